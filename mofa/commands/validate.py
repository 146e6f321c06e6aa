"""`mofa validate`: compare the model's predictions with measured runs."""

from __future__ import annotations

import sys

from mofa.commands._common import add_json_option, stamped, to_json

NAME = "validate"
HELP = "compare predictions with measured runs"
DESCRIPTION = "Predict the step time of each validation point (a measured run) and report the errors, per GPU and overall, with the memory checks."


def add_arguments(p) -> None:
    p.add_argument("data", nargs="+", help="validation point files (problems/validation/*.yaml)")
    p.add_argument("--profile", action="append", default=[], metavar="FILE", help="use this calibrated profile for its GPU; repeatable (default: the presets' profiles)")
    p.add_argument("--max-mape", type=float, metavar="P", help="exit 1 when the MAPE of the fitted points exceeds P percent (default: no threshold)")
    add_json_option(p)


def run(args) -> int:
    from calibration.data import load_points
    from calibration.fit import evaluate_point
    from calibration.memory_checks import memory_checks
    from calibration.profile import read_profile, with_profile
    from calibration.resolve import resolve
    from mofa.report import render_validation

    profiles = {}
    for path in args.profile:
        try:
            name, efficiency = read_profile(path)
        except (OSError, ValueError) as exc:  # pydantic and YAML errors are ValueErrors
            print(f"mofa validate: {path}: {str(exc).splitlines()[0]}", file=sys.stderr)
            return 2
        profiles[name] = efficiency
    rows, efficiencies = [], {}
    for point in load_points(args.data):
        hw = point.problem.hardware
        efficiencies[hw.name] = hw.efficiency
        if hw.name in profiles:
            hw = with_profile(hw, profiles[hw.name])
        cfg, chosen = resolve(point, hw)
        ev = evaluate_point(point, hw, cfg)
        pred, fits, tflops = float(ev.step_time_s[0]), bool(ev.fits[0]), float(ev.tflops_per_gpu[0])
        meas = point.step_time_s()
        rows.append({
            "name": point.name,
            "hardware": hw.name,
            "fitted": point.measured.fit,
            "metric": point.measured.metric,
            "predicted_step_s": pred,
            "measured_step_s": meas,
            "error_pct": 100.0 * (pred / meas - 1.0),
            # both as evaluate counts model FLOPs (eq. 15): the same work over each step time
            "predicted_tflops_per_gpu": tflops,
            "measured_tflops_per_gpu": tflops * pred / meas,
            "fits_memory": fits,
            "resolved": chosen,
            "source": point.measured.source,
        })
    out = summary(rows, profiles, efficiencies)
    out["memory_checks"] = memory_checks()
    print(to_json(stamped(out, list(args.data))) if args.json else render_validation(out))
    if args.max_mape is not None and out["mape_pct"] is not None and out["mape_pct"] > args.max_mape:
        print(f"mofa validate: MAPE {out['mape_pct']:.2f}% exceeds --max-mape {args.max_mape}", file=sys.stderr)
        return 1
    return 0


def summary(rows: list[dict], profiles: dict, efficiencies: dict) -> dict:
    fitted = [r for r in rows if r["fitted"]]
    per = {}
    for name in sorted({r["hardware"] for r in rows}):
        group = [r for r in fitted if r["hardware"] == name]
        eff = profiles.get(name) or efficiencies[name]
        cal = eff.calibration
        per[name] = {
            "points": len(group),
            "mape_pct": sum(abs(r["error_pct"]) for r in group) / len(group) if group else None,
            "max_abs_error_pct": max((abs(r["error_pct"]) for r in group), default=None),
            "loo_mape_pct": cal.loo_mape_pct if cal else None,
            "profile": "calibrated" if cal else "default",
        }
    return {
        "points": rows,
        "mape_pct": sum(abs(r["error_pct"]) for r in fitted) / len(fitted) if fitted else None,
        "max_abs_error_pct": max((abs(r["error_pct"]) for r in fitted), default=None),
        "per_hardware": per,
    }
