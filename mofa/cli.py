"""The `mofa` command line."""

from __future__ import annotations

import argparse
import json
import sys

from costmodel.loader import ProblemError
from mofa.report import finite


def _emit(obj, as_json: bool, text: str) -> None:
    print(json.dumps(finite(obj), indent=2, allow_nan=False) if as_json else text)


# --------------------------------------------------------------------------------------
# Each command imports what it needs when it runs: numpy, the model and OR-Tools stay out of
# `mofa --help` and of the commands that do not use them.
def cmd_evaluate(args) -> int:
    from costmodel.configs import ConfigBatch
    from costmodel.evaluate import evaluate
    from costmodel.loader import load_problem
    from mofa.report import render_evaluation

    problem = load_problem(args.problem, args.set)
    if problem.config is None:
        raise ProblemError(args.problem, "config", "no configuration to evaluate: add a config section or --set tp=... pp=...")
    batch = ConfigBatch.from_specs(problem, [problem.config])
    result = evaluate(problem, batch).as_dict(0, batch)
    result = _with_interval(problem, result)
    _emit(result, args.json, render_evaluation(problem.name, result))
    return 0


def _with_interval(problem, result: dict) -> dict:
    """Attach the calibration uncertainty interval when the hardware profile carries one."""
    from costmodel.uncertainty import step_time_interval

    interval = step_time_interval(problem.hardware, result["step_time_s"])
    if interval is not None:
        result["step_time_interval_s"] = list(interval)
    return result


def cmd_ettr(args) -> int:
    import math

    import numpy as np

    from costmodel.reliability import end_to_end_s, failure_rate_per_s, optimal_interval, steady_state_ettr

    for name in ("failure_rate", "repair_time", "save_time", "first_init", "step_time"):
        if not math.isfinite(getattr(args, name)):
            print(f"mofa ettr: --{name.replace('_', '-')} must be a finite number", file=sys.stderr)
            return 2
    for name in ("nodes", "step_time"):
        if getattr(args, name) <= 0:
            print(f"mofa ettr: --{name.replace('_', '-')} must be positive", file=sys.stderr)
            return 2
    for name in ("failure_rate", "repair_time", "save_time", "first_init"):
        if getattr(args, name) < 0:
            print(f"mofa ettr: --{name.replace('_', '-')} must not be negative", file=sys.stderr)
            return 2
    if args.interval is not None and args.interval <= 0 or args.steps is not None and args.steps <= 0:
        print("mofa ettr: --interval and --steps must be positive", file=sys.stderr)
        return 2
    rate = failure_rate_per_s(args.nodes, args.failure_rate)
    best = int(optimal_interval(np.array([args.step_time]), rate, args.repair_time, args.save_time)[0])
    interval = args.interval or best
    out = {
        "nodes": args.nodes,
        "failure_rate_per_node_day": args.failure_rate,
        "job_mttf_h": (1.0 / rate / 3600.0) if rate > 0 else None,
        "optimal_interval": best,
        "interval": interval,
        "ettr": float(steady_state_ettr(args.step_time, interval, rate, args.repair_time, args.save_time)),
        "e2e_time_s": None,
    }
    if args.steps:
        e2e = float(end_to_end_s(args.steps, args.step_time, interval, rate, args.repair_time, args.save_time, args.first_init))
        out["e2e_time_s"] = e2e
        out["ettr_with_steps"] = args.steps * args.step_time / e2e if e2e != float("inf") else 0.0
    from mofa.report import duration

    mttf = f"{out['job_mttf_h']:.2f} h" if out["job_mttf_h"] else "no failures"
    text = [
        f"job mean time to failure: {mttf} ({args.nodes} nodes x {args.failure_rate} failures/node/day)",
        f"optimal checkpoint interval (eq. 44): {best} steps ({best * args.step_time:,.0f} s)",
        f"ETTR at interval {interval}: {100 * out['ettr']:.2f}%",
    ]
    if args.steps:
        text.append(f"end-to-end time for {args.steps:,} steps: {duration(out['e2e_time_s'])}")
    _emit(out, args.json, "\n".join(text))
    return 0


# --------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mofa", description="Predict and optimise LLM pretraining runs (MoFa).")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("evaluate", help="score one configuration of a problem")
    p.add_argument("problem")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config (tp=8) or any field (training.seq_len=4096)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("ettr", help="effective training time ratio, optimal checkpoint interval, end-to-end time")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--failure-rate", type=float, required=True, metavar="R_PER_NODE_DAY")
    p.add_argument("--repair-time", type=float, required=True, metavar="U_B_S")
    p.add_argument("--save-time", type=float, required=True, metavar="T_SAVE_S")
    p.add_argument("--step-time", type=float, required=True, metavar="T_STEP_S")
    p.add_argument("--steps", type=int)
    p.add_argument("--interval", type=int)
    p.add_argument("--first-init", type=float, default=0.0, metavar="U_0_S")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ettr)

    from mofa import commands

    commands.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from costmodel.arrays import tune_allocator

    parser = build_parser()
    args = parser.parse_args(argv)
    tune_allocator()
    try:
        return args.func(args)
    except ProblemError as exc:
        print(f"mofa {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
