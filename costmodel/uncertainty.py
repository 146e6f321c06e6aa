"""Prediction intervals from calibration residuals.

A calibrated hardware profile records the spread of log(predicted / measured) step time over
its calibration points (leave-one-out). A new prediction T gets the interval
T * exp(-z * sd) .. T * exp(+z * sd) with z = 1.645 (90% if the log-residuals are normal)."""

from __future__ import annotations

import math

from costmodel.specs import HardwareSpec

Z_90 = 1.645


def step_time_interval(hw: HardwareSpec, step_time_s: float) -> tuple[float, float] | None:
    cal = hw.efficiency.calibration
    if cal is None or not math.isfinite(step_time_s):
        return None
    spread = math.exp(Z_90 * cal.log_residual_sd)
    return step_time_s / spread, step_time_s * spread
