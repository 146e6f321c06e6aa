"""torchtitan 0.3.0's own configuration code reads every torchtitan launch script exported
from the shipped results: ConfigManager.parse_args (tyro: flag names, choices, the config
function, schedule names, its _validate_config) and ParallelDims.from_config against the
script's world (dp_replicate x dp_shard x cp x tp x pp == world). Deliberately broken files
are rejected by the same code."""

import contextlib
import io

import pytest

from launch_scripts import script_args, script_modules, script_world, with_flag
from shipped_exports import accepted, exports, infeasible, need

need("torchtitan")
from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.distributed.parallel_dims import ParallelDims  # noqa: E402


@pytest.fixture(autouse=True)
def sm90(monkeypatch):
    """The fp8 config functions (llama3_405b) build their Float8 converter while loading and ask
    the GPU for SM89+; this CPU machine stands in for the H100 the plan was sized for."""
    import torchtitan.components.quantization.float8 as float8
    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: (9, 0) >= (major, minor))


def parse(args):
    """The parsed config; a rejection (tyro's SystemExit, a ValueError or an assertion) raises."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return ConfigManager().parse_args(list(args))
        except SystemExit as exc:
            raise ValueError(f"torchtitan exited {exc.code}: {err.getvalue()[-400:]}") from None


@contextlib.contextmanager
def written_modules(text):
    """The config modules the script writes, on sys.path as the script's PYTHONPATH puts them
    (fresh for every script: they share a name)."""
    import sys
    import tempfile
    from pathlib import Path

    modules = script_modules(text)
    with tempfile.TemporaryDirectory() as folder:
        for name, source in modules.items():
            (Path(folder) / f"{name}.py").write_text(source)
            sys.modules.pop(name, None)
        sys.path.insert(0, folder)
        try:
            yield
        finally:
            sys.path.remove(folder)
            for name in modules:
                sys.modules.pop(name, None)


def check(text):
    with written_modules(text):
        cfg = parse(script_args(text))
    dims = ParallelDims.from_config(cfg.parallelism, world_size=script_world(text))
    return cfg, dims


def test_torchtitan_accepts_every_exported_script():
    files = accepted("torchtitan")
    assert files, f"no shipped result exported to torchtitan; refused: {[(e.name, e.refused) for e in exports('torchtitan')][:5]}"
    models = set()
    for e in files:
        cfg, dims = check(e.text)
        p = e.plan
        assert (dims.tp, dims.pp, dims.cp, dims.ep) == (p.tp, p.pp, p.cp, p.ep), e.name
        assert dims.dp_replicate * dims.dp_shard * dims.cp == p.dp * p.cp, e.name
        assert (cfg.training.global_batch_size, cfg.training.seq_len, cfg.training.steps) == (p.global_batch_size, p.seq_len, p.train_iters), e.name
        assert cfg.checkpoint.interval == p.checkpoint_interval, e.name
        # what torchtitan checks only inside the Trainer (after distributed init): the batch arithmetic
        local = cfg.training.local_batch_size
        assert cfg.training.global_batch_size % (local * dims.dp_replicate * dims.dp_shard) == 0, e.name
        if p.pp > 1:
            assert local % cfg.parallelism.pipeline_parallel_microbatch_size == 0, e.name
            assert local // cfg.parallelism.pipeline_parallel_microbatch_size == p.microbatches, e.name
        models.add(p.model.name)
    print(f"torchtitan accepted {len(files)} scripts of {sorted({e.problem for e in files})}; infeasible: {infeasible()}")
    assert "llama3-405b" in models


def test_torchtitan_splits_layers_as_the_plan():
    """torchtitan's own stage split (pipeline_parallel._get_pipeline_metadata, the per-stage module
    lists and the rank -> stage map: "v" style under DualPipeV, rank 0 holding the first and the
    last stage) puts on every stage the layers the exact model priced (costmodel.pipeline.stage_sizes),
    DualPipeV's uneven split among them (costmodel.layout.vee_split)."""
    from types import SimpleNamespace

    import numpy as np
    from torchtitan.distributed import pipeline_parallel as tt

    from costmodel.pipeline import stage_sizes

    piped = [e for e in accepted("torchtitan") if e.plan.pp > 1]
    assert piped, "no accepted torchtitan export runs a pipeline"
    schedules = set()
    for e in piped:
        cfg, dims = check(e.text)
        p = e.plan
        L = p.model.num_layers
        parts = cfg.parallelism.module_fqns_per_model_part  # a split its flags cannot give: the script's module lists
        if not parts:
            stages, layers, first_weight, last_weight = tt._get_pipeline_metadata(dims, cfg.parallelism, SimpleNamespace(layers=[None] * L))
            parts = tt._generate_llm_fqn_per_model_part(stages, layers, first_weight, last_weight)
        stages = len(parts)
        per_stage = [sum(name.startswith("layers.") for name in part) for part in parts]
        vee = p.pp_schedule == "dualpipev"
        sizes, rank = stage_sizes(L, p.pp, p.vp, p.first_stage_layers, p.last_stage_layers, vee)
        assert per_stage == sizes.tolist(), e.name
        for r in range(p.pp):
            mine = tt._get_pp_rank_to_stage_indices_mapping(r, p.pp, cfg.parallelism.pipeline_parallel_schedule, stages)
            assert sorted(mine) == np.flatnonzero(rank == r).tolist(), (e.name, r)
        schedules.add((p.pp_schedule, p.layer_split))
    print(f"torchtitan stage splits agree on {len(piped)} exports: {sorted(schedules)}")
    assert ("dualpipev", "uneven") in schedules  # DualPipeV's uneven V split (QUICK's torchtitan-dualpipev)


def test_torchtitan_rejects_broken_scripts():
    text = accepted("torchtitan")[0].text
    args, world = script_args(text), script_world(text)
    with pytest.raises(AssertionError, match="Invalid parallel dims"):  # a world the degrees do not fill
        ParallelDims.from_config(parse(args).parallelism, world_size=world * 2)
    with pytest.raises(ValueError, match="exited"):  # an unknown schedule name
        parse(with_flag(args, "--parallelism.tensor-parallel-degree", "eight"))
    with pytest.raises(ValueError, match="exited"):  # a flag that does not exist (misspelt)
        parse([*args[:-1], "--parallelism.tensor-paralel-degree", "8", args[-1]])
    with pytest.raises(Exception):  # no such config function
        parse(with_flag(args, "--config", "llama3_404b"))


def test_torchtitan_refusals_say_why():
    """What torchtitan cannot express is refused by the exporter, with the reason."""
    reasons = {e.refused for e in exports("torchtitan") if e.refused}
    assert reasons and all(r.startswith("torchtitan cannot run this plan: ") for r in reasons)
    deepseek = [e for e in exports("torchtitan") if e.plan.model.name == "deepseek-v3"]
    assert deepseek and all(e.refused for e in deepseek)  # its MTP module (and more): see the exporter's check()


def test_dualpipev_order_is_pytorchs():
    """The DualPipeV order the simulator's oracle is checked against (tests/data/
    dualpipev_order.json, tests/unit/test_schedule_sim.py) is what the installed torch builds:
    ScheduleDualPipeV._calculate_single_rank_operations on a stub carrying only the group size and
    the micro-batch count, every rank of every recorded (pp, m)."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from torch.distributed.pipelining.schedules import ScheduleDualPipeV

    data = json.loads((Path(__file__).parents[1] / "data" / "dualpipev_order.json").read_text())
    assert data["orders"]
    for case, ranks in data["orders"].items():
        pp, m = (int(x) for x in case[2:].split("_m"))
        stub = SimpleNamespace(pp_group_size=pp, _n_microbatches=m)
        built = [[str(a) for a in ScheduleDualPipeV._calculate_single_rank_operations(stub, r)] for r in range(pp)]
        assert built == ranks, case


def test_torchtitan_reads_an_exported_layout():
    """A heterogeneous layout (Llama 3 405B on pp 16 x vp 8: the second stage empty, its layer on
    the third; the same at the other end) exported as the script's config module: torchtitan's
    ConfigManager loads the module by `--module`, its config carries one module list per stage
    (no layers-per-stage split), every name is a module of the model torchtitan builds (on the meta
    device), its own _split_module builds the first, an empty, a two-layer and the last stage, and
    Interleaved1F1B places stage s on rank s % pp, as the layout model does."""
    import torch
    from torchtitan.distributed import pipeline_parallel as tt

    from costmodel.loader import load_problem
    from costmodel.specs import ConfigSpec
    from costmodel.stage_layout import StageLayout
    from mofa.launch import export
    from mofa.launch.plan import build_plan

    problem = load_problem("problems/tuning/llama3_405b_16384xh100_seq8k.yaml", ["training.dtypes.compute=fp8", "training.dtypes.grads=fp32"])
    sizes = [0] + [1] * 126 + [0]
    sizes[1], sizes[2], sizes[-2], sizes[-3] = 0, 2, 0, 2
    layout = StageLayout.from_stage_sizes(16, 8, sizes, 0)
    plan = build_plan(problem, ConfigSpec(tp=8, pp=16, vp=8, layer_split="embedding_loss", zero_stage=3), 45)
    text = export(plan.model_copy(update={"pipeline_layout": layout.to_megatron()}), "torchtitan")
    assert list(script_modules(text)) == ["mofa_torchtitan_layout"]
    cfg, dims = check(text)
    stages = cfg.parallelism.module_fqns_per_model_part
    assert cfg.parallelism.pipeline_parallel_layers_per_stage is None
    assert [sum(n.startswith("layers.") for n in s) for s in stages] == sizes
    with torch.device("meta"):
        model = cfg.model_spec.model.build()
    names = {n for n, _ in model.named_modules()}
    assert all(n in names for s in stages for n in s)
    for s in (0, 1, 2, len(stages) - 1):
        part = tt._split_module(model, stages[s])
        assert len(part.layers) == sizes[s]
        assert (part.tok_embeddings is not None) == (s == 0) and (part.lm_head is not None) == (s == len(stages) - 1)
    for r in range(dims.pp):
        assert list(tt._get_pp_rank_to_stage_indices_mapping(r, dims.pp, cfg.parallelism.pipeline_parallel_schedule, len(stages))) == list(range(r, 128, 16))


def test_torchtitan_splits_uneven_interleaved_ranks_as_the_plan():
    """An interleaved split with uneven first / last ranks (Llama 3 405B on pp 8 x vp 2, 8 layers
    on rank 0, 10 on rank 7, 18 on the others: each of the end ranks' two stages shorter), which
    torchtitan's split flags cannot give (they shorten one stage at each end): the exported
    config module's lists are read by ConfigManager, hold the stages the model priced
    (costmodel.pipeline.stage_sizes) and build on the meta-device model, and Interleaved1F1B
    places stage s on rank s % pp."""
    import torch
    from torchtitan.distributed import pipeline_parallel as tt

    from costmodel.loader import load_problem
    from costmodel.pipeline import stage_sizes
    from costmodel.specs import ConfigSpec
    from mofa.launch import export
    from mofa.launch.plan import build_plan

    problem = load_problem("problems/tuning/llama3_405b_16384xh100_seq8k.yaml", ["training.dtypes.compute=fp8", "training.dtypes.grads=fp32"])
    plan = build_plan(problem, ConfigSpec(tp=8, pp=8, vp=2, first_stage_layers=8, last_stage_layers=10, layer_split="uneven", zero_stage=3), 45)
    assert (plan.layer_split, plan.pipeline_layout) == ("uneven", None)
    text = export(plan, "torchtitan")
    assert list(script_modules(text)) == ["mofa_torchtitan_layout"]
    cfg, dims = check(text)
    sizes, rank = stage_sizes(126, 8, 2, 8, 10, False)
    assert sizes.tolist() == [4, 9, 9, 9, 9, 9, 9, 5, 4, 9, 9, 9, 9, 9, 9, 5]
    stages = cfg.parallelism.module_fqns_per_model_part
    assert [sum(n.startswith("layers.") for n in s) for s in stages] == sizes.tolist()
    with torch.device("meta"):
        model = cfg.model_spec.model.build()
    for s in (0, 7, 8, len(stages) - 1):
        assert len(tt._split_module(model, stages[s]).layers) == sizes[s]
    for r in range(dims.pp):
        mine = tt._get_pp_rank_to_stage_indices_mapping(r, dims.pp, cfg.parallelism.pipeline_parallel_schedule, len(stages))
        assert list(mine) == [s for s in range(16) if rank[s] == r]


def test_torchtitan_runs_a_layout_in_dualpipevs_v():
    """A heterogeneous layout under DualPipeV (Llama 3 405B on pp 16, its V split with a layer
    moved from stage 0 to stage 1): the script's module lists are the stages in model order,
    ConfigManager reads them with the DualPipeV schedule, and torchtitan's own stage map puts
    stages r and 2pp - 1 - r on rank r, the V the layout model scored (StageLayout.vee)."""
    from costmodel.loader import load_problem
    from costmodel.specs import ConfigSpec
    from costmodel.stage_layout import StageLayout
    from mofa.launch import export
    from mofa.launch.plan import build_plan
    from torchtitan.distributed import pipeline_parallel as tt

    problem = load_problem("problems/tuning/llama3_405b_8192gpu_gbs8192.yaml", ["hardware=h100-sxm", "model.vocab_size=128256",
                                                                                "training.dtypes.compute=fp8", "training.dtypes.grads=fp32"])
    spec = ConfigSpec(tp=8, pp=16, vp=2, pp_schedule="dualpipev", first_stage_layers=6, last_stage_layers=8, layer_split="uneven", zero_stage=3, pp_overlap=True)
    plan = build_plan(problem, spec, 45)
    sizes = [2, 5] + [4] * 29 + [3]
    layout = StageLayout.from_stage_sizes(16, 2, sizes, 0, vee=True)
    text = export(plan.model_copy(update={"pipeline_layout": layout.to_megatron()}), "torchtitan")
    cfg, dims = check(text)
    assert cfg.parallelism.pipeline_parallel_schedule == "DualPipeV"
    stages = cfg.parallelism.module_fqns_per_model_part
    assert [sum(n.startswith("layers.") for n in s) for s in stages] == sizes
    for r in range(dims.pp):
        mine = tt._get_pp_rank_to_stage_indices_mapping(r, dims.pp, "DualPipeV", len(stages))
        assert sorted(mine) == sorted(layout.rank_stages(r).tolist()) == sorted([r, 31 - r])
