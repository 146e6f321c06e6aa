"""One protocol, three backends: every search method takes a problem and returns a SolveResult."""

from __future__ import annotations

from typing import Callable

from costmodel.specs import Problem
from optimizer.cpsat import solve_cpsat
from optimizer.dfs import solve_dfs
from optimizer.exhaustive import solve_exhaustive
from optimizer.explain import explain_infeasible
from optimizer.result import SolveResult

METHODS: dict[str, Callable[..., SolveResult]] = {
    "cpsat": solve_cpsat,
    "dfs": solve_dfs,
    "exhaustive": solve_exhaustive,
}


def solve(problem: Problem, method: str = "cpsat", objective: str | None = None, top_k: int = 1, time_limit_s: float | None = None,
          distinct_layouts: bool = False, progress=None) -> SolveResult:
    """Find the best configurations of `problem`. The objective defaults to the problem's
    search.objective; an infeasible result carries an explanation of why. `distinct_layouts`:
    the top K are K different layouts, each its best configuration (TopK). `progress`: a
    callable the DFS reports to every few seconds (the other methods finish in seconds)."""
    if method not in METHODS:
        raise ValueError(f"unknown method '{method}' ({', '.join(METHODS)})")
    objective = objective or problem.search.objective
    extra = {"progress": progress} if method == "dfs" and progress is not None else {}
    result = METHODS[method](problem, objective=objective, top_k=top_k, time_limit_s=time_limit_s, distinct_layouts=distinct_layouts, **extra)
    if result.status == "infeasible":
        result.explanation = explain_infeasible(problem)
    return result
