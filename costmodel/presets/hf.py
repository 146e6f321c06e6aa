"""A ModelSpec from a Hugging Face config.json, offline.

Reads the field names of Llama, Mistral/Mixtral, Qwen2/3(-MoE, -Next, 3.5), DeepSeek-V2/V3,
GPT-OSS, OLMo and GPT-2 configs (a multimodal config's `text_config` is the language model).
Every key is either used, known not to change cost (tokenizer ids, RoPE, initialisation,
loss coefficients ...) or reported: the returned notes list each key that was not used, so
nothing is dropped silently.
"""

from __future__ import annotations

import json
from pathlib import Path

from costmodel.specs import ModelSpec

#: keys that do not change FLOPs, memory or communication
NO_COST = {
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "use_cache", "bos_token_id", "eos_token_id",
    "pad_token_id", "initializer_range", "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
    "max_position_embeddings", "max_window_layers", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "attention_dropout",
    "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "router_aux_loss_coef", "output_router_logits", "norm_topk_prob",
    "routed_scaling_factor", "aux_loss_alpha", "seq_aux", "topk_method", "ep_size", "moe_layer_freq", "tie_word_embeddings",
    "_name_or_path", "name_or_path", "quantization_config", "auto_map", "use_sliding_window", "full_attention_interval",
    "n_positions", "n_ctx", "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "scale_attn_weights", "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx", "task_specific_params",
    "mtp_use_dedicated_embeddings", "attn_output_gate", "router_jitter_noise", "swiglu_limit",
    "initial_context_length", "rope_interleave", "qk_rope_head_dim_interleave", "use_qk_norm", "qk_layernorm", "layer_types",
    "sliding_window", "num_nextn_predict_layers", "mtp_num_hidden_layers", "scoring_func", "n_group", "topk_group", "linear_num_key_heads",
    "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "decoder_sparse_step",
    "mlp_only_layers", "first_k_dense_replace", "moe_intermediate_size", "shared_expert_intermediate_size", "n_shared_experts",
    "n_routed_experts", "num_local_experts", "num_experts", "num_experts_per_tok", "experts_per_token", "kv_lora_rank", "q_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_hidden_layers", "n_layer", "hidden_size", "n_embd",
    "num_attention_heads", "n_head", "num_key_value_heads", "head_dim", "intermediate_size", "n_inner", "vocab_size",
    "hidden_act", "activation_function", "attention_bias", "mlp_bias", "bias", "text_config",
    "pretraining_tp",  # Llama: how the weights were sliced during pretraining, not a different architecture
}
#: keys whose effect on cost is small and not modelled: used nowhere, named in the notes
NOT_MODELLED = {
    "scoring_func": "the router's scoring function (softmax or sigmoid) changes a few elementwise ops",
    "n_group": "group-limited routing is modelled through topk_group (max nodes per token)",
}
QK_NORM_MODELS = {"qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text", "olmo2", "olmoe"}
ATTENTION_TYPES = {"full_attention": "full_attention", "attention": "full_attention", "sliding_attention": "sliding_attention",
                   "linear_attention": "linear_attention"}


def model_from_hf_config(path: Path, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json; its `notes` list what was not used."""
    if not path.is_file():
        raise ValueError(f"hf_config file not found: {path}")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f" at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise ValueError(f"hf_config {path} is not valid JSON: {getattr(exc, 'msg', exc)}{where}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"hf_config {path} is not a JSON object")
    cfg = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw
    model_type = str(cfg.get("model_type", raw.get("model_type", "")))

    def need(*keys):
        for k in keys:
            if k in cfg:
                return cfg[k]
        raise ValueError(f"hf_config {path} lacks {' / '.join(keys)}")

    act = str(cfg.get("hidden_act", cfg.get("activation_function", "silu"))).lower()
    gpt2 = "n_layer" in cfg
    hidden = need("hidden_size", "n_embd")
    data = dict(
        name=name or cfg.get("_name_or_path") or raw.get("_name_or_path") or path.stem,
        source=f"Hugging Face config {path.name}",
        num_layers=need("num_hidden_layers", "n_layer"),
        hidden_size=hidden,
        num_heads=need("num_attention_heads", "n_head"),
        num_kv_heads=cfg.get("num_key_value_heads"),
        head_dim=cfg.get("head_dim"),
        ffn_hidden_size=cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * hidden,
        vocab_size=need("vocab_size"),
        activation="swiglu" if act in ("silu", "swish", "swiglu") else ("squared_relu" if "relu2" in act else "gelu"),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", gpt2)),
        norm="layernorm" if ("layer_norm_eps" in cfg or "layer_norm_epsilon" in cfg) else "rmsnorm",
        linear_bias=bool(cfg.get("attention_bias") or cfg.get("mlp_bias") or cfg.get("bias") or gpt2),
        position_embedding="learned" if gpt2 else "rope",
        qk_layernorm=bool(cfg.get("qk_layernorm") or cfg.get("use_qk_norm") or model_type in QK_NORM_MODELS),
        # DeepSeek-V3 names its MTP modules num_nextn_predict_layers, Qwen3-Next/3.5 mtp_num_hidden_layers
        mtp_layers=int(cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers") or 0),
        attention_output_gate=bool(cfg.get("attn_output_gate")),
        attention_sinks=model_type == "gpt_oss",  # GptOssAttention.sinks: no config key, always there
    )
    if cfg.get("kv_lora_rank"):
        data["mla"] = dict(
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=cfg["kv_lora_rank"],
            qk_nope_head_dim=need("qk_nope_head_dim"),
            qk_rope_head_dim=need("qk_rope_head_dim"),
            v_head_dim=need("v_head_dim"),
        )
        data["num_kv_heads"] = None
        data["head_dim"] = None
    experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts:
        shared_size = cfg.get("shared_expert_intermediate_size")
        data["moe"] = dict(
            num_experts=experts,
            top_k=need("num_experts_per_tok", "experts_per_token"),
            expert_ffn_hidden_size=cfg.get("moe_intermediate_size") or data["ffn_hidden_size"],
            num_shared_experts=cfg.get("n_shared_experts") or (1 if shared_size else 0),
            shared_expert_ffn_hidden_size=shared_size,
            first_dense_layers=cfg.get("first_k_dense_replace") or 0,
            sparse_step=cfg.get("decoder_sparse_step") or 1,
            dense_layers=list(cfg.get("mlp_only_layers") or []),
            max_nodes_per_token=cfg.get("topk_group") if cfg.get("n_group") else None,
        )
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        unknown = sorted({t for t in layer_types if t not in ATTENTION_TYPES})
        if unknown:
            raise ValueError(f"hf_config {path}: layer_types holds {unknown} (known: {', '.join(ATTENTION_TYPES)})")
        data["layer_types"] = [ATTENTION_TYPES[t] for t in layer_types]
    elif cfg.get("sliding_window") and cfg.get("use_sliding_window", True) and model_type in ("mistral", "mixtral"):
        data["layer_types"] = ["sliding_attention"] * data["num_layers"]  # Mistral: every layer slides
    if data.get("layer_types") and "sliding_attention" in data["layer_types"]:
        data["sliding_window"] = need("sliding_window")
    if cfg.get("linear_num_value_heads"):
        data["linear_attention"] = dict(
            num_key_heads=need("linear_num_key_heads"),
            num_value_heads=need("linear_num_value_heads"),
            key_head_dim=need("linear_key_head_dim"),
            value_head_dim=need("linear_value_head_dim"),
            conv_kernel=cfg.get("linear_conv_kernel_dim", 4),
        )
    notes = [f"{key}: {why} (not modelled)" for key, why in NOT_MODELLED.items() if key in cfg]
    if cfg is not raw:
        others = sorted(k for k in raw if k not in NO_COST and k != "text_config")
        if others:
            notes.append("outside text_config, not modelled (the language model only): " + ", ".join(others))
    ignored = sorted(k for k in cfg if k not in NO_COST and k not in NOT_MODELLED)
    if ignored:
        notes.append("unknown keys, ignored: " + ", ".join(ignored))
    data["notes"] = notes
    return ModelSpec.model_validate(data)
