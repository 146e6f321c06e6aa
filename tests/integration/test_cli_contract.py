"""The JSON keys other tools read (issue contract) and the shipped problem files."""

import json
import subprocess
import sys

import pytest

from conftest import PROBLEMS

BREAKDOWN = {"compute", "tp", "cp", "ep", "fsdp", "overhead", "pp", "bubble", "dp", "update", "offload"}
MEMORY = {"peak", "params", "grads", "optimizer", "gathered_params", "activations", "optimizer_transient", "comm_buffers", "cuda_context", "fragmentation"}
TOP = {"step_time_s", "breakdown_s", "memory_bytes", "memory_gib", "memory_capacity_bytes", "fits", "tflops_per_gpu", "mfu", "tokens_per_s_per_gpu", "ettr", "checkpoint_interval", "e2e_time_s", "config"}


def mofa(*args):
    result = subprocess.run([sys.executable, "-m", "mofa", *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_evaluate_json_contract():
    out = json.loads(mofa("evaluate", str(PROBLEMS / "mofa" / "table5_llama3_405b_64gpu.yaml"), "--json"))
    assert TOP <= set(out)
    assert BREAKDOWN <= set(out["breakdown_s"])
    assert MEMORY | {"peak"} == set(out["memory_bytes"]) == set(out["memory_gib"])
    assert sum(out["breakdown_s"].values()) == pytest.approx(out["step_time_s"], rel=1e-12)
    mem = out["memory_bytes"]
    assert sum(v for k, v in mem.items() if k != "peak") == pytest.approx(mem["peak"], abs=len(mem))  # integers, each rounded
    assert out["fits"] == (mem["peak"] <= out["memory_capacity_bytes"])
    assert out["config"]["tp"] == 8 and out["checkpoint_interval"] == 10
    assert 0 < out["ettr"] < 1 and out["e2e_time_s"] > out["step_time_s"] * 15258790


def test_evaluate_set_overrides_the_config():
    path = str(PROBLEMS / "mofa" / "table5_llama3_405b_64gpu.yaml")
    base = json.loads(mofa("evaluate", path, "--json"))
    other = json.loads(mofa("evaluate", path, "--json", "--set", "mbs=2", "--set", "checkpoint_interval=optimal"))
    assert other["config"]["mbs"] == 2 and base["config"]["mbs"] == 1
    assert other["checkpoint_interval"] != 10 or other["ettr"] >= base["ettr"]


def test_evaluate_human_output_mentions_the_essentials():
    text = mofa("evaluate", str(PROBLEMS / "mofa" / "table5_llama2_70b_128gpu.yaml"))
    for word in ("step time", "peak", "TFLOP/s", "MFU", "ETTR"):
        assert word in text


def test_ettr_json_contract():
    out = json.loads(mofa("ettr", "--nodes", "32", "--failure-rate", "0.01", "--repair-time", "60", "--save-time", "2", "--step-time", "28", "--steps", "100000", "--json"))
    assert {"ettr", "optimal_interval", "e2e_time_s"} <= set(out)
    assert out["optimal_interval"] == 37 and round(100 * out["ettr"], 2) == 99.59
    fixed = json.loads(mofa("ettr", "--nodes", "32", "--failure-rate", "0.01", "--repair-time", "60", "--save-time", "2", "--step-time", "28", "--interval", "10", "--json"))
    assert fixed["interval"] == 10 and fixed["ettr"] < out["ettr"]


def test_evaluate_is_deterministic():
    path = str(PROBLEMS / "mofa" / "table5_deepseek_v3_128gpu.yaml")
    assert mofa("evaluate", path, "--json") == mofa("evaluate", path, "--json")


SHIPPED = sorted(p for p in PROBLEMS.rglob("*.yaml") if p.parent.name != "validation")  # validation points: test_calibration


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(PROBLEMS)) for p in SHIPPED])
def test_shipped_problem_loads(path):
    from costmodel.configs import ConfigBatch
    from costmodel.evaluate import evaluate
    from costmodel.loader import load_problems

    for _, _, problem in load_problems(str(path)):  # a sweep: every problem it expands to
        if problem.config is not None:
            batch = ConfigBatch.from_specs(problem, [problem.config])
            ev = evaluate(problem, batch)
            assert ev.step_time_s[0] > 0


def test_evaluate_simulate_replays_the_pipeline():
    """--simulate: the digital twin's replay of the plan's schedule next to the closed form (MoFa
    Table 5's Llama 3 405B plan: pp 8 x vp 8, 16 micro-batches), in JSON and in the text."""
    path = str(PROBLEMS / "mofa" / "table5_llama3_405b_64gpu.yaml")
    out = json.loads(mofa("evaluate", path, "--simulate", "--json"))
    replay = out["pipeline_replay"]
    assert (replay["schedule"], replay["pp"], replay["vp"], replay["microbatches"]) == ("interleaved_1f1b", 8, 8, 16)
    assert replay["closed_form_s"] == pytest.approx(out["step_time_s"] - out["breakdown_s"]["dp"] - out["breakdown_s"]["update"], rel=1e-9)
    assert 0.0 <= replay["difference"] <= 0.02 and replay["peak_in_flight"] == replay["model_in_flight"]
    assert "pipeline replay (interleaved_1f1b, pp 8 x vp 8, 16 micro-batches" in mofa("evaluate", path, "--simulate")
    assert "pipeline_replay" not in json.loads(mofa("evaluate", path, "--json"))
