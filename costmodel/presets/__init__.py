"""Preset registries and the resolution of the `model:` and `hardware:` fields of a problem.

A field may be a preset name, an inline spec, a preset with overrides
(`{preset: h100-sxm, memory_mib: 95830}`), or for models `{hf_config: path/to/config.json}`
(read offline, relative to the problem file).
"""

from __future__ import annotations

from pathlib import Path

from costmodel.presets.hardware import HARDWARE
from costmodel.presets.hf import model_from_hf_config
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
