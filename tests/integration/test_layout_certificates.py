"""Certificates of the free layout search on a case too large to enumerate: DeepSeek-V3 on
2048 of MoFa's device B at tp 4, pp 16 x vp 2, ep 64 with full recompute allowed per stage
(bench/bench_layouts.py's fifth case, 1.5e36 layouts and recompute vectors). Its rounds were
stopped at a 6.4% gap until the dwell paths and the rule that a rank recomputes only where it
does not fit without (MemoryRows.recompute_only_where_needed) joined the model; the bench times
them (7.7-9.3 s on 2 cores). Here the limit is generous: what is checked is the certificate, not
its speed."""

import dataclasses
from pathlib import Path

from costmodel.configs import ConfigBatch
from costmodel.loader import load_problem
from costmodel.stage_layout import balanced_layout, layout_context, megatron_layout
from optimizer.layout_search import solve_layout

DSV3 = Path(__file__).resolve().parents[2] / "problems" / "tuning" / "deepseek_v3_2048gpu_sn8.yaml"


def test_per_stage_recompute_is_certified_and_agrees_with_the_search_without_it():
    """Both searches certify their optimum; every layout with recompute is also a layout the
    first one searched, so its optimum is no slower than the second's, and here recompute does
    not pay (a rank of 4 MoE layers that recomputes one is ~63 s against the ~61 s optimum): the
    two optima are the same makespan, the first recomputing nothing."""
    problem = load_problem(str(DSV3), ["config=null"])
    cfg = ConfigBatch.from_columns(2048, tp=4, pp=16, vp=2, ep=64, mbs=1, first_layers=2, last_layers=3, zero_stage=1, pp_overlap=1,
                                   dp_overlap=1, recompute=2, recompute_method=1, recompute_layers=1)
    ctx = layout_context(problem, cfg)
    seeds = (balanced_layout(61, 1, 16, 2), megatron_layout(61, 1, 16, 2, 2, 3))
    with_recompute = solve_layout(ctx, 60.0, seeds=seeds)
    assert with_recompute.optimal and with_recompute.fits
    assert with_recompute.lower_bound_s <= with_recompute.makespan_s
    without = solve_layout(dataclasses.replace(ctx, lc_full=None), 60.0, seeds=seeds)
    assert without.optimal and without.fits
    assert abs(with_recompute.makespan_s - without.makespan_s) <= 1e-6 * without.makespan_s
    assert not with_recompute.layout.any_recompute


LLAMA_2048 = Path(__file__).resolve().parents[2] / "problems" / "tuning" / "llama3_405b_2048gpu_gbs512.yaml"


def test_rank_order_proves_the_split_of_a_shipped_problem_optimal():
    """What `mofa solve problems/tuning/llama3_405b_2048gpu_gbs512.yaml --pipeline-layouts`
    solves (tp 4, cp 8, pp 16 x vp 8, 128 micro-batches): Megatron's split (stage 0 the
    embedding alone, 8 layers on ranks 1-14, 7 on rank 0 and on the last, with the loss) is
    optimal, and the rank order proves it with no LP at all. Every rank that holds 8 layers is
    busy 128 x 8 layers; 14 ranks must, and the one of them whose first decoder stage comes
    last waits for micro-batch 0's forward through 13 such stages before it (and their
    backward after), which is the split's makespan to the nanosecond. Rank 0 holding 8 layers
    with nothing on stage 0 escaped this until it took a place in the order too (the search
    stopped at 1.1% in 10 s, its LP spreading 7.875 layers on every rank)."""
    from optimizer.layout_bounds import rank_order_region
    from optimizer.layout_search import layout_makespan, own_layout
    from costmodel.stage_layout import score_layout

    problem = load_problem(str(LLAMA_2048), ["tp=4", "cp=8", "pp=16", "vp=8", "dp=4", "mbs=1", "pp_schedule=interleaved_1f1b",
                                             "zero_stage=1", "cp_overlap=true", "pp_overlap=true", "dp_overlap=true"])
    ctx = layout_context(problem, ConfigBatch.from_specs(problem, [problem.config]))
    own = own_layout(ctx)
    assert ctx.microbatches == 128 and own.decoders[0] == 0
    makespan = layout_makespan(score_layout(ctx, own))
    region = rank_order_region(ctx, makespan * (1 + 1e-9))
    assert region is not None and region.contains(own.decoders)
    assert rank_order_region(ctx, makespan * (1 - 1e-6)) is None
    # the one solve the search asks first says the same
    assert rank_order_region(ctx, makespan * (1 - 1e-6), feasibility_only=True) is None
    assert rank_order_region(ctx, makespan * (1 + 1e-9), feasibility_only=True) is not None
