"""Model FLOPs against PaLM's count and MoFa Table 6."""

import pytest

from costmodel import architecture as arch
from costmodel.flops import model_flops_per_token, palm_flops_per_token
from costmodel.presets import MODELS


def test_llama3_405b_matches_palm_within_1pct():
    """PaLM Appendix B: 6N + 12*L*H*Q*T per token. Ours counts GQA's smaller K/V projections
    exactly and skips the embedding lookup; for LLaMA3-405B the two agree within 1%."""
    m = MODELS["llama3-405b"]
    ours = model_flops_per_token(m, 8192)
    palm = palm_flops_per_token(m, 8192, arch.total_params(m))
    assert abs(ours / palm - 1) < 0.01


def test_llama3_405b_parameter_count():
    """Llama 3 herd Table 3: 405B parameters (with the 128,000 vocabulary of MoFa Table 4)."""
    assert arch.total_params(MODELS["llama3-405b"]) == pytest.approx(405e9, rel=0.01)


def test_deepseek_v3_parameter_counts():
    """DeepSeek-V3 report: 671B total, 37B activated per token (main model, MTP excluded); the
    Hugging Face card: 685B with the 14B MTP module."""
    m = MODELS["deepseek-v3"]
    assert arch.total_params(m) - m.mtp_layers * arch.mtp_params(m) == pytest.approx(671e9, rel=0.01)
    assert arch.total_params(m) == pytest.approx(685e9, rel=0.01)
    active = m.num_dense_layers * arch.active_matmul_params(m, False) + m.num_moe_layers * arch.active_matmul_params(m, True)
    active += 2 * m.vocab_size * m.hidden_size
    assert active == pytest.approx(37e9, rel=0.03)


def test_mofa_table6_row1_tflops():
    """MoFa Table 6 row 1: LLaMA3-405B, 64 GPUs, GBS 16 (seq 8192), T_step 22.86 s ->
    241.18 TFLOP/s per GPU. Model FLOPs per step / (T_step * GPUs), within 3%."""
    m = MODELS["llama3-405b"]
    flops = 16 * 8192 * model_flops_per_token(m, 8192)
    tflops = flops / (22.86 * 64) / 1e12
    assert tflops == pytest.approx(241.18, rel=0.03)


def test_qwen3_30b_a3b_parameter_counts():
    """Qwen3-30B-A3B model card: 30.5B parameters, 3.3B activated per token."""
    m = MODELS["qwen3-30b-a3b"]
    assert arch.total_params(m) == pytest.approx(30.5e9, rel=0.01)
    active = sum(n * arch.active_matmul_params(m, kind) for kind, n in m.kind_counts().items()) + 2 * m.vocab_size * m.hidden_size
    assert active == pytest.approx(3.3e9, rel=0.03)
