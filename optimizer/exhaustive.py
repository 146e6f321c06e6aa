"""Exhaustive enumeration: every configuration of the space, scored by the vectorized exact
model in chunks. The ground truth the other methods are checked against."""

from __future__ import annotations

import numpy as np

from costmodel.evaluate import evaluate
from costmodel.specs import Problem
from optimizer.result import SolveResult, Stopwatch, TopK, check_objective, objective_values
from optimizer.space import SearchSpace


def solve_exhaustive(problem: Problem, objective: str = "step", top_k: int = 1, time_limit_s: float | None = None, chunk: int = 65536, distinct_layouts: bool = False) -> SolveResult:
    check_objective(problem, objective)
    clock = Stopwatch()
    space = SearchSpace.from_problem(problem)
    best = TopK(top_k, distinct_layouts)
    evaluated = 0
    complete = True
    stats = {}
    try:
        for cfg in space.batches(chunk, space.interval()):
            ok = space.feature_ok(cfg)
            if not ok.any():
                continue
            cfg = cfg.take(np.flatnonzero(ok))
            ev = evaluate(problem, cfg)
            evaluated += len(cfg)
            best.offer(objective_values(ev, objective), cfg)
            if time_limit_s is not None and clock.elapsed > time_limit_s:
                complete = False
                break
    except KeyboardInterrupt:  # Ctrl-C: the best found so far, with its gap, as a time limit would
        complete = False
        stats["interrupted"] = True
    return best.result("exhaustive", objective, complete, clock, evaluated, space.size, stats, problem=problem, interval=space.interval())
