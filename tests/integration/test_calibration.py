"""Calibration and validation against public measured runs (issue: calibration)."""

import json
import math
import subprocess
import sys

import pytest
import yaml

from conftest import PROBLEMS, ROOT
from calibration.data import load_points
from calibration.fit import KNOBS, calibrate, default_knobs, point_result
from calibration.resolve import resolve
from costmodel.presets.hardware import DEFAULT_EFFICIENCY, HARDWARE, chip_of

DATA = [str(PROBLEMS / "validation")]
PROFILES = ROOT / "costmodel" / "presets" / "profiles"


def run(*args):
    return subprocess.run([sys.executable, "-m", "mofa", *args], capture_output=True, text=True, timeout=900)


POINTS = load_points([str(PROBLEMS / "validation")])


def chip_points(gpu):
    chip = chip_of(HARDWARE[gpu])
    return [p for p in POINTS if chip_of(p.problem.hardware) == chip]


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm"])
def test_recalibration_reproduces_the_shipped_profile(gpu):
    """The shipped profile is exactly what fitting its knobs on the shipped data produces, with
    fewer knobs than a tenth of the points (issue 9) and each within its physical bounds; it
    was cross-validated by source."""
    shipped = yaml.safe_load((PROFILES / f"{gpu}.yaml").read_text())
    knobs = tuple(shipped["knobs"])
    points = chip_points(gpu)
    assert knobs == default_knobs(points)
    cal = calibrate(points, knobs, loo=False)
    for knob, value in cal.knobs.items():
        assert shipped["knobs"][knob] == pytest.approx(value, abs=1e-4), knob
        assert KNOBS[knob][1] <= value <= KNOBS[knob][2]
    assert len(knobs) <= cal.stats.points / 10
    assert shipped["efficiency"]["calibration"]["cross_validation"] == "source"


def test_a_held_out_source_is_predicted_from_the_others():
    """Leave one source out, for one source: NeMo's long-sequence CP runs on H100 (9 points,
    FP8, Transformer Engine attention, CP 1-32) predicted by the H100 profile fitted on every
    other H100 source, within the issue's 10% per source. The tolerance is the figure
    results/reference/validate.txt records for this source (5.42%, held out. It was 4.29% before
    the attention kernel's grid tail (ComputeModel.attention_time): the tail slows the TP-thin
    attention of the other sources (Llama 3 405B's and Nemotron-4 340B's 12-16 heads a GPU, the
    device steps' short calls), the refit moves the knobs the source shares with them (in the
    full fit the kernel overhead 16.9 -> 14.1 us, the bandwidth decay at scale 0.0075 -> 0): the
    4K-32K rows, whose own TP-thin calls pay the tail, come out 0.3-1.4 points slower (+13.3..+1.6%
    -> +14.1..+1.9%), the 64K-1M rows, whose CP calls are mostly rectangles the tail spares,
    0.6-1.9 points faster (+0.2..-5.5% -> -0.4..-7.3%). Their per-source figure is
    the one the new term costs; over all 133 H100 points the held-out error is 5.03% against
    5.06%. 4.36% before
    torchtitan's 405B CP runs resolved their unstated Float8 and async TP and joined the H100
    fit; 4.35% before
    torchtitan's H100 rows, which the H100 fit shares, repeated K/V to every query head and kept
    their pipeline stages' outputs; 4.6% before the
    other sources gained torchtitan's per-op checkpointing rows; 6.0% before the
    device steps' fp32 weights were cast under autocast, which a 30 us per-kernel overhead stood
    in for; 6.4% before the async backward TP collectives slowed only the GEMM they overlap, eq.
    24's form; 7.0% before
    the column-parallel backward hid its collective behind wgrad as Megatron does and the fit
    took the contention of overlapped data-parallel collectives). It was 22.1% while
    the source left CP's ring exchange unoverlapped, which Transformer Engine always overlaps with
    the attention of the block in hand: the held-out fit then priced the exposed inter-node ring
    with a cluster bandwidth no other source pins down, and missed the 512K and 1M rows by 54%."""
    points = chip_points("h100-sxm")
    source = "NeMo long-sequence context parallelism on H100 (Llama 2 7B, FP8)"
    others = [p for p in points if p.source != source]
    held = [p for p in points if p.source == source]
    assert len(held) == 9
    cal = calibrate(others, default_knobs(points), loo=False)
    errors = []
    for p in held:
        hw = p.problem.hardware.model_copy(update={"efficiency": cal.hardware.efficiency})
        cfg, chosen = resolve(p, hw)
        r = point_result(p, hw, cfg, chosen)
        assert r.scored
        errors.append(abs(r.error_pct))
    assert sum(errors) / len(errors) <= 5.42 + 0.005  # the recorded figure, to its printed precision


def test_presets_use_the_calibrated_profiles():
    """A calibrated profile serves every preset on its chip."""
    for gpu in ("a100-80gb", "a100-40gb", "h100-sxm", "h100-96gb", "h800", "h200"):
        assert HARDWARE[gpu].efficiency.calibration is not None
        assert HARDWARE[gpu].efficiency != DEFAULT_EFFICIENCY[gpu]
    assert HARDWARE["a100-40gb"].efficiency == HARDWARE["a100-80gb"].efficiency


def test_validate_reports_per_source_unexplained_and_skipped():
    out = run("validate", str(PROBLEMS / "validation"), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    for key in ("points", "mape_pct", "per_hardware", "per_source", "unexplained", "skipped", "peak_memory"):
        assert key in doc
    for point in doc["points"]:
        if point["unexplained"]:
            assert point["error_pct"] is None  # never scored
        else:
            assert point["error_pct"] == pytest.approx(100 * (point["predicted_step_s"] / point["measured_step_s"] - 1))
    unexplained = {u["name"]: u["reason"] for u in doc["unexplained"]}
    assert "GiB" in unexplained["llama3-405b-8192gpu_seq8k"]  # the model's memory estimate does not fit it
    assert doc["scored"] == sum(1 for p in doc["points"] if p["fitted"] and not p["unexplained"])
    assert len(doc["skipped"]) == 8 + 11 and all(s["reason"] for s in doc["skipped"])  # the B200 table's 8 rows, 11 device OOM configurations
    memory = doc["peak_memory"]
    assert memory["n"] >= 10
    stated = [p for p in doc["points"] if p["memory_error_pct"] is not None and not p["unexplained"]]
    assert memory["n"] == len(stated) == sum(s["n"] for s in memory["per_source"].values())
    assert memory["within_bar"] == sum(1 for p in stated if abs(p["memory_error_pct"]) <= memory["bar_pct"])
    strict = run("validate", str(PROBLEMS / "validation"), "--max-mape", "0.5")
    assert strict.returncode == 1 and "exceeds --max-mape" in strict.stderr


def test_every_metric_converts_to_a_step_time():
    points = load_points(DATA)
    assert {p.measured.metric for p in points} >= {"iteration_time_s", "model_tflops_per_gpu", "tokens_per_s_per_gpu"}
    for p in points:
        assert 0.01 < p.step_time_s() < 1000  # the device source's single-GPU 1B steps take 66 ms
    # Nemotron reports MFU next to its iteration time: our FLOP count reproduces it within 2%
    for p in points:
        if p.measured.reported_mfu:
            from costmodel.flops import model_flops_per_token

            tr = p.problem.training
            flops = tr.global_batch_size * tr.seq_len * model_flops_per_token(p.problem.model, tr.seq_len)
            mfu = flops / (p.step_time_s() * p.problem.cluster.num_gpus * 989e12)
            assert mfu == pytest.approx(p.measured.reported_mfu, rel=0.02), p.name


def test_predictions_carry_a_calibrated_interval():
    out = json.loads(run("evaluate", str(PROBLEMS / "tuning" / "llama3_405b_16384xh100_seq8k.yaml"), "--set", "tp=8", "--set", "pp=16", "--set", "vp=4", "--set", "layer_split=embedding_loss", "--set", "recompute=full", "--set", "zero_stage=1", "--json").stdout)
    lo, hi = out["step_time_interval_s"]
    sd = HARDWARE["h100-sxm"].efficiency.calibration.log_residual_sd
    assert lo < out["step_time_s"] < hi
    assert hi / out["step_time_s"] == pytest.approx(math.exp(1.645 * sd))


@pytest.mark.parametrize("nodes,mttf_h", [(16384 // 8, 1.8), (131072 // 8, 0.23)])
def test_meta_job_mttf_projections(nodes, mttf_h):
    """Kokolis et al. 2024 (arXiv 2410.21680): r_f = 6.5 failures per 1000 node-days projects a
    job MTTF of 1.8 h at 16,384 GPUs and 0.23 h at 131,072 GPUs."""
    out = json.loads(run("ettr", "--nodes", str(nodes), "--failure-rate", "0.0065", "--repair-time", "300", "--save-time", "300", "--step-time", "10", "--json").stdout)
    assert round(out["job_mttf_h"], 2 if mttf_h < 1 else 1) == mttf_h


def test_llama3_interruption_rate():
    """Llama 3 herd section 3.3.4: 419 unexpected interruptions in 54 days on 16,384 GPUs
    (2,048 nodes) -- a failure every ~3.1 hours."""
    r_f = 419 / 54 / 2048
    out = json.loads(run("ettr", "--nodes", "2048", "--failure-rate", str(r_f), "--repair-time", "600", "--save-time", "3", "--step-time", "6.5", "--steps", "1000000", "--json").stdout)
    assert out["job_mttf_h"] == pytest.approx(54 * 24 / 419, rel=1e-9)
    assert 0.9 < out["ettr"] < 1.0  # Meta reports > 90% effective training time
