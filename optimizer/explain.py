"""Why a problem has no admissible configuration.

Three ways to fail:
  * search.framework restricts the search and that framework runs none of the configurations
    the model's rules admit: report the framework's rules (costmodel.frameworks) that cut them,
    each with how many it cuts and its message for one of them;
  * no skeleton survives the Megatron rules: report, per rule, how many candidate layouts it
    rejects, and the rule that rejects every one of them if there is one;
  * skeletons exist but none fits: report the configuration with the least peak memory (over
    every memory-relevant feature: recompute, offload, distributed and CPU optimizer) and its
    ledger, or, if GPU memory fits somewhere, the host-memory shortfall.
"""

from __future__ import annotations

import itertools

import numpy as np

from costmodel.configs import ConfigBatch, config_label, features_label
from costmodel.evaluate import evaluate
from costmodel.frameworks import DISPLAY, describe, facts_of, framework_violations
from costmodel.layout import split_layers
from costmodel.rules import RULES, violations
from costmodel.specs import Problem
from costmodel.units import GB, GIB
from optimizer.space import MEMORY_FEATURES, PURE_TIME_FEATURES, SKELETON_FIELDS, SKELETON_RULES, SearchSpace


def explain_infeasible(problem: Problem, space: SearchSpace | None = None) -> str:
    cut = _framework_cuts(problem)
    if cut:
        return cut
    space = space or SearchSpace.from_problem(problem)
    framework = problem.search.framework
    within = "" if framework == "any" else f"within what {DISPLAY[framework]} runs (search.framework: {framework}), "
    if len(space.skeletons) == 0:
        return within + _no_layout(problem, space)
    return within + _nothing_fits(problem, space)


#: framework rules an explanation names at most
MAX_NAMED = 4


def _framework_cuts(problem: Problem) -> str | None:
    """When search.framework restricts the search and its rules leave none of the
    configurations the model's own rules admit: the framework's rules that cut them, each with
    the number it cuts and its message for one of them. None otherwise (no framework, the
    model's rules alone admit nothing, or the framework admits some and memory decides)."""
    framework = problem.search.framework
    if framework == "any":
        return None
    free = SearchSpace.from_problem(problem.model_copy(update={"search": problem.search.model_copy(update={"framework": "any"})}))
    cfg = _memory_product(problem, free)
    if not len(cfg):
        return None
    facts = facts_of(problem)
    bad = framework_violations(framework, facts, cfg)  # the overlap switches off, which every rule admits
    survivors = np.ones(len(cfg), bool)
    for mask in bad.values():
        survivors &= ~mask
    if survivors.any():
        return None
    counts = sorted(((int(mask.sum()), key) for key, mask in bad.items() if mask.any()), key=lambda x: -x[0])
    named = [f"{key} cuts {n} ({describe(key, facts, cfg, int(np.argmax(bad[key])))})" for n, key in counts[:MAX_NAMED]]
    more = f"; {len(counts) - MAX_NAMED} more rule(s)" if len(counts) > MAX_NAMED else ""
    return (f"{DISPLAY[framework]} (search.framework: {framework}) runs none of the {len(cfg)} layout and memory choices the model's "
            f"rules admit: " + "; ".join(named) + more)


def _no_layout(problem: Problem, space: SearchSpace) -> str:
    m, G = problem.model, problem.cluster.num_gpus
    etps = sorted({etp for t in space.tp for etp in space.etp_options(t)})
    grid = np.array(list(itertools.product(space.tp, space.cp, space.pp, space.vp, space.ep, etps, space.mbs)), dtype=float)
    if grid.size == 0:
        return "the search section admits no value for some parallel degree"
    t, c, p, v, e, etp, mbs = grid.T
    # each point's first split among the search's modes; where none applies, the uneven
    # arithmetic's (which the layers_split rule then names)
    first, last = split_layers(m.num_layers, p, v, "uneven")
    first, last = np.maximum(first, 1), np.maximum(last, 1)
    for mode in reversed(space.split_modes):
        f, la = split_layers(m.num_layers, p, v, mode)
        first, last = np.where(f > 0, f, first), np.where(f > 0, la, last)
    cfg = ConfigBatch.from_columns(G, tp=t, cp=c, pp=p, vp=v, ep=e, etp=etp, mbs=mbs, first_layers=first, last_layers=last,
                                   pp_overlap=1 if 1 in space.flags["pp_overlap"] else 0)
    bad = violations(problem, cfg)
    counts = {rule: int(bad[rule].sum()) for rule in SKELETON_RULES}  # the model's rules: _framework_cuts names the framework's
    everything = [rule for rule, n in counts.items() if n == len(cfg)]
    ranked = [(r, n) for r, n in sorted(counts.items(), key=lambda kv: -kv[1]) if n and r not in everything[:1]][:3]
    detail = "; ".join(f"{RULES[r][1]} ({n} of {len(cfg)})" for r, n in ranked)
    if everything:
        rule = everything[0]
        also = f" (other rules that reject layouts: {detail})" if detail else ""
        return f"no parallel layout is admissible: for all {len(cfg)} candidate layouts, {RULES[rule][1]}{also}"
    return f"no parallel layout satisfies all rules at once; the most restrictive: {detail}"


def _memory_product(problem: Problem, space: SearchSpace) -> ConfigBatch:
    """Every skeleton with every memory choice, where some choice of the overlap switches
    satisfies every rule of the space."""
    sk = space.skeletons
    G = problem.cluster.num_gpus
    combos = space.memory_choices
    n_sk, n_c = len(sk), len(combos)
    cols = {name: np.repeat(getattr(sk, name), n_c) for name in SKELETON_FIELDS}
    for j, name in enumerate(MEMORY_FEATURES):
        cols[name] = np.tile(combos[:, j], n_sk)
    cfg = ConfigBatch.from_columns(G, **cols)
    return cfg.take(np.flatnonzero(space.viable(cfg, PURE_TIME_FEATURES)))


def _nothing_fits(problem: Problem, space: SearchSpace) -> str:
    cfg = _memory_product(problem, space)
    if not len(cfg):
        return "every combination of the allowed features breaks a feature rule (for example offload with recompute, or a forced feature that needs a larger parallel degree)"
    ev = evaluate(problem, cfg)
    hw = problem.hardware
    cap = hw.memory_bytes / GIB
    peak = ev.memory_bytes["peak"] / GIB
    if (peak <= cap).any():
        host = ev.host_bytes / GB
        i = int(np.argmin(np.where(peak <= cap, host, np.inf)))
        share = problem.hardware.host_memory_gb_per_node / problem.cluster.gpus_per_node
        return (
            f"GPU memory fits, but host memory does not: the least host memory any fitting configuration needs is "
            f"{host[i]:.1f} GB per GPU ({_label(cfg.row(i))}) against {share:.1f} GB per GPU"
        )
    i = int(np.argmin(peak))
    ledger = {k: float(v[i]) / GIB for k, v in ev.memory_bytes.items()}
    parts = ", ".join(f"{k} {v:.1f}" for k, v in ledger.items() if k != "peak" and v >= 0.05)
    rank = ("first", "middle", "last")[int(ev.worst_rank[i])]
    return (
        f"no configuration fits in {cap:.2f} GiB ({hw.name} exposes {hw.memory_mib} MiB): the least is {peak[i]:.2f} GiB at "
        f"{_label(cfg.row(i))} (worst rank: {rank}; {parts} GiB); memory per GPU is the binding constraint"
    )


def _label(c: dict) -> str:
    return f"{config_label(c)}, {features_label(c)}"
