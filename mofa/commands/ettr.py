"""`mofa ettr`: effective training time ratio, optimal checkpoint interval (eq. 44) and
end-to-end time from the fault-tolerance inputs alone."""

from __future__ import annotations

import math
import sys

from mofa.commands._common import add_json_option, emit, stamped

NAME = "ettr"
HELP = "effective training time ratio, optimal checkpoint interval, end-to-end time"
DESCRIPTION = "ETTR, the optimal checkpoint interval (MoFa eq. 44) and the end-to-end time of a job, from its failure and checkpoint inputs (MoFa eqs. 36-44)."


def add_arguments(p) -> None:
    p.add_argument("--nodes", type=int, required=True, help="nodes in the job")
    p.add_argument("--failure-rate", type=float, required=True, metavar="R_PER_NODE_DAY", help="failures per node per day (r_f)")
    p.add_argument("--repair-time", type=float, required=True, metavar="U_B_S", help="mean seconds to recover from one failure (u_b)")
    p.add_argument("--save-time", type=float, required=True, metavar="T_SAVE_S", help="blocking seconds per checkpoint save (T_save)")
    p.add_argument("--step-time", type=float, required=True, metavar="T_STEP_S", help="seconds per training step")
    p.add_argument("--steps", type=int, help="training steps; gives the end-to-end time (default: none, ETTR only)")
    p.add_argument("--interval", type=int, help="checkpoint interval in steps (default: the optimal one, eq. 44)")
    p.add_argument("--first-init", type=float, default=0.0, metavar="U_0_S", help="seconds to start the job the first time (u_0)")
    add_json_option(p)


def _bad(args) -> str | None:
    for name in ("failure_rate", "repair_time", "save_time", "first_init", "step_time"):
        if not math.isfinite(getattr(args, name)):
            return f"--{name.replace('_', '-')} must be a finite number"
    for name in ("nodes", "step_time"):
        if getattr(args, name) <= 0:
            return f"--{name.replace('_', '-')} must be positive"
    for name in ("failure_rate", "repair_time", "save_time", "first_init"):
        if getattr(args, name) < 0:
            return f"--{name.replace('_', '-')} must not be negative"
    if args.interval is not None and args.interval <= 0 or args.steps is not None and args.steps <= 0:
        return "--interval and --steps must be positive"
    return None


def run(args) -> int:
    import numpy as np

    from costmodel.reliability import end_to_end_s, failure_rate_per_s, optimal_interval, steady_state_ettr
    from mofa.report import duration

    problem = _bad(args)
    if problem:
        print(f"mofa ettr: {problem}", file=sys.stderr)
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
    mttf = f"{out['job_mttf_h']:.2f} h" if out["job_mttf_h"] else "no failures"
    text = [
        f"job mean time to failure: {mttf} ({args.nodes} nodes x {args.failure_rate} failures/node/day)",
        f"optimal checkpoint interval (eq. 44): {best} steps ({best * args.step_time:,.0f} s)",
        f"ETTR at interval {interval}: {100 * out['ettr']:.2f}%",
    ]
    if args.steps:
        text.append(f"end-to-end time for {args.steps:,} steps: {duration(out['e2e_time_s'])}")
    emit(stamped(out, None), args.json, "\n".join(text))
    return 0
