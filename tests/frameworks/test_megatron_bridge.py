"""Megatron-Bridge 0.3.1's own ConfigContainer.validate() reads every Megatron-Bridge override
file exported from the shipped results (the default search's and the search restricted to
Megatron), applied to the model's pretraining recipe with the Bridge's own omegaconf utilities,
and rejects deliberately broken ones. The Bridge runs in a process of its own
(bridge_check.py: a Transformer Engine stand-in, an offline Hugging Face cache), once for all
the files."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from shipped_exports import accepted, coverage

from mofa.launch.megatron import bridge_overrides

# found, not imported: importing it needs the Transformer Engine stand-in, which only the
# checker's own process gets (find_spec of a submodule raises when its parent package is absent)
if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.bridge") is None:
    if os.environ.get("MOFA_FRAMEWORK_TESTS") == "1":
        raise ImportError("megatron.bridge is not installed (tests/frameworks/requirements-nodeps.txt)")
    pytest.skip("megatron-bridge is not installed (the framework environment: .ci/frameworks)", allow_module_level=True)

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bridge_check import RECIPES  # noqa: E402


def _broken(lines: list[str], key: str, value: str) -> list[str]:
    assert any(line.startswith(key + "=") for line in lines), key
    return [f"{key}={value}" if line.startswith(key + "=") else line for line in lines]


@pytest.fixture(scope="module")
def verdicts():
    """{case name: "ok" or the Bridge's error} for every exported file and the broken ones."""
    files = [e for e in accepted("megatron-bridge") if e.plan.model.name in RECIPES]
    assert files, coverage()
    cases = [{"name": e.name, "model": e.plan.model.name, "world": e.plan.num_gpus, "overrides": e.text.splitlines()} for e in files]
    first = cases[0]
    broken = {  # each breaks one rule the Bridge checks, keeping the rest of a file it accepts
        "broken:tp_heads": _broken(first["overrides"], "model.tensor_model_parallel_size", "3"),
        "broken:world": _broken(first["overrides"], "model.context_parallel_size", "3"),
        "broken:cp_seq": _broken(first["overrides"], "model.seq_length", "1000"),
    }
    # the precision a plan states must survive the recipe's MixedPrecisionConfig at launch: the
    # first file's plan with fp8 GEMMs and bf16 gradient reduction, exported by the exporter
    plan = files[0].plan
    for name, compute in (("fp8", "fp8"), ("bf16_grads", plan.dtypes.compute)):
        dtypes = plan.dtypes.model_copy(update={"compute": compute, "grads": "bf16"})
        cases.append({**first, "name": f"precision:{name}", "overrides": bridge_overrides(plan.model_copy(update={"dtypes": dtypes}))})
    cases += [{**first, "name": name, "overrides": lines} for name, lines in broken.items()]
    # pretrain() checks the world size before the heads: the tp_heads case keeps the world divisible
    tp = int(next(line for line in first["overrides"] if line.startswith("model.tensor_model_parallel_size=")).split("=")[1])
    cases[-3]["world"] = first["world"] // tp * 3
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    run = subprocess.run([sys.executable, str(HERE / "bridge_check.py")], input=json.dumps(cases), capture_output=True, text=True,
                         timeout=900, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout)
    print(f"Megatron-Bridge checked {len(files)} exported files ({sorted({c['model'] for c in cases})})")
    return [c["name"] for c in cases[: len(files)]], out


def test_bridge_accepts_every_exported_file(verdicts):
    names, out = verdicts
    rejected = {name: out[name] for name in names if out[name] != "ok"}
    assert not rejected, rejected
    assert len(names) >= 2


@pytest.mark.parametrize("case", ["precision:fp8", "precision:bf16_grads"])
def test_the_exported_precision_survives_the_recipe(verdicts, case):
    """The recipe's MixedPrecisionConfig overwrites DDP and model precision fields in pretrain()
    (runtime_config_update); the checker reads every exported field back after it."""
    _, out = verdicts
    assert out[case] == "ok", out[case]


@pytest.mark.parametrize("case,message", [
    ("broken:tp_heads", "must be a multiple of tensor_model_parallel_size"),
    ("broken:world", "is not divisible by total_model_size"),
    ("broken:cp_seq", "equence length"),
])
def test_bridge_rejects_a_broken_file(verdicts, case, message):
    _, out = verdicts
    assert out[case] != "ok" and message in out[case], out[case]
