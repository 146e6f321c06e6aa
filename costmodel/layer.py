"""Layer-level cost model: MoFa eqs. 7-8 with the layer-level optimisation features.

T^FWD = sum of forward operator times + exposed forward communication (eq. 7) and likewise
T^BWD (eq. 8), per layer, per micro-batch, on one GPU, then modified by
  * TP overlap (eq. 20), per (GEMM, collective) pair, split into s_n = tp ring-exchange chunks:
        T_gemm + T_tp -> min(T_gemm, T_tp)/s_n + max(alpha*T_gemm, beta*T_tp)
  * context parallelism, by variant (`cp_comm`):
      p2p (ring attention): K/V blocks travel the ring, cp - 1 steps; the backward sends K/V and
        dK/dV. Overlapped (eq. 21): T_attn + T_cp -> min(T_attn, T_cp)/c + max(alpha*T_attn, beta*T_cp)
      all_gather (Llama 3 section 4): K/V all-gathered before attention (forward), all-gathered again
        and their gradients reduce-scattered (backward): the ring's volume, as collectives, exposed
      a2a (Ulysses): q, k, v and the output all-to-all'd between sequence and head sharding, in
        both passes, exposed; every rank then runs whole sequences for heads/cp
      a2a+p2p (Megatron's hierarchical CP): a2a inside groups of cp_a2a, a ring across them
    Document masks (costmodel.documents) scale the attention work of the rank that paces a layer.
  * EP overlap (eq. 22), forward of one micro-batch against backward of another:
        sum(T_comp) + sum(T_ep) -> max(alpha*sum(T_comp), beta*sum(T_ep))
  * torchtitan's per-op selective recompute (module `ops`, architecture.op_sac): the backward
    re-runs the share of each GEMM and the memory-bound kernels the policy does not keep;
  * selective recompute (eq. 30) by module (Megatron --recompute-modules): the backward re-runs
    the forward operators of the chosen modules (core_attn: the attention core; layernorm: the
    two norms; mlp: the dense MLP; moe_act: the expert activation; moe: the whole MoE block with
    its all-to-alls; shared_experts; mla_up_proj: MLA's up projections). MoFa's eq. 30 also re-runs
    the QKV GEMM; Megatron keeps Q, K, V and re-runs only the attention core (Korthikanti et al.
    section 4.2), so we follow Megatron.
  * full recompute (eq. 32): backward re-runs the whole forward, its communication included
    (how many layers do is the rank's business: pipeline/memory compose it).
  * activation offload (eqs. 34-35) of the bytes the setting offloads (MoFa's whole layer or
    Megatron's chosen modules): T^FWD -> max(beta*M_off/B_d2h, alpha*T^FWD) (eqs. 34-35 name the
    copy's coefficient alpha; here alpha is the computation's, costmodel.specs.OverlapCoefficients),
    and the same for the backward prefetch over H2D.
  * the backward TP collectives Megatron launches asynchronously without userbuffer overlap
    (`tp_backward_exposed`): the input gradient's reduce-scatter (all-reduce without SP) beside
    the wgrad GEMM, the SP input's re-all-gather beside the dgrad GEMM, eq. 24's form (only the
    compute they overlap is slowed).
Every overlap is one of the two forms in costmodel.overlap. Communication that is not
overlapped is fully exposed.

The backward of every GEMM is a data-gradient and a weight-gradient GEMM, each timed at its own
shape (costmodel.compute); the weight-gradient part (W) is kept apart for the zero-bubble family
(DualPipeV). The fused attention backward is `attention_backward_ratio` times its forward, the
linear-attention (Gated DeltaNet) backward `linear_attention_backward_ratio` times its own.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from costmodel.architecture import CHUNKED, SAVED_TAGS, LayerWork, op_sac
from costmodel.compute import ComputeModel
from costmodel.configs import CP_COMM_CODES, OFFLOAD_LAYER, OFFLOAD_MODULE_BITS, RECOMPUTE_MODULE_BITS, ConfigBatch
from costmodel.network import Group, Network
from costmodel.overlap import beyond_window, contended
from costmodel.placement import LayerGroups
from costmodel.specs import EfficiencyProfile, ModelSpec

@dataclass(frozen=True)
class LayerTime:
    """Per layer, per micro-batch times on one GPU (seconds, arrays over configurations).
    forward = comp_f + tp_f + cp_f + ep_f + offload_f, and likewise backward (+ selective recompute)."""

    comp_f: np.ndarray
    comp_b: np.ndarray
    weight_grad: np.ndarray  # the weight-gradient GEMMs inside comp_b
    tp_f: np.ndarray
    tp_b: np.ndarray
    cp_f: np.ndarray
    cp_b: np.ndarray
    ep_f: np.ndarray
    ep_b: np.ndarray
    recompute: np.ndarray  # selective recompute of the chosen modules
    offload_f: np.ndarray
    offload_b: np.ndarray
    attention_f: np.ndarray  # core attention forward (for HFU and reporting)

    @property
    def forward(self) -> np.ndarray:
        return self.comp_f + self.tp_f + self.cp_f + self.ep_f + self.offload_f


@dataclass(frozen=True)
class Collectives:
    """The collectives of one layer's forward on one GPU for one micro-batch, each timed on its
    group before any overlap (layer_time composes them; the lower bounds of costmodel.bounds time
    the same collectives on ideal links)."""

    tp: list[tuple[np.ndarray, str]]  # (time, the GEMM it pairs with) per TP collective
    ring: np.ndarray  # CP K/V ring (p2p, a2a+p2p's outer ring) or all-gather, forward
    cp_a2a: np.ndarray  # Ulysses all-to-all (a2a, a2a+p2p's inner groups), forward
    ep_a2a: np.ndarray  # one EP dispatch (or combine), all FCDA chunks
    etp: np.ndarray  # the expert-TP all-gather

    @property
    def totals(self) -> dict[str, np.ndarray]:
        """Forward + backward per parallel dimension, as layer_time counts them without overlap:
        the TP collectives again in the backward, the ring twice (K/V and dK/dV) and the
        all-to-all once more, dispatch and combine in both passes."""
        tp = sum((t for t, _ in self.tp), 0.0 * self.ring)
        return {"tp": 2.0 * tp, "cp": 3.0 * self.ring + 2.0 * self.cp_a2a, "ep": 4.0 * (self.ep_a2a + self.etp)}


def collectives(work: LayerWork, model: ModelSpec, cfg: ConfigBatch, place: LayerGroups, net: Network, dispatcher: str = "alltoall") -> Collectives:
    """Time the layer's TP, CP and EP collectives on their groups (eqs. 2-3), by CP variant."""
    tp = [(net.all_gather(nbytes, place.tp), gemm) for _, nbytes, gemm in work.tp_bytes]
    v = cfg.cp_comm
    ring_bytes = work.cp_bytes * cfg.cp  # all ranks' K/V blocks: the ring's (or all-gather's) volume
    ring_f = net.all_gather(ring_bytes, place.cp)
    hier_ring_f = net.all_gather(work.cp_bytes * cfg.cp / np.maximum(cfg.cp_a2a, 1.0), place.cp_outer)
    a2a_full = net.all_to_all(work.cp_a2a_bytes, place.cp)
    a2a_inner = net.all_to_all(work.cp_a2a_bytes, place.cp_inner)
    ring = np.select([v == CP_COMM_CODES["a2a+p2p"], v == CP_COMM_CODES["a2a"]], [hier_ring_f, 0.0 * ring_f], ring_f)
    a2a = np.select([v == CP_COMM_CODES["a2a+p2p"], v == CP_COMM_CODES["a2a"]], [a2a_inner, a2a_full], 0.0 * ring_f)
    chunks = work.ep_chunks
    a2a_ep = chunks * net.all_to_all(work.ep_a2a_bytes / chunks, place.ep, inter_node_share(model, dispatcher, place.ep))
    etp = net.all_gather(work.etp_bytes, place.etp)
    return Collectives(tp, ring, a2a, a2a_ep, etp)


def overlapped(t_compute, t_comm, split, coef) -> np.ndarray:
    """Exposed communication of eqs. 20-21: min(T_c, T_m)/s_n + max(alpha*T_c, beta*T_m) - T_c."""
    return np.minimum(t_compute, t_comm) / split + contended(t_compute, t_comm, coef)


def inter_node_share(model: ModelSpec, dispatcher: str, group: Group):
    """Bound on the share of a rank's dispatched bytes that leaves its node (None: the uniform
    spread of independent copies). Megatron's all-to-all dispatcher sends one copy per (token,
    expert), so node-limited routing moves copies between nodes but does not reduce them.
    DeepEP-style deduplication sends one copy per (token, node) across nodes and forwards it over
    NVLink inside (DeepSeek-V3 report section 3.2.2): top_k experts drawn over the N nodes of the
    EP group reach N(1 - (1 - 1/N)^top_k) distinct nodes on average, at most max_nodes_per_token
    with node-limited routing; counting every reached node as remote bounds the share by that
    over top_k."""
    x = model.moe
    if x is None or dispatcher != "deepep":
        return None
    nodes = np.maximum(group.n[1] * group.n[2], 1.0)
    reached = nodes * (1.0 - (1.0 - 1.0 / nodes) ** x.top_k)
    if x.max_nodes_per_token:
        reached = np.minimum(reached, x.max_nodes_per_token)
    return np.minimum(1.0, reached / x.top_k)


def tp_backward_exposed(kind: str, t_comm, dgrad, wgrad, eff: EfficiencyProfile, sequence_parallel: bool, async_dgrad: bool):
    """Exposed backward TP communication of one collective of the forward (eq. 20's backward
    half), without userbuffer overlap. `kind` is the forward collective: "ag" before a
    column-parallel GEMM (qkv, fc1), "rs" after a row-parallel one (o_proj, fc2); t_comm its time.

    Megatron (LinearWithGradAccumulationAndAsyncCommunication; --async-tensor-model-parallel-
    allreduce, default since 2022, and Megatron-Core) launches the column-parallel input gradient's
    collective asynchronously and computes the weight gradient meanwhile: under SP a reduce-scatter
    hidden behind the wgrad GEMM, with the input re-gathered under the dgrad GEMM; without SP an
    all-reduce (twice the volume) behind the wgrad GEMM. The row-parallel backward all-gathers the
    output gradient under SP (exposed) and has no collective without it. Both hidings are eq. 24's
    form, costmodel.overlap.beyond_window with eq. 20's coefficients (tp_overlap): the collective
    slows only the part of the GEMM it overlaps, and what outlasts the GEMM is exposed. With
    `async_dgrad` off (torchtitan's DTensor TP, whose collectives wait where issued) every
    collective is exposed: the reverse of the forward's, the same volume under SP, the all-reduce
    on the column side without it."""
    if kind == "rs":
        return t_comm if sequence_parallel else 0.0 * t_comm
    coef = eff.tp_overlap
    if not sequence_parallel:
        return beyond_window(2.0 * t_comm, wgrad, coef) if async_dgrad else 2.0 * t_comm
    if not async_dgrad:
        return t_comm
    return beyond_window(t_comm, wgrad, coef) + beyond_window(t_comm, dgrad, coef)


def has(mask: np.ndarray, bit: int) -> np.ndarray:
    """Float 0/1: is `bit` set in the integer mask `mask` (an int64 array: see `ints`)."""
    return ((mask & bit) != 0) * 1.0


def in_any(mask: np.ndarray, modules: tuple[str, ...], bits: dict[str, int]) -> np.ndarray:
    """Float 0/1: is any of `modules` set in the int64 mask."""
    return ((mask & sum(bits[name] for name in modules)) != 0) * 1.0


def ints(column: np.ndarray) -> np.ndarray:
    return column.astype(np.int64)


def layer_time(
    work: LayerWork,
    model: ModelSpec,
    cfg: ConfigBatch,
    place: LayerGroups,
    comp: ComputeModel,
    net: Network,
    eff: EfficiencyProfile,
    unfused_attention: bool,
    host_links: tuple[float, float],
    attention_factor: np.ndarray,
    attention_tokens: np.ndarray,
    dispatcher: str = "alltoall",
    sequence_parallel: bool = True,
    tp_backward_overlap: bool = True,
    diagonal_share: np.ndarray | float = 1.0,
) -> LayerTime:
    gemm_f = {g.name: comp.gemm_time(g) for g in work.gemms}
    comp_gemm_f = sum(gemm_f.values())
    gemm_b = {g.name: comp.gemm_backward_times(g) for g in work.gemms}  # (dgrad, wgrad)
    dgrad = sum(d for d, _ in gemm_b.values()) if gemm_b else 0.0
    wgrad = sum(w for _, w in gemm_b.values()) if gemm_b else 0.0
    linear = work.attention_class == "linear_attention"
    attn_f = comp.attention_time(work.attention_work(attention_factor), attention_tokens, work.attention_class, work.attention_keys,
                                work.attention_rows, diagonal_share)
    attn_b = attn_f * (eff.linear_attention_backward_ratio if linear else 2.0 if unfused_attention else eff.attention_backward_ratio)
    mem_f = {op.name: comp.memory_time(op.bytes, op.kernels, op.kind) for op in work.memory_ops}
    mem_total = sum(mem_f.values())
    mem_b = sum(comp.memory_backward_ratio(op.kind) * mem_f[op.name] for op in work.memory_ops)
    # MemFine FCDA: each grouped GEMM runs once per chunk (a launch each; their shapes are in the Gemm)
    chunks = work.ep_chunks
    relaunch = (chunks - 1.0) * comp.overhead * sum(1.0 for g in work.gemms if g.kind == "grouped_gemm")
    comp_f = comp_gemm_f + attn_f + mem_total + relaunch
    comp_b = dgrad + wgrad + mem_b + attn_b + 2.0 * relaunch
    # autocast's weight casts (fp32 weights, bf16 compute): one per GEMM weight each way
    casts = float(len(work.gemms)) * (np.asarray(work.cast_f_bytes) > 0)
    comp_f = comp_f + comp.memory_time(work.cast_f_bytes, casts)
    comp_b = comp_b + comp.memory_time(work.cast_b_bytes, casts)

    c = collectives(work, model, cfg, place, net, dispatcher)

    # --- tensor parallelism (eq. 20) -----------------------------------------------------
    tp_on = cfg.tp_overlap == 1
    tp_f = np.zeros_like(comp_f)
    for t_comm, gemm in c.tp:
        hidden = overlapped(gemm_f[gemm], t_comm, cfg.tp, eff.tp_overlap)
        tp_f = tp_f + np.where(tp_on, hidden, t_comm)
    # backward: userbuffers pipeline the collective with the GEMM of the same shape; Transformer
    # Engine keeps the async order too (its bulk overlaps: the dgrad reduce-scatter beside the
    # wgrad GEMM), so switching them on never exposes more than the async path alone
    tp_b = np.zeros_like(comp_f)
    for (kind, _, _), (t_comm, gemm) in zip(work.tp_bytes, c.tp):
        async_b = tp_backward_exposed(kind, t_comm, *gemm_b[gemm], eff, sequence_parallel, tp_backward_overlap)
        ub_b = overlapped(gemm_f[gemm], t_comm, cfg.tp, eff.tp_overlap)
        tp_b = tp_b + np.where(tp_on, np.minimum(ub_b, async_b) if tp_backward_overlap else ub_b, async_b)

    # --- context parallelism by variant ---------------------------------------------------
    v = cfg.cp_comm
    ring, a2a = c.ring, c.cp_a2a
    ring_b = 2.0 * ring  # K/V again (ring, or re-gathered) and dK/dV
    overlappable = (cfg.cp_overlap == 1) & (v != CP_COMM_CODES["all_gather"])
    cp_f = a2a + np.where(overlappable, overlapped(attn_f, ring, cfg.cp, eff.cp_overlap), ring)
    cp_b = a2a + np.where(overlappable, overlapped(attn_b, ring_b, cfg.cp, eff.cp_overlap), ring_b)

    # --- expert parallelism (eq. 22): dispatch + combine, and the expert-TP gather --------
    # (the busiest rank's volume, work.ep_a2a_bytes; FCDA: one all-to-all per chunk)
    ep_comm_f = 2.0 * (c.ep_a2a + c.etp)
    ep_comm_b = ep_comm_f
    both = ep_comm_f + ep_comm_b
    ep_on = (cfg.ep_overlap == 1) & (both > 0)  # dense layers of an MoE model have nothing to hide
    exposed = contended(comp_f + comp_b, both, eff.ep_overlap)
    share_f = np.divide(ep_comm_f, both, out=np.full_like(both, 0.5), where=both > 0)
    ep_f = np.where(ep_on, exposed * share_f, ep_comm_f)
    ep_b = np.where(ep_on, exposed * (1 - share_f), ep_comm_b)

    # --- selective recompute (eq. 30) by module --------------------------------------------
    mods = ints(cfg.recompute_modules * (cfg.recompute == 1))
    recompute = has(mods, RECOMPUTE_MODULE_BITS["core_attn"]) * attn_f + has(mods, RECOMPUTE_MODULE_BITS["moe"]) * ep_f
    for g in work.gemms:
        if g.modules:
            recompute = recompute + in_any(mods, g.modules, RECOMPUTE_MODULE_BITS) * gemm_f[g.name]
    for op in work.memory_ops:
        if op.modules:
            recompute = recompute + in_any(mods, op.modules, RECOMPUTE_MODULE_BITS) * mem_f[op.name]
    ops_on = has(mods, RECOMPUTE_MODULE_BITS["ops"])
    if np.any(ops_on):  # torchtitan's per-op policy (rules keep it to dense softmax-attention layers)
        policy = op_sac(work)
        rerun = sum(share * gemm_f[name] for name, share in policy.rerun_gemm_share.items()) + sum(mem_f[name] for name in policy.rerun_ops)
        recompute = recompute + ops_on * rerun
    # FCDA's chunked recompute (MemFine eq. 7): the backward re-runs each chunk's dispatch, expert
    # computation and combine, unless full recompute re-runs the layer anyway or the moe module
    # is already recomputed
    if "expert_fc1" in gemm_f:
        again = (chunks > 1) * (cfg.recompute != 2) * (1.0 - has(mods, RECOMPUTE_MODULE_BITS["moe"]))
        expert_f = gemm_f["expert_fc1"] + gemm_f["expert_fc2"] + mem_f["permute"] + relaunch + ep_f
        expert_f = expert_f + (1.0 - has(mods, RECOMPUTE_MODULE_BITS["moe_act"])) * mem_f["expert_activation"]
        recompute = recompute + again * expert_f

    # --- activation offload (eqs. 34-35) ---------------------------------------------------
    d2h, h2d = host_links
    offloaded = offloaded_bytes(work, cfg)
    fwd = comp_f + tp_f + cp_f + ep_f
    bwd = comp_b + tp_b + cp_b + ep_b + recompute
    c = eff.offload_overlap
    off = offloaded > 0
    offload_f = np.where(off, contended(fwd, offloaded / d2h, c), 0.0)
    offload_b = np.where(off, contended(bwd, offloaded / h2d, c), 0.0)
    return LayerTime(comp_f, comp_b, wgrad, tp_f, tp_b, cp_f, cp_b, ep_f, ep_b, recompute, offload_f, offload_b, attn_f)


def kept_bytes(work: LayerWork, cfg: ConfigBatch) -> np.ndarray:
    """Bytes a layer keeps for its backward under its recompute setting: everything, minus
    what the selected modules re-create (selective) and, under MemFine's FCDA, the routed
    experts' tensors (recomputed chunk by chunk), or the whole set (a layer that full recompute
    does not cover; the covered ones keep only their input, see memory.py)."""
    mods = ints(cfg.recompute_modules * (cfg.recompute == 1))
    fcda = (work.ep_chunks > 1) * 1.0
    kept = work.saved_bytes
    for name, nbytes in work.saved.items():
        dropped_by = SAVED_TAGS[name].dropped_by
        dropped = in_any(mods, dropped_by, RECOMPUTE_MODULE_BITS) if dropped_by else 0.0
        if name in CHUNKED:
            dropped = np.maximum(dropped, fcda)
        kept = kept - dropped * nbytes
    ops_on = has(mods, RECOMPUTE_MODULE_BITS["ops"])
    if np.any(ops_on):
        policy = op_sac(work)
        kept = kept + ops_on * (policy.extra_kept - sum(share * work.saved[name] for name, share in policy.dropped_share.items()))
    return kept


def offloaded_bytes(work: LayerWork, cfg: ConfigBatch) -> np.ndarray:
    """Bytes one layer sends to the host: all it keeps (MoFa's whole-layer offload, eq. 33) or
    the saved inputs of the chosen Megatron modules."""
    setting = cfg.activation_offload
    total = (setting == OFFLOAD_LAYER) * kept_bytes(work, cfg)
    modules = ints(np.where(setting == OFFLOAD_LAYER, 0.0, setting))
    fcda = (work.ep_chunks > 1) * 1.0
    for name, nbytes in work.saved.items():
        module = SAVED_TAGS[name].offload
        if module is not None:
            total = total + has(modules, OFFLOAD_MODULE_BITS[module]) * nbytes * ((1.0 - fcda) if name in CHUNKED else 1.0)
    return total


#: the configuration fields that fix a layer's shape and layer-level features (MPE's "layer")
LAYER_KEY_FIELDS = ("tp", "cp", "ep", "etp", "mbs", "cp_comm", "cp_a2a", "recompute", "recompute_modules", "activation_offload", "tp_overlap", "cp_overlap", "ep_overlap", "moe_chunks")


@dataclass(frozen=True)
class KindCosts:
    """One layer kind (dense or MoE), per layer and per micro-batch on one GPU."""

    compute: np.ndarray  # forward + backward operator time
    weight_grad: np.ndarray  # the weight-gradient part of the backward (inside compute)
    recompute: np.ndarray  # selective recompute of the chosen modules
    tp: np.ndarray  # exposed communication, forward + backward
    cp: np.ndarray
    ep: np.ndarray
    offload: np.ndarray
    forward: np.ndarray  # with its exposed communication: what full recompute repeats
    activation: np.ndarray  # bytes kept for backward (selective modules dropped; eqs. 5, 29)
    saved_full: np.ndarray  # bytes of the complete saved set (working set of a recomputed layer; one FCDA chunk of the experts')
    chunk_work: np.ndarray  # FCDA: one chunk's expert tensors, alive while the layer runs or is recomputed (MemFine 4.1)
    offloaded: np.ndarray  # bytes sent to the host per layer (eq. 33; Megatron's modules)
    input_bytes: np.ndarray  # the layer input: all a fully recomputed layer keeps (eq. 31)
    params: np.ndarray  # parameters on the GPU
    expert_params: np.ndarray
    # lower bounds (costmodel.bounds), forward + backward: compute and collectives in seconds
    # (None when the evaluation does not ask for bounds)
    bound_compute: np.ndarray | None = None
    bound_hbm_bytes: np.ndarray | None = None
    bound_tp: np.ndarray | None = None
    bound_cp: np.ndarray | None = None
    bound_ep: np.ndarray | None = None

    @property
    def total(self) -> np.ndarray:
        return self.compute + self.recompute + self.tp + self.cp + self.ep + self.offload


@dataclass(frozen=True)
class LayerCosts:
    """Everything per layer shape that the pipeline, memory and optimizer models compose: one
    KindCosts per layer kind (ModelSpec.kinds order, then the MTP module's kind if it is new),
    and the edge modules."""

    kinds: list[KindCosts]
    embedding_f: np.ndarray
    embedding_b: np.ndarray
    head_compute: np.ndarray  # forward + backward of the head GEMM and the loss
    head_forward: np.ndarray
    head_weight_grad: np.ndarray
    head_tp: np.ndarray  # exposed, forward + backward
    head_saved: np.ndarray
    embedding_params: np.ndarray
    head_params: np.ndarray
    hop_bytes: np.ndarray  # one pipeline hop: an activation micro-batch
    comm_buffer_bytes: np.ndarray  # TP/SP, CP and EP buffers a layer allocates while it runs
    mtp_compute: np.ndarray  # one MTP module's projection and head, forward + backward (its layer is a kind)
    mtp_params: np.ndarray  # one MTP module's projection and norms
    head_output_bytes: np.ndarray  # one micro-batch's logits on this rank (the head's output, vocab-parallel)

    def take(self, index) -> "LayerCosts":
        def pick(x):
            if isinstance(x, list):
                return [KindCosts(*(None if getattr(k, f.name) is None else getattr(k, f.name)[index] for f in fields(KindCosts))) for k in x]
            return x[index]

        return LayerCosts(*(pick(getattr(self, f.name)) for f in fields(LayerCosts)))


def kind_costs(work: LayerWork, t: LayerTime, cfg: ConfigBatch, bounds: dict[str, np.ndarray] | None = None) -> KindCosts:
    zero = 0.0 * t.comp_f
    extra = {} if bounds is None else {f"bound_{k}": v + zero for k, v in bounds.items()}
    return KindCosts(
        compute=t.comp_f + t.comp_b,
        weight_grad=t.weight_grad,
        recompute=t.recompute,
        tp=t.tp_f + t.tp_b,
        cp=t.cp_f + t.cp_b,
        ep=t.ep_f + t.ep_b,
        offload=t.offload_f + t.offload_b,
        forward=t.forward,
        activation=kept_bytes(work, cfg) + zero,
        saved_full=work.saved_bytes - work.chunked_bytes * (1.0 - 1.0 / work.ep_chunks) + zero,
        chunk_work=(work.ep_chunks > 1) * work.chunked_bytes / work.ep_chunks + zero,
        offloaded=offloaded_bytes(work, cfg) + zero,
        input_bytes=work.input_bytes + zero,
        params=work.params_local + zero,
        expert_params=work.expert_params_local + zero,
        **extra,
    )
