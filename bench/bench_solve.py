"""Time to certified optimum of cpsat, MoFa's DFS and exhaustive enumeration on the shipped
tuning problems, and their ratios.

    python bench/bench_solve.py [--dfs-sample 400] [--full-dfs] [--clusters]

The DFS scores every admissible configuration one at a time, so its time to the certified
optimum is its number of leaves (exactly the configurations the exhaustive enumerator scores)
times the cost of one leaf. The benchmark measures that cost on the first `--dfs-sample`
leaves and projects; with --full-dfs it also runs the DFS to completion on problems where that
takes under ten minutes, which checks the projection. The `path` column says which cpsat path
ran (exhaustive scoring where that costs less than the tables, bound-ordered scoring of the
tables, or the CP-SAT model: optimizer.cpsat.choose_path).

With --clusters it times the cluster-choosing problems (problems/clusters: every candidate
GPU type and count solved, then the Pareto front) with cpsat and exhaustive, per cluster.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from costmodel.arrays import tune_allocator  # noqa: E402
from costmodel.loader import load_problem  # noqa: E402
from optimizer.dfs import solve_dfs  # noqa: E402
from optimizer.search import solve  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dfs-sample", type=int, default=400)
    parser.add_argument("--full-dfs", action="store_true")
    parser.add_argument("--clusters", action="store_true", help="time the cluster-choosing problems instead")
    parser.add_argument("problems", nargs="*")
    args = parser.parse_args()
    tune_allocator()
    if args.clusters:
        bench_clusters(args.problems or sorted(glob.glob(os.path.join(ROOT, "problems", "clusters", "*.yaml"))))
        return
    paths = args.problems or sorted(glob.glob(os.path.join(ROOT, "problems", "tuning", "*.yaml")))
    print(f"{'problem':40s} {'cpsat s':>8s} {'exh s':>7s} {'DFS s':>10s} {'DFS/cpsat':>10s} {'exh/cpsat':>9s} {'leaves':>8s} {'agree':>5s}  path")
    for path in paths:
        problem = load_problem(path)
        cp = solve(problem, "cpsat")
        ex = solve(problem, "exhaustive")
        probe = solve_dfs(problem, problem.search.objective, 1, max_leaves=args.dfs_sample)
        per_leaf = probe.solve_time_s / max(probe.evaluated, 1)
        projected = per_leaf * ex.evaluated
        label = f"{projected:9.0f}p"
        if args.full_dfs and projected < 600:
            full = solve_dfs(problem, problem.search.objective, 1)
            label = f"{full.solve_time_s:9.1f} "
            projected = full.solve_time_s
        agree = (cp.best_value is None and ex.best_value is None) or (
            cp.best_value is not None and ex.best_value is not None and abs(cp.best_value - ex.best_value) <= 1e-9 * ex.best_value
        )
        name = os.path.basename(path)[:-5]
        print(f"{name:40s} {cp.solve_time_s:8.2f} {ex.solve_time_s:7.2f} {label:>10s} {projected / cp.solve_time_s:10.0f} {ex.solve_time_s / cp.solve_time_s:9.2f} {ex.evaluated:8d} {str(agree):>5s}  {cp.stats.get('path', '-')}", flush=True)
    print("DFS column: 'p' = projected from the measured cost of one leaf times the leaves the DFS must score")


def bench_clusters(paths: list[str]) -> None:
    """Seconds to the certified choice and Pareto front, cpsat against exhaustive, and whether
    they choose the same cluster and the same front."""
    from optimizer.cluster import solve_clusters

    print(f"{'problem':40s} {'clusters':>8s} {'cpsat s':>8s} {'exh s':>7s} {'exh/cpsat':>9s} {'front':>5s} {'agree':>5s}")
    for path in paths:
        problem = load_problem(path)
        cp = solve_clusters(problem, "cpsat", pareto=True)
        ex = solve_clusters(problem, "exhaustive", pareto=True)

        def key(s):
            return (None if s.best is None else s.best.choice.label, [r.choice.label for r in s.front])

        name = os.path.basename(path)[:-5]
        print(f"{name:40s} {len(cp.rows):8d} {cp.solve_time_s:8.2f} {ex.solve_time_s:7.2f} {ex.solve_time_s / cp.solve_time_s:9.2f} "
              f"{len(cp.front):5d} {str(key(cp) == key(ex)):>5s}", flush=True)
        for a, b in zip(cp.rows, ex.rows):
            print(f"  {a.choice.label:38s} {'':8s} {a.result.solve_time_s:8.2f} {b.result.solve_time_s:7.2f} "
                  f"{b.result.solve_time_s / a.result.solve_time_s:9.2f}  {a.result.stats.get('path', '-')}", flush=True)


if __name__ == "__main__":
    main()
