"""What the layout searches share (optimizer.layout_search, optimizer.layout_vee,
optimizer.layout_bounds): the answer type, the CP-SAT rounds that ask for layouts priced below
an incumbent, the integer layer counts of each kind-run per stage, and small helpers over
scored layouts."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
from ortools.sat.python import cp_model

from costmodel.stage_layout import LayoutContext, StageLayout, score_layout
from optimizer import cp_solver
from optimizer.schedule_graph import schedule_graph


TIME_SCALE = 1e9  # integer nanoseconds in the CP-SAT model

# what can prove a LayoutSolution's lower_bound_s (layout_report's notes say each in words)
BOUND_SOURCES = (
    "cp-sat",  # CP-SAT over the critical-path cuts
    "rank-lp",  # rank_order_region and lp_region_bound, before or instead of CP-SAT rounds
    "recompute-split",  # recompute_split_bound
    "relaxed",  # relaxed_bound: the search's model without the per-stage jumps
    "rank-totals",  # rank_totals_bound: the ranks' integer totals under busy time, order and memory
    "work",  # work_bound_s: nothing bounded better
    "level-work",  # level_work_bounds, one --recompute-num-layers N
    "levels",  # every N >= 1 ruled out, the rest by the search without recompute
    "per-stage", "free", "enumerated",  # layout_report's: a wider search's bound, or every layout scored
    "vee-cp-sat", "vee-rank", "vee-work",  # DualPipeV's (layout_vee)
)


@dataclasses.dataclass(frozen=True)
class LayoutSolution:
    """A layout search's answer: the best layout found that fits (else the least over memory),
    its exact score, and the makespan bound proven for every layout of the skeleton."""

    layout: StageLayout
    step_time_s: float  # the exact model's (schedule simulated op by op)
    makespan_s: float  # the simulated pipeline makespan of the layout
    bound_s: float  # the layout's critical-path bound (costmodel.stage_layout), for comparison
    lower_bound_s: float  # proven: no layout that fits has a makespan below this
    optimal: bool  # the makespan meets the lower bound (within the integer rounding)
    solve_s: float
    fits: bool
    rounds: int  # CP-SAT solves (one per critical path added)
    # what proved lower_bound_s: one of BOUND_SOURCES
    bound_source: str = "cp-sat"
    # Ctrl-C ended the search: the best layout found so far and the bound proven by then
    # (as a time limit would end it)
    interrupted: bool = False

    def __post_init__(self):
        if self.bound_source not in BOUND_SOURCES:  # a report must be able to say what proved the bound
            raise ValueError(f"unknown bound source {self.bound_source!r}")

    @property
    def gap(self) -> float:
        """Proven optimality gap of the layout's simulated makespan."""
        return max(0.0, self.makespan_s - self.lower_bound_s) / self.makespan_s


class Answers(cp_model.CpSolverSolutionCallback):
    """Every distinct layout CP-SAT reports during one solve (decoder counts, then recompute counts)."""

    def __init__(self, t):
        super().__init__()
        self.t = t  # the variables of an answer
        self.answers = []
        self.seen = set()

    def on_solution_callback(self):
        answer = tuple(int(self.Value(v)) for v in self.t)
        if answer not in self.seen:
            self.seen.add(answer)
            self.answers.append(answer)

    def stop_after(self, seconds: float | None):
        """cp_solver.solve's stop_when for a round (from now): stop once it has run `seconds`
        with answers; None: never (the round's time limit alone)."""
        if seconds is None:
            return None
        begun = time.perf_counter()
        return lambda: bool(self.answers) and time.perf_counter() - begun >= seconds


def round_solver(time_limit_s: float, workers: int) -> cp_model.CpSolver:
    """cp_solver for a round of the layout search's CP-SAT model (round_below, the free search's
    rounds without an incumbent, recompute_split_bound's), with a lighter presolve: one
    presolve iteration, without the search for dominated linear constraints and for linear
    overlaps. The model is rebuilt and presolved in full every round (thousands of path cuts of
    up to 2 x stages terms), and those two passes and the iterations after the first took most of
    it: Llama 3 405B cp 1's 128-stage model (1,300 cuts, 176k terms) presolved in 2.5 s of a
    round's 4 s on 2 cores, 1.0 s with this, for little (31 redundant cuts of 1,410 found). The
    time freed goes to the rounds (bench_layouts, 10 s, 2 cores: the free search on cp 1 without
    recompute runs 3-4 rounds, not 1, and its gap is 1.1% in three runs of three, against
    6.7-43.8% in four, and as much regular first; regular then free with per-chunk recompute
    5.3-5.5%, against 10.7-10.9%). The regular search's own rounds keep the full presolve (solve_layout)."""
    solver = cp_solver.cp_solver(time_limit_s, workers)
    solver.parameters.presolve_inclusion_work_limit = 0
    solver.parameters.find_big_linear_overlap = False
    solver.parameters.max_presolve_iterations = 1
    return solver


def answers_by(round_limit_s: float, left_s: float) -> float | None:
    """When a round with `left_s` seconds to go stops once it has answers (round_below's
    answers_by_s): round_limit_s in, where two rounds' time is left; else never (None), the
    round takes all the time left, since a round cut short loses its presolve and LP with it."""
    return round_limit_s if left_s >= 2 * round_limit_s else None


def round_below(model: cp_model.CpModel, z, variables, incumbent_s: float, slack_s: float, time_limit_s: float,
                workers: int, under_s: float = 0.0, answers_by_s: float | None = None) -> tuple[int, float, list]:
    """One round that asks CP-SAT only for layouts the model prices below the incumbent
    (makespan `z` <= incumbent - 2 slack, set as z's domain): (status, the makespan bound it
    proves for every layout, in seconds, and every distinct answer it found). Each answer is
    then truly better or priced too low (its longest path a new cut), and INFEASIBLE certifies
    the incumbent within 2 slack. `under_s`: how far the model's rounded coefficients can price
    a layout above its makespan (0 where they are rounded down). `answers_by_s`: the round
    stops once it has run that long with answers (their cuts make the next round's model),
    and goes on to time_limit_s while it has none (a round that stopped there without answers
    was asked again from scratch, its search lost: DeepSeek-V3 on pp 16 x vp 2 with per-stage
    recompute, 4 s of the 17 s it took to certify with a 30 s limit)."""
    domain = model.Proto().variables[z.Index()].domain
    goal_s = incumbent_s - 2 * slack_s
    domain[0], domain[1] = 0, max(int(math.floor(goal_s * TIME_SCALE)), 0)
    found = Answers(variables)
    solver = round_solver(time_limit_s, workers)
    status = cp_solver.solve(solver, model, found, stop_when=found.stop_after(answers_by_s))
    if status == cp_model.INFEASIBLE:
        return status, goal_s, found.answers
    # proven on the restricted model: no layout is priced below it, or the incumbent is within 2 slack
    return status, min(solver.BestObjectiveBound() / TIME_SCALE - under_s, goal_s), found.answers


def path_sum(counts, exprs):
    """A path's length in the CP-SAT model: sum over passes p and stages s of counts[p][s] *
    exprs[p][s] (a pass's ops on each stage along the path, times that stage's duration
    expression), built as one weighted sum: term by term in Python it took twice as long
    (~1000 cuts of 128 stages: 0.9 s -> 0.4 s on 2 cores)."""
    terms, coefficients = [], []
    for n, expr in zip(counts, exprs):
        n = np.asarray(n)
        for s in np.flatnonzero(n):
            terms.append(expr[s])
            coefficients.append(int(n[s]))
    return cp_model.LinearExpr.weighted_sum(terms, coefficients)


def memo_scorer(ctx: LayoutContext, scores: dict | None = None):
    """score_layout of the skeleton, each layout scored once (`scores`: a cache shared between
    searches of the same skeleton)."""
    scores = {} if scores is None else scores

    def score_of(layout: StageLayout):
        if layout not in scores:
            scores[layout] = score_layout(ctx, layout)
        return scores[layout]

    return score_of


def layout_makespan(score) -> float:
    """What the searches minimise: the simulated schedule's makespan, the exposed P2P left out."""
    return score.pipeline_s - score.pp_exposed_s


def clipped_prefix(model: cp_model.CpModel, value, a: int, b: int, upper: int, tag: str):
    """min(max(value, a), b) as a CP-SAT variable: a prefix sum of layers clipped to the kind
    run [a, b), whose differences between neighbouring stages count that run's layers per stage
    (the clips shared by neighbours keep the LP relaxation tight)."""
    high = model.NewIntVar(a, upper, f"h{tag}")
    model.AddMaxEquality(high, [value, a])
    q = model.NewIntVar(a, b, f"q{tag}")
    model.AddMinEquality(q, [high, b])
    return q


def recompute_run_vars(model: cp_model.CpModel, rc, prefix, clipped, run_counts, runs, upper: int) -> list[list]:
    """[stage][run] recomputed layers of each kind-run per stage: the first rc[s] layers of the
    stage, i.e. the layers [P_{s-1}, P_{s-1} + r_s) clipped to each run (run_count_vars' prefix
    sums `prefix`, clipped prefixes `clipped` and counts `run_counts`)."""
    stages = len(rc)
    if len(runs) == 1:
        return [[rc[s]] for s in range(stages)]
    rc_counts = []
    for s in range(stages):
        row = []
        for j, (_, a, b) in enumerate(runs):
            if j == len(runs) - 1:  # the last run: what the others leave of r_s (half the clips)
                row.append(rc[s] - sum(row))
                continue
            q = clipped_prefix(model, (prefix[s - 1] if s else 0) + rc[s], a, b, upper, f"r{j}_{s}")
            row.append(q - (clipped[j][s - 1] if s else a))
        rc_counts.append(row)
        # implied, but the LP relaxation of the clips above lets a run's recomputed count go
        # negative, which prices recompute below nothing and takes the bound down by a third
        # (DeepSeek-V3 pp 16 x vp 2: 42 s instead of 60.7 s); stated, the bound holds
        for j in range(len(runs)):
            model.Add(row[j] >= 0)
            model.Add(row[j] <= run_counts[s][j])
        model.Add(sum(row) == rc[s])
    return rc_counts


def run_count_vars(model: cp_model.CpModel, t, prefix, runs, upper: int, tag: str = "") -> tuple[list, list]:
    """Layers of each kind run per stage as CP-SAT expressions: t itself for one run, else the
    differences of the prefix sums clipped to each run (clipped_prefix; the clips shared by
    neighbouring stages keep the LP relaxation tight). Returns ([stage][run] counts, [run][stage]
    clipped prefix sums, empty for one run)."""
    stages = len(t)
    if len(runs) == 1:
        return [[t[s]] for s in range(stages)], []
    clipped = [[clipped_prefix(model, prefix[s], a, b, upper, f"{tag}{j}_{s}") for s in range(stages)] for j, (_, a, b) in enumerate(runs)]
    return [[clipped[j][s] - (clipped[j][s - 1] if s else a) for j, (_, a, _) in enumerate(runs)] for s in range(stages)], clipped


def table_value(model: cp_model.CpModel, index, values: list[int]):
    """values[index] as a new variable (an element constraint), for the model to take through a
    one-sided bound that its objective pulls onto it, never as a term itself: presolve gives an
    element's target the table's values as its domain, a union of points, and where the gather
    tables' targets sat in the stage times it summed those through the path cuts and the
    windows' max into domains of up to 1M intervals (DeepSeek-V3 on pp 16 x vp 2 under FSDP: a
    round's presolve 26 s, past its time limit by 1.4 s; with the bound, 4.5 s, at most 89
    intervals). The bound is exact: a layout's least price has it at the value."""
    value = model.NewIntVar(min(values), max(values), "")
    model.AddElement(index, values, value)
    return value


def held_vars(model: cp_model.CpModel, t: list) -> list:
    """A boolean per stage: whether it holds a decoder layer (t_s >= 1), for what a stage pays
    for holding one (ZeRO-3's first gather, the gradient windows)."""
    held = [model.NewBoolVar(f"held{s}") for s in range(len(t))]
    for s, h in enumerate(held):
        model.Add(t[s] >= 1).OnlyEnforceIf(h)
        model.Add(t[s] == 0).OnlyEnforceIf(h.Not())
    return held


def gather_rest_vars(model: cp_model.CpModel, lin, t: list, prefix: list, n_layers: int, most: np.ndarray) -> tuple[list, list, list, float]:
    """ZeRO-3 with more than one kind of layer (LinearLayouts.gathers): each stage's gathers
    beyond the linear terms, by table at the stage's first layer and its layer count, as
    variables held at least at the table's value rounded down (table_value: the model's price
    is never above the exact model's, and its objective pulls the variable onto the value).
    `most`: per stage the most layers it holds in a layout that fits (the index domains).
    Returns per stage (the forward's rest, the backward's rest: 0 where a pass gathers
    nothing), each stage's table index (solve_layout's window_vars read the prefetches' overlap
    by it) and the most seconds of both passes' rest per stage."""
    g = lin.gathers
    stages = len(t)
    rest_f, rest_b, table_index = [0] * stages, [0] * stages, []
    for s in range(stages):
        if s < stages - 1:
            # only the runs that exist (start + t <= n) and fit (t <= the most layers the
            # stage holds in a layout that fits): CP-SAT presolves an element into a literal
            # per value of its index (DeepSeek-V3 on pp 16 x vp 2 under FSDP: 73k literals,
            # 3.3 s of presolve past a 1.5 s limit, over the whole square)
            runs_here = [start * (n_layers + 1) + count for start in range(n_layers + 1)
                         for count in range(min(int(most[s]), n_layers - start) + 1)]
            index = model.NewIntVarFromDomain(cp_model.Domain.FromValues(runs_here), f"run{s}")
            model.Add(index == (prefix[s - 1] if s else 0) * (n_layers + 1) + t[s])
            by_pass = (g.middle_f.ravel(), g.middle_b.ravel())
        else:
            index, by_pass = (prefix[s - 1] if s else 0), (g.last_f, g.last_b)
        table_index.append(index)
        for out, table in zip((rest_f, rest_b), by_pass):
            if not table.any():  # no gathers in this pass (kept after the forward: none in the backward)
                continue
            values = [max(int(math.floor(v * TIME_SCALE)), 0) for v in table]  # rounded down: never above the exact model
            rest = model.NewIntVar(0, max(values), "")  # only lengthens the paths: at its least, the value
            model.Add(rest >= table_value(model, index, values))
            out[s] = rest
    return rest_f, rest_b, table_index, float(max(g.middle_f.max(), g.last_f.max()) + max(g.middle_b.max(), g.last_b.max()))


def path_of(ctx: LayoutContext, score) -> tuple[np.ndarray, np.ndarray]:
    """A longest path of the scored layout's schedule (ScheduleGraph.path; critical_path on the
    simulation finds one of the same length)."""
    return schedule_graph(ctx).path(score.forward_s, score.backward_s)


def regular(layout: StageLayout, spread: int) -> bool:
    """The chunks of every rank differ by at most `spread` layers."""
    return all(max(layout.decoders[r::layout.pp]) - min(layout.decoders[r::layout.pp]) <= spread for r in range(layout.pp))


def with_launched_recompute(layout: StageLayout, block_layers: int | None) -> StageLayout:
    """The layout with the recompute Megatron launches on it under full recompute: the block
    method's N recomputes the first min(N, layers) of every stage; uniform (None) every layer."""
    n = max(layout.decoders) if block_layers is None else block_layers
    return layout.with_recompute([min(n, d) for d in layout.decoders])
