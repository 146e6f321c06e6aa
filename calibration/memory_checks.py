"""Memory predictions against the published memory figures the data has.

* Korthikanti et al. 2022 (arXiv 2205.05198) section 4: bytes of activations per layer for a
  GPT layer, with tensor parallelism alone, with sequence parallelism and with selective
  recompute (their eqs. 2-5), for the 175B model at s=2048, b=1, t=8.
* MoFa Table 7: peak memory of LLaMA3-405B on device B (GBS 16), as MoFa's eq. 4 counts the
  optimizer (`optimizer_memory: mofa_eq4`).
Each check returns (name, predicted, published, unit); the tests hold them to their tolerances.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from costmodel import architecture as arch
from costmodel.configs import ConfigBatch
from costmodel.evaluate import evaluate
from costmodel.loader import load_problem
from costmodel.presets import MODELS
from costmodel.specs import TrainingSpec
from costmodel.units import GB

ROOT = Path(__file__).resolve().parents[1]
TABLE7 = [
    ("t8 p8 CPU optimizer", 64, 34.46, "bf16", dict(pp=8, vp=8, mbs=2, first_layers=15, last_layers=15, pp_overlap=1, cpu_optimizer=1)),
    ("t8 p16 CPU optimizer", 128, 21.71, "bf16", dict(pp=16, vp=8, mbs=1, first_layers=7, last_layers=7, pp_overlap=1, cpu_optimizer=1)),
    ("t8 p32 distributed optimizer", 256, 43.50, "fp32", dict(pp=32, vp=1, mbs=1, first_layers=3, last_layers=3, zero_stage=1)),
]


def korthikanti_checks() -> list[dict]:
    gpt = MODELS["gpt3-175b"]
    unfused = TrainingSpec(global_batch_size=8, seq_len=2048, attention_kernel="unfused")
    s, b, h, a, t = 2048, 1, gpt.hidden_size, gpt.num_heads, 8
    one = lambda x: np.array([float(x)])
    out = []
    for label, sp, selective, published in (
        ("activations/layer, TP (eq. 3)", False, False, s * b * h * (10 + 24 / t) + 5 * a * s * s * b / t),
        ("activations/layer, TP+SP (eq. 4)", True, False, (34 * s * b * h + 5 * a * s * s * b) / t),
        ("activations/layer, TP+SP+selective (eq. 5)", True, True, 34 * s * b * h / t),
    ):
        shard = arch.Shard(t=one(t), c=one(1), e=one(1), etp=one(1), b=one(b), seq=s, sp=sp)
        work = arch.dense_layer(gpt, unfused, shard, D=2)
        predicted = float((work.saved_without_core_attention() if selective else work.saved_bytes)[0])
        out.append({"name": f"Korthikanti GPT-175B {label}", "predicted": predicted / 1e6, "published": published / 1e6, "unit": "MB"})
    return out


def mofa_table7_checks() -> list[dict]:
    base = str(ROOT / "problems" / "mofa" / "table5_llama3_405b_64gpu.yaml")
    out = []
    for label, gpus, published, grads, cfg in TABLE7:
        problem = load_problem(base, [f"cluster.num_gpus={gpus}", "config=null", f"training.dtypes.grads={grads}", "training.optimizer_memory=mofa_eq4"])
        batch = ConfigBatch.from_columns(gpus, tp=8, tp_overlap=1, activation_offload=1, **cfg)
        peak = float(evaluate(problem, batch).memory_bytes["peak"][0]) / GB
        out.append({"name": f"MoFa Table 7 {label}", "predicted": peak, "published": published, "unit": "GB"})
    return out


def memory_checks() -> list[dict]:
    rows = korthikanti_checks() + mofa_table7_checks()
    for r in rows:
        r["error_pct"] = 100.0 * (r["predicted"] / r["published"] - 1.0)
    return rows
