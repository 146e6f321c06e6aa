"""CP-SAT tuning: a lower-bounding integer model, certified by the exact cost model.

What the solver decides (OR-Tools CP-SAT)
  * `choice`: one Boolean per admissible (skeleton, recompute, activation offload), one-hot.
    A skeleton is a Megatron-admissible (tp, cp, pp, vp, ep, etp, mbs, layer split) from the
    search space;
  * `dist`, `cpu`: the distributed optimizer and the CPU optimizer, which interact with the
    skeleton through memory (eqs. 25, 27) and the update time (eqs. 26, 28).
The five pure-time overlap switches (TP, CP, EP, PP, DP overlap) change no memory: the tables
keep the best of them, and the outer loop evaluates all of them exactly.

Tables (`build_tables`), all from the exact model's own functions, never re-derived:
  * per layer choice (layer shape x recompute x offload): `layer_costs` gives the per-layer
    forward+backward time of the dense and the MoE layer (the least over the overlap
    switches), the embedding and head times, parameters, and the activation ledger;
  * per pipeline shape: `rank_classes` gives the layers of the first, middle and last rank;
  * per skeleton: micro-batches m, `in_flight` activations, the pipeline hop (`p2p_hop` over
    `stage_groups`).
They are combined per choice into lower bounds of the exact terms (integer ticks of 1 us,
times G so that sums stay integers, rounded down):
  * steady state (eqs. 9-12): m * max_r R_r, R_r = n_r,dense L_dense + n_r,moe L_moe + edges_r;
  * bubble: (sum_r R_r - max_r R_r) / vp;
  * pipeline p2p (eq. 23): exact without overlap; with it 2*(vp*pp-1)*hop, the steady hops
    dropped (eq. 23's remainder is >= 0);
  * DP communication (eq. 24): >= 0;
  * optimizer update (eqs. 13, 26, 28): exact, per rank class, the slowest counted;
and memory (eqs. 4-6, 25, 27, 29-33): static + optimizer states + max(activations, the
optimizer step's gradient copy) + buffers, per rank class, within the GPU's capacity.
Each bound is at most the exact value, so the model's optimum is a lower bound of the exact
optimum, and the exact model has the last word on memory.

The outer loop (`solve_cpsat`): minimise the bound; score the optimum's overlap choices with
the exact model; with U the K-th best exact value so far, enumerate every choice whose bound
is below U and score those. Nothing unscored can beat U, so the best scored configurations are
certified optimal (top-K included). Under a time limit the answer carries the gap to the best
proven bound.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from costmodel.configs import ConfigBatch
from costmodel.evaluate import checkpoint_save_s, evaluate, layer_costs
from costmodel.network import Network
from costmodel.pipeline import in_flight, rank_classes
from costmodel.placement import stage_groups
from costmodel.reliability import end_to_end_s, failure_rate_per_s, optimal_interval
from costmodel.specs import Problem
from costmodel.units import GB, US
from costmodel.update import ADAM_KERNELS, adam_bytes_per_param
from optimizer.result import SolveResult, Stopwatch, TopK, check_objective, objective_values
from optimizer.space import SKELETON_FIELDS, SearchSpace

TICK_S = 1e-6  # objective unit: one microsecond (times G)
MB = 1e6  # memory unit
PURE_TIME_FEATURES = ("tp_overlap", "cp_overlap", "ep_overlap", "pp_overlap", "dp_overlap")
SEED = 20261122
CLASSES = 3  # first, middle, last pipeline rank


def _floor(x) -> np.ndarray:
    return np.floor(np.nan_to_num(np.asarray(x, dtype=float), nan=0.0, posinf=1e18)).astype(np.int64)


@dataclass
class Tables:
    """One row per choice: skeleton x recompute x offload x optimizer mode."""

    G: int
    skeleton: np.ndarray  # index into space.skeletons
    recompute: np.ndarray
    offload: np.ndarray
    dist: np.ndarray
    cpu: np.ndarray
    objective: np.ndarray  # ticks x G: steady + bubble + pipeline p2p + update (lower bound)
    memory: np.ndarray  # [choice, rank class], MB x G: peak memory (lower bound)


def build_tables(problem: Problem, space: SearchSpace) -> Tables:
    m, tr, hw, cl = problem.model, problem.training, problem.hardware, problem.cluster
    G, gbs = cl.num_gpus, tr.global_batch_size
    sk = space.skeletons
    n_sk = len(sk)

    # ---- layer costs of every skeleton under every (recompute, offload, overlaps) ----------
    rec_off = [(r, o) for r in space.recompute for o in space.flags["activation_offload"] if not (o == 1 and r != 0)]
    overlaps = list(itertools.product(*(space.flags[n] for n in ("tp_overlap", "cp_overlap", "ep_overlap"))))
    n_ro, n_ov = len(rec_off), len(overlaps)
    i_sk = np.repeat(np.arange(n_sk), n_ro * n_ov)
    i_ro = np.tile(np.repeat(np.arange(n_ro), n_ov), n_sk)
    i_ov = np.tile(np.arange(n_ov), n_sk * n_ro)
    cols = {name: getattr(sk, name)[i_sk] for name in SKELETON_FIELDS}
    cols["recompute"] = np.array([r for r, _ in rec_off], dtype=float)[i_ro]
    cols["activation_offload"] = np.array([o for _, o in rec_off], dtype=float)[i_ro]
    for j, name in enumerate(("tp_overlap", "cp_overlap", "ep_overlap")):
        cols[name] = np.array([ov[j] for ov in overlaps], dtype=float)[i_ov]
    cfg = ConfigBatch.from_columns(G, **cols)
    admissible = space.feature_ok(cfg)
    from costmodel.evaluate import shared_layer_costs  # MPE reuse: few distinct layer shapes

    lc = shared_layer_costs(problem, cfg)
    rows = n_sk * n_ro

    def best(values):  # least over the overlap switches (admissible ones)
        return np.where(admissible, values, np.inf).reshape(rows, n_ov).min(axis=1)

    def pick(values):  # quantities the overlap switches do not change
        return np.asarray(values, dtype=float).reshape(rows, n_ov)[:, 0]

    L_d = best(lc.dense.total)
    L_m = best(lc.moe.total) if lc.moe is not None else np.zeros(rows)
    exists = np.isfinite(L_d) & np.isfinite(L_m)
    L_d, L_m = np.where(exists, L_d, 0.0), np.where(exists, L_m, 0.0)
    emb_t = pick(lc.embedding_f + lc.embedding_b)
    head_t = pick(lc.head_compute + lc.head_tp)

    # ---- per choice: its skeleton's pipeline shape ------------------------------------------
    sk_of = np.repeat(np.arange(n_sk), n_ro)
    skc = sk.take(sk_of)
    ranks = rank_classes(m.num_layers, m.num_dense_layers, skc)
    p, v = skc.pp, skc.vp
    micro = gbs / np.maximum(skc.mbs * np.maximum(skc.dp, 1), 1)
    edges = [(1.0, p == 1), (0.0, p <= 2), (0.0, np.ones_like(p, bool))]  # (embedding, head) per class
    R = [r.dense * L_d + r.moe * L_m + emb * emb_t + head * head_t for r, (emb, head) in zip(ranks, edges)]
    r_max = np.maximum(np.maximum(R[0], R[1]), R[2])
    steady = micro * r_max
    bubble = np.where(p == 1, 0.0, (R[0] + R[2] + np.maximum(p - 2, 0) * R[1] - r_max) / v)

    net = Network(hw, cl)
    groups = stage_groups(cl.placement, sk, net)
    hop = net.p2p_hop(layer_costs(problem, sk).hop_bytes, groups.pp)[sk_of]
    can_overlap = (v > 1) & (p > 1) & (1 in space.flags["pp_overlap"])
    plain_ok = ~can_overlap | (0 in space.flags["pp_overlap"])
    with_overlap = np.where(can_overlap, 2 * (v * p - 1) * hop, np.inf)
    without = np.where(plain_ok, (2 * micro * v + 2 * (p - 1)) * hop, np.inf)
    pp = np.where(p > 1, np.minimum(with_overlap, without), 0.0)
    pipeline = (steady + bubble + pp) * G / TICK_S

    # ---- memory and update per rank class -----------------------------------------------------
    d_para, d_grad, d_opt = tr.bytes_of("params"), tr.bytes_of("grads"), tr.bytes_of("optimizer")
    factor = 4 if tr.optimizer_memory == "mofa_eq4" else (3 if d_para < d_opt else 2)
    transient_factor = 0 if tr.optimizer_memory == "mofa_eq4" or d_grad >= d_opt else 1
    dense_p = pick(lc.dense.params)
    moe_p = pick(lc.moe.params - lc.moe.expert_params) if lc.moe is not None else 0.0 * dense_p
    expert_p = pick(lc.moe.expert_params) if lc.moe is not None else 0.0 * dense_p
    emb_p, head_p = pick(lc.embedding_params), pick(lc.head_params)
    act_d = pick(lc.dense.activation)
    act_m = pick(lc.moe.activation) if lc.moe is not None else 0.0 * act_d
    full_d = pick(lc.dense.saved_full)
    full_m = pick(lc.moe.saved_full) if lc.moe is not None else 0.0 * act_d
    rec = np.array([r for r, _ in rec_off], dtype=float)[np.tile(np.arange(n_ro), n_sk)]
    off = np.array([o for _, o in rec_off], dtype=float)[np.tile(np.arange(n_ro), n_sk)]
    chunk_input = pick(lc.dense.input_bytes)
    head_saved = pick(lc.head_saved)
    hop_bytes = pick(lc.hop_bytes)
    t_shard = skc.tp * p / G  # dense params / (cp*dp)
    e_shard = skc.ep * skc.etp * p / G  # expert params / edp

    eff = hw.efficiency
    frac = 1.0 if eff.mode == "roofline" else eff.memory_bound_fraction
    gpu_rate = adam_bytes_per_param(d_para, d_opt) / (frac * hw.memory_bandwidth_gb_per_s * GB)
    link = eff.host_link_efficiency * GB
    cpu_rate = 1.0 / hw.cpu_optimizer_params_per_s + d_grad / (hw.d2h_gb_per_s * link) + d_para / (hw.h2d_gb_per_s * link)
    gpu_fixed = ADAM_KERNELS * eff.kernel_overhead_us * US

    # memory and update of every rank class under every optimizer mode
    modes = [(d, c) for d in space.flags["distributed_optimizer"] for c in space.flags["cpu_optimizer"]]
    dist_ok = (skc.cp * np.maximum(skc.dp, 1)) > 1
    host_share = hw.host_memory_gb_per_node * GB / cl.gpus_per_node
    memory = {mode: np.zeros((rows, CLASSES)) for mode in modes}
    update = {mode: np.zeros(rows) for mode in modes}
    for k, (rank, (emb, head)) in enumerate(zip(ranks, edges)):
        tied_single_stage = m.tied_embeddings and k == 0  # the head reuses the embedding on one stage
        head_here = head * (head_p - emb_p if tied_single_stage else head_p)
        dense_params = rank.dense * dense_p + rank.moe * moe_p + emb * emb_p + head_here
        experts = rank.moe * expert_p
        params = dense_params + experts
        shard = dense_params * t_shard + experts * e_shard
        rank_index = [np.zeros_like(p), np.ones_like(p), p - 1][k]
        flight = in_flight(rank_index, skc, micro)
        largest = np.maximum((rank.dense > 0) * full_d, (rank.moe > 0) * full_m)
        chunk = (rank.dense * act_d + rank.moe * act_m) / v
        acts = np.where(off == 1, 2.0 * largest + flight * chunk_input, flight * chunk + (rec == 2) * largest) + head * head_saved
        static = (d_para + d_grad) * params + hw.runtime_reserved_gb * GB + (p > 1) * 2.0 * hop_bytes
        for d, c in modes:
            local = shard if d else params
            states = factor * d_opt * local
            if c:  # eq. 27: the states live in host memory, the GPU keeps what does not fit
                peak = static + np.maximum(0.0, states - host_share) + acts
                upd = cpu_rate * local
            else:  # states + max(activations, the fp32 gradient copy at the step)
                peak = static + states + np.maximum(acts, transient_factor * d_opt * local)
                upd = gpu_rate * local + gpu_fixed
            memory[d, c][:, k] = peak
            update[d, c] = np.maximum(update[d, c], upd)  # the slowest rank's update
    parts = []
    for d, c in modes:
        ok = exists & (dist_ok | (d == 0))  # the distributed optimizer needs a DP group
        idx = np.flatnonzero(ok)
        parts.append((idx, d, c, pipeline[idx] + update[d, c][idx] * G / TICK_S, memory[d, c][idx] * G / MB))
    idx = np.concatenate([pt[0] for pt in parts])
    return Tables(
        G=G,
        skeleton=sk_of[idx],
        recompute=rec[idx].astype(np.int64),
        offload=off[idx].astype(np.int64),
        dist=np.concatenate([np.full(len(pt[0]), pt[1]) for pt in parts]).astype(np.int64),
        cpu=np.concatenate([np.full(len(pt[0]), pt[2]) for pt in parts]).astype(np.int64),
        objective=_floor(np.concatenate([pt[3] for pt in parts])),
        memory=_floor(np.concatenate([pt[4] for pt in parts])),
    )


@dataclass
class ModelVars:
    choice: list
    index: cp_model.IntVar  # the chosen row
    objective: cp_model.IntVar


def build_model(problem: Problem, tb: Tables, bound: int | None = None, at_least: int | None = None) -> tuple[cp_model.CpModel, ModelVars]:
    """The lower-bounding model (module docstring), in one function: pick exactly one choice;
    every rank class's memory within the GPU; the objective is the chosen bound."""
    model = cp_model.CpModel()
    choice = [model.NewBoolVar(f"choice_{i}") for i in range(len(tb.objective))]
    model.AddExactlyOne(choice)
    index = model.NewIntVar(0, len(choice) - 1, "index")
    model.Add(index == cp_model.LinearExpr.WeightedSum(choice, list(range(len(choice)))))
    capacity = int(math.floor(problem.hardware.memory_gb * GB / MB)) * tb.G
    for k in range(CLASSES):
        model.Add(cp_model.LinearExpr.WeightedSum(choice, [int(x) for x in tb.memory[:, k]]) <= capacity)
    objective = model.NewIntVar(0, int(tb.objective.max()), "objective")
    model.Add(objective == cp_model.LinearExpr.WeightedSum(choice, [int(x) for x in tb.objective]))
    if bound is not None:
        model.Add(objective <= bound)
    if at_least is not None:
        model.Add(objective >= at_least)
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
    solver = cp_model.CpSolver()
    solver.parameters.random_seed = SEED
    solver.parameters.num_workers = workers
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = max(0.05, time_limit_s)
    return solver


def _configs(problem: Problem, space: SearchSpace, tb: Tables, found) -> ConfigBatch:
    """The configurations of each chosen row: its skeleton, recompute, offload and optimizer
    choices, crossed with every admissible choice of the pure-time overlaps."""
    overlaps = np.array(list(itertools.product(*(space.flags[n] for n in PURE_TIME_FEATURES))), dtype=float)
    rows = np.repeat(np.array(sorted(set(found)), dtype=np.int64), len(overlaps))
    sk = space.skeletons
    index = tb.skeleton[rows]
    cols = {name: getattr(sk, name)[index] for name in SKELETON_FIELDS}
    cols["recompute"] = tb.recompute[rows].astype(float)
    cols["activation_offload"] = tb.offload[rows].astype(float)
    cols["distributed_optimizer"] = tb.dist[rows].astype(float)
    cols["cpu_optimizer"] = tb.cpu[rows].astype(float)
    for j, name in enumerate(PURE_TIME_FEATURES):
        cols[name] = np.tile(overlaps[:, j], len(rows) // max(len(overlaps), 1))
    cfg = ConfigBatch.from_columns(problem.cluster.num_gpus, **cols, interval=space.interval())
    return cfg.take(np.flatnonzero(space.feature_ok(cfg)))


def solve_cpsat(problem: Problem, objective: str = "step", top_k: int = 1, time_limit_s: float | None = None, workers: int = 1) -> SolveResult:
    check_objective(problem, objective)
    clock = Stopwatch()
    space = SearchSpace.from_problem(problem)
    stats = {"skeletons": len(space.skeletons)}
    if len(space.skeletons) == 0:
        return SolveResult("cpsat", objective, "infeasible", np.zeros(0), None, clock.elapsed, 0, lower_bound=math.inf, space_size=space.size, stats=stats)
    tb = build_tables(problem, space)
    stats.update(choices=len(tb.objective), tables_s=round(clock.elapsed, 3))
    best = TopK(top_k)  # ranked by step time: the end-to-end time increases with it
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

    # phase 1: the least lower bound (and every improving assignment on the way)
    model, mv = build_model(problem, tb)
    model.Minimize(mv.objective)
    solver = _solver(remaining(), workers)
    collector = _Collector(mv)
    status = solver.Solve(model, collector)
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
            model2, mv2 = build_model(problem, tb, int(upper), int(covered) + 1)
            solver2 = _solver(remaining(), 1)
            solver2.parameters.enumerate_all_solutions = True
            collector2 = _Collector(mv2)
            status2 = solver2.Solve(model2, collector2)
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
    if objective == "e2e" and top is not None:
        lower = _e2e_of_step(problem, lower)
    if top is None:
        state = "infeasible" if complete else "unknown"
    else:
        state = "optimal" if complete else "feasible"
        if complete:
            lower = float(values[0])
    return SolveResult("cpsat", objective, state, values, top, clock.elapsed, evaluated, lower_bound=lower, space_size=space.size, stats=stats)


def _e2e_of_step(problem: Problem, step_s: float) -> float:
    """End-to-end time (eq. 43 with the eq.-44 interval) of a configuration with this step
    time: increasing in it, so it maps a step-time bound to an end-to-end bound."""
    ft = problem.fault_tolerance
    rate = failure_rate_per_s(problem.cluster.num_nodes, ft.failure_rate_per_node_day)
    save = checkpoint_save_s(problem)
    step = np.array([max(step_s, 1e-9)])
    interval = ft.checkpoint_interval if isinstance(ft.checkpoint_interval, int) else optimal_interval(step, rate, ft.mean_recovery_s, save, problem.search.max_interval)
    return float(end_to_end_s(problem.training.total_steps, step, interval, rate, ft.mean_recovery_s, save, ft.first_init_s)[0])
