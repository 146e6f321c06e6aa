"""Validation points: a problem file plus what was measured, converted to a step time."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from costmodel.configs import ConfigBatch
from costmodel.flops import model_flops_per_token, recompute_flops_per_token
from costmodel.loader import ProblemError, _describe, build_problem, read_yaml
from costmodel.rules import config_violations
from costmodel.specs import ConfigSpec, Problem, Spec
from costmodel.units import TFLOP

Metric = Literal["iteration_time_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "tokens_per_s_per_gpu"]
#: configuration fields a source may leave unstated
UNKNOWABLE = ("mbs", "vp", "recompute", "layer_split")


class Measured(Spec):
    metric: Metric
    value: float = Field(gt=0)
    definition: str = ""
    source: str
    flops_convention: Literal["palm", "causal"] = Field(default="palm", description="attention FLOPs over the full score matrix or its lower triangle")
    fit: bool = Field(default=True, description="false: validate only")
    reported_mfu: float | None = Field(default=None, gt=0, le=1)
    reported_hardware_tflops_per_gpu: float | None = Field(default=None, gt=0)


@dataclass
class Point:
    name: str
    path: str
    problem: Problem
    measured: Measured
    unknown: tuple[str, ...] = field(default_factory=tuple)

    @property
    def hardware(self) -> str:
        return self.problem.hardware.name

    def step_time_s(self) -> float:
        """The measured metric as a step time (see problems/validation/README.md)."""
        p, m = self.problem, self.measured
        tr, G = p.training, p.cluster.num_gpus
        tokens = tr.global_batch_size * tr.seq_len
        causal = m.flops_convention == "causal"
        model_flops = tokens * model_flops_per_token(p.model, tr.seq_len, causal)
        if m.metric == "iteration_time_s":
            return m.value
        if m.metric == "model_tflops_per_gpu":
            return model_flops / (m.value * TFLOP * G)
        if m.metric == "mfu":
            return model_flops / (m.value * p.hardware.peak(tr.dtypes.compute) * TFLOP * G)
        if m.metric == "tokens_per_s_per_gpu":
            return tokens / (m.value * G)
        if m.metric == "hardware_tflops_per_gpu":
            cfg = ConfigBatch.from_specs(p, [p.config or ConfigSpec()])
            extra = tokens * float(recompute_flops_per_token(p.model, tr.seq_len, cfg)[0])
            return (model_flops + extra) / (m.value * TFLOP * G)
        raise ValueError(m.metric)


def load_point(path: str) -> Point:
    data = read_yaml(path)
    measured = data.pop("measured", None)
    unknown = data.pop("unknown", []) or []
    if measured is None:
        raise ProblemError(path, "measured", "a validation point needs a measured section")
    try:
        measured = Measured.model_validate(measured)
    except ValidationError as exc:
        fld, message = _describe(exc)
        raise ProblemError(path, f"measured.{fld}" if fld else "measured", message) from None
    bad = [u for u in unknown if u not in UNKNOWABLE]
    if bad:
        raise ProblemError(path, "unknown", f"cannot resolve {bad} (resolvable: {', '.join(UNKNOWABLE)})")
    data.setdefault("name", Path(path).stem)
    config = data.pop("config", None)
    if config is None:
        raise ProblemError(path, "config", "a validation point needs the known configuration")
    problem = build_problem(data, path)
    try:
        # with unknown fields the rules are checked by the search that resolves them
        problem = problem.model_copy(update={"config": ConfigSpec.model_validate(config)})
    except ValidationError as exc:
        fld, message = _describe(exc)
        raise ProblemError(path, f"config.{fld}" if fld else "config", message) from None
    if not unknown:  # fully stated: it must obey the rules now (resolved points obey them by search)
        broken = config_violations(problem, problem.config)
        if broken:
            raise ProblemError(path, f"config.{broken[0][0]}", broken[0][1])
    return Point(problem.name, path, problem, measured, tuple(unknown))


def load_points(paths: list[str]) -> list[Point]:
    return [load_point(p) for p in paths]
