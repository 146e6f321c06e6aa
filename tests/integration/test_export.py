"""Launch-config export from the typed launch plan: the flags each feature maps to in
Megatron-LM, Megatron-Bridge, torchtitan 0.3.0 and DeepSpeed 0.19.8, the refusals (with their
reasons), shell quoting, `mofa export` and `solve --out`. Flag names and rules:
../shared/reference/frameworks.md and framework_validation.md; tests/frameworks/ checks the
same files with the frameworks' own code."""

import json
import os
import stat
import subprocess
import sys

import pytest
import yaml

from conftest import PROBLEMS
from costmodel.loader import load_problem
from costmodel.specs import ConfigSpec
from mofa.launch import FORMATS, ExportError, export
from mofa.launch.deepspeed import deepspeed_config
from mofa.launch.megatron import bridge_overrides, megatron_arg_groups, megatron_env, megatron_flags, megatron_script
from mofa.launch.plan import LaunchPlan, build_plan
from mofa.launch.torchtitan import torchtitan_args, torchtitan_script


def plan_of(problem, interval=None, **fields) -> LaunchPlan:
    return build_plan(problem, ConfigSpec(**fields), interval)


def groups(plan) -> set[str]:
    return {" ".join(g) for g in megatron_arg_groups(plan)}


def small_problem(tmp_path, model="llama3.1-8b", **training):
    doc = {
        "model": model,
        "hardware": "h100-sxm",
        "cluster": {"num_gpus": 64, "gpus_per_node": 8},
        "training": {"global_batch_size": 64, "seq_len": 4096, "steps": 1000, **training},
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_problem(str(path))


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


LLAMA405 = PROBLEMS / "tuning" / "llama3_405b_16384xh100_seq8k.yaml"
DEEPSEEK = PROBLEMS / "tuning" / "deepseek_v3_1024gpu_sn8.yaml"


def test_plan_is_typed_complete_and_survives_json():
    problem = load_problem(str(LLAMA405))
    plan = plan_of(problem, 45, tp=8, cp=4, pp=16, vp=8, layer_split="embedding_loss", zero_stage=1, dp_overlap=True)
    assert (plan.first_stage_layers, plan.last_stage_layers, plan.middle_stage_layers, plan.layer_split) == (7, 7, 8, "embedding_loss")
    assert (plan.dp, plan.microbatches, plan.dp_shard, plan.dp_replicate) == (32, 64, 128, 1)
    assert plan.train_iters == -(-int(15.6e12) // (2048 * 8192)) and plan.checkpoint_interval == 45
    assert plan.num_nodes == 2048 and plan.model.num_layers == 126 and plan.pp_schedule == "interleaved_1f1b"
    assert LaunchPlan.model_validate(json.loads(plan.model_dump_json())) == plan
    with pytest.raises(ValueError, match="tp=3 does not divide num_heads=128"):
        plan_of(problem, tp=3)


def test_solve_result_hands_typed_plans_to_export():
    """issue 12: the result of a solve carries typed plans; result.json stores them and they
    validate back to the same plan (no dict round-trip that re-derives the layout)."""
    from optimizer.search import solve

    problem = load_problem(str(PROBLEMS / "tuning" / "llama2_70b_128gpu.yaml"))
    result = solve(problem, "cpsat", None, 2, None)
    plans = result.plans(problem)
    out = result.as_dict(problem)
    assert len(plans) == 2 and all(isinstance(p, LaunchPlan) for p in plans)
    assert [LaunchPlan.model_validate(json.loads(json.dumps(e["plan"]))) for e in out["top"]] == plans
    assert plans[0].checkpoint_interval == out["best"]["checkpoint_interval"]


def test_megatron_llama3_405b_layout_with_embedding_and_loss_accounting():
    problem = load_problem(str(LLAMA405))
    plan = plan_of(problem, 45, tp=8, cp=4, pp=16, vp=8, mbs=1, layer_split="embedding_loss", tp_overlap=True, cp_overlap=True,
                   pp_overlap=True, dp_overlap=True, zero_stage=1)
    assert megatron_env(plan) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    flags = groups(plan)
    for flag in ("--tensor-model-parallel-size 8", "--context-parallel-size 4", "--pipeline-model-parallel-size 16",
                 "--num-virtual-stages-per-pipeline-rank 8", "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                 "--sequence-parallel", "--tp-comm-overlap", "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                 "--group-query-attention", "--num-query-groups 8", "--swiglu", "--cp-comm-type p2p", "--save-interval 45",
                 "--global-batch-size 2048", "--seq-length 8192", "--num-layers 126", "--train-iters 929833", "--bf16",
                 "--accumulate-allreduce-grads-in-fp32", "--optimizer adam", "--hidden-size 16384"):
        assert flag in flags, flag
    assert "--no-overlap-p2p-communication" not in flags
    assert not any(f.startswith("--decoder-first-pipeline-num-layers") for f in flags)
    assert not any(f.startswith("--expert-") for f in flags)  # dense model
    overrides = bridge_overrides(plan)
    for item in ("model.virtual_pipeline_model_parallel_size=8", "model.account_for_embedding_in_pipeline_split=true",
                 "ddp.overlap_param_gather=true", "comm_overlap.overlap_p2p_comm=true", "checkpoint.save_interval=45",
                 "train.train_iters=929833", "ddp.grad_reduce_in_fp32=true", "mixed_precision.grad_reduce_in_fp32=true",
                 "model.pipeline_model_parallel_layout=null"):
        assert item in overrides, item
    assert not any(item.startswith("mixed_precision.fp8") for item in overrides)  # bf16 GEMMs
    # fp8 GEMMs: Megatron-LM's --fp8-format hybrid (delayed scaling), and the Bridge's MixedPrecisionConfig fields,
    # which pretrain() copies onto the model (tests/frameworks reads them back after it)
    fp8 = plan.model_copy(update={"dtypes": plan.dtypes.model_copy(update={"compute": "fp8", "grads": "bf16"})})
    assert "--fp8-format hybrid" in groups(fp8) and "--grad-reduce-in-bf16" in groups(fp8)
    overrides = bridge_overrides(fp8)
    for item in ("mixed_precision.fp8=hybrid", "mixed_precision.fp8_recipe=delayed", "mixed_precision.grad_reduce_in_fp32=false",
                 "ddp.grad_reduce_in_fp32=false"):
        assert item in overrides, item


def test_uneven_first_and_last_stages(tmp_path):
    problem = small_problem(tmp_path)  # 32 layers
    plan = plan_of(problem, tp=2, pp=4, first_stage_layers=6, last_stage_layers=10)
    assert plan.layer_split == "uneven" and plan.middle_stage_layers == 8
    flags = groups(plan)
    assert "--decoder-first-pipeline-num-layers 6" in flags and "--decoder-last-pipeline-num-layers 10" in flags
    assert not any(f.startswith("--num-virtual-stages-per-pipeline-rank") for f in flags)
    overrides = bridge_overrides(plan)
    assert "model.num_layers_in_first_pipeline_stage=6" in overrides and "model.num_layers_in_last_pipeline_stage=10" in overrides
    assert "model.virtual_pipeline_model_parallel_size=null" in overrides
    # torchtitan: shorter ends by its split flags (the middle ranks' 9 layers per stage, the first 3 and the last 1 fewer)
    args = torchtitan_args(plan_of(problem, tp=2, pp=4, zero_stage=3, first_stage_layers=6, last_stage_layers=8, layer_split="uneven"))
    assert flag_value(args, "--parallelism.pipeline-parallel-layers-per-stage") == "9"
    assert flag_value(args, "--parallelism.pipeline-parallel-first-stage-less-layers") == "3"
    assert flag_value(args, "--parallelism.pipeline-parallel-last-stage-less-layers") == "1"
    assert "--module" in args and args[args.index("--module") + 1] == "llama3"


@pytest.mark.parametrize("pp, vp, first, last", [(4, 1, 6, 10), (4, 2, 6, 10), (4, 2, 7, 7)])
def test_torchtitan_gets_splits_its_flags_cannot_give_as_module_lists(tmp_path, pp, vp, first, last):
    """A last rank longer than the middle ones (its flags only take layers off the ends) and
    uneven ranks with virtual stages (the flags shorten one stage at each end, the split every
    stage of the rank): the script's config module lists each stage's modules, the stages the
    model priced (costmodel.pipeline.stage_sizes), in model order."""
    from costmodel.pipeline import stage_sizes
    from mofa.launch.torchtitan import LAYOUT_MODULE, module_fqns, split_layout, torchtitan_script

    problem = small_problem(tmp_path)  # 32 layers
    plan = plan_of(problem, tp=2, pp=pp, vp=vp, zero_stage=3, first_stage_layers=first, last_stage_layers=last, layer_split="uneven")
    sizes, _ = stage_sizes(32, pp, vp, first, last, False)
    assert list(split_layout(plan).decoders) == sizes.tolist() and sizes[0] != sizes[1]
    stages = module_fqns(plan)
    assert [sum(n.startswith("layers.") for n in s) for s in stages] == sizes.tolist()
    assert [n for s in stages for n in s if n.startswith("layers.")] == [f"layers.{i}" for i in range(32)]
    args = torchtitan_args(plan)
    assert args[args.index("--module") + 1] == LAYOUT_MODULE
    assert not any("layers-per-stage" in a or "less-layers" in a for a in args)
    script = torchtitan_script(plan)
    assert f"cat > \"$LAYOUT_DIR/{LAYOUT_MODULE}.py\" <<'PY'" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_param_gather_overlap_only_with_the_distributed_optimizer(tmp_path):
    problem = small_problem(tmp_path)
    plan = plan_of(problem, tp=2, pp=2, dp_overlap=True)
    assert "--overlap-grad-reduce" in groups(plan) and "--overlap-param-gather" not in groups(plan)
    assert "ddp.overlap_param_gather=false" in bridge_overrides(plan)


def test_recompute_and_cpu_optimizer_flags(tmp_path):
    problem = small_problem(tmp_path)
    full = plan_of(problem, tp=2, pp=2, recompute="full", zero_stage=1, cpu_optimizer=True)
    flags = groups(full)
    assert {"--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"} <= flags
    assert {"--optimizer-cpu-offload", "--optimizer-offload-fraction 1.0", "--use-precision-aware-optimizer"} <= flags
    assert "optimizer.optimizer_offload_fraction=1.0" in bridge_overrides(full)  # Core's default is 0.0
    selective = plan_of(problem, tp=2, pp=2, recompute="selective", recompute_modules=["core_attn", "mlp"])
    assert "--recompute-granularity selective" in groups(selective) and "--recompute-modules core_attn mlp" in groups(selective)
    assert not any(f.startswith("--recompute-method") for f in groups(selective))
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in megatron_env(plan_of(problem, tp=1, pp=2))
    with pytest.raises(ExportError, match="distributed optimizer"):
        megatron_flags(plan_of(problem, tp=2, cpu_optimizer=True))


def test_moe_mla_dense_first_layers_node_limited_routing_and_mtp():
    problem = load_problem(str(DEEPSEEK))  # 1024 GPUs in nodes of 8
    plan = plan_of(problem, tp=1, pp=16, vp=1, ep=64, mbs=1, layer_split="uneven")
    flags = groups(plan)
    for flag in ("--num-experts 256", "--moe-router-topk 8", "--expert-model-parallel-size 64", "--expert-tensor-parallel-size 1",
                 "--multi-latent-attention", "--kv-lora-rank 512", "--q-lora-rank 1536", "--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep",
                 "--mtp-num-layers 1", "--moe-router-num-groups 8", "--moe-router-group-topk 4"):
        assert flag in flags, flag
    freq = next(f for f in flags if f.startswith("--moe-layer-freq"))
    assert freq == "--moe-layer-freq [" + ",".join(["0"] * 3 + ["1"] * 58) + "]"
    assert "model.moe_router_num_groups=8" in bridge_overrides(plan)
    assert {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=deepep"} <= set(bridge_overrides(plan))
    # an EP group inside 4 nodes: a token can reach every node anyway, no routing groups
    assert not any("router-num-groups" in f for f in groups(plan_of(problem, tp=1, pp=16, ep=32, layer_split="uneven")))
    assert "--mtp-num-layers" in megatron_script(plan)
    with pytest.raises(ExportError, match="mixed_precision_reduce is float32 only"):  # DeepSeek-V3 reduces gradients in bf16
        torchtitan_args(plan_of(problem, pp=16, ep=64, zero_stage=3, layer_split="uneven"))
    fp32_grads = problem.model_copy(update={"training": problem.training.model_copy(update={"dtypes": problem.training.dtypes.model_copy(update={"grads": "fp32"})})})
    with pytest.raises(ExportError, match="multi-token-prediction"):
        torchtitan_args(plan_of(fp32_grads, pp=16, ep=64, zero_stage=3, layer_split="uneven"))


def test_qk_layernorm(tmp_path):
    problem = small_problem(tmp_path, model="qwen3-235b-a22b")
    assert "--qk-layernorm" in groups(plan_of(problem, tp=4, ep=8, pp=2))


def test_refuses_a_configuration_megatron_would_reject(tmp_path):
    problem = small_problem(tmp_path)
    with pytest.raises(ValueError, match="tp=3 does not divide num_heads=32"):
        plan_of(problem, tp=3, pp=2)


def test_layer_offload_needs_one_stage_and_module_offload_exports_its_modules(tmp_path):
    problem = small_problem(tmp_path)
    plan = plan_of(problem, tp=2, pp=2, activation_offload=True)
    for render in (megatron_flags, bridge_overrides):
        with pytest.raises(ExportError, match="pp > 1"):
            render(plan)
    modules = plan_of(problem, tp=2, pp=2, activation_offload=["core_attn", "attn_proj"])
    assert {"--fine-grained-activation-offloading", "--offload-modules core_attn attn_proj"} <= groups(modules)
    # Transformer Engine's activation-only offload path (Megatron-Bridge's validation asks for it from TE 2.10)
    assert megatron_env(modules)["NVTE_CPU_OFFLOAD_V1"] == "1" and "export NVTE_CPU_OFFLOAD_V1=1" in megatron_script(modules)
    assert "NVTE_CPU_OFFLOAD_V1" not in megatron_env(plan_of(problem, tp=8, pp=1, activation_offload=True))
    with pytest.raises(ExportError, match="NVTE_CPU_OFFLOAD_V1=1 in the launch environment"):  # an override file cannot set it
        bridge_overrides(modules)
    from costmodel.frameworks import refusals

    # a framework rule, so `--framework megatron-bridge` never picks what its exporter refuses
    assert [key for key, _ in refusals("megatron-bridge", modules.facts(), modules.batch())] == ["megatron-bridge:fine_grained_offload_env"]
    assert "model.cpu_offloading_num_layers=31" in bridge_overrides(plan_of(problem, tp=8, pp=1, activation_offload=True))


def test_refuses_alibi_and_a_run_without_a_length(tmp_path):
    problem = small_problem(tmp_path, model="bloom-176b", global_batch_size=64, seq_len=2048)
    with pytest.raises(ExportError, match="ALiBi"):
        megatron_flags(plan_of(problem, tp=8, pp=2))
    doc = yaml.safe_load((tmp_path / "p.yaml").read_text())
    del doc["training"]["steps"]
    (tmp_path / "q.yaml").write_text(yaml.safe_dump({**doc, "model": "llama3.1-8b"}))
    endless = plan_of(load_problem(str(tmp_path / "q.yaml")), tp=2, zero_stage=3)
    for fmt in ("megatron", "megatron-bridge", "torchtitan"):
        with pytest.raises(ExportError, match="neither training.steps nor training.tokens"):
            export(endless, fmt)
    single = plan_of(load_problem(str(tmp_path / "q.yaml")), zero_stage=3)
    assert json.loads(export(single, "deepspeed"))["mofa"]["train_iters"] is None  # DeepSpeed's loop sets the length


def test_exports_zero_stages_cp_variants_schedules_and_recompute(tmp_path):
    problem = small_problem(tmp_path, global_batch_size=64, seq_len=8192)
    flags = groups(plan_of(problem, tp=2, cp=2, zero_stage=3, cp_comm="all_gather", recompute="selective", recompute_modules=["core_attn", "mlp"]))
    assert {"--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params", "--use-distributed-optimizer",
            "--cp-comm-type allgather", "--recompute-granularity selective", "--recompute-modules core_attn mlp"} <= flags
    flags = groups(plan_of(problem, tp=2, cp=4, cp_comm="a2a+p2p", cp_a2a=2, pp=2, vp=2, pp_schedule="flexible", pp_group=4,
                           recompute="full", recompute_method="block", recompute_num_layers=3))
    assert {"--cp-comm-type a2a+p2p", "--hierarchical-context-parallel-sizes 2 2", "--microbatch-group-size-per-virtual-pipeline-stage 4",
            "--recompute-method block", "--recompute-num-layers 3"} <= flags
    bridge = bridge_overrides(plan_of(problem, tp=2, zero_stage=2))
    assert "ddp.use_megatron_fsdp=true" in bridge and "ddp.data_parallel_sharding_strategy=optim_grads" in bridge


@pytest.mark.parametrize("fields,reason", [
    (dict(tp=2, pp=2, pp_schedule="afab"), "all-forward-all-backward"),
    (dict(tp=2, pp=2, vp=2, pp_schedule="dualpipev", pp_overlap=True), "DualPipeV"),
    (dict(tp=2, pp=2, zero_stage=3), "pipeline parallelism"),
    (dict(tp=2, zero_stage=3, reshard_after_forward=False), "frees gathered parameters"),
])
def test_refuses_what_megatron_cannot_run(tmp_path, fields, reason):
    plan = plan_of(small_problem(tmp_path, global_batch_size=64), **fields)
    for fmt in ("megatron", "megatron-bridge"):
        with pytest.raises(ExportError, match=reason):
            export(plan, fmt)


def test_torchtitan_fsdp_hsdp_tp_pp_cp_and_checkpointing(tmp_path):
    problem = small_problem(tmp_path, global_batch_size=64, seq_len=8192)  # llama3.1-8b -> llama3_8b
    plan = plan_of(problem, 100, tp=2, cp=2, pp=2, vp=2, zero_stage=3, dp_shard=4, cp_comm="all_gather", tp_overlap=True,
                   pp_overlap=True, recompute="full")
    args = torchtitan_args(plan)
    assert args[:4] == ["--module", "llama3", "--config", "llama3_8b"] and args[-1] == "activation-checkpoint:full"
    # dp 8 x cp 2 = 16 ranks in HSDP groups of 4: 4 replicas, each sharding over dp_shard 2 x cp 2
    expect = {"--parallelism.data-parallel-replicate-degree": "4", "--parallelism.data-parallel-shard-degree": "2",
              "--parallelism.tensor-parallel-degree": "2", "--parallelism.context-parallel-degree": "2",
              "--parallelism.pipeline-parallel-degree": "2", "--parallelism.pipeline-parallel-schedule": "Interleaved1F1B",
              "--parallelism.pipeline-parallel-layers-per-stage": "8", "--parallelism.fsdp-reshard-after-forward": "always",
              "--training.local-batch-size": "8", "--parallelism.pipeline-parallel-microbatch-size": "1",
              "--training.global-batch-size": "64", "--training.seq-len": "8192", "--training.steps": "1000", "--checkpoint.interval": "100"}
    for flag, value in expect.items():
        assert flag_value(args, flag) == value, flag
    assert "--compile.enable-async-tensor-parallel" in args and "--checkpoint.enable" in args
    afab = torchtitan_args(plan_of(problem, tp=2, pp=2, vp=2, pp_schedule="afab", zero_stage=3, reshard_after_forward=False))
    assert flag_value(afab, "--parallelism.pipeline-parallel-schedule") == "LoopedBFS"
    assert flag_value(afab, "--parallelism.fsdp-reshard-after-forward") == "never"
    assert flag_value(torchtitan_args(plan_of(problem, tp=2, pp=2, pp_schedule="afab", zero_stage=3)), "--parallelism.pipeline-parallel-schedule") == "GPipe"
    ddp = torchtitan_args(plan_of(problem, tp=2))
    assert flag_value(ddp, "--parallelism.data-parallel-replicate-degree") == "32" and flag_value(ddp, "--parallelism.data-parallel-shard-degree") == "1"
    # compiled as the model prices it (fused norms, rotary, SwiGLU), async TP or not; eager where the problem says
    assert "--compile.enable" in ddp and "--compile.no-enable-async-tensor-parallel" in ddp
    eager = small_problem(tmp_path, global_batch_size=64, seq_len=8192, elementwise="eager")
    assert "--compile.enable" not in torchtitan_args(plan_of(eager, tp=2))


@pytest.mark.parametrize("fields,reason", [
    (dict(tp=2, zero_stage=1), "ZeRO-1 keeps whole parameters"),
    (dict(tp=2, cp=2, zero_stage=3), "CP variant p2p"),
    (dict(tp=2, cp=2), "ZeRO-0 with cp > 1"),
    (dict(tp=2, zero_stage=3, recompute="selective"), "per op"),
    (dict(tp=2, zero_stage=3, recompute="full", recompute_num_layers=2), "every block"),
    (dict(tp=2, zero_stage=3, activation_offload=True), "activation offload"),
    (dict(tp=2, zero_stage=3, cpu_optimizer=True), "CPU optimizer"),
    (dict(tp=2, pp=2, vp=2, pp_schedule="flexible", pp_group=4, zero_stage=3), "round size"),
])
def test_refuses_what_torchtitan_cannot_run(tmp_path, fields, reason):
    plan = plan_of(small_problem(tmp_path, seq_len=8192), **fields)
    with pytest.raises(ExportError, match=reason):
        torchtitan_args(plan)


def test_torchtitan_needs_its_config_function_and_dtype(tmp_path):
    with pytest.raises(ExportError, match="no config function builds llama2-70b"):
        torchtitan_args(plan_of(small_problem(tmp_path, model="llama2-70b"), tp=8, zero_stage=3))
    problem = load_problem(str(LLAMA405))  # torchtitan's llama3_405b trains in float8
    with pytest.raises(ExportError, match=r"llama3_405b \(fp8\), the plan in bf16"):
        torchtitan_args(plan_of(problem, tp=8, pp=16, zero_stage=3, layer_split="embedding_loss"))
    fp8 = problem.model_copy(update={"training": problem.training.model_copy(update={"dtypes": problem.training.dtypes.model_copy(update={"compute": "fp8"})})})
    args = torchtitan_args(plan_of(fp8, tp=8, pp=16, zero_stage=3, layer_split="embedding_loss"))
    assert args[3] == "llama3_405b" and flag_value(args, "--parallelism.pipeline-parallel-first-stage-less-layers") == "1"


def test_deepspeed_json(tmp_path):
    problem = small_problem(tmp_path)
    config = deepspeed_config(plan_of(problem, 50, zero_stage=3, dp_overlap=True, cpu_optimizer=True, recompute="full"))
    assert config["train_batch_size"] == 64 == config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * 64
    assert config["zero_optimization"] == {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                                           "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    assert config["bf16"] == {"enabled": True} and config["data_types"] == {"grad_accum_dtype": "fp32"}
    assert config["activation_checkpointing"]["number_checkpoints"] == 32 and config["mofa"]["checkpoint_interval"] == 50
    piped = deepspeed_config(plan_of(problem, pp=2, zero_stage=1))
    assert piped["pipeline"]["stages"] == 2 and piped["gradient_accumulation_steps"] == 2


@pytest.mark.parametrize("fields,reason", [
    (dict(tp=2), "tensor parallelism"),
    (dict(cp=2), "context parallelism"),
    (dict(pp=2, zero_stage=2), "ZeRO-0 or ZeRO-1 only"),
    (dict(pp=4, vp=2, zero_stage=1), "schedule"),
    (dict(cpu_optimizer=True), "ZeRO >= 1"),
    (dict(zero_stage=1, dp_shard=8), "MiCS"),
    (dict(zero_stage=1, recompute="selective"), "by module"),
])
def test_refuses_what_deepspeed_cannot_run(tmp_path, fields, reason):
    with pytest.raises(ExportError, match=reason):
        deepspeed_config(plan_of(small_problem(tmp_path), **fields))


def test_launch_scripts_quote_and_run_torchrun(tmp_path):
    """The scripts are valid bash that call torchrun with every argument as one word; a fake
    torchrun on PATH records what it receives."""
    problem = small_problem(tmp_path, global_batch_size=64, seq_len=8192)
    plan = plan_of(problem, 10, tp=2, pp=2, zero_stage=1, recompute="selective", recompute_modules=["core_attn", "mlp"])
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "torchrun").write_text('#!/usr/bin/env bash\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (fake / "torchrun").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "NODE_RANK": "0", "MASTER_ADDR": "host 0"}
    for script, words in ((megatron_script(plan), megatron_flags(plan)), (torchtitan_script(plan_of(problem, 10, tp=2, pp=2, zero_stage=3)), None)):
        path = tmp_path / "launch.sh"
        path.write_text(script)
        out = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        argv = out.stdout.splitlines()
        assert argv[:8] == ["--nnodes", "8", "--nproc-per-node", "8", "--node-rank", "0", "--master-addr", "host 0"]
        if words:
            start = argv.index("--tensor-model-parallel-size")
            assert argv[start:start + len(words)] == words  # every flag and value one word, in order
            assert argv[start + len(words):start + len(words) + 4] == ["--save", "checkpoints", "--load", "checkpoints"]
        else:
            assert argv[argv.index("-m") + 1] == "torchtitan.train" and argv[-1] == "activation-checkpoint:none"
    missing = subprocess.run(["bash", str(path)], env={**env, "NODE_RANK": ""}, capture_output=True, text=True, timeout=30)
    assert missing.returncode != 0 and "NODE_RANK" in missing.stderr
    assert "--moe-layer-freq '[0,0,0,1,1," in megatron_script(plan_of(load_problem(str(DEEPSEEK)), pp=16, ep=64, layer_split="uneven"))


def _mofa(*args):
    return subprocess.run([sys.executable, "-m", "mofa", *args], capture_output=True, text=True, timeout=120)


def test_export_command(tmp_path):
    """`mofa export` reads the plan a result stores: each format, --rank, --out (atomic,
    executable scripts), refusal with exit 1, one-line errors with exit 2."""
    problem = PROBLEMS / "tuning" / "llama2_70b_128gpu.yaml"
    solved = _mofa("solve", str(problem), "--top", "2", "--json")
    assert solved.returncode == 0, solved.stderr
    result = tmp_path / "result.json"
    result.write_text(solved.stdout)
    best = LaunchPlan.model_validate(json.loads(solved.stdout)["best"]["plan"])
    out = _mofa("export", str(result), "--format", "megatron-bridge")
    assert out.returncode == 0 and out.stdout == export(best, "megatron-bridge")
    script = tmp_path / "launch.sh"
    assert _mofa("export", str(result), "--format", "megatron", "--rank", "2", "--out", str(script)).returncode == 0
    assert script.stat().st_mode & stat.S_IXUSR and "--context-parallel-size 2" in script.read_text()
    refused = _mofa("export", str(result), "--format", "deepspeed")
    assert refused.returncode == 1 and refused.stderr.startswith("mofa export: refused: DeepSpeed cannot run this plan: activation offload")
    for args, message in ((["--rank", "3"], "--rank 3: the result holds 2 configuration(s)"),
                          (["--rank", "0"], "--rank must be at least 1")):
        bad = _mofa("export", str(result), "--format", "megatron", *args)
        assert bad.returncode == 2 and bad.stderr == f"mofa export: {message}\n"
    (tmp_path / "junk.json").write_text("{nope")
    (tmp_path / "old.json").write_text(json.dumps({"top": [{"config": {}}]}))
    (tmp_path / "bad.json").write_text(json.dumps({"plan": {**json.loads(solved.stdout)["best"]["plan"], "tp": "eight"}}))
    for name, message in (("junk.json", "not JSON"), ("old.json", "has no launch plan"), ("bad.json", "plan.tp"), ("missing.json", "cannot read")):
        bad = _mofa("export", str(tmp_path / name), "--format", "torchtitan")
        assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and message in bad.stderr, bad.stderr
    evaluated = _mofa("evaluate", str(PROBLEMS / "mofa" / "table5_llama2_70b_128gpu.yaml"), "--json")
    (tmp_path / "eval.json").write_text(evaluated.stdout)
    assert _mofa("export", str(tmp_path / "eval.json"), "--format", "megatron").returncode in (0, 1)


def test_every_format_is_listed_once():
    assert set(FORMATS) == {"megatron", "megatron-bridge", "torchtitan", "deepspeed"}
    assert len({name for name, _ in FORMATS.values()}) == 4


def test_moe_dispatcher_capacity_factor_and_chunks():
    """training.moe's dispatcher and capacity factor become Megatron's flags; MemFine's chunked
    dispatch has no Megatron flag, so a plan with moe_chunks > 1 is refused with the reason."""
    problem = load_problem(str(DEEPSEEK))
    moe = problem.training.moe.model_copy(update={"dispatcher": "alltoall", "capacity_factor": 1.25})
    dropping = problem.model_copy(update={"training": problem.training.model_copy(update={"moe": moe})})
    flags = groups(plan_of(dropping, tp=1, pp=16, ep=64, layer_split="uneven"))
    assert {"--moe-token-dispatcher-type alltoall", "--moe-expert-capacity-factor 1.25"} <= flags
    assert "--moe-flex-dispatcher-backend deepep" not in flags
    with pytest.raises(ExportError, match="chunked MoE dispatch"):
        megatron_flags(plan_of(problem, tp=1, pp=16, ep=64, layer_split="uneven", moe_chunks=4))


def test_torchtitan_per_op_checkpointing_and_megatron_refusing_it(tmp_path):
    """recompute_modules [ops] is torchtitan's SelectiveAC (the activation-checkpoint:selective
    sub-command); Megatron's --recompute-modules name modules and have no such policy."""
    plan = plan_of(small_problem(tmp_path), zero_stage=3, recompute="selective", recompute_modules=["ops"])
    assert torchtitan_args(plan)[-1] == "activation-checkpoint:selective"
    for fmt in ("megatron", "megatron-bridge"):
        with pytest.raises(ExportError, match="torchtitan's per-op policy"):
            export(plan, fmt)
    modules = plan_of(small_problem(tmp_path), zero_stage=3, recompute="selective", recompute_modules=["core_attn"])
    with pytest.raises(ExportError, match="selective AC is per op"):
        export(modules, "torchtitan")
