"""The search space of a problem: candidate values per decision variable, and its enumeration.

A configuration is a *skeleton* (tp, cp, pp, vp, ep, etp, mbs, the layer split, the pipeline
schedule and its round size, the context-parallel variant, the HSDP sharding group) plus a
*feature choice*: a *memory choice* (recompute mode with its method, layers or modules;
activation offload; ZeRO stage and resharding; CPU optimizer; MemFine's MoE chunks) and the five
overlap switches,
which change only time. The skeleton rules of costmodel.rules (divisibility, world size,
micro-batch counts, layer layout, schedules, CP variants, expert grid) are applied when
skeletons are generated; the feature rules (overlap needs TP>1, offload excludes recompute,
forced features, ...) when skeletons and features are combined.

All three search methods (exhaustive, DFS, CP-SAT) read the same space, so they agree on what
is admissible.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields
from functools import cached_property

import numpy as np

from costmodel.configs import (
    CP_COMM_CODES,
    MEMORY_FIELDS,
    PP_SCHEDULE_CODES,
    RECOMPUTE_CODES,
    RECOMPUTE_MODULE_BITS,
    ConfigBatch,
    chunks_code,
    mask_of,
    offload_code,
)
from costmodel.frameworks import FRAMEWORK_RULES, rule_key, rule_of
from costmodel.layout import SPLIT_MODES, split_layers, vee_split
from costmodel.rules import op_sac_modelled, tp_domain, violations
from costmodel.specs import FEATURES, Problem

SKELETON_FIELDS = ("tp", "cp", "pp", "vp", "ep", "etp", "mbs", "first_layers", "last_layers", "pp_schedule", "pp_group", "cp_comm", "cp_a2a", "dp_shard")
#: choices that change memory (one CP-SAT row each with a skeleton), and the switches that change only time
MEMORY_FEATURES = MEMORY_FIELDS
PURE_TIME_FEATURES = ("tp_overlap", "cp_overlap", "ep_overlap", "pp_overlap", "dp_overlap")
FEATURE_FIELDS = MEMORY_FEATURES + PURE_TIME_FEATURES
SKELETON_RULES = (
    "world_size",
    "tp_divides_heads",
    "tp_kv_heads",
    "tp_in_domain",
    "cp_divides_seq",
    "cp_comm_needs_cp",
    "cp_linear_attention",
    "cp_a2a_heads",
    "cp_a2a_degree",
    "layers_split",
    "vp_needs_pp",
    "schedule_needs_pp",
    "schedule_vp",
    "pp_group",
    "dualpipev_layout",
    "gbs_divisible",
    "microbatches_ge_pp",
    "microbatches_interleave",
    "microbatches_dualpipev",
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
    "zero_needs_dp",
    "reshard_needs_zero3",
    "dp_shard_valid",
    "recompute_method",
    "recompute_modules",
    "recompute_ops",
    "offload_excludes_recompute",
    "offload_attn_proj_alone",
    "moe_chunks_needs_moe",
    "feature_forced",
    "recompute_allowed",
    "zero_allowed",
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

DEFAULT_MBS = (1, 2, 4, 8)
MAX_VP = 32
MIN_TOKENS_PER_CP_RANK = 1024


def _modules_exist(modules, problem: Problem) -> bool:
    """Recompute modules the model has (the rule recompute_modules says the same per row)."""
    m = problem.model
    if m.moe is None and {"moe_act", "moe", "shared_experts"} & set(modules):
        return False
    if m.moe is not None and not m.moe.num_shared_experts and "shared_experts" in modules:
        return False
    if "ops" in modules and not op_sac_modelled(problem):
        return False  # torchtitan's per-op policy where it is modelled (rule recompute_ops)
    return m.mla is not None or "mla_up_proj" not in modules


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
        tp = s.tp or [t for t in _powers_of_two(tp_domain(problem)) if m.num_heads % t == 0 and G % t == 0]
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
        empty = ConfigBatch.from_columns(G, **{k: np.zeros(0) for k in SKELETON_FIELDS})
        grid = np.array([(t, c, p, v, e, etp, b) for t in self.tp for etp in self.etp_options(t)
                         for c, p, v, e, b in itertools.product(self.cp, self.pp, self.vp, self.ep, self.mbs)], dtype=float)
        if grid.size == 0:
            return empty
        t, c, p, v, e, etp, mbs = grid.T
        # cheap rules first: they cut the grid before splits and variants multiply it
        keep = (np.mod(G, t * c * p) == 0) & ((v == 1) | (p > 1)) & (v * p <= m.num_layers + 2)
        t, c, p, v, e, etp, mbs = (a[keep] for a in (t, c, p, v, e, etp, mbs))
        parts = []
        for mode in self.split_modes:
            first, last = split_layers(m.num_layers, p, v, mode)
            ok = first > 0
            parts.append((t[ok], c[ok], p[ok], v[ok], e[ok], etp[ok], mbs[ok], first[ok], last[ok]))
        if "dualpipev" in self.problem.search.pp_schedule:
            # DualPipeV's own split (costmodel.layout.vee_split): the even one where 2pp divides
            # L, else an uneven first rank (the schedules attached below and the rules pair it
            # with DualPipeV only)
            first, last = vee_split(m.num_layers, p)
            even = (first == last) & (p * first == m.num_layers)
            ok = (v == 2) & (first > 0) & np.where(even, "even" in self.split_modes, "uneven" in self.split_modes)
            parts.append((t[ok], c[ok], p[ok], v[ok], e[ok], etp[ok], mbs[ok], first[ok], last[ok]))
        if not parts:
            return empty
        base = np.unique(np.concatenate([np.stack(pt, axis=1) for pt in parts]), axis=0)
        rows = self.skeleton_variants(base)
        stacked = np.unique(rows, axis=0)  # canonical order, no duplicates
        cols = dict(zip(SKELETON_FIELDS, stacked.T))
        batch = ConfigBatch.from_columns(G, **cols, pp_overlap=1 if 1 in self.flags["pp_overlap"] else 0)
        bad = violations(self.problem, batch)
        ok = np.ones(len(batch), bool)
        for rule in self.skeleton_rules:
            ok &= ~bad[rule]
        cols = {name: getattr(batch, name)[ok] for name in SKELETON_FIELDS}
        return ConfigBatch.from_columns(G, **cols)

    def skeleton_variants(self, base: np.ndarray) -> np.ndarray:
        """Each (tp, cp, pp, vp, ep, etp, mbs, first, last) row with the schedules its pp and vp
        admit, the CP variants its cp admits and the HSDP groups of the search section."""
        s = self.problem.search
        p, v, c = base[:, 2], base[:, 3], base[:, 1]
        schedules = []  # (code, nc, applies)
        for name in s.pp_schedule:
            code = PP_SCHEDULE_CODES[name]
            if name == "1f1b":
                schedules.append((code, 0.0, v == 1))
            elif name == "interleaved_1f1b":
                schedules.append((code, 0.0, (p > 1) & (v > 1)))
            elif name == "dualpipev":
                schedules.append((code, 0.0, (p > 1) & (v == 2)))
            elif name == "afab":
                schedules.append((code, 0.0, p > 1))
            elif name == "flexible":
                for nc in s.pp_group or [None]:
                    group = 2.0 * p if nc is None else np.full_like(p, float(nc))
                    schedules.append((code, group, (p > 1) & (v > 1) & (group > p)))
        if "1f1b" not in s.pp_schedule:  # without pipelining there is no schedule to choose
            schedules.append((PP_SCHEDULE_CODES["1f1b"], 0.0, p == 1))
        cp_variants = []  # (code, a2a degree, applies)
        for name in s.cp_comm:
            code = CP_COMM_CODES[name]
            if name == "a2a+p2p":
                for degree in s.cp_a2a or [d for d in (2, 4, 8, 16, 32) if d < max(self.cp)]:
                    cp_variants.append((code, float(degree), (c > degree) & (np.mod(c, degree) == 0)))
            else:
                cp_variants.append((code, 0.0, (c > 1) | (name == "p2p")))
        if "p2p" not in s.cp_comm:
            cp_variants.append((CP_COMM_CODES["p2p"], 0.0, c == 1))
        shards = [0.0] + [float(d) for d in (s.dp_shard or [])]
        out = []
        for (code, nc, applies), (cp_code, degree, cp_applies), shard in itertools.product(schedules, cp_variants, shards):
            ok = applies & cp_applies
            if not ok.any():
                continue
            rows = base[ok]
            n = len(rows)
            group = nc[ok] if isinstance(nc, np.ndarray) else np.full(n, nc)
            extra = np.stack([np.full(n, float(code)), group, np.full(n, float(cp_code)), np.full(n, degree), np.full(n, shard)], axis=1)
            out.append(np.concatenate([rows, extra], axis=1))
        return np.concatenate(out) if out else np.zeros((0, len(SKELETON_FIELDS)))

    @cached_property
    def memory_choices(self) -> np.ndarray:
        """Every allowed memory choice, one row each (columns MEMORY_FEATURES), without the ones
        the rules always reject whatever the skeleton (offload with recompute, modules the
        model lacks; the rules still run on every result)."""
        pr = self.problem
        s, f = pr.search, pr.features
        recompute = []  # (mode, method, layers, modules)
        for mode in self.recompute:
            if mode == RECOMPUTE_CODES["none"]:
                recompute.append((0, 0, 0, 0))
            elif mode == RECOMPUTE_CODES["selective"]:
                for modules in s.recompute_modules:
                    mask = mask_of(modules, RECOMPUTE_MODULE_BITS)
                    if _modules_exist(modules, pr):
                        recompute.append((1, 0, 0, mask))
            else:
                recompute.append((2, 0, 1, 0))
                for n in s.recompute_block_layers or []:
                    recompute.append((2, 1, n, 0))
        offload_settings = {"on": [o for o in s.activation_offload if o is not False], "off": [False]}.get(f.activation_offload, s.activation_offload)
        offloads = sorted({offload_code(o) for o in offload_settings})
        zero = []
        for stage in f.zero_stage:
            if stage == 3:
                reshard = {"on": [1], "off": [0]}.get(f.fsdp_reshard_after_forward, [1, 0])
                zero += [(3, r) for r in reshard]
            else:
                zero.append((stage, 0))
        chunks = sorted({chunks_code(c) for c in s.moe_chunks}) if pr.model.moe is not None else [1]
        rows = [
            (*rc, off, z, r, cpu, chunk)
            for rc, off, (z, r), cpu, chunk in itertools.product(recompute, offloads, zero, self.flags["cpu_optimizer"], chunks)
            if not (off != 0 and rc[0] != 0)
        ]
        return np.array(rows, dtype=float).reshape(-1, len(MEMORY_FEATURES))

    @cached_property
    def features(self) -> dict[str, np.ndarray]:
        """Every feature choice (memory choice x overlap switches), as columns."""
        switches = np.array(list(itertools.product(*(self.flags[n] for n in PURE_TIME_FEATURES))), dtype=float)
        choices = self.memory_choices
        rows = np.concatenate([np.repeat(choices, len(switches), axis=0), np.tile(switches, (len(choices), 1))], axis=1)
        return {name: rows[:, i] for i, name in enumerate(FEATURE_FIELDS)}

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
        """Skeleton x feature products in chunks of about `chunk` configurations, skeleton-major.
        Each skeleton is paired only with the feature choices its own fields leave possible
        (no TP overlap without TP, no ZeRO without a data-parallel group, ...: `_signature`), so
        the enumerator does not build rows the rules would reject whatever they hold; the
        rules still check every row it scores."""
        sig = self._signature(self.skeletons)
        for code in np.unique(sig):
            skeletons = np.flatnonzero(sig == code)
            features = np.flatnonzero(self._features_for(int(code)))
            F = len(features)
            if F == 0:
                continue
            per = max(1, chunk // F)
            for start in range(0, len(skeletons), per):
                sk = skeletons[start:start + per]
                yield self.combine(np.repeat(sk, F), np.tile(features, len(sk)), interval)

    def enumeration(self, chunk: int = 65536) -> tuple[int, int]:
        """(configurations, batches) that `batches(chunk)` yields -- the exhaustive
        enumerator's work, before the feature rules -- counted without building them."""
        sig = self._signature(self.skeletons)
        configurations = count = 0
        for code, n in zip(*np.unique(sig, return_counts=True)):
            F = int(self._features_for(int(code)).sum())
            if F:
                configurations += int(n) * F
                count += -(-int(n) // max(1, chunk // F))
        return configurations, count

    #: what a skeleton's own fields allow: (bit of the signature, the feature it gates)
    GATES = ("tp_overlap", "cp_overlap", "ep_overlap", "pp_overlap", "dp_overlap", "zero_stage")

    def _signature(self, sk: ConfigBatch) -> np.ndarray:
        """Per skeleton, a bit per GATES entry: may that feature be on?"""
        ring = (sk.cp_comm == CP_COMM_CODES["p2p"]) | (sk.cp_comm == CP_COMM_CODES["a2a+p2p"])
        schedule = sk.pp_schedule
        pipelined = (sk.pp > 1) & ((sk.vp > 1) | (schedule == PP_SCHEDULE_CODES["afab"]))
        sp = self.problem.training.sequence_parallel
        data_parallel = sk.dp * sk.cp > 1
        gates = [(sk.tp > 1) & sp, (sk.cp > 1) & ring, (sk.ep > 1) & ((sk.pp == 1) | (sk.vp > 1)), pipelined, data_parallel, data_parallel]
        return sum(g.astype(np.int64) << i for i, g in enumerate(gates))

    def _features_for(self, code: int) -> np.ndarray:
        """Feature rows a skeleton with this signature may take (a superset of the admissible)."""
        ok = np.ones(self.num_features, bool)
        for i, name in enumerate(self.GATES):
            if not (code >> i) & 1:
                ok &= self.features[name] == 0
        return ok

    # ----------------------------------------------------------------------------------
    @cached_property
    def framework_rules(self) -> tuple[str, ...]:
        """The rules of search.framework (costmodel.frameworks), none for `any`."""
        framework = self.problem.search.framework
        return () if framework == "any" else tuple(rule_key(framework, rule) for rule in FRAMEWORK_RULES[framework])

    @cached_property
    def skeleton_rules(self) -> tuple[str, ...]:
        """SKELETON_RULES and the framework's rules that read skeleton fields only (or none: a
        fact of the run, such as a dtype the framework cannot train in, cuts every skeleton)."""
        return SKELETON_RULES + tuple(k for k in self.framework_rules if set(rule_of(k).fields) <= set(SKELETON_FIELDS))

    @cached_property
    def feature_rules(self) -> tuple[str, ...]:
        """FEATURE_RULES and the framework's rules that read a feature."""
        return FEATURE_RULES + tuple(k for k in self.framework_rules if k not in self.skeleton_rules)

    @cached_property
    def switch_rules(self) -> dict[str, tuple[str, ...]]:
        """SWITCH_RULES and, per switch, the framework's rules that read it."""
        return {name: rules + tuple(k for k in self.framework_rules if name in rule_of(k).fields) for name, rules in SWITCH_RULES.items()}

    def feature_ok(self, cfg: ConfigBatch) -> np.ndarray:
        bad = violations(self.problem, cfg)
        ok = np.ones(len(cfg), bool)
        for rule in self.feature_rules:
            ok &= ~bad[rule]
        return ok

    def viable(self, cfg: ConfigBatch, open_switches: tuple[str, ...]) -> np.ndarray:
        """True where every rule holds for some allowed value of each switch in
        `open_switches` (their values in `cfg` are ignored) and for the fixed fields."""
        G = self.problem.cluster.num_gpus
        base = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "dp"}
        for name in open_switches:
            base[name] = self.flags[name][0]
        skip = {rule for name in open_switches for rule in self.switch_rules[name]}
        bad = violations(self.problem, ConfigBatch.from_columns(G, **base))
        ok = np.ones(len(cfg), bool)
        for rule, mask in bad.items():
            if rule not in skip:
                ok &= ~mask
        for name in open_switches:
            # the switch's first value is what `base` holds: its violations are known; a
            # further value is tried only on the rows still alive that no value satisfied yet
            any_value = self._switch_holds(bad, name)
            for value in self.flags[name][1:]:
                rows = np.flatnonzero(ok & ~any_value)
                if not len(rows):
                    break
                subset = {k: (v[rows] if np.ndim(v) else v) for k, v in base.items()}
                trial = violations(self.problem, ConfigBatch.from_columns(G, **{**subset, name: value}))
                any_value[rows] |= self._switch_holds(trial, name)
            ok &= any_value
        return ok

    def _switch_holds(self, bad: dict[str, np.ndarray], name: str) -> np.ndarray:
        """True where no rule of switch `name` is broken in `bad` (violations' output)."""
        holds = np.ones(len(next(iter(bad.values()))), bool)
        for rule in self.switch_rules[name]:
            holds &= ~bad[rule]
        return holds

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
