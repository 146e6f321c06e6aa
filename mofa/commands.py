"""Sub-commands beyond evaluate/ettr: search (solve, compare) and calibration."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile

from costmodel.loader import ProblemError
from mofa.report import finite

EXIT_INFEASIBLE = 1


def register(sub) -> None:
    p = sub.add_parser("solve", help="find the best configurations of a problem")
    p.add_argument("problem")
    p.add_argument("--method", choices=("cpsat", "dfs", "exhaustive"), default="cpsat")
    p.add_argument("--objective", choices=("step", "e2e"), help="default: the problem's search.objective")
    p.add_argument("--top", type=int, default=1, metavar="K")
    p.add_argument("--time-limit", type=float, metavar="S")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override any field (search.tp=[4,8])")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", metavar="DIR", help="write result.json, best.yaml and launch configs here")
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser("compare", help="run cpsat, DFS and exhaustive on problems and compare them")
    p.add_argument("problems", nargs="+")
    p.add_argument("--objective", choices=("step", "e2e"))
    p.add_argument("--dfs-time-limit", type=float, default=600.0, metavar="S", help="stop the DFS after this long (default 600)")
    p.add_argument("--max-exhaustive", type=float, default=2e7, metavar="N", help="skip exhaustive above this many configurations")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compare)
    register_calibration(sub)


def _load(path: str, overrides: list[str] | None = None):
    from costmodel.loader import load_problem

    problem = load_problem(path, overrides)
    if problem.config is not None:
        problem = problem.model_copy(update={"config": None})
    return problem


def write_atomically(path: str, text: str) -> None:
    """Write via a temporary file in the same directory and rename: readers never see a
    partial file, and an existing file is only replaced once the new one is complete."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def cmd_solve(args) -> int:
    from mofa.report import render_solve
    from optimizer.result import ObjectiveError
    from optimizer.search import solve

    if args.top < 1:
        print("mofa solve: --top must be at least 1", file=sys.stderr)
        return 2
    if args.time_limit is not None and not (args.time_limit > 0 and math.isfinite(args.time_limit)):
        print("mofa solve: --time-limit must be positive", file=sys.stderr)
        return 2
    problem = _load(args.problem, args.set)
    try:
        result = solve(problem, args.method, args.objective, args.top, args.time_limit)
    except ObjectiveError as exc:
        raise ProblemError(args.problem, "search.objective", str(exc)) from None
    out = finite(result.as_dict(problem))
    from mofa.cli import _with_interval

    for entry in out["top"]:
        _with_interval(problem, entry)
    if args.out:
        try:
            _write_outputs(problem, out, args.out)
        except OSError as exc:
            print(f"mofa solve: cannot write to --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(render_solve(problem, out))
    return EXIT_INFEASIBLE if out["status"] in ("infeasible", "unknown") else 0  # nothing to launch


def _write_outputs(problem, out: dict, directory: str) -> None:
    import yaml

    from mofa.export import ExportError, bridge_overrides, megatron_args

    os.makedirs(directory, exist_ok=True)
    write_atomically(os.path.join(directory, "result.json"), json.dumps(out, indent=2) + "\n")
    best = out.get("best")
    if not best:
        return
    config = dict(best["config"])
    if best.get("checkpoint_interval") is not None:
        config["checkpoint_interval"] = best["checkpoint_interval"]  # the interval eq. 44 chose
    keep = {k: v for k, v in config.items() if k not in ("dp",)}
    write_atomically(os.path.join(directory, "best.yaml"), yaml.safe_dump({"config": keep}, sort_keys=False))
    errors = []
    try:
        env, flags = megatron_args(problem, config)
        lines = ["#!/usr/bin/env bash", "# Megatron-LM launch flags chosen by `mofa solve`", *[f"export {k}={v}" for k, v in env.items()], "MEGATRON_ARGS=("]
        lines += [f"  {flag}" for flag in flags] + [")", 'echo "${MEGATRON_ARGS[@]}"', ""]
        write_atomically(os.path.join(directory, "megatron_args.sh"), "\n".join(lines))
    except ExportError as exc:
        errors.append(f"megatron: {exc}")
    try:
        write_atomically(os.path.join(directory, "bridge_overrides.txt"), "\n".join(bridge_overrides(problem, config)) + "\n")
    except ExportError as exc:
        errors.append(f"bridge: {exc}")
    if errors:
        write_atomically(os.path.join(directory, "export_errors.txt"), "\n".join(errors) + "\n")


def cmd_compare(args) -> int:
    from mofa.report import render_compare
    from optimizer.result import ObjectiveError, check_objective
    from optimizer.search import solve
    from optimizer.space import SearchSpace

    rows = []
    for path in args.problems:
        problem = _load(path)
        objective = args.objective or problem.search.objective
        try:
            check_objective(problem, objective)
        except ObjectiveError as exc:
            raise ProblemError(path, "search.objective", str(exc)) from None
        entry = {"problem": path}
        for method in ("cpsat", "dfs", "exhaustive"):
            if method == "exhaustive" and SearchSpace.from_problem(problem).size > args.max_exhaustive:
                entry[method] = None
                continue
            limit = args.dfs_time_limit if method == "dfs" else None
            r = solve(problem, method, objective, 1, limit)
            entry[method] = {"status": r.status, "objective": r.best_value, "solve_time_s": r.solve_time_s, "evaluated": r.evaluated,
                             "config": r.as_dict(problem)["best"]["config"] if r.best_value is not None else None}
        done = [entry[m]["objective"] for m in ("cpsat", "dfs", "exhaustive") if entry.get(m) and entry[m]["status"] in ("optimal", "infeasible")]
        entry["agree"] = all((a is None and b is None) or (a is not None and b is not None and abs(a - b) <= 1e-9 * max(abs(a), abs(b))) for a, b in zip(done, done[1:]))
        rows.append(entry)
    rows = finite(rows)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(render_compare(rows))
    return 0


def register_calibration(sub) -> None:
    p = sub.add_parser("calibrate", help="fit a hardware profile to measured runs")
    p.add_argument("data", nargs="+", help="validation point files (problems/validation/*.yaml)")
    p.add_argument("--hardware", required=True, help="fit the points on this GPU preset")
    p.add_argument("--knobs", help="comma-separated knobs to fit (default: gemm, attention, node and cluster communication, scale decay, DP-overlap contention)")
    p.add_argument("--no-loo", action="store_true", help="skip leave-one-out cross-validation")
    p.add_argument("--out", metavar="PROFILE.yaml")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("validate", help="compare predictions with measured runs")
    p.add_argument("data", nargs="+")
    p.add_argument("--profile", action="append", default=[], metavar="FILE", help="use this calibrated profile for its GPU")
    p.add_argument("--max-mape", type=float, metavar="P", help="exit 1 when the MAPE of the fitted points exceeds P percent")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)


def cmd_calibrate(args) -> int:
    import yaml

    from calibration.data import load_points
    from calibration.fit import DEFAULT_KNOBS, KNOBS, calibrate
    from calibration.profile import profile_document
    from mofa.report import render_calibration

    points = [p for p in load_points(args.data) if p.hardware == args.hardware]
    if not points:
        print(f"mofa calibrate: none of the data runs on hardware '{args.hardware}'", file=sys.stderr)
        return 2
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        print(f"mofa calibrate: the directory of --out {args.out} does not exist", file=sys.stderr)
        return 2
    knobs = tuple(k.strip() for k in args.knobs.split(",")) if args.knobs else DEFAULT_KNOBS
    unknown = [k for k in knobs if k not in KNOBS]
    if unknown:
        print(f"mofa calibrate: unknown knobs {unknown} (known: {', '.join(KNOBS)})", file=sys.stderr)
        return 2
    try:
        cal = calibrate(points, knobs, loo=not args.no_loo)
    except ValueError as exc:
        print(f"mofa calibrate: {exc}", file=sys.stderr)
        return 2
    command = "mofa calibrate " + " ".join(sorted(os.path.relpath(d) for d in args.data)) + f" --hardware {args.hardware}"
    doc = profile_document(cal, command)
    if args.out:
        header = f"# Calibrated efficiency profile for {args.hardware}, written by:\n#   {command}\n"
        try:
            write_atomically(args.out, header + yaml.safe_dump(doc, sort_keys=False))
        except OSError as exc:
            print(f"mofa calibrate: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    print(json.dumps(finite(doc), indent=2) if args.json else render_calibration(doc))
    return 0


def cmd_validate(args) -> int:
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
    out = _validation_summary(rows, profiles, efficiencies)
    out["memory_checks"] = memory_checks()
    print(json.dumps(finite(out), indent=2) if args.json else render_validation(out))
    if args.max_mape is not None and out["mape_pct"] is not None and out["mape_pct"] > args.max_mape:
        print(f"mofa validate: MAPE {out['mape_pct']:.2f}% exceeds --max-mape {args.max_mape}", file=sys.stderr)
        return 1
    return 0


def _validation_summary(rows: list[dict], profiles: dict, efficiencies: dict) -> dict:
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
