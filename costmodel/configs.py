"""A batch of training configurations as a struct of numpy arrays.

The exact model, the search baselines and the CP-SAT outer loop all score `ConfigBatch`es:
one row for `mofa evaluate`, millions for the exhaustive enumerator. Every field is a number:
names (schedules, CP variants) are codes, module sets are bit masks (see the tables below).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from costmodel.arrays import divides
from costmodel.specs import CP_COMMS, FEATURES, OFFLOAD_MODULES, PP_SCHEDULES, RECOMPUTE_MODULES, ConfigSpec, Problem

RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODES.items()}
RECOMPUTE_METHOD_CODES = {"uniform": 0, "block": 1}
RECOMPUTE_METHOD_NAMES = {v: k for k, v in RECOMPUTE_METHOD_CODES.items()}
PP_SCHEDULE_CODES = {name: i for i, name in enumerate(PP_SCHEDULES)}
CP_COMM_CODES = {name: i for i, name in enumerate(CP_COMMS)}
#: selective recompute: one bit per Megatron module
RECOMPUTE_MODULE_BITS = {name: 1 << i for i, name in enumerate(RECOMPUTE_MODULES)}
#: activation offload: 1 = MoFa's whole-layer offload (eqs. 33-35); higher bits: Megatron's
#: fine-grained offload of one module's saved inputs each
OFFLOAD_LAYER = 1
OFFLOAD_MODULE_BITS = {name: 2 << i for i, name in enumerate(OFFLOAD_MODULES)}

#: integer decision variables, in the order they are printed; first_layers / last_layers are
#: the transformer layers on the first and last pipeline rank (the rest split evenly)
PARALLEL_FIELDS = ("tp", "cp", "pp", "vp", "ep", "etp", "mbs", "first_layers", "last_layers", "pp_schedule", "pp_group", "cp_comm", "cp_a2a", "dp_shard")
#: choices that change memory (and time)
MEMORY_FIELDS = ("recompute", "recompute_method", "recompute_layers", "recompute_modules", "activation_offload", "zero_stage", "reshard_after_forward", "cpu_optimizer", "moe_chunks")
#: moe_chunks: MemFine's MACT ("auto"), resolved per configuration by the scorer
MOE_CHUNKS_AUTO = 0
#: checkpoint interval in steps; 0 means "the optimum of eq. 44"
INTERVAL_FIELD = "interval"


def mask_of(names, bits: dict[str, int]) -> int:
    return sum(bits[n] for n in set(names))


def names_of(mask: int, bits: dict[str, int]) -> list[str]:
    return [n for n, b in bits.items() if int(mask) & b]


def offload_code(setting) -> int:
    """false -> 0; true / 'layer' -> MoFa's whole-layer offload; a module list -> its bits."""
    if setting is False or setting is None:
        return 0
    if setting is True or setting == "layer":
        return OFFLOAD_LAYER
    return mask_of(setting, OFFLOAD_MODULE_BITS)


def offload_setting(code: int):
    code = int(code)
    if code == 0:
        return False
    if code == OFFLOAD_LAYER:
        return "layer"
    return names_of(code, OFFLOAD_MODULE_BITS)


def chunks_code(setting) -> int:
    """moe_chunks: a count, or 'auto' (MemFine's MACT) -> MOE_CHUNKS_AUTO."""
    return MOE_CHUNKS_AUTO if setting == "auto" else int(setting)


def chunks_setting(code):
    code = int(code)
    return "auto" if code == MOE_CHUNKS_AUTO else code


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
    pp_schedule: np.ndarray  # PP_SCHEDULE_CODES
    pp_group: np.ndarray  # flexible schedule: micro-batches per round nc; 0 = pp
    cp_comm: np.ndarray  # CP_COMM_CODES
    cp_a2a: np.ndarray  # a2a+p2p: all-to-all degree inside CP; 0 otherwise
    dp_shard: np.ndarray  # HSDP sharding-group size; 0 = the whole dp*cp group
    recompute: np.ndarray  # RECOMPUTE_CODES
    recompute_method: np.ndarray  # full: 0 uniform, 1 block
    recompute_layers: np.ndarray  # full: uniform group size / block layers per virtual stage
    recompute_modules: np.ndarray  # selective: RECOMPUTE_MODULE_BITS
    activation_offload: np.ndarray  # OFFLOAD_LAYER or OFFLOAD_MODULE_BITS
    moe_chunks: np.ndarray  # MemFine FCDA token chunks per MoE layer (1: none); MOE_CHUNKS_AUTO: MACT
    zero_stage: np.ndarray
    reshard_after_forward: np.ndarray
    cpu_optimizer: np.ndarray
    tp_overlap: np.ndarray
    cp_overlap: np.ndarray
    ep_overlap: np.ndarray
    pp_overlap: np.ndarray
    dp_overlap: np.ndarray
    interval: np.ndarray
    dp: np.ndarray  # derived: world / (tp * cp * pp), 0 where that is not an integer

    @classmethod
    def from_columns(cls, num_gpus: int, **columns) -> "ConfigBatch":
        """Build from equal-length (or scalar) columns. Missing features are off; missing
        defaults follow the frameworks: the interleaved schedule when vp > 1, parameters freed
        after the forward under ZeRO-3, one layer per checkpoint under full recompute, the
        attention core under selective recompute."""
        names = [f.name for f in fields(cls) if f.name != "dp"]
        unknown = set(columns) - set(names)
        if unknown:
            raise KeyError(f"unknown configuration fields: {sorted(unknown)}")
        lengths = {np.size(v) for v in columns.values() if np.ndim(v) > 0}
        if len(lengths) > 1:
            raise ValueError(f"configuration columns differ in length: {sorted(lengths)}")
        n = lengths.pop() if lengths else 1  # scalars alone make one configuration
        missing = {"first_layers", "last_layers"} - set(columns)
        if missing:
            raise KeyError(f"layer split not given: {sorted(missing)} (see pipeline.split_layers)")
        defaults = {"tp": 1, "cp": 1, "pp": 1, "vp": 1, "ep": 1, "etp": 1, "mbs": 1, "moe_chunks": 1}
        arrays = {}
        for name in names:
            if name in columns or name in defaults:
                value = columns.get(name, defaults.get(name))
                arrays[name] = np.ascontiguousarray(np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)))
        zeros = np.zeros(n)
        for name in names:
            arrays.setdefault(name, zeros)
        if "pp_schedule" not in columns:
            arrays["pp_schedule"] = (arrays["vp"] > 1) * float(PP_SCHEDULE_CODES["interleaved_1f1b"])
        if "reshard_after_forward" not in columns:
            arrays["reshard_after_forward"] = (arrays["zero_stage"] == 3) * 1.0
        if "recompute_layers" not in columns:
            arrays["recompute_layers"] = (arrays["recompute"] == 2) * 1.0
        if "recompute_modules" not in columns:
            arrays["recompute_modules"] = (arrays["recompute"] == 1) * float(RECOMPUTE_MODULE_BITS["core_attn"])
        model_parallel = arrays["tp"] * arrays["cp"] * arrays["pp"]
        dp = np.where(divides(model_parallel, num_gpus), np.floor(num_gpus / model_parallel), 0.0)
        return cls(dp=dp, **arrays)

    @classmethod
    def from_specs(cls, problem: Problem, specs: list[ConfigSpec]) -> "ConfigBatch":
        rows = [resolve_spec(problem, spec) for spec in specs]
        cols = {name: [row[name] for row in rows] for name in rows[0]}
        return cls.from_columns(problem.cluster.num_gpus, **cols)

    def __len__(self) -> int:
        return len(self.tp)

    def derived(self) -> "Derived":
        return Derived(self)

    def take(self, index) -> "ConfigBatch":
        return ConfigBatch(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def row(self, i: int) -> dict:
        """Human-facing dict of one configuration (names, not codes); ConfigSpec reads it back."""
        out = {name: int(getattr(self, name)[i]) for name in ("tp", "cp", "pp", "vp", "ep", "etp", "dp", "mbs")}
        out["first_stage_layers"] = int(self.first_layers[i])
        out["last_stage_layers"] = int(self.last_layers[i])
        out["pp_schedule"] = PP_SCHEDULES[int(self.pp_schedule[i])]
        out["pp_group"] = int(self.pp_group[i]) or None
        out["cp_comm"] = CP_COMMS[int(self.cp_comm[i])]
        out["cp_a2a"] = int(self.cp_a2a[i]) or None
        out["zero_stage"] = int(self.zero_stage[i])
        out["reshard_after_forward"] = bool(self.reshard_after_forward[i])
        out["dp_shard"] = int(self.dp_shard[i]) or None
        mode = RECOMPUTE_NAMES[int(self.recompute[i])]
        out["recompute"] = mode
        out["recompute_method"] = RECOMPUTE_METHOD_NAMES[int(self.recompute_method[i])]
        out["recompute_num_layers"] = int(self.recompute_layers[i]) if mode == "full" else None
        out["recompute_modules"] = names_of(self.recompute_modules[i], RECOMPUTE_MODULE_BITS) if mode == "selective" else None
        out["activation_offload"] = offload_setting(self.activation_offload[i])
        out["moe_chunks"] = chunks_setting(self.moe_chunks[i])
        for name in FEATURES:
            out[name] = bool(getattr(self, name)[i])
        interval = int(self.interval[i])
        out["checkpoint_interval"] = interval if interval > 0 else "optimal"
        return out

    def spec(self, i: int) -> ConfigSpec:
        """Configuration i as a typed ConfigSpec with every choice explicit (the layer split
        as first/last stage layers, the schedule, the interval): `from_specs` of it gives the
        same row back."""
        mode = RECOMPUTE_NAMES[int(self.recompute[i])]
        schedule = PP_SCHEDULES[int(self.pp_schedule[i])]
        cp_comm = CP_COMMS[int(self.cp_comm[i])]
        zero = int(self.zero_stage[i])
        interval = int(self.interval[i])
        return ConfigSpec(
            tp=int(self.tp[i]), cp=int(self.cp[i]), pp=int(self.pp[i]), vp=int(self.vp[i]), ep=int(self.ep[i]),
            etp=int(self.etp[i]), mbs=int(self.mbs[i]), dp=int(self.dp[i]) or None,
            first_stage_layers=int(self.first_layers[i]), last_stage_layers=int(self.last_layers[i]),
            pp_schedule=schedule, pp_group=(int(self.pp_group[i]) or None) if schedule == "flexible" else None,
            cp_comm=cp_comm, cp_a2a=(int(self.cp_a2a[i]) or None) if cp_comm == "a2a+p2p" else None,
            zero_stage=zero, reshard_after_forward=bool(self.reshard_after_forward[i]) if zero == 3 else None,
            dp_shard=int(self.dp_shard[i]) or None,
            recompute=mode,
            recompute_method=RECOMPUTE_METHOD_NAMES[int(self.recompute_method[i])] if mode == "full" else "uniform",
            recompute_num_layers=int(self.recompute_layers[i]) if mode == "full" else None,
            recompute_modules=names_of(self.recompute_modules[i], RECOMPUTE_MODULE_BITS) if mode == "selective" else None,
            activation_offload=offload_setting(self.activation_offload[i]),
            moe_chunks=chunks_setting(self.moe_chunks[i]),
            **{name: bool(getattr(self, name)[i]) for name in FEATURES},
            checkpoint_interval=interval if interval > 0 else None,
        )

    @staticmethod
    def concat(batches: list["ConfigBatch"]) -> "ConfigBatch":
        return ConfigBatch(**{f.name: np.concatenate([getattr(b, f.name) for b in batches]) for f in fields(ConfigBatch)})


class Derived:
    """Per-configuration quantities that several parts of the model need, computed once:
    feature switches as 0/1 floats, data-parallel group sizes."""

    def __init__(self, cfg: ConfigBatch):
        self.cpu = (cfg.cpu_optimizer == 1) * 1.0
        self.layer_offload = (cfg.activation_offload == OFFLOAD_LAYER) * 1.0
        self.dp_overlap = (cfg.dp_overlap == 1) * 1.0
        self.full_recompute = (cfg.recompute == 2) * 1.0
        self.block_recompute = self.full_recompute * (cfg.recompute_method == 1)
        self.interleaved = (cfg.vp > 1) * 1.0
        self.dp = np.maximum(cfg.dp, 1.0)
        self.dp_cp = cfg.cp * self.dp  # ranks that reduce one dense gradient
        self.edp = np.maximum(np.floor(cfg.tp * self.dp_cp / np.maximum(cfg.ep * cfg.etp, 1.0)), 1.0)  # ... one expert gradient
        # ZeRO: 1 shards optimizer states, 2 also gradients, 3 also parameters; over the sharding
        # group (the whole dp*cp group, or an HSDP shard group), experts over expert-DP
        self.zero = cfg.zero_stage
        self.shard_states = (cfg.zero_stage >= 1) * 1.0
        self.shard_grads = (cfg.zero_stage >= 2) * 1.0
        self.shard_params = (cfg.zero_stage == 3) * 1.0
        self.shard = np.where(cfg.dp_shard > 0, cfg.dp_shard, self.dp_cp)
        self.replicas = self.dp_cp / self.shard
        self.eshard = self.edp
        # what the batch holds at all: the model skips the arithmetic of absent features
        self.any_full_recompute = bool(self.full_recompute.any())
        self.any_block_recompute = bool(self.block_recompute.any())
        self.any_offload = bool((cfg.activation_offload != 0).any())
        self.any_zero2 = bool(self.shard_grads.any())
        self.any_zero3 = bool(self.shard_params.any())
        self.any_dualpipev = bool((cfg.pp_schedule == PP_SCHEDULE_CODES["dualpipev"]).any())
        self.any_chunks = bool((cfg.moe_chunks != 1).any())


def resolve_spec(problem: Problem, spec: ConfigSpec) -> dict[str, int]:
    """Numeric columns of a ConfigSpec: etp defaults to tp; the layer split follows
    `first_stage_layers`/`last_stage_layers` if given, else `layer_split` ('auto' picks even,
    then embedding_loss, then uneven, then layout -- the first the layer count admits; under
    DualPipeV its own split, costmodel.layout.vee_split); the schedule
    defaults to Megatron's (interleaved when vp > 1); features as given; the interval defaults
    to the fault_tolerance section's. Settings that mean the same are written one way (block
    recompute of every layer of a stage is uniform recompute of one layer; an HSDP group as large
    as dp*cp is no HSDP), so every configuration has one canonical row."""
    from costmodel.layout import SPLIT_MODES, split_layers, vee_split

    L = problem.model.num_layers
    if spec.first_stage_layers is not None or spec.last_stage_layers is not None:
        even_first, even_last = (int(x[0]) for x in split_layers(L, np.array([spec.pp]), np.array([spec.vp]), "uneven"))
        first = spec.first_stage_layers if spec.first_stage_layers is not None else even_first
        last = spec.last_stage_layers if spec.last_stage_layers is not None else even_last
    elif spec.pp_schedule == "dualpipev" and spec.layer_split in ("auto", "uneven"):
        first, last = (int(x[0]) for x in vee_split(L, np.array([spec.pp])))  # the even split where 2pp divides L
    else:
        modes = SPLIT_MODES if spec.layer_split == "auto" else (spec.layer_split,)
        first = last = 0
        for mode in modes:
            f, la = split_layers(L, np.array([spec.pp]), np.array([spec.vp]), mode)
            if f[0] > 0:
                first, last = int(f[0]), int(la[0])
                break
    schedule = spec.pp_schedule or ("interleaved_1f1b" if spec.vp > 1 else "1f1b")
    dp_cp = problem.cluster.num_gpus // max(spec.tp * spec.cp * spec.pp, 1) * spec.cp
    recompute_layers = 0
    method = "uniform"
    if spec.recompute == "full":
        method = spec.recompute_method
        middle = (L - first - last) // (spec.pp - 2) if spec.pp > 2 else (last if spec.pp == 2 else L)
        per_stage = max(middle // max(spec.vp, 1), 1)  # layers of a middle rank's virtual stage
        if method == "block" and (spec.recompute_num_layers is None or spec.recompute_num_layers >= per_stage):
            method, recompute_layers = "uniform", 1  # every layer of the stage: uniform, one per group
        else:
            recompute_layers = spec.recompute_num_layers or 1
    modules = 0
    if spec.recompute == "selective":
        modules = mask_of(spec.recompute_modules or ["core_attn"], RECOMPUTE_MODULE_BITS)
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
        "pp_schedule": PP_SCHEDULE_CODES[schedule],
        "pp_group": spec.pp_group or 0,
        "cp_comm": CP_COMM_CODES[spec.cp_comm],
        "cp_a2a": spec.cp_a2a or 0,
        "dp_shard": 0 if spec.dp_shard in (None, dp_cp) else spec.dp_shard,
        "recompute": RECOMPUTE_CODES[spec.recompute],
        "recompute_method": RECOMPUTE_METHOD_CODES[method],
        "recompute_layers": recompute_layers,
        "recompute_modules": modules,
        "activation_offload": offload_code(spec.activation_offload),
        "moe_chunks": chunks_code(spec.moe_chunks),
        "zero_stage": spec.zero_stage,
        "reshard_after_forward": int(spec.reshard_after_forward if spec.reshard_after_forward is not None else spec.zero_stage == 3),
    }
    for name in FEATURES:
        row[name] = int(bool(getattr(spec, name)))
    interval = spec.checkpoint_interval
    if interval is None and problem.fault_tolerance is not None:
        interval = problem.fault_tolerance.checkpoint_interval
    row[INTERVAL_FIELD] = interval if isinstance(interval, int) else 0
    return row


def config_label(c: dict) -> str:
    """One line naming a configuration (a ConfigBatch.row): the layout, then the choices that
    are not the default. The one labeller of the project (reports, explanations)."""
    parts = [f"tp={c['tp']}", f"cp={c['cp']}", f"pp={c['pp']}", f"vp={c['vp']}", f"dp={c['dp']}", f"ep={c['ep']}"]
    if c.get("ep", 1) > 1 or c.get("etp", 1) > 1:
        parts.append(f"etp={c['etp']}")
    parts.append(f"mbs={c['mbs']}")
    if c["pp"] > 1:  # a launch plan's heterogeneous layout replaces the first/last split
        parts.append("layers by the pipeline layout" if c.get("pipeline_layout") else f"layers first/last={c['first_stage_layers']}/{c['last_stage_layers']}")
        schedule = c["pp_schedule"] + (f"(nc={c['pp_group']})" if c.get("pp_group") else "")
        parts.append(schedule)
    if c["cp"] > 1:
        parts.append("cp " + c["cp_comm"] + (f"({c['cp_a2a']})" if c.get("cp_a2a") else ""))
    return " ".join(parts)


def features_label(c: dict) -> str:
    on = [f"ZeRO-{c['zero_stage']}" + ("" if c["zero_stage"] < 3 or c["reshard_after_forward"] else " (no reshard)")] if c.get("zero_stage") else []
    if c.get("dp_shard"):
        on.append(f"HSDP shard {c['dp_shard']}")
    for name, short in (("tp_overlap", "TPov"), ("cp_overlap", "CPov"), ("ep_overlap", "EPov"), ("pp_overlap", "PPov"), ("dp_overlap", "DPov"), ("cpu_optimizer", "CPUOpt")):
        if c.get(name):
            on.append(short)
    chunks = c.get("moe_chunks", 1)
    if chunks != 1:
        on.append(f"MoE-chunks({chunks})")
    offload = c.get("activation_offload")
    if offload:
        on.append("Offload-layer" if offload == "layer" else "Offload(" + "+".join(offload) + ")")
    mode = c.get("recompute", "none")
    if mode == "selective":
        on.append("RC-selective(" + "+".join(c.get("recompute_modules") or ["core_attn"]) + ")")
    elif mode == "full":
        n = c.get("recompute_num_layers") or 1
        on.append("RC-full" + (f"(block {n})" if c.get("recompute_method") == "block" else (f"(uniform {n})" if n > 1 else "")))
    return ",".join(on) or "-"
