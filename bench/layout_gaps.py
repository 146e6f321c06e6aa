"""Where the layout search's remaining gaps lie (issue 11): on the bound's side, measured.

    python bench/layout_gaps.py [--seconds 60] [--memory-cases]

For Llama 3 405B on pp 16 x vp 8 at cp 1 (bench_layouts' cases), without recompute and with one
--recompute-num-layers N = 1 (with --memory-cases: under ZeRO-2 and with offload instead), it
takes the search's incumbent (10 s, as the bench runs it) and:

1. the convex hull of each rank's integer choices: column generation over every integer chunk
   vector of a rank that fits its memory (its linear rows, the recompute min(1, t) of each chunk
   with N = 1), the ranks tied by their layer total, and path generation on the schedule graph
   (the longest paths at the master's point and, in-out stabilised, near the best point seen). The
   master LP's value, and the simulated makespan of the best fractional point it visits: an
   upper bound on what any bound from this relaxation can prove. Below the incumbent, no bound
   of that family certifies it: what is missing is integrality across stages.
2. simulated annealing from the incumbent (layout_seeds.anneal, the search's own: moves of one
   layer, scored on the schedule graph with the linear memory test): where it finds nothing better, the incumbent
   is at least a deep local optimum, and the gap is the bound's.
3. HiGHS' branch and bound over the whole event graph (bench/layout_proof.py's event_mip: an end
   time per op, integer layer counts per stage, every memory row; with recompute, per-stage
   recompute counts, whose bound holds for one N too): a general MIP solver's best layout and
   proven bound in the same time. Exact on the schedule graph where the skeleton's stages pay
   nothing for holding a layer (no ZeRO-3 gather, no gradient window's rest), a relaxation of it
   otherwise (the line says so).

Minutes per case; prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import numpy as np  # noqa: E402
from scipy.optimize import linprog  # noqa: E402

from bench_layouts import cases  # noqa: E402
from layout_proof import NotAffine, event_mip  # noqa: E402
from costmodel.stage_layout import layout_context, megatron_layout  # noqa: E402
from optimizer.layout_linear import LinearLayouts, least_recompute  # noqa: E402
from optimizer.layout_search import solve_layout  # noqa: E402
from optimizer.layout_seeds import anneal  # noqa: E402
from optimizer.schedule_graph import schedule_graph, segment_paths  # noqa: E402


def compositions(most: int, parts: int) -> np.ndarray:
    """Every vector of `parts` non-negative integers summing to at most `most`."""
    out, sums = np.zeros((1, 0), dtype=np.int64), np.zeros(1, dtype=np.int64)
    for _ in range(parts):
        reps = most - sums + 1
        idx = np.repeat(np.arange(len(out)), reps)
        values = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
        out, sums = np.hstack([out[idx], values[:, None]]), sums[idx] + values
    return out


def rank_vectors(ctx, lin, rank: int, level: int | None, most: int, batch: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """(chunk layer counts, chunk recompute counts) of every integer choice of `rank` that fits
    its linear memory rows (LinearLayouts.rank_rows, on layouts holding only this rank's
    chunks): no recompute (level None) or min(level, layers) per chunk."""
    vectors = compositions(most, ctx.vp)
    recompute = np.zeros_like(vectors) if level is None else np.minimum(level, vectors)
    fits = np.zeros(len(vectors), dtype=bool)
    for i in range(0, len(vectors), batch):
        part = slice(i, i + batch)
        layouts = np.zeros((len(vectors[part]), 2 * lin.stages), dtype=np.int64)
        layouts[:, rank:lin.stages:ctx.pp] = vectors[part]
        layouts[:, lin.stages + rank::ctx.pp] = recompute[part]
        counts, recomputed = lin.layout_counts(layouts)
        fits[part] = lin.rank_rows(counts, recomputed if ctx.recompute_allowed else None)[rank].max(axis=1) <= lin.capacity
    return vectors[fits], recompute[fits]


def hull_lp(ctx, level: int | None, seconds: float, most: int = 12) -> tuple[float, float, int]:
    """(the master LP's last value, the least simulated makespan of its points, rounds)."""
    lin, graph = LinearLayouts(ctx), schedule_graph(ctx)
    pp, stages, n = ctx.pp, lin.stages, len(ctx.kind_of_layer)
    f1, b1, rec = float(lin.forward_s[0]), float(lin.backward_s[0]), float(lin.recompute_s[0])
    cf, cb = lin.const_forward_s, lin.const_backward_s
    per_rank = [rank_vectors(ctx, lin, r, level, most) for r in range(pp)]
    # a column: one rank's vector, spread onto the stage axis
    columns, keys = [], set()

    def add_column(r, i):
        if (r, i) not in keys:
            keys.add((r, i))
            layers, again = np.zeros(stages), np.zeros(stages)
            layers[r::pp], again[r::pp] = per_rank[r][0][i], per_rank[r][1][i]
            columns.append((r, layers, again))

    for r, (vectors, _) in enumerate(per_rank):  # the most even vector of every total
        totals = vectors.sum(axis=1)
        for total in np.unique(totals):
            idx = np.flatnonzero(totals == total)
            add_column(r, int(idx[np.argmin(vectors[idx].max(axis=1) - vectors[idx].min(axis=1))]))
    paths, seen = [], set()

    def add_path(n_f, n_b):
        key = (n_f.astype(np.int64).tobytes(), n_b.astype(np.int64).tobytes())
        if key not in seen:
            seen.add(key)
            paths.append((n_f, n_b))

    for n_f, n_b in segment_paths(ctx.ops, stages, ctx.microbatches):
        add_path(np.asarray(n_f, dtype=float), np.asarray(n_b, dtype=float))
    start, rounds, value = time.perf_counter(), 0, math.nan
    center, center_value = None, math.inf
    while time.perf_counter() - start < seconds:
        rounds += 1
        coef = np.array([n_f * f1 + n_b * b1 for n_f, n_b in paths])  # [path, stage] seconds per layer
        rcoef = np.array([n_b * rec for _, n_b in paths])
        const = np.array([n_f @ cf + n_b @ cb for n_f, n_b in paths])
        layers = np.array([c[1] for c in columns]).T  # [stage, column]
        again = np.array([c[2] for c in columns]).T
        a_ub = np.hstack([coef @ layers + rcoef @ again, -np.ones((len(paths), 1))])
        a_eq = np.zeros((pp + 1, len(columns) + 1))
        for j, (r, col, _) in enumerate(columns):
            a_eq[r, j], a_eq[pp, j] = 1.0, col.sum()
        objective = np.zeros(len(columns) + 1)
        objective[-1] = 1.0
        result = linprog(objective, A_ub=a_ub, b_ub=-const, A_eq=a_eq, b_eq=np.concatenate([np.ones(pp), [n]]),
                         bounds=[(0, None)] * (len(columns) + 1), method="highs")
        if result.status != 0:
            break
        value = result.fun
        weight, dual = np.maximum(-result.ineqlin.marginals, 0.0), result.eqlin.marginals
        point = np.concatenate([layers @ result.x[:-1], again @ result.x[:-1]])
        probe = point if center is None else center + 0.15 * (point - center)
        grid = np.repeat(probe[:, None], stages + 1, axis=1)
        grid[np.arange(stages), np.arange(1, stages + 1)] += 0.15
        forward = f1 * grid[:stages] + cf[:, None]
        backward = b1 * grid[:stages] + rec * grid[stages:] + cb[:, None]
        end = graph.ends(forward, backward)
        if float(end[:-1, 0].max()) < center_value:
            center, center_value = probe, float(end[:-1, 0].max())
        before = len(paths)
        for n_f, n_b in zip(*graph.paths(forward, backward, end=end)):
            add_path(n_f, n_b)
        here = graph.paths((f1 * point[:stages] + cf)[:, None], (b1 * point[:stages] + rec * point[stages:] + cb)[:, None])
        for n_f, n_b in zip(*here):
            add_path(n_f, n_b)
        # pricing: each rank's vectors at the path weights, against its convexity and total duals
        price = weight @ coef
        price_again = weight @ rcoef
        added = 0
        for r, (vectors, recomputed) in enumerate(per_rank):
            reduced = vectors @ price[r::pp] + recomputed @ price_again[r::pp] - dual[r] - dual[pp] * vectors.sum(axis=1)
            for i in np.argsort(reduced)[:5]:
                if reduced[i] < -1e-9 and (r, int(i)) not in keys:
                    add_column(r, int(i))
                    added += 1
        if len(paths) == before and not added:
            break
    return value, center_value, rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per column generation and per annealing run")
    parser.add_argument("--memory-cases", action="store_true",
                        help="also cp 1 under ZeRO-2 and with activation offload (bench_layouts' memory-bound cases)")
    args = parser.parse_args()
    chosen = {"tp8 cp1 pp16 vp8": None, "tp8 cp1 pp16 vp8, per-chunk recompute": 1}  # case name ending: one N, or no recompute
    if args.memory_cases:
        chosen = {"tp8 cp1 pp16 vp8, ZeRO-2": None, "tp8 cp1 pp16 vp8, offload of core_attn and attn_proj": None}
    for name, problem, cfg, _ in cases():
        ending = [key for key in chosen if name.endswith(key)]
        if not ending:
            continue
        level = chosen[ending[0]]
        ctx = layout_context(problem, cfg)
        own = megatron_layout(len(ctx.kind_of_layer), 0, ctx.pp, ctx.vp, 7, 7)
        own = own.with_recompute([min(level, d) for d in own.decoders]) if level is not None else own
        solution = solve_layout(ctx, 10.0, seeds=(own,), uniform_recompute=level is not None)
        if solution.interrupted:  # Ctrl-C: the search stopped with its best so far; so does this script
            raise KeyboardInterrupt
        print(f"\n{name}" + (f", one N = {level}" if level is not None else "") +
              f": search (10 s) incumbent {solution.makespan_s:.4f} s, proven bound {solution.lower_bound_s:.4f} s")
        t0 = time.perf_counter()
        lp_value, point_value, rounds = hull_lp(ctx, level, args.seconds)
        print(f"  per-rank integer hull, column and path generation ({rounds} rounds, {time.perf_counter() - t0:.0f} s): "
              f"LP {lp_value:.4f} s; best fractional point visited runs {point_value:.4f} s "
              f"({'below' if point_value < solution.makespan_s else 'not below'} the incumbent)")
        t0 = time.perf_counter()
        # the search's own annealing (layout_seeds.anneal), given the whole time; one N where the
        # case has it (r_s = min(N, layers_s) kept through the moves)
        _, found, _ = anneal(ctx, solution.layout.decoders, solution.layout.recompute, args.seconds,
                             uniform_recompute=level is not None)
        print(f"  annealing from the incumbent ({time.perf_counter() - t0:.0f} s): {found:.4f} s "
              f"({100 * (1 - found / solution.makespan_s):+.2f}% on the incumbent)")
        t0 = time.perf_counter()
        lin, n = LinearLayouts(ctx), len(ctx.kind_of_layer)
        tables = [least_recompute(ctx, lin, r, n) for r in range(ctx.pp)] if ctx.recompute_allowed else None
        most = max(len(t) for t in tables) - 1 if tables is not None else n
        try:
            value, bound, _ = event_mip(ctx, lin, schedule_graph(ctx), tables, most, args.seconds)
        except NotAffine as exc:
            print(f"  HiGHS' MIP over the whole event graph: not measured, {exc}")
            continue
        exact = "exact on the schedule graph" if lin.without_stage_jumps() is None else "the graph without the stages' jumps"
        # with recompute the MIP's space is per-stage recompute, a superset of one N's: its bound
        # holds for one N, its best layout is not comparable with the one-N incumbent
        best = (f"best per-stage layout {value:.4f} s" if tables is not None else
                f"best {value:.4f} s ({100 * (1 - value / solution.makespan_s):+.2f}% on the incumbent)")
        scope = ", per-stage recompute: its bound holds for one N" if tables is not None else ""
        print(f"  HiGHS' MIP over the whole event graph ({exact}{scope}; {time.perf_counter() - t0:.0f} s): {best}, "
              f"proven bound {bound:.4f} s (the search's 10 s bound {solution.lower_bound_s:.4f} s)")


if __name__ == "__main__":
    main()
