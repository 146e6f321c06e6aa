"""Model presets against their sources (issue 8, Presets): each preset equals what the Hugging
Face importer reads from its bundled config.json (costmodel/presets/hf_configs), and its
parameter counts reproduce the model card's within a stated tolerance.

Conventions: 'total' is every stored parameter of the language model (embedding and output head
once each unless tied; biases not counted, as for every preset). 'Active' is the matmul
parameters one token passes through in the layers plus the embeddings the card counts: both
(Qwen, Mistral), or only the output head (gpt-oss Table 1, DeepSeek's README_WEIGHTS), said at
each test."""

from pathlib import Path

import pytest

from costmodel import architecture as arch
from costmodel.presets import MODELS
from costmodel.presets.hf import model_from_hf_config

CONFIGS = Path(arch.__file__).parent / "presets" / "hf_configs"
BUNDLED = {
    "qwen3.5-35b-a3b": "qwen3_5_35b_a3b.json",
    "gpt-oss-120b": "gpt_oss_120b.json",
    "mixtral-8x22b": "mixtral_8x22b.json",
    "deepseek-v3": "deepseek_v3.json",
    "llama3.1-405b": "llama3_1_405b.json",
}


def active_params(m, embeddings: int) -> int:
    """Matmul parameters per token over all layers, plus `embeddings` vocabulary matrices."""
    layers = sum(n * arch.active_matmul_params(m, kind) for kind, n in m.kind_counts().items())
    return layers + embeddings * m.vocab_size * m.hidden_size


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_preset_is_its_bundled_config(name):
    """The preset and the import of its config.json agree on every field that changes cost (the
    dense MLP width is skipped where no layer is dense: Qwen3.5's config gives none)."""
    preset = MODELS[name]
    imported = model_from_hf_config(CONFIGS / BUNDLED[name])
    skip = {"name", "source", "notes"} | ({"ffn_hidden_size"} if preset.num_dense_layers == 0 else set())
    assert preset.model_dump(exclude=skip) == imported.model_dump(exclude=skip)
    assert BUNDLED[name] in preset.source


def test_bundled_configs_are_all_cited():
    readme = (CONFIGS / "README.md").read_text()
    files = sorted(p.name for p in CONFIGS.glob("*.json"))
    assert files == sorted(BUNDLED.values())
    assert all(f"`{f}` | https://huggingface.co/" in readme for f in files)


def test_qwen35_35b_a3b_counts():
    """Model card: 35B total, 3B activated. The card rounds to whole billions, so the tolerance
    is that rounding: total within 35 +- 0.5B, active (both embeddings, the convention of the
    Qwen3 presets) within 3 +- 0.5B."""
    m = MODELS["qwen3.5-35b-a3b"]
    assert m.mtp_layers == 1  # config mtp_num_hidden_layers; the card's 35B, like DeepSeek-V3's 671B, is the main model
    assert 34.5e9 <= arch.total_params(m) - arch.mtp_params(m) < 35.5e9
    assert 2.5e9 <= active_params(m, embeddings=2) < 3.5e9
    assert m.kind_counts() == {("linear_attention", "moe"): 30, ("full_attention", "moe"): 10}


def test_gpt_oss_120b_counts():
    """gpt-oss model card (arXiv 2508.10925) Table 1: 116.83B total, 5.13B active (the
    unembedding counted, the embedding not); within 1% (biases and sinks are not counted)."""
    m = MODELS["gpt-oss-120b"]
    assert arch.total_params(m) == pytest.approx(116.83e9, rel=0.01)
    assert active_params(m, embeddings=1) == pytest.approx(5.13e9, rel=0.01)
    assert m.kind_counts() == {("sliding_attention", "moe"): 18, ("full_attention", "moe"): 18} and m.sliding_window == 128


def test_mixtral_8x22b_counts():
    """Mistral AI: 141B parameters, 39B active (given to the billion); within 1% and 1.5%."""
    m = MODELS["mixtral-8x22b"]
    assert arch.total_params(m) == pytest.approx(141e9, rel=0.01)
    assert active_params(m, embeddings=2) == pytest.approx(39e9, rel=0.015)


def test_deepseek_v3_with_mtp_counts():
    """DeepSeek-V3 README_WEIGHTS: 671B main model with 36.7B activated (output head counted),
    one MTP module of 11.5B unique parameters (embedding and head shared with the main model);
    the report: 671B total, 37B activated. Within 1% (main) and 1.5% (MTP: its 11.5B is rounded
    to a tenth of a billion from a larger figure that includes its norms)."""
    m = MODELS["deepseek-v3"]
    assert m.mtp_layers == 1
    mtp = arch.mtp_params(m)
    assert mtp == pytest.approx(11.5e9, rel=0.015)
    assert arch.total_params(m) - mtp == pytest.approx(671e9, rel=0.01)
    assert active_params(m, embeddings=1) == pytest.approx(36.7e9, rel=0.01)


def test_llama31_405b_counts():
    """Model card: 405B parameters; within 1%."""
    m = MODELS["llama3.1-405b"]
    assert arch.total_params(m) == pytest.approx(405e9, rel=0.01)
    assert m.vocab_size == 128256 and MODELS["llama3-405b"].vocab_size == 128000  # the released model, not MoFa's Table 4


def test_gated_attention_widens_the_query_projection():
    """Qwen3.5's gated attention: q_proj emits 2 x heads x head_dim (query and gate), so each of
    the 10 full-attention layers holds h x 16 x 256 more parameters and every token passes
    through them (and its MTP module's full-attention layer); the linear-attention layers are unchanged."""
    m = MODELS["qwen3.5-35b-a3b"]
    plain = m.model_copy(update={"attention_output_gate": False})
    full, linear = ("full_attention", "moe"), ("linear_attention", "moe")
    assert arch.layer_params(m, full) - arch.layer_params(plain, full) == 2048 * 16 * 256
    assert arch.active_matmul_params(m, full) - arch.active_matmul_params(plain, full) == 2048 * 16 * 256
    assert arch.layer_params(m, linear) == arch.layer_params(plain, linear)
    assert arch.total_params(m) - arch.total_params(plain) == (10 + m.mtp_layers) * 2048 * 16 * 256


def test_attention_sinks_are_one_parameter_per_head():
    m = MODELS["gpt-oss-120b"]
    plain = m.model_copy(update={"attention_sinks": False})
    assert arch.total_params(m) - arch.total_params(plain) == 36 * 64
