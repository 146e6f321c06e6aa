"""A batch of training configurations as a struct of numpy arrays.

The exact model, the search baselines and the CP-SAT outer loop all score `ConfigBatch`es:
one row for `mofa evaluate`, millions for the exhaustive enumerator.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from costmodel.specs import FEATURES, ConfigSpec, Problem

RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODES.items()}
SPLIT_CODES = {"even": 0, "embedding_loss": 1}
SPLIT_NAMES = {v: k for k, v in SPLIT_CODES.items()}

#: integer decision variables, in the order they are printed
PARALLEL_FIELDS = ("tp", "cp", "pp", "vp", "ep", "etp", "mbs", "split", "recompute")
#: checkpoint interval in steps; 0 means "the optimum of eq. 44"
INTERVAL_FIELD = "interval"


@dataclass(frozen=True)
class ConfigBatch:
    tp: np.ndarray
    cp: np.ndarray
    pp: np.ndarray
    vp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    mbs: np.ndarray
    split: np.ndarray
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
        n = max((np.size(v) for v in columns.values()), default=1)
        defaults = {"tp": 1, "cp": 1, "pp": 1, "vp": 1, "ep": 1, "etp": 1, "mbs": 1, "split": 0, "recompute": 0, "interval": 0}
        arrays = {}
        for name in names:
            value = columns.get(name, defaults.get(name, 0))
            arr = np.broadcast_to(np.asarray(value, dtype=np.int64), (n,))
            arrays[name] = np.ascontiguousarray(arr)
        model_parallel = arrays["tp"] * arrays["cp"] * arrays["pp"]
        dp = np.where(num_gpus % model_parallel == 0, num_gpus // model_parallel, 0)
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

    def take(self, index) -> "ConfigBatch":
        return ConfigBatch(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def row(self, i: int) -> dict:
        """Human-facing dict of one configuration (names, not codes)."""
        out = {name: int(getattr(self, name)[i]) for name in ("tp", "cp", "pp", "vp", "ep", "etp", "dp", "mbs")}
        out["layer_split"] = SPLIT_NAMES[int(self.split[i])]
        out["recompute"] = RECOMPUTE_NAMES[int(self.recompute[i])]
        for name in FEATURES:
            out[name] = bool(getattr(self, name)[i])
        interval = int(self.interval[i])
        out["checkpoint_interval"] = interval if interval > 0 else "optimal"
        return out

    @staticmethod
    def concat(batches: list["ConfigBatch"]) -> "ConfigBatch":
        return ConfigBatch(**{f.name: np.concatenate([getattr(b, f.name) for b in batches]) for f in fields(ConfigBatch)})


def resolve_spec(problem: Problem, spec: ConfigSpec) -> dict[str, int]:
    """Integer codes of a ConfigSpec: etp defaults to tp, 'auto' split to the first mode the
    layer count admits, features to the problem's forced value, interval to the problem's."""
    L = problem.model.num_layers
    stages = spec.pp * spec.vp
    if spec.layer_split == "auto":
        split = "even" if L % stages == 0 or spec.pp == 1 else "embedding_loss"
    else:
        split = spec.layer_split
    row = {
        "tp": spec.tp,
        "cp": spec.cp,
        "pp": spec.pp,
        "vp": spec.vp,
        "ep": spec.ep,
        "etp": spec.etp if spec.etp is not None else (spec.tp if problem.model.moe else 1),
        "mbs": spec.mbs,
        "split": SPLIT_CODES[split],
        "recompute": RECOMPUTE_CODES[spec.recompute],
    }
    for name in FEATURES:
        row[name] = int(bool(getattr(spec, name)))
    interval = spec.checkpoint_interval
    if interval is None and problem.fault_tolerance is not None:
        interval = problem.fault_tolerance.checkpoint_interval
    row[INTERVAL_FIELD] = interval if isinstance(interval, int) else 0
    return row
