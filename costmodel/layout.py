"""Layer layouts over pipeline ranks and virtual stages: the rules Megatron applies to them.

A configuration gives the transformer layers of the first and the last pipeline
rank; the other ranks share the rest evenly, each over vp virtual stages. Three layouts:
  * even: L/pp layers per rank, L/(pp*vp) per virtual stage;
  * embedding_loss (Megatron --account-for-embedding/loss-in-pipeline-split; the Llama 3 layout
    of 126 layers on 16 stages): the embedding and the loss count as a layer each, so every
    virtual stage holds l = (L+2)/(pp*vp) and the first and last one l-1 transformer layers;
  * uneven (Megatron --decoder-first/last-pipeline-num-layers): middle ranks hold the smallest
    multiple of vp >= L/pp, the first and last rank the rest (the first the smaller share,
    since it keeps the most activations in flight), each a multiple of vp.
"""

from __future__ import annotations

import numpy as np

from costmodel.arrays import divides, floor_div

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


def split_ok(num_layers: int, cfg) -> np.ndarray:
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


def middle_layers(num_layers: int, cfg) -> np.ndarray:
    return np.where(cfg.pp > 2, floor_div(num_layers - cfg.first_layers - cfg.last_layers, np.maximum(cfg.pp - 2, 1)), cfg.last_layers)


def layout_name(num_layers: int, pp: int, vp: int, first: int, last: int) -> str:
    for mode in SPLIT_MODES:
        f, la = split_layers(num_layers, np.array([pp]), np.array([vp]), mode)
        if f[0] == first and la[0] == last and f[0] > 0:
            return mode
    return "uneven"
