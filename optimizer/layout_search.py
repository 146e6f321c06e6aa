"""The best heterogeneous pipeline layout of one skeleton configuration (issue 11): CP-SAT over
integer layer counts per stage and layer kind, certified by the exact model
(costmodel.stage_layout.score_layout); a dynamic program over stages (MPE eq. 3, seed 002) and
plain enumeration as oracles on small instances.

Why CP-SAT here: a layout of 126 layers over 128 stages is one of C(253, 127) ~ 1e75; nothing
enumerates that, while the structure is linear. With the skeleton fixed (degrees, micro-batch,
features), the exact model's step time of a layout is
    (m - 1/vp) * max_r R_r + (sum_r R_r) / vp + P2P + DP + update
where only max_r R_r depends on the layout (the total work, the mean chunk that hides the P2P
hops and the step-level terms do not), so minimising the bottleneck rank's work R_r, a max of
linear forms in the counts, minimises the step time. Memory per rank is the exact ledger
(costmodel.memory.rank_memory), affine in the rank's kind counts for the supported skeletons:
    peak_r = base_r(counts) + (1 + frag) * max(activations_r, optimizer transient_r)
with activations_r = max over the rank's in-flight vectors h (costmodel.stage_layout.held_chunks)
of sum_c h_c * bytes of local chunk c; each h is one linear constraint. The coefficients are read
off the exact ledger by probing it (no formula is copied), and the answer is re-scored.

Layer kinds: a stage holds a contiguous run of the model's layers, so with prefix sums P_s the
layers of kind-run [a, b) in stage s are clip(P_s, a, b) - clip(P_{s-1}, a, b).
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import numpy as np
from ortools.sat.python import cp_model

from costmodel.schedule_sim import simulate

from costmodel.stage_layout import (
    LayoutContext,
    LayoutError,
    StageLayout,
    chunk_times,
    layout_context,
    rank_ledger,
    score_layout,
    unit_costs,
)

TIME_SCALE = 1e9  # integer nanoseconds in the CP-SAT model
BYTE_SCALE = 1024.0  # integer KiB


@dataclasses.dataclass(frozen=True)
class LayoutSolution:
    layout: StageLayout
    step_time_s: float  # the exact model's (schedule simulated op by op)
    makespan_s: float  # the simulated pipeline makespan of the layout
    bound_s: float  # the layout's critical-path bound (costmodel.stage_layout), for comparison
    lower_bound_s: float  # proven: no layout that fits has a makespan below this
    optimal: bool  # the makespan meets the lower bound (within the integer rounding)
    solve_s: float
    fits: bool
    rounds: int  # CP-SAT solves (one per critical path added)

    @property
    def gap(self) -> float:
        """Proven optimality gap of the layout's simulated makespan."""
        return max(0.0, self.makespan_s - self.lower_bound_s) / self.makespan_s


def critical_path(ops, result, forward_s: np.ndarray, backward_s: np.ndarray, prefer_rank: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(forward ops, backward ops) per stage on a longest path of the simulated schedule's
    dependency graph (each op waits for the rank's previous op and its inputs: F(s-1), and for
    a backward F(s) and B(s+1)). The graph is the same for every layout of the skeleton, so the
    path's length, sum over stages of nF*F_s + nB*B_s, bounds every layout's makespan from
    below: a cut for the layout search. Backtracks from the op that ends last through whichever
    predecessor its start equals (the rank's previous op first with prefer_rank, else an input:
    two of the tied paths of a balanced schedule)."""
    stages = forward_s.shape[0] * forward_s.shape[1]
    where = {(op.kind, op.stage, op.microbatch): (r, i) for r, rank_ops in enumerate(ops) for i, op in enumerate(rank_ops)}
    r, i = max(((r, len(e) - 1) for r, e in enumerate(result.end_s) if len(e)), key=lambda x: result.end_s[x[0]][x[1]])
    tol = 1e-9 * max(result.makespan_s, 1e-30)
    n_f, n_b = np.zeros(stages), np.zeros(stages)
    while True:
        op = ops[r][i]
        (n_f if op.kind == "F" else n_b)[op.stage] += 1
        start = result.start_s[r][i]
        if start <= tol:
            break
        preds = []
        if op.kind == "F" and op.stage > 0:
            preds.append(("F", op.stage - 1, op.microbatch))
        if op.kind == "B":
            preds.append(("F", op.stage, op.microbatch))
            if op.stage < stages - 1:
                preds.append(("B", op.stage + 1, op.microbatch))
        step = [where[k] for k in preds if abs(result.end_s[where[k][0]][where[k][1]] - start) <= tol]
        if i > 0 and abs(result.end_s[r][i - 1] - start) <= tol:
            step.insert(len(step) * (not prefer_rank), (r, i - 1))
        if not step:
            raise RuntimeError("critical path lost: an op starts when no predecessor ends")
        r, i = step[0]
    return n_f, n_b


def kind_runs(kind_of_layer: list[int]) -> list[tuple[int, int, int]]:
    """(kind, first layer, end) of each maximal run of equal kinds in model order."""
    runs = []
    for kind, group in itertools.groupby(enumerate(kind_of_layer), key=lambda x: x[1]):
        idx = [i for i, _ in group]
        runs.append((kind, idx[0], idx[-1] + 1))
    return runs


def rank_memory_model(ctx: LayoutContext, rank: int) -> tuple[float, np.ndarray, float, np.ndarray, float]:
    """(base_0, base per kind, transient_0, transient per kind, head bytes) of a rank, read
    off the exact ledger at zero activations: peak = base + (1+frag)*max(act + head, trans)."""
    pp = ctx.pp
    last_rank = (pp * ctx.vp - 1) % pp
    first, last = rank == 0, rank == last_rank
    mtp = ctx.problem.model.mtp_layers if last else 0
    no_head = dataclasses.replace(ctx.lc, head_saved=0.0 * ctx.lc.head_saved)
    frag = ctx.mc.fragmentation
    k = len(ctx.kinds)

    def probe(counts):
        ledger = rank_ledger(ctx, counts, first, last, mtp, 0.0, lc=no_head)
        trans = float(ledger.optimizer_transient[0])
        return float(ledger.peak[0]) - (1.0 + frag) * trans, trans

    base0, trans0 = probe(np.zeros(k))
    base, trans = np.zeros(k), np.zeros(k)
    for j in range(k):
        unit = np.zeros(k)
        unit[j] = 1.0
        b, t = probe(unit)
        base[j], trans[j] = b - base0, t - trans0
    head = float(np.asarray(ctx.lc.head_saved).ravel()[0]) * (1 + mtp) if last else 0.0
    return base0, base, trans0, trans, head


def solve_layout(ctx: LayoutContext, time_limit_s: float = 10.0, workers: int = 2, min_layers: int = 0, refine: bool = True,
                 seeds: tuple[StageLayout, ...] = (), round_limit_s: float = 2.0, graph: bool = False,
                 max_layers: int | None = None, chunk_spread: int | None = None) -> LayoutSolution:
    """The layout minimising the exact step time of `ctx`'s skeleton under every rank's memory
    (MTP modules on the last stage; `min_layers`: the least decoder layers per stage).

    The objective is the simulated makespan, a max over the schedule graph's paths of linear
    forms in the layer counts. CP-SAT starts from the critical-path bound's paths (one per rank)
    and those of the `seeds`' simulations; each round it solves, the exact model simulates the
    answer, and the answer's critical path is added as a cut, until the best simulated layout
    meets CP-SAT's bound (certified optimal) or time runs out (its gap is reported).
    refine=False stops after the first round: the critical-path bound's optimum (the DP oracle's
    objective). chunk_spread: search only regular layouts, whose chunks on one rank differ by at
    most this many layers (the answer and its bound then hold among those; the cuts start from
    the rank terms only, which keeps the model small). round_limit_s caps each CP-SAT solve after the first (its bound is proven
    either way). graph=True replaces the cuts by the whole event graph of the schedule (an
    end-time variable per op): exact in one solve, but too large for CP-SAT beyond small
    instances (pp 16 x vp 8 x 32 micro-batches: no bound in 20 s)."""
    start = time.perf_counter()
    pp, vp = ctx.pp, ctx.vp
    stages = pp * vp
    n_layers = len(ctx.kind_of_layer)
    mtp_layers = ctx.problem.model.mtp_layers
    u = unit_costs(ctx)
    runs = kind_runs(ctx.kind_of_layer)
    model = cp_model.CpModel()
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
    # layers of each kind-run per stage
    if len(runs) == 1:
        run_counts = [[t[s]] for s in range(stages)]
    else:
        clipped = []
        for j, (_, a, b) in enumerate(runs):
            row = []
            for s in range(stages):
                high = model.NewIntVar(a, n_layers, f"h{j}_{s}")
                model.AddMaxEquality(high, [prefix[s], a])
                q = model.NewIntVar(a, b, f"q{j}_{s}")
                model.AddMinEquality(q, [high, b])
                row.append(q)
            clipped.append(row)
        run_counts = [[clipped[j][s] - (clipped[j][s - 1] if s else a) for j, (_, a, _) in enumerate(runs)] for s in range(stages)]
    kind_of_run = [kind for kind, _, _ in runs]

    # forward and backward ns of each stage (chunk_times' composition, integer coefficients)
    mtp = np.zeros(stages)
    mtp[-1] = mtp_layers
    first = np.arange(stages) == 0
    last = np.arange(stages) == stages - 1
    edge_counts = np.zeros((stages, len(ctx.kinds)))
    if ctx.mtp_kind is not None:
        edge_counts[-1, ctx.mtp_kind] = mtp_layers
    const_f, const_b = chunk_times(u, edge_counts, mtp, first, last)  # what a stage holds besides its decoder layers
    fwd = [int(round(u["kind_forward"][k] * TIME_SCALE)) for k in kind_of_run]
    bwd = [int(round((u["kind_total"][k] - u["kind_forward"][k]) * TIME_SCALE)) for k in kind_of_run]
    f_expr = [sum(fwd[j] * run_counts[s][j] for j in range(len(runs))) + int(round(const_f[s] * TIME_SCALE)) for s in range(stages)]
    b_expr = [sum(bwd[j] * run_counts[s][j] for j in range(len(runs))) + int(round(const_b[s] * TIME_SCALE)) for s in range(stages)]
    per_op = (max(u["kind_total"].max(), 0.0) * n_layers + float(const_f.max() + const_b.max())) * TIME_SCALE
    horizon = int(2 * ctx.microbatches * stages * per_op) + 1
    z = model.NewIntVar(0, horizon, "makespan")
    cuts = set()

    def cut(n_f, n_b):
        key = (tuple(n_f.astype(int)), tuple(n_b.astype(int)))
        if key in cuts:
            return False
        cuts.add(key)
        model.Add(z >= sum(int(n_f[s]) * f_expr[s] + int(n_b[s]) * b_expr[s] for s in range(stages) if n_f[s] or n_b[s]))
        return True

    for n_f, n_b in segment_paths(ctx.ops, stages, ctx.microbatches):
        if chunk_spread is None or (n_f == n_b).all():
            cut(n_f, n_b)
    best, best_score = None, None
    for layout in seeds:  # known layouts: their critical paths as cuts, the best that fits as the incumbent
        score = score_layout(ctx, layout)
        for prefer_rank in (False, True):
            cut(*_path_of(ctx, score, prefer_rank))
        if score.fits and (best_score is None or score.pipeline_s - score.pp_exposed_s < best_score.pipeline_s - best_score.pp_exposed_s):
            best, best_score = layout, score

    frag = ctx.mc.fragmentation
    cap = ctx.problem.hardware.memory_bytes
    act = u["kind_activation"]
    for r in range(pp):
        base0, base, trans0, trans, head = rank_memory_model(ctx, r)
        mine = list(range(r, stages, pp))
        kind_count = {k: [] for k in range(len(ctx.kinds))}
        for s in mine:
            for j, k in enumerate(kind_of_run):
                kind_count[k].append(run_counts[s][j])
        if r == (stages - 1) % pp and ctx.mtp_kind is not None:
            base0 += mtp_layers * base[ctx.mtp_kind]
            trans0 += mtp_layers * trans[ctx.mtp_kind]
        base_expr = sum(int(round(base[k] / BYTE_SCALE)) * sum(v) for k, v in kind_count.items() if v) + int(round(base0 / BYTE_SCALE))
        trans_expr = sum(int(round(trans[k] / BYTE_SCALE)) * sum(v) for k, v in kind_count.items() if v) + int(round(trans0 / BYTE_SCALE))
        budget = int(cap // BYTE_SCALE)
        model.Add(base_expr * 1000 + int(round((1 + frag) * 1000)) * trans_expr <= budget * 1000)
        # the MTP modules' layers sit in the last stage: local chunk vp-1 of the last rank
        mtp_act = mtp_layers * act[ctx.mtp_kind] if (r == (stages - 1) % pp and ctx.mtp_kind is not None) else 0.0
        for h in ctx.held[r]:
            act_expr = sum(int(h[c]) * sum(int(round(act[k] / BYTE_SCALE)) * run_counts[s][j] for j, k in enumerate(kind_of_run))
                           for c, s in enumerate(mine) if h[c])
            const = int(round((head + int(h[-1]) * mtp_act) / BYTE_SCALE))
            model.Add(base_expr * 1000 + int(round((1 + frag) * 1000)) * (act_expr + const) <= budget * 1000)
    if graph:  # the schedule's event graph: every op ends after its rank's previous op and its inputs
        ends = {}
        for rank_ops in ctx.ops:
            for op in rank_ops:
                ends[op.kind, op.stage, op.microbatch] = model.NewIntVar(0, horizon, "")
        for rank_ops in ctx.ops:
            previous = None
            for op in rank_ops:
                duration = f_expr[op.stage] if op.kind == "F" else b_expr[op.stage]
                end = ends[op.kind, op.stage, op.microbatch]
                preds = [previous] if previous is not None else []
                if op.kind == "F" and op.stage > 0:
                    preds.append(ends["F", op.stage - 1, op.microbatch])
                if op.kind == "B":
                    preds.append(ends["F", op.stage, op.microbatch])
                    if op.stage < stages - 1:
                        preds.append(ends["B", op.stage + 1, op.microbatch])
                for pred in preds or [0]:
                    model.Add(end >= pred + duration)
                previous = end
            model.Add(z >= previous)
    model.Minimize(z)

    # integer nanoseconds: a path of <= 2*m*stages ops, each off by <= 0.5 ns per rounded term
    slack = 0.5 * 2 * ctx.microbatches * stages * (len(runs) + 1) / TIME_SCALE
    bound, rounds, proven = 0.0, 0, False
    while True:
        remaining = time_limit_s - (time.perf_counter() - start)
        if remaining <= 0 and best is not None:
            break
        solver = cp_model.CpSolver()
        # the first round may take all the time (the incumbent is only a seed); later rounds are capped
        solver.parameters.max_time_in_seconds = max(min(remaining, round_limit_s) if rounds else remaining, 0.05)
        solver.parameters.num_workers = int(workers)
        solver.parameters.random_seed = 0
        model.ClearHints()
        if best is not None:
            for var, value in zip(t, best.decoders):
                model.AddHint(var, value)
        status = solver.Solve(model)
        rounds += 1
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if best is not None:
                break
            raise LayoutError("no layout of this configuration fits the GPU memory" if status == cp_model.INFEASIBLE else "the layout search found no layout within its time limit")
        bound = max(bound, solver.BestObjectiveBound() / TIME_SCALE - slack)  # proven whatever the status
        layout = StageLayout(pp=pp, vp=vp, decoders=tuple(int(solver.Value(v)) for v in t), mtp=tuple(int(x) for x in mtp))
        score = score_layout(ctx, layout)
        makespan = score.pipeline_s - score.pp_exposed_s
        if score.fits and (best_score is None or makespan < best_score.pipeline_s - best_score.pp_exposed_s):
            best, best_score = layout, score
        if not score.fits:  # rounding put it over the capacity: exclude this layout
            model.AddForbiddenAssignments(t, [layout.decoders])
            continue
        if not refine:
            proven = status == cp_model.OPTIMAL
            break
        best_makespan = best_score.pipeline_s - best_score.pp_exposed_s
        if status == cp_model.OPTIMAL and best_makespan <= bound + 2 * slack:
            proven = True
            break
        added = [cut(*_path_of(ctx, score, prefer_rank)) for prefer_rank in (False, True)]
        if not any(added) and status == cp_model.OPTIMAL:
            proven = True  # its own path was already a cut: CP-SAT's value is its makespan
            break
    makespan = best_score.pipeline_s - best_score.pp_exposed_s
    return LayoutSolution(best, best_score.step_time_s, makespan, best_score.bound_s, float(min(bound, makespan) if proven else bound),
                          proven, time.perf_counter() - start, best_score.fits, rounds)


def segment_paths(ops, stages: int, microbatches: int):
    """Paths of the schedule graph through one rank's op list: micro-batch 0's forward through
    stages 0..s-1, rank r's ops from F(s, 0) to B(s', m-1) (s, s' stages of rank r, in its
    order), then the last micro-batch's backward through stages s'-1..0. Each is a lower bound
    for every layout; with s, s' rank r's first and last op it is critical_path_bound_s's term
    for rank r. They tie a stage's forward to every stage before it, which the rank terms alone
    do not (a layout that empties the early stages still waits for the chain)."""
    last = microbatches - 1
    for rank_ops in ops:
        kinds = np.array([op.kind == "F" for op in rank_ops])
        stage_of = np.array([op.stage for op in rank_ops])
        first_f = {op.stage: i for i, op in enumerate(rank_ops) if op.kind == "F" and op.microbatch == 0}
        last_b = {op.stage: i for i, op in enumerate(rank_ops) if op.kind == "B" and op.microbatch == last}
        for s, i in first_f.items():
            for s2, j in last_b.items():
                if j < i:
                    continue
                n_f = np.zeros(stages)
                n_b = np.zeros(stages)
                n_f[:s] += 1
                n_b[:s2] += 1
                seg = slice(i, j + 1)
                np.add.at(n_f, stage_of[seg][kinds[seg]], 1)
                np.add.at(n_b, stage_of[seg][~kinds[seg]], 1)
                yield n_f, n_b


def _path_of(ctx: LayoutContext, score, prefer_rank: bool = False) -> tuple[np.ndarray, np.ndarray]:
    f, b = score.chunk_seconds(ctx.pp, ctx.vp)
    return critical_path(ctx.ops, simulate(ctx.ops, f, b, 0.0), f, b, prefer_rank)


def dp_layout(ctx: LayoutContext) -> tuple[StageLayout | None, float]:
    """MPE eq. 3 for vp = 1: C(s, b) = min over a of max(C(s-1, a), term of stage s holding
    layers [a, b)), a stage allowed only where its rank's exact ledger fits. The term is the
    critical-path bound's: the stages before s (layers [0, a) and their edges, fixed by a) plus
    m times stage s. Returns the best layout and its bound (None, inf when nothing fits): the
    oracle of solve_layout."""
    if ctx.vp != 1:
        raise ValueError("the stage DP covers vp = 1 (a rank's chunks are not contiguous otherwise)")
    pp, n = ctx.pp, len(ctx.kind_of_layer)
    mtp_layers = ctx.problem.model.mtp_layers
    cap = ctx.problem.hardware.memory_bytes
    inf = float("inf")

    cost = {}
    for s in range(pp):
        for a in range(n + 1):
            before = sum(_stage_cost(ctx, q, *((0, a) if q == 0 else (a, a)), float("inf")) for q in range(s))
            for b in range(a, n + 1):
                cost[s, a, b] = before + ctx.microbatches * _stage_cost(ctx, s, a, b, cap)
    best = [[inf] * (n + 1) for _ in range(pp)]
    arg = [[-1] * (n + 1) for _ in range(pp)]
    for b in range(n + 1):
        best[0][b] = cost[0, 0, b]
    for s in range(1, pp):
        for b in range(n + 1):
            for a in range(b + 1):
                value = max(best[s - 1][a], cost[s, a, b])
                if value < best[s][b]:
                    best[s][b], arg[s][b] = value, a
    if best[pp - 1][n] == inf:
        return None, inf
    sizes, b = [], n
    for s in range(pp - 1, 0, -1):
        a = arg[s][b]
        sizes.append(b - a)
        b = a
    sizes.append(b)
    mtp = [0] * pp
    mtp[-1] = mtp_layers
    return StageLayout(pp=pp, vp=1, decoders=tuple(reversed(sizes)), mtp=tuple(mtp)), best[pp - 1][n]


def _stage_cost(ctx: LayoutContext, s: int, a: int, b: int, cap: float) -> float:
    """Forward+backward seconds of stage s (vp = 1: rank s) holding layers [a, b), inf where
    the rank's exact ledger does not fit."""
    k = len(ctx.kinds)
    counts = np.bincount(np.asarray(ctx.kind_of_layer[a:b], dtype=int), minlength=k).astype(float)
    last = s == ctx.pp - 1
    mtp = ctx.problem.model.mtp_layers if last else 0
    if ctx.mtp_kind is not None:
        counts[ctx.mtp_kind] += mtp
    forward, backward = chunk_times(unit_costs(ctx), counts[None, :], np.array([mtp]), np.array([s == 0]), np.array([last]))
    held = float(ctx.held[s].max())  # vp = 1: one chunk, so the count itself
    ledger = rank_ledger(ctx, counts, s == 0, last, mtp, held)
    return float(forward[0] + backward[0]) if float(ledger.peak[0]) <= cap else float("inf")


def regular(layout: StageLayout, spread: int) -> bool:
    """The chunks of every rank differ by at most `spread` layers."""
    return all(max(layout.decoders[r::layout.pp]) - min(layout.decoders[r::layout.pp]) <= spread for r in range(layout.pp))


def enumerate_layouts(ctx: LayoutContext, min_layers: int = 0):
    """Every layout (MTP on the last stage) with its exact score: the brute-force oracle for
    tiny instances."""
    stages, n = ctx.pp * ctx.vp, len(ctx.kind_of_layer)
    mtp = [0] * stages
    mtp[-1] = ctx.problem.model.mtp_layers
    for bars in itertools.combinations(range(n + stages - 1), stages - 1):
        sizes, prev = [], -1
        for bar in (*bars, n + stages - 1):
            sizes.append(bar - prev - 1)
            prev = bar
        if min(sizes) < min_layers:
            continue
        layout = StageLayout(pp=ctx.pp, vp=ctx.vp, decoders=tuple(sizes), mtp=tuple(mtp))
        yield layout, score_layout(ctx, layout)


def two_phase(ctx: LayoutContext, time_limit_s: float, workers: int, seeds: tuple[StageLayout, ...]) -> tuple[LayoutSolution | None, LayoutSolution]:
    """Regular layouts first (chunks of a rank within one layer: a small model that CP-SAT
    certifies or nearly so), then free layouts seeded with that answer, half the time each.
    Returns (the regular search's answer, None where no regular layout fits; the free
    search's), the free one never worse; its bound is the one that holds for every layout."""
    regular_seeds = tuple(s for s in seeds if regular(s, 1))
    first = None
    try:
        first = solve_layout(ctx, time_limit_s / 2, workers, seeds=regular_seeds, chunk_spread=1)
    except LayoutError:
        pass  # no regular layout fits: the free search alone
    more = (first.layout,) if first is not None else ()
    second = solve_layout(ctx, time_limit_s / 2 if first is not None else time_limit_s, workers, seeds=seeds + more)
    return first, second


def layout_report(problem, cfg, time_limit_s: float = 10.0, workers: int = 2) -> tuple[dict, StageLayout | None]:
    """The layout search on one solved configuration (`mofa solve --pipeline-layouts`): a JSON
    report and the layout to launch (None where the search is refused or finds nothing better
    than the configuration's own Megatron split). Step times here are the simulated
    schedule's (costmodel.stage_layout), the split's and the layout's alike."""
    from costmodel.stage_layout import megatron_layout, space_size

    try:
        ctx = layout_context(problem, cfg)
        own = megatron_layout(problem.model.num_layers, problem.model.mtp_layers, ctx.pp, ctx.vp, int(cfg.first_layers[0]), int(cfg.last_layers[0]))
        own_score = score_layout(ctx, own)
        regular_solution, solution = two_phase(ctx, time_limit_s, workers, (own,))
    except LayoutError as exc:
        return {"refused": str(exc)}, None
    better = solution.step_time_s < own_score.step_time_s * (1 - 1e-9) or (solution.fits and not own_score.fits)
    report = {
        "layout": solution.layout.to_megatron(),
        "applied": bool(better),
        "step_time_s": solution.step_time_s,
        "megatron_split_step_time_s": own_score.step_time_s,
        "megatron_split_fits": own_score.fits,
        "gain": own_score.step_time_s / solution.step_time_s - 1.0,
        "makespan_lower_bound_s": solution.lower_bound_s,
        "gap": solution.gap,
        "optimal": solution.optimal,
        "rounds": solution.rounds,
        "search_time_s": solution.solve_s + (regular_solution.solve_s if regular_solution else 0.0),
        "regular": None if regular_solution is None else {
            "note": "among layouts whose chunks on one rank differ by at most one layer",
            "step_time_s": regular_solution.step_time_s, "optimal": regular_solution.optimal, "gap": regular_solution.gap},
        "space_size": float(space_size(len(ctx.kind_of_layer), ctx.pp * ctx.vp)),
    }
    return report, solution.layout if better else None
