"""The layout search (optimizer.layout_search) against its oracles: plain enumeration of every
layout and the stage dynamic program (MPE eq. 3), on a 7-layer DeepSeek-V3 (3 dense + 4 MoE
layers and its MTP module: two kind runs) small enough to enumerate, with GPU capacities from
roomy to tight so that memory binds and, at the smallest, nothing fits."""

import pytest

from costmodel.configs import ConfigBatch
from costmodel.loader import load_problem
from costmodel.stage_layout import LayoutError, layout_context
from optimizer.layout_search import dp_layout, enumerate_layouts, kind_runs, regular, solve_layout, two_phase

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
    from optimizer.layout_search import critical_path

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
    from optimizer.layout_search import segment_paths

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


@pytest.mark.parametrize("memory_mib", [81559, 39000])
def test_regular_layouts(tmp_path, memory_mib):
    """chunk_spread=1 finds the best layout among those whose chunks on one rank differ by at
    most one layer (enumeration restricted the same way); two_phase is never worse than it."""
    ctx = context(tmp_path, 2, 2, memory_mib)
    scored = [(s.pipeline_s - s.pp_exposed_s, lay) for lay, s in enumerate_layouts(ctx) if s.fits and regular(lay, 1)]
    best = min(v for v, _ in scored)
    solution = solve_layout(ctx, time_limit_s=20, chunk_spread=1)
    assert solution.optimal and regular(solution.layout, 1)
    assert solution.makespan_s == pytest.approx(best, rel=1e-6)
    first, second = two_phase(ctx, 20, 2, ())
    assert second.makespan_s <= first.makespan_s * (1 + 1e-12)
