"""The exact cost model: MoFa's CostModel_base + Mo + Fa for a batch of configurations.

    step time (eq. 14) = pipeline (eqs. 9-12, 23) + exposed DP communication (eq. 24) + update

`evaluate` is the single scorer of the project: `mofa evaluate` calls it with one row, the
exhaustive enumerator with millions, the DFS and the CP-SAT outer loop with their candidates.
It does not check the Megatron rules (costmodel.rules does); it scores whatever it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from costmodel import architecture as arch
from costmodel.arrays import argmax_masks, blend, pick, unique_rows
from costmodel.compute import ComputeModel
from costmodel.configs import CP_COMM_CODES, MOE_CHUNKS_AUTO, PP_SCHEDULE_CODES, ConfigBatch
from costmodel.documents import attention_factor
from costmodel.flops import convention_flops_per_token, mfu_convention, recompute_flops_per_token
from costmodel.bounds import ideal_network, kind_bounds, step_bounds
from costmodel.layer import LAYER_KEY_FIELDS, LayerCosts, collectives, kind_costs, layer_time
from costmodel.memory import MEMORY_KEYS, communicator_count, choose_bin, memory_context, rank_memory, rank_params
from costmodel.network import Network
from costmodel.pipeline import PipelinePasses, grad_windows, in_flight, pipeline_time, rank_classes
from costmodel.placement import place, stage_groups
from costmodel.reliability import end_to_end_s, failure_rate_per_s, optimal_interval, steady_state_ettr
from costmodel.specs import MOE_CHUNK_BINS, Problem
from costmodel.units import DTYPE_BYTES, GB, GIB, TFLOP, US, optimizer_state_bytes
from costmodel.update import cooldown_passes, optimizer_time, window_compute_s, window_traffic, zero3_gathers, zero3_gathers_per_step

#: step-time ledger: per-micro-batch terms of the pacing rank (times the micro-batches), then the
#: pipeline's own terms, then the step-level ones; fsdp = ZeRO-3 parameter gathers and ZeRO-2/3
#: gradient reduce-scatters inside the pipeline, overhead = the fixed cost of each virtual-stage
#: chunk of each micro-batch (stage_overhead_us), dp = the step-level reduction and gathers
BREAKDOWN_KEYS = ("compute", "recompute", "tp", "cp", "ep", "fsdp", "offload", "overhead", "pp", "bubble", "dp", "update")

RANK_NAMES = ("first", "middle", "last")


@dataclass(frozen=True)
class Evaluation:
    """Arrays over the configurations of the batch (seconds, bytes, ratios)."""

    step_time_s: np.ndarray
    breakdown_s: dict[str, np.ndarray]
    memory_bytes: dict[str, np.ndarray]  # worst rank's ledger, MEMORY_KEYS + 'peak'
    worst_rank: np.ndarray  # 0 first, 1 middle, 2 last (pp = 2: first or last; pp = 1: first)
    fits: np.ndarray
    capacity_bytes: int
    host_bytes: np.ndarray
    host_fits: np.ndarray
    microbatches: np.ndarray
    tflops_per_gpu: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray
    tokens_per_s_per_gpu: np.ndarray
    tokens_per_s: np.ndarray
    model_flops_per_step: float  # the MFU numerator, counted in mfu_convention(flops_convention)
    flops_convention: str  # training.flops_convention: what the MFU/HFU/TFLOP/s figures count (costmodel.flops)
    checkpoint_save_s: float | None
    pp_without_overlap_s: np.ndarray  # for search bounds: PP exposure without overlap,
    pp_overlap_floor_s: np.ndarray  # and the part that overlap cannot hide
    ettr: np.ndarray | None
    checkpoint_interval: np.ndarray | None
    e2e_time_s: np.ndarray | None
    moe_chunks: np.ndarray  # MemFine FCDA chunks scored (MACT's choice where the configuration says auto)
    lower_bounds_s: dict[str, np.ndarray] | None  # costmodel.bounds: the step's compute, memory and communication bounds (BOUND_KEYS); None unless asked
    pipeline_s: np.ndarray  # the pipeline's part of the step (steady state, bubble, exposed P2P): step less DP and update
    passes: PipelinePasses  # the pass times and hop it was priced from (costmodel.twin replays them)

    def __len__(self) -> int:
        return len(self.step_time_s)

    def as_dict(self, i: int, cfg: ConfigBatch) -> dict:
        """The contract object of `mofa evaluate --json` for configuration i."""
        ft = self.ettr is not None
        return {
            "config": cfg.row(i),
            "step_time_s": float(self.step_time_s[i]),
            "breakdown_s": {k: float(v[i]) for k, v in self.breakdown_s.items()},
            "memory_bytes": {k: int(round(float(v[i]))) for k, v in self.memory_bytes.items()},
            "memory_gib": {k: float(v[i]) / GIB for k, v in self.memory_bytes.items()},
            "memory_capacity_bytes": self.capacity_bytes,
            "worst_rank": RANK_NAMES[int(self.worst_rank[i])],
            "fits": bool(self.fits[i]),
            "host_memory_gb": float(self.host_bytes[i]) / GB,
            "host_fits": bool(self.host_fits[i]),
            "microbatches": float(self.microbatches[i]),
            "tflops_per_gpu": float(self.tflops_per_gpu[i]),
            "mfu": float(self.mfu[i]),
            "hfu": float(self.hfu[i]),
            "tokens_per_s_per_gpu": float(self.tokens_per_s_per_gpu[i]),
            "tokens_per_s": float(self.tokens_per_s[i]),
            "model_flops_per_step": self.model_flops_per_step,
            "flops_convention": self.flops_convention,
            "mfu_convention": mfu_convention(self.flops_convention),
            "checkpoint_save_s": self.checkpoint_save_s,
            "ettr": float(self.ettr[i]) if ft else None,
            "checkpoint_interval": int(self.checkpoint_interval[i]) if ft else None,
            "e2e_time_s": (float(self.e2e_time_s[i]) if self.e2e_time_s is not None else None),
            "moe_chunks_used": int(self.moe_chunks[i]),
            "lower_bounds_s": None if self.lower_bounds_s is None else {k: float(v[i]) for k, v in self.lower_bounds_s.items()},
        }


def reliability_of_step(problem: Problem, step_s: np.ndarray, interval: np.ndarray):
    """Checkpoint interval (eq. 44 where `interval` is 0, else as given), ETTR and end-to-end
    time (eqs. 36-43) of configurations with these step times; (None, None, None) without a
    fault-tolerance section. ETTR is the steady-state one when the step count is unknown, else the share of the end-to-end time spent on useful steps."""
    ft = problem.fault_tolerance
    if ft is None:
        return None, None, None
    save_s = checkpoint_save_s(problem)
    rate = failure_rate_per_s(problem.cluster.num_nodes, ft.failure_rate_per_node_day)
    u_b = ft.mean_recovery_s
    interval = np.where(interval > 0, interval, optimal_interval(step_s, rate, u_b, save_s, problem.search.max_interval))
    steps = problem.training.total_steps
    if steps is None:
        return interval, steady_state_ettr(step_s, interval, rate, u_b, save_s), None
    e2e = end_to_end_s(steps, step_s, interval, rate, u_b, save_s, ft.first_init_s)
    with np.errstate(invalid="ignore"):
        ettr = np.where(np.isfinite(e2e), steps * step_s / e2e, 0.0)
    return interval, ettr, e2e


def checkpoint_save_s(problem: Problem) -> float | None:
    """T_save: given, or the full training state (weights + optimizer states) written by all
    nodes at the given per-node bandwidth."""
    ft = problem.fault_tolerance
    if ft is None:
        return None
    if ft.checkpoint_save_s is not None:
        return ft.checkpoint_save_s
    tr = problem.training
    d_para, d_opt = tr.bytes_of("params"), tr.bytes_of("optimizer")
    states = optimizer_state_bytes(d_para, d_opt)
    state_bytes = arch.total_params(problem.model) * (d_para + states)
    return state_bytes / (ft.checkpoint_write_gb_per_s_per_node * GB * problem.cluster.num_nodes)


def layer_key_fields(order: list[str]) -> tuple[str, ...]:
    """Fields that fix the layer-level costs. The TP/CP/EP groups sit where the placement order
    puts them; if PP or DP is placed inside one of them, their sizes move its strides."""
    inner = max(order.index(d) for d in ("tp", "cp", "ep"))
    extra = tuple(f for f, dim in (("pp", "pp"), ("dp", "dp")) if order.index(dim) < inner)
    return LAYER_KEY_FIELDS + extra


def layer_costs(problem: Problem, cfg: ConfigBatch, bounds: bool = False) -> LayerCosts:
    """Layer-level costs (eqs. 1, 3, 7, 8, 17-22, 29-35) for each configuration of `cfg`, with
    each layer's lower bounds (costmodel.bounds) when `bounds`."""
    m, tr, hw, cl = problem.model, problem.training, problem.hardware, problem.cluster
    eff = hw.efficiency
    d_act = DTYPE_BYTES[tr.dtypes.activations]
    shard = arch.Shard(t=cfg.tp.astype(float), c=cfg.cp.astype(float), e=cfg.ep.astype(float), etp=cfg.etp.astype(float), b=cfg.mbs.astype(float), seq=tr.seq_len, sp=tr.sequence_parallel,
                       chunks=np.maximum(cfg.moe_chunks, 1.0),
                       keeps_gathered=float(not tr.tp_backward_overlap) * (cfg.tp_overlap == 0) * (cfg.tp > 1) * float(tr.sequence_parallel))
    works = [arch.layer_work(m, tr, shard, d_act, kind) for kind in model_kinds(m, tr)]
    edge = arch.edges(m, tr, shard, d_act, cfg.pp)

    comp = ComputeModel(hw, tr.dtypes.compute, DTYPE_BYTES[tr.dtypes.compute], tr.attention_impl)
    net = Network(hw, cl)
    where = place(cl.placement, cfg, net)
    host = (hw.d2h_gb_per_s * eff.host_link_efficiency * GB, hw.h2d_gb_per_s * eff.host_link_efficiency * GB)
    unfused = tr.attention_kernel == "unfused"
    # document masks: the rank that paces each layer (the slowest of a ring / all-gather CP group)
    ring = np.select([cfg.cp_comm == CP_COMM_CODES["a2a"], cfg.cp_comm == CP_COMM_CODES["a2a+p2p"]], [np.ones_like(cfg.cp), cfg.cp / np.maximum(cfg.cp_a2a, 1.0)], cfg.cp)
    factor = attention_factor(tr.seq_len, tr.mean_document_tokens, cfg.cp, ring)
    # query tokens of one attention call: a sequence's share of the ring (whole sequences for
    # Ulysses), no longer than a document under document masks
    tokens = tr.seq_len / ring
    causal_len = float(tr.seq_len)  # the tokens of one causal self-attention (a document under document masks)
    if tr.mean_document_tokens is not None:
        tokens = np.minimum(tokens, tr.mean_document_tokens)
        causal_len = float(min(tr.seq_len, tr.mean_document_tokens))
    # the share of a rank's attention work in causal self-attention calls (the diagonal blocks of
    # its chunks; the rest are rectangles): where the kernel's grid tail weighs (ComputeModel.attention_time)
    diagonal = tokens / causal_len
    times = [layer_time(work, m, cfg, where, comp, net, eff, unfused, host, factor, tokens, tr.moe.dispatcher,
                        tr.sequence_parallel, tr.tp_backward_overlap, diagonal) for work in works]
    if bounds:
        ideal = ideal_network(hw, cl)
        ideal_where = place(cl.placement, cfg, ideal)
        per_kind = [kind_bounds(work, comp, factor, collectives(work, m, cfg, ideal_where, ideal, tr.moe.dispatcher)) for work in works]
    else:
        per_kind = [None] * len(works)

    # embedding (first rank) and output head + loss (last rank), per micro-batch
    emb_f = comp.memory_time(edge.embedding_memory_bytes)
    head_gemm = comp.gemm_time(edge.head_gemm)
    head_dgrad, head_wgrad = comp.gemm_backward_times(edge.head_gemm)
    head_mem = comp.memory_time(edge.head_memory_bytes, 4.0)
    head_tp = net.all_gather(edge.head_tp_bytes, where.tp)
    # an MTP module beyond its layer: the 2h -> h projection (TP-split) and its own head and loss
    h = m.hidden_size
    proj = arch.Gemm("mtp_proj", shard.tokens, h / shard.t, np.full_like(shard.tokens, 2 * h))
    mtp_compute = comp.gemm_time(proj) + sum(comp.gemm_backward_times(proj)) + head_gemm + head_dgrad + head_wgrad + 2.0 * head_mem
    staging = hw.tp_overlap_buffers if tr.tp_overlap_impl == "userbuffers" else 0  # async TP stages nothing
    return LayerCosts(
        kinds=[kind_costs(work, t, cfg, b) for work, t, b in zip(works, times, per_kind)],
        embedding_f=emb_f,
        embedding_b=2.0 * emb_f,
        head_compute=head_gemm + head_dgrad + head_wgrad + 2.0 * head_mem,
        head_forward=head_gemm + head_mem + head_tp,
        head_weight_grad=head_wgrad,
        head_tp=2.0 * head_tp,
        head_saved=edge.head_saved,
        embedding_params=edge.embedding_params_local + 0.0 * emb_f,
        head_params=edge.head_params_local + 0.0 * emb_f,
        # Megatron sends [s/cp(/tp with SP), b, h]; old Megatron's scatter/gather sent 1/tp without SP
        hop_bytes=d_act * (shard.tokens / shard.t if tr.p2p_scatter_gather else shard.tokens_sp) * m.hidden_size,
        comm_buffer_bytes=np.maximum.reduce([layer_buffers(work, cfg, shard, d_act, h, staging) for work in works]),
        mtp_compute=mtp_compute if m.mtp_layers else 0.0 * emb_f,
        mtp_params=(2 * h * h / shard.t + 2 * h) + 0.0 * emb_f,
        head_output_bytes=edge.head_output_bytes + 0.0 * emb_f,
    )


#: MoE layers whose routing imbalance grows with depth are costed in this many depth bands, each at
#: its deepest layer's factor (exact for the deepest layer of every band, conservative for the rest)
IMBALANCE_BANDS = 8


def layer_kinds(m, tr=None) -> list[tuple]:
    """The kind of each layer: ModelSpec.layer_kinds(), and when training.moe's imbalance varies
    with depth (MemFine Fig. 2), MoE layers split into up to IMBALANCE_BANDS contiguous bands of
    MoE depth, each kind carrying its band's range of relative depth (0 the first MoE layer, 1 the
    last): the layers of a band share their costs, the worst layer of each pipeline stage sets the
    stage's peak."""
    kinds = m.layer_kinds()
    if m.moe is None or tr is None or tr.moe.flat:
        return kinds
    moe = [i for i, (_, mlp) in enumerate(kinds) if mlp == "moe"]
    n = len(moe)
    bands = min(n, IMBALANCE_BANDS)
    band_of = [j * bands // n for j in range(n)]
    depth = lambda j: j / max(n - 1, 1)
    ranges = {b: (depth(band_of.index(b)), depth(n - 1 - band_of[::-1].index(b))) for b in set(band_of)}
    out = list(kinds)
    for j, i in enumerate(moe):
        out[i] = (kinds[i][0], "moe", ranges[band_of[j]])
    return out


def mtp_kind(m, tr=None) -> tuple:
    """The MTP module's layer kind: like the last layer (at the deepest MoE imbalance)."""
    kind = arch.mtp_kind(m)
    return ("full_attention", "moe", (1.0, 1.0)) if kind[1] == "moe" and len(layer_kinds(m, tr)[-1]) > 2 else kind


def model_kinds(m, tr=None) -> list[tuple]:
    """The layer kinds the model's costs are computed for: the distinct `layer_kinds` in order,
    then the MTP module's layer kind if the model has MTP and the kind is new."""
    kinds = list(dict.fromkeys(layer_kinds(m, tr)))
    if m.mtp_layers and mtp_kind(m, tr) not in kinds:
        kinds.append(mtp_kind(m, tr))
    return kinds


def kind_of_layers(m, tr=None) -> list[int]:
    index = {kind: i for i, kind in enumerate(model_kinds(m, tr))}
    return [index[kind] for kind in layer_kinds(m, tr)]


def layer_buffers(work: arch.LayerWork, cfg: ConfigBatch, shard: arch.Shard, d_act: int, hidden: int, tp_overlap_buffers: int) -> np.ndarray:
    """Communication buffers one layer allocates while it runs: the TP all-gathered input and
    the pre-reduce-scatter output of a sequence-parallel GEMM, Transformer Engine's userbuffers
    under TP overlap, the CP exchange (ring: a send and a receive block; all-gather: the whole
    sequence's K/V; all-to-all: the re-sharded q/k/v/output), the EP combine buffer (the rank's
    own token copies coming back; what it receives in the dispatch is the experts' saved input)."""
    full = d_act * shard.tokens * hidden  # [s/cp, b, h] on one rank
    tp = (cfg.tp > 1) * (2.0 * full + (cfg.tp_overlap == 1) * tp_overlap_buffers * full)
    v = cfg.cp_comm
    cp = (cfg.cp > 1) * np.select(
        [v == CP_COMM_CODES["all_gather"], v == CP_COMM_CODES["a2a"], v == CP_COMM_CODES["a2a+p2p"]],
        [work.cp_bytes * cfg.cp, work.cp_a2a_bytes, work.cp_a2a_bytes + 2.0 * work.cp_bytes],
        2.0 * work.cp_bytes,
    )
    return tp + cp + work.ep_buffer_bytes


def shared_layer_costs(problem: Problem, cfg: ConfigBatch, bounds: bool = False) -> LayerCosts:
    """MPE's layer-cost reuse (seed 002): configurations that differ only in pipeline, DP,
    optimizer or checkpoint choices share their layer costs, so compute each distinct layer
    shape once and gather. The key is a mixed-radix number of the fields (radix max + 1); a
    field whose radix would overflow int64 is replaced by its rank among its distinct values."""
    names = layer_key_fields(problem.cluster.placement)
    key = np.zeros(len(cfg), dtype=np.int64)
    span = 1
    for name in names:
        column = getattr(cfg, name).astype(np.int64)
        radix = int(column.max(initial=0)) + 1
        if span * radix >= 2**62:
            values, column = np.unique(column, return_inverse=True)
            radix = len(values)
        span *= radix
        key = key * radix + column.ravel()
    first, inverse = unique_rows(key)
    if len(first) == len(cfg):
        return layer_costs(problem, cfg, bounds)
    return layer_costs(problem, cfg.take(first), bounds).take(inverse)


def evaluate(problem: Problem, cfg: ConfigBatch, bounds: bool = False) -> Evaluation:
    """Score every configuration of `cfg`; with `bounds`, also the lower bounds per phase
    (costmodel.bounds) that outputs show beside the prediction (the searches do without: they
    cost about a fifth of the throughput)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        auto = cfg.moe_chunks == MOE_CHUNKS_AUTO
        if auto.any():
            cfg = mact(problem, cfg, auto)
        return _evaluate(problem, cfg, bounds)


def mact(problem: Problem, cfg: ConfigBatch, auto: np.ndarray, bins=MOE_CHUNK_BINS) -> ConfigBatch:
    """MemFine's MACT for the rows that ask for it: the chunk count of eq. 9 rounded up to a bin,
    i.e. the smallest bin whose peak fits the GPU (eq. 8's s'_max is where the peak meets the
    capacity), the largest bin when none fits. One count per configuration: the one its tightest
    pipeline stage needs (MemFine tunes each stage, and each iteration, on its own)."""
    rows = np.flatnonzero(auto)
    sub = cfg.take(rows)
    fits = []
    for b in bins:
        trial = ConfigBatch(**{**{f: getattr(sub, f) for f in sub.__dataclass_fields__}, "moe_chunks": np.full(len(sub), float(b))})
        fits.append(_evaluate(problem, trial).fits)
    column = cfg.moe_chunks.copy()
    column[rows] = choose_bin(fits, bins)
    return ConfigBatch(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, "moe_chunks": column})


def _evaluate(problem: Problem, cfg: ConfigBatch, with_bounds: bool = False) -> Evaluation:
    m, tr, hw, cl = problem.model, problem.training, problem.hardware, problem.cluster
    d_para, d_grad, d_opt = tr.bytes_of("params"), tr.bytes_of("grads"), tr.bytes_of("optimizer")
    G = cl.num_gpus
    moe = m.moe is not None
    lc = shared_layer_costs(problem, cfg, with_bounds)
    comp = ComputeModel(hw, tr.dtypes.compute, DTYPE_BYTES[tr.dtypes.compute], tr.attention_impl)
    net = Network(hw, cl)
    groups = stage_groups(cl.placement, cfg, net, experts=m.moe is not None)
    x = cfg.derived()
    v = cfg.vp

    kinds = model_kinds(m, tr)
    ranks = rank_classes(kind_of_layers(m, tr), len(kinds), cfg)
    if m.mtp_layers:  # the MTP modules follow the last layer: on the rank holding the head
        mtp = kinds.index(mtp_kind(m, tr))
        ranks = [replace(r, counts=[c + m.mtp_layers * r.last * (i == mtp) for i, c in enumerate(r.counts)]) for r in ranks]
    micro = tr.global_batch_size / np.maximum(cfg.mbs * np.maximum(cfg.dp, 1), 1)
    windows = grad_windows(cfg, micro) if x.any_zero2 else None
    params = [rank_params(rank, lc, m.tied_embeddings, m.mtp_layers) for rank in ranks]
    zero = np.zeros(len(cfg))

    parts = {k: [] for k in ("compute", "recompute", "tp", "cp", "ep", "fsdp", "offload", "overhead")}
    chunk_overhead = hw.efficiency.stage_overhead_us * US  # per chunk, per pass
    fwd, bwd, wgrad, layer_bounds, windows_exposed = [], [], [], [], []
    for k, rank in enumerate(ranks):
        def both(name):  # summed over the layer kinds the rank holds
            return sum(count * getattr(kind, name) for count, kind in zip(rank.counts, lc.kinds))

        layers = np.maximum(rank.layers, 1.0)
        if with_bounds:
            layer_bounds.append({"compute": both("bound_compute"), "hbm_bytes": both("bound_hbm_bytes"), "tp": both("bound_tp"), "cp": both("bound_cp"), "ep": both("bound_ep")})
        layer_forward = both("forward")
        compute = both("compute")
        f = layer_forward
        if rank.first:
            compute = compute + lc.embedding_f + lc.embedding_b
            f = f + lc.embedding_f
        # full recompute re-runs the forward of every layer (uniform) or of the first N layers
        # of each virtual stage (block); selective re-runs the chosen modules of every layer
        recompute = both("recompute")
        if x.any_full_recompute:
            covered = blend(x.block_recompute, np.minimum(cfg.recompute_layers * v, layers) / layers, 1.0) if x.any_block_recompute else 1.0
            recompute = blend(x.full_recompute, covered * layer_forward, recompute)
        head = lc.head_compute + m.mtp_layers * lc.mtp_compute if m.mtp_layers else lc.head_compute
        parts["compute"].append(compute + rank.last * head)
        parts["recompute"].append(recompute)
        parts["tp"].append(both("tp") + rank.last * lc.head_tp)
        parts["cp"].append(both("cp"))
        parts["ep"].append(both("ep"))
        parts["offload"].append(both("offload") if x.any_offload else zero)
        f = f + rank.last * lc.head_forward

        # ZeRO-2/3 traffic inside the pipeline, per step, spread over the micro-batches
        fsdp, fsdp_f, window_exposed = zero, zero, zero
        if x.any_zero2:
            dense_p, expert_p = params[k]
            per_mb = sum(parts[key][-1] for key in ("compute", "recompute", "tp", "cp", "ep", "offload"))  # one micro-batch, both passes
            prefetch_used = zero
            if x.any_zero3:
                expert_per_layer = both("expert_params") / layers
                dense_per_layer = both("params") / layers - expert_per_layer
                edge_params = rank.first * lc.embedding_params + rank.last * lc.head_params
                gathers_f, gathers_b = zero3_gathers_per_step(cfg.reshard_after_forward, cfg.pp, micro, windows)
                f_layer = layer_forward / layers
                # the backward prefetch hides behind the layer's own backward (with its recompute
                # and exposed communication), not a multiple of the forward: a feature that
                # shortens the forward must not shrink the backward window by more than it saves
                layer_both = sum(both(key) for key in ("compute", "recompute", "tp", "cp", "ep")) + (both("offload") if x.any_offload else 0.0)
                b_layer = layer_both / layers - f_layer
                gathers = zero3_gathers(dense_per_layer, expert_per_layer, edge_params, layers / v, gathers_f, gathers_b, v, x, groups, net, hw, d_para, f_layer, b_layer, moe)
                fsdp = gathers.exposed_f + gathers.exposed_b
                fsdp_f = gathers.exposed_f / micro  # the forward gathers' exposed time is the forward pass's
                prefetch_used = gathers.window_used
            # one overlap budget: a window's reduce-scatter hides behind the compute between two
            # windows that the parameter prefetches of the same stretch do not already overlap
            stage_gap = window_compute_s(micro, per_mb, prefetch_used, windows, v)
            window_exposed = window_traffic(dense_p, expert_p, v, x, groups, net, hw, d_grad, windows, stage_gap, moe) / micro
            fsdp = fsdp / micro + window_exposed
        parts["fsdp"].append(fsdp)
        parts["overhead"].append(2.0 * v * chunk_overhead if chunk_overhead else zero)
        f = f + v * chunk_overhead + fsdp_f
        fwd.append(f)
        bwd.append(sum(p[-1] for p in parts.values()) - f)
        wgrad.append(both("weight_grad") + rank.last * lc.head_weight_grad if x.any_dualpipev else zero)
        windows_exposed.append(window_exposed)

    per_rank = [fwd[k] + bwd[k] for k in range(len(ranks))]
    hop = net.p2p_hop(lc.hop_bytes, groups.pp)
    # the busiest middle rank's chunks, and under DualPipeV's V rank pp - 1's too (a middle rank
    # there, with no head): with an MoE model's leading dense layers on rank 1, the all-MoE ranks
    # after it pace the V (the replay, costmodel.twin, put DeepSeek-V3 on pp 16 0.3% slower than
    # a bubble of rank 1's chunks)
    vee = cfg.pp_schedule == PP_SCHEDULE_CODES["dualpipev"]
    busiest = argmax_masks(per_rank[1:-1] + [np.where(vee, per_rank[-1], -1.0)])

    def middle(passes):  # one pass of the busiest middle rank, per chunk
        return pick(busiest, passes[1:]) / v

    chunk_f, chunk_b, chunk_w = middle(fwd), middle(bwd), middle(wgrad)
    # DualPipeV's bubble weighs the passes' own chunks: a gradient window's exposed
    # reduce-scatter stalls once per window and stays in R_r. Booked to the backward chunk, the
    # exposure an overlap adds where it shortens the forward (less compute to hide it behind)
    # moved time from F to B, which the bubble weighs twice: TP overlap made a ZeRO-3 DualPipeV
    # step of Llama 3 405B slower (+1 ms) with alpha = beta = 1
    bubble_b = chunk_b - middle(windows_exposed)
    pipe = pipeline_time(per_rank, cfg, micro, hop, chunk_f, chunk_b, chunk_w, hw.efficiency.pp_overlap, bubble_b=bubble_b,
                         rank_counts=[r.ranks for r in ranks])

    # memory per rank class; the optimizer step of the rank with the most to do
    mc = memory_context(problem)
    communicators = communicator_count(cfg, x, moe)
    ledgers = []
    opt_dp, opt_update = [], []
    for k, rank in enumerate(ranks):
        flight = in_flight(rank.rank, cfg, micro)
        ledger = rank_memory(rank, flight, lc, cfg, x, mc, communicators, m.mtp_layers, micro)
        ledgers.append(ledger)
        cooldown = cooldown_passes(cfg, x)
        window_b = cooldown * bwd[k]
        window_f = cooldown * fwd[k]
        ot = optimizer_time(ledger.dense_params, ledger.expert_params, x, groups, net, hw, (d_para, d_grad, d_opt), comp, window_b, window_f, cfg.vp, moe,
                            tr.optimizer_impl)
        opt_dp.append(ot.dp_exposed)
        opt_update.append(ot.update)
    slowest = argmax_masks([dp + up for dp, up in zip(opt_dp, opt_update)])
    dp_exposed = pick(slowest, opt_dp)
    update = pick(slowest, opt_update)

    step = pipe.total + dp_exposed + update
    bounds = None
    if with_bounds:
        ideal = ideal_network(hw, cl)
        bounds = step_bounds(layer_bounds, params, micro, x, stage_groups(cl.placement, cfg, ideal, experts=moe), ideal, (d_para, d_grad, d_opt), hw.memory_bandwidth_gb_per_s * GB, moe,
                              tr.optimizer_impl)
    breakdown = {key: zero if all(v is zero for v in parts[key]) else micro * pick(pipe.bottleneck, parts[key]) for key in parts}
    breakdown["pp"] = pipe.pp_exposed
    breakdown["bubble"] = pipe.bubble
    breakdown["dp"] = dp_exposed
    breakdown["update"] = update
    breakdown = {k: breakdown[k] for k in BREAKDOWN_KEYS}

    peaks = [lg.peak for lg in ledgers]
    worst = argmax_masks(peaks)
    memory = {key: pick(worst, [getattr(lg, key) for lg in ledgers]) for key in MEMORY_KEYS}
    memory["peak"] = pick(worst, peaks)
    host_used = np.maximum.reduce([lg.host for lg in ledgers])

    tokens = tr.global_batch_size * tr.seq_len
    convention = mfu_convention(tr.flops_convention)
    model_flops = tokens * convention_flops_per_token(m, tr.seq_len, convention)
    hw_flops = model_flops + tokens * recompute_flops_per_token(m, tr.seq_len, cfg, causal=convention == "palm_causal")
    peak_flops = hw.peak(tr.dtypes.compute) * TFLOP
    tflops = model_flops / (step * G) / TFLOP

    save_s = checkpoint_save_s(problem)
    interval, ettr, e2e = reliability_of_step(problem, step, cfg.interval)

    return Evaluation(
        step_time_s=step,
        breakdown_s=breakdown,
        memory_bytes=memory,
        # a middle class is the last rank when pp = 2 (rank_classes): name it so
        worst_rank=np.where((cfg.pp == 2) & (worst[-1] == 0) & (worst[0] == 0), 2.0, sum(worst[1:-1]) + 2.0 * worst[-1]),
        fits=memory["peak"] <= hw.memory_bytes,
        capacity_bytes=hw.memory_bytes,
        host_bytes=host_used,
        host_fits=host_used <= mc.host_share_bytes,
        microbatches=micro,
        tflops_per_gpu=tflops,
        mfu=model_flops / (step * G * peak_flops),
        hfu=hw_flops / (step * G * peak_flops),
        tokens_per_s_per_gpu=tokens / (step * G),
        tokens_per_s=tokens / step,
        model_flops_per_step=float(model_flops),
        flops_convention=tr.flops_convention,
        checkpoint_save_s=save_s,
        pp_without_overlap_s=pipe.pp_without_overlap,
        pp_overlap_floor_s=pipe.pp_overlap_floor,
        ettr=ettr,
        checkpoint_interval=interval,
        e2e_time_s=e2e,
        moe_chunks=cfg.moe_chunks,
        lower_bounds_s=bounds,
        pipeline_s=pipe.total,
        passes=PipelinePasses(tuple(fwd), tuple(bwd), tuple(wgrad), hop),
    )
