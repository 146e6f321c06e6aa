"""The tuning system: cpsat, DFS and exhaustive on the shipped problems."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import PROBLEMS
from costmodel.arrays import tune_allocator
from costmodel.evaluate import evaluate
from costmodel.loader import load_problem
from costmodel.rules import violations
from optimizer.cpsat import build_tables, solve_cpsat
from optimizer.result import objective_values
from optimizer.search import solve
from optimizer.space import SearchSpace

tune_allocator()
TUNING = sorted((PROBLEMS / "tuning").glob("*.yaml"))
#: a space the DFS (one exact evaluation per leaf) finishes in seconds
NARROW = ["search.tp=[4,8]", "search.pp=[4,8,16]", "search.mbs=[1]", "search.vp=[1,2,4,8]", "features.zero_stage=[1]",
          "search.pp_schedule=[1f1b,interleaved_1f1b,afab]"]


def same(a, b, rel=1e-9):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= rel * max(abs(a), abs(b))


@pytest.mark.parametrize("path", TUNING, ids=[p.stem for p in TUNING])
def test_cpsat_equals_exhaustive_and_is_certified(path):
    problem = load_problem(str(path))
    exhaustive = solve(problem, "exhaustive")
    cpsat = solve(problem, "cpsat")
    assert cpsat.status == exhaustive.status
    assert same(cpsat.best_value, exhaustive.best_value)
    if exhaustive.status == "optimal":
        assert cpsat.status == "optimal" and cpsat.gap == 0.0  # certified


@pytest.mark.parametrize("name", ["llama3_405b_64gpu_gbs16", "deepseek_v3_1024gpu_sn8"])
def test_top_k_matches_exhaustive(name):
    problem = load_problem(str(PROBLEMS / "tuning" / f"{name}.yaml"))
    a, b = solve(problem, "cpsat", top_k=4), solve(problem, "exhaustive", top_k=4)
    assert len(a.top_values) == 4
    np.testing.assert_allclose(a.top_values, b.top_values, rtol=1e-12)
    assert np.all(np.diff(a.top_values) >= 0)


@pytest.mark.parametrize("method", ["cpsat", "exhaustive", "dfs"])
def test_answers_never_break_a_constraint(method):
    problem = load_problem(str(PROBLEMS / "tuning" / "llama3_405b_64gpu_gbs16.yaml"),
                           NARROW)
    result = solve(problem, method, top_k=5, time_limit_s=120)
    cfg = result.top_configs
    assert cfg is not None and len(cfg) == 5
    for rule, bad in violations(problem, cfg).items():
        assert not bad.any(), rule
    ev = evaluate(problem, cfg)
    assert ev.fits.all() and ev.host_fits.all()
    np.testing.assert_allclose(objective_values(ev, "step"), result.top_values, rtol=1e-12)


def test_dfs_agrees_on_a_space_it_can_finish():
    problem = load_problem(str(PROBLEMS / "tuning" / "llama3_405b_64gpu_gbs16.yaml"),
                           NARROW)
    dfs, exhaustive = solve(problem, "dfs"), solve(problem, "exhaustive")
    assert dfs.status == "optimal" and same(dfs.best_value, exhaustive.best_value)
    assert dfs.evaluated == exhaustive.evaluated  # both score every admissible configuration


def test_infeasible_problem_explains_itself():
    problem = load_problem(str(PROBLEMS / "tuning" / "infeasible_llama3_405b_8gpu.yaml"))
    for method in ("cpsat", "exhaustive"):
        result = solve(problem, method)
        assert result.status == "infeasible" and result.best_value is None
        assert "no configuration fits in 79.65 GiB (h100-sxm exposes 81559 MiB): the least is" in result.explanation
        least = float(result.explanation.split("the least is ")[1].split(" GiB")[0])
        assert least > 79.65


def test_no_layout_is_explained_by_the_rule_that_binds():
    problem = load_problem(str(PROBLEMS / "tuning" / "infeasible_llama3_405b_8gpu.yaml"), ["training.global_batch_size=3", "search.mbs=[2,4]"])
    result = solve(problem, "cpsat")
    assert result.status == "infeasible"
    assert "global_batch_size must be divisible by mbs*dp" in result.explanation


def test_time_limited_solve_returns_an_answer_with_its_gap(monkeypatch):
    """A limit that lets the tables be built (so their bound is proven) but not the scoring
    finish: the answer is the best exact configuration found, with the gap to the proven
    bound. The limit runs out on a clock that stands still while the tables are built and
    jumps past the limit once they are, so the test does not depend on the machine's speed
    (the limit bounds table building too: test_proven_gap covers a limit that stops it)."""
    import optimizer.cpsat

    problem = load_problem(str(PROBLEMS / "tuning" / "deepseek_v3_8192gpu_sn8.yaml"))
    full = solve_cpsat(problem, "step", top_k=4)
    built = {"tables": False}
    real_build = optimizer.cpsat.build_tables

    def build_then_run_out(*args, **kwargs):
        tables = real_build(*args, **kwargs)
        built["tables"] = True
        return tables

    class Clock:
        @property
        def elapsed(self):
            return 100.0 if built["tables"] else 0.0

    monkeypatch.setattr(optimizer.cpsat, "build_tables", build_then_run_out)
    monkeypatch.setattr(optimizer.cpsat, "PATH", "tables")  # the tables' path, whatever the choice would be
    monkeypatch.setattr(optimizer.cpsat, "Stopwatch", Clock)
    result = solve_cpsat(problem, "step", top_k=4, time_limit_s=50.0)
    assert result.stats.get("tables_complete", True)
    assert result.status in ("optimal", "feasible")
    assert result.best_value is not None and result.gap is not None
    assert 0.0 <= result.gap < 0.05
    assert result.lower_bound <= result.best_value + 1e-9
    assert result.best_value >= full.best_value - 1e-9  # never better than the certified optimum
    if result.status == "optimal":
        assert result.gap == 0.0 and result.best_value == full.best_value


def test_bound_never_exceeds_the_exact_value():
    """The CP-SAT objective is a lower bound of the exact step time for every row."""
    problem = load_problem(str(PROBLEMS / "tuning" / "deepseek_v3_1024gpu_sn8.yaml"))
    space = SearchSpace.from_problem(problem)
    tb = build_tables(problem, space)
    from optimizer.cpsat import TICK_S, _configs

    rng = np.random.default_rng(0)
    rows = rng.choice(len(tb.objective), 300, replace=False)
    for row in rows:
        cfg = _configs(problem, space, tb, [int(row)])
        ev = evaluate(problem, cfg)
        exact = float(ev.step_time_s.min())
        assert tb.objective[row] * TICK_S / tb.G <= exact * (1 + 1e-12)
        peak = float(ev.memory_bytes["peak"].min())
        assert tb.memory[row].max() * 1e6 / tb.G <= peak * (1 + 1e-12)


def test_e2e_objective_ranks_like_step_time():
    problem = load_problem(str(PROBLEMS / "tuning" / "llama2_70b_256gpu.yaml"))
    by_e2e = solve(problem, "cpsat", "e2e", top_k=3)
    by_step = solve(problem, "exhaustive", "step", top_k=3)
    ev = evaluate(problem, by_step.top_configs)
    np.testing.assert_allclose(by_e2e.top_values, ev.e2e_time_s, rtol=1e-12)


def _run(*args):
    return subprocess.run([sys.executable, "-m", "mofa", *args], capture_output=True, text=True, timeout=600)


def test_solve_json_contract_and_determinism(tmp_path):
    path = str(PROBLEMS / "tuning" / "llama2_70b_128gpu.yaml")
    first = _run("solve", path, "--json", "--top", "3", "--out", str(tmp_path / "out"))
    second = _run("solve", path, "--json", "--top", "3")
    assert first.returncode == 0, first.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    for key in ("status", "gap", "objective", "best", "top", "solve_time_s", "evaluated", "method"):
        assert key in a
    assert a["status"] == "optimal" and a["gap"] == 0 and a["method"] == "cpsat" and len(a["top"]) == 3
    assert a["objective"] == a["best"]["e2e_time_s"]
    for volatile in ("solve_time_s", "stats"):
        a.pop(volatile), b.pop(volatile)
    assert a == b
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    # the best (ZeRO-3 with layer offload) runs on Megatron; torchtitan and DeepSpeed refuse it, and say why
    assert files == ["best.yaml", "bridge_overrides.txt", "export_errors.txt", "megatron_launch.sh", "result.json"]
    assert json.loads((tmp_path / "out" / "result.json").read_text())["objective"] == a["objective"]
    errors = (tmp_path / "out" / "export_errors.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in errors] == ["torchtitan", "deepspeed"]
    assert a["exports"]["torchtitan"]["refused"] in errors[0] and a["exports"]["megatron"] == {"file": "megatron_launch.sh"}


def test_solve_reports_infeasible_with_exit_code_1():
    result = _run("solve", str(PROBLEMS / "tuning" / "infeasible_llama3_405b_8gpu.yaml"))
    assert result.returncode == 1 and "no configuration fits in 79.65 GiB" in result.stdout


def test_compare_json():
    problem = str(PROBLEMS / "mofa" / "table5_llama2_70b_128gpu.yaml")
    out = _run("compare", problem, "--json", "--dfs-time-limit", "5")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows[0]["problem"] == problem and {"cpsat", "dfs", "exhaustive", "agree"} <= set(rows[0])
    assert rows[0]["agree"] is True  # the DFS did not finish; the finished methods agree
    assert rows[0]["cpsat"]["objective"] == rows[0]["exhaustive"]["objective"]


def test_solve_that_runs_out_of_time_says_so_and_exits_1(monkeypatch, capsys):
    """A time limit that expires before any configuration is scored: status unknown, a line
    that says to allow more time (not "no admissible configuration"), exit code 1. The
    search is replaced by its timed-out result so the test does not depend on machine speed."""
    from mofa.cli import main
    from optimizer import search
    from optimizer.result import SolveResult

    def timed_out(problem, method, objective=None, top_k=1, time_limit_s=None, *args, **kwargs):
        return SolveResult(method, objective or "step", "unknown", np.zeros(0), None, 0.5, 0, stats={"tables_s": 1.4})

    monkeypatch.setattr(search, "solve", timed_out)
    code = main(["solve", str(PROBLEMS / "tuning" / "llama2_70b_128gpu.yaml"), "--time-limit", "0.5"])
    text = capsys.readouterr().out
    assert code == 1
    assert "-> unknown" in text and "no configuration found before the time limit (scoring this problem's tables alone took 1.4 s)" in text
    assert "no admissible configuration" not in text
