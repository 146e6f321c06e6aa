"""Where each parallel group sits in rank space, given the placement order.

Dense layers use the grid [TP, CP, PP, DP]; expert layers the grid [ETP, EP, PP, EDP] over the
same ranks (Megatron's "MoE parallel folding"): the ETP x EP block of a pipeline stage takes
the innermost ranks of that stage, first the TP ranks, then CP, then whatever part of EP does
not fit in TP x CP (the `ep` slot of the placement order), so EP stays as close as it can.
Each group is a list of (stride, count) factors, inner first, resolved onto the network's levels
by network.Network.group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.configs import ConfigBatch
from costmodel.network import Factors, Group, Network


def _take(factors: Factors, skip, take) -> Factors:
    """The sub-group formed by members `skip`, 2*skip, ... of the (stride, count) space `factors`
    (inner first), keeping `take` of them: skip the innermost `skip` slots, take the next."""
    out: Factors = []
    for stride, count in factors:
        skipped = np.minimum(count, skip)
        skip = skip / skipped
        stride = stride * skipped
        count = count / skipped
        taken = np.minimum(count, take)
        take = take / taken
        out.append((stride, taken))
    return out


@dataclass(frozen=True)
class LayerGroups:
    """Groups whose collectives run inside a layer."""

    tp: Group
    cp: Group
    cp_inner: Group  # a2a+p2p: the all-to-all groups (consecutive CP ranks) ...
    cp_outer: Group  # ... and the ring across them
    ep: Group
    etp: Group


def _layout(order: list[str], cfg: ConfigBatch):
    f = lambda a: a.astype(float)
    t, c, p, d, e, etp = f(cfg.tp), f(cfg.cp), f(cfg.pp), np.maximum(f(cfg.dp), 1.0), f(cfg.ep), f(cfg.etp)
    ep_outer = np.maximum(1.0, np.floor(e * etp / (t * c)))
    sizes = {"tp": t, "cp": c, "ep": ep_outer, "pp": p, "dp": np.maximum(1.0, np.floor(d / ep_outer))}
    strides = {}
    running = np.ones_like(t)
    for dim in order:
        strides[dim] = running
        running = running * sizes[dim]
    stage = [(strides[dim], sizes[dim]) for dim in order if dim != "pp"]  # one pipeline stage's ranks
    edp = np.maximum(1.0, np.floor(t * c * d / (e * etp)))
    return t, c, d, e, etp, edp, strides, stage


@dataclass(frozen=True)
class StageGroups:
    pp: Group
    dp: Group  # the dp*cp ranks that hold the same dense parameters
    shard: Group  # ZeRO / FSDP sharding group: the whole dp group, or HSDP's inner shard group
    replica: Group  # HSDP: the shard groups' corresponding ranks (size 1 without HSDP)
    edp: Group


def stage_groups(order: list[str], cfg: ConfigBatch, net: Network, experts: bool = True) -> StageGroups:
    """The groups that depend on the pipeline and data-parallel sizes (per configuration).
    HSDP shards over consecutive ranks of the dp*cp group (the innermost, best connected) and
    replicates across them (torchtitan's data_parallel_shard_degree x replicate_degree). A dense
    model (experts=False) has no expert-data-parallel group to build."""
    t, c, d, e, etp, edp, strides, stage = _layout(order, cfg)
    dp_factors = _take(stage, t, c * d)
    dp = net.group(dp_factors)
    if np.any(cfg.dp_shard > 0):
        shard_size = np.where(cfg.dp_shard > 0, cfg.dp_shard, c * d)
        shard, replica = net.group(_take(dp_factors, 1.0, shard_size)), net.group(_take(dp_factors, shard_size, c * d / shard_size))
    else:  # no HSDP in the batch: the sharding group is the data-parallel group
        shard, replica = dp, net.single(c)
    return StageGroups(
        pp=net.group([(strides["pp"], cfg.pp.astype(float))]),
        dp=dp,
        shard=shard,
        replica=replica,
        edp=net.group(_take(stage, etp * e, edp)) if experts else dp,
    )


def place(order: list[str], cfg: ConfigBatch, net: Network) -> LayerGroups:
    """The TP, CP, EP and expert-TP groups of each configuration."""
    t, c, d, e, etp, edp, strides, stage = _layout(order, cfg)
    cp = net.group([(strides["cp"], c)])
    if np.any(cfg.cp_a2a > 0):
        inner = np.where(cfg.cp_a2a > 0, cfg.cp_a2a, 1.0)
        cp_inner, cp_outer = net.group([(strides["cp"], inner)]), net.group([(strides["cp"] * inner, c / inner)])
    else:  # no hierarchical CP in the batch: skip building the sub-groups
        cp_inner, cp_outer = net.single(c), cp
    return LayerGroups(
        tp=net.group([(strides["tp"], t)]),
        cp=cp,
        cp_inner=cp_inner,
        cp_outer=cp_outer,
        ep=net.group(_take(stage, etp, e)),
        etp=net.group(_take(stage, 1.0, etp)),
    )
