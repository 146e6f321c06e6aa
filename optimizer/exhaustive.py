"""Exhaustive enumeration: every configuration of the space, scored by the vectorized exact
model in chunks. The ground truth the other methods are checked against, and the path cpsat
takes where scoring every leaf costs less than building its tables (optimizer.cpsat)."""

from __future__ import annotations

import numpy as np

from costmodel.evaluate import evaluate
from costmodel.specs import Problem
from optimizer.result import SolveResult, Stopwatch, TopK, check_objective, objective_values
from optimizer.space import SearchSpace


def solve_exhaustive(problem: Problem, objective: str = "step", top_k: int = 1, time_limit_s: float | None = None, chunk: int = 65536, distinct_layouts: bool = False) -> SolveResult:
    check_objective(problem, objective)
    clock = Stopwatch()
    return score_space(problem, SearchSpace.from_problem(problem), objective, top_k, time_limit_s, chunk, distinct_layouts, clock)


def score_space(problem: Problem, space: SearchSpace, objective: str, top_k: int, time_limit_s: float | None, chunk: int, distinct_layouts: bool,
                clock: Stopwatch, method: str = "exhaustive", stats: dict | None = None) -> SolveResult:
    """Score every configuration of `space` (SearchSpace.batches, the feature rules applied)
    and keep the best `top_k`. `time_limit_s` counts from `clock`'s start, so a caller's time
    already spent counts too; when it runs out (checked after each batch) or on Ctrl-C the
    answer is the best so far, with the compute floor as its proven bound. `method` and
    `stats` are the caller's, for the result."""
    best = TopK(top_k, distinct_layouts)
    evaluated = 0
    complete = True
    stats = {} if stats is None else stats
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
    return best.result(method, objective, complete, clock, evaluated, space.size, stats, problem=problem, interval=space.interval())
