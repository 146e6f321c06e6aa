"""Where each parallel group sits in rank space, given the placement order.

Dense layers use the grid [TP, CP, PP, DP]; expert layers the grid [ETP, EP, PP, EDP] over the
same ranks (Megatron's "MoE parallel folding"): the ETP x EP block of a pipeline stage takes
the innermost ranks of that stage, first the TP ranks, then CP, then whatever part of EP does
not fit in TP x CP (the `ep` slot of the placement order), so EP stays as close as it can.
Each group is returned as (stride, count) factors, inner first (see network.Network.fanout).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.configs import ConfigBatch
from costmodel.network import Factors


def _take(factors: Factors, skip, take) -> Factors:
    """The sub-group formed by members `skip`, 2*skip, ... of the (stride, count) space `factors`
    (inner first), keeping `take` of them: skip the innermost `skip` slots, take the next."""
    out: Factors = []
    skip = np.asarray(skip, dtype=np.int64)
    take = np.asarray(take, dtype=np.int64)
    for stride, count in factors:
        skipped = np.minimum(count, skip)
        skip = skip // np.maximum(skipped, 1)
        stride = stride * skipped
        count = count // np.maximum(skipped, 1)
        taken = np.minimum(count, take)
        take = take // np.maximum(taken, 1)
        out.append((stride, taken))
    return out


@dataclass(frozen=True)
class Placement:
    tp: Factors
    cp: Factors
    pp_stride: np.ndarray
    dp: Factors  # gradient reduction of dense parameters: CP x DP ranks (CP shares weights)
    ep: Factors
    etp: Factors
    edp: Factors  # gradient reduction of expert parameters
    ep_outer: np.ndarray


def place(order: list[str], cfg: ConfigBatch) -> Placement:
    t, c, p, d, e, etp = cfg.tp, cfg.cp, cfg.pp, np.maximum(cfg.dp, 1), cfg.ep, cfg.etp
    ep_outer = np.maximum(1, (e * etp) // (t * c))
    sizes = {"tp": t, "cp": c, "ep": ep_outer, "pp": p, "dp": np.maximum(1, d // ep_outer)}
    strides = {}
    running = np.ones_like(t)
    for dim in order:
        strides[dim] = running
        running = running * sizes[dim]
    stage = [(strides[dim], sizes[dim]) for dim in order if dim != "pp"]  # one pipeline stage's ranks
    edp = (t * c * d) // np.maximum(e * etp, 1)
    return Placement(
        tp=[(strides["tp"], t)],
        cp=[(strides["cp"], c)],
        pp_stride=strides["pp"],
        dp=_take(stage, t, c * d),  # all stage ranks with the same TP rank
        ep=_take(stage, etp, e),
        etp=_take(stage, 1, etp),
        edp=_take(stage, etp * e, edp),
        ep_outer=ep_outer,
    )
