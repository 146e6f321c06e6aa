"""Lower bounds of the step time per phase (seed note 004, section "单步耗时", the three physical
bounds of every phase):

    T_compute >= FLOPs / (peak x efficiency)
    T_memory  >= HBM bytes / HBM bandwidth
    T_comm    >= collective bytes / link bandwidth + latency terms

computed from the exact model's own ledger (costmodel.architecture's operators, the layer
collectives of costmodel.layer, the optimizer's traffic of costmodel.update), per GPU and per
step, so a user sees how far a configuration is from its limits. Each is a bound on what the
model itself charges, never above the predicted step (tests/unit/test_bounds.py):

* compute: every GEMM's FLOPs (forward, data and weight gradient) at the best rate its operator
  class reaches (peak x the efficiency curve's peak fraction, or the profiled table's best
  point), the attention core's forward FLOPs and twice them for the backward at the attention
  class's best rate; recompute, embedding and loss are left out (the work the model needs, not
  what an implementation adds);
* memory: the bytes every GEMM moves (three times: forward and the two backward GEMMs), the
  memory-bound kernels' bytes (forward, and twice in the backward, as the layer model charges
  them) and the GPU Adam update's traffic, at the full HBM bandwidth;
* comm: the layer's TP, CP and EP collectives (forward + backward) and the step's
  data-parallel gradient reduction and parameter gather, timed by the model's own network
  formulas on ideal links (comm efficiency 1, no bandwidth decay at scale). Collectives of
  different groups run on their own streams and links, so the bound is the largest of the
  per-dimension bounds (each is reported); pipeline sends are left out.

Each bound is the busiest pipeline rank's (first, middle, last), since every rank does its own
work inside the step.
"""

from __future__ import annotations

import numpy as np

from costmodel.architecture import LayerWork
from costmodel.compute import ComputeModel
from costmodel.layer import Collectives
from costmodel.network import Network
from costmodel.specs import ClusterSpec, HardwareSpec
from costmodel.update import adam_bytes_per_param, dp_traffic, updated_params

#: the per-dimension communication bounds; "comm" in a result is their maximum
COMM_KINDS = ("tp", "cp", "ep", "dp")
BOUND_KEYS = ("compute", "memory", "comm") + tuple(f"comm_{k}" for k in COMM_KINDS)


def ideal_network(hw: HardwareSpec, cluster: ClusterSpec) -> Network:
    """The cluster's network with every link at its nominal bandwidth: communication efficiency
    1 at every level and no bandwidth decay at scale (latencies kept)."""
    eff = hw.efficiency.model_copy(update={"comm_efficiency": {k: 1.0 for k in hw.efficiency.comm_efficiency}, "scale_decay_exponent": 0.0})
    return Network(hw.model_copy(update={"efficiency": eff}), cluster.model_copy(update={"bandwidth_decay": []}))


def kind_bounds(work: LayerWork, comp: ComputeModel, attention_factor: np.ndarray, ideal: Collectives) -> dict[str, np.ndarray]:
    """One layer's bounds per micro-batch on one GPU (seconds; the memory one in bytes):
    compute time at the best rates, HBM bytes, and the collectives on ideal links."""
    gemm_s = sum((3.0 * g.flops / comp.best_rate(g.kind) for g in work.gemms), 0.0 * work.input_bytes)
    attention_s = 3.0 * work.attention_work(attention_factor) / comp.best_rate(work.attention_class)
    gemm_bytes = sum((3.0 * comp.dtype_bytes * (g.m * g.k + g.k * g.n + g.m * g.n) * g.count for g in work.gemms), 0.0 * work.input_bytes)
    totals = ideal.totals
    return {"compute": gemm_s + attention_s, "hbm_bytes": gemm_bytes + 3.0 * work.memory_bytes, "tp": totals["tp"], "cp": totals["cp"], "ep": totals["ep"]}


def step_bounds(rank_layer_bounds: list[dict[str, np.ndarray]], rank_params: list[tuple], micro: np.ndarray, x, ideal_groups, ideal: Network,
                dtypes: tuple[int, int, int], hbm_bytes_per_s: float, moe: bool, optimizer_impl: str = "fused") -> dict[str, np.ndarray]:
    """The step's bounds (BOUND_KEYS, seconds) from each rank class's summed layer bounds (per
    micro-batch) and its (dense, expert) parameters: the busiest rank's, for each phase."""
    d_para, _, d_opt = dtypes
    out = {}
    per_rank = []
    for layer, (dense, expert) in zip(rank_layer_bounds, rank_params):
        update_bytes = (1.0 - x.cpu) * adam_bytes_per_param(d_para, d_opt, optimizer_impl) * updated_params(dense, expert, x)
        per_rank.append({
            "compute": micro * layer["compute"],
            "memory": (micro * layer["hbm_bytes"] + update_bytes) / hbm_bytes_per_s,
            **{f"comm_{k}": micro * layer[k] for k in ("tp", "cp", "ep")},
            "comm_dp": dp_traffic(dense, expert, x, ideal_groups, ideal, dtypes, moe),
        })
    for key in per_rank[0]:
        out[key] = np.maximum.reduce([r[key] for r in per_rank])
    out["comm"] = np.maximum.reduce([out[f"comm_{k}"] for k in COMM_KINDS])
    return {k: out[k] for k in BOUND_KEYS}
