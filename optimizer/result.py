"""Objectives, top-K bookkeeping and the result every search method returns."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from costmodel.configs import ConfigBatch
from costmodel.evaluate import Evaluation, evaluate
from costmodel.specs import Problem
from optimizer.space import FEATURE_FIELDS, SKELETON_FIELDS

if TYPE_CHECKING:
    from mofa.launch.plan import LaunchPlan

OBJECTIVES = ("step", "e2e")
ORDER_FIELDS = SKELETON_FIELDS + FEATURE_FIELDS + ("interval",)
#: what makes two answers different layouts (TopK(distinct_layouts=True) keeps the best of each):
#: the parallel grid, the micro-batch and the ZeRO stage; toggles (overlaps, recompute, offload,
#: CPU optimizer), the layer split and the schedule variant do not
LAYOUT_FIELDS = ("tp", "cp", "pp", "vp", "ep", "dp", "mbs", "zero_stage")


class ObjectiveError(ValueError):
    pass


def check_objective(problem: Problem, objective: str) -> None:
    if objective not in OBJECTIVES:
        raise ObjectiveError(f"unknown objective '{objective}' (step or e2e)")
    if objective == "e2e" and (problem.fault_tolerance is None or problem.training.total_steps is None):
        raise ObjectiveError("objective e2e needs a fault_tolerance section and training.steps or training.tokens")


def objective_values(ev: Evaluation, objective: str) -> np.ndarray:
    """The value a search minimises: step time (eq. 42) or end-to-end time (eq. 43, with the
    checkpoint interval of eq. 44); infinite where the configuration does not fit in memory."""
    value = ev.step_time_s if objective == "step" else ev.e2e_time_s
    return np.where(ev.fits & ev.host_fits, value, np.inf)


class TopK:
    """The K best configurations seen so far. Ties in the objective are broken by the
    configuration's fields in canonical order, so every method and every run agree.

    With `distinct_layouts`, only the best configuration of each layout (LAYOUT_FIELDS) is
    kept, so the K answers differ in layout, not only in a toggle. `threshold` stays a valid
    pruning bound: a configuration worse than the K-th kept layout either belongs to a kept
    layout, whose best is already better, or would rank past K. Every method offers what it
    scores here, so they all share the grouping."""

    def __init__(self, k: int, distinct_layouts: bool = False):
        self.k = k
        self.distinct_layouts = distinct_layouts
        self.values = np.zeros(0)
        self.configs: ConfigBatch | None = None

    @property
    def threshold(self) -> float:
        """The K-th best value (infinity until K configurations are known)."""
        return float(self.values[-1]) if len(self.values) >= self.k else np.inf

    def offer(self, values: np.ndarray, cfg: ConfigBatch) -> None:
        keep = np.isfinite(values) & (values <= self.threshold)
        if not keep.any():
            return
        values, cfg = values[keep], cfg.take(np.flatnonzero(keep))
        if self.configs is not None:
            values = np.concatenate([self.values, values])
            cfg = ConfigBatch.concat([self.configs, cfg])
        keys = [getattr(cfg, name) for name in reversed(ORDER_FIELDS)] + [values]
        order = np.lexsort(keys)
        # drop exact duplicates (the same configuration offered twice)
        rows = np.stack([getattr(cfg, n) for n in ORDER_FIELDS], axis=1)[order]
        fresh = np.ones(len(order), bool)
        fresh[1:] = np.any(rows[1:] != rows[:-1], axis=1)
        order = order[fresh]
        if self.distinct_layouts:
            # the first of each layout in the ranked order is its best (value, then canonical order)
            layouts = np.stack([getattr(cfg, n) for n in LAYOUT_FIELDS], axis=1)[order]
            _, first = np.unique(layouts, axis=0, return_index=True)
            order = order[np.sort(first)]
        order = order[: self.k]
        self.values = values[order]
        self.configs = cfg.take(order)

    def result(self, method: str, objective: str, complete: bool, clock: "Stopwatch", evaluated: int, space_size: int, stats: dict | None = None,
               problem: Problem | None = None, interval: float = 0.0) -> "SolveResult":
        """The SolveResult of a search that offered everything it scored here: optimal or
        infeasible when it covered the whole space, feasible or unknown when it stopped early
        -- then, given the problem, with the compute floor (floor_objective) as its proven
        lower bound, so the answer carries its gap."""
        lower = None
        if self.configs is None:
            status = "infeasible" if complete else "unknown"
        else:
            status = "optimal" if complete else "feasible"
        if status == "optimal":
            lower = float(self.values[0])
        elif status == "feasible" and problem is not None:
            lower = min(float(self.values[0]), floor_objective(problem, objective, interval))
        return SolveResult(
            method=method,
            objective=objective,
            status=status,
            top_values=self.values,
            top_configs=self.configs,
            solve_time_s=clock.elapsed,
            evaluated=evaluated,
            space_size=space_size,
            stats=stats or {},
            lower_bound=lower,
        )


def e2e_of_step(problem: Problem, step_s: float, interval: float = 0.0) -> float:
    """End-to-end time of a configuration with this step time (the given checkpoint interval,
    or eq. 44's where it is 0): increasing in the step time, so it maps a step-time bound to an
    end-to-end bound."""
    from costmodel.evaluate import reliability_of_step

    return float(reliability_of_step(problem, np.array([max(step_s, 1e-9)]), np.array([interval]))[2][0])


def floor_objective(problem: Problem, objective: str, interval: float = 0.0) -> float:
    """The compute floor (costmodel.flops.step_time_floor_s) in the objective's units."""
    from costmodel.flops import step_time_floor_s

    floor = step_time_floor_s(problem)
    return floor if objective == "step" else e2e_of_step(problem, floor, interval)


@dataclass
class SolveResult:
    method: str
    objective: str
    status: str  # optimal | feasible | infeasible
    top_values: np.ndarray
    top_configs: ConfigBatch | None
    solve_time_s: float
    evaluated: int  # exact-model evaluations
    lower_bound: float | None = None  # proven bound on the objective (cpsat)
    space_size: int | None = None
    explanation: str | None = None
    stats: dict = field(default_factory=dict)
    _entries: dict = field(default_factory=dict, repr=False, compare=False)  # id(problem) -> (problem, entries)

    @property
    def best_value(self) -> float | None:
        return float(self.top_values[0]) if len(self.top_values) else None

    @property
    def gap(self) -> float | None:
        if self.best_value is None:
            return None
        if self.status == "optimal":
            return 0.0
        if self.lower_bound is None or not np.isfinite(self.lower_bound):
            return None
        return max(0.0, (self.best_value - self.lower_bound) / self.best_value)

    def entries(self, problem: Problem) -> list[tuple[dict, "LaunchPlan"]]:
        """(the evaluation's dict, the launch plan) of each top configuration, best first,
        from one evaluation. The plan is built from the typed row (ConfigBatch.spec), with the
        checkpoint interval the evaluation chose: exporters read it, never the dict."""
        from mofa.launch.plan import build_plan

        if self.top_configs is None or not len(self.top_configs):
            return []
        cached = self._entries.get(id(problem))
        if cached is not None and cached[0] is problem:
            return cached[1]
        ev = evaluate(problem, self.top_configs, bounds=True)
        out = []
        for i in range(len(self.top_configs)):
            entry = ev.as_dict(i, self.top_configs)
            out.append((entry, build_plan(problem, self.top_configs.spec(i), entry["checkpoint_interval"])))
        self._entries[id(problem)] = (problem, out)
        return out

    def plans(self, problem: Problem) -> list["LaunchPlan"]:
        return [plan for _, plan in self.entries(problem)]

    def as_dict(self, problem: Problem) -> dict:
        top = [{**entry, "plan": plan.model_dump(mode="json")} for entry, plan in self.entries(problem)]
        return {
            "method": self.method,
            "objective_name": self.objective,
            "status": self.status,
            "objective": self.best_value,
            "gap": self.gap,
            "lower_bound": self.lower_bound,
            "best": top[0] if top else None,
            "top": top,
            "solve_time_s": self.solve_time_s,
            "evaluated": self.evaluated,
            "space_size": self.space_size,
            "explanation": self.explanation,
            "stats": self.stats,
        }


class Stopwatch:
    def __init__(self):
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start
