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

from mofa.launch.common import check_rules, refuse
from mofa.launch.plan import LaunchPlan

NAME = "DeepSpeed"


def check(plan: LaunchPlan) -> None:
    """What plain DeepSpeed cannot run: the rules of costmodel.frameworks, which the search
    applies under `--framework deepspeed` (a heterogeneous pipeline layout is chosen after the
    search, so it is refused here)."""
    if plan.pipeline_layout is not None:
        refuse(NAME, "a pipeline layout (--pipeline-layouts, or a layer split only a layout expresses) is Megatron-Core's --pipeline-model-parallel-layout; "
               "this exporter only splits layers evenly")
    check_rules(plan, "deepspeed")


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
