"""costmodel.stage_layout.step_overhead_floor_s (what any layout adds to its makespan in the
step: exposed P2P and the busiest rank's DP reduce and update) against every layout and
recompute vector, enumerated and scored by the exact layout model: on one kind of decoder
layer, where every way of sharing the layers among the ranks is some layout, each floor is the
least over the layouts; with dense and MoE layers in model order (and the MTP module on the last
rank) it bounds them from below."""

import pytest

from costmodel.configs import ConfigBatch
from costmodel.loader import load_problem
from costmodel.stage_layout import layout_context, pp_exposed_floor_s, step_overhead_floor_s, update_floor_s
from mofa.commands.solve import render_layout
from optimizer.layout_oracles import enumerate_layouts

DENSE = """name: tiny-dense
model: {preset: llama3.1-8b, num_layers: 7}
hardware: h100-sxm
cluster: {num_gpus: 64, gpus_per_node: 8}
training: {global_batch_size: 64, seq_len: 32768, dtypes: {params: bf16, grads: bf16, optimizer: fp32}}
"""
MOE = """name: tiny-moe
model: {preset: deepseek-v3, num_layers: 7}
hardware: h100-sxm
cluster: {num_gpus: 64, gpus_per_node: 8}
training: {global_batch_size: 64, seq_len: 32768, dtypes: {params: bf16, grads: bf16, optimizer: fp32}}
"""


def context(tmp_path, text, recompute, overrides=(), **degrees):
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    full = dict(recompute=2, recompute_method=1, recompute_layers=1) if recompute else {}
    cfg = ConfigBatch.from_columns(64, **(dict(mbs=1, first_layers=1, last_layers=1, zero_stage=1) | degrees | full))
    return layout_context(load_problem(str(path), list(overrides)), cfg)


def minima(ctx):
    """The least exposed P2P, busiest update and their sum over every layout (fitting or not)."""
    scores = [score for _, score in enumerate_layouts(ctx)]
    return (min(s.pp_exposed_s for s in scores), min(s.update_s for s in scores),
            min(s.step_time_s - (s.pipeline_s - s.pp_exposed_s) for s in scores))


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("pp,vp", [(2, 2), (4, 1)])
def test_floors_are_the_least_over_layouts_of_one_kind(tmp_path, pp, vp, recompute):
    ctx = context(tmp_path, DENSE, recompute, tp=8, pp=pp, vp=vp)
    pp_least, update_least, both_least = minima(ctx)
    assert pp_exposed_floor_s(ctx) == pytest.approx(pp_least, rel=1e-9)
    assert update_floor_s(ctx) == pytest.approx(update_least, rel=1e-9)
    assert step_overhead_floor_s(ctx) <= both_least * (1 + 1e-12)


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("pp,vp,schedule", [(2, 2, 0), (4, 1, 0), (2, 2, 4)])  # 4: DualPipeV, its V placement
def test_floors_bound_layouts_of_two_kinds(tmp_path, pp, vp, schedule, recompute):
    from costmodel.configs import PP_SCHEDULE_CODES

    assert PP_SCHEDULE_CODES["dualpipev"] == 4
    ctx = context(tmp_path, MOE, recompute, tp=8, pp=pp, vp=vp, ep=8, pp_schedule=schedule)
    pp_least, update_least, both_least = minima(ctx)
    assert pp_exposed_floor_s(ctx) == pytest.approx(pp_least, rel=1e-9)  # any count of recomputed layers of each kind is some layout's
    floor = update_floor_s(ctx)
    assert floor <= update_least * (1 + 1e-12)
    # not trivial: the busiest rank holds at least its share of the layers
    assert floor >= 0.5 * update_least
    assert step_overhead_floor_s(ctx) <= both_least * (1 + 1e-12)


@pytest.mark.parametrize("text,degrees,exact", [
    (DENSE.replace("seq_len: 32768", "seq_len: 1024"), dict(tp=4), True),
    (MOE.replace("seq_len: 32768", "seq_len: 4096"), dict(tp=8, ep=8), False)])
def test_update_floor_counts_the_window_recompute_opens(tmp_path, text, degrees, exact):
    """With the DP reduce overlapped and short micro-batches, a rank's recomputed layers lengthen
    its cool-down backward, the window its gradient reduce hides behind: the least busiest update
    is a layout that recomputes (checked here, so that the floor's least over each rank's
    recompute counts is what is tested), and the floor still meets (one kind) or bounds it."""
    ctx = context(tmp_path, text, True, pp=2, vp=2, dp_overlap=1, **degrees)
    scored = list(enumerate_layouts(ctx))
    least = min(s.update_s for _, s in scored)
    assert least < min(s.update_s for layout, s in scored if not layout.any_recompute) * (1 - 1e-3)
    floor = update_floor_s(ctx)
    assert floor <= least * (1 + 1e-12)
    if exact:
        assert floor == pytest.approx(least, rel=1e-9)


def test_update_floor_counts_every_chunk_overhead_in_the_window(tmp_path):
    """The window a rank's gradient reduce hides behind is one micro-batch over all its chunks,
    each paying the per-chunk overhead (`stage_overhead_us`, fitted at 0 on the bundled
    profiles, so set here): with the reduce overlapped and longer than the window, the busiest
    update moves with that overhead (checked), and the floor, which adds the rank's other
    chunks' overhead to the one chunk_times carries, still meets the least over the layouts."""
    text = DENSE.replace("seq_len: 32768", "seq_len: 1024")
    plain, slow = (context(tmp_path, text, False, [f"hardware.efficiency.stage_overhead_us={us}"], tp=4, pp=2, vp=4, dp_overlap=1)
                   for us in (0.0, 2000.0))
    least = [minima(ctx) for ctx in (plain, slow)]
    assert least[1][1] < least[0][1] * (1 - 1e-3)  # a longer window hides more of the reduce
    for ctx, (_, update_least, _) in zip((plain, slow), least):
        assert update_floor_s(ctx) == pytest.approx(update_least, rel=1e-9)


def test_layout_report_step_bound_holds_for_every_layout(tmp_path):
    """layout_report's step bound (its makespan bound plus the floor) is below the step of every
    layout that fits in the space it speaks for, the launched one-N answer's and the per-stage
    answer's alike (7-layer DeepSeek-V3 at 44000 MiB on pp 4 x vp 1, where the best per-stage
    recompute is no one N), and its step gap is at least what its makespan gap leaves in the step."""
    from optimizer.layout_report import layout_report

    ctx = context(tmp_path, MOE, True, ["hardware.memory_mib=44000"], tp=8, pp=4, vp=1, ep=8, last_layers=2)
    report, _ = layout_report(ctx.problem, ctx.cfg, time_limit_s=20)
    assert report["recompute_expressible"] is False
    fitting = [(layout, s.step_time_s) for layout, s in enumerate_layouts(ctx) if s.fits]
    one_n = min(step for layout, step in fitting if layout.uniform_recompute() is not None)
    assert report["step_lower_bound_s"] <= one_n * (1 + 1e-9) and report["step_lower_bound_s"] <= report["step_time_s"]
    other = report["best_any_recompute"]
    assert other["step_lower_bound_s"] <= min(step for _, step in fitting) * (1 + 1e-9)
    for answer in (report, other):  # the step's gap in seconds holds the makespan's: step - floor >= makespan
        makespan = answer["makespan_lower_bound_s"] / (1 - answer["gap"])
        assert answer["step_gap"] * answer["step_time_s"] >= (makespan - answer["makespan_lower_bound_s"]) * (1 - 1e-9) - 1e-12
    assert f"step gap {100 * report['step_gap']:.2f}%" in render_layout(report)


def test_memory_keeps_the_update_floor_to_layouts_that_fit(tmp_path):
    """At 8000 MiB on pp 4 x vp 1 without recompute one layout fits (1, 2, 3, 1 layers: rank 0,
    with the most micro-batches in flight, holds one), and its busiest update is above the floor
    with memory left out; with each rank's least_recompute table (here, the most layers it fits)
    the floor is that layout's, and step_floor_s takes it where an answer updates more than the
    floor without memory."""
    from optimizer.layout_linear import LinearLayouts, least_recompute
    from optimizer.layout_search import solve_layout
    from optimizer.layout_report import step_floor_s

    ctx = context(tmp_path, DENSE, False, ["hardware.memory_mib=8000"], tp=8, pp=4, vp=1)
    fitting = [(layout, s) for layout, s in enumerate_layouts(ctx) if s.fits]
    assert [layout.decoders for layout, _ in fitting] == [(1, 2, 3, 1)]
    least = min(s.update_s for _, s in fitting)
    assert update_floor_s(ctx) < least * (1 - 1e-6)
    lin = LinearLayouts(ctx)
    tables = [least_recompute(ctx, lin, r, 7) for r in range(4)]
    assert update_floor_s(ctx, tables) == pytest.approx(least, rel=1e-9)
    answer = solve_layout(ctx, 10.0, seeds=(fitting[0][0],))
    assert step_floor_s(ctx, [answer]) == pytest.approx(pp_exposed_floor_s(ctx) + least, rel=1e-9)


def test_update_floor_is_zero_beyond_its_enumeration(tmp_path, monkeypatch):
    """Where the (layers, recomputed) count pairs of a rank exceed FLOOR_PAIRS the update term's
    floor is zero (still a bound), and the step floor the exposed P2P's alone."""
    import costmodel.stage_layout as stage_layout

    ctx = context(tmp_path, MOE, True, tp=8, pp=2, vp=2, ep=8)
    assert update_floor_s(ctx) > 0.0
    monkeypatch.setattr(stage_layout, "FLOOR_PAIRS", 10)
    assert update_floor_s(ctx) == 0.0 and step_overhead_floor_s(ctx) == pp_exposed_floor_s(ctx)


def test_memory_floor_under_dualpipev(tmp_path):
    """DualPipeV on pp 2 at 10000 MiB without recompute: six V layouts fit, each rank 4 layers
    at most, so the least busiest update is above the floor without memory; with each rank's
    least_recompute table (over the V's two stages of the rank) the floor meets it."""
    from optimizer.layout_linear import LinearLayouts, least_recompute

    ctx = context(tmp_path, DENSE, False, ["hardware.memory_mib=10000"], tp=8, pp=2, vp=2, pp_schedule=4)
    assert ctx.vee
    least = min(s.update_s for _, s in enumerate_layouts(ctx) if s.fits)
    assert update_floor_s(ctx) < least * (1 - 1e-6)
    lin = LinearLayouts(ctx)
    assert update_floor_s(ctx, [least_recompute(ctx, lin, r, 7) for r in range(2)]) == pytest.approx(least, rel=1e-9)
