"""Pipeline-level cost model: MoFa eqs. 9-12 (interleaved 1F1B) and eq. 23 (PP overlap).

Layer split. `even`: every one of the pp*vp virtual stages holds l = L/(pp*vp) layers.
`embedding_loss` (Megatron --account-for-embedding/loss-in-pipeline-split; the Llama 3 layout
of 126 layers on 16 stages): the embedding and the loss count as one layer each, so
l = (L+2)/(pp*vp) and the first and last virtual stages hold l-1 transformer layers.
Rank r holds virtual stages r, r+pp, ..., r+(vp-1)*pp.

Three rank classes bound everything that differs between ranks: the first (embedding, most
activations in flight), the second (the busiest middle rank) and the last (output head and
loss). Middle ranks are assumed alike (exact unless an MoE model's leading dense layers
spill past the first virtual stage, which no shipped model does).

Pipeline time. With R_r the forward+backward time of one micro-batch on rank r (all its
virtual stages) and m micro-batches, the interleaved 1F1B schedule takes
    T = m * max_r R_r + (sum_r R_r - max_r R_r) / vp + T_pp
which for equal ranks is (m*vp + pp - 1) * (F_chunk + B_chunk), Narayanan et al. 2021 eq. for
the interleaved bubble. This replaces MoFa's eqs. 9-11, whose printed steady-state term
mixes per-chunk and per-rank quantities (v*l*T^FWD next to l*T^BWD); the sum of its three
phases is the same expression when those are made consistent.

PP communication (tau = one hop of an activation micro-batch, s*b*h/(tp*cp) elements with
sequence parallelism, as Megatron sends it):
  * without overlap every forward and backward chunk-step blocks on its hop, and the fill and
    drain each add pp-1 hops on the critical path: (2*m*vp + 2*(pp-1)) * tau. For vp = 1 this
    is MoFa's steady-state count (4*m*v - 2*m + 2*p - 2) * T^PP.
  * with overlap (eq. 23) the hops of the steady state hide behind the neighbouring chunk:
    max(0, beta*tau - alpha*l*T^FWD) (and T^BWD), while the warm-up and cool-down chains keep
    vp*pp - 1 exposed hops each (MoFa eqs. 9 and 11 count exactly these).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.configs import ConfigBatch


@dataclass(frozen=True)
class RankLayers:
    """Layer counts of one rank class: transformer layers by kind, edge modules."""

    dense: np.ndarray
    moe: np.ndarray
    first: bool
    last: np.ndarray  # bool array: is this class the last pipeline rank

    @property
    def layers(self) -> np.ndarray:
        return self.dense + self.moe


def stage_layers(num_layers: int, cfg: ConfigBatch) -> tuple[np.ndarray, np.ndarray]:
    """(l, delta): layers per virtual stage and how many fewer the first/last stage holds."""
    stages = cfg.pp * cfg.vp
    emb = (cfg.split == 1) & (cfg.pp > 1)
    per_stage = np.where(emb, (num_layers + 2) // stages, num_layers // np.maximum(stages, 1))
    return per_stage, emb.astype(np.int64)


def _dense_on_rank(rank, num_dense: int, l, delta, cfg: ConfigBatch, max_vp: int) -> np.ndarray:
    """Leading dense layers (MoE models) that fall on pipeline rank `rank`."""
    if num_dense == 0:
        return np.zeros_like(l)
    total = np.zeros_like(l)
    for j in range(max_vp):
        k = rank + j * cfg.pp
        start = np.where(k > 0, k * l - delta, 0)
        size = l - np.where((k == 0) | (k == cfg.pp * cfg.vp - 1), delta, 0)
        overlap = np.clip(np.minimum(start + size, num_dense) - start, 0, None)
        total = total + np.where(j < cfg.vp, overlap, 0)
    return total


def rank_classes(num_layers: int, num_dense: int, cfg: ConfigBatch) -> tuple[RankLayers, RankLayers, RankLayers]:
    """First, second and last rank (they coincide when pp is 1 or 2)."""
    l, delta = stage_layers(num_layers, cfg)
    vp_max = int(cfg.vp.max()) if len(cfg) else 1
    p = cfg.pp
    on_rank = cfg.vp * l
    first_layers = np.where(p == 1, num_layers, on_rank - delta)
    last_layers = np.where(p == 1, num_layers, on_rank - delta)
    second_layers = np.where(p == 2, last_layers, on_rank)
    d_first = _dense_on_rank(0, num_dense, l, delta, cfg, vp_max)
    d_second = _dense_on_rank(np.ones_like(p), num_dense, l, delta, cfg, vp_max)
    d_last = _dense_on_rank(p - 1, num_dense, l, delta, cfg, vp_max)
    d_first = np.where(p == 1, num_dense, d_first)
    first = RankLayers(d_first, first_layers - d_first, True, p == 1)
    second = RankLayers(np.where(p == 1, d_first, d_second), np.where(p == 1, first_layers - d_first, second_layers - d_second), False, p <= 2)
    last = RankLayers(np.where(p == 1, d_first, d_last), last_layers - np.where(p == 1, d_first, d_last), False, np.ones_like(p, dtype=bool))
    return first, second, last


def in_flight(rank, cfg: ConfigBatch, microbatches) -> np.ndarray:
    """Micro-batch chunks whose activations rank `rank` holds at its peak (eq. 5's factor).

    Interleaved (vp > 1): Megatron warms up (pp - r - 1)*2 + (vp - 1)*pp chunks and holds one
    more in the first steady step: vp*pp + pp - 2r - 1, MoFa's eq. 5 exactly. Non-interleaved
    (vp = 1): Megatron warms up pp - r - 1, so pp - r are held -- eq. 5 would give
    2pp - 2r - 1 there, which overstates rank 0 by pp - 1 micro-batches. Capped at m*vp."""
    p, v = cfg.pp, cfg.vp
    count = np.where(v > 1, v * p + p - 2 * rank - 1, p - rank)
    return np.minimum(count, microbatches * v)


@dataclass(frozen=True)
class PipelineTime:
    total: np.ndarray
    steady: np.ndarray  # m * max_r R_r: the bottleneck rank's own work
    bubble: np.ndarray  # (sum_r R_r - max_r R_r) / vp
    pp_exposed: np.ndarray
    bottleneck: np.ndarray  # index of the rank class with the most work (0 first, 1 second, 2 last)


def pipeline_time(rank_work: list[np.ndarray], cfg: ConfigBatch, microbatches, hop, chunk_f, chunk_b, pp_overlap_coef) -> PipelineTime:
    """rank_work: per-micro-batch forward+backward time of the first, second and last rank
    classes; chunk_f/chunk_b: forward/backward time of one virtual-stage chunk (for eq. 23)."""
    p, v = cfg.pp, cfg.vp
    R = np.stack(rank_work)
    r_max = R.max(axis=0)
    middle = np.maximum(p - 2, 0)
    total_work = np.where(p == 1, R[0], R[0] + R[2] + middle * R[1])
    steady = microbatches * r_max
    bubble = (total_work - r_max) / v

    no_overlap = (2 * microbatches * v + 2 * (p - 1)) * hop
    c = pp_overlap_coef
    steady_hidden = microbatches * v * (np.maximum(0.0, c.beta * hop - c.alpha * chunk_f) + np.maximum(0.0, c.beta * hop - c.alpha * chunk_b))
    with_overlap = 2 * (v * p - 1) * hop + steady_hidden
    pp = np.where(p == 1, 0.0, np.where(cfg.pp_overlap == 1, with_overlap, no_overlap))
    return PipelineTime(steady + bubble + pp, steady, bubble, pp, R.argmax(axis=0))
