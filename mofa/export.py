"""Launch configurations for a chosen configuration: Megatron-LM flags and Megatron-Bridge
overrides (flag names and rules from ../shared/reference/frameworks.md). A configuration that
breaks a rule the framework enforces is never exported: `ExportError` says which rule."""

from __future__ import annotations

from costmodel.layout import layout_name
from costmodel.rules import config_violations
from costmodel.specs import ConfigSpec, Problem


class ExportError(ValueError):
    pass


#: Megatron-Core's names for the CP variants (--cp-comm-type)
CP_COMM_FLAG = {"p2p": "p2p", "all_gather": "allgather", "a2a": "a2a", "a2a+p2p": "a2a+p2p"}
#: Megatron-FSDP's sharding strategies (--data-parallel-sharding-strategy) by ZeRO stage
FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}


def _spec(config: dict) -> ConfigSpec:
    keep = {k: v for k, v in config.items() if k in ConfigSpec.model_fields}
    return ConfigSpec.model_validate(keep)


def _check(problem: Problem, config: dict) -> None:
    broken = config_violations(problem, _spec(config))
    if broken:
        raise ExportError(f"refusing to export a configuration Megatron would reject: {broken[0][1]}")


def _megatron_expressible(config: dict, what: str) -> None:
    """What Megatron-LM / Megatron-Bridge cannot run, refused with the reason."""
    c = config
    if c["pp"] > 1 and c["pp_schedule"] == "afab":
        raise ExportError(f"refusing to export {what}: Megatron has no all-forward-all-backward schedule (torchtitan runs it as GPipe / LoopedBFS)")
    if c["pp"] > 1 and c["pp_schedule"] == "dualpipev":
        raise ExportError(f"refusing to export {what}: Megatron has no DualPipeV schedule (DeepSeek's DualPipe repository and torchtitan do)")
    if c["zero_stage"] >= 2 and c["pp"] > 1:
        raise ExportError(f"refusing to export {what}: Megatron-FSDP (ZeRO-{c['zero_stage']}) does not run with pipeline parallelism")
    if c["zero_stage"] == 3 and not c["reshard_after_forward"]:
        raise ExportError(f"refusing to export {what}: Megatron-FSDP always frees gathered parameters after the forward (reshard_after_forward false is torchtitan's / FSDP2's option)")
    if c.get("dp_shard") and c["zero_stage"] >= 2:
        raise ExportError(f"refusing to export {what}: hybrid sharding with ZeRO-{c['zero_stage']} is torchtitan's (data_parallel_shard_degree), not Megatron's")
    if c["activation_offload"] == "layer" and c["pp"] > 1:
        raise ExportError(f"refusing to export {what}: Megatron's layer activation offload (--cpu-offloading) does not run with pp > 1; use fine-grained offload of modules")


def megatron_args(problem: Problem, config: dict) -> tuple[dict[str, str], list[str]]:
    """(environment, Megatron-LM command-line flags). config['checkpoint_interval'] is the
    interval in steps (the value an evaluation chose, not 'optimal')."""
    _check(problem, config)
    _megatron_expressible(config, "Megatron-LM flags")
    m, tr = problem.model, problem.training
    c = config
    args = [
        f"--tensor-model-parallel-size {c['tp']}",
        f"--pipeline-model-parallel-size {c['pp']}",
        f"--context-parallel-size {c['cp']}",
        f"--micro-batch-size {c['mbs']}",
        f"--global-batch-size {tr.global_batch_size}",
        f"--seq-length {tr.seq_len}",
        f"--max-position-embeddings {tr.seq_len}",
        f"--num-layers {m.num_layers}",
        f"--hidden-size {m.hidden_size}",
        f"--ffn-hidden-size {m.ffn_hidden_size}",
        f"--num-attention-heads {m.num_heads}",
    ]
    if m.head_dim and m.head_dim != m.hidden_size // m.num_heads:
        args.append(f"--kv-channels {m.head_dim}")
    if m.activation == "swiglu":
        args.append("--swiglu")
    elif m.activation == "squared_relu":
        args.append("--squared-relu")
    if m.norm == "rmsnorm":
        args.append("--normalization RMSNorm")
    if m.position_embedding == "alibi":
        raise ExportError("refusing to export: Megatron-Core has no ALiBi position embedding")
    args.append({"rope": "--position-embedding-type rope", "learned": "--position-embedding-type learned_absolute", "none": "--position-embedding-type none"}[m.position_embedding])
    if not m.linear_bias:
        args.append("--disable-bias-linear")
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if m.mla is not None:
        args += ["--multi-latent-attention", f"--kv-lora-rank {m.mla.kv_lora_rank}", f"--qk-head-dim {m.mla.qk_nope_head_dim}",
                 f"--qk-pos-emb-head-dim {m.mla.qk_rope_head_dim}", f"--v-head-dim {m.mla.v_head_dim}"]
        if m.mla.q_lora_rank:
            args.append(f"--q-lora-rank {m.mla.q_lora_rank}")
    elif m.num_kv_heads and m.num_kv_heads != m.num_heads:
        args += ["--group-query-attention", f"--num-query-groups {m.num_kv_heads}"]
    if m.moe is not None:
        args += [f"--num-experts {m.moe.num_experts}", f"--moe-router-topk {m.moe.top_k}", f"--moe-ffn-hidden-size {m.moe.expert_ffn_hidden_size}",
                 f"--expert-model-parallel-size {c['ep']}", f"--expert-tensor-parallel-size {c['etp']}",
                 "--moe-token-dispatcher-type alltoall", "--moe-grouped-gemm"]
        if m.moe.num_shared_experts:
            args.append(f"--moe-shared-expert-intermediate-size {m.moe.num_shared_experts * m.moe.shared_ffn}")
        if m.moe.first_dense_layers:
            pattern = "[" + ",".join(["0"] * m.moe.first_dense_layers + ["1"] * m.num_moe_layers) + "]"
            args.append(f"--moe-layer-freq {pattern}")
    if c["tp"] > 1 and tr.sequence_parallel:
        args.append("--sequence-parallel")
    if c["vp"] > 1:
        args.append(f"--num-virtual-stages-per-pipeline-rank {c['vp']}")
        if not c["pp_overlap"]:
            args.append("--no-overlap-p2p-communication")
        if c["pp_schedule"] == "flexible":
            args.append(f"--microbatch-group-size-per-virtual-pipeline-stage {c['pp_group']}")
    layout = layout_name(m.num_layers, c["pp"], c["vp"], c["first_stage_layers"], c["last_stage_layers"])
    if c["pp"] > 1 and layout == "embedding_loss":
        args += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    elif c["pp"] > 1 and layout == "uneven":
        args += [f"--decoder-first-pipeline-num-layers {c['first_stage_layers']}", f"--decoder-last-pipeline-num-layers {c['last_stage_layers']}"]
    if c["cp"] > 1:
        args.append(f"--cp-comm-type {CP_COMM_FLAG[c['cp_comm']]}")
        if c["cp_comm"] == "a2a+p2p":
            args.append(f"--hierarchical-context-parallel-sizes {c['cp_a2a']} {c['cp'] // c['cp_a2a']}")
    if c["zero_stage"] == 1:
        args.append("--use-distributed-optimizer")
        if c.get("dp_shard"):
            args.append(f"--num-distributed-optimizer-instances {c['dp'] * c['cp'] // c['dp_shard']}")
    elif c["zero_stage"] >= 2:
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {FSDP_STRATEGY[c['zero_stage']]}"]
    if c["dp_overlap"]:
        args.append("--overlap-grad-reduce")
        if c["zero_stage"] >= 1:
            args.append("--overlap-param-gather")
    if c["tp_overlap"]:
        args.append("--tp-comm-overlap")
    if c["ep_overlap"]:
        args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if c["recompute"] == "selective":
        args += ["--recompute-granularity selective", "--recompute-modules " + " ".join(c["recompute_modules"])]
    elif c["recompute"] == "full":
        args += ["--recompute-granularity full", f"--recompute-method {c['recompute_method']}", f"--recompute-num-layers {c['recompute_num_layers']}"]
    if c["activation_offload"] == "layer":
        args += ["--cpu-offloading", f"--cpu-offloading-num-layers {m.num_layers - 1}"]
    elif c["activation_offload"]:
        args += ["--fine-grained-activation-offloading", "--offload-modules " + " ".join(c["activation_offload"])]
    dt = tr.dtypes
    if c["cpu_optimizer"] or dt.grads != "fp32":
        args.append("--use-precision-aware-optimizer")
    if dt.grads != "fp32":
        args.append(f"--main-grads-dtype {dt.grads}")
    if c["cpu_optimizer"]:
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction 1.0", "--overlap-cpu-optimizer-d2h-h2d"]
    args.append("--bf16" if dt.params == "bf16" else "--fp16" if dt.params == "fp16" else "")
    if dt.compute == "fp8":
        args.append("--fp8-format hybrid")
    interval = c.get("checkpoint_interval")
    if isinstance(interval, int):
        args.append(f"--save-interval {interval}")
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if (c["tp"] > 1 or c["cp"] > 1) else {}
    return env, [a for a in args if a]


def bridge_overrides(problem: Problem, config: dict) -> list[str]:
    """Megatron-Bridge / NeMo 2.0 `key=value` overrides (Megatron-Core field names)."""
    _check(problem, config)
    _megatron_expressible(config, "Megatron-Bridge overrides")
    m = problem.model
    c = config
    out = [
        f"model.tensor_model_parallel_size={c['tp']}",
        f"model.pipeline_model_parallel_size={c['pp']}",
        f"model.virtual_pipeline_model_parallel_size={c['vp'] if c['vp'] > 1 else 'null'}",
        f"model.context_parallel_size={c['cp']}",
        f"model.expert_model_parallel_size={c['ep']}",
        f"model.expert_tensor_parallel_size={c['etp']}",
        f"model.sequence_parallel={str(c['tp'] > 1 and problem.training.sequence_parallel).lower()}",
        f"train.micro_batch_size={c['mbs']}",
        f"train.global_batch_size={problem.training.global_batch_size}",
        f"model.seq_length={problem.training.seq_len}",
        f"ddp.use_distributed_optimizer={str(c['zero_stage'] == 1).lower()}",
        f"ddp.overlap_grad_reduce={str(c['dp_overlap']).lower()}",
        f"ddp.overlap_param_gather={str(c['dp_overlap'] and c['zero_stage'] >= 1).lower()}",
        f"comm_overlap.tp_comm_overlap={str(c['tp_overlap']).lower()}",
        f"comm_overlap.overlap_p2p_comm={str(c['pp_overlap']).lower()}",
        f"comm_overlap.overlap_moe_expert_parallel_comm={str(c['ep_overlap']).lower()}",
        f"optimizer.optimizer_cpu_offload={str(c['cpu_optimizer']).lower()}",
        f"optimizer.optimizer_offload_fraction={1.0 if c['cpu_optimizer'] else 0.0}",
        f"optimizer.use_precision_aware_optimizer={str(c['cpu_optimizer'] or problem.training.dtypes.grads != 'fp32').lower()}",
    ]
    if problem.training.dtypes.grads != "fp32":
        out.append(f"optimizer.main_grads_dtype={problem.training.dtypes.grads}")
    if c["zero_stage"] >= 2:
        out += ["ddp.use_megatron_fsdp=true", f"ddp.data_parallel_sharding_strategy={FSDP_STRATEGY[c['zero_stage']]}"]
    if c["zero_stage"] == 1 and c.get("dp_shard"):
        out.append(f"ddp.num_distributed_optimizer_instances={c['dp'] * c['cp'] // c['dp_shard']}")
    if c["cp"] > 1:
        out.append(f"model.cp_comm_type={CP_COMM_FLAG[c['cp_comm']]}")
        if c["cp_comm"] == "a2a+p2p":
            out.append(f"model.hierarchical_context_parallel_sizes=[{c['cp_a2a']},{c['cp'] // c['cp_a2a']}]")
    if c["pp_schedule"] == "flexible":
        out.append(f"model.microbatch_group_size_per_vp_stage={c['pp_group']}")
    layout = layout_name(m.num_layers, c["pp"], c["vp"], c["first_stage_layers"], c["last_stage_layers"])
    if c["pp"] > 1 and layout == "embedding_loss":
        out += ["model.account_for_embedding_in_pipeline_split=true", "model.account_for_loss_in_pipeline_split=true"]
    if c["pp"] > 1 and layout == "uneven":
        out += [f"model.num_layers_in_first_pipeline_stage={c['first_stage_layers']}", f"model.num_layers_in_last_pipeline_stage={c['last_stage_layers']}"]
    if c["recompute"] != "none":
        out.append(f"model.recompute_granularity={c['recompute']}")
        if c["recompute"] == "full":
            out += [f"model.recompute_method={c['recompute_method']}", f"model.recompute_num_layers={c['recompute_num_layers']}"]
        else:
            out.append("model.recompute_modules=[" + ",".join(c["recompute_modules"]) + "]")
    if c["activation_offload"] == "layer":
        out += ["model.cpu_offloading=true", f"model.cpu_offloading_num_layers={m.num_layers - 1}"]
    elif c["activation_offload"]:
        out += ["model.fine_grained_activation_offloading=true", "model.offload_modules=[" + ",".join(c["activation_offload"]) + "]"]
    interval = c.get("checkpoint_interval")
    if isinstance(interval, int):
        out.append(f"checkpoint.save_interval={interval}")
    return out
