"""Whole training steps this project measured on one H100 (problems/validation/
device_h100_torch_eager.yaml, from bench/device/measure_steps.py): eager PyTorch Llama 3.2 1B/3B and
a 4-layer Llama 3.1 8B, one GPU, no communication. Its rows were never in a calibration fit."""

from pathlib import Path

import numpy as np
import yaml

from calibration.data import load_source
from calibration.resolve import UNEXPLAINED, resolve
from costmodel.evaluate import evaluate
from costmodel.units import GIB

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "problems" / "validation" / "device_h100_torch_eager.yaml"


def _raw() -> dict:
    return yaml.safe_load(SOURCE.read_text())


def test_what_ran_out_of_memory_does_not_fit_the_model_either():
    """Each configuration that ran out of memory on the 80 GB H100 (the skipped rows) exceeds the
    GPU in the model's memory estimate: the tuner would not propose it."""
    data = _raw()
    impl = {"flash": "sdpa", "cudnn": "te"}
    oom = [entry["row"] for entry in data["skipped"]]
    assert len(oom) == 11
    data["rows"] = [[name, model, seq, mbs, mbs, recompute, impl[backend], 1.0, 80.0] for name, model, seq, mbs, recompute, backend in oom]
    for point in load_source(str(SOURCE), data).points:
        _, chosen = resolve(point)
        assert UNEXPLAINED in chosen, f"{point.name}: the model says it fits"


def test_peak_memory_of_what_fit_within_10_percent():
    """Peak memory against torch.cuda.max_memory_reserved, the fp32 cross-entropy of eager PyTorch
    counted (training.loss_kernel: eager_fp32): every kept row within 10% (measured median 4.6%,
    worst 8.0%; the model is low, the allocator's cached blocks are not in it). With the fused
    loss's ledger the same rows are up to 28% low: that is what the eager loss's transients cost."""
    errors, fused_errors = [], []
    for point in load_source(str(SOURCE)).points:
        cfg, chosen = resolve(point)
        assert UNEXPLAINED not in chosen, point.name
        measured = point.measured.peak_memory_gib
        errors.append(float(evaluate(point.problem, cfg).memory_bytes["peak"][0]) / GIB / measured - 1)
        fused = point.problem.model_copy(update={"training": point.problem.training.model_copy(update={"loss_kernel": "fused"})})
        fused_errors.append(float(evaluate(fused, cfg).memory_bytes["peak"][0]) / GIB / measured - 1)
    assert max(abs(e) for e in errors) < 0.10
    assert min(fused_errors) < -0.25


def test_step_times_within_stated_bounds():
    """The calibrated H100 profile is fitted on these rows with every other H100 source; held out
    by source (results/reference/validate.txt) they are predicted at 6.6% MAPE, and
    before they existed the profile of the time predicted them all low, by 10.6% (eager
    PyTorch's unfused kernels and launch gaps: the fit's per-kernel overhead rose from 10.7 to
    29.5 us with them, and the other sources' held-out errors fell with it). In sample: median
    error within 6%, worst within 15% (measured 4.0% MAPE, worst 11.4%)."""
    errors = []
    for point in load_source(str(SOURCE)).points:
        cfg, _ = resolve(point)
        errors.append(float(evaluate(point.problem, cfg).step_time_s[0]) / point.step_time_s() - 1)
    errors = np.abs(np.array(errors))
    assert np.median(errors) < 0.06 and errors.max() < 0.15
