"""Memory cost model: MoFa eqs. 4-6 with the memory-level features (eqs. 25, 27, 29, 31, 33).

Static memory (eq. 4) of a pipeline rank: parameters (D_para), gradients (D_grad) and the
optimizer states. Eq. 4 charges 4*D_opt per parameter for the optimizer; Megatron's mixed-
precision Adam keeps three D_opt tensors for the whole run -- the fp32 master weight and the
two moments (two if the weights already are fp32) -- and, when gradients are kept in a
narrower type than D_opt, materialises an fp32 copy of the gradients only for the optimizer
step (DistributedOptimizer._copy_model_grads_to_main_grads), freed by the next zero_grad
before any activation exists. So: states = 3*D_opt persistently, plus a D_opt transient that
competes with the activations for the peak rather than adding to it. With fp32 gradients
(Megatron's default) this is the familiar 18 bytes per parameter. `training.optimizer_memory:
mofa_eq4` keeps eq. 4 literally (4*D_opt throughout) to reproduce MoFa's own figures: its
Table 7 row 3 (43.50 GB) is 22 bytes x 1.594e9 parameters + its ~8.5 GB of other memory.

Distributed optimizer (eq. 25): states (and the transient) divided over the CP x DP ranks
(expert states over the expert-DP ranks). CPU optimizer (eq. 27): the states live in host
memory; what exceeds the GPU's share of host memory stays on the GPU.

Activations (eq. 5): in-flight micro-batch chunks (pipeline.in_flight) times the tensors one
chunk saves. Selective recompute (eq. 29) drops the core-attention tensors; full recompute
(eq. 31) keeps only each layer's input, plus one layer's full set while it is recomputed;
activation offload (eq. 33) keeps one layer's set -- we keep two, because the asynchronous
copy of layer i overlaps the computation of layer i+1, so both are resident at the peak --
plus the input tensor of every in-flight chunk, which the pipeline schedule holds for the
backward pass and offloading therefore cannot free.

Buffers: the runtime reserve of the hardware profile (CUDA context, NCCL communicators,
cuBLAS workspaces, allocator slack) and the pipeline send/receive buffers. The last rank
also holds the fp32 logits of the micro-batch whose loss it computes.

Peak (eq. 6) = static + max(activations, optimizer transient) + buffers; the reported peak
is that of the worst rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.arrays import blend
from costmodel.configs import ConfigBatch, Derived
from costmodel.layer import LayerCosts
from costmodel.pipeline import RankLayers
from costmodel.units import GB

MEMORY_KEYS = ("params", "grads", "optimizer", "activations", "optimizer_transient", "buffers")


@dataclass(frozen=True)
class RankMemory:
    params: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    optimizer_transient: np.ndarray  # part of the optimizer-step transient above the activations
    buffers: np.ndarray
    host: np.ndarray  # host memory this GPU uses (CPU optimizer states, offloaded activations)
    dense_params: np.ndarray  # parameter counts, for the optimizer step
    expert_params: np.ndarray

    @property
    def peak(self) -> np.ndarray:
        return self.params + self.grads + self.optimizer + self.activations + self.optimizer_transient + self.buffers


def rank_memory(
    rank: RankLayers,
    in_flight: np.ndarray,
    lc: LayerCosts,
    cfg: ConfigBatch,
    x: Derived,
    dtypes: tuple[int, int, int, int],
    runtime_reserved_gb: float,
    host_share_bytes: float,
    tied_embeddings: bool,
    mofa_eq4: bool = False,
) -> RankMemory:
    d_para, d_grad, d_opt, d_act = dtypes
    n_d, n_m = rank.dense, rank.moe
    dense, moe = lc.dense, lc.moe

    def both(name):
        value = n_d * getattr(dense, name)
        return value if moe is None else value + n_m * getattr(moe, name)

    expert_params = 0.0 * n_d if moe is None else n_m * moe.expert_params
    dense_params = both("params") - expert_params
    if rank.first:
        dense_params = dense_params + lc.embedding_params
    head = lc.head_params
    if tied_embeddings and rank.first:  # tied and one stage: the head reuses the embedding
        head = lc.head_params - lc.embedding_params
    dense_params = dense_params + rank.last * head  # tied, pp>1: Megatron keeps a copy
    params = dense_params + expert_params

    opt_params = blend(x.dist, dense_params / x.dp_cp + expert_params / x.edp, params)
    if mofa_eq4:  # MoFa eq. 4 taken literally: four D_opt copies for the whole run
        states, transient = 4 * d_opt * opt_params, 0.0 * opt_params
    else:
        states = (3 if d_para < d_opt else 2) * d_opt * opt_params
        transient = (d_opt if d_grad < d_opt else 0) * opt_params
    gpu_states = blend(x.cpu, np.maximum(0.0, states - host_share_bytes), states)
    host_states = x.cpu * np.minimum(states, host_share_bytes)
    gpu_transient = transient * (1.0 - x.cpu)

    largest_layer = np.maximum((n_d > 0) * dense.saved_full, 0.0 if moe is None else (n_m > 0) * moe.saved_full)
    chunk = both("activation") / cfg.vp
    resident = in_flight * chunk + x.full_recompute * largest_layer
    # the schedule keeps a reference to every in-flight chunk's input tensor (Megatron's
    # input_tensors list), so offloading cannot free it
    chunk_inputs = in_flight * dense.input_bytes
    activations = blend(x.offload, 2.0 * largest_layer + chunk_inputs, resident) + rank.last * lc.head_saved
    host_act = x.offload * in_flight * chunk

    pp_buffers = (cfg.pp > 1) * 2.0 * lc.hop_bytes
    return RankMemory(
        params=d_para * params,
        grads=d_grad * params,
        optimizer=gpu_states,
        activations=activations,
        optimizer_transient=np.maximum(0.0, gpu_transient - activations),
        buffers=runtime_reserved_gb * GB + pp_buffers,
        host=host_states + host_act,
        dense_params=dense_params,
        expert_params=expert_params,
    )
