"""Heterogeneous pipeline layouts in the launch plan (issue 11): Megatron-LM and Megatron-Bridge
get --pipeline-model-parallel-layout instead of every other split flag, torchtitan and DeepSpeed
refuse with the reason, and `mofa solve --pipeline-layouts` searches, reports and exports it."""

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


@pytest.mark.parametrize("exporter", [torchtitan_args, deepspeed_config])
def test_other_frameworks_refuse_a_layout(plan, exporter):
    with pytest.raises(ExportError, match="pipeline layout"):
        exporter(plan[0])


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
        assert shlex.quote(report["layout"]) in script
        assert json.loads((out / "result.json").read_text())["best"]["plan"]["pipeline_layout"] == report["layout"]
    else:
        assert "--pipeline-model-parallel-layout" not in script


def test_megatron_gets_the_layout_recompute(plan):
    """A layout whose recompute counts are min(N, layers) for one N launches as Megatron's block
    method with that N beside the layout; counts no one N gives are refused."""
    from optimizer.layout_search import launch_recompute

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
    from optimizer.layout_search import layout_report

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
