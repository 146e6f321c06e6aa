"""Megatron-Core 0.16.1's own dataclasses read every Megatron-LM launch script exported from
the shipped results: each flag is mapped to the field Megatron-LM's arguments.py fills from it
(core_v0.16 generates most flags from these dataclasses: `--foo-bar` -> `foo_bar`), and
TransformerConfig / MLATransformerConfig, OptimizerConfig and DistributedDataParallelConfig
are constructed, so their __post_init__ checks run (heads vs TP, query groups, layers per
(virtual) stage, recompute settings, first/last stage layers, MoE and MLA fields). A flag
that maps to no field and is not one of arguments.py's own flags fails the test (Megatron-LM
would exit on it). Megatron-LM's validate_args (world size, batch, experts vs EP) ships in the
megatron-core wheel only from 0.17, which needs Python 3.12: its rules are applied here to the
same flags, and say so."""

import dataclasses
import typing

import pytest

from launch_scripts import script_args, script_world, with_flag
from shipped_exports import accepted, exports, need

need("megatron.core")
import torch  # noqa: E402
from megatron.core.distributed import DistributedDataParallelConfig  # noqa: E402
from megatron.core.optimizer import OptimizerConfig  # noqa: E402
from megatron.core.transformer import MLATransformerConfig, TransformerConfig  # noqa: E402

#: arguments.py flags that set a field of another name (or several)
RENAMED = {
    "--swiglu": {"gated_linear_unit": True, "activation_func": torch.nn.functional.silu},
    "--disable-bias-linear": {"add_bias_linear": False},
    "--num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size",
    "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
    "--microbatch-group-size-per-virtual-pipeline-stage": "microbatch_group_size_per_vp_stage",
    "--no-overlap-p2p-communication": {"overlap_p2p_comm": False},
    "--bf16": {"bf16": True, "params_dtype": torch.bfloat16},
    "--fp16": {"fp16": True, "params_dtype": torch.float16},
    "--fp8-format": "fp8",
    "--accumulate-allreduce-grads-in-fp32": {"grad_reduce_in_fp32": True},
    "--grad-reduce-in-bf16": {"grad_reduce_in_fp32": False},
    "--qk-head-dim": "qk_head_dim",
    "--qk-pos-emb-head-dim": "qk_pos_emb_head_dim",
    "--cpu-offloading": {"cpu_offloading": True},
    "--multi-latent-attention": {},
    "--num-experts": "num_moe_experts",
}
#: arguments.py's own flags (training loop, data, GPTModel): no dataclass field in 0.16
LM_ONLY = {"--micro-batch-size", "--global-batch-size", "--train-iters", "--save-interval", "--seq-length",
           "--max-position-embeddings", "--untie-embeddings-and-output-weights", "--position-embedding-type",
           "--group-query-attention", "--optimizer", "--attention-backend"}
CLASSES = (TransformerConfig, MLATransformerConfig, OptimizerConfig, DistributedDataParallelConfig)


@pytest.fixture(autouse=True)
def transformer_engine_2_9(monkeypatch):
    """OptimizerConfig asks for Transformer Engine >= 2.1 when the precision-aware (CPU)
    optimizer is on; a launch has TE (megatron-core 0.16.1's dev extra pins >= 2.9), this CPU
    machine does not: the version query stands in for it. Nothing else is patched."""
    from packaging.version import Version

    import megatron.core.optimizer.optimizer_config as optimizer_config
    monkeypatch.setattr(optimizer_config, "is_te_min_version", lambda v, check_equality=True: Version("2.9.0") >= Version(v))


def field_types(cls) -> dict:
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(cls)}


TYPES = {}
for _cls in CLASSES:
    TYPES.update(field_types(_cls))


def value_of(field: str, words: list[str]):
    hint = TYPES[field]
    text = " ".join(str(hint).split())
    if not words:
        return True
    if len(words) == 1 and not words[0].startswith("[") and "str" in text and "int" not in text:
        return words[0]  # a str-or-list field given one word (--cp-comm-type p2p): arguments.py passes the string
    if "list" in text.lower() and ("int" in text or "str" in text) and (len(words) > 1 or words[0].startswith("[") or "str" in text):
        if words[0].startswith("["):
            return [int(x) for x in words[0].strip("[]").split(",")]
        return [int(w) for w in words] if "int" in text and "str" not in text else list(words)
    for conv in (int, float):
        try:
            return conv(words[0])
        except ValueError:
            pass
    return words[0]


def groups(args: list[str]) -> list[list[str]]:
    out = []
    for w in args:
        if w.startswith("--"):
            out.append([w])
        else:
            out[-1].append(w)
    return out


def configs(args: list[str]):
    """(TransformerConfig, OptimizerConfig, DistributedDataParallelConfig, {LM-only flag: value})."""
    values, lm = {}, {}
    for flag, *words in groups(args):
        if flag in RENAMED:
            target = RENAMED[flag]
            values.update(target if isinstance(target, dict) else {target: value_of(target, words)})
        elif flag in LM_ONLY:
            lm[flag] = words[0] if words else True
        elif flag.startswith("--no-") and flag[5:].replace("-", "_") in TYPES:
            values[flag[5:].replace("-", "_")] = False
        elif flag[2:].replace("-", "_") in TYPES:
            name = flag[2:].replace("-", "_")
            values[name] = value_of(name, words)
        else:
            raise AssertionError(f"{flag}: no Megatron-Core field and not an arguments.py flag")
    # core_transformer_config_from_args: the pipeline's p2p buffers take the parameters' dtype
    values.setdefault("pipeline_dtype", values.get("params_dtype", torch.float32))
    mla = "--multi-latent-attention" in args
    tf_cls = MLATransformerConfig if mla else TransformerConfig
    pick = lambda cls: {k: v for k, v in values.items() if k in field_types(cls)}  # noqa: E731
    used = set(pick(tf_cls)) | set(pick(OptimizerConfig)) | set(pick(DistributedDataParallelConfig))
    assert used == set(values), f"flags for fields of another model class: {sorted(set(values) - used)}"
    tf = tf_cls(**pick(tf_cls))
    opt = OptimizerConfig(**pick(OptimizerConfig))
    ddp = DistributedDataParallelConfig(**pick(DistributedDataParallelConfig))
    return tf, opt, ddp, lm


def validate_args_rules(tf, lm, world: int) -> None:
    """Megatron-LM validate_args's world and batch rules (arguments.py; not in the 0.16.1 wheel)."""
    mp = tf.tensor_model_parallel_size * tf.pipeline_model_parallel_size * tf.context_parallel_size
    assert world % mp == 0, f"world size {world} is not divisible by tp*pp*cp = {mp}"
    dp = world // mp
    gbs, mbs = int(lm["--global-batch-size"]), int(lm["--micro-batch-size"])
    assert gbs % (mbs * dp) == 0, f"global batch {gbs} is not divisible by micro batch {mbs} x dp {dp}"
    if tf.num_moe_experts:
        assert tf.num_moe_experts % tf.expert_model_parallel_size == 0, "num_experts % EP"
        edp = world // (tf.expert_tensor_parallel_size * tf.expert_model_parallel_size * tf.pipeline_model_parallel_size)
        assert edp * tf.expert_tensor_parallel_size * tf.expert_model_parallel_size * tf.pipeline_model_parallel_size == world
    cp = tf.context_parallel_size
    assert cp == 1 or int(lm["--seq-length"]) % (2 * cp) == 0, f"sequence length not divisible by 2 x cp = {2 * cp}"


def test_megatron_core_accepts_every_exported_script():
    files = accepted("megatron")
    assert files
    models = set()
    for e in files:
        args = script_args(e.text)
        tf, opt, ddp, lm = configs(args)
        validate_args_rules(tf, lm, script_world(e.text))
        p = e.plan
        assert (tf.tensor_model_parallel_size, tf.pipeline_model_parallel_size, tf.context_parallel_size) == (p.tp, p.pp, p.cp), e.name
        assert (tf.virtual_pipeline_model_parallel_size or 1) == p.vp, e.name
        assert ddp.use_distributed_optimizer == (p.zero_stage >= 1), e.name
        assert tf.num_layers == p.model.num_layers and tf.num_attention_heads == p.model.num_heads, e.name
        if p.model.moe:
            assert (tf.num_moe_experts, tf.expert_model_parallel_size, tf.moe_router_topk) == (p.model.moe.num_experts, p.ep, p.model.moe.top_k), e.name
        if p.pipeline_layout is not None:  # parsed and checked against the layers and MTP modules by Megatron-Core
            assert tf.pipeline_model_parallel_layout.virtual_pipeline_model_parallel_size == p.vp, e.name
        if isinstance(p.activation_offload, list):  # fine-grained offload: its module list checked by TransformerConfig
            assert tf.fine_grained_activation_offloading and tf.offload_modules == p.activation_offload, e.name
        models.add(p.model.name)
    print(f"Megatron-Core accepted {len(files)} scripts of {sorted({e.problem for e in files})}")
    assert {"llama3-405b", "deepseek-v3"} <= models
    # the layout split (costmodel.layout): DeepSeek-V3 on pp 16 x vp 2, launchable only by a layout string
    assert any(e.plan.layer_split == "layout" and e.plan.pipeline_layout for e in files)
    assert any(isinstance(e.plan.activation_offload, list) and e.plan.pp > 1 for e in files)  # fine-grained offload with a pipeline


def test_megatron_core_rejects_broken_scripts():
    dense = next(e for e in accepted("megatron") if e.plan.model.name == "llama3-405b")
    args = script_args(dense.text)
    with pytest.raises((AssertionError, ValueError)):  # TP that does not divide the 128 heads
        configs(with_flag(args, "--tensor-model-parallel-size", "3"))
    with pytest.raises(AssertionError, match="world size"):  # a world tp*pp*cp does not divide
        tf, _, _, lm = configs(args)
        validate_args_rules(tf, lm, script_world(dense.text) + 1)  # odd; tp*pp*cp is even for 405B
    with pytest.raises(AssertionError, match="no Megatron-Core field"):  # a misspelt flag
        configs([*args, "--tensor-model-paralel-size", "8"])
    moe = next(e for e in accepted("megatron") if e.plan.model.name == "deepseek-v3")
    with pytest.raises((AssertionError, ValueError)):  # a recompute module Megatron-Core does not know
        configs([*script_args(moe.text), "--recompute-granularity", "selective", "--recompute-modules", "core_attention"])
    offload = next(e for e in accepted("megatron") if isinstance(e.plan.activation_offload, list))
    with pytest.raises(ValueError, match="attn_proj cannot be set"):  # attn_proj without core_attn (costmodel.rules refuses it)
        configs(with_flag(script_args(offload.text), "--offload-modules", "attn_proj"))
    with pytest.raises(AssertionError, match="MTP"):  # EP overlap with DeepSeek-V3's MTP layer on one stage (the exporter refuses it)
        configs([*with_flag(script_args(moe.text), "--pipeline-model-parallel-size", "1"), "--overlap-moe-expert-parallel-comm"])


def test_megatron_refusals_say_why():
    refused = [e for e in exports("megatron") if e.refused]
    assert all(e.refused.startswith("Megatron-LM cannot run this plan: ") for e in refused)
