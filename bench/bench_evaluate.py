"""Throughput of the vectorized exact model, and latency of one `mofa evaluate`.

    python bench/bench_evaluate.py [--configs 1000000] [--chunk 65536]

Scores random configurations of shipped problems on one core and prints configurations per
second, twice: with Megatron's switches only (ZeRO-0/1, Megatron's schedules, ring CP: the
space the model had before issue 7, for comparison) and with every choice drawn at random
(ZeRO-0..3 with resharding and HSDP, every schedule, every CP variant, recompute granularity
and fine-grained offload).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from costmodel.arrays import tune_allocator  # noqa: E402
from costmodel.configs import ConfigBatch  # noqa: E402
from costmodel.evaluate import evaluate  # noqa: E402
from costmodel.loader import load_problem  # noqa: E402
from costmodel.layout import split_layers  # noqa: E402
from costmodel.specs import FEATURES  # noqa: E402

PROBLEMS = [
    "problems/mofa/table5_llama3_405b_64gpu.yaml",
    "problems/mofa/table5_deepseek_v3_128gpu.yaml",
]


def random_batch(problem, n: int, rng, every_feature: bool = False) -> ConfigBatch:
    G = problem.cluster.num_gpus
    pick = lambda values: rng.choice(np.array(values), n)
    cols = dict(
        tp=pick([1, 2, 4, 8]),
        cp=pick([1, 2]),
        pp=pick([1, 2, 4, 8]),
        vp=pick([1, 2]),
        mbs=pick([1, 2, 4]),
        recompute=pick([0, 1, 2]),
        ep=pick([1, 2, 4, 8, 16, 32]) if problem.model.moe else 1,
    )
    cols["etp"] = np.ones(n, dtype=np.int64)
    first, last = split_layers(problem.model.num_layers, cols["pp"], cols["vp"], "uneven")
    ef, el = split_layers(problem.model.num_layers, cols["pp"], cols["vp"], "even")
    cols["first_layers"] = np.where(ef > 0, ef, np.maximum(first, 1))
    cols["last_layers"] = np.where(el > 0, el, np.maximum(last, 1))
    for name in FEATURES:
        cols[name] = pick([0, 1])
    cols["interval"] = pick([0, 10])
    cols["zero_stage"] = pick([0, 1])
    if every_feature:
        cols["zero_stage"] = pick([0, 1, 2, 3])
        cols["reshard_after_forward"] = (cols["zero_stage"] == 3) * pick([0, 1])
        cols["dp_shard"] = (cols["zero_stage"] >= 1) * pick([0, 2])
        schedules = np.where(cols["vp"] > 1, pick([1, 2, 3]), pick([0, 3]))
        cols["pp_schedule"] = np.where(cols["pp"] > 1, schedules, 0)
        cols["pp_group"] = np.where(cols["pp_schedule"] == 2, 2 * cols["pp"], 0)
        cols["cp_comm"] = np.where(cols["cp"] > 1, pick([0, 1, 2]), 0)
        cols["recompute_modules"] = np.where(cols["recompute"] == 1, pick([1, 3, 5]), 0)
        cols["recompute_method"] = (cols["recompute"] == 2) * pick([0, 1])
        cols["recompute_layers"] = (cols["recompute"] == 2) * 1
        cols["activation_offload"] = (cols["recompute"] == 0) * pick([0, 1, 2 | 8])
    return ConfigBatch.from_columns(G, **cols)


def throughput(path: str, n: int, chunk: int, rng, every_feature: bool, repeats: int = 3) -> float:
    """Configurations per second: the best of `repeats` passes over the same batches (the
    machine's other load only ever slows a pass down)."""
    problem = load_problem(os.path.join(ROOT, path))
    batches = [random_batch(problem, min(chunk, n - i), rng, every_feature) for i in range(0, n, chunk)]
    evaluate(problem, batches[0])  # warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for b in batches:
            evaluate(problem, b)
        best = min(best, time.perf_counter() - start)
    return n / best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=65536)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    tuned = tune_allocator()
    print(f"allocator tuned for large temporaries: {tuned}")
    print(f"exact model, one core, batches of {args.chunk:,}")
    for every_feature in (False, True):
        print("  every choice at random:" if every_feature else "  Megatron's switches (the pre-issue-7 space):")
        for path in PROBLEMS:
            rate = throughput(path, args.configs, args.chunk, rng, every_feature)
            print(f"    {os.path.basename(path):43s} {rate:>12,.0f} configurations/s")
    cmd = [sys.executable, "-m", "mofa", "evaluate", os.path.join(ROOT, PROBLEMS[0]), "--json"]
    times = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - start)
    print(f"one `mofa evaluate` (process start included): median {sorted(times)[2]:.3f} s")


if __name__ == "__main__":
    main()
