"""Launch-config export: the Megatron-LM flags and Megatron-Bridge overrides a chosen
configuration turns into, and the configurations the exporter refuses. Flag names and the
rules they carry are those of ../shared/reference/frameworks.md."""

import pytest
import yaml

from conftest import PROBLEMS
from costmodel.configs import ConfigBatch
from costmodel.loader import load_problem
from costmodel.specs import ConfigSpec
from mofa.export import ExportError, bridge_overrides, megatron_args


def config_of(problem, interval=None, **fields):
    """The config dict `mofa solve` hands the exporter (ConfigBatch.row of the evaluation)."""
    row = ConfigBatch.from_specs(problem, [ConfigSpec(**fields)]).row(0)
    if interval is not None:
        row["checkpoint_interval"] = interval
    return row


def small_problem(tmp_path, model="llama3.1-8b", **training):
    doc = {
        "model": model,
        "hardware": "h100-sxm",
        "cluster": {"num_gpus": 64, "gpus_per_node": 8},
        "training": {"global_batch_size": 64, "seq_len": 4096, **training},
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_problem(str(path))


def test_llama3_405b_layout_with_embedding_and_loss_accounting():
    """126 layers on pp=16 x vp=8: Meta's layout, the embedding and the loss each counted as a
    layer (7 transformer layers on the first and last rank)."""
    problem = load_problem(str(PROBLEMS / "tuning" / "llama3_405b_16384xh100_seq8k.yaml"))
    cfg = config_of(problem, interval=45, tp=8, cp=4, pp=16, vp=8, mbs=1, layer_split="embedding_loss", tp_overlap=True, cp_overlap=True,
                    pp_overlap=True, dp_overlap=True, zero_stage=1)
    assert (cfg["first_stage_layers"], cfg["last_stage_layers"]) == (7, 7)
    env, flags = megatron_args(problem, cfg)
    assert env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    for flag in ("--tensor-model-parallel-size 8", "--context-parallel-size 4", "--pipeline-model-parallel-size 16",
                 "--num-virtual-stages-per-pipeline-rank 8", "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                 "--sequence-parallel", "--tp-comm-overlap", "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                 "--group-query-attention", "--num-query-groups 8", "--swiglu", "--cp-comm-type p2p", "--save-interval 45",
                 "--global-batch-size 2048", "--seq-length 8192", "--num-layers 126"):
        assert flag in flags, flag
    assert "--no-overlap-p2p-communication" not in flags
    assert not any(f.startswith("--decoder-first-pipeline-num-layers") for f in flags)
    overrides = bridge_overrides(problem, cfg)
    for item in ("model.virtual_pipeline_model_parallel_size=8", "model.account_for_embedding_in_pipeline_split=true",
                 "ddp.overlap_param_gather=true", "comm_overlap.overlap_p2p_comm=true", "checkpoint.save_interval=45"):
        assert item in overrides, item


def test_uneven_first_and_last_stages(tmp_path):
    problem = small_problem(tmp_path)  # 32 layers
    cfg = config_of(problem, tp=2, pp=4, first_stage_layers=6, last_stage_layers=10)
    _, flags = megatron_args(problem, cfg)
    assert "--decoder-first-pipeline-num-layers 6" in flags and "--decoder-last-pipeline-num-layers 10" in flags
    assert "--num-virtual-stages-per-pipeline-rank" not in " ".join(flags)
    overrides = bridge_overrides(problem, cfg)
    assert "model.num_layers_in_first_pipeline_stage=6" in overrides and "model.num_layers_in_last_pipeline_stage=10" in overrides
    assert "model.virtual_pipeline_model_parallel_size=null" in overrides


def test_param_gather_overlap_only_with_the_distributed_optimizer(tmp_path):
    """frameworks.md: param-gather overlap needs the distributed optimizer."""
    problem = small_problem(tmp_path)
    cfg = config_of(problem, tp=2, pp=2, dp_overlap=True)
    _, flags = megatron_args(problem, cfg)
    assert "--overlap-grad-reduce" in flags and "--overlap-param-gather" not in flags
    assert "ddp.overlap_param_gather=false" in bridge_overrides(problem, cfg)


def test_recompute_and_cpu_optimizer_flags(tmp_path):
    problem = small_problem(tmp_path)
    full = config_of(problem, tp=2, pp=2, recompute="full", zero_stage=1, cpu_optimizer=True)
    _, flags = megatron_args(problem, full)
    # full recompute: a method is required and 1 <= num_layers <= L/PP
    assert {"--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"} <= set(flags)
    # CPU offload needs the precision-aware optimizer; the CLI's offload fraction is given explicitly
    assert {"--optimizer-cpu-offload", "--optimizer-offload-fraction 1.0", "--use-precision-aware-optimizer"} <= set(flags)
    overrides = bridge_overrides(problem, full)
    assert "optimizer.optimizer_offload_fraction=1.0" in overrides  # Core's default is 0.0
    selective = config_of(problem, tp=2, pp=2, recompute="selective")
    _, flags = megatron_args(problem, selective)
    assert "--recompute-granularity selective" in flags
    assert not any(f.startswith("--recompute-method") for f in flags)  # selective takes no method
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in megatron_args(problem, config_of(problem, tp=1, pp=2))[0]


def test_moe_with_mla_and_dense_first_layers():
    problem = load_problem(str(PROBLEMS / "tuning" / "deepseek_v3_1024gpu_sn8.yaml"))
    cfg = config_of(problem, tp=1, pp=16, vp=1, ep=64, mbs=1, layer_split="uneven", ep_overlap=False)
    _, flags = megatron_args(problem, cfg)
    for flag in ("--num-experts 256", "--moe-router-topk 8", "--expert-model-parallel-size 64", "--expert-tensor-parallel-size 1",
                 "--multi-latent-attention", "--kv-lora-rank 512", "--q-lora-rank 1536", "--moe-token-dispatcher-type alltoall"):
        assert flag in flags, flag
    freq = next(f for f in flags if f.startswith("--moe-layer-freq"))
    assert freq == "--moe-layer-freq [" + ",".join(["0"] * 3 + ["1"] * 58) + "]"


def test_refuses_a_configuration_megatron_would_reject(tmp_path):
    problem = small_problem(tmp_path)
    cfg = config_of(problem, tp=2, pp=2)
    cfg["tp"] = 3  # 32 heads are not divisible by 3
    with pytest.raises(ExportError, match="tp=3 does not divide num_heads=32"):
        megatron_args(problem, cfg)
    with pytest.raises(ExportError, match="tp=3"):
        bridge_overrides(problem, cfg)


def test_layer_offload_needs_one_stage_and_module_offload_exports_its_modules(tmp_path):
    """frameworks.md: layer activation offload (--cpu-offloading, Bridge cpu_offloading) does not
    run with PP>1: refused by both, with the reason; Megatron's fine-grained offload of chosen
    modules (--offload-modules) does, and exports exactly the modules chosen."""
    problem = small_problem(tmp_path)
    cfg = config_of(problem, tp=2, pp=2, activation_offload=True)
    for export in (megatron_args, bridge_overrides):
        with pytest.raises(ExportError, match="pp > 1"):
            export(problem, cfg)
    modules = config_of(problem, tp=2, pp=2, activation_offload=["core_attn", "attn_proj"])
    _, flags = megatron_args(problem, modules)
    assert "--fine-grained-activation-offloading" in flags and "--offload-modules core_attn attn_proj" in flags
    single_stage = config_of(problem, tp=8, pp=1, activation_offload=True)
    assert "model.cpu_offloading_num_layers=31" in bridge_overrides(problem, single_stage)  # < L


def test_refuses_alibi(tmp_path):
    problem = small_problem(tmp_path, model="bloom-176b", global_batch_size=64, seq_len=2048)
    cfg = config_of(problem, tp=8, pp=2)
    with pytest.raises(ExportError, match="ALiBi"):
        megatron_args(problem, cfg)


def test_exports_the_plans_issue7_added(tmp_path):
    """ZeRO stages, CP variants, the flexible schedule's round size, recompute granularity: each
    maps to the Megatron flag (frameworks.md) and Bridge field that says it."""
    problem = small_problem(tmp_path, global_batch_size=64, seq_len=8192)
    _, flags = megatron_args(problem, config_of(problem, tp=2, cp=2, zero_stage=3, cp_comm="all_gather", recompute="selective",
                                                recompute_modules=["core_attn", "mlp"]))
    assert {"--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params", "--cp-comm-type allgather",
            "--recompute-granularity selective", "--recompute-modules core_attn mlp"} <= set(flags)
    assert "--use-distributed-optimizer" not in flags
    _, flags = megatron_args(problem, config_of(problem, tp=2, cp=4, cp_comm="a2a+p2p", cp_a2a=2, pp=2, vp=2, pp_schedule="flexible", pp_group=4,
                                                recompute="full", recompute_method="block", recompute_num_layers=3))
    assert {"--cp-comm-type a2a+p2p", "--hierarchical-context-parallel-sizes 2 2", "--microbatch-group-size-per-virtual-pipeline-stage 4",
            "--recompute-method block", "--recompute-num-layers 3"} <= set(flags)
    bridge = bridge_overrides(problem, config_of(problem, tp=2, zero_stage=2))
    assert "ddp.use_megatron_fsdp=true" in bridge and "ddp.data_parallel_sharding_strategy=optim_grads" in bridge


@pytest.mark.parametrize("fields,reason", [
    (dict(tp=2, pp=2, pp_schedule="afab"), "all-forward-all-backward"),
    (dict(tp=2, pp=2, vp=2, pp_schedule="dualpipev", pp_overlap=True), "DualPipeV"),
    (dict(tp=2, pp=2, zero_stage=3), "pipeline parallelism"),
    (dict(tp=2, zero_stage=3, reshard_after_forward=False), "frees gathered parameters"),
])
def test_refuses_what_megatron_cannot_run(tmp_path, fields, reason):
    problem = small_problem(tmp_path, global_batch_size=64)
    cfg = config_of(problem, **fields)
    for export in (megatron_args, bridge_overrides):
        with pytest.raises(ExportError, match=reason):
            export(problem, cfg)
