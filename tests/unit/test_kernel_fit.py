"""Kernel-level terms fitted to timings measured on an H100 (calibration/kernels/h100-sxm, taken
with bench/device/measure_kernels.py on one NVIDIA H100 80GB HBM3, torch 2.11 / CUDA 13.0 /
cuDNN 9.19, two repeated runs; see its README)."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from calibration import kernels
from costmodel.compute import ComputeModel
from costmodel.presets.hardware import DEFAULT_EFFICIENCY, HARDWARE

ROOT = Path(__file__).resolve().parents[2]
TABLES = ROOT / "calibration" / "kernels" / "h100-sxm"


@pytest.fixture(scope="module")
def fit():
    return kernels.fit_chip(TABLES, HARDWARE["h100-sxm"])


def test_committed_kernel_preset_is_what_the_tables_give(fit):
    """costmodel/presets/kernels/gh100.yaml is reproducible from the committed tables: nothing in
    it is edited by hand."""
    committed = yaml.safe_load((ROOT / "costmodel" / "presets" / "kernels" / "gh100.yaml").read_text())["efficiency"]
    assert committed == kernels.profile_fields(fit)


def test_gemm_model_predicts_layers_of_models_it_never_saw(fit):
    """Leave-one-model-out on the forward, data- and weight-gradient GEMMs of Llama 3 8B/70B/405B
    and MPT-7B/30B under TP 1-8: the bf16 model's median error within 6% and its 90th percentile
    within 15% (measured 4.1% / 10.4%); the repeat-to-repeat spread of the same kernels is 1.6% /
    5.4%, the floor under any model."""
    cv = fit["gemm_bf16"]["cross_validated_layers"]
    assert cv.n == 612
    assert cv.median_abs_pct < 6.0 and cv.p90_abs_pct < 15.0
    assert fit["repeat_spread_gemm"].median_abs_pct < 3.0


def test_wave_quantization_is_rejected_by_the_h100_timings(fit):
    """cuBLAS on Hopper runs persistent (stream-K style) kernels: a last-wave loss with 128x256 tiles,
    the term the profile used before it was measured, predicts held-out layers at least twice as
    badly as no wave term."""
    forms = fit["gemm_bf16"]["forms"]
    assert fit["gemm_bf16"]["form"] == "roofline"
    assert forms["roofline+wave128x256"].median_abs_pct > 2 * forms["roofline"].median_abs_pct


def test_attention_curves_fit_and_fp8_is_faster_than_bf16(fit):
    """Causal forward at head dim 128: cuDNN's fused attention (what Transformer Engine calls)
    near twice PyTorch's FlashAttention-2 backend, both within 5% median of their curve; the
    backward about 3x the forward (FlashAttention-2's 2.5 FLOP ratio plus its lower efficiency)."""
    att = fit["attention"]["backends"]
    assert att["cudnn"]["fit"].median_abs_pct < 5.0 and att["flash"]["fit"].median_abs_pct < 5.0
    assert 1.6 < att["cudnn"]["peak_fraction"] / att["flash"]["peak_fraction"] < 2.2
    assert 2.6 < fit["attention"]["backward_ratio"] < 3.4
    bf16_rate = fit["gemm_bf16"]["peak_fraction"] * 989
    fp8_rate = fit["gemm_fp8"]["peak_fraction"] * 1979
    assert 1.5 < fp8_rate / bf16_rate < 2.0


def test_every_hopper_preset_starts_from_the_measured_kernel_terms():
    for name in ("h100-sxm", "h100-96gb", "h800", "h200"):
        eff = DEFAULT_EFFICIENCY[name]
        assert eff.gemm_tile is None
        assert set(eff.attention_impls) >= {"te", "sdpa"}
        assert "kernel terms measured" in eff.source
    assert DEFAULT_EFFICIENCY["a100-80gb"].gemm_tile is not None  # no A100 timings: unchanged


def test_no_tile_means_no_wave_quantization():
    """With gemm_tile None the GEMM rate depends on arithmetic intensity alone: a shape with a
    nearly empty last wave (133 tiles on 132 SMs) runs at the rate of one with full waves."""
    hw = HARDWARE["h100-sxm"]
    data = hw.model_dump()
    data["efficiency"].update(mode="modified_roofline", gemm_tile=None, gemm_k_half=0.0, kernel_overhead_us=0.0)
    comp = ComputeModel(type(hw).model_validate(data), "bf16", 2)
    # 7 x 19 = 133 and 11 x 12 = 132 output tiles of 128 x 128, both compute-bound
    m, n, k = np.array([7 * 128.0, 11 * 128.0]), np.array([19 * 128.0, 12 * 128.0]), np.array([8192.0, 8192.0])
    rate = 2 * m * n * k / comp.gemm_time_of(m, n, k)
    assert rate[0] == pytest.approx(rate[1], rel=1e-3)
    data["efficiency"]["gemm_tile"] = (128, 128)
    comp = ComputeModel(type(hw).model_validate(data), "bf16", 2)
    waved = 2 * m * n * k / comp.gemm_time_of(m, n, k)
    assert waved[0] / waved[1] == pytest.approx(133 / 264, rel=1e-3)  # 133 tiles in 2 waves of 132


def test_gated_deltanet_runs_far_below_the_gemm_rate(fit):
    """flash-linear-attention's chunked Gated DeltaNet at Qwen3.5's heads (calibration/kernels/
    h100-sxm/linear_attention, 7 calls): at the FLOPs the model counts, 6.0% of the bf16 peak
    (the profile had assumed 30% before it was measured), a forward never under ~0.69 ms (fla's
    per-call dispatch), the backward 3.1x the forward; the forward within 6% median of the curve
    (measured 4.4%), the large calls' backward within 3% (1.1%)."""
    la = fit["linear_attention"]
    assert la["fit"].n == 7 and la["fit"].median_abs_pct < 6.0
    assert 0.03 < la["peak_fraction"] < 0.12 < fit["gemm_bf16"]["peak_fraction"]
    assert 400.0 < la["floor_us"] < 1000.0
    assert 2.6 < la["backward_ratio"] < 3.6 and la["backward_fit"].median_abs_pct < 3.0
    eff = DEFAULT_EFFICIENCY["h200"]  # every Hopper preset starts from it
    assert eff.linear_attention.peak_fraction == pytest.approx(la["peak_fraction"], abs=1e-4)
