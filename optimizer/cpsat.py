"""CP-SAT tuning: a lower-bounding integer model, certified by the exact cost model.

What the solver decides (OR-Tools CP-SAT): one Boolean per admissible *row* -- a skeleton
(tp, cp, pp, vp, ep, etp, micro-batch, layer split, schedule, CP variant, HSDP group: an
admissible layout from the search space) with a memory choice (recompute variant, activation
offload, ZeRO stage and resharding, CPU optimizer) -- exactly one of them, under the memory
constraints of eq. 6 (GPU and host). The five overlap switches (TP, CP, EP, PP, DP overlap)
change no memory, but for TP overlap's staging buffers and, under DTensor TP, the gathered
inputs it drops (a row's memory is then its least over TP overlap); the bound takes the best of
them, and the outer loop evaluates every admissible choice exactly.

Tables (`build_tables`) come from the exact model itself: `evaluate` scores every row under
its first (TP, CP, EP, DP) overlap choice, which gives its memory, and the rows that fit under
every other admissible choice too; the bound of a row is
  * steady state + bubble + ZeRO-2/3 traffic inside the pipeline (eqs. 9-12): the least over
    those choices (memory does not depend on them);
  * pipeline p2p (eq. 23): the least over the admissible PP-overlap choices of the exposure
    without overlap and of the part overlap can never hide (the warm-up/cool-down chains);
  * DP communication (eq. 24): >= 0, dropped;
  * optimizer update (eqs. 13, 26, 28): exact, for the rank class the exact model picks;
in integer ticks of 1 us times G, rounded down, so a row's bound never exceeds the exact step
time of any configuration in it. Memory and host memory are the exact model's (rounded down,
with the capacity rounded after scaling), so the constraints never cut an admissible row.

The outer loop (`solve_cpsat`): minimise the bound; score the optimum's overlap choices with
the exact model; with U the K-th best exact value so far, enumerate in widening bands every row
whose bound is below U and score those. Nothing unscored can beat U, so the best scored
configurations are certified optimal (top-K included). Under a time limit the answer carries
the gap to the best proven bound. Rows are disaggregated (the optimizer mode is part of the row)
because coupling rows to separate optimizer Booleans left the LP loose: the first formulations
took up to 200 s where this one takes a second.

Three paths, reported as the result's stats["path"] (`choose_path` picks one up front):
  * exhaustive scoring (optimizer.exhaustive.score_space, on this space and clock) where
    scoring every leaf costs no more than the tables are expected to: the tables score about
    one configuration per row plus one per fitting row and overlap choice, the enumerator one
    per leaf, so a space whose rows mostly fit and that has few overlap choices per row (no
    pipeline overlap to bound by its floor) is cheaper to score whole;
  * bound-ordered scoring of the tables, no solver, up to DIRECT_ROWS fitting rows;
  * the CP-SAT model above, beyond that.
All three are certified the same way (exhaustive: by having scored everything), and a time
limit bounds the whole solve, the path choice included.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from costmodel.configs import ConfigBatch
from costmodel.evaluate import evaluate
from costmodel.specs import Problem
from costmodel.units import GB
from optimizer.cp_solver import cp_solver, solve
from optimizer.exhaustive import score_space
from optimizer.result import SolveResult, Stopwatch, TopK, check_objective, e2e_of_step, floor_objective, objective_values
from optimizer.space import MEMORY_FEATURES, PURE_TIME_FEATURES, SKELETON_FIELDS, SearchSpace

TICK_S = 1e-6  # objective unit: one microsecond (times G)
MB = 1e6  # memory unit
#: the overlaps the bound enumerates (they change the pipeline's per-micro-batch work); pp overlap
#: is bounded by its floor, and the step-level DP exposure by zero
LAYER_OVERLAPS = ("tp_overlap", "cp_overlap", "ep_overlap", "dp_overlap")
SEED = 20261122
CHUNK = 65536  # configurations per exact-model batch
#: fitting rows up to which the table is scored in bound order without the solver (issue 11:
#: never slower than enumeration where enumeration suffices). The tables are in memory by
#: then and bound-ordered scoring costs one sort, while the solver's model holds a Boolean per
#: row: on Llama-3.1-8B on 128 H100s (202k fitting rows) the CP-SAT stage took 20 s where the
#: sort and scoring took 0.02 s, for the same certified optimum. The cap only bounds the sort's
#: memory; tests set it to 0 to exercise the solver path.
DIRECT_ROWS = 50_000_000
#: which path `solve_cpsat` takes: "auto" (`choose_path`), or "tables" or "exhaustive" (tests)
PATH = "auto"
#: the cost of one configuration the tables score, and of checking the feature rules on one
#: leaf, in configurations the exhaustive enumerator scores in the same time: the tables 1.26
#: (DeepSeek-V3 on 1,024 GPUs), 1.27 (gpt_oss_120b_144xgb200_nvl72), 1.36 (Llama-2-70B on
#: 1,024), 1.47 (llama3_405b_64gpu_gbs64) -- they check the rules twice on some configurations
#: and their batches share fewer layer costs; the rules about 0.1
TABLE_COST = 1.3
RULE_COST = 0.1
#: the fixed cost of one batch of the exact model, in configurations: 8-14 ms a call whatever
#: its size, against 2.5-3 us a configuration (llama2_70b_128gpu, deepseek_v3_1024gpu_sn256):
#: on small spaces the tables' many small batches cost more than their configurations
BATCH_COST = 4000
#: batches of bound-ordered scoring (blocks of 64, 128, ... rows, then the final ranking)
SCORING_BATCHES = 5
#: rows whose memory estimates the share of rows that fit (`table_work`)
PATH_SAMPLE = 2048
EXHAUSTIVE_PATH = "exhaustive scoring (scoring every leaf costs less than building the tables)"


def _floor(x) -> np.ndarray:
    return np.floor(np.nan_to_num(np.asarray(x, dtype=float), nan=0.0, posinf=1e18)).astype(np.int64)


@dataclass
class Tables:
    """One entry per admissible row that fits in memory: skeleton x recompute x offload x
    optimizer mode (the rows whose memory exceeds a capacity are never kept: `_block_tables`)."""

    G: int
    skeleton: np.ndarray  # index into space.skeletons
    features: dict[str, np.ndarray]  # MEMORY_FEATURES values of each row
    objective: np.ndarray  # ticks x G: lower bound of the step time
    memory: np.ndarray  # MB x G: peak GPU memory of the worst rank (rounded down)
    host: np.ndarray  # MB x G: host memory per GPU (rounded down)
    complete: bool = True  # False when a time limit stopped the building: rows of some skeletons are missing
    paired: int = 0  # rows looked at (skeleton x memory choice), before the rules and the memory capacities
    interrupted: bool = False  # Ctrl-C stopped the building (as a time limit would: `complete` is False)


def build_tables(problem: Problem, space: SearchSpace, out_of_time=None) -> Tables:
    """The rows and their bounds, built per skeleton signature (space._signature): each group
    of skeletons is paired with the memory choices and overlap choices its fields leave
    possible, so the exact model scores no configuration the rules reject outright.
    `out_of_time()` (checked between batches of the exact model) stops the building early: the
    tables then hold only the rows built, and `Tables.complete` is False; so does Ctrl-C
    (`Tables.interrupted`)."""
    choices = space.memory_choices
    sig = space._signature(space.skeletons)
    parts, complete, paired, interrupted = [], True, 0, False
    for code in np.unique(sig):
        if out_of_time is not None and parts and out_of_time():
            complete = False
            break
        stopped = []
        group = _group_tables(problem, space, np.flatnonzero(sig == code), int(code), out_of_time, stopped)
        if group is not None:
            paired += group[0]
            parts.append(group[1:])
        if stopped:
            complete, interrupted = False, "interrupted" in stopped
            break
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return Tables(problem.cluster.num_gpus, empty, {name: np.zeros(0) for name in MEMORY_FEATURES}, empty, empty, empty, complete, paired,
                      interrupted)
    order = np.lexsort((np.concatenate([t[1] for t in parts]), np.concatenate([t[0] for t in parts])))  # skeleton-major, canonical
    skeleton, choice, objective, memory, host = (np.concatenate([t[i] for t in parts])[order] for i in range(5))
    return Tables(
        G=problem.cluster.num_gpus,
        skeleton=skeleton,
        features={name: choices[choice, j] for j, name in enumerate(MEMORY_FEATURES)},
        objective=objective,
        memory=memory,
        host=host,
        complete=complete,
        paired=paired,
        interrupted=interrupted,
    )


def _group_tables(problem: Problem, space: SearchSpace, skeletons: np.ndarray, code: int, out_of_time=None, stopped: list | None = None):
    """(rows paired, then skeleton, memory choice, objective, memory, host of the admissible
    fitting rows) of one signature group, or None. Rows go to `_block_tables` CHUNK at a time;
    when `out_of_time()` turns true, the rows scored so far are returned and True is appended
    to `stopped`."""
    mem_ok, triples = _group_choices(space, code)
    if len(skeletons) == 0 or len(mem_ok) == 0 or len(triples) == 0:
        return None
    row_sk = np.repeat(skeletons, len(mem_ok))
    row_choice = np.tile(mem_ok, len(skeletons))
    parts = []
    for lo in range(0, len(row_sk), CHUNK):
        if lo and out_of_time is not None and out_of_time():
            if stopped is not None:
                stopped.append(True)
            break
        try:
            parts.append(_block_tables(problem, space, row_sk[lo:lo + CHUNK], row_choice[lo:lo + CHUNK], triples, out_of_time, stopped))
        except KeyboardInterrupt:  # Ctrl-C: as a time limit would, the rows built so far (their block's lost)
            if stopped is None:
                raise
            stopped.append("interrupted")
        if stopped:
            break
    if not parts:
        return None
    return (len(row_sk),) + tuple(np.concatenate([part[i] for part in parts]) for i in range(5))


def _group_choices(space: SearchSpace, code: int) -> tuple[np.ndarray, np.ndarray]:
    """(memory choices, LAYER_OVERLAPS value triples) that skeletons of signature `code` may
    take: ZeRO only with a data-parallel group, each overlap only where the gate allows it."""
    gate = dict(zip(space.GATES, ((code >> i) & 1 for i in range(len(space.GATES)))))
    choices = space.memory_choices
    mem_ok = np.flatnonzero((choices[:, MEMORY_FEATURES.index("zero_stage")] == 0) | (gate["zero_stage"] == 1))
    options = [tuple(v for v in space.flags[n] if v == 0 or gate[n]) for n in LAYER_OVERLAPS]
    return mem_ok, np.array(list(itertools.product(*options)), dtype=float).reshape(-1, len(LAYER_OVERLAPS))


def _fitting(problem: Problem, peak_bytes: np.ndarray, host_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(memory, host memory, fits) in the tables' units: build_model's constraints, applied
    before the model is built."""
    G = problem.cluster.num_gpus
    gpu_capacity, host_capacity = _capacities(problem, G)
    memory, host = _floor(peak_bytes * G / MB), _floor(host_bytes * G / MB)
    return memory, host, (memory <= gpu_capacity) & (host <= host_capacity)


def _draw(n: int, k: int) -> np.ndarray:
    """k indices of range(n), sorted: all of them when k >= n, else drawn at random with a fixed
    seed (evenly spaced picks can fall in step with an inner dimension, e.g. always the first
    memory choice of a skeleton)."""
    if k >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(SEED).integers(0, n, k))


def table_work(problem: Problem, space: SearchSpace) -> tuple[float, int]:
    """(configurations, batches) of the exact model `build_tables` is expected to score: every
    row once under its first overlap choice, and the rows that fit under their other choices
    (`_block_tables`). The share that fits is estimated on about PATH_SAMPLE rows drawn over
    the signature groups in proportion (`_draw`), each standing for its share of its group."""
    sig = space._signature(space.skeletons)
    groups = []
    for code in np.unique(sig):
        mem_ok, triples = _group_choices(space, int(code))
        if len(mem_ok) and len(triples):
            groups.append((np.flatnonzero(sig == code), mem_ok, triples))
    rows = sum(len(skeletons) * len(mem_ok) for skeletons, mem_ok, _ in groups)
    if rows == 0:
        return 0.0, 0
    samples, weights, group = [], [], []
    for g, (skeletons, mem_ok, triples) in enumerate(groups):
        n = len(skeletons) * len(mem_ok)
        pick = _draw(n, max(1, round(PATH_SAMPLE * n / rows)))  # row i is skeleton i // len(mem_ok) with choice i % len(mem_ok)
        samples.append(_row_configs(problem, space, skeletons[pick // len(mem_ok)], mem_ok[pick % len(mem_ok)], triples[:1]))
        weights.append(np.full(len(pick), n / len(pick) * (len(triples) - 1)))
        group.append(np.full(len(pick), g))
    ev = evaluate(problem, ConfigBatch.concat(samples))
    fits = _fitting(problem, ev.memory_bytes["peak"], ev.host_bytes)[2]
    others = np.bincount(np.concatenate(group)[fits], weights=np.concatenate(weights)[fits], minlength=len(groups))
    batches = SCORING_BATCHES
    lean_rows = 0
    for (skeletons, mem_ok, triples), extra in zip(groups, others):
        blocks = -(-len(skeletons) * len(mem_ok) // CHUNK)
        lean = _lean_tp_overlap(problem, triples) is not None  # the first choices scored twice
        lean_rows += lean * len(skeletons) * len(mem_ok)
        batches += (2 + 2 * lean) * blocks + int(math.ceil(extra / CHUNK))  # first choices and the pp rules per block, then the others
    return rows + lean_rows + float(others.sum()), batches


def enumeration_work(space: SearchSpace) -> tuple[float, int, int]:
    """(admitted leaves, leaves, batches) of the exhaustive enumerator on `space`: it checks the
    feature rules on every leaf and scores the admitted ones (43% of the leaves are rejected on
    gpt_oss_120b_144xgb200_nvl72, 2% on DeepSeek-V3). The admitted share is estimated on about
    PATH_SAMPLE leaves drawn over the signature groups in proportion (`_draw`)."""
    leaves, batches = space.enumeration(CHUNK)
    if leaves == 0:
        return 0.0, 0, 0
    sig = space._signature(space.skeletons)
    skeleton, feature, weights = [], [], []
    for code in np.unique(sig):
        skeletons, features = np.flatnonzero(sig == code), np.flatnonzero(space._features_for(int(code)))
        n = len(skeletons) * len(features)
        if n:
            pick = _draw(n, max(1, round(PATH_SAMPLE * n / leaves)))  # leaf i is skeleton i // F with feature i % F
            skeleton.append(skeletons[pick // len(features)])
            feature.append(features[pick % len(features)])
            weights.append(np.full(len(pick), n / len(pick)))
    cfg = space.combine(np.concatenate(skeleton), np.concatenate(feature), space.interval())
    return float(np.concatenate(weights)[space.feature_ok(cfg)].sum()), leaves, batches


def choose_path(problem: Problem, space: SearchSpace) -> tuple[str, dict]:
    """"exhaustive" where scoring every leaf (`enumeration_work`) costs no more than the
    tables' expected work (`table_work`), both in configurations the enumerator scores
    (RULE_COST, TABLE_COST, BATCH_COST), else "tables"; with the figures."""
    admitted, leaves, batches = enumeration_work(space)
    work, table_batches = table_work(problem, space)
    enumeration = RULE_COST * leaves + admitted + BATCH_COST * batches
    tables = TABLE_COST * work + BATCH_COST * table_batches
    figures = {"leaves": leaves, "table_work": int(round(work)), "cost_ratio": round(tables / max(enumeration, 1.0), 3)}
    return ("exhaustive" if enumeration <= tables else "tables"), figures


#: the fields a table row fixes: its skeleton, its memory choice and the layer overlaps (the
#: pp overlap is left open, bounded by its floor)
ROW_FIELDS = SKELETON_FIELDS + MEMORY_FEATURES + LAYER_OVERLAPS


def _row_configs(problem: Problem, space: SearchSpace, row_sk: np.ndarray, row_choice: np.ndarray, triples: np.ndarray) -> ConfigBatch:
    """Each row (skeleton, memory choice) under each of `triples` (LAYER_OVERLAPS values),
    row-major."""
    n_tri = len(triples)
    idx_row = np.repeat(np.arange(len(row_sk)), n_tri)
    idx_tri = np.tile(np.arange(n_tri), len(row_sk))
    sk = space.skeletons
    cols = {name: getattr(sk, name)[row_sk[idx_row]] for name in SKELETON_FIELDS}
    chosen = space.memory_choices[row_choice[idx_row]]
    for j, name in enumerate(MEMORY_FEATURES):
        cols[name] = chosen[:, j]
    for j, name in enumerate(LAYER_OVERLAPS):
        cols[name] = triples[idx_tri, j]
    return ConfigBatch.from_columns(problem.cluster.num_gpus, **cols)  # pp overlap left open below


def _bound_terms(problem: Problem, space: SearchSpace, cfg: ConfigBatch) -> dict[str, np.ndarray]:
    """The exact model's terms the bound is made of (module docstring), per configuration:
    the steady state with the bubble and the optimizer update (infinite where no value of the
    pp overlap makes the configuration admissible), the pipeline p2p floors, the memory."""
    ok = space.viable(cfg, ("pp_overlap",))
    ev = evaluate(problem, cfg)
    b = ev.breakdown_s
    steady = b["compute"] + b["recompute"] + b["tp"] + b["cp"] + b["ep"] + b["fsdp"] + b["offload"] + b["overhead"] + b["bubble"]
    return {
        "steady_bubble": np.where(ok, steady, np.inf),
        "update": np.where(ok, b["update"], np.inf),
        "pp_overlap_floor": ev.pp_overlap_floor_s,
        "pp_without_overlap": ev.pp_without_overlap_s,
        "peak": ev.memory_bytes["peak"],
        "host": ev.host_bytes,
    }


def _lean_tp_overlap(problem: Problem, triples: np.ndarray) -> np.ndarray | None:
    """The first overlap choice with TP overlap on, where that can take memory away: without
    Megatron's async backward (training.tp_backward_overlap false: DTensor TP), the column-parallel
    GEMMs keep their all-gathered inputs unless TP overlap (async TP) fuses the gathers
    (costmodel.architecture.Shard.keeps_gathered). None where TP overlap only adds memory
    (its staging buffers) or is not a choice."""
    j = LAYER_OVERLAPS.index("tp_overlap")
    if problem.training.tp_backward_overlap or not np.any(triples[:, j] == 1):
        return None
    lean = triples[:1].copy()
    lean[0, j] = 1.0
    return lean


def _block_tables(problem: Problem, space: SearchSpace, row_sk: np.ndarray, row_choice: np.ndarray, triples: np.ndarray, out_of_time=None, stopped: list | None = None):
    """(skeleton, memory choice, objective, memory, host) of the admissible rows of a block
    that fit in memory. A row's memory is its first overlap choice's: the layer overlaps
    change no memory but for TP overlap's buffers, which only add, and the first choice has
    TP overlap off wherever off is allowed -- except under DTensor TP, where TP overlap (async
    TP) also drops the gathered inputs the GEMMs keep: there the row's memory is the least of
    the first choice and the first choice with TP overlap on (`_lean_tp_overlap`; the exact
    model checks the chosen configuration's own). So every row is scored under its first choice,
    and only the rows that fit (build_model's capacities, in its units) under the others: the
    rows that cannot fit (three in four on DeepSeek-V3 on 1,024 GPUs) cost one configuration
    each, not one per overlap choice (`_fitting`). When `out_of_time()` turns true between batches, the
    rows scored under every choice so far are returned and True is appended to `stopped`."""
    G = problem.cluster.num_gpus
    first = _row_configs(problem, space, row_sk, row_choice, triples[:1])
    terms = _bound_terms(problem, space, first)
    peak, host_bytes = terms["peak"], terms["host"]
    lean = _lean_tp_overlap(problem, triples)
    if lean is not None:  # a row's memory is its least over TP overlap: DTensor TP drops its gathered inputs with it
        alt = _bound_terms(problem, space, _row_configs(problem, space, row_sk, row_choice, lean))
        peak, host_bytes = np.minimum(peak, alt["peak"]), np.minimum(host_bytes, alt["host"])
    memory, host, fits = _fitting(problem, peak, host_bytes)
    fit = np.flatnonzero(fits)
    n_tri = len(triples)
    steady, update = np.empty((len(fit), n_tri)), np.empty((len(fit), n_tri))
    steady[:, 0], update[:, 0] = terms["steady_bubble"][fit], terms["update"][fit]
    per = max(1, CHUNK // max(n_tri - 1, 1))  # rows per batch of the other choices
    for lo in range(0, len(fit) if n_tri > 1 else 0, per):
        if lo and out_of_time is not None and out_of_time():  # the rows done so far
            fit, steady, update = fit[:lo], steady[:lo], update[:lo]
            if stopped is not None:
                stopped.append(True)
            break
        rows = fit[lo:lo + per]
        rest = _bound_terms(problem, space, _row_configs(problem, space, row_sk[rows], row_choice[rows], triples[1:]))
        steady[lo:lo + len(rows), 1:] = rest["steady_bubble"].reshape(len(rows), n_tri - 1)
        update[lo:lo + len(rows), 1:] = rest["update"].reshape(len(rows), n_tri - 1)
    best = steady.min(axis=1)  # the least over the overlap choices a row admits
    # pipeline p2p: the least over the PP-overlap choices this row admits
    head = first.take(fit)
    pp_options = []
    for value, floor in ((1, terms["pp_overlap_floor"]), (0, terms["pp_without_overlap"])):
        if value in space.flags["pp_overlap"]:
            trial = ConfigBatch.from_columns(G, **{f: getattr(head, f) for f in ROW_FIELDS}, pp_overlap=value)
            pp_options.append(np.where(space.viable(trial, LAYER_OVERLAPS), floor[fit], np.inf))
    pp = np.minimum.reduce(pp_options) if pp_options else np.full(len(fit), np.inf)
    bound = best + pp + update.min(axis=1)
    kept = np.isfinite(best) & np.isfinite(pp)
    keep = fit[kept]
    return row_sk[keep], row_choice[keep], _floor(bound[kept] * G / TICK_S), memory[keep], host[keep]


@dataclass
class ModelVars:
    choice: list
    index: cp_model.IntVar  # the chosen row
    objective: cp_model.IntVar


def build_model(problem: Problem, tb: Tables) -> tuple[cp_model.CpModel, ModelVars]:
    """The lower-bounding model (module docstring), in one function: pick exactly one row;
    its peak memory within the GPU and its host memory within the GPU's share of the node;
    the objective is the row's bound."""
    model = cp_model.CpModel()
    choice = [model.NewBoolVar(f"row_{i}") for i in range(len(tb.objective))]
    model.AddExactlyOne(choice)
    index = model.NewIntVar(0, len(choice) - 1, "index")
    model.Add(index == cp_model.LinearExpr.WeightedSum(choice, list(range(len(choice)))))
    gpu_capacity, host_capacity = _capacities(problem, tb.G)
    model.Add(cp_model.LinearExpr.WeightedSum(choice, [int(x) for x in tb.memory]) <= gpu_capacity)
    model.Add(cp_model.LinearExpr.WeightedSum(choice, [int(x) for x in tb.host]) <= host_capacity)
    objective = model.NewIntVar(0, int(tb.objective.max()), "objective")
    model.Add(objective == cp_model.LinearExpr.WeightedSum(choice, [int(x) for x in tb.objective]))
    return model, ModelVars(choice, index, objective)


class _Collector(cp_model.CpSolverSolutionCallback):
    """Records every assignment the solver reports: the improving ones while minimising, all
    of them while enumerating."""

    def __init__(self, mv: ModelVars):
        super().__init__()
        self.mv = mv
        self.found: list[int] = []

    def on_solution_callback(self):
        self.found.append(self.Value(self.mv.index))


def _solver(time_limit_s: float | None, workers: int) -> cp_model.CpSolver:
    """Ctrl-C stops the search as a time limit would: the best so far is reported (cp_solver)."""
    return cp_solver(time_limit_s, workers, SEED, ctrl_c_stops_search=True)


def _configs(problem: Problem, space: SearchSpace, tb: Tables, found) -> ConfigBatch:
    """The configurations of each chosen row: its skeleton and memory features, crossed with
    every admissible choice of the pure-time overlaps."""
    overlaps = np.array(list(itertools.product(*(space.flags[n] for n in PURE_TIME_FEATURES))), dtype=float)
    rows = np.repeat(np.array(sorted(set(found)), dtype=np.int64), len(overlaps))
    sk = space.skeletons
    cols = {name: getattr(sk, name)[tb.skeleton[rows]] for name in SKELETON_FIELDS}
    cols.update({name: values[rows] for name, values in tb.features.items()})
    for j, name in enumerate(PURE_TIME_FEATURES):
        cols[name] = np.tile(overlaps[:, j], len(rows) // max(len(overlaps), 1))
    cfg = ConfigBatch.from_columns(problem.cluster.num_gpus, **cols, interval=space.interval())
    return cfg.take(np.flatnonzero(space.feature_ok(cfg)))


def solve_cpsat(problem: Problem, objective: str = "step", top_k: int = 1, time_limit_s: float | None = None, workers: int = 1, distinct_layouts: bool = False) -> SolveResult:
    check_objective(problem, objective)
    clock = Stopwatch()
    space = SearchSpace.from_problem(problem)
    stats = {"skeletons": len(space.skeletons)}
    if len(space.skeletons):
        path = PATH
        if path == "auto":
            path, figures = choose_path(problem, space)
            stats.update(figures, choice_s=round(clock.elapsed, 3))
        if path == "exhaustive":  # the enumerator itself, on this space and this clock
            stats["path"] = EXHAUSTIVE_PATH
            result = score_space(problem, space, objective, top_k, time_limit_s, CHUNK, distinct_layouts, clock, "cpsat", stats)
            if result.status == "infeasible":
                result.lower_bound = math.inf  # as the tables' paths say it: nothing is admissible
            return result
    out_of_time = None if time_limit_s is None else (lambda: clock.elapsed > time_limit_s)
    tb = build_tables(problem, space, out_of_time) if len(space.skeletons) else None
    if tb is not None and not tb.complete:
        # the limit ran out (or Ctrl-C came) while the tables were built: what was built is
        # searched, and the skeletons left out are bounded by the compute floor, so the answer
        # keeps its gap
        stats["tables_complete"] = False
        if tb.interrupted:
            stats["interrupted"] = True
        result = _solve_tables(problem, space, tb, objective, top_k, time_limit_s, workers, distinct_layouts, clock, stats)
        return _partial(problem, space, result, objective)
    if tb is None:  # no admissible skeleton
        return SolveResult("cpsat", objective, "infeasible", np.zeros(0), None, clock.elapsed, 0, lower_bound=math.inf, space_size=space.size, stats=stats)
    return _solve_tables(problem, space, tb, objective, top_k, time_limit_s, workers, distinct_layouts, clock, stats)


def _partial(problem: Problem, space: SearchSpace, result: SolveResult, objective: str) -> SolveResult:
    """A result over part of the tables: never certified; its bound is the least of the part's
    and the compute floor's (optimizer.result.floor_objective), which covers the rest."""
    floor = floor_objective(problem, objective, space.interval())
    if result.status in ("optimal", "feasible"):
        result.status = "feasible"
        result.lower_bound = min(floor, result.lower_bound if result.lower_bound is not None else math.inf)
    else:
        result.status, result.lower_bound = "unknown", floor
    return result


def _solve_tables(problem, space, tb, objective, top_k, time_limit_s, workers, distinct_layouts, clock, stats) -> SolveResult:
    """Search the tables: score them in bound order when small, else CP-SAT (module docstring)."""
    stats.update(choices=tb.paired, fitting=len(tb.objective), tables_s=round(clock.elapsed, 3))
    if len(tb.objective) == 0:
        stats["path"] = "tables (no admissible row fits)"
        return SolveResult("cpsat", objective, "infeasible", np.zeros(0), None, clock.elapsed, 0, lower_bound=math.inf, space_size=space.size, stats=stats)
    best = TopK(top_k, distinct_layouts)  # ranked by step time: the end-to-end time increases with it
    evaluated = 0

    def score(found) -> None:
        nonlocal evaluated
        if found:
            cfg = _configs(problem, space, tb, found)
            if len(cfg):
                evaluated += len(cfg)
                best.offer(objective_values(evaluate(problem, cfg), "step"), cfg)

    def remaining():
        return None if time_limit_s is None else max(0.05, time_limit_s - clock.elapsed)

    if len(tb.objective) <= DIRECT_ROWS:
        # a table this small is scored in bound order, no solver needed: every row whose bound
        # is below the K-th best exact value is scored, then the rest cannot beat it
        stats["path"] = "bound-ordered scoring (table small enough to score whole)"
        scoring = Stopwatch()
        order = np.argsort(tb.objective, kind="stable")
        start, block, complete = 0, 64, True
        while start < len(order):
            threshold = best.threshold
            if math.isfinite(threshold) and tb.objective[order[start]] > math.floor(threshold * tb.G / TICK_S):
                break
            if time_limit_s is not None and clock.elapsed > time_limit_s and evaluated:
                # out of time, but never without an answer: the rows with the least bounds
                # are scored even when the tables alone used up the limit
                complete = False
                break
            score(order[start:start + block].tolist())
            start += block
            block *= 2
        stats["scoring_s"] = round(scoring.elapsed, 3)
        proven = float(tb.objective[order[min(start, len(order) - 1)]]) if not complete else float(tb.objective[order[0]])
        return _finish(problem, space, tb, best, objective, complete, proven, clock, evaluated, stats)
    stats["path"] = "CP-SAT"

    # phase 1: the least lower bound (and every improving assignment on the way)
    base, mv = build_model(problem, tb)
    model = base.Clone()
    model.Minimize(model.GetIntVarFromProtoIndex(mv.objective.Index()))
    solver = _solver(remaining(), workers)
    collector = _Collector(ModelVars(mv.choice, model.GetIntVarFromProtoIndex(mv.index.Index()), model.GetIntVarFromProtoIndex(mv.objective.Index())))
    status = solve(solver, model, collector)
    stats.update(phase1=solver.StatusName(status), phase1_s=round(solver.WallTime(), 3))
    if status == cp_model.INFEASIBLE:
        return SolveResult("cpsat", objective, "infeasible", np.zeros(0), None, clock.elapsed, 0, lower_bound=math.inf, space_size=space.size, stats=stats)
    proven = solver.BestObjectiveBound() if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else 0.0
    score(collector.found)

    # phase 2: every choice whose bound is below the K-th best exact value U. Enumerate in
    # widening bands above the proven bound, re-scoring after each band: U only falls, and
    # once the band's upper edge reaches U nothing unscored can beat it.
    complete = status == cp_model.OPTIMAL
    if complete:
        floor_value = math.floor(proven)
        covered = floor_value - 1  # bands enumerated so far cover bound values <= covered
        width = max(1.0, 0.002 * proven)
        stats.update(bands=0, enumerated=0, phase2_s=0.0)
        while True:
            threshold = best.threshold
            limit = math.floor(threshold * tb.G / TICK_S) if math.isfinite(threshold) else None
            if limit is not None and covered >= limit:
                break
            upper = covered + width if limit is None else min(limit, covered + width)
            model2 = base.Clone()  # the same rows, restricted to the band
            objective2 = model2.GetIntVarFromProtoIndex(mv.objective.Index())
            model2.Add(objective2 <= int(upper))
            model2.Add(objective2 >= int(covered) + 1)
            solver2 = _solver(remaining(), 1)
            solver2.parameters.enumerate_all_solutions = True
            collector2 = _Collector(ModelVars(mv.choice, model2.GetIntVarFromProtoIndex(mv.index.Index()), objective2))
            status2 = solve(solver2, model2, collector2)
            stats["bands"] += 1
            stats["enumerated"] += len(collector2.found)
            stats["phase2_s"] = round(stats["phase2_s"] + solver2.WallTime(), 3)
            score(collector2.found)
            if status2 not in (cp_model.OPTIMAL, cp_model.INFEASIBLE):
                complete = False  # out of time inside a band
                break
            covered = upper
            if limit is None and covered >= tb.objective.max():
                break  # the whole table is enumerated
            width *= 2.0

    return _finish(problem, space, tb, best, objective, complete, proven, clock, evaluated, stats)


def _finish(problem, space, tb, best, objective, complete, proven, clock, evaluated, stats) -> SolveResult:
    """The result: the best scored configurations re-ranked by the objective, certified when
    the search was complete, else with the proven bound (in ticks x G)."""
    values, top = np.zeros(0), None
    if best.configs is not None:
        values = objective_values(evaluate(problem, best.configs), objective)
        order = np.lexsort((np.arange(len(values)), values))
        order = order[np.isfinite(values[order])]
        if len(order):
            values, top = values[order], best.configs.take(order)
        else:
            values = np.zeros(0)
    lower = proven * TICK_S / tb.G
    if objective == "e2e":
        lower = e2e_of_step(problem, lower, space.interval()) if lower > 0 else 0.0
    if top is None:
        state = "infeasible" if complete else "unknown"
    else:
        state = "optimal" if complete else "feasible"
        if complete:
            lower = float(values[0])
    return SolveResult("cpsat", objective, state, values, top, clock.elapsed, evaluated, lower_bound=lower, space_size=space.size, stats=stats)


def _capacities(problem: Problem, G: int) -> tuple[int, int]:
    hw, cl = problem.hardware, problem.cluster
    gpu = int(math.floor(hw.memory_bytes * G / MB))
    host = int(math.floor(hw.host_memory_gb_per_node * GB / cl.gpus_per_node * G / MB))
    return gpu, host


