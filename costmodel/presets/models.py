"""Model presets. Each value names its source; MoFa Table 4 values win where they differ from a
Hugging Face config (the experiments it reproduces used them)."""

from costmodel.specs import LinearAttentionSpec, MLASpec, ModelSpec, MoESpec

MODELS: dict[str, ModelSpec] = {}


def _register(spec: ModelSpec) -> ModelSpec:
    MODELS[spec.name] = spec
    return spec


_register(ModelSpec(
    name="llama2-70b",
    source="MoFa Table 4; Touvron et al. 2023 (arXiv 2307.09288) Table 1; HF meta-llama/Llama-2-70b-hf config.json",
    num_layers=80,  # MoFa Table 4 L
    hidden_size=8192,  # Table 4 h
    num_heads=64,  # Table 4 a
    num_kv_heads=8,  # Table 4 q = 8 query heads per KV head: 64 / 8
    ffn_hidden_size=28672,  # Table 4 g_d
    vocab_size=32000,  # Table 4 V
))

_register(ModelSpec(
    name="llama3-405b",
    source="MoFa Table 4; Llama 3 herd (arXiv 2407.21783) Table 3; calibration.yaml llama3_405b.arch",
    num_layers=126,  # Table 4 L (128 minus one on the first and last stage, Llama 3 ISCA'25 section 3.1.2)
    hidden_size=16384,
    num_heads=128,
    num_kv_heads=8,  # Llama 3 Table 3: 8 KV heads (MoFa Table 4 prints q=16, the query groups per KV head)
    ffn_hidden_size=53248,
    vocab_size=128000,  # Table 4 V (HF tokenizer: 128256)
))

_register(ModelSpec(
    name="deepseek-v3",
    source="MoFa Table 4; DeepSeek-V3 technical report (arXiv 2412.19437) sections 2.1, 2.2, 4.2; HF deepseek-ai/DeepSeek-V3 config.json "
    "(hf_configs/deepseek_v3.json); README_WEIGHTS.md: 671B main model + 11.5B MTP module (embedding and head shared)",
    num_layers=61,  # report 4.2: 61 transformer layers (the MTP module is mtp_layers below)
    hidden_size=7168,
    num_heads=128,
    ffn_hidden_size=18432,  # dense layers' intermediate size
    vocab_size=129280,
    mla=MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),  # report 4.2
    moe=MoESpec(
        num_experts=256,  # routed experts per MoE layer
        top_k=8,
        expert_ffn_hidden_size=2048,
        num_shared_experts=1,
        first_dense_layers=3,  # "all FFNs except for the first three layers" are MoE
        max_nodes_per_token=4,  # node-limited routing, M = 4
    ),
    mtp_layers=1,  # report 2.2: one MTP module (D = 1), costed on the last stage
))

_register(ModelSpec(
    name="gpt3-175b",
    source="Brown et al. 2020 (arXiv 2005.14165) Table 2.1; vocabulary padded to 51200 as in Megatron (Korthikanti et al. 2022 Table 1)",
    num_layers=96,
    hidden_size=12288,
    num_heads=96,
    ffn_hidden_size=4 * 12288,
    vocab_size=51200,
    activation="gelu",
    norm="layernorm",
    tied_embeddings=True,
    dropout=True,
    position_embedding="learned",
    linear_bias=True,
))

_register(ModelSpec(
    name="llama3.1-8b",
    source="HF meta-llama/Llama-3.1-8B config.json",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    ffn_hidden_size=14336,
    vocab_size=128256,
))

_register(ModelSpec(
    name="llama3.1-70b",
    source="HF meta-llama/Llama-3.1-70B config.json",
    num_layers=80,
    hidden_size=8192,
    num_heads=64,
    num_kv_heads=8,
    ffn_hidden_size=28672,
    vocab_size=128256,
))

_register(ModelSpec(
    name="mixtral-8x7b",
    source="HF mistralai/Mixtral-8x7B-v0.1 config.json (num_local_experts 8, num_experts_per_tok 2)",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    ffn_hidden_size=14336,
    vocab_size=32000,
    moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336),
))

_register(ModelSpec(
    name="qwen3-235b-a22b",
    source="HF Qwen/Qwen3-235B-A22B config.json (head_dim 128, moe_intermediate_size 1536, decoder_sparse_step 1)",
    num_layers=94,
    hidden_size=4096,
    num_heads=64,
    num_kv_heads=4,
    head_dim=128,
    ffn_hidden_size=12288,
    vocab_size=151936,
    moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=1536),
    qk_layernorm=True,  # HF Qwen3MoeAttention: q_norm and k_norm
))

_register(ModelSpec(
    name="qwen3-30b-a3b",
    source="HF Qwen/Qwen3-30B-A3B config.json (head_dim 128, moe_intermediate_size 768, decoder_sparse_step 1, no shared expert); model card: 30.5B parameters, 3.3B activated",
    num_layers=48,
    hidden_size=2048,
    num_heads=32,
    num_kv_heads=4,
    head_dim=128,
    ffn_hidden_size=6144,  # intermediate_size: no dense layer uses it (mlp_only_layers is empty)
    vocab_size=151936,
    moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=768),
    qk_layernorm=True,  # HF Qwen3MoeAttention: q_norm and k_norm
))

_register(ModelSpec(
    name="qwen3.5-35b-a3b",
    source="HF Qwen/Qwen3.5-35B-A3B config.json text_config (hf_configs/qwen3_5_35b_a3b.json); model card: 35B total, 3B activated, "
    "hidden layout 10 x (3 x (Gated DeltaNet -> MoE) -> 1 x (Gated Attention -> MoE)); one MTP module (config mtp_num_hidden_layers 1)",
    num_layers=40,  # card: 40 layers
    hidden_size=2048,  # card: hidden dimension 2048
    num_heads=16,  # card: Gated Attention, 16 Q heads
    num_kv_heads=2,  # card: 2 KV heads
    head_dim=256,  # card: head dimension 256
    ffn_hidden_size=512,  # config: no intermediate_size (every layer is MoE); the expert width stands in, used by no layer
    vocab_size=248320,  # card: token embedding 248,320 (padded)
    moe=MoESpec(
        num_experts=256,  # card: 256 experts
        top_k=8,  # card: 8 routed
        expert_ffn_hidden_size=512,  # card: expert intermediate dimension 512
        num_shared_experts=1,  # card: + 1 shared
        shared_expert_ffn_hidden_size=512,  # config: shared_expert_intermediate_size
    ),
    layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 10,  # config layer_types (full_attention_interval 4)
    linear_attention=LinearAttentionSpec(
        num_key_heads=16, num_value_heads=32, key_head_dim=128, value_head_dim=128, conv_kernel=4,  # card: 32 V / 16 QK heads of 128; config linear_conv_kernel_dim
    ),
    qk_layernorm=True,  # HF Qwen3_5Moe attention: q_norm and k_norm
    attention_output_gate=True,  # config attn_output_gate; card: "Gated Attention"
    mtp_layers=1,  # config mtp_num_hidden_layers 1 (trained with multi-token prediction; a full-attention MoE layer, as DeepSeek-V3's)
))

_register(ModelSpec(
    name="gpt-oss-120b",
    source="HF openai/gpt-oss-120b config.json (hf_configs/gpt_oss_120b.json); gpt-oss model card (arXiv 2508.10925) Table 1: "
    "116.83B total, 5.13B active",
    num_layers=36,  # config num_hidden_layers
    hidden_size=2880,
    num_heads=64,
    num_kv_heads=8,
    head_dim=64,
    ffn_hidden_size=2880,  # config intermediate_size: each expert's width (no dense layer)
    vocab_size=201088,  # o200k_harmony, padded
    linear_bias=True,  # config attention_bias; the experts carry biases too (not counted, as for every model)
    moe=MoESpec(num_experts=128, top_k=4, expert_ffn_hidden_size=2880),  # config num_local_experts, experts_per_token
    layer_types=["sliding_attention", "full_attention"] * 18,  # config layer_types: banded window and dense alternate
    sliding_window=128,  # config sliding_window
    attention_sinks=True,  # model card: a learned sink logit per head in every attention layer
))

_register(ModelSpec(
    name="mixtral-8x22b",
    source="HF mistralai/Mixtral-8x22B-v0.1 config.json (hf_configs/mixtral_8x22b.json); Mistral AI announcement: 141B parameters, 39B active",
    num_layers=56,
    hidden_size=6144,
    num_heads=48,
    num_kv_heads=8,
    ffn_hidden_size=16384,
    vocab_size=32000,
    moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=16384),  # config num_local_experts 8, num_experts_per_tok 2
))

_register(ModelSpec(
    name="llama3.1-405b",
    source="HF meta-llama/Llama-3.1-405B config.json (hf_configs/llama3_1_405b.json); model card: 405B. Unlike llama3-405b "
    "(MoFa Table 4's vocabulary of 128,000) this is the released model",
    num_layers=126,
    hidden_size=16384,
    num_heads=128,
    num_kv_heads=8,
    ffn_hidden_size=53248,
    vocab_size=128256,
))

_register(ModelSpec(
    name="nemotron4-340b",
    source="Nemotron-4 340B technical report (arXiv 2406.11704) Table 1; calibration.yaml nemotron4_340b.arch",
    num_layers=96,
    hidden_size=18432,
    num_heads=96,
    num_kv_heads=8,
    ffn_hidden_size=73728,  # 4h, squared-ReLU MLP (not gated)
    vocab_size=256000,
    activation="squared_relu",
    norm="layernorm",
))

_register(ModelSpec(
    name="nemotron4-15b",
    source="Nemotron-4 15B technical report (arXiv 2402.16819) section 2; calibration.yaml nemotron4_15b",
    num_layers=32,
    hidden_size=6144,
    num_heads=48,
    num_kv_heads=8,
    ffn_hidden_size=24576,  # 4h, squared-ReLU MLP
    vocab_size=256000,
    activation="squared_relu",
    norm="layernorm",
))

_register(ModelSpec(
    name="bloom-176b",
    source="BLOOM (arXiv 2211.05100) Table 3; bigscience tr11-176B-ml README; calibration.yaml bloom_176b.arch",
    num_layers=70,
    hidden_size=14336,
    num_heads=112,
    ffn_hidden_size=4 * 14336,  # GeLU MLP of 4h
    vocab_size=250680,
    activation="gelu",
    norm="layernorm",
    tied_embeddings=True,
    position_embedding="alibi",
    linear_bias=True,
))
