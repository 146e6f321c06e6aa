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
    from optimizer.layout_report import own_layout
    from optimizer.layout_rounds import layout_makespan
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


LLAMA_64 = Path(__file__).resolve().parents[2] / "problems" / "tuning" / "llama3_405b_64gpu_gbs64.yaml"


def test_the_shipped_answer_that_offloads_activations_is_certified():
    """`mofa solve problems/tuning/llama3_405b_64gpu_gbs64.yaml --pipeline-layouts` (MoFa 5.3):
    its answer (tp 2, cp 2, pp 16 x vp 8, ZeRO-1, CPU optimizer, MoFa's whole-layer activation
    offload) was refused by the layout search, which did not model offload. Now its memory rows
    hold each chunk's input in flight and two layers' sets in transit, and Megatron's split is
    proven optimal among its 7e74 layouts."""
    from optimizer.layout_report import layout_report

    problem = load_problem(str(LLAMA_64), ["tp=2", "cp=2", "pp=16", "vp=8", "mbs=1", "layer_split=uneven", "first_stage_layers=7",
                                           "last_stage_layers=7", "zero_stage=1", "pp_overlap=true", "dp_overlap=true", "cpu_optimizer=true",
                                           "activation_offload=layer"])
    report, launched = layout_report(problem, ConfigBatch.from_specs(problem, [problem.config]))
    assert "refused" not in report, report
    assert report["optimal"] and report["gap"] <= 1e-6 and not report["applied"] and launched is None


LLAMA2_128 = Path(__file__).resolve().parents[2] / "problems" / "tuning" / "llama2_70b_128gpu.yaml"


def test_a_single_stage_is_enumerated():
    """pp = 1 has one layout (with full recompute, one per recompute count): layout_report scores
    every one with the exact model instead of searching (ZeRO-3's gradient window at pp 1, two
    layers' worth, is not linear in the layers: the linear model refused it). On Llama 2 70B on
    128 GPUs (ZeRO-3, mbs 2) with full recompute and 60 GiB, the answer recomputes the fewest
    layers that fit: one fewer does not."""
    from costmodel.stage_layout import layout_context, score_layout
    from optimizer.layout_report import layout_report

    common = ["tp=1", "pp=1", "mbs=2", "zero_stage=3", "dp_overlap=true"]
    offload = load_problem(str(LLAMA2_128), common + ["activation_offload=layer"])
    report, _ = layout_report(offload, ConfigBatch.from_specs(offload, [offload.config]))
    assert report["optimal"] and report["space_size"] == 1 and report["bound"].startswith("every layout of the skeleton scored")
    problem = load_problem(str(LLAMA2_128), common + ["recompute=full", "recompute_method=block", "recompute_num_layers=80",
                                                      "hardware.memory_mib=61440"])
    cfg = ConfigBatch.from_specs(problem, [problem.config])
    report, _ = layout_report(problem, cfg)
    assert report["optimal"] and report["space_size"] == 81
    fewest = report["recompute_num_layers"]
    ctx = layout_context(problem, cfg)
    own = megatron_layout(80, 0, 1, 1, 80, 80)
    assert 0 < fewest < 80 and score_layout(ctx, own.with_recompute([fewest])).fits
    assert not score_layout(ctx, own.with_recompute([fewest - 1])).fits
