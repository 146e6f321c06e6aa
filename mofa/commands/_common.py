"""What several commands share: JSON/text output, provenance stamps, problem loading for
the searches, the calibration interval. Light imports only (this is loaded for --help)."""

from __future__ import annotations

import argparse
import sys

import json

from mofa.report import finite
from mofa.version import version

#: `mofa solve` found nothing to launch (infeasible, or the time limit ran out first)
EXIT_INFEASIBLE = 1


def stamped(obj: dict, inputs: str | list[str] | None) -> dict:
    """The tool's version and the input file(s) first, then the result: a JSON output says
    what produced it from what."""
    head = {"mofa_version": version()}
    if inputs is not None:
        head["input"] = inputs
    return {**head, **{k: v for k, v in obj.items() if k not in head}}


def to_json(obj) -> str:
    return json.dumps(finite(obj), indent=2, allow_nan=False)


def emit(obj, as_json: bool, text: str) -> None:
    print(to_json(obj) if as_json else text)


def with_interval(problem, result: dict) -> dict:
    """Attach the calibration uncertainty interval when the hardware profile carries one."""
    from costmodel.uncertainty import step_time_interval

    interval = step_time_interval(problem.hardware, result["step_time_s"])
    if interval is not None:
        result["step_time_interval_s"] = list(interval)
    return result


def load_for_search(path: str, overrides: list[str] | None = None):
    """A problem to search: its fixed configuration, if any, is dropped."""
    from costmodel.loader import load_problem

    problem = load_problem(path, overrides)
    if problem.config is not None:
        problem = problem.model_copy(update={"config": None})
    return problem


def add_set_option(parser, example: str) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a config key or any field by its dotted path ({example}); repeatable (default: none)")


def add_json_option(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text (default: text)")


def add_convention_option(parser) -> None:
    from costmodel.specs import FlopsConvention
    from typing import get_args

    parser.add_argument("--flops-convention", choices=get_args(FlopsConvention), default=None,
                        help="count MFU and TFLOP/s as palm, palm_causal, megatron, verl or tgs (costmodel/flops.py; "
                        "default: the problem's training.flops_convention, itself palm by default)")


def convention_sets(args) -> list[str]:
    """--set overrides with --flops-convention folded in (it is training.flops_convention)."""
    sets = list(getattr(args, "set", []) or [])
    if getattr(args, "flops_convention", None):
        sets.append(f"training.flops_convention={args.flops_convention}")
    return sets


def add_progress_option(parser) -> None:
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="report a long search's progress on stderr every few seconds (default: when stderr is a terminal)")


def progress_printer(args, prefix: str):
    """The callable a DFS reports its progress to (optimizer.dfs.solve_dfs), writing one line
    to stderr each time; None when progress is off (--no-progress, or stderr not a terminal)."""
    wanted = args.progress if args.progress is not None else sys.stderr.isatty()
    if not wanted:
        return None

    def report(r: dict) -> None:
        best = f"{r['best']:.6g}" if r.get("best") is not None else "none yet"
        print(f"{prefix}{r['method']}: {r['leaves']:,} leaves, {r['nodes']:,} nodes, {r['elapsed_s']:.0f} s, best {best}", file=sys.stderr, flush=True)

    return report


def add_simulate_option(parser, what: str) -> None:
    parser.add_argument("--simulate", action="store_true",
                        help=f"replay {what}'s pipeline schedule op by op on the pass times the model priced (MoFa's digital "
                             "twin, costmodel.twin) and report it next to the closed form (default: off)")


def pipeline_replay(problem, cfg) -> dict:
    """The digital twin's replay of the first configuration of a batch, as JSON: the replay,
    or {"refused": why} where there is nothing to replay."""
    from costmodel.evaluate import evaluate
    from costmodel.twin import TwinError, replay_pipeline

    try:
        return replay_pipeline(problem, evaluate(problem, cfg), cfg, 0).as_dict()
    except TwinError as exc:
        return {"refused": str(exc)}
