"""The layout search's oracles on small instances (tests/unit/test_layout_search.py): the
dynamic program over stages of MPE eq. 3 (seed 002) for vp = 1, and plain enumeration of every
layout with its exact score."""

from __future__ import annotations

import itertools

import numpy as np

from costmodel.stage_layout import (
    LayoutContext,
    StageLayout,
    chunk_times,
    rank_peak_bytes,
    score_layout,
    unit_costs,
)


def dp_layout(ctx: LayoutContext) -> tuple[StageLayout | None, float]:
    """MPE eq. 3 for vp = 1, over the critical-path bound: rank s's term is the stages before
    it (their forward+backward, a chain) plus m times its own. A state (s, b) -- stages 0..s
    hold layers [0, b) -- keeps the pairs (worst term so far, chain) that no other pair beats
    in both, since the next stage's term grows with the chain: C(s, b) = Pareto-min over a of
    (max(v, ch + m * T(s, a, b)), ch + T(s, a, b)) for (v, ch) in C(s-1, a). T is stage s
    holding layers [a, b) with the fewest recomputed layers its rank's exact ledger allows
    (with vp = 1 a rank's memory depends on its own stage only, and fewer recomputed layers
    are never slower, so that choice is best for both the term and the chain); inf where none
    fits. Without recompute the pairs collapse to MPE's plain recursion. Returns the best
    layout and its bound (None, inf when nothing fits): the oracle of solve_layout."""
    if ctx.vp != 1:
        raise ValueError("the stage DP covers vp = 1 (a rank's chunks are not contiguous otherwise)")
    pp, n = ctx.pp, len(ctx.kind_of_layer)
    inf = float("inf")
    m = ctx.microbatches

    stage = {(s, a, b): _stage_cost(ctx, s, a, b) for s in range(pp) for a in range(n + 1) for b in range(a, n + 1)}
    # front[s][b]: list of (worst term, chain, previous b, index in front[s-1][a], recompute)
    front = [[[] for _ in range(n + 1)] for _ in range(pp)]
    for b in range(n + 1):
        time_s, r = stage[0, 0, b]
        if time_s < inf:
            front[0][b] = [(m * time_s, time_s, 0, -1, r)]
    for s in range(1, pp):
        for b in range(n + 1):
            pairs = []
            for a in range(b + 1):
                time_s, r = stage[s, a, b]
                if time_s == inf:
                    continue
                for i, (v, ch, _, _, _) in enumerate(front[s - 1][a]):
                    pairs.append((max(v, ch + m * time_s), ch + time_s, a, i, r))
            pairs.sort()
            kept, least_chain = [], inf
            for p in pairs:  # by worst term, then chain: keep each pair whose chain is the least so far
                if p[1] < least_chain:
                    kept.append(p)
                    least_chain = p[1]
            front[s][b] = kept
    if not front[pp - 1][n]:
        return None, inf
    i = min(range(len(front[pp - 1][n])), key=lambda k: front[pp - 1][n][k][0])
    value = front[pp - 1][n][i][0]
    sizes, recompute, b = [], [], n
    for s in range(pp - 1, -1, -1):
        _, _, a, i_prev, r = front[s][b][i]
        sizes.append(b - a)
        recompute.append(r)
        b, i = a, i_prev
    return StageLayout(pp=pp, vp=1, decoders=tuple(reversed(sizes)), mtp=ctx.mtp_on_last, recompute=tuple(reversed(recompute))), value


def _stage_cost(ctx: LayoutContext, s: int, a: int, b: int) -> tuple[float, int]:
    """(forward+backward seconds, recomputed layers) of stage s (vp = 1: rank s) holding layers
    [a, b) with the fewest recomputed layers (its first ones) for which its rank's exact
    ledger fits; (inf, 0) where none does. Scored by score_layout's functions on the one stage."""
    k = len(ctx.kinds)
    counts = np.bincount(np.asarray(ctx.kind_of_layer[a:b], dtype=int), minlength=k).astype(float)
    last = s == ctx.pp - 1
    mtp = ctx.problem.model.mtp_layers if last else 0
    if ctx.mtp_kind is not None:
        counts[ctx.mtp_kind] += mtp
    u = unit_costs(ctx)
    for r in range(b - a + 1 if ctx.recompute_allowed else 1):
        recomputed = np.bincount(np.asarray(ctx.kind_of_layer[a:a + r], dtype=int), minlength=k).astype(float)
        if rank_peak_bytes(ctx, s, counts[None, :], recomputed[None, :], last, mtp) <= ctx.problem.hardware.memory_bytes:
            forward, backward = chunk_times(u, counts[None, :], np.array([mtp]), np.array([s == 0]), np.array([last]), recomputed[None, :])
            return float(forward[0] + backward[0]), r
    return float("inf"), 0


def enumerate_layouts(ctx: LayoutContext, min_layers: int = 0, uniform_recompute: bool = False):
    """Every layout (MTP on the last stage) with its exact score: the brute-force oracle for
    tiny instances. Where the skeleton allows full recompute, every recompute count of every
    stage too (uniform_recompute: only r_s = min(N, layers_s), every N)."""
    stages, n = ctx.pp * ctx.vp, len(ctx.kind_of_layer)
    mtp = ctx.mtp_on_last
    for bars in itertools.combinations(range(n + stages - 1), stages - 1):
        sizes, prev = [], -1
        for bar in (*bars, n + stages - 1):
            sizes.append(bar - prev - 1)
            prev = bar
        if min(sizes) < min_layers:
            continue
        layout = StageLayout(pp=ctx.pp, vp=ctx.vp, decoders=tuple(sizes), mtp=mtp, vee=ctx.vee)
        if not ctx.recompute_allowed:
            choices = [layout.recompute]
        elif uniform_recompute:
            choices = sorted({tuple(min(level, d) for d in sizes) for level in range(max(sizes) + 1)})
        else:
            choices = itertools.product(*(range(d + 1) for d in sizes))
        for recompute in choices:
            chosen = layout.with_recompute(recompute)
            yield chosen, score_layout(ctx, chosen)
