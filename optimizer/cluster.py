"""Choosing the cluster too: solve every candidate (GPU type, GPU count) of a problem, rank
them by time to train, GPU-hours or cost under a deadline or a budget, and certify the Pareto
front of (time to train, GPUs or cost, ETTR) -- MoFa section 6's "optimal hardware
configuration".

Why one solve per cluster is enough: inside one cluster the GPU count and the price are
fixed, so GPU-hours and cost are the time to train times a constant, and the time to train is
increasing in the step time (end-to-end time, eqs. 37-43; steps x step time without a
fault-tolerance section). The configuration that minimises one minimises all three, and if it
misses the deadline or the budget, every configuration of that cluster does. The tuner's
certificate for each cluster therefore certifies the choice across clusters.

A point of the Pareto front is a cluster with its fastest configuration. ETTR is compared
between clusters (a larger cluster fails more often), not inside one: with the checkpoint
interval of eq. 44, ETTR inside a cluster rises with the step time (the one-off u_0 is spread
over a longer run), so a slower configuration of the same cluster would be "non-dominated"
only by being slower -- no one picks that. The front is certified when every cluster's solve
is (status optimal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from costmodel.cluster_choice import ClusterChoice, cluster_problems
from costmodel.specs import Problem
from optimizer.result import SolveResult, Stopwatch

SECONDS_PER_HOUR = 3600.0


@dataclass
class ClusterRow:
    """One candidate cluster: its solve and the figures of its best configuration."""

    choice: ClusterChoice
    problem: Problem
    result: SolveResult
    time_to_train_s: float | None = None
    time_to_train_lower_s: float | None = None  # proven bound (the cluster's optimum is at least this)
    ettr: float | None = None
    admitted: bool = False  # solved, and within the deadline and the budget
    why_not: str | None = None

    @property
    def gpu_hours(self) -> float | None:
        return None if self.time_to_train_s is None else self.choice.num_gpus * self.time_to_train_s / SECONDS_PER_HOUR

    @property
    def cost(self) -> float | None:
        price = self.choice.price_per_gpu_hour
        return None if price is None or self.gpu_hours is None else price * self.gpu_hours

    def metric(self, name: str, seconds: float | None = None) -> float | None:
        """time_to_train (s), gpu_hours or cost of this cluster at `seconds` to train (default
        its best configuration's)."""
        t = self.time_to_train_s if seconds is None else seconds
        if t is None:
            return None
        if name == "time_to_train":
            return t
        hours = self.choice.num_gpus * t / SECONDS_PER_HOUR
        if name == "gpu_hours":
            return hours
        return None if self.choice.price_per_gpu_hour is None else hours * self.choice.price_per_gpu_hour

    def as_dict(self) -> dict:
        r = self.result
        return {
            "hardware": self.choice.hardware,
            "num_gpus": self.choice.num_gpus,
            "price_per_gpu_hour": self.choice.price_per_gpu_hour,
            "status": r.status,
            "gap": r.gap,
            "path": r.stats.get("path"),
            "step_time_s": r.best_value if r.objective == "step" else _best_step(self),
            "time_to_train_s": self.time_to_train_s,
            "time_to_train_lower_s": self.time_to_train_lower_s,
            "gpu_hours": self.gpu_hours,
            "cost": self.cost,
            "ettr": self.ettr,
            "admitted": self.admitted,
            "why_not": self.why_not,
            "solve_time_s": r.solve_time_s,
        }


def _best_step(row: ClusterRow) -> float | None:
    entries = row.result.entries(row.problem)
    return entries[0][0]["step_time_s"] if entries else None


@dataclass
class ClusterSolve:
    """Every candidate cluster's solve, the chosen one and (on request) the Pareto front."""

    rows: list[ClusterRow]
    objective: str  # time_to_train | gpu_hours | cost
    best: ClusterRow | None
    status: str  # optimal | feasible | infeasible | unknown
    gap: float | None
    solve_time_s: float
    front: list[ClusterRow] | None = None
    front_certified: bool = False
    second_axis: str = "num_gpus"  # the front's resource axis: num_gpus, or cost where prices are given
    stats: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {
            "objective": self.objective,
            "status": self.status,
            "gap": self.gap,
            "chosen": None if self.best is None else {"hardware": self.best.choice.hardware, "num_gpus": self.best.choice.num_gpus},
            "candidates": [row.as_dict() for row in self.rows],
            "solve_time_s": self.solve_time_s,
        }
        if self.front is not None:
            out["pareto"] = {
                "axes": ["time_to_train_s", self.second_axis, "ettr"],
                "certified": self.front_certified,
                "points": [row.as_dict() for row in self.front],
            }
        return out


def per_cluster_objective(problem: Problem) -> str:
    """What each cluster's solve minimises: the end-to-end time where the problem has what it
    needs (fault tolerance and a step count), else the step time (time to train = steps x step
    time); both order a cluster's configurations as its time to train does."""
    return "e2e" if problem.fault_tolerance is not None and problem.training.total_steps is not None else "step"


def _time_to_train(problem: Problem, objective: str, value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return value if objective == "e2e" else value * problem.training.total_steps


def solve_clusters(problem: Problem, method: str = "cpsat", top_k: int = 1, time_limit_s: float | None = None,
                   distinct_layouts: bool = False, pareto: bool = False, solve=None) -> ClusterSolve:
    """Solve each candidate cluster (the time left shared evenly among the clusters not yet
    solved), rank them by search.cluster_objective under the deadline and budget, and build
    the Pareto front when asked. `solve` is optimizer.search.solve (passed in: search imports
    this module's callers, not the reverse)."""
    if solve is None:
        from optimizer.search import solve
    clock = Stopwatch()
    s = problem.search
    objective = per_cluster_objective(problem)
    candidates = cluster_problems(problem)
    rows = []
    interrupted = False
    for i, (choice, sub) in enumerate(candidates):
        limit = None
        if time_limit_s is not None:
            limit = max(0.05, (time_limit_s - clock.elapsed) / (len(candidates) - i))
        if interrupted:  # Ctrl-C stopped an earlier cluster's search: the rest are left unsolved
            result = SolveResult(method, objective, "unknown", np.zeros(0), None, 0.0, 0, stats={"interrupted": True})
        else:
            result = solve(sub, method, objective, top_k, limit, distinct_layouts)
            interrupted = bool(result.stats.get("interrupted"))
        row = ClusterRow(choice, sub, result)
        if result.best_value is not None:
            row.time_to_train_s = _time_to_train(sub, objective, result.best_value)
            row.ettr = result.entries(sub)[0][0]["ettr"]
        if result.status == "infeasible":
            row.time_to_train_lower_s = math.inf
        else:
            row.time_to_train_lower_s = _time_to_train(sub, objective, result.best_value if result.status == "optimal" else result.lower_bound)
        row.admitted, row.why_not = _admit(row, s)
        rows.append(row)

    ranked = sorted((r for r in rows if r.admitted), key=lambda r: (r.metric(s.cluster_objective), rows.index(r)))
    best = ranked[0] if ranked else None
    everything_certified = all(r.result.status in ("optimal", "infeasible") for r in rows)
    if best is None:
        status = "infeasible" if everything_certified else "unknown"
    else:
        status = "optimal" if everything_certified else "feasible"
    gap = _gap(rows, best, s.cluster_objective) if best is not None else None
    out = ClusterSolve(rows, s.cluster_objective, best, status, gap, clock.elapsed)
    if pareto:
        out.second_axis = "cost" if all(r.choice.price_per_gpu_hour is not None for r in rows) else "num_gpus"
        out.front = pareto_front([r for r in rows if r.admitted], out.second_axis)
        out.front_certified = everything_certified
    return out


def _admit(row: ClusterRow, s) -> tuple[bool, str | None]:
    """Within the deadline and the budgets? (The cluster's best configuration is its best in
    every metric, so if it misses one, the cluster does.)"""
    if row.time_to_train_s is None:
        return False, {"infeasible": "no admissible configuration"}.get(row.result.status, "no configuration found in the time limit")
    if s.deadline_hours is not None and row.time_to_train_s > s.deadline_hours * SECONDS_PER_HOUR:
        return False, f"misses the deadline ({row.time_to_train_s / SECONDS_PER_HOUR:.4g} h > {s.deadline_hours:g} h)"
    if s.budget_gpu_hours is not None and row.gpu_hours > s.budget_gpu_hours:
        return False, f"over the GPU-hour budget ({row.gpu_hours:.4g} > {s.budget_gpu_hours:g})"
    if s.budget_cost is not None and row.cost > s.budget_cost:
        return False, f"over the budget ({row.cost:.4g} > {s.budget_cost:g})"
    return True, None


def _gap(rows: list[ClusterRow], best: ClusterRow, objective: str) -> float | None:
    """Relative gap between the chosen cluster's value and the least proven bound over every
    cluster that could still beat it (unsolved or uncertified clusters included)."""
    value = best.metric(objective)
    bounds = []
    for r in rows:
        if r.result.status == "infeasible":
            continue
        if r.time_to_train_lower_s is None:
            return None  # a cluster with no bound at all: nothing is proven
        if not r.admitted and r.result.status == "optimal":
            continue  # certified outside the deadline or the budget
        bounds.append(r.metric(objective, r.time_to_train_lower_s))
    lower = min(bounds) if bounds else value
    if lower is None or not value:
        return None
    return max(0.0, (value - lower) / value)


def dominates(a: tuple, b: tuple) -> bool:
    """a dominates b: no worse in every coordinate (all minimised) and better in one."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def point_of(row: ClusterRow, second_axis: str) -> tuple:
    """The minimised coordinates of a cluster: time to train, GPUs or cost, and -ETTR (0 when
    the problem models no failures, which compares equal everywhere)."""
    second = row.cost if second_axis == "cost" else float(row.choice.num_gpus)
    return (row.time_to_train_s, second, -(row.ettr if row.ettr is not None else 1.0))


def pareto_front(rows: list[ClusterRow], second_axis: str = "num_gpus") -> list[ClusterRow]:
    """The rows no other row dominates, fastest first (ties: the candidates' order). Quadratic
    in the clusters, which number in the tens."""
    points = [point_of(r, second_axis) for r in rows]
    keep = [r for i, r in enumerate(rows) if not any(dominates(points[j], points[i]) for j in range(len(rows)) if j != i)]
    return sorted(keep, key=lambda r: (point_of(r, second_axis), rows.index(r)))
