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
  * activation checkpointing: none, full (every block) or per-op selective (SelectiveAC: the
    plan's recompute_modules [ops]; not Megatron's modules);
  * CUDA graphs (training.disable_cuda_graphs, on by default) reject pp > 1 and the default
    EP dispatcher: the exporter disables them there;
  * mixed_precision_reduce is float32 only; training.enable_cpu_offload offloads FSDP's
    parameters, gradients and optimizer states (not the CPU optimizer alone);
  * a heterogeneous layout is parallelism.module_fqns_per_model_part (tok_embeddings, layers.i,
    norm, lm_head per stage, stage s on rank s % pp for 1F1B and Interleaved1F1B), which its
    command line cannot give (tyro reads every word as a one-module stage): the script writes a
    config module that sets it on the config function's config and launches with
    `--module mofa_torchtitan_layout --config mofa_config`.
"""

from __future__ import annotations

import shlex

from mofa.launch.common import check_rules, refuse
from mofa.launch.plan import LaunchPlan

NAME = "torchtitan"

SCHEDULES = {"1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B", "dualpipev": "DualPipeV"}


def config_function(plan: LaunchPlan) -> tuple[str, str]:
    """(module, function) of the config function that builds the plan's model in its GEMM
    dtype (the rules config_function and config_dtype refuse a plan without one)."""
    from costmodel.frameworks import torchtitan_functions

    return next((module, function) for module, function, dtype in torchtitan_functions(plan.model) if dtype == plan.dtypes.compute)


def _schedule(p: LaunchPlan) -> str:
    if p.pp_schedule == "afab":
        return "GPipe" if p.vp == 1 else "LoopedBFS"
    return SCHEDULES[p.pp_schedule]


def _layout(p: LaunchPlan) -> tuple[int, int, int]:
    """(layers per stage, first-stage less, last-stage less) that give the plan's split."""
    L, stages = p.model.num_layers, p.pp * p.vp
    if p.layer_split == "even":
        return L // stages, 0, 0
    if p.layer_split == "embedding_loss":
        return (L + 2) // stages, 1, 1
    if p.pp_schedule == "dualpipev":
        # the V: stage 0 and the last stage are rank 0's (costmodel.pipeline.stage_sizes), the
        # ones torchtitan shortens; every other stage holds `per`
        from costmodel.pipeline import stage_sizes

        sizes, _ = stage_sizes(L, p.pp, 2, p.first_stage_layers, p.last_stage_layers, True)
        per = int(sizes[1])
        return per, per - int(sizes[0]), per - int(sizes[-1])
    # other uneven splits are given as module lists (split_layout)
    per = p.middle_stage_layers if p.pp > 2 else max(p.first_stage_layers, p.last_stage_layers)
    return per, per - p.first_stage_layers, per - p.last_stage_layers


LAYOUT_MODULE, LAYOUT_FUNCTION = "mofa_torchtitan_layout", "mofa_config"


def _stage_layout(plan: LaunchPlan):
    """The plan's layout string parsed (costmodel.stage_layout, the one reader of it)."""
    from costmodel.stage_layout import StageLayout

    return StageLayout.from_megatron(plan.pipeline_layout, plan.pp, plan.vp, plan.pp_schedule == "dualpipev")


def split_layout(plan: LaunchPlan):
    """The layers of every stage torchtitan must be given as module lists
    (module_fqns_per_model_part, in a config module): the plan's heterogeneous layout where it
    has one; else its layer split (costmodel.pipeline.stage_sizes, what the model priced) where
    torchtitan's split flags cannot give it: they set one count for every stage and take layers
    off the first and the last stage only, so an interleaved split with uneven first / last
    ranks (each of its vp stages shorter) or a first or last rank longer than the others needs
    the lists (in model order: torchtitan places them by its schedule, DualPipeV's V included).
    None where the flags give the split (_layout), DualPipeV's V split among them."""
    from costmodel.pipeline import stage_sizes
    from costmodel.stage_layout import StageLayout

    if plan.pipeline_layout is not None:
        return _stage_layout(plan)
    if plan.pp == 1:
        return None
    stages, vee = plan.pp * plan.vp, plan.pp_schedule == "dualpipev"
    sizes, _ = stage_sizes(plan.model.num_layers, plan.pp, plan.vp, plan.first_stage_layers, plan.last_stage_layers, vee)
    per, less_first, less_last = _layout(plan)
    if less_first >= 0 and less_last >= 0 and sizes.tolist() == [per - less_first] + [per] * (stages - 2) + [per - less_last]:
        return None
    return StageLayout.from_stage_sizes(plan.pp, plan.vp, sizes, plan.model.mtp_layers, vee)


def check(plan: LaunchPlan) -> None:
    """What torchtitan 0.3.0 cannot run: the rules of costmodel.frameworks, which the search
    applies under `--framework torchtitan`; a layout holding MTP modules (torchtitan builds
    none). A layout under DualPipeV is its stages in model order, which torchtitan's
    ScheduleDualPipeV places in the V itself ("v" stage style), as the layout model does."""
    if plan.pipeline_layout is not None:
        if _stage_layout(plan).mtp_layers:
            refuse(NAME, "a pipeline layout with MTP modules (m): torchtitan's config functions build none")
    check_rules(plan, NAME)


def module_fqns(plan: LaunchPlan) -> list[list[str]]:
    """torchtitan's module names of every stage, in model order, for the plan's split_layout:
    the embedding on the first stage, the final norm and the output head on the last, each
    decoder layer where the layout puts it (an empty list for a stage without layers)."""
    layout = split_layout(plan)
    stages, first = [], 0
    for s, n in enumerate(layout.decoders):
        stages.append(["tok_embeddings"] * (s == 0) + [f"layers.{i}" for i in range(first, first + n)]
                      + ["norm", "lm_head"] * (s == layout.stages - 1))
        first += n
    return stages


def layout_module(plan: LaunchPlan) -> str:
    """The Python config module of a plan with a layout: the config function's config with
    module_fqns_per_model_part set (and no layers-per-stage split to contradict it)."""
    module, function = config_function(plan)
    stages = ",\n".join(f"    {names!r}" for names in module_fqns(plan))
    return (f'"""torchtitan 0.3.0 config written by `mofa export`: torchtitan.models.{module}\'s {function} with the\n'
            f'pipeline layout {split_layout(plan).to_megatron()} (one module list per stage, in model order)."""\n'
            f"from torchtitan.models.{module}.config_registry import {function}\n\n"
            f"STAGES = [\n{stages},\n]\n\n\n"
            f"def {LAYOUT_FUNCTION}():\n"
            f"    config = {function}()\n"
            f"    config.parallelism.pipeline_parallel_layers_per_stage = None  # the stages are the layout's\n"
            f"    config.parallelism.module_fqns_per_model_part = [list(stage) for stage in STAGES]\n"
            f"    return config\n")


def torchtitan_args(plan: LaunchPlan) -> list[str]:
    """The argv torchtitan's ConfigManager parses (after `-m torchtitan.train`)."""
    check(plan)
    p = plan
    module, function = config_function(p)
    layout = split_layout(p)
    if layout is not None:  # the script's config module (layout_module) wraps the function
        module, function = LAYOUT_MODULE, LAYOUT_FUNCTION
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
        args += ["--parallelism.pipeline-parallel-schedule", _schedule(p)]
        if layout is None:
            per, less_first, less_last = _layout(p)
            args += ["--parallelism.pipeline-parallel-layers-per-stage", str(per),
                     "--parallelism.pipeline-parallel-first-stage-less-layers", str(less_first),
                     "--parallelism.pipeline-parallel-last-stage-less-layers", str(less_last)]
        args += ["--parallelism.pipeline-parallel-microbatch-size", str(p.micro_batch_size),
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
    # torch.compile fuses what the model prices fused (the norms, rotary, SwiGLU); async TP needs it too
    if p.compiled or p.tp_overlap:
        args += ["--compile.enable", "--compile.components", "model,loss"]
    args.append("--compile.enable-async-tensor-parallel" if p.tp_overlap else "--compile.no-enable-async-tensor-parallel")
    if p.checkpoint_interval is not None:
        args += ["--checkpoint.enable", "--checkpoint.interval", str(p.checkpoint_interval)]
    else:
        args += ["--checkpoint.no-enable"]
    # selective here is only the per-op policy (recompute_modules [ops]): the rules refuse modules
    args.append({"full": "activation-checkpoint:full", "selective": "activation-checkpoint:selective"}.get(p.recompute, "activation-checkpoint:none"))
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
    ]
    if split_layout(plan) is not None:  # torchtitan's CLI cannot give the layout: a config module does
        lines += [
            "# the pipeline layout: a config module on PYTHONPATH (every node writes its own copy)",
            'LAYOUT_DIR="$(mktemp -d)"',
            f'cat > "$LAYOUT_DIR/{LAYOUT_MODULE}.py" <<\'PY\'',
            *layout_module(plan).splitlines(),
            "PY",
            'export PYTHONPATH="$LAYOUT_DIR${PYTHONPATH:+:$PYTHONPATH}"',
        ]
    lines += ["ARGS=("]
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
