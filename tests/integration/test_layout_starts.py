"""The layout search's starts and moves on Llama 3 405B on 16,384 H100s at tp 8, cp 1, pp 16 x
vp 8 (bench/bench_layouts.py's second and third cases), whose even split needs 90.6 of 79.6 GiB.
Without recompute no given layout fits, and the free search starts from round_seeds' answers:
the local optima of its starts differ by 12% and not in the order of the starts; it descends
from the fastest few (layout_search.ROUND_STARTS), which reach the 9.15 s layout (its proven
bound, 9.04 s). With per-chunk recompute the local search moves a recomputed layer off the
longest path."""

from pathlib import Path

import numpy as np

from costmodel.configs import ConfigBatch
from costmodel.loader import load_problem
from costmodel.stage_layout import layout_context
from optimizer.layout_linear import LinearLayouts
from optimizer.layout_seeds import ROUND_STARTS, local_search, round_seeds
from optimizer.schedule_graph import schedule_graph

LLAMA405 = Path(__file__).resolve().parents[2] / "problems" / "tuning" / "llama3_405b_16384xh100_seq8k.yaml"


def context(**recompute):
    problem = load_problem(str(LLAMA405), ["config=null"])
    cfg = ConfigBatch.from_columns(16384, tp=8, pp=16, vp=8, mbs=1, first_layers=7, last_layers=7, zero_stage=1,
                                   pp_overlap=1, tp_overlap=1, dp_overlap=1, **recompute)
    return layout_context(problem, cfg)


def test_the_fastest_starts_reach_the_best_basin():
    ctx = context()
    lin = LinearLayouts(ctx)
    answers = list(dict.fromkeys(a for k in (0, 1) for a in round_seeds(ctx, lin, 1.0, random_seed=k)))
    counts, _ = lin.layout_counts(np.array([a.decoders + a.recompute for a in answers]))
    f, b = lin.times(counts)
    order = np.argsort(schedule_graph(ctx).makespan(f, b), kind="stable")
    ends = [local_search(ctx, answers[k].decoders, 10.0, lin=lin, start_recompute=answers[k].recompute)[1] for k in order[:ROUND_STARTS]]
    assert min(ends) < 9.16
    assert max(ends) > 1.05 * min(ends)  # the starts do lead to different basins: one descent is not enough


def test_a_recomputed_layer_moves_off_the_longest_path():
    """From the layout the search kept until the move existed (one layer a stage, 27 recomputed,
    5.809 s): one fewer recomputed layer does not fit, one more is slower, and moving one to a
    stage off the longest path is faster (5.770 s after three such moves; 5.757 s once the
    descent also takes a move that leaves the makespan but shortens the other ops, so that two
    parallel longest paths are both shortened)."""
    ctx = context(recompute=2, recompute_method=1, recompute_layers=1)
    lin = LinearLayouts(ctx)
    decoders = (0,) + (1,) * 126 + (0,)
    recompute = [0] * 128
    for s in list(range(88, 92)) + list(range(97, 120)):
        recompute[s] = 1
    counts, recomputed = lin.layout_counts(np.array([decoders + tuple(recompute)]))
    f, b = lin.times(counts, recomputed)
    start = float(schedule_graph(ctx).makespan(f, b)[0])
    assert lin.fits(counts, recomputed)[0] and abs(start - 5.809) < 0.001
    _, end, _, moved = local_search(ctx, decoders, 10.0, lin=lin, start_recompute=tuple(recompute))
    assert end < 5.76 and sum(moved) == 27
