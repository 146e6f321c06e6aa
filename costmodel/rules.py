"""The rules a configuration must satisfy before it can run, as named vectorized checks.

Each rule is the framework assertion it mirrors (see ../shared/reference/frameworks.md: most
are Megatron-LM's; the schedules and sharding modes add Llama 3's, torchtitan's and DeepSeek's
own) or a MoFa tuning rule (section 4.1). `violations` returns, per rule name, a boolean array
that is True where a configuration breaks the rule; the memory rule lives in the cost model (it
needs the full memory ledger) and is added by the search. Some rules keep one canonical row per
distinct configuration (a setting that means nothing for it must be left at its default), so
that searches never score the same configuration twice.
"""

from __future__ import annotations

import numpy as np

from costmodel.arrays import divides, floor_div
from costmodel.configs import (
    CP_COMM_CODES,
    OFFLOAD_LAYER,
    OFFLOAD_MODULE_BITS,
    PP_SCHEDULE_CODES,
    RECOMPUTE_CODES,
    RECOMPUTE_MODULE_BITS,
    ConfigBatch,
)
from costmodel.frameworks import framework_violations, facts_of, rule_of
from costmodel.layout import middle_layers, split_ok, vee_split_ok
from costmodel.specs import FEATURES, ConfigSpec, Problem

S = PP_SCHEDULE_CODES
C = CP_COMM_CODES

#: rule name -> (config field it is reported against, message)
RULES: dict[str, tuple[str, str]] = {
    "world_size": ("tp", "tp*cp*pp must divide the number of GPUs"),
    "dp_matches": ("dp", "dp must equal num_gpus / (tp*cp*pp)"),
    "tp_divides_heads": ("tp", "tp must divide num_heads"),
    "tp_kv_heads": ("tp", "num_kv_heads must be a multiple or a divisor of tp"),
    "tp_in_domain": ("tp", "tp must not exceed the GPUs of one node (or supernode, if search.tp_domain says so)"),
    "cp_divides_seq": ("cp", "seq_len must be divisible by 2*cp"),
    "cp_comm_needs_cp": ("cp_comm", "a context-parallel variant other than p2p needs cp > 1"),
    "cp_linear_attention": ("cp", "linear-attention (Gated DeltaNet) layers carry a state along the sequence: not split by context parallelism here (cp must be 1)"),
    "cp_a2a_heads": ("cp_comm", "all-to-all CP needs the attention heads of a TP rank divisible by the all-to-all degree"),
    "cp_a2a_degree": ("cp_a2a", "a2a+p2p needs an all-to-all degree 1 < cp_a2a < cp that divides cp (and none otherwise)"),
    "layers_split": ("pp", "Megatron cannot lay the layers out over pp ranks x vp virtual stages this way"),
    "vp_needs_pp": ("vp", "interleaving (vp>1) needs pp>2, or pp>1 with pp_overlap"),
    "schedule_needs_pp": ("pp_schedule", "without pipeline parallelism (pp=1) the schedule is 1f1b"),
    "schedule_vp": ("pp_schedule", "1f1b runs one stage per rank (vp=1); interleaved_1f1b and flexible need vp>1; dualpipev needs vp=2"),
    "pp_group": ("pp_group", "the flexible schedule needs pp < nc <= micro-batches with the micro-batches a multiple of nc; other schedules take no nc"),
    "dualpipev_layout": ("pp_schedule", "DualPipeV needs its V split: every rank but the first the same even number of layers, the first at least one"),
    "gbs_divisible": ("mbs", "global_batch_size must be divisible by mbs*dp"),
    "microbatches_ge_pp": ("mbs", "the number of micro-batches must be at least pp (bs >= pp)"),
    "microbatches_interleave": ("mbs", "with interleaved 1F1B the number of micro-batches must be a multiple of pp"),
    "microbatches_dualpipev": ("mbs", "DualPipeV needs at least 2*pp micro-batches"),
    "ep_divides_experts": ("ep", "ep must divide num_experts (and be 1 for a dense model)"),
    "expert_grid": ("ep", "etp*ep*pp must divide the GPUs and ep*etp must tile the tp*cp*dp ranks of a stage"),
    "etp_valid": ("etp", "etp must be 1 for a dense model and must not exceed the GPUs of one node"),
    "moe_needs_sequence_parallel": ("tp", "Megatron requires sequence parallelism for MoE with tp>1"),
    "tp_overlap_needs_tp": ("tp_overlap", "tp_overlap needs tp>1 (with sequence parallelism)"),
    "cp_overlap_needs_cp": ("cp_overlap", "cp_overlap needs cp>1 and a ring (p2p or a2a+p2p): all-gather and all-to-all CP are exposed"),
    "ep_overlap_needs_ep": ("ep_overlap", "ep_overlap needs ep>1, vp>1 when pp>1, and no full recompute"),
    "pp_overlap_needs_vp": ("pp_overlap", "pp_overlap needs pp>1 and vp>1 or all-forward-all-backward (Megatron forces it off without VPP); DualPipeV overlaps by design"),
    "dp_overlap_needs_dp": ("dp_overlap", "dp_overlap needs a data-parallel group (dp*cp>1)"),
    "zero_needs_dp": ("zero_stage", "ZeRO sharding (zero_stage >= 1, the distributed optimizer) needs dp*cp > 1 ranks to shard over"),
    "reshard_needs_zero3": ("reshard_after_forward", "reshard_after_forward applies to ZeRO-3 only"),
    "dp_shard_valid": ("dp_shard", "an HSDP sharding group must be a proper divisor > 1 of dp*cp, with zero_stage >= 1"),
    "recompute_method": ("recompute_num_layers", "full recompute needs 1 <= recompute_num_layers (block: fewer than a virtual stage's layers); other modes take none"),
    "recompute_modules": ("recompute_modules", "the recompute modules must exist in the model (moe_act/moe/shared_experts need MoE, shared_experts shared experts, mla_up_proj MLA)"),
    "recompute_ops": ("recompute_modules", "ops (torchtitan's per-op selective AC) is modelled for dense models with softmax flash attention (no MoE, MLA, "
                      "linear attention or output gate) and tp=1: under TP its policy also keeps the reduce-scatter outputs and re-gathers the inputs"),
    "offload_excludes_recompute": ("activation_offload", "activation offload cannot be combined with recompute"),
    "offload_attn_proj_alone": ("activation_offload", "offloading attn_proj needs core_attn offloaded too: attn_proj's saved input is core_attn's "
                                "output, which core_attn's backward keeps (Megatron-Core's TransformerConfig refuses it)"),
    "moe_chunks_needs_moe": ("moe_chunks", "chunked MoE dispatch (moe_chunks other than 1) needs an MoE model"),
    "feature_forced": ("features", "the configuration contradicts a feature the problem forces on or off"),
    "recompute_allowed": ("recompute", "the problem does not allow this recompute mode"),
    "zero_allowed": ("zero_stage", "the problem does not allow this ZeRO stage"),
}


def op_sac_modelled(problem: Problem) -> bool:
    """Whether torchtitan's per-op selective recompute (module ops, architecture.op_sac) is
    modelled for this model: dense layers with softmax flash attention (its matmul count and
    kept tensors are a Llama block's), no MLA, linear attention or output gate; tp = 1 is the
    rule's per-configuration part."""
    m = problem.model
    return (m.moe is None and m.mla is None and not m.attention_output_gate and "linear_attention" not in (m.layer_types or ())
            and problem.training.attention_kernel == "flash")


def tp_domain(problem: Problem) -> int:
    """GPUs TP may span: a node, or a supernode if search.tp_domain says so."""
    cl = problem.cluster
    return cl.supernode if problem.search.tp_domain == "supernode" else cl.gpus_per_node


def kv_heads_fit(kv_heads, tp):
    """Megatron's TransformerConfig: the KV heads (query groups) are a multiple of tp or divide it."""
    return divides(tp, kv_heads) | divides(kv_heads, tp)


def kv_heads(problem: Problem) -> int:
    m = problem.model
    return m.kv_heads if m.mla is None else m.num_heads


def _has(mask, bit) -> np.ndarray:
    return (mask.astype(np.int64) & bit) != 0


def violations(problem: Problem, cfg: ConfigBatch) -> dict[str, np.ndarray]:
    m, tr, cl = problem.model, problem.training, problem.cluster
    G = cl.num_gpus
    t, c, p, v, e, etp, mbs, d = cfg.tp, cfg.cp, cfg.pp, cfg.vp, cfg.ep, cfg.etp, cfg.mbs, cfg.dp
    sched = cfg.pp_schedule
    dense = m.moe is None
    out: dict[str, np.ndarray] = {}

    # model-shape rules first: they are the most specific explanation when several fail
    out["tp_divides_heads"] = ~divides(t, m.num_heads)
    out["tp_kv_heads"] = ~kv_heads_fit(kv_heads(problem), t)
    out["cp_divides_seq"] = (c > 1) & ~divides(2 * c, tr.seq_len)
    out["cp_comm_needs_cp"] = (c == 1) & (cfg.cp_comm != C["p2p"])
    out["cp_linear_attention"] = (c > 1) & ("linear_attention" in (m.layer_types or ()))
    a2a_degree = np.select([cfg.cp_comm == C["a2a"], cfg.cp_comm == C["a2a+p2p"]], [c, np.maximum(cfg.cp_a2a, 1.0)], 1.0)
    out["cp_a2a_heads"] = (a2a_degree > 1) & ~divides(a2a_degree * t, m.num_heads)
    hierarchical = cfg.cp_comm == C["a2a+p2p"]
    out["cp_a2a_degree"] = np.where(hierarchical, ~((cfg.cp_a2a > 1) & (cfg.cp_a2a < c) & divides(cfg.cp_a2a, c)), cfg.cp_a2a != 0)
    out["world_size"] = d == 0
    out["dp_matches"] = np.zeros(len(cfg), bool)
    out["tp_in_domain"] = t > tp_domain(problem)
    vee = sched == S["dualpipev"]  # its own split (dualpipev_layout below)
    out["layers_split"] = ~split_ok(m.num_layers, cfg) & ~vee
    out["vp_needs_pp"] = (v > 1) & ~((p > 2) | ((p > 1) & (cfg.pp_overlap == 1)) | ((p > 1) & (sched != S["interleaved_1f1b"])))

    # schedules
    out["schedule_needs_pp"] = (p == 1) & (sched != S["1f1b"])
    out["schedule_vp"] = np.select(
        [sched == S["1f1b"], sched == S["dualpipev"], (sched == S["interleaved_1f1b"]) | (sched == S["flexible"])],
        [v != 1, v != 2, v == 1],
        False,
    )
    out["dualpipev_layout"] = vee & ~vee_split_ok(m.num_layers, cfg)

    dd = np.maximum(d, 1)
    out["gbs_divisible"] = (d == 0) | ~divides(mbs * dd, tr.global_batch_size)
    micro = floor_div(tr.global_batch_size, np.maximum(mbs * dd, 1))
    out["microbatches_ge_pp"] = micro < p
    out["microbatches_interleave"] = (sched == S["interleaved_1f1b"]) & ~divides(p, micro)
    out["microbatches_dualpipev"] = (sched == S["dualpipev"]) & (micro < 2 * p)
    nc = cfg.pp_group
    out["pp_group"] = np.where(sched == S["flexible"], ~((nc > p) & (nc <= micro) & divides(nc, micro)), nc != 0)

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

    # overlaps
    out["tp_overlap_needs_tp"] = (cfg.tp_overlap == 1) & ((t == 1) | (not tr.sequence_parallel))
    ring = (cfg.cp_comm == C["p2p"]) | hierarchical
    out["cp_overlap_needs_cp"] = (cfg.cp_overlap == 1) & ((c == 1) | ~ring)
    out["ep_overlap_needs_ep"] = (cfg.ep_overlap == 1) & ((e == 1) | ((p > 1) & (v == 1)) | (cfg.recompute == 2))
    async_schedule = (sched == S["afab"]) | (sched == S["dualpipev"])
    out["pp_overlap_needs_vp"] = np.where(
        sched == S["dualpipev"], cfg.pp_overlap == 0, (cfg.pp_overlap == 1) & ((p == 1) | ((v == 1) & ~async_schedule))
    )
    out["dp_overlap_needs_dp"] = (cfg.dp_overlap == 1) & (dd * c == 1)

    # data-parallel sharding
    out["zero_needs_dp"] = (cfg.zero_stage >= 1) & (dd * c == 1)
    out["reshard_needs_zero3"] = (cfg.reshard_after_forward == 1) & (cfg.zero_stage != 3)
    out["dp_shard_valid"] = (cfg.dp_shard > 0) & ~((cfg.zero_stage >= 1) & (cfg.dp_shard > 1) & (cfg.dp_shard < dd * c) & divides(cfg.dp_shard, dd * c))

    # recompute and offload
    full, selective = cfg.recompute == RECOMPUTE_CODES["full"], cfg.recompute == RECOMPUTE_CODES["selective"]
    stage_layers = np.maximum(floor_div(np.where(p == 1, m.num_layers, middle_layers(m.num_layers, cfg)), v), 1.0)
    out["recompute_method"] = np.where(
        full,
        (cfg.recompute_layers < 1) | ((cfg.recompute_method == 1) & (cfg.recompute_layers >= stage_layers)),
        (cfg.recompute_layers != 0) | (cfg.recompute_method != 0),
    )
    mods = cfg.recompute_modules
    bad_module = np.where(selective, mods == 0, mods != 0)
    if dense:
        bad_module |= _has(mods, RECOMPUTE_MODULE_BITS["moe_act"]) | _has(mods, RECOMPUTE_MODULE_BITS["moe"]) | _has(mods, RECOMPUTE_MODULE_BITS["shared_experts"])
    elif not m.moe.num_shared_experts:
        bad_module |= _has(mods, RECOMPUTE_MODULE_BITS["shared_experts"])
    if m.mla is None:
        bad_module |= _has(mods, RECOMPUTE_MODULE_BITS["mla_up_proj"])
    out["recompute_modules"] = bad_module
    out["recompute_ops"] = selective & _has(mods, RECOMPUTE_MODULE_BITS["ops"]) & ((t > 1) | (not op_sac_modelled(problem)))
    out["offload_excludes_recompute"] = (cfg.activation_offload != 0) & (cfg.recompute != 0)
    offload = cfg.activation_offload
    modules = (offload != 0) & (offload != OFFLOAD_LAYER)
    out["offload_attn_proj_alone"] = modules & _has(offload, OFFLOAD_MODULE_BITS["attn_proj"]) & ~_has(offload, OFFLOAD_MODULE_BITS["core_attn"])
    out["moe_chunks_needs_moe"] = (cfg.moe_chunks != 1) & dense

    # what the problem's features section allows
    forced = np.zeros(len(cfg), bool)
    for name in FEATURES:
        mode = getattr(problem.features, name)
        value = getattr(cfg, name)
        if mode == "on":
            forced |= value == 0
        elif mode == "off":
            forced |= value == 1
    for mode, offloading in ((problem.features.activation_offload, cfg.activation_offload != 0),):
        if mode == "on":
            forced |= ~offloading
        elif mode == "off":
            forced |= offloading
    reshard = problem.features.fsdp_reshard_after_forward
    if reshard != "allowed":
        forced |= (cfg.zero_stage == 3) & (cfg.reshard_after_forward != (1 if reshard == "on" else 0))
    out["feature_forced"] = forced
    allowed = np.zeros(len(cfg), bool)
    for mode in problem.features.recompute:
        allowed |= cfg.recompute == RECOMPUTE_CODES[mode]
    out["recompute_allowed"] = ~allowed
    zero_ok = np.zeros(len(cfg), bool)
    for stage in problem.features.zero_stage:
        zero_ok |= cfg.zero_stage == stage
    out["zero_allowed"] = ~zero_ok
    framework = problem.search.framework
    if framework != "any":  # search.framework: what that framework runs, by the rules its exporter refuses by
        out.update(framework_violations(framework, facts_of(problem), cfg))
    return out


def feasible(problem: Problem, cfg: ConfigBatch) -> np.ndarray:
    ok = np.ones(len(cfg), bool)
    for bad in violations(problem, cfg).values():
        ok &= ~bad
    return ok


#: rules about what the features section lets a search use; a configuration given explicitly
#: is checked against the frameworks' rules only (search.framework's rules included: the
#: exporter of that framework refuses such a configuration by the same rules, with its reason)
PROBLEM_ONLY_RULES = ("feature_forced", "recompute_allowed", "zero_allowed")


def is_framework_rule(name: str) -> bool:
    """A rule of search.framework (costmodel.frameworks), named `framework:rule`."""
    return ":" in name


def rule_text(name: str) -> str:
    """The message of a rule, a model rule (RULES) or a framework rule (unfilled template)."""
    return rule_of(name).message if is_framework_rule(name) else RULES[name][1]


def config_violations(problem: Problem, spec: ConfigSpec) -> list[tuple[str, str]]:
    """(field, message) for every rule a single ConfigSpec breaks; used when a problem file's
    `config` section (or `mofa evaluate --set`) is validated."""
    cfg = ConfigBatch.from_specs(problem, [spec])
    found = []
    for name, bad in violations(problem, cfg).items():
        if name in PROBLEM_ONLY_RULES or is_framework_rule(name):
            continue
        if bad[0]:
            field, message = RULES[name]
            found.append((field, _detail(problem, spec, cfg, name, message)))
    if spec.dp is not None and cfg.dp[0] != spec.dp:
        found.append(("dp", f"dp={spec.dp} but num_gpus/(tp*cp*pp) = {problem.cluster.num_gpus}/{spec.tp * spec.cp * spec.pp}"))
    return found


def _detail(problem: Problem, spec: ConfigSpec, cfg: ConfigBatch, name: str, message: str) -> str:
    m, tr = problem.model, problem.training
    micro = tr.global_batch_size // max(spec.mbs * max(int(cfg.dp[0]), 1), 1)
    specifics = {
        "tp_divides_heads": f"tp={spec.tp} does not divide num_heads={m.num_heads}",
        "cp_divides_seq": f"seq_len={tr.seq_len} is not divisible by 2*cp={2 * spec.cp}",
        "world_size": f"tp*cp*pp={spec.tp * spec.cp * spec.pp} does not divide num_gpus={problem.cluster.num_gpus}",
        "layers_split": f"{m.num_layers} layers cannot be laid out over pp={spec.pp} x vp={spec.vp} stages as {int(cfg.first_layers[0])} first / {int(cfg.last_layers[0])} last",
        "gbs_divisible": f"global_batch_size={tr.global_batch_size} is not divisible by mbs*dp={spec.mbs * int(cfg.dp[0])}",
        "microbatches_ge_pp": f"{micro} micro-batches (global batch {tr.global_batch_size} / (mbs {spec.mbs} x dp {int(cfg.dp[0])})) is fewer than pp={spec.pp}",
        "zero_needs_dp": f"zero_stage={spec.zero_stage} shards over dp*cp={int(cfg.dp[0]) * spec.cp} rank(s): nothing to shard",
    }
    return specifics.get(name, message)
