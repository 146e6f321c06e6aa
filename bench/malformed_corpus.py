"""A seeded corpus of malformed problem files made from the shipped ones, run through
`mofa evaluate` in-process: per mutation class, how many ended in a clean error (exit 2, one
line on stderr naming the file and the field, no traceback, within 5 s), and each failure.

    python bench/malformed_corpus.py [--per-class 60] [--seed 0] [--classes a,b] [--failures N]

The classes and the oracle are those of tests/integration/test_malformed_problems.py
(tests/integration/malformed.py); the schema-strictness classes are the ones
costmodel/specs.py accepts today.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

import malformed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-class", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--classes", help="comma-separated (default: all)")
    parser.add_argument("--failures", type=int, default=8, help="failures to list per class")
    parser.add_argument("--exhaustive", action="store_true", help="list every (field, value) each schema-strictness class fails on, over the mofa/ problems")
    args = parser.parse_args()
    if args.exhaustive:
        return exhaustive()
    classes = args.classes.split(",") if args.classes else list(malformed.CLEAN + malformed.STRICTNESS)
    bases = malformed.load_bases()
    rng = random.Random(args.seed)
    chooser = malformed.RandomChooser(rng)
    total = collections.Counter()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in classes:
            clean, failures, seconds = 0, [], 0.0
            for i in range(args.per_class):
                base = chooser.pick(bases)
                case = malformed.mutate(kind, base, chooser)
                path = Path(tmp) / f"{kind}-{i}.yaml"
                outcome = malformed.run_case(case, path)
                seconds = max(seconds, outcome.seconds)
                problem = malformed.verdict(case, path, outcome)
                if problem is None:
                    clean += 1
                else:
                    failures.append((case, problem))
            total["cases"] += args.per_class
            total["clean"] += clean
            group = "strictness" if kind in malformed.STRICTNESS else "clean"
            print(f"{kind:28s} [{group}] {clean:4d}/{args.per_class} clean ({100 * clean / args.per_class:5.1f}%), slowest {seconds:.2f} s")
            reasons = collections.Counter()
            for case, problem in failures:
                reasons[(case.detail.split(" = ")[0] if " = " in case.detail else case.detail, problem.split(":")[0])] += 1
            shown = 0
            for case, problem in failures:
                if shown >= args.failures:
                    break
                print(f"    {case.base}: {case.detail} -> {problem}")
                shown += 1
    print(f"total: {total['clean']}/{total['cases']} clean in {time.perf_counter() - started:.1f} s")


def exhaustive() -> None:
    bases = [b for b in malformed.load_bases() if b.name.startswith("mofa/")]
    with tempfile.TemporaryDirectory() as tmp:
        for kind in malformed.STRICTNESS:
            failing, tried = {}, set()
            for base in bases:
                if kind in malformed.STRICT:
                    cases = malformed.strictness_cases(kind, base)
                else:
                    cases = [malformed.mutate(kind, base, malformed.RandomChooser(random.Random(base.name)))]
                for i, case in enumerate(cases):
                    path = Path(tmp) / f"{kind}-{i}.yaml"
                    problem = malformed.verdict(case, path, malformed.run_case(case, path))
                    tried.add(case.field)
                    if problem is not None:
                        failing.setdefault(case.field, (case.detail, base.name, problem))
            print(f"{kind}: fails on {len(failing)} of {len(tried)} fields")
            for name, (detail, base, problem) in sorted(failing.items()):
                print(f"    {detail:60s} {problem[:110]}   [{base}]")


if __name__ == "__main__":
    main()
