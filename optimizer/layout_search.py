"""The best heterogeneous pipeline layout of one skeleton configuration (issue 11): CP-SAT over
integer layer counts per stage and layer kind, certified by the exact model
(costmodel.stage_layout.score_layout); a dynamic program over stages (MPE eq. 3, seed 002) and
plain enumeration as oracles on small instances.

Why CP-SAT here: a layout of 126 layers over 128 stages is one of C(253, 127) ~ 1e75; nothing
enumerates that, while the structure is linear. With the skeleton fixed (degrees, micro-batch,
features), the objective is the simulated pipeline makespan of the layout, a max over the paths
of the schedule's dependency graph (optimizer.schedule_graph) of forms linear in the layer
counts, so any path bounds every layout from below; memory per rank is linear in the counts
too. The rounds add the paths of the layouts they propose until the incumbent is proven, and
the step adds what the layout changes beside the makespan (exposed P2P, the busiest rank's DP
reduce and update), scored whole by the exact model.

The parts, each in its module: the layout's linear model, its stage times and per-rank memory
rows read off the exact ledger, and what memory forces a rank to recompute
(optimizer.layout_linear); the CP-SAT rounds that ask for layouts priced below an incumbent and
the answer type (optimizer.layout_rounds); the seeds and the local search on the schedule graph
(optimizer.layout_seeds); the lower bounds beyond the rounds' own (optimizer.layout_bounds);
DualPipeV's V (optimizer.layout_vee); the DP over stages and plain enumeration, the oracles
(optimizer.layout_oracles); what the CLI reports and launches (optimizer.layout_report:
layout_report, the launchable answer, with one --recompute-num-layers where the skeleton
recomputes). This module holds the search: solve_layout, and two_phase (regular layouts, then
free ones).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction
import time

import numpy as np
from ortools.sat.python import cp_model

from costmodel.schedule_sim import op_inputs
from costmodel.stage_layout import (
    LayoutContext,
    LayoutError,
    StageLayout,
    stage_ranks,
    unit_costs,
)
from costmodel.update import window_compute_s
from optimizer import cp_solver
from optimizer.layout_bounds import (
    dwell_paths,
    level_range,
    lp_region_bound,
    rank_order_region,
    rank_totals_bound,
    recompute_split_bound,
    recomputing_ranks,
    split_slack,
    work_bound_s,
)
from optimizer.layout_linear import (
    LinearLayouts,
    MemoryRows,
    fewest_recompute,
    kind_runs,
    least_recompute,
    least_recompute_var,
    lower_envelope,
)
from optimizer.layout_rounds import (
    LayoutSolution,
    TIME_SCALE,
    answers_by,
    gather_rest_vars,
    held_vars,
    layout_makespan,
    memo_scorer,
    path_of,
    path_sum,
    recompute_run_vars,
    regular,
    round_below,
    round_solver,
    run_count_vars,
    table_value,
)
from optimizer.layout_seeds import ROUND_STARTS, anneal, fill_seed, local_search, packed_seeds, round_seed_pair
from optimizer.schedule_graph import segment_paths


NO_GOAL_S = 1e6  # a makespan no layout reaches: rank_order_region's feasibility then asks only whether any layout fits
# free layouts with per-chunk recompute: the most of the time left that a part of the space other
# than the last gets before the rounds search the whole (solve_layout)
PART_FRACTION = 0.5


def fix_bool(model: cp_model.CpModel, var, value: int | None) -> None:
    """Fix a boolean of the model between solves (None: free it again), through its domain:
    presolve then drops the constraints it disables."""
    cp_solver.set_domain(model, var, *((0, 1) if value is None else (value, value)))


def check_searchable(ctx: LayoutContext) -> None:
    """Refuse skeletons solve_layout does not cover though the layout model scores them:
    DualPipeV, whose V places rank r's stages at r and 2pp - 1 - r where solve_layout's
    region bounds, segment paths and recompute rows read stage s on rank s % pp
    (vee_layout_search searches the V: a descent, then vee_rounds' CP-SAT rounds)."""
    if ctx.vee:
        raise LayoutError("solve_layout does not search pp_schedule dualpipev (its V places stages r and 2pp - 1 - r on rank r); "
                          "vee_layout_search searches it, `mofa evaluate --pipeline-layout` scores a layout under it")


@dataclasses.dataclass
class Incumbent:
    """The best layout that fits found so far, and its exact score (None before one)."""

    layout: StageLayout | None = None
    score: object = None

    def offer(self, layout: StageLayout, score) -> None:
        """Take the layout where it fits and its makespan beats the incumbent's."""
        if score.fits and (self.score is None or layout_makespan(score) < layout_makespan(self.score)):
            self.layout, self.score = layout, score


@dataclasses.dataclass
class LayoutModel:
    """solve_layout's CP-SAT model of a skeleton's layouts (build_layout_model): the decision
    variables, the stage-time expressions the path cuts are written in, the makespan, and the
    cuts so far (`cut` adds one)."""

    model: cp_model.CpModel
    t: list  # decoder layers per stage
    rc: list  # recomputed layers per stage (0 where the skeleton has no full recompute)
    level: object  # uniform recompute: the one N (r_s = min(N, t_s)); else None
    run_counts: list  # [stage][kind-run] layers
    rc_counts: list  # [stage][kind-run] recomputed layers (0s without recompute)
    f_expr: list  # forward ns of each stage
    b_expr: list  # backward ns of each stage (recompute included)
    z: object  # the makespan, ns
    horizon: int  # z's upper bound
    first_gather: bool  # ZeRO-3 kept after the forward: each stage holding a layer pays its first gather
    extra_err_ns: float = 0.0  # the most one op is off by in the integer model beyond its rounded coefficients (window_vars, the gather tables)
    cuts: set = dataclasses.field(default_factory=set)

    @property
    def vars_(self) -> list:
        """What an answer assigns: decoder counts, then recompute counts."""
        return self.t + self.rc

    def cut(self, n_f, n_b) -> bool:
        """z >= a path's length (forward and backward ops per stage): a cut for every layout;
        whether it was new."""
        key = (tuple(n_f.astype(int)), tuple(n_b.astype(int)))
        if key in self.cuts:
            return False
        self.cuts.add(key)
        self.model.Add(self.z >= path_sum((n_f, n_b), (self.f_expr, self.b_expr)))
        return True


def build_layout_model(ctx: LayoutContext, lin: LinearLayouts, min_layers: int = 0, max_layers: int | None = None,
                       chunk_spread: int | None = None, uniform_recompute: bool = False, tables=None, paths=None) -> LayoutModel:
    """The CP-SAT model solve_layout's rounds solve (see its docstring for the arguments):
    integer layers and recomputed layers per stage, their counts per kind-run, each stage's
    forward and backward ns, the makespan over the path cuts (`paths`, a previous search's,
    and the schedule's segment paths) and each rank's busy time over its integer kind totals
    (with `tables`, least_recompute's, the recompute its memory forces). Memory rows come in
    later, as layouts break them (MemoryRows)."""
    pp, vp = ctx.pp, ctx.vp
    stages = pp * vp
    n_layers = len(ctx.kind_of_layer)
    u = unit_costs(ctx)
    runs = kind_runs(ctx.kind_of_layer)
    kind_of_run = [kind for kind, _, _ in runs]
    recompute = ctx.recompute_allowed
    model = cp_model.CpModel()

    # -- decision variables: layers per stage in model order, and how many of them are recomputed
    t = [model.NewIntVar(min_layers, n_layers if max_layers is None else max_layers, f"t{s}") for s in range(stages)]
    prefix = [model.NewIntVar(0, n_layers, f"P{s}") for s in range(stages)]
    if chunk_spread is not None:  # regular layouts: the chunks of a rank differ by at most this many layers
        for r in range(pp):
            low = model.NewIntVar(0, n_layers, "")
            model.AddMinEquality(low, t[r::pp])
            for v in t[r::pp]:
                model.Add(v <= low + chunk_spread)
    for s in range(stages):
        model.Add(prefix[s] == (prefix[s - 1] if s else 0) + t[s])
    model.Add(prefix[-1] == n_layers)
    rc = [model.NewIntVar(0, n_layers if recompute else 0, f"r{s}") for s in range(stages)]
    for s in range(stages):
        model.Add(rc[s] <= t[s])
    level = None
    if recompute and uniform_recompute:  # one N for every stage: r_s = min(N, t_s)
        level = model.NewIntVar(0, n_layers, "N")
        for s in range(stages):
            model.AddMinEquality(rc[s], [level, t[s]])

    # -- layers of each kind-run per stage, and the recomputed ones (the first r_s of the stage)
    run_counts, clipped = run_count_vars(model, t, prefix, runs, n_layers)
    rc_counts = recompute_run_vars(model, rc, prefix, clipped, run_counts, runs, n_layers) if recompute else [[0] * len(runs) for _ in range(stages)]

    # -- forward and backward ns of each stage (LinearLayouts' composition, integer coefficients):
    # its layers' and what it holds besides them (chunk_times'), with ZeRO-2/3's traffic inside
    # the pipeline where the skeleton has it: a cost per layer and, under ZeRO-3, one per stage
    # holding a layer (its exposed first gather), through a boolean per stage
    const_f, const_b = lin.const_forward_s, lin.const_backward_s  # what a stage holds besides its decoder layers
    fwd = [int(round(x * TIME_SCALE)) for x in lin.forward_s]
    bwd = [int(round(x * TIME_SCALE)) for x in lin.backward_s]
    rec = [int(round(u["kind_recompute"][k] * TIME_SCALE)) for k in kind_of_run]
    f_expr = [sum(fwd[j] * run_counts[s][j] for j in range(len(runs))) + int(round(const_f[s] * TIME_SCALE)) for s in range(stages)]
    b_expr = [sum(bwd[j] * run_counts[s][j] + rec[j] * rc_counts[s][j] for j in range(len(runs))) + int(round(const_b[s] * TIME_SCALE))
              for s in range(stages)]
    first_gather = bool(np.any(lin.first_forward_s) or np.any(lin.first_backward_s))
    held = held_vars(model, t) if first_gather or lin.windows is not None else []
    if first_gather:
        for s in range(stages):
            f_expr[s] += int(round(lin.first_forward_s[s] * TIME_SCALE)) * held[s]
            b_expr[s] += int(round(lin.first_backward_s[s] * TIME_SCALE)) * held[s]
    # ZeRO-3 with more than one kind of layer: each stage's gathers beyond the linear terms, by
    # table (LinearLayouts.gathers) at the stage's first layer and its layer count
    gather_max_s, table_index = 0.0, []
    if lin.gathers is not None:
        most = np.minimum(lin.most_layers(), n_layers if max_layers is None else max_layers)
        rest_f, rest_b, table_index, gather_max_s = gather_rest_vars(model, lin, t, prefix, n_layers, most)
        f_expr = [x + y for x, y in zip(f_expr, rest_f)]
        b_expr = [x + y for x, y in zip(b_expr, rest_b)]
    # ZeRO-2/3's earlier gradient windows: each stage's backward gains its exposed reduce-scatters
    window, window_max_s, extra_err_ns = [0] * stages, 0.0, 1.0 if lin.gathers is not None else 0.0
    if lin.windows is not None:
        window, window_max_s, window_err_ns = window_vars(model, ctx, lin, run_counts, rc_counts, held, table_index)
        extra_err_ns += window_err_ns
        for s in range(stages):
            b_expr[s] += window[s]

    # -- the makespan: at least every path cut's length
    zero_traffic = float(np.max(lin.forward_s + lin.backward_s - u["kind_total"][kind_of_run])) * n_layers + float(
        lin.first_forward_s.max() + lin.first_backward_s.max()) + window_max_s + gather_max_s  # ZeRO-2/3's, per layer and per stage: 0 without
    per_op = (max((u["kind_total"] + u["kind_recompute"]).max(), 0.0) * n_layers + float(const_f.max() + const_b.max()) + zero_traffic) * TIME_SCALE
    horizon = int(2 * ctx.microbatches * stages * per_op) + 1
    z = model.NewIntVar(0, horizon, "makespan")
    lm = LayoutModel(model, t, rc, level, run_counts, rc_counts, f_expr, b_expr, z, horizon, first_gather, extra_err_ns)
    for n_f, n_b in sorted(paths or ()):  # a previous search's paths of this skeleton: cuts for every layout
        lm.cut(np.array(n_f), np.array(n_b))
    for n_f, n_b in segment_paths(ctx.ops, stages, ctx.microbatches):
        if chunk_spread is None or (n_f == n_b).all():
            lm.cut(n_f, n_b)

    # -- each rank's layers of each kind as integer variables, and the rank's busy time over
    # them: implied by the segment paths, but in this form CP-SAT branches and propagates on the
    # integer rank totals (with it the bound reaches DeepSeek-V3's rank bound, 4 MoE layers x
    # 480 micro-batches = 57.6 s, within the first round)
    kinds_used = sorted(set(kind_of_run))
    for r in range(pp):
        mine = range(r, stages, pp)
        total = {k: model.NewIntVar(0, n_layers, f"L{r}_{k}") for k in kinds_used}
        for k in kinds_used:
            model.Add(total[k] == sum(run_counts[s][j] for s in mine for j, kind in enumerate(kind_of_run) if kind == k))
        per_layer = {k: fwd[kind_of_run.index(k)] + bwd[kind_of_run.index(k)] for k in kinds_used}
        const = sum(int(round(const_f[s] * TIME_SCALE)) + int(round(const_b[s] * TIME_SCALE)) for s in mine)
        recomputing = 0
        if recompute:  # the rank's recomputed layers of each kind, integer totals like its layers
            for k in kinds_used:
                again = model.NewIntVar(0, n_layers, f"R{r}_{k}")
                model.Add(again == sum(rc_counts[s][j] for s in mine for j, kind in enumerate(kind_of_run) if kind == k))
                recomputing += rec[kind_of_run.index(k)] * again
            if tables is not None:
                # the fewest layers the rank recomputes at each layer total (least_recompute), as
                # an element constraint (integer reasoning) and its lower convex envelope (the
                # LP's): the memory rows alone let the LP recompute a fraction of a layer where a
                # layout must recompute one or two
                table = tables[r]
                k = kinds_used[0]
                model.Add(again >= least_recompute_var(model, total[k], table, f"least{r}"))
                for (n1, f1), (n2, f2) in lower_envelope(table):
                    model.Add((n2 - n1) * again >= (f2 - f1) * total[k] + (f1 * n2 - f2 * n1))
        model.Add(z >= ctx.microbatches * (sum(per_layer[k] * total[k] for k in kinds_used) + const + recomputing + sum(window[s] for s in mine)))
    return lm


def model_slack_s(ctx: LayoutContext, lm: LayoutModel) -> float:
    """How far the integer model can price a path off its seconds: a path of <= 2*m*stages ops,
    each off by <= 0.5 ns per rounded term (its constants; its layers and recomputed layers per
    kind-run, times their counts, which sum to <= 2*m*n layers along a path, each stage visited
    <= 2*m times), and the windows' and gather tables' error per op (lm.extra_err_ns)."""
    stages, n_layers = ctx.pp * ctx.vp, len(ctx.kind_of_layer)
    runs = len(kind_runs(ctx.kind_of_layer))
    terms = max(stages * runs, n_layers) * (2 if ctx.recompute_allowed else 1) + stages * (1 + lm.first_gather)
    return (0.5 * 2 * ctx.microbatches * terms + 2 * ctx.microbatches * stages * lm.extra_err_ns) / TIME_SCALE


def relaxed_bound(ctx: LayoutContext, lin: LinearLayouts, incumbent: StageLayout, time_limit_s: float, workers: int, paths=(),
                  min_layers: int = 0, max_layers: int | None = None, chunk_spread: int | None = None,
                  round_limit_s: float = 4.0) -> tuple[float | None, set]:
    """A lower bound on the makespan of every layout that fits, from the search's model without
    what a stage pays for holding a layer (LinearLayouts.without_stage_jumps: ZeRO-3's exposed
    first gather, the gather tables' and the gradient windows' rest, all >= 0, so the model
    prices every layout at most at its makespan), and the paths it found: cuts for the search's
    own model. Those terms are small (microseconds to milliseconds an op) but each needs a
    boolean per stage, whose LP prices a stage's jump at a fraction, so CP-SAT branches on them in
    every round (DeepSeek-V3 on pp 16 x vp 2 under ZeRO-2, 30 windows per stage: one round in 10
    s, a 9.8% gap); without them the rounds close within seconds, on the least relaxed makespan,
    which is below the optimum by at most the jumps along its path.
    Rounds as the free search's, on relaxed times: CP-SAT's answers priced below the goal (at
    first the incumbent's relaxed makespan) bring their longest paths as cuts and the memory rows
    they break, and one that fits with a relaxed makespan below the goal becomes it; INFEASIBLE
    proves the goal less 2 slack: the bound returned, None where no round proved it in time.
    `paths`: the search's cuts so far (op counts per stage, priced here on relaxed times), and
    the paths found are returned with it. (None, set()) where there is nothing to leave out."""
    start = time.perf_counter()
    plain = lin.without_stage_jumps()
    if plain is None:
        return None, set()
    lm = build_layout_model(ctx, plain, min_layers, max_layers, chunk_spread, paths=paths)
    slack = model_slack_s(ctx, lm)
    rows = MemoryRows(lm.model, ctx, plain, lm.run_counts, lm.rc_counts if ctx.recompute_allowed else None)
    # no objective: each round asks only whether some layout is priced below the goal, and stops
    # at its first answers; with Minimize(z) CP-SAT's rounds went on improving answers and did not
    # prove the goal in time (DeepSeek-V3 on pp 16 x vp 2 under FSDP: 1.09% -> 5.8-6.5% in 10 s),
    # so a bound comes only from a round that proves it (INFEASIBLE)
    vector = incumbent.decoders + incumbent.recompute
    rows.add_broken(vector)
    goal = float(plain.screen([vector]).makespan_s[0])
    bound = None
    while (left := time_limit_s - (time.perf_counter() - start)) > 0.05:
        status, proved, answers = round_below(lm.model, lm.z, lm.vars_, goal, slack, left, workers, under_s=slack,
                                              answers_by_s=answers_by(round_limit_s, left))
        if status == cp_model.INFEASIBLE:
            bound = proved  # the goal less 2 slack
            break
        if not answers:
            break  # the time is out
        screened = plain.screen(answers)
        new = False
        for k, (n_f, n_b) in enumerate(screened.paths()):
            new |= lm.cut(n_f, n_b)
            if not screened.fits[k]:
                new |= rows.add_broken(answers[k])
            elif screened.makespan_s[k] < goal:
                goal, new = float(screened.makespan_s[k]), True
        if not new:  # nothing learnt (integer rounding): exclude them
            lm.model.AddForbiddenAssignments(lm.vars_, answers)
    return bound, lm.cuts


def window_vars(model: cp_model.CpModel, ctx: LayoutContext, lin: LinearLayouts, run_counts: list, rc_counts: list,
                held: list, table_index: list) -> tuple[list, float, float]:
    """Each stage's earlier gradient windows beyond LinearLayouts' linear terms, in integer ns
    (LinearLayouts.window_s, WindowTerms): E_s >= max(B_s - G_r, (alpha - 1) min(G_r, B_s)) over
    B_s = beta * rs_s and G_r = max(gap_r, 0) (costmodel.overlap.beyond_window), a min and a
    max of affine forms, less the (alpha - 1) / alpha B_s the linear terms hold (of B_s without
    its jump, the experts' collective; rounded up, so that the rest is never priced above its
    value); a stage's backward gains (windows - 1) / m of it. Without DP overlap the rest is the
    jump alone. With tabulated gathers (table_index: each stage's GatherTables index) the
    prefetches' overlap in G_r comes from their tables. Returns (per stage the ns variable, the
    most seconds one can add, the rounding error of one op in ns, for the search's slack)."""
    w, coef = lin.windows, ctx.problem.hardware.efficiency.dp_overlap
    stages, pp, vp, m = lin.stages, ctx.pp, ctx.vp, float(ctx.microbatches)
    n_layers = len(ctx.kind_of_layer)
    runs = range(len(lin.runs))
    ns = lambda v: int(round(float(v) * TIME_SCALE))  # noqa: E731
    # -- each stage holds a layer that starts the jump's collective (an experts' layer): a boolean
    jumped = []
    for s in range(stages):
        if not w.rs_jump[s] or not w.jump_runs.any():
            jumped.append(0)
            continue
        h = model.NewBoolVar(f"jumped{s}")
        starting = sum(run_counts[s][j] for j in runs if w.jump_runs[j])
        model.Add(starting >= 1).OnlyEnforceIf(h)
        model.Add(starting == 0).OnlyEnforceIf(h.Not())
        jumped.append(h)
    if not w.overlap:  # rs exposed whole: the linear terms hold all of it but the jump
        out = [int(math.floor(w.linear * w.rs_jump[s] * TIME_SCALE)) * jumped[s] for s in range(stages)]
        return out, w.linear * float(w.rs_jump.max()), 1.0
    rs_max_s = float((w.rs_const + w.rs_first + w.rs_jump).max() + w.rs_run.max() * n_layers)
    share = (w.windows - 1.0) / m  # of one stage's E_s in each of its backward passes
    scale = Fraction(share).limit_denominator(10**6)
    if scale > Fraction(share):  # never above it: (windows - 1) / m is exact where windows is an integer
        scale = Fraction(math.floor(share * 10**6), 10**6)
    alpha, beta = float(coef.alpha), float(coef.beta)
    q = 2**24  # (alpha - 1) as excess_q / q rounded down, (alpha - 1) / alpha as linear_q / q rounded up
    excess_q, linear_q = int(math.floor((alpha - 1.0) * q)), int(math.ceil((alpha - 1.0) / alpha * q))
    # gap_r = per_gap * compute - per_used * used, read off the exact model's window_compute_s
    per_gap = float(window_compute_s(m, 1.0, 0.0, w.windows, vp))
    per_used = -float(window_compute_s(m, 0.0, 1.0, w.windows, vp))
    gap_max_s = per_gap * float(w.compute_const.sum() + (w.compute_run.max() + float(lin.recompute_s.max(initial=0.0))) * n_layers)
    # the domains' ends, with the rounding of their terms (<= 0.5 ns per layer and constant)
    b_max, g_max = ns(beta * rs_max_s) + n_layers + 4, ns(gap_max_s) + 2 * n_layers + 3 * stages + 2
    e_max = int(max(1.0, alpha - 1.0) * b_max) + 1
    # -- the prefetches' overlap of each stage, by table where the gathers are tabulated
    used = [0] * stages
    g = lin.gathers
    if g is not None and g.used_middle is not None:
        for s in range(stages):
            table = g.used_middle.ravel() if s < stages - 1 else g.used_last
            values = [ns(per_used * v) for v in table]
            used[s] = model.NewIntVar(min(values), max(values), f"used{s}")  # more overlap only shortens: at its most, the value
            model.Add(used[s] <= table_value(model, table_index[s], values))
    gaps = []
    # -- each rank's gap: its compute between two windows less its prefetches' overlap, >= 0
    for r in range(pp):
        mine = ctx.stages_of[r]
        gap = sum(ns(per_gap * w.compute_const[s]) - ns(per_used * w.used_const[s]) - used[s] for s in mine)
        gap += sum((ns(per_gap * w.compute_run[j]) - ns(per_used * w.used_layer)) * run_counts[s][j] for s in mine for j in runs)
        gap += sum(-ns(per_used * w.used_first[s]) * held[s] for s in mine)
        gap += sum(ns(per_gap * lin.recompute_s[j]) * rc_counts[s][j] for s in mine for j in runs if not isinstance(rc_counts[s][j], int))
        gv = model.NewIntVar(0, g_max, f"gap{r}")
        model.AddMaxEquality(gv, [gap, 0])
        gaps.append(gv)
    # -- each stage's reduce-scatter, what it exposes, and the rest beyond the linear terms
    rank_of = stage_ranks(pp, vp, ctx.vee)
    out = []
    for s in range(stages):
        b = model.NewIntVar(0, b_max, f"rs{s}")  # beta * rs_s
        jump = ns(beta * w.rs_jump[s]) * jumped[s]
        model.Add(b == ns(beta * w.rs_const[s]) + ns(beta * w.rs_first[s]) * held[s] + jump
                  + sum(ns(beta * w.rs_run[j]) * run_counts[s][j] for j in runs))
        low = model.NewIntVar(0, b_max, f"overlapped{s}")
        model.AddMinEquality(low, [gaps[rank_of[s]], b])
        e = model.NewIntVar(0, e_max, f"exposed{s}")
        model.Add(e >= b - gaps[rank_of[s]])
        model.Add(q * e >= excess_q * low)
        rest = model.NewIntVar(0, e_max, f"rest{s}")
        model.Add(q * rest >= q * e - linear_q * (b - jump))
        grown = model.NewIntVar(0, int(share * e_max) + 2, f"window{s}")
        model.Add(scale.denominator * grown >= scale.numerator * rest)
        out.append(grown)
    # rounding per op: B_s (its terms, <= 0.5 ns per layer and constant) and G_r (per layer of
    # the rank, recomputed or not, its constants and tabulated overlaps), each weighing up to
    # max(1, alpha - 1) in E_s; the two shares of q; the integer E_s and rest; the final ceiling
    err = share * (max(1.0, alpha - 1.0) * (0.5 * (3 + n_layers) + 0.5 * (3 * stages + 3 * n_layers)) + 2 * b_max / q + 2.0) + 1.0
    return out, share * e_max / TIME_SCALE, err


def in_space(decoders, min_layers: int, max_layers: int | None) -> bool:
    """Whether a layout's stages hold between min_layers and max_layers decoder layers."""
    return min(decoders) >= min_layers and (max_layers is None or max(decoders) <= max_layers)


def known_layouts(ctx: LayoutContext, lin: LinearLayouts, lm: LayoutModel, inc: Incumbent, score_of, seeds: tuple[StageLayout, ...],
                  time_limit_s: float, min_layers: int, max_layers: int | None, chunk_spread: int | None,
                  graph: bool, make_starts=lambda: True) -> tuple[tuple[StageLayout, ...], tuple[StageLayout, ...], StageLayout | None]:
    """solve_layout's known layouts: the given seeds, with the recompute that makes them fit
    (one N where the search keeps one, lm.level), their longest paths as cuts and the best that
    fits offered to the incumbent; where none fits, starts of the search's own (round_seeds,
    fill_seed; not where `make_starts()`, asked then, is False: none would fit). Returns (every
    seed, the starts a local search descends from where no seed fit, and under one N the
    fastest seed that fits recomputing nothing)."""
    pp, vp = ctx.pp, ctx.vp
    stages = pp * vp
    level, recompute, cut = lm.level, ctx.recompute_allowed, lm.cut
    runs = lin.runs
    mtp = ctx.mtp_on_last
    if level is not None:
        # uniform recompute: seeds recompute min(N, layers), N their own where they have one,
        # else their most; each also with no recompute and with the least N that fits it
        # (fewest_recompute): a per-stage answer that recomputes one layer somewhere becomes
        # N = 1 everywhere, a basin far from its own decoder counts with N = 0 (DeepSeek-V3:
        # 69.7 s against 60.9 s)
        own_n = tuple(seed.with_recompute([min(n, d) for d in seed.decoders])
                      for seed, n in ((seed, seed.uniform_recompute()) for seed in seeds)
                      for n in [n if n is not None else max(seed.recompute)])
        least_n = tuple(x for x in (fewest_recompute(ctx, seed.with_recompute([0] * stages), lin, uniform=True)
                                    for seed in seeds if seed.stages == stages) if x is not None)
        seeds = tuple(dict.fromkeys(own_n + least_n))
        if not graph:  # and the layouts that pack each rank's layers into its last chunks, N = 1 and 2
            packed = (seed for seed in packed_seeds(ctx, (1, 2))
                      if in_space(seed.decoders, min_layers, max_layers) and (chunk_spread is None or regular(seed, chunk_spread)))
            seeds = tuple(dict.fromkeys(seeds + tuple(packed)))
    if recompute and level is None:
        # each seed also with the fewest recomputed layers that make it fit (fewest_recompute);
        # not with one N: a seed that one N makes fit (DeepSeek-V3's recipe split, N = 1 at
        # 69.8 s) can hold the local search in a basin that N = 0 layouts (61.0 s) are not near
        repaired = [fewest_recompute(ctx, seed.with_recompute([0] * stages), lin) for seed in seeds if seed.stages == stages]
        seeds = tuple(dict.fromkeys(seeds + tuple(x for x in repaired if x is not None)))
    # Known layouts: their critical paths as cuts, the best that fits as the incumbent. Those
    # with the MTP modules where the search puts them are measured in one batch on the
    # schedule graph and the linear memory test (the exact model's), which gives every one's
    # longest path at once, and only the fastest that passes is simulated, to confirm it; the
    # others are scored exactly.
    graph_seeds = [layout for layout in seeds if layout.mtp == mtp and layout.stages == stages]
    candidates = [layout for layout in seeds if layout not in graph_seeds]
    if graph_seeds:
        screened = lin.screen([layout.decoders + layout.recompute for layout in graph_seeds])
        for n_f, n_b in screened.paths():
            cut(n_f, n_b)
        order = np.argsort(screened.makespan_s, kind="stable")
        candidates += [graph_seeds[k] for k in order if screened.fits[k]]
        # one N: the fastest seed that fits recomputing nothing, a start of its own (below)
        plain_seeds = [k for k in order if screened.fits[k] and not graph_seeds[k].any_recompute]
        zero_start = graph_seeds[plain_seeds[0]] if level is not None and plain_seeds else None
    else:
        zero_start = None
    for layout in candidates:
        score = score_of(layout)
        if layout not in graph_seeds:
            cut(*path_of(ctx, score))
        inc.offer(layout, score)
        if score.fits and layout in graph_seeds:
            break  # the fastest graph seed that fits: the others are slower
    starts: tuple[StageLayout, ...] = ()
    if inc.layout is None and len(runs) == 1 and level is None and not graph and make_starts():
        # no given layout fits: seeds whose chunk rounds are balanced under the memory rows
        # (round_seeds): every answer of two CP-SAT solves (random seeds 0 and 1 side by side, round_seed_pair, each with a
        # twentieth of the time at most), the ROUND_STARTS fastest on the schedule graph. Their
        # local optima differ widely and not in the order of the starts (Llama 3 405B cp 1:
        # starts at 11.36 s descend to 9.15, 9.70 or 10.27 s), and which one leads to the best
        # layout changes with the step-time coefficients: descending from each solve's best
        # answer alone gave 9.15 s, and 10.27 s after a 0.4% refit of the H100 profile
        found = round_seed_pair(ctx, lin, min(0.5, 0.05 * time_limit_s), min_layers, max_layers, chunk_spread)
        found = list(dict.fromkeys(found))
        if found:
            order = np.argsort(lin.screen([a.decoders + a.recompute for a in found]).makespan_s, kind="stable")
            starts = tuple(found[k] for k in order[:ROUND_STARTS])
        # and the layers poured into the ranks that still fit them (fill_seed): near the split
        # where memory binds on a few ranks (Llama 3 405B cp 1 under ZeRO-2: 6.94 s, where
        # round_seeds' answers pile every rank's layers into its last chunks and descend to 7.41 s)
        filled = fill_seed(ctx, lin) if min_layers == 0 and max_layers is None else None
        if filled is not None and filled not in starts and (chunk_spread is None or regular(filled, chunk_spread)):
            starts = starts + (filled,)
        for seed in starts:
            score = score_of(seed)
            cut(*path_of(ctx, score))
            inc.offer(seed, score)
        seeds = seeds + starts
    return seeds, starts, zero_start


def region_bound(ctx: LayoutContext, lin: LinearLayouts, lm: LayoutModel, incumbent, goal_s: float, slack_s: float, budget_s: float,
                 tables, min_layers: int, max_layers: int | None, below_goal=()) -> tuple[float | None, bool]:
    """Layouts of one kind of layer, with an incumbent (its score): the integer
    consequences of beating it (rank_order_region: rank totals, stage 0) and, within them, the
    LP relaxation of the schedule graph (lp_region_bound), in `budget_s`. Where the LP reaches
    `goal_s` (the incumbent less the rounding slack), that certifies the incumbent without a
    CP-SAT round (Llama 3 405B on pp 16 x vp 8, which CP-SAT over the same cuts does not certify
    in 20 s); otherwise the region's rows and the LP's paths join the model (the rows hold for
    every layout the rounds ask for: those below the incumbent). solve_layout runs it with a
    second or more: under that, its probes alone would overrun the limit.
    `below_goal`: the decoder counts of layouts known to run below the goal though they do not
    fit (the seeds that break the memory): the LP relaxes memory and recompute, so at one of them
    inside the region its value is at most that layout's makespan, and it cannot reach the goal;
    then the region's rows alone join the model and the LP's time goes to the rounds.
    Returns (the bound proven for every layout, None where the LP proved nothing; whether it
    certifies the incumbent)."""
    pp, t = ctx.pp, lm.t
    t_region = time.perf_counter()
    region = rank_order_region(ctx, goal_s, lin, time_limit_s=0.2 * budget_s, tables=tables)
    if region is None:
        return goal_s, True
    for r in range(pp):
        lm.model.Add(sum(t[r::pp]) >= region.low[r])
        lm.model.Add(sum(t[r::pp]) <= region.high[r])
    lm.model.Add(t[0] <= region.stage0_high)
    if any(region.contains(decoders) for decoders in below_goal):
        return None, False
    pool = [path_of(ctx, incumbent)] + [(np.array(n_f), np.array(n_b)) for n_f, n_b in sorted(lm.cuts)]
    found_lb, lp_paths = lp_region_bound(ctx, region, goal_s, pool=pool, time_limit_s=budget_s - (time.perf_counter() - t_region),
                                         lin=lin, min_layers=min_layers, max_layers=max_layers)
    for n_f, n_b in lp_paths:
        lm.cut(n_f, n_b)
    if found_lb is None:
        return None, False
    # a layout outside the region is no faster than the goal, one inside no faster than found_lb
    return min(goal_s, found_lb - slack_s), found_lb - slack_s >= goal_s


def solve_layout(ctx: LayoutContext, time_limit_s: float = 10.0, workers: int = 2, min_layers: int = 0, refine: bool = True,
                 seeds: tuple[StageLayout, ...] = (), round_limit_s: float = 4.0, graph: bool = False,
                 max_layers: int | None = None, chunk_spread: int | None = None, local: bool = True,
                 local_fraction: float = 0.15, neighbour_paths: int | None = None, uniform_recompute: bool = False,
                 scores: dict | None = None, paths: set | None = None, region_fraction: float = 0.75,
                 split_fraction: float | None = None, rank_tables: bool = True, table_cache: dict | None = None,
                 relax_fraction: float | None = None, anneal_fraction: float = 0.25) -> LayoutSolution:
    """The layout minimising the simulated pipeline makespan of `ctx`'s skeleton under every
    rank's memory (MTP modules on the last stage; `min_layers`: the least decoder layers per
    stage). The step adds the exposed P2P (the skeleton's) and the busiest rank's DP reduce and
    update (costmodel.stage_layout.rank_update_s), which the objective leaves out: the bound and
    the gap are the makespan's, and the step of the answer is scored whole.

    The objective is the simulated makespan, a max over the schedule graph's paths of linear
    forms in the layer counts (any path bounds every layout from below). The model starts from
    the segment paths of every rank (segment_paths), each rank's busy time over its integer
    kind totals, and the longest paths of the `seeds` and of a local search from the best seed
    that fits (local_search: the incumbent, and the paths of its best `neighbour_paths`
    neighbours, which are tight around it; default min(1000, 32768 / stages), about 32k cut
    terms: on DeepSeek-V3 32 -> 1000 takes its free-layout certification from ~20 s to ~8 s,
    where Llama 3 405B's 128 stages make each path four times the terms); memory rows come in
    as answers break them. Where no seed fits (one kind of decoder layer, not uniform_recompute),
    the ROUND_STARTS fastest of round_seeds' answers join the seeds and the local search runs
    from each.
    Layouts with an incumbent, one kind of decoder layer (free ones, and regular ones where
    stages pay nothing for holding a layer): first the integer consequences of beating the
    incumbent (rank_order_region: each rank's least and most layers, stage 0's most, from the
    ranks' busy time, the recompute their totals force and the order their first layers come
    in) and the LP
    relaxation of the schedule graph within them (lp_region_bound), with at most
    `region_fraction` of the time left: where the LP reaches the incumbent that certifies it
    with no CP-SAT round (Llama 3 405B on pp 16 x vp 8: the integer rank totals are what the
    path cuts' LP relaxation misses, 2.1% below Megatron's split; its regular layouts: 2.4 s
    -> 0.4 s); otherwise the region's rows and the LP's paths join the model for the rounds
    (cp 1 with per-chunk recompute, regular layouts, whose tables hold a rank to 8 layers:
    1.8% -> 1.6% in 10 s). Where a seed that breaks the memory runs below the incumbent, the
    LP (memory relaxed) stays below that seed and cannot certify: it is skipped, and without
    recompute tables the region's probes too, their time going to the rounds (Llama 3 405B
    cp 1, free layouts, the split 11 GiB over at 5.5 s against a 9.2 s incumbent: 43.8% ->
    1.5-6.7% in 10 s over four runs).
    Free layouts with an incumbent: each round asks CP-SAT for layouts the model prices below
    the incumbent; every answer's longest path becomes a cut (or the answer the new incumbent),
    and INFEASIBLE certifies the incumbent. Before the rounds the model takes the paths that
    dwell on one or two overloaded chunks (dwell_paths, around the incumbent's stage times:
    the far layouts CP-SAT proposes first; Llama 3 405B cp 1, free layouts: 5.2% -> 1.1% in
    10 s) and, with recompute, that only ranks which cannot fit without it recompute
    (MemoryRows.recompute_only_where_needed; recomputing_ranks' zeros for ranks that cannot
    do so below the incumbent): DeepSeek-V3 pp 16 x vp 2, per-stage recompute, 6.4% in 10 s
    -> certified in 7.7-9.3 s. Otherwise (regular layouts, no incumbent yet,
    refine=False) each round minimises the model, simulates the answer and adds its path,
    until the best simulated layout meets CP-SAT's bound. Either way the bound is proven when
    time runs out and the gap is reported.
    refine=False stops after the first round: the critical-path bound's optimum (the DP oracle's
    objective). chunk_spread: search only regular layouts, whose chunks on one rank differ by at
    most this many layers (the answer and its bound then hold among those; the cuts start from
    the rank terms only, which keeps the model small). round_limit_s caps each CP-SAT solve
    once there is an incumbent (free layouts: a round stops that far in once it has answers and
    goes on while it has none, round_below; regular ones: a round that finds nothing gets the
    rest of the time; its bound is proven either way). local=False skips the local search
    (local_fraction of the time limit). graph=True replaces the cuts by the whole event graph of the schedule (an
    end-time variable per op): exact in one solve, but too large for CP-SAT beyond small
    instances (pp 16 x vp 8 x 32 micro-batches: no bound in 20 s).
    Recompute (skeletons with full recompute, ctx.recompute_allowed): an integer r_s per stage,
    0 <= r_s <= t_s, the stage's first r_s layers fully recomputed (their kind-runs clipped
    from the prefix sums like the layers'); the backward times gain r_s's recompute, the memory
    rows lose what the recomputed layers do not keep and gain, per rank, the working set of the
    largest kind it recomputes (an integer w_r >= working_k * y_rk, y_rk a boolean that the
    rank recomputes a layer of kind k). uniform_recompute: r_s = min(N, t_s) for one integer N,
    Megatron's one --recompute-num-layers (the exportable answer), seeded also with layouts that
    pack each rank's layers into its last chunks (packed_seeds). With one kind of decoder
    layer (rank_tables), each rank's fewest recomputed layers at each of its layer totals
    (least_recompute, over regular splits where chunk_spread is set; 0.7-0.8 s for Llama 3
    405B's 16 ranks on 2 cores; `table_cache`: shared by calls on the same skeleton, two_phase) join the model as element constraints
    with their convex envelopes, and the rank region as recompute its work must include: the
    memory rows alone let the LP recompute a fraction of a layer where the rank must recompute
    one or two (Llama 3 405B cp 1, regular layouts: 5.9% -> 2.7% in 10 s).
    Time: the seeds are scored first (`scores`: a cache of score_layout by layout that
    callers solving the same skeleton twice share, two_phase), the local search takes at most
    local_fraction of the limit and a quarter of what is left, the rank region and its LP at
    most region_fraction of the rest (the LP stops early where it stops gaining), CP-SAT the
    rest. The bound reported is the best of CP-SAT's, the region LP's and work_bound_s
    (bound_source says which): a search whose CP-SAT rounds prove nothing in time still
    carries a proven gap.
    anneal_fraction: where no seed fits (the descents from round_seeds' starts) and no two descents
    ended in the same best layout, at most this share of the limit (and 35% of the time left: the
    rounds need the rest for a bound; half left ZeRO-2's at the work bound in two runs of three)
    goes to annealing from the incumbent (layout_seeds.anneal) before the rounds, and a descent
    from what it finds.
    relax_fraction: the share of the time left after the local search given to relaxed_bound
    (skeletons whose stages pay for holding a layer: ZeRO-3's first gather, the gather tables,
    the gradient windows; with an incumbent): the model without those jumps, whose rounds close
    where the jumps' booleans stall the search's own, its bound a floor for them (z >= it) and its
    paths their cuts (DeepSeek-V3 on pp 16 x vp 2, 30 windows per stage: ZeRO-2 9.8% -> 0.007%
    in 10 s, FSDP kept after the forward 12.9% -> 1.1%; the jumps along a path are what is left).
    Default (None): 0.4, and 0.7 for free layouts of several kinds of decoder layer, where no rank
    region or LP follows and the search's own rounds stall on the jumps, so relaxed_bound is the
    bound: DeepSeek-V3 pp 16 x vp 2 under FSDP, `mofa solve --pipeline-layouts` (its free phase
    ~6 s), proved 1.09% in 9 runs of 14 (each the first search of its process) and the work
    bound's 12.9% in 5: where the regular phase's cuts leave it a harder first round it needs
    2.3-2.5 s, not 0.25 s, and 0.4 gave it 1.7-1.8 s; with 0.7, 1.09% in 14 runs of 14.
    split_fraction: the share of the time left after the local search given to
    recompute_split_bound (skeletons with recompute, with an incumbent): recompute as a yes/no
    per rank, where a rank that recomputes is over its capacity without it and pays at least
    one recomputed layer. Default: all of it for regular layouts whose incumbent recomputes at
    most one layer per rank (DeepSeek-V3 on pp 16 x vp 2, whose optimum recomputes nothing:
    certified in 5-10 s, where the search's own rounds stop at a 5.9% gap, their LP recomputing a
    fraction of a layer); none where it recomputes more (the relaxation prices a rank's
    recompute at one layer, so it cannot reach such an incumbent: Llama 3 405B cp 1, 27 layers,
    11.5% instead of the rounds' 6.1%) and none for free layouts (there its CP-SAT model, 32
    more booleans, proved less in 10 s than the search's own rounds: 56.5 s against 56.8 s)."""
    check_searchable(ctx)
    start = time.perf_counter()
    scores = {} if scores is None else scores  # shared with the nested search below
    score_of = memo_scorer(ctx, scores)

    pp, vp = ctx.pp, ctx.vp
    stages = pp * vp
    if neighbour_paths is None:
        neighbour_paths = min(1000, 32768 // stages)
    n_layers = len(ctx.kind_of_layer)
    runs = kind_runs(ctx.kind_of_layer)
    if relax_fraction is None:  # see the docstring: relaxed_bound is the only bound of free layouts of several kinds
        relax_fraction = 0.7 if chunk_spread is None and len(runs) > 1 else 0.4
    recompute = ctx.recompute_allowed
    lin = LinearLayouts(ctx)
    tables = None  # one kind of layer, with recompute: each rank's fewest recomputed layers per layer total
    if recompute and rank_tables and len(runs) == 1:
        most = n_layers if max_layers is None else min(n_layers, vp * max_layers)
        table_cache = {} if table_cache is None else table_cache
        key = most if chunk_spread is None else (most, chunk_spread)  # step_floor_s reads the free tables by `most`
        if key not in table_cache:
            table_cache[key] = [least_recompute(ctx, lin, r, most, chunk_spread) for r in range(pp)]
        tables = table_cache[key]
    lm = build_layout_model(ctx, lin, min_layers, max_layers, chunk_spread, uniform_recompute, tables, paths)
    model, rc, level, vars_, z, cut, cuts = lm.model, lm.rc, lm.level, lm.vars_, lm.z, lm.cut, lm.cuts
    mtp = ctx.mtp_on_last
    inc = Incumbent()  # the best layout that fits so far

    def make(vector) -> StageLayout:
        """The layout of an answer: decoder counts, then recompute counts."""
        return StageLayout(pp=pp, vp=vp, decoders=tuple(int(x) for x in vector[:stages]), mtp=mtp,
                           recompute=tuple(int(x) for x in vector[stages:]))

    # no regular layout fits, by the ranks' memory in their integer totals: a solve of 0.06-0.1 s
    # where the starts for a space without a fitting seed and CP-SAT's first round took 0.8-1.5 s
    # to say so (Llama 3 405B cp 1, plain, ZeRO-2, offload, nc 32: time two_phase's free search
    # now gets); the seeds are still scored, the exact model having the last word
    @functools.cache
    def none_fits() -> bool:  # asked only where no seed fits
        return chunk_spread is not None and rank_order_region(ctx, NO_GOAL_S, lin, time_limit_s=0.5, feasibility_only=True,
                                                              spread=chunk_spread, memory=True) is None

    seeds, starts, zero_start = known_layouts(ctx, lin, lm, inc, score_of, seeds, time_limit_s, min_layers, max_layers, chunk_spread, graph,
                                              make_starts=lambda: not none_fits())
    if inc.layout is None and none_fits():
        raise LayoutError("no layout of this configuration fits the GPU memory (no rank's layer total fits its memory with the others')")

    nearest = None
    descent_ends = []  # the makespan each descent ended at

    def descend(layout, budget_s):
        """Local search from a layout (repaired first where it does not fit): a better
        incumbent, and the longest paths of the layouts around the local optimum as cuts (the
        ones CP-SAT's bound needs there)."""
        nonlocal nearest
        if not local or budget_s <= 0:
            return
        decoders, end_s, paths, recomputed = local_search(ctx, layout.decoders, budget_s, lin=lin, spread=chunk_spread, min_layers=min_layers,
                                                      max_layers=max_layers, neighbour_paths=neighbour_paths, start_recompute=layout.recompute,
                                                      uniform_recompute=level is not None)
        descent_ends.append(end_s)
        for n_f, n_b in paths:
            cut(n_f, n_b)
        found = make(decoders + recomputed)
        add_rows(decoders + recomputed)
        nearest = found  # a repair that fell short still makes CP-SAT's best hint
        score = score_of(found)
        inc.offer(found, score)

    rows = MemoryRows(model, ctx, lin, lm.run_counts, lm.rc_counts if recompute else None)
    add_rows = rows.add_broken
    # a rank's recompute only slows it, except under gradient windows: its recomputed layers
    # widen the gap its stages' reduce-scatters hide behind, so one may speed the layout up
    # (with DP overlap: without, nothing hides and the windows do not depend on the gap)
    recompute_dominated = lin.windows is None or not lin.windows.overlap
    if recompute and level is None and tables is None and recompute_dominated:
        # a rank recomputes only where it must (with one kind of layer the rank tables above
        # already price what its memory forces, and these 16 more booleans slowed the rounds:
        # Llama 3 405B cp 1, free layouts after a regular search, 5.4% -> 7.8% in 10 s)
        rows.recompute_only_where_needed(lm.run_counts, lm.rc_counts)
    for layout in seeds:
        add_rows(layout.decoders + layout.recompute)

    def by_levels() -> LayoutSolution | None:
        """One N (see below): the answer where level_work_bounds settles the search (no N open,
        or only N = 0: the search without recompute), else None (the N still open kept for
        CP-SAT's domain)."""
        nonlocal level_floor, open_levels
        best_makespan = layout_makespan(inc.score)
        open_levels, low = level_range(ctx, lin, best_makespan, n_layers if max_layers is None else max_layers, tables)
        level_floor = max(level_floor, low)
        if not open_levels:
            return LayoutSolution(inc.layout, inc.score.step_time_s, best_makespan, inc.score.bound_s, best_makespan, True,
                                  time.perf_counter() - start, inc.score.fits, 0, "levels")
        if open_levels == [0]:
            # the cuts so far go in (a descent's, near the incumbent, where one ran; a per-stage
            # search's, shared through `paths`) and the time to CP-SAT's rounds, not to a local
            # search of its own (its rounds need the time: DeepSeek-V3 certifies after 2-4 s of
            # them); the incumbent is its only seed, since each seed brings the memory rows it
            # binds, which slow the rounds (DeepSeek-V3 standalone with every seed: 0.39% at 10 s
            # in two runs of three; with the incumbent alone certified in 4.3-5.7 s)
            zero = [0] * stages
            known = set(cuts) | set(paths or ())
            plain = solve_layout(dataclasses.replace(ctx, lc_full=None), max(time_limit_s - (time.perf_counter() - start), 0.05), workers,
                                 min_layers, refine, seeds=(inc.layout.with_recompute(zero),),
                                 round_limit_s=round_limit_s, max_layers=max_layers, chunk_spread=chunk_spread, local=False,
                                 neighbour_paths=neighbour_paths, scores=scores, paths=known, region_fraction=region_fraction)
            if paths is not None:
                paths.update(known)
            if plain.makespan_s <= best_makespan:
                return dataclasses.replace(plain, solve_s=time.perf_counter() - start, bound_source="levels")
            # the incumbent (some N >= 1) stays: no N >= 1 beats it, nor a layout without recompute below plain's bound
            lower = min(plain.lower_bound_s, best_makespan)
            return LayoutSolution(inc.layout, inc.score.step_time_s, best_makespan, inc.score.bound_s, lower, lower >= best_makespan,
                                  time.perf_counter() - start, inc.score.fits, plain.rounds, "levels", plain.interrupted)
        return None

    level_floor = -math.inf  # one N: the least of level_work_bounds over the N still open
    open_levels = None  # one N: the N level_work_bounds leaves open, once checked
    check_levels = level is not None and refine and not graph
    if check_levels and inc.layout is not None:
        # One N for every stage: the N whose ranks' busy time alone reaches the incumbent are out
        # (level_work_bounds: with N >= 1 every chunk holding a layer recomputes one). Where
        # only N = 0 is left the layouts recompute nothing, and the search without recompute
        # (its region LP and rounds) gets the time left: DeepSeek-V3 on pp 16 x vp 2, where a
        # rank of 4 MoE layers with one recomputed is 63 s against the 60.9 s optimum without.
        # Checked before the local search and after each descent: where the seeds already settle
        # it (a per-stage search's answer, layout_report), the descent's time goes to the search
        # without recompute. The fastest seed recomputing nothing descends first: the one that
        # one N makes fastest can hold the descent in an N = 1 basin (DeepSeek-V3's recipe split,
        # 69.6 s, against 60.9 s from the even split without recompute).
        settled = by_levels()
        if settled is not None:
            return settled
    slack = model_slack_s(ctx, lm)
    bound, rounds, proven, stalled = 0.0, 0, False, False
    lp_bound = None  # what rank_order_region and lp_region_bound proved, for every layout
    split_bound = None  # what recompute_split_bound proved, for every layout and recompute vector
    relaxed_floor = None  # what relaxed_bound proved, for every layout
    totals_floor = None  # what rank_totals_bound proved, for every layout of the search's space
    totals_reserve_s = 0.0  # the time kept for it after the rounds
    roomiest = None  # free layouts with per-chunk recompute: the rank with the most room for it (the parts below)
    interrupted = False
    try:  # Ctrl-C from here on: the incumbent and the bound proven so far, as a time limit would
        # the local search gets its share of what the seeds left, so that CP-SAT keeps the most: each
        # descent at most local_s (from ROUND_STARTS starts up to that many times local_s, though they
        # settle well within it: 0.3-0.7 s each on Llama 3 405B cp 1, against 1.5 s)
        local_s = min(local_fraction * time_limit_s, 0.25 * max(time_limit_s - (time.perf_counter() - start), 0.0))
        if starts:  # the local search from each (the better start is not the better end)
            for seed in starts:
                descend(seed, local_s)
            best_end = min(descent_ends, default=math.inf)
            same_end = sum(abs(x - best_end) <= 1e-9 * best_end for x in descent_ends)
            if local and inc.layout is not None and anneal_fraction > 0 and same_end < 2:
                # no given layout fits: memory binds, and the descents can end on a plateau that
                # moves of equal makespan cross, or behind a slightly slower layout (anneal); its
                # best is descended from (the exact model confirming it, its neighbours' paths the
                # cuts there). Not where two descents ended in the best layout's basin (Llama 3
                # 405B cp 1 alone, nc 32: their rounds keep the time). Llama 3 405B cp 1, free
                # layouts, 10 s, the anneal ~1.2-1.5 s of it after the four descents, each ended
                # elsewhere: with offload 7.81 -> 7.38-7.50 s, under ZeRO-2 6.99 -> 6.91 s
                share_s = min(anneal_fraction * time_limit_s, 0.35 * max(time_limit_s - (time.perf_counter() - start), 0.0))
                decoders, _, recomputed = anneal(ctx, inc.layout.decoders, inc.layout.recompute, share_s, lin=lin, spread=chunk_spread,
                                                 min_layers=min_layers, max_layers=max_layers, uniform_recompute=level is not None)
                if decoders + recomputed != inc.layout.decoders + inc.layout.recompute:  # it found a shorter one
                    descend(make(decoders + recomputed), local_s)
        elif inc.layout is not None:
            for seed in ([zero_start] if zero_start is not None and zero_start != inc.layout else []) + [inc.layout]:
                descend(seed, local_s)
                if check_levels:
                    settled = by_levels()
                    if settled is not None:
                        return settled
        elif seeds:  # no seed fits: repair the one least over the capacity
            over = [lin.excess(*lin.layout_counts(np.array(seed.decoders + seed.recompute)[None])).sum() for seed in seeds]
            descend(seeds[int(np.argmin(over))], local_s)
        if open_levels is not None:
            model.AddLinearExpressionInDomain(level, cp_model.Domain.FromValues(open_levels))
        if graph:  # the schedule's event graph: every op ends after its rank's previous op and its inputs
            ends = {}
            for rank_ops in ctx.ops:
                for op in rank_ops:
                    ends[op.kind, op.stage, op.microbatch] = model.NewIntVar(0, lm.horizon, "")
            for rank_ops in ctx.ops:
                previous = None
                for op in rank_ops:
                    duration = lm.f_expr[op.stage] if op.kind == "F" else lm.b_expr[op.stage]
                    end = ends[op.kind, op.stage, op.microbatch]
                    preds = ([previous] if previous is not None else []) + [ends[key] for key in op_inputs(op, stages - 1)]
                    for pred in preds or [0]:
                        model.Add(end >= pred + duration)
                    previous = end
                model.Add(z >= previous)
        model.Minimize(z)

        def _take_answers(answers) -> bool:
            """Score CP-SAT's answers on the schedule graph in one batch: each one's longest path
            becomes a cut, the memory rows it breaks come in, the best that fits (the exact model
            confirming) becomes the incumbent; whether anything was new."""
            vectors = np.array(answers, dtype=np.int64)
            new = False
            for i in range(0, len(vectors), 64):
                part = vectors[i:i + 64]
                screened = lin.screen(part)
                values, fits = screened.makespan_s, screened.fits
                for n_f, n_b in screened.paths():
                    new |= cut(n_f, n_b)
                for k in np.argsort(values):
                    if not fits[k]:
                        new |= add_rows(part[k])
                        continue
                    if values[k] >= layout_makespan(inc.score):
                        break
                    layout = make(part[k])
                    score = score_of(layout)
                    new |= add_rows(part[k])
                    if score.fits:
                        inc.layout, inc.score, new = layout, score, True
                        break
            return new

        if refine and inc.layout is not None and chunk_spread is None and not graph and recompute and level is None and recompute_dominated:
            # rounds ask only for layouts below the incumbent: ranks that cannot recompute in one
            # (recomputing_ranks, the dominance of recompute_only_where_needed) recompute nothing
            maybe = recomputing_ranks(ctx, layout_makespan(inc.score), lin)
            for r in range(pp):
                if r not in maybe:
                    for s in ctx.stages_of[r]:
                        model.Add(rc[int(s)] == 0)
            if rows.needs and maybe:  # the one with the most room for recompute: the least busy in the incumbent
                counts, recomputed = lin.layout_counts(np.array(inc.layout.decoders + inc.layout.recompute)[None])
                f, b = (x[:, 0] for x in lin.times(counts, recomputed))
                roomiest = min(sorted(maybe), key=lambda r: float(f[r::pp].sum() + b[r::pp].sum()))
        if refine and inc.layout is not None and chunk_spread is None and not graph and level is None:
            # free layouts: the paths that dwell on one or two overloaded chunks (dwell_paths),
            # around the incumbent's stage times (not with one N: Llama 3 405B cp 1's one-N bound
            # fell with them, 18.79-18.80% -> 18.82-19.23% in 10 s)
            counts, recomputed = lin.layout_counts(np.array(inc.layout.decoders + inc.layout.recompute)[None])
            for n_f, n_b in dwell_paths(ctx, tuple(x[:, 0] for x in lin.times(counts, recomputed if recompute else None))):
                cut(n_f, n_b)
        if refine and inc.layout is not None and not graph and len(runs) == 1:
            # the rank order alone first (one solve of a tiny model, milliseconds): where no
            # layout's ranks can beat the incumbent it is certified before the bounds below spend
            # their time (Llama 3 405B under ZeRO-2 with 128 micro-batches: relaxed_bound's 2.9 s,
            # then the region's 0.03 s)
            goal = layout_makespan(inc.score) - 2 * slack
            if rank_order_region(ctx, goal, lin, time_limit_s=0.05, tables=tables, feasibility_only=True) is None:
                lp_bound, proven = goal, True
                bound = max(bound, goal)
            elif chunk_spread is None and lin.rank_held_floor_s(1) is not None:
                # free layouts whose stages pay for holding a layer (ZeRO-3's first gather, the
                # gradient windows' rest), which the region's LP leaves out and the ranks' busy
                # time counts (rank_held_floor_s): the largest goal their totals prove out of
                # reach, by bisection (rank_totals_bound), is a floor for the rounds. Llama 3 405B
                # cp 2 under ZeRO-2: the LP stalled at 5.23 s (a 3.7% gap in 10 s), the totals
                # prove 5.40 s against the even split's 5.43 s (0.59%). Not for regular layouts:
                # their rounds certify that case in 6.7 s, and the floor in the model stalled them
                floor_s = rank_totals_bound(ctx, max(bound, work_bound_s(ctx, lin) - slack), goal, lin, min(0.5, 0.05 * time_limit_s),
                                            tables, chunk_spread)
                if floor_s is not None and floor_s > bound:
                    totals_floor = bound = floor_s
                    model.Add(z >= int(math.floor(floor_s * TIME_SCALE)))
                    proven = floor_s >= goal
        if (refine and inc.layout is not None and not graph and len(runs) > 1 and chunk_spread is not None and ctx.vp > 1
                and lin.without_stage_jumps() is not None and not proven):
            # regular interleaved layouts of several kinds whose stages pay for holding a layer
            # (ZeRO-3's gathers, gradient windows: the jumps' booleans stall the rounds, and the
            # region's LP does not run): the ranks' integer totals under busy time, order and
            # memory (rank_totals_bound) bound them where the rounds prove less, with time kept
            # for it at the end. Not where the rounds certify: run first it slowed DeepSeek-V3's
            # regular layouts from 3.2-3.7 s to 3.6-5.2 s, and its reserve left FSDP on 1F1B at a
            # 0.02% gap in 10 s (certified in 7.0 s without); nor for free layouts, where the
            # memory binds little (DeepSeek-V3 under FSDP: 57.5 s against the work bound's 55.6)
            totals_reserve_s = min(1.5, 0.15 * time_limit_s)  # CP-SAT's round overruns its time by up to 0.7 s there
        relax_budget = relax_fraction * max(time_limit_s - (time.perf_counter() - start), 0.0)
        if refine and inc.layout is not None and not graph and level is None and relax_budget >= 0.5 and not proven and lin.without_stage_jumps() is not None:
            # the model without the per-stage jumps (relaxed_bound): its rounds close where the
            # jumps' booleans keep these from it; its bound holds for every layout (z >= it) and
            # its paths are cuts here
            relaxed, relaxed_paths = relaxed_bound(ctx, lin, inc.layout, relax_budget, workers, cuts, min_layers, max_layers,
                                                   chunk_spread, round_limit_s)
            for n_f, n_b in sorted(relaxed_paths):
                cut(np.array(n_f), np.array(n_b))
            if relaxed is not None:
                relaxed_floor = relaxed
                bound = max(bound, relaxed)
                model.Add(z >= int(math.floor(relaxed * TIME_SCALE)))
                proven = relaxed >= layout_makespan(inc.score) - 2 * slack
        if inc.layout is not None and inc.layout.any_recompute:
            # the region's LP leaves recompute out, so it cannot reach an incumbent that pays for
            # some: the region's integer rows for CP-SAT, and the time to its rounds (Llama 3 405B
            # cp 1, per-chunk recompute, free phase of two_phase: 11.5% -> 6.3-6.6%)
            region_fraction = min(region_fraction, 0.3)
        if chunk_spread is not None and lin.without_stage_jumps() is not None:
            # regular layouts whose stages pay for holding a layer (ZeRO-3's gathers, gradient
            # windows), which the region's LP leaves out: its probes took the time CP-SAT's
            # rounds certify in (Llama 3 405B cp 2 under ZeRO-2: 0.9% at 10 s with it, certified
            # in 5.9 s without)
            region_fraction = 0.0
        region_budget = region_fraction * max(time_limit_s - (time.perf_counter() - start), 0.0)
        goal = layout_makespan(inc.score) - 2 * slack if inc.layout is not None else -math.inf
        # layouts of the search's space that run below the goal but break the memory (seeds the
        # capacity rules out): the region's LP, which relaxes memory, stays below them
        known = [layout for layout in seeds if layout.mtp == mtp and layout.stages == stages and in_space(layout.decoders, min_layers, max_layers)]
        below_goal = [] if not known or inc.layout is None else [
            layout.decoders for layout, value in zip(known, lin.screen([x.decoders + x.recompute for x in known]).makespan_s) if value < goal]
        if below_goal and tables is None:
            # without recompute tables the region holds every layout below the goal, memory
            # relaxed (rank_order_region), so these too: neither its probes nor its LP can certify,
            # and their time goes to the rounds (see the docstring)
            region_budget = 0.0
        if refine and inc.layout is not None and not graph and len(runs) == 1 and region_budget >= 1.0 and not proven:
            lp_bound, proven = region_bound(ctx, lin, lm, inc.score, goal, slack, region_budget,
                                            tables, min_layers, max_layers, below_goal)
            if lp_bound is not None:
                bound = max(bound, lp_bound)
        if split_fraction is None:  # see the docstring: where it was measured to certify
            split_fraction = 0.0
            if chunk_spread is not None and inc.layout is not None:
                split_fraction = 1.0 if max(sum(inc.layout.recompute[r::pp]) for r in range(pp)) <= 1 else 0.0
        split_budget = split_fraction * max(time_limit_s - (time.perf_counter() - start), 0.0)
        if refine and inc.layout is not None and recompute and not graph and not proven and split_budget >= 0.5:
            goal = layout_makespan(inc.score)
            found_lb, split_paths = recompute_split_bound(ctx, goal, lin, time_limit_s=split_budget, workers=workers, paths=cuts,
                                                          chunk_spread=chunk_spread, min_layers=min_layers, max_layers=max_layers,
                                                          hint=inc.layout, round_limit_s=round_limit_s)
            for n_f, n_b in split_paths:
                cut(n_f, n_b)
            if found_lb is not None:
                split_bound = min(found_lb, goal - 2 * slack)
                bound = max(bound, split_bound)
                proven = found_lb >= goal - 2 * max(slack, split_slack(ctx, lin))
        # Free layouts with per-chunk recompute: the rounds search the space in parts, each a
        # smaller search than the whole, whose LP recomputes a fraction of a layer wherever memory
        # is near: the layouts that recompute nothing; then, where a rank recomputes only where it
        # must (rows.needs), those where the rank with the most room for recompute in the
        # incumbent (`roomiest`) recomputes nothing, those where it and another rank recompute,
        # and last those where it alone does (else those that recompute some). The parts
        # partition the space: each one settled holds its goal, and the last one's rounds prove
        # the bound of the rest. A part other than the last that does not settle within
        # PART_FRACTION of the time left as it began gives way to the whole space (the cuts and
        # rows its rounds brought hold for every layout). DeepSeek-V3 on pp 16 x vp 2, free
        # layouts (its optimum recomputes nothing): one solve of each of the last two parts'
        # models, rank 0 the roomiest, took 1.2-1.3 and 3.6-4.0 s where the two as one part took
        # 5.9 s; in solve_layout (10 s, 2 cores) the three parts took 1.0, 1.6-1.7 and 3.5-4.8 s,
        # certifying in 6 runs of 11 (8.1-10.0 s), where the whole never did. Rank 0's part is a
        # near tie (its best layout the model prices at 60.97 s against the 60.93 s optimum,
        # rank 0 holding the 3 dense layers and 2 MoE): alone its model took 2.2-2.9 s, with
        # another rank recomputing 1.0-1.2 s, the two as one 4.1-5.3 s; as four parts, the
        # last last (it gets all the time left), and the descent's neighbour paths kept to its
        # time (local_search), 10 of 11 standalone runs certified in 7.7-9.5 s (the other at 3.2%)
        parts = []  # [{boolean: value}] still to settle, the first the one searched
        part_floor_s = math.inf  # the least goal the parts settled proved for their layouts
        part_ends_at = math.inf  # when the part searched gives way, where it is not the last
        if refine and inc.layout is not None and chunk_spread is None and not graph and recompute and level is None and not proven:
            recomputes = model.NewBoolVar("recomputes")
            model.Add(sum(rc) >= 1).OnlyEnforceIf(recomputes)
            model.Add(sum(rc) == 0).OnlyEnforceIf(recomputes.Not())
            parts = [{recomputes: 0}]
            others = [y for r, y in enumerate(rows.needs) if r != roomiest]
            if roomiest is not None and others:
                also = model.NewBoolVar("others_recompute")  # a rank other than the roomiest recomputes
                model.Add(sum(others) >= 1).OnlyEnforceIf(also)
                model.Add(sum(others) == 0).OnlyEnforceIf(also.Not())
                mine = rows.needs[roomiest]
                parts += [{recomputes: 1, mine: 0}, {recomputes: 1, mine: 1, also: 1}, {recomputes: 1, mine: 1, also: 0}]
            else:
                parts.append({recomputes: 1})

        def enter_part() -> None:
            nonlocal part_ends_at
            for var, value in parts[0].items():
                fix_bool(model, var, value)
            left_s = time_limit_s - (time.perf_counter() - start) - totals_reserve_s
            part_ends_at = time.perf_counter() + PART_FRACTION * left_s if len(parts) > 1 else math.inf

        if parts:
            enter_part()
        while not proven:
            remaining = time_limit_s - (time.perf_counter() - start) - totals_reserve_s
            if remaining <= 0 and inc.layout is not None:
                break
            if len(parts) > 1 and time.perf_counter() >= part_ends_at:  # the part did not settle: the whole from here
                for var in {var for part in parts for var in part}:
                    fix_bool(model, var, None)
                parts, part_ends_at = [], math.inf
            if refine and inc.layout is not None and chunk_spread is None:
                # Free layouts, with an incumbent: ask only for layouts the model prices below it
                # (z < incumbent - 2 slack). Every answer is then either truly better (the new
                # incumbent) or priced too low, and its longest path is a new cut that removes it;
                # and no answer at all (INFEASIBLE) certifies the incumbent. Each round returns
                # every answer CP-SAT found, not only its last, so one round brings many cuts.
                best_makespan = layout_makespan(inc.score)
                # a round stops round_limit_s in once it has answers, and goes on while it has
                # none; a round cut short loses its presolve and LP with it: where less than two
                # rounds' time is left, this one takes it all (Llama 3 405B's 128-stage model
                # presolves for ~1 s of a 4 s round)
                left = min(remaining, part_ends_at - time.perf_counter())  # a part other than the last: its time
                status, proved, answers = round_below(model, z, vars_, best_makespan, slack, left, workers, under_s=slack,
                                                      answers_by_s=answers_by(round_limit_s, left))
                rounds += 1
                if len(parts) > 1:  # proved holds for this part's layouts only
                    if status == cp_model.INFEASIBLE:
                        part_floor_s = min(part_floor_s, proved)
                        parts.pop(0)
                        enter_part()
                        continue
                else:  # the last part (the others settled), or the whole
                    bound = max(bound, min(proved, part_floor_s))
                if status == cp_model.INFEASIBLE:
                    proven = True
                    break
                if not answers:  # the round had all the time left
                    continue
                if not _take_answers(answers):
                    for answer in answers:  # nothing new learnt (integer rounding): exclude them
                        model.AddForbiddenAssignments(vars_, [answer])
                continue
            # regular layouts keep a first round of all the time (their LNS workers find the
            # incumbent), later ones are capped; free layouts without an incumbent are capped too, so
            # that the first layout that fits switches to the rounds above (a round that finds
            # nothing gets the rest of the time)
            capped = (inc.layout is not None and rounds > 0) if chunk_spread is not None else not stalled
            time_s = min(remaining, round_limit_s) if capped else remaining
            if chunk_spread is not None:
                # regular layouts: CP-SAT's full presolve (their first round has all the time and,
                # with round_solver's lighter one, proved less in it: Llama 3 405B cp 1 with
                # per-chunk recompute, 10 s, 1.8% -> 4.9%), and the LP of every constraint, the max
                # over the rank rows and the recompute tables' element constraints included
                # (CP-SAT's level 2), which proves more per round than the default's: the same
                # case, 10 s on a loaded 2-core machine, 4.9% -> 1.8% (no change on the certified
                # regular cases)
                solver = cp_solver.cp_solver(time_s, workers)
                solver.parameters.linearization_level = 2
            else:
                solver = round_solver(time_s, workers)
            model.ClearHints()
            hint = inc.layout if inc.layout is not None else nearest
            if hint is not None:
                for var, value in zip(vars_, hint.decoders + hint.recompute):
                    model.AddHint(var, value)
            status = cp_solver.solve(solver, model)
            rounds += 1
            if status == cp_model.UNKNOWN and inc.layout is None and chunk_spread is None and time_limit_s - (time.perf_counter() - start) > 0.1:
                stalled = True
                continue
            if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                if inc.layout is not None:
                    break
                raise LayoutError("no layout of this configuration fits the GPU memory" if status == cp_model.INFEASIBLE else "the layout search found no layout within its time limit")
            bound = max(bound, solver.BestObjectiveBound() / TIME_SCALE - slack)  # proven whatever the status
            layout = make([solver.Value(v) for v in vars_])
            score = score_of(layout)
            inc.offer(layout, score)
            if not score.fits:  # a memory row not in the model yet, or the integer rounding: add it, or exclude the layout
                if not add_rows(layout.decoders + layout.recompute):
                    model.AddForbiddenAssignments(vars_, [layout.decoders + layout.recompute])
                continue
            add_rows(layout.decoders + layout.recompute)
            if not refine:
                proven = status == cp_model.OPTIMAL
                break
            best_makespan = layout_makespan(inc.score)
            if status == cp_model.OPTIMAL and best_makespan <= bound + 2 * slack:
                proven = True
                break
            added = cut(*path_of(ctx, score))
            if not added and status == cp_model.OPTIMAL:
                proven = True  # its own path was already a cut: CP-SAT's value is its makespan
                break
    except KeyboardInterrupt:
        if inc.layout is None:  # nothing that fits to give back
            raise
        interrupted = True
    if totals_reserve_s > 0 and not proven and not interrupted:
        goal = layout_makespan(inc.score) - 2 * slack
        floor_s = rank_totals_bound(ctx, max(bound, work_bound_s(ctx, lin) - slack), goal, lin,
                                    max(time_limit_s - (time.perf_counter() - start), 0.05), tables, chunk_spread)
        if floor_s is not None and floor_s > bound:
            totals_floor = bound = floor_s
            proven = floor_s >= goal
    if paths is not None:
        paths.update(cuts)
    makespan = layout_makespan(inc.score)
    source = ("rank-lp" if lp_bound is not None and bound <= lp_bound else "recompute-split" if split_bound is not None and bound <= split_bound
              else "relaxed" if relaxed_floor is not None and bound <= relaxed_floor
              else "rank-totals" if totals_floor is not None and bound <= totals_floor else "cp-sat")
    if not proven:
        floor = work_bound_s(ctx, lin) - slack
        if floor > bound:
            bound, source = floor, "work"
        if level_floor - slack > bound:
            bound, source = level_floor - slack, "level-work"
    return LayoutSolution(inc.layout, inc.score.step_time_s, makespan, inc.score.bound_s, float(min(bound, makespan) if proven else bound),
                          proven, time.perf_counter() - start, inc.score.fits, rounds, source, interrupted)


def two_phase(ctx: LayoutContext, time_limit_s: float, workers: int, seeds: tuple[StageLayout, ...],
              regular_share: float = 0.4, free_floor: float = 0.3, scores: dict | None = None, paths: set | None = None,
              tables: dict | None = None) -> tuple[LayoutSolution | None, LayoutSolution]:
    """Regular layouts first (chunks of a rank within one layer: a small model that CP-SAT
    certifies or nearly so) with `regular_share` of the time, then free layouts seeded with that
    answer (without a local search where the regular phase certified it: see below), with what
    is left and never less than `free_floor` of the limit (so a regular phase
    that overruns its share, CP-SAT presolve included, cannot leave the free phase nothing:
    the free search's bound is the one reported, and it needs CP-SAT rounds of its own). The
    seeds' scores and the ranks' recompute tables are shared by both phases (the exact model
    simulates each seed once; `scores`, `paths`, `tables`: the caller's, to share them with a
    search after this one, layout_report's with one N).
    Returns (the regular search's answer, None where no regular layout fits; the free
    search's), the free one never worse; its bound is the one that holds for every layout
    (a bound of the regular phase holds among regular layouts only, so it is not carried
    over; where the free phase's CP-SAT rounds proved less than work_bound_s, that is its
    bound and bound_source says so). A Ctrl-C in the regular phase skips the free one: its
    answer is returned as both, the second with work_bound_s."""
    start = time.perf_counter()
    regular_seeds = tuple(s for s in seeds if regular(s, 1))
    scores = {} if scores is None else scores
    paths = set() if paths is None else paths  # the regular phase's critical paths: cuts that hold for free layouts too
    tables = {} if tables is None else tables  # each rank's least recompute per layer total, the same for both phases
    first = None
    try:
        first = solve_layout(ctx, regular_share * time_limit_s, workers, seeds=regular_seeds, chunk_spread=1, scores=scores, paths=paths,
                             table_cache=tables)
    except LayoutError:
        pass  # no regular layout fits: the free search alone
    if first is not None and first.interrupted:  # Ctrl-C: no free phase; its answer, bounded for every layout
        floor = min(work_bound_s(ctx), first.makespan_s)
        return first, dataclasses.replace(first, lower_bound_s=floor, optimal=floor >= first.makespan_s * (1 - 1e-9), bound_source="work",
                                          solve_s=0.0)  # the free phase did not run
    more = (first.layout,) if first is not None else ()
    # what the regular search left (it stops early once certified) goes to the free search; where
    # the regular phase certified its answer, the free one starts from it with its CP-SAT rounds
    # and no local search of its own (an irregular layout priced below it is an answer of the
    # rounds, taken or cut): DeepSeek-V3 pp 16 x vp 2 with per-chunk recompute, whose free phase
    # got ~6 s and needed 1.7 s of descent and a round of 4-10 s, stopped at 4.9-6.2% in six runs
    # of six and is certified in 7.5-9.6 s without it
    left = max(time_limit_s - (time.perf_counter() - start), free_floor * time_limit_s)
    second = solve_layout(ctx, left, workers, seeds=seeds + more, scores=scores, paths=paths, table_cache=tables,
                          local=not (first is not None and first.optimal))
    return first, second
