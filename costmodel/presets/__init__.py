"""Preset registries and the resolution of the `model:` and `hardware:` fields of a problem.

A field may be a preset name, an inline spec, a preset with overrides
(`{preset: h100-sxm, memory_mib: 95830}`), or for models `{hf_config: path/to/config.json}`
(read offline, relative to the problem file).
"""

from __future__ import annotations

import json
from pathlib import Path

from costmodel.presets.hardware import HARDWARE
from costmodel.presets.models import MODELS
from costmodel.specs import HardwareSpec, ModelSpec

__all__ = ["HARDWARE", "MODELS", "resolve_model", "resolve_hardware", "model_from_hf_config"]


def _lookup(registry: dict, name: str, kind: str):
    key = name.strip().lower()
    if key not in registry:
        raise ValueError(f"unknown {kind} preset '{name}' (known: {', '.join(sorted(registry))})")
    return registry[key]


def _merge(base: dict, overrides: dict) -> dict:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _with_overrides(base, overrides: dict, spec_type):
    """A preset with some fields replaced, nested sections merged key by key."""
    if not overrides:
        return base
    return spec_type.model_validate(_merge(base.model_dump(), overrides))


def resolve_model(value, base_dir: str | None = None):
    if isinstance(value, ModelSpec):
        return value
    if isinstance(value, str):
        return _lookup(MODELS, value, "model")
    if isinstance(value, dict):
        value = dict(value)
        if "hf_config" in value:
            path = Path(value.pop("hf_config"))
            if not path.is_absolute() and base_dir:
                path = Path(base_dir) / path
            base = model_from_hf_config(path, value.pop("name", None))
            return _with_overrides(base, value, ModelSpec)
        if "preset" in value:
            base = _lookup(MODELS, str(value.pop("preset")), "model")
            return _with_overrides(base, value, ModelSpec)
    return value  # an inline spec: pydantic validates it


def resolve_hardware(value):
    if isinstance(value, HardwareSpec):
        return value
    if isinstance(value, str):
        return _lookup(HARDWARE, value, "hardware")
    if isinstance(value, dict) and "preset" in value:
        value = dict(value)
        base = _lookup(HARDWARE, str(value.pop("preset")), "hardware")
        return _with_overrides(base, value, HardwareSpec)
    return value


def model_from_hf_config(path: Path, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json (Llama, Mistral/Mixtral, Qwen2/3(-MoE),
    DeepSeek-V2/V3 field names)."""
    if not path.is_file():
        raise ValueError(f"hf_config file not found: {path}")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"hf_config {path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    cfg = cfg.get("text_config", cfg)

    def need(*keys):
        for k in keys:
            if k in cfg:
                return cfg[k]
        raise ValueError(f"hf_config {path} lacks {' / '.join(keys)}")

    act = str(cfg.get("hidden_act", "silu")).lower()
    data = dict(
        name=name or cfg.get("_name_or_path") or path.stem,
        source=f"Hugging Face config {path.name}",
        num_layers=need("num_hidden_layers", "n_layer"),
        hidden_size=need("hidden_size", "n_embd"),
        num_heads=need("num_attention_heads", "n_head"),
        num_kv_heads=cfg.get("num_key_value_heads"),
        head_dim=cfg.get("head_dim"),
        ffn_hidden_size=cfg.get("intermediate_size") or 4 * need("hidden_size", "n_embd"),
        vocab_size=need("vocab_size"),
        activation="swiglu" if act in ("silu", "swish", "swiglu") else ("squared_relu" if "relu2" in act else "gelu"),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
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
        data["moe"] = dict(
            num_experts=experts,
            top_k=need("num_experts_per_tok"),
            expert_ffn_hidden_size=cfg.get("moe_intermediate_size") or data["ffn_hidden_size"],
            num_shared_experts=cfg.get("n_shared_experts") or (1 if cfg.get("shared_expert_intermediate_size") else 0),
            shared_expert_ffn_hidden_size=cfg.get("shared_expert_intermediate_size"),
            first_dense_layers=cfg.get("first_k_dense_replace", 0),
            max_nodes_per_token=cfg.get("topk_group") if cfg.get("n_group") else None,
        )
    return ModelSpec.model_validate(data)
