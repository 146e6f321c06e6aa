"""DFS and compare print progress (issue 11): the DFS reports leaves, nodes, time and the best
value so far; `--progress` puts those lines on stderr, stdout stays the result alone."""

import json

import yaml

import optimizer.dfs
from costmodel.loader import load_problem
from mofa.cli import main
from optimizer.search import solve

DENSE = {
    "model": {"preset": "llama3.1-8b", "num_layers": 8},
    "hardware": "h100-sxm",
    "cluster": {"num_gpus": 8, "gpus_per_node": 8},
    "training": {"global_batch_size": 16, "seq_len": 2048},
    "search": {"mbs": [1], "vp": [1], "tp": [1, 2], "pp": [1, 2], "pp_schedule": ["1f1b"], "cp": [1]},
    "features": {"zero_stage": [0, 1]},
}


def write(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(DENSE))
    return str(path)


def test_dfs_reports_progress(tmp_path, monkeypatch):
    monkeypatch.setattr(optimizer.dfs, "PROGRESS_EVERY_S", 0.0)  # every leaf
    reports = []
    result = solve(load_problem(write(tmp_path)), "dfs", "step", progress=reports.append)
    assert result.status == "optimal"
    assert len(reports) == result.evaluated  # one per leaf at this period
    assert [r["leaves"] for r in reports] == list(range(1, len(reports) + 1))
    bests = [r["best"] for r in reports if r["best"] is not None]
    assert bests == sorted(bests, reverse=True) and bests[-1] == result.best_value  # the best so far only improves


def test_compare_progress_goes_to_stderr(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(optimizer.dfs, "PROGRESS_EVERY_S", 0.0)
    path = write(tmp_path)
    assert main(["compare", path, "--progress", "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)  # stdout is the JSON alone
    assert rows[0]["agree"]
    lines = captured.err.strip().splitlines()
    assert all(line.startswith(f"mofa compare [1/1] {path}: ") for line in lines)
    assert any(" dfs: " in line and " leaves, " in line for line in lines)
    assert [line.split(": ", 1)[1].split()[0] for line in lines if " in " in line and "leaves" not in line] == ["cpsat", "dfs", "exhaustive"]


def test_no_progress_without_a_terminal(tmp_path, capsys):
    assert main(["compare", write(tmp_path), "--json"]) == 0
    assert capsys.readouterr().err == ""
