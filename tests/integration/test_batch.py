"""`mofa batch`: run folders written as sets, failures recorded, --resume skipping what is
done (also after a SIGKILL mid-way), the summary table read from the typed results, the Ray
backend's table equal to the local one's; `mofa report` on a batch."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

TINY = {
    "name": "tiny",
    "model": "llama3.1-8b",
    "hardware": "h100-sxm",
    "cluster": {"num_gpus": 16, "gpus_per_node": 8},
    "training": {"global_batch_size": 64, "seq_len": 4096, "steps": 1000},
    "fault_tolerance": {"failure_rate_per_node_day": 0.01, "recovery_time_s": 600, "checkpoint_save_s": 10, "checkpoint_interval": "optimal"},
    "search": {"tp": [1, 2], "pp": [1, 2], "cp": [1], "mbs": [1, 2]},
}


def mofa(*args, **kw):
    return subprocess.run([sys.executable, "-m", "mofa", *args], capture_output=True, text=True, timeout=300, **kw)


def problems(tmp_path, seqs=(2048, 4096), gbss=(32, 64), broken=True):
    folder = tmp_path / "problems"
    folder.mkdir(exist_ok=True)
    (folder / "tiny.yaml").write_text(yaml.safe_dump({**TINY, "sweep": {"training.seq_len": list(seqs), "training.global_batch_size": list(gbss)}}, sort_keys=False))
    if broken:
        (folder / "broken.yaml").write_text(yaml.safe_dump({**TINY, "cluster": {"num_gpus": "many", "gpus_per_node": 8}}))
    return folder


def run_names(out):
    return sorted(os.listdir(out / "runs"))


def summary(out):
    return [json.loads(line) for line in (out / "summary" / "summary.jsonl").read_text().splitlines()]


def test_batch_writes_runs_failures_and_summary(tmp_path):
    out = tmp_path / "batch"
    result = mofa("batch", str(problems(tmp_path)), "--out", str(out), "--workers", "2")
    assert result.returncode == 1, result.stderr  # one run failed, the others were solved
    names = run_names(out)
    assert names == ["broken", "tiny_seq_len=2048_global_batch_size=32", "tiny_seq_len=2048_global_batch_size=64",
                     "tiny_seq_len=4096_global_batch_size=32", "tiny_seq_len=4096_global_batch_size=64"]
    failed = json.loads((out / "runs" / "broken" / "failed.json").read_text())
    assert "broken.yaml" in failed["error"] and "cluster.num_gpus" in failed["error"] and "\n" not in failed["error"]
    assert sorted(os.listdir(out / "runs" / "broken")) == ["failed.json", "run.json"]
    rows = {row["run"]: row for row in summary(out)}
    assert set(rows) == set(names)
    assert rows["broken"]["status"] == "failed" and rows["broken"]["error"] == failed["error"]
    with open(out / "summary" / "summary.csv") as fh:
        assert [r["run"] for r in csv.DictReader(fh)] == [r["run"] for r in summary(out)]
    for name in names[1:]:
        folder = out / "runs" / name
        assert {"run.json", "problem.json", "result.json", "best.yaml", "megatron_launch.sh", "deepspeed_config.json"} <= set(os.listdir(folder))
        res = json.loads((folder / "result.json").read_text())
        best, row = res["best"], rows[name]
        # every number of the row is the typed result's, not recomputed
        assert row["t_step_s"] == best["step_time_s"] and row["mfu"] == best["mfu"] and row["tokens_per_s"] == best["tokens_per_s"]
        assert row["t_comm_dp_s"] == best["breakdown_s"]["dp"] and row["t_bubble_s"] == best["breakdown_s"]["bubble"]
        assert row["peak_gib"] == best["memory_gib"]["peak"] and row["activations_gib"] == best["memory_gib"]["activations"]
        assert row["model_flops_per_step"] == best["model_flops_per_step"] and row["ettr"] == best["ettr"]
        # the convention the MFU counts in, and the lower bounds beside the step (costmodel.bounds)
        assert row["mfu_convention"] == best["mfu_convention"] == "palm" and row["flops_convention"] == "palm"
        assert (row["t_bound_compute_s"], row["t_bound_memory_s"], row["t_bound_comm_s"]) == tuple(best["lower_bounds_s"][k] for k in ("compute", "memory", "comm"))
        assert 0 < max(row["t_bound_compute_s"], row["t_bound_memory_s"], row["t_bound_comm_s"]) <= row["t_step_s"]
        assert row["checkpoint_interval_steps"] == best["checkpoint_interval"] and row["e2e_days"] == pytest.approx(best["e2e_time_s"] / 86400, rel=1e-12)
        assert (row["tp"], row["pp"], row["mbs"], row["dp"]) == (best["config"]["tp"], best["config"]["pp"], best["config"]["mbs"], best["config"]["dp"])
        assert row["seq_len"] == json.loads(row["sweep"])["seq_len"] and row["status"] == res["status"] == "optimal"
        assert len(res["top"]) == 3  # --top defaults to 3: the report compares them
    # the same batch again without --resume is refused; with it, nothing is redone but the failure
    again = mofa("batch", str(problems(tmp_path)), "--out", str(out))
    assert again.returncode == 2 and "--resume" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    before = {n: os.stat(out / "runs" / n / "run.json").st_mtime_ns for n in names}
    resumed = mofa("batch", str(problems(tmp_path)), "--out", str(out), "--resume")
    assert resumed.returncode == 1 and "4 run(s) already done" in resumed.stderr
    after = {n: os.stat(out / "runs" / n / "run.json").st_mtime_ns for n in names}
    assert [n for n in names if before[n] != after[n]] == ["broken"]  # failures are retried


def test_resume_reruns_a_run_whose_input_changed(tmp_path):
    out = tmp_path / "batch"
    folder = problems(tmp_path, seqs=(2048,), gbss=(32, 64), broken=False)
    assert mofa("batch", str(folder), "--out", str(out), "--workers", "1").returncode == 0
    first = {n: json.loads((out / "runs" / n / "run.json").read_text())["input_hash"] for n in run_names(out)}
    data = yaml.safe_load((folder / "tiny.yaml").read_text())
    data["sweep"]["training.global_batch_size"] = [32, 128]  # one run kept, one new
    data["training"]["steps"] = 1000
    (folder / "tiny.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    result = mofa("batch", str(folder), "--out", str(out), "--resume", "--workers", "1")
    assert result.returncode == 0 and "1 run(s) already done" in result.stderr, result.stderr
    assert [r["run"] for r in summary(out)] == ["tiny_seq_len=2048_global_batch_size=32", "tiny_seq_len=2048_global_batch_size=128"]
    assert json.loads((out / "runs" / "tiny_seq_len=2048_global_batch_size=32" / "run.json").read_text())["input_hash"] == first["tiny_seq_len=2048_global_batch_size=32"]


def _complete(folder) -> bool:
    """A run folder is whole: its marker and the files the marker's status implies, from one run."""
    files = set(os.listdir(folder))
    marker = json.loads((folder / "run.json").read_text())
    if marker["status"] == "failed":
        return files == {"run.json", "failed.json", "problem.json"} or files == {"run.json", "failed.json"}
    problem = json.loads((folder / "problem.json").read_text())
    result = json.loads((folder / "result.json").read_text())
    # every launch format is there, or named with its reason in export_errors.txt (which one a
    # framework refuses depends on the plan the model finds best)
    refused = (folder / "export_errors.txt").read_text() if "export_errors.txt" in files else ""
    launches = {"megatron": "megatron_launch.sh", "megatron-bridge": "bridge_overrides.txt", "torchtitan": "torchtitan_launch.sh", "deepspeed": "deepspeed_config.json"}
    exported = all(name in files or refused.count(f"{fmt}: ") for fmt, name in launches.items())
    return "best.yaml" in files and exported and problem["name"].endswith(marker["name"][len("tiny"):]) and result["input"] == marker["input"]


def test_sigkill_mid_batch_then_resume_redoes_nothing(tmp_path):
    """Acceptance: a batch killed with SIGKILL mid-way keeps every finished run whole, leaves no
    half-written one, and --resume finishes without redoing any."""
    folder = problems(tmp_path, seqs=(1024, 2048, 4096, 8192), gbss=(16, 32, 64), broken=False)
    out = tmp_path / "batch"
    cmd = [sys.executable, "-m", "mofa", "batch", str(folder), "--out", str(out), "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    finished = []
    while time.monotonic() < deadline and proc.poll() is None:
        runs = out / "runs"
        finished = [n for n in (os.listdir(runs) if runs.is_dir() else []) if not n.startswith(".")]
        if len(finished) >= 3:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the batch finished before it could be killed: give it more runs"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    names = [n for n in os.listdir(out / "runs") if not n.startswith(".")]
    assert 3 <= len(names) < 12
    assert all(_complete(out / "runs" / n) for n in names)  # nothing mixed, nothing half-written
    assert not (out / "summary").exists()
    stamps = {n: os.stat(out / "runs" / n / "result.json").st_mtime_ns for n in names}
    result = mofa("batch", str(folder), "--out", str(out), "--resume", "--workers", "1")
    assert result.returncode == 0, result.stderr
    assert f"{len(names)} run(s) already done" in result.stderr
    assert {n: os.stat(out / "runs" / n / "result.json").st_mtime_ns for n in names} == stamps  # not redone
    visible = [n for n in os.listdir(out / "runs") if not n.startswith(".")]
    assert len(visible) == 12 and all(_complete(out / "runs" / n) for n in visible)
    assert not [n for n in os.listdir(out / "runs") if n.startswith(".")]  # temporary folders of the killed run are gone
    assert len(summary(out)) == 12 and all(r["status"] == "optimal" for r in summary(out))


def _table(out):
    return [{k: v for k, v in row.items() if k != "solve_time_s"} for row in summary(out)]


def test_ray_backend_gives_the_local_table(tmp_path):
    pytest.importorskip("ray")
    folder = problems(tmp_path, seqs=(2048,), gbss=(32, 64), broken=True)
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert mofa("batch", str(folder), "--out", str(local), "--workers", "1").returncode == 1
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    result = mofa("batch", str(folder), "--out", str(remote), "--workers", "2", "--backend", "ray", env=env)
    assert result.returncode == 1, result.stderr
    assert _table(remote) == _table(local) and len(_table(local)) == 3


def test_report_on_a_batch(tmp_path):
    out = tmp_path / "batch"
    folder = problems(tmp_path, seqs=(2048, 4096), gbss=(32, 64), broken=True)
    (folder / "other.yaml").write_text(yaml.safe_dump({**TINY, "cluster": {"num_gpus": 32, "gpus_per_node": 8}, "training": {**TINY["training"], "global_batch_size": 128}}))
    assert mofa("batch", str(folder), "--out", str(out), "--workers", "2").returncode == 1
    result = mofa("report", str(out))
    assert result.returncode == 0, result.stderr
    report = out / "report"
    files = set(os.listdir(report))
    assert {"memory.png", "step_time_waterfall.png", "topk.png", "ettr_interval.png", "ettr_nodes.png", "linearity.png", "heatmap_1.png", "report.md", "plots.json"} <= files
    for name in files:
        if name.endswith(".png"):
            assert (report / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert f"]({name})" in (report / "report.md").read_text()
    plots = json.loads((report / "plots.json").read_text())
    rows = {r["run"]: r for r in summary(out)}
    results = {n: json.loads((out / "runs" / n / "result.json").read_text()) for n in rows if rows[n]["status"] != "failed"}
    # memory: each run's stacked parts are its ledger, the capacity its GPU's
    memory = plots["memory.png"]
    assert memory["runs"] == [n for n in rows if n in results]
    for i, name in enumerate(memory["runs"]):
        best = results[name]["best"]
        assert memory["parts_gib"]["activations"][i] == best["memory_gib"]["activations"]
        assert sum(part[i] for part in memory["parts_gib"].values()) == pytest.approx(best["memory_gib"]["peak"], rel=1e-9)
        assert memory["capacity_gib"][i] == best["memory_capacity_bytes"] / 2**30
    # heatmap: seq x gbs of the sweep, tokens/s per GPU of each run
    heat = plots["heatmap_1.png"]
    assert heat["seq_len"] == [2048, 4096] and heat["global_batch_size"] == [32, 64]
    for i, seq in enumerate(heat["seq_len"]):
        for j, gbs in enumerate(heat["global_batch_size"]):
            assert heat["tokens_per_s_per_gpu"][i][j] == rows[f"tiny_seq_len={seq}_global_batch_size={gbs}"]["tokens_per_s_per_gpu"]
    # ETTR against the interval: the curve's best point is the interval the solve chose (eq. 44)
    for name, curve in plots["ettr_interval.png"].items():
        assert curve["optimal_interval_steps"] == results[name]["best"]["checkpoint_interval"]
        assert max(curve["ettr"]) <= curve["ettr_at_optimum"] + 1e-12
    # ETTR falls as nodes are added at the same step time
    for curve in plots["ettr_nodes.png"].values():
        assert all(a >= b for a, b in zip(curve["ettr"], curve["ettr"][1:]))
    # linearity: 16 and 32 GPUs of the same model, GPU and sequence length
    lines = plots["linearity.png"]
    line = next(v for k, v in lines.items() if "seq 4096" in k)
    assert line["num_gpus"] == [16, 32] and line["linearity"][0] == 1.0
    top = plots["topk.png"]
    for name, panel in top.items():
        assert panel["step_time_s"] == [t["step_time_s"] for t in results[name]["top"]]
    assert "Supernode size and the best EP" in (report / "report.md").read_text()  # listed as not drawn, with why
    assert "broken" in (report / "report.md").read_text()


def test_sensitivity_moves_one_variable_at_a_time(tmp_path):
    from costmodel.loader import load_problem
    from mofa.commands.sensitivity import metrics

    path = tmp_path / "fixed.yaml"
    path.write_text(yaml.safe_dump({**TINY, "config": {"tp": 2, "pp": 1, "mbs": 1}}))
    result = mofa("sensitivity", str(path), "--vary", "tp,seq,mbs", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["base_config"]["tp"] == 2
    variants = {r["variant"]: r for r in out["variants"]}
    assert set(variants) == {"tp=1 (base 2)", "tp=4 (base 2)", "seq=2048 (base 4096)", "seq=8192 (base 4096)", "mbs=2 (base 1)"}
    assert variants["tp=4 (base 2)"]["rejected"] is None and variants["tp=4 (base 2)"]["delta_comm_share"] > 0  # more TP, more TP traffic
    # each variant's figures are the exact model's for that configuration
    evaluated = json.loads(mofa("evaluate", str(path), "--set", "tp=1", "--json").stdout)
    expected = metrics(evaluated)
    row = variants["tp=1 (base 2)"]
    assert row["step_time_s"] == expected["step_time_s"] and row["headroom_gib"] == expected["headroom_gib"] and row["mfu"] == expected["mfu"]
    assert row["delta_step_time_s"] == pytest.approx(row["step_time_s"] - out["base"]["step_time_s"], rel=1e-12)
    longer = variants["seq=8192 (base 4096)"]
    assert longer["step_time_s"] > out["base"]["step_time_s"] and longer["headroom_gib"] < out["base"]["headroom_gib"]
    assert load_problem(str(path)).config.tp == 2
    bad = mofa("sensitivity", str(path), "--vary", "tp,zz")
    assert bad.returncode == 2 and "zz" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_sensitivity_names_the_memory_line_behind_a_headroom_change(tmp_path):
    """A ZeRO-3 run at pp 1 moved to pp 2 (1F1B, one stage per rank) loses most of its headroom
    to the gradients: the rank now holds its stage's unsharded gradient for the whole step. The
    row names that ledger line and its change, which is the evaluated ledgers' difference."""
    path = tmp_path / "zero3.yaml"
    path.write_text(yaml.safe_dump({**TINY, "config": {"tp": 1, "pp": 1, "mbs": 1, "zero_stage": 3}}))
    out = json.loads(mofa("sensitivity", str(path), "--vary", "pp", "--json").stdout)
    row = next(r for r in out["variants"] if r["variant"] == "pp=2 (base 1)")
    evaluated = json.loads(mofa("evaluate", str(path), "--set", "pp=2", "--json").stdout)
    grads_delta = evaluated["memory_gib"]["grads"] - out["base"]["memory_gib"]["grads"]
    assert row["memory_driver"] == {"term": "grads", "delta_gib": pytest.approx(grads_delta, rel=1e-12)}
    assert grads_delta > 0.5 * -row["delta_headroom_gib"] > 0
    text = mofa("sensitivity", str(path), "--vary", "pp").stdout
    assert f"grads {grads_delta:+.1f}" in text
