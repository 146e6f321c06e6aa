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
    p.add_argument("--pipeline-layout", metavar="LAYOUT",
                   help="also score the configuration with this heterogeneous pipeline layout, in Megatron Core's layout "
                        "string (e.g. 'Et*3|(tt|)*29,|mL'), next to its own split, both on the simulated schedule with "
                        "every rank's own memory ledger; with --json the launch plan takes the layout (default: none)")
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
    layout = None
    if args.pipeline_layout is not None:
        from costmodel.stage_layout import LayoutError
        from optimizer.layout_report import given_layout_report

        try:
            spec = problem.config
            block = (spec.recompute_num_layers or 1) if spec.recompute == "full" and spec.recompute_method == "block" else None
            result["pipeline_layout"], layout = given_layout_report(problem, batch, args.pipeline_layout, block)
        except LayoutError as exc:
            raise ProblemError(args.problem, "--pipeline-layout", str(exc)) from None
    if args.json:  # the typed launch plan `mofa export` reads
        from mofa.launch.plan import build_plan, with_pipeline_layout

        plan = build_plan(problem, batch.spec(0), result["checkpoint_interval"])
        if layout is not None:  # with full recompute, the N the layout was scored with (block method)
            from optimizer.layout_report import launch_recompute

            recompute = launch_recompute(layout) if "recompute" in result["pipeline_layout"] else {}
            plan = with_pipeline_layout(plan, layout).model_copy(update=recompute)
        result["plan"] = plan.model_dump(mode="json")
    text = render_evaluation(problem.name, result)
    if layout is not None:
        text += "\n" + render_given_layout(result["pipeline_layout"])
    emit(stamped(result, args.problem) if args.json else result, args.json, text)
    return 0


def render_given_layout(report: dict) -> str:
    gib = [b / 2**30 for b in report["peak_bytes"]]
    fits = "fits" if report["fits"] else "does NOT fit"
    split = f"{report['megatron_split_step_time_s']:.4f} s" + ("" if report["megatron_split_fits"] else ", does not fit")
    line = (f"pipeline layout (given; simulated schedule, costmodel.stage_layout): step {report['step_time_s']:.4f} s against "
            f"{split} for the configuration's split ({100 * report['gain']:+.2f}%); peak {max(gib):.1f} GiB on rank "
            f"{report['worst_rank']} ({min(gib):.1f}-{max(gib):.1f} over the ranks), {fits}\n  --pipeline-model-parallel-layout {report['layout']}")
    if max(report["host_bytes"]) > report["host_share_bytes"]:
        line += f"\n  host memory short: {max(report['host_bytes']) / 1e9:.0f} GB on a rank, {report['host_share_bytes'] / 1e9:.0f} GB a GPU's share"
    if "recompute" in report:
        line += f"\n  recompute per stage {report['recompute']} (the configuration's recompute on every stage)"
    return line
