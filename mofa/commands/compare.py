"""`mofa compare`: run the three search methods on problems and check that they agree."""

from __future__ import annotations

import json
import sys

from costmodel.loader import ProblemError
from mofa.commands._common import add_json_option, add_progress_option, load_for_search, progress_printer, stamped
from mofa.report import finite

NAME = "compare"
HELP = "run cpsat, DFS and exhaustive on problems and compare them"
DESCRIPTION = "Solve each problem with the CP-SAT tuner, MoFa's DFS and exhaustive enumeration and check that the finished methods agree."


def add_arguments(p) -> None:
    p.add_argument("problems", nargs="+", help="problem files (YAML)")
    p.add_argument("--objective", choices=("step", "e2e"), help="minimise the step time or the end-to-end time (default: each problem's search.objective)")
    p.add_argument("--dfs-time-limit", type=float, default=600.0, metavar="S", help="stop the DFS after this many seconds")
    p.add_argument("--max-exhaustive", type=float, default=2e7, metavar="N", help="skip exhaustive enumeration above this many configurations")
    add_progress_option(p)
    add_json_option(p)


def run(args) -> int:
    from mofa.report import render_compare
    from optimizer.result import ObjectiveError, check_objective
    from optimizer.search import solve
    from optimizer.space import SearchSpace

    rows = []
    for number, path in enumerate(args.problems, 1):
        prefix = f"mofa compare [{number}/{len(args.problems)}] {path}: "
        report = progress_printer(args, prefix)
        problem = load_for_search(path)
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
            r = solve(problem, method, objective, 1, limit, **({"progress": report} if report is not None else {}))
            if report is not None:
                print(f"{prefix}{method} {r.status} in {r.solve_time_s:.1f} s", file=sys.stderr, flush=True)
            entry[method] = {"status": r.status, "objective": r.best_value, "solve_time_s": r.solve_time_s, "evaluated": r.evaluated,
                             "config": r.as_dict(problem)["best"]["config"] if r.best_value is not None else None}
        done = [entry[m]["objective"] for m in ("cpsat", "dfs", "exhaustive") if entry.get(m) and entry[m]["status"] in ("optimal", "infeasible")]
        entry["agree"] = all((a is None and b is None) or (a is not None and b is not None and abs(a - b) <= 1e-9 * max(abs(a), abs(b))) for a, b in zip(done, done[1:]))
        rows.append(entry)
    rows = finite(rows)
    if args.json:
        # a list, one entry per problem; each carries the version and its input file
        print(json.dumps([stamped(row, row["problem"]) for row in rows], indent=2))
    else:
        print(render_compare(rows))
    return 0
