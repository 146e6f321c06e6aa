"""Memory cost model: MoFa eqs. 4-6 with the memory-level features (eqs. 25, 27, 29, 31, 33),
ZeRO/FSDP sharding, and the ledger lines a GPU really spends memory on (note 004's memory book).

One ledger per pipeline-rank class; every line in bytes:
  params      weights the rank keeps (D_para per parameter; ZeRO-3 keeps 1/shard of them)
  grads       the gradient buffer (D_grad): whole under ZeRO-0/1; ZeRO-2/3 keep 1/shard plus the
              unsharded gradients of the accumulation window (Llama 3 Figure 4: one virtual stage
              at a time, two while the previous window's reduce-scatter drains; the whole rank
              when the window spans the step, i.e. 1F1B with vp = 1; two layers' reduce buckets
              without pipelining)
  optimizer   optimizer states (eq. 4, see below), sharded from ZeRO-1 on (eq. 25), on the host
              with the CPU optimizer (eq. 27)
  gathered_params  ZeRO-3: parameters gathered for compute -- the layer running and the one being
              prefetched, or, when they are not freed after the forward, every layer of the rank
  activations tensors kept for the backward (eqs. 5, 29, 31, 33), see below
  optimizer_transient  the optimizer step's D_opt copy of the gradients, as far as it exceeds the
              activations it replaces
  comm_buffers  buffers of the collectives: pipeline send/receive (2 activation micro-batches;
              PyTorch's pipelining one per micro-batch and stage, `pipeline_buffer_count`),
              the largest per-layer TP/SP gather, CP K/V exchange and EP dispatch buffer, Transformer
              Engine's TP-overlap userbuffers, and NCCL's own buffers per communicator
  cuda_context  the CUDA context and cuBLAS workspaces (hardware preset)
  fragmentation the caching allocator's reserve over the transient allocations (training field)
Peak (eq. 6) = the sum; the reported peak is that of the worst rank, compared with the bytes the
GPU exposes.

Optimizer states (eq. 4). Eq. 4 charges 4*D_opt per parameter for the optimizer; Megatron's
mixed-precision Adam keeps three D_opt tensors for the whole run -- the fp32 master weight and the
two moments (two if the weights already are fp32) -- and, when gradients are kept in a narrower
type than D_opt, materialises an fp32 copy of the gradients only for the optimizer step
(DistributedOptimizer._copy_model_grads_to_main_grads), freed by the next zero_grad before any
activation exists. So: states = 3*D_opt persistently, plus a D_opt transient that competes with
the activations for the peak rather than adding to it. With fp32 gradients (Megatron's default)
this is the familiar 18 bytes per parameter. `training.optimizer_memory: mofa_eq4` keeps eq. 4
literally (4*D_opt throughout) to reproduce MoFa's own figures: its Table 7 row 3 (43.50 GB) is
22 bytes x 1.594e9 parameters + its ~8.5 GB of other memory.

Activations (eq. 5): in-flight micro-batch chunks (pipeline.in_flight, by schedule) times the
tensors one chunk keeps. Selective recompute (eq. 29) drops what the chosen modules re-create;
full recompute (eq. 31) keeps each checkpointed group's input (method uniform: groups of N
layers; method block: the first N layers of each virtual stage, the rest keep everything) plus
one group's complete set while it is recomputed; MoFa's whole-layer offload (eq. 33) keeps one
layer's set -- we keep two, because the asynchronous copy of layer i overlaps the computation of
layer i+1, so both are resident at the peak -- plus the input tensor of every in-flight chunk,
which the pipeline schedule holds for the backward pass and offloading therefore cannot free;
Megatron's fine-grained offload moves the chosen modules' saved inputs and keeps the rest, with
two layers' offloaded tensors in transit. MemFine's FCDA (moe_chunks c > 1) keeps none of the
routed experts' tensors (they are recomputed chunk by chunk) and holds one chunk of them, 1/c,
while a layer runs; under full recompute the recomputed layer's working set holds 1/c of them
(MemFine section 4.1: the peak is the largest chunk).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.arrays import blend
from costmodel.configs import OFFLOAD_LAYER, PP_SCHEDULE_CODES, ConfigBatch, Derived
from costmodel.layer import LayerCosts
from costmodel.pipeline import RankLayers
from costmodel.specs import MOE_CHUNK_BINS
from costmodel.units import GB, MIB, optimizer_state_bytes

MEMORY_KEYS = ("params", "grads", "optimizer", "gathered_params", "activations", "optimizer_transient", "comm_buffers", "cuda_context", "fragmentation")


@dataclass(frozen=True)
class RankMemory:
    params: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    gathered_params: np.ndarray
    activations: np.ndarray
    optimizer_transient: np.ndarray  # part of the optimizer-step transient above the activations
    comm_buffers: np.ndarray
    cuda_context: np.ndarray
    fragmentation: np.ndarray
    host: np.ndarray  # host memory this GPU uses (CPU optimizer states, offloaded activations)
    dense_params: np.ndarray  # parameter counts, for the optimizer step and DP communication
    expert_params: np.ndarray

    @property
    def peak(self) -> np.ndarray:
        return sum(getattr(self, key) for key in MEMORY_KEYS)


@dataclass(frozen=True)
class MemoryContext:
    """What every rank's ledger shares: dtypes, the hardware's fixed costs, the settings."""

    d_para: int
    d_grad: int
    d_opt: int
    cuda_context_bytes: float
    nccl_bytes_per_group: float
    host_share_bytes: float
    tied_embeddings: bool
    mofa_eq4: bool
    fragmentation: float
    buffers_per_microbatch: bool = False  # training.pipeline_buffers per_microbatch (torch.distributed.pipelining)
    last_stage_outputs_kept: bool = False  # and its step() returning the outputs (training.pipeline_return_outputs)
    grads_freed_between_steps: bool = False  # training.grads_freed_between_steps (FSDP2's zero_grad set_to_none)
    every_stage_outputs_kept: bool = False  # training.pipeline_every_stage_outputs (torch <= 2.6 output_chunks)


def rank_params(rank: RankLayers, lc: LayerCosts, tied_embeddings: bool, mtp_layers: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) parameter counts of a rank class: its layers, the embedding on the first
    rank, the head (and the MTP modules' projections) on the rank that holds it (tied and on one
    rank: shared; tied across ranks: Megatron keeps a copy)."""
    expert = sum(count * kind.expert_params for count, kind in zip(rank.counts, lc.kinds))
    dense = sum(count * kind.params for count, kind in zip(rank.counts, lc.kinds)) - expert
    head = lc.head_params + mtp_layers * lc.mtp_params
    if rank.first:
        dense = dense + lc.embedding_params
        if tied_embeddings:
            head = head - lc.embedding_params
    return dense + rank.last * head, expert


def _per_chunk(rank: RankLayers, lc: LayerCosts, v, name: str) -> np.ndarray:
    """Sum over the layer kinds of one virtual stage of the rank."""
    return sum(count / v * getattr(kind, name) for count, kind in zip(rank.counts, lc.kinds))


def _largest(rank: RankLayers, lc: LayerCosts, name: str) -> np.ndarray:
    """The largest layer of a kind the rank holds."""
    return np.maximum.reduce([(count > 0) * getattr(kind, name) for count, kind in zip(rank.counts, lc.kinds)])


def activation_bytes(rank: RankLayers, in_flight: np.ndarray, lc: LayerCosts, cfg: ConfigBatch, x: Derived, mtp_layers: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(activations on the GPU, activations on the host) of a rank at its peak; the rank with
    the head keeps the loss's logits (and each MTP module's)."""
    head_saved = lc.head_saved * (1 + mtp_layers)
    v = cfg.vp

    def per_chunk(name):
        return _per_chunk(rank, lc, v, name)

    def largest(name):
        return _largest(rank, lc, name)

    kept = per_chunk("activation")
    resident = in_flight * kept
    zero = 0.0 * kept
    if x.any_chunks:  # FCDA: one chunk of the experts' tensors while a layer runs or is recomputed
        resident = resident + (1.0 - x.full_recompute) * largest("chunk_work")
    if not (x.any_full_recompute or x.any_offload):  # nothing else to count in this batch
        return resident + rank.last * head_saved, zero
    chunk_layers = np.maximum(rank.layers / v, 1.0)
    inputs = per_chunk("input_bytes")
    full_set = largest("saved_full")
    if x.any_full_recompute:
        # full recompute: uniform keeps one input per group of N layers; block recomputes the
        # first N layers of each virtual stage and keeps everything of the others
        n = np.maximum(cfg.recompute_layers, 1.0)
        uniform = np.ceil(chunk_layers / n) / chunk_layers * inputs
        recomputed, working = uniform, np.minimum(n, chunk_layers) * full_set
        if x.any_block_recompute:
            covered = np.minimum(n, chunk_layers) / chunk_layers
            recomputed = blend(x.block_recompute, covered * inputs + (1.0 - covered) * kept, uniform)
            working = blend(x.block_recompute, full_set, working)
        resident = in_flight * blend(x.full_recompute, recomputed, kept) + x.full_recompute * working
        if x.any_chunks:
            resident = resident + (1.0 - x.full_recompute) * largest("chunk_work")
    if not x.any_offload:
        return resident + rank.last * head_saved, zero
    offloaded = per_chunk("offloaded")
    modules = (cfg.activation_offload > 0) & (cfg.activation_offload != OFFLOAD_LAYER)
    # MoFa's whole-layer offload: two layers' sets and the input of every in-flight chunk
    # (Megatron's input_tensors list) stay; fine-grained offload: the rest of every chunk stays
    layer_offload = 2.0 * full_set + in_flight * lc.kinds[0].input_bytes
    module_offload = in_flight * (kept - offloaded) + 2.0 * largest("offloaded")
    on_gpu = np.select([x.layer_offload == 1, modules], [layer_offload, module_offload], resident)
    host = (x.layer_offload + modules) * in_flight * np.where(x.layer_offload == 1, kept, offloaded)
    return on_gpu + rank.last * head_saved, host


def pipeline_buffer_count(mc: MemoryContext, cfg: ConfigBatch, microbatches, in_flight, first: bool, last) -> np.ndarray:
    """Activation-sized pipeline buffers a rank holds beyond the stage inputs its in-flight
    micro-batches keep as activations (0 without PP). Megatron (per_transfer): a send and a
    receive in transit, 2 (a sent output's storage is freed once sent: deallocate_output_tensor).
    PyTorch's pipelining (per_microbatch): an activation buffer for every micro-batch of each of
    its stages but the model's first, an output-gradient buffer for every micro-batch of each but
    the last, allocated once for the run (the activation buffers of the micro-batches in flight
    are the stage inputs already counted); and each in-flight micro-batch's stage output, which
    the stage keeps until that micro-batch's backward (stage.py forward_one_chunk: fwd_cache
    holds output_tuple; the model's last stage holds at most one, its logits, counted by the
    loss); where every stage keeps its outputs to the end of the step (torch <= 2.6's
    output_chunks), every chunk's of the step: the stash stays full through the steady state
    while each forward adds an output, so the peak comes at the last forward."""
    if not mc.buffers_per_microbatch or microbatches is None:
        return (cfg.pp > 1) * 2.0
    chunks = microbatches * cfg.vp
    receiving = chunks - (microbatches if first else 0.0)
    sending = chunks - last * microbatches
    counted = np.minimum(in_flight * receiving / chunks, receiving)
    outputs = chunks - last * microbatches if mc.every_stage_outputs_kept else in_flight - last * np.minimum(in_flight, 1.0)
    return (cfg.pp > 1) * (receiving - counted + sending + outputs)


def rank_memory(rank: RankLayers, in_flight: np.ndarray, lc: LayerCosts, cfg: ConfigBatch, x: Derived, mc: MemoryContext, communicators: np.ndarray,
                mtp_layers: int = 0, microbatches=None) -> RankMemory:
    dense_params, expert_params = rank_params(rank, lc, mc.tied_embeddings, mtp_layers)
    params = dense_params + expert_params
    sharded = dense_params / x.shard + expert_params / x.eshard  # this rank's share of the stage's parameters

    # --- parameters and ZeRO-3's gathered copies -----------------------------------------
    kept_params, gathered, grads = params, 0.0 * params, params
    layer_params = None
    if x.any_zero3:
        kept_params = blend(x.shard_params, sharded, params)
        layer_params = _largest(rank, lc, "params")
        edge = np.maximum(lc.embedding_params * rank.first, rank.last * lc.head_params)
        prefetch = 2.0 * np.maximum(layer_params, edge)  # the layer running and the next one
        unfreed = params - sharded  # every layer stays gathered from its forward to its backward
        gathered = x.shard_params * blend(cfg.reshard_after_forward, prefetch, unfreed)

    # --- gradients ---------------------------------------------------------------------------
    # the unsharded window at the activation peak: without pipelining the reduce buckets (two
    # layers); with one stage per rank under 1F1B the whole rank (one window spans the step);
    # all-forward-all-backward peaks as the first stage's backward starts (one stage's
    # gradients); the other schedules hold their peak through the steady state, where one
    # stage accumulates while the previous one's reduce-scatter drains (two stages)
    if x.any_zero2:
        if layer_params is None:
            layer_params = _largest(rank, lc, "params")
        vee = cfg.pp_schedule == PP_SCHEDULE_CODES["dualpipev"]
        spans_step = (cfg.pp > 1) & (cfg.vp == 1) & ~vee
        stages_alive = np.where(cfg.pp_schedule == PP_SCHEDULE_CODES["afab"], 1.0, 2.0)
        window = np.where(cfg.pp == 1, np.minimum(2.0 * layer_params, params), np.where(spans_step, params, np.minimum(stages_alive / cfg.vp, 1.0) * params))
        held = sharded  # the sharded gradients at the activation peak
        if mc.grads_freed_between_steps and microbatches is not None:
            # freed by zero_grad before the step, remade by the reduce-scatters: under a pipeline
            # the micro-batches accumulate unsharded without sync until the stage's last backward,
            # and a single micro-batch peaks as its backward starts, before the first reduce-scatter
            held = np.where((cfg.pp > 1) | (microbatches <= 1), 0.0, sharded)
        grads = blend(x.shard_grads, held + window, params)

    # --- optimizer states (eqs. 4, 25, 27) and the step's transient copy ----------------------
    opt_params = blend(x.shard_states, sharded, params)  # ZeRO-1 and up
    if mc.mofa_eq4:  # MoFa eq. 4 taken literally: four D_opt copies for the whole run
        states, transient = 4 * mc.d_opt * opt_params, 0.0 * opt_params
    else:
        states = optimizer_state_bytes(mc.d_para, mc.d_opt) * opt_params
        transient = (mc.d_opt if mc.d_grad < mc.d_opt else 0) * opt_params
    gpu_states = blend(x.cpu, np.maximum(0.0, states - mc.host_share_bytes), states)
    host_states = x.cpu * np.minimum(states, mc.host_share_bytes)
    gpu_transient = transient * (1.0 - x.cpu)

    activations, host_activations = activation_bytes(rank, in_flight, lc, cfg, x, mtp_layers)
    transient_excess = np.maximum(0.0, gpu_transient - activations)
    pp_buffers = pipeline_buffer_count(mc, cfg, microbatches, in_flight, rank.first, rank.last) * lc.hop_bytes
    if mc.last_stage_outputs_kept and microbatches is not None:
        # the last stage's logits of every micro-batch, kept for step()'s merged return (the one
        # in flight is the loss's, counted in the activations)
        pp_buffers = pp_buffers + (cfg.pp > 1) * rank.last * np.maximum(microbatches - 1.0, 0.0) * lc.head_output_bytes
    buffers = pp_buffers + lc.comm_buffer_bytes
    nccl = communicators * mc.nccl_bytes_per_group
    fragmentation = mc.fragmentation * (activations + mc.d_para * gathered + buffers + transient_excess)
    return RankMemory(
        params=mc.d_para * kept_params,
        grads=mc.d_grad * grads,
        optimizer=gpu_states,
        gathered_params=mc.d_para * gathered,
        activations=activations,
        optimizer_transient=transient_excess,
        comm_buffers=buffers + nccl,
        cuda_context=mc.cuda_context_bytes + 0.0 * params,
        fragmentation=fragmentation,
        host=host_states + host_activations,
        dense_params=dense_params,
        expert_params=expert_params,
    )


def mact_max_tokens(available_bytes, bytes_per_token):
    """MemFine eq. 8: s'_max, the token copies an EP rank may receive in one MoE layer before the
    GPU overflows, = (alpha M_GPU - M_sta - the activations that do not scale with s') / the
    activation bytes of one received copy ((m_g/tc) D_t b (2h + 2g_e) in MemFine's ledger)."""
    return np.asarray(available_bytes, dtype=float) / bytes_per_token


def choose_bin(fits_by_bin, bins):
    """MACT's bin choice (MemFine 4.2): the smallest bin that fits -- fits_by_bin[i] says where
    bins[i] chunks fit --, the largest bin where none does."""
    choice = np.full(np.shape(fits_by_bin[0]), float(bins[-1]))
    for b, fits in zip(reversed(bins), reversed(list(fits_by_bin))):
        choice = np.where(fits, float(b), choice)
    return choice


def mact_chunks(received_tokens, max_tokens, bins=MOE_CHUNK_BINS):
    """MemFine eq. 9 and the bin: c = ceil(s'' / s'_max) token chunks make each chunk fit; MACT
    takes the smallest bin >= c (the largest bin when c exceeds them all)."""
    received = np.asarray(received_tokens, dtype=float)
    return choose_bin([b * np.asarray(max_tokens, dtype=float) >= received for b in bins], bins)


def communicator_count(cfg: ConfigBatch, x: Derived, moe: bool) -> np.ndarray:
    """NCCL communicators a rank uses (groups of more than one rank), as Megatron sets them up:
    TP, CP, the data-parallel (x CP) group and HSDP's replica group, two point-to-point pairs
    for the pipeline (previous and next rank; PyTorch makes a communicator per pair), the
    model-parallel group (gradient-norm and loss reductions), and the expert groups."""
    model_parallel = (cfg.tp * cfg.cp * cfg.pp > 1) * 1.0
    count = (cfg.tp > 1) * 1.0 + (cfg.cp > 1) + 2.0 * (cfg.pp > 1) + (x.dp_cp > 1) + (x.replicas > 1) + model_parallel
    if moe:
        count = count + (cfg.ep > 1) + ((cfg.etp > 1) & (cfg.etp != cfg.tp)) + (x.edp > 1)
    return count


def nccl_and_context(hw) -> tuple[float, float]:
    return hw.cuda_context_mib * MIB, hw.nccl_mib_per_group * MIB


def memory_context(problem) -> MemoryContext:
    """The facts of a problem every rank's memory ledger reads (dtype widths, CUDA context and
    NCCL buffers, the host share per GPU, the optimizer-memory convention, fragmentation)."""
    m, tr, hw, cl = problem.model, problem.training, problem.hardware, problem.cluster
    context_bytes, nccl_bytes = nccl_and_context(hw)
    return MemoryContext(tr.bytes_of("params"), tr.bytes_of("grads"), tr.bytes_of("optimizer"), context_bytes, nccl_bytes,
                         hw.host_memory_gb_per_node * GB / cl.gpus_per_node, m.tied_embeddings, tr.optimizer_memory == "mofa_eq4",
                         tr.allocator_fragmentation, tr.pipeline_buffers == "per_microbatch",
                         tr.pipeline_buffers == "per_microbatch" and tr.pipeline_return_outputs, tr.grads_freed_between_steps,
                         tr.pipeline_buffers == "per_microbatch" and tr.pipeline_every_stage_outputs)
