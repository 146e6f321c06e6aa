"""Where the layout search starts (optimizer.layout_search): seeds whose chunk rounds are
balanced under the memory rows (round_seeds), the layers poured into the ranks that still fit
them (fill_seed), layouts that pack each rank's layers into its last chunks (packed_seeds, for
one recompute N), and the local search that descends from a seed on the schedule graph,
scoring its moves in batches (local_search)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import numpy as np
from ortools.sat.python import cp_model

from costmodel.stage_layout import LayoutContext, StageLayout, stage_ranks
from optimizer import cp_solver
from optimizer.layout_linear import BYTE_SCALE, LinearLayouts
from optimizer.layout_rounds import Answers, TIME_SCALE
from optimizer.schedule_graph import schedule_graph


ROUND_STARTS = 3  # local searches from round_seeds' answers where no given layout fits


def packed_seeds(ctx: LayoutContext, levels) -> list[StageLayout]:
    """Seeds for one --recompute-num-layers N (uniform recompute): every rank's layers packed
    into its last k chunks (k = 1 .. vp), spread evenly by count over those stages with the
    remainder taken off the last ones (the head's), each recomputing min(N, its layers) for
    each N in `levels`. With one N a stage recomputes up to N of its layers whatever it holds, so
    fewer, fuller chunks recompute fewer layers, and the later chunks hold fewer micro-batches
    in flight: Llama 3 405B cp 1 on pp 16 x vp 8 with N = 1, the last four chunks of every rank
    holding two layers (one recomputed) run a 7.39 s step, where recomputing all 126 layers of
    the even split runs 7.69 s and the local search does not leave it (single moves do not)."""
    pp, vp = ctx.pp, ctx.vp
    n = len(ctx.kind_of_layer)
    mtp = ctx.problem.model.mtp_layers
    out = []
    for k in range(1, vp + 1):
        used = sorted(c * pp + r for c in range(vp - k, vp) for r in range(pp))
        base, extra = divmod(n, len(used))
        sizes = [0] * (pp * vp)
        for i, stage in enumerate(used):
            sizes[stage] = base + (i < extra)
        layout = StageLayout.from_stage_sizes(pp, vp, sizes, mtp)
        out.extend(layout.with_recompute([min(level, d) for d in sizes]) for level in levels)
    return list(dict.fromkeys(out))


def fill_seed(ctx: LayoutContext, lin: LinearLayouts) -> StageLayout | None:
    """A seed for a skeleton whose given layouts do not fit, one kind of decoder layer, no
    recompute: the layers poured into the ranks one at a time, each to the rank with the least
    work so far (the embedding's and the head's counted in layers) among those that still fit
    one more, each rank's layers spread as evenly as fits over its last chunks (the most chunks
    whose even share passes its linear memory rows: later chunks hold fewer micro-batches in
    flight). Near the split where memory binds on a few ranks, where round_seeds' answers pile
    the layers into the last chunks of every rank: Llama 3 405B cp 1 under ZeRO-2 (ranks 1-9
    over by up to 2.2 GiB) descends from it to a 6.94 s makespan, from round_seeds' to 7.41 s in
    60 s. None where the ranks together cannot hold every layer so."""
    pp, vp, stages = ctx.pp, ctx.vp, ctx.pp * ctx.vp
    n = len(ctx.kind_of_layer)
    rank_of = np.array(stage_ranks(pp, vp, ctx.vee))
    mine = [np.flatnonzero(rank_of == r) for r in range(pp)]  # each rank's stages, chunk order

    def spread(total: int, k: int) -> np.ndarray:
        """`total` layers over a rank's last k chunks, the remainder on the last ones."""
        share = np.zeros(vp, dtype=np.int64)
        share[vp - k:] = total // k
        share[vp - total % k:] += 1 if total % k else 0
        return share

    # every (total, chunks) placement of a rank alone in a layout, a rank's at once: its memory
    # rows read only its own chunks
    options = [(total, k) for total in range(1, n + 1) for k in range(vp, 0, -1)]
    placement = {}  # (rank, total): the most chunks that fit
    for r in range(pp):
        layouts = np.zeros((len(options), 2 * stages), dtype=np.int64)
        for row, (total, k) in enumerate(options):
            layouts[row, mine[r]] = spread(total, k)
        fits = lin.excess(lin.layout_counts(layouts)[0])[:, r] <= 0
        for row in np.flatnonzero(fits):
            total, k = options[row]
            placement.setdefault((r, total), spread(total, k))
    per_layer = float(lin.forward_s[0] + lin.backward_s[0])
    work = np.array([float((lin.const_forward_s + lin.const_backward_s)[st].sum()) / per_layer for st in mine])
    totals = np.zeros(pp, dtype=np.int64)
    for _ in range(n):
        open_ranks = [r for r in range(pp) if (r, int(totals[r]) + 1) in placement]
        if not open_ranks:
            return None
        r = min(open_ranks, key=lambda r: (totals[r] + work[r], r))
        totals[r] += 1
    decoders = np.zeros(stages, dtype=np.int64)
    for r in range(pp):
        if totals[r]:
            decoders[mine[r]] = placement[r, int(totals[r])]
    return StageLayout(pp=pp, vp=vp, decoders=tuple(int(x) for x in decoders), mtp=ctx.mtp_on_last, vee=ctx.vee)


def round_seeds(ctx: LayoutContext, lin: LinearLayouts, time_limit_s: float, min_layers: int = 0,
                max_layers: int | None = None, chunk_spread: int | None = None, random_seed: int = 0,
                stop_when: Callable[[], bool] | None = None) -> list[StageLayout]:
    """Seeds for a skeleton whose given layouts do not fit: CP-SAT's answers for the layout (and,
    where the skeleton allows it, per-stage recompute) that minimises the sum over the chunk rounds of
    their slowest stage, plus the busiest rank, under every rank's linear memory rows -- a
    small CP-SAT model without the schedule's paths, one kind of decoder layer. In an
    interleaved schedule the ranks run chunk c of every micro-batch as one round that its
    slowest stage paces, so a layout whose rounds are balanced flows, where one that fits by
    piling the layers of the ranks with many micro-batches in flight into a few chunks stalls.
    Llama 3 405B at cp 1 on pp 16 x vp 8 (even split 90.6 GiB of 79.6): the search from the
    given seeds, repaired, stalls at a 16.5 s step; from these seeds it reaches 9.6-10.2 s.
    `random_seed` picks among CP-SAT's near-optimal answers. Returns every answer the solve
    found, the best last (its earlier ones are other starts for a local search: the better start
    is not the better end); empty where the time runs out without a layout or none fits the rows.
    `stop_when`: cp_solver.solve's (round_seed_pair stops the other solve with it)."""
    pp, vp = ctx.pp, ctx.vp
    stages = pp * vp
    n_layers = len(ctx.kind_of_layer)
    recompute = lin.recompute
    model = cp_model.CpModel()
    high = n_layers if max_layers is None else max_layers
    t = [model.NewIntVar(min_layers, high, f"t{s}") for s in range(stages)]
    rc = [model.NewIntVar(0, high if recompute else 0, f"r{s}") for s in range(stages)]
    model.Add(sum(t) == n_layers)
    for s in range(stages):
        model.Add(rc[s] <= t[s])
    const = (lin.const_forward_s + lin.const_backward_s) * TIME_SCALE
    per_layer = int(round(float(lin.forward_s[0] + lin.backward_s[0]) * TIME_SCALE))
    per_recompute = int(round(float(lin.recompute_s[0]) * TIME_SCALE))
    stage_ns = [per_layer * t[s] + per_recompute * rc[s] + int(round(const[s])) for s in range(stages)]
    cap = int(lin.capacity // BYTE_SCALE)

    def kib(x):  # costs rounded up, so that what fits here fits the linear test
        return int(math.ceil(float(x) * (1 + lin.frag) / BYTE_SCALE))

    for r in range(pp):
        mine = range(r, stages, pp)
        if chunk_spread is not None:
            low = model.NewIntVar(0, n_layers, "")
            model.AddMinEquality(low, [t[s] for s in mine])
            for s in mine:
                model.Add(t[s] <= low + chunk_spread)
        base0, base, trans0, trans, head, chunk_act = lin.memory[r]
        layers = sum(t[s] for s in mine)
        # the largest layer's bytes, PyTorch pipelining's buffers and activation offload's sets in
        # transit at their most as constants (upper bounds: what fits here fits the linear test and
        # the ledger)
        fixed = (int(math.ceil((base0 + float(lin.largest[r].max(initial=0.0)) + lin.buffer_spread[r]) / BYTE_SCALE))
                 + int(math.ceil(base[0] / BYTE_SCALE)) * layers)
        model.Add(fixed + kib(trans0) + kib(trans[0]) * layers <= cap)
        working = 0
        if recompute:
            y = model.NewBoolVar(f"y{r}")
            model.Add(sum(rc[s] for s in mine) <= n_layers * y)
            working = kib(lin.u["kind_working"][0]) * y
        for h in ctx.held[r]:
            act = sum(kib(h[c] * lin.act[0]) * t[s] - (kib(h[c] * lin.dropped[0]) * rc[s] if recompute else 0) for c, s in enumerate(mine))
            model.Add(fixed + act + kib(head + h @ chunk_act + float(lin.in_transit[r].max(initial=0.0))) + working <= cap)
    rounds = []
    for c in range(vp):
        slowest = model.NewIntVar(0, int(2 * n_layers * (per_layer + per_recompute) + const.max()) + 1, f"M{c}")
        for s in range(c * pp, (c + 1) * pp):
            model.Add(slowest >= stage_ns[s])
        rounds.append(slowest)
    busiest = model.NewIntVar(0, int(vp * (2 * n_layers * (per_layer + per_recompute) + const.max())) + 1, "busy")
    for r in range(pp):
        model.Add(busiest >= sum(stage_ns[s] for s in range(r, stages, pp)))
    model.Minimize(sum(rounds) + busiest)
    # one worker and a deterministic time limit: the same seeds on every run. The wall-clock cap
    # is a guard, 4x the deterministic limit: on 2 shared cores 0.5 deterministic seconds took
    # 0.9-2.0 s, and a 2x cap cut the solve short by the clock, so that Llama 3 405B cp 1's seeds
    # (limit 0.3 s, random seed 1) changed from run to run (1, 1 and 2 answers, against 3)
    solver = cp_solver.cp_solver(max(4 * time_limit_s, 0.1), 1, random_seed)
    solver.parameters.max_deterministic_time = max(time_limit_s, 0.05)
    answers = Answers(t + rc)
    if cp_solver.solve(solver, model, answers, stop_when=stop_when) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return []
    return [StageLayout(pp=pp, vp=vp, decoders=a[:stages], mtp=ctx.mtp_on_last, recompute=a[stages:]) for a in answers.answers]


def round_seed_pair(ctx: LayoutContext, lin: LinearLayouts, time_limit_s: float, min_layers: int = 0,
                    max_layers: int | None = None, chunk_spread: int | None = None) -> list[StageLayout]:
    """round_seeds with random seeds 0 and 1, the answers of the first then the second's, the
    two solves side by side: each has one worker and a deterministic time limit, so the answers
    are those of the two one after the other, in about half the wall time on two cores (CP-SAT
    releases the GIL while it solves; Llama 3 405B cp 1: 2.2-2.6 s one after the other), time
    the search's CP-SAT rounds get. A Ctrl-C stops both."""
    stop = threading.Event()
    done, other = cp_solver.in_thread(
        lambda: round_seeds(ctx, lin, time_limit_s, min_layers, max_layers, chunk_spread, random_seed=1, stop_when=stop.is_set), "round-seeds")
    try:
        first = round_seeds(ctx, lin, time_limit_s, min_layers, max_layers, chunk_spread, random_seed=0)
        while not done.wait(0.05):
            pass
    except BaseException:  # a Ctrl-C: the other solve stops too, then it goes on up
        stop.set()
        while not done.wait(0.05):
            pass
        raise
    return first + cp_solver.result(other)


def local_search(ctx: LayoutContext, start: tuple[int, ...], time_limit_s: float, batch: int = 128,
                 lin: LinearLayouts | None = None, spread: int | None = None, min_layers: int = 0,
                 max_layers: int | None = None, max_moves: int = 1024, neighbour_paths: int = 32,
                 start_recompute: tuple[int, ...] | None = None,
                 uniform_recompute: bool = False, fixed_level: int | None = None) -> tuple[tuple[int, ...], float, list[tuple[np.ndarray, ...]], tuple[int, ...]]:
    """Descent over single-layer moves from `start`: moves of one layer from any stage to any
    other (the `max_moves` that most shorten the current longest path, and as many recompute
    moves), one layer from one chunk to another on every rank that holds one there (every such
    move: parallel longest paths through a chunk of several ranks), and, where the skeleton allows full recompute, one more or one fewer recomputed layer in a
    stage or one recomputed layer moved to another stage (with `uniform_recompute`, one more or
    fewer N for every stage: r_s = min(N, layers_s), Megatron's one --recompute-num-layers;
    `fixed_level`: that N, kept, so that only layers move),
    screened by the linear memory test, scored in batches of `batch` on the schedule graph; the best
    improving move of the first batch that has one is taken (improving: a shorter makespan, or
    the same and a smaller sum of op ends). A batch of 128 costs about 1.5x one of 64 on Llama 3
    405B's 4,096-op graph, whose 286 levels' per-call overhead dominates, and takes the best of
    twice the moves: from the four starts of its cp 1 search the descents converge in 7.2 s
    against 9.8 s, under ZeRO-2 in 7.3 s against 10.5 s and with offload in 15.3 s against
    18.4 s, to the same or better ends (within the search's 10 s, ZeRO-2's answer 7.45-7.70 ->
    6.99 s and offload's 8.09 -> 7.81 s in standalone runs). Descending, only the moves that fit
    are scored on the graph, those of as many batches as the last step decided in one graph call,
    the batches still decided one at a time (the same descent): from round_seeds' first four
    starts, ZeRO-2's descents converge in 7.8 s against 13.8 s, offload's two in 3.2 s against
    3.9 s, cp 1's four in 1.8 s against 4.1 s. A layer move keeps the stages' recompute counts, clipped to their layers. A start
    that does not fit is first repaired (least memory over the capacity, summed over ranks).
    Returns the best layout's decoder counts, its makespan, the longest paths of the layouts it
    moved through and of the best neighbours of the last one (cuts that are tight near the
    local optimum: the nearest `batch` always, the rest of the `neighbour_paths` while the time
    lasts; scored whatever the time, DeepSeek-V3's 1,000 on pp 16 x vp 2 ran a 1.5 s descent,
    converged in ~0.6 s, to 2.0-2.5 s), and its recompute counts. Moves keep `min_layers` <= a stage <=
    `max_layers` and, with `spread`, a rank's chunks within that many layers (solve_layout's
    constraints). Deterministic (fixed seed)."""
    t0 = time.perf_counter()
    lin = lin or LinearLayouts(ctx)
    graph = schedule_graph(ctx)
    stages = lin.stages
    rng = np.random.default_rng(0)
    decoders = np.array(start, dtype=np.int64)
    recompute = np.zeros(stages, dtype=np.int64) if start_recompute is None else np.minimum(np.array(start_recompute, dtype=np.int64), decoders)
    uniform = lin.recompute and (uniform_recompute or fixed_level is not None)
    level = int(recompute.max(initial=0)) if fixed_level is None else int(fixed_level)  # uniform: N
    if uniform:
        recompute = np.minimum(level, decoders)
    current = np.concatenate([decoders, recompute])

    def measure(layouts):
        counts, recomputed = lin.layout_counts(layouts)
        recomputed = recomputed if lin.recompute else None
        return counts, recomputed

    def measured(seconds):
        """(makespan, sum of every op's end) of each layout: the second breaks ties, so that the
        descent crosses a plateau of equal makespans where several longest paths must all be
        shortened (two recomputed layers moved off two parallel paths: Llama 3 405B cp 1,
        5.770 -> 5.757 s), and stops, since the pair only ever decreases."""
        ends = graph.ends(*seconds)[:-1]
        return ends.max(axis=0), ends.sum(axis=0)

    counts, recomputed = measure(current[None])
    seconds = lin.pass_times(counts, recomputed)
    values, totals = measured(seconds)
    value, total = float(values[0]), float(totals[0])
    over = lin.excess(counts, recomputed)[0]  # [rank] bytes over the capacity: a start that does not fit is repaired first
    headroom = lin.headroom(counts, recomputed)[0]
    paths = [graph.path(*(x[:, 0] for x in seconds))]
    main_run = int(np.argmax([end - begin for _, begin, end in lin.runs]))  # the kind most layers have
    layer_s = lin.pass_layer_s(main_run)
    rank_of = np.array(stage_ranks(ctx.pp, ctx.vp, ctx.vee))
    chunk_stage = np.array([list(mine) for mine in ctx.stages_of], dtype=np.int64)  # [rank, chunk] -> stage
    # bytes one more recomputed layer of the main kind takes off its rank's peak (the most
    # micro-batches its chunk has in flight times what it stops keeping)
    drop_bytes = np.zeros(stages)
    for r, mine in enumerate(ctx.stages_of):
        for c, s in enumerate(mine):
            drop_bytes[s] = (1 + lin.frag) * lin.dropped[main_run] * ctx.held[r][:, c].max()
    depth = 1  # batches of moves whose layouts that fit are scored in one graph call (scored)
    while time.perf_counter() - t0 < time_limit_s:
        # every move, the most promising first: off a rank over its memory, then those that
        # shorten the current longest path most, ties at random. A layer move from stage a to
        # c gains (ops of the path on a minus on c) x a layer; a recompute move on stage a
        # gains or loses the path's backward ops on a x a layer's recompute.
        dec, rec = current[:stages], current[stages:]
        n_b = paths[-1][1]  # (under DualPipeV the path's W passes follow)
        weight = sum(n * s for n, s in zip(paths[-1], layer_s)) + n_b * lin.recompute_s[main_run] * (rec > 0)
        a, c = np.meshgrid(np.arange(stages), np.arange(stages), indexing="ij")
        ok = (a != c) & (dec[a] > 0)
        a, c = a[ok], c[ok]
        kind = np.zeros(len(a), dtype=np.int64)  # 0: a layer a -> c; 1: recompute one more on a; 2: one fewer; 4: a recomputed layer a -> c
        room = np.maximum(-headroom, 0.0)[rank_of]  # [stage] bytes over
        free = np.maximum(headroom, 0.0)[rank_of]
        gain = weight[a] - weight[c]
        saved = np.minimum(lin.layer_bytes[a], room[a]) - np.maximum(lin.layer_bytes[c] - free[c], 0.0)
        if ctx.vp > 1:
            # one layer from chunk a to chunk c on every rank whose chunk a holds one (kind 5, a
            # and c chunk indices): where parallel longest paths run through the same chunk of
            # several ranks, no single move shortens the makespan and the tie-break by the sum of
            # op ends may not lead across (Llama 3 405B cp 1, free layouts: six ranks' layers in
            # chunk 2, a 9.77 s local optimum; moved to chunk 6 together, 9.20 s)
            ca, cc = np.meshgrid(np.arange(ctx.vp), np.arange(ctx.vp), indexing="ij")
            ca, cc = ca[ca != cc], cc[ca != cc]
            held = dec[chunk_stage] > 0  # [rank, chunk]
            row_gain = np.array([(weight[chunk_stage[:, x]] - weight[chunk_stage[:, y]])[held[:, x]].sum() for x, y in zip(ca, cc)])
            row_ok = held[:, ca].any(axis=0)
            row_order = np.argsort(-row_gain[row_ok], kind="stable")
            chunk_moves = [(5, int(x), int(y)) for x, y in zip(ca[row_ok][row_order], cc[row_ok][row_order])]
        else:
            chunk_moves = []
        if lin.recompute:
            slow = n_b * lin.recompute_s[main_run]
            if uniform:
                up, down = np.array([level < dec.max()]), np.array([level > 0])
                if fixed_level is not None:
                    up[:], down[:] = False, False
                up_gain, down_gain = -slow[dec > level].sum(), slow[dec >= level].sum() * (level > 0)
                up_saved = np.minimum(drop_bytes, room)[dec > level].sum()
                down_saved = -np.maximum(drop_bytes - free, 0.0)[(dec >= level) & (level > 0)].sum()
                r_a = np.array([-1, -1])
                r_kind = np.array([1, 2])
                r_ok = np.concatenate([up, down])
                r_gain, r_saved = np.array([up_gain, down_gain]), np.array([up_saved, down_saved])
            else:
                r_a = np.concatenate([np.arange(stages), np.arange(stages)])
                r_kind = np.repeat([1, 2], stages)
                r_ok = np.concatenate([rec < dec, rec > 0])
                r_gain = np.concatenate([-slow, slow])
                r_saved = np.concatenate([np.minimum(drop_bytes, room), -np.maximum(drop_bytes - free, 0.0)])
            r_c = r_a
            if not uniform:
                # and one recomputed layer moved from stage a to stage c (kind 4): where memory
                # binds, one fewer alone does not fit and one more alone is slower, so the
                # recompute stays where the descent first put it (Llama 3 405B cp 1, per-chunk
                # recompute: 5.809 s; moving it off the longest path, 5.770 s)
                ma, mc = np.meshgrid(np.arange(stages), np.arange(stages), indexing="ij")
                moved = (ma != mc) & (rec[ma] > 0) & (rec[mc] < dec[mc])
                ma, mc = ma[moved], mc[moved]
                r_a, r_c = np.concatenate([r_a, ma]), np.concatenate([r_a, mc])
                r_kind = np.concatenate([r_kind, np.full(len(ma), 4)])
                r_ok = np.concatenate([r_ok, np.ones(len(ma), bool)])
                r_gain = np.concatenate([r_gain, slow[ma] - slow[mc]])
                r_saved = np.concatenate([r_saved, np.minimum(drop_bytes[mc], room[mc]) - np.maximum(drop_bytes[ma] - free[ma], 0.0)])
            a = np.concatenate([a, r_a[r_ok]])
            c = np.concatenate([c, r_c[r_ok]])
            kind = np.concatenate([kind, r_kind[r_ok]])
            gain = np.concatenate([gain, r_gain[r_ok]])
            saved = np.concatenate([saved, r_saved[r_ok]])
        if over.sum() > 0:
            # repairing: the moves that take most bytes off the ranks over their capacity for
            # the fewest they add where there is no room (a layer weighs more on a chunk with
            # more micro-batches in flight: the first chunks of the first ranks)
            order = np.lexsort((rng.permutation(len(a)), -gain, -saved))
        else:
            order = np.lexsort((rng.permutation(len(a)), -gain))
        # the most promising max_moves layer moves and as many recompute moves, in that order:
        # capped together, the layer moves' larger estimates crowd out every recompute move;
        # then, where none of them improves, every chunk move (at most vp * (vp - 1)), in batches
        # of their own and outside the single moves' random tie-break: a descent that single
        # moves still improve follows the same path as without them (mixed in, they led the
        # per-chunk recompute descent of tests/integration/test_layout_starts.py to 5.805 s
        # instead of 5.792 s)
        layer = kind[order] == 0
        keep = np.zeros(len(order), bool)
        keep[np.flatnonzero(layer)[:max_moves]] = True
        keep[np.flatnonzero(~layer)[:max_moves]] = True
        order = order[keep]
        single = list(zip(kind[order].tolist(), a[order].tolist(), c[order].tolist()))
        improved = False
        neighbours = []

        def build(moves):
            """The layouts of `moves` from the current one, those within the constraints."""
            cand = np.repeat(current[None], len(moves), axis=0)
            levels = np.full(len(moves), level)
            for row, (k, a, c) in enumerate(moves):
                if k == 0:
                    cand[row, a] -= 1
                    cand[row, c] += 1
                    cand[row, stages + a] = min(cand[row, stages + a], cand[row, a])
                elif k == 5:  # chunk a -> chunk c on every rank whose chunk a holds a layer
                    src, dst = chunk_stage[:, a], chunk_stage[:, c]
                    src, dst = src[cand[row, src] > 0], dst[cand[row, src] > 0]
                    cand[row, src] -= 1
                    cand[row, dst] += 1
                    cand[row, stages + src] = np.minimum(cand[row, stages + src], cand[row, src])
                elif a < 0:  # uniform N
                    levels[row] += 1 if k == 1 else -1
                elif k == 4:  # a recomputed layer from a to c
                    cand[row, stages + a] -= 1
                    cand[row, stages + c] += 1
                else:
                    cand[row, stages + a] += 1 if k == 1 else -1
            if uniform:
                cand[:, stages:] = np.minimum(levels[:, None], cand[:, :stages])
            dec_c = cand[:, :stages]
            keep = (dec_c.min(axis=1) >= min_layers) & (dec_c.max(axis=1) <= (max_layers if max_layers is not None else np.inf))
            if spread is not None:
                per_rank = dec_c.reshape(len(cand), ctx.vp, ctx.pp)
                keep &= (per_rank.max(axis=1) - per_rank.min(axis=1) <= spread).all(axis=1)
            return cand[keep], levels[keep]

        def scored():
            """Each batch of moves, in order, with its layouts scored: (layouts, their N, their
            bytes over per rank, seconds per pass, makespans, sums of op ends). Descending, only
            the moves that fit (only they can be taken; the memory test costs about a quarter of
            the graph), and those of up to `depth` batches in one graph call, whose per-call
            overhead dominates a batch's few that fit (Llama 3 405B cp 1 under ZeRO-2, about 1
            move in 7): the batches are still decided one at a time, so the descent is the same."""
            pending = []

            def flush():
                seconds = lin.pass_times(*measure(np.concatenate([part[0] for part in pending])))
                values, totals = measured(seconds)
                at = 0
                for cand, levels, cand_over in pending:
                    rows = slice(at, at + len(cand))
                    at += len(cand)
                    yield cand, levels, cand_over, tuple(x[:, rows] for x in seconds), values[rows], totals[rows]
                pending.clear()

            for moves in batches:
                cand, levels = build(moves)
                if not len(cand):
                    continue
                counts, recomputed = measure(cand)
                cand_over = lin.excess(counts, recomputed)
                if over.sum() > 0:  # repairing: every move
                    seconds = lin.pass_times(counts, recomputed)
                    yield (cand, levels, cand_over, seconds, *measured(seconds))
                    continue
                fit = cand_over.sum(axis=1) <= 0
                if not fit.any():
                    continue
                pending.append((cand[fit], levels[fit], cand_over[fit]))
                if len(pending) >= depth or sum(len(part[0]) for part in pending) >= batch:
                    yield from flush()
            if pending:
                yield from flush()

        batches = [single[i:i + batch] for i in range(0, len(single), batch)] + [chunk_moves[i:i + batch] for i in range(0, len(chunk_moves), batch)]
        decided = 0  # batches decided this step: the next step scores that many at once (the same choices)
        for cand, levels, cand_over, seconds, values, totals in scored():
            decided += 1
            if over.sum() > 0:  # repairing: least total excess, then the shortest
                k = int(np.lexsort((values, cand_over.sum(axis=1)))[0])
                better = cand_over[k].sum() < over.sum()
            else:  # descending: every layout here fits (scored)
                neighbours.extend((values[k], tuple(cand[k])) for k in range(len(cand)))
                # the shortest, then the least total (makespans within float noise tie)
                rounded = np.round(values / (value * 1e-12))
                k = int(np.lexsort((totals, rounded))[0])
                tied = abs(values[k] - value) <= value * 1e-12
                better = values[k] < value * (1 - 1e-12) or (tied and totals[k] < total * (1 - 1e-12))
            if better:
                current, value, total, over, level, improved = cand[k], float(values[k]), float(totals[k]), cand_over[k], int(levels[k]), True
                headroom = lin.headroom(*measure(current[None]))[0]
                paths.append(graph.path(*(x[:, k] for x in seconds)))
                depth = decided
                break
            if time.perf_counter() - t0 >= time_limit_s:
                break
        if not improved:
            neighbours.sort()
            near = np.array([layout for _, layout in neighbours[:neighbour_paths]], dtype=np.int64).reshape(-1, 2 * stages)
            for i in range(0, len(near), batch):
                if i and time.perf_counter() - t0 >= time_limit_s:  # the nearest batch always; the rest in the time left
                    break
                paths.extend(zip(*graph.paths(*lin.pass_times(*measure(near[i:i + batch])))))
            break
    return tuple(int(x) for x in current[:stages]), value, paths, tuple(int(x) for x in current[stages:])


def anneal(ctx: LayoutContext, start: tuple[int, ...], start_recompute: tuple[int, ...], time_limit_s: float,
           lin: LinearLayouts | None = None, spread: int | None = None, min_layers: int = 0, max_layers: int | None = None,
           uniform_recompute: bool = False, batch: int = 64, proposals: int = 4, temperature: float = 0.003,
           seed: int = 0, steps: int | None = None, chains: int = 4) -> tuple[tuple[int, ...], float, tuple[int, ...]]:
    """Simulated annealing over single-layer moves from a layout (the local search's local
    optimum), where the descent is stuck, in `chains` chains scored together. Each step draws,
    per chain, `proposals` x batch / chains random moves of one layer from a stage holding one
    to any other stage (a stage's recompute clipped to its layers, or min(N, layers) with
    `uniform_recompute`; min_layers, max_layers and the chunk `spread` kept), keeps the first
    batch / chains that pass the linear memory test, scores every chain's at once on the schedule
    graph, and each chain takes its best if it is no slower, or else with probability
    exp(-(its makespan - current) / T), T falling linearly from `temperature` x the start's
    makespan to 0 over `time_limit_s` (or over `steps` steps, where given: then deterministic, a
    fixed seed, unless the time runs out first). Where memory binds, most moves break it, and a
    descent ends where no move that fits is shorter: on a plateau of equal makespans (parallel
    longest paths) that the descent's tie-break by the sum of op ends does not cross, or behind
    a slightly slower layout. Ties are taken (exp(0) = 1), so the chains cross the plateau; the
    best only changes on a shorter layout (taking only shorter layouts, 200 steps from the offload
    incumbent below find nothing: tests/integration/test_layout_starts.py).
    Llama 3 405B cp 1 from the search's incumbents (10 s), 1 s of this on 2 cores, four seeds:
    with offload 7.81 s -> 7.50-7.66 s in four of four (one chain of 32: one of four), under
    ZeRO-2 6.99 -> 6.91-6.95 s in three (one chain: two or three); cp 1 alone (9.20 s) and nc 32
    (certified) nothing. The memory test comes first (a quarter of the graph's cost per layout);
    per step the graph's 286 levels cost as much as the layouts, so the chains share a call.
    Returns the best layout any chain visited (decoder counts), its makespan on the graph and its
    recompute counts: the start's own where none found a shorter one (makespan inf where the
    start does not fit)."""
    t0 = time.perf_counter()
    lin = lin or LinearLayouts(ctx)
    graph = schedule_graph(ctx)
    stages = lin.stages
    rng = np.random.default_rng(seed)
    level = max(start_recompute, default=0) if uniform_recompute else None

    first = np.array(tuple(start) + tuple(start_recompute), dtype=np.int64)
    counts, recomputed = lin.layout_counts(first[None])
    recomputed = recomputed if lin.recompute else None
    if not lin.fits(counts, recomputed)[0]:
        return tuple(start), math.inf, tuple(start_recompute)
    value = np.full(chains, float(graph.makespan(*lin.pass_times(counts, recomputed))[0]))
    current = np.repeat(first[None], chains, axis=0)  # [chain, 2 stage]
    best, best_value = first, float(value[0])
    heat0 = temperature * best_value
    per = max(batch // chains, 1)  # each chain's layouts scored per step
    draws = proposals * per
    rows = np.arange(chains * draws)
    chain_of = np.repeat(np.arange(chains), draws)
    step = 0
    while (elapsed := time.perf_counter() - t0) < time_limit_s and (steps is None or step < steps):
        # how far along: by the clock, or by the steps where they are given (then deterministic)
        done = elapsed / time_limit_s if steps is None else step / steps
        step += 1
        cand = current[chain_of]  # (a copy: fancy indexing)
        dec = cand[:, :stages]  # a view: the moves below write through
        held = dec > 0
        # a random stage holding a layer (each row's k-th held stage, k uniform), to a random stage
        nheld = held.sum(axis=1)
        pick = (rng.random(len(rows)) * nheld).astype(np.int64)
        source = np.argmax(np.cumsum(held, axis=1) > pick[:, None], axis=1)
        target = rng.integers(0, stages, len(rows))
        dec[rows, source] -= 1
        dec[rows, target] += 1
        cand[:, stages:] = np.minimum(level, dec) if level is not None else np.minimum(cand[:, stages:], dec)
        ok = (source != target) & (dec.min(axis=1) >= min_layers)
        if max_layers is not None:
            ok &= dec.max(axis=1) <= max_layers
        if spread is not None:
            per_rank = dec.reshape(len(rows), ctx.vp, ctx.pp)
            ok &= (per_rank.max(axis=1) - per_rank.min(axis=1) <= spread).all(axis=1)
        # the memory test first (a quarter of the schedule graph's cost per layout): where memory
        # binds most random moves break it, and only those that fit are scored, `per` a chain
        counts, recomputed = lin.layout_counts(cand[ok])
        recomputed = recomputed if lin.recompute else None
        fit = np.flatnonzero(ok)[lin.fits(counts, recomputed)]
        rank_in_chain = np.arange(len(fit)) - np.searchsorted(chain_of[fit], chain_of[fit])  # rows come chain by chain
        fit = fit[rank_in_chain < per]
        if not len(fit):
            continue
        counts, recomputed = lin.layout_counts(cand[fit])
        values = graph.makespan(*lin.pass_times(counts, recomputed if lin.recompute else None))
        heat = heat0 * max(1 - done, 0.0) + 1e-12
        for c in np.unique(chain_of[fit]):
            mine = np.flatnonzero(chain_of[fit] == c)
            k = mine[int(np.argmin(values[mine]))]
            if values[k] < value[c] or rng.random() < math.exp(-(values[k] - value[c]) / heat):
                current[c], value[c] = cand[fit[k]], float(values[k])
                if value[c] < best_value * (1 - 1e-9):  # shorter, not a tie within float noise (a plateau's moves)
                    best, best_value = current[c].copy(), float(value[c])
    return tuple(int(x) for x in best[:stages]), best_value, tuple(int(x) for x in best[stages:])
