"""Heterogeneous pipeline layouts (issue 11): the layout search on the two cases of the issue.

    python bench/bench_layouts.py [--time-limit 10] [--workers 2]

For each case (a skeleton configuration: degrees, micro-batch, features fixed) and each search
(regular layouts, free layouts, regular then free as `mofa solve --pipeline-layouts` runs it;
each with the full time limit; the time printed is the search's whole wall time) it prints the size
of the layout space (decoder layers over pp*vp stages, any stage possibly empty), the
time the search takes to certify its optimum (CP-SAT over the schedule's path cuts, or, for
free layouts of one kind of layer, the integer rank totals a faster layout needs and the
schedule graph's LP within them; the line says which proved the bound), the exact model's step time of the layout it returns (schedule
simulated op by op) with the proven gap (the makespan's, which the search minimises, and the step's: the
makespan bound plus the least exposed P2P and busiest update of any layout that fits, step_floor_s),
and the same for Megatron's layouts: the even split by
count and the first/last-stage heuristics (Llama 3's embedding/loss accounting; DeepSeek-V3's
Megatron-LM recipe with its MTP module moved onto the last stage, which the model requires).

With per-chunk recompute (the cases marked so: the skeleton has full recompute, so each stage
also chooses how many of its layers to recompute, Megatron's block method per chunk) the space
counts every recompute vector too, the baselines recompute nothing and everything, and a fourth
search keeps one --recompute-num-layers N for every chunk (r_s = min(N, layers_s): what Megatron
launches; layout_report reports it where the per-chunk answer is no one N).

A last case is what every shipped DeepSeek-V3 problem picks, DualPipeV (also under FSDP): its V layouts are
searched as layout_report searches them (vee_layout_search): a descent scored by the layout
model, then CP-SAT rounds over the path cuts of the V's schedule graph and its memory rows
(vee_rounds).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from costmodel.configs import PP_SCHEDULE_CODES, ConfigBatch, offload_code  # noqa: E402
from costmodel.loader import load_problem  # noqa: E402
from costmodel.stage_layout import (  # noqa: E402
    LayoutError,
    StageLayout,
    balanced_layout,
    layout_context,
    megatron_layout,
    score_layout,
    space_size,
)
from costmodel.units import GIB  # noqa: E402
from optimizer.layout_linear import LinearLayouts
from optimizer.layout_rounds import regular
from optimizer.layout_search import solve_layout, two_phase
from optimizer.layout_report import step_bound, step_floor_s
from optimizer.layout_vee import vee_layout_search
from optimizer.schedule_graph import schedule_graph  # noqa: E402


def cases():
    """(name, problem, skeleton, baselines). The skeletons: Llama 3 405B as Meta trained it at
    8K (tp 8, pp 16, vp 8 on 16,384 H100s; the paper's section 3.1.2), with cp 2 so that
    Megatron's split fits 80 GB, and without (cp 1) where it does not; DeepSeek-V3 on 2048 of
    MoFa's device B (tp 4, pp 16, vp 2, ep 64: the cheapest degrees that fit at vp 2), as the
    homogeneous search proposes it (the layout split: 2 layers on the first rank, 3 on the last).
    Llama 3 405B with per-chunk recompute at cp 1 (memory forces it) and cp 2 (it does not: the
    search must rule the recompute vectors out), cp 1 also under ZeRO-2, Meta's sharding, where
    the split is 2.2 GiB over, cp 2 under ZeRO-2 (two gradient windows per stage), and cp 1
    under Llama 3's flexible schedule
    (rounds of nc = 32 micro-batches on 8,192 GPUs); DeepSeek-V3 also under torchtitan's FSDP on
    1F1B (pp 16, 480 micro-batches), where a stage gathers its mean layer (tabulated), and on the
    interleaved schedule (30 gradient windows per stage: the experts' reduce-scatter a jump per
    stage, the prefetches' overlap by table)."""
    llama = load_problem(os.path.join(ROOT, "problems/tuning/llama3_405b_16384xh100_seq8k.yaml"), ["config=null"])
    common = dict(tp=8, pp=16, vp=8, mbs=1, first_layers=7, last_layers=7, zero_stage=1, pp_overlap=1, tp_overlap=1, dp_overlap=1)
    llama_baselines = {"even by count": balanced_layout(126, 0, 16, 8), "first/last -1 (Llama 3, embedding+loss)": megatron_layout(126, 0, 16, 8, 7, 7)}
    yield "Llama 3 405B, 16384 H100, tp8 cp2 pp16 vp8", llama, ConfigBatch.from_columns(16384, cp=2, **common), llama_baselines
    yield "Llama 3 405B, 16384 H100, tp8 cp1 pp16 vp8", llama, ConfigBatch.from_columns(16384, **common), llama_baselines
    # Meta's own sharding (ZeRO-2; 16 micro-batches, one gradient window per stage: searchable)
    yield ("Llama 3 405B, 16384 H100, tp8 cp1 pp16 vp8, ZeRO-2", llama, ConfigBatch.from_columns(16384, **{**common, "zero_stage": 2}),
           llama_baselines)
    # ZeRO-2 with cp 2: 32 micro-batches in rounds of 16, so each stage reduce-scatters its gradients twice per step and the
    # first window's hides behind its rank's compute (the search's min and max per stage, LinearLayouts.windows)
    yield ("Llama 3 405B, 16384 H100, tp8 cp2 pp16 vp8, ZeRO-2 (2 gradient windows per stage)", llama,
           ConfigBatch.from_columns(16384, cp=2, **{**common, "zero_stage": 2}), llama_baselines)
    # Llama 3's flexible schedule (section 3.1.1): 8192 GPUs, 32 micro-batches in rounds of nc = 32
    yield ("Llama 3 405B, 8192 H100, tp8 cp1 pp16 vp8, flexible schedule nc 32", llama,
           ConfigBatch.from_columns(8192, **common, pp_schedule=PP_SCHEDULE_CODES["flexible"], pp_group=32), llama_baselines)
    # Megatron's fine-grained activation offload of core_attn and attn_proj (their saved inputs to the host): the split is
    # 1.8 GiB over on ranks 1-9, every chunk of which holds all 16 micro-batches at its peak
    yield ("Llama 3 405B, 16384 H100, tp8 cp1 pp16 vp8, offload of core_attn and attn_proj", llama,
           ConfigBatch.from_columns(16384, **common, activation_offload=offload_code(["core_attn", "attn_proj"])), llama_baselines)
    full = dict(recompute=2, recompute_method=1, recompute_layers=1)  # block method; the layouts choose N per chunk
    yield ("Llama 3 405B, 16384 H100, tp8 cp1 pp16 vp8, per-chunk recompute", llama, ConfigBatch.from_columns(16384, **common, **full),
           with_recompute_baselines(llama_baselines))
    # the same with cp 2, where the split fits without recompute: the recompute dimension (4.5e103 vectors) must be ruled out
    yield ("Llama 3 405B, 16384 H100, tp8 cp2 pp16 vp8, per-chunk recompute", llama, ConfigBatch.from_columns(16384, cp=2, **common, **full),
           with_recompute_baselines(llama_baselines))
    ds = load_problem(os.path.join(ROOT, "problems/tuning/deepseek_v3_2048gpu_sn8.yaml"), ["config=null"])
    # the layout split (costmodel.layout): no split flag splits 61 layers over pp 16 x vp 2
    ds_common = dict(tp=4, pp=16, vp=2, ep=64, mbs=1, first_layers=2, last_layers=3, zero_stage=1, pp_overlap=1, dp_overlap=1)
    ds_baselines = {"even by count": balanced_layout(61, 1, 16, 2), "first/last (Megatron-LM recipe)": StageLayout.from_megatron("Et*3|(tt|)*29,|mL", 16, 2),
                    "layout split (mofa solve's skeleton)": megatron_layout(61, 1, 16, 2, 2, 3)}
    yield "DeepSeek-V3 (61 layers, 3 dense, MTP), 2048 device B, tp4 pp16 vp2 ep64", ds, ConfigBatch.from_columns(2048, **ds_common), ds_baselines
    yield ("DeepSeek-V3 (61 layers, 3 dense, MTP), 2048 device B, tp4 pp16 vp2 ep64, per-chunk recompute", ds,
           ConfigBatch.from_columns(2048, **ds_common, **full), with_recompute_baselines(ds_baselines))
    # torchtitan's sharding: FSDP (ZeRO-3 kept after the forward) on 1F1B, where a stage gathers its mean layer (dense or MoE)
    fsdp = dict(ds_common, vp=1, pp_schedule=PP_SCHEDULE_CODES["1f1b"], first_layers=3, last_layers=2, zero_stage=3, reshard_after_forward=0)
    yield ("DeepSeek-V3 (61 layers, 3 dense, MTP), 2048 device B, tp4 pp16 ep64 1F1B, FSDP kept after the forward", ds,
           ConfigBatch.from_columns(2048, **fsdp), {"even by count": balanced_layout(61, 1, 16, 1), "first/last (3 / 2)": megatron_layout(61, 1, 16, 1, 3, 2)})
    # and on the interleaved schedule (pp 16 x vp 2, 480 micro-batches in rounds of 16: 30 gradient windows per stage), where each
    # stage's reduce-scatter starts the experts' collective with its first MoE layer and its prefetches' overlap comes by table
    yield ("DeepSeek-V3 (61 layers, 3 dense, MTP), 2048 device B, tp4 pp16 vp2 ep64, FSDP kept after the forward (30 gradient windows per stage)",
           ds, ConfigBatch.from_columns(2048, **{**ds_common, "zero_stage": 3, "reshard_after_forward": 0}), ds_baselines)
    # what every shipped DeepSeek-V3 problem picks: DualPipeV (2048 GPUs, supernodes of 8: tp 1, cp 4, pp 4 in the V, 13 / 16 layers)
    vee = dict(tp=1, cp=4, pp=4, vp=2, ep=256, mbs=1, first_layers=13, last_layers=16, pp_schedule=4, zero_stage=1, cp_overlap=1,
               ep_overlap=1, pp_overlap=1, dp_overlap=1, cpu_optimizer=1)
    yield ("DeepSeek-V3 (61 layers, 3 dense, MTP), 2048 device B, tp1 cp4 pp4 ep256 under DualPipeV (the shipped answer)", ds,
           ConfigBatch.from_columns(2048, **vee), {"V split (mofa solve's skeleton, 13 / 16 layers)": megatron_layout(61, 1, 4, 2, 13, 16, True)})
    # the same V under FSDP kept after the forward: a gradient window per micro-batch per stage
    yield ("DeepSeek-V3 (61 layers, 3 dense, MTP), 2048 device B, tp1 cp4 pp4 ep256 under DualPipeV, FSDP kept after the forward", ds,
           ConfigBatch.from_columns(2048, **{**vee, "zero_stage": 3, "reshard_after_forward": 0}),
           {"V split (mofa solve's skeleton, 13 / 16 layers)": megatron_layout(61, 1, 4, 2, 13, 16, True)})
    # Llama 3 405B under DualPipeV on pp 16 (8192 GPUs, 128 micro-batches): its V split (3 layers on rank 0's stages, 4 on
    # the others) needs 84.9 GiB of device B's 64, so memory shapes the answer
    llama_v = load_problem(os.path.join(ROOT, "problems/tuning/llama3_405b_8192gpu_gbs8192.yaml"),
                           ["tp=8", "pp=16", "vp=2", "mbs=1", "pp_schedule=dualpipev", "zero_stage=1", "pp_overlap=true", "layer_split=uneven"])
    yield ("Llama 3 405B, 8192 device B, tp8 pp16 under DualPipeV", llama_v, ConfigBatch.from_specs(llama_v, [llama_v.config]),
           {"V split (3 layers on rank 0's stages, 4 elsewhere)": StageLayout.from_stage_sizes(16, 2, [3] + [4] * 30 + [3], 0, vee=True)})


def with_recompute_baselines(baselines: dict) -> dict:
    """Each baseline recomputing nothing and recomputing every layer (--recompute-num-layers
    at least the largest chunk)."""
    out = {}
    for label, layout in baselines.items():
        out[label + ", no recompute"] = layout
        out[label + ", all recomputed"] = layout.with_recompute(layout.decoders)
    return out


BOUND_NOTES = {
    "cp-sat": "",
    "rank-lp": " (proven by the integer rank totals a faster layout needs and the schedule graph's LP over them)",
    "work": " (the work bound: no CP-SAT round proved more)",
    "recompute-split": " (proven by recompute as a yes/no per rank: a rank that recomputes is over its memory without it)",
    "relaxed": " (proven by the search's model without the per-stage jumps, relaxed_bound: the jumps along a path are the gap)",
    "rank-totals": " (the ranks' integer layer totals under busy time, order and memory, rank_totals_bound: no CP-SAT round proved more)",
    "levels": (" (every N >= 1 ruled out by the ranks' busy time with a recomputed layer per chunk; the layouts without "
               "recompute by the search without recompute)"),
    "level-work": " (the ranks' busy time under one N, least over the N: no CP-SAT round proved more)",
    "vee-cp-sat": " (CP-SAT over the V's path cuts and memory rows)",
    "vee-work": " (the ranks' mean work: the V's CP-SAT rounds proved no more)",
    "vee-rank": " (each rank's work after the forward chain to it, least over integer layer counts: the V's CP-SAT rounds proved no more)",
}


def graph_rate(ctx, batch: int = 4096, seed: int = 0) -> float:
    """Layouts per second that exhaustive enumeration could score at best: random layouts (each
    layer on a random stage, a random recompute count where the skeleton has recompute) through
    the linear memory test and the schedule graph's makespan in one batch, the search's own
    fastest path (the exact model's simulation, one layout at a time, is 25-90x slower)."""
    rng = np.random.default_rng(seed)
    lin = LinearLayouts(ctx)
    stages, n = lin.stages, len(ctx.kind_of_layer)
    decoders = np.stack([np.bincount(rng.integers(0, stages, n), minlength=stages) for _ in range(batch)])
    recompute = rng.integers(0, decoders + 1) if ctx.recompute_allowed else np.zeros_like(decoders)
    graph = schedule_graph(ctx)
    t0 = time.perf_counter()
    counts, recomputed = lin.layout_counts(np.concatenate([decoders, recompute], axis=1))
    recomputed = recomputed if ctx.recompute_allowed else None
    lin.fits(counts, recomputed)
    graph.makespan(*lin.pass_times(counts, recomputed))  # under the V, the weight-gradient passes apart
    return batch / (time.perf_counter() - t0)


def describe(score) -> str:
    fits = "fits" if score.fits else "does NOT fit"
    return f"step {score.step_time_s:8.4f} s  pipeline {score.pipeline_s:8.4f} s  peak {score.peak_bytes.max() / GIB:6.1f} GiB ({fits})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--case", default="", help="only the cases whose name contains this text")
    args = parser.parse_args()
    for name, problem, cfg, baselines in cases():
        if args.case not in name:
            continue
        t0 = time.perf_counter()
        ctx = layout_context(problem, cfg)
        tables = {}  # each rank's least recompute per layer total, for the step floor with memory (step_floor_s)
        setup = time.perf_counter() - t0
        n, stages = len(ctx.kind_of_layer), ctx.pp * ctx.vp
        n_layers = n
        recompute = ctx.recompute_allowed
        print(f"\n{name}: {n} layers over {stages} stages, {ctx.microbatches} micro-batches; layout space "
              f"{float(space_size(n, stages, recompute)):.2e}" + (" (layer and recompute counts per stage)" if recompute else ""))
        rate = graph_rate(ctx)
        seconds = float(space_size(n, stages, recompute)) / rate
        how = "on the schedule graph (batches of 4096, memory test included)"
        span = f"{seconds / 3.156e7:.1e} years" if seconds >= 3.156e7 else f"{seconds / 3600:.1f} hours"
        print(f"  exhaustive enumeration: {rate:,.0f} layouts/s {how}, "
              f"{span} for the space: does not finish in a bench (nor does a DFS over it, which scores the same leaves)")
        scores = {}
        for label, layout in baselines.items():
            scores[label] = score_layout(ctx, layout)
            print(f"  {label:58s} {describe(scores[label])}")
        seeds = tuple(baselines.values())
        searches = [("local search on the V's schedule graph, then CP-SAT rounds (layout_report's path for DualPipeV)",
                     lambda: vee_layout_search(ctx, args.time_limit, seeds[0], workers=args.workers))] if ctx.vee else [("regular layouts (chunks of a rank within 1 layer)",
                     lambda: solve_layout(ctx, args.time_limit, args.workers, seeds=tuple(b for b in seeds if regular(b, 1)), chunk_spread=1)),
                    ("free layouts", lambda: solve_layout(ctx, args.time_limit, args.workers, seeds=seeds)),
                    ("regular (40% of the time) then free (mofa solve --pipeline-layouts)", lambda: two_phase(ctx, args.time_limit, args.workers, seeds)[1])]
        if recompute and not ctx.vee:
            searches.append(("free layouts, one --recompute-num-layers N for every chunk (exportable)",
                             lambda: solve_layout(ctx, args.time_limit, args.workers, seeds=seeds, uniform_recompute=True)))
        for label, search in searches:
            t_search = time.perf_counter()
            try:
                sol = search()
                elapsed = time.perf_counter() - t_search
            except LayoutError as exc:
                print(f"  {label}: {exc}")
                continue
            best = score_layout(ctx, sol.layout)
            status = "certified optimal" if sol.optimal else "stopped by Ctrl-C" if sol.interrupted else "not proven"
            rounds = f"{sol.rounds} layer moves and CP-SAT rounds" if ctx.vee else f"{sol.rounds} CP-SAT rounds"
            print(f"  {label}: {describe(best)}")
            print(f"    {elapsed:.2f} s (+{setup:.2f} s shared costs, schedule op lists) [{status}, {rounds}]; "
                  f"proven makespan lower bound {sol.lower_bound_s:.4f} s, gap {100 * sol.gap:.2f}%" + BOUND_NOTES[sol.bound_source])
            t_floor = time.perf_counter()
            overhead_floor = step_floor_s(ctx, [sol], tables)  # what every layout that fits adds to its makespan in the step, at least
            step = step_bound(sol, overhead_floor)
            print(f"    step lower bound {step['step_lower_bound_s']:.4f} s (the makespan's plus {overhead_floor:.4f} s of exposed P2P and "
                  f"update, the least of any layout that fits; {time.perf_counter() - t_floor:.2f} s), step gap {100 * step['step_gap']:.2f}%")
            for base, score in scores.items():
                if score.fits:
                    print(f"    gain over {base}: {100 * (score.step_time_s / best.step_time_s - 1):+.2f}% step time")
                else:
                    print(f"    {base}: does not fit" + ("; this layout does" if best.fits else ""))
            print(f"    --pipeline-model-parallel-layout {sol.layout.to_megatron()}")
            if recompute:
                n = sol.layout.uniform_recompute()
                export = f"--recompute-method block --recompute-num-layers {n}" if n else ("none" if n == 0 else "no one --recompute-num-layers gives it")
                print(f"    recompute per stage {list(sol.layout.recompute)} ({sum(sol.layout.recompute)} of {n_layers} layers): {export}")
            if sol.interrupted:  # the search gave its best so far (above): the bench stops
                raise KeyboardInterrupt


if __name__ == "__main__":
    main()
