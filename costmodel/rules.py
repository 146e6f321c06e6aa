"""The rules a configuration must satisfy before it can run, as named vectorized checks.

Each rule is the Megatron-LM assertion it mirrors (see ../shared/reference/frameworks.md) or
a MoFa tuning rule (section 4.1). `violations` returns, per rule name, a boolean array that is
True where a configuration breaks the rule; the memory rule lives in the cost model (it needs
the full memory ledger) and is added by the search.
"""

from __future__ import annotations

import numpy as np

from costmodel.arrays import divides, floor_div
from costmodel.configs import RECOMPUTE_CODES, ConfigBatch
from costmodel.pipeline import split_ok
from costmodel.specs import FEATURES, ConfigSpec, Problem

#: rule name -> (config field it is reported against, message)
RULES: dict[str, tuple[str, str]] = {
    "world_size": ("tp", "tp*cp*pp must divide the number of GPUs"),
    "dp_matches": ("dp", "dp must equal num_gpus / (tp*cp*pp)"),
    "tp_divides_heads": ("tp", "tp must divide num_heads"),
    "tp_kv_heads": ("tp", "num_kv_heads must be a multiple or a divisor of tp"),
    "tp_in_domain": ("tp", "tp must not exceed the GPUs of one node (or supernode, if search.tp_domain says so)"),
    "cp_divides_seq": ("cp", "seq_len must be divisible by 2*cp"),
    "layers_split": ("pp", "Megatron cannot lay the layers out over pp ranks x vp virtual stages this way"),
    "vp_needs_pp": ("vp", "interleaving (vp>1) needs pp>2, or pp>1 with pp_overlap"),
    "gbs_divisible": ("mbs", "global_batch_size must be divisible by mbs*dp"),
    "microbatches_ge_pp": ("mbs", "the number of micro-batches must be at least pp"),
    "microbatches_interleave": ("mbs", "with vp>1 the number of micro-batches must be a multiple of pp"),
    "ep_divides_experts": ("ep", "ep must divide num_experts (and be 1 for a dense model)"),
    "expert_grid": ("ep", "etp*ep*pp must divide the GPUs and ep*etp must tile the tp*cp*dp ranks of a stage"),
    "etp_valid": ("etp", "etp must be 1 for a dense model and must not exceed the GPUs of one node"),
    "moe_needs_sequence_parallel": ("tp", "Megatron requires sequence parallelism for MoE with tp>1"),
    "tp_overlap_needs_tp": ("tp_overlap", "tp_overlap needs tp>1 (with sequence parallelism)"),
    "cp_overlap_needs_cp": ("cp_overlap", "cp_overlap needs cp>1"),
    "ep_overlap_needs_ep": ("ep_overlap", "ep_overlap needs ep>1, vp>1 when pp>1, and no full recompute"),
    "pp_overlap_needs_vp": ("pp_overlap", "pp_overlap needs pp>1 and vp>1 (Megatron forces it off without VPP)"),
    "dp_overlap_needs_dp": ("dp_overlap", "dp_overlap needs a data-parallel group (dp*cp>1)"),
    "distributed_optimizer_needs_dp": ("distributed_optimizer", "the distributed optimizer shards over dp*cp ranks; with dp*cp=1 it changes nothing"),
    "offload_excludes_recompute": ("activation_offload", "activation offload cannot be combined with recompute"),
    "feature_forced": ("features", "the configuration contradicts a feature the problem forces on or off"),
    "recompute_allowed": ("recompute", "the problem does not allow this recompute mode"),
}


def violations(problem: Problem, cfg: ConfigBatch) -> dict[str, np.ndarray]:
    m, tr, cl = problem.model, problem.training, problem.cluster
    G = cl.num_gpus
    t, c, p, v, e, etp, mbs, d = cfg.tp, cfg.cp, cfg.pp, cfg.vp, cfg.ep, cfg.etp, cfg.mbs, cfg.dp
    dense = m.moe is None
    out: dict[str, np.ndarray] = {}

    # model-shape rules first: they are the most specific explanation when several fail
    out["tp_divides_heads"] = ~divides(t, m.num_heads)
    kv = m.kv_heads if m.mla is None else m.num_heads
    out["tp_kv_heads"] = ~(divides(t, kv) | divides(kv, t))
    out["cp_divides_seq"] = (c > 1) & ~divides(2 * c, tr.seq_len)
    out["world_size"] = d == 0
    out["dp_matches"] = np.zeros(len(cfg), bool)
    domain = cl.supernode if problem.search.tp_domain == "supernode" else cl.gpus_per_node
    out["tp_in_domain"] = t > domain
    out["layers_split"] = ~split_ok(m.num_layers, cfg)
    out["vp_needs_pp"] = (v > 1) & ~((p > 2) | ((p > 1) & (cfg.pp_overlap == 1)))

    dd = np.maximum(d, 1)
    out["gbs_divisible"] = (d == 0) | ~divides(mbs * dd, tr.global_batch_size)
    micro = floor_div(tr.global_batch_size, np.maximum(mbs * dd, 1))
    out["microbatches_ge_pp"] = micro < p
    out["microbatches_interleave"] = (v > 1) & ~divides(p, micro)

    if dense:
        out["ep_divides_experts"] = e != 1
        out["expert_grid"] = np.zeros(len(cfg), bool)
        out["etp_valid"] = etp != 1
    else:
        out["ep_divides_experts"] = ~divides(e, m.moe.num_experts)
        ranks_per_stage = t * c * dd  # the ranks of one pipeline stage
        expert_block = e * etp
        tiles = np.where(expert_block <= t * c, divides(expert_block, t * c), divides(expert_block, ranks_per_stage) & divides(t * c, expert_block))
        out["expert_grid"] = ~(divides(etp * e * p, G) & tiles)
        out["etp_valid"] = etp > cl.gpus_per_node
    out["moe_needs_sequence_parallel"] = (t > 1) & (not dense) & (not tr.sequence_parallel)

    out["tp_overlap_needs_tp"] = (cfg.tp_overlap == 1) & ((t == 1) | (not tr.sequence_parallel))
    out["cp_overlap_needs_cp"] = (cfg.cp_overlap == 1) & (c == 1)
    out["ep_overlap_needs_ep"] = (cfg.ep_overlap == 1) & ((e == 1) | ((p > 1) & (v == 1)) | (cfg.recompute == 2))
    out["pp_overlap_needs_vp"] = (cfg.pp_overlap == 1) & ((p == 1) | (v == 1))
    out["dp_overlap_needs_dp"] = (cfg.dp_overlap == 1) & (dd * c == 1)
    out["distributed_optimizer_needs_dp"] = (cfg.distributed_optimizer == 1) & (dd * c == 1)
    out["offload_excludes_recompute"] = (cfg.activation_offload == 1) & (cfg.recompute != 0)

    forced = np.zeros(len(cfg), bool)
    for name in FEATURES:
        mode = getattr(problem.features, name)
        value = getattr(cfg, name)
        if mode == "on":
            forced |= value == 0
        elif mode == "off":
            forced |= value == 1
    out["feature_forced"] = forced
    allowed = np.zeros(len(cfg), bool)
    for mode in problem.features.recompute:
        allowed |= cfg.recompute == RECOMPUTE_CODES[mode]
    out["recompute_allowed"] = ~allowed
    return out


def feasible(problem: Problem, cfg: ConfigBatch) -> np.ndarray:
    ok = np.ones(len(cfg), bool)
    for bad in violations(problem, cfg).values():
        ok &= ~bad
    return ok


def config_violations(problem: Problem, spec: ConfigSpec) -> list[tuple[str, str]]:
    """(field, message) for every rule a single ConfigSpec breaks; used when a problem file's
    `config` section (or `mofa evaluate --set`) is validated."""
    cfg = ConfigBatch.from_specs(problem, [spec])
    found = []
    for name, bad in violations(problem, cfg).items():
        if name in ("feature_forced", "recompute_allowed"):
            continue  # the features section constrains the search, not a configuration given explicitly
        if bad[0]:
            field, message = RULES[name]
            found.append((field, _detail(problem, spec, cfg, name, message)))
    if spec.dp is not None and cfg.dp[0] != spec.dp:
        found.append(("dp", f"dp={spec.dp} but num_gpus/(tp*cp*pp) = {problem.cluster.num_gpus}/{spec.tp * spec.cp * spec.pp}"))
    return found


def _detail(problem: Problem, spec: ConfigSpec, cfg: ConfigBatch, name: str, message: str) -> str:
    m, tr = problem.model, problem.training
    specifics = {
        "tp_divides_heads": f"tp={spec.tp} does not divide num_heads={m.num_heads}",
        "cp_divides_seq": f"seq_len={tr.seq_len} is not divisible by 2*cp={2 * spec.cp}",
        "world_size": f"tp*cp*pp={spec.tp * spec.cp * spec.pp} does not divide num_gpus={problem.cluster.num_gpus}",
        "layers_split": f"{m.num_layers} layers cannot be laid out over pp={spec.pp} x vp={spec.vp} stages as {int(cfg.first_layers[0])} first / {int(cfg.last_layers[0])} last",
        "gbs_divisible": f"global_batch_size={tr.global_batch_size} is not divisible by mbs*dp={spec.mbs * int(cfg.dp[0])}",
    }
    return specifics.get(name, message)
