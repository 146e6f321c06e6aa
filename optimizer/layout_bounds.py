"""Lower bounds on the makespan of every layout of a skeleton, beyond the CP-SAT rounds' own
(optimizer.layout_search): the busiest rank's least work (work_bound_s), the ranks' busy time
under one recompute N (level_work_bounds), recompute as a yes/no per rank
(recompute_split_bound), the integer rank totals a faster layout needs and the schedule
graph's LP relaxation within them (rank_order_region, lp_region_bound), and the paths that
dwell on overloaded chunks, cuts for the rounds (dwell_paths). Each is valid for every layout
that fits, and the search reports which one proved its bound."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

import numpy as np
from ortools.sat.python import cp_model

from costmodel.stage_layout import LayoutContext, StageLayout, stage_ranks, unit_costs
from optimizer import cp_solver
from optimizer.layout_linear import BYTE_SCALE, LinearLayouts, least_recompute_var, over_capacity_without_recompute
from optimizer.layout_rounds import Answers, answers_by, TIME_SCALE, clipped_prefix, path_sum, round_solver, run_count_vars
from optimizer.schedule_graph import chunk_segments_hold, schedule_graph, segment_paths


def recompute_split_bound(ctx: LayoutContext, goal_s: float, lin: "LinearLayouts | None" = None, time_limit_s: float = 5.0,
                          workers: int = 2, paths=(), chunk_spread: int | None = None, min_layers: int = 0,
                          max_layers: int | None = None, hint: StageLayout | None = None,
                          round_limit_s: float = 4.0) -> tuple[float | None, list]:
    """A lower bound on the makespan of every fitting layout and recompute vector of a
    skeleton with full recompute, from a relaxation where recompute is a yes/no per rank
    (Megatron's per-stage counts, per-chunk recompute), and the paths that prove it: (None, [])
    where the skeleton has no recompute. Proves goal_s - 2 slack (every layout is at least
    that: certifies an incumbent of makespan goal_s) where the relaxation has no point below
    it; else CP-SAT's bound over the relaxation.

    The relaxation. Take a fitting layout (L, r) and zero the recompute of every rank that
    fits without it (memory is per rank: the others are untouched, and recompute only adds
    time, so the makespan does not grow); call its recomputing ranks S. Then:
    * every rank outside S recomputes nothing and fits: its memory rows at r = 0 (the
      no-recompute search's rows) hold;
    * every rank in S does not fit at r = 0, so its envelope (each chunk's activations times
      the most micro-batches it ever holds in flight, a row above every in-flight row) is over
      the capacity;
    * every rank in S recomputes the first layer of some stage of its own with layers (Megatron's
      block method recomputes a stage's first r_s), whose recompute adds to that stage's
      backward: with x_s = 1 for one such stage per rank in S, the makespan with recompute x
      (a path's length is monotone in the stage times) is at most (L, r)'s.
    So min over (L, x) of the schedule graph's makespan under those rows bounds every fitting
    layout. Memory: integer KiB rows with coefficients rounded down (the budget up) and the
    envelope rounded up (its threshold down), so every fitting layout satisfies them. Times:
    path cuts as the layout search's (rounded to integer ns: the slack), ranks' busy time.
    Where memory forces recompute only on a few ranks whose layers cost a lot (DeepSeek-V3 on
    pp 16 x vp 2: a 4-layer rank that recomputes a MoE layer adds 480 x 12 ms), the yes/no is
    what the search model's LP relaxation misses: it recomputes a fraction of a layer.
    Rounds as the free search's: answers the model prices below goal_s - 2 slack; each one's
    longest path becomes a cut and the memory rows it breaks come in (lazily: ~100 in-flight
    vectors per rank); INFEASIBLE proves the goal; an answer of the relaxation truly below the
    goal ends it (the relaxation cannot certify it)."""
    start = time.perf_counter()
    lin = lin or LinearLayouts(ctx)
    u = lin.u
    if not lin.recompute or (np.asarray(u["kind_recompute"]) < 0).any():
        return None, []
    pp, vp, m = ctx.pp, ctx.vp, ctx.microbatches
    stages, n = lin.stages, len(ctx.kind_of_layer)
    runs = lin.runs
    kind_of_run = [int(k) for k in lin.kind_of_run]
    graph = schedule_graph(ctx)
    model = cp_model.CpModel()
    t = [model.NewIntVar(min_layers, n if max_layers is None else max_layers, f"t{s}") for s in range(stages)]
    x = [model.NewBoolVar(f"x{s}") for s in range(stages)]  # stage s's first layer recomputed
    prefix = [model.NewIntVar(0, n, f"P{s}") for s in range(stages)]
    for s in range(stages):
        model.Add(prefix[s] == (prefix[s - 1] if s else 0) + t[s])
        model.Add(x[s] <= t[s])
    model.Add(prefix[-1] == n)
    if chunk_spread is not None:
        for r in range(pp):
            low = model.NewIntVar(0, n, "")
            model.AddMinEquality(low, t[r::pp])
            for v in t[r::pp]:
                model.Add(v <= low + chunk_spread)

    # layers of each kind-run per stage as differences of the clipped prefix sums (solve_layout's
    # encoding: the clips are shared by neighbouring stages, which keeps the LP relaxation tight)
    def clip(value, j, tag):
        _, a, b = runs[j]
        return clipped_prefix(model, value, a, b, n + 1, f"{tag}{j}")

    run_counts, clipped = run_count_vars(model, t, prefix, runs, n + 1, "c")
    if len(runs) == 1:
        x_counts = [[x[s]] for s in range(stages)]
    else:
        x_counts = [[clip((prefix[s - 1] if s else 0) + x[s], j, f"x{s}") - (clipped[j][s - 1] if s else runs[j][1])
                     for j in range(len(runs))] for s in range(stages)]
    if len(runs) > 1:
        for s in range(stages):  # implied; stated so the LP relaxation of the clips keeps them (solve_layout)
            model.Add(sum(x_counts[s]) == x[s])
            model.Add(sum(run_counts[s]) == t[s])
            for j in range(len(runs)):
                model.Add(x_counts[s][j] >= 0)
                model.Add(x_counts[s][j] <= run_counts[s][j])
    fwd = [int(round(u["kind_forward"][k] * TIME_SCALE)) for k in kind_of_run]
    bwd = [int(round((u["kind_total"][k] - u["kind_forward"][k]) * TIME_SCALE)) for k in kind_of_run]
    rec = [int(round(u["kind_recompute"][k] * TIME_SCALE)) for k in kind_of_run]
    cf = [int(round(v * TIME_SCALE)) for v in lin.const_forward_s]
    cb = [int(round(v * TIME_SCALE)) for v in lin.const_backward_s]
    f_expr = [sum(fwd[j] * run_counts[s][j] for j in range(len(runs))) + cf[s] for s in range(stages)]
    b_expr = [sum(bwd[j] * run_counts[s][j] + rec[j] * x_counts[s][j] for j in range(len(runs))) + cb[s] for s in range(stages)]
    per_op = (float(np.max(u["kind_total"] + u["kind_recompute"])) * n + float(lin.const_forward_s.max() + lin.const_backward_s.max())) * TIME_SCALE
    slack = split_slack(ctx, lin)
    cap = min(int(math.floor((goal_s - 2 * slack) * TIME_SCALE)), int(2 * m * stages * per_op) + 1)
    if cap < 0:
        return None, []
    z = model.NewIntVar(0, cap, "makespan")  # only layouts below the goal
    cuts, new_paths = set(), []

    def cut(n_f, n_b) -> bool:
        key = (tuple(np.asarray(n_f).astype(int)), tuple(np.asarray(n_b).astype(int)))
        if key in cuts:
            return False
        cuts.add(key)
        new_paths.append((np.asarray(n_f, dtype=float), np.asarray(n_b, dtype=float)))
        model.Add(z >= path_sum(key, (f_expr, b_expr)))
        return True

    for n_f, n_b in sorted(paths):
        cut(np.array(n_f), np.array(n_b))
    for n_f, n_b in segment_paths(ctx.ops, stages, m):
        if chunk_spread is None or (n_f == n_b).all():
            cut(n_f, n_b)
    kinds_used = sorted(set(kind_of_run))
    candidates = recomputing_ranks(ctx, goal_s, lin)
    recomputing = []
    for r in range(pp):  # busy time over integer kind totals (solve_layout's rows)
        mine = range(r, stages, pp)
        busy = 0
        for k in kinds_used:
            js = [j for j, kind in enumerate(kind_of_run) if kind == k]
            total = model.NewIntVar(0, n, f"L{r}_{k}")
            model.Add(total == sum(run_counts[s][j] for s in mine for j in js))
            again = model.NewIntVar(0, vp, f"R{r}_{k}")
            model.Add(again == sum(x_counts[s][j] for s in mine for j in js))
            busy += (fwd[js[0]] + bwd[js[0]]) * total + rec[js[0]] * again
        model.Add(z >= m * (busy + sum(cf[s] + cb[s] for s in mine)))
        y = model.NewBoolVar(f"y{r}")  # the rank recomputes (is in S)
        model.Add(y <= sum(x[s] for s in mine))
        if r not in candidates:  # no layout below the goal has it recompute: r = 0 rows, no recompute
            model.Add(y == 0)
            for s in mine:
                model.Add(x[s] == 0)
        recomputing.append(y)

    # memory, in thousandths of KiB: coefficients rounded down for the rows (a fitting layout
    # meets them); the envelope of a recomputing rank is over_capacity_without_recompute's
    scale = 1000.0 / BYTE_SCALE
    budget = int(math.ceil(lin.capacity * scale))
    frag = lin.frag
    rows, added = {}, set()
    for r, (base0, base, trans0, trans, head, chunk_act) in enumerate(lin.memory):
        mine = list(range(r, stages, pp))
        held = np.asarray(ctx.held[r])

        def row(coef_of, const, rounding):
            terms = []
            for c, s in enumerate(mine):
                for j, k in enumerate(kind_of_run):
                    coef = int(rounding(coef_of(c, k) * scale))
                    if coef:
                        terms.append(coef * run_counts[s][j])
            return sum(terms) + int(rounding(const * scale))

        rows[r, -1] = row(lambda c, k: base[k] + (1 + frag) * trans[k], base0 + (1 + frag) * trans0, math.floor)
        for i, h in enumerate(held):
            rows[r, i] = row(lambda c, k, h=h: base[k] + (1 + frag) * h[c] * lin.u["kind_activation"][k],
                             base0 + (1 + frag) * (head + h @ chunk_act), math.floor)
        over_capacity_without_recompute(model, ctx, lin, r, run_counts, recomputing[r])
        model.Add(rows[r, -1] <= budget)  # the optimizer transient: recompute does not lower it
        added.add((r, -1))

    def add_rows(decoders, ranks_free) -> bool:
        """Rows an r = 0 layout breaks (or comes nearest to), of the ranks that do not recompute."""
        counts = lin.run_counts(np.asarray(decoders)[None])
        new = False
        for r, values in enumerate(lin.rank_rows(counts, None)):
            if r in ranks_free:
                continue
            values = values[0]
            for i in [int(np.argmax(values))] + [int(i) for i in np.flatnonzero(values > lin.capacity)]:
                if (r, i - 1) not in added:
                    added.add((r, i - 1))
                    constraint = model.Add(rows[r, i - 1] <= budget)
                    if i > 0:
                        constraint.OnlyEnforceIf(recomputing[r].Not())
                    new = True
        return new

    if hint is not None:
        add_rows(hint.decoders, set())
        for var, value in zip(t + x, list(hint.decoders) + [0] * stages):
            model.AddHint(var, value)
    model.Minimize(z)
    bound = None
    while time.perf_counter() - start < time_limit_s:
        found = Answers(t + x)
        left = time_limit_s - (time.perf_counter() - start)
        solver = round_solver(left, workers)  # as the free search's rounds (round_below)
        status = cp_solver.solve(solver, model, found, stop_when=found.stop_after(answers_by(round_limit_s, left)))
        if status == cp_model.INFEASIBLE:
            return goal_s - 2 * slack, new_paths
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
            value = min(solver.BestObjectiveBound() / TIME_SCALE - slack, goal_s - 2 * slack)
            bound = value if bound is None else max(bound, value)
        if not found.answers:
            continue
        answers = np.array(found.answers, dtype=np.int64)
        decoders, marks = answers[:, :stages], answers[:, stages:]
        counts = lin.run_counts(decoders)
        recomputed = lin.recompute_counts(decoders, marks)
        f, b = lin.times(counts, recomputed)
        values = graph.makespan(f, b)
        new = False
        for n_f, n_b in zip(*graph.paths(f, b)):
            new |= cut(n_f, n_b)
        rank_rows = lin.rank_rows(counts, None)
        below = False
        for k in range(len(answers)):
            free = {r for r in range(pp) if marks[k, r::pp].any()}
            ok = all(rank_rows[r][k, 0] <= lin.capacity and (r in free or rank_rows[r][k].max() <= lin.capacity) for r in range(pp))
            if ok and values[k] < goal_s - 2 * slack:
                below = True  # the relaxation has a point below the goal: it cannot certify it
            if not ok:
                new |= add_rows(decoders[k], free)
        if below:
            break
        if not new:
            for answer in found.answers:
                model.AddForbiddenAssignments(t + x, [answer])
    return bound, new_paths


def split_slack(ctx: LayoutContext, lin: "LinearLayouts") -> float:
    """recompute_split_bound's integer rounding (seconds): a path of <= 2 m ops per stage, each
    off by <= 0.5 ns per rounded term (its layers, recomputed layers and constant)."""
    stages, n = lin.stages, len(ctx.kind_of_layer)
    return 0.5 * 2 * ctx.microbatches * max(stages * (2 * len(lin.runs) + 1), 2 * n + stages) / TIME_SCALE


def recomputing_ranks(ctx: LayoutContext, goal_s: float, lin: "LinearLayouts | None" = None, limit: int = 20000) -> set[int]:
    """The ranks that may recompute in a layout whose makespan is below `goal_s`, where no
    layout recomputes on a rank that fits without it (zeroing such a rank's recompute keeps
    the layout fitting, the other ranks' memory untouched, and does not slow it): such a rank
    holds kind counts per chunk over its capacity at r = 0 (its exact linear rows, transient
    within it) whose busy time with one more recomputed layer (the cheapest kind it holds),
    m * (its layers' forward+backward + its stages' constants + that recompute), is below the
    goal. Enumerated per rank over its chunks' counts of each kind (kinds' order relaxed, as
    many layers as its busy time allows); a rank whose enumeration would pass `limit` vectors is
    kept (no claim)."""
    lin = lin or LinearLayouts(ctx)
    u = lin.u
    pp, vp, m = ctx.pp, ctx.vp, ctx.microbatches
    kinds = sorted(set(int(k) for k in lin.kind_of_run))
    available = {k: sum(b - a for kind, a, b in lin.runs if kind == k) for k in kinds}
    cost = {k: float(u["kind_total"][k]) for k in kinds}
    rec = {k: float(u["kind_recompute"][k]) for k in kinds}
    out = set()
    for r in range(pp):
        const = float(sum(lin.const_forward_s[s] + lin.const_backward_s[s] for s in range(r, lin.stages, pp)))
        room = goal_s / m - const  # seconds per micro-batch the rank's layers and recompute may take
        if room <= 0:
            continue
        most = {k: min(available[k], int(room // cost[k]) if cost[k] > 0 else available[k]) for k in kinds}
        # every vector of counts per (chunk, kind) within each kind's most (a bounded composition)
        size = 1
        for k in kinds:
            size *= math.comb(most[k] + vp, vp)
        if size > limit:
            out.add(r)
            continue
        per_kind = {}
        for k in kinds:
            rows = [np.diff((-1,) + bars + (most[k] + vp,)) - 1 for bars in itertools.combinations(range(most[k] + vp), vp)]
            per_kind[k] = np.array(rows, dtype=float)[:, :vp].reshape(-1, vp)  # the last part: layers not held
        grids = np.meshgrid(*[np.arange(len(per_kind[k])) for k in kinds], indexing="ij")
        counts = np.stack([per_kind[k][g.ravel()] for k, g in zip(kinds, grids)], axis=2)  # [V, chunk, kind]
        totals = counts.sum(axis=1)  # [V, kind]
        present = totals > 0
        cheapest = np.where(present, np.array([rec[k] for k in kinds])[None, :], np.inf).min(axis=1)
        busy = totals @ np.array([cost[k] for k in kinds]) + cheapest
        keep = busy < room
        if not keep.any():
            continue
        counts, totals = counts[keep], totals[keep]
        base0, base, trans0, trans, head, chunk_act = lin.memory[r]
        base_k = np.array([base[k] for k in kinds])
        trans_k = np.array([trans[k] for k in kinds])
        act_k = np.array([u["kind_activation"][k] for k in kinds])
        fixed = base0 + totals @ base_k + np.where(totals > 0, np.array([lin.largest[r][k] for k in kinds])[None, :], 0.0).max(axis=1)
        transient = fixed + (1 + lin.frag) * (trans0 + totals @ trans_k)
        held = np.asarray(ctx.held[r], dtype=float)  # [vectors, chunk]
        chunk_bytes = counts @ act_k  # [V, chunk]
        # (PyTorch pipelining's buffers per micro-batch at their most: over for certain where over here)
        activations = fixed[:, None] + lin.buffer_spread[r] + (1 + lin.frag) * (chunk_bytes @ held.T + (held @ chunk_act)[None, :] + head)
        # (and, with those buffers, the transient row at their most: recompute shrinks them too)
        over = (transient <= lin.capacity) & (np.maximum(activations.max(axis=1), transient + lin.buffer_spread[r]) > lin.capacity)
        if over.any():
            out.add(r)
    return out


def work_bound_s(ctx: LayoutContext, lin: "LinearLayouts | None" = None) -> float:
    """A makespan lower bound for every layout, without CP-SAT: a rank runs each of its
    chunks' m forwards and m backwards one after another, so the makespan is at least the
    busiest rank's m * sum of its stages' (F_s + B_s), at least the mean over ranks, and the
    ranks' sum is m * (every layer's forward+backward + the stages' constant terms) whatever
    the layout (recompute only adds). The floor of a search whose CP-SAT rounds proved less (or
    never ran): the answer then still carries a proven gap."""
    lin = lin or LinearLayouts(ctx)
    counts = lin.run_counts(np.array([[len(ctx.kind_of_layer)] + [0] * (lin.stages - 1)]))  # any layout: the totals per run
    total = float(counts[0].sum(axis=0) @ (lin.forward_s + lin.backward_s)) + float(lin.const_forward_s.sum() + lin.const_backward_s.sum())
    return ctx.microbatches * total / ctx.pp


def level_range(ctx: LayoutContext, lin: "LinearLayouts", below_s: float, most: int, tables=None) -> tuple[list[int], float]:
    """The levels N (0..most) of one --recompute-num-layers that level_work_bounds leaves below
    `below_s`, and the least bound over all levels (-inf where it makes no claim: then every
    level is open). Every N up to the most layers a rank can hold below `below_s` (its
    cheapest layers' busy time) is bounded: the bounds are not monotone in N (a larger N
    recomputes more, but lets a rank whose memory forces many recomputed layers hold them);
    beyond that most, min(N, layers) no longer changes, so the last level stands for all
    larger ones."""
    cheapest = float(np.min(lin.u["kind_total"][sorted(set(int(k) for k in lin.kind_of_run))]))
    cap = most if cheapest <= 0 else min(most, int(below_s / (ctx.microbatches * cheapest)) + 1)
    bounds = level_work_bounds(ctx, lin, range(cap + 1), tables, below_s)
    if not bounds:
        return list(range(most + 1)), -math.inf
    open_levels = [n for n, value in sorted(bounds.items()) if value < below_s]
    if cap in open_levels:
        open_levels += list(range(cap + 1, most + 1))
    return open_levels, min(bounds.values())


def level_work_bounds(ctx: LayoutContext, lin: "LinearLayouts", levels, tables=None, below_s: float = math.inf,
                      max_states: int = 20000) -> dict[int, float]:
    """Per level N of one --recompute-num-layers (every stage recomputes min(N, its layers)):
    a lower bound on the makespan of every such layout, from the ranks' busy time alone. A rank
    runs its chunks' m forwards and m backwards one after another, so the makespan is at least
    m * its seconds per micro-batch: its layers' forward+backward, its stages' constant terms
    and its recompute. With N >= 1 a rank holding L >= 1 layers recomputes
    sum_c min(N, t_c) >= min(N, L) of them, each at least the cheapest recompute among the
    kinds it holds; with `tables` (least_recompute's, one kind of layer) at least what its
    memory forces, which N = 0 must not need and which may not exceed the vp * N that one N
    recomputes at most. The least over every split of each kind's layers among the ranks (their
    order relaxed) of the busiest rank: a min-max DP over ranks, whose states are the layers of
    each kind placed so far. Where that takes more than `max_states` states (many kinds), {}:
    no claim.
    Why: with one N every chunk that holds a layer pays a recompute, so where the busiest
    rank's layers leave no room for one (DeepSeek-V3 on pp 16 x vp 2: 58 MoE layers over 16
    ranks put 4 on some rank, 57.2 s, and one recomputed MoE layer more is 63 s, above the
    no-recompute optimum's 60.9 s), every N >= 1 is out and the search is the one without
    recompute. Rank vectors whose busy time reaches `below_s` are dropped (only speeds it)."""
    u = lin.u
    pp, vp, m = ctx.pp, ctx.vp, ctx.microbatches
    kinds = sorted(set(int(k) for k in lin.kind_of_run))
    count = [sum(b - a for kind, a, b in lin.runs if kind == k) for k in kinds]
    shape = tuple(c + 1 for c in count)
    if int(np.prod(shape)) > max_states:
        return {}
    cost = np.array([float(u["kind_total"][k]) for k in kinds])
    rec = np.array([float(u["kind_recompute"][k]) for k in kinds])
    if (rec < 0).any():
        return {}
    grid = np.stack(np.meshgrid(*[np.arange(c + 1) for c in count], indexing="ij"), axis=-1).reshape(-1, len(kinds))  # [state, kind]
    held = grid.sum(axis=1)
    cheapest = np.where(grid > 0, rec[None, :], np.inf).min(axis=1)  # the cheapest recompute among the kinds held
    cheapest[held == 0] = 0.0
    out = {}
    for level in levels:
        worst = np.full(shape, np.inf)  # the least busiest-rank seconds per micro-batch over the ranks so far, per layers placed
        worst[(0,) * len(kinds)] = 0.0
        for r in range(pp):
            const = float(sum(lin.const_forward_s[s] + lin.const_backward_s[s] for s in range(r, lin.stages, pp)))
            again = np.minimum(level, held).astype(float)
            if tables is not None:  # beyond its table the rank fits no recompute at all
                table = np.asarray(tables[r], dtype=float)
                forced = np.full(len(held), np.inf)
                inside = held < len(table)
                forced[inside] = table[held[inside]]
                if level == 0:
                    again = np.where(forced > 0, np.inf, 0.0)
                else:
                    again = np.where(forced > vp * level, np.inf, np.maximum(again, forced))
            busy = np.full(len(held), np.inf)
            can = np.isfinite(again)
            busy[can] = grid[can] @ cost + const + np.where(again[can] > 0, again[can], 0.0) * cheapest[can]
            busy[m * busy >= below_s] = np.inf
            nxt = np.full(shape, np.inf)
            for v in np.flatnonzero(np.isfinite(busy)):
                take = grid[v]
                src = tuple(slice(0, c + 1 - t) for c, t in zip(count, take))
                dst = tuple(slice(t, c + 1) for c, t in zip(count, take))
                np.minimum(nxt[dst], np.maximum(worst[src], busy[v]), out=nxt[dst])
            worst = nxt
        out[int(level)] = m * float(worst[tuple(count)])
    return out


def dwell_paths(ctx: LayoutContext, seconds: tuple[np.ndarray, ...], budget_terms: int = 40000, heavy: float = 3.0,
                batch: int = 256) -> list[tuple[np.ndarray, ...]]:
    """Longest paths of the schedule graph where one stage, or two, are `heavy` times slower
    than in `seconds` (a layout's per-stage pass times, [stage] each): the paths that dwell on
    those stages for a run of micro-batches and hop between them. Each is a cut for every
    layout (any path is). Why: the search's other cuts are tight near the layouts they came
    from, and CP-SAT's first answers are layouts far from them, whose one or two overloaded
    chunks pace the steady state (DeepSeek-V3 on pp 16 x vp 2: answers priced below the 60.9 s
    incumbent whose paths run 291 micro-batches on one chunk and 480 on the last, 65-74 s);
    every pair of stages gives the rounds those paths up front (its free search without
    recompute certifies in one round, 3.3-3.9 s against 5.1-7.9 s; with per-stage recompute,
    together with MemoryRows.recompute_only_where_needed, in 7.7-9.3 s, where that alone
    stopped at 3.0% in 10 s). Pairs where their terms fit
    `budget_terms` (about 2 * stages terms a path: pp 16 x vp 2's 528 probes, ~0.7 s), else
    single stages only (pp 16 x vp 8: 8,256 pairs make a model CP-SAT does not solve in 10 s)."""
    stages = len(seconds[0])
    probes = [(s,) for s in range(stages)]
    pairs = list(itertools.combinations(range(stages), 2))
    if (len(probes) + len(pairs)) * 2 * stages <= budget_terms:
        probes += pairs
    elif len(probes) * 2 * stages > budget_terms:
        return []
    graph = schedule_graph(ctx)
    out = []
    for i in range(0, len(probes), batch):
        part = probes[i:i + batch]
        scaled = [np.repeat(np.asarray(x, dtype=float)[:, None], len(part), axis=1) for x in seconds]
        for k, probe in enumerate(part):
            for x in scaled:
                x[list(probe), k] *= heavy
        out.extend(zip(*graph.paths(*scaled)))
    return out


@dataclasses.dataclass(frozen=True)
class RankRegion:
    """What every layout whose makespan is below a goal satisfies (rank_order_region): each
    rank holds between low[r] and high[r] decoder layers, stage 0 at most stage0_high."""

    low: tuple[int, ...]
    high: tuple[int, ...]
    stage0_high: int

    def contains(self, decoders) -> bool:
        decoders = np.asarray(decoders)
        pp = len(self.low)
        totals = [int(decoders[r::pp].sum()) for r in range(pp)]
        return decoders[0] <= self.stage0_high and all(lo <= x <= hi for lo, x, hi in zip(self.low, totals, self.high))


def rank_order_region(ctx: LayoutContext, below_s: float, lin: "LinearLayouts | None" = None,
                      time_limit_s: float = 1.0, tables=None, feasibility_only: bool = False,
                      spread: int | None = None, memory: bool = False) -> RankRegion | None:
    """The integer consequences of a makespan below `below_s`: None where no layout has one,
    else per rank the least and most decoder layers and the most on stage 0, proven on a small
    CP-SAT model of the ranks' integer layer totals (kinds apart, their order, recompute and
    memory relaxed: a relaxation of every layout; the least totals and stage 0's most are
    probed, the most totals follow from busy time and the others' least) with two facts of the
    schedule:

    * busy: a rank runs its m forwards and backwards of every chunk one after another, so the
      makespan is at least m * W_r (W_r its layers' and modules' seconds per micro-batch);
    * rank order: where chunk_segments_hold, a rank r > 0 whose first decoder layer is in
      stage s_r does all its layers' work inside segment_paths' path of s_r, after micro-batch
      0's forward chain through every stage before s_r and with the last micro-batch's backward
      chain back through them: makespan >= m * W_r + sum_{q < s_r} (F_q + B_q). The stages
      before s_r include stage 0 (the embedding and its t_0 layers) and the first decoder stage
      of every rank whose first decoder stage comes earlier, each holding a layer. So with
      ranks numbered 1, 2, ... by their first decoder stage (pos_r, all different), makespan
      >= m * W_r + E + delta * t_0 + delta * (pos_r - 1), delta the cheapest layer's forward
      and backward, E stage 0's own (less the fixed overhead of the empty chunks the rank may
      run outside the segment, where chunks have one). Rank 0 takes a place in that order
      too where stage 0 holds no decoder layer but the rank does (its first decoder stage is
      then a later chunk's), less what its chunks before the last may run outside the
      segment (the embedding's m passes among them): Llama 3 405B with 128 micro-batches
      (tp 4, cp 8, pp 16 x vp 8), where rank 0 holding 8 layers with nothing on stage 0
      escaped the argument, and the search stopped at 1.1% in 10 s; now the region is empty
      just below Megatron's split, which is certified in 0.5 s.

    With `tables` (least_recompute's, per rank; one kind of layer) a rank's work also counts
    the recompute its layer total forces: every layout that fits recomputes at least that.
    With one kind of layer it also counts the least its chunks holding a layer pay beyond the
    linear terms at its total (LinearLayouts.rank_held_floor_s: the gradient windows' rest,
    ZeRO-3's first gather; inside the segment, since those chunks hold layers): Llama 3 405B
    cp 2 under ZeRO-2, two windows per stage, the goals proven out of reach went from below
    5.35-5.38 s to below 5.3957 s (the split's makespan 5.4276 s).
    With `memory`, each rank's memory in its kind totals (LinearLayouts.rank_total_rows, below
    its peak in every layout without recompute whose chunks differ by at most `spread` layers
    on a rank), and where `spread` is set, that the first kind-run's layers come first: a rank
    holds at most those the stages before its first one leave, each holding at least the least
    chunk its rank's total allows. Ranks that cannot hold their share push layers onto others
    (DeepSeek-V3 on pp 16 x vp 2 under FSDP, regular layouts: rank 2 holds at most 3 MoE layers,
    a dense one only where ranks 0 and 1 hold fewer).

    Integrality is what the bound gains: Llama 3 405B on pp 16 x vp 8 (126 layers) keeps ranks
    of 8 layers (ceil(126 / 16)), and the 14 that must hold 8 cannot all start early, which
    forces rank 0 to hold 8 layers and stage 0 none for any layout below Megatron's split; the
    LP relaxation of the path cuts spreads 0.7 of a layer over the first stages instead.
    Coefficients are rounded down (integer nanoseconds), the goal up, so every layout below
    `below_s` is a solution; each probe that runs out of time keeps its proven bound.
    `feasibility_only`: one solve without probes (a tiny model: milliseconds), the region then
    the trivial one where it does not prove the goal out of reach."""
    lin = lin or LinearLayouts(ctx)
    pp, vp, m = ctx.pp, ctx.vp, ctx.microbatches
    n = len(ctx.kind_of_layer)
    goal = int(math.ceil(below_s * TIME_SCALE)) - 1
    if goal < 0:
        return None
    kinds = sorted(set(int(k) for k in lin.kind_of_run))
    count = {k: sum(b - a for kind, a, b in lin.runs if kind == k) for k in kinds}
    per_layer = {int(k): max(int(math.floor((lin.forward_s[j] + lin.backward_s[j]) * TIME_SCALE)), 0) for j, k in enumerate(lin.kind_of_run)}
    delta = min(per_layer.values())
    rec = max(int(math.floor(float(lin.recompute_s[0]) * TIME_SCALE)), 0) if tables is not None else 0
    const = np.floor((lin.const_forward_s + lin.const_backward_s) * TIME_SCALE).astype(np.int64)  # per stage, besides its decoder layers
    # an empty chunk still runs its fixed overhead, forward and backward: the m * (vp - 1) empty
    # chunks' overhead a rank may run outside its segment path is taken off it
    overhead = int(math.ceil(2 * unit_costs(ctx)["overhead"] * TIME_SCALE)) * m * (vp - 1)
    # with one kind of layer, a rank's least seconds beyond the linear terms per layer total
    # (LinearLayouts.rank_held_floor_s: ZeRO-3's first gathers, the gradient windows' rest), up
    # to the most layers its busy time allows below the goal and twice a rank's share (0 beyond:
    # a valid floor; the table costs ~vp * most^2 stage vectors, and a goal far above every
    # layout, NO_GOAL_S's feasibility test, would ask for all n)
    most = min(n, 2 * math.ceil(n / pp) + 2,
               max(((goal - m * int(const[r::pp].sum())) // (m * delta) if delta > 0 else n) for r in range(pp)))
    held_floor = lin.rank_held_floor_s(int(max(most, 0))) if most >= 1 else None
    model = cp_model.CpModel()
    layers = {(r, k): model.NewIntVar(0, count[k], "") for r in range(pp) for k in kinds}
    for k in kinds:
        model.Add(sum(layers[r, k] for r in range(pp)) == count[k])
    total = [model.NewIntVar(0, n, f"total{r}") for r in range(pp)]
    z = model.NewIntVar(0, goal, "makespan")
    work = []
    for r in range(pp):
        model.Add(total[r] == sum(layers[r, k] for k in kinds))
        work.append(sum(per_layer[k] * layers[r, k] for k in kinds) + int(const[r::pp].sum()))
        if tables is not None and rec > 0:
            work[r] = work[r] + rec * least_recompute_var(model, total[r], tables[r], f"least{r}")
        if held_floor is not None:  # what its chunks holding a layer pay beyond the linear terms, at least
            table = [int(math.floor(x * TIME_SCALE)) for x in held_floor[r]] + [0] * (n - most)
            beyond = model.NewIntVar(0, max(table), f"held_floor{r}")
            model.AddElement(total[r], table, beyond)
            work[r] = work[r] + beyond
        model.Add(m * work[r] <= z)
        rows = lin.rank_total_rows(r, spread) if memory else None
        if rows is not None:  # costs rounded down, the capacity up: every layout that fits passes
            kind_bytes, transient0, kind_transient, in_flight_rows = rows
            fixed = sum(int(math.floor(kind_bytes[k] / BYTE_SCALE)) * layers[r, k] for k in kinds)
            room = int(math.ceil(lin.capacity / BYTE_SCALE))
            model.Add(fixed + int(math.floor(transient0 / BYTE_SCALE))
                      + sum(int(math.floor(kind_transient[k] / BYTE_SCALE)) * layers[r, k] for k in kinds) <= room)
            for j, (in_flight, per_kind) in enumerate(in_flight_rows):
                table = [int(math.floor(x / BYTE_SCALE)) for x in in_flight]
                held = model.NewIntVar(min(table), max(table), f"held{r}_{j}")
                model.AddElement(total[r], table, held)
                model.Add(fixed + held + sum(int(math.floor(per_kind[k] / BYTE_SCALE)) * layers[r, k] for k in kinds) <= room)
    head_kind, _, head_end = lin.runs[0]
    if memory and spread is not None and pp > 1 and sum(1 for kind, _, _ in lin.runs if kind == head_kind) == 1:
        # the first run's layers (DeepSeek-V3's dense ones) come first in model order: a rank
        # holds at most those left after the stages before its first one, each of which holds at
        # least the least chunk its rank's total allows (ceil((T - spread (vp - 1)) / vp))
        rank_of = np.array(stage_ranks(pp, vp, ctx.vee))
        least_chunk = []
        for r in range(pp):
            low = model.NewIntVar(0, 2 * n + vp, f"chunk_low{r}")
            model.AddDivisionEquality(low, total[r] + (vp - 1) * (1 - spread) + n * vp, vp)  # shifted by n: a non-negative numerator
            floor = model.NewIntVar(0, n, f"chunk_floor{r}")
            model.AddMaxEquality(floor, [low - n, 0])
            least_chunk.append(floor)
        for r in range(pp):
            first_stage = int(np.flatnonzero(rank_of == r)[0])
            before = sum(least_chunk[int(q)] for q in rank_of[:first_stage])
            left = model.NewIntVar(0, head_end, f"head_left{r}")
            model.AddMaxEquality(left, [head_end - before, 0])
            model.Add(layers[r, head_kind] <= left)
    first = model.NewIntVar(0, n, "t0")  # decoder layers on stage 0
    model.Add(first <= total[0])
    if pp > 1 and chunk_segments_hold(ctx.ops, pp, vp, m):
        # rank 0 takes a place in the order too where its stage 0 holds no decoder layer (its
        # first decoder stage is then a later chunk's, c * pp: after micro-batch 0's forward
        # through every rank's first decoder stage before it), with its work less what may run
        # outside its segment (its chunks before c: stage 0's embedding and empty chunks)
        rank0 = vp > 1 and chunk_segments_hold(ctx.ops, pp, vp, m, ranks=[0])
        layered = [model.NewBoolVar(f"h{r}") for r in range(1, pp)]
        position = [model.NewIntVar(1, pp - 1 + int(rank0), f"pos{r}") for r in range(1, pp)]
        late0 = model.NewBoolVar("late0")  # rank 0 holds layers, none on stage 0
        if rank0:
            has0, on0 = model.NewBoolVar("has0"), model.NewBoolVar("on0")
            model.Add(total[0] >= 1).OnlyEnforceIf(has0)
            model.Add(total[0] == 0).OnlyEnforceIf(has0.Not())
            model.Add(first >= 1).OnlyEnforceIf(on0)
            model.Add(first == 0).OnlyEnforceIf(on0.Not())
            model.AddBoolOr([has0.Not(), on0, late0])
            model.AddImplication(late0, has0)
            model.AddImplication(late0, on0.Not())
            pos0 = model.NewIntVar(1, pp, "pos0")
            model.AddAllDifferent(position + [pos0])
            outside0 = m * int(const[0::pp][:vp - 1].sum())
            model.Add(z >= m * work[0] - outside0 + int(const[0]) + delta * (pos0 - 1)).OnlyEnforceIf(late0)
            model.Add(pos0 >= 1 + sum(layered)).OnlyEnforceIf(late0.Not())  # no place before a rank with layers
        else:
            model.Add(late0 == 0)
            model.AddAllDifferent(position)
        for r, h, pos in zip(range(1, pp), layered, position):
            model.Add(total[r] >= 1).OnlyEnforceIf(h)
            model.Add(total[r] == 0).OnlyEnforceIf(h.Not())
            model.Add(z >= m * work[r] - overhead + int(const[0]) + delta * first + delta * (pos - 1)).OnlyEnforceIf(h)
            model.Add(pos >= 1 + sum(layered) + late0).OnlyEnforceIf(h.Not())  # ranks without layers after those with

    def extreme(objective, maximize):
        (model.Maximize if maximize else model.Minimize)(objective)
        solver = cp_solver.cp_solver(random_seed=1)  # CP-SAT's default seed, which this solve always ran with
        solver.parameters.max_time_in_seconds = max(time_limit_s / (pp + 1), 0.01)
        status = cp_solver.solve(solver, model)
        if status == cp_model.INFEASIBLE:
            return None
        if status == cp_model.OPTIMAL:
            return int(solver.ObjectiveValue())
        bound = solver.BestObjectiveBound()  # proven whatever the status
        if not math.isfinite(bound):
            return n if maximize else 0
        return min(int(math.floor(bound + 1e-6)), n) if maximize else max(int(math.ceil(bound - 1e-6)), 0)

    if feasibility_only:
        solver = cp_solver.cp_solver(random_seed=1)
        solver.parameters.max_time_in_seconds = max(time_limit_s, 0.01)
        if cp_solver.solve(solver, model) == cp_model.INFEASIBLE:
            return None
        return RankRegion((0,) * pp, (n,) * pp, n)
    stage0_high = extreme(first, True)
    if stage0_high is None:
        return None
    low = []
    for r in range(pp):
        low.append(extreme(total[r], False))
        if low[-1] is None:
            return None
    # the most layers of a rank: its busy time with the cheapest layers, and what the others'
    # least leave (a probe each would add little: these are the same on Llama 3 405B)
    high = []
    for r in range(pp):
        busy = (goal - m * int(const[r::pp].sum())) // (m * delta) if delta > 0 else n
        if tables is not None:  # nor more than the recompute its memory forces lets it hold
            busy = min(busy, len(tables[r]) - 1)
            while busy > 0 and m * (delta * busy + rec * tables[r][busy] + int(const[r::pp].sum())) > goal:  # from the top: the largest total whose work meets the goal
                busy -= 1
        high.append(int(max(min(busy, n - (sum(low) - low[r]), n), low[r])))
    return RankRegion(tuple(low), tuple(high), min(stage0_high, n))


def rank_totals_bound(ctx: LayoutContext, low_s: float, high_s: float, lin: "LinearLayouts | None" = None, time_limit_s: float = 0.5,
                      tables=None, spread: int | None = None, tolerance: float = 1e-3) -> float | None:
    """A makespan lower bound for every layout of the search's space (chunks within `spread`
    on a rank) from the ranks' integer layer totals: the largest goal in [low_s, high_s] that
    rank_order_region, with the ranks' memory, proves out of reach (its feasibility solve,
    INFEASIBLE), high_s first, then by bisection to `tolerance` of high_s in `time_limit_s`
    (each solve a tiny model, 0.05-0.1 s on DeepSeek-V3; one that runs out of time counts as
    reachable). None where low_s is not proven. DeepSeek-V3 on pp 16 x vp 2 under FSDP, regular
    layouts: the memory of ranks 0-3 pushes layers onto later ranks, 55.6 s (the work bound, all
    CP-SAT's round proved) -> 62.3 s; the last rank holding a layer beside the head and MTP,
    which costs the regular layouts their speed, is a path's argument, not the ranks' (76.5 s
    against 72.8 s)."""
    lin = lin or LinearLayouts(ctx)
    start = time.perf_counter()

    def out_of_reach(goal_s: float) -> bool:
        left = time_limit_s - (time.perf_counter() - start)
        return left > 0 and rank_order_region(ctx, goal_s, lin, time_limit_s=min(left, 0.25), tables=tables,
                                              feasibility_only=True, spread=spread, memory=True) is None

    if out_of_reach(high_s):  # high_s itself: it certifies an incumbent there
        return high_s
    proven = None  # the largest goal proven so far
    while high_s - low_s > tolerance * high_s and time.perf_counter() - start < time_limit_s:
        middle = 0.5 * (low_s + high_s)
        if out_of_reach(middle):
            low_s = proven = middle
        else:
            high_s = middle
    if proven is None and low_s < high_s and out_of_reach(low_s):
        proven = low_s
    return proven


def _least_in_region(cost: np.ndarray, region: RankRegion, low: np.ndarray, cap: np.ndarray, n: int) -> float:
    """min cost . x over layer counts x with low <= x <= cap (integers), sum x = n and each
    rank's sum within the region: every rank filled to its least total with its cheapest
    stages, then the layers left one at a time where they cost least (exact: each rank's
    least cost is convex in its total, and the totals share one sum); inf where none fits."""
    pp = len(region.low)
    if (low > cap).any():
        return math.inf
    x = low.astype(np.int64).copy()
    cap = cap.astype(np.int64)
    rank = np.arange(len(cost)) % pp
    sums = np.bincount(rank, weights=x, minlength=pp).astype(np.int64)
    if (sums > np.array(region.high)).any():
        return math.inf
    for r in range(pp):
        mine = np.flatnonzero(rank == r)
        while sums[r] < region.low[r]:
            room = mine[x[mine] < cap[mine]]
            if not len(room):
                return math.inf
            s = room[np.argmin(cost[room])]
            step = min(int(cap[s] - x[s]), int(region.low[r] - sums[r]))
            x[s] += step
            sums[r] += step
    left = n - int(x.sum())
    if left < 0:
        return math.inf
    high = np.array(region.high)
    while left > 0:
        room = np.flatnonzero((x < cap) & (sums[rank] < high[rank]))
        if not len(room):
            return math.inf
        s = room[np.argmin(cost[room])]
        step = min(int(cap[s] - x[s]), int(high[rank[s]] - sums[rank[s]]), left)
        x[s] += step
        sums[rank[s]] += step
        left -= step
    return float(cost @ x)


def lp_region_bound(ctx: LayoutContext, region: RankRegion, goal_s: float, pool=(), time_limit_s: float = 3.0,
                    lin: "LinearLayouts | None" = None, min_layers: int = 0, max_layers: int | None = None,
                    step: float = 0.15, nudge: float = 0.15) -> tuple[float | None, list]:
    """A lower bound on the makespan of every layout in `region` (rank_order_region's), from
    the LP relaxation of the schedule graph over the region's layer counts, and the paths that
    prove it (cuts for the CP-SAT model): (None, []) where the model has more than one kind of
    layer (the LP would drop their order) or no round proves anything.

    Cut generation (Kelley's method, stabilised): an LP over the paths so far (z >= each
    path's length, linear in the stage counts) gives a point; the longest paths at a point
    between it and the best point seen (`step` of the way, in-out stabilisation) and at that
    point with each stage nudged up by `nudge` layer (the paths tied there) join the LP. Until
    `goal_s` is reached, time is up or the LP stops gaining (less than 5% of its distance to the
    goal in four rounds).
    The bound is rigorous whatever the LP solver's tolerances: its duals, clipped to >= 0 and
    normalised, weigh the paths into one valid cut z >= abar . x + cbar, whose least over
    the region's integer counts (_least_in_region, exact) bounds every layout there. The LP
    ignores memory and recompute (recompute only adds time), so it relaxes every layout."""
    from scipy.optimize import linprog

    start = time.perf_counter()
    lin = lin or LinearLayouts(ctx)
    if len(lin.runs) != 1:
        return None, []
    graph = schedule_graph(ctx)
    stages, pp = lin.stages, ctx.pp
    n = len(ctx.kind_of_layer)
    unit = float(lin.forward_s[0] + lin.backward_s[0])  # LP in layer units: better conditioned
    if unit <= 0:
        return None, []
    f1, b1 = float(lin.forward_s[0]), float(lin.backward_s[0])
    cf, cb = lin.const_forward_s, lin.const_backward_s
    low = np.full(stages, float(min_layers))
    cap = np.full(stages, float(n if max_layers is None else max_layers))
    cap[0] = min(cap[0], region.stage0_high)
    if _least_in_region(np.zeros(stages), region, low, cap, n) == math.inf:
        return math.inf, []  # no layout of the search's space is in the region: none is below the goal
    rows, consts, paths, seen = [], [], [], set()

    def add(n_f, n_b):
        key = (np.asarray(n_f).astype(np.int64).tobytes(), np.asarray(n_b).astype(np.int64).tobytes())
        if key in seen:
            return
        seen.add(key)
        n_f, n_b = np.asarray(n_f, dtype=float), np.asarray(n_b, dtype=float)
        rows.append((n_f * f1 + n_b * b1) / unit)
        consts.append(float(n_f @ cf + n_b @ cb) / unit)
        paths.append((n_f, n_b))

    for n_f, n_b in pool:
        add(n_f, n_b)
    for n_f, n_b in segment_paths(ctx.ops, stages, ctx.microbatches):
        add(n_f, n_b)
    member = np.zeros((pp, stages))
    for r in range(pp):
        member[r, r::pp] = 1.0
    rank_rows = np.hstack([np.vstack([-member, member]), np.zeros((2 * pp, 1))])
    rank_rhs = np.concatenate([-np.array(region.low, dtype=float), np.array(region.high, dtype=float)])
    a_eq = np.hstack([np.ones((1, stages)), np.zeros((1, 1))])
    bounds = [(low[s], cap[s]) for s in range(stages)] + [(0.0, None)]
    objective = np.zeros(stages + 1)
    objective[-1] = 1.0
    goal = goal_s / unit
    best_lb, center, center_value, history, useful = None, None, math.inf, [], []
    idle = np.zeros(0, dtype=np.int64)  # per path: rounds since its dual was last positive (the LP keeps the last two rounds')
    while time.perf_counter() - start < time_limit_s:
        all_rows, all_consts = np.array(rows), np.array(consts)
        idle = np.concatenate([idle, np.zeros(len(rows) - len(idle), dtype=np.int64)])
        active = np.flatnonzero(idle <= 1)
        a = np.hstack([all_rows[active], -np.ones((len(active), 1))])
        result = linprog(objective, A_ub=np.vstack([a, rank_rows]), b_ub=np.concatenate([-all_consts[active], rank_rhs]),
                         A_eq=a_eq, b_eq=[n], bounds=bounds, method="highs-ds", options={"presolve": False})
        if result.status != 0:
            break
        weight = np.maximum(-result.ineqlin.marginals[:len(active)], 0.0)
        idle += 1
        idle[active[weight > 1e-12]] = 0
        x, level = result.x[:stages], result.fun
        violated = np.flatnonzero(all_rows @ x + all_consts > level * (1 + 1e-9))
        idle[violated] = 0  # paths the LP point breaks come back for the next round
        if weight.sum() > 0.5:
            weight = weight / weight.sum()
            lb = float(weight @ all_consts[active]) + _least_in_region(weight @ all_rows[active], region, low, cap, n)
            if best_lb is None or lb > best_lb:
                best_lb = lb
                useful = [paths[active[i]] for i in np.flatnonzero(weight > 1e-9)]
        if best_lb is not None and best_lb >= goal:
            break
        history.append(level)
        if len(history) > 4 and goal - history[-1] > 0.95 * (goal - history[-5]):
            break  # the LP stopped gaining
        point = x if center is None else center + step * (x - center)
        columns = np.repeat(point[:, None], stages + 1, axis=1)
        columns[np.arange(stages), np.arange(1, stages + 1)] += nudge
        forward, backward = f1 * columns + cf[:, None], b1 * columns + cb[:, None]
        end = graph.ends(forward, backward)
        value = float(end[:-1, 0].max())
        if value < center_value:
            center, center_value = point, value
        for n_f, n_b in zip(*graph.paths(forward, backward, end=end)):
            add(n_f, n_b)
    return (None if best_lb is None else best_lb * unit), useful
