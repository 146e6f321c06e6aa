"""`mofa solve`: find the best configurations of a problem, optionally writing the launch
files of the best one to a folder."""

from __future__ import annotations

import functools
import json
import math
import sys

from costmodel.loader import ProblemError
from mofa.atomic import check_target, write_file_set
from mofa.commands._common import (EXIT_INFEASIBLE, add_convention_option, add_json_option, add_progress_option, add_set_option, add_simulate_option,
                                   convention_sets, load_for_search, pipeline_replay, progress_printer, stamped, with_interval)
from mofa.report import finite

NAME = "solve"
HELP = "find the best configurations of a problem"
DESCRIPTION = ("Find the configurations of a problem that minimise the step time or the end-to-end time. "
               "Exit code 1 when there is nothing to launch (no admissible configuration, or none found before --time-limit).")


def add_arguments(p) -> None:
    p.add_argument("problem", help="problem file (YAML)")
    p.add_argument("--method", choices=("cpsat", "dfs", "exhaustive"), default="cpsat",
                   help="cpsat: CP-SAT tuner certified by the exact model; dfs: MoFa's depth-first search; exhaustive: score every configuration")
    p.add_argument("--objective", choices=("step", "e2e"), help="minimise the step time or the end-to-end time (default: the problem's search.objective)")
    p.add_argument("--top", type=int, default=1, metavar="K", help="report the K best configurations")
    add_distinct_option(p)
    p.add_argument("--time-limit", type=float, metavar="S", help="stop the search after S seconds (default: no limit)")
    p.add_argument("--pipeline-layouts", action="store_true",
                   help="then search the best configuration's heterogeneous pipeline layout (layers per virtual stage, CP-SAT certified "
                        "by the simulated schedule) and launch it with --pipeline-model-parallel-layout where it beats the split (default: off)")
    p.add_argument("--layout-time-limit", type=float, default=10.0, metavar="S", help="time for the layout search (default: 10)")
    p.add_argument("--pareto", action="store_true",
                   help="solve every candidate cluster (search.num_gpus, search.hardware) and report the certified Pareto front of "
                        "(time to train, GPUs or cost, ETTR) (default: off)")
    add_simulate_option(p, "the best configuration")
    add_framework_option(p)
    add_progress_option(p)
    add_set_option(p, "search.tp=[4,8], training.seq_len=4096")
    add_convention_option(p)
    add_json_option(p)
    p.add_argument("--out", metavar="DIR",
                   help="write result.json, best.yaml and the best configuration's launch files (megatron_launch.sh, bridge_overrides.txt, "
                        "torchtitan_launch.sh, deepspeed_config.json; export_errors.txt says which formats were refused and why) here, "
                        "replacing the folder's previous set (default: write nothing)")


def add_framework_option(p) -> None:
    p.add_argument("--framework", choices=("any", "megatron", "megatron-bridge", "torchtitan", "deepspeed"),
                   help="search only what this framework runs, by the rules its exporter refuses by; sets search.framework "
                        "(default: the problem's search.framework, else any)")


def framework_override(args) -> list[str]:
    """--framework as the --set override of search.framework it stands for."""
    return [f"search.framework={args.framework}"] if getattr(args, "framework", None) else []


def add_distinct_option(p) -> None:
    p.add_argument("--distinct-layouts", action="store_true",
                   help="make the top K differ in layout (tp, cp, pp, vp, ep, dp, mbs, ZeRO stage): keep the best configuration "
                        "of each layout, not several that differ only in a toggle (default: off)")


def run(args) -> int:
    from mofa.report import render_replay, render_solve

    if args.top < 1:
        print("mofa solve: --top must be at least 1", file=sys.stderr)
        return 2
    if args.time_limit is not None and not (args.time_limit > 0 and math.isfinite(args.time_limit)):
        print("mofa solve: --time-limit must be positive", file=sys.stderr)
        return 2
    if not (args.layout_time_limit > 0 and math.isfinite(args.layout_time_limit)):
        print("mofa solve: --layout-time-limit must be positive", file=sys.stderr)
        return 2
    problem = load_for_search(args.problem, convention_sets(args) + framework_override(args))
    if args.out:
        try:
            check_target(args.out, OUTPUT_FILES)  # refuse a folder of other files before searching
        except OSError as exc:
            print(f"mofa solve: cannot write to --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    out, plans = solve_output(problem, args.problem, args.method, args.objective, args.top, args.time_limit, args.distinct_layouts,
                              args.layout_time_limit if args.pipeline_layouts else None, args.pareto,
                              progress_printer(args, f"mofa solve {args.problem}: "), args.simulate)
    if args.out:
        try:
            write_outputs(problem, out, args.out, plans)
        except OSError as exc:
            print(f"mofa solve: cannot write to --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(render_solve(problem, out))
        if out.get("pipeline_replay"):
            print(render_replay(out["pipeline_replay"]))
        if out.get("pipeline_layout"):
            print(render_layout(out["pipeline_layout"]))
        if out.get("clusters"):
            from mofa.report import render_clusters

            print()
            print(render_clusters(out["clusters"]))
        if out.get("exports"):
            print(render_exports(out["exports"]))
    return EXIT_INFEASIBLE if out["status"] in ("infeasible", "unknown") else 0  # nothing to launch


def solve_output(problem, source: str, method: str, objective: str | None, top: int, time_limit_s: float | None,
                 distinct_layouts: bool = False, layout_time_limit_s: float | None = None, pareto: bool = False, progress=None,
                 simulate: bool = False):
    """(the JSON result `solve --json` prints and result.json holds, the top configurations'
    typed launch plans): what `mofa solve` and each run of `mofa batch` compute.
    layout_time_limit_s: search the best configuration's pipeline layout for this long
    (optimizer.layout_search; None: no layout search); `pipeline_layout` reports it, and the
    best plan carries the layout where it beats the configuration's own split. A problem
    that chooses its cluster (search.num_gpus / search.hardware lists, a cluster objective,
    deadline or budget), or `pareto`, solves every candidate cluster (optimizer.cluster): the
    result is the chosen cluster's, with `clusters` listing them all (and the front). simulate:
    replay the best configuration's pipeline (costmodel.twin) as `pipeline_replay`."""
    from optimizer.result import ObjectiveError
    from optimizer.search import solve

    if progress is not None:
        solve = functools.partial(solve, progress=progress)
    clusters = None
    try:
        if problem.search.chooses_cluster or pareto:
            from optimizer.cluster import solve_clusters

            clusters = solve_clusters(problem, method, top, time_limit_s, distinct_layouts, pareto, solve)
            row = clusters.best or clusters.rows[0]
            problem, result = row.problem, row.result
        else:
            result = solve(problem, method, objective, top, time_limit_s, distinct_layouts)
    except ObjectiveError as exc:
        raise ProblemError(source, "search.objective", str(exc)) from None
    out = stamped(finite(result.as_dict(problem)), source)
    if clusters is not None:
        out["clusters"] = finite(clusters.as_dict())
        out["status"], out["gap"], out["solve_time_s"] = clusters.status, clusters.gap, clusters.solve_time_s
        if clusters.best is None:  # no cluster admitted: nothing to launch
            out["best"], out["top"] = None, []
    out["distinct_layouts"] = distinct_layouts
    for entry in out["top"]:
        with_interval(problem, entry)
    plans = result.plans(problem) if out["top"] else []
    if simulate and out.get("best"):  # the skeleton's schedule (a layout search replays its own layouts)
        out["pipeline_replay"] = finite(pipeline_replay(problem, result.top_configs.take([0])))
    if layout_time_limit_s is not None and out.get("best"):
        from mofa.launch.plan import with_pipeline_layout
        from optimizer.layout_report import launch_recompute, layout_report

        try:
            report, layout = layout_report(problem, result.top_configs.take([0]), layout_time_limit_s)
        except KeyboardInterrupt:  # Ctrl-C: the solved configuration stands, with its own split
            report, layout = {"refused": "interrupted (Ctrl-C) before it ended: the configuration's own split stands",
                              "interrupted": True}, None
        out["pipeline_layout"] = finite(report)
        if layout is not None:
            # a configuration with full recompute: the layout chose its recompute too (one N, block method)
            recompute = launch_recompute(layout) if "recompute" in report else {}
            plans = [with_pipeline_layout(plans[0], layout).model_copy(update=recompute), *plans[1:]]
            flags = plans[0].pipeline_layout is None  # a first/last split builds it: launched by the split flags
            out["pipeline_layout"]["launched_as"] = (f"{plans[0].layer_split} split, first/last {plans[0].first_stage_layers}/"
                                                     f"{plans[0].last_stage_layers}" if flags else "pipeline_layout")
            out["best"]["plan"] = plans[0].model_dump(mode="json")
            out["top"][0]["plan"] = out["best"]["plan"]
    if out.get("best"):
        out["exports"] = export_report(plans[0])
    return out, plans


#: every file `solve --out` may write (megatron_args.sh: earlier versions'); a folder holding only these can be replaced
OUTPUT_FILES = ("result.json", "best.yaml", "megatron_launch.sh", "bridge_overrides.txt", "torchtitan_launch.sh",
                "deepspeed_config.json", "export_errors.txt", "megatron_args.sh")


def render_layout(report: dict) -> str:
    if "refused" in report:
        return f"pipeline layout search: {report['refused']}"
    status = "optimal makespan" if report["optimal"] else f"makespan gap {100 * (report['gap'] or 0):.2f}%"
    # the search minimises the makespan; the step's own gap adds the busiest rank's update above the least
    status += f", step gap {100 * report['step_gap']:.2f}%"
    if report.get("interrupted"):
        status += ", stopped by Ctrl-C: the best so far"
    # "in the launch plan", not "launched": the exporters below may still refuse the plan (DualPipeV, MTP modules)
    verdict = "in the launch plan" if report["applied"] else "not better than the split: the split stays in the launch plan"
    return (f"pipeline layout ({status}, {report['search_time_s']:.1f} s, {report['space_size']:.1e} layouts): "
            f"{report['step_time_s']:.4f} s against {report['megatron_split_step_time_s']:.4f} s for the split "
            f"({100 * report['gain']:+.2f}%), {verdict}\n  --pipeline-model-parallel-layout {report['layout']}"
            + (f"\n  launched by the {report['launched_as']} flags, which build it" if report.get("launched_as", "pipeline_layout") != "pipeline_layout" else "")
            + render_layout_regular(report) + render_layout_recompute(report))


def render_layout_regular(report: dict) -> str:
    """Where the free search is not certified: what its first phase proved among regular
    layouts (a rank's chunks within one layer), often the split certified there: the gap left
    is then the irregular layouts'."""
    regular = report.get("regular")
    if report["optimal"] or not regular:
        return ""
    status = "certified optimal" if regular["optimal"] else f"step gap {100 * regular['step_gap']:.2f}%"
    return f"\n  among regular layouts (a rank's chunks within one layer): {regular['step_time_s']:.4f} s, {status} there"


def render_layout_recompute(report: dict) -> str:
    """The recompute a layout search chose (configurations with full recompute), and whether
    Megatron's one --recompute-num-layers expresses the best per-stage counts."""
    if "recompute" not in report:
        return ""
    n = report["recompute_num_layers"]
    line = f"\n  recompute per stage {report['recompute']}: " + ("none" if n == 0 else f"--recompute-method block --recompute-num-layers {n}")
    if not report["recompute_expressible"]:
        other = report["best_any_recompute"]
        line += (f"\n  (the best per-stage recompute, {other['recompute']} at {other['step_time_s']:.4f} s, is no one "
                 f"--recompute-num-layers: the best layout with one N is reported and launched)")
    return line


def render_exports(exports: dict) -> str:
    lines = ["launch configs of the best configuration:"]
    for fmt, what in exports.items():
        lines.append(f"  {fmt}: " + (f"refused: {what['refused']}" if "refused" in what else what["file"]))
    return "\n".join(lines)


def export_report(plan) -> dict:
    """{format: {"file": name} or {"refused": why}} for the best configuration's plan."""
    from mofa.launch import FORMATS, export_all

    _, refused = export_all(plan)
    return {fmt: ({"refused": refused[fmt]} if fmt in refused else {"file": name}) for fmt, (name, _) in FORMATS.items()}


def output_files(problem, out: dict, plans=None) -> dict[str, str]:
    """{file name: text} of the set `solve --out` writes for this result: the launch files
    come from the best configuration's typed plan (`plans`, best first; else the plan the
    result stores), never from its printed dict."""
    import yaml

    from mofa.launch import export_all
    from mofa.launch.plan import LaunchPlan

    files = {"result.json": json.dumps(out, indent=2) + "\n"}
    best = out.get("best")
    if not best:
        return files
    plan = plans[0] if plans else LaunchPlan.model_validate(best["plan"])
    config = dict(best["config"])
    if best.get("checkpoint_interval") is not None:
        config["checkpoint_interval"] = best["checkpoint_interval"]  # the interval eq. 44 chose
    keep = {k: v for k, v in config.items() if k not in ("dp",)}
    files["best.yaml"] = yaml.safe_dump({"config": keep}, sort_keys=False)
    exported, refused = export_all(plan)
    files.update(exported)
    if refused:
        files["export_errors.txt"] = "".join(f"{fmt}: {why}\n" for fmt, why in refused.items())
    return files


def write_outputs(problem, out: dict, directory: str, plans=None) -> None:
    """Replace the folder's set of files as a whole: a run killed at any moment leaves the
    previous set or this one, and no file of an earlier run this one did not write."""
    write_file_set(directory, output_files(problem, out, plans), owned=OUTPUT_FILES)
