"""`mofa solve --pipeline-layouts` on every shipped tuning problem, run twice: the layout each
launches, its certificate and search time, and whether the two runs gave the same answer.

    python bench/bench_shipped_layouts.py [--runs 2] [PROBLEM.yaml ...]

Each run is the command a user types (`mofa solve P --pipeline-layouts --json`, a fresh process,
the default 10 s layout limit), so the search times include nothing but the layout search and
the answers are compared whole, timings aside (`stats`, `solve_time_s`, `search_time_s`): the
README's "Determinism" paragraph rests on this table. An infeasible problem is listed as such.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOLATILE = ("stats", "solve_time_s", "search_time_s")


def without_timings(value):
    """The answer with its timings left out, for comparing runs."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in VOLATILE}
    return [without_timings(v) for v in value] if isinstance(value, list) else value


def solve(path: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "mofa", "solve", path, "--pipeline-layouts", "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    if out.returncode not in (0, 1):
        raise SystemExit(f"{path}: mofa solve exited {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("problems", nargs="*")
    args = parser.parse_args()
    paths = args.problems or sorted(glob.glob(os.path.join(ROOT, "problems", "tuning", "*.yaml")))
    print(f"{'problem':34} {'skeleton':40} {'layout':>9} {'step s':>9} {'split s':>9} {'gap':>8} {'search s':>15} same")
    times, same_all = [], True
    for path in paths:
        runs = [solve(path) for _ in range(args.runs)]
        name = os.path.basename(path)[:-5]
        first = runs[0]
        same = all(without_timings(r) == without_timings(first) for r in runs[1:])
        same_all &= same
        report = first.get("pipeline_layout")
        if first["status"] != "optimal" or not report:
            print(f"{name:34} {first['status']:40}")
            continue
        c = first["best"]["config"]
        skeleton = f"tp{c['tp']} cp{c['cp']} pp{c['pp']} vp{c['vp']} ep{c['ep']} {c['pp_schedule']}"
        searched = [r["pipeline_layout"]["search_time_s"] for r in runs]
        times += searched
        layout = "applied" if report["applied"] else "split"
        gap = "certified" if report["optimal"] else f"{report['gap']:.2%}"
        print(f"{name:34} {skeleton:40} {layout:>9} {report['step_time_s']:9.4f} {report['megatron_split_step_time_s']:9.4f} {gap:>8} "
              f"{' / '.join(f'{t:.3f}' for t in searched):>15} {'yes' if same else 'NO'}")
    print(f"\nlayout search {min(times):.3f}-{max(times):.3f} s over {len(times)} searches; "
          f"{'every problem gave the same answer in each run' if same_all else 'SOME ANSWERS DIFFERED between runs'}")


if __name__ == "__main__":
    main()
