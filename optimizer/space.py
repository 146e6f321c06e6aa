"""The search space of a problem: candidate values per decision variable, and its enumeration.

A configuration is a *skeleton* (tp, cp, pp, vp, ep, etp, mbs and the layer split) plus a
*feature choice* (recompute mode and the eight feature switches). The skeleton rules of
costmodel.rules (divisibility, world size, micro-batch counts, layer layout, expert grid) are
applied when skeletons are generated; the feature rules (overlap needs TP>1, offload excludes
recompute, forced features, ...) when skeletons and features are combined.

All three search methods (exhaustive, DFS, CP-SAT) read the same space, so they agree on what
is admissible.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields
from functools import cached_property

import numpy as np

from costmodel.configs import RECOMPUTE_CODES, ConfigBatch
from costmodel.pipeline import SPLIT_MODES, split_layers
from costmodel.rules import violations
from costmodel.specs import FEATURES, Problem

SKELETON_FIELDS = ("tp", "cp", "pp", "vp", "ep", "etp", "mbs", "first_layers", "last_layers")
FEATURE_FIELDS = ("recompute", *FEATURES)
SKELETON_RULES = (
    "world_size",
    "tp_divides_heads",
    "tp_kv_heads",
    "tp_in_domain",
    "cp_divides_seq",
    "layers_split",
    "vp_needs_pp",
    "gbs_divisible",
    "microbatches_ge_pp",
    "microbatches_interleave",
    "ep_divides_experts",
    "expert_grid",
    "etp_valid",
    "moe_needs_sequence_parallel",
)
FEATURE_RULES = (
    "tp_overlap_needs_tp",
    "cp_overlap_needs_cp",
    "ep_overlap_needs_ep",
    "pp_overlap_needs_vp",
    "dp_overlap_needs_dp",
    "distributed_optimizer_needs_dp",
    "offload_excludes_recompute",
    "feature_forced",
    "recompute_allowed",
    "vp_needs_pp",
)

#: the rules that constrain each switch a search may leave open (decide later, exactly)
SWITCH_RULES = {
    "tp_overlap": ("tp_overlap_needs_tp",),
    "cp_overlap": ("cp_overlap_needs_cp",),
    "ep_overlap": ("ep_overlap_needs_ep",),
    "pp_overlap": ("pp_overlap_needs_vp", "vp_needs_pp"),
    "dp_overlap": ("dp_overlap_needs_dp",),
}

#: features that change memory, and the overlap switches that change only time
MEMORY_FEATURES = ("recompute", "activation_offload", "distributed_optimizer", "cpu_optimizer")
PURE_TIME_FEATURES = ("tp_overlap", "cp_overlap", "ep_overlap", "pp_overlap", "dp_overlap")

DEFAULT_MBS = (1, 2, 4, 8)
MAX_VP = 32
MIN_TOKENS_PER_CP_RANK = 1024


def _powers_of_two(limit: int) -> list[int]:
    out, x = [], 1
    while x <= limit:
        out.append(x)
        x *= 2
    return out


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


@dataclass(frozen=True)
class SearchSpace:
    problem: Problem
    tp: tuple[int, ...]
    cp: tuple[int, ...]
    pp: tuple[int, ...]
    vp: tuple[int, ...]
    ep: tuple[int, ...]
    etp: tuple[int, ...] | None  # None: {1, tp}
    mbs: tuple[int, ...]
    split_modes: tuple[str, ...]
    recompute: tuple[int, ...]
    flags: dict[str, tuple[int, ...]] = field(hash=False)

    @classmethod
    def from_problem(cls, problem: Problem) -> "SearchSpace":
        s, m, cl, tr, f = problem.search, problem.model, problem.cluster, problem.training, problem.features
        G = cl.num_gpus
        domain = cl.supernode if s.tp_domain == "supernode" else cl.gpus_per_node
        tp = s.tp or [t for t in _powers_of_two(domain) if m.num_heads % t == 0 and G % t == 0]
        cp = s.cp or [c for c in _powers_of_two(64) if tr.seq_len % (2 * c) == 0 and tr.seq_len // c >= MIN_TOKENS_PER_CP_RANK and G % c == 0] or [1]
        pp = s.pp or _divisors(G, m.num_layers)
        vp = s.vp or list(range(1, min(MAX_VP, m.num_layers) + 1))
        ep = s.ep or (_divisors(m.moe.num_experts, G) if m.moe else [1])
        mbs = s.mbs or [b for b in DEFAULT_MBS if tr.global_batch_size % b == 0] or [1]
        flags = {}
        for name in FEATURES:
            mode = getattr(f, name)
            flags[name] = (1,) if mode == "on" else (0,) if mode == "off" else (0, 1)
        return cls(
            problem=problem,
            tp=tuple(tp),
            cp=tuple(cp),
            pp=tuple(pp),
            vp=tuple(vp),
            ep=tuple(ep),
            etp=tuple(s.etp) if s.etp else None,
            mbs=tuple(mbs),
            split_modes=tuple(m for m in SPLIT_MODES if m in s.layer_split),
            recompute=tuple(RECOMPUTE_CODES[r] for r in f.recompute),
            flags=flags,
        )

    # ----------------------------------------------------------------------------------
    @cached_property
    def skeletons(self) -> ConfigBatch:
        """Every admissible skeleton (features off), in a canonical order."""
        m = self.problem.model
        G = self.problem.cluster.num_gpus
        grid = np.array([(t, c, p, v, e, etp, b) for t in self.tp for etp in self.etp_options(t)
                         for c, p, v, e, b in itertools.product(self.cp, self.pp, self.vp, self.ep, self.mbs)], dtype=float)
        if grid.size == 0:
            return ConfigBatch.from_columns(G, **{k: np.zeros(0) for k in SKELETON_FIELDS})
        t, c, p, v, e, etp, mbs = grid.T
        # cheap rules first: they cut the grid before splits multiply it
        keep = (np.mod(G, t * c * p) == 0) & ((v == 1) | (p > 1)) & (v * p <= m.num_layers + 2)
        t, c, p, v, e, etp, mbs = (a[keep] for a in (t, c, p, v, e, etp, mbs))
        parts = []
        for mode in self.split_modes:
            first, last = split_layers(m.num_layers, p, v, mode)
            ok = first > 0
            parts.append((t[ok], c[ok], p[ok], v[ok], e[ok], etp[ok], mbs[ok], first[ok], last[ok]))
        if not parts:
            return ConfigBatch.from_columns(G, **{k: np.zeros(0) for k in SKELETON_FIELDS})
        stacked = np.unique(np.concatenate([np.stack(pt, axis=1) for pt in parts]), axis=0)  # canonical order, no duplicates
        cols = dict(zip(SKELETON_FIELDS, stacked.T))
        batch = ConfigBatch.from_columns(G, **cols, pp_overlap=1 if 1 in self.flags["pp_overlap"] else 0)
        bad = violations(self.problem, batch)
        ok = np.ones(len(batch), bool)
        for rule in SKELETON_RULES:
            ok &= ~bad[rule]
        cols = {name: getattr(batch, name)[ok] for name in SKELETON_FIELDS}
        return ConfigBatch.from_columns(G, **cols)

    @cached_property
    def features(self) -> dict[str, np.ndarray]:
        """Every feature choice (recompute x switches), as columns."""
        names = FEATURE_FIELDS
        options = [self.recompute] + [self.flags[n] for n in FEATURES]
        rows = np.array(list(itertools.product(*options)), dtype=float)
        return {name: rows[:, i] for i, name in enumerate(names)}

    @cached_property
    def memory_choices(self) -> np.ndarray:
        """Every allowed combination of MEMORY_FEATURES, one row each, without the ones
        offload_excludes_recompute always rejects (the rules still run on every result)."""
        options = [self.recompute] + [self.flags[n] for n in MEMORY_FEATURES[1:]]
        rows = [c for c in itertools.product(*options) if not (c[1] == 1 and c[0] != 0)]
        return np.array(rows, dtype=float).reshape(-1, len(MEMORY_FEATURES))

    @property
    def num_features(self) -> int:
        return len(self.features["recompute"])

    @property
    def size(self) -> int:
        """Configurations the exhaustive enumerator scores (before the feature rules)."""
        return len(self.skeletons) * self.num_features

    def combine(self, skeleton_index: np.ndarray, feature_index: np.ndarray, interval: int = 0) -> ConfigBatch:
        """Configurations pairing skeleton_index[i] with feature_index[i]."""
        sk = self.skeletons
        cols = {name: getattr(sk, name)[skeleton_index] for name in SKELETON_FIELDS}
        for name, column in self.features.items():
            cols[name] = column[feature_index]
        cols["interval"] = interval
        return ConfigBatch.from_columns(self.problem.cluster.num_gpus, **cols)

    def batches(self, chunk: int = 65536, interval: int = 0):
        """Skeleton x feature products in chunks of about `chunk` configurations, in canonical
        order (skeleton-major)."""
        F = self.num_features
        per = max(1, chunk // max(F, 1))
        for start in range(0, len(self.skeletons), per):
            sk = np.arange(start, min(start + per, len(self.skeletons)))
            yield self.combine(np.repeat(sk, F), np.tile(np.arange(F), len(sk)), interval)

    def feature_ok(self, cfg: ConfigBatch) -> np.ndarray:
        bad = violations(self.problem, cfg)
        ok = np.ones(len(cfg), bool)
        for rule in FEATURE_RULES:
            ok &= ~bad[rule]
        return ok

    def viable(self, cfg: ConfigBatch, open_switches: tuple[str, ...]) -> np.ndarray:
        """True where every rule holds for some allowed value of each switch in
        `open_switches` (their values in `cfg` are ignored) and for the fixed fields."""
        G = self.problem.cluster.num_gpus
        base = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "dp"}
        for name in open_switches:
            base[name] = self.flags[name][0]
        skip = {rule for name in open_switches for rule in SWITCH_RULES[name]}
        bad = violations(self.problem, ConfigBatch.from_columns(G, **base))
        ok = np.ones(len(cfg), bool)
        for rule, mask in bad.items():
            if rule not in skip:
                ok &= ~mask
        for name in open_switches:
            any_value = np.zeros(len(cfg), bool)
            for value in self.flags[name]:
                trial = violations(self.problem, ConfigBatch.from_columns(G, **{**base, name: value}))
                holds = np.ones(len(cfg), bool)
                for rule in SWITCH_RULES[name]:
                    holds &= ~trial[rule]
                any_value |= holds
            ok &= any_value
        return ok

    def etp_options(self, tp: int) -> tuple[int, ...]:
        """Expert-TP sizes for a TP size: the search section's, else none or TP (Megatron's
        default ETP = TP; torchtitan's rule ETP in {1, TP})."""
        if not self.problem.model.moe:
            return (1,)
        return tuple(self.etp) if self.etp else tuple(sorted({1, tp}))

    def interval(self) -> int:
        """Fixed checkpoint interval if the problem fixes one, else 0 (eq. 44 per configuration)."""
        ft = self.problem.fault_tolerance
        return ft.checkpoint_interval if ft is not None and isinstance(ft.checkpoint_interval, int) else 0
