"""Lower bounds per phase (costmodel.bounds, seed note 004 "单步耗时"): never above the predicted
step over whole search spaces, and hand arithmetic on a tiny case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from costmodel.configs import ConfigBatch
from costmodel.evaluate import evaluate
from costmodel.loader import build_problem, load_problem
from optimizer.space import SearchSpace

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["tuning/llama3_405b_64gpu_gbs16.yaml", "tuning/deepseek_v3_1024gpu_sn8.yaml",
                                  "tuning/llama3_405b_16384xh100_seq128k.yaml", "memfine/table4_model_i.yaml"])
def test_bounds_never_exceed_the_predicted_step(name):
    """20,000 configurations drawn (seeded) from the problem's whole space (dense, MoE with EP,
    long-sequence CP, MemFine's chunked MoE), the feature rules applied: compute, memory and
    each communication bound are at most the step the model predicts (1e-9 relative: rounding)."""
    problem = load_problem(str(ROOT / "problems" / name))
    space = SearchSpace.from_problem(problem)
    rng = np.random.default_rng(8)
    n = 20000
    cfg = space.combine(rng.integers(len(space.skeletons), size=n), rng.integers(space.num_features, size=n), space.interval())
    cfg = cfg.take(np.flatnonzero(space.feature_ok(cfg)))
    ev = evaluate(problem, cfg, bounds=True)
    finite = np.isfinite(ev.step_time_s)
    assert finite.sum() > 1000
    for key, bound in ev.lower_bounds_s.items():
        assert np.all(bound >= 0), key
        excess = bound[finite] / ev.step_time_s[finite]
        assert excess.max(initial=0) <= 1 + 1e-9, (key, float(excess.max()))
    # the bounds are not vacuous: compute is the largest part of a training step somewhere
    assert (ev.lower_bounds_s["compute"][finite] / ev.step_time_s[finite]).max() > 0.3


def tiny_problem(**config):
    """A 2-layer MHA GeLU model (hidden 1024, 8 heads, FFN 4096, vocabulary 32,000) on the 8
    H100s of one node, compute as the plain roofline without kernel overheads."""
    problem = build_problem({
        "name": "tiny",
        "model": {"name": "tiny", "num_layers": 2, "hidden_size": 1024, "num_heads": 8, "ffn_hidden_size": 4096, "vocab_size": 32000,
                  "activation": "gelu", "norm": "layernorm"},
        "hardware": "h100-sxm",
        "cluster": {"num_gpus": 8, "gpus_per_node": 8},
        "training": {"global_batch_size": 8, "seq_len": 1024},
        "config": config,
    }, "tiny.yaml")
    hw = problem.hardware
    eff = hw.efficiency.model_copy(update={"mode": "roofline", "kernel_overhead_us": 0.0, "stage_overhead_us": 0.0})
    return problem.model_copy(update={"hardware": hw.model_copy(update={"efficiency": eff})})


def test_compute_and_dp_bounds_by_hand():
    """Pure DP (dp 8, mbs 1, DDP) on the tiny model: each GPU runs one sequence of 1024 tokens
    through 2 layers (embedding and head are outside the compute bound). Compute bound = 3 x forward FLOPs / peak: per layer the QKV, output and MLP
    GEMMs, 2 x 1024 x (3 + 1 + 8) x 1024^2 FLOPs, and the causal attention core, 2 x (QK^T, AV) x
    the lower triangle with its diagonal x 1024 dims, 2 x 2 x (1024 x 1025 / 2) x 1024, at the bf16
    peak (roofline). DP bound: the DDP all-reduce of the gradients (the training's gradient
    dtype), 2 x (7/8 x bytes / NVLink bandwidth + 7 node latencies)."""
    problem = tiny_problem(tp=1, pp=1, dp=8, mbs=1, zero_stage=0)
    hw = problem.hardware
    cfg = ConfigBatch.from_specs(problem, [problem.config])
    ev = evaluate(problem, cfg, bounds=True)
    b = {k: float(v[0]) for k, v in ev.lower_bounds_s.items()}
    h, s = 1024, 1024
    gemm = 2 * s * 12 * h * h
    attention = 2 * 2 * (s * (s + 1) / 2) * h
    assert b["compute"] == pytest.approx(2 * 3 * (gemm + attention) / (hw.peak("bf16") * 1e12), rel=1e-9)
    tr = problem.training
    grads = float(ev.memory_bytes["params"][0]) / tr.bytes_of("params") * tr.bytes_of("grads")  # a gradient per parameter held
    link = hw.intra_node_gb_per_s * 1e9
    assert b["comm_dp"] == pytest.approx(2 * (7 / 8 * grads / link + 7 * hw.intra_node_latency_us * 1e-6), rel=1e-9)
    assert b["comm_tp"] == b["comm_cp"] == b["comm_ep"] == 0.0
    assert b["comm"] == b["comm_dp"] and float(ev.step_time_s[0]) >= max(b["compute"], b["memory"], b["comm"])
