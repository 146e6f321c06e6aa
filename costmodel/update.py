"""Optimizer-level cost model: MoFa eq. 13 (T^Opt = T^DP + T^update) with DP overlap (eq. 24),
ZeRO sharding (eqs. 25-26 generalised) and the CPU optimizer (eq. 28); and the per-micro-batch
data-parallel traffic of ZeRO-2/3 that runs inside the pipeline.

Gradients of dense parameters are reduced over the CP x DP ranks (CP ranks share weights,
Llama 3 section 4), those of expert parameters over the expert-data-parallel ranks. What runs
once per step, after the last backward (trailing) and before the next forward (leading):
  * ZeRO-0 (DDP): an all-reduce of the gradients (trailing);
  * ZeRO-1 (Megatron's distributed optimizer): a reduce-scatter of the gradients (trailing) and an
    all-gather of the updated parameters (leading);
  * ZeRO-2: the reduce-scatter of the last gradient window (trailing; the earlier windows run
    inside the pipeline, see `window_traffic`) and the parameter all-gather (leading);
  * ZeRO-3 (FSDP): the last window's reduce-scatter only; parameters are gathered layer by layer
    inside the pipeline (`zero3_gathers`).
With hybrid sharding (HSDP) a reduce-scatter inside the shard group is followed by an
all-reduce of the shard across the replicas, and gathers stay inside the shard group.

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
bandwidth, on the rank's shard (eq. 26).

CPU optimizer (eq. 28): parameters / host Adam throughput + gradients device-to-host +
parameters host-to-device. (Eq. 28 as printed divides gradients by B^h2d and parameters by
B^d2h; gradients travel device-to-host, so the links are swapped here.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.arrays import blend
from costmodel.overlap import beyond_window
from costmodel.units import GB, optimizer_state_bytes

#: Megatron's default DDP bucket (parameters): --ddp-bucket-size default max(40M, 1M * dp)
BUCKET_PARAMS = 40e6
BUCKET_PARAMS_PER_DP_RANK = 1e6
#: kernels of one Adam step (launch overheads): a fused multi-tensor kernel's few launches, or the
#: eight elementwise passes of an unfused step (`adam_bytes_per_param`)
ADAM_KERNELS = {"fused": 4.0, "foreach": 8.0, "per_parameter": 8.0}


@dataclass(frozen=True)
class OptimizerTime:
    dp_exposed: np.ndarray
    update: np.ndarray


def exposed_after_overlap(total, units, window, coef, on):
    """Eq. 24 for one direction (reduce-scatter or all-gather): the first unit is exposed; the
    rest overlaps the window of compute (costmodel.overlap.beyond_window); all of it without
    overlap."""
    first = total / units
    return blend(on, first + beyond_window(total - first, window, coef), total)


def hidden(comm, window, coef, on):
    """A transfer that overlaps `window` seconds of compute entirely (no exposed first unit):
    what it adds beyond the window (costmodel.overlap.beyond_window); all of it without overlap."""
    return blend(on, beyond_window(comm, window, coef), comm)


def window_used(comm, window, coef, on):
    """The compute of `window` that a transfer hidden behind it (`hidden`) overlaps: min(window,
    beta*comm) with overlap, none without. Two transfers that run behind the same compute share
    one budget: the second hides only behind `window - window_used(first)`, never behind compute
    the first already overlaps (else shortening the compute by d exposes up to 2d more)."""
    return on * np.minimum(window, coef.beta * comm)


def adam_bytes_per_param(d_para: int, d_opt: int, impl: str = "fused") -> int:
    """HBM bytes of one Adam step per parameter (eq. 13's update, counted).

    fused (Apex/Transformer Engine FusedAdam, torch.optim.AdamW(fused=True)): one pass that reads
    the master weight (when the weights are narrower than D_opt), both moments and the gradient
    upcast to D_opt, and writes the states and the model weight.
    foreach (torch.optim.AdamW's multi-tensor default) and per_parameter (Composer's
    DecoupledAdamW, llm-foundry's optimizer: the same ops in a Python loop over the parameters):
    eight elementwise passes over D_opt tensors, each reading its operands and writing its result,
    20 D_opt in all, plus the copy to the narrower model weight:
      foreach: m lerp (3), v mul (2), v addcmul (3), weight decay (2), sqrt(v) (2), / bias
        correction (2), + eps (2), the weight's addcdiv (4);
      DecoupledAdamW (weight_decay 0): m mul (2), m add (3), v mul (2), v addcmul (3), sqrt(v) (2),
        / bias correction (2), + eps (2), the weight's addcdiv (4)."""
    states = optimizer_state_bytes(d_para, d_opt)
    if impl == "fused":
        return states + d_opt + states + d_para
    return 20 * d_opt + ((d_opt + d_para) if d_para < d_opt else 0)


def reduce_scatter_grads(nbytes, expert_nbytes, x, groups, net, moe: bool):
    """Reduce-scatter of gradient bytes (dense over the sharding group, then HSDP's all-reduce of
    the shard across replicas; experts over expert-DP)."""
    rs = net.reduce_scatter(nbytes, groups.shard)
    if np.any(x.replicas > 1):
        rs = rs + net.all_reduce(nbytes / x.shard, groups.replica)
    if moe:
        rs = rs + net.reduce_scatter(expert_nbytes, groups.edp)
    return rs


def gather_params(nbytes, expert_nbytes, groups, net, moe: bool):
    ag = net.all_gather(nbytes, groups.shard)
    if moe:
        ag = ag + net.all_gather(expert_nbytes, groups.edp)
    return ag


def updated_params(dense_params, expert_params, x):
    """Parameters whose optimizer step this rank runs: its shard under ZeRO-1..3 (eq. 26), all it
    holds otherwise."""
    return blend(x.shard_states, dense_params / x.shard + expert_params / x.eshard, dense_params + expert_params)


def dp_traffic(dense_params, expert_params, x, groups, net, dtypes, moe: bool):
    """The step's data-parallel collectives of one rank, timed whole: DDP's gradient all-reduce,
    or ZeRO's gradient reduce-scatter and parameter all-gather (ZeRO-3 gathers at least once)."""
    d_para, d_grad, _ = dtypes
    all_reduce = 2.0 * net.reduce_scatter(d_grad * dense_params, groups.dp)
    if moe:
        all_reduce = all_reduce + 2.0 * net.reduce_scatter(d_grad * expert_params, groups.edp)
    sharded = reduce_scatter_grads(d_grad * dense_params, d_grad * expert_params, x, groups, net, moe) + gather_params(d_para * dense_params, d_para * expert_params, groups, net, moe)
    return blend(x.shard_states, sharded, all_reduce)


def cooldown_passes(cfg, x):
    """Eq. 24's overlap window of the step-level DP traffic, in passes of a rank over all its
    virtual stages: interleaved, the cool-down's (vp - 1) * pp / vp; one pass otherwise. The
    gradient reduce hides behind that many backward passes, the gather behind as many forwards."""
    return blend(x.interleaved, (cfg.vp - 1) * cfg.pp / cfg.vp, 1.0)


def optimizer_time(dense_params, expert_params, x, groups, net, hw, dtypes, comp, window_b, window_f, units_v, moe: bool,
                   optimizer_impl: str = "fused") -> OptimizerTime:
    """Step-level DP communication and update of one pipeline rank holding `dense_params` +
    `expert_params`. window_b/window_f: compute that can hide the gradient reduction / parameter
    all-gather; units_v: virtual stages on the rank (1 means bucket-granular overlap);
    optimizer_impl: how the GPU update runs (`adam_bytes_per_param`)."""
    d_para, d_grad, d_opt = dtypes
    sharded = x.shard_states
    all_reduce = 0.0 * dense_params
    if np.any(sharded == 0):
        all_reduce = 2.0 * net.reduce_scatter(d_grad * dense_params, groups.dp)
        if moe:
            all_reduce = all_reduce + 2.0 * net.reduce_scatter(d_grad * expert_params, groups.edp)
    rs = reduce_scatter_grads(d_grad * dense_params, d_grad * expert_params, x, groups, net, moe)
    ag = gather_params(d_para * dense_params, d_para * expert_params, groups, net, moe)
    # every stage's last gradient window reduces in the cool-down (ZeRO-2/3's earlier windows:
    # window_traffic, inside the pipeline)
    trailing = blend(sharded, rs, all_reduce)
    leading = sharded * (1.0 - x.shard_params) * ag
    params = dense_params + expert_params
    bucket = np.maximum(BUCKET_PARAMS, BUCKET_PARAMS_PER_DP_RANK * x.dp_cp)
    units = blend(x.interleaved, units_v, np.maximum(1.0, np.ceil(params / bucket)))
    on = x.dp_overlap
    coef = hw.efficiency.dp_overlap
    exposed = exposed_after_overlap(trailing, units, window_b, coef, on) + exposed_after_overlap(leading, units, window_f, coef, on)

    local = updated_params(dense_params, expert_params, x)
    gpu_update = comp.memory_time(adam_bytes_per_param(d_para, d_opt, optimizer_impl) * local, ADAM_KERNELS[optimizer_impl])
    eff = hw.efficiency.host_link_efficiency
    cpu_update = local / hw.cpu_optimizer_params_per_s + d_grad * local / (hw.d2h_gb_per_s * eff * GB) + d_para * local / (hw.h2d_gb_per_s * eff * GB)
    update = blend(x.cpu, cpu_update, gpu_update)
    return OptimizerTime(exposed, update)


def window_compute_s(microbatches, per_microbatch_s, prefetch_used_s, windows, vp):
    """The compute a gradient window's reduce-scatter can hide behind (`window_traffic`): a rank's
    compute of one step (per_microbatch_s: both passes of one micro-batch over all its chunks)
    over the stretches between two windows of a stage (windows * vp per step), less what ZeRO-3's
    prefetches of the same step already overlap (`Zero3Gathers.window_used`: one overlap budget)."""
    return (microbatches * per_microbatch_s - prefetch_used_s) / np.maximum(windows * vp, 1.0)


def zero3_gathers_per_step(reshard_after_forward, pp, microbatches, windows):
    """(forward, backward) all-gathers of each virtual stage's parameters per step under ZeRO-3:
    freed after the forward (reshard_after_forward), gathered again for every micro-batch's
    forward and backward; kept, once per gradient window in the forward (every micro-batch without
    a pipeline) and never in the backward."""
    freed = reshard_after_forward == 1
    return np.where(freed | (pp == 1), microbatches, windows), np.where(freed, microbatches, 0.0)


def window_traffic(dense_params, expert_params, vp, x, groups, net, hw, d_grad, windows, window_compute, moe: bool):
    """ZeRO-2/3: the reduce-scatters of the gradient windows before each stage's last, per step,
    of one rank (its vp virtual stages), each hidden behind the next window's compute when DP
    overlap is on (what it adds beyond that compute is exposed) and exposed otherwise.
    windows: gradient windows per virtual stage per step (pipeline.grad_windows);
    window_compute: the compute one window's reduce-scatter can hide behind, less what ZeRO-3's
    parameter prefetches in the same window already overlap (`Zero3Gathers.window_used`): the
    two share one overlap budget."""
    if not np.any(x.shard_grads):
        return 0.0 * dense_params
    rs_stage = reduce_scatter_grads(d_grad * dense_params / vp, d_grad * expert_params / vp, x, groups, net, moe)
    return windows_exposed(rs_stage, vp, x, hw, windows, window_compute)


def windows_exposed(rs_stage, vp, x, hw, windows, window_compute):
    """window_traffic from one virtual stage's gradient reduce-scatter seconds (`rs_stage`): the
    windows before each stage's last, each hidden behind `window_compute` with DP overlap."""
    earlier = x.shard_grads * vp * (windows - 1.0)
    return earlier * hidden(rs_stage, np.maximum(window_compute, 0.0), hw.efficiency.dp_overlap, x.dp_overlap)


@dataclass(frozen=True)
class Zero3Gathers:
    """ZeRO-3's parameter all-gathers of one rank in one step: the time they add in the forward
    and in the backward passes (`exposed_f`, `exposed_b`: the pipeline schedules weigh the two
    passes differently) and the compute their prefetches overlap (`window_used`), which the
    gradient reduce-scatters of the same step can no longer hide behind."""

    exposed_f: np.ndarray
    exposed_b: np.ndarray
    window_used: np.ndarray


def zero3_gathers(dense_per_layer, expert_per_layer, edge_params, stage_layers, gathers_f, gathers_b, vp, x, groups, net, hw, d_para, forward_per_layer, backward_per_layer, moe: bool) -> Zero3Gathers:
    """ZeRO-3: the parameter all-gathers of one rank in one step. Each gather of a virtual stage
    exposes its first layer and prefetches the rest behind the previous layer's compute (FSDP's
    prefetch, with DP overlap; all exposed without); a stage without layers gathers none (of vp
    stages of stage_layers = L / vp layers, min(vp, L) hold one); the root unit (embedding, head)
    is gathered once per forward on the ranks that hold it. gathers_f/_b: gathers of each stage per step in
    the forward / backward (per micro-batch when parameters are freed after the forward)."""
    if not np.any(x.shard_params):
        zero = 0.0 * dense_per_layer
        return Zero3Gathers(zero, zero, zero)
    ag = gather_params(d_para * dense_per_layer, d_para * expert_per_layer, groups, net, moe)
    coef, on = hw.efficiency.dp_overlap, x.dp_overlap
    rest = np.maximum(stage_layers - 1.0, 0.0)
    # stages that hold a layer, each exposing its first gather: every one, except where a rank
    # holds fewer layers than stages (Meta's 126-layer split: 7 layers on 8 chunks, the
    # embedding's chunk none) or a layout's stage is empty, which gathers nothing
    held = np.minimum(vp, vp * np.asarray(stage_layers, dtype=float))
    per_f = held * ag + vp * rest * hidden(ag, forward_per_layer, coef, on)
    per_b = held * ag + vp * rest * hidden(ag, backward_per_layer, coef, on)
    used = vp * rest * (gathers_f * window_used(ag, forward_per_layer, coef, on) + gathers_b * window_used(ag, backward_per_layer, coef, on))
    edges = gathers_f * net.all_gather(d_para * edge_params, groups.shard)
    return Zero3Gathers(x.shard_params * (gathers_f * per_f + edges), x.shard_params * gathers_b * per_b, x.shard_params * used)
