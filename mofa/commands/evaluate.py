"""`mofa evaluate`: score the configuration of a problem file."""

from __future__ import annotations

from costmodel.loader import ProblemError
from mofa.commands._common import (add_convention_option, add_json_option, add_set_option, add_simulate_option, convention_sets, emit, pipeline_replay,
                                   stamped, with_interval)

NAME = "evaluate"
HELP = "score one configuration of a problem"
DESCRIPTION = "Score the configuration of a problem file (its config section, overridden by --set): step time and its breakdown, memory, MFU, ETTR and end-to-end time."


def add_arguments(p) -> None:
    p.add_argument("problem", help="problem file (YAML)")
    add_set_option(p, "tp=8, training.seq_len=4096")
    add_convention_option(p)
    add_simulate_option(p, "the configuration")
    add_json_option(p)


def run(args) -> int:
    from costmodel.configs import ConfigBatch
    from costmodel.evaluate import evaluate
    from costmodel.loader import load_problem
    from mofa.report import render_evaluation

    problem = load_problem(args.problem, convention_sets(args))
    if problem.config is None:
        raise ProblemError(args.problem, "config", "no configuration to evaluate: add a config section or --set tp=... pp=...")
    batch = ConfigBatch.from_specs(problem, [problem.config])
    result = evaluate(problem, batch, bounds=True).as_dict(0, batch)
    result = with_interval(problem, result)
    if args.simulate:
        result["pipeline_replay"] = pipeline_replay(problem, batch)
    if args.json:  # the typed launch plan `mofa export` reads
        from mofa.launch.plan import build_plan

        result["plan"] = build_plan(problem, batch.spec(0), result["checkpoint_interval"]).model_dump(mode="json")
    emit(stamped(result, args.problem) if args.json else result, args.json, render_evaluation(problem.name, result))
    return 0
