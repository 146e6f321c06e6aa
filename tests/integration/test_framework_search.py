"""A search restricted to one framework (search.framework, `mofa solve --framework`) finds only
what that framework's exporter accepts: the mask and the refusals are one set of rules
(costmodel.frameworks). Checked three ways: each framework solves a small bundled problem to
plans its exporter accepts; on a narrowed space, the admissible set under a framework is
exactly the unrestricted admissible set minus what its exporter refuses; and an empty
restriction is explained by the framework's rules."""

import json
import subprocess
import sys
from dataclasses import fields

import numpy as np
import pytest

from conftest import PROBLEMS
from costmodel.frameworks import FRAMEWORKS
from costmodel.loader import load_problem
from mofa.launch import ExportError, build_plan, export
from optimizer.search import solve
from optimizer.space import SearchSpace

SMALL = PROBLEMS / "frameworks" / "llama31_8b_64xh100.yaml"
QUICK_START = PROBLEMS / "tuning" / "llama3_405b_16384xh100_seq8k.yaml"


def restricted(path, framework, *overrides):
    return load_problem(str(path), [f"search.framework={framework}", *overrides])


def refusal(plan, framework):
    try:
        export(plan, framework)
    except ExportError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_framework_solves_to_plans_its_exporter_accepts(framework):
    problem = restricted(SMALL, framework)
    result = solve(problem, "cpsat", top_k=4, distinct_layouts=True)
    assert result.status == "optimal"
    plans = result.plans(problem)
    assert len(plans) == 4
    for plan in plans:
        assert refusal(plan, framework) is None, plan.label()


def test_quick_start_restricted_to_megatron_exports():
    """The README's quick start (Llama 3 405B on 16,384 H100s), whose unrestricted best layout
    used ZeRO-2 with pp=16 (Megatron-FSDP does not pipeline): restricted to Megatron-LM, its best
    plans export for Megatron-LM and Megatron-Bridge."""
    problem = restricted(QUICK_START, "megatron")
    best = solve(problem, "cpsat", top_k=2)
    assert best.status == "optimal"
    for plan in best.plans(problem):
        for fmt in ("megatron", "megatron-bridge"):
            assert refusal(plan, fmt) is None, plan.label()


#: narrowed spaces (every schedule, CP variant, ZeRO stage, HSDP group, recompute and offload
#: setting and overlap switch stay free; the same recompute module sets under every framework):
#: Llama-3.1-8B on 16 GPUs, and DeepSeek-V3 on 32 (its
#: routing and dtypes set to what torchtitan can run, so every framework admits something)
SPACES = {
    "dense": (SMALL, ("cluster.num_gpus=16", "training.global_batch_size=32", "search.tp=[1,2]", "search.cp=[1,2]", "search.pp=[1,2,4]",
                      "search.vp=[1,2]", "search.mbs=[2]", "search.dp_shard=[2]", "search.recompute_block_layers=[2]",
                      "search.recompute_modules=[[core_attn],[ops]]")),  # Megatron's module and torchtitan's per-op policy
    "moe": (PROBLEMS / "tuning" / "deepseek_v3_1024gpu_sn8.yaml",
            ("cluster.num_gpus=32", "training.global_batch_size=64", "training.moe.dispatcher=alltoall", "training.dtypes.grads=fp32",
             "model.mtp_layers=0", "search.tp=[1,2]", "search.cp=[1]", "search.pp=[1,2]", "search.vp=[1]", "search.ep=[1,2,8,16,32]",
             "search.mbs=[1]", "search.recompute_block_layers=[2]")),
}


def _admissible(problem):
    """The rows of the search space that pass every rule (memory aside: the search applies it
    separately), in batches."""
    space = SearchSpace.from_problem(problem)
    rows = [(cfg, np.flatnonzero(space.feature_ok(cfg))) for cfg in space.batches(8192, space.interval())]
    return [cfg.take(ok) for cfg, ok in rows if len(ok)]


def _rows(batches):
    """{the row's columns: (its batch, its index)}."""
    return {tuple(getattr(cfg, f.name)[i] for f in fields(cfg)): (cfg, i) for cfg in batches for i in range(len(cfg))}


def _sample(rows: dict, n: int):
    keys = sorted(rows)
    return [(key, rows[key]) for key in keys[:: max(1, len(keys) // n)]]


@pytest.fixture(scope="module", params=sorted(SPACES))
def unrestricted(request):
    """A narrowed problem, its overrides, its admissible rows and a deterministic sample of about 300."""
    path, overrides = SPACES[request.param]
    free = load_problem(str(path), list(overrides))
    rows = _rows(_admissible(free))
    return free, path, overrides, set(rows), _sample(rows, 300)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_mask_is_the_exporters_refusals(framework, unrestricted):
    """A configuration is admissible under the framework exactly when it is admissible without
    one and the framework's exporter accepts its plan: checked on a sample of every admissible
    configuration and on a sample of those the restricted search admits."""
    free, path, overrides, everything, sample = unrestricted
    allowed = _rows(_admissible(restricted(path, framework, *overrides)))
    assert allowed and set(allowed) < everything
    verdicts = []
    for key, (cfg, i) in sample + _sample(allowed, 100):
        why = refusal(build_plan(free, cfg.spec(i), 100), framework)
        assert (why is None) == (key in allowed), (cfg.row(i), why)
        verdicts.append(why is None)
    assert any(verdicts) and not all(verdicts)  # both sides of the rule set are exercised


def _mofa(*args):
    return subprocess.run([sys.executable, "-m", "mofa", *args], capture_output=True, text=True, timeout=300)


def test_a_framework_that_runs_nothing_is_explained_by_its_rules():
    """DeepSpeed runs neither tensor nor context parallelism nor uneven pipeline stages, which
    Llama 3 405B's 126 layers on 64 GPUs with a global batch of 16 need; torchtitan's Llama 3 405B config function computes in fp8, the problem
    in bf16: the explanation names the framework's rules that cut, with their messages."""
    out = _mofa("solve", str(QUICK_START), "--framework", "torchtitan", "--json")
    assert out.returncode == 1
    explanation = json.loads(out.stdout)["explanation"]
    assert "torchtitan (search.framework: torchtitan) runs none of the" in explanation
    assert "torchtitan:config_dtype cuts" in explanation and "llama3_405b (fp8), the plan in bf16" in explanation
    out = _mofa("solve", str(PROBLEMS / "tuning" / "llama3_405b_64gpu_gbs16.yaml"), "--framework", "deepspeed")
    assert out.returncode == 1
    assert "DeepSpeed (search.framework: deepspeed) runs none of the" in out.stdout and "deepspeed:no_tp cuts" in out.stdout, out.stdout


def test_bad_framework_is_one_line():
    out = _mofa("solve", str(SMALL), "--set", "search.framework=jax")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1
    assert "search.framework" in out.stderr and "llama31_8b_64xh100.yaml" in out.stderr


def test_a_torchtitan_search_tries_its_per_op_checkpointing():
    """A torchtitan search's selective recompute is its per-op policy unless the problem names
    module sets: the admissible space holds selective [ops] rows, and no Megatron module set."""
    problem = restricted(SMALL, "torchtitan")
    assert problem.search.recompute_modules == [["ops"]]
    result = solve(problem, "exhaustive", top_k=1)
    assert result.status == "optimal"
    from costmodel.configs import RECOMPUTE_CODES, RECOMPUTE_MODULE_BITS

    admissible = _admissible(problem)
    recompute = np.concatenate([cfg.recompute for cfg in admissible])
    modules = np.concatenate([cfg.recompute_modules for cfg in admissible])
    selective = recompute == RECOMPUTE_CODES["selective"]
    assert selective.any() and np.all(modules[selective] == RECOMPUTE_MODULE_BITS["ops"])
