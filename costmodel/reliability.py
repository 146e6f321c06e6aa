"""Fault-tolerance cost model: MoFa eqs. 36-44 (CostModel_Fa), array-valued.

Failures arrive at N_nodes * r_f per unit of wall-clock time (eq. 38, r_f per node per day).
Each failure costs the recovery time u_b (eq. 41 when a process/pod/job mix is given) plus,
on average, half a checkpoint interval of lost steps; each of the ceil(S/I) checkpoints
blocks for T_save; u_0 is paid once (eq. 39). Solving eqs. 37-39 for the wall-clock time:

    T_E2E = (S*T_step + u_0 + ceil(S/I)*T_save) / (1 - N*r_f*(u_b + I*T_step/2))      (exact)
    ETTR  = S*T_step / T_E2E                                                        (eq. 36)

Dropping u_0 and the ceiling gives eq. 40, the steady-state ETTR, which is what MoFa's Table 5
reports and what `steady_state_ettr` returns. Eq. 43 is T_E2E without u_0. When failures
arrive faster than the job can make progress (denominator <= 0) the job never finishes:
ETTR is 0 and T_E2E infinite.

The optimal interval (eq. 44) maximises eq. 40:
    I* = (-T_save + sqrt(T_save^2 - 2*T_save*u_b + 2*T_save/(N*r_f))) / T_step,
rounded down and up, keeping the better (MoFa section 4.2); at least one step.
"""

from __future__ import annotations

import numpy as np

from costmodel.units import SECONDS_PER_DAY


def failure_rate_per_s(num_nodes, failures_per_node_day):
    return np.asarray(num_nodes, dtype=float) * failures_per_node_day / SECONDS_PER_DAY


def steady_state_ettr(step_s, interval, rate_per_s, recovery_s, save_s):
    """Eq. 40."""
    step_s = np.asarray(step_s, dtype=float)
    lost = 1.0 - rate_per_s * (recovery_s + interval * step_s / 2.0)
    return np.maximum(0.0, lost) / (1.0 + save_s / (interval * step_s))


def end_to_end_s(steps, step_s, interval, rate_per_s, recovery_s, save_s, first_init_s=0.0):
    """Eqs. 37-39 solved exactly (ceil(S/I) checkpoints, u_0 included)."""
    step_s = np.asarray(step_s, dtype=float)
    denominator = 1.0 - rate_per_s * (recovery_s + interval * step_s / 2.0)
    numerator = steps * step_s + first_init_s + np.ceil(steps / interval) * save_s
    with np.errstate(divide="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1.0), np.inf)


def optimal_interval(step_s, rate_per_s, recovery_s, save_s, max_interval: int = 10**9) -> np.ndarray:
    """Eq. 44, rounded down and up, keeping the interval with the higher eq.-40 ETTR."""
    step_s = np.asarray(step_s, dtype=float)
    if np.all(np.asarray(rate_per_s) == 0):
        return np.full(step_s.shape, max_interval, dtype=np.int64)
    save_s = np.asarray(save_s, dtype=float)  # a Python float's ** raises on overflow; numpy's gives inf
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        disc = save_s**2 - 2.0 * save_s * recovery_s + 2.0 * save_s / rate_per_s
        raw = (-save_s + np.sqrt(np.maximum(disc, 0.0))) / step_s
    raw = np.where(np.isfinite(raw), raw, 1.0)
    lo = np.clip(np.floor(raw), 1, max_interval)
    hi = np.clip(np.ceil(raw), 1, max_interval)
    e_lo = steady_state_ettr(step_s, lo, rate_per_s, recovery_s, save_s)
    e_hi = steady_state_ettr(step_s, hi, rate_per_s, recovery_s, save_s)
    return np.where(e_hi > e_lo, hi, lo).astype(np.int64)
