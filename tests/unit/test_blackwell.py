"""Blackwell (issue 8, Presets and FP8): the GB200 NVL72 preset's per-GPU figures from its
datasheet, the rack's 72-GPU NVLink domain as the supernode level, and MXFP8 -- GEMMs at the
fp8 rate on GPUs whose tensor cores apply MX block scales, refused in one line elsewhere."""

import subprocess
import sys

import pytest

from conftest import PROBLEMS, ROOT
from costmodel.configs import ConfigBatch
from costmodel.evaluate import evaluate
from costmodel.loader import ProblemError, build_problem, load_problem
from costmodel.presets import HARDWARE
from mofa.launch import ExportError
from mofa.launch.deepspeed import deepspeed_config
from mofa.launch.megatron import megatron_flags
from mofa.launch.plan import build_plan
from costmodel.specs import ConfigSpec

GB200_PROBLEM = PROBLEMS / "tuning" / "gpt_oss_120b_144xgb200_nvl72.yaml"


def test_gb200_per_gpu_figures_are_the_nvl72_datasheets_over_72():
    """GB200 NVL72 datasheet, per rack of 72 GPUs: BF16 360 PF and FP8 720 PF with sparsity
    (dense: half), 576 TB/s HBM3e, 130 TB/s NVLink (bidirectional); 186 GB per GPU. Exact up
    to the datasheet's rounding (NVLink: 1.8 TB/s per GPU as NVIDIA states it, 1% of 130/72)."""
    gb = HARDWARE["gb200"]
    assert gb.peak_tflops["bf16"] == 360e3 / 72 / 2 and gb.peak_tflops["fp8"] == 720e3 / 72 / 2
    assert gb.peak_tflops["mxfp8"] == gb.peak_tflops["fp8"]
    assert gb.memory_bandwidth_gb_per_s == 576e3 / 72
    assert 2 * gb.intra_node_gb_per_s == pytest.approx(130e3 / 72, rel=0.01)
    b200 = HARDWARE["b200"]
    # capacity: the datasheet's 186 GB at B200's exposed-to-nominal ratio (180 GB -> 183,359 MiB)
    assert gb.memory_mib == round(186 * b200.memory_mib / 180)
    assert gb.chip == b200.chip  # one Blackwell die: one calibrated efficiency profile


def test_nvl72_domain_carries_expert_parallelism_across_trays():
    """EP over 16 GPUs spans four 4-GPU trays: inside the NVL72 supernode its all-to-all runs at
    NVLink speed; with the rack's domain removed (trays joined by their NICs) it slows down."""
    rack = load_problem(str(GB200_PROBLEM))
    trays = rack.model_copy(update={"cluster": rack.cluster.model_copy(update={"supernode_size": None})})
    cfg = ConfigBatch.from_columns(144, tp=1, pp=1, ep=16, etp=1, mbs=1, zero_stage=1, first_layers=36, last_layers=36)
    ep_rack, ep_trays = (float(evaluate(p, cfg).breakdown_s["ep"][0]) for p in (rack, trays))
    assert 0 < ep_rack < ep_trays / 4


def with_compute(problem, dtype):
    tr = problem.training
    return problem.model_copy(update={"training": tr.model_copy(update={"dtypes": tr.dtypes.model_copy(update={"compute": dtype})})})


def test_mxfp8_runs_gemms_at_the_fp8_rate_on_blackwell():
    """On B200 and GB200 MXFP8 costs what per-tensor fp8 costs (the block scales are applied in
    the MMA at the fp8 rate) and less than bf16; attention stays in bf16, so the saving is
    below the 2x of the GEMMs alone."""
    rack = load_problem(str(GB200_PROBLEM))
    cfg = ConfigBatch.from_columns(144, tp=1, pp=1, ep=16, etp=1, mbs=1, zero_stage=1, first_layers=36, last_layers=36)
    step = {d: float(evaluate(with_compute(rack, d), cfg).step_time_s[0]) for d in ("bf16", "fp8", "mxfp8")}
    assert step["mxfp8"] == pytest.approx(step["fp8"], rel=1e-12)
    assert step["bf16"] / 2 < step["mxfp8"] < step["bf16"]


def problem_doc(hardware, compute):
    return {"model": "llama3.1-8b", "hardware": hardware, "cluster": {"num_gpus": 8, "gpus_per_node": 8},
            "training": {"global_batch_size": 8, "seq_len": 4096, "steps": 100, "dtypes": {"compute": compute}}}


@pytest.mark.parametrize("hardware", ["h100-sxm", "h200", "a100-80gb"])
def test_mxfp8_is_refused_where_the_tensor_cores_lack_it(hardware):
    with pytest.raises(ProblemError) as err:
        build_problem(problem_doc(hardware, "mxfp8"), str(ROOT / "p.yaml"))
    text = str(err.value)
    assert "\n" not in text and "training.dtypes.compute: mxfp8 needs" in text and hardware in text
    assert ("use fp8" in text) == ("fp8" in HARDWARE[hardware].peak_tflops)  # Hopper: per-tensor fp8 is the alternative


def test_mxfp8_on_hopper_is_one_line_and_exit_code_2():
    problem = PROBLEMS / "tuning" / "llama2_70b_128gpu.yaml"
    out = subprocess.run([sys.executable, "-m", "mofa", "evaluate", str(problem), "--set", "training.dtypes.compute=mxfp8",
                          "--set", "hardware=h100-sxm"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "llama2_70b_128gpu.yaml" in lines[0] and "mxfp8 needs" in lines[0] and "Traceback" not in out.stderr


def test_mxfp8_exports():
    """Megatron-LM: Transformer Engine's MXFP8 recipe (--fp8-recipe mxfp8, E4M3); DeepSpeed
    refuses it as it refuses fp8 (its model code has no Transformer Engine layers)."""
    problem = build_problem(problem_doc("b200", "mxfp8"), str(ROOT / "p.yaml"))
    plan = build_plan(problem, ConfigSpec(tp=2), None)
    flags = megatron_flags(plan)
    i = flags.index("--fp8-recipe")
    assert flags[i + 1] == "mxfp8" and flags[flags.index("--fp8-format") + 1] == "e4m3"
    with pytest.raises(ExportError, match="mxfp8 GEMMs need Transformer Engine"):
        deepspeed_config(build_plan(problem, ConfigSpec(zero_stage=1), None))  # a plan DeepSpeed runs in bf16
