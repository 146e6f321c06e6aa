"""Layer layouts over pipeline ranks and virtual stages: the rules Megatron applies to them.

A configuration gives the transformer layers of the first and the last pipeline
rank; the other ranks share the rest evenly, each over vp virtual stages. Four layouts:
  * even: L/pp layers per rank, L/(pp*vp) per virtual stage;
  * embedding_loss (Megatron --account-for-embedding/loss-in-pipeline-split; the Llama 3 layout
    of 126 layers on 16 stages): the embedding and the loss count as a layer each, so every
    virtual stage holds l = (L+2)/(pp*vp) and the first and last one l-1 transformer layers;
  * uneven (Megatron --decoder-first/last-pipeline-num-layers): middle ranks hold the smallest
    multiple of vp >= L/pp, the first and last rank the rest (the first the smaller share,
    since it keeps the most activations in flight), each a multiple of vp;
  * layout (Megatron-Core --pipeline-model-parallel-layout): where none of the three admits
    (pp, vp) -- DeepSeek-V3's 61 layers on pp 16 x vp 2 -- uneven without the multiple-of-vp
    rule at the edges: middle ranks hold ceil(L/pp) where vp divides it, the first and last rank
    the rest, spread over their virtual stages as evenly as it goes
    (costmodel.pipeline.stage_sizes). Larger vp that divide no rank's share are left out: they
    multiply the skeletons (every vp up to L/pp would qualify) for stages of one or two layers. Only a
    layout string launches it (mofa.launch.plan writes the one stage_sizes gives); it is the
    skeleton the layout search (optimizer.layout_search) then refines. The exact model reads it
    by rank like the others (costmodel.pipeline.rank_classes), charging an edge rank's virtual
    stages their mean layers where they differ by one (costmodel.memory); the layout search
    scores each stage as it is (costmodel.stage_layout).
DualPipeV (V shape: rank r holds virtual stages r and 2pp-1-r, so rank 0 holds both ends, the
embedding and the head) has a split of its own, vee_split: every rank but the first the same
even number of layers, ceil(L/pp) rounded up to even, and the first rank the rest (at least
one), which it spreads over its two stages, the extra one on the embedding's. On DeepSeek-V3's
61 layers over pp 16 that is 1 layer with the embedding, head and MTP on rank 0 and 4 (2 + 2)
on the others; where 2pp divides L it is the even split. torchtitan's DualPipeV launches it
with --parallelism.pipeline-parallel-first/last-stage-less-layers (its first and last stages
are rank 0's under the V).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from costmodel.arrays import divides, floor_div
from costmodel.specs import PP_SCHEDULES

SPLIT_MODES = ("even", "embedding_loss", "uneven", "layout")
#: the splits Megatron's split flags express (the rest need a --pipeline-model-parallel-layout)
FLAG_SPLIT_MODES = SPLIT_MODES[:3]


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
    if mode == "layout":
        mid = np.ceil(L / np.maximum(pp, 1))
        rest = np.where(pp > 2, L - (pp - 2) * mid, L)
        first = floor_div(rest, 2)  # the first rank the smaller share, as uneven
        last = rest - first
        # the middle ranks' virtual stages alike, as uneven's (vp divides ceil(L/pp)): only the
        # edge ranks' stages differ, by one layer, and every stage holds a layer
        ok = (pp > 1) & (first >= vp) & (last >= vp) & divides(vp, mid)
        for flag_mode in FLAG_SPLIT_MODES:  # only where the split flags admit nothing
            ok &= split_layers(num_layers, pp, vp, flag_mode)[0] == 0
        return np.where(ok, first, zero), np.where(ok, last, zero)
    raise ValueError(f"unknown layer split {mode!r}")


def vee_split(num_layers: int, pp):
    """(first, last) rank layers of DualPipeV's split (module docstring); 0 where it does not
    apply (pp = 1, or too few layers to leave the first rank one)."""
    pp = np.asarray(pp)
    mid = np.ceil(num_layers / np.maximum(pp, 1) / 2) * 2  # ceil(L / pp) rounded up to even
    first = num_layers - (pp - 1) * mid
    ok = (pp > 1) & (first >= 1)
    return np.where(ok, first, 0 * pp), np.where(ok, mid, 0 * pp)


def vee_split_ok(num_layers: int, cfg) -> np.ndarray:
    """The split is one DualPipeV runs as the exact model reads it: every rank but the first
    (rank pp-1 included: under the V it is a middle rank) the same even layer count, two alike
    stages, and the first rank at least one layer."""
    L, p, F, La = num_layers, cfg.pp, cfg.first_layers, cfg.last_layers
    rest = L - F - La
    return (p > 1) & (F >= 1) & (La >= 2) & divides(2, La) & (rest == np.maximum(p - 2, 0) * La)


def flag_split_ok(num_layers: int, cfg) -> np.ndarray:
    """Megatron's split flags express the split: even or uneven ranks with multiples of vp per
    rank, or the embedding/loss-accounted layout."""
    L, p, v, F, La = num_layers, cfg.pp, cfg.vp, cfg.first_layers, cfg.last_layers
    single = (p == 1) & (F == L) & (La == L)
    ef, el = split_layers(L, p, v, "embedding_loss")
    emb = (ef > 0) & (F == ef) & (La == el)
    rest = L - F - La
    middle_ok = np.where(p == 2, rest == 0, (rest > 0) & divides(np.maximum((p - 2) * v, 1), rest))
    general = (p > 1) & (F >= v) & (La >= v) & divides(v, F) & divides(v, La) & middle_ok
    return single | emb | general


def split_ok(num_layers: int, cfg) -> np.ndarray:
    """Megatron accepts the split: its split flags express it (flag_split_ok), or a
    --pipeline-model-parallel-layout does, which needs only equal middle ranks (the model's
    rank classes) and a layer on every virtual stage."""
    L, p, v, F, La = num_layers, cfg.pp, cfg.vp, cfg.first_layers, cfg.last_layers
    rest = L - F - La
    middle_ok = np.where(p == 2, rest == 0, (rest >= v * np.maximum(p - 2, 1)) & divides(np.maximum(p - 2, 1), rest))
    by_layout = (p > 1) & (F >= v) & (La >= v) & middle_ok
    return flag_split_ok(num_layers, cfg) | by_layout


def needs_layout(num_layers: int, cfg) -> np.ndarray:
    """Rows whose split only a --pipeline-model-parallel-layout launches (not DualPipeV's: its
    own split, vee_split, is torchtitan's first/last-stage flags, and Megatron has no DualPipeV)."""
    vee = getattr(cfg, "pp_schedule", None)
    vee = False if vee is None else vee == PP_SCHEDULES.index("dualpipev")
    return split_ok(num_layers, cfg) & ~flag_split_ok(num_layers, cfg) & ~vee


def middle_layers(num_layers: int, cfg) -> np.ndarray:
    return np.where(cfg.pp > 2, floor_div(num_layers - cfg.first_layers - cfg.last_layers, np.maximum(cfg.pp - 2, 1)), cfg.last_layers)


def layout_name(num_layers: int, pp: int, vp: int, first: int, last: int, schedule: str | None = None) -> str:
    """The split's name: a flag split's mode, "layout" where only a layout string expresses it
    (needs_layout, which knows DualPipeV's split from the schedule), "uneven" otherwise."""
    for mode in FLAG_SPLIT_MODES:
        f, la = split_layers(num_layers, np.array([pp]), np.array([vp]), mode)
        if f[0] == first and la[0] == last and f[0] > 0:
            return mode
    row = SimpleNamespace(pp=np.array([pp]), vp=np.array([vp]), first_layers=np.array([first]), last_layers=np.array([last]))
    if schedule is not None:
        row.pp_schedule = np.array([PP_SCHEDULES.index(schedule)])
    return "layout" if needs_layout(num_layers, row)[0] else "uneven"
