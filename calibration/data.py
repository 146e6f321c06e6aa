"""Validation points: a problem plus what was measured, converted to a step time.

A file holds one point (a problem file with `measured:` and `unknown:`) or a source: one
measurement campaign as `common:` fields every row shares, `columns:` (dotted field paths) and
`rows:` (one measured run each), optional `models:` (model specs the rows name) and `skipped:`
(rows the model cannot express, each with its reason, kept so that nothing is dropped
silently). See problems/validation/README.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from costmodel.configs import ConfigBatch
from costmodel.flops import convention_flops_per_token, mfu_convention, recompute_flops_per_token
from costmodel.loader import ProblemError, _describe, build_problem, read_yaml
from costmodel.rules import config_violations
from costmodel.specs import FEATURES, ConfigSpec, FlopsConvention, Problem, Spec
from costmodel.units import TFLOP

Metric = Literal["iteration_time_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "tokens_per_s_per_gpu"]
#: the GEMM dtype of a mixed-precision run, when a source leaves it unstated: resolved like a
#: configuration field (the fastest the GPU runs, bf16 or fp8), the point's problem takes it
COMPUTE_DTYPE = "training.dtypes.compute"
#: fields a source may leave unstated: the configuration's shape, its overlap features, the GEMM dtype
UNKNOWABLE = ("mbs", "vp", "recompute", "layer_split", *FEATURES, COMPUTE_DTYPE)
#: how a run chose its number of micro-batches: `stated` (the micro-batch size is given or
#: resolved like any unknown field) or `per_pipeline_stage` (torchtitan before its 2025
#: `pipeline_parallel_microbatch_size`: `pipeline_parallel_microbatches` unset means one
#: micro-batch per pipeline stage, pp x vp, so the micro-batch size is the local batch over pp x vp)
MICROBATCH_RULES = ("stated", "per_pipeline_stage")


class Measured(Spec):
    """What a source measured, in its own metric and FLOPs convention (seed note 004: a figure
    converts to a step time through its own convention before it is compared with ours)."""

    metric: Metric
    value: float = Field(gt=0)
    definition: str = ""
    source: str
    flops_convention: FlopsConvention = Field(
        default="palm",
        description="how the source counts the FLOPs of a TFLOP/s or MFU figure (costmodel.flops.FLOPS_CONVENTIONS): palm (attention "
        "over the whole score matrix), palm_causal (its lower triangle), megatron, verl; tgs only for a tokens/s figure",
    )
    fit: bool = Field(default=True, description="false: validate only")
    reported_mfu: float | None = Field(default=None, gt=0, le=1)
    reported_hardware_tflops_per_gpu: float | None = Field(default=None, gt=0)
    peak_memory_gib: float | None = Field(
        default=None, gt=0, description="peak device memory the source reports, GiB (2^30 bytes); compared with the model's peak"
    )

    @model_validator(mode="after")
    def _convention_counts_flops(self):
        if self.flops_convention == "tgs" and self.metric in ("model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu"):
            raise ValueError(f"flops_convention tgs counts tokens, not FLOPs: a {self.metric} figure needs palm, palm_causal, megatron or verl")
        return self


@dataclass
class Point:
    name: str
    path: str
    problem: Problem
    measured: Measured
    unknown: tuple[str, ...] = field(default_factory=tuple)
    source: str = ""  # the campaign it was measured in: held out together under source cross-validation
    microbatches: str = "stated"  # MICROBATCH_RULES

    def __post_init__(self):
        self.source = self.source or self.measured.source

    @property
    def hardware(self) -> str:
        return self.problem.hardware.name

    def resolved(self, picks: dict) -> "Point":
        """The point with the problem-level fields its resolution chose (the GEMM dtype; the
        configuration's fields travel in the resolved ConfigBatch): what to evaluate it as."""
        if COMPUTE_DTYPE not in picks:
            return self
        return replace(self, problem=with_compute_dtype(self.problem, picks[COMPUTE_DTYPE]))

    def flops_per_step(self, convention: str) -> float:
        """Model FLOPs of one step in a convention (costmodel.flops; tgs counts PaLM's)."""
        tr = self.problem.training
        return tr.global_batch_size * tr.seq_len * convention_flops_per_token(self.problem.model, tr.seq_len, mfu_convention(convention))

    def mfu_of(self, step_s: float, convention: str) -> float:
        """MFU of this run at a step time, counted in `convention`."""
        p = self.problem
        return self.flops_per_step(convention) / (step_s * p.hardware.peak(p.training.dtypes.compute) * TFLOP * p.cluster.num_gpus)

    def step_time_s(self) -> float:
        """The measured metric as a step time (see problems/validation/README.md): a TFLOP/s or
        MFU figure is divided into the FLOPs of a step counted in the source's own convention
        (seed note 004), a token rate into the tokens of a step (MemFine eq. 10)."""
        p, m = self.problem, self.measured
        tr, G = p.training, p.cluster.num_gpus
        tokens = tr.global_batch_size * tr.seq_len
        model_flops = self.flops_per_step(m.flops_convention)
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
            extra = tokens * float(recompute_flops_per_token(p.model, tr.seq_len, cfg, causal=m.flops_convention == "palm_causal")[0])
            return (model_flops + extra) / (m.value * TFLOP * G)
        raise ValueError(m.metric)


def _point(data: dict, path: str, where: str = "", source: str = "") -> Point:
    """A point from a problem's data with `measured`, `unknown` and the known `config`. `where`
    prefixes the field names of errors (`rows[3].`)."""
    try:
        return _point_unprefixed(dict(data), path, source)
    except ProblemError as exc:
        if not where:
            raise
        raise ProblemError(path, where + (exc.field or "").rstrip("."), exc.message) from None


def _point_unprefixed(data: dict, path: str, source: str) -> Point:
    measured = data.pop("measured", None)
    unknown = data.pop("unknown", []) or []
    microbatches = data.pop("microbatches", "stated")
    if measured is None:
        raise ProblemError(path, "measured", "a validation point needs a measured section")
    try:
        measured = Measured.model_validate(measured)
    except ValidationError as exc:
        fld, message = _describe(exc)
        raise ProblemError(path, f"measured.{fld}" if fld else "measured", message) from None
    if not isinstance(unknown, list):
        raise ProblemError(path, "unknown", "a list of configuration fields")
    bad = [u for u in unknown if u not in UNKNOWABLE]
    if bad:
        raise ProblemError(path, "unknown", f"cannot resolve {bad} (resolvable: {', '.join(UNKNOWABLE)})")
    if microbatches not in MICROBATCH_RULES:
        raise ProblemError(path, "microbatches", f"'{microbatches}' is not a micro-batch rule ({', '.join(MICROBATCH_RULES)})")
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
    if microbatches == "per_pipeline_stage":
        _check_per_stage_microbatches(problem, unknown, path)
    if not unknown:  # fully stated: it must obey the rules now (resolved points obey them by search)
        broken = config_violations(problem, problem.config)
        if broken:
            raise ProblemError(path, f"config.{broken[0][0]}", broken[0][1])
    return Point(problem.name, path, problem, measured, tuple(unknown), source, microbatches)


def with_compute_dtype(problem: Problem, dtype: str) -> Problem:
    """The problem with its GEMM dtype set (an unknown COMPUTE_DTYPE being resolved or resolved)."""
    tr = problem.training
    return problem.model_copy(update={"training": tr.model_copy(update={"dtypes": tr.dtypes.model_copy(update={"compute": dtype})})})


def local_batch(problem: Problem) -> float:
    """Sequences one data-parallel replica takes per step (global batch over dp)."""
    c = problem.config
    dp = problem.cluster.num_gpus // (c.tp * c.cp * c.pp)
    return problem.training.global_batch_size / dp


def _check_per_stage_microbatches(problem: Problem, unknown: list, path: str) -> None:
    """Under `per_pipeline_stage` the micro-batch size follows from vp: stated with a known vp
    (and then it must be the rule's), resolved with vp when vp is unknown."""
    c = problem.config
    if "vp" in unknown:
        if "mbs" not in unknown:
            raise ProblemError(path, "unknown", "microbatches: per_pipeline_stage derives mbs from vp: an unknown vp makes mbs unknown too")
        return
    if "mbs" in unknown:
        raise ProblemError(path, "unknown", "microbatches: per_pipeline_stage derives mbs from the stated vp: state it")
    expected = local_batch(problem) / (c.pp * c.vp)
    if c.mbs != expected:
        raise ProblemError(path, "config.mbs", f"microbatches: per_pipeline_stage makes the micro-batch the local batch over pp x vp ({expected:g}), not {c.mbs}")


def load_point(path: str) -> Point:
    return _point(read_yaml(path), path)


@dataclass
class Skipped:
    """A measured row the model cannot express, and why."""
    path: str
    row: list
    reason: str


@dataclass
class Dataset:
    points: list[Point]
    skipped: list[Skipped]


def _set_path(data: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ValueError(f"{key} is not a section")
    node[keys[-1]] = value


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_source(path: str, data: dict | None = None) -> Dataset:
    """Every row of a source file as a point: `common` merged with the row's columns."""
    data = read_yaml(path) if data is None else data
    unknown_keys = set(data) - {"source", "common", "columns", "rows", "models", "skipped"}
    if unknown_keys:
        raise ProblemError(path, sorted(unknown_keys)[0], "unknown field of a source (source, common, models, columns, rows, skipped)")
    source = data.get("source")
    if not isinstance(source, str) or not source.strip():
        raise ProblemError(path, "source", "a source file names its source (the publication or repository and table)")
    common, columns, rows = data.get("common") or {}, data.get("columns"), data.get("rows")
    models = data.get("models") or {}
    if not isinstance(common, dict):
        raise ProblemError(path, "common", "a mapping of the fields every row shares")
    if not isinstance(models, dict):
        raise ProblemError(path, "models", "a mapping of model name -> model spec")
    if not isinstance(columns, list) or not columns or not all(isinstance(c, str) and c for c in columns):
        raise ProblemError(path, "columns", "a list of dotted field paths (name, model, config.tp, measured.value, ...)")
    if "name" not in columns:
        raise ProblemError(path, "columns", "a column 'name' names each row's point")
    if not isinstance(rows, list) or not rows:
        raise ProblemError(path, "rows", "a list of rows, one value per column")
    points = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(columns):
            raise ProblemError(path, f"rows[{i}]", f"a row needs {len(columns)} values ({', '.join(columns)})")
        point_data = _merge(common, {})
        try:
            for column, value in zip(columns, row):
                _set_path(point_data, column, value)
        except ValueError as exc:
            raise ProblemError(path, f"rows[{i}]", str(exc)) from None
        model = point_data.get("model")
        if isinstance(model, str) and model in models:
            point_data["model"] = {"name": model, **models[model]} if "preset" not in models[model] else dict(models[model])
        points.append(_point(point_data, path, f"rows[{i}].", source.strip()))
    skipped = []
    for i, item in enumerate(data.get("skipped") or []):
        if not isinstance(item, dict) or set(item) != {"row", "reason"}:
            raise ProblemError(path, f"skipped[{i}]", "each skipped row is {row: [...], reason: why the model cannot express it}")
        skipped.append(Skipped(path, item["row"], str(item["reason"])))
    return Dataset(points, skipped)


def expand_paths(paths: list[str]) -> list[str]:
    """Files as given; a folder stands for its *.yaml files, sorted."""
    out = []
    for p in paths:
        if Path(p).is_dir():
            out += sorted(str(f) for f in Path(p).glob("*.yaml"))
        else:
            out.append(p)
    return out


def load_dataset(paths: list[str]) -> Dataset:
    points, skipped = [], []
    for path in expand_paths(paths):
        data = read_yaml(path)
        if isinstance(data, dict) and "rows" in data:
            ds = load_source(path, data)
            points += ds.points
            skipped += ds.skipped
        else:
            points.append(_point(data, path))
    seen = {}
    for p in points:
        if p.name in seen:
            raise ProblemError(p.path, "name", f"point '{p.name}' is also defined in {seen[p.name]}")
        seen[p.name] = p.path
    return Dataset(points, skipped)


def load_points(paths: list[str]) -> list[Point]:
    return load_dataset(paths).points
