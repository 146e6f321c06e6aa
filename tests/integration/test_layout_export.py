"""Heterogeneous pipeline layouts in the launch plan (issue 11): Megatron-LM and Megatron-Bridge
get --pipeline-model-parallel-layout instead of every other split flag, torchtitan a config module
with every stage's modules (refused with MTP modules; under DualPipeV in model order, torchtitan placing the V), DeepSpeed refuses with
the reason; `mofa solve --pipeline-layouts` searches, reports and exports it, and `mofa evaluate
--pipeline-layout` scores a given one."""

import json
import shlex
import subprocess
import sys

import pytest

from conftest import PROBLEMS
from costmodel.loader import load_problem
from costmodel.specs import ConfigSpec
from costmodel.stage_layout import StageLayout
from mofa.launch import ExportError
from mofa.launch.deepspeed import deepspeed_config
from mofa.launch.megatron import bridge_overrides, megatron_flags, megatron_script
from mofa.launch.plan import build_plan
from mofa.launch.torchtitan import torchtitan_args

LLAMA405 = PROBLEMS / "tuning" / "llama3_405b_16384xh100_seq8k.yaml"


@pytest.fixture(scope="module")
def plan():
    problem = load_problem(str(LLAMA405))
    base = build_plan(problem, ConfigSpec(tp=8, pp=16, vp=8, layer_split="embedding_loss", zero_stage=1), 45)
    sizes = [0] + [1] * 126 + [0]
    sizes[1], sizes[2], sizes[-2], sizes[-3] = 0, 2, 0, 2  # move a layer off the second and the second-to-last stage
    layout = StageLayout.from_stage_sizes(16, 8, sizes, 0)
    return base.model_copy(update={"pipeline_layout": layout.to_megatron()}), layout


def test_megatron_gets_the_layout_and_no_other_split(plan):
    p, layout = plan
    flags = megatron_flags(p)
    assert flags[flags.index("--pipeline-model-parallel-layout") + 1] == layout.to_megatron()
    for other in ("--num-virtual-stages-per-pipeline-rank", "--account-for-embedding-in-pipeline-split",
                  "--account-for-loss-in-pipeline-split", "--decoder-first-pipeline-num-layers"):
        assert other not in flags  # Megatron refuses them next to a layout
    script = megatron_script(p)
    assert shlex.quote(layout.to_megatron()) in script  # | and * quoted for the shell
    assert StageLayout.from_megatron(layout.to_megatron(), 16, 8) == layout


def test_bridge_gets_the_layout(plan):
    p, layout = plan
    overrides = bridge_overrides(p)
    assert f'model.pipeline_model_parallel_layout="{layout.to_megatron()}"' in overrides
    assert not any("account_for" in o or "num_layers_in_first" in o for o in overrides)


def test_a_layout_the_split_flags_build_is_launched_by_them(plan):
    """Issue 11's "first/last stage counts where that suffices": a layout equal to a flag split
    (the embedding/loss-accounted one, an uneven one) is launched by the flags, which every
    framework reads (DeepSpeed reads no layout string); any other stays the layout string."""
    from costmodel.stage_layout import megatron_layout
    from mofa.launch.plan import with_pipeline_layout

    p, layout = plan
    base = p.model_copy(update={"pipeline_layout": None})
    accounted = with_pipeline_layout(base, megatron_layout(126, 0, 16, 8, 7, 7))
    assert (accounted.layer_split, accounted.pipeline_layout) == ("embedding_loss", None)
    assert "--account-for-embedding-in-pipeline-split" in megatron_flags(accounted)
    assert with_pipeline_layout(base, layout).pipeline_layout == layout.to_megatron()  # no flag split builds it
    # 8 / 6 on pp 16 x vp 8: no flag split (vp divides neither end's count and the middle 112 layers
    # would need 110), so the layout string, though its ranks are a first/last split's
    eight_six = megatron_layout(126, 0, 16, 8, 8, 6)
    assert with_pipeline_layout(base, eight_six).pipeline_layout == eight_six.to_megatron()
    problem = load_problem(str(LLAMA405))
    flat = build_plan(problem, ConfigSpec(tp=8, pp=16, vp=1, layer_split="embedding_loss", zero_stage=1), 45)
    uneven = with_pipeline_layout(flat, megatron_layout(126, 0, 16, 1, 6, 8))
    assert (uneven.layer_split, uneven.first_stage_layers, uneven.last_stage_layers, uneven.middle_stage_layers) == ("uneven", 6, 8, 8)
    assert uneven.pipeline_layout is None and "--decoder-first-pipeline-num-layers" in megatron_flags(uneven)


def test_deepspeed_refuses_a_layout(plan):
    with pytest.raises(ExportError, match="pipeline layout"):
        deepspeed_config(plan[0])


@pytest.fixture(scope="module")
def fp8_plan(plan):
    """The layout on a plan torchtitan runs: its llama3_405b config function computes in fp8,
    FSDP2 shards the parameters (ZeRO-3), gradients reduce in fp32."""
    problem = load_problem(str(LLAMA405), ["training.dtypes.compute=fp8", "training.dtypes.grads=fp32"])
    base = build_plan(problem, ConfigSpec(tp=8, pp=16, vp=8, layer_split="embedding_loss", zero_stage=3), 45)
    return base.model_copy(update={"pipeline_layout": plan[1].to_megatron()}), plan[1]


def test_torchtitan_gets_the_layout_as_a_config_module(fp8_plan):
    """torchtitan's command line cannot give module_fqns_per_model_part, so the script writes a
    config module (every stage's modules, in model order) and launches it; no layers-per-stage
    split beside it. tests/frameworks/test_torchtitan.py has torchtitan read it."""
    from mofa.launch.torchtitan import LAYOUT_FUNCTION, LAYOUT_MODULE, module_fqns, torchtitan_script

    p, layout = fp8_plan
    stages = module_fqns(p)
    assert [sum(n.startswith("layers.") for n in s) for s in stages] == list(layout.decoders)
    assert stages[0][0] == "tok_embeddings" and stages[-1][-2:] == ["norm", "lm_head"]
    assert [n for s in stages for n in s if n.startswith("layers.")] == [f"layers.{i}" for i in range(126)]
    args = torchtitan_args(p)
    assert args[args.index("--module") + 1] == LAYOUT_MODULE and args[args.index("--config") + 1] == LAYOUT_FUNCTION
    assert not any("layers-per-stage" in a or "less-layers" in a for a in args)
    script = torchtitan_script(p)
    assert f"cat > \"$LAYOUT_DIR/{LAYOUT_MODULE}.py\" <<'PY'" in script and "from torchtitan.models.llama3.config_registry import llama3_405b" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_torchtitan_refuses_a_layout_it_cannot_place(fp8_plan):
    p, _ = fp8_plan
    with pytest.raises(ExportError, match="MTP"):
        torchtitan_args(p.model_copy(update={"pipeline_layout": p.pipeline_layout[:-1] + "mL"}))


def test_solve_pipeline_layouts(tmp_path):
    """Llama 2 70B on 128 GPUs with pp 4 x vp 2 interleaved: the search is never worse than the
    configuration's own split, and the exported launch script carries what the report says."""
    out = tmp_path / "run"
    args = [sys.executable, "-m", "mofa", "solve", str(PROBLEMS / "tuning" / "llama2_70b_128gpu.yaml"),
            "--set", "search.pp=[4]", "--set", "search.vp=[2]", "--set", "features.zero_stage=[1]",
            "--set", "features.activation_offload=off", "--set", "features.recompute=[none, selective]",
            "--set", "search.pp_schedule=[interleaved_1f1b]", "--pipeline-layouts", "--layout-time-limit", "5",
            "--json", "--out", str(out)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["pipeline_layout"]
    # certification within the limit depends on the machine's load; what must hold always:
    assert report["step_time_s"] <= report["megatron_split_step_time_s"] and 0.0 <= report["gap"] <= 1.0
    assert not report["applied"] or report["step_time_s"] < report["megatron_split_step_time_s"] or not report["megatron_split_fits"]
    script = (out / "megatron_launch.sh").read_text()
    if report["applied"]:
        plan = json.loads((out / "result.json").read_text())["best"]["plan"]
        if report["launched_as"] == "pipeline_layout":
            assert shlex.quote(report["layout"]) in script and plan["pipeline_layout"] == report["layout"]
        else:  # a first/last split builds the layout: launched by those flags
            from costmodel.stage_layout import megatron_layout

            assert plan["pipeline_layout"] is None and "--pipeline-model-parallel-layout" not in script
            assert StageLayout.from_megatron(report["layout"], 4, 2) == megatron_layout(80, 0, 4, 2, plan["first_stage_layers"], plan["last_stage_layers"])
    else:
        assert "--pipeline-model-parallel-layout" not in script


@pytest.mark.parametrize("problem, narrowed, split", [
    # the V search: the certified layout is not the V split (rank 7 holds 8 layers in its first stage, none in its second)
    ("deepseek_v3_1024gpu_sn256", ["search.tp=[1]", "search.cp=[4]", "search.pp=[8]", "search.ep=[128]", "search.pp_schedule=[dualpipev]"], False),
    # regular then free layouts (two_phase): the split, certified by the rank order
    ("llama3_405b_16384xh100_seq8k", ["search.tp=[4]", "search.cp=[4]", "search.pp=[16]", "search.vp=[8]",
                                      "search.pp_schedule=[interleaved_1f1b]"], True),
])
def test_solve_pipeline_layouts_is_deterministic(problem, narrowed, split):
    """The same problem file gives the same answer, run after run, layout search included (two
    CP-SAT workers, descents with seeded tie-breaks): two shipped problems narrowed to their best
    skeleton, one through each layout search `mofa solve` runs. Everything but the timings must
    be identical (bench/bench_shipped_layouts.py checks every shipped problem whole)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_shipped_layouts", PROBLEMS.parent / "bench" / "bench_shipped_layouts.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = [sys.executable, "-m", "mofa", "solve", str(PROBLEMS / "tuning" / f"{problem}.yaml"), "--pipeline-layouts", "--json"]
    for override in narrowed:
        args += ["--set", override]
    runs = [subprocess.run(args, capture_output=True, text=True, timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    first, second = (json.loads(r.stdout) for r in runs)
    report = first["pipeline_layout"]
    assert report["optimal"] and report["applied"] is not split and report["search_time_s"] > 0
    assert bench.without_timings(first) == bench.without_timings(second)


def test_megatron_gets_the_layout_recompute(plan):
    """A layout whose recompute counts are min(N, layers) for one N launches as Megatron's block
    method with that N beside the layout; counts no one N gives are refused."""
    from optimizer.layout_report import launch_recompute

    p, layout = plan
    chosen = layout.with_recompute([min(1, d) for d in layout.decoders])
    flags = megatron_flags(p.model_copy(update=launch_recompute(chosen)))
    assert flags[flags.index("--recompute-granularity") + 1] == "full"
    assert flags[flags.index("--recompute-method") + 1] == "block"
    assert flags[flags.index("--recompute-num-layers") + 1] == "1"
    assert flags[flags.index("--pipeline-model-parallel-layout") + 1] == layout.to_megatron()
    assert "--recompute-granularity" not in megatron_flags(p.model_copy(update=launch_recompute(layout)))  # N = 0: none
    uneven = list(chosen.recompute)
    uneven[uneven.index(1)] = 0
    with pytest.raises(ValueError, match="one N"):
        launch_recompute(chosen.with_recompute(uneven))


DEEPSEEK = PROBLEMS / "tuning" / "deepseek_v3_1024gpu_sn8.yaml"


def test_a_degree_only_a_layout_splits_is_searched_and_launched():
    """DeepSeek-V3 (61 layers, an MTP module) on pp 16 x vp 2: Megatron's split flags admit no
    split (costmodel.layout), so until the layout split the search found nothing there. Now it
    finds the layout split's configurations, and the plan launches with its layout string, the
    only way Megatron-Core runs it."""
    from optimizer.search import solve

    problem = load_problem(str(DEEPSEEK), ["search.pp=[16]", "search.vp=[2]", "search.framework=megatron"])
    result = solve(problem, "cpsat")
    assert result.status == "optimal"
    plan = result.plans(problem)[0]
    assert (plan.pp, plan.vp, plan.layer_split, plan.first_stage_layers, plan.last_stage_layers) == (16, 2, "layout", 2, 3)
    layout = StageLayout.from_megatron(plan.pipeline_layout, 16, 2)
    assert layout.decoders == (1,) + (2,) * 15 + (1,) + (2,) * 14 + (1,) and layout.mtp[-1] == 1
    flags = megatron_flags(plan)
    assert flags[flags.index("--pipeline-model-parallel-layout") + 1] == plan.pipeline_layout
    assert "--decoder-first-pipeline-num-layers" not in flags and "--num-virtual-stages-per-pipeline-rank" not in flags
    assert f'model.pipeline_model_parallel_layout="{plan.pipeline_layout}"' in bridge_overrides(plan)
    with pytest.raises(ExportError, match="pipeline layout"):
        torchtitan_args(plan)
    # --pipeline-layouts starts from the split itself: the search takes it, and is never worse
    from optimizer.layout_report import layout_report

    report, found = layout_report(problem, result.top_configs.take([0]), time_limit_s=3.0)
    assert "refused" not in report and report["step_time_s"] <= report["megatron_split_step_time_s"]
    assert report["applied"] == (found is not None)
    # without the layout split the same search admits nothing: among Megatron's schedules it
    # says it is the split; with DualPipeV searched too, the model admits its V split (1 / 4
    # layers, costmodel.layout.vee_split) and the explanation names Megatron's rule against it
    flags_only = ["search.pp=[16]", "search.vp=[2]", "search.framework=megatron", "search.layer_split=[even, embedding_loss, uneven]"]
    megatron_schedules = "search.pp_schedule=[1f1b, interleaved_1f1b, flexible, afab]"
    none = solve(load_problem(str(DEEPSEEK), [*flags_only, megatron_schedules]), "cpsat")
    assert none.status == "infeasible" and "lay the layers out" in none.explanation
    vee = solve(load_problem(str(DEEPSEEK), flags_only), "cpsat")
    assert vee.status == "infeasible" and vee.explanation.startswith("Megatron-LM") and "no_dualpipev cuts" in vee.explanation


DSV3 = PROBLEMS / "tuning" / "deepseek_v3_2048gpu_sn8.yaml"
DSV3_INTERLEAVED = ["tp=1", "cp=4", "pp=16", "vp=2", "ep=128", "mbs=1", "pp_schedule=interleaved_1f1b", "pp_overlap=true", "layer_split=layout"]


def run_mofa(*args):
    return subprocess.run([sys.executable, "-m", "mofa", *args], capture_output=True, text=True, timeout=300)


def sets(overrides):
    return [arg for o in overrides for arg in ("--set", o)]


def test_evaluate_scores_a_given_layout():
    """`mofa evaluate --pipeline-layout`: DeepSeek-V3 interleaved on pp 16 x vp 2 with three layers
    on the first stage, two on every other, the MTP module with the head: scored by the layout
    model (the same numbers as costmodel.stage_layout.score_layout), next to the configuration's
    own split, and launched with that layout (the JSON's plan)."""
    from costmodel.configs import ConfigBatch
    from costmodel.stage_layout import layout_context, score_layout
    from optimizer.layout_report import own_layout

    text = "Et*3|(tt|)*29,|mL"
    result = run_mofa("evaluate", str(DSV3), *sets(DSV3_INTERLEAVED), "--pipeline-layout", text, "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    report = out["pipeline_layout"]
    problem = load_problem(str(DSV3), DSV3_INTERLEAVED)
    cfg = ConfigBatch.from_specs(problem, [problem.config])
    ctx = layout_context(problem, cfg)
    layout = StageLayout.from_megatron(text, 16, 2)
    score, own = score_layout(ctx, layout), score_layout(ctx, own_layout(ctx))
    assert report["layout"] == layout.to_megatron() == out["plan"]["pipeline_layout"]
    assert report["step_time_s"] == pytest.approx(score.step_time_s, rel=1e-12)
    assert report["peak_bytes"] == pytest.approx(list(score.peak_bytes), rel=1e-12)
    assert report["fits"] == score.fits and report["worst_rank"] == int(score.peak_bytes.argmax())
    assert report["megatron_split_step_time_s"] == pytest.approx(own.step_time_s, rel=1e-12)
    assert report["gain"] == pytest.approx(own.step_time_s / score.step_time_s - 1.0, rel=1e-12)
    assert "recompute" not in report
    text_out = run_mofa("evaluate", str(DSV3), *sets(DSV3_INTERLEAVED), "--pipeline-layout", text)
    assert text_out.returncode == 0 and "pipeline layout (given" in text_out.stdout and layout.to_megatron() in text_out.stdout


def test_a_given_layout_takes_the_configurations_recompute():
    """Under full recompute, block N = 1, every stage of the given layout recomputes min(1, its
    layers), as Megatron launches --recompute-num-layers 1 on it."""
    overrides = ["tp=8", "cp=1", "pp=16", "vp=8", "mbs=1", "layer_split=embedding_loss", "zero_stage=1", "recompute=full",
                 "recompute_method=block", "recompute_num_layers=1"]
    sizes = [0] + [1] * 126 + [0]
    sizes[1], sizes[2] = 0, 2
    layout = StageLayout.from_stage_sizes(16, 8, sizes, 0)
    result = run_mofa("evaluate", str(LLAMA405), *sets(overrides), "--pipeline-layout", layout.to_megatron(), "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["pipeline_layout"]["recompute"] == [min(1, n) for n in sizes]
    plan = out["plan"]
    assert (plan["recompute"], plan["recompute_method"], plan["recompute_num_layers"]) == ("full", "block", 1)
    assert plan["pipeline_layout"] == layout.to_megatron()


@pytest.mark.parametrize("text,fragment", [
    ("Et*3|(tt|)*29,m|L", "MTP modules on a rank without the head"),
    ("Et*3|(tt|)*29,t|mL", "62 decoder layers, the model has 61"),
    ("Et*3|(tt|)*28,|mL", "31 stages, pp=16 x vp=2 needs 32"),
    ("Et*3|(tx|)*29,|mL", "unknown symbol"),
])
def test_a_bad_given_layout_is_one_line(text, fragment):
    result = run_mofa("evaluate", str(DSV3), *sets(DSV3_INTERLEAVED), "--pipeline-layout", text)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(DSV3) in lines[0] and "--pipeline-layout" in lines[0] and fragment in lines[0]


def test_a_launch_plan_with_a_layout_says_so_in_its_label(fp8_plan):
    """The launch files' header names the plan: with a layout, not the first/last split it replaced."""
    p, _ = fp8_plan
    assert "layers by the pipeline layout" in p.label() and "first/last" not in p.label()
    assert "layers first/last=7/7" in p.model_copy(update={"pipeline_layout": None}).label()


LLAMA_VEE = ["hardware=h100-sxm", "model.vocab_size=128256", "tp=8", "pp=16", "vp=2", "mbs=1", "pp_schedule=dualpipev", "zero_stage=0", "pp_overlap=true", "layer_split=uneven",
             "training.dtypes.compute=fp8", "training.dtypes.grads=fp32"]


def test_evaluate_scores_and_launches_a_layout_under_dualpipev():
    """`mofa evaluate --pipeline-layout` under DualPipeV: Llama 3 405B on pp 16 (8192 of MoFa's device B, DDP as
    torchtitan replicates without FSDP, the layout model covering ZeRO 0-1), its V split (3 + 3
    layers on rank 0, 4 on each other stage) with a layer moved from stage 0 to stage 1: scored by the layout model in the V (the JSON equal to score_layout's), and
    launched by torchtitan with the stages as module lists in model order, which its
    ScheduleDualPipeV places in the V (tests/frameworks reads them back)."""
    from costmodel.configs import ConfigBatch
    from costmodel.stage_layout import layout_context, score_layout
    from mofa.launch.plan import LaunchPlan
    from mofa.launch.torchtitan import module_fqns

    path = PROBLEMS / "tuning" / "llama3_405b_8192gpu_gbs8192.yaml"
    sizes = [2, 5] + [4] * 29 + [3]
    text = "|".join(("E" if s == 0 else "") + "t" * n + ("L" if s == 31 else "") for s, n in enumerate(sizes))
    result = run_mofa("evaluate", str(path), *sets(LLAMA_VEE), "--pipeline-layout", text, "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    problem = load_problem(str(path), LLAMA_VEE)
    ctx = layout_context(problem, ConfigBatch.from_specs(problem, [problem.config]))
    layout = StageLayout.from_megatron(text, 16, 2, vee=True)
    score = score_layout(ctx, layout)
    assert out["pipeline_layout"]["step_time_s"] == pytest.approx(score.step_time_s, rel=1e-12)
    assert out["pipeline_layout"]["peak_bytes"] == pytest.approx(list(score.peak_bytes), rel=1e-12)
    plan = LaunchPlan.model_validate(out["plan"])
    assert plan.pp_schedule == "dualpipev" and plan.pipeline_layout == layout.to_megatron()
    stages = module_fqns(plan)
    assert [sum(n.startswith("layers.") for n in st) for st in stages] == sizes
    args = torchtitan_args(plan)
    assert args[args.index("--parallelism.pipeline-parallel-schedule") + 1] == "DualPipeV" and "--module" in args


def test_evaluate_says_where_a_given_layout_is_short_of_host_memory():
    """`mofa evaluate --pipeline-layout` under MoFa's whole-layer activation offload (the shipped
    gbs 64 answer, tp 2, cp 2, pp 16 x vp 8), with a node's host memory just above what the
    split offloads: rank 1 moving a layer from its last chunk to its first keeps every GPU's peak
    and offloads 32 GiB more; the report says the host is short and that the layout does not
    fit (its JSON: each rank's host bytes and the share)."""
    from costmodel.stage_layout import megatron_layout

    problem = PROBLEMS / "tuning" / "llama3_405b_64gpu_gbs64.yaml"
    overrides = ["tp=2", "cp=2", "pp=16", "vp=8", "mbs=1", "layer_split=uneven", "first_stage_layers=7", "last_stage_layers=7", "zero_stage=1",
                 "pp_overlap=true", "dp_overlap=true", "cpu_optimizer=true", "activation_offload=layer", "hardware.host_memory_gb_per_node=1816"]
    split = megatron_layout(126, 0, 16, 8, 7, 7)
    decoders = list(split.decoders)
    decoders[1], decoders[113] = decoders[1] + 1, decoders[113] - 1  # rank 1's chunks 0 and 7
    text = StageLayout(pp=16, vp=8, decoders=tuple(decoders), mtp=split.mtp).to_megatron()
    result = run_mofa("evaluate", str(problem), *sets(overrides), "--pipeline-layout", text, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["pipeline_layout"]
    assert report["megatron_split_fits"] and not report["fits"]
    assert max(report["host_bytes"]) > report["host_share_bytes"] > 211 * 2**30
    text_out = run_mofa("evaluate", str(problem), *sets(overrides), "--pipeline-layout", text)
    assert text_out.returncode == 0 and "does NOT fit" in text_out.stdout and "host memory short" in text_out.stdout
