"""Layer-level cost model: MoFa eqs. 7-8 with the layer-level optimisation features.

T^FWD = sum of forward operator times + exposed forward communication (eq. 7) and likewise
T^BWD (eq. 8), per layer, per micro-batch, on one GPU, then modified by
  * TP overlap (eq. 20), per (GEMM, collective) pair, split into s_n = tp ring-exchange chunks:
        T_gemm + T_tp -> min(T_gemm, T_tp)/s_n + max(alpha*T_gemm, beta*T_tp)
  * CP overlap (eq. 21), ring attention: T_attn + T_cp -> min(T_attn, T_cp)/c + max(alpha*T_attn, beta*T_cp)
  * EP overlap (eq. 22), forward of one micro-batch against backward of another:
        sum(T_comp) + sum(T_ep) -> max(alpha*sum(T_comp), beta*sum(T_ep))
  * selective recompute (eq. 30): backward re-runs core attention. MoFa's eq. 30 also re-runs
    the QKV GEMM; Megatron's selective recompute (--recompute-modules core_attn, Korthikanti
    et al. section 4.2) keeps Q, K, V and re-runs only the attention core, so we follow Megatron.
  * full recompute (eq. 32): backward re-runs the whole forward, its communication included.
  * activation offload (eqs. 34-35): T^FWD -> max(alpha*M_act/B_d2h, beta*T^FWD), and the same
    for the backward prefetch over H2D.
Communication that is not overlapped is fully exposed. Without --tp-comm-overlap Megatron
still hides the backward re-all-gather of the sequence-parallel input behind the dgrad GEMM
(async all-gather), so the backward exposes four TP collectives per layer, like the forward.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from costmodel.architecture import LayerWork
from costmodel.compute import ComputeModel
from costmodel.configs import ConfigBatch
from costmodel.network import Network
from costmodel.placement import LayerGroups
from costmodel.specs import EfficiencyProfile, ModelSpec

#: memory-bound kernels per layer (norms, residual adds, activation, rotary, permutes)
MEMORY_KERNELS_PER_LAYER = 10.0
#: backward / forward time of the fused attention kernel (FlashAttention-2: 5 vs 2 matmuls)
FLASH_BACKWARD_RATIO = 2.5


@dataclass(frozen=True)
class LayerTime:
    """Per layer, per micro-batch times on one GPU (seconds, arrays over configurations).
    forward = comp_f + tp_f + cp_f + ep_f + offload_f, and likewise backward (+ recompute)."""

    comp_f: np.ndarray
    comp_b: np.ndarray
    tp_f: np.ndarray
    tp_b: np.ndarray
    cp_f: np.ndarray
    cp_b: np.ndarray
    ep_f: np.ndarray
    ep_b: np.ndarray
    recompute: np.ndarray
    offload_f: np.ndarray
    offload_b: np.ndarray
    attention_f: np.ndarray  # core attention forward (for HFU and reporting)

    @property
    def forward(self) -> np.ndarray:
        return self.comp_f + self.tp_f + self.cp_f + self.ep_f + self.offload_f

    @property
    def backward(self) -> np.ndarray:
        return self.comp_b + self.tp_b + self.cp_b + self.ep_b + self.recompute + self.offload_b


def overlapped(t_compute, t_comm, split, coef) -> np.ndarray:
    """Exposed communication of eqs. 20-21: min(T_c, T_m)/s_n + max(alpha*T_c, beta*T_m) - T_c."""
    return np.minimum(t_compute, t_comm) / split + np.maximum(coef.alpha * t_compute, coef.beta * t_comm) - t_compute


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
) -> LayerTime:
    gemm_f = {g.name: comp.gemm_time(g) for g in work.gemms}
    comp_gemm_f = sum(gemm_f.values())
    attn_f = comp.attention_time(work.attention_flops_hw)
    attn_b = attn_f * (2.0 if unfused_attention else FLASH_BACKWARD_RATIO)
    mem_f = comp.memory_time(work.memory_bytes, MEMORY_KERNELS_PER_LAYER)
    softmax_f = np.where(work.attention_unfused_bytes > 0, comp.memory_time(work.attention_unfused_bytes), 0.0)
    comp_f = comp_gemm_f + attn_f + mem_f + softmax_f
    comp_b = 2.0 * (comp_gemm_f + mem_f + softmax_f) + attn_b

    # --- tensor parallelism (eq. 20) -----------------------------------------------------
    tp_on = cfg.tp_overlap == 1
    tp_f = np.zeros_like(comp_f)
    for _, nbytes, gemm in work.tp_bytes:
        t_comm = net.all_gather(nbytes, place.tp)
        hidden = overlapped(gemm_f[gemm], t_comm, cfg.tp, eff.tp_overlap)
        tp_f = tp_f + np.where(tp_on, hidden, t_comm)
    tp_b = tp_f  # same collectives, paired with the dgrad GEMMs of the same shapes

    # --- context parallelism (eq. 21): ring exchange of K/V blocks ------------------------
    cp_comm_f = net.all_gather(work.cp_bytes * cfg.cp, place.cp)
    cp_comm_b = 2.0 * cp_comm_f  # K/V again and dK/dV
    cp_on = cfg.cp_overlap == 1
    cp_f = np.where(cp_on, overlapped(attn_f, cp_comm_f, cfg.cp, eff.cp_overlap), cp_comm_f)
    cp_b = np.where(cp_on, overlapped(attn_b, cp_comm_b, cfg.cp, eff.cp_overlap), cp_comm_b)

    # --- expert parallelism (eq. 22): dispatch + combine, and the expert-TP gather --------
    cap = None
    if model.moe is not None and model.moe.max_nodes_per_token:
        cap = min(1.0, model.moe.max_nodes_per_token / model.moe.top_k)
    a2a = net.all_to_all(work.ep_a2a_bytes, place.ep, cap)
    etp = net.all_gather(work.etp_bytes, place.etp)
    ep_comm_f = 2.0 * (a2a + etp)
    ep_comm_b = ep_comm_f
    both = ep_comm_f + ep_comm_b
    ep_on = (cfg.ep_overlap == 1) & (both > 0)  # dense layers of an MoE model have nothing to hide
    exposed = np.maximum(eff.ep_overlap.alpha * (comp_f + comp_b), eff.ep_overlap.beta * both) - (comp_f + comp_b)
    share_f = np.divide(ep_comm_f, both, out=np.full_like(both, 0.5), where=both > 0)
    ep_f = np.where(ep_on, exposed * share_f, ep_comm_f)
    ep_b = np.where(ep_on, exposed * (1 - share_f), ep_comm_b)

    # --- recompute (eqs. 30, 32) -----------------------------------------------------------
    fwd = comp_f + tp_f + cp_f + ep_f
    recompute = np.select([cfg.recompute == 1, cfg.recompute == 2], [attn_f + softmax_f, fwd], 0.0)

    # --- activation offload (eqs. 34-35) ---------------------------------------------------
    d2h, h2d = host_links
    off = cfg.activation_offload == 1
    saved = work.saved_bytes
    bwd = comp_b + tp_b + cp_b + ep_b + recompute
    c = eff.offload_overlap
    offload_f = np.where(off, np.maximum(c.alpha * saved / d2h, c.beta * fwd) - fwd, 0.0)
    offload_b = np.where(off, np.maximum(c.alpha * saved / h2d, c.beta * bwd) - bwd, 0.0)
    return LayerTime(comp_f, comp_b, tp_f, tp_b, cp_f, cp_b, ep_f, ep_b, recompute, offload_f, offload_b, attn_f)


#: the configuration fields that fix a layer's shape and layer-level features (MPE's "layer")
LAYER_KEY_FIELDS = ("tp", "cp", "ep", "etp", "mbs", "recompute", "tp_overlap", "cp_overlap", "ep_overlap", "activation_offload")


@dataclass(frozen=True)
class KindCosts:
    """One layer kind (dense or MoE), per layer and per micro-batch on one GPU."""

    compute: np.ndarray  # forward + backward operator time
    recompute: np.ndarray
    tp: np.ndarray  # exposed communication, forward + backward
    cp: np.ndarray
    ep: np.ndarray
    offload: np.ndarray
    forward: np.ndarray
    activation: np.ndarray  # bytes kept for backward under the recompute mode (eqs. 5, 29, 31)
    saved_full: np.ndarray  # bytes of the complete saved set (working set of a recomputed layer)
    input_bytes: np.ndarray
    params: np.ndarray  # parameters on the GPU
    expert_params: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.compute + self.recompute + self.tp + self.cp + self.ep + self.offload


@dataclass(frozen=True)
class LayerCosts:
    """Everything per layer shape that the pipeline, memory and optimizer models compose."""

    dense: KindCosts
    moe: KindCosts | None
    embedding_f: np.ndarray
    embedding_b: np.ndarray
    head_compute: np.ndarray  # forward + backward of the head GEMM and the loss
    head_forward: np.ndarray
    head_tp: np.ndarray  # exposed, forward + backward
    head_saved: np.ndarray
    embedding_params: np.ndarray
    head_params: np.ndarray
    hop_bytes: np.ndarray  # one pipeline hop: an activation micro-batch

    def take(self, index) -> "LayerCosts":
        def pick(x):
            if x is None:
                return None
            if isinstance(x, KindCosts):
                return KindCosts(*(getattr(x, f.name)[index] for f in fields(KindCosts)))
            return x[index]

        return LayerCosts(*(pick(getattr(self, f.name)) for f in fields(LayerCosts)))


def kind_costs(work: LayerWork, t: LayerTime, recompute: np.ndarray) -> KindCosts:
    activation = np.select([recompute == 1, recompute == 2], [work.saved_without_core_attention(), work.input_bytes], work.saved_bytes)
    return KindCosts(
        compute=t.comp_f + t.comp_b,
        recompute=t.recompute,
        tp=t.tp_f + t.tp_b,
        cp=t.cp_f + t.cp_b,
        ep=t.ep_f + t.ep_b,
        offload=t.offload_f + t.offload_b,
        forward=t.forward,
        activation=activation,
        saved_full=work.saved_bytes,
        input_bytes=work.input_bytes,
        params=work.params_local + 0.0 * t.comp_f,
        expert_params=work.expert_params_local + 0.0 * t.comp_f,
    )
