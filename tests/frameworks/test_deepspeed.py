"""DeepSpeed 0.19.8's own DeepSpeedConfig reads every DeepSpeed JSON exported from the shipped
results (pydantic ZeRO section, batch arithmetic against the data-parallel size, bf16/fp16),
with a stand-in model-parallel unit that gives the data-parallel size (without a process group
DeepSpeed would assume a world of 1). DeepSpeed ignores unknown top-level keys, so the key
names are checked against its own constants and ZeRO model here."""

import json

import pytest

from shipped_exports import accepted, exports, infeasible, need

need("deepspeed")
from deepspeed.runtime import constants  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig  # noqa: E402

#: our own section for the training loop (DeepSpeed has no key for the length or the checkpoint interval)
OWN = {"mofa"}
#: top-level keys DeepSpeed 0.19.8 reads: its constants module's names, plus the sections parsed elsewhere
KNOWN = {v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str)} | {"zero_optimization", "bf16", "fp16", "data_types", "pipeline", "activation_checkpointing"}


@pytest.fixture(autouse=True)
def rank0(monkeypatch):
    """DeepSpeedConfig asks deepspeed.comm for this process's rank before it reads the mpu;
    without a process group that raises and it falls back to a world of 1. Rank 0 of the run."""
    import deepspeed.runtime.config as ds_config
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)


class DataParallelUnit:
    """The part of an mpu DeepSpeedConfig asks for: the data-parallel world size."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self):
        return self.dp

    def get_data_parallel_rank(self):
        return 0


def check(config: dict, dp: int) -> DeepSpeedConfig:
    unknown = set(config) - KNOWN - OWN
    assert not unknown, f"keys DeepSpeed would ignore: {sorted(unknown)}"
    zero = config.get("zero_optimization", {})
    fields = set(DeepSpeedZeroConfig.model_fields) | {f.alias for f in DeepSpeedZeroConfig.model_fields.values() if f.alias}
    assert not set(zero) - fields, f"zero_optimization keys DeepSpeed would ignore: {sorted(set(zero) - fields)}"
    return DeepSpeedConfig(config, mpu=DataParallelUnit(dp))


def test_deepspeed_accepts_every_exported_config():
    files = accepted("deepspeed")
    assert files, "no shipped result exported to DeepSpeed"
    for e in files:
        config = json.loads(e.text)
        ds = check(config, e.plan.dp)
        assert ds.world_size == e.plan.dp, e.name
        assert (ds.train_batch_size, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) == (
            e.plan.global_batch_size, e.plan.micro_batch_size, e.plan.microbatches), e.name
        assert ds.zero_optimization_stage == e.plan.zero_stage, e.name
        assert ds.bfloat16_config.enabled == (e.plan.dtypes.params == "bf16"), e.name
    print(f"DeepSpeed accepted {len(files)} configs of {sorted({e.problem for e in files})}; infeasible: {infeasible()}")


def test_deepspeed_rejects_broken_configs():
    e = accepted("deepspeed")[0]
    config = json.loads(e.text)
    with pytest.raises(AssertionError):  # a data-parallel size the batch does not fit
        DeepSpeedConfig(config, mpu=DataParallelUnit(e.plan.dp * 2))
    with pytest.raises(Exception):  # no ZeRO stage 4
        DeepSpeedConfig({**config, "zero_optimization": {**config["zero_optimization"], "stage": 4}}, mpu=DataParallelUnit(e.plan.dp))
    with pytest.raises(AssertionError):  # bf16 and fp16 together
        DeepSpeedConfig({**config, "bf16": {"enabled": True}, "fp16": {"enabled": True}}, mpu=DataParallelUnit(e.plan.dp))
    with pytest.raises(AssertionError, match="ignore"):  # a misspelt section DeepSpeed itself would ignore
        check({**{k: v for k, v in config.items() if k != "zero_optimization"}, "zero_optimisation": config["zero_optimization"]}, e.plan.dp)


def test_deepspeed_refusals_say_why():
    refused = [e for e in exports("deepspeed") if e.refused]
    assert refused and all(e.refused.startswith("DeepSpeed cannot run this plan: ") for e in refused)
    assert any("tensor parallelism" in e.refused for e in refused)
