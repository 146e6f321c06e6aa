"""DeepSpeed 0.19.8 JSON configuration from a launch plan.

Plain DeepSpeed (deepspeed.initialize with this JSON) runs data parallelism with ZeRO 0-3, its
CPU optimizer offload, bf16/fp16 and its activation-checkpointing settings; its pipeline
engine runs one 1F1B-like schedule over a PipelineModule. Tensor, context and expert
parallelism need model code and a model-parallel unit (Megatron-DeepSpeed, DeepSpeed-MoE,
Ulysses): they are refused, as are the layouts and features the JSON cannot say. Rules:
../shared/reference/frameworks.md (DeepSpeed) and the 0.19.8 sources
(deepspeed/runtime/config.py, runtime/zero/config.py), checked by tests/frameworks/."""

from __future__ import annotations

import json

from mofa.launch.common import refuse
from mofa.launch.plan import LaunchPlan

NAME = "DeepSpeed"
DTYPE = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


def check(plan: LaunchPlan) -> None:
    p, dt = plan, plan.dtypes
    if p.pipeline_layout is not None:
        refuse(NAME, "a heterogeneous pipeline layout (--pipeline-layouts) is Megatron-Core's --pipeline-model-parallel-layout; "
               "this exporter only splits layers evenly")
    if p.moe_chunks != 1:
        refuse(NAME, f"moe_chunks={p.moe_chunks}: DeepSpeed has no chunked MoE dispatch (MemFine's FCDA)")
    if p.tp > 1:
        refuse(NAME, f"tp={p.tp}: plain DeepSpeed has no tensor parallelism for a training model (Megatron-DeepSpeed's mpu does)")
    if p.cp > 1:
        refuse(NAME, f"cp={p.cp}: context parallelism needs Ulysses' model code and a sequence-parallel unit, not a JSON key")
    if p.ep > 1:
        refuse(NAME, f"ep={p.ep}: expert parallelism needs DeepSpeed-MoE layers in the model code")
    if p.pp > 1:
        if p.zero_stage >= 2:
            refuse(NAME, f"pipeline parallelism with ZeRO-{p.zero_stage}: DeepSpeed's pipeline engine runs ZeRO-0 or ZeRO-1 only")
        if p.pp_schedule != "1f1b" or p.vp > 1:
            refuse(NAME, f"the {p.pp_schedule} schedule (vp={p.vp}): the pipeline engine runs its own 1F1B over one stage per rank")
        if p.layer_split != "even":
            refuse(NAME, f"the {p.layer_split} layer split: the JSON's pipeline.partition balances layers, it cannot place them")
    if p.zero_stage == 3 and not p.reshard_after_forward:
        refuse(NAME, "ZeRO-3 keeping gathered parameters to the backward: stage 3 releases them after use")
    if p.hsdp:
        refuse(NAME, "hybrid sharding: DeepSpeed 0.19.8 removed MiCS (mics_shard_size)")
    if p.cpu_optimizer and p.zero_stage == 0:
        refuse(NAME, "the CPU optimizer (zero_optimization.offload_optimizer) needs ZeRO >= 1")
    if p.recompute == "selective":
        refuse(NAME, "selective recompute by module: DeepSpeed checkpoints what the model code wraps")
    if p.recompute == "full" and not (p.recompute_method == "uniform" and p.recompute_num_layers == 1):
        refuse(NAME, f"full recompute {p.recompute_method} {p.recompute_num_layers}: the exporter writes one checkpoint per layer")
    if p.activation_offload:
        refuse(NAME, "activation offload without recompute: DeepSpeed's cpu_checkpointing offloads checkpointed activations only")
    if dt.compute in ("fp8", "mxfp8"):
        refuse(NAME, f"{dt.compute} GEMMs need Transformer Engine in the model code")
    if dt.params not in DTYPE or dt.grads not in ("fp32", "bf16"):
        refuse(NAME, f"parameters in {dt.params} with gradients accumulated in {dt.grads}")
    if dt.optimizer != "fp32":
        refuse(NAME, f"optimizer states in {dt.optimizer}: DeepSpeed keeps fp32 master weights and moments")
    if p.model.moe is not None and p.ep == 1 and p.etp > 1:
        refuse(NAME, "expert tensor parallelism")


def deepspeed_config(plan: LaunchPlan) -> dict:
    check(plan)
    p, dt = plan, plan.dtypes
    zero: dict = {"stage": p.zero_stage}
    if p.zero_stage >= 1:
        zero["overlap_comm"] = p.dp_overlap
        zero["contiguous_gradients"] = True
    if p.cpu_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    config: dict = {
        "train_batch_size": p.global_batch_size,
        "train_micro_batch_size_per_gpu": p.micro_batch_size,
        "gradient_accumulation_steps": p.microbatches,
        "zero_optimization": zero,
        "bf16": {"enabled": dt.params == "bf16"},
        "fp16": {"enabled": dt.params == "fp16"},
        "data_types": {"grad_accum_dtype": dt.grads},
        "optimizer": {"type": "Adam"},
    }
    if p.pp > 1:
        config["pipeline"] = {"stages": p.pp, "partition": "uniform",
                              "activation_checkpoint_interval": 1 if p.recompute == "full" else 0}
    if p.recompute == "full":
        config["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False,
                                              "contiguous_memory_optimization": False, "number_checkpoints": p.model.num_layers // p.pp}
    # DeepSpeed has no key for these (the training loop calls save_checkpoint): for the loop
    config["mofa"] = {"train_iters": p.train_iters, "checkpoint_interval": p.checkpoint_interval,
                      "data_parallel_size": p.dp, "pipeline_parallel_size": p.pp, "plan": p.label()}
    return config


def deepspeed_text(plan: LaunchPlan) -> str:
    return json.dumps(deepspeed_config(plan), indent=2) + "\n"
