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

from costmodel.stage_layout import (
    LayoutContext,
    LayoutError,
    StageLayout,
    chunk_times,
    rank_ledger,
    score_layout,
    unit_costs,
)

TIME_SCALE = 1e9  # integer nanoseconds in the CP-SAT model
BYTE_SCALE = 1024.0  # integer KiB


@dataclasses.dataclass(frozen=True)
class LayoutSolution:
    layout: StageLayout
    step_time_s: float  # the exact model's (simulated schedule)
    makespan_s: float  # the simulated pipeline makespan of the layout
    bound_s: float  # the layout's critical-path bound (CP-SAT's objective, exact arithmetic)
    lower_bound_s: float  # proven: no layout's makespan is below this (CP-SAT's bound on the objective)
    optimal: bool  # CP-SAT proved its objective optimal
    solve_s: float
    fits: bool

    @property
    def gap(self) -> float:
        """Proven optimality gap of the layout's simulated makespan: every layout's makespan is
        at least its critical-path bound, which is at least lower_bound_s."""
        return max(0.0, self.makespan_s - self.lower_bound_s) / self.makespan_s


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


def solve_layout(ctx: LayoutContext, time_limit_s: float = 10.0, workers: int = 2, min_layers: int = 0) -> LayoutSolution:
    """The layout minimising the exact step time of `ctx`'s skeleton under every rank's memory;
    MTP modules on the last stage. `min_layers`: the least decoder layers per stage."""
    start = time.perf_counter()
    pp, vp = ctx.pp, ctx.vp
    stages = pp * vp
    n_layers = len(ctx.kind_of_layer)
    mtp_layers = ctx.problem.model.mtp_layers
    u = unit_costs(ctx)
    runs = kind_runs(ctx.kind_of_layer)
    model = cp_model.CpModel()
    t = [model.NewIntVar(min_layers, n_layers, f"t{s}") for s in range(stages)]
    prefix = [model.NewIntVar(0, n_layers, f"P{s}") for s in range(stages)]
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

    # stage work (ns) and memory pieces
    def stage_const(s):
        c = 2.0 * u["overhead"]
        if s == 0:
            c += u["embedding_total"]
        if s == stages - 1:
            c += u["head_total"] + mtp_layers * (u["mtp_extra"] + (u["kind_total"][ctx.mtp_kind] if ctx.mtp_kind is not None else 0.0))
        return c

    tot = [int(round(u["kind_total"][k] * TIME_SCALE)) for k in kind_of_run]
    work = [sum(tot[j] * run_counts[s][j] for j in range(len(runs))) + int(round(stage_const(s) * TIME_SCALE)) for s in range(stages)]
    horizon = (ctx.microbatches + 1) * (int(sum(u["kind_total"].max() for _ in range(n_layers)) * TIME_SCALE + sum(stage_const(s) for s in range(stages)) * TIME_SCALE) + 1)
    z = model.NewIntVar(0, horizon, "bottleneck")
    frag = ctx.mc.fragmentation
    cap = ctx.problem.hardware.memory_bytes
    act = u["kind_activation"]
    for r in range(pp):
        # critical_path_bound_s: chunk 0 of the ranks before r, then m times rank r's work
        model.Add(z >= sum(work[q] for q in range(r)) + ctx.microbatches * sum(work[s] for s in range(r, stages, pp)))
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
    model.Minimize(z)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = int(workers)
    solver.parameters.random_seed = 0
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise LayoutError("no layout of this configuration fits the GPU memory" if status == cp_model.INFEASIBLE else "the layout search found no layout within its time limit")
    decoders = tuple(int(solver.Value(v)) for v in t)
    mtp = [0] * stages
    mtp[-1] = mtp_layers
    layout = StageLayout(pp=pp, vp=vp, decoders=decoders, mtp=tuple(mtp))
    score = score_layout(ctx, layout)
    # integer nanoseconds: each of the <= (m+1)*layers rounded terms is off by at most 0.5 ns
    slack = 0.5 * (ctx.microbatches + 1) * (n_layers + stages) / TIME_SCALE
    bound = solver.BestObjectiveBound() / TIME_SCALE - slack
    makespan = score.pipeline_s - score.pp_exposed_s
    return LayoutSolution(layout, score.step_time_s, makespan, score.bound_s, float(bound), status == cp_model.OPTIMAL,
                          time.perf_counter() - start, score.fits)


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
