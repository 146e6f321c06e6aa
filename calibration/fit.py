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
from calibration.resolve import UNEXPLAINED, resolve
from costmodel.evaluate import evaluate
from costmodel.presets.hardware import DEFAULT_EFFICIENCY, HARDWARE, chip_of
from costmodel.specs import CalibrationStats, HardwareSpec
from costmodel.units import FP8_COMPUTE, GIB

#: knob -> (path in HardwareSpec, lower bound, upper bound, prior scale). The prior pulls a knob
#: toward its documented default in log terms; a knob whose default is 0 (an exponent, a
#: half-saturation size, an overhead) is pulled toward 0 in units of its scale.
KNOBS: dict[str, tuple[tuple[str, ...], float, float, float]] = {
    "gemm": (("efficiency", "gemm", "peak_fraction"), 0.2, 1.0, 1.0),
    "fp8_gemm": (("efficiency", "fp8_gemm", "peak_fraction"), 0.1, 1.0, 1.0),
    "attention": (("efficiency", "attention", "peak_fraction"), 0.05, 1.0, 1.0),
    "attention_te": (("efficiency", "attention_impls", "te", "peak_fraction"), 0.05, 1.0, 1.0),
    "attention_sdpa": (("efficiency", "attention_impls", "sdpa", "peak_fraction"), 0.05, 1.0, 1.0),
    "attention_triton": (("efficiency", "attention_impls", "triton", "peak_fraction"), 0.05, 1.0, 1.0),
    "memory": (("efficiency", "memory_bound_fraction"), 0.2, 1.0, 1.0),
    "node_comm": (("efficiency", "comm_efficiency", "node"), 0.05, 1.0, 1.0),
    "cluster_comm": (("efficiency", "comm_efficiency", "cluster"), 0.05, 1.0, 1.0),
    "scale_decay": (("efficiency", "scale_decay_exponent"), 0.0, 0.6, 1.0),
    "dp_overlap_comm": (("efficiency", "dp_overlap", "beta"), 1.0, 3.0, 1.0),
    # the compute an overlapped data-parallel collective slows (eq. 24's alpha): NCCL's kernels
    # take SMs and HBM bandwidth from the GEMMs they run beside (FSDP's per-layer gathers above all)
    "dp_contention": (("efficiency", "dp_overlap", "alpha"), 1.0, 2.0, 1.0),
    "tp_overlap_comm": (("efficiency", "tp_overlap", "beta"), 1.0, 3.0, 1.0),
    "gemm_k_half": (("efficiency", "gemm_k_half"), 0.0, 4096.0, 1024.0),
    "attention_seq_half": (("efficiency", "attention_seq_half"), 0.0, 16384.0, 4096.0),
    "kernel_overhead": (("efficiency", "kernel_overhead_us"), 0.5, 50.0, 1.0),
    "stage_overhead": (("efficiency", "stage_overhead_us"), 0.0, 5000.0, 1000.0),
}
#: a knob is fitted only when at least this many points exercise it, and a chip gets at most one
#: knob per this many points (issue 9: fewer parameters than a tenth of the points)
POINTS_PER_KNOB = 10


def default_knobs(points: list[Point]) -> tuple[str, ...]:
    """The knobs a set of points can determine: each enters only when POINTS_PER_KNOB points
    exercise it (an attention implementation's efficiency needs that many runs using it, fp8
    GEMMs that many fp8 runs, cluster communication that many multi-node runs), in order of how
    many points inform it, at most one knob per POINTS_PER_KNOB points."""
    def count(pred) -> int:
        return sum(1 for p in points if p.measured.fit and pred(p))

    tr = lambda p: p.problem.training  # noqa: E731
    multi_node = lambda p: p.problem.cluster.num_gpus > p.problem.cluster.gpus_per_node  # noqa: E731
    candidates = {
        "gemm": count(lambda p: tr(p).dtypes.compute not in FP8_COMPUTE),
        "fp8_gemm": count(lambda p: tr(p).dtypes.compute in FP8_COMPUTE),
        "attention": count(lambda p: tr(p).attention_impl is None),
        "attention_te": count(lambda p: tr(p).attention_impl == "te"),
        "attention_sdpa": count(lambda p: tr(p).attention_impl == "sdpa"),
        "attention_triton": count(lambda p: tr(p).attention_impl == "triton"),
        "node_comm": count(lambda p: True),
        "cluster_comm": count(multi_node),
        "scale_decay": count(lambda p: p.problem.cluster.num_gpus >= 512),
        "kernel_overhead": count(lambda p: True),
        "dp_contention": count(lambda p: p.problem.config is not None and p.problem.config.dp_overlap),
    }
    ranked = sorted((k for k, n in candidates.items() if n >= POINTS_PER_KNOB), key=lambda k: -candidates[k])
    budget = max(1, count(lambda p: True) // POINTS_PER_KNOB)
    return tuple(ranked[:budget])
#: weight of log(knob / default) against log(predicted / measured): a 25% move of a knob costs
#: what a 5% miss on one point costs
PRIOR_WEIGHT = 0.2


def _node(data: dict, path: tuple[str, ...], create: bool):
    """The dict holding the last key of `path`. An attention implementation not in the profile
    yet starts as a copy of the attention curve (what it runs at until fitted)."""
    node = data
    for i, key in enumerate(path[:-1]):
        if key not in node and create and path[i - 1] == "attention_impls":
            node[key] = dict(data["efficiency"]["attention"])
        elif key not in node and path[i - 1] == "attention_impls":
            return data["efficiency"]["attention"]
        node = node[key]
    return node


def apply(hw: HardwareSpec, values: dict[str, float]) -> HardwareSpec:
    data = hw.model_dump()
    for knob, value in values.items():
        path = KNOBS[knob][0]
        _node(data, path, create=True)[path[-1]] = float(value)
    return HardwareSpec.model_validate(data)


def read(hw: HardwareSpec, knob: str) -> float:
    path = KNOBS[knob][0]
    return float(_node(hw.model_dump(), path, create=False)[path[-1]])


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
    unexplained: str | None = None  # why the model cannot explain the point; it is not scored
    predicted_peak_gib: float | None = None
    measured_peak_gib: float | None = None

    @property
    def scored(self) -> bool:
        """Counts in the accuracy figures: fitted and explained."""
        return self.fitted and self.unexplained is None

    @property
    def memory_error_pct(self) -> float | None:
        if self.measured_peak_gib is None or self.predicted_peak_gib is None:
            return None
        return 100.0 * (self.predicted_peak_gib / self.measured_peak_gib - 1.0)

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


def point_result(point: Point, hw: HardwareSpec, cfg, chosen: dict) -> PointResult:
    """The prediction for one point with its resolved configuration, as calibrate and validate
    report it."""
    if cfg is None:  # no admissible configuration: nothing to predict
        return PointResult(point.name, point.hardware, point.step_time_s(), math.nan, {}, point.measured.fit, fits=False,
                           source=point.source, unexplained=chosen.get(UNEXPLAINED), measured_peak_gib=point.measured.peak_memory_gib)
    ev = evaluate_point(point, hw, cfg)
    return PointResult(
        point.name, point.hardware, point.step_time_s(), float(ev.step_time_s[0]),
        {k: v for k, v in chosen.items() if k != UNEXPLAINED}, point.measured.fit, fits=bool(ev.fits[0]), source=point.source,
        unexplained=chosen.get(UNEXPLAINED), predicted_peak_gib=float(ev.memory_bytes["peak"][0]) / GIB,
        measured_peak_gib=point.measured.peak_memory_gib,
    )


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


#: knobs that set one attention implementation's efficiency
IMPL_KNOBS = {"attention_te": "te", "attention_sdpa": "sdpa", "attention_triton": "triton"}


def bears_on(point: Point, knob: str, knobs: tuple[str, ...]) -> bool:
    """Whether a knob can change the point's prediction: an implementation's attention curve
    only its runs, the generic attention curve the runs whose implementation has no knob of its
    own, fp8 GEMM efficiency only fp8 and mxfp8 runs; every other knob all runs."""
    tr = point.problem.training
    if knob in IMPL_KNOBS:
        return tr.attention_impl == IMPL_KNOBS[knob]
    if knob == "attention":
        return tr.attention_impl is None or f"attention_{tr.attention_impl}" not in knobs
    if knob == "fp8_gemm":
        return tr.dtypes.compute in FP8_COMPUTE
    return True


def _fit(points: list[Point], starts: dict, knobs: tuple[str, ...], configs: dict, start: np.ndarray | None = None) -> np.ndarray:
    lo = np.array([KNOBS[k][1] for k in knobs])
    hi = np.array([KNOBS[k][2] for k in knobs])
    scale = np.array([KNOBS[k][3] for k in knobs])
    reference = starts[points[0].name] if points else None
    prior = np.array([read(reference, k) for k in knobs]) if reference is not None else (lo + hi) / 2
    x0 = np.clip(start if start is not None else prior, lo + 1e-6, hi - 1e-6)
    measured = np.array([p.step_time_s() for p in points])

    used = {p.name: tuple(i for i, k in enumerate(knobs) if bears_on(p, k, knobs)) for p in points}
    memo: dict[tuple, float] = {}

    def predicted(p, x) -> float:
        # a point is re-evaluated only when a knob that bears on it moved (finite differences
        # perturb one knob at a time; most knobs touch a subset of the points)
        key = (p.name, *(float(x[i]) for i in used[p.name]))
        if key not in memo:
            memo[key] = predict(p, apply(starts[p.name], {knobs[i]: x[i] for i in used[p.name]}), configs)[0]
        return memo[key]

    def residuals(x):
        pred = np.array([predicted(p, x) for p in points])
        # a weak prior toward the profile's documented defaults: a knob only one point informs
        # stays near its default instead of absorbing that point's idiosyncrasies
        # (an exponent defaults to 0: its prior is on the value itself)
        pull = np.where(prior > 0, np.log(np.maximum(x, 1e-9) / np.where(prior > 0, prior, 1.0)), x / scale)
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


def calibrate(points: list[Point], knobs: tuple[str, ...] | None = None, loo: bool = True, rounds: int = 3,
              cross_validate: str = "point") -> Calibration:
    """Fit `knobs` on the points, all on one chip (A100 40 and 80 GB pool: kernel efficiency is
    the die's). Each point keeps its own hardware; the knobs are applied on top of it. Points the
    model cannot explain (resolve's UNEXPLAINED) are reported and left out of the fit and of
    every figure. Cross-validation refits without each held-out group and predicts it: `point`
    (leave one out) or `source` (leave one source out: every point of a measurement campaign
    held out at once, the test that says how the model does on runs it never saw). `knobs`
    defaults to those the points can determine (default_knobs)."""
    chips = {chip_of(p.problem.hardware) for p in points}
    if len(chips) != 1:
        raise ValueError(f"calibrate one chip at a time (got {', '.join(sorted(chips))})")
    if cross_validate not in ("point", "source"):
        raise ValueError(f"unknown cross-validation '{cross_validate}' (point or source)")
    starts = {p.name: starting_hardware(p) for p in points}
    configs, picks = {}, {}
    for p in points:
        configs[p.name], picks[p.name] = resolve(p, starts[p.name])
    points = [p.resolved(picks[p.name]) for p in points]  # an unknown GEMM dtype, as resolved
    knobs = default_knobs(points) if knobs is None else knobs
    if not knobs:
        raise ValueError(f"no knob is exercised by {POINTS_PER_KNOB} of these {len(points)} points; nothing can be fitted")
    fit_points = [p for p in points if p.measured.fit and UNEXPLAINED not in picks[p.name]]
    if len(fit_points) <= len(knobs):
        raise ValueError(f"{len(fit_points)} fitted, explained points cannot determine {len(knobs)} parameters; give more points or fewer knobs")
    x = _fit(fit_points, starts, knobs, configs)
    for _ in range(rounds - 1):  # re-resolve the unknowns with the fitted profile, refit, until stable
        changed = False
        for i, p in enumerate(fit_points):
            if not p.unknown:
                continue  # a stated configuration does not depend on the profile
            cfg, chosen = resolve(p, apply(starts[p.name], dict(zip(knobs, x))))
            changed |= picks[p.name] != chosen
            configs[p.name], picks[p.name] = cfg, chosen
            fit_points[i] = p.resolved(chosen)
        if not changed:
            break
        x = _fit([p for p in fit_points if UNEXPLAINED not in picks[p.name]], starts, knobs, configs, x)
    latest = {p.name: p for p in fit_points}  # resolved with the final profile
    points = [latest.get(p.name, p) for p in points]
    values = dict(zip(knobs, x))

    results = [point_result(p, apply(starts[p.name], values), configs[p.name], picks[p.name]) for p in points]
    by_name = {r.name: r for r in results}
    scored = [p for p in points if by_name[p.name].scored]
    if loo:
        key = (lambda p: p.name) if cross_validate == "point" else (lambda p: p.source)
        groups: dict[str, list[Point]] = {}
        for p in scored:
            groups.setdefault(key(p), []).append(p)
        for held in groups.values():
            names_out = {p.name for p in held}
            others = [p for p in scored if p.name not in names_out]
            if len(others) <= len(knobs):
                continue  # too few points left to fit: no out-of-sample prediction for this group
            # from the documented defaults, not from the fit that saw the held-out points: a start
            # near their optimum would leak them into the held-out figure wherever least squares
            # stops short or the knobs trade off (GEMM efficiency against DP contention)
            x_cv = _fit(others, starts, knobs, configs)
            for p in held:
                trial = apply(starts[p.name], dict(zip(knobs, x_cv)))
                cfg_i, chosen_i = resolve(p, trial) if p.unknown else (configs[p.name], picks[p.name])
                if UNEXPLAINED in chosen_i:
                    continue
                by_name[p.name].loo_predicted_step_s = predict(p.resolved(chosen_i), trial, {p.name: cfg_i})[0]

    fitted = [r for r in results if r.scored]
    held_out = any(r.loo_predicted_step_s for r in fitted)
    stats = CalibrationStats(
        points=len(fitted),
        log_residual_sd=log_residual_sd(fitted),
        mape_pct=float(np.mean([abs(r.error_pct) for r in fitted])),
        loo_mape_pct=float(np.mean([abs(r.loo_error_pct) for r in fitted if r.loo_error_pct is not None])) if held_out else None,
        max_abs_error_pct=float(max(abs(r.error_pct) for r in fitted)),
        data=sorted({r.source for r in fitted}),
        cross_validation=cross_validate if held_out else None,
    )
    base = apply(starts[fit_points[0].name], values)
    efficiency = base.efficiency.model_copy(update={
        "calibration": stats,
        "source": f"calibrated on {len(fitted)} public measured runs from {len(stats.data)} sources (problems/validation): {'; '.join(stats.data)}",
    })
    return Calibration(base.model_copy(update={"efficiency": efficiency}), {k: float(v) for k, v in values.items()}, results)


def log_residual_sd(results: list[PointResult]) -> float:
    """Root mean square of log(predicted / measured) over the scored points: their held-out
    predictions where cross-validation made them, else the in-sample ones (the 90% interval is
    prediction x exp(+-1.645 sd))."""
    scored = [r for r in results if r.scored]
    held = [r for r in scored if r.loo_predicted_step_s]
    logs = [math.log(r.loo_predicted_step_s / r.measured_step_s) for r in held] if held else \
        [math.log(r.predicted_step_s / r.measured_step_s) for r in scored]
    return math.sqrt(sum(x * x for x in logs) / len(logs)) if logs else 0.0


def cross_validation_summary(results: list[PointResult], log_residual_sd: float) -> dict:
    """Out-of-sample figures of a calibration (issue 9's JSON key `cross_validation`): per GPU
    and per source the MAPE, worst error and count of the held-out predictions, and the share of
    points inside their 90% interval (prediction x exp(+-1.645 sd))."""
    held = [r for r in results if r.scored and r.loo_predicted_step_s]

    def stats(rows):
        errors = [abs(r.loo_error_pct) for r in rows]
        return {"mape_pct": float(np.mean(errors)), "max_abs_error_pct": float(max(errors)), "n": len(rows)}

    spread = math.exp(1.645 * log_residual_sd)
    inside = [r.loo_predicted_step_s / spread <= r.measured_step_s <= r.loo_predicted_step_s * spread for r in held]
    by = lambda attr: {k: stats([r for r in held if getattr(r, attr) == k]) for k in sorted({getattr(r, attr) for r in held})}
    return {"per_gpu": by("hardware"), "per_source": by("source"), "interval_coverage": float(np.mean(inside)) if inside else None}
