"""Every answer under a time limit carries its proven gap (issue 11), DFS and exhaustive
enumeration too: their bound is the compute floor (costmodel.flops.step_time_floor_s), which
no configuration may beat -- checked here against every configuration of small spaces, dense
and MoE, bf16 and fp8 -- and Ctrl-C returns the best found so far as a time limit would."""

import numpy as np
import pytest
import yaml

import optimizer.exhaustive
from costmodel.evaluate import evaluate
from costmodel.flops import step_time_floor_s
from costmodel.loader import load_problem
from optimizer.result import floor_objective
from optimizer.search import solve
from optimizer.space import SearchSpace

DENSE = {
    "model": {"preset": "llama3.1-8b", "num_layers": 8},
    "hardware": "h100-sxm",
    "cluster": {"num_gpus": 16, "gpus_per_node": 8},
    "training": {"global_batch_size": 32, "seq_len": 4096, "steps": 10000},
    "fault_tolerance": {"failure_rate_per_node_day": 0.01, "recovery_time_s": 300, "checkpoint_save_s": 20},
    "search": {"mbs": [1, 2], "vp": [1, 2], "pp_schedule": ["1f1b", "interleaved_1f1b"], "cp_comm": ["p2p"]},
    "features": {"zero_stage": [0, 1]},
}
MOE = {**DENSE, "model": {"preset": "mixtral-8x7b", "num_layers": 4}, "search": {**DENSE["search"], "vp": [1]}}
FP8 = {**DENSE, "training": {**DENSE["training"], "dtypes": {"compute": "fp8"}}}


def load(tmp_path, data):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_problem(str(path))


@pytest.mark.parametrize("data", [DENSE, MOE, FP8], ids=["dense", "moe", "fp8"])
def test_no_configuration_beats_the_compute_floor(tmp_path, data):
    problem = load(tmp_path, data)
    space = SearchSpace.from_problem(problem)
    floor = step_time_floor_s(problem)
    least, scored = np.inf, 0
    for cfg in space.batches(65536, space.interval()):
        cfg = cfg.take(np.flatnonzero(space.feature_ok(cfg)))
        if len(cfg):
            least = min(least, float(evaluate(problem, cfg).step_time_s.min()))  # fitting or not: the floor ignores memory
            scored += len(cfg)
    assert scored > 1000
    assert floor <= least
    assert floor > 0.05 * least  # a floor, not zero: it measures the compute the step must do


@pytest.mark.parametrize("method", ["exhaustive", "dfs"])
@pytest.mark.parametrize("objective", ["step", "e2e"])
def test_time_limited_answers_carry_a_proven_gap(tmp_path, method, objective):
    problem = load(tmp_path, DENSE)
    optimum = solve(problem, "cpsat", objective).best_value
    stopped = solve(problem, method, objective, 1, 1e-9)  # stops after its first batch / leaf
    assert stopped.status == "feasible"
    assert stopped.lower_bound <= optimum <= stopped.best_value
    assert stopped.gap is not None and 0 <= stopped.gap < 1
    assert stopped.gap == pytest.approx((stopped.best_value - stopped.lower_bound) / stopped.best_value)


def test_ctrl_c_returns_the_best_found_so_far(tmp_path, monkeypatch):
    problem = load(tmp_path, DENSE)
    calls = {"n": 0}
    real = optimizer.exhaustive.evaluate

    def interrupted_on_second_batch(p, cfg):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(p, cfg)

    monkeypatch.setattr(optimizer.exhaustive, "evaluate", interrupted_on_second_batch)
    result = optimizer.exhaustive.solve_exhaustive(problem, "step", chunk=256)
    assert calls["n"] == 2
    assert result.status == "feasible" and result.stats["interrupted"]
    assert result.gap is not None and result.best_value >= result.lower_bound > 0


def test_ctrl_c_while_cpsat_builds_its_tables_returns_the_best_so_far(tmp_path, monkeypatch):
    """Ctrl-C while the tables are built (most of a cpsat solve on the shipped problems) stops the
    building as a time limit would: the rows built are searched, the rest bounded by the compute
    floor, and the answer, not certified, carries its gap (it used to end the solve with no
    answer)."""
    import optimizer.cpsat

    monkeypatch.setattr(optimizer.cpsat, "PATH", "tables")
    monkeypatch.setattr(optimizer.cpsat, "CHUNK", 64)  # several blocks, so that one is built before the interrupt
    problem = load(tmp_path, DENSE)
    optimum = solve(problem, "cpsat", "step").best_value
    calls = {"n": 0}
    real = optimizer.cpsat._block_tables

    def interrupted_on_second_block(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(optimizer.cpsat, "_block_tables", interrupted_on_second_block)
    stopped = solve(problem, "cpsat", "step")
    assert calls["n"] == 2 and stopped.stats["interrupted"] and stopped.stats["tables_complete"] is False
    assert stopped.status == "feasible" and stopped.lower_bound <= optimum <= stopped.best_value
    assert stopped.gap is not None and 0 <= stopped.gap < 1


@pytest.mark.parametrize("objective", ["step", "e2e"])
def test_cpsat_time_limit_bounds_table_building(tmp_path, monkeypatch, objective):
    """A limit that runs out while the tables are built: the rows built are searched, the rest
    bounded by the compute floor; the answer is not certified but carries its gap."""
    import optimizer.cpsat

    monkeypatch.setattr(optimizer.cpsat, "PATH", "tables")  # whatever the path choice would pick here
    problem = load(tmp_path, DENSE)
    optimum = solve(problem, "cpsat", objective).best_value
    stopped = solve(problem, "cpsat", objective, 1, 1e-9)
    assert stopped.stats["tables_complete"] is False
    assert stopped.status == "feasible"
    assert stopped.lower_bound <= optimum <= stopped.best_value
    assert stopped.lower_bound == pytest.approx(min(stopped.lower_bound, floor_objective(problem, objective)))
    assert 0 <= stopped.gap < 1
