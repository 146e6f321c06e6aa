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
