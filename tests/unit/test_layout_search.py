"""The layout search (optimizer.layout_search) against its oracles: plain enumeration of every
layout and the stage dynamic program (MPE eq. 3), on a 7-layer DeepSeek-V3 (3 dense + 4 MoE
layers and its MTP module: two kind runs) small enough to enumerate, with GPU capacities from
roomy to tight so that memory binds and, at the smallest, nothing fits."""

import dataclasses

import numpy as np
import pytest

from costmodel.configs import ConfigBatch
from costmodel.loader import load_problem
from costmodel.stage_layout import LayoutError, StageLayout, layout_context, unit_costs
from optimizer.layout_linear import kind_runs
from optimizer.layout_oracles import dp_layout, enumerate_layouts
from optimizer.layout_rounds import layout_makespan, regular
from optimizer.layout_search import solve_layout, two_phase

TINY = """name: tiny-moe
model: {preset: deepseek-v3, num_layers: 7}
hardware: h100-sxm
cluster: {num_gpus: 64, gpus_per_node: 8}
training: {global_batch_size: 64, seq_len: 4096, dtypes: {params: bf16, grads: bf16, optimizer: fp32}}
"""


def context(tmp_path, pp, vp, memory_mib):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    problem = load_problem(str(path), [f"hardware.memory_mib={memory_mib}"])
    cfg = ConfigBatch.from_columns(64, tp=8, pp=pp, vp=vp, ep=8, mbs=1, first_layers=2, last_layers=2, zero_stage=1)
    return layout_context(problem, cfg)


def best_by_enumeration(ctx, objective="bound"):
    """The least critical-path bound ("bound") or simulated makespan ("makespan") over every
    layout that fits."""
    value = {"bound": lambda s: s.bound_s, "makespan": lambda s: s.pipeline_s - s.pp_exposed_s}[objective]
    scored = [(value(score), layout) for layout, score in enumerate_layouts(ctx) if score.fits]
    return min(scored, key=lambda x: x[0]) if scored else (None, None)


def assert_certifies_enumeration_optimum(ctx):
    """solve_layout certifies the least simulated makespan of every layout that fits, enumerated
    (tolerance 1e-6 relative: CP-SAT works in integer nanoseconds), with a bound below it."""
    best, _ = best_by_enumeration(ctx, "makespan")
    solution = solve_layout(ctx, time_limit_s=20)
    assert solution.optimal and solution.fits
    assert solution.makespan_s == pytest.approx(best, rel=1e-6)
    assert solution.lower_bound_s <= solution.makespan_s * (1 + 1e-9)


@pytest.mark.parametrize("pp,vp", [(4, 1), (2, 2)])
@pytest.mark.parametrize("memory_mib", [81559, 39000, 38000, 36000])  # 39000 binds at vp 2; 36000 fits nothing
def test_cpsat_matches_enumeration(tmp_path, pp, vp, memory_mib):
    """Same optimum as enumerating all C(7+S-1, S-1) layouts with the exact ledger deciding what
    fits: of the critical-path bound without refinement (vp = 1), of the simulated makespan with the
    critical-path cuts, certified; the answer fits when re-scored; infeasible exactly when
    nothing fits. Tolerance 1e-6 relative: CP-SAT works in integer nanoseconds and KiB."""
    ctx = context(tmp_path, pp, vp, memory_mib)
    best, _ = best_by_enumeration(ctx)
    if best is None:
        with pytest.raises(LayoutError):
            solve_layout(ctx, time_limit_s=10)
        return
    first = solve_layout(ctx, time_limit_s=10, refine=False)
    assert first.fits
    if vp == 1:  # one stage per rank: the initial cuts are exactly the critical-path bound's terms
        assert first.bound_s == pytest.approx(best, rel=1e-6)
    refined = solve_layout(ctx, time_limit_s=20)
    best_makespan, _ = best_by_enumeration(ctx, "makespan")
    assert refined.optimal and refined.fits
    assert refined.makespan_s == pytest.approx(best_makespan, rel=1e-6)
    assert refined.lower_bound_s <= refined.makespan_s * (1 + 1e-9)


@pytest.mark.parametrize("model,schedule,pp,vp,group,memory_mib", [
    ("moe", "flexible", 2, 2, 8, 39000),   # memory binds: 0.798 s against 0.733 s at 81559 MiB
    ("moe", "afab", 4, 1, None, 81559),
    ("dense", "flexible", 2, 2, 4, 5000),  # memory binds: 0.282 s against 0.203 s
    ("dense", "afab", 2, 2, None, 81559),
])
def test_other_schedules_match_enumeration(tmp_path, model, schedule, pp, vp, group, memory_mib):
    """Llama 3's flexible schedule (nc micro-batches per round) and all-forward-all-backward:
    the layout search works on the skeleton's own op lists and in-flight vectors, so its
    certified optimum is enumeration's under them too (16 micro-batches on pp 2, 32 on pp 4),
    where memory binds and where it does not; tolerance 1e-6 relative (integer nanoseconds)."""
    from costmodel.specs import PP_SCHEDULES

    text, columns = (TINY, dict(ep=8, first_layers=2, last_layers=2)) if model == "moe" else \
        (TINY_DENSE.replace("LAYERS", "7"), dict(first_layers=1, last_layers=1))
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    problem = load_problem(str(path), [f"hardware.memory_mib={memory_mib}"])
    cfg = ConfigBatch.from_columns(64, tp=8, pp=pp, vp=vp, mbs=1, zero_stage=1, pp_schedule=PP_SCHEDULES.index(schedule),
                                   pp_group=group or 0, **columns)
    assert_certifies_enumeration_optimum(layout_context(problem, cfg))


def assert_linear_times_are_exact(ctx, lin):
    """LinearLayouts prices every layout's passes as the scorer does (relative 1e-12); returns
    the enumerated (layout, score) pairs and their run counts."""
    import numpy as np

    layouts = list(enumerate_layouts(ctx))
    counts, _ = lin.layout_counts(np.array([layout.decoders + layout.recompute for layout, _ in layouts]))
    forward, backward = lin.times(counts)
    for k, (_, score) in enumerate(layouts):
        assert forward[:, k] == pytest.approx(score.forward_s, rel=1e-12)
        assert backward[:, k] == pytest.approx(score.backward_s, rel=1e-12)
    return layouts, counts


# ZeRO-2 with and without DP overlap, ZeRO-3 kept and freed after the forward: the window tests' sharding
SHARDINGS = pytest.mark.parametrize("columns", [
    dict(zero_stage=2, dp_overlap=1),
    dict(zero_stage=2, dp_overlap=0),
    dict(zero_stage=3, reshard_after_forward=0, dp_overlap=1),
    dict(zero_stage=3, reshard_after_forward=1, dp_overlap=1),
], ids=["zero2", "zero2-no-overlap", "zero3-kept", "zero3-freed"])


@SHARDINGS
def test_gradient_windows_are_searched_and_match_enumeration(tmp_path, columns):
    """ZeRO-2/3 on interleaved 1F1B with 8 gradient windows per stage (16 micro-batches, rounds
    of 2): a stage's earlier windows reduce-scatter its gradients behind its rank's compute
    between two windows, with DP overlap max(beta rs - gap, (alpha - 1) min(gap, beta rs)) per
    stage, a min and a max of affine forms in the counts (LinearLayouts.windows; without overlap
    all exposed, linear). The linear terms hold (alpha - 1) / alpha of beta rs, never more than
    the windows' value, and the rest is >= 0. The model prices every layout's passes as the
    scorer does (relative 1e-12), the layouts reach both branches (a stage's reduce-scatter longer than its rank's gap, and shorter), and the
    search certifies enumeration's optimum, roomy and at the median layout's peak (tolerance
    1e-6 relative: integer nanoseconds). Parameters freed after the forward gather every stage
    again per micro-batch, both passes: linear too."""
    import numpy as np

    from costmodel.specs import PP_SCHEDULES
    from costmodel.stage_layout import stage_ranks
    from costmodel.update import window_compute_s
    from optimizer.layout_linear import LinearLayouts
    from optimizer.layout_report import layout_report

    path = tmp_path / "tiny_dense.yaml"
    path.write_text(TINY_DENSE.replace("LAYERS", "8"))
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, mbs=1, first_layers=4, last_layers=4, pp_schedule=PP_SCHEDULES.index("interleaved_1f1b"),
                                   **columns)

    def sharded(memory_mib):
        return layout_context(load_problem(str(path), [f"hardware.memory_mib={memory_mib}"]), cfg)

    roomy = sharded(81559)
    lin = LinearLayouts(roomy)
    assert (lin.windows is not None) == bool(columns["dp_overlap"])  # without overlap the windows are linear: no rest
    layouts, counts = assert_linear_times_are_exact(roomy, lin)
    if columns["dp_overlap"]:
        assert lin.windows.windows == 8
        assert (lin.window_s(counts) >= 0).all() and (lin.window_s(counts)[counts.sum(axis=-1) > 0] > 0).all()
        w = lin.windows
        held = counts.sum(axis=-1) > 0
        rs = w.rs_const + held * w.rs_first + counts @ w.rs_run
        used = w.used_const + held * w.used_first + counts.sum(axis=-1) * w.used_layer
        rank_of = np.array(stage_ranks(2, 2, False))
        on_rank = (rank_of[:, None] == np.arange(2)).astype(float)
        gap = window_compute_s(16.0, (w.compute_const + counts @ w.compute_run) @ on_rank, used @ on_rank, 8.0, 2)[:, rank_of]
        longer = roomy.problem.hardware.efficiency.dp_overlap.beta * rs > gap
        assert longer.any() and not longer.all()
    peaks = sorted(float(score.peak_bytes.max()) for _, score in layouts)
    for memory_mib in (81559, int(peaks[len(peaks) // 2] / 2**20)):
        assert_certifies_enumeration_optimum(sharded(memory_mib))
    # `mofa solve --pipeline-layouts`' path: searched (it was refused), never worse than the split
    report, _ = layout_report(roomy.problem, cfg, 5.0)
    assert "refused" not in report and report["step_time_s"] <= report["megatron_split_step_time_s"]


def test_gradient_windows_with_per_stage_recompute_match_enumeration(tmp_path):
    """ZeRO-2's 8 gradient windows per stage with full recompute chosen per stage, on a GPU just
    below the least peak of the layouts that recompute nothing: recomputed layers add to the
    compute the windows hide behind (LinearLayouts prices them as the scorer does), and the
    search certifies enumeration's optimum over layer and recompute counts, which recomputes."""
    import numpy as np

    from costmodel.specs import PP_SCHEDULES
    from costmodel.stage_layout import stage_times
    from optimizer.layout_linear import LinearLayouts

    path = tmp_path / "tiny_dense.yaml"
    path.write_text(TINY_DENSE.replace("LAYERS", "8"))
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, mbs=1, first_layers=2, last_layers=2, zero_stage=2, dp_overlap=1,
                                   pp_schedule=PP_SCHEDULES.index("interleaved_1f1b"), recompute=2, recompute_method=1, recompute_layers=1)

    def sharded(memory_mib):
        return layout_context(load_problem(str(path), [f"hardware.memory_mib={memory_mib}"]), cfg)

    roomy = sharded(81559)
    lin = LinearLayouts(roomy)
    layouts = list(enumerate_layouts(roomy))
    sample = layouts[::7]
    assert any(layout.any_recompute for layout, _ in sample)
    for layout, _ in sample:
        counts, recomputed = lin.layout_counts(np.array([layout.decoders + layout.recompute]))
        assert np.add(*lin.times(counts, recomputed))[:, 0] == pytest.approx(np.add(*stage_times(roomy, layout)), rel=1e-12)
    least = min(float(score.peak_bytes.max()) for layout, score in layouts if not layout.any_recompute)
    tight = sharded(int(least / 2**20) - 1)
    assert_certifies_enumeration_optimum(tight)
    assert solve_layout(tight, time_limit_s=20).layout.any_recompute


def test_gradient_windows_make_recompute_pay_where_memory_does_not_force_it(tmp_path):
    """Under gradient windows a rank's recomputed layers widen the gap its stages' reduce-scatters
    hide behind, so recompute can speed a layout up on a GPU where everything fits without it
    (a short sequence, a slow inter-node link: 6 layers over pp 2 x vp 2, 8 windows per stage).
    The search must not assume a rank recomputes only where memory forces it: seeded with the
    best layout without recompute and no local search, its CP-SAT rounds reach enumeration's
    optimum over layer and recompute counts (relative 1e-6), which recomputes, and certify it
    (a review found the search certifying the seed, 0.09% slower, when it did)."""
    from costmodel.specs import PP_SCHEDULES

    path = tmp_path / "tiny_dense.yaml"
    path.write_text(TINY_DENSE.replace("LAYERS", "6"))
    problem = load_problem(str(path), ["training.seq_len=256", "hardware.inter_node_gb_per_s=8"])
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, mbs=1, first_layers=3, last_layers=3, zero_stage=2, dp_overlap=1,
                                   pp_schedule=PP_SCHEDULES.index("interleaved_1f1b"), recompute=2, recompute_method=1, recompute_layers=1)
    ctx = layout_context(problem, cfg)
    scored = list(enumerate_layouts(ctx))
    assert all(score.fits for layout, score in scored if not layout.any_recompute)  # memory forces no recompute
    best, best_layout = best_by_enumeration(ctx, "makespan")
    plain = min(((score.pipeline_s - score.pp_exposed_s, layout) for layout, score in scored if not layout.any_recompute), key=lambda x: x[0])
    assert best_layout.any_recompute and best < plain[0]
    solution = solve_layout(ctx, time_limit_s=20, seeds=(plain[1],), local=False)
    assert solution.optimal and solution.makespan_s == pytest.approx(best, rel=1e-6)
    assert solution.lower_bound_s <= best * (1 + 1e-9)


@SHARDINGS
def test_dualpipev_gradient_windows_are_searched_and_match_enumeration(tmp_path, columns):
    """DualPipeV under ZeRO-2/3 reduce-scatters each stage's gradients once per micro-batch (16
    windows per stage), each hidden behind the rank's compute between two: LinearLayouts prices
    every V layout of DeepSeek-V3's kinds (3 dense and 4 MoE layers, MTP) as the exact model
    does (forward, backward and its weight-gradient part, what fits), and vee_layout_search,
    whose CP-SAT model leaves out what a stage pays for holding a layer (the first gather, the
    tables' and the windows' rest: >= 0, so its bound holds) in a first phase and prices the
    first gather and the tables' rest in a second (vee_model's jumps; the windows' rest stays
    out), from the slowest layout that fits
    certifies the least simulated makespan of the 120 layouts, enumerated, roomy and at the
    median layout's peak (tolerance 1e-6 relative). `mofa solve --pipeline-layouts` searches
    it (it was refused) and never does worse than the V split; a heavy stage's traffic grows
    with its layers."""
    import numpy as np

    from costmodel.specs import PP_SCHEDULES
    from costmodel.stage_layout import stage_times, stage_weights
    from optimizer.layout_linear import LinearLayouts
    from optimizer.layout_report import layout_report
    from optimizer.layout_vee import vee_layout_search

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, ep=8, mbs=1, first_layers=3, last_layers=4, pp_schedule=PP_SCHEDULES.index("dualpipev"),
                                   **columns)
    roomy = layout_context(load_problem(str(path), []), cfg)
    lin = LinearLayouts(roomy)
    assert roomy.vee and lin.windows.windows == 16
    layouts = list(enumerate_layouts(roomy))
    assert len(layouts) == 120
    counts, _ = lin.layout_counts(np.array([layout.decoders + layout.recompute for layout, _ in layouts]))
    forward, backward = lin.times(counts)
    weight, fits = lin.weights(counts), lin.fits(counts)
    for k, (layout, score) in enumerate(layouts):
        assert forward[:, k] == pytest.approx(score.forward_s, rel=1e-12)
        assert backward[:, k] == pytest.approx(score.backward_s, rel=1e-12)
        assert weight[:, k] == pytest.approx(stage_weights(roomy, layout), rel=1e-12)
        assert fits[k] == score.fits
    peaks = sorted(float(score.peak_bytes.max()) for _, score in layouts)
    for memory_mib in (81559, int(peaks[len(peaks) // 2] / 2**20)):
        ctx = layout_context(load_problem(str(path), [f"hardware.memory_mib={memory_mib}"]), cfg)
        fitting = [(score.pipeline_s - score.pp_exposed_s, layout) for layout, score in enumerate_layouts(ctx) if score.fits]
        best = min(value for value, _ in fitting)
        solution = vee_layout_search(ctx, 10.0, max(fitting, key=lambda x: x[0])[1])
        assert solution.optimal and solution.fits and solution.makespan_s == pytest.approx(best, rel=1e-6)
        assert solution.lower_bound_s <= best * (1 + 1e-9)
    report, _ = layout_report(roomy.problem, cfg, 5.0)
    assert "refused" not in report and report["step_time_s"] <= report["megatron_split_step_time_s"]
    plain = layout_context(roomy.problem, ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, ep=8, mbs=1, first_layers=3, last_layers=4,
                                                                   zero_stage=1, pp_schedule=PP_SCHEDULES.index("dualpipev")))
    heavy = StageLayout.from_stage_sizes(2, 2, [1, 1, 1, 4], 1, vee=True)
    sharded, unsharded = np.add(*stage_times(roomy, heavy)), np.add(*stage_times(plain, heavy))
    assert (sharded > unsharded).all() and np.argmax(sharded - unsharded) == 3


@SHARDINGS
def test_vee_model_prices_each_stage_as_the_linear_times(tmp_path, columns):
    """vee_model's stage times (DualPipeV's forward, input-gradient and weight-gradient passes,
    integer nanoseconds) on every fourth of the 120 V layouts of DeepSeek-V3's kinds under
    ZeRO-2/3: with the jumps, LinearLayouts.pass_times' less the windows' rest (which the model
    leaves out), rounded down by less than 1 ns a term (the layers of each run, the constant,
    the first gather, the table's rest); without, also less what a stage pays for holding a
    layer (the first gather, the gather tables' rest), so at most that. Either way never above
    the exact times: every path cut and rank row holds for every layout that may fit (with the
    tables, only those: a stage over LinearLayouts.most_layers is outside their index domain)."""
    from ortools.sat.python import cp_model

    from costmodel.specs import PP_SCHEDULES
    from optimizer.layout_linear import LinearLayouts
    from optimizer.layout_vee import prices_jumps, vee_model

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, ep=8, mbs=1, first_layers=3, last_layers=4, pp_schedule=PP_SCHEDULES.index("dualpipev"),
                                   **columns)
    ctx = layout_context(load_problem(str(path), []), cfg)
    lin = LinearLayouts(ctx)
    held_terms = prices_jumps(lin)
    assert held_terms and (lin.gathers is not None) == (columns["zero_stage"] == 3)  # ZeRO-2: the windows' share per stage held
    plain = lin.without_stage_jumps()
    most = lin.most_layers()
    for layout, _ in list(enumerate_layouts(ctx))[::4]:
        counts, _ = lin.layout_counts(np.array([layout.decoders + layout.recompute]))
        if (np.array(layout.decoders) > most).any():  # the gather tables' index domains hold only layouts that may fit
            assert not lin.fits(counts)[0]
            continue
        exact = [x[:, 0] * 1e9 for x in lin.pass_times(counts)]
        exact[1] = exact[1] - lin.window_s(counts)[0] * 1e9
        relaxed = [x[:, 0] * 1e9 for x in (plain or lin).pass_times(counts)]
        terms = 2 * len(lin.runs) + 1 + 2 * held_terms
        for jumps, target in ((True, exact), (False, relaxed)):
            vm = vee_model(ctx, lin, jumps=jumps)
            for t, value in zip(vm.t, layout.decoders):
                vm.model.Add(t == value)
            vm.model.Minimize(sum(vm.forward) + sum(vm.backward) + sum(vm.weight))  # each table's rest onto its value
            solver = cp_model.CpSolver()
            assert solver.Solve(vm.model) == cp_model.OPTIMAL
            for exprs, seconds in zip((vm.forward, vm.backward, vm.weight), target):
                priced = np.array([solver.Value(e) for e in exprs], dtype=float)
                assert (priced <= seconds + 1e-6).all() and (priced > seconds - terms - 1e-6).all()
            if not jumps and columns["zero_stage"] == 3:  # the first gather, left out (ZeRO-2's per stage share: ns here)
                total = solver.Value(sum(vm.forward) + sum(vm.backward) + sum(vm.weight))
                assert total < sum(x.sum() for x in exact) - 3 * terms * len(vm.t)


@SHARDINGS
def test_gradient_windows_with_moe_layers_are_searched_and_match_enumeration(tmp_path, columns):
    """DeepSeek-V3's kinds (3 dense and 4 MoE layers, an MTP module on the last stage) under
    ZeRO-2/3 on interleaved 1F1B with 8 gradient windows per stage: a stage's reduce-scatter
    starts the experts' collective with its first MoE layer (WindowTerms.rs_jump, a boolean per
    stage in CP-SAT; without DP overlap the jump is all the windows add beyond the linear terms),
    and under ZeRO-3 a stage gathers its mean layer, so the compute its prefetches overlap comes
    by table (GatherTables.used_*). Freed after the forward, a rank holds the gathered copies of
    its largest layer, a jump at its first layer of a kind (LinearLayouts.largest). The model
    prices every layout's passes and every rank's peak as the scorer does (relative 1e-12;
    1 KiB), the jump is there to model, and the search certifies enumeration's optimum, roomy and
    at the median layout's peak (tolerance 1e-6 relative: integer nanoseconds).
    `mofa solve --pipeline-layouts` searches it (it was refused) and never does worse than the
    split."""
    import numpy as np

    from costmodel.specs import PP_SCHEDULES
    from optimizer.layout_linear import LinearLayouts
    from optimizer.layout_report import layout_report

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, ep=8, mbs=1, first_layers=3, last_layers=4,
                                   pp_schedule=PP_SCHEDULES.index("interleaved_1f1b"), **columns)

    def sharded(memory_mib):
        return layout_context(load_problem(str(path), [f"hardware.memory_mib={memory_mib}"]), cfg)

    roomy = sharded(81559)
    lin = LinearLayouts(roomy)
    assert lin.windows.windows == 8 and lin.windows.jump_runs.tolist() == [False, True]
    assert (lin.windows.rs_jump[:-1] > 0).all() and lin.windows.rs_jump[-1] == 0  # the last stage's MTP module holds experts
    assert (lin.gathers is not None and lin.gathers.used_middle is not None) == (columns["zero_stage"] == 3)
    layouts, counts = assert_linear_times_are_exact(roomy, lin)
    assert (lin.window_s(counts) >= 0).all()
    peaks = np.array([score.peak_bytes for _, score in layouts])
    assert lin.capacity - lin.headroom(counts) == pytest.approx(peaks, rel=1e-12, abs=1024)
    assert any(x.any() for x in lin.largest) == bool(columns.get("reshard_after_forward"))
    median = int(np.sort(peaks.max(axis=1))[len(peaks) // 2] / 2**20)
    for memory_mib in (81559, median):
        assert_certifies_enumeration_optimum(sharded(memory_mib))
    if columns["zero_stage"] == 3 and not columns["reshard_after_forward"]:
        # with recompute chosen per stage too: recomputed layers widen the gap the windows hide
        # behind, beside the tabulated prefetch overlap (layer and recompute counts enumerated)
        full = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, ep=8, mbs=1, first_layers=3, last_layers=4, recompute=2, recompute_method=1,
                                        recompute_layers=1, pp_schedule=PP_SCHEDULES.index("interleaved_1f1b"), **columns)
        assert_certifies_enumeration_optimum(layout_context(load_problem(str(path), [f"hardware.memory_mib={median}"]), full))
    report, _ = layout_report(roomy.problem, cfg, 5.0)
    assert "refused" not in report and report["step_time_s"] <= report["megatron_split_step_time_s"]


def test_gather_tables_enter_the_model_through_a_bound(tmp_path):
    """The gather tables' values (GatherTables: each stage's gathers beyond the linear terms and
    the compute its prefetches overlap) enter the search's CP-SAT model through a one-sided bound
    on a value looked up by an element constraint, never as the element's target inside the
    stage times: presolve gives a target the table's values as its domain, a union of points, and
    summing such domains through the path cuts and the windows' max made domains of up to a
    million intervals (DeepSeek-V3 on pp 16 x vp 2 under FSDP kept after the forward: 26 s of
    presolve for one round, 1.4 s past the round's time limit, so `--time-limit` was overrun).
    Each element's target is in no constraint but its bound; the search still certifies
    enumeration's optimum (test above)."""
    from costmodel.specs import PP_SCHEDULES
    from optimizer.layout_linear import LinearLayouts
    from optimizer.layout_search import build_layout_model

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, ep=8, mbs=1, first_layers=3, last_layers=4, zero_stage=3,
                                   reshard_after_forward=0, dp_overlap=1, pp_schedule=PP_SCHEDULES.index("interleaved_1f1b"))
    ctx = layout_context(load_problem(str(path), []), cfg)
    lin = LinearLayouts(ctx)
    assert lin.gathers is not None and lin.gathers.used_middle is not None and lin.windows is not None
    proto = build_layout_model(ctx, lin).model.Proto()
    targets = [c.element.linear_target.vars[0] if c.element.linear_target.vars else c.element.target
               for c in proto.constraints if c.has_element()]
    assert len(targets) == 2 * lin.stages  # each stage's gathers in the forward and its prefetches' overlap
    for target in targets:
        users = [c for c in proto.constraints if not c.has_element() and c.has_linear() and target in c.linear.vars]
        assert len(users) == 1 and len(users[0].linear.vars) == 2  # rest >= looked up, or used <= looked up


def median_memory_context(tmp_path, columns):
    """The tiny DeepSeek-V3 (3 dense, 4 MoE layers) on pp 2 x vp 2, interleaved, under the
    sharding `columns`, with the GPU at the median layout's peak (so memory binds on half)."""
    from costmodel.specs import PP_SCHEDULES

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, ep=8, mbs=1, first_layers=3, last_layers=4,
                                   pp_schedule=PP_SCHEDULES.index("interleaved_1f1b"), **columns)
    roomy = layout_context(load_problem(str(path), []), cfg)
    peaks = sorted(float(score.peak_bytes.max()) for _, score in enumerate_layouts(roomy))
    return layout_context(load_problem(str(path), [f"hardware.memory_mib={int(peaks[len(peaks) // 2] / 2**20)}"]), cfg)


@SHARDINGS
def test_relaxed_bound_holds_for_every_layout(tmp_path, columns):
    """The search's model without what a stage pays for holding a layer (ZeRO-3's exposed first
    gather, the gather tables' and the windows' rest: LinearLayouts.without_stage_jumps) prices
    every layout's passes at most as the scorer does, and relaxed_bound, from the slowest layout
    that fits as its incumbent, proves a bound that no layout that fits beats (every layout
    enumerated; DeepSeek-V3's kinds under ZeRO-2/3, 8 windows per stage, the GPU at the median
    layout's peak) and that reaches the least relaxed makespan of the layouts that fit, less its
    two slacks (the rounds close on so small a model). Every layout that fits holds at most
    LinearLayouts.most_layers per stage (what bounds the gather tables' index domains)."""
    import numpy as np

    from optimizer.layout_linear import LinearLayouts
    from optimizer.layout_search import build_layout_model, model_slack_s, relaxed_bound

    ctx = median_memory_context(tmp_path, columns)
    lin = LinearLayouts(ctx)
    plain = lin.without_stage_jumps()
    scored = [(layout, score) for layout, score in enumerate_layouts(ctx) if score.fits]
    vectors = np.array([layout.decoders + layout.recompute for layout, _ in scored])
    relaxed = plain.times(*lin.layout_counts(vectors)[:1])
    exact = lin.times(*lin.layout_counts(vectors)[:1])
    assert (relaxed[0] <= exact[0] * (1 + 1e-12)).all() and (relaxed[1] <= exact[1] * (1 + 1e-12)).all()
    assert (relaxed[1] < exact[1]).any()  # something left out
    assert (vectors[:, :lin.stages] <= lin.most_layers()).all()  # the gather tables' index domains hold every fitting layout
    makespans = [score.pipeline_s - score.pp_exposed_s for _, score in scored]
    slowest = scored[int(np.argmax(makespans))][0]
    bound, paths = relaxed_bound(ctx, lin, slowest, 10.0, 2)
    assert paths and bound <= min(makespans) * (1 + 1e-9)
    slack = model_slack_s(ctx, build_layout_model(ctx, plain))
    assert bound >= float(plain.screen(vectors).makespan_s.min()) - 2 * slack - 1e-12


@SHARDINGS
def test_rank_totals_bound_holds_for_every_layout(tmp_path, columns):
    """LinearLayouts.rank_total_rows stays below every rank's peak (the linear rows') in every
    layout, regular and free (every layout of DeepSeek-V3's kinds, 3 dense then 4 MoE, on
    pp 2 x vp 2 enumerated), and rank_totals_bound, with the ranks' memory and the dense
    layers first, proves no more than the fastest layout of its space that fits (the GPU at
    the median layout's peak), and at least the work bound."""
    import numpy as np

    from optimizer.layout_bounds import rank_totals_bound, work_bound_s
    from optimizer.layout_linear import LinearLayouts
    from optimizer.layout_rounds import regular

    ctx = median_memory_context(tmp_path, columns)
    lin = LinearLayouts(ctx)
    scored = list(enumerate_layouts(ctx))
    vectors = np.array([layout.decoders + layout.recompute for layout, _ in scored])
    counts = lin.layout_counts(vectors)[0]  # [layout, stage, run]
    fits = lin.fits(counts)
    row_peaks = np.stack([rows.max(axis=1) for rows in lin.rank_rows(counts)], axis=1)  # [layout, rank]
    kinds = np.zeros((len(scored), ctx.pp, len(ctx.kinds)))
    for r in range(ctx.pp):
        np.add.at(kinds[:, r].T, lin.kind_of_run, counts[:, ctx.stages_of[r], :].sum(axis=1).T)
    makespans = np.array([score.pipeline_s - score.pp_exposed_s for _, score in scored])
    is_regular = np.array([regular(layout, 1) for layout, _ in scored])
    work = work_bound_s(ctx, lin)
    for spread, space in ((None, np.ones(len(scored), dtype=bool)), (1, is_regular)):
        for r in range(ctx.pp):
            fixed, transient0, transient, in_flight = lin.rank_total_rows(r, spread)
            mine = kinds[space, r]
            least = mine @ fixed + np.max([transient0 + mine @ transient]
                                          + [table[mine.sum(axis=1).astype(int)] + mine @ per_kind for table, per_kind in in_flight], axis=0)
            assert (least <= row_peaks[space, r] * (1 + 1e-12)).all()
        best = float(makespans[space & fits].min())
        found = rank_totals_bound(ctx, work * (1 - 1e-6), float(makespans.max()), lin, time_limit_s=5.0, spread=spread)
        assert found is not None and work * (1 - 1e-6) <= found <= best * (1 + 1e-9)


@SHARDINGS
def test_rank_held_floor_is_each_ranks_least_over_every_layout(tmp_path, columns):
    """LinearLayouts.rank_held_floor_s, the least seconds per micro-batch a rank's chunks holding
    a layer pay beyond the linear terms (the windows' rest, ZeRO-3's first gather) at each layer
    total, is exactly the least over every layout of one kind of layer (8 layers on pp 2 x vp 2,
    8 windows per stage, every layout enumerated: each rank's every split of each total occurs)
    of the sum over the rank's chunks that hold a layer (relative 1e-9), so the busy time it adds
    in rank_order_region holds for every layout; and rank_totals_bound with it proves no more
    than the fastest layout that fits, free and regular (the GPU at the median layout's peak).
    None where the floor would not hold: without DP overlap nothing is left out beyond the
    linear terms; ZeRO-3's prefetch overlap per stage holding a layer moves the gap."""
    from costmodel.specs import PP_SCHEDULES
    from optimizer.layout_bounds import rank_totals_bound, work_bound_s
    from optimizer.layout_linear import LinearLayouts

    path = tmp_path / "tiny_dense.yaml"
    path.write_text(TINY_DENSE.replace("LAYERS", "8"))
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, mbs=1, first_layers=4, last_layers=4, pp_schedule=PP_SCHEDULES.index("interleaved_1f1b"),
                                   **columns)
    roomy = layout_context(load_problem(str(path), []), cfg)
    lin = LinearLayouts(roomy)
    floor = lin.rank_held_floor_s(8)
    assert (floor is not None) == (lin.windows is not None and not np.any(lin.windows.used_first))
    if floor is None:
        return
    assert floor.shape == (2, 9) and (floor[:, 0] == 0).all() and (floor[:, 1:] > 0).all()  # the windows' rest, on a stage holding a layer
    scored = list(enumerate_layouts(roomy))
    decoders = np.array([layout.decoders for layout, _ in scored])
    counts = lin.run_counts(decoders)
    forward, backward = lin.times(counts)
    beyond = forward.T + backward.T - (counts @ (lin.forward_s + lin.backward_s) + lin.const_forward_s + lin.const_backward_s)
    beyond = np.where(decoders > 0, beyond, 0.0)  # a rank's empty chunks count nothing
    for r, mine in enumerate(roomy.stages_of):
        totals = decoders[:, mine].sum(axis=1)
        paid = beyond[:, mine].sum(axis=1)
        for total in range(1, 9):
            assert floor[r, total] == pytest.approx(paid[totals == total].min(), rel=1e-9)
    peaks = sorted(float(score.peak_bytes.max()) for _, score in scored)
    ctx = layout_context(load_problem(str(path), [f"hardware.memory_mib={int(peaks[len(peaks) // 2] / 2**20)}"]), cfg)
    lin = LinearLayouts(ctx)
    scored = list(enumerate_layouts(ctx))
    makespans = np.array([score.pipeline_s - score.pp_exposed_s for _, score in scored])
    fits = np.array([score.fits for _, score in scored])
    is_regular = np.array([regular(layout, 1) for layout, _ in scored])
    work = work_bound_s(ctx, lin)
    for spread, space in ((None, np.ones(len(scored), dtype=bool)), (1, is_regular)):
        found = rank_totals_bound(ctx, work * (1 - 1e-6), float(makespans.max()), lin, time_limit_s=5.0, spread=spread)
        assert found is not None and found <= float(makespans[space & fits].min()) * (1 + 1e-9)


def test_torchtitan_pipeline_buffers_are_searched():
    """torchtitan's PyTorch pipelining keeps buffers per micro-batch, which the ledger prices on
    its in-flight count (held bytes over the rank's mean chunk, not linear in the counts), so
    LinearLayouts' rank rows hold them at their least (pipeline_buffer_range): its probe check
    allows what those buffers can move and still searches the skeleton (a review found it
    refusing every torchtitan skeleton with PP), and the answer, confirmed by the exact model,
    fits and is no slower than the split. Llama 3.1 8B on 64 H100, tp 2, pp 4, FSDP kept after
    the forward."""
    import os

    from costmodel.specs import PP_SCHEDULES
    from costmodel.stage_layout import score_layout
    from optimizer.layout_linear import LinearLayouts

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    problem = load_problem(os.path.join(root, "problems/frameworks/llama31_8b_64xh100.yaml"), ["search.framework=torchtitan"])
    for schedule, vp in (("1f1b", 1), ("interleaved_1f1b", 2)):
        cfg = ConfigBatch.from_columns(64, tp=2, pp=4, vp=vp, mbs=1, first_layers=8, last_layers=8, zero_stage=3, reshard_after_forward=0,
                                       pp_schedule=PP_SCHEDULES.index(schedule))
        ctx = layout_context(problem, cfg)
        assert ctx.mc.buffers_per_microbatch
        LinearLayouts(ctx)  # not refused
        split = StageLayout.from_stage_sizes(4, vp, [32 // (4 * vp)] * (4 * vp), 0)
        solution = solve_layout(ctx, time_limit_s=3.0, seeds=(split,))
        split_score = score_layout(ctx, split)
        assert solution.fits and score_layout(ctx, solution.layout).fits
        assert solution.makespan_s <= (split_score.pipeline_s - split_score.pp_exposed_s) * (1 + 1e-12)


def check_linear_against_ledger(ctx, rng, layouts: int) -> None:
    """For random layouts and recompute vectors of ctx's skeleton: LinearLayouts' stage times are
    the exact model's, no rank's linear peak is above the ledger's and none below it by more than
    `buffer_spread`; where the model has host terms (a CPU optimizer, activation offload) each
    rank's host bytes are the exact score's (layout_host_bytes) within 1 KiB."""
    from costmodel.stage_layout import layout_host_bytes, layout_ledgers, stage_times
    from optimizer.layout_linear import LinearLayouts

    lin = LinearLayouts(ctx)  # not refused
    assert (lin.buffer_spread > 0).any() == ctx.mc.buffers_per_microbatch
    stages, n = lin.stages, len(ctx.kind_of_layer)
    for _ in range(layouts):
        decoders = np.bincount(rng.choice(stages, n, p=rng.dirichlet(np.full(stages, rng.choice([0.3, 1.0, 5.0])))), minlength=stages)
        recomputed = rng.integers(0, decoders + 1) if ctx.recompute_allowed else np.zeros(stages, dtype=np.int64)
        layout = StageLayout(pp=ctx.pp, vp=ctx.vp, decoders=tuple(int(x) for x in decoders), mtp=ctx.mtp_on_last,
                             recompute=tuple(int(x) for x in recomputed), vee=ctx.vee)
        counts, rc = lin.layout_counts(np.array([layout.decoders + layout.recompute]))
        rc = rc if ctx.recompute_allowed else None
        forward, backward = lin.times(counts, rc)
        exact_f, exact_b = stage_times(ctx, layout)
        assert forward[:, 0] == pytest.approx(exact_f, rel=1e-12, abs=1e-12)
        assert backward[:, 0] == pytest.approx(exact_b, rel=1e-12, abs=1e-12)
        exact = np.array([float(np.asarray(ledger.peak).ravel()[0]) for ledger in layout_ledgers(ctx, layout)])
        mine = lin.capacity - lin.headroom(counts, rc)[0]
        assert (mine <= exact + 1024.0).all(), (layout, mine - exact)
        assert (mine + lin.buffer_spread >= exact - 1024.0).all(), (layout, mine + lin.buffer_spread - exact)
        if lin.host is not None:
            host = np.array([rows.max(axis=1)[0] for rows in lin.host_rows(counts)])
            exact_host = layout_host_bytes(ctx, layout, layout_ledgers(ctx, layout))
            assert host == pytest.approx(exact_host, rel=0.0, abs=1024.0), (layout, host - exact_host)


SKELETON_AXES = (((1, 0), (2, 0), (3, 0), (3, 1)), (0, 1), (0, 1), (0, 1))  # (ZeRO stage, reshard), recompute, CPU optimizer, DP overlap


@pytest.mark.parametrize("model,framework,outputs_kept", [("llama", "megatron", False), ("llama", "deepspeed", False), ("llama", "torchtitan", False),
                                                          ("llama", "torchtitan", True), ("deepseek", "megatron", False),
                                                          ("deepseek", "torchtitan", False)])
def test_linear_layouts_bound_the_ledger_on_every_skeleton(model, framework, outputs_kept):
    """On every skeleton LinearLayouts models (each ZeRO stage, FSDP kept and freed after the
    forward, each schedule, full recompute, CPU optimizer, DP overlap on and off; one kind of
    layer, and DeepSeek-V3's dense, MoE and MTP), for random layouts and recompute vectors
    (check_linear_against_ledger): its stage times are the exact model's, no rank's linear peak
    is above the ledger's (a row above it could keep a certificate from a layout that fits) and
    none is below it by more than `buffer_spread`, what the tests that must not miss a rank over
    add. PyTorch pipelining's buffers per micro-batch (torchtitan) move with the ledger's
    in-flight count, not linear in the counts: the rows hold them at their least
    (pipeline_buffer_range); before, the last rank's row was a hop above the ledger on 85-100% of
    random layouts, 0.26 GiB with torch <= 2.6's kept outputs. Llama 3.1 8B on 64 H100, tp 2,
    pp 4 (10 layouts a skeleton); DeepSeek-V3 on 2048 device B, tp 4, ep 64, pp 8 and a V of pp 4
    (4 a skeleton)."""
    import itertools
    import os

    from costmodel.specs import PP_SCHEDULES

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    overrides = [f"search.framework={framework}", f"training.pipeline_every_stage_outputs={str(outputs_kept).lower()}"]
    if model == "llama":
        problem = load_problem(os.path.join(root, "problems/frameworks/llama31_8b_64xh100.yaml"), overrides)
        gpus, base, layouts = 64, dict(tp=2, mbs=1, first_layers=8, last_layers=8), 10
        schedules = (("1f1b", 4, 1), ("interleaved_1f1b", 4, 2), ("afab", 4, 1), ("dualpipev", 4, 2))
    else:
        problem = load_problem(os.path.join(root, "problems/tuning/deepseek_v3_2048gpu_sn8.yaml"), ["config=null"] + overrides)
        gpus, base, layouts = 2048, dict(tp=4, ep=64, mbs=1, first_layers=2, last_layers=3), 4
        schedules = (("1f1b", 8, 1), ("interleaved_1f1b", 8, 2), ("dualpipev", 4, 2))
    rng = np.random.default_rng(0)
    for (schedule, pp, vp), ((zero, reshard), recompute, cpu, dp_overlap) in itertools.product(schedules, itertools.product(*SKELETON_AXES)):
        columns = dict(base, pp=pp, vp=vp, zero_stage=zero, reshard_after_forward=reshard, pp_schedule=PP_SCHEDULES.index(schedule),
                       cpu_optimizer=cpu, dp_overlap=dp_overlap)
        if recompute:
            columns.update(recompute=2, recompute_method=1, recompute_layers=1)
        ctx = layout_context(problem, ConfigBatch.from_columns(gpus, **columns))
        assert ctx.recompute_allowed == bool(recompute) and ctx.mc.buffers_per_microbatch == (framework == "torchtitan")
        check_linear_against_ledger(ctx, rng, layouts)


OFFLOADS = ("layer", ["core_attn", "attn_proj"], ["core_attn", "expert_fc1", "moe_act"])  # MoFa's whole layer; Megatron's modules


@pytest.mark.parametrize("offload", OFFLOADS)
def test_linear_layouts_bound_the_ledger_under_activation_offload(offload):
    """Activation offload on the skeletons of the test above (without recompute, which offload
    excludes): whole-layer offload keeps the input of every chunk in flight, empty ones too (a
    constant per chunk in every memory row, rank_memory_terms' chunk_act), fine-grained offload
    the layers' activations less the offloaded modules' (LinearLayouts' per-layer bytes), both
    with two layers' offloaded sets in transit (a jump at a rank's first layer of a kind, which
    the ledger probe reads). Random layouts, check_linear_against_ledger: stage times exact, no
    rank's linear peak above the ledger's, none below it (no buffers per micro-batch here).
    Llama 3.1 8B (one kind) and DeepSeek-V3 (dense, MoE, MTP), each schedule, ZeRO-1 and ZeRO-3."""
    import itertools
    import os

    from costmodel.configs import offload_code
    from costmodel.specs import PP_SCHEDULES
    from optimizer.layout_linear import LinearLayouts

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rng = np.random.default_rng(1)
    cases = [(load_problem(os.path.join(root, "problems/frameworks/llama31_8b_64xh100.yaml")), 64, dict(tp=2, mbs=1, first_layers=8, last_layers=8),
              (("1f1b", 4, 1), ("interleaved_1f1b", 4, 2), ("dualpipev", 4, 2)), 6),
             (load_problem(os.path.join(root, "problems/tuning/deepseek_v3_2048gpu_sn8.yaml"), ["config=null"]), 2048,
              dict(tp=4, ep=64, mbs=1, first_layers=2, last_layers=3), (("interleaved_1f1b", 8, 2), ("dualpipev", 4, 2)), 3)]
    for (problem, gpus, base, schedules, layouts), (schedule, pp, vp), (zero, reshard) in (
            (case, schedule, zero) for case in cases for schedule, zero in itertools.product(case[3], ((1, 0), (3, 1)))):
        columns = dict(base, pp=pp, vp=vp, zero_stage=zero, reshard_after_forward=reshard, pp_schedule=PP_SCHEDULES.index(schedule),
                       activation_offload=offload_code(offload))
        ctx = layout_context(problem, ConfigBatch.from_columns(gpus, **columns))
        u = unit_costs(ctx)
        assert (u["chunk_activation"] > 0) == (offload == "layer") and (u["kind_host"] > 0).any()
        assert LinearLayouts(ctx).host is not None  # the host rows are checked too
        check_linear_against_ledger(ctx, rng, layouts)


def test_linear_layouts_bound_the_ledger_under_fcda():
    """MemFine's FCDA on DeepSeek-V3 (interleaved and DualPipeV, ZeRO-1 and ZeRO-3 freed after the
    forward; 2 and 4 chunks): the one chunk of a layer's expert tensors alive while it runs is a
    set the ledger holds whatever the in-flight count, once per rank (LinearLayouts.in_transit,
    a jump at a rank's first MoE layer); random layouts, check_linear_against_ledger."""
    import itertools
    import os

    from costmodel.specs import PP_SCHEDULES
    from optimizer.layout_linear import LinearLayouts

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    problem = load_problem(os.path.join(root, "problems/tuning/deepseek_v3_2048gpu_sn8.yaml"), ["config=null"])
    rng = np.random.default_rng(2)
    for (schedule, pp, vp), (zero, reshard), chunks in itertools.product((("interleaved_1f1b", 8, 2), ("dualpipev", 4, 2)), ((1, 0), (3, 1)), (2, 4)):
        ctx = layout_context(problem, ConfigBatch.from_columns(2048, tp=4, ep=64, mbs=1, first_layers=2, last_layers=3, pp=pp, vp=vp,
                                                               zero_stage=zero, reshard_after_forward=reshard, moe_chunks=chunks,
                                                               pp_schedule=PP_SCHEDULES.index(schedule)))
        assert any(transit.any() for transit in LinearLayouts(ctx).in_transit)
        check_linear_against_ledger(ctx, rng, 3)


@pytest.mark.parametrize("memory_mib", [81559, 48000])  # 48000 binds: the fastest layout needs 50153 MiB, the least 44295
def test_cpsat_matches_enumeration_under_fcda(tmp_path, memory_mib):
    """The layout search under FCDA (2 chunks: rank 0's chunk of expert tensors, 640 MiB, in its
    rows; the last rank always holds an MoE layer, its MTP module) certifies enumeration's
    optimum on the tiny DeepSeek-like model at 32K tokens (pp 2 x vp 2), roomy and where memory
    binds; tolerance 1e-6 relative."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_RECOMPUTE)
    problem = load_problem(str(path), [f"hardware.memory_mib={memory_mib}"])
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, ep=8, mbs=1, first_layers=2, last_layers=2, zero_stage=1, moe_chunks=2)
    assert_certifies_enumeration_optimum(layout_context(problem, cfg))


@pytest.mark.parametrize("offload,memory_mib,host_gb", [("layer", 81559, None), ("layer", 30000, None), (OFFLOADS[1], 81559, None),
                                                         (OFFLOADS[1], 37000, None), ("layer", 81559, 292)])
def test_cpsat_matches_enumeration_under_activation_offload(tmp_path, offload, memory_mib, host_gb):
    """The layout search under activation offload certifies enumeration's optimum: the tiny
    DeepSeek-like model's 7 layers on pp 2 x vp 2 at 32K tokens (CPU optimizer: activations
    bind, not the optimizer's transient), roomy and where memory binds (30000 MiB under
    whole-layer offload, 37000 under the modules': the fastest layout's peak is 33782 / 40089
    MiB, the least any layout needs 28238 / 34375), and where the host binds (292 GB a node of 8
    GPUs, 34.0 GiB a GPU: the fastest layout offloads 35.8 GiB on a rank, the next 32.5; the
    linear model's host rows, LinearLayouts.host_rows, hold it); tolerance 1e-6 relative
    (integer nanoseconds)."""
    from costmodel.configs import offload_code
    from optimizer.layout_linear import LinearLayouts, MemoryRows
    from optimizer.layout_search import build_layout_model

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_RECOMPUTE)
    problem = load_problem(str(path), [f"hardware.memory_mib={memory_mib}"] + ([f"hardware.host_memory_gb_per_node={host_gb}"] if host_gb else []))
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, ep=8, mbs=1, first_layers=2, last_layers=2, zero_stage=1, cpu_optimizer=1,
                                   activation_offload=offload_code(offload))
    ctx = layout_context(problem, cfg)
    if host_gb:  # the fastest layout is over the host share, and the linear test says so
        fastest = min(enumerate_layouts(ctx), key=lambda pair: layout_makespan(pair[1]))
        assert fastest[1].peak_bytes.max() <= ctx.problem.hardware.memory_bytes  # its GPUs fit it
        assert not fastest[1].fits and fastest[1].host_bytes.max() > ctx.mc.host_share_bytes
        lin = LinearLayouts(ctx)
        assert not lin.fits(lin.run_counts(np.array([fastest[0].decoders])))[0]
        lm = build_layout_model(ctx, lin)  # and it brings a host row into CP-SAT's model
        rows = MemoryRows(lm.model, ctx, lin, lm.run_counts)
        assert rows.add_broken(fastest[0].decoders + fastest[0].recompute) and any(key[1] == "host" for key in rows.added)
    assert_certifies_enumeration_optimum(ctx)


def torchtitan_8b_context(seq_len: int, memory_mib: int | None = None):
    """Llama 3.1 8B under torchtitan (PyTorch pipelining's buffers per micro-batch), bf16
    gradients, tp 2, pp 4, 1F1B, full recompute allowed per stage (the layouts choose it)."""
    import os

    from costmodel.specs import PP_SCHEDULES

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    overrides = ["search.framework=torchtitan", f"training.seq_len={seq_len}", "training.dtypes.grads=bf16"]
    problem = load_problem(os.path.join(root, "problems/frameworks/llama31_8b_64xh100.yaml"),
                           overrides + ([f"hardware.memory_mib={memory_mib}"] if memory_mib else []))
    return layout_context(problem, ConfigBatch.from_columns(64, tp=2, pp=4, vp=1, mbs=1, first_layers=8, last_layers=8, zero_stage=0,
                                                            pp_schedule=PP_SCHEDULES.index("1f1b"), recompute=2, recompute_method=1,
                                                            recompute_layers=1))


def rank_peaks(ctx, layout):
    """Every rank's exact peak bytes (the ledger's)."""
    from costmodel.stage_layout import layout_ledgers

    return np.array([float(np.asarray(ledger.peak).ravel()[0]) for ledger in layout_ledgers(ctx, layout)])


def assert_rank_0_may_recompute(ctx, lin, decoders):
    """Both dominance tests let rank 0 recompute: recomputing_ranks holds it, and
    over_capacity_without_recompute enforced on these layer counts is satisfiable."""
    from ortools.sat.python import cp_model

    from optimizer.layout_bounds import recomputing_ranks
    from optimizer.layout_linear import over_capacity_without_recompute

    assert 0 in recomputing_ranks(ctx, 1e9, lin)
    model = cp_model.CpModel()
    run_counts = [[model.NewConstant(int(x)) for x in stage] for stage in lin.run_counts(np.array([decoders]))[0]]
    enforce = model.NewBoolVar("recomputes")
    model.Add(enforce == 1)
    over_capacity_without_recompute(model, ctx, lin, 0, run_counts, enforce)
    assert cp_model.CpSolver().Solve(model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


def test_a_rank_over_through_its_transient_row_may_recompute():
    """With torchtitan's pipeline buffers per micro-batch the optimizer-transient row counts
    buffers that recompute shrinks (rank 0's grow with its in-flight count), so a rank can be over
    its capacity through that row alone and fit by recomputing: the dominance tests that let only
    ranks over without recompute recompute (recomputing_ranks, over_capacity_without_recompute)
    must let it (a review found both reading the activations' rows only, which excluded this
    layout). Llama 3.1 8B at 1K tokens, bf16 gradients, torchtitan, tp 2, pp 4, 1F1B, layers
    9/8/8/7, rank 0 recomputing its 9, the capacity rank 0's peak with them."""
    import math

    from optimizer.layout_linear import LinearLayouts

    decoders = (9, 8, 8, 7)
    recomputing = StageLayout(pp=4, vp=1, decoders=decoders, mtp=(0, 0, 0, 0), recompute=(9, 0, 0, 0))
    plain = recomputing.with_recompute((0, 0, 0, 0))
    ctx = torchtitan_8b_context(1024, math.ceil(rank_peaks(torchtitan_8b_context(1024), recomputing)[0] / 2**20))
    lin = LinearLayouts(ctx)
    assert (rank_peaks(ctx, recomputing) <= lin.capacity).all() and not (rank_peaks(ctx, plain) <= lin.capacity).all()
    assert_rank_0_may_recompute(ctx, lin, decoders)


def test_a_rank_over_only_at_its_most_buffers_may_recompute():
    """The activations' rows hold torchtitan's pipeline buffers at their least (a floor), so the
    dominance tests must add the buffers' spread there too, or a rank whose floor is under the
    capacity but whose exact peak without recompute is over it would be barred from recomputing
    though it fits only by doing so. Llama 3.1 8B at 2K tokens, torchtitan, tp 2, pp 4, 1F1B,
    layers 9/8/8/7: rank 0's row without recompute is 33 MiB under its exact peak (the spread is
    42 MiB); the capacity is set between the two, where rank 0 recomputing its 9 layers fits."""
    import math

    from optimizer.layout_linear import LinearLayouts

    decoders = (9, 8, 8, 7)
    recomputing = StageLayout(pp=4, vp=1, decoders=decoders, mtp=(0, 0, 0, 0), recompute=(9, 0, 0, 0))
    plain = recomputing.with_recompute((0, 0, 0, 0))
    probe = torchtitan_8b_context(2048)
    floor = LinearLayouts(probe).rank_rows(*LinearLayouts(probe).layout_counts(np.array([decoders + (0,) * 4])))[0][0].max()
    ctx = torchtitan_8b_context(2048, math.floor((floor + rank_peaks(probe, plain)[0]) / 2 / 2**20))
    lin = LinearLayouts(ctx)
    counts, _ = lin.layout_counts(np.array([decoders + (0,) * 4]))
    assert lin.rank_rows(counts, None)[0][0].max() < lin.capacity < rank_peaks(ctx, plain)[0]  # under by its row, over by the ledger
    assert rank_peaks(ctx, recomputing)[0] <= lin.capacity
    assert_rank_0_may_recompute(ctx, lin, decoders)


def test_most_layers_binds_where_memory_does():
    """LinearLayouts.most_layers (each stage's most layers in a layout that fits: its rank's
    fixed bytes and the activations of its most-held chunk per layer, a lower bound on the
    peak; enumerated as valid in test_relaxed_bound_holds_for_every_layout) binds on
    DeepSeek-V3 under FSDP on pp 16 x vp 2 (2048 device B, 64 GB): the first chunks, whose
    micro-batches stay in flight longest, hold at most 4 layers, far below 61, and the layouts
    of the bench's answers (2 per stage) within; the tables' index domains shrink with it."""
    import os

    from optimizer.layout_linear import LinearLayouts

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ds = load_problem(os.path.join(root, "problems/tuning/deepseek_v3_2048gpu_sn8.yaml"), ["config=null"])
    cfg = ConfigBatch.from_columns(2048, tp=4, pp=16, vp=2, ep=64, mbs=1, first_layers=2, last_layers=3, pp_overlap=1, dp_overlap=1,
                                   zero_stage=3, reshard_after_forward=0)
    most = LinearLayouts(layout_context(ds, cfg)).most_layers()
    assert most[:9].max() <= 4 and (most >= 2).all() and most.max() < 61


@pytest.mark.parametrize("schedule,pp,vp", [("1f1b", 4, 1), ("afab", 2, 2)])
def test_zero_2_with_one_window_per_stage_matches_enumeration(tmp_path, schedule, pp, vp):
    """ZeRO-2 (Llama 3's sharding) where every stage reduces its gradients once per step (1F1B,
    all-forward-all-backward): no traffic inside the pipeline and a ledger affine in the counts,
    so the search's linear model is exact and its certified optimum is enumeration's, with the
    GPU roomy and at the median layout's peak (half the layouts do not fit); below the least peak
    nothing fits."""
    from costmodel.specs import PP_SCHEDULES

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)

    def zero_2(memory_mib, schedule=schedule, pp=pp, vp=vp):
        problem = load_problem(str(path), [f"hardware.memory_mib={memory_mib}"])
        cfg = ConfigBatch.from_columns(64, tp=8, pp=pp, vp=vp, ep=8, mbs=1, first_layers=2, last_layers=2, zero_stage=2,
                                       pp_schedule=PP_SCHEDULES.index(schedule))
        return layout_context(problem, cfg)

    peaks = sorted(float(score.peak_bytes.max()) for _, score in enumerate_layouts(zero_2(81559)))
    median = int(peaks[len(peaks) // 2] / 2**20)
    for memory_mib in (81559, median):
        assert_certifies_enumeration_optimum(zero_2(memory_mib))
    with pytest.raises(LayoutError, match="fits the GPU memory"):
        solve_layout(zero_2(int(peaks[0] / 2**20) - 1), time_limit_s=20)


@pytest.mark.parametrize("schedule,pp,vp", [("1f1b", 4, 1), ("afab", 2, 2)])
def test_zero_3_kept_after_the_forward_matches_enumeration(tmp_path, schedule, pp, vp):
    """ZeRO-3 with parameters kept after the forward (torchtitan's policy under PP) and one
    gradient window per stage: each stage gathers its layers once per step, the first exposed
    and the rest prefetched, so a stage's forward is linear in its layers plus a fixed cost where
    it holds one. LinearLayouts (probed from stage_zero_terms) prices every layout's passes as the
    scorer does, and the search (a boolean per stage for that cost) certifies enumeration's
    optimum, roomy and at the median layout's peak, and roomy with parameters freed after the
    forward (every micro-batch gathers again, both passes: linear too)."""
    from costmodel.specs import PP_SCHEDULES
    from optimizer.layout_linear import LinearLayouts

    path = tmp_path / "tiny_dense.yaml"
    path.write_text(TINY_DENSE.replace("LAYERS", "8"))
    columns = dict(tp=8, pp=pp, vp=vp, mbs=1, first_layers=2, last_layers=2, zero_stage=3, reshard_after_forward=0, dp_overlap=1,
                   pp_schedule=PP_SCHEDULES.index(schedule))

    def zero_3(memory_mib):
        problem = load_problem(str(path), [f"hardware.memory_mib={memory_mib}"])
        return layout_context(problem, ConfigBatch.from_columns(64, **columns))

    roomy = zero_3(81559)
    lin = LinearLayouts(roomy)
    assert lin.first_forward_s.min() > 0.0  # the exposed first gather is there to model
    layouts, counts = assert_linear_times_are_exact(roomy, lin)
    peaks = sorted(float(score.peak_bytes.max()) for _, score in layouts)
    for memory_mib in (81559, int(peaks[len(peaks) // 2] / 2**20)):
        assert_certifies_enumeration_optimum(zero_3(memory_mib))
    assert_certifies_enumeration_optimum(layout_context(load_problem(str(path), []), ConfigBatch.from_columns(64, **{**columns, "reshard_after_forward": 1})))


@pytest.mark.parametrize("schedule,pp,vp,reshard", [("1f1b", 4, 1, 0), ("afab", 2, 2, 0), ("1f1b", 4, 1, 1)])
def test_zero_3_with_two_kinds_of_layer_matches_enumeration(tmp_path, schedule, pp, vp, reshard):
    """ZeRO-3 on DeepSeek-V3's kinds (dense and MoE layers, an MTP module on the last stage) with
    one gradient window per stage: a stage gathers its mean layer, a ratio of its counts, so the
    exact model's gathers are tabulated by each stage's first layer and layer count
    (LinearLayouts.gathers, an element constraint per stage and pass in CP-SAT) above linear
    terms that stay below every entry. The model prices every layout's passes as the scorer
    does, and the search certifies enumeration's optimum, roomy and at the median layout's peak,
    kept after the forward and freed after it, and with recompute chosen per stage (8 windows
    per stage: test_gradient_windows_with_moe_layers_are_searched_and_match_enumeration)."""
    from costmodel.specs import PP_SCHEDULES
    from optimizer.layout_linear import LinearLayouts

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    columns = dict(tp=8, pp=pp, vp=vp, ep=8, mbs=1, first_layers=2, last_layers=2, zero_stage=3, reshard_after_forward=reshard, dp_overlap=1,
                   pp_schedule=PP_SCHEDULES.index(schedule))

    def zero_3(memory_mib, **changes):
        problem = load_problem(str(path), [f"hardware.memory_mib={memory_mib}"])
        return layout_context(problem, ConfigBatch.from_columns(64, **{**columns, **changes}))

    roomy = zero_3(81559)
    lin = LinearLayouts(roomy)
    assert lin.gathers is not None and lin.gathers.middle_f.max() > 0  # the mean layers' gathers are there to model
    layouts, counts = assert_linear_times_are_exact(roomy, lin)
    rest_f, rest_b = lin.gather_rest_s(counts)
    assert rest_f.min() >= 0 and rest_b.min() >= 0
    peaks = sorted(float(score.peak_bytes.max()) for _, score in layouts)
    for memory_mib in (81559, int(peaks[len(peaks) // 2] / 2**20)):
        assert_certifies_enumeration_optimum(zero_3(memory_mib))
    # with recompute chosen per stage too (layer and recompute counts enumerated)
    assert_certifies_enumeration_optimum(zero_3(81559, recompute=2, recompute_method=1, recompute_layers=1))


@pytest.mark.parametrize("memory_mib", [81559, 38000, 36000])
def test_stage_dp_agrees(tmp_path, memory_mib):
    """MPE eq. 3 over stages (vp = 1) reaches the same optimum as CP-SAT and enumeration, and
    finds nothing exactly when nothing fits."""
    ctx = context(tmp_path, 4, 1, memory_mib)
    layout, value = dp_layout(ctx)
    best, _ = best_by_enumeration(ctx)
    if best is None:
        assert layout is None
        return
    assert value == pytest.approx(best, rel=1e-9)
    assert solve_layout(ctx, time_limit_s=10, refine=False).bound_s == pytest.approx(value, rel=1e-6)


def test_kind_runs():
    assert kind_runs([0, 0, 0, 1, 1, 2, 1]) == [(0, 0, 3), (1, 3, 5), (2, 5, 6), (1, 6, 7)]


@pytest.mark.parametrize("prefer_rank", [False, True])
def test_critical_path_is_the_makespan(prefer_rank):
    """The path the search adds as a cut is as long as the simulated makespan (it is a longest
    path), and as a linear form it bounds another layout's makespan from below."""
    import numpy as np

    from costmodel.schedule_sim import schedule_ops, simulate
    from optimizer.schedule_graph import critical_path

    ops = schedule_ops("interleaved_1f1b", 4, 2, 8)
    rng = np.random.default_rng(5)
    f = rng.uniform(0.1, 1.0, (4, 2))
    result = simulate(ops, f, 2 * f, 0.0)
    n_f, n_b = critical_path(ops, result, f, 2 * f, prefer_rank)
    flat = lambda x: x.T.ravel()  # [pp, vp] -> stages in model order
    assert n_f @ flat(f) + n_b @ flat(2 * f) == pytest.approx(result.makespan_s, rel=1e-12)
    g = rng.uniform(0.1, 1.0, (4, 2))
    assert n_f @ flat(g) + n_b @ flat(2 * g) <= simulate(ops, g, 2 * g, 0.0).makespan_s * (1 + 1e-12)


def test_segment_paths_bound_every_layout():
    """The initial cuts (a forward chain, one rank's run of ops, a backward chain) never
    exceed the simulated makespan, for chunk times with near-empty stages, and one of them
    meets it for uniform chunks."""
    import numpy as np

    from costmodel.schedule_sim import schedule_ops, simulate
    from optimizer.schedule_graph import segment_paths

    ops = schedule_ops("interleaved_1f1b", 4, 2, 8)
    paths = list(segment_paths(ops, 8, 8))
    assert len(paths) == 4 * 2 * 2  # per rank, every (first forward, last backward) pair: m > pp puts all in order
    rng = np.random.default_rng(3)
    flat = lambda x: x.T.ravel()
    for _ in range(20):
        f = rng.uniform(0.0, 1.0, (4, 2)) * (rng.uniform(size=(4, 2)) > 0.4) + 0.01
        makespan = simulate(ops, f, 2 * f, 0.0).makespan_s
        assert max(n_f @ flat(f) + n_b @ flat(2 * f) for n_f, n_b in paths) <= makespan * (1 + 1e-12)
    ones = np.ones((4, 2))
    best = max(n_f @ flat(ones) + n_b @ flat(2 * ones) for n_f, n_b in paths)
    assert best == pytest.approx(simulate(ops, ones, 2 * ones, 0.0).makespan_s, rel=1e-12)


@pytest.mark.parametrize("pp,vp,budget", [(4, 2, 10**6), (4, 2, 2 * 8 * 8), (4, 2, 2 * 8 * 8 - 1)])
def test_dwell_paths_bound_every_layout(tmp_path, pp, vp, budget):
    """Each dwell path is its probe's longest path (its length is the makespan of the stage
    times with one or two stages slowed) and no longer than the makespan of any other layout's
    times: a cut for every layout. Pairs only where their terms fit the budget, single stages
    where those alone fit, none past that."""
    import numpy as np

    from optimizer.layout_bounds import dwell_paths
    from optimizer.schedule_graph import schedule_graph

    ctx = context(tmp_path, pp, vp, 81559)
    stages = pp * vp
    graph = schedule_graph(ctx)
    rng = np.random.default_rng(5)
    base = (rng.uniform(0.5, 1.5, stages), rng.uniform(1.0, 3.0, stages))
    paths = dwell_paths(ctx, base, budget_terms=budget)
    singles, pairs = stages, stages * (stages - 1) // 2
    expected = singles + pairs if (singles + pairs) * 2 * stages <= budget else singles if singles * 2 * stages <= budget else 0
    assert len(paths) == expected
    for k, (n_f, n_b) in enumerate(paths[:singles]):  # the single-stage probes come first, stage by stage
        slow = [x.copy() for x in base]
        for x in slow:
            x[k] *= 3.0
        assert n_f @ slow[0] + n_b @ slow[1] == pytest.approx(graph.makespan(*slow), rel=1e-12)
    for _ in range(20):
        f = rng.uniform(0.0, 1.0, stages) * (rng.uniform(size=stages) > 0.3) + 0.01
        b = 2 * f
        makespan = graph.makespan(f, b)
        assert max((n_f @ f + n_b @ b for n_f, n_b in paths), default=0.0) <= makespan * (1 + 1e-12)


@pytest.mark.parametrize("memory_mib", [81559, 39000])
def test_regular_layouts(tmp_path, memory_mib):
    """chunk_spread=1 finds the best layout among those whose chunks on one rank differ by at
    most one layer (enumeration restricted the same way); two_phase is never worse than it, and
    certifies the optimum over every layout."""
    ctx = context(tmp_path, 2, 2, memory_mib)
    scored = [(s.pipeline_s - s.pp_exposed_s, lay) for lay, s in enumerate_layouts(ctx) if s.fits and regular(lay, 1)]
    best = min(v for v, _ in scored)
    solution = solve_layout(ctx, time_limit_s=20, chunk_spread=1)
    assert solution.optimal and regular(solution.layout, 1)
    assert solution.makespan_s == pytest.approx(best, rel=1e-6)
    first, second = two_phase(ctx, 20, 2, ())
    assert second.makespan_s <= first.makespan_s * (1 + 1e-12)
    # the regular phase certified, its free phase runs no local search and still finds and
    # certifies the optimum over every layout (an irregular one better than the regular
    # optimum would be an answer of its CP-SAT rounds)
    assert first.optimal and second.optimal
    assert second.makespan_s == pytest.approx(min(s.pipeline_s - s.pp_exposed_s for _, s in enumerate_layouts(ctx) if s.fits), rel=1e-6)


@pytest.mark.parametrize("schedule,pp,vp,m,group", [("1f1b", 4, 1, 6, None), ("interleaved_1f1b", 4, 2, 8, None), ("interleaved_1f1b", 2, 3, 4, None),
                                                    ("flexible", 2, 3, 8, 4), ("afab", 2, 2, 4, None), ("afab", 3, 1, 5, None)])
def test_schedule_graph_is_the_simulation(schedule, pp, vp, m, group):
    """ScheduleGraph's makespan is schedule_sim.simulate's at hop 0, one layout or a batch, for
    random chunk times with empty chunks; its longest path, as a linear form, equals the
    makespan and bounds every other time vector's makespan from below, as does each rank's
    busy time (the rank-total cut)."""
    import numpy as np

    from costmodel.schedule_sim import schedule_ops, simulate
    from optimizer.schedule_graph import ScheduleGraph

    ops = schedule_ops(schedule, pp, vp, m, group)
    graph = ScheduleGraph(ops, pp * vp)
    rng = np.random.default_rng(11)
    flat = lambda x: x.T.ravel()  # [pp, vp] -> stages in model order
    times = []
    for _ in range(12):
        f = rng.uniform(0.0, 1.0, (pp, vp)) * (rng.uniform(size=(pp, vp)) > 0.3)
        b = f * rng.uniform(1.0, 3.0, (pp, vp))
        times.append((f, b))
        reference = simulate(ops, f, b, 0.0).makespan_s
        assert graph.makespan(flat(f), flat(b)) == pytest.approx(reference, rel=1e-12, abs=1e-15)
        assert m * (f + b).sum(axis=1).max() <= reference * (1 + 1e-12) + 1e-15
    batch = graph.makespan(np.stack([flat(f) for f, _ in times], axis=1), np.stack([flat(b) for _, b in times], axis=1))
    assert batch == pytest.approx([simulate(ops, f, b, 0.0).makespan_s for f, b in times], rel=1e-12, abs=1e-15)
    for (f, b), (g, c) in zip(times, times[1:]):
        n_f, n_b = graph.path(flat(f), flat(b))
        assert n_f @ flat(f) + n_b @ flat(b) == pytest.approx(graph.makespan(flat(f), flat(b)), rel=1e-12, abs=1e-15)
        assert n_f @ flat(g) + n_b @ flat(c) <= graph.makespan(flat(g), flat(c)) * (1 + 1e-12) + 1e-15


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 13)])
def test_schedule_graph_of_dualpipev_is_its_simulation(pp, m):
    """DualPipeV's graph (nodes are its entries: a forward overlapped with another stage's full
    backward, a full backward (B, W), deferred W passes) times the V as schedule_sim.simulate
    does at hop 0, one layout or a batch, and its longest path, counted in F, B and W passes
    per stage, equals the makespan and bounds every other time vector's from below."""
    import numpy as np

    from costmodel.schedule_sim import schedule_ops, simulate
    from costmodel.stage_layout import rank_stages
    from optimizer.schedule_graph import ScheduleGraph

    ops = schedule_ops("dualpipev", pp, 2, m)
    graph = ScheduleGraph(ops, 2 * pp)
    assert graph.has_weight
    mine = rank_stages(pp, 2, True)
    rng = np.random.default_rng(5)
    times = []
    for _ in range(10):
        f, b, w = (rng.uniform(0.0, 1.0, 2 * pp) * (rng.uniform(size=2 * pp) > 0.2) for _ in range(3))
        times.append((f, b, w))
        per_chunk = lambda x: np.array([x[st] for st in mine])
        reference = simulate(ops, per_chunk(f), per_chunk(b), 0.0, weight_s=per_chunk(w)).makespan_s
        assert graph.makespan(f, b, w) == pytest.approx(reference, rel=1e-12, abs=1e-15)
    batch = graph.makespan(*(np.stack(x, axis=1) for x in zip(*times)))
    assert batch == pytest.approx([graph.makespan(*t) for t in times], rel=1e-12)
    f2, b2, w2 = (np.stack(x, axis=1) for x in zip(*times[:2]))
    many = graph.paths(f2, b2, w2)
    for (f, b, w), (g, c, v), k in zip(times, times[1:], range(len(times))):
        n_f, n_b, n_w = graph.path(f, b, w)
        assert n_f @ f + n_b @ b + n_w @ w == pytest.approx(graph.makespan(f, b, w), rel=1e-12, abs=1e-15)
        assert n_f @ g + n_b @ c + n_w @ v <= graph.makespan(g, c, v) * (1 + 1e-12) + 1e-15
        if k < 2:
            assert many[0][k] @ f + many[1][k] @ b + many[2][k] @ w == pytest.approx(graph.makespan(f, b, w), rel=1e-12)


@pytest.mark.parametrize("memory_mib,recompute", [(81559, None), (40000, None), (38000, None), (36000, None),  # 36000 fits nothing
                                                  (81559, 2), (38000, 2), (40000, "all")])
def test_dualpipev_search_matches_enumeration(tmp_path, memory_mib, recompute):
    """DualPipeV on pp 2 (stages 0 and 3 on rank 0, 1 and 2 on rank 1; 16 micro-batches), with
    no recompute or the full recompute Megatron launches on every stage (block N = 2: the first
    min(2, layers); or every layer): LinearLayouts prices every V layout as the exact model
    does (forward, backward and its weight-gradient part, what fits), and vee_layout_search,
    from the slowest layout that fits, certifies the least simulated makespan among the 120
    layouts, enumerated (tolerance 1e-6 relative: CP-SAT works in integer nanoseconds and KiB)."""
    import numpy as np

    from costmodel.stage_layout import stage_weights
    from optimizer.layout_linear import LinearLayouts
    from optimizer.layout_vee import vee_layout_search

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    problem = load_problem(str(path), [f"hardware.memory_mib={memory_mib}"])
    full = {} if recompute is None else dict(recompute=2, recompute_method=1 if recompute != "all" else 0, recompute_layers=recompute if recompute != "all" else 0)
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, ep=8, mbs=1, first_layers=2, last_layers=2, zero_stage=1, pp_schedule=4, **full)
    ctx = layout_context(problem, cfg)
    assert ctx.vee and ctx.recompute_allowed == (recompute is not None)
    level = {None: 0, 2: 2, "all": 7}[recompute]
    lin = LinearLayouts(ctx)
    layouts = [(layout, score) for layout, score in enumerate_layouts(ctx, uniform_recompute=True)
               if layout.recompute == tuple(min(level, d) for d in layout.decoders)]
    assert len(layouts) == 120 and all(layout.vee for layout, _ in layouts)
    counts, recomputed = lin.layout_counts(np.array([layout.decoders + layout.recompute for layout, _ in layouts]))
    recomputed = recomputed if recompute is not None else None
    forward, backward = lin.times(counts, recomputed)
    weight, fits = lin.weights(counts), lin.fits(counts, recomputed)
    for k, (layout, score) in enumerate(layouts):
        assert forward[:, k] == pytest.approx(score.forward_s, rel=1e-12)
        assert backward[:, k] == pytest.approx(score.backward_s, rel=1e-12)
        assert weight[:, k] == pytest.approx(stage_weights(ctx, layout), rel=1e-12)
        assert fits[k] == score.fits
    fitting = [(score.pipeline_s - score.pp_exposed_s, layout) for layout, score in layouts if score.fits]
    if not fitting:
        return
    best = min(value for value, _ in fitting)
    slowest = max(fitting, key=lambda x: x[0])[1]
    solution = vee_layout_search(ctx, 10.0, slowest)
    assert solution.optimal and solution.fits and solution.bound_source == "vee-cp-sat"
    assert solution.layout.recompute == tuple(min(level, d) for d in solution.layout.decoders)
    assert solution.makespan_s == pytest.approx(best, rel=1e-6)
    assert solution.lower_bound_s <= best * (1 + 1e-9)


@pytest.mark.parametrize("pp,vp", [(4, 1), (2, 2)])
def test_linear_layouts_match_the_exact_model(tmp_path, pp, vp):
    """LinearLayouts (what the local search and the lazily added memory rows read) gives every
    layout the exact model's stage times, and says it fits exactly when score_layout does, at
    capacities from roomy to tight."""
    import numpy as np

    from optimizer.layout_linear import LinearLayouts

    for memory_mib in (81559, 39000, 38000):
        ctx = context(tmp_path, pp, vp, memory_mib)
        lin = LinearLayouts(ctx)
        layouts = list(enumerate_layouts(ctx))
        decoders = np.array([layout.decoders for layout, _ in layouts])
        counts = lin.run_counts(decoders)
        forward, backward = lin.times(counts)
        fits = lin.fits(counts)
        for k, (_, score) in enumerate(layouts):
            assert forward[:, k] == pytest.approx(score.forward_s, rel=1e-12)
            assert backward[:, k] == pytest.approx(score.backward_s, rel=1e-12)
            assert fits[k] == score.fits


@pytest.mark.parametrize("pp,vp,memory_mib", [(4, 1, 81559), (2, 2, 39000), (2, 2, 81559)])
@pytest.mark.parametrize("time_limit_s", [0.05, 1.0])
def test_proven_bound_holds_for_every_layout(tmp_path, pp, vp, memory_mib, time_limit_s):
    """Whatever the time limit (cut short or certified), the free search's proven lower bound
    never exceeds the simulated makespan of any layout that fits (all enumerated), its answer
    fits, and it is never worse than its seed."""
    ctx = context(tmp_path, pp, vp, memory_mib)
    best, _ = best_by_enumeration(ctx, "makespan")
    seeds = tuple(layout for layout, score in enumerate_layouts(ctx) if score.fits)[:1]
    solution = solve_layout(ctx, time_limit_s=time_limit_s, seeds=seeds)
    assert solution.fits
    assert solution.lower_bound_s <= best * (1 + 1e-9)
    assert best <= solution.makespan_s * (1 + 1e-12)
    from costmodel.stage_layout import score_layout

    seed_score = score_layout(ctx, seeds[0])
    assert solution.makespan_s <= (seed_score.pipeline_s - seed_score.pp_exposed_s) * (1 + 1e-12)


def test_local_search_improves_and_fits(tmp_path):
    """From a fitting layout, the descent returns a layout that fits, is no slower, and whose
    reported makespan is the exact model's; the paths it returns bound every layout."""
    from costmodel.stage_layout import StageLayout, score_layout
    from optimizer.layout_seeds import local_search

    ctx = context(tmp_path, 2, 2, 39000)
    scored = [(s.pipeline_s - s.pp_exposed_s, layout) for layout, s in enumerate_layouts(ctx) if s.fits]
    worst_value, worst = max(scored, key=lambda x: x[0])
    decoders, value, paths, recompute = local_search(ctx, worst.decoders, 5.0)
    assert recompute == (0,) * 4  # the skeleton has no full recompute
    found = score_layout(ctx, StageLayout(pp=2, vp=2, decoders=decoders, mtp=worst.mtp))
    assert found.fits
    assert value == pytest.approx(found.pipeline_s - found.pp_exposed_s, rel=1e-12)
    assert value <= worst_value
    for n_f, n_b in paths:
        for makespan, layout in scored:
            s = score_layout(ctx, layout)
            assert n_f @ s.forward_s + n_b @ s.backward_s <= makespan * (1 + 1e-12)


# --- per-stage full recompute ---------------------------------------------------------------
# The same 7-layer DeepSeek-V3 at 32K tokens, its skeleton with full recompute, so that the
# layouts choose how many layers of each stage to recompute. The GPU capacity decides only
# which layouts fit (their scores are the same), so each instance is enumerated once, at a
# capacity where everything fits, and the capacities below filter it. On pp 2 x vp 2 at
# 40.1-47.9 GB only layouts that recompute fit; at 39000 MiB nothing does.

TINY_RECOMPUTE = TINY.replace("seq_len: 4096", "seq_len: 32768")


def recompute_context(tmp_path, pp, vp, memory_mib):
    path = tmp_path / "tiny_recompute.yaml"
    path.write_text(TINY_RECOMPUTE)
    problem = load_problem(str(path), [f"hardware.memory_mib={memory_mib}"])
    cfg = ConfigBatch.from_columns(64, tp=8, pp=pp, vp=vp, ep=8, mbs=1, first_layers=2, last_layers=2, zero_stage=1,
                                   recompute=2, recompute_method=1, recompute_layers=1)
    return layout_context(problem, cfg)


@pytest.fixture(scope="module")
def recompute_layouts(tmp_path_factory):
    """{(pp, vp): [(layout, peak bytes, makespan, critical-path bound)]} of every layout and
    recompute vector (enumerate_layouts), scored at 200 GB."""
    out = {}
    for pp, vp in ((2, 2), (4, 1)):
        ctx = recompute_context(tmp_path_factory.mktemp("rc"), pp, vp, 200000)
        out[pp, vp] = [(layout, s.peak_bytes.max(), s.pipeline_s - s.pp_exposed_s, s.bound_s) for layout, s in enumerate_layouts(ctx)]
    return out


def fitting(layouts, ctx):
    return [entry for entry in layouts if entry[1] <= ctx.problem.hardware.memory_bytes]


@pytest.mark.parametrize("memory_mib", [200000, 49000, 44000, 39000])
def test_recompute_cpsat_matches_enumeration(tmp_path, recompute_layouts, memory_mib):
    """pp 2 x vp 2 with a recompute count per stage (C(7 + 8 - 1, 7) = 3432 layouts): the
    certified free search reaches enumeration's least simulated makespan, and the uniform-N
    search (r_s = min(N, layers_s), what Megatron launches) the least among those; infeasible
    exactly when nothing fits."""
    ctx = recompute_context(tmp_path, 2, 2, memory_mib)
    fits = fitting(recompute_layouts[2, 2], ctx)
    if not fits:
        with pytest.raises(LayoutError):
            solve_layout(ctx, time_limit_s=10)
        return
    for uniform in (False, True):
        best = min(makespan for layout, _, makespan, _ in fits if not uniform or layout.uniform_recompute() is not None)
        solution = solve_layout(ctx, time_limit_s=20, uniform_recompute=uniform)
        assert solution.optimal and solution.fits
        assert solution.makespan_s == pytest.approx(best, rel=1e-6)
        assert solution.lower_bound_s <= solution.makespan_s * (1 + 1e-9)
        if uniform:
            assert solution.layout.uniform_recompute() is not None


@pytest.mark.parametrize("pp,vp", [(2, 2), (4, 1)])
@pytest.mark.parametrize("memory_mib", [200000, 49000, 44000, 41000])
def test_recompute_rounds_below_an_incumbent_match_enumeration(tmp_path, recompute_layouts, pp, vp, memory_mib):
    """The free search with per-stage recompute, started from the slowest layout that fits and
    no local search, so that its rounds below the incumbent do the work with every cut they
    take on trust (recompute_only_where_needed's dominance, recomputing_ranks' zeros, the dwell
    paths, the parts the rounds search one after another): certified at enumeration's least
    simulated makespan over every layout and recompute vector. A cut that removed a better
    layout, or parts that missed some, would leave a slower certified answer."""
    ctx = recompute_context(tmp_path, pp, vp, memory_mib)
    fits = fitting(recompute_layouts[pp, vp], ctx)
    slowest = max(fits, key=lambda e: e[2])[0]
    solution = solve_layout(ctx, time_limit_s=20, seeds=(slowest,), local=False)
    assert solution.optimal and solution.fits
    assert solution.makespan_s == pytest.approx(min(makespan for _, _, makespan, _ in fits), rel=1e-6)


def test_recompute_rounds_search_the_parts_in_order(tmp_path, recompute_layouts, monkeypatch):
    """Free layouts with per-stage recompute, below an incumbent: the rounds first fix the
    layouts that recompute nothing, and settle each part before the next (the parts' booleans
    fixed in that order: nothing; the roomiest rank nothing; it and another rank; it alone),
    and the answer is enumeration's optimum."""
    import optimizer.layout_search as layout_search
    fixed = []
    real_fix = layout_search.fix_bool
    monkeypatch.setattr(layout_search, "fix_bool", lambda model, var, value: (fixed.append((var.Name(), value)), real_fix(model, var, value))[1])
    ctx = recompute_context(tmp_path, 2, 2, 44000)
    fits = fitting(recompute_layouts[2, 2], ctx)
    slowest = max(fits, key=lambda e: e[2])[0]
    solution = layout_search.solve_layout(ctx, time_limit_s=20, seeds=(slowest,), local=False)
    assert solution.optimal
    assert solution.makespan_s == pytest.approx(min(makespan for _, _, makespan, _ in fits), rel=1e-6)
    assert fixed[0] == ("recomputes", 0)  # the layouts that recompute nothing first
    assert ("recomputes", 1) in fixed and None not in [value for _, value in fixed]  # the next parts, none given up
    # here (pp 2) with the per-rank booleans: the roomiest rank recomputes nothing; it and
    # another rank recompute; it alone does (the hardest part last, with all the time left)
    roomiest = [name for name, _ in fixed if name.startswith("needs_recompute")]
    assert roomiest and len(set(roomiest)) == 1
    assert [(name, value) for name, value in fixed if name != "recomputes"] == [
        (roomiest[0], 0), (roomiest[0], 1), ("others_recompute", 1), (roomiest[0], 1), ("others_recompute", 0)]


def test_recompute_is_found_where_only_it_fits(tmp_path, recompute_layouts):
    """At 44000 MiB no layout that recomputes nothing fits; the search finds one that
    recomputes some layers of some stages, not all of them, and is faster than recomputing
    everything (the best layout that does)."""
    ctx = recompute_context(tmp_path, 2, 2, 44000)
    fits = fitting(recompute_layouts[2, 2], ctx)
    assert fits and not any(not layout.any_recompute for layout, *_ in fits)
    solution = solve_layout(ctx, time_limit_s=20)
    layout = solution.layout
    assert solution.fits and solution.optimal and layout.any_recompute
    assert sum(layout.recompute) < sum(layout.decoders)
    everything = min(makespan for lay, _, makespan, _ in fits if lay.recompute == lay.decoders)
    assert solution.makespan_s < everything


@pytest.mark.parametrize("memory_mib", [200000, 44000, 41000, 39000])
def test_recompute_stage_dp_agrees(tmp_path, recompute_layouts, memory_mib):
    """pp 4 x vp 1: the stage DP with recompute (Pareto pairs of term and chain) reaches
    enumeration's least critical-path bound, as does CP-SAT's first round; at 41000 MiB the
    answer recomputes; nothing exactly when nothing fits."""
    ctx = recompute_context(tmp_path, 4, 1, memory_mib)
    fits = fitting(recompute_layouts[4, 1], ctx)
    layout, value = dp_layout(ctx)
    if not fits:
        assert layout is None
        return
    best = min(bound for *_, bound in fits)
    assert value == pytest.approx(best, rel=1e-9)
    if memory_mib == 41000:
        assert layout.any_recompute
    assert solve_layout(ctx, time_limit_s=10, refine=False).bound_s == pytest.approx(value, rel=1e-6)


def test_linear_layouts_with_recompute(tmp_path, recompute_layouts):
    """LinearLayouts' stage times and memory test (what the local search and the memory rows
    read) are the exact model's for every layout and recompute vector."""
    import numpy as np

    from costmodel.stage_layout import score_layout
    from optimizer.layout_linear import LinearLayouts

    ctx = recompute_context(tmp_path, 2, 2, 44000)
    lin = LinearLayouts(ctx)
    layouts = [layout for layout, *_ in recompute_layouts[2, 2]][::7]
    counts, recomputed = lin.layout_counts(np.array([layout.decoders + layout.recompute for layout in layouts]))
    forward, backward = lin.times(counts, recomputed)
    fits = lin.fits(counts, recomputed)
    for k, layout in enumerate(layouts):
        score = score_layout(ctx, layout)
        assert forward[:, k] == pytest.approx(score.forward_s, rel=1e-12)
        assert backward[:, k] == pytest.approx(score.backward_s, rel=1e-12)
        assert fits[k] == score.fits


def test_layout_report_states_whether_megatron_can_launch_the_recompute(tmp_path):
    """At 44000 MiB on pp 4 x vp 1 (Megatron's split: 1, 2, 2, 2 layers) the best per-stage
    recompute is no min(N, layers): the report says so, keeps it aside, and reports (and would
    launch) the best layout with one N, which is slower but launchable; launch_recompute turns
    it into Megatron's block method."""
    from optimizer.layout_report import launch_recompute, layout_report

    ctx = recompute_context(tmp_path, 4, 1, 44000)
    cfg = ConfigBatch.from_columns(64, tp=8, pp=4, vp=1, ep=8, mbs=1, first_layers=1, last_layers=2, zero_stage=1,
                                   recompute=2, recompute_method=1, recompute_layers=1)
    report, layout = layout_report(ctx.problem, cfg, time_limit_s=20)
    assert report["recompute_expressible"] is False
    other = report["best_any_recompute"]
    assert other["step_time_s"] < report["step_time_s"]
    # the one-N layouts are among the per-stage ones: the per-stage search's bound holds for them
    assert report["makespan_lower_bound_s"] >= other["makespan_lower_bound_s"]
    n = report["recompute_num_layers"]
    assert n is not None and report["recompute"] == [min(n, d) for d in layout.decoders]
    assert layout is not None and layout.recompute == tuple(report["recompute"])  # the configuration's own split does not fit
    assert not report["megatron_split_fits"] and report["applied"]
    assert launch_recompute(layout) == ({"recompute": "full", "recompute_method": "block", "recompute_num_layers": n} if n else
                                        {"recompute": "none", "recompute_method": None, "recompute_num_layers": None})
    with pytest.raises(LayoutError, match="one N"):
        launch_recompute(layout.with_recompute(other["recompute"]))


def test_layout_report_searches_one_n_where_the_answer_already_is_one(tmp_path, recompute_layouts):
    """At a roomy capacity (pp 4 x vp 1) the best per-stage counts recompute nothing, which one
    N (0) gives: the report says Megatron can launch them, keeps nothing aside, and still runs
    the search with one N, whose level bounds rule out every N >= 1 and certify the layout
    (the search over any per-stage counts says nothing of that kind)."""
    from optimizer.layout_report import _BOUND_NOTES, layout_report

    ctx = recompute_context(tmp_path, 4, 1, 200000)
    cfg = ConfigBatch.from_columns(64, tp=8, pp=4, vp=1, ep=8, mbs=1, first_layers=1, last_layers=2, zero_stage=1,
                                   recompute=2, recompute_method=1, recompute_layers=1)
    report, layout = layout_report(ctx.problem, cfg, time_limit_s=20)
    assert report["recompute_expressible"] is True and "best_any_recompute" not in report
    assert report["recompute_num_layers"] == 0 and not any(report["recompute"])
    assert report["optimal"] and report["bound"] == _BOUND_NOTES["levels"]
    best = min(makespan for lay, _, makespan, _ in fitting(recompute_layouts[4, 1], ctx) if lay.uniform_recompute() is not None)
    assert report["makespan_lower_bound_s"] == pytest.approx(best, rel=1e-6)


@pytest.mark.parametrize("pp,vp", [(2, 2), (4, 1)])
def test_work_bound_holds_for_every_layout(tmp_path, recompute_layouts, pp, vp):
    """work_bound_s (the floor of every search's bound) never exceeds the simulated makespan
    of any layout and recompute vector, fitting or not, and is no trivial bound: within a
    factor 2 of the best."""
    from optimizer.layout_bounds import work_bound_s

    ctx = recompute_context(tmp_path, pp, vp, 200000)
    floor = work_bound_s(ctx)
    makespans = [makespan for _, _, makespan, _ in recompute_layouts[pp, vp]]
    assert floor <= min(makespans) * (1 + 1e-12)
    assert floor > 0.5 * min(makespans)


@pytest.mark.parametrize("memory_mib", [200000, 44000])
@pytest.mark.parametrize("time_limit_s", [0.02, 0.5, 20.0])
def test_two_phase_bound_is_the_free_search_own(tmp_path, recompute_layouts, memory_mib, time_limit_s):
    """`mofa solve --pipeline-layouts`' two phases with recompute: whatever the time limit,
    the free phase returns a proven bound (never 0, never above the least makespan over every
    fitting layout, enumerated) and says what proved it: CP-SAT where a round did, the work
    bound or the ranks' integer totals (rank_totals_bound: DeepSeek-V3's two kinds) where none
    could (the shortest limit); with time, it certifies the optimum."""
    ctx = recompute_context(tmp_path, 2, 2, memory_mib)
    fits = fitting(recompute_layouts[2, 2], ctx)
    best = min(makespan for _, _, makespan, _ in fits)
    seed = max(fits, key=lambda entry: entry[2])[0]  # the slowest layout that fits: an incumbent, far from the optimum
    first, second = two_phase(ctx, time_limit_s, 2, (seed,))
    assert second.fits and 0 < second.lower_bound_s <= best * (1 + 1e-9)
    assert second.bound_source in ("cp-sat", "work", "rank-totals")
    if second.bound_source == "cp-sat":
        assert second.rounds >= 1
    if time_limit_s >= 20:
        assert second.optimal and second.makespan_s == pytest.approx(best, rel=1e-6)


@pytest.mark.parametrize("memory_mib", [49000, 44000, 39000])
def test_fewest_recompute_fits(tmp_path, recompute_layouts, memory_mib):
    """fewest_recompute makes a layout fit (the exact model's test) with recomputed layers only
    where needed: none where it already fits; None exactly where even recomputing every layer
    does not fit (every layout at 39000 MiB); the uniform variant gives one N."""
    from costmodel.stage_layout import score_layout
    from optimizer.layout_linear import fewest_recompute

    ctx = recompute_context(tmp_path, 2, 2, memory_mib)
    for layout, *_ in recompute_layouts[2, 2][::97]:
        plain = layout.with_recompute([0] * 4)
        everything_fits = score_layout(ctx, plain.with_recompute(plain.decoders)).fits
        for uniform in (False, True):
            repaired = fewest_recompute(ctx, plain, uniform=uniform)
            assert (repaired is None) == (not everything_fits)
            if repaired is None:
                continue
            assert repaired.decoders == plain.decoders and score_layout(ctx, repaired).fits
            if score_layout(ctx, plain).fits:
                assert not repaired.any_recompute
            if uniform:
                assert repaired.uniform_recompute() is not None


# --- the rank-order region and the LP bound within it (one kind of layer) --------------------
# A 7- and 9-layer Llama 3.1 8B (dense layers only, an embedding and a large head): the
# free search's rank_order_region and lp_region_bound must hold for every layout, which these
# enumerate (up to C(9 + 7, 7) = 11,440 layouts, timed on the schedule graph).

TINY_DENSE = """name: tiny-dense
model: {preset: llama3.1-8b, num_layers: LAYERS}
hardware: h100-sxm
cluster: {num_gpus: 64, gpus_per_node: 8}
training: {global_batch_size: 64, seq_len: 4096, dtypes: {params: bf16, grads: bf16, optimizer: fp32}}
"""


def dense_context(tmp_path, pp, vp, layers=7, memory_mib=81559):
    path = tmp_path / f"tiny_dense_{layers}.yaml"
    path.write_text(TINY_DENSE.replace("LAYERS", str(layers)))
    problem = load_problem(str(path), [f"hardware.memory_mib={memory_mib}"])
    cfg = ConfigBatch.from_columns(64, tp=8, pp=pp, vp=vp, mbs=1, first_layers=1, last_layers=1, zero_stage=1)
    return layout_context(problem, cfg)


def graph_makespans(ctx):
    """(every layout's decoder counts [K, stage], its makespan on the schedule graph [K])."""
    import itertools

    import numpy as np

    from optimizer.layout_linear import LinearLayouts
    from optimizer.schedule_graph import schedule_graph

    n, stages = len(ctx.kind_of_layer), ctx.pp * ctx.vp
    decoders = []
    for bars in itertools.combinations(range(n + stages - 1), stages - 1):
        edges = (-1, *bars, n + stages - 1)
        decoders.append([b - a - 1 for a, b in zip(edges, edges[1:])])
    decoders = np.array(decoders)
    lin = LinearLayouts(ctx)
    forward, backward = lin.times(lin.run_counts(decoders))
    return decoders, schedule_graph(ctx).makespan(forward, backward)


@pytest.mark.parametrize("pp,vp,layers", [(4, 2, 7), (4, 2, 9), (2, 2, 7), (4, 1, 9)])
def test_rank_order_region_holds_for_every_layout(tmp_path, pp, vp, layers):
    """Every layout whose makespan is below the goal lies in rank_order_region's region (its
    ranks' decoder totals and stage 0 within the proven limits), and None comes only where no
    layout is below the goal; for goals from below the optimum to well above it. The region is
    no trivial one: just above the optimum it leaves most layouts out."""
    import numpy as np

    from optimizer.layout_bounds import rank_order_region

    ctx = dense_context(tmp_path, pp, vp, layers)
    decoders, makespans = graph_makespans(ctx)
    order = np.sort(np.unique(makespans))
    for goal in [order[0] * 0.999, order[0] * (1 + 1e-9), *order[[1, 5, 20, len(order) // 2]] * (1 + 1e-9), order[-1] * 1.01]:
        region = rank_order_region(ctx, goal)
        below = decoders[makespans < goal]
        if region is None:
            assert not len(below)
            continue
        assert all(region.contains(d) for d in below)
    tight = rank_order_region(ctx, order[0] * (1 + 1e-9))
    assert sum(tight.contains(d) for d in decoders) < 0.5 * len(decoders)


@pytest.mark.parametrize("pp,vp,layers", [(2, 2, 5), (2, 2, 8), (2, 3, 8), (2, 4, 8)])
def test_rank_0_starting_late_waits_for_the_ranks_before_it(tmp_path, pp, vp, layers):
    """The rank-order argument for rank 0 (rank_order_region), on every layout whose stage 0
    holds no decoder layer while rank 0 holds some: its first decoder stage is a later chunk's
    and the schedule graph's segment path through it is at least rank 0's work for every
    micro-batch less what may run outside the segment (its chunks before the last: the
    embedding and empty chunks) plus stage 0 and one layer per rank whose first decoder stage
    comes earlier (their forward for micro-batch 0 before, their backward for the last after).
    The least margin is under one layer's time, so an extra layer in the term would be wrong."""
    from optimizer.layout_linear import LinearLayouts
    from optimizer.schedule_graph import chunk_segments_hold

    ctx = dense_context(tmp_path, pp, vp, layers)
    m, stages = ctx.microbatches, pp * vp
    assert chunk_segments_hold(ctx.ops, pp, vp, m, ranks=[0])
    decoders, makespans = graph_makespans(ctx)
    lin = LinearLayouts(ctx)
    delta = float(lin.forward_s[0] + lin.backward_s[0])
    const = lin.const_forward_s + lin.const_backward_s
    margins = []
    for d, makespan in zip(decoders, makespans):
        if d[0] > 0 or d[0::pp].sum() == 0:
            continue
        first = [next((s for s in range(r, stages, pp) if d[s] > 0), stages) for r in range(pp)]
        before = sum(first[r] < first[0] for r in range(1, pp))
        term = m * (d[0::pp].sum() * delta + const[0::pp][-1]) + const[0] + delta * before
        margins.append((makespan - term) / delta)
    assert len(margins) > 10
    assert min(margins) >= -1e-9
    assert min(margins) < 1.0


@pytest.mark.parametrize("pp,vp,layers", [(4, 2, 7), (4, 2, 9), (2, 2, 7)])
def test_lp_region_bound_holds_for_every_layout(tmp_path, pp, vp, layers):
    """lp_region_bound's bound never exceeds the makespan of any layout in the region, and the
    paths it returns are cuts: as linear forms they never exceed any layout's makespan; on
    pp 2 x vp 2 it reaches the optimum (what certifies the free search there)."""
    import numpy as np

    from optimizer.layout_bounds import lp_region_bound, rank_order_region
    from optimizer.layout_linear import LinearLayouts

    ctx = dense_context(tmp_path, pp, vp, layers)
    lin = LinearLayouts(ctx)
    decoders, makespans = graph_makespans(ctx)
    forward, backward = lin.times(lin.run_counts(decoders))  # [stage, K]
    order = np.sort(np.unique(makespans))
    bounds = []
    for goal in (order[0] * (1 + 1e-9), order[min(20, len(order) - 1)] * (1 + 1e-9)):
        region = rank_order_region(ctx, goal)
        bound, paths = lp_region_bound(ctx, region, goal, time_limit_s=5.0)
        inside = np.array([region.contains(d) for d in decoders])
        assert bound is not None and bound <= makespans[inside].min() * (1 + 1e-12)
        for n_f, n_b in paths:
            assert (n_f @ forward + n_b @ backward <= makespans * (1 + 1e-12)).all()
        bounds.append(bound)
    if (pp, vp) == (2, 2):
        assert bounds[0] >= order[0] * (1 - 1e-9)


def test_the_region_lp_is_skipped_where_a_layout_that_breaks_the_memory_beats_the_goal(tmp_path, monkeypatch):
    """At 5,000 MiB the fastest layout of the 9-layer model (pp 4 x vp 2) does not fit, and 28
    of the 11,440 do. Given it as a seed, the search knows a layout below any goal that fitting
    layouts can reach; the region holds every layout below the goal with memory relaxed, and
    the LP's value at it is at most its makespan, so the LP cannot certify and region_bound is
    not called. The search still returns the enumerated optimum of the layouts that fit."""
    import numpy as np

    from costmodel.stage_layout import StageLayout
    from optimizer import layout_search
    from optimizer.layout_linear import LinearLayouts

    ctx = dense_context(tmp_path, 4, 2, 9, memory_mib=5000)
    lin = LinearLayouts(ctx)
    decoders, makespans = graph_makespans(ctx)
    fits = lin.fits(lin.run_counts(decoders))
    assert 0 < fits.sum() < 100 and not fits[np.argmin(makespans)]
    fastest = StageLayout(pp=4, vp=2, decoders=tuple(int(x) for x in decoders[np.argmin(makespans)]), mtp=ctx.mtp_on_last)
    calls = []
    real = layout_search.region_bound
    monkeypatch.setattr(layout_search, "region_bound", lambda *a, **k: calls.append(1) or real(*a, **k))
    sol = layout_search.solve_layout(ctx, 10.0, 2, seeds=(fastest,))
    assert sol.fits and sol.makespan_s == pytest.approx(makespans[fits].min(), rel=1e-9)
    assert sol.makespan_s > makespans.min() * (1 + 1e-6)
    assert not calls


def test_lp_region_bound_needs_one_kind(tmp_path):
    """With two kinds of layers (dense then MoE) the LP would lose their order: no bound."""
    from optimizer.layout_bounds import RankRegion, lp_region_bound

    ctx = context(tmp_path, 2, 2, 81559)
    assert lp_region_bound(ctx, RankRegion((0, 0), (7, 7), 7), 1.0) == (None, [])


def test_least_in_region_is_the_minimum():
    """_least_in_region (the exact inner minimum of the LP bound) equals brute force over every
    integer layer vector, for random stage costs, rank limits, per-stage limits and stage 0's cap."""
    import itertools

    import numpy as np

    from optimizer.layout_bounds import RankRegion, _least_in_region

    rng = np.random.default_rng(7)
    pp, stages, n = 2, 6, 7
    for _ in range(60):
        cost = rng.uniform(0.0, 5.0, stages)
        low_rank = rng.integers(0, 4, pp)
        region = RankRegion(tuple(int(x) for x in low_rank), tuple(int(x) for x in low_rank + rng.integers(0, 5, pp)), int(rng.integers(0, 4)))
        low = np.full(stages, float(rng.integers(0, 2)))
        cap = np.full(stages, float(rng.integers(1, 5)))
        cap[0] = min(cap[0], region.stage0_high)
        best = np.inf
        for x in itertools.product(*(range(int(low[s]), int(cap[s]) + 1) for s in range(stages))):
            x = np.array(x)
            totals = [x[r::pp].sum() for r in range(pp)]
            if x.sum() == n and all(lo <= t <= hi for lo, t, hi in zip(region.low, totals, region.high)):
                best = min(best, float(cost @ x))
        assert _least_in_region(cost, region, low, cap, n) == pytest.approx(best, rel=1e-12) if np.isfinite(best) else \
            _least_in_region(cost, region, low, cap, n) == np.inf


@pytest.mark.parametrize("schedule,pp,vp,m", [("1f1b", 4, 1, 6), ("interleaved_1f1b", 4, 2, 8), ("interleaved_1f1b", 4, 3, 16),
                                              ("interleaved_1f1b", 2, 4, 4)])
def test_chunk_segments_hold(schedule, pp, vp, m):
    """Megatron's lists keep a rank's later chunks inside each chunk's (first forward, last
    backward) segment, which the rank-order argument needs; a list that runs a later chunk's
    forward after that segment does not."""
    from costmodel.schedule_sim import schedule_ops
    from optimizer.schedule_graph import chunk_segments_hold

    ops = schedule_ops(schedule, pp, vp, m)
    assert chunk_segments_hold(ops, pp, vp, m)
    if vp > 1:
        rank_ops = list(ops[1])
        late = next(i for i, op in enumerate(rank_ops) if op.kind == "F" and op.stage // pp == vp - 1)
        rank_ops.append(rank_ops.pop(late))  # that forward now runs last
        assert not chunk_segments_hold([ops[0], rank_ops, *ops[2:]], pp, vp, m)


@pytest.mark.parametrize("pp,vp", [(2, 2), (4, 1)])
@pytest.mark.parametrize("memory_mib", [81559, 5000])  # 5000 MiB: the fastest pp 2 x vp 2 layout (5.1 GiB) does not fit
@pytest.mark.parametrize("time_limit_s", [0.05, 20.0])
def test_dense_free_search_bound_holds(tmp_path, pp, vp, memory_mib, time_limit_s):
    """One kind of layer, so the free search runs rank_order_region and lp_region_bound: its
    proven bound never exceeds the makespan of any layout that fits (exact model, every layout
    enumerated), cut short or not; with time it certifies enumeration's optimum, with no CP-SAT
    round where memory does not bind (the region's LP reaches it), with CP-SAT rounds over the
    region's rows and memory rows where it does (5000 MiB on pp 2 x vp 2)."""
    ctx = dense_context(tmp_path, pp, vp, 7, memory_mib)
    best, _ = best_by_enumeration(ctx, "makespan")
    seeds = tuple(layout for layout, score in enumerate_layouts(ctx) if score.fits)[-1:]
    solution = solve_layout(ctx, time_limit_s=time_limit_s, seeds=seeds)
    assert solution.fits
    assert solution.lower_bound_s <= best * (1 + 1e-9)
    assert best <= solution.makespan_s * (1 + 1e-12)
    if time_limit_s >= 20:
        assert solution.optimal and solution.makespan_s == pytest.approx(best, rel=1e-6)
        if memory_mib == 81559:
            assert solution.bound_source == "rank-lp" and solution.rounds == 0


# --- recompute as a yes/no per rank (recompute_split_bound) -----------------------------------


@pytest.mark.parametrize("pp,vp", [(2, 2), (4, 1)])
@pytest.mark.parametrize("memory_mib", [200000, 49000, 44000, 41000])
def test_recompute_split_bound_holds_for_every_layout(tmp_path, recompute_layouts, pp, vp, memory_mib):
    """recompute_split_bound never exceeds the least simulated makespan over every fitting layout
    and recompute vector (enumerated), for goals from the optimum to the slowest fitting layout,
    and proves the goal where it returns it; the paths it returns are cuts (never above any
    layout's makespan). recomputing_ranks holds every rank that recomputes and does not fit
    without it in a fitting layout below the goal. At 200000 MiB (nothing needs recompute) it
    certifies the optimum."""
    import numpy as np

    from costmodel.stage_layout import score_layout
    from optimizer.layout_bounds import recompute_split_bound, recomputing_ranks
    from optimizer.layout_linear import LinearLayouts

    ctx = recompute_context(tmp_path, pp, vp, memory_mib)
    lin = LinearLayouts(ctx)
    fits = fitting(recompute_layouts[pp, vp], ctx)
    if not fits:
        return
    best = min(makespan for _, _, makespan, _ in fits)
    slowest = max(fits, key=lambda entry: entry[2])
    everything = [layout for layout, *_ in recompute_layouts[pp, vp]]
    counts, recomputed = lin.layout_counts(np.array([layout.decoders + layout.recompute for layout in everything]))
    forward, backward = lin.times(counts, recomputed)
    makespans = np.array([makespan for _, _, makespan, _ in recompute_layouts[pp, vp]])
    plain_rows = lin.rank_rows(counts, None)
    for goal in (best * (1 + 1e-9), slowest[2]):
        bound, paths = recompute_split_bound(ctx, goal, time_limit_s=10.0, hint=min(fits, key=lambda e: e[2])[0])
        assert bound is not None and bound <= best * (1 + 1e-9)
        for n_f, n_b in paths:
            assert (n_f @ forward + n_b @ backward <= makespans * (1 + 1e-12)).all()
        ranks = recomputing_ranks(ctx, goal, lin)
        for k, (layout, peak, makespan, _) in enumerate(recompute_layouts[pp, vp]):
            if peak > ctx.problem.hardware.memory_bytes or makespan >= goal:
                continue
            for r in range(pp):
                if any(layout.recompute[r::pp]) and plain_rows[r][k].max() > ctx.problem.hardware.memory_bytes:
                    assert r in ranks
        if memory_mib == 200000 and goal < slowest[2]:
            assert bound == pytest.approx(best, rel=1e-6)
    assert score_layout(ctx, slowest[0]).fits


# --- a seed where no given layout fits (round_seeds) --------------------------------------------


@pytest.mark.parametrize("pp,vp", [(4, 2), (2, 2)])
def test_round_seed_fits_where_the_even_split_does_not(tmp_path, pp, vp):
    """At a capacity between the least peak of any layout and the even split's peak, round_seeds'
    best (last) answer is a layout that passes the linear memory test and the exact model's, the
    same answers on every call (one worker, a deterministic time limit), and the free search
    that starts from them returns a layout that fits; below the least peak there is no answer."""
    import numpy as np

    from costmodel.stage_layout import balanced_layout, score_layout
    from costmodel.units import MIB
    from optimizer.layout_linear import LinearLayouts
    from optimizer.layout_seeds import round_seed_pair, round_seeds

    roomy = dense_context(tmp_path, pp, vp, 9)
    peaks = [float(score.peak_bytes.max()) for _, score in enumerate_layouts(roomy)]
    even = balanced_layout(9, 0, pp, vp)
    even_peak = float(score_layout(roomy, even).peak_bytes.max())
    assert min(peaks) < even_peak
    ctx = dense_context(tmp_path, pp, vp, 9, int((min(peaks) + even_peak) / 2 / MIB))
    assert not score_layout(ctx, even).fits
    lin = LinearLayouts(ctx)
    answers = round_seeds(ctx, lin, 1.0)
    seed = answers[-1]
    assert answers == round_seeds(ctx, lin, 1.0)
    # the two solves side by side give what they give one after the other
    assert round_seed_pair(ctx, lin, 1.0) == answers + round_seeds(ctx, lin, 1.0, random_seed=1)
    assert lin.fits(*lin.layout_counts(np.array(seed.decoders + seed.recompute)[None]))[0]
    assert score_layout(ctx, seed).fits
    # every answer of the solve is a start for the local search: each within the memory rows
    assert lin.fits(*lin.layout_counts(np.array([a.decoders + a.recompute for a in answers]))).all()
    assert solve_layout(ctx, time_limit_s=2.0, seeds=(even,)).fits
    tight = dense_context(tmp_path, pp, vp, 9, int(min(peaks) / MIB) - 64)
    assert round_seeds(tight, LinearLayouts(tight), 1.0) == []


@pytest.mark.parametrize("pp,vp", [(4, 2), (2, 2)])
def test_fill_seed_fits_where_the_even_split_does_not(tmp_path, pp, vp):
    """At a capacity between the least peak of any layout and the even split's peak, fill_seed
    pours the layers into the ranks that still fit one more: every layer placed, a layout that
    passes the linear memory test and the exact model's, the same on every call; below the least
    peak it finds none."""
    import numpy as np

    from costmodel.stage_layout import balanced_layout, score_layout
    from costmodel.units import MIB
    from optimizer.layout_linear import LinearLayouts
    from optimizer.layout_seeds import fill_seed

    roomy = dense_context(tmp_path, pp, vp, 9)
    peaks = [float(score.peak_bytes.max()) for _, score in enumerate_layouts(roomy)]
    even = balanced_layout(9, 0, pp, vp)
    ctx = dense_context(tmp_path, pp, vp, 9, int((min(peaks) + float(score_layout(roomy, even).peak_bytes.max())) / 2 / MIB))
    assert not score_layout(ctx, even).fits
    lin = LinearLayouts(ctx)
    seed = fill_seed(ctx, lin)
    assert seed == fill_seed(ctx, lin) and sum(seed.decoders) == 9
    assert lin.fits(*lin.layout_counts(np.array(seed.decoders + seed.recompute)[None]))[0]
    assert score_layout(ctx, seed).fits
    tight = dense_context(tmp_path, pp, vp, 9, int(min(peaks) / MIB) - 64)
    assert fill_seed(tight, LinearLayouts(tight)) is None


# --- the fewest recomputed layers a rank needs at each layer total (least_recompute) ----------
# The 7-layer Llama 3.1 8B at 32K tokens on pp 2 x vp 2 with full recompute per stage: at 12000
# MiB and below a rank holding many layers must recompute some of them.

def dense_recompute_context(tmp_path, memory_mib):
    path = tmp_path / "tiny_dense_recompute.yaml"
    path.write_text(TINY_DENSE.replace("LAYERS", "7").replace("seq_len: 4096", "seq_len: 32768"))
    problem = load_problem(str(path), [f"hardware.memory_mib={memory_mib}"])
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, mbs=1, first_layers=1, last_layers=1, zero_stage=1,
                                   recompute=2, recompute_method=1, recompute_layers=1)
    return layout_context(problem, cfg)


@pytest.fixture(scope="module")
def dense_recompute_layouts(tmp_path_factory):
    """Every layout and recompute vector of the dense pp 2 x vp 2 instance (3432), with its
    decoder and recompute counts and its simulated makespan, scored at a roomy capacity."""
    ctx = dense_recompute_context(tmp_path_factory.mktemp("drc"), 200000)
    return [(layout, s.peak_bytes, s.pipeline_s - s.pp_exposed_s) for layout, s in enumerate_layouts(ctx)]


@pytest.mark.parametrize("spread", [None, 1])
@pytest.mark.parametrize("memory_mib", [12000, 10000, 8000])
def test_least_recompute_is_each_ranks_fewest(tmp_path, dense_recompute_layouts, memory_mib, spread):
    """least_recompute's table is, per rank and layer total, the fewest layers recomputed by
    any chunk split (with `spread`, regular ones: chunks within that many layers) and
    recompute vector of that rank that passes its linear memory rows (brute force over the
    rank's own choices), never more than what a layout that fits (the exact model, every
    layout enumerated; with `spread`, every regular one) recomputes on that rank, and
    non-decreasing; it ends where no recompute fits the total."""
    import itertools

    import numpy as np

    from optimizer.layout_linear import LinearLayouts, least_recompute

    ctx = dense_recompute_context(tmp_path, memory_mib)
    lin = LinearLayouts(ctx)
    pp, vp, n = ctx.pp, ctx.vp, len(ctx.kind_of_layer)
    capacity = ctx.problem.hardware.memory_bytes
    for r in range(pp):
        table = least_recompute(ctx, lin, r, n, spread)
        assert all(a <= b for a, b in zip(table, table[1:]))
        for total in range(n + 1):
            fewest = None
            for split in itertools.product(range(total + 1), repeat=vp):
                if sum(split) != total or (spread is not None and max(split) - min(split) > spread):
                    continue
                for rec in itertools.product(*(range(c + 1) for c in split)):
                    decoders, recompute = np.zeros(pp * vp, dtype=int), np.zeros(pp * vp, dtype=int)
                    decoders[r::pp], recompute[r::pp] = split, rec
                    counts, recomputed = lin.layout_counts(np.concatenate([decoders, recompute])[None])
                    if lin.rank_rows(counts, recomputed)[r][0].max() <= capacity and (fewest is None or sum(rec) < fewest):
                        fewest = sum(rec)
            if fewest is None:
                assert total >= len(table)
            else:
                assert table[total] == fewest
        for layout, peak, _ in dense_recompute_layouts:
            if peak.max() <= capacity and (spread is None or regular(layout, spread)):
                total = sum(layout.decoders[r::pp])
                assert total < len(table) and sum(layout.recompute[r::pp]) >= table[total]


@pytest.mark.parametrize("memory_mib", [12000, 10000, 8000])
def test_recompute_search_with_rank_tables_matches_enumeration(tmp_path, dense_recompute_layouts, memory_mib):
    """One kind of layer with per-stage recompute, where the search adds least_recompute's tables
    (element constraints and their convex envelopes) to CP-SAT and to the rank region: free and
    regular searches certify enumeration's least simulated makespan, and their bounds hold."""
    ctx = dense_recompute_context(tmp_path, memory_mib)
    capacity = ctx.problem.hardware.memory_bytes
    fits = [(layout, makespan) for layout, peak, makespan in dense_recompute_layouts if peak.max() <= capacity]
    best = min(makespan for _, makespan in fits)
    best_regular = min(makespan for layout, makespan in fits if regular(layout, 1))
    for spread, target in ((None, best), (1, best_regular)):
        solution = solve_layout(ctx, time_limit_s=20, chunk_spread=spread)
        assert solution.optimal and solution.fits
        assert solution.makespan_s == pytest.approx(target, rel=1e-6)
        assert solution.lower_bound_s <= target * (1 + 1e-9)


def test_lower_envelope_lies_under_every_point():
    """The convex envelope's segments: consecutive hull points, every value on or above each
    segment's line, and the hull's corners among the values."""
    from optimizer.layout_linear import lower_envelope

    values = (0, 0, 0, 1, 2, 4, 5, 6, 9)
    segments = lower_envelope(values)
    assert segments[0][0] == (0, 0) and segments[-1][1] == (8, 9)
    for (x1, y1), (x2, y2) in segments:
        assert x1 < x2 and values[x1] == y1 and values[x2] == y2
        assert all((x2 - x1) * y >= (y2 - y1) * x + (y1 * x2 - y2 * x1) for x, y in enumerate(values))
    assert [a for a, _ in segments] == [(0, 0), (2, 0), (4, 2), (7, 6)]


def test_packed_seeds_hold_every_layer_in_each_ranks_last_chunks(tmp_path):
    """packed_seeds: for k = 1 .. vp, every layer in the last k chunks of the ranks, spread by
    count (within one layer), each stage recomputing min(N, its layers) for each N."""
    from optimizer.layout_seeds import packed_seeds

    ctx = dense_recompute_context(tmp_path, 200000)
    n, pp, vp = len(ctx.kind_of_layer), ctx.pp, ctx.vp
    seeds = packed_seeds(ctx, (1, 2))
    assert len(seeds) == len(set(seeds)) and {tuple(min(2, d) for d in s.decoders) for s in seeds} <= {s.recompute for s in seeds}
    for seed in seeds:
        sizes = seed.decoders
        assert sum(sizes) == n and seed.mtp == (0,) * (pp * vp - 1) + (ctx.problem.model.mtp_layers,)
        level = max(seed.recompute)
        assert seed.recompute == tuple(min(level, d) for d in sizes)
        # some k: the first vp - k chunks empty, the last k even by count, the extra layers first
        assert any(not any(sizes[:(vp - k) * pp]) and max(sizes[(vp - k) * pp:]) - min(sizes[(vp - k) * pp:]) <= 1
                   and list(sizes[(vp - k) * pp:]) == sorted(sizes[(vp - k) * pp:], reverse=True) for k in range(1, vp + 1))
    assert {sum(1 for d in seed.decoders if d) for seed in seeds} == {pp * k for k in range(1, vp + 1)}


def test_a_larger_space_bound_carries_over():
    """within_superset: the per-stage search's bound holds for the one-N layouts; it replaces a
    lower one, certifies an answer it reaches, and never lowers a bound."""
    from optimizer.layout_rounds import LayoutSolution
    from optimizer.layout_report import within_superset

    layout = StageLayout.from_stage_sizes(2, 1, [2, 2], 0)
    one_n = LayoutSolution(layout, 10.0, 9.0, 9.0, 7.0, False, 1.0, True, 1, "cp-sat")
    per_stage = dataclasses.replace(one_n, lower_bound_s=8.0)
    raised = within_superset(one_n, per_stage)
    assert raised.lower_bound_s == 8.0 and raised.bound_source == "per-stage" and not raised.optimal
    assert raised.gap == pytest.approx(1 / 9)
    certified = within_superset(one_n, dataclasses.replace(one_n, lower_bound_s=9.0))
    assert certified.optimal and certified.gap == 0.0
    assert within_superset(one_n, dataclasses.replace(one_n, lower_bound_s=6.0)) is one_n


@pytest.mark.parametrize("instance,memory_mib", [("moe", 200000), ("moe", 44000), ("dense", 12000), ("dense", 10000), ("dense", 8000)])
def test_level_work_bounds_hold_for_every_layout(tmp_path, recompute_layouts, dense_recompute_layouts, instance, memory_mib):
    """level_work_bounds: for each N, no layout whose stages recompute min(N, layers) and that
    fits (the exact model, every layout enumerated) has a simulated makespan below N's bound,
    with the ranks' memory tables (one kind of layer) or without (two kinds); and the bound
    says more than work_bound_s for the N that recompute. level_range keeps every N some
    layout below the goal has, and its least bound lies under every such layout."""
    from optimizer.layout_bounds import level_range, level_work_bounds, work_bound_s
    from optimizer.layout_linear import LinearLayouts, least_recompute

    if instance == "moe":
        ctx = recompute_context(tmp_path, 2, 2, memory_mib)
        layouts = [(layout, peak, makespan) for layout, peak, makespan, _ in recompute_layouts[2, 2]]
        tables = None
    else:
        ctx = dense_recompute_context(tmp_path, memory_mib)
        layouts = [(layout, peak.max(), makespan) for layout, peak, makespan in dense_recompute_layouts]
    lin = LinearLayouts(ctx)
    n = len(ctx.kind_of_layer)
    if instance == "dense":
        tables = [least_recompute(ctx, lin, r, n) for r in range(ctx.pp)]
    fits = [(layout, makespan) for layout, peak, makespan in layouts if peak <= ctx.problem.hardware.memory_bytes]
    assert fits
    bounds = level_work_bounds(ctx, lin, range(n + 1), tables)
    assert sorted(bounds) == list(range(n + 1))
    floor = work_bound_s(ctx, lin)
    assert max(bounds.values()) > floor * 1.01
    checked = 0
    for level in range(n + 1):
        for layout, makespan in fits:
            if layout.recompute == tuple(min(level, d) for d in layout.decoders):
                assert makespan >= bounds[level] * (1 - 1e-12)
                checked += 1
    assert checked
    best = min(makespan for layout, makespan in fits if layout.uniform_recompute() is not None)
    goal = best * 1.05
    open_levels, least = level_range(ctx, lin, goal, n, tables)
    for level in range(n + 1):
        if any(makespan < goal and layout.recompute == tuple(min(level, d) for d in layout.decoders) for layout, makespan in fits):
            assert level in open_levels
    assert least <= best * (1 + 1e-12)


def test_one_n_search_without_recompute_where_every_n_is_out(tmp_path, recompute_layouts):
    """Where the ranks' busy time rules out every N >= 1 against the incumbent, the search with
    one N is the search without recompute: it certifies enumeration's least makespan among the
    layouts that recompute nothing, says so (bound_source "levels"), and returns a layout that
    recomputes nothing."""
    from optimizer.layout_bounds import level_range
    from optimizer.layout_linear import LinearLayouts

    ctx = recompute_context(tmp_path, 2, 2, 200000)
    lin = LinearLayouts(ctx)
    fits = fitting(recompute_layouts[2, 2], ctx)
    best = min(makespan for layout, _, makespan, _ in fits if not layout.any_recompute)
    n = len(ctx.kind_of_layer)
    open_levels, _ = level_range(ctx, lin, best, n)
    assert open_levels == [0]  # the instance is chosen so: what the test is about
    assert min(makespan for layout, _, makespan, _ in fits if layout.uniform_recompute() is not None) == pytest.approx(best, rel=1e-9)
    solution = solve_layout(ctx, time_limit_s=20, uniform_recompute=True)
    assert solution.optimal and solution.bound_source == "levels"
    assert not solution.layout.any_recompute
    assert solution.makespan_s == pytest.approx(best, rel=1e-6)


def test_the_regular_answer_takes_the_free_searchs_bound():
    """The regular layouts are among the free ones: a bound the free search proves holds for the
    regular answer too (within_superset, source "free"), which is then certified where that bound
    meets its makespan; a lower free bound changes nothing."""
    from optimizer.layout_rounds import LayoutSolution
    from optimizer.layout_report import within_superset

    layout = StageLayout.from_stage_sizes(2, 1, [3, 4], 0)
    regular_answer = LayoutSolution(layout, 10.5, 10.0, 9.0, 9.5, False, 1.0, True, 3)
    free = dataclasses.replace(regular_answer, lower_bound_s=9.8, makespan_s=9.9)
    taken = within_superset(regular_answer, free, "free")
    assert taken.lower_bound_s == 9.8 and taken.bound_source == "free" and not taken.optimal
    assert within_superset(regular_answer, dataclasses.replace(free, lower_bound_s=10.0), "free").optimal
    assert within_superset(regular_answer, dataclasses.replace(free, lower_bound_s=9.0), "free") == regular_answer


def test_the_step_floor_leaves_memory_out_where_the_linear_model_does_not_hold():
    """A single stage under ZeRO-3 (its gradient window of two layers is not linear in the
    layers: LinearLayouts refuses it, layout_report enumerates it) whose answer updates more than
    the floor: step_floor_s falls back to the floor without memory instead of raising."""
    import os

    from costmodel.stage_layout import step_overhead_floor_s
    from optimizer.layout_linear import LinearLayouts
    from optimizer.layout_rounds import LayoutSolution
    from optimizer.layout_report import own_layout, step_floor_s

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    problem = load_problem(os.path.join(root, "problems/tuning/llama2_70b_128gpu.yaml"), ["tp=1", "pp=1", "mbs=2", "zero_stage=3"])
    ctx = layout_context(problem, ConfigBatch.from_specs(problem, [problem.config]))
    with pytest.raises(LayoutError):
        LinearLayouts(ctx)
    plain = step_overhead_floor_s(ctx)
    busy = LayoutSolution(own_layout(ctx), 12.0 + 2 * plain + 1.0, 12.0, 12.0, 12.0, True, 0.0, True, 0)
    assert step_floor_s(ctx, [busy]) == plain


def test_every_bound_source_has_a_note():
    """Whatever proved a layout's bound, the report says it in words (layout_report's notes);
    a source the notes lack once raised a KeyError in `mofa solve --pipeline-layouts` where
    relaxed_bound proved the bound (ZeRO-2/3 skeletons), and LayoutSolution now refuses one."""
    import dataclasses

    from optimizer.layout_report import _BOUND_NOTES
    from optimizer.layout_rounds import BOUND_SOURCES, LayoutSolution

    assert set(BOUND_SOURCES) <= set(_BOUND_NOTES)
    solution = LayoutSolution(None, 1.0, 1.0, 1.0, 1.0, True, 0.0, True, 0)
    with pytest.raises(ValueError, match="unknown bound source"):
        dataclasses.replace(solution, bound_source="guess")


@pytest.mark.parametrize("memory_mib", [81559, 39000, 38500, 38000, 36000])
def test_no_regular_layout_fits_by_the_rank_totals(tmp_path, memory_mib):
    """rank_order_region with the ranks' memory and no makespan goal is infeasible only where
    no layout of its space passes the linear memory test (every layout of DeepSeek-V3's kinds
    on pp 2 x vp 2 enumerated, regular and free); where it proves that for regular layouts,
    solve_layout over them says no layout fits before any start or CP-SAT round; and it proves
    it at 36000 MiB, where nothing fits."""
    import numpy as np

    from optimizer.layout_bounds import rank_order_region
    from optimizer.layout_linear import LinearLayouts
    from optimizer.layout_rounds import regular
    from optimizer.layout_search import NO_GOAL_S

    ctx = context(tmp_path, 2, 2, memory_mib)
    lin = LinearLayouts(ctx)
    layouts = [layout for layout, _ in enumerate_layouts(ctx)]
    fits = lin.fits(lin.layout_counts(np.array([layout.decoders + layout.recompute for layout in layouts]))[0])
    for spread in (None, 1):
        space = np.array([spread is None or regular(layout, spread) for layout in layouts])
        none_fits = rank_order_region(ctx, NO_GOAL_S, lin, time_limit_s=5.0, feasibility_only=True, spread=spread, memory=True) is None
        assert not (none_fits and (fits & space).any())
        if memory_mib == 36000:
            assert none_fits and not fits.any()
        if none_fits and spread == 1:  # said by the rank totals, before any start or CP-SAT round
            with pytest.raises(LayoutError, match="no rank's layer total fits its memory"):
                solve_layout(ctx, time_limit_s=10, chunk_spread=1)
