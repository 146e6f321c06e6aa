"""What each training framework can run, as named rules vectorized over configurations.

One implementation serves two callers: the search (`search.framework` / `mofa solve
--framework` restricts the candidates to what one framework runs: costmodel.rules adds these
masks to its own) and the exporters (mofa.launch refuses a plan with the message of the first
rule it breaks, evaluated on the plan as a one-row batch). So a plan the search returns for a
framework is one its exporter accepts, and an exporter refusal names a rule the search knows.

A rule reads configuration columns (a ConfigBatch) and the run's facts that do not vary over
the candidates (`RunFacts`: architecture, dtypes, length, MoE routing, node size). Each rule
lists the configuration fields it reads, so the search can apply it where those fields are
decided (a rule on skeleton fields prunes skeletons; one on a feature prunes combinations; one
on an overlap switch joins that switch's rules). Its message is a template filled with the
facts of a configuration that breaks it (`describe`).

Sources: ../shared/reference/frameworks.md and framework_validation.md, and the pinned
releases tests/frameworks/ installs (Megatron-Core 0.16.1, torchtitan 0.3.0, DeepSpeed 0.19.8),
whose own configuration code checks the exported files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from costmodel.arrays import divides, floor_div
from costmodel.configs import (
    CP_COMM_CODES,
    OFFLOAD_LAYER,
    PP_SCHEDULE_CODES,
    RECOMPUTE_CODES,
    RECOMPUTE_METHOD_NAMES,
    RECOMPUTE_MODULE_BITS,
    ConfigBatch,
    chunks_setting,
)
from costmodel.layout import needs_layout, split_layers
from costmodel.specs import CP_COMMS, PP_SCHEDULES, DtypeSpec, ModelSpec, Problem

Framework = Literal["megatron", "megatron-bridge", "torchtitan", "deepspeed"]
FRAMEWORKS: tuple[str, ...] = ("megatron", "megatron-bridge", "torchtitan", "deepspeed")
#: the name a refusal or an explanation gives each framework
DISPLAY = {"megatron": "Megatron-LM", "megatron-bridge": "Megatron-Bridge", "torchtitan": "torchtitan", "deepspeed": "DeepSpeed"}

S, C, R = PP_SCHEDULE_CODES, CP_COMM_CODES, RECOMPUTE_CODES


class RunFacts(BaseModel):
    """What the rules read besides the configuration: the same for every candidate of a
    problem, and carried by every launch plan."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelSpec
    dtypes: DtypeSpec
    num_gpus: int
    gpus_per_node: int
    train_iters: int | None
    moe_dispatcher: Literal["alltoall", "deepep"]
    moe_capacity_factor: float | None
    attention_kernel: Literal["flash", "unfused"]


def facts_of(problem: Problem) -> RunFacts:
    tr, cl = problem.training, problem.cluster
    return RunFacts(model=problem.model, dtypes=tr.dtypes, num_gpus=cl.num_gpus, gpus_per_node=min(cl.gpus_per_node, cl.num_gpus),
                    train_iters=tr.total_steps, moe_dispatcher=tr.moe.dispatcher, moe_capacity_factor=tr.moe.capacity_factor,
                    attention_kernel=tr.attention_kernel)


# --- what the rules derive from a configuration ---------------------------------------------

def layer_split_codes(num_layers: int, cfg: ConfigBatch) -> np.ndarray:
    """0 single (pp = 1), 1 even, 2 embedding_loss, 3 uneven, 4 layout (only a
    --pipeline-model-parallel-layout states it): the layout a launcher states
    (costmodel.layout.layout_name, per row)."""
    out = np.where(needs_layout(num_layers, cfg), 4.0, 3.0)
    for code, mode in ((2, "embedding_loss"), (1, "even")):  # the first match wins, as in layout_name
        f, la = split_layers(num_layers, cfg.pp, cfg.vp, mode)
        out = np.where((f > 0) & (cfg.first_layers == f) & (cfg.last_layers == la), code, out)
    return np.where(cfg.pp == 1, 0.0, out)


SPLIT_NAMES = ("single", "even", "embedding_loss", "uneven", "layout")


def sharding_group(cfg: ConfigBatch) -> np.ndarray:
    """Ranks a ZeRO stage shards over: the HSDP group, else every dp*cp rank of a stage."""
    return np.where(cfg.dp_shard > 0, cfg.dp_shard, cfg.dp * cfg.cp)


def hybrid_sharded(cfg: ConfigBatch) -> np.ndarray:
    return (cfg.dp_shard > 0) & (cfg.dp_shard < cfg.dp * cfg.cp)


def expert_groups(facts: RunFacts, ep, etp) -> np.ndarray:
    """Node-limited routing (DeepSeek-V3's M nodes per token) as Megatron's group-limited
    routing: one group per node an expert-parallel group spans; 0 where it spans no more nodes
    than a token may reach (the limit changes nothing). The expert grid is tp-ep-dp: the EP
    ranks are consecutive after the expert-TP ranks."""
    moe = facts.model.moe
    ep, etp = np.asarray(ep, dtype=float), np.asarray(etp, dtype=float)
    if moe is None or moe.max_nodes_per_token is None:
        return np.zeros_like(ep * etp)
    nodes = floor_div(ep * etp, facts.gpus_per_node)
    return np.where(nodes > moe.max_nodes_per_token, nodes, 0.0)


def fsdp_tp_ranks(cfg: ConfigBatch) -> np.ndarray:
    """torchtitan's EP borrows ranks of dp_shard x cp x tp (FSDP's shard group only under ZeRO-3)."""
    return np.where(cfg.zero_stage == 3, sharding_group(cfg), 1.0) * cfg.tp


#: torchtitan 0.3.0's config functions (torchtitan/models/<model>/config_registry.py): (module,
#: function, GEMM dtype, the model it builds: layers, hidden, heads, kv heads, vocab, experts).
#: The command line changes neither the architecture nor the quantization.
TORCHTITAN_CONFIGS = (
    ("llama3", "llama3_8b", "bf16", (32, 4096, 32, 8, 128256, None)),
    ("llama3", "llama3_70b", "bf16", (80, 8192, 64, 8, 128256, None)),
    ("llama3", "llama3_405b", "fp8", (126, 16384, 128, 8, 128256, None)),
    ("deepseek_v3", "deepseek_v3_671b", "bf16", (61, 7168, 128, None, 129280, 256)),
    ("deepseek_v3", "deepseek_v3_671b_float8", "fp8", (61, 7168, 128, None, 129280, 256)),
)


def torchtitan_architecture(model: ModelSpec) -> tuple:
    return (model.num_layers, model.hidden_size, model.num_heads, None if model.mla is not None else model.kv_heads, model.vocab_size,
            model.moe.num_experts if model.moe else None)


def torchtitan_functions(model: ModelSpec) -> list[tuple[str, str, str]]:
    """(module, function, GEMM dtype) of each config function that builds this architecture."""
    arch = torchtitan_architecture(model)
    return [(module, function, dtype) for module, function, dtype, built in TORCHTITAN_CONFIGS if built == arch]


# --- the rules ------------------------------------------------------------------------------

Test = Callable[[RunFacts, ConfigBatch], "np.ndarray | bool"]


@dataclass(frozen=True)
class Rule:
    """One thing a framework cannot run: True where `test` says a configuration breaks it.
    `fields`: the configuration fields it reads (none: a fact of the run)."""

    name: str
    fields: tuple[str, ...]
    message: str
    test: Test


def _megatron_rules() -> tuple[Rule, ...]:
    """What neither Megatron-LM nor Megatron-Bridge runs (both build Megatron-Core 0.16.1)."""
    def ep_overlap(cfg):
        return cfg.ep_overlap == 1

    return (
        Rule("moe_chunks", ("moe_chunks",), "moe_chunks={moe_chunks}: Megatron-Core has no chunked MoE dispatch (MemFine's FCDA is ZTE's own)",
             lambda f, c: c.moe_chunks != 1),
        Rule("no_op_recompute", ("recompute", "recompute_modules"),
             "recompute module ops is torchtitan's per-op policy: Megatron's --recompute-modules name modules",
             lambda f, c: (c.recompute == R["selective"]) & ((c.recompute_modules.astype(np.int64) & RECOMPUTE_MODULE_BITS["ops"]) != 0)),
        Rule("no_afab", ("pp", "pp_schedule"),
             "Megatron has no all-forward-all-backward schedule (only 1F1B and interleaved 1F1B; torchtitan runs it as GPipe / LoopedBFS)",
             lambda f, c: (c.pp > 1) & (c.pp_schedule == S["afab"])),
        Rule("no_dualpipev", ("pp", "pp_schedule"), "Megatron has no DualPipeV schedule (torchtitan's DualPipeV does)",
             lambda f, c: (c.pp > 1) & (c.pp_schedule == S["dualpipev"])),
        Rule("fsdp_without_pp", ("zero_stage", "pp"), "Megatron-FSDP (ZeRO-{zero_stage}) does not run with pipeline parallelism",
             lambda f, c: (c.zero_stage >= 2) & (c.pp > 1)),
        Rule("fsdp_reshards", ("zero_stage", "reshard_after_forward"),
             "Megatron-FSDP always frees gathered parameters after the forward (keeping them is torchtitan's fsdp_reshard_after_forward=never)",
             lambda f, c: (c.zero_stage == 3) & (c.reshard_after_forward == 0)),
        Rule("hsdp_zero1_only", ("zero_stage", "dp_shard"),
             "hybrid sharding with ZeRO-{zero_stage} is torchtitan's (data_parallel_replicate_degree), not Megatron's",
             lambda f, c: hybrid_sharded(c) & (c.zero_stage >= 2)),
        Rule("layer_offload_single_stage", ("activation_offload", "pp"),
             "layer activation offload (--cpu-offloading) does not run with pp > 1 (frameworks.md); fine-grained offload of modules does",
             lambda f, c: (c.activation_offload == OFFLOAD_LAYER) & (c.pp > 1)),
        Rule("cpu_optimizer_needs_zero", ("cpu_optimizer", "zero_stage"),
             "the CPU optimizer needs the precision-aware optimizer, which needs the distributed optimizer (Megatron-Core OptimizerConfig)",
             lambda f, c: (c.cpu_optimizer == 1) & (c.zero_stage == 0)),
        Rule("no_alibi", (), "Megatron-Core has no ALiBi position embedding", lambda f, c: f.model.position_embedding == "alibi"),
        Rule("grad_dtype", (), "gradients are reduced in fp32 or bf16 (--grad-reduce-in-bf16), not {grads}",
             lambda f, c: f.dtypes.grads not in ("fp32", "bf16")),
        Rule("optimizer_dtype", (), "optimizer states in {optimizer_dtype}: the exporter writes fp32 Adam states only",
             lambda f, c: f.dtypes.optimizer != "fp32"),
        Rule("param_dtype", (), "parameters in {params}: Megatron keeps bf16, fp16 or fp32 weights",
             lambda f, c: f.dtypes.params not in ("bf16", "fp16", "fp32")),
        # Megatron-Core 0.16.1 TransformerConfig.__post_init__ (overlap_moe_expert_parallel_comm)
        Rule("ep_overlap_mtp", ("ep_overlap", "pp"),
             "EP communication overlap with {mtp_layers} MTP layer(s) and pp={pp}: Megatron-Core runs it with one MTP layer and pp > 1 only",
             lambda f, c: ep_overlap(c) & ((f.model.mtp_layers or 0) > 0) & (((f.model.mtp_layers or 0) > 1) | (c.pp == 1))),
        Rule("ep_overlap_recompute", ("ep_overlap", "recompute"),
             "EP communication overlap with full recompute: Megatron-Core requires recompute off or selective",
             lambda f, c: ep_overlap(c) & (c.recompute == R["full"])),
        Rule("ep_overlap_dtype", ("ep_overlap",),
             "EP communication overlap with {params} parameters: Megatron-Core needs a bf16 or fp16 model",
             lambda f, c: ep_overlap(c) & (f.dtypes.params not in ("bf16", "fp16"))),
        Rule("needs_length", (), "the problem gives neither training.steps nor training.tokens, and a launch without a "
             "length runs the framework's default number of steps", lambda f, c: f.train_iters is None),
        Rule("expert_groups", ("ep", "etp"),
             "node-limited routing over {expert_groups} expert groups (nodes of an EP group) needs num_experts divisible by it",
             lambda f, c: _groups_indivisible(f, c)),
    )


def _groups_indivisible(f: RunFacts, c: ConfigBatch):
    groups = expert_groups(f, c.ep, c.etp)
    if f.model.moe is None:
        return False
    return (groups > 0) & ~divides(np.maximum(groups, 1), f.model.moe.num_experts)


def _full_recompute_not_every_block(c: ConfigBatch):
    return (c.recompute == R["full"]) & ~((c.recompute_method == 0) & (c.recompute_layers == 1))


def _torchtitan_rules() -> tuple[Rule, ...]:
    """torchtitan 0.3.0 (parallel_dims, its config functions and Trainer checks; see
    mofa/launch/torchtitan.py for how a plan maps to its flags)."""
    moe = lambda f: f.model.moe is not None  # noqa: E731

    return (
        Rule("fsdp_shards_parameters", ("zero_stage",),
             "ZeRO-{zero_stage} keeps whole parameters; torchtitan's FSDP2 always shards them (ZeRO-3), or replicates everything (ZeRO-0)",
             lambda f, c: (c.zero_stage == 1) | (c.zero_stage == 2)),
        Rule("cp_needs_fsdp", ("zero_stage", "cp"),
             "ZeRO-0 with cp > 1: torchtitan always shards parameters over the context-parallel ranks (its FSDP mesh is dp_shard x cp)",
             lambda f, c: (c.zero_stage == 0) & (c.cp > 1)),
        Rule("hsdp_group_cp", ("dp_shard", "cp"),
             "an HSDP sharding group of {dp_shard} ranks that is not a multiple of cp={cp} (torchtitan shards over dp_shard x cp)",
             lambda f, c: hybrid_sharded(c) & ~divides(c.cp, sharding_group(c))),
        Rule("cp_all_gather_only", ("cp", "cp_comm"),
             "CP variant {cp_comm}: torchtitan runs PyTorch's context parallel with its all-gather rotation, and has no flag for another",
             lambda f, c: (c.cp > 1) & (c.cp_comm != C["all_gather"])),
        Rule("no_expert_tp", ("ep", "etp"), "expert tensor parallelism etp={etp}: torchtitan's EP borrows the TP ranks (no expert TP)",
             lambda f, c: moe(f) & (c.ep > 1) & (c.etp != 1)),
        Rule("experts_over_tp", ("ep", "etp", "tp"), "etp={etp} without EP: torchtitan shards the experts over TP like the dense layers",
             lambda f, c: moe(f) & (c.ep == 1) & (c.etp != c.tp)),
        Rule("ep_borrows_ranks", ("ep", "tp", "zero_stage", "dp_shard", "cp"),
             "ep={ep} must divide dp_shard x cp x tp = {fsdp_tp} (EP borrows FSDP and TP ranks)",
             lambda f, c: moe(f) & ~divides(c.ep, fsdp_tp_ranks(c))),
        Rule("no_ep_overlap", ("ep_overlap",), "EP communication overlap has no flag (its overlapped EP is a separate config function)",
             lambda f, c: c.ep_overlap == 1),
        Rule("no_selective_modules", ("recompute", "recompute_modules"),
             "selective recompute by module: torchtitan's selective AC is per op (recompute_modules [ops]: saves attention and every other matmul)",
             lambda f, c: (c.recompute == R["selective"]) & (c.recompute_modules != RECOMPUTE_MODULE_BITS["ops"])),
        Rule("full_every_block", ("recompute", "recompute_method", "recompute_layers"),
             "full recompute {recompute_method} {recompute_num_layers}: torchtitan's full AC checkpoints every block",
             lambda f, c: _full_recompute_not_every_block(c)),
        Rule("no_activation_offload", ("activation_offload",), "activation offload: torchtitan has none",
             lambda f, c: c.activation_offload != 0),
        Rule("no_cpu_optimizer_alone", ("cpu_optimizer",),
             "a CPU optimizer alone: training.enable_cpu_offload also moves FSDP's parameters and gradients to the host",
             lambda f, c: c.cpu_optimizer == 1),
        Rule("reduce_fp32", (), "gradient reduction in {grads}: training.mixed_precision_reduce is float32 only",
             lambda f, c: f.dtypes.grads != "fp32"),
        Rule("optimizer_dtype", (), "optimizer states in {optimizer_dtype}: torchtitan keeps them in the parameters' fp32 dtype",
             lambda f, c: f.dtypes.optimizer != "fp32"),
        Rule("param_dtype", (), "parameters in {params}: mixed_precision_param is bfloat16 or float32",
             lambda f, c: f.dtypes.params not in ("bf16", "fp32")),
        Rule("no_mtp", (), "{model} has {mtp_layers} multi-token-prediction module(s); torchtitan's config function builds none",
             lambda f, c: bool(f.model.mtp_layers)),
        Rule("flash_attention", (), "an unfused attention kernel: torchtitan's configs use SDPA / flex attention",
             lambda f, c: f.attention_kernel != "flash"),
        Rule("needs_length", (), "the problem gives neither training.steps nor training.tokens, and a launch without a "
             "length runs the framework's default number of steps", lambda f, c: f.train_iters is None),
        Rule("moe_routing", ("moe_chunks",),
             "chunked MoE dispatch, token dropping and DeepEP dispatch are not exported for torchtitan",
             lambda f, c: (c.moe_chunks != 1) | (f.moe_capacity_factor is not None) | (f.moe_dispatcher != "alltoall")),
        Rule("config_function", (), "no config function builds {model} ({num_layers} layers, hidden {hidden_size}, vocabulary {vocab_size}); "
             "the command line cannot change the architecture", lambda f, c: not torchtitan_functions(f.model)),
        Rule("config_dtype", (), "its {model} config functions compute in {torchtitan_dtypes}, the plan in {compute}; "
             "the quantization is fixed by the function, not a flag",
             lambda f, c: bool(torchtitan_functions(f.model)) and f.dtypes.compute not in {d for _, _, d in torchtitan_functions(f.model)}),
        Rule("no_flexible_rounds", ("pp", "pp_schedule"),
             "the flexible schedule's round size (nc != pp) has no flag: Interleaved1F1B rounds by pp",
             lambda f, c: (c.pp > 1) & (c.pp_schedule == S["flexible"])),
    )


def _deepspeed_rules() -> tuple[Rule, ...]:
    """Plain DeepSpeed 0.19.8 (deepspeed.initialize with the JSON; see mofa/launch/deepspeed.py)."""
    piped = lambda c: c.pp > 1  # noqa: E731
    return (
        Rule("moe_chunks", ("moe_chunks",), "moe_chunks={moe_chunks}: DeepSpeed has no chunked MoE dispatch (MemFine's FCDA)",
             lambda f, c: c.moe_chunks != 1),
        Rule("no_tp", ("tp",), "tp={tp}: plain DeepSpeed has no tensor parallelism for a training model (Megatron-DeepSpeed's mpu does)",
             lambda f, c: c.tp > 1),
        Rule("no_cp", ("cp",), "cp={cp}: context parallelism needs Ulysses' model code and a sequence-parallel unit, not a JSON key",
             lambda f, c: c.cp > 1),
        Rule("no_ep", ("ep",), "ep={ep}: expert parallelism needs DeepSpeed-MoE layers in the model code", lambda f, c: c.ep > 1),
        Rule("pipeline_zero01", ("pp", "zero_stage"),
             "pipeline parallelism with ZeRO-{zero_stage}: DeepSpeed's pipeline engine runs ZeRO-0 or ZeRO-1 only",
             lambda f, c: piped(c) & (c.zero_stage >= 2)),
        Rule("pipeline_1f1b", ("pp", "vp", "pp_schedule"),
             "the {pp_schedule} schedule (vp={vp}): the pipeline engine runs its own 1F1B over one stage per rank",
             lambda f, c: piped(c) & ((c.pp_schedule != S["1f1b"]) | (c.vp > 1))),
        Rule("pipeline_even", ("pp", "vp", "first_layers", "last_layers"),
             "the {layer_split} layer split: the JSON's pipeline.partition balances layers, it cannot place them",
             lambda f, c: piped(c) & (layer_split_codes(f.model.num_layers, c) != 1)),
        Rule("zero3_reshards", ("zero_stage", "reshard_after_forward"),
             "ZeRO-3 keeping gathered parameters to the backward: stage 3 releases them after use",
             lambda f, c: (c.zero_stage == 3) & (c.reshard_after_forward == 0)),
        Rule("no_hsdp", ("dp_shard",), "hybrid sharding: DeepSpeed 0.19.8 removed MiCS (mics_shard_size)", lambda f, c: hybrid_sharded(c)),
        Rule("cpu_optimizer_needs_zero", ("cpu_optimizer", "zero_stage"), "the CPU optimizer (zero_optimization.offload_optimizer) needs ZeRO >= 1",
             lambda f, c: (c.cpu_optimizer == 1) & (c.zero_stage == 0)),
        Rule("no_selective_modules", ("recompute",), "selective recompute by module: DeepSpeed checkpoints what the model code wraps",
             lambda f, c: c.recompute == R["selective"]),
        Rule("full_every_layer", ("recompute", "recompute_method", "recompute_layers"),
             "full recompute {recompute_method} {recompute_num_layers}: the exporter writes one checkpoint per layer",
             lambda f, c: _full_recompute_not_every_block(c)),
        Rule("no_activation_offload", ("activation_offload",),
             "activation offload without recompute: DeepSpeed's cpu_checkpointing offloads checkpointed activations only",
             lambda f, c: c.activation_offload != 0),
        Rule("no_fp8", (), "{compute} GEMMs need Transformer Engine in the model code", lambda f, c: f.dtypes.compute in ("fp8", "mxfp8")),
        Rule("param_grad_dtype", (), "parameters in {params} with gradients accumulated in {grads}",
             lambda f, c: f.dtypes.params not in ("fp32", "bf16", "fp16") or f.dtypes.grads not in ("fp32", "bf16")),
        Rule("optimizer_dtype", (), "optimizer states in {optimizer_dtype}: DeepSpeed keeps fp32 master weights and moments",
             lambda f, c: f.dtypes.optimizer != "fp32"),
        Rule("no_expert_tp", ("ep", "etp"), "expert tensor parallelism",
             lambda f, c: (f.model.moe is not None) & (c.ep == 1) & (c.etp > 1)),
    )


def _bridge_rules() -> tuple[Rule, ...]:
    """What Megatron-Bridge's launch file (an override dotlist on a recipe) cannot carry, beyond
    Megatron-Core's rules."""
    return (
        Rule("fine_grained_offload_env", ("activation_offload",),
             "fine-grained activation offload: Megatron-Bridge 0.3.1's validation needs NVTE_CPU_OFFLOAD_V1=1 in the launch "
             "environment (Transformer Engine >= 2.10), which an override file cannot set (Megatron-LM's launch script sets it)",
             lambda f, c: (c.activation_offload != 0) & (c.activation_offload != OFFLOAD_LAYER)),
    )


_MEGATRON = _megatron_rules()
#: framework -> its rules, in the order a refusal reports them (the first broken one)
FRAMEWORK_RULES: dict[str, tuple[Rule, ...]] = {
    "megatron": _MEGATRON,
    "megatron-bridge": _MEGATRON + _bridge_rules(),  # Megatron-Bridge builds the same Megatron-Core objects
    "torchtitan": _torchtitan_rules(),
    "deepspeed": _deepspeed_rules(),
}


def rule_key(framework: str, rule: Rule) -> str:
    """The name a rule has among costmodel.rules' masks: `framework:rule`."""
    return f"{framework}:{rule.name}"


def framework_violations(framework: str, facts: RunFacts, cfg: ConfigBatch) -> dict[str, np.ndarray]:
    """{framework:rule: True where the configuration breaks it}, in the framework's order."""
    n = len(cfg)
    return {rule_key(framework, rule): np.broadcast_to(np.asarray(rule.test(facts, cfg), dtype=bool), (n,)).copy()
            for rule in FRAMEWORK_RULES[framework]}


def rule_of(key: str) -> Rule:
    framework, _, name = key.partition(":")
    return next(r for r in FRAMEWORK_RULES[framework] if r.name == name)


def describe(key: str, facts: RunFacts, cfg: ConfigBatch, i: int) -> str:
    """The message of rule `key` for configuration i (the facts it names filled in)."""
    rule = rule_of(key)
    m, dt = facts.model, facts.dtypes
    split = SPLIT_NAMES[int(layer_split_codes(m.num_layers, cfg.take([i]))[0])]
    values = {
        "tp": int(cfg.tp[i]), "cp": int(cfg.cp[i]), "pp": int(cfg.pp[i]), "vp": int(cfg.vp[i]), "ep": int(cfg.ep[i]), "etp": int(cfg.etp[i]),
        "zero_stage": int(cfg.zero_stage[i]), "moe_chunks": chunks_setting(cfg.moe_chunks[i]),
        "pp_schedule": PP_SCHEDULES[int(cfg.pp_schedule[i])], "cp_comm": CP_COMMS[int(cfg.cp_comm[i])], "layer_split": split,
        "recompute_method": RECOMPUTE_METHOD_NAMES[int(cfg.recompute_method[i])], "recompute_num_layers": int(cfg.recompute_layers[i]),
        "dp_shard": int(sharding_group(cfg.take([i]))[0]), "fsdp_tp": int(fsdp_tp_ranks(cfg.take([i]))[0]),
        "expert_groups": int(expert_groups(facts, cfg.ep[i], cfg.etp[i])),
        "model": m.name, "num_layers": m.num_layers, "hidden_size": m.hidden_size, "vocab_size": m.vocab_size, "mtp_layers": m.mtp_layers,
        "params": dt.params, "grads": dt.grads, "optimizer_dtype": dt.optimizer, "compute": dt.compute,
        "torchtitan_dtypes": ", ".join(f"{fn} ({d})" for _, fn, d in torchtitan_functions(m)),
    }
    return rule.message.format(**values)


def refusals(framework: str, facts: RunFacts, cfg: ConfigBatch, i: int = 0) -> list[tuple[str, str]]:
    """(rule key, message) of every rule configuration i breaks, in the framework's order."""
    return [(key, describe(key, facts, cfg, i)) for key, bad in framework_violations(framework, facts, cfg).items() if bad[i]]
