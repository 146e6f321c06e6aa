"""MoFa's depth-first search (section 4.1), the baseline the CP-SAT solver is measured against.

The DFS walks the decision variables in a fixed order -- tp, cp, pp, vp, layer split, ep, etp,
micro-batch, the schedule / CP-variant / HSDP choices, the memory choice (recompute variant,
offload, ZeRO stage, CPU optimizer), then the five overlap switches -- and prunes a subtree as
soon as a rule involving only the variables assigned so far fails. MoFa's four expert rules are
  1. hardware resources: t*c*p*d within the GPUs (here: equal to them), memory at the leaf;
  2. g_bs divisible by m_bs * d;
  3. at least p micro-batches;
  4. TP inside a node;
and the Megatron rules (costmodel.rules) are checked at the depth where they become checkable;
at a leaf the full rule set runs again. Every complete configuration (leaf) is scored on its
own by the exact model, as in the paper: the DFS's cost is its leaves times one evaluation.
"""

from __future__ import annotations

import numpy as np

from costmodel.configs import ConfigBatch
from costmodel.evaluate import evaluate
from costmodel.frameworks import facts_of, framework_violations, rule_of
from costmodel.layout import split_layers
from costmodel.rules import feasible, kv_heads, kv_heads_fit, tp_domain
from costmodel.specs import Problem
from optimizer.result import SolveResult, Stopwatch, TopK, check_objective, objective_values
from optimizer.space import MEMORY_FEATURES, PURE_TIME_FEATURES, SKELETON_FIELDS, SearchSpace


class _Stop(Exception):
    pass


#: seconds between two progress reports
PROGRESS_EVERY_S = 5.0


def solve_dfs(problem: Problem, objective: str = "step", top_k: int = 1, time_limit_s: float | None = None, max_leaves: int | None = None,
              distinct_layouts: bool = False, progress=None) -> SolveResult:
    """`progress(report)`, when given, is called every PROGRESS_EVERY_S seconds with the leaves
    and nodes visited, the time spent and the best value so far: a DFS runs for minutes."""
    check_objective(problem, objective)
    clock = Stopwatch()
    space = SearchSpace.from_problem(problem)
    m, tr, cl = problem.model, problem.training, problem.cluster
    G, L, gbs = cl.num_gpus, m.num_layers, tr.global_batch_size
    domain, kv = tp_domain(problem), kv_heads(problem)
    interval = space.interval()
    best = TopK(top_k, distinct_layouts)
    count = {"leaves": 0, "nodes": 0}
    last_report = [0.0]

    def leaf(row: dict) -> None:
        cfg = ConfigBatch.from_columns(G, **row, interval=interval)
        if not feasible(problem, cfg)[0]:  # every rule, whatever the prefixes checked
            return
        count["leaves"] += 1
        best.offer(objective_values(evaluate(problem, cfg), objective), cfg)
        if progress is not None and clock.elapsed - last_report[0] >= PROGRESS_EVERY_S:
            last_report[0] = clock.elapsed
            progress({"method": "dfs", "leaves": count["leaves"], "nodes": count["nodes"], "elapsed_s": clock.elapsed,
                      "best": float(best.values[0]) if len(best.values) else None})
        if (time_limit_s is not None and clock.elapsed > time_limit_s) or (max_leaves and count["leaves"] >= max_leaves):
            raise _Stop

    memory_rows = space.memory_choices
    switch_levels = [(name, space.flags[name]) for name in PURE_TIME_FEATURES]

    def switches(depth: int, row: dict) -> None:
        count["nodes"] += 1
        if depth == len(switch_levels):
            leaf(row)
            return
        name, values = switch_levels[depth]
        for value in values:
            row[name] = value
            if _feature_prefix_ok(row, name):
                switches(depth + 1, row)
        del row[name]

    # search.framework: its rules on skeleton fields prune a skeleton, those on no overlap
    # switch a memory choice (the leaf checks every rule again)
    framework = problem.search.framework
    facts = facts_of(problem) if framework != "any" else None
    skeleton_only = [k for k in space.framework_rules if k in space.skeleton_rules]
    switch_free = [k for k in space.framework_rules if not set(rule_of(k).fields) & set(PURE_TIME_FEATURES)]

    def framework_ok(row: dict, rules: list[str]) -> bool:
        if not rules:
            return True
        bad = framework_violations(framework, facts, ConfigBatch.from_columns(G, **row))
        return not any(bad[k][0] for k in rules)

    def features(row: dict) -> None:
        if not framework_ok(row, skeleton_only):
            return
        for choice in memory_rows:  # recompute variant, offload, ZeRO stage, CPU optimizer
            count["nodes"] += 1
            row.update(zip(MEMORY_FEATURES, choice))
            if framework_ok(row, switch_free):
                switches(0, row)
        for name in MEMORY_FEATURES:
            row.pop(name, None)

    try:
        for t in space.tp:  # rule 4 and the TP rules
            count["nodes"] += 1
            if t > domain or m.num_heads % t or not kv_heads_fit(kv, t) or G % t:
                continue
            for c in space.cp:
                count["nodes"] += 1
                if (c > 1 and tr.seq_len % (2 * c)) or G % (t * c):
                    continue
                for p in space.pp:  # rule 1: the world must factor
                    count["nodes"] += 1
                    if G % (t * c * p):
                        continue
                    d = G // (t * c * p)
                    for v in space.vp:
                        count["nodes"] += 1
                        if v > 1 and p == 1:
                            continue
                        splits = []
                        for mode in space.split_modes:
                            first, last = (int(x[0]) for x in split_layers(L, np.array([float(p)]), np.array([float(v)]), mode))
                            if first > 0 and (first, last) not in splits:
                                splits.append((first, last))
                        for first, last in splits:
                            for e in space.ep:
                                count["nodes"] += 1
                                if m.moe and (m.moe.num_experts % e or G % (e * p)):
                                    continue
                                for etp in space.etp_options(t):
                                    count["nodes"] += 1
                                    if m.moe and ((t * c * d) % (e * etp) or G % (etp * e * p)):
                                        continue
                                    for mbs in space.mbs:  # rules 2 and 3
                                        count["nodes"] += 1
                                        if gbs % (mbs * d):
                                            continue
                                        micro = gbs // (mbs * d)
                                        if micro < p:
                                            continue
                                        base = np.array([[t, c, p, v, e, etp, mbs, first, last]], dtype=float)
                                        for variant in space.skeleton_variants(base):  # schedule, CP variant, HSDP group
                                            count["nodes"] += 1
                                            row = dict(zip(SKELETON_FIELDS, variant.tolist()))
                                            features(row)
        complete = True
        interrupted = False
    except _Stop:
        complete, interrupted = False, False
    except KeyboardInterrupt:  # Ctrl-C: the best found so far, with its gap, as a time limit would
        complete, interrupted = False, True

    stats = {"nodes": count["nodes"], "leaves": count["leaves"]}
    if interrupted:
        stats["interrupted"] = True
    return best.result("dfs", objective, complete, clock, count["leaves"], space.size, stats, problem=problem, interval=interval)


def _feature_prefix_ok(row: dict, assigned: str) -> bool:
    """Switch rules that become checkable once `assigned` is set (costmodel.rules checks all
    of them again at the leaf)."""
    if row[assigned] == 0:
        return True
    t, c, e, v, p = row["tp"], row["cp"], row["ep"], row["vp"], row["pp"]
    if assigned == "tp_overlap":
        return t > 1
    if assigned == "cp_overlap":
        return c > 1
    if assigned == "ep_overlap":
        return e > 1 and (p == 1 or v > 1) and row["recompute"] != 2
    if assigned == "pp_overlap":
        return p > 1
    return True
