"""`mofa validate`: compare the model's predictions with measured runs."""

from __future__ import annotations

import sys

from mofa.commands._common import add_convention_option, add_json_option, stamped, to_json

NAME = "validate"
HELP = "compare predictions with measured runs"
DESCRIPTION = (
    "Predict the step time (and, where a source states it, the peak memory) of each validation point (a measured "
    "run) and report the errors per GPU and per source; points the model cannot explain are listed and counted, "
    "never scored. With --cross-validate source, each GPU chip's profile is refitted without every point of one "
    "source and that source predicted: the out-of-sample figures."
)


def add_arguments(p) -> None:
    p.add_argument("data", nargs="+", help="validation files or folders of them (problems/validation)")
    p.add_argument("--profile", action="append", default=[], metavar="FILE", help="use this calibrated profile for its GPU; repeatable (default: the presets' profiles)")
    p.add_argument("--cross-validate", choices=["none", "point", "source"], default="none",
                   help="refit each chip's profile without each held-out point or source and predict it (default: none, the shipped profiles)")
    p.add_argument("--knobs", help="knobs refitted under --cross-validate (default: calibrate's per-chip defaults)")
    add_convention_option(p)
    p.add_argument("--max-mape", type=float, metavar="P", help="exit 1 when the MAPE of the scored points exceeds P percent (default: no threshold)")
    add_json_option(p)


def run(args) -> int:
    from calibration.data import load_dataset
    from calibration.fit import KNOBS, calibrate, cross_validation_summary, log_residual_sd, point_result
    from calibration.memory_checks import memory_checks
    from calibration.profile import read_profile, with_profile
    from calibration.resolve import resolve
    from costmodel.presets.hardware import chip_of
    from mofa.report import render_validation

    profiles = {}
    for path in args.profile:
        try:
            name, efficiency = read_profile(path)
        except (OSError, ValueError) as exc:  # pydantic and YAML errors are ValueErrors
            print(f"mofa validate: {path}: {str(exc).splitlines()[0]}", file=sys.stderr)
            return 2
        profiles[name] = efficiency
    knobs = None
    if args.knobs:
        knobs = tuple(k.strip() for k in args.knobs.split(","))
        unknown = [k for k in knobs if k not in KNOBS]
        if unknown:
            print(f"mofa validate: --knobs: unknown knobs {unknown} (known: {', '.join(KNOBS)})", file=sys.stderr)
            return 2
    data = load_dataset(args.data)
    results, efficiencies = [], {}
    for point in data.points:
        hw = point.problem.hardware
        efficiencies[hw.name] = hw.efficiency
        if hw.name in profiles:
            hw = with_profile(hw, profiles[hw.name])
        cfg, chosen = resolve(point, hw)
        results.append(point_result(point.resolved(chosen), hw, cfg, chosen))
    out = summary(results, profiles, efficiencies, data.points, args.flops_convention or "palm")
    out["skipped"] = [{"file": s.path, "row": s.row, "reason": s.reason} for s in data.skipped]
    if args.cross_validate != "none":
        chips: dict[str, list] = {}
        for point in data.points:
            chips.setdefault(chip_of(point.problem.hardware), []).append(point)
        held, fitted_knobs = [], {}
        for chip, points in sorted(chips.items()):
            try:
                cal = calibrate(points, knobs, loo=True, cross_validate=args.cross_validate)
            except ValueError as exc:  # too few points on this chip to refit
                print(f"mofa validate: {chip}: no cross-validation ({exc})", file=sys.stderr)
                continue
            held += cal.results
            fitted_knobs[chip] = cal.knobs
        sd = log_residual_sd(held)
        held_out = {r.name: r.loo_error_pct for r in held if r.scored and r.loo_predicted_step_s}
        for row in out["points"]:  # each point's error when its group was held out of the fit
            row["held_out_error_pct"] = held_out.get(row["name"])
        out["cross_validation"] = {"held_out": args.cross_validate, "knobs": fitted_knobs, **cross_validation_summary(held, sd), "log_residual_sd": sd}
    out["memory_checks"] = memory_checks()
    print(to_json(stamped(out, list(args.data))) if args.json else render_validation(out))
    if args.max_mape is not None and out["mape_pct"] is not None and out["mape_pct"] > args.max_mape:
        print(f"mofa validate: MAPE {out['mape_pct']:.2f}% exceeds --max-mape {args.max_mape}", file=sys.stderr)
        return 1
    return 0


def _errors(rows: list[dict], key: str) -> dict:
    errors = [abs(r[key]) for r in rows if r[key] is not None]
    return {"n": len(errors), "mape_pct": sum(errors) / len(errors) if errors else None, "max_abs_error_pct": max(errors, default=None)}


def mfu_figures(point, result, convention: str) -> dict:
    """The source's figure as stated (metric, value, its FLOPs convention) and the measured and
    predicted MFU both counted in `convention`: a figure in the source's convention reaches ours
    through the step time (seed note 004)."""
    m = point.measured
    predicted = result.predicted_step_s
    return {
        "measured_metric": m.metric,
        "measured_value": m.value,
        "measured_convention": m.flops_convention,
        "mfu_convention": convention,
        "measured_mfu": point.mfu_of(result.measured_step_s, convention),
        "predicted_mfu": point.mfu_of(predicted, convention) if predicted == predicted else None,  # NaN: nothing predicted
    }


def summary(results, profiles: dict, efficiencies: dict, points=None, convention: str = "palm") -> dict:
    points = points or [None] * len(results)
    rows = [{
        "name": r.name,
        "hardware": r.hardware,
        "source": r.source,
        "fitted": r.fitted,
        "measured_step_s": r.measured_step_s,
        "predicted_step_s": r.predicted_step_s,
        "error_pct": None if r.unexplained else r.error_pct,
        "unexplained": r.unexplained,
        "predicted_peak_gib": r.predicted_peak_gib,
        "measured_peak_gib": r.measured_peak_gib,
        "memory_error_pct": r.memory_error_pct,
        "fits_memory": r.fits,
        "resolved": r.resolved,
        **(mfu_figures(p, r, convention) if p is not None else {}),
    } for r, p in zip(results, points)]
    scored = [row for row, r in zip(rows, results) if r.scored]
    per_hardware = {}
    for name in sorted({r["hardware"] for r in rows}):
        eff = profiles.get(name) or efficiencies[name]
        cal = eff.calibration
        per_hardware[name] = {
            **_errors([r for r in scored if r["hardware"] == name], "error_pct"),
            "unexplained": sum(1 for r in rows if r["hardware"] == name and r["unexplained"]),
            "profile": ("calibrated, in sample" if cal else "default") + ("" if name not in profiles else " (--profile)"),
        }
    per_source = {
        name: {**_errors([r for r in scored if r["source"] == name], "error_pct"),
               "unexplained": sum(1 for r in rows if r["source"] == name and r["unexplained"])}
        for name in sorted({r["source"] for r in rows})
    }
    overall = _errors(scored, "error_pct")
    return {
        "points": rows,
        "mape_pct": overall["mape_pct"],
        "max_abs_error_pct": overall["max_abs_error_pct"],
        "scored": overall["n"],
        "unexplained": [{"name": r["name"], "reason": r["unexplained"]} for r in rows if r["unexplained"]],
        "per_hardware": per_hardware,
        "per_source": per_source,
        "peak_memory": memory_figures([r for r in rows if not r["unexplained"]]),
    }


#: issue 9's peak-memory bar: a prediction within this share of the reported peak
MEMORY_BAR_PCT = 10.0


def memory_figures(rows: list[dict]) -> dict:
    """Peak memory against the points that state it: the error figures, how many are within
    MEMORY_BAR_PCT, and the same per source."""
    def figures(subset):
        stated = [r for r in subset if r["memory_error_pct"] is not None]
        return {**_errors(stated, "memory_error_pct"), "within_bar": sum(1 for r in stated if abs(r["memory_error_pct"]) <= MEMORY_BAR_PCT)}

    sources = sorted({r["source"] for r in rows if r["memory_error_pct"] is not None})
    return {**figures(rows), "bar_pct": MEMORY_BAR_PCT, "per_source": {name: figures([r for r in rows if r["source"] == name]) for name in sources}}
