"""`mofa report`'s MoFa figures on a small pipelined batch: ETTR against failure rate, repair
and save time (Fig. 5), the effect of v (Fig. 6) and the optimizer placement (Table 7 / Fig. 7).
The plotted data is checked against the exact model and the fault model, not pixels."""

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from costmodel.configs import ConfigBatch
from costmodel.evaluate import evaluate
from costmodel.reliability import failure_rate_per_s, optimal_interval, steady_state_ettr
from costmodel.specs import ConfigSpec, Problem

PIPELINED = {
    "name": "pp",
    "model": {"preset": "llama3.1-8b", "num_layers": 16},
    "hardware": "h100-sxm",
    "cluster": {"num_gpus": 16, "gpus_per_node": 8},
    "training": {"global_batch_size": 32, "seq_len": 4096, "steps": 1000},
    "fault_tolerance": {"failure_rate_per_node_day": 0.01, "recovery_time_s": 600, "checkpoint_save_s": 10, "checkpoint_interval": "optimal"},
    "search": {"tp": [1, 2], "pp": [2, 4], "cp": [1], "mbs": [1], "vp": [1, 2]},
    "features": {"zero_stage": [0, 1], "cpu_optimizer": "off"},
}


def mofa(*args):
    return subprocess.run([sys.executable, "-m", "mofa", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    (tmp / "pp.yaml").write_text(yaml.safe_dump(PIPELINED, sort_keys=False))
    out = tmp / "batch"
    done = mofa("batch", str(tmp / "pp.yaml"), "--out", str(out), "--workers", "1", "--distinct-layouts")
    assert done.returncode == 0, done.stderr
    made = mofa("report", str(out))
    assert made.returncode == 0, made.stderr
    run = out / "runs" / "pp"
    return {"plots": json.loads((out / "report" / "plots.json").read_text()), "md": (out / "report" / "report.md").read_text(),
            "result": json.loads((run / "result.json").read_text()), "problem": Problem.model_validate_json((run / "problem.json").read_text())}


def exact(problem, config: dict) -> dict:
    batch = ConfigBatch.from_specs(problem, [ConfigSpec.model_validate(config)])
    return evaluate(problem, batch).as_dict(0, batch)


def test_new_figures_are_linked(report):
    for name in ("ettr_factors.png", "vp.png", "optimizer.png"):
        assert name in report["plots"] and f"]({name})" in report["md"]


def test_ettr_factors_follow_the_fault_model(report):
    """Fig. 5: each curve moves one factor, the others held at the run's; every point is eq. 40
    at eq. 44's interval, ETTR falls as each factor grows, and at the run's own values it is the
    ETTR of the interval the solve chose."""
    problem, best = report["problem"], report["result"]["best"]
    ft = problem.fault_tolerance
    nodes, step, save = problem.cluster.num_nodes, best["step_time_s"], best["checkpoint_save_s"]
    at_run = float(steady_state_ettr(np.array([step]), best["checkpoint_interval"], failure_rate_per_s(nodes, ft.failure_rate_per_node_day),
                                     ft.mean_recovery_s, save)[0])
    for factor, curves in report["plots"]["ettr_factors.png"].items():
        curve = curves["pp"]
        assert curve["ettr_at_run_value"] == pytest.approx(at_run, rel=1e-12)
        assert all(a >= b for a, b in zip(curve["ettr"], curve["ettr"][1:])), factor
        values = {"failure_rate_per_node_day": ft.failure_rate_per_node_day, "recovery_s": ft.mean_recovery_s, "checkpoint_save_s": save}
        for x, ettr, interval in zip(curve[factor], curve["ettr"], curve["interval_steps"]):
            point = {**values, factor: x}
            rate = failure_rate_per_s(nodes, point["failure_rate_per_node_day"])
            assert interval == int(optimal_interval(np.array([step]), rate, point["recovery_s"], point["checkpoint_save_s"])[0])
            assert ettr == pytest.approx(float(steady_state_ettr(np.array([step]), interval, rate, point["recovery_s"], point["checkpoint_save_s"])[0]), rel=1e-12)
        assert curve[factor][0] == pytest.approx(values[factor] / 10) and curve[factor][-1] == pytest.approx(values[factor] * 10)


def test_vp_sweep_is_the_exact_model(report):
    """Fig. 6: the best configuration with only v (and what v forces: split, schedule) changed;
    each point is the exact model's step time, the run's own v gives the run's step time."""
    problem, best = report["problem"], report["result"]["best"]
    data = report["plots"]["vp.png"]["pp"]
    assert best["config"]["pp"] > 1 and best["config"]["vp"] in data["vp"] and 1 in data["vp"] and len(data["vp"]) >= 3
    for v, config, step, bubble in zip(data["vp"], data["configs"], data["step_time_s"], data["bubble_s"]):
        assert config["vp"] == v
        assert {k: config[k] for k in ("tp", "cp", "pp", "ep", "mbs", "zero_stage")} == {k: best["config"][k] for k in ("tp", "cp", "pp", "ep", "mbs", "zero_stage")}
        entry = exact(problem, config)
        assert entry["step_time_s"] == step and entry["breakdown_s"]["bubble"] == bubble
    at_best = data["vp"].index(best["config"]["vp"])
    assert data["step_time_s"][at_best] == pytest.approx(best["step_time_s"], rel=1e-12)
    assert data["bubble_s"][0] > data["bubble_s"][-1]  # interleaving shrinks the bubble


def test_optimizer_placements_are_the_exact_model(report):
    """Table 7 / Fig. 7: ZeRO stage x CPU optimizer around the best layout; each bar is the
    exact model's, the CPU optimizer moves the optimizer states off the GPU."""
    problem, best = report["problem"], report["result"]["best"]
    data = report["plots"]["optimizer.png"]["pp"]
    assert data["variants"] == [f"ZeRO-{z}" + c for z in range(4) for c in ("", " + CPU")]  # dp = 8: every stage admissible
    for label, config, step, peak in zip(data["variants"], data["configs"], data["step_time_s"], data["peak_gib"]):
        assert config["zero_stage"] == int(label[5]) and config["cpu_optimizer"] == label.endswith("CPU")
        entry = exact(problem, config)
        assert entry["step_time_s"] == step and entry["memory_gib"]["peak"] == peak
    i = data["variants"].index(data["best"])
    assert data["step_time_s"][i] == pytest.approx(best["step_time_s"], rel=1e-12)
    assert data["peak_gib"][data["variants"].index("ZeRO-0 + CPU")] < data["peak_gib"][data["variants"].index("ZeRO-0")]


def test_distinct_layouts_in_the_batch(report):
    layouts = [tuple(t["config"][k] for k in ("tp", "cp", "pp", "vp", "ep", "dp", "mbs", "zero_stage")) for t in report["result"]["top"]]
    assert len(layouts) == 3 and len(set(layouts)) == 3 and report["result"]["distinct_layouts"] is True
