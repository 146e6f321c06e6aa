"""Megatron-Bridge 0.3.1's own configuration code on exported override files, in a process of
its own (python bridge_check.py < cases.json > verdicts.json).

For each case {"name", "model", "world", "overrides"}: the Bridge pretraining recipe of the
model is built (its ConfigContainer; RECIPES), the exported Hydra dotlist is applied with the
Bridge's own omegaconf utilities (process_config_with_overrides), WORLD_SIZE is set to the
plan's world and ConfigContainer.validate() runs: world size vs model-parallel sizes, sequence
length vs 2 x CP, Megatron-Core's TransformerConfig checks, the DDP / optimizer / scheduler
finalisation. The verdict is "ok" or the exception's type and message.

Why a process of its own: Megatron-Bridge imports Transformer Engine unconditionally, which
needs CUDA to install; standin/transformer_engine lets the import succeed. Megatron-Core is
imported first, so it sees no Transformer Engine (the truth on this machine) and none of its
code paths change; only Megatron-Bridge's import sees the stand-in. The recipes fetch the
model's Hugging Face config.json: an offline cache is seeded from hf_configs/ first."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
REVISION = "0" * 40  # the snapshot name the seeded cache's refs/main points to


def seed_hf_cache() -> str:
    """HF_HOME with hub/models--ORG--NAME/snapshots/REVISION/config.json for hf_configs/*."""
    home = tempfile.mkdtemp(prefix="mofa-hf-")
    for folder in sorted((HERE / "hf_configs").iterdir()):
        if not (folder / "config.json").exists():
            continue
        repo = pathlib.Path(home, "hub", f"models--{folder.name}")
        (repo / "snapshots" / REVISION).mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(REVISION)
        (repo / "snapshots" / REVISION / "config.json").write_text((folder / "config.json").read_text())
    return home


def recipe(model: str):
    """The Bridge ConfigContainer a user would start from for this model."""
    from megatron.bridge import AutoBridge
    from megatron.bridge.recipes.deepseek import deepseek_v3
    from megatron.bridge.recipes.llama import llama2, llama3

    if model == "llama3-405b":
        return llama3.llama31_405b_pretrain_config()
    if model == "deepseek-v3":
        return deepseek_v3.deepseek_v3_pretrain_config()
    if model == "llama2-70b":  # 0.3.1 ships a Llama 2 7B recipe only: its settings, the 70B model the Bridge converts
        from megatron.bridge.training.mixed_precision import get_mixed_precision_config

        cfg = llama2.llama2_7b_pretrain_config()
        cfg.model = AutoBridge.from_hf_pretrained("meta-llama/Llama-2-70b-hf").to_megatron_provider(load_weights=False)
        # this older recipe names its precision ("bf16_mixed"), which a dotlist cannot edit field by
        # field; resolved to the MixedPrecisionConfig it names, as the Llama 3 and DeepSeek recipes hold
        cfg.mixed_precision = get_mixed_precision_config(cfg.mixed_precision)
        return cfg
    raise KeyError(model)


#: the models of the shipped results. (The 8B recipes carry no CommOverlapConfig, so the
#: exported comm_overlap.* overrides cannot apply to them: a Hydra dotlist cannot create it.)
RECIPES = ("llama3-405b", "deepseek-v3", "llama2-70b")
#: appended to every case: two fused kernels Megatron-Core refuses to configure without Transformer
#: Engine, which a launch has and this machine lacks (framework_validation.md: Megatron-LM's
#: --no-rope-fusion): RoPE fusion, and the MoE permutation fusion the DeepSeek-V3 recipe turns on.
#: Performance switches only; nothing the exporter writes.
MACHINE = ["model.apply_rope_fusion=false", "model.moe_permute_fusion=false"]


def check(case: dict) -> str:
    """Apply the overrides, then what pretrain() runs before building the model
    (runtime_config_update: the mixed-precision and comm-overlap setups, which overwrite model,
    optimizer and DDP fields, then ConfigContainer.validate()); then read every overridden field
    back, so that a setting the Bridge silently replaced fails too."""
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    try:
        cfg = recipe(case["model"])
        cfg = process_config_with_overrides(cfg, cli_overrides=[*case["overrides"], *MACHINE])
        os.environ["WORLD_SIZE"] = str(case["world"])
        runtime_config_update(cfg)
    except Exception as exc:  # the verdict: what the framework's own code says
        return f"{type(exc).__name__}: {exc}"
    changed = [f"{key}={value!r} became {got!r}" for key, value, got in read_back(cfg, case["overrides"]) if got != value]
    return "ok" if not changed else "overwritten: " + "; ".join(changed)


def read_back(cfg, overrides: list[str]):
    """(key, the override's value, the value the final config holds) for every `a.b=value`."""
    import yaml

    for line in overrides:
        key, _, text = line.partition("=")
        value = yaml.safe_load(text)
        if isinstance(value, str) and len(text) > 1 and text[0] == text[-1] == '"':
            value = text[1:-1]
        node = cfg
        for part in key.split("."):
            node = getattr(node, part)
        if type(node).__module__ == "torch" and type(node).__name__ == "dtype":
            node = str(node)  # "torch.float32", as the override writes it
        elif type(node).__name__ == "PipelineParallelLayerLayout":
            node = str(node)  # TransformerConfig parsed the layout string; it prints it back
        yield key, value, (list(node) if isinstance(node, tuple) else node)


class H100Properties:
    """What torch.cuda.get_device_properties(0) answers on an H100 (SM 9.0), the shipped problems'
    GPU class: the DeepSeek-V3 recipe asks the device whether DeepEP applies, and this machine
    has no GPU (framework_validation.md: Megatron-LM's own device query is patched the same way)."""

    name = "NVIDIA H100 80GB HBM3"
    major, minor = 9, 0
    total_memory = 81559 * 2**20
    multi_processor_count = 132


def main() -> int:
    cases = json.load(sys.stdin)
    verdict_out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # the Bridge prints its notes; stdout carries the verdicts only
        verdicts = run(cases)
    json.dump(verdicts, verdict_out, indent=1, sort_keys=True)
    return 0


def run(cases: list[dict]) -> dict[str, str]:
    os.environ["HF_HOME"] = seed_hf_cache()
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    import megatron.core.distributed  # noqa: F401  (before the stand-in: Megatron-Core sees no Transformer Engine)
    import megatron.core.fp8_utils  # noqa: F401
    import megatron.core.models.gpt  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.transformer  # noqa: F401
    import torch

    torch.cuda.get_device_properties = lambda device=None: H100Properties()
    sys.path.insert(0, str(HERE / "standin"))
    return {case["name"]: check(case) for case in cases}


if __name__ == "__main__":
    sys.exit(main())
