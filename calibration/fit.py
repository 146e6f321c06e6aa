"""Fit the efficiency parameters of a hardware profile to measured step times.

A handful of knobs of the modified roofline and the network (GEMM and attention efficiency,
the memory-bound fraction, the node and cluster communication efficiency -- the lambdas of
MoFa eqs. 17-18) are fitted by least squares on log(predicted / measured) step time
(scipy.optimize.least_squares, bounded trust region). Fewer knobs than points, none per point.
A weak prior keeps each knob near its documented default unless the data move it. Unknown
configuration fields are resolved with the profile being fitted, alternating with the fit
until the choices settle. Leave-one-out refits without each point and predicts it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from calibration.data import Point
from calibration.resolve import resolve
from costmodel.evaluate import evaluate
from costmodel.presets.hardware import DEFAULT_EFFICIENCY, HARDWARE
from costmodel.specs import CalibrationStats, HardwareSpec

#: knob -> (path in HardwareSpec, lower bound, upper bound)
KNOBS: dict[str, tuple[tuple[str, ...], float, float]] = {
    "gemm": (("efficiency", "gemm", "peak_fraction"), 0.2, 1.0),
    "attention": (("efficiency", "attention", "peak_fraction"), 0.05, 1.0),
    "memory": (("efficiency", "memory_bound_fraction"), 0.2, 1.0),
    "node_comm": (("efficiency", "comm_efficiency", "node"), 0.05, 1.0),
    "cluster_comm": (("efficiency", "comm_efficiency", "cluster"), 0.05, 1.0),
    "scale_decay": (("efficiency", "scale_decay_exponent"), 0.0, 0.6),
    "dp_overlap_comm": (("efficiency", "dp_overlap", "beta"), 1.0, 3.0),
    "tp_overlap_comm": (("efficiency", "tp_overlap", "beta"), 1.0, 3.0),
}
DEFAULT_KNOBS = ("gemm", "attention", "node_comm", "cluster_comm", "scale_decay", "dp_overlap_comm")
#: weight of log(knob / default) against log(predicted / measured): a 25% move of a knob costs
#: what a 5% miss on one point costs
PRIOR_WEIGHT = 0.2


def apply(hw: HardwareSpec, values: dict[str, float]) -> HardwareSpec:
    data = hw.model_dump()
    for knob, value in values.items():
        path = KNOBS[knob][0]
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = float(value)
    return HardwareSpec.model_validate(data)


def read(hw: HardwareSpec, knob: str) -> float:
    node = hw.model_dump()
    for key in KNOBS[knob][0]:
        node = node[key]
    return float(node)


@dataclass
class PointResult:
    name: str
    hardware: str
    measured_step_s: float
    predicted_step_s: float
    resolved: dict
    fitted: bool
    loo_predicted_step_s: float | None = None
    fits: bool = True
    source: str = ""

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_step_s / self.measured_step_s - 1.0)

    @property
    def loo_error_pct(self) -> float | None:
        if self.loo_predicted_step_s is None:
            return None
        return 100.0 * (self.loo_predicted_step_s / self.measured_step_s - 1.0)


def predict(point: Point, hw: HardwareSpec, configs: dict) -> tuple[float, bool]:
    """(predicted step time, whether it fits in memory) of the point's configuration."""
    ev = evaluate_point(point, hw, configs[point.name])
    return float(ev.step_time_s[0]), bool(ev.fits[0])


def evaluate_point(point: Point, hw: HardwareSpec, cfg):
    return evaluate(point.problem.model_copy(update={"hardware": hw}), cfg)


def starting_hardware(point: Point) -> HardwareSpec:
    """The point's GPU with the documented default efficiency when it is the preset carrying a
    shipped calibrated profile (calibration must not start from its own previous answer);
    otherwise as the point gives it (per-point overrides are kept)."""
    hw = point.problem.hardware
    preset = HARDWARE.get(hw.name)
    if preset is not None and hw.efficiency == preset.efficiency and hw.name in DEFAULT_EFFICIENCY:
        return hw.model_copy(update={"efficiency": DEFAULT_EFFICIENCY[hw.name]})
    return hw


def _fit(points: list[Point], starts: dict, knobs: tuple[str, ...], configs: dict, start: np.ndarray | None = None) -> np.ndarray:
    lo = np.array([KNOBS[k][1] for k in knobs])
    hi = np.array([KNOBS[k][2] for k in knobs])
    reference = starts[points[0].name] if points else None
    prior = np.array([read(reference, k) for k in knobs]) if reference is not None else (lo + hi) / 2
    x0 = np.clip(start if start is not None else prior, lo + 1e-6, hi - 1e-6)
    measured = np.array([p.step_time_s() for p in points])

    def residuals(x):
        values = dict(zip(knobs, x))
        pred = np.array([predict(p, apply(starts[p.name], values), configs)[0] for p in points])
        # a weak prior toward the profile's documented defaults: a knob only one point informs
        # stays near its default instead of absorbing that point's idiosyncrasies
        # (an exponent defaults to 0: its prior is on the value itself)
        pull = np.where(prior > 0, np.log(np.maximum(x, 1e-9) / np.where(prior > 0, prior, 1.0)), x)
        return np.concatenate([np.log(pred / measured), PRIOR_WEIGHT * pull])

    if len(points) == 0:
        return x0
    fit = least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac", diff_step=1e-3, max_nfev=200)
    return fit.x


@dataclass
class Calibration:
    hardware: HardwareSpec  # the fitted profile, its CalibrationStats attached
    knobs: dict[str, float]
    results: list[PointResult] = field(default_factory=list)

    @property
    def stats(self) -> CalibrationStats:
        return self.hardware.efficiency.calibration


def source_of(point: Point) -> str:
    """The group a point is held out with under source cross-validation: its publication."""
    return point.measured.source


def calibrate(points: list[Point], knobs: tuple[str, ...] = DEFAULT_KNOBS, loo: bool = True, rounds: int = 3,
              cross_validate: str = "point") -> Calibration:
    """Fit `knobs` on the points (all on one GPU). Each point keeps its own hardware; the knobs
    are applied on top of it. Cross-validation refits without each held-out group and predicts
    it: `point` (leave one out) or `source` (leave one source out: every point of a
    publication held out at once, the test that says how the model does on runs it never saw)."""
    names = {p.hardware for p in points}
    if len(names) != 1:
        raise ValueError(f"calibrate one GPU at a time (got {', '.join(sorted(names))})")
    if cross_validate not in ("point", "source"):
        raise ValueError(f"unknown cross-validation '{cross_validate}' (point or source)")
    fit_points = [p for p in points if p.measured.fit]
    if len(fit_points) <= len(knobs):
        raise ValueError(f"{len(fit_points)} fitted points cannot determine {len(knobs)} parameters; give more points or fewer knobs")
    starts = {p.name: starting_hardware(p) for p in points}
    configs, picks = {}, {}
    x = None
    for _ in range(rounds):  # resolve the unknowns with the current profile, refit, until stable
        changed = False
        for p in points:
            current = starts[p.name] if x is None else apply(starts[p.name], dict(zip(knobs, x)))
            cfg, chosen = resolve(p, current)
            if p.name not in picks or picks[p.name] != chosen:
                changed = True
            configs[p.name], picks[p.name] = cfg, chosen
        if not changed and x is not None:
            break
        x = _fit(fit_points, starts, knobs, configs, x)
    values = dict(zip(knobs, x))

    results = []
    for p in points:
        pred, fits = predict(p, apply(starts[p.name], values), configs)
        results.append(PointResult(p.name, p.hardware, p.step_time_s(), pred, picks[p.name], p.measured.fit, fits=fits, source=source_of(p)))
    if loo:
        key = (lambda p: p.name) if cross_validate == "point" else source_of
        groups: dict[str, list[Point]] = {}
        for p in fit_points:
            groups.setdefault(key(p), []).append(p)
        for held in groups.values():
            names_out = {p.name for p in held}
            others = [p for p in fit_points if p.name not in names_out]
            if len(others) <= len(knobs):
                continue  # too few points left to fit: no out-of-sample prediction for this group
            x_cv = _fit(others, starts, knobs, configs, x)
            for p in held:
                trial = apply(starts[p.name], dict(zip(knobs, x_cv)))
                cfg_i, _ = resolve(p, trial)
                pred_i, _ = predict(p, trial, {p.name: cfg_i})
                next(r for r in results if r.name == p.name).loo_predicted_step_s = pred_i

    fitted = [r for r in results if r.fitted]
    logs = np.array([math.log(r.predicted_step_s / r.measured_step_s) for r in fitted])
    loo_logs = [math.log(r.loo_predicted_step_s / r.measured_step_s) for r in fitted if r.loo_predicted_step_s]
    spread = np.array(loo_logs) if loo_logs else logs
    stats = CalibrationStats(
        points=len(fitted),
        log_residual_sd=float(np.sqrt(np.mean(spread**2))),
        mape_pct=float(np.mean([abs(r.error_pct) for r in fitted])),
        loo_mape_pct=float(np.mean([abs(r.loo_error_pct) for r in fitted if r.loo_error_pct is not None])) if loo_logs else None,
        max_abs_error_pct=float(max(abs(r.error_pct) for r in fitted)),
        data=[r.name for r in fitted],
        cross_validation=cross_validate if loo_logs else None,
    )
    base = apply(starts[fit_points[0].name], values)
    efficiency = base.efficiency.model_copy(update={"calibration": stats, "source": f"calibrated on {len(fitted)} public measured runs (problems/validation): {', '.join(stats.data)}"})
    return Calibration(base.model_copy(update={"efficiency": efficiency}), {k: float(v) for k, v in values.items()}, results)


def cross_validation_summary(results: list[PointResult], log_residual_sd: float) -> dict:
    """Out-of-sample figures of a calibration (issue 9's JSON key `cross_validation`): per GPU
    and per source the MAPE, worst error and count of the held-out predictions, and the share of
    points inside their 90% interval (prediction x exp(+-1.645 sd))."""
    held = [r for r in results if r.fitted and r.loo_predicted_step_s]

    def stats(rows):
        errors = [abs(r.loo_error_pct) for r in rows]
        return {"mape_pct": float(np.mean(errors)), "max_abs_error_pct": float(max(errors)), "n": len(rows)}

    spread = math.exp(1.645 * log_residual_sd)
    inside = [r.loo_predicted_step_s / spread <= r.measured_step_s <= r.loo_predicted_step_s * spread for r in held]
    by = lambda attr: {k: stats([r for r in held if getattr(r, attr) == k]) for k in sorted({getattr(r, attr) for r in held})}
    return {"per_gpu": by("hardware"), "per_source": by("source"), "interval_coverage": float(np.mean(inside)) if inside else None}
