"""DualPipeV's layouts (vee_layout_search): rank r holds stages r and 2pp - 1 - r, so the
rank rows read ctx.stages_of, and the schedule graph's nodes are the V's entries (a forward
overlapped with another stage's backward lasts both) with weight-gradient passes of their own: a
path is n_F.F + n_B.B + n_W.W, still linear in the counts (vee_model, vee_rounds). A descent on
the V's schedule graph, then CP-SAT rounds over its path cuts and memory rows, certified by the
exact model (costmodel.stage_layout.score_layout)."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
from ortools.sat.python import cp_model

from costmodel.stage_layout import LayoutContext, StageLayout
from optimizer import cp_solver
from optimizer.layout_bounds import work_bound_s
from optimizer.layout_linear import LinearLayouts, MemoryRows, kind_runs
from optimizer.layout_rounds import (
    LayoutSolution,
    TIME_SCALE,
    gather_rest_vars,
    held_vars,
    layout_makespan,
    memo_scorer,
    path_sum,
    recompute_run_vars,
    round_below,
    run_count_vars,
    with_launched_recompute,
)
from optimizer.layout_seeds import local_search


@dataclasses.dataclass
class VeeModel:
    """DualPipeV's layouts as a CP-SAT model: integer decoder layers per stage `t` (model
    order), the layers of each kind-run per stage `counts`, each stage's forward,
    input-gradient and weight-gradient nanoseconds as linear expressions (LinearLayouts'
    seconds rounded down, so that any path's length in the model is at most its length in
    seconds), and the makespan `z` above each rank's work after the forward chain to it
    (vee_rank_bound's rows). The rounds of vee_rounds add path cuts and memory rows."""

    model: cp_model.CpModel
    t: list
    counts: list
    recomputed: list | None  # recomputed layers of each kind-run per stage (a block N launched), or None
    forward: list
    backward: list
    weight: list
    z: object


def prices_jumps(lin: "LinearLayouts") -> bool:
    """Whether vee_model(jumps=True) prices more than without: stages that pay for holding a
    layer (ZeRO-3's exposed first gather, the gather tables' rest)."""
    return bool(lin.first_forward_s.any() or lin.first_backward_s.any() or lin.gathers is not None)


def vee_model(ctx: LayoutContext, lin: "LinearLayouts", block: int | None = None, jumps: bool = True) -> VeeModel:
    """The V's base model (VeeModel): t, counts, per-stage times and the rank rows
    makespan >= sum_{s < r} F_s + m * R_r (rank r's first op waits for micro-batch 0's forward
    through stages 0..r-1, then the rank runs its m micro-batches' work on its two stages one
    op after another). `block`: the recompute launched on every stage, the first min(N, t_s)
    layers (with_launched_recompute), priced in the input-gradient pass that re-runs them.
    `jumps`: what a stage pays for holding a layer (ZeRO-3's exposed first gather, a boolean per
    stage; with more than one kind of layer the gather tables' rest) in the stage times; without,
    the model prices every layout at most as with (all >= 0): a relaxation, whose rounds run
    ~10x faster."""
    runs = kind_runs(ctx.kind_of_layer)
    stages, n, m = ctx.pp * ctx.vp, len(ctx.kind_of_layer), ctx.microbatches
    model = cp_model.CpModel()
    t = [model.NewIntVar(0, n, f"t{s}") for s in range(stages)]
    prefix = [model.NewIntVar(0, n, f"P{s}") for s in range(stages)]
    for s in range(stages):
        model.Add(prefix[s] == (prefix[s - 1] if s else 0) + t[s])
    model.Add(prefix[-1] == n)
    counts, clipped = run_count_vars(model, t, prefix, runs, n)
    recomputed = None
    if block is not None:
        rc = [model.NewIntVar(0, n, f"r{s}") for s in range(stages)]
        for s in range(stages):
            model.AddMinEquality(rc[s], [t[s], int(block)])
        recomputed = recompute_run_vars(model, rc, prefix, clipped, counts, runs, n)

    def ns(x) -> int:
        return int(math.floor(float(x) * TIME_SCALE))

    def linear(per_run, const, of=counts):
        return [sum(ns(per_run[j]) * of[s][j] for j in range(len(runs))) + ns(const[s]) for s in range(stages)]

    forward = linear(lin.forward_s, lin.const_forward_s)
    backward = linear(lin.backward_s - lin.weight_s, lin.const_backward_s - lin.const_weight_s)  # the input-gradient pass
    if recomputed is not None:
        backward = [x + y for x, y in zip(backward, linear(lin.recompute_s, np.zeros(stages), recomputed))]
    weight = linear(lin.weight_s, lin.const_weight_s)
    if jumps and (lin.first_forward_s.any() or lin.first_backward_s.any()):
        # what a stage pays for holding a layer (ZeRO-3's exposed first gather: in the forward and
        # in the input-gradient pass, LinearLayouts.times), a boolean per stage: without it the
        # model priced DeepSeek-V3's V under FSDP kept after the forward at 42.8 s against 46.5 s
        # (two stages x 120 micro-batches x 6 ms a rank), and its bound stalled 4.6% below
        held = held_vars(model, t)
        forward = [x + max(ns(lin.first_forward_s[s]), 0) * held[s] for s, x in enumerate(forward)]
        backward = [x + max(ns(lin.first_backward_s[s]), 0) * held[s] for s, x in enumerate(backward)]
    per_stage = ns(max(lin.first_forward_s.max(), 0.0) + max(lin.first_backward_s.max(), 0.0)) if jumps else 0  # a stage's jumps, at most
    if jumps and lin.gathers is not None:
        # with more than one kind of layer, the gathers beyond the linear terms by table (the
        # free search's): in the forward and the input-gradient pass, as LinearLayouts.times
        rest_f, rest_b, _, gather_max_s = gather_rest_vars(model, lin, t, prefix, n, np.minimum(lin.most_layers(), n))
        forward = [x + y for x, y in zip(forward, rest_f)]
        backward = [x + y for x, y in zip(backward, rest_b)]
        per_stage += ns(gather_max_s) + 1
    per_layer = max(ns(x) for x in lin.forward_s + lin.backward_s + lin.recompute_s) + 4
    # above any rank's work after any chain: (m + 1) x every layer, constant and jump of the model
    horizon = (m + 1) * (n * per_layer + ns((lin.const_forward_s + lin.const_backward_s).sum()) + stages * (3 + per_stage)) + 1
    z = model.NewIntVar(0, horizon, "makespan")
    for mine in ctx.stages_of:
        model.Add(z >= sum(forward[s] for s in range(int(mine[0]))) + m * sum(forward[s] + backward[s] + weight[s] for s in map(int, mine)))
    return VeeModel(model, t, counts, recomputed, forward, backward, weight, z)


def vee_rank_bound(ctx: LayoutContext, time_limit_s: float = 2.0, workers: int = 2) -> float:
    """A makespan lower bound for every DualPipeV layout of the skeleton, fitting or not: the
    least over the integer layer counts per stage and kind run of vee_model's rank rows
    (recompute left out: it only adds); its proven bound, in seconds. Where the ranks' work is
    uneven in integers (DeepSeek-V3 on pp 4: 61 layers, 3 of them dense, over 4 ranks) it is
    above the ranks' mean work (work_bound_s)."""
    vm = vee_model(ctx, LinearLayouts(ctx), jumps=False)  # the rank rows alone: ~10 ms on DeepSeek-V3's pp 4, 2 s with the jumps
    vm.model.Minimize(vm.z)
    solver = cp_solver.cp_solver(time_limit_s, workers)
    status = cp_solver.solve(solver, vm.model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return 0.0
    return float(solver.BestObjectiveBound()) / TIME_SCALE


def vee_rounds(ctx: LayoutContext, best: StageLayout, score_of, deadline: float, workers: int = 2,
               paths=(), level: int | None = None, jumps: bool = True,
               patience: int | None = None) -> tuple[StageLayout, float, bool, int, bool]:
    """CP-SAT rounds over DualPipeV's layouts, as solve_layout's free rounds: the model (vee_model) asks only for layouts it prices below
    the incumbent `best`; each answer's longest path on the V's schedule graph (ScheduleGraph:
    a node per entry, so a forward overlapped with another stage's backward lasts both, and
    the W passes count on their own: n_F.F + n_B.B + n_W.W) becomes a cut valid for every
    layout, the memory rows it breaks come in (MemoryRows, over the V's ranks), and an answer
    that is truly faster and fits (the exact model confirming) becomes the incumbent. No answer
    at all (INFEASIBLE) certifies it. `paths`: known (n_F, n_B, n_W) paths of the V's graph,
    cuts from the start. `level`: under full recompute, the N every layout recomputes the
    first min(N, layers) of each stage with (Megatron's block method as launched; all layers:
    N = the model's), priced in the times and the memory rows. `jumps`: vee_model's (without,
    the rounds search a relaxation: its bound and its certificate hold, and its answers, priced
    lower, are more). `patience`: stop after that many rounds in a row that neither improve the
    incumbent nor the bound. Until `deadline` (perf_counter seconds), or a Ctrl-C. Where `paths`
    is a set, the cuts found are added to it (each a (n_F, n_B, n_W) of tuples). Returns (the
    best layout, the proven makespan lower bound in seconds, whether certified, rounds, whether
    a Ctrl-C ended it)."""
    lin = LinearLayouts(ctx)
    vm = vee_model(ctx, lin, level, jumps)
    model, stages = vm.model, ctx.pp * ctx.vp
    rows = MemoryRows(model, ctx, lin, vm.counts, vm.recomputed)
    # integer nanoseconds rounded down: a path of <= 3 m stages ops, each under by < 1 ns per
    # term (the layers of each run, the constant; with jumps the first gather and its table's rest)
    held = jumps and prices_jumps(lin)
    slack = 3 * ctx.microbatches * stages * (2 * len(lin.runs) + 1 + 2 * held) / TIME_SCALE

    def vectors(decoders: np.ndarray) -> np.ndarray:
        """[K, 2 stage] decoder counts and the recompute launched on them."""
        decoders = np.asarray(decoders, dtype=np.int64).reshape(-1, stages)
        return np.concatenate([decoders, np.minimum(decoders, level) if level is not None else np.zeros_like(decoders)], axis=1)
    cuts = set()

    def cut(n_f, n_b, n_w) -> bool:
        key = (tuple(n_f.astype(int)), tuple(n_b.astype(int)), tuple(n_w.astype(int)))
        if key in cuts:
            return False
        cuts.add(key)
        model.Add(vm.z >= path_sum((n_f, n_b, n_w), (vm.forward, vm.backward, vm.weight)))
        return True

    def measure(decoders: np.ndarray):
        """(graph makespans, linear fits, [(n_F, n_B, n_W)] paths) of K layouts [K, stage]."""
        screened = lin.screen(vectors(decoders))
        return screened.makespan_s, screened.fits, screened.paths()

    def makespan_of(layout) -> float:
        return layout_makespan(score_of(layout))

    def layout_of(decoders) -> StageLayout:
        layout = StageLayout(pp=best.pp, vp=best.vp, decoders=tuple(int(x) for x in decoders), mtp=best.mtp, vee=True)
        return with_launched_recompute(layout, level) if level is not None else layout

    for path in list(paths) + measure(np.array([best.decoders]))[2]:  # known paths (local_search's, a phase's) and the incumbent's
        cut(*(np.asarray(x) for x in path))
    rows.add_broken(tuple(vectors(best.decoders)[0]))
    model.Minimize(vm.z)
    bound, proven, rounds, interrupted, idle = 0.0, False, 0, False, 0
    try:  # Ctrl-C: the incumbent (it fits) and the bound proven so far, as the deadline would
        while not proven and time.perf_counter() < deadline and (patience is None or idle < patience):
            best_makespan = makespan_of(best)
            status, proved, found = round_below(model, vm.z, vm.t, best_makespan, slack, deadline - time.perf_counter(), workers)
            rounds += 1
            idle = 0 if proved > bound else idle + 1
            bound, proven = max(bound, proved), status == cp_model.INFEASIBLE
            if proven or not found:
                break  # certified, or the time ran out within the round
            answers = np.array(found, dtype=np.int64)
            values, fits, found_paths = measure(answers)
            new = False
            for path in found_paths:
                new |= cut(*path)
            for k in np.argsort(values, kind="stable"):
                if not fits[k]:
                    new |= rows.add_broken(tuple(vectors(answers[k])[0]))
                    continue
                if values[k] >= best_makespan:
                    break
                layout = layout_of(answers[k])
                if score_of(layout).fits and makespan_of(layout) < best_makespan:
                    best, new, idle = layout, True, 0
                    break
                new |= rows.add_broken(tuple(vectors(answers[k])[0]))
            if not new:  # nothing learnt (integer rounding): exclude them
                for answer in found:
                    model.AddForbiddenAssignments(vm.t, [answer])
    except KeyboardInterrupt:
        interrupted = True
    if isinstance(paths, set):
        paths.update(cuts)
    return best, bound, proven, rounds, interrupted


def vee_layout_search(ctx: LayoutContext, time_limit_s: float, start: StageLayout, scores: dict | None = None,
                      workers: int = 2) -> LayoutSolution:
    """DualPipeV's layouts (solve_layout does not search them: check_searchable): local_search
    from `start` over the V's schedule graph and linear memory test (half the time at most; a
    start that does not fit is repaired first), then vee_rounds (CP-SAT over the V's path cuts
    and memory rows, the local search's paths among them) the rest: they certify the makespan
    optimum or improve on it. Where stages pay for holding a layer (ZeRO-3's first gather, the
    gather tables), the rounds of the model without it first (until they stall, half the time
    at most: many fast answers that improve the incumbent), then the model with it from their
    cuts (its bound: DeepSeek-V3's V under FSDP kept after the forward, 4.6% -> 1.4% in 10 s). Under full recompute every layout recomputes what Megatron
    launches (own_layout: block N per stage, N fixed) and only layers move. The bound is the
    best of the rounds', vee_rank_bound's (each rank's work after the forward chain to its
    first stage, least over integer layer counts) and work_bound_s's (the ranks' mean work),
    all for every V layout. On DeepSeek-V3's shipped answer (pp 4, 61 layers) the rounds
    certify the V split in ~0.2 s, where the rank bound alone left 1.20%.
    Ctrl-C ends it as the time limit would, with the best layout so far (the start where the
    local search had not ended) and the bound proven by then (`interrupted`); before any
    layout that fits is known it reaches the caller."""
    start_time = time.perf_counter()
    score_of = memo_scorer(ctx, scores)

    def makespan_of(layout: StageLayout) -> float:
        return layout_makespan(score_of(layout))

    level = None
    if ctx.recompute_allowed:  # the block method's N, or every layer
        level = int(ctx.cfg.recompute_layers[0]) if int(ctx.cfg.recompute_method[0]) == 1 else len(ctx.kind_of_layer)
        start = with_launched_recompute(start, level)
    best, mean, ranks = start, work_bound_s(ctx), 0.0
    rounds, found, proven, interrupted, moves = 0, 0.0, False, False, 0
    try:
        # the bound first (a fifth of the time at most; on DeepSeek-V3's pp 4 it is optimal in ~10 ms)
        ranks = vee_rank_bound(ctx, min(2.0, max(0.2 * time_limit_s, 0.05)), workers)
        remaining = time_limit_s - (time.perf_counter() - start_time)
        decoders, _, paths, recompute = local_search(ctx, start.decoders, 0.5 * remaining, start_recompute=start.recompute, fixed_level=level)
        descended = StageLayout(pp=start.pp, vp=start.vp, decoders=decoders, mtp=start.mtp, recompute=recompute, vee=True)
        if score_of(descended).fits and (not score_of(start).fits or makespan_of(descended) < makespan_of(start)):
            best = descended
        moves = int(sum(abs(a - b) for a, b in zip(best.decoders, start.decoders)) // 2)
        if score_of(best).fits:
            deadline = start_time + time_limit_s
            lin = LinearLayouts(ctx)
            if prices_jumps(lin):
                # stages pay for holding a layer: the rounds of the model without it first (a
                # relaxation, ~10x faster a round: many answers, which improve the incumbent),
                # until they stall or half the time is gone, then the model with it, from their
                # cuts, for the bound. DeepSeek-V3's V under FSDP kept after the forward: 43.51 s
                # at 4.6% (the relaxation alone), 43.70 s at 1.85% (the model with it alone)
                known = {tuple(tuple(int(v) for v in x) for x in path) for path in paths}
                half = time.perf_counter() + 0.5 * (deadline - time.perf_counter())
                best, found, proven, rounds, interrupted = vee_rounds(ctx, best, score_of, half, workers, known, level, jumps=False,
                                                                      patience=10)
                paths = known
            if not proven and not interrupted:
                best, bound, proven, more, interrupted = vee_rounds(ctx, best, score_of, deadline, workers, paths, level)
                found, rounds = max(found, bound), rounds + more
    except KeyboardInterrupt:
        if not score_of(best).fits:  # nothing that fits to give back
            raise
        interrupted = True
    best_score = score_of(best)
    makespan = layout_makespan(best_score)
    lower = min(max(mean, ranks, found), makespan)
    source = "vee-cp-sat" if found >= max(mean, ranks) else "vee-rank" if ranks > mean else "vee-work"
    return LayoutSolution(best, best_score.step_time_s, makespan, best_score.bound_s, lower, proven or lower >= makespan * (1 - 1e-9),
                          time.perf_counter() - start_time, best_score.fits, moves + rounds, source, interrupted)
