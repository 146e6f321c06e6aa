"""Optimizer-level cost model: MoFa eq. 13 (T^Opt = T^DP + T^update) with DP overlap (eq. 24),
the distributed optimizer (eq. 26) and the CPU optimizer (eq. 28).

Gradients of dense parameters are reduced over the CP x DP ranks (CP ranks share weights,
Llama 3 section 4), those of expert parameters over the expert-data-parallel ranks.
Without the distributed optimizer this is an all-reduce of the gradients; with it, a
reduce-scatter of the gradients and an all-gather of the updated parameters (ZeRO-1).

DP overlap (eq. 24): the gradients of virtual stage i+1 reduce while stage i runs backward;
the parameters of stage j+1 gather while stage j runs forward. Only the first unit is exposed
in full; the rest overlaps a window of compute, both slowed by contention (beta on the
communication, alpha on the compute it overlaps):
    exposed = first + max(beta*rest - window, (alpha - 1) * min(window, beta*rest)).
(Eq. 24 as printed adds max(comm, compute) to the pipeline time that already contains that
compute; only what the overlapped region adds beyond it is counted here.)
MoFa's window is p*l*(v-1)*T^BWD (the cool-down). With vp = 1 the unit is Megatron's gradient
bucket (40M parameters by default) and the window the last micro-batch's backward on the rank.

GPU Adam update (eq. 13's P^Opt, counted rather than profiled): per parameter it reads the
master weight (if the weights are narrower than D_opt), both moments and the gradient (upcast
to D_opt) and writes them back with the model weight, at the memory-bound fraction of HBM
bandwidth. Sharded over DP by the distributed optimizer (eq. 26).

CPU optimizer (eq. 28): parameters / host Adam throughput + gradients device-to-host +
parameters host-to-device. (Eq. 28 as printed divides gradients by B^h2d and parameters by
B^d2h; gradients travel device-to-host, so the links are swapped here.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.arrays import blend
from costmodel.units import GB

#: Megatron's default DDP bucket (parameters): --ddp-bucket-size default max(40M, 1M * dp)
BUCKET_PARAMS = 40e6
BUCKET_PARAMS_PER_DP_RANK = 1e6
#: kernels of one fused multi-tensor Adam step (launch overheads)
ADAM_KERNELS = 4.0


@dataclass(frozen=True)
class OptimizerTime:
    dp_exposed: np.ndarray
    update: np.ndarray


def exposed_after_overlap(total, units, window, coef, on):
    """Eq. 24 for one direction (reduce-scatter or all-gather): the first unit is exposed; the
    rest overlaps the window of compute, the communication slowed by beta and the compute it
    overlaps by alpha. The overlapped region lasts max(beta*rest, window + (alpha-1)*overlapped
    compute); what it adds beyond the window (already counted in the pipeline) is exposed."""
    first = total / units
    rest = coef.beta * (total - first)
    overlapped = np.minimum(window, rest)
    extra = np.maximum(rest - window, (coef.alpha - 1.0) * overlapped)
    return blend(on, first + extra, total)


def adam_bytes_per_param(d_para: int, d_opt: int) -> int:
    """Reads: master weight (when the weights are narrower than D_opt), both moments, the
    gradient upcast to D_opt; writes: the same states and the model weight."""
    states = (3 if d_para < d_opt else 2) * d_opt
    return states + d_opt + states + d_para


def optimizer_time(dense_params, expert_params, x, groups, net, hw, dtypes, comp, window_b, window_f, units_v, moe: bool) -> OptimizerTime:
    """DP communication and update of one pipeline rank holding `dense_params` + `expert_params`.
    window_b/window_f: compute that can hide the gradient reduce-scatter / parameter all-gather;
    units_v: virtual stages on the rank (1 means bucket-granular overlap)."""
    d_para, d_grad, d_opt = dtypes
    dist = x.dist
    gather_bytes = d_grad + dist * (d_para - d_grad)  # ZeRO-1 gathers weights; all-reduce's 2nd half gathers grads
    rs = net.reduce_scatter(d_grad * dense_params, groups.dp)
    ag = net.all_gather(gather_bytes * dense_params, groups.dp)
    if moe:
        rs = rs + net.reduce_scatter(d_grad * expert_params, groups.edp)
        ag = ag + net.all_gather(gather_bytes * expert_params, groups.edp)
    params = dense_params + expert_params
    bucket = np.maximum(BUCKET_PARAMS, BUCKET_PARAMS_PER_DP_RANK * x.dp_cp)
    units = blend(x.interleaved, units_v, np.maximum(1.0, np.ceil(params / bucket)))
    on = x.dp_overlap
    coef = hw.efficiency.dp_overlap
    # distributed optimizer: the reduce-scatter trails the backward, the parameter all-gather
    # leads the next forward; without it the whole all-reduce trails the backward
    trailing = rs + ag * (1.0 - dist)  # follows the backward
    leading = ag * dist  # the distributed optimizer's parameter all-gather leads the next forward
    exposed = exposed_after_overlap(trailing, units, window_b, coef, on) + exposed_after_overlap(leading, units, window_f, coef, on)

    local = blend(dist, dense_params / x.dp_cp + expert_params / x.edp, params)
    gpu_update = comp.memory_time(adam_bytes_per_param(d_para, d_opt) * local, ADAM_KERNELS)
    eff = hw.efficiency.host_link_efficiency
    cpu_update = local / hw.cpu_optimizer_params_per_s + d_grad * local / (hw.d2h_gb_per_s * eff * GB) + d_para * local / (hw.h2d_gb_per_s * eff * GB)
    update = blend(x.cpu, cpu_update, gpu_update)
    return OptimizerTime(exposed, update)
