"""Pipeline-level cost model: MoFa eqs. 9-12 (interleaved 1F1B) and eq. 23 (PP overlap).

Layer split. A configuration gives the transformer layers of the first and the last pipeline
rank; the other ranks share the rest evenly, each over vp virtual stages. Three layouts:
  * even: L/pp layers per rank, L/(pp*vp) per virtual stage;
  * embedding_loss (Megatron --account-for-embedding/loss-in-pipeline-split; the Llama 3 layout
    of 126 layers on 16 stages): the embedding and the loss count as a layer each, so every
    virtual stage holds l = (L+2)/(pp*vp) and the first and last one l-1 transformer layers;
  * uneven (Megatron --decoder-first/last-pipeline-num-layers): middle ranks hold the smallest
    multiple of vp >= L/pp, the first and last rank the rest (the first the smaller share,
    since it keeps the most activations in flight), each a multiple of vp.
Rank r holds virtual stages r, r+pp, ..., r+(vp-1)*pp.

Three rank classes bound everything that differs between ranks: the first (embedding, most
activations in flight), the second (the busiest middle rank) and the last (output head and
loss). Middle ranks are assumed alike (exact unless an MoE model's leading dense layers
spill past the first two virtual stages, which no shipped model does).

Pipeline time. With R_r the forward+backward time of one micro-batch on rank r (all its
virtual stages) and m micro-batches, the interleaved 1F1B schedule takes
    T = m * max_r R_r + (sum_r R_r - max_r R_r) / vp + T_pp
which for equal ranks is (m*vp + pp - 1) * (F_chunk + B_chunk), Narayanan et al. 2021 eq. for
the interleaved bubble. This replaces MoFa's eqs. 9-11, whose printed steady-state term
mixes per-chunk and per-rank quantities (v*l*T^FWD next to l*T^BWD); the sum of its three
phases is the same expression when those are made consistent.

PP communication (tau = one hop of an activation micro-batch: s*b*h/cp elements, divided by tp
with sequence parallelism, as Megatron's get_tensor_shapes sends it):
  * without overlap every forward and backward chunk-step blocks on its hop, and the fill and
    drain each add pp-1 hops on the critical path: (2*m*vp + 2*(pp-1)) * tau. For vp = 1 this
    is MoFa's steady-state count (4*m*v - 2*m + 2*p - 2) * T^PP.
  * with overlap (eq. 23) the hops of the steady state hide behind the neighbouring chunk:
    each adds max(beta*tau - chunk, (alpha-1)*min(chunk, beta*tau)) (beta slowing the hop,
    alpha the chunk it overlaps), while the warm-up and cool-down chains keep vp*pp - 1
    exposed hops each (MoFa eqs. 9 and 11 count exactly these).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.arrays import argmax3, blend, divides, floor_div
from costmodel.configs import ConfigBatch

SPLIT_MODES = ("even", "embedding_loss", "uneven")


def split_layers(num_layers: int, pp, vp, mode: str):
    """(first, last) transformer layers on the first and last rank for a layout; 0 where the
    layout does not apply to (pp, vp)."""
    L = num_layers
    pp, vp = np.asarray(pp), np.asarray(vp)
    stages = pp * vp
    zero = np.zeros_like(pp)
    if mode == "even":
        ok = divides(stages, L) | ((pp == 1) & (vp == 1))
        per_rank = np.where(pp == 1, L, floor_div(L, np.maximum(pp, 1)))
        return np.where(ok, per_rank, zero), np.where(ok, per_rank, zero)
    if mode == "embedding_loss":
        per_stage = floor_div(L + 2, stages)  # the first virtual stage may hold only the embedding
        count = vp * per_stage - 1
        ok = (pp > 1) & divides(stages, L + 2) & (count >= 1)
        return np.where(ok, count, zero), np.where(ok, count, zero)
    if mode == "uneven":
        mid = np.ceil(L / np.maximum(pp, 1))  # ceil(L / pp) ...
        mid = np.ceil(mid / vp) * vp  # ... rounded up to a multiple of vp
        rest = np.where(pp > 2, L - (pp - 2) * mid, L)
        first = floor_div(rest, 2 * vp) * vp
        last = rest - first
        ok = (pp > 1) & (first >= vp) & (last >= vp) & divides(vp, last)
        return np.where(ok, first, zero), np.where(ok, last, zero)
    raise ValueError(f"unknown layer split {mode!r}")


def split_ok(num_layers: int, cfg: ConfigBatch) -> np.ndarray:
    """Megatron accepts the layout: even or uneven ranks with multiples of vp per rank, or the
    embedding/loss-accounted layout."""
    L, p, v, F, La = num_layers, cfg.pp, cfg.vp, cfg.first_layers, cfg.last_layers
    single = (p == 1) & (F == L) & (La == L)
    ef, el = split_layers(L, p, v, "embedding_loss")
    emb = (ef > 0) & (F == ef) & (La == el)
    rest = L - F - La
    middle_ok = np.where(p == 2, rest == 0, (rest > 0) & divides(np.maximum((p - 2) * v, 1), rest))
    general = (p > 1) & (F >= v) & (La >= v) & divides(v, F) & divides(v, La) & middle_ok
    return single | emb | general


def middle_layers(num_layers: int, cfg: ConfigBatch) -> np.ndarray:
    return np.where(cfg.pp > 2, floor_div(num_layers - cfg.first_layers - cfg.last_layers, np.maximum(cfg.pp - 2, 1)), cfg.last_layers)


def layout_name(num_layers: int, pp: int, vp: int, first: int, last: int) -> str:
    for mode in SPLIT_MODES:
        f, la = split_layers(num_layers, np.array([pp]), np.array([vp]), mode)
        if f[0] == first and la[0] == last and f[0] > 0:
            return mode
    return "uneven"


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


def rank_classes(num_layers: int, num_dense: int, cfg: ConfigBatch) -> tuple[RankLayers, RankLayers, RankLayers]:
    """First, second and last rank (they coincide when pp is 1 or 2). The leading dense layers
    of an MoE model fill the first virtual stage of rank 0, then that of rank 1."""
    p, v = cfg.pp, cfg.vp
    first_n = np.where(p == 1, num_layers, cfg.first_layers)
    last_n = np.where(p == 1, num_layers, cfg.last_layers)
    second_n = np.where(p <= 2, last_n, middle_layers(num_layers, cfg))
    if num_dense >= num_layers:  # a dense model
        return (
            RankLayers(first_n, 0 * first_n, True, p == 1),
            RankLayers(second_n, 0 * second_n, False, p <= 2),
            RankLayers(last_n, 0 * last_n, False, np.ones_like(p, dtype=bool)),
        )
    chunk0 = floor_div(first_n, v)
    d_first = np.minimum(num_dense, chunk0)
    d_first = np.where(p == 1, num_dense, d_first)
    d_second = np.where(p == 1, d_first, np.minimum(np.maximum(num_dense - chunk0, 0), floor_div(second_n, v)))
    d_last = np.where(p == 1, d_first, np.where(p == 2, d_second, 0))
    first = RankLayers(d_first, first_n - d_first, True, p == 1)
    second = RankLayers(d_second, second_n - d_second, False, p <= 2)
    last = RankLayers(d_last, last_n - d_last, False, np.ones_like(p, dtype=bool))
    return first, second, last


def in_flight(rank, cfg: ConfigBatch, microbatches) -> np.ndarray:
    """Micro-batch chunks whose activations rank `rank` holds at its peak (eq. 5's factor).

    Interleaved (vp > 1): Megatron warms up (pp - r - 1)*2 + (vp - 1)*pp chunks and holds one
    more in the first steady step: vp*pp + pp - 2r - 1, MoFa's eq. 5 exactly. Non-interleaved
    (vp = 1): Megatron warms up pp - r - 1, so pp - r are held -- eq. 5 would give
    2pp - 2r - 1 there, which overstates rank 0 by pp - 1 micro-batches. Capped at m*vp."""
    p, v = cfg.pp, cfg.vp
    count = blend(v > 1, v * p + p - 2 * rank - 1, p - rank)
    return np.minimum(count, microbatches * v)


@dataclass(frozen=True)
class PipelineTime:
    total: np.ndarray
    bubble: np.ndarray  # (sum_r R_r - max_r R_r) / vp
    pp_exposed: np.ndarray
    bottleneck: tuple  # masks of the rank class with the most work (first, second, last)
    pp_without_overlap: np.ndarray  # the exposed PP time without overlap ...
    pp_overlap_floor: np.ndarray  # ... and the part overlap cannot hide (warm-up and cool-down chains)


def pipeline_time(rank_work: list[np.ndarray], cfg: ConfigBatch, microbatches, hop, chunk_f, chunk_b, pp_overlap_coef) -> PipelineTime:
    """rank_work: per-micro-batch forward+backward time of the first, second and last rank
    classes; chunk_f/chunk_b: forward/backward time of one virtual-stage chunk (for eq. 23)."""
    p, v = cfg.pp, cfg.vp
    r0, r1, r2 = rank_work
    r_max = np.maximum(np.maximum(r0, r1), r2)
    total_work = blend(p == 1, r0, r0 + r2 + np.maximum(p - 2, 0) * r1)
    steady = microbatches * r_max
    bubble = (total_work - r_max) / v

    no_overlap = (2 * microbatches * v + 2 * (p - 1)) * hop
    c = pp_overlap_coef

    def exposed(chunk):  # eq. 23 per hop: what the overlapped region adds beyond the chunk
        comm = c.beta * hop
        return np.maximum(comm - chunk, (c.alpha - 1.0) * np.minimum(chunk, comm))

    steady_hidden = microbatches * v * (exposed(chunk_f) + exposed(chunk_b))
    floor = (p > 1) * 2 * (v * p - 1) * hop
    no_overlap = (p > 1) * no_overlap
    pp = blend(cfg.pp_overlap == 1, floor + steady_hidden, no_overlap)
    return PipelineTime(steady + bubble + pp, bubble, pp, argmax3(r0, r1, r2), no_overlap, floor)
