"""torchtitan 0.3.0 command line from a launch plan.

torchtitan 0.3.0 has no job files: a run names a config function of a model module
(`--module llama3 --config llama3_405b`, torchtitan/models/<model>/config_registry.py) and
overrides its fields with flags parsed by `torchtitan.config.ConfigManager` (tyro), the
activation-checkpoint sub-command last. The function fixes the architecture and the
quantization (its converters): the command line can change neither, so the exporter picks the
function whose model is the plan's and whose GEMM dtype is the plan's, and refuses otherwise.
Facts (read from the 0.3.0 sources, checked by tests/frameworks/):
  * parallel_dims: dp_replicate * dp_shard * cp * tp * pp == world; FSDP always runs over
    (dp_shard x cp), so ZeRO-0 is dp_replicate = dp with cp = 1, and FSDP2 always shards the
    parameters (ZeRO-3); EP borrows ranks of dp_shard * cp * tp (no expert TP);
  * CP: PyTorch's context parallel with its default all-gather rotation (no flag for another);
  * schedules: 1F1B, Interleaved1F1B, GPipe, LoopedBFS, DualPipeV (torch.distributed.pipelining);
    layers per stage with the first / last stage `less_layers` weights;
  * activation checkpointing: none, full (every block) or per-op selective (not modules);
  * CUDA graphs (training.disable_cuda_graphs, on by default) reject pp > 1 and the default
    EP dispatcher: the exporter disables them there;
  * mixed_precision_reduce is float32 only; training.enable_cpu_offload offloads FSDP's
    parameters, gradients and optimizer states (not the CPU optimizer alone).
"""

from __future__ import annotations

import shlex

from mofa.launch.common import needs_iterations, refuse
from mofa.launch.plan import LaunchPlan

NAME = "torchtitan"

#: config functions by architecture: (module, function, GEMM dtype) -> the model it builds
#: (layers, hidden, heads, kv heads, vocab, experts); torchtitan 0.3.0's config_registry
CONFIGS = (
    ("llama3", "llama3_8b", "bf16", (32, 4096, 32, 8, 128256, None)),
    ("llama3", "llama3_70b", "bf16", (80, 8192, 64, 8, 128256, None)),
    ("llama3", "llama3_405b", "fp8", (126, 16384, 128, 8, 128256, None)),
    ("deepseek_v3", "deepseek_v3_671b", "bf16", (61, 7168, 128, None, 129280, 256)),
    ("deepseek_v3", "deepseek_v3_671b_float8", "fp8", (61, 7168, 128, None, 129280, 256)),
)

SCHEDULES = {"1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B", "dualpipev": "DualPipeV"}


def architecture(plan: LaunchPlan) -> tuple:
    m = plan.model
    return (m.num_layers, m.hidden_size, m.num_heads, None if m.mla is not None else m.kv_heads, m.vocab_size,
            m.moe.num_experts if m.moe else None)


def config_function(plan: LaunchPlan) -> tuple[str, str]:
    arch = architecture(plan)
    matches = [c for c in CONFIGS if c[3] == arch]
    if not matches:
        refuse(NAME, f"no config function builds {plan.model.name} ({plan.model.num_layers} layers, hidden {plan.model.hidden_size}, "
               f"vocabulary {plan.model.vocab_size}); the command line cannot change the architecture")
    for module, function, dtype, _ in matches:
        if dtype == plan.dtypes.compute:
            return module, function
    have = ", ".join(f"{f} ({d})" for _, f, d, _ in matches)
    refuse(NAME, f"its {plan.model.name} config functions compute in {have}, the plan in {plan.dtypes.compute}; "
           "the quantization is fixed by the function, not a flag")


def _schedule(p: LaunchPlan) -> str:
    if p.pp_schedule == "afab":
        return "GPipe" if p.vp == 1 else "LoopedBFS"
    if p.pp_schedule == "flexible":
        refuse(NAME, "the flexible schedule's round size (nc != pp) has no flag: Interleaved1F1B rounds by pp")
    return SCHEDULES[p.pp_schedule]


def _layout(p: LaunchPlan) -> tuple[int, int, int]:
    """(layers per stage, first-stage less, last-stage less) that give the plan's split."""
    L, stages = p.model.num_layers, p.pp * p.vp
    if p.layer_split == "even":
        return L // stages, 0, 0
    if p.layer_split == "embedding_loss":
        return (L + 2) // stages, 1, 1
    if p.vp > 1:
        refuse(NAME, "uneven first/last ranks with virtual stages: torchtitan shortens only the first and last virtual stage")
    per = p.middle_stage_layers if p.pp > 2 else max(p.first_stage_layers, p.last_stage_layers)
    less_first, less_last = per - p.first_stage_layers, per - p.last_stage_layers
    if less_first < 0 or less_last < 0:
        refuse(NAME, "a first or last rank with more layers than the middle ranks: torchtitan only shortens them")
    return per, less_first, less_last


def check(plan: LaunchPlan) -> None:
    p, dt = plan, plan.dtypes
    if p.pipeline_layout is not None:
        refuse(NAME, "a heterogeneous pipeline layout (--pipeline-layouts) is Megatron-Core's --pipeline-model-parallel-layout; "
               "this exporter only splits layers evenly")
    if p.zero_stage in (1, 2):
        refuse(NAME, f"ZeRO-{p.zero_stage} keeps whole parameters; torchtitan's FSDP2 always shards them (ZeRO-3), or replicates everything (ZeRO-0)")
    if p.zero_stage == 0 and p.cp > 1:
        refuse(NAME, "ZeRO-0 with cp > 1: torchtitan always shards parameters over the context-parallel ranks (its FSDP mesh is dp_shard x cp)")
    if p.hsdp and p.dp_shard % p.cp:
        refuse(NAME, f"an HSDP sharding group of {p.dp_shard} ranks that is not a multiple of cp={p.cp} (torchtitan shards over dp_shard x cp)")
    if p.cp > 1 and p.cp_comm != "all_gather":
        refuse(NAME, f"CP variant {p.cp_comm}: torchtitan runs PyTorch's context parallel with its all-gather rotation, and has no flag for another")
    if p.model.moe is not None:
        if p.ep > 1 and p.etp != 1:
            refuse(NAME, f"expert tensor parallelism etp={p.etp}: torchtitan's EP borrows the TP ranks (no expert TP)")
        if p.ep == 1 and p.etp != p.tp:
            refuse(NAME, f"etp={p.etp} without EP: torchtitan shards the experts over TP like the dense layers")
        fsdp_tp = (p.dp_shard if p.zero_stage == 3 else 1) * p.tp
        if fsdp_tp % p.ep:
            refuse(NAME, f"ep={p.ep} must divide dp_shard x cp x tp = {fsdp_tp} (EP borrows FSDP and TP ranks)")
    if p.ep_overlap:
        refuse(NAME, "EP communication overlap has no flag (its overlapped EP is a separate config function)")
    if p.recompute == "selective":
        refuse(NAME, "selective recompute by module: torchtitan's selective AC is per op (saves matmuls and attention, recomputes every second matmul)")
    if p.recompute == "full" and not (p.recompute_method == "uniform" and p.recompute_num_layers == 1):
        refuse(NAME, f"full recompute {p.recompute_method} {p.recompute_num_layers}: torchtitan's full AC checkpoints every block")
    if p.activation_offload:
        refuse(NAME, "activation offload: torchtitan has none")
    if p.cpu_optimizer:
        refuse(NAME, "a CPU optimizer alone: training.enable_cpu_offload also moves FSDP's parameters and gradients to the host")
    if dt.grads != "fp32":
        refuse(NAME, f"gradient reduction in {dt.grads}: training.mixed_precision_reduce is float32 only")
    if dt.optimizer != "fp32":
        refuse(NAME, f"optimizer states in {dt.optimizer}: torchtitan keeps them in the parameters' fp32 dtype")
    if dt.params not in ("bf16", "fp32"):
        refuse(NAME, f"parameters in {dt.params}: mixed_precision_param is bfloat16 or float32")
    if p.model.mtp_layers:
        refuse(NAME, f"{p.model.name} has {p.model.mtp_layers} multi-token-prediction module(s); torchtitan's config function builds none")
    if p.attention_kernel != "flash":
        refuse(NAME, "an unfused attention kernel: torchtitan's configs use SDPA / flex attention")
    needs_iterations(p, NAME)
    if p.moe_chunks != 1 or p.moe_capacity_factor is not None or p.moe_dispatcher != "alltoall":
        refuse(NAME, "chunked MoE dispatch, token dropping and DeepEP dispatch are not exported for torchtitan")


def torchtitan_args(plan: LaunchPlan) -> list[str]:
    """The argv torchtitan's ConfigManager parses (after `-m torchtitan.train`)."""
    check(plan)
    p = plan
    module, function = config_function(p)
    args = ["--module", module, "--config", function]
    replicate = p.dp if p.zero_stage == 0 else p.dp_replicate
    shard = 1 if p.zero_stage == 0 else p.dp_shard // p.cp
    args += ["--parallelism.data-parallel-replicate-degree", str(replicate),
             "--parallelism.data-parallel-shard-degree", str(shard),
             "--parallelism.tensor-parallel-degree", str(p.tp),
             "--parallelism.context-parallel-degree", str(p.cp),
             "--parallelism.pipeline-parallel-degree", str(p.pp),
             "--parallelism.expert-parallel-degree", str(p.ep)]
    args.append("--parallelism.enable-sequence-parallel" if p.sequence_parallel or p.tp == 1 else "--parallelism.no-enable-sequence-parallel")
    if p.zero_stage == 3:
        args += ["--parallelism.fsdp-reshard-after-forward", "always" if p.reshard_after_forward else "never"]
    if p.pp > 1:
        per, less_first, less_last = _layout(p)
        args += ["--parallelism.pipeline-parallel-schedule", _schedule(p),
                 "--parallelism.pipeline-parallel-layers-per-stage", str(per),
                 "--parallelism.pipeline-parallel-first-stage-less-layers", str(less_first),
                 "--parallelism.pipeline-parallel-last-stage-less-layers", str(less_last),
                 "--parallelism.pipeline-parallel-microbatch-size", str(p.micro_batch_size),
                 "--training.local-batch-size", str(p.micro_batch_size * p.microbatches)]
    else:
        args += ["--training.local-batch-size", str(p.micro_batch_size)]
    args += ["--training.global-batch-size", str(p.global_batch_size),
             "--training.seq-len", str(p.seq_len),
             "--training.steps", str(p.train_iters),
             "--training.dtype", "float32",
             "--training.mixed-precision-param", "bfloat16" if p.dtypes.params == "bf16" else "float32",
             "--training.mixed-precision-reduce", "float32",
             "--training.no-enable-cpu-offload"]
    # the Trainer's config validation: CUDA graphs (on by default) support neither pipeline
    # parallelism nor the default EP token dispatcher, which synchronises with the CPU
    if p.pp > 1 or p.ep > 1:
        args.append("--training.disable-cuda-graphs")
    if p.tp_overlap:
        args += ["--compile.enable", "--compile.components", "model,loss", "--compile.enable-async-tensor-parallel"]
    else:
        args += ["--compile.no-enable-async-tensor-parallel"]
    if p.checkpoint_interval is not None:
        args += ["--checkpoint.enable", "--checkpoint.interval", str(p.checkpoint_interval)]
    else:
        args += ["--checkpoint.no-enable"]
    args.append("activation-checkpoint:full" if p.recompute == "full" else "activation-checkpoint:none")
    return args


def torchtitan_script(plan: LaunchPlan) -> str:
    args = torchtitan_args(plan)
    lines = [
        "#!/usr/bin/env bash",
        f"# torchtitan 0.3.0 launch written by `mofa export` for {plan.problem or 'a problem'} on {plan.num_gpus} x {plan.hardware}:",
        f"#   {plan.label()}",
        "# Run it on every node with NODE_RANK (0..NNODES-1) and MASTER_ADDR (node 0) set.",
        "set -euo pipefail",
        f"NNODES={plan.num_nodes}",
        f"GPUS_PER_NODE={plan.gpus_per_node}",
        ': "${NODE_RANK:?set NODE_RANK to this node\'s rank (0..NNODES-1)}"',
        ': "${MASTER_ADDR:?set MASTER_ADDR to node 0\'s address}"',
        'MASTER_PORT="${MASTER_PORT:-29500}"',
        "ARGS=(",
    ]
    # one flag (with its value) per line; the sub-command last
    i = 0
    while i < len(args):
        if args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--") and ":" not in args[i + 1]:
            lines.append(f"  {shlex.quote(args[i])} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            lines.append(f"  {shlex.quote(args[i])}")
            i += 1
    lines += [
        ")",
        'exec torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" --node-rank "$NODE_RANK" \\',
        '  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\',
        '  -m torchtitan.train "${ARGS[@]}" "$@"',
        "",
    ]
    return "\n".join(lines)
