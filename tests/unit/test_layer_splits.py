"""Layer splits over pipeline ranks and virtual stages (costmodel.layout, costmodel.pipeline.stage_sizes):
the split flags' three splits, the layout split for the (pp, vp) none of them admits, and
DualPipeV's V split."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.configs import PP_SCHEDULE_CODES
from costmodel.layout import FLAG_SPLIT_MODES, flag_split_ok, layout_name, needs_layout, split_layers, split_ok, vee_split, vee_split_ok
from costmodel.pipeline import stage_sizes
from costmodel.stage_layout import StageLayout, megatron_layout


class Rows:
    """pp, vp, first/last layers (and the schedule) as split_ok reads them from a ConfigBatch."""

    def __init__(self, pp, vp, first, last, schedule="interleaved_1f1b"):
        self.pp, self.vp = np.atleast_1d(pp), np.atleast_1d(vp)
        self.first_layers, self.last_layers = np.atleast_1d(first), np.atleast_1d(last)
        self.pp_schedule = np.full(len(self.pp), PP_SCHEDULE_CODES[schedule])


def one(num_layers, pp, vp, mode):
    f, la = split_layers(num_layers, np.array([pp]), np.array([vp]), mode)
    return int(f[0]), int(la[0])


def test_deepseek_v3_on_pp16_vp2_needs_a_layout():
    """61 layers: the split flags admit no split of pp 16 x vp 2 (uneven gives 2 / 3 edge layers,
    3 not a multiple of vp); the layout split keeps 4 on each middle rank and 2 / 3 on the edges."""
    assert all(one(61, 16, 2, mode) == (0, 0) for mode in FLAG_SPLIT_MODES)
    assert one(61, 16, 2, "layout") == (2, 3)
    assert needs_layout(61, Rows(16, 2, 2, 3))[0] and layout_name(61, 16, 2, 2, 3) == "layout"
    sizes, rank = stage_sizes(61, 16, 2, 2, 3, False)
    assert sizes.tolist() == [1] + [2] * 15 + [1] + [2] * 14 + [1]  # the first rank's extra on its last chunk, the last rank's on its first
    assert megatron_layout(61, 1, 16, 2, 2, 3).to_megatron() == "Et|" + "tt|" * 15 + "t|" + "tt|" * 14 + "tmL"


def test_the_layout_split_is_only_where_the_flags_admit_none():
    # Llama 3 405B on pp 16 x vp 8: the embedding/loss split exists, so no layout row
    assert one(126, 16, 8, "embedding_loss") == (7, 7) and one(126, 16, 8, "layout") == (0, 0)
    # 80 layers on pp 4 x vp 2: even
    assert one(80, 4, 2, "even") == (20, 20) and one(80, 4, 2, "layout") == (0, 0)
    # vp must divide the middle ranks' ceil(L / pp): 61 on pp 16 x vp 4 (4 per middle rank) has
    # edges of 2 and 3 layers, fewer than vp: no split at all
    assert one(61, 16, 4, "layout") == (0, 0) and one(61, 8, 4, "layout") == (6, 7)
    assert one(61, 8, 3, "layout") == (0, 0)  # 3 does not divide ceil(61 / 8) = 8


def test_split_ok_tells_flags_from_layouts():
    rows = Rows([16, 16, 16, 2, 4], [2, 2, 2, 2, 2], [2, 4, 1, 30, 14], [3, 3, 3, 31, 15])
    assert flag_split_ok(61, rows).tolist() == [False, False, False, False, False]
    # 4 / 3: the middle ranks would hold 54 / 14 layers; 1 first layer leaves a virtual stage empty
    assert split_ok(61, rows).tolist() == [True, False, False, True, True]
    assert layout_name(80, 4, 2, 20, 20) == "even" and layout_name(80, 4, 2, 18, 22) == "uneven"


@settings(max_examples=300, deadline=None)
@given(num_layers=st.integers(2, 160), pp=st.integers(2, 32), vp=st.integers(1, 8))
def test_every_split_lays_out_every_layer(num_layers, pp, vp):
    """Whichever mode applies, the stages hold every layer, each rank the counts the split gives,
    its virtual stages within one layer of each other, and Megatron's layout string of it
    parses back to the same stages."""
    for mode in (*FLAG_SPLIT_MODES, "layout"):
        first, last = one(num_layers, pp, vp, mode)
        if first == 0:
            continue
        assert split_ok(num_layers, Rows(pp, vp, first, last))[0]
        assert needs_layout(num_layers, Rows(pp, vp, first, last))[0] == (mode == "layout")
        sizes, rank = stage_sizes(num_layers, pp, vp, first, last, False)
        assert sizes.sum() == num_layers and sizes.min() >= (0 if mode == "embedding_loss" else 1)
        per_rank = np.bincount(rank, weights=sizes, minlength=pp)
        middle = (num_layers - first - last) // (pp - 2) if pp > 2 else None
        if mode != "embedding_loss":
            assert per_rank[0] == first and per_rank[-1] == last
            assert middle is None or (per_rank[1:-1] == middle).all()
        for r in range(pp):
            chunks = sizes[rank == r]
            assert chunks.max() - chunks.min() <= 1
        layout = megatron_layout(num_layers, 0, pp, vp, first, last)
        assert StageLayout.from_megatron(layout.to_megatron(), pp, vp).decoders == layout.decoders


def test_deepseek_v3_under_dualpipev_takes_the_v_split():
    """61 layers over pp 16 under DualPipeV: no 2pp-stage split is even, so every rank but the
    first holds 4 (2 per stage) and rank 0, which holds both ends of the V (embedding, head,
    MTP), the one layer left, on the embedding's stage; torchtitan's first/last-stage flags
    give the same stages (tests/frameworks)."""
    first, last = (int(x[0]) for x in vee_split(61, np.array([16])))
    assert (first, last) == (1, 4)
    assert vee_split_ok(61, Rows(16, 2, 1, 4, "dualpipev"))[0]
    sizes, rank = stage_sizes(61, 16, 2, first, last, True)
    assert sizes.tolist() == [1] + [2] * 30 + [0]
    assert rank[0] == rank[-1] == 0 and np.bincount(rank, weights=sizes).tolist() == [1] + [4] * 15
    # Megatron's layout split of the same (pp, vp) is not one DualPipeV runs, nor is it a layout under it
    assert not vee_split_ok(61, Rows(16, 2, 2, 3, "dualpipev"))[0]
    assert not needs_layout(61, Rows(16, 2, 2, 3, "dualpipev"))[0]
    assert layout_name(61, 16, 2, 1, 4, "dualpipev") == "uneven"


def test_the_v_split_is_the_even_one_where_2pp_divides_the_layers():
    assert [int(x[0]) for x in vee_split(64, np.array([16]))] == [4, 4]
    assert stage_sizes(64, 16, 2, 4, 4, True)[0].tolist() == [2] * 32
    assert [int(x[0]) for x in vee_split(3, np.array([4]))] == [0, 0]  # too few layers: no split


@settings(max_examples=300, deadline=None)
@given(num_layers=st.integers(2, 160), pp=st.integers(2, 32))
def test_every_v_split_lays_out_every_layer(num_layers, pp):
    """Where it applies, the V split holds every layer, every rank but the first the same even
    count (two alike stages), the first no more than the others, and DualPipeV's rule accepts it."""
    first, last = (int(x[0]) for x in vee_split(num_layers, np.array([pp])))
    if first == 0:
        return
    assert vee_split_ok(num_layers, Rows(pp, 2, first, last, "dualpipev"))[0]
    sizes, rank = stage_sizes(num_layers, pp, 2, first, last, True)
    per_rank = np.bincount(rank, weights=sizes, minlength=pp)
    assert sizes.sum() == num_layers and sizes.min() >= 0
    assert per_rank[0] == first <= last and (per_rank[1:] == last).all() and last % 2 == 0
    assert (sizes[1:-1] == last // 2).all() and sizes[0] >= sizes[-1] >= sizes[0] - 1
