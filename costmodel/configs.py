"""A batch of training configurations as a struct of numpy arrays.

The exact model, the search baselines and the CP-SAT outer loop all score `ConfigBatch`es:
one row for `mofa evaluate`, millions for the exhaustive enumerator.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from costmodel.arrays import divides
from costmodel.specs import FEATURES, ConfigSpec, Problem

RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODES.items()}

#: integer decision variables, in the order they are printed; first_layers / last_layers are
#: the transformer layers on the first and last pipeline rank (the rest split evenly)
PARALLEL_FIELDS = ("tp", "cp", "pp", "vp", "ep", "etp", "mbs", "first_layers", "last_layers", "recompute")
#: checkpoint interval in steps; 0 means "the optimum of eq. 44"
INTERVAL_FIELD = "interval"


@dataclass(frozen=True)
class ConfigBatch:
    """Columns are float64 (exact for these integers) so that the model's arithmetic never
    converts between integer and float arrays, which costs more than the arithmetic."""

    tp: np.ndarray
    cp: np.ndarray
    pp: np.ndarray
    vp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    mbs: np.ndarray
    first_layers: np.ndarray
    last_layers: np.ndarray
    recompute: np.ndarray
    tp_overlap: np.ndarray
    cp_overlap: np.ndarray
    ep_overlap: np.ndarray
    pp_overlap: np.ndarray
    dp_overlap: np.ndarray
    distributed_optimizer: np.ndarray
    cpu_optimizer: np.ndarray
    activation_offload: np.ndarray
    interval: np.ndarray
    dp: np.ndarray  # derived: world / (tp * cp * pp), 0 where that is not an integer

    @classmethod
    def from_columns(cls, num_gpus: int, **columns) -> "ConfigBatch":
        """Build from equal-length (or scalar) columns; missing features default to off."""
        names = [f.name for f in fields(cls) if f.name != "dp"]
        unknown = set(columns) - set(names)
        if unknown:
            raise KeyError(f"unknown configuration fields: {sorted(unknown)}")
        lengths = {np.size(v) for v in columns.values() if np.ndim(v) > 0}
        if len(lengths) > 1:
            raise ValueError(f"configuration columns differ in length: {sorted(lengths)}")
        n = lengths.pop() if lengths else 1  # scalars alone make one configuration
        defaults = {"tp": 1, "cp": 1, "pp": 1, "vp": 1, "ep": 1, "etp": 1, "mbs": 1, "recompute": 0, "interval": 0}
        missing = {"first_layers", "last_layers"} - set(columns)
        if missing:
            raise KeyError(f"layer split not given: {sorted(missing)} (see pipeline.split_layers)")
        arrays = {}
        for name in names:
            value = columns.get(name, defaults.get(name, 0))
            arr = np.broadcast_to(np.asarray(value, dtype=np.float64), (n,))
            arrays[name] = np.ascontiguousarray(arr)
        model_parallel = arrays["tp"] * arrays["cp"] * arrays["pp"]
        dp = np.where(divides(model_parallel, num_gpus), np.floor(num_gpus / model_parallel), 0.0)
        return cls(dp=dp, **arrays)

    @classmethod
    def from_specs(cls, problem: Problem, specs: list[ConfigSpec]) -> "ConfigBatch":
        cols: dict[str, list[int]] = {name: [] for name in (*PARALLEL_FIELDS, *FEATURES, INTERVAL_FIELD)}
        for spec in specs:
            row = resolve_spec(problem, spec)
            for name, value in row.items():
                cols[name].append(value)
        return cls.from_columns(problem.cluster.num_gpus, **cols)

    def __len__(self) -> int:
        return len(self.tp)

    def derived(self) -> "Derived":
        return Derived(self)

    def take(self, index) -> "ConfigBatch":
        return ConfigBatch(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def row(self, i: int) -> dict:
        """Human-facing dict of one configuration (names, not codes)."""
        out = {name: int(getattr(self, name)[i]) for name in ("tp", "cp", "pp", "vp", "ep", "etp", "dp", "mbs")}
        out["first_stage_layers"] = int(self.first_layers[i])
        out["last_stage_layers"] = int(self.last_layers[i])
        out["recompute"] = RECOMPUTE_NAMES[int(self.recompute[i])]
        for name in FEATURES:
            out[name] = bool(getattr(self, name)[i])
        interval = int(self.interval[i])
        out["checkpoint_interval"] = interval if interval > 0 else "optimal"
        return out

    @staticmethod
    def concat(batches: list["ConfigBatch"]) -> "ConfigBatch":
        return ConfigBatch(**{f.name: np.concatenate([getattr(b, f.name) for b in batches]) for f in fields(ConfigBatch)})


class Derived:
    """Per-configuration quantities that several parts of the model need, computed once:
    feature switches as 0/1 floats, data-parallel group sizes."""

    def __init__(self, cfg: ConfigBatch):
        self.dist = (cfg.distributed_optimizer == 1) * 1.0
        self.cpu = (cfg.cpu_optimizer == 1) * 1.0
        self.offload = (cfg.activation_offload == 1) * 1.0
        self.dp_overlap = (cfg.dp_overlap == 1) * 1.0
        self.full_recompute = (cfg.recompute == 2) * 1.0
        self.interleaved = (cfg.vp > 1) * 1.0
        self.dp = np.maximum(cfg.dp, 1.0)
        self.dp_cp = cfg.cp * self.dp  # ranks that reduce one dense gradient
        self.edp = np.maximum(np.floor(cfg.tp * self.dp_cp / np.maximum(cfg.ep * cfg.etp, 1.0)), 1.0)  # ... one expert gradient


def resolve_spec(problem: Problem, spec: ConfigSpec) -> dict[str, int]:
    """Integer codes of a ConfigSpec: etp defaults to tp; the layer split follows
    `first_stage_layers`/`last_stage_layers` if given, else `layer_split` ('auto' picks even,
    then embedding_loss, then uneven -- the first the layer count admits); features as given;
    the interval defaults to the fault_tolerance section's."""
    from costmodel.pipeline import SPLIT_MODES, split_layers  # here: pipeline imports ConfigBatch

    L = problem.model.num_layers
    if spec.first_stage_layers is not None or spec.last_stage_layers is not None:
        even_first, even_last = (int(x[0]) for x in split_layers(L, np.array([spec.pp]), np.array([spec.vp]), "uneven"))
        first = spec.first_stage_layers if spec.first_stage_layers is not None else even_first
        last = spec.last_stage_layers if spec.last_stage_layers is not None else even_last
    else:
        modes = SPLIT_MODES if spec.layer_split == "auto" else (spec.layer_split,)
        first = last = 0
        for mode in modes:
            f, la = split_layers(L, np.array([spec.pp]), np.array([spec.vp]), mode)
            if f[0] > 0:
                first, last = int(f[0]), int(la[0])
                break
    row = {
        "tp": spec.tp,
        "cp": spec.cp,
        "pp": spec.pp,
        "vp": spec.vp,
        "ep": spec.ep,
        "etp": spec.etp if spec.etp is not None else (spec.tp if problem.model.moe else 1),
        "mbs": spec.mbs,
        "first_layers": first,
        "last_layers": last,
        "recompute": RECOMPUTE_CODES[spec.recompute],
    }
    for name in FEATURES:
        row[name] = int(bool(getattr(spec, name)))
    interval = spec.checkpoint_interval
    if interval is None and problem.fault_tolerance is not None:
        interval = problem.fault_tolerance.checkpoint_interval
    row[INTERVAL_FIELD] = interval if isinstance(interval, int) else 0
    return row
