"""Megatron-LM launch script and Megatron-Bridge overrides from a launch plan.

Flag names and the rules they carry: ../shared/reference/frameworks.md (Megatron-LM
arguments.py, whose core_v0.16 flags are generated from Megatron-Core's dataclasses: field
`foo_bar` -> `--foo-bar`) and the installed Megatron-Core 0.16.1 sources (TransformerConfig,
OptimizerConfig, DistributedDataParallelConfig), which the framework tests construct from the
exported values. What Megatron cannot run is refused with the reason (`ExportError`)."""

from __future__ import annotations

import shlex

from mofa.launch.common import ExportError, check_rules, mode_of
from mofa.launch.plan import LaunchPlan

#: Megatron-Core's names for the CP variants (--cp-comm-type)
CP_COMM_FLAG = {"p2p": "p2p", "all_gather": "allgather", "a2a": "a2a", "a2a+p2p": "a2a+p2p"}
#: Megatron-FSDP's sharding strategies (--data-parallel-sharding-strategy) by ZeRO stage
FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
#: training.moe.dispatcher as Megatron-Core flags: its all-to-all dispatcher, or DeepEP's
#: deduplicated one behind the flex dispatcher (Megatron-Core 0.16.1: moe_flex_dispatcher_backend;
#: moe_enable_deepep is deprecated and clashes with a recipe's hybridep backend)
MOE_DISPATCHER_ARGS = {"alltoall": [["--moe-token-dispatcher-type", "alltoall"]],
                       "deepep": [["--moe-token-dispatcher-type", "flex"], ["--moe-flex-dispatcher-backend", "deepep"]]}
#: the Megatron-LM entry point the script runs (relative to MEGATRON_LM, the checkout)
ENTRY = "pretrain_gpt.py"


def check_megatron(plan: LaunchPlan, framework: str = "megatron") -> None:
    """What neither Megatron-LM nor Megatron-Bridge can run (both build Megatron-Core): the
    rules of costmodel.frameworks, which the search applies under `--framework megatron`."""
    check_rules(plan, framework)


def expert_groups(plan: LaunchPlan) -> int:
    """Megatron's router groups for node-limited routing (costmodel.frameworks.expert_groups)."""
    from costmodel.frameworks import expert_groups as groups

    return int(groups(plan.facts(), plan.ep, plan.etp))


def _layout_args(p: LaunchPlan) -> list[list[str]]:
    out = []
    if p.pipeline_layout is not None:  # the layout fixes vp and every stage: no other split flag may be given
        out.append(["--pipeline-model-parallel-layout", p.pipeline_layout])
    elif p.vp > 1:
        out.append(["--num-virtual-stages-per-pipeline-rank", str(p.vp)])
    if p.vp > 1:
        if not p.pp_overlap:
            out.append(["--no-overlap-p2p-communication"])
        if p.pp_schedule == "flexible":
            out.append(["--microbatch-group-size-per-virtual-pipeline-stage", str(p.pp_group)])
    if p.pipeline_layout is not None:
        pass
    elif p.layer_split == "embedding_loss":
        out += [["--account-for-embedding-in-pipeline-split"], ["--account-for-loss-in-pipeline-split"]]
    elif p.layer_split == "uneven":
        out += [["--decoder-first-pipeline-num-layers", str(p.first_stage_layers)], ["--decoder-last-pipeline-num-layers", str(p.last_stage_layers)]]
    return out


def _model_args(p: LaunchPlan) -> list[list[str]]:
    m = p.model
    out = [["--num-layers", str(m.num_layers)], ["--hidden-size", str(m.hidden_size)], ["--ffn-hidden-size", str(m.ffn_hidden_size)],
           ["--num-attention-heads", str(m.num_heads)], ["--seq-length", str(p.seq_len)], ["--max-position-embeddings", str(p.seq_len)]]
    if m.head_dim and m.head_dim != m.hidden_size // m.num_heads:
        out.append(["--kv-channels", str(m.head_dim)])
    if m.activation == "swiglu":
        out.append(["--swiglu"])
    elif m.activation == "squared_relu":
        out.append(["--squared-relu"])
    out.append(["--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"])
    out.append(["--position-embedding-type", {"rope": "rope", "learned": "learned_absolute", "none": "none"}[m.position_embedding]])
    if not m.linear_bias:
        out.append(["--disable-bias-linear"])
    if not m.tied_embeddings:
        out.append(["--untie-embeddings-and-output-weights"])
    if m.qk_layernorm:
        out.append(["--qk-layernorm"])
    if m.mla is not None:
        out += [["--multi-latent-attention"], ["--kv-lora-rank", str(m.mla.kv_lora_rank)], ["--qk-head-dim", str(m.mla.qk_nope_head_dim)],
                ["--qk-pos-emb-head-dim", str(m.mla.qk_rope_head_dim)], ["--v-head-dim", str(m.mla.v_head_dim)]]
        if m.mla.q_lora_rank:
            out.append(["--q-lora-rank", str(m.mla.q_lora_rank)])
    elif m.num_kv_heads and m.num_kv_heads != m.num_heads:
        out += [["--group-query-attention"], ["--num-query-groups", str(m.num_kv_heads)]]
    if m.moe is not None:
        out += [["--num-experts", str(m.moe.num_experts)], ["--moe-router-topk", str(m.moe.top_k)],
                ["--moe-ffn-hidden-size", str(m.moe.expert_ffn_hidden_size)],
                *MOE_DISPATCHER_ARGS[p.moe_dispatcher], ["--moe-grouped-gemm"]]
        if p.moe_capacity_factor is not None:
            out.append(["--moe-expert-capacity-factor", repr(p.moe_capacity_factor)])
        if m.moe.num_shared_experts:
            out.append(["--moe-shared-expert-intermediate-size", str(m.moe.num_shared_experts * m.moe.shared_ffn)])
        if m.moe.first_dense_layers:
            out.append(["--moe-layer-freq", "[" + ",".join(["0"] * m.moe.first_dense_layers + ["1"] * m.num_moe_layers) + "]"])
        groups = expert_groups(p)
        if groups:
            out += [["--moe-router-num-groups", str(groups)], ["--moe-router-group-topk", str(m.moe.max_nodes_per_token)]]
    if m.mtp_layers:
        out.append(["--mtp-num-layers", str(m.mtp_layers)])
    return out


def megatron_arg_groups(plan: LaunchPlan) -> list[list[str]]:
    """Megatron-LM's command line, one [flag, values...] group per setting."""
    check_megatron(plan)
    p, dt = plan, plan.dtypes
    out = [["--tensor-model-parallel-size", str(p.tp)], ["--pipeline-model-parallel-size", str(p.pp)],
           ["--context-parallel-size", str(p.cp)], ["--micro-batch-size", str(p.micro_batch_size)],
           ["--global-batch-size", str(p.global_batch_size)], ["--train-iters", str(p.train_iters)]]
    if p.model.moe is not None:
        out += [["--expert-model-parallel-size", str(p.ep)], ["--expert-tensor-parallel-size", str(p.etp)]]
    if p.sequence_parallel:
        out.append(["--sequence-parallel"])
    out += _layout_args(p)
    if p.cp > 1:
        out.append(["--cp-comm-type", CP_COMM_FLAG[p.cp_comm]])
        if p.cp_comm == "a2a+p2p":
            out.append(["--hierarchical-context-parallel-sizes", str(p.cp_a2a), str(p.cp // p.cp_a2a)])
    if p.zero_stage >= 1:
        out.append(["--use-distributed-optimizer"])
        if p.hsdp:
            out.append(["--num-distributed-optimizer-instances", str(p.dp_replicate)])
    if p.zero_stage >= 2:
        out += [["--use-megatron-fsdp"], ["--data-parallel-sharding-strategy", FSDP_STRATEGY[p.zero_stage]]]
    if p.dp_overlap:
        out.append(["--overlap-grad-reduce"])
        if p.zero_stage >= 1:
            out.append(["--overlap-param-gather"])
    if p.tp_overlap:
        out.append(["--tp-comm-overlap"])
    if p.ep_overlap:
        out += [["--overlap-moe-expert-parallel-comm"], ["--delay-wgrad-compute"]]
    if p.recompute == "selective":
        out += [["--recompute-granularity", "selective"], ["--recompute-modules", *(p.recompute_modules or ["core_attn"])]]
    elif p.recompute == "full":
        out += [["--recompute-granularity", "full"], ["--recompute-method", p.recompute_method], ["--recompute-num-layers", str(p.recompute_num_layers)]]
    if p.activation_offload == "layer":
        out += [["--cpu-offloading"], ["--cpu-offloading-num-layers", str(p.model.num_layers - 1)]]
    elif p.activation_offload:
        out += [["--fine-grained-activation-offloading"], ["--offload-modules", *p.activation_offload]]
    out += [["--optimizer", "adam"]]
    if p.cpu_optimizer:
        out += [["--use-precision-aware-optimizer"], ["--optimizer-cpu-offload"], ["--optimizer-offload-fraction", "1.0"], ["--overlap-cpu-optimizer-d2h-h2d"]]
    if dt.params == "bf16":
        out.append(["--bf16"])
    elif dt.params == "fp16":
        out.append(["--fp16"])
    out.append(["--accumulate-allreduce-grads-in-fp32"] if dt.grads == "fp32" else ["--grad-reduce-in-bf16"])
    if dt.compute == "fp8":
        out += [["--fp8-format", "hybrid"]]
    elif dt.compute == "mxfp8":  # Megatron-Core's MXFP8 recipe (Transformer Engine MXFP8BlockScaling, Blackwell)
        out += [["--fp8-format", "e4m3"], ["--fp8-recipe", "mxfp8"]]
    if p.attention_kernel == "unfused":
        out.append(["--attention-backend", "unfused"])
    if p.checkpoint_interval is not None:
        out.append(["--save-interval", str(p.checkpoint_interval)])
    return out + _model_args(p)


def megatron_flags(plan: LaunchPlan) -> list[str]:
    """Megatron-LM's argv (flags and values as separate words)."""
    return [word for group in megatron_arg_groups(plan) for word in group]


def megatron_env(plan: LaunchPlan) -> dict[str, str]:
    """Launcher environment: TP or CP needs one CUDA connection (before Blackwell); fine-grained
    activation offload needs Transformer Engine's first CPU-offload path, which moves activations
    only (NVTE_CPU_OFFLOAD_V1=1: Megatron-Bridge's config validation requires it from TE 2.10 on,
    "to avoid offloading weights")."""
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if (plan.tp > 1 or plan.cp > 1) else {}
    if isinstance(plan.activation_offload, list) and plan.activation_offload:
        env["NVTE_CPU_OFFLOAD_V1"] = "1"
    return env


def megatron_script(plan: LaunchPlan) -> str:
    """A bash launch script: one torchrun per node (NODE_RANK, MASTER_ADDR from the
    environment; MEGATRON_LM the checkout; DATA_ARGS and CHECKPOINT_DIR the run's own), every
    argument shell-quoted."""
    groups = megatron_arg_groups(plan)
    lines = [
        "#!/usr/bin/env bash",
        f"# Megatron-LM launch written by `mofa export` for {plan.problem or 'a problem'} on {plan.num_gpus} x {plan.hardware}:",
        f"#   {plan.label()}",
        "# Run it on every node with NODE_RANK (0..NNODES-1) and MASTER_ADDR (node 0) set.",
    ]
    lines += [
        "set -euo pipefail",
        f"NNODES={plan.num_nodes}",
        f"GPUS_PER_NODE={plan.gpus_per_node}",
        ': "${NODE_RANK:?set NODE_RANK to this node\'s rank (0..NNODES-1)}"',
        ': "${MASTER_ADDR:?set MASTER_ADDR to node 0\'s address}"',
        'MASTER_PORT="${MASTER_PORT:-6000}"',
        'MEGATRON_LM="${MEGATRON_LM:-.}"',
        'CHECKPOINT_DIR="${CHECKPOINT_DIR:-checkpoints}"',
        "read -r -a DATA <<< \"${DATA_ARGS:---mock-data --tokenizer-type NullTokenizer --vocab-size " + str(plan.model.vocab_size) + "}\"",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in megatron_env(plan).items()]
    lines.append("ARGS=(")
    lines += ["  " + " ".join(shlex.quote(word) for word in group) for group in groups]
    lines += [
        '  --save "$CHECKPOINT_DIR" --load "$CHECKPOINT_DIR"',
        ")",
        'exec torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" --node-rank "$NODE_RANK" \\',
        '  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\',
        f'  "$MEGATRON_LM/{ENTRY}" "${{ARGS[@]}}" "${{DATA[@]}}" "$@"',
        "",
    ]
    return "\n".join(lines)


#: compute dtype -> the Bridge's MixedPrecisionConfig (fp8, fp8_recipe): hybrid E4M3/E5M2 with
#: delayed scaling (Megatron-LM's --fp8-format hybrid and its default --fp8-recipe delayed), and
#: MXFP8 block scaling on Blackwell
BRIDGE_FP8 = {"fp8": ("hybrid", "delayed"), "mxfp8": ("e4m3", "mxfp8")}


def bridge_overrides(plan: LaunchPlan) -> list[str]:
    """Megatron-Bridge / NeMo 2.0 Hydra dotlist overrides (Megatron-Core field names) on a
    pretraining recipe's ConfigContainer."""
    check_megatron(plan, "megatron-bridge")
    p, m, dt = plan, plan.model, plan.dtypes
    if dt.params != "bf16":  # the dtype fields are torch.dtype objects a Hydra dotlist cannot write
        raise ExportError(f"Megatron-Bridge export keeps the recipes' bf16 mixed precision (its dtype fields are torch "
                          f"dtypes a dotlist cannot write); {dt.params} weights need the recipe changed (or export --format megatron)")
    out = [
        f"model.tensor_model_parallel_size={p.tp}",
        f"model.pipeline_model_parallel_size={p.pp}",
        f"model.virtual_pipeline_model_parallel_size={p.vp if p.vp > 1 else 'null'}",
        f"model.context_parallel_size={p.cp}",
        f"model.sequence_parallel={mode_of(p.sequence_parallel)}",
        f"model.seq_length={p.seq_len}",
        f"dataset.sequence_length={p.seq_len}",  # GPTDatasetConfig's field (seq_length is its alias): validate() asserts the two agree
        f"train.micro_batch_size={p.micro_batch_size}",
        f"train.global_batch_size={p.global_batch_size}",
        f"train.train_iters={p.train_iters}",
        f"ddp.use_distributed_optimizer={mode_of(p.zero_stage >= 1)}",
        f"optimizer.use_distributed_optimizer={mode_of(p.zero_stage >= 1)}",
        f"ddp.overlap_grad_reduce={mode_of(p.dp_overlap)}",
        f"ddp.overlap_param_gather={mode_of(p.dp_overlap and p.zero_stage >= 1)}",
        f"ddp.grad_reduce_in_fp32={mode_of(dt.grads == 'fp32')}",
        # the recipe's MixedPrecisionConfig overwrites ddp/model/optimizer precision fields at launch
        # (runtime_config_update -> MixedPrecisionConfig.setup): the gradient dtype and the fp8 recipe
        # must be set there too, or a bf16 reduction silently becomes fp32
        f"mixed_precision.grad_reduce_in_fp32={mode_of(dt.grads == 'fp32')}",
        f"comm_overlap.tp_comm_overlap={mode_of(p.tp_overlap)}",
        # with dp > 1 the recipe's CommOverlapConfig turns the DP overlaps on at launch unless told
        f"comm_overlap.overlap_grad_reduce={mode_of(p.dp_overlap)}",
        f"comm_overlap.overlap_param_gather={mode_of(p.dp_overlap and p.zero_stage >= 1)}",
        f"comm_overlap.overlap_p2p_comm={mode_of(p.pp_overlap)}",
        f"optimizer.optimizer_cpu_offload={mode_of(p.cpu_optimizer)}",
        f"optimizer.optimizer_offload_fraction={1.0 if p.cpu_optimizer else 0.0}",
        f"optimizer.use_precision_aware_optimizer={mode_of(p.cpu_optimizer)}",
        # fp32 master weights, main gradients and Adam states, as the plan's ledger counts them (the
        # optimizer_dtype rule): the DeepSeek-V3 recipe keeps bf16 main gradients and first moments
        # under its precision-aware optimizer, which Megatron-Core refuses once that is off. The Bridge
        # turns a "torch.<dtype>" string back into the torch dtype these fields hold.
        *(f"optimizer.{name}=torch.float32" for name in ("main_params_dtype", "main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")),
    ]
    if dt.compute in BRIDGE_FP8:  # Megatron-LM's --fp8-format (and recipe) above, as the Bridge's fields
        fmt, recipe = BRIDGE_FP8[dt.compute]
        out += [f"mixed_precision.fp8={fmt}", f"mixed_precision.fp8_recipe={recipe}"]
    if m.moe is not None:
        out += [f"model.expert_model_parallel_size={p.ep}", f"model.expert_tensor_parallel_size={p.etp}",
                f"comm_overlap.overlap_moe_expert_parallel_comm={mode_of(p.ep_overlap)}",
                f"model.moe_token_dispatcher_type={'flex' if p.moe_dispatcher == 'deepep' else 'alltoall'}",
                "model.moe_enable_deepep=false"]  # deprecated in Megatron-Core 0.16.1: the backend field says it
        if p.moe_dispatcher == "deepep":
            out.append("model.moe_flex_dispatcher_backend=deepep")
        if p.moe_capacity_factor is not None:
            out.append(f"model.moe_expert_capacity_factor={p.moe_capacity_factor!r}")
        groups = expert_groups(p)
        if groups:
            out += [f"model.moe_router_num_groups={groups}", f"model.moe_router_group_topk={m.moe.max_nodes_per_token}"]
    if p.zero_stage >= 2:  # Megatron-FSDP saves only its own DTensor checkpoints (Bridge 0.3.1 ConfigContainer.validate())
        out += ["ddp.use_megatron_fsdp=true", f"ddp.data_parallel_sharding_strategy={FSDP_STRATEGY[p.zero_stage]}",
                "checkpoint.ckpt_format=fsdp_dtensor"]
    if p.zero_stage == 1 and p.hsdp:
        out.append(f"ddp.num_distributed_optimizer_instances={p.dp_replicate}")
    if p.cp > 1:
        out.append(f"model.cp_comm_type={CP_COMM_FLAG[p.cp_comm]}")
        if p.cp_comm == "a2a+p2p":
            out.append(f"model.hierarchical_context_parallel_sizes=[{p.cp_a2a},{p.cp // p.cp_a2a}]")
    if p.pp_schedule == "flexible":
        out.append(f"model.microbatch_group_size_per_vp_stage={p.pp_group}")
    if p.pipeline_layout is not None:  # Hydra's quoted string: the layout's | and * stay literal
        out.append(f'model.pipeline_model_parallel_layout="{p.pipeline_layout}"')
    else:  # a recipe's own layout (DeepSeek-V3's) would otherwise override the split and vp chosen here
        out.append("model.pipeline_model_parallel_layout=null")
    if p.pipeline_layout is not None:
        pass
    elif p.layer_split == "embedding_loss":
        out += ["model.account_for_embedding_in_pipeline_split=true", "model.account_for_loss_in_pipeline_split=true"]
    elif p.layer_split == "uneven":
        out += [f"model.num_layers_in_first_pipeline_stage={p.first_stage_layers}", f"model.num_layers_in_last_pipeline_stage={p.last_stage_layers}"]
    if p.recompute != "none":
        out.append(f"model.recompute_granularity={p.recompute}")
        if p.recompute == "full":
            out += [f"model.recompute_method={p.recompute_method}", f"model.recompute_num_layers={p.recompute_num_layers}"]
        else:
            out.append("model.recompute_modules=[" + ",".join(p.recompute_modules or ["core_attn"]) + "]")
    if p.activation_offload == "layer":
        out += ["model.cpu_offloading=true", f"model.cpu_offloading_num_layers={m.num_layers - 1}"]
    elif p.activation_offload:
        out += ["model.fine_grained_activation_offloading=true", "model.offload_modules=[" + ",".join(p.activation_offload) + "]"]
    if p.checkpoint_interval is not None:
        out.append(f"checkpoint.save_interval={p.checkpoint_interval}")
    return out


def bridge_text(plan: LaunchPlan) -> str:
    return "\n".join(bridge_overrides(plan)) + "\n"


__all__ = ["ExportError", "megatron_flags", "megatron_env", "megatron_script", "bridge_overrides", "bridge_text", "check_megatron"]
