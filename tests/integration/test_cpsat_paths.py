"""cpsat picks its path up front (optimizer.cpsat.choose_path): exhaustive scoring where scoring
every leaf costs less than building the tables, the tables (bound-ordered scoring, or the
CP-SAT model) where they cost less. The choice is reported in stats["path"], is deterministic
(counts and a fixed sample, no clock), and every path gives exhaustive's answer;
test_search_agreement checks each path on the corner-case problems."""

import math

import numpy as np
import pytest
import yaml

import optimizer.cpsat
from conftest import PROBLEMS
from costmodel.loader import load_problem
from optimizer.cpsat import build_tables, choose_path, enumeration_work, table_work
from optimizer.result import floor_objective
from optimizer.search import solve
from optimizer.space import SearchSpace

DENSE = {
    "model": {"preset": "llama3.1-8b", "num_layers": 16},
    "hardware": "h100-sxm",
    "cluster": {"num_gpus": 16, "gpus_per_node": 8},
    "training": {"global_batch_size": 32, "seq_len": 4096, "steps": 10000},
    "search": {"mbs": [1, 2], "vp": [1, 2, 4], "pp_schedule": ["1f1b", "interleaved_1f1b"], "cp_comm": ["p2p"]},
    "features": {"zero_stage": [0, 1]},
}
#: MoE with full recompute, which rules out the EP overlap: the feature rules reject leaves
MOE_FULL_RECOMPUTE = {
    "model": {"preset": "mixtral-8x7b", "num_layers": 8},
    "hardware": "h100-sxm",
    "cluster": {"num_gpus": 16, "gpus_per_node": 8},
    "training": {"global_batch_size": 32, "seq_len": 4096},
    "search": {"mbs": [1, 2], "vp": [1, 2], "pp_schedule": ["1f1b", "interleaved_1f1b"], "cp_comm": ["p2p"]},
    "features": {"zero_stage": [0, 1], "recompute": ["none", "full"]},
}
#: without pipelining a row has few overlap choices and most rows fit: the leaves are barely
#: more than the tables' configurations, and the tables' batches cost more
UNPIPELINED = ("llama2_70b_128gpu", ["search.pp=[1]"])
#: a pipelined space where three rows in four do not fit: the tables score a fraction of the leaves
PIPELINED = ("llama3_405b_64gpu_gbs16", ["search.tp=[4,8]", "search.pp=[4,8,16]", "search.mbs=[1]"])


def load(tmp_path, data):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_problem(str(path))


def tuning(name, overrides):
    return load_problem(str(PROBLEMS / "tuning" / f"{name}.yaml"), overrides)


@pytest.mark.parametrize("case, path, reported", [(UNPIPELINED, "exhaustive", "exhaustive scoring"), (PIPELINED, "tables", "bound-ordered scoring")],
                         ids=["unpipelined", "pipelined"])
def test_the_path_chosen_is_reported_and_agrees_with_exhaustive(case, path, reported):
    problem = tuning(*case)
    space = SearchSpace.from_problem(problem)
    chosen, figures = choose_path(problem, space)
    assert chosen == path
    assert (figures["cost_ratio"] > 1) == (path == "exhaustive")
    assert figures["leaves"] == space.enumeration()[0]
    cpsat, exhaustive = solve(problem, "cpsat", top_k=3), solve(problem, "exhaustive", top_k=3)
    assert cpsat.method == "cpsat" and cpsat.stats["path"].startswith(reported)
    assert cpsat.stats["leaves"] == figures["leaves"] and cpsat.stats["table_work"] == figures["table_work"]
    assert cpsat.status == exhaustive.status == "optimal" and cpsat.gap == 0.0
    assert list(cpsat.top_values) == list(exhaustive.top_values)
    for i in range(3):
        assert cpsat.top_configs.spec(i) == exhaustive.top_configs.spec(i)
    if path == "exhaustive":  # the enumerator itself: the same work
        assert cpsat.evaluated == exhaustive.evaluated
    else:
        assert cpsat.evaluated < exhaustive.evaluated / 100  # the bound orders the rows: few are scored


def test_enumeration_counts_what_the_enumerator_scores(monkeypatch, tmp_path):
    """The leaves and batches are counts; the admitted leaves an estimate that is a count when
    every leaf is in the sample."""
    problem = load(tmp_path, MOE_FULL_RECOMPUTE)
    space = SearchSpace.from_problem(problem)
    batches = list(space.batches(4096))
    assert space.enumeration(4096) == (sum(len(b) for b in batches), len(batches))
    scored = solve(problem, "exhaustive").evaluated
    estimate, leaves, _ = enumeration_work(space)
    monkeypatch.setattr(optimizer.cpsat, "PATH_SAMPLE", 10**9)
    exact, _, _ = enumeration_work(space)
    assert exact == scored < 0.8 * leaves  # the feature rules reject EP overlap under full recompute
    assert estimate == pytest.approx(exact, rel=0.1)


@pytest.mark.parametrize("case", [UNPIPELINED, PIPELINED], ids=["unpipelined", "pipelined"])
def test_table_work_counts_what_the_tables_score(monkeypatch, case):
    """With every row in the sample the estimate is a count: the configurations the tables'
    exact-model batches score. With the default sample it stays close."""
    problem = tuning(*case)
    space = SearchSpace.from_problem(problem)
    estimate, _ = table_work(problem, space)
    scored = []
    real = optimizer.cpsat._bound_terms

    def counting(p, s, cfg):
        scored.append(len(cfg))
        return real(p, s, cfg)

    monkeypatch.setattr(optimizer.cpsat, "_bound_terms", counting)
    build_tables(problem, space)
    monkeypatch.setattr(optimizer.cpsat, "PATH_SAMPLE", 10**9)
    exact, _ = table_work(problem, space)
    assert exact == sum(scored)
    assert estimate == pytest.approx(exact, rel=0.1)


def test_exhaustive_path_under_a_time_limit_carries_the_floor_gap(monkeypatch, tmp_path):
    """The exhaustive path keeps the enumerator's time-limit semantics, on cpsat's clock: the
    best found so far, not certified, with the compute floor as its bound."""
    monkeypatch.setattr(optimizer.cpsat, "PATH", "exhaustive")
    problem = load(tmp_path, DENSE)
    optimum = solve(problem, "exhaustive").best_value
    stopped = solve(problem, "cpsat", time_limit_s=1e-9)  # stops after its first batch
    assert stopped.method == "cpsat" and stopped.stats["path"].startswith("exhaustive scoring")
    assert stopped.status == "feasible"
    assert stopped.lower_bound == pytest.approx(floor_objective(problem, "step"))
    assert stopped.lower_bound <= optimum <= stopped.best_value
    assert 0 <= stopped.gap < 1


@pytest.mark.parametrize("path", ["exhaustive", "tables"])
def test_infeasible_on_either_path(monkeypatch, path):
    """Nothing fits: both paths say infeasible with an infinite proven bound, and explain it."""
    monkeypatch.setattr(optimizer.cpsat, "PATH", path)
    problem = load_problem(str(PROBLEMS / "tuning" / "infeasible_llama3_405b_8gpu.yaml"))
    result = solve(problem, "cpsat")
    assert result.status == "infeasible" and result.best_value is None
    assert math.isinf(result.lower_bound)
    assert result.stats["path"].startswith("exhaustive scoring" if path == "exhaustive" else "tables (no admissible row fits)")
    assert "no configuration fits in 79.65 GiB" in result.explanation
    if path == "tables":  # the tables score each row once to learn it fits: far fewer than the leaves
        assert result.stats["choices"] < SearchSpace.from_problem(problem).enumeration()[0] / 4
    assert np.isfinite(result.solve_time_s)
