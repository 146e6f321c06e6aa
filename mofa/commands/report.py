"""`mofa report`: figures (PNG) and a Markdown page from solve and batch results (mofa.charts)."""

from __future__ import annotations

import os
import sys

NAME = "report"
HELP = "draw figures (PNG) and a Markdown summary of solve and batch results"
DESCRIPTION = ("Read batch folders (mofa batch --out), run or solve --out folders and result.json files, and write PNG figures "
               "(memory against capacity, step-time waterfall, top-K, ETTR against checkpoint interval, nodes, failure rate, "
               "repair and save time, the best configuration's step time against the virtual-stage count v and against the "
               "optimizer placement (ZeRO stage, CPU optimizer) with its peak memory, cluster linearity, supernode size against the best EP, throughput heatmaps of sequence length x global batch), "
               "plots.json (the data each figure shows) and report.md linking them. The folder is replaced as a set. "
               "A figure the results cannot support is listed under 'Not drawn'.")


def add_arguments(p) -> None:
    p.add_argument("results", nargs="+", metavar="RESULTS", help="batch folders, run folders, solve --out folders or result.json files")
    p.add_argument("--out", metavar="DIR", help="the report folder (default: FIRST/report when the first result is a batch folder, else ./mofa-report)")


def default_out(first: str) -> str:
    return os.path.join(first, "report") if os.path.isdir(os.path.join(first, "runs")) else "mofa-report"


def run(args) -> int:
    from mofa.atomic import write_file_set
    from mofa.charts import build_report, load_runs, owned

    try:
        runs = load_runs(args.results)
    except ValueError as exc:
        print(f"mofa report: {exc}", file=sys.stderr)
        return 2
    if not runs:
        print(f"mofa report: {', '.join(args.results)}: no runs found", file=sys.stderr)
        return 2
    out = args.out or default_out(args.results[0])
    files, _ = build_report(runs)
    try:
        write_file_set(out, files, owned=owned)
    except OSError as exc:
        print(f"mofa report: cannot write to --out {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    pictures = sorted(n for n in files if n.endswith(".png"))
    print(f"{len(runs)} runs: {len(pictures)} figures and report.md in {out}")
    return 0
