"""bench/layout_proof.py's relaxations against brute force: the LP of the whole event graph,
with the memory rows read off LinearLayouts.rank_rows and least_recompute's tables, on the
7-layer Llama 3.1 8B at 32K tokens on pp 2 x vp 2 with per-stage recompute (3432 layouts and
recompute vectors, every one scored), at capacities where memory forces recompute. The proof
in docs/pipeline_layouts.md ("Proven offline") rests on two properties checked here: with
every count fixed the LP is that layout's makespan (or infeasible where it does not fit), and
with a stage forced above k layers its value is below every fitting layout that has such a
stage. The same program solved as a MIP (event_mip, bench/layout_gaps.py's measurement) is the
least makespan of every layout that fits, with recompute and without."""

import importlib.util

import numpy as np
import pytest

from conftest import ROOT
from costmodel.configs import ConfigBatch
from costmodel.loader import load_problem
from costmodel.stage_layout import layout_context
from optimizer.layout_linear import LinearLayouts, least_recompute
from optimizer.schedule_graph import schedule_graph

TINY_DENSE = """name: tiny-dense
model: {preset: llama3.1-8b, num_layers: 7}
hardware: h100-sxm
cluster: {num_gpus: 64, gpus_per_node: 8}
training: {global_batch_size: 64, seq_len: 32768, dtypes: {params: bf16, grads: bf16, optimizer: fp32}}
"""


def proof_module():
    spec = importlib.util.spec_from_file_location("layout_proof", ROOT / "bench" / "layout_proof.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def instance(tmp_path, memory_mib, recompute=True):
    path = tmp_path / "tiny_dense_recompute.yaml"
    path.write_text(TINY_DENSE)
    problem = load_problem(str(path), [f"hardware.memory_mib={memory_mib}"])
    full = dict(recompute=2, recompute_method=1, recompute_layers=1) if recompute else {}
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, mbs=1, first_layers=1, last_layers=1, zero_stage=1, **full)
    ctx = layout_context(problem, cfg)
    lin = LinearLayouts(ctx)
    n = len(ctx.kind_of_layer)
    tables = [least_recompute(ctx, lin, r, n) for r in range(ctx.pp)]
    return ctx, lin, schedule_graph(ctx), tables


def every_vector(stages, n):
    """Every (layers, recomputed layers) vector of n layers over the stages."""
    import itertools

    for bars in itertools.combinations(range(n + stages - 1), stages - 1):
        sizes = np.diff(np.concatenate([[-1], bars, [n + stages - 1]])) - 1
        for again in itertools.product(*(range(d + 1) for d in sizes)):
            yield np.concatenate([sizes, again]).astype(np.int64)


@pytest.fixture(scope="module")
def proof():
    return proof_module()


@pytest.mark.parametrize("memory_mib", [12000, 10000])
def test_event_lp_is_each_layouts_makespan_and_bounds_the_big_stages(tmp_path, proof, memory_mib):
    ctx, lin, graph, tables = instance(tmp_path, memory_mib)
    stages, n = lin.stages, len(ctx.kind_of_layer)
    vectors = np.array(list(every_vector(stages, n)))
    counts, recomputed = lin.layout_counts(vectors)
    fits = lin.fits(counts, recomputed)
    makespan = graph.makespan(*lin.times(counts, recomputed))
    assert 0 < fits.sum() < len(vectors)  # memory binds: some layouts fit, some do not

    # the memory rows read off rank_rows are rank_rows, on every vector
    constants, coefficients, owner = proof.memory_rows(ctx, lin)
    recomputes = np.stack([vectors[:, stages + ctx.stages_of[r]].sum(axis=1) > 0 for r in range(ctx.pp)], axis=1)
    mine = constants[None, :] + np.concatenate([vectors, recomputes], axis=1) @ coefficients.T
    truth = np.concatenate(lin.rank_rows(counts, recomputed), axis=1)
    assert mine == pytest.approx(truth, rel=1e-9, abs=1.0)

    most = max(len(t) for t in tables) - 1
    least_makespan = proof.event_lp(ctx, lin, graph, tables, most)
    rng = np.random.default_rng(0)
    within = vectors.max(axis=1) <= most
    for i in np.concatenate([rng.choice(np.flatnonzero(fits), 8, replace=False), rng.choice(np.flatnonzero(~fits & within), 4, replace=False)]):
        value = least_makespan(vectors[i], vectors[i])  # every count fixed
        if fits[i]:
            assert value == pytest.approx(makespan[i], rel=1e-6)
        else:
            assert value == float("inf")
    for k in (1, 2):
        for s in range(stages):
            low = np.zeros(2 * stages)
            low[s] = k + 1
            bound = least_makespan(low)
            above = fits & (vectors[:, s] >= k + 1)
            if above.any():
                assert bound <= makespan[above].min() * (1 + 1e-7)


@pytest.mark.parametrize("memory_mib,recompute", [(12000, True), (10000, True), (14000, False)])
def test_event_mip_is_the_least_makespan_of_every_layout_that_fits(tmp_path, proof, memory_mib, recompute):
    ctx, lin, graph, tables = instance(tmp_path, memory_mib, recompute)
    stages, n = lin.stages, len(ctx.kind_of_layer)
    vectors = np.array(list(every_vector(stages, n)))
    if not recompute:
        vectors = vectors[vectors[:, stages:].sum(axis=1) == 0]
    counts, recomputed = lin.layout_counts(vectors)
    recomputed = recomputed if recompute else None
    fits = lin.fits(counts, recomputed)
    makespan = graph.makespan(*lin.times(counts, recomputed))
    assert 0 < fits.sum() < len(vectors)  # memory binds: some layouts fit, some do not
    most = max(len(t) for t in tables) - 1 if recompute else n
    within = vectors[:, :stages].max(axis=1) <= most
    best = makespan[fits & within].min()
    value, bound, layout = proof.event_mip(ctx, lin, graph, tables if recompute else None, most, time_limit_s=60.0)
    assert value == pytest.approx(best, rel=1e-6)
    assert bound <= best * (1 + 1e-9) and bound >= best * (1 - 2e-4)  # HiGHS' default relative gap, 1e-4
    counts, again = lin.layout_counts(layout[None])
    assert lin.fits(counts, again if recompute else None)[0]
    assert graph.makespan(*lin.times(counts, again if recompute else None))[0] == pytest.approx(best, rel=1e-6)
