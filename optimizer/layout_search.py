"""The best heterogeneous pipeline layout of one skeleton configuration (issue 11): CP-SAT over
integer layer counts per stage and layer kind, certified by the exact model
(costmodel.stage_layout.score_layout); a dynamic program over stages (MPE eq. 3, seed 002) and
plain enumeration as oracles on small instances.

Why CP-SAT here: a layout of 126 layers over 128 stages is one of C(253, 127) ~ 1e75; nothing
enumerates that, while the structure is linear. With the skeleton fixed (degrees, micro-batch,
features), the exact model's step time of a layout is
    (m - 1/vp) * max_r R_r + (sum_r R_r) / vp + P2P + DP + update
where only max_r R_r depends on the layout (the total work, the mean chunk that hides the P2P
hops and the step-level terms do not), so minimising the bottleneck rank's work R_r, a max of
linear forms in the counts, minimises the step time. Memory per rank is the exact ledger
(costmodel.memory.rank_memory), affine in the rank's kind counts for the supported skeletons:
    peak_r = base_r(counts) + (1 + frag) * max(activations_r, optimizer transient_r)
with activations_r = max over the rank's in-flight vectors h (costmodel.stage_layout.held_chunks)
of sum_c h_c * bytes of local chunk c; each h is one linear constraint. The coefficients are read
off the exact ledger by probing it (no formula is copied), and the answer is re-scored.

Layer kinds: a stage holds a contiguous run of the model's layers, so with prefix sums P_s the
layers of kind-run [a, b) in stage s are clip(P_s, a, b) - clip(P_{s-1}, a, b).

Recompute (skeletons with full recompute): an integer r_s per stage, 0 <= r_s <= t_s, the
stage's first r_s layers, so the recomputed layers of kind-run [a, b) are
clip(P_{s-1} + r_s, a, b) - clip(P_{s-1}, a, b); each adds its recompute to the stage's
backward and takes what it does not keep off every memory row, and a rank that recomputes adds
one layer's working set (costmodel.stage_layout). `uniform_recompute` ties r_s = min(N, t_s)
to one N, what Megatron launches. The local search also moves r_s by one; the stage DP and the
enumeration cover every recompute count.

DualPipeV (vee_layout_search): rank r holds stages r and 2pp - 1 - r, so the rank rows read
ctx.stages_of, and the schedule graph's nodes are the V's entries (a forward overlapped with
another stage's backward lasts both) with weight-gradient passes of their own: a path is
n_F.F + n_B.B + n_W.W, still linear in the counts (vee_model, vee_rounds).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time

import numpy as np
from ortools.sat.python import cp_model

from costmodel.schedule_sim import op_inputs
from costmodel.stage_layout import (
    LayoutContext,
    LayoutError,
    StageLayout,
    chunk_times,
    layout_context,
    rank_ledger,
    rank_peak_bytes,
    recompute_working_bytes,
    score_layout,
    stage_ranks,
    step_overhead_floor_s,
    unit_costs,
)
from optimizer.cp_solver import cp_solver, solve
from optimizer.schedule_graph import ScheduleGraph, chunk_segments_hold, schedule_graph, segment_paths

TIME_SCALE = 1e9  # integer nanoseconds in the CP-SAT model
ROUND_STARTS = 3  # local searches from round_seeds' answers where no given layout fits
BYTE_SCALE = 1024.0  # integer KiB


@dataclasses.dataclass(frozen=True)
class LayoutSolution:
    layout: StageLayout
    step_time_s: float  # the exact model's (schedule simulated op by op)
    makespan_s: float  # the simulated pipeline makespan of the layout
    bound_s: float  # the layout's critical-path bound (costmodel.stage_layout), for comparison
    lower_bound_s: float  # proven: no layout that fits has a makespan below this
    optimal: bool  # the makespan meets the lower bound (within the integer rounding)
    solve_s: float
    fits: bool
    rounds: int  # CP-SAT solves (one per critical path added)
    # what proved lower_bound_s: "cp-sat"; "rank-lp" (rank_order_region and lp_region_bound, before
    # or instead of CP-SAT rounds); "recompute-split" (recompute_split_bound); or "work"
    # (work_bound_s: nothing bounded better)
    bound_source: str = "cp-sat"
    # Ctrl-C ended the search: the best layout found so far and the bound proven by then
    # (as a time limit would end it)
    interrupted: bool = False

    @property
    def gap(self) -> float:
        """Proven optimality gap of the layout's simulated makespan."""
        return max(0.0, self.makespan_s - self.lower_bound_s) / self.makespan_s


class _Answers(cp_model.CpSolverSolutionCallback):
    """Every distinct layout CP-SAT reports during one solve (decoder counts, then recompute counts)."""

    def __init__(self, t):
        super().__init__()
        self.t = t  # the variables of an answer
        self.answers = []
        self.seen = set()

    def on_solution_callback(self):
        answer = tuple(int(self.Value(v)) for v in self.t)
        if answer not in self.seen:
            self.seen.add(answer)
            self.answers.append(answer)

    def stop_after(self, seconds: float | None):
        """cp_solver.solve's stop_when for a round (from now): stop once it has run `seconds`
        with answers; None: never (the round's time limit alone)."""
        if seconds is None:
            return None
        begun = time.perf_counter()
        return lambda: bool(self.answers) and time.perf_counter() - begun >= seconds


def round_solver(time_limit_s: float, workers: int) -> cp_model.CpSolver:
    """cp_solver for a round of the layout search's CP-SAT model (round_below, the free search's
    rounds without an incumbent, recompute_split_bound's), with a lighter presolve: one
    presolve iteration, without the search for dominated linear constraints and for linear
    overlaps. The model is rebuilt and presolved in full every round (thousands of path cuts of
    up to 2 x stages terms), and those two passes and the iterations after the first took most of
    it: Llama 3 405B cp 1's 128-stage model (1,300 cuts, 176k terms) presolved in 2.5 s of a
    round's 4 s on 2 cores, 1.0 s with this, for little (31 redundant cuts of 1,410 found). The
    time freed goes to the rounds (bench_layouts, 10 s, 2 cores: the free search on cp 1 without
    recompute runs 3-4 rounds, not 1, and its gap is 1.1% in three runs of three, against
    6.7-43.8% in four, and as much regular first; regular then free with per-chunk recompute
    5.3-5.5%, against 10.7-10.9%). The regular search's own rounds keep the full presolve (solve_layout)."""
    solver = cp_solver(time_limit_s, workers)
    solver.parameters.presolve_inclusion_work_limit = 0
    solver.parameters.find_big_linear_overlap = False
    solver.parameters.max_presolve_iterations = 1
    return solver


def round_below(model: cp_model.CpModel, z, variables, incumbent_s: float, slack_s: float, time_limit_s: float,
                workers: int, under_s: float = 0.0, answers_by_s: float | None = None) -> tuple[int, float, list]:
    """One round that asks CP-SAT only for layouts the model prices below the incumbent
    (makespan `z` <= incumbent - 2 slack, set as z's domain): (status, the makespan bound it
    proves for every layout, in seconds, and every distinct answer it found). Each answer is
    then truly better or priced too low (its longest path a new cut), and INFEASIBLE certifies
    the incumbent within 2 slack. `under_s`: how far the model's rounded coefficients can price
    a layout above its makespan (0 where they are rounded down). `answers_by_s`: the round
    stops once it has run that long with answers (their cuts make the next round's model),
    and goes on to time_limit_s while it has none (a round that stopped there without answers
    was asked again from scratch, its search lost: DeepSeek-V3 on pp 16 x vp 2 with per-stage
    recompute, 4 s of the 17 s it took to certify with a 30 s limit)."""
    domain = model.Proto().variables[z.Index()].domain
    goal_s = incumbent_s - 2 * slack_s
    domain[0], domain[1] = 0, max(int(math.floor(goal_s * TIME_SCALE)), 0)
    found = _Answers(variables)
    solver = round_solver(time_limit_s, workers)
    status = solve(solver, model, found, stop_when=found.stop_after(answers_by_s))
    if status == cp_model.INFEASIBLE:
        return status, goal_s, found.answers
    # proven on the restricted model: no layout is priced below it, or the incumbent is within 2 slack
    return status, min(solver.BestObjectiveBound() / TIME_SCALE - under_s, goal_s), found.answers


def path_sum(counts, exprs):
    """A path's length in the CP-SAT model: sum over passes p and stages s of counts[p][s] *
    exprs[p][s] (a pass's ops on each stage along the path, times that stage's duration
    expression), built as one weighted sum: term by term in Python it took twice as long
    (~1000 cuts of 128 stages: 0.9 s -> 0.4 s on 2 cores)."""
    terms, coefficients = [], []
    for n, expr in zip(counts, exprs):
        n = np.asarray(n)
        for s in np.flatnonzero(n):
            terms.append(expr[s])
            coefficients.append(int(n[s]))
    return cp_model.LinearExpr.weighted_sum(terms, coefficients)


def memo_scorer(ctx: LayoutContext, scores: dict | None = None):
    """score_layout of the skeleton, each layout scored once (`scores`: a cache shared between
    searches of the same skeleton)."""
    scores = {} if scores is None else scores

    def score_of(layout: StageLayout):
        if layout not in scores:
            scores[layout] = score_layout(ctx, layout)
        return scores[layout]

    return score_of


def layout_makespan(score) -> float:
    """What the searches minimise: the simulated schedule's makespan, the exposed P2P left out."""
    return score.pipeline_s - score.pp_exposed_s


def kind_runs(kind_of_layer: list[int]) -> list[tuple[int, int, int]]:
    """(kind, first layer, end) of each maximal run of equal kinds in model order."""
    runs = []
    for kind, group in itertools.groupby(enumerate(kind_of_layer), key=lambda x: x[1]):
        idx = [i for i, _ in group]
        runs.append((kind, idx[0], idx[-1] + 1))
    return runs


def rank_memory_model(ctx: LayoutContext, rank: int) -> tuple[float, np.ndarray, float, np.ndarray, float]:
    """(base_0, base per kind, transient_0, transient per kind, head bytes) of a rank, read
    off the exact ledger at zero activations: peak = base + (1+frag)*max(act + head, trans)."""
    last_rank = stage_ranks(ctx.pp, ctx.vp, ctx.vee)[-1]
    first, last = rank == 0, rank == last_rank
    mtp = ctx.problem.model.mtp_layers if last else 0
    no_head = dataclasses.replace(ctx.lc, head_saved=0.0 * ctx.lc.head_saved)
    frag = ctx.mc.fragmentation
    k = len(ctx.kinds)

    def probe(counts):
        ledger = rank_ledger(ctx, counts, first, last, mtp, 0.0, lc=no_head)
        trans = float(ledger.optimizer_transient[0])
        return float(ledger.peak[0]) - (1.0 + frag) * trans, trans

    base0, trans0 = probe(np.zeros(k))
    base, trans = np.zeros(k), np.zeros(k)
    for j in range(k):
        unit = np.zeros(k)
        unit[j] = 1.0
        b, t = probe(unit)
        base[j], trans[j] = b - base0, t - trans0
    head = float(np.asarray(ctx.lc.head_saved).ravel()[0]) * (1 + mtp) if last else 0.0
    return base0, base, trans0, trans, head


def rank_memory_terms(ctx: LayoutContext, rank: int) -> tuple[float, np.ndarray, float, np.ndarray, float, float]:
    """rank_memory_model's (base_0, base per kind, transient_0, transient per kind, head bytes)
    with the MTP modules of the last rank folded into the constants, and the MTP modules'
    activation bytes (held with the last local chunk): the rank fits when
        base_0 + base . counts + (1+frag) * max(transient_0 + transient . counts,
                                               max_h sum_c h_c act . chunk_c + head + h_last * mtp_act) <= capacity
    over its in-flight vectors h (ctx.held). The CP-SAT model and the local search read it."""
    base0, base, trans0, trans, head = rank_memory_model(ctx, rank)
    mtp_act = 0.0
    if rank == stage_ranks(ctx.pp, ctx.vp, ctx.vee)[-1] and ctx.mtp_kind is not None:
        mtp_layers = ctx.problem.model.mtp_layers
        base0 += mtp_layers * base[ctx.mtp_kind]
        trans0 += mtp_layers * trans[ctx.mtp_kind]
        mtp_act = mtp_layers * unit_costs(ctx)["kind_activation"][ctx.mtp_kind]
    return base0, base, trans0, trans, head, mtp_act


class LinearLayouts:
    """A skeleton's layouts in the linear form the search works with, vectorized over many
    layouts: layers of each kind-run per stage (clipped prefix sums), per-stage forward and
    backward seconds (chunk_times' composition) and the rank memory test of rank_memory_terms.
    The local search screens neighbours with it; the exact model (score_layout) has the last
    word on what fits."""

    def __init__(self, ctx: LayoutContext):
        self.ctx = ctx
        u = unit_costs(ctx)
        self.stages = ctx.pp * ctx.vp
        self.runs = kind_runs(ctx.kind_of_layer)
        self.kind_of_run = np.array([k for k, _, _ in self.runs])
        mtp = np.zeros(self.stages)
        mtp[-1] = ctx.problem.model.mtp_layers
        edge = np.zeros((self.stages, len(ctx.kinds)))
        if ctx.mtp_kind is not None:
            edge[-1, ctx.mtp_kind] = mtp[-1]
        first = np.arange(self.stages) == 0
        last = np.arange(self.stages) == self.stages - 1
        self.const_forward_s, self.const_backward_s = chunk_times(u, edge, mtp, first, last)
        # DualPipeV's weight-gradient pass, part of the backward above (stage_weights' composition)
        self.const_weight_s = edge @ u["kind_weight"] + last * u["head_weight"]
        self.weight_s = u["kind_weight"][self.kind_of_run]
        self.forward_s = u["kind_forward"][self.kind_of_run]
        self.backward_s = (u["kind_total"] - u["kind_forward"])[self.kind_of_run]
        self.act = u["kind_activation"][self.kind_of_run]
        self.u = u
        self.recompute_s = u["kind_recompute"][self.kind_of_run]  # a recomputed layer's extra backward seconds
        self.dropped = u["kind_dropped"][self.kind_of_run]  # and the bytes it does not keep per micro-batch in flight
        self.recompute = ctx.recompute_allowed
        self.memory = [rank_memory_terms(ctx, r) for r in range(ctx.pp)]
        self.frag = ctx.mc.fragmentation
        self.capacity = ctx.problem.hardware.memory_bytes

    def run_counts(self, decoders: np.ndarray) -> np.ndarray:
        """[K, stage, run] layers of each kind-run in each stage of K layouts [K, stage]."""
        prefix = np.cumsum(decoders, axis=1)
        before = prefix - decoders
        low = np.array([a for _, a, _ in self.runs])
        high = np.array([b for _, _, b in self.runs])
        return np.clip(prefix[..., None], low, high) - np.clip(before[..., None], low, high)

    def recompute_counts(self, decoders: np.ndarray, recompute: np.ndarray) -> np.ndarray:
        """[K, stage, run] recomputed layers of each kind-run in each stage (a stage's first
        `recompute` layers) of K layouts [K, stage]."""
        before = np.cumsum(decoders, axis=1) - decoders
        low = np.array([a for _, a, _ in self.runs])
        high = np.array([b for _, _, b in self.runs])
        return np.clip((before + recompute)[..., None], low, high) - np.clip(before[..., None], low, high)

    def layout_counts(self, layouts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(run counts, recomputed run counts) of K layouts [K, 2 * stage]: decoder counts then
        recompute counts (the search's vector)."""
        layouts = np.asarray(layouts, dtype=np.int64).reshape(-1, 2 * self.stages)
        decoders, recompute = layouts[:, :self.stages], layouts[:, self.stages:]
        return self.run_counts(decoders), self.recompute_counts(decoders, recompute)

    def times(self, counts: np.ndarray, recomputed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """[stage, K] forward and backward seconds of K layouts' run counts [K, stage, run]
        (and recomputed run counts)."""
        backward = counts @ self.backward_s + self.const_backward_s
        if recomputed is not None:
            backward = backward + recomputed @ self.recompute_s
        return (counts @ self.forward_s + self.const_forward_s).T, backward.T

    def weights(self, counts: np.ndarray) -> np.ndarray:
        """[stage, K] DualPipeV weight-gradient seconds of K layouts' run counts [K, stage, run]:
        the part of `times`' backward that the W pass runs (stage_weights)."""
        return (counts @ self.weight_s + self.const_weight_s).T

    def pass_times(self, counts: np.ndarray, recomputed: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """The schedule graph's seconds ([stage, K] per pass) of K layouts: (forward, backward),
        or under DualPipeV (forward, input gradient, weight gradient), its backward split."""
        forward, backward = self.times(counts, recomputed)
        if not self.ctx.vee:
            return forward, backward
        weight = self.weights(counts)
        return forward, backward - weight, weight

    def pass_layer_s(self, run: int) -> tuple[float, ...]:
        """One layer of kind-run `run`'s seconds in each of pass_times' passes (no recompute)."""
        if not self.ctx.vee:
            return float(self.forward_s[run]), float(self.backward_s[run])
        return float(self.forward_s[run]), float(self.backward_s[run] - self.weight_s[run]), float(self.weight_s[run])

    def rank_rows(self, counts: np.ndarray, recomputed: np.ndarray | None = None) -> list[np.ndarray]:
        """Per rank, [K, 1 + vectors] the peak bytes of each memory row (rank_memory_terms):
        the optimizer transient's, then each in-flight vector's; the rank's peak is their max.
        Recomputed layers keep their input instead of their activations and add the working
        set of the largest kind the rank recomputes (stage_layout.recompute_working_bytes)."""
        out = []
        for r, (base0, base, trans0, trans, head, mtp_act) in enumerate(self.memory):
            mine = counts[:, self.ctx.stages_of[r], :]  # [K, chunk, run]
            fixed = base0 + mine.sum(axis=1) @ base[self.kind_of_run]
            transient = trans0 + mine.sum(axis=1) @ trans[self.kind_of_run]
            held = self.ctx.held[r]  # [vectors, chunk]
            chunk_bytes = mine @ self.act
            working = 0.0
            if recomputed is not None:
                rmine = recomputed[:, self.ctx.stages_of[r], :]
                chunk_bytes = chunk_bytes - rmine @ self.dropped
                per_kind = np.zeros((len(counts), len(self.ctx.kinds)))
                np.add.at(per_kind.T, self.kind_of_run, rmine.sum(axis=1).T)
                working = recompute_working_bytes(self.u, per_kind)[:, None]
            activations = chunk_bytes @ held.T + held[:, -1][None, :] * mtp_act + head + working
            out.append(fixed[:, None] + (1 + self.frag) * np.concatenate([transient[:, None], activations], axis=1))
        return out

    def headroom(self, counts: np.ndarray, recomputed: np.ndarray | None = None) -> np.ndarray:
        """[K, rank] bytes each rank's peak leaves free (negative: over the capacity)."""
        return np.stack([self.capacity - rows.max(axis=1) for rows in self.rank_rows(counts, recomputed)], axis=1)

    @functools.cached_property
    def layer_bytes(self) -> np.ndarray:
        """[stage] about what one more layer of the commonest kind costs its rank's peak: its
        fixed bytes and its activations times the most micro-batches its chunk has in flight
        (the local search's ordering of repair moves; the test itself is rank_rows')."""
        j = int(np.argmax([end - begin for _, begin, end in self.runs]))
        k = self.kind_of_run[j]
        out = np.zeros(self.stages)
        for r, mine in enumerate(self.ctx.stages_of):
            base0, base, trans0, trans, head, mtp_act = self.memory[r]
            for c, s in enumerate(mine):
                out[s] = base[k] + (1 + self.frag) * self.act[j] * self.ctx.held[r][:, c].max()
        return out

    def excess(self, counts: np.ndarray, recomputed: np.ndarray | None = None) -> np.ndarray:
        """[K, rank] bytes of each rank's peak over the capacity (0 where it fits)."""
        return np.stack([np.maximum(rows.max(axis=1) - self.capacity, 0.0) for rows in self.rank_rows(counts, recomputed)], axis=1)

    def fits(self, counts: np.ndarray, recomputed: np.ndarray | None = None) -> np.ndarray:
        """[K] whether every rank's linear memory test passes."""
        return (self.excess(counts, recomputed) <= 0).all(axis=1)

    def screen(self, vectors) -> "Screened":
        """K layouts [K, 2 * stage] (the search's vectors: decoder counts, then recompute counts)
        on the schedule graph and the linear memory test at once: milliseconds for a batch, where
        the exact model takes ~0.1-1 s a layout, so that the search ranks what it knows here and
        confirms only the best with score_layout."""
        counts, recomputed = self.layout_counts(vectors)
        recomputed = recomputed if self.recompute else None
        seconds = self.pass_times(counts, recomputed)
        graph = schedule_graph(self.ctx)
        return Screened(seconds, self.fits(counts, recomputed), graph, graph.ends(*seconds))


@dataclasses.dataclass(frozen=True)
class Screened:
    """LinearLayouts.screen's K layouts: per-pass seconds ([stage, K] each), whether each passes
    the linear memory test [K], and every node's end on the schedule graph (ScheduleGraph.ends),
    from which their makespans and longest paths follow."""

    seconds: tuple[np.ndarray, ...]
    fits: np.ndarray
    graph: ScheduleGraph
    end: np.ndarray

    @property
    def makespan_s(self) -> np.ndarray:
        """[K] each layout's makespan (ScheduleGraph.makespan, off the ends already computed)."""
        return self.graph.makespan(*self.seconds, end=self.end)

    def paths(self) -> list[tuple[np.ndarray, ...]]:
        """Each layout's longest path as op counts per stage and pass (ScheduleGraph.paths): the
        search's cuts."""
        return list(zip(*self.graph.paths(*self.seconds, end=self.end)))


def over_capacity_without_recompute(model: cp_model.CpModel, ctx: LayoutContext, lin: "LinearLayouts", rank: int, run_counts,
                                    enforce) -> None:
    """Where `enforce` holds, rank `rank` does not fit without recompute: its envelope (each
    chunk's activations times the most micro-batches it ever holds in flight, above every
    in-flight row of rank_memory_terms) is over the capacity. In thousandths of KiB, the
    coefficients rounded up and the threshold down, so a rank over the capacity is over it
    here. What recompute_split_bound and MemoryRows.recompute_only_where_needed require of a
    rank that recomputes."""
    base0, base, trans0, trans, head, mtp_act = lin.memory[rank]
    mine = [int(s) for s in ctx.stages_of[rank]]
    held = np.asarray(ctx.held[rank])
    top = held.max(axis=0) if len(held) else np.zeros(len(mine))
    act = lin.u["kind_activation"]
    scale = 1000.0 / BYTE_SCALE
    envelope = sum(coef * run_counts[s][j] for c, s in enumerate(mine) for j, k in enumerate(int(k) for k in lin.kind_of_run)
                   if (coef := int(math.ceil((base[k] + (1 + lin.frag) * top[c] * act[k]) * scale))))
    envelope += int(math.ceil((base0 + (1 + lin.frag) * (head + top[-1] * mtp_act)) * scale))
    model.Add(envelope >= int(math.floor(lin.capacity * scale)) + 1).OnlyEnforceIf(enforce)


class MemoryRows:
    """The rank memory test of LinearLayouts.rank_rows as CP-SAT rows over a layout model's
    layers of each kind-run per stage (and recomputed ones): per rank one row for the
    optimizer transient and one per in-flight vector h, in integer KiB. A rank of interleaved
    1F1B has up to ~100 vectors, and all of them make a model whose presolve alone takes
    seconds; so each rank starts with its transient row, and a layout that breaks a row brings
    that row in (add_broken; fewer rows only relax the model: its bound stays valid)."""

    def __init__(self, model: cp_model.CpModel, ctx: LayoutContext, lin: "LinearLayouts", run_counts, rc_counts=None):
        u = unit_costs(ctx)
        kind_of_run = [int(k) for k in lin.kind_of_run]
        n_layers = len(ctx.kind_of_layer)
        act = u["kind_activation"]
        scaled_frag = int(round((1 + lin.frag) * 1000))
        self.model, self.lin, self.ctx = model, lin, ctx
        self.budget = int(ctx.problem.hardware.memory_bytes // BYTE_SCALE)
        self.rows = {}  # (rank, vector index or -1 for the transient) -> its left side
        self.added = set()
        for r, (base0, base, trans0, trans, head, mtp_act) in enumerate(lin.memory):
            mine = [int(s) for s in ctx.stages_of[r]]
            kind_count = {k: [] for k in range(len(ctx.kinds))}
            for s in mine:
                for j, k in enumerate(kind_of_run):
                    kind_count[k].append(run_counts[s][j])
            base_expr = sum(int(round(base[k] / BYTE_SCALE)) * sum(v) for k, v in kind_count.items() if v) + int(round(base0 / BYTE_SCALE))
            trans_expr = sum(int(round(trans[k] / BYTE_SCALE)) * sum(v) for k, v in kind_count.items() if v) + int(round(trans0 / BYTE_SCALE))
            self.rows[r, -1] = base_expr * 1000 + scaled_frag * trans_expr
            working = 0
            if rc_counts is not None:
                # the working set of the largest kind the rank recomputes: w >= working_k * y_k,
                # y_k = 1 where the rank recomputes a layer of kind k (w only relaxes the rows upward
                # from 0, so its least value is the max)
                working = model.NewIntVar(0, int(round(u["kind_working"].max() / BYTE_SCALE)) + 1, f"w{r}")
                for k in sorted(set(kind_of_run)):
                    if u["kind_working"][k] <= 0:
                        continue
                    y = model.NewBoolVar(f"y{r}_{k}")
                    model.Add(sum(rc_counts[s][j] for s in mine for j, kind in enumerate(kind_of_run) if kind == k) <= n_layers * y)
                    model.Add(working >= int(round(u["kind_working"][k] / BYTE_SCALE)) * y)
            for i, h in enumerate(ctx.held[r]):
                act_expr = sum(int(h[c]) * sum(int(round(act[k] / BYTE_SCALE)) * run_counts[s][j] for j, k in enumerate(kind_of_run))
                               for c, s in enumerate(mine) if h[c])
                if rc_counts is not None:  # what the recomputed layers do not keep
                    act_expr = act_expr - sum(int(h[c]) * sum(int(round(u["kind_dropped"][k] / BYTE_SCALE)) * rc_counts[s][j]
                                                              for j, k in enumerate(kind_of_run)) for c, s in enumerate(mine) if h[c]) + working
                const = int(round((head + int(h[-1]) * mtp_act) / BYTE_SCALE))
                self.rows[r, i] = base_expr * 1000 + scaled_frag * (act_expr + const)
        for r in range(ctx.pp):
            self.add((r, -1))

    def recompute_only_where_needed(self, run_counts, rc_counts) -> None:
        """A rank recomputes only where it does not fit without: y_r = 1 where rank r
        recomputes a layer, and then its envelope (each chunk's activations times the most
        micro-batches it ever holds, above every in-flight row) is over the capacity.
        Valid for certification, not only for search: take any fitting layout and zero the
        recompute of every rank that fits without it (memory is per rank, and recompute only
        adds time, so the makespan does not grow); the result meets these rows, so a layout
        below the incumbent exists only where one meeting them does (recompute_split_bound's
        argument, here over the search's own integer recompute counts)."""
        model, lin, ctx = self.model, self.lin, self.ctx
        n_layers = len(ctx.kind_of_layer)
        for r in range(ctx.pp):
            y = model.NewBoolVar(f"needs_recompute{r}")
            model.Add(sum(rc_counts[s][j] for s in ctx.stages_of[r] for j in range(len(lin.kind_of_run))) <= n_layers * y)
            over_capacity_without_recompute(model, ctx, lin, r, run_counts, y)

    def add(self, key) -> bool:
        """Bring one row into the model; whether it was new."""
        if key in self.added:
            return False
        self.added.add(key)
        self.model.Add(self.rows[key] <= self.budget * 1000)
        return True

    def add_broken(self, vector) -> bool:
        """Add the rows this layout (decoder counts, then recompute counts) breaks, and per rank
        the row nearest to binding; whether any row was new."""
        counts, recomputed = self.lin.layout_counts(np.array(vector)[None])
        new = False
        for r, values in enumerate(self.lin.rank_rows(counts, recomputed)):
            values = values[0]  # [1 + vectors] bytes: transient first
            for i in [int(np.argmax(values))] + [i for i in np.flatnonzero(values > self.ctx.problem.hardware.memory_bytes)]:
                new |= self.add((r, i - 1))
        return new


def fewest_recompute(ctx: LayoutContext, layout: StageLayout, lin: LinearLayouts | None = None,
                     uniform: bool = False) -> StageLayout | None:
    """The layout's decoder counts with recompute added greedily until every rank passes the
    linear memory test: while a rank is over its capacity, one more recomputed layer in the
    chunk that holds the most micro-batches of that rank's binding row (its in-flight vector
    with the largest peak), which takes the most bytes off it per recomputed layer; with
    `uniform`, the least N for which r_s = min(N, layers_s) fits. A seed for the layout search
    (a Megatron split made to fit with a few recomputed layers on the ranks that need them:
    on Llama 3 405B cp 1 the even split with 27 recomputed layers, 6.48 s a step, where the
    local search from the split recomputing everything stalls at 7.6 s: single moves do not
    shorten a balanced pipeline). None where recomputing everything does not fit."""
    lin = lin or LinearLayouts(ctx)
    if not lin.recompute:
        return None
    pp = ctx.pp
    decoders = np.array(layout.decoders, dtype=np.int64)
    recompute = np.minimum(np.array(layout.recompute, dtype=np.int64), decoders)
    if uniform:
        for n in range(int(decoders.max(initial=0)) + 1):
            recompute = np.minimum(n, decoders)
            if lin.fits(*lin.layout_counts(np.concatenate([decoders, recompute])[None]))[0]:
                return layout.with_recompute(recompute.tolist())
        return None
    while True:
        counts, recomputed = lin.layout_counts(np.concatenate([decoders, recompute])[None])
        rows = lin.rank_rows(counts, recomputed)
        over = [r for r in range(pp) if rows[r][0].max() > lin.capacity]
        if not over:
            return layout.with_recompute(recompute.tolist())
        r = over[0]
        i = int(np.argmax(rows[r][0])) - 1  # the binding row (-1: the optimizer transient, which recompute does not lower)
        if i < 0:
            return None
        room = [(int(ctx.held[r][i][c]), c * pp + r) for c in range(ctx.vp) if recompute[c * pp + r] < decoders[c * pp + r]]
        if not room or max(room)[0] == 0:
            return None
        recompute[max(room)[1]] += 1


def least_recompute(ctx: LayoutContext, lin: LinearLayouts, rank: int, most: int) -> tuple[int, ...]:
    """The fewest layers rank `rank` must recompute to fit its memory when it holds L layers,
    for L = 0, 1, ... up to `most` or the first L that no recompute makes fit (the tuple ends
    there): over every split of the L layers among its chunks and every recompute count per
    chunk, its linear memory rows (rank_memory_terms, the in-flight vectors ctx.held, the
    working set once it recomputes anything). One kind of decoder layer; a small CP-SAT per L,
    its coefficients rounded so that it relaxes the rows (activations down, what recompute
    saves up, the room up), so every layout that fits recomputes at least this many layers on
    the rank. Non-decreasing in L, and so is fitting at all (the first L that fits no more ends
    the table): a layout with one layer fewer (a kept one, else a recomputed one, which keeps
    its input, over a KiB) still fits.
    Cost: one model per rank, whose layer total and row bounds are set for each L, solved
    without presolve; and an L whose value the previous L's answer plus one kept layer in some
    chunk already meets (it cannot be less: non-decreasing) takes no solve at all (Llama 3
    405B's 16 ranks: 2.4 s -> 0.7 s on 2 cores, 468 solves -> 329, the same tables)."""
    assert len(lin.runs) == 1
    u, vp = lin.u, ctx.vp
    base0, base, trans0, trans, head, mtp_act = lin.memory[rank]
    k = int(lin.kind_of_run[0])
    act = int(u["kind_activation"][k] // BYTE_SCALE)
    dropped = int(-(-u["kind_dropped"][k] // BYTE_SCALE))
    working = int(u["kind_working"][k] // BYTE_SCALE)
    held = np.asarray(ctx.held[rank], dtype=np.int64)
    consts = [head + float(h[-1]) * mtp_act for h in held]
    model = cp_model.CpModel()
    total = model.NewIntVar(0, most, "L")
    t = [model.NewIntVar(0, most, "") for _ in range(vp)]
    rc = [model.NewIntVar(0, most, "") for _ in range(vp)]
    model.Add(sum(t) == total)
    for c in range(vp):
        model.Add(rc[c] <= t[c])
    any_ = model.NewBoolVar("")
    model.Add(sum(rc) <= most * any_)

    def loads(t, rc, any_) -> list:
        """Each row's KiB (CP-SAT expressions over variables, or integers over a split)."""
        return [sum(int(h[c]) * (act * t[c] - dropped * rc[c]) for c in range(vp) if h[c]) + working * any_ for h in held]

    rooms = []  # each row's bound, a variable fixed per L
    for load in loads(t, rc, any_):
        room_var = model.NewIntVar(-(2 ** 40), 2 ** 40, "")
        model.Add(load <= room_var)
        rooms.append(room_var)
    floor_var = model.NewIntVar(0, most, "")  # the previous L's value: the table is non-decreasing
    model.Add(sum(rc) >= floor_var)
    model.Minimize(sum(rc))
    proto = model.Proto().variables

    def fix(var, value: int) -> None:
        domain = proto[var.Index()].domain
        domain[0], domain[1] = value, value

    out: list[int] = []
    witness = None  # the previous L's optimal (t, rc): layers and recomputed layers per chunk
    for n in range(most + 1):
        fixed = base0 + n * base[k]
        if fixed + (1 + lin.frag) * (trans0 + n * trans[k]) > lin.capacity:  # recompute does not lower this row
            break
        room = (lin.capacity - fixed) / (1 + lin.frag)  # bytes the activations may take
        bounds = [int(math.floor((room - const) / BYTE_SCALE)) + 1 for const in consts]
        if witness is not None:
            # the previous answer with one more kept layer in some chunk: where one passes the
            # rows, this L needs no more recompute than the previous one
            w_t, w_rc = witness
            grown = [[x + (c == j) for j, x in enumerate(w_t)] for c in range(vp)]
            fits = [t_c for t_c in grown if all(v <= b for v, b in zip(loads(t_c, w_rc, int(sum(w_rc) > 0)), bounds))]
            if fits:
                witness = (fits[0], w_rc)
                out.append(out[-1])
                continue
        fix(total, n)
        fix(floor_var, out[-1] if out else 0)
        for room_var, bound in zip(rooms, bounds):
            fix(room_var, int(bound))
        solver = cp_solver(random_seed=1)  # CP-SAT's default seed, which this solve always ran with
        solver.parameters.max_deterministic_time = 5.0
        # 17 variables: presolving them took longer than the search (Llama 3 405B's tables,
        # 16 ranks: 1.7 s -> 0.7 s on 2 cores, the same values)
        solver.parameters.cp_model_presolve = False
        status = solve(solver, model)
        if status == cp_model.INFEASIBLE:
            break
        # unproven in its budget: its bound still holds
        if status == cp_model.OPTIMAL:
            out.append(int(round(solver.ObjectiveValue())))
            witness = ([solver.Value(v) for v in t], [solver.Value(v) for v in rc])
        else:
            out.append(max(int(math.ceil(solver.BestObjectiveBound() - 1e-6)), 0))
            witness = None
    return tuple(out)


def least_recompute_var(model: cp_model.CpModel, total, table: tuple[int, ...], name: str):
    """A variable equal to table[total] (a rank's least recompute at its layer total), the
    total held within the table (an empty one: the rank fits no layer count)."""
    model.Add(total <= len(table) - 1)
    least = model.NewIntVar(0, max(table, default=0), name)
    model.AddElement(total, list(table) or [0], least)
    return least


def lower_envelope(values) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The segments of the lower convex hull of the points (i, values[i]): each a pair of
    points whose line every point lies on or above."""
    hull: list[tuple[int, int]] = []
    for point in enumerate(values):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (point[0] - x1) >= (point[1] - y1) * (x2 - x1):  # hull[-1] on or above the chord
                hull.pop()
            else:
                break
        hull.append(point)
    return list(zip(hull, hull[1:]))


def packed_seeds(ctx: LayoutContext, levels) -> list[StageLayout]:
    """Seeds for one --recompute-num-layers N (uniform recompute): every rank's layers packed
    into its last k chunks (k = 1 .. vp), spread evenly by count over those stages with the
    remainder taken off the last ones (the head's), each recomputing min(N, its layers) for
    each N in `levels`. With one N a stage recomputes up to N of its layers whatever it holds, so
    fewer, fuller chunks recompute fewer layers, and the later chunks hold fewer micro-batches
    in flight: Llama 3 405B cp 1 on pp 16 x vp 8 with N = 1, the last four chunks of every rank
    holding two layers (one recomputed) run a 7.39 s step, where recomputing all 126 layers of
    the even split runs 7.69 s and the local search does not leave it (single moves do not)."""
    pp, vp = ctx.pp, ctx.vp
    n = len(ctx.kind_of_layer)
    mtp = ctx.problem.model.mtp_layers
    out = []
    for k in range(1, vp + 1):
        used = sorted(c * pp + r for c in range(vp - k, vp) for r in range(pp))
        base, extra = divmod(n, len(used))
        sizes = [0] * (pp * vp)
        for i, stage in enumerate(used):
            sizes[stage] = base + (i < extra)
        layout = StageLayout.from_stage_sizes(pp, vp, sizes, mtp)
        out.extend(layout.with_recompute([min(level, d) for d in sizes]) for level in levels)
    return list(dict.fromkeys(out))


def round_seeds(ctx: LayoutContext, lin: LinearLayouts, time_limit_s: float, min_layers: int = 0,
                max_layers: int | None = None, chunk_spread: int | None = None, random_seed: int = 0) -> list[StageLayout]:
    """Seeds for a skeleton whose given layouts do not fit: CP-SAT's answers for the layout (and,
    where the skeleton allows it, per-stage recompute) that minimises the sum over the chunk rounds of
    their slowest stage, plus the busiest rank, under every rank's linear memory rows -- a
    small CP-SAT model without the schedule's paths, one kind of decoder layer. In an
    interleaved schedule the ranks run chunk c of every micro-batch as one round that its
    slowest stage paces, so a layout whose rounds are balanced flows, where one that fits by
    piling the layers of the ranks with many micro-batches in flight into a few chunks stalls.
    Llama 3 405B at cp 1 on pp 16 x vp 8 (even split 90.6 GiB of 79.6): the search from the
    given seeds, repaired, stalls at a 16.5 s step; from these seeds it reaches 9.6-10.2 s.
    `random_seed` picks among CP-SAT's near-optimal answers. Returns every answer the solve
    found, the best last (its earlier ones are other starts for a local search: the better start
    is not the better end); empty where the time runs out without a layout or none fits the rows."""
    pp, vp = ctx.pp, ctx.vp
    stages = pp * vp
    n_layers = len(ctx.kind_of_layer)
    recompute = lin.recompute
    model = cp_model.CpModel()
    high = n_layers if max_layers is None else max_layers
    t = [model.NewIntVar(min_layers, high, f"t{s}") for s in range(stages)]
    rc = [model.NewIntVar(0, high if recompute else 0, f"r{s}") for s in range(stages)]
    model.Add(sum(t) == n_layers)
    for s in range(stages):
        model.Add(rc[s] <= t[s])
    const = (lin.const_forward_s + lin.const_backward_s) * TIME_SCALE
    per_layer = int(round(float(lin.forward_s[0] + lin.backward_s[0]) * TIME_SCALE))
    per_recompute = int(round(float(lin.recompute_s[0]) * TIME_SCALE))
    stage_ns = [per_layer * t[s] + per_recompute * rc[s] + int(round(const[s])) for s in range(stages)]
    cap = int(lin.capacity // BYTE_SCALE)

    def kib(x):  # costs rounded up, so that what fits here fits the linear test
        return int(math.ceil(float(x) * (1 + lin.frag) / BYTE_SCALE))

    for r in range(pp):
        mine = range(r, stages, pp)
        if chunk_spread is not None:
            low = model.NewIntVar(0, n_layers, "")
            model.AddMinEquality(low, [t[s] for s in mine])
            for s in mine:
                model.Add(t[s] <= low + chunk_spread)
        base0, base, trans0, trans, head, mtp_act = lin.memory[r]
        layers = sum(t[s] for s in mine)
        fixed = int(math.ceil(base0 / BYTE_SCALE)) + int(math.ceil(base[0] / BYTE_SCALE)) * layers
        model.Add(fixed + kib(trans0) + kib(trans[0]) * layers <= cap)
        working = 0
        if recompute:
            y = model.NewBoolVar(f"y{r}")
            model.Add(sum(rc[s] for s in mine) <= n_layers * y)
            working = kib(lin.u["kind_working"][0]) * y
        for h in ctx.held[r]:
            act = sum(kib(h[c] * lin.act[0]) * t[s] - (kib(h[c] * lin.dropped[0]) * rc[s] if recompute else 0) for c, s in enumerate(mine))
            model.Add(fixed + act + kib(head + h[-1] * mtp_act) + working <= cap)
    rounds = []
    for c in range(vp):
        slowest = model.NewIntVar(0, int(2 * n_layers * (per_layer + per_recompute) + const.max()) + 1, f"M{c}")
        for s in range(c * pp, (c + 1) * pp):
            model.Add(slowest >= stage_ns[s])
        rounds.append(slowest)
    busiest = model.NewIntVar(0, int(vp * (2 * n_layers * (per_layer + per_recompute) + const.max())) + 1, "busy")
    for r in range(pp):
        model.Add(busiest >= sum(stage_ns[s] for s in range(r, stages, pp)))
    model.Minimize(sum(rounds) + busiest)
    # one worker and a deterministic time limit: the same seeds on every run. The wall-clock cap
    # is a guard, 4x the deterministic limit: on 2 shared cores 0.5 deterministic seconds took
    # 0.9-2.0 s, and a 2x cap cut the solve short by the clock, so that Llama 3 405B cp 1's seeds
    # (limit 0.3 s, random seed 1) changed from run to run (1, 1 and 2 answers, against 3)
    solver = cp_solver(max(4 * time_limit_s, 0.1), 1, random_seed)
    solver.parameters.max_deterministic_time = max(time_limit_s, 0.05)
    answers = _Answers(t + rc)
    if solve(solver, model, answers) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return []
    mtp = (0,) * (stages - 1) + (ctx.problem.model.mtp_layers,)
    return [StageLayout(pp=pp, vp=vp, decoders=a[:stages], mtp=mtp, recompute=a[stages:]) for a in answers.answers]


def local_search(ctx: LayoutContext, start: tuple[int, ...], time_limit_s: float, batch: int = 64,
                 lin: LinearLayouts | None = None, spread: int | None = None, min_layers: int = 0,
                 max_layers: int | None = None, max_moves: int = 1024, neighbour_paths: int = 32,
                 start_recompute: tuple[int, ...] | None = None,
                 uniform_recompute: bool = False, fixed_level: int | None = None) -> tuple[tuple[int, ...], float, list[tuple[np.ndarray, ...]], tuple[int, ...]]:
    """Descent over single-layer moves from `start`: moves of one layer from any stage to any
    other (the `max_moves` that most shorten the current longest path, and as many recompute
    moves), and, where the skeleton allows full recompute, one more or one fewer recomputed layer in a
    stage or one recomputed layer moved to another stage (with `uniform_recompute`, one more or
    fewer N for every stage: r_s = min(N, layers_s), Megatron's one --recompute-num-layers;
    `fixed_level`: that N, kept, so that only layers move),
    screened by the linear memory test, scored in batches on the schedule graph; the best
    improving move of the first batch that has one is taken (improving: a shorter makespan, or
    the same and a smaller sum of op ends). A layer move keeps the stages' recompute counts, clipped to their layers. A start
    that does not fit is first repaired (least memory over the capacity, summed over ranks).
    Returns the best layout's decoder counts, its makespan, the longest paths of the layouts it
    moved through and of the best neighbours of the last one (cuts that are tight near the
    local optimum), and its recompute counts. Moves keep `min_layers` <= a stage <=
    `max_layers` and, with `spread`, a rank's chunks within that many layers (solve_layout's
    constraints). Deterministic (fixed seed)."""
    t0 = time.perf_counter()
    lin = lin or LinearLayouts(ctx)
    graph = schedule_graph(ctx)
    stages = lin.stages
    rng = np.random.default_rng(0)
    decoders = np.array(start, dtype=np.int64)
    recompute = np.zeros(stages, dtype=np.int64) if start_recompute is None else np.minimum(np.array(start_recompute, dtype=np.int64), decoders)
    uniform = lin.recompute and (uniform_recompute or fixed_level is not None)
    level = int(recompute.max(initial=0)) if fixed_level is None else int(fixed_level)  # uniform: N
    if uniform:
        recompute = np.minimum(level, decoders)
    current = np.concatenate([decoders, recompute])

    def measure(layouts):
        counts, recomputed = lin.layout_counts(layouts)
        recomputed = recomputed if lin.recompute else None
        return counts, recomputed

    def measured(seconds):
        """(makespan, sum of every op's end) of each layout: the second breaks ties, so that the
        descent crosses a plateau of equal makespans where several longest paths must all be
        shortened (two recomputed layers moved off two parallel paths: Llama 3 405B cp 1,
        5.770 -> 5.757 s), and stops, since the pair only ever decreases."""
        ends = graph.ends(*seconds)[:-1]
        return ends.max(axis=0), ends.sum(axis=0)

    counts, recomputed = measure(current[None])
    seconds = lin.pass_times(counts, recomputed)
    values, totals = measured(seconds)
    value, total = float(values[0]), float(totals[0])
    over = lin.excess(counts, recomputed)[0]  # [rank] bytes over the capacity: a start that does not fit is repaired first
    headroom = lin.headroom(counts, recomputed)[0]
    paths = [graph.path(*(x[:, 0] for x in seconds))]
    main_run = int(np.argmax([end - begin for _, begin, end in lin.runs]))  # the kind most layers have
    layer_s = lin.pass_layer_s(main_run)
    rank_of = np.array(stage_ranks(ctx.pp, ctx.vp, ctx.vee))
    # bytes one more recomputed layer of the main kind takes off its rank's peak (the most
    # micro-batches its chunk has in flight times what it stops keeping)
    drop_bytes = np.zeros(stages)
    for r, mine in enumerate(ctx.stages_of):
        for c, s in enumerate(mine):
            drop_bytes[s] = (1 + lin.frag) * lin.dropped[main_run] * ctx.held[r][:, c].max()
    while time.perf_counter() - t0 < time_limit_s:
        # every move, the most promising first: off a rank over its memory, then those that
        # shorten the current longest path most, ties at random. A layer move from stage a to
        # c gains (ops of the path on a minus on c) x a layer; a recompute move on stage a
        # gains or loses the path's backward ops on a x a layer's recompute.
        dec, rec = current[:stages], current[stages:]
        n_b = paths[-1][1]  # (under DualPipeV the path's W passes follow)
        weight = sum(n * s for n, s in zip(paths[-1], layer_s)) + n_b * lin.recompute_s[main_run] * (rec > 0)
        a, c = np.meshgrid(np.arange(stages), np.arange(stages), indexing="ij")
        ok = (a != c) & (dec[a] > 0)
        a, c = a[ok], c[ok]
        kind = np.zeros(len(a), dtype=np.int64)  # 0: a layer a -> c; 1: recompute one more on a; 2: one fewer; 4: a recomputed layer a -> c
        room = np.maximum(-headroom, 0.0)[rank_of]  # [stage] bytes over
        free = np.maximum(headroom, 0.0)[rank_of]
        gain = weight[a] - weight[c]
        saved = np.minimum(lin.layer_bytes[a], room[a]) - np.maximum(lin.layer_bytes[c] - free[c], 0.0)
        if lin.recompute:
            slow = n_b * lin.recompute_s[main_run]
            if uniform:
                up, down = np.array([level < dec.max()]), np.array([level > 0])
                if fixed_level is not None:
                    up[:], down[:] = False, False
                up_gain, down_gain = -slow[dec > level].sum(), slow[dec >= level].sum() * (level > 0)
                up_saved = np.minimum(drop_bytes, room)[dec > level].sum()
                down_saved = -np.maximum(drop_bytes - free, 0.0)[(dec >= level) & (level > 0)].sum()
                r_a = np.array([-1, -1])
                r_kind = np.array([1, 2])
                r_ok = np.concatenate([up, down])
                r_gain, r_saved = np.array([up_gain, down_gain]), np.array([up_saved, down_saved])
            else:
                r_a = np.concatenate([np.arange(stages), np.arange(stages)])
                r_kind = np.repeat([1, 2], stages)
                r_ok = np.concatenate([rec < dec, rec > 0])
                r_gain = np.concatenate([-slow, slow])
                r_saved = np.concatenate([np.minimum(drop_bytes, room), -np.maximum(drop_bytes - free, 0.0)])
            r_c = r_a
            if not uniform:
                # and one recomputed layer moved from stage a to stage c (kind 4): where memory
                # binds, one fewer alone does not fit and one more alone is slower, so the
                # recompute stays where the descent first put it (Llama 3 405B cp 1, per-chunk
                # recompute: 5.809 s; moving it off the longest path, 5.770 s)
                ma, mc = np.meshgrid(np.arange(stages), np.arange(stages), indexing="ij")
                moved = (ma != mc) & (rec[ma] > 0) & (rec[mc] < dec[mc])
                ma, mc = ma[moved], mc[moved]
                r_a, r_c = np.concatenate([r_a, ma]), np.concatenate([r_a, mc])
                r_kind = np.concatenate([r_kind, np.full(len(ma), 4)])
                r_ok = np.concatenate([r_ok, np.ones(len(ma), bool)])
                r_gain = np.concatenate([r_gain, slow[ma] - slow[mc]])
                r_saved = np.concatenate([r_saved, np.minimum(drop_bytes[mc], room[mc]) - np.maximum(drop_bytes[ma] - free[ma], 0.0)])
            a = np.concatenate([a, r_a[r_ok]])
            c = np.concatenate([c, r_c[r_ok]])
            kind = np.concatenate([kind, r_kind[r_ok]])
            gain = np.concatenate([gain, r_gain[r_ok]])
            saved = np.concatenate([saved, r_saved[r_ok]])
        if over.sum() > 0:
            # repairing: the moves that take most bytes off the ranks over their capacity for
            # the fewest they add where there is no room (a layer weighs more on a chunk with
            # more micro-batches in flight: the first chunks of the first ranks)
            order = np.lexsort((rng.permutation(len(a)), -gain, -saved))
        else:
            order = np.lexsort((rng.permutation(len(a)), -gain))
        # the most promising max_moves layer moves and as many recompute moves, in that order:
        # capped together, the layer moves' larger estimates crowd out every recompute move
        layer = kind[order] == 0
        keep = np.zeros(len(order), bool)
        keep[np.flatnonzero(layer)[:max_moves]] = True
        keep[np.flatnonzero(~layer)[:max_moves]] = True
        order = order[keep]
        moves = list(zip(kind[order].tolist(), a[order].tolist(), c[order].tolist()))
        improved = False
        neighbours = []
        for i in range(0, len(moves), batch):
            chunk = moves[i:i + batch]
            cand = np.repeat(current[None], len(chunk), axis=0)
            levels = np.full(len(chunk), level)
            for row, (k, a, c) in enumerate(chunk):
                if k == 0:
                    cand[row, a] -= 1
                    cand[row, c] += 1
                    cand[row, stages + a] = min(cand[row, stages + a], cand[row, a])
                elif a < 0:  # uniform N
                    levels[row] += 1 if k == 1 else -1
                elif k == 4:  # a recomputed layer from a to c
                    cand[row, stages + a] -= 1
                    cand[row, stages + c] += 1
                else:
                    cand[row, stages + a] += 1 if k == 1 else -1
            if uniform:
                cand[:, stages:] = np.minimum(levels[:, None], cand[:, :stages])
            dec_c = cand[:, :stages]
            keep = (dec_c.min(axis=1) >= min_layers) & (dec_c.max(axis=1) <= (max_layers if max_layers is not None else np.inf))
            if spread is not None:
                per_rank = dec_c.reshape(len(cand), ctx.vp, ctx.pp)
                keep &= (per_rank.max(axis=1) - per_rank.min(axis=1) <= spread).all(axis=1)
            if not keep.any():
                continue
            cand, levels = cand[keep], levels[keep]
            counts, recomputed = measure(cand)
            cand_over = lin.excess(counts, recomputed)
            seconds = lin.pass_times(counts, recomputed)
            values, totals = measured(seconds)
            if over.sum() > 0:  # repairing: least total excess, then the shortest
                k = int(np.lexsort((values, cand_over.sum(axis=1)))[0])
                better = cand_over[k].sum() < over.sum()
            else:
                fit = np.flatnonzero(cand_over.sum(axis=1) <= 0)
                if not len(fit):
                    continue
                neighbours.extend((values[k], tuple(cand[k])) for k in fit)
                # the shortest, then the least total (makespans within float noise tie)
                rounded = np.round(values[fit] / (value * 1e-12))
                k = int(fit[np.lexsort((totals[fit], rounded))[0]])
                tied = abs(values[k] - value) <= value * 1e-12
                better = values[k] < value * (1 - 1e-12) or (tied and totals[k] < total * (1 - 1e-12))
            if better:
                current, value, total, over, level, improved = cand[k], float(values[k]), float(totals[k]), cand_over[k], int(levels[k]), True
                headroom = lin.headroom(*measure(current[None]))[0]
                paths.append(graph.path(*(x[:, k] for x in seconds)))
                break
            if time.perf_counter() - t0 >= time_limit_s:
                break
        if not improved:
            neighbours.sort()
            near = np.array([layout for _, layout in neighbours[:neighbour_paths]], dtype=np.int64).reshape(-1, 2 * stages)
            for i in range(0, len(near), batch):
                paths.extend(zip(*graph.paths(*lin.pass_times(*measure(near[i:i + batch])))))
            break
    return tuple(int(x) for x in current[:stages]), value, paths, tuple(int(x) for x in current[stages:])


def check_searchable(ctx: LayoutContext) -> None:
    """Refuse skeletons solve_layout does not cover though the layout model scores them:
    DualPipeV, whose V places rank r's stages at r and 2pp - 1 - r where solve_layout's
    region bounds, segment paths and recompute rows read stage s on rank s % pp
    (vee_layout_search searches the V: a descent, then vee_rounds' CP-SAT rounds)."""
    if ctx.vee:
        raise LayoutError("solve_layout does not search pp_schedule dualpipev (its V places stages r and 2pp - 1 - r on rank r); "
                          "vee_layout_search searches it, `mofa evaluate --pipeline-layout` scores a layout under it")


@dataclasses.dataclass
class VeeModel:
    """DualPipeV's layouts as a CP-SAT model: integer decoder layers per stage `t` (model
    order), the layers of each kind-run per stage `counts`, each stage's forward,
    input-gradient and weight-gradient nanoseconds as linear expressions (LinearLayouts'
    seconds rounded down, so that any path's length in the model is at most its length in
    seconds), and the makespan `z` above each rank's work after the forward chain to it
    (vee_rank_bound's rows). The rounds of vee_rounds add path cuts and memory rows."""

    model: cp_model.CpModel
    t: list
    counts: list
    recomputed: list | None  # recomputed layers of each kind-run per stage (a block N launched), or None
    forward: list
    backward: list
    weight: list
    z: object


def vee_model(ctx: LayoutContext, lin: "LinearLayouts", block: int | None = None) -> VeeModel:
    """The V's base model (VeeModel): t, counts, per-stage times and the rank rows
    makespan >= sum_{s < r} F_s + m * R_r (rank r's first op waits for micro-batch 0's forward
    through stages 0..r-1, then the rank runs its m micro-batches' work on its two stages one
    op after another). `block`: the recompute launched on every stage, the first min(N, t_s)
    layers (with_launched_recompute), priced in the input-gradient pass that re-runs them."""
    runs = kind_runs(ctx.kind_of_layer)
    stages, n, m = ctx.pp * ctx.vp, len(ctx.kind_of_layer), ctx.microbatches
    model = cp_model.CpModel()
    t = [model.NewIntVar(0, n, f"t{s}") for s in range(stages)]
    prefix = [model.NewIntVar(0, n, f"P{s}") for s in range(stages)]
    for s in range(stages):
        model.Add(prefix[s] == (prefix[s - 1] if s else 0) + t[s])
    model.Add(prefix[-1] == n)
    counts, clipped = run_count_vars(model, t, prefix, runs, n)
    recomputed = None
    if block is not None:
        rc = [model.NewIntVar(0, n, f"r{s}") for s in range(stages)]
        for s in range(stages):
            model.AddMinEquality(rc[s], [t[s], int(block)])
        recomputed = recompute_run_vars(model, rc, prefix, clipped, counts, runs, n)

    def ns(x) -> int:
        return int(math.floor(float(x) * TIME_SCALE))

    def linear(per_run, const, of=counts):
        return [sum(ns(per_run[j]) * of[s][j] for j in range(len(runs))) + ns(const[s]) for s in range(stages)]

    forward = linear(lin.forward_s, lin.const_forward_s)
    backward = linear(lin.backward_s - lin.weight_s, lin.const_backward_s - lin.const_weight_s)  # the input-gradient pass
    if recomputed is not None:
        backward = [x + y for x, y in zip(backward, linear(lin.recompute_s, np.zeros(stages), recomputed))]
    weight = linear(lin.weight_s, lin.const_weight_s)
    per_layer = max(ns(x) for x in lin.forward_s + lin.backward_s + lin.recompute_s) + 4
    # above any rank's work after any chain: (m + 1) x every layer and constant of the model
    horizon = (m + 1) * (n * per_layer + ns((lin.const_forward_s + lin.const_backward_s).sum()) + 3 * stages) + 1
    z = model.NewIntVar(0, horizon, "makespan")
    for mine in ctx.stages_of:
        model.Add(z >= sum(forward[s] for s in range(int(mine[0]))) + m * sum(forward[s] + backward[s] + weight[s] for s in map(int, mine)))
    return VeeModel(model, t, counts, recomputed, forward, backward, weight, z)


def vee_rank_bound(ctx: LayoutContext, time_limit_s: float = 2.0, workers: int = 2) -> float:
    """A makespan lower bound for every DualPipeV layout of the skeleton, fitting or not: the
    least over the integer layer counts per stage and kind run of vee_model's rank rows
    (recompute left out: it only adds); its proven bound, in seconds. Where the ranks' work is
    uneven in integers (DeepSeek-V3 on pp 4: 61 layers, 3 of them dense, over 4 ranks) it is
    above the ranks' mean work (work_bound_s)."""
    vm = vee_model(ctx, LinearLayouts(ctx))
    vm.model.Minimize(vm.z)
    solver = cp_solver(time_limit_s, workers)
    status = solve(solver, vm.model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return 0.0
    return float(solver.BestObjectiveBound()) / TIME_SCALE


def vee_rounds(ctx: LayoutContext, best: StageLayout, score_of, deadline: float, workers: int = 2,
               paths=(), level: int | None = None) -> tuple[StageLayout, float, bool, int]:
    """CP-SAT rounds over DualPipeV's layouts, as solve_layout's free rounds: the model (vee_model) asks only for layouts it prices below
    the incumbent `best`; each answer's longest path on the V's schedule graph (ScheduleGraph:
    a node per entry, so a forward overlapped with another stage's backward lasts both, and
    the W passes count on their own: n_F.F + n_B.B + n_W.W) becomes a cut valid for every
    layout, the memory rows it breaks come in (MemoryRows, over the V's ranks), and an answer
    that is truly faster and fits (the exact model confirming) becomes the incumbent. No answer
    at all (INFEASIBLE) certifies it. `paths`: known (n_F, n_B, n_W) paths of the V's graph,
    cuts from the start. `level`: under full recompute, the N every layout recomputes the
    first min(N, layers) of each stage with (Megatron's block method as launched; all layers:
    N = the model's), priced in the times and the memory rows. Until `deadline`
    (perf_counter seconds), or a Ctrl-C. Returns (the best layout, the proven makespan lower
    bound in seconds, whether certified, rounds, whether a Ctrl-C ended it)."""
    lin = LinearLayouts(ctx)
    vm = vee_model(ctx, lin, level)
    model, stages = vm.model, ctx.pp * ctx.vp
    rows = MemoryRows(model, ctx, lin, vm.counts, vm.recomputed)
    # integer nanoseconds rounded down: a path of <= 3 m stages ops, each under by < 1 ns per term
    slack = 3 * ctx.microbatches * stages * (2 * len(lin.runs) + 1) / TIME_SCALE

    def vectors(decoders: np.ndarray) -> np.ndarray:
        """[K, 2 stage] decoder counts and the recompute launched on them."""
        decoders = np.asarray(decoders, dtype=np.int64).reshape(-1, stages)
        return np.concatenate([decoders, np.minimum(decoders, level) if level is not None else np.zeros_like(decoders)], axis=1)
    cuts = set()

    def cut(n_f, n_b, n_w) -> bool:
        key = (tuple(n_f.astype(int)), tuple(n_b.astype(int)), tuple(n_w.astype(int)))
        if key in cuts:
            return False
        cuts.add(key)
        model.Add(vm.z >= path_sum((n_f, n_b, n_w), (vm.forward, vm.backward, vm.weight)))
        return True

    def measure(decoders: np.ndarray):
        """(graph makespans, linear fits, [(n_F, n_B, n_W)] paths) of K layouts [K, stage]."""
        screened = lin.screen(vectors(decoders))
        return screened.makespan_s, screened.fits, screened.paths()

    def makespan_of(layout) -> float:
        return layout_makespan(score_of(layout))

    def layout_of(decoders) -> StageLayout:
        layout = StageLayout(pp=best.pp, vp=best.vp, decoders=tuple(int(x) for x in decoders), mtp=best.mtp, vee=True)
        return with_launched_recompute(layout, level) if level is not None else layout

    for path in list(paths) + measure(np.array([best.decoders]))[2]:  # known paths (local_search's) and the incumbent's
        cut(*path)
    rows.add_broken(tuple(vectors(best.decoders)[0]))
    model.Minimize(vm.z)
    bound, proven, rounds, interrupted = 0.0, False, 0, False
    try:  # Ctrl-C: the incumbent (it fits) and the bound proven so far, as the deadline would
        while not proven and time.perf_counter() < deadline:
            best_makespan = makespan_of(best)
            status, proved, found = round_below(model, vm.z, vm.t, best_makespan, slack, deadline - time.perf_counter(), workers)
            rounds += 1
            bound, proven = max(bound, proved), status == cp_model.INFEASIBLE
            if proven or not found:
                break  # certified, or the time ran out within the round
            answers = np.array(found, dtype=np.int64)
            values, fits, paths = measure(answers)
            new = False
            for path in paths:
                new |= cut(*path)
            for k in np.argsort(values, kind="stable"):
                if not fits[k]:
                    new |= rows.add_broken(tuple(vectors(answers[k])[0]))
                    continue
                if values[k] >= best_makespan:
                    break
                layout = layout_of(answers[k])
                if score_of(layout).fits and makespan_of(layout) < best_makespan:
                    best, new = layout, True
                    break
                new |= rows.add_broken(tuple(vectors(answers[k])[0]))
            if not new:  # nothing learnt (integer rounding): exclude them
                for answer in found:
                    model.AddForbiddenAssignments(vm.t, [answer])
    except KeyboardInterrupt:
        interrupted = True
    return best, bound, proven, rounds, interrupted


def vee_layout_search(ctx: LayoutContext, time_limit_s: float, start: StageLayout, scores: dict | None = None,
                      workers: int = 2) -> LayoutSolution:
    """DualPipeV's layouts (solve_layout does not search them: check_searchable): local_search
    from `start` over the V's schedule graph and linear memory test (half the time at most; a
    start that does not fit is repaired first), then vee_rounds (CP-SAT over the V's path cuts
    and memory rows, the local search's paths among them) the rest: they certify the makespan
    optimum or improve on it. Under full recompute every layout recomputes what Megatron
    launches (own_layout: block N per stage, N fixed) and only layers move. The bound is the
    best of the rounds', vee_rank_bound's (each rank's work after the forward chain to its
    first stage, least over integer layer counts) and work_bound_s's (the ranks' mean work),
    all for every V layout. On DeepSeek-V3's shipped answer (pp 4, 61 layers) the rounds
    certify the V split in ~0.2 s, where the rank bound alone left 1.20%.
    Ctrl-C ends it as the time limit would, with the best layout so far (the start where the
    local search had not ended) and the bound proven by then (`interrupted`); before any
    layout that fits is known it reaches the caller."""
    start_time = time.perf_counter()
    score_of = memo_scorer(ctx, scores)

    def makespan_of(layout: StageLayout) -> float:
        return layout_makespan(score_of(layout))

    level = None
    if ctx.recompute_allowed:  # the block method's N, or every layer
        level = int(ctx.cfg.recompute_layers[0]) if int(ctx.cfg.recompute_method[0]) == 1 else len(ctx.kind_of_layer)
        start = with_launched_recompute(start, level)
    best, mean, ranks = start, work_bound_s(ctx), 0.0
    rounds, found, proven, interrupted, moves = 0, 0.0, False, False, 0
    try:
        # the bound first (a fifth of the time at most; on DeepSeek-V3's pp 4 it is optimal in ~10 ms)
        ranks = vee_rank_bound(ctx, min(2.0, max(0.2 * time_limit_s, 0.05)), workers)
        remaining = time_limit_s - (time.perf_counter() - start_time)
        decoders, _, paths, recompute = local_search(ctx, start.decoders, 0.5 * remaining, start_recompute=start.recompute, fixed_level=level)
        descended = StageLayout(pp=start.pp, vp=start.vp, decoders=decoders, mtp=start.mtp, recompute=recompute, vee=True)
        if score_of(descended).fits and (not score_of(start).fits or makespan_of(descended) < makespan_of(start)):
            best = descended
        moves = int(sum(abs(a - b) for a, b in zip(best.decoders, start.decoders)) // 2)
        if score_of(best).fits:
            best, found, proven, rounds, interrupted = vee_rounds(ctx, best, score_of, start_time + time_limit_s, workers, paths, level)
    except KeyboardInterrupt:
        if not score_of(best).fits:  # nothing that fits to give back
            raise
        interrupted = True
    best_score = score_of(best)
    makespan = layout_makespan(best_score)
    lower = min(max(mean, ranks, found), makespan)
    source = "vee-cp-sat" if found >= max(mean, ranks) else "vee-rank" if ranks > mean else "vee-work"
    return LayoutSolution(best, best_score.step_time_s, makespan, best_score.bound_s, lower, proven or lower >= makespan * (1 - 1e-9),
                          time.perf_counter() - start_time, best_score.fits, moves + rounds, source, interrupted)


def solve_layout(ctx: LayoutContext, time_limit_s: float = 10.0, workers: int = 2, min_layers: int = 0, refine: bool = True,
                 seeds: tuple[StageLayout, ...] = (), round_limit_s: float = 4.0, graph: bool = False,
                 max_layers: int | None = None, chunk_spread: int | None = None, local: bool = True,
                 local_fraction: float = 0.15, neighbour_paths: int | None = None, uniform_recompute: bool = False,
                 scores: dict | None = None, paths: set | None = None, region_fraction: float = 0.75,
                 split_fraction: float | None = None, rank_tables: bool = True, table_cache: dict | None = None) -> LayoutSolution:
    """The layout minimising the simulated pipeline makespan of `ctx`'s skeleton under every
    rank's memory (MTP modules on the last stage; `min_layers`: the least decoder layers per
    stage). The step adds the exposed P2P (the skeleton's) and the busiest rank's DP reduce and
    update (costmodel.stage_layout.rank_update_s), which the objective leaves out: the bound and
    the gap are the makespan's, and the step of the answer is scored whole.

    The objective is the simulated makespan, a max over the schedule graph's paths of linear
    forms in the layer counts (any path bounds every layout from below). The model starts from
    the segment paths of every rank (segment_paths), each rank's busy time over its integer
    kind totals, and the longest paths of the `seeds` and of a local search from the best seed
    that fits (local_search: the incumbent, and the paths of its best `neighbour_paths`
    neighbours, which are tight around it; default min(1000, 32768 / stages), about 32k cut
    terms: on DeepSeek-V3 32 -> 1000 takes its free-layout certification from ~20 s to ~8 s,
    where Llama 3 405B's 128 stages make each path four times the terms); memory rows come in
    as answers break them. Where no seed fits (one kind of decoder layer, not uniform_recompute),
    the ROUND_STARTS fastest of round_seeds' answers join the seeds and the local search runs
    from each.
    Free layouts with an incumbent, one kind of decoder layer: first the integer consequences
    of beating the incumbent (rank_order_region: each rank's least and most layers, stage 0's
    most, from the ranks' busy time and the order their first layers come in) and the LP
    relaxation of the schedule graph within them (lp_region_bound), with at most
    `region_fraction` of the time left: where the LP reaches the incumbent that certifies it
    with no CP-SAT round (Llama 3 405B on pp 16 x vp 8: the integer rank totals are what the
    path cuts' LP relaxation misses, 2.1% below Megatron's split); otherwise the region's
    rows and the LP's paths join the model for the rounds.
    Free layouts with an incumbent: each round asks CP-SAT for layouts the model prices below
    the incumbent; every answer's longest path becomes a cut (or the answer the new incumbent),
    and INFEASIBLE certifies the incumbent. Before the rounds the model takes the paths that
    dwell on one or two overloaded chunks (dwell_paths, around the incumbent's stage times:
    the far layouts CP-SAT proposes first; Llama 3 405B cp 1, free layouts: 5.2% -> 1.1% in
    10 s) and, with recompute, that only ranks which cannot fit without it recompute
    (MemoryRows.recompute_only_where_needed; recomputing_ranks' zeros for ranks that cannot
    do so below the incumbent): DeepSeek-V3 pp 16 x vp 2, per-stage recompute, 6.4% in 10 s
    -> certified in 7.7-9.3 s. Otherwise (regular layouts, no incumbent yet,
    refine=False) each round minimises the model, simulates the answer and adds its path,
    until the best simulated layout meets CP-SAT's bound. Either way the bound is proven when
    time runs out and the gap is reported.
    refine=False stops after the first round: the critical-path bound's optimum (the DP oracle's
    objective). chunk_spread: search only regular layouts, whose chunks on one rank differ by at
    most this many layers (the answer and its bound then hold among those; the cuts start from
    the rank terms only, which keeps the model small). round_limit_s caps each CP-SAT solve
    once there is an incumbent (free layouts: a round stops that far in once it has answers and
    goes on while it has none, round_below; regular ones: a round that finds nothing gets the
    rest of the time; its bound is proven either way). local=False skips the local search
    (local_fraction of the time limit). graph=True replaces the cuts by the whole event graph of the schedule (an
    end-time variable per op): exact in one solve, but too large for CP-SAT beyond small
    instances (pp 16 x vp 8 x 32 micro-batches: no bound in 20 s).
    Recompute (skeletons with full recompute, ctx.recompute_allowed): an integer r_s per stage,
    0 <= r_s <= t_s, the stage's first r_s layers fully recomputed (their kind-runs clipped
    from the prefix sums like the layers'); the backward times gain r_s's recompute, the memory
    rows lose what the recomputed layers do not keep and gain, per rank, the working set of the
    largest kind it recomputes (an integer w_r >= working_k * y_rk, y_rk a boolean that the
    rank recomputes a layer of kind k). uniform_recompute: r_s = min(N, t_s) for one integer N,
    Megatron's one --recompute-num-layers (the exportable answer), seeded also with layouts that
    pack each rank's layers into its last chunks (packed_seeds). With one kind of decoder
    layer (rank_tables), each rank's fewest recomputed layers at each of its layer totals
    (least_recompute, 0.7-0.8 s for Llama 3 405B's 16 ranks on 2 cores; `table_cache`: shared by calls on the
    same skeleton, two_phase) join the model as element constraints
    with their convex envelopes, and the rank region as recompute its work must include: the
    memory rows alone let the LP recompute a fraction of a layer where the rank must recompute
    one or two (Llama 3 405B cp 1, regular layouts: 5.9% -> 2.7% in 10 s).
    Time: the seeds are scored first (`scores`: a cache of score_layout by layout that
    callers solving the same skeleton twice share, two_phase), the local search takes at most
    local_fraction of the limit and a quarter of what is left, the rank region and its LP at
    most region_fraction of the rest (the LP stops early where it stops gaining), CP-SAT the
    rest. The bound reported is the best of CP-SAT's, the region LP's and work_bound_s
    (bound_source says which): a search whose CP-SAT rounds prove nothing in time still
    carries a proven gap.
    split_fraction: the share of the time left after the local search given to
    recompute_split_bound (skeletons with recompute, with an incumbent): recompute as a yes/no
    per rank, where a rank that recomputes is over its capacity without it and pays at least
    one recomputed layer. Default: all of it for regular layouts whose incumbent recomputes at
    most one layer per rank (DeepSeek-V3 on pp 16 x vp 2, whose optimum recomputes nothing:
    certified in 5-10 s, where the search's own rounds stop at a 5.9% gap, their LP recomputing a
    fraction of a layer); none where it recomputes more (the relaxation prices a rank's
    recompute at one layer, so it cannot reach such an incumbent: Llama 3 405B cp 1, 27 layers,
    11.5% instead of the rounds' 6.1%) and none for free layouts (there its CP-SAT model, 32
    more booleans, proved less in 10 s than the search's own rounds: 56.5 s against 56.8 s)."""
    check_searchable(ctx)
    start = time.perf_counter()
    scores = {} if scores is None else scores  # shared with the nested search below
    score_of = memo_scorer(ctx, scores)

    pp, vp = ctx.pp, ctx.vp
    stages = pp * vp
    if neighbour_paths is None:
        neighbour_paths = min(1000, 32768 // stages)
    n_layers = len(ctx.kind_of_layer)
    mtp_layers = ctx.problem.model.mtp_layers
    u = unit_costs(ctx)
    runs = kind_runs(ctx.kind_of_layer)
    model = cp_model.CpModel()
    t = [model.NewIntVar(min_layers, n_layers if max_layers is None else max_layers, f"t{s}") for s in range(stages)]
    prefix = [model.NewIntVar(0, n_layers, f"P{s}") for s in range(stages)]
    if chunk_spread is not None:  # regular layouts: the chunks of a rank differ by at most this many layers
        for r in range(pp):
            low = model.NewIntVar(0, n_layers, "")
            model.AddMinEquality(low, t[r::pp])
            for v in t[r::pp]:
                model.Add(v <= low + chunk_spread)
    for s in range(stages):
        model.Add(prefix[s] == (prefix[s - 1] if s else 0) + t[s])
    model.Add(prefix[-1] == n_layers)
    recompute = ctx.recompute_allowed
    rc = [model.NewIntVar(0, n_layers if recompute else 0, f"r{s}") for s in range(stages)]  # recomputed layers per stage
    for s in range(stages):
        model.Add(rc[s] <= t[s])
    level = None
    if recompute and uniform_recompute:  # one N for every stage: r_s = min(N, t_s)
        level = model.NewIntVar(0, n_layers, "N")
        for s in range(stages):
            model.AddMinEquality(rc[s], [level, t[s]])
    vars_ = t + rc  # what an answer assigns
    # layers of each kind-run per stage
    run_counts, clipped = run_count_vars(model, t, prefix, runs, n_layers)
    kind_of_run = [kind for kind, _, _ in runs]
    # recomputed layers of each kind-run per stage (the first r_s of the stage)
    rc_counts = recompute_run_vars(model, rc, prefix, clipped, run_counts, runs, n_layers) if recompute else [[0] * len(runs) for _ in range(stages)]

    # forward and backward ns of each stage (chunk_times' composition, integer coefficients)
    mtp = np.zeros(stages)
    mtp[-1] = mtp_layers
    first = np.arange(stages) == 0
    last = np.arange(stages) == stages - 1
    edge_counts = np.zeros((stages, len(ctx.kinds)))
    if ctx.mtp_kind is not None:
        edge_counts[-1, ctx.mtp_kind] = mtp_layers
    const_f, const_b = chunk_times(u, edge_counts, mtp, first, last)  # what a stage holds besides its decoder layers
    fwd = [int(round(u["kind_forward"][k] * TIME_SCALE)) for k in kind_of_run]
    bwd = [int(round((u["kind_total"][k] - u["kind_forward"][k]) * TIME_SCALE)) for k in kind_of_run]
    rec = [int(round(u["kind_recompute"][k] * TIME_SCALE)) for k in kind_of_run]
    f_expr = [sum(fwd[j] * run_counts[s][j] for j in range(len(runs))) + int(round(const_f[s] * TIME_SCALE)) for s in range(stages)]
    b_expr = [sum(bwd[j] * run_counts[s][j] + rec[j] * rc_counts[s][j] for j in range(len(runs))) + int(round(const_b[s] * TIME_SCALE))
              for s in range(stages)]
    per_op = (max((u["kind_total"] + u["kind_recompute"]).max(), 0.0) * n_layers + float(const_f.max() + const_b.max())) * TIME_SCALE
    horizon = int(2 * ctx.microbatches * stages * per_op) + 1
    z = model.NewIntVar(0, horizon, "makespan")
    lin = LinearLayouts(ctx)
    cuts = set()

    def cut(n_f, n_b):
        key = (tuple(n_f.astype(int)), tuple(n_b.astype(int)))
        if key in cuts:
            return False
        cuts.add(key)
        model.Add(z >= path_sum((n_f, n_b), (f_expr, b_expr)))
        return True

    for n_f, n_b in sorted(paths or ()):  # a previous search's paths of this skeleton: cuts for every layout
        cut(np.array(n_f), np.array(n_b))
    for n_f, n_b in segment_paths(ctx.ops, stages, ctx.microbatches):
        if chunk_spread is None or (n_f == n_b).all():
            cut(n_f, n_b)
    # Each rank's layers of each kind as integer variables, and the rank's busy time over them:
    # implied by the segment paths, but in this form CP-SAT branches and propagates on the
    # integer rank totals (with it the bound reaches DeepSeek-V3's rank bound, 4 MoE layers x
    # 480 micro-batches = 57.6 s, within the first round)
    kinds_used = sorted(set(kind_of_run))
    tables = None
    if recompute and rank_tables and len(runs) == 1:
        most = n_layers if max_layers is None else min(n_layers, vp * max_layers)
        table_cache = {} if table_cache is None else table_cache
        if most not in table_cache:
            table_cache[most] = [least_recompute(ctx, lin, r, most) for r in range(pp)]
        tables = table_cache[most]
    for r in range(pp):
        mine = range(r, stages, pp)
        total = {k: model.NewIntVar(0, n_layers, f"L{r}_{k}") for k in kinds_used}
        for k in kinds_used:
            model.Add(total[k] == sum(run_counts[s][j] for s in mine for j, kind in enumerate(kind_of_run) if kind == k))
        per_layer = {k: fwd[kind_of_run.index(k)] + bwd[kind_of_run.index(k)] for k in kinds_used}
        const = sum(int(round(const_f[s] * TIME_SCALE)) + int(round(const_b[s] * TIME_SCALE)) for s in mine)
        recomputing = 0
        if recompute:  # the rank's recomputed layers of each kind, integer totals like its layers
            for k in kinds_used:
                again = model.NewIntVar(0, n_layers, f"R{r}_{k}")
                model.Add(again == sum(rc_counts[s][j] for s in mine for j, kind in enumerate(kind_of_run) if kind == k))
                recomputing += rec[kind_of_run.index(k)] * again
            if tables is not None:
                # the fewest layers the rank recomputes at each layer total (least_recompute), as
                # an element constraint (integer reasoning) and its lower convex envelope (the
                # LP's): the memory rows alone let the LP recompute a fraction of a layer where a
                # layout must recompute one or two
                table = tables[r]
                k = kinds_used[0]
                model.Add(again >= least_recompute_var(model, total[k], table, f"least{r}"))
                for (n1, f1), (n2, f2) in lower_envelope(table):
                    model.Add((n2 - n1) * again >= (f2 - f1) * total[k] + (f1 * n2 - f2 * n1))
        model.Add(z >= ctx.microbatches * (sum(per_layer[k] * total[k] for k in kinds_used) + const + recomputing))
    best, best_score = None, None

    def make(vector) -> StageLayout:
        """The layout of an answer: decoder counts, then recompute counts."""
        return StageLayout(pp=pp, vp=vp, decoders=tuple(int(x) for x in vector[:stages]), mtp=tuple(int(x) for x in mtp),
                           recompute=tuple(int(x) for x in vector[stages:]))

    if level is not None:
        # uniform recompute: seeds recompute min(N, layers), N their own where they have one,
        # else their most; each also with no recompute and with the least N that fits it
        # (fewest_recompute): a per-stage answer that recomputes one layer somewhere becomes
        # N = 1 everywhere, a basin far from its own decoder counts with N = 0 (DeepSeek-V3:
        # 69.7 s against 60.9 s)
        own_n = tuple(seed.with_recompute([min(n, d) for d in seed.decoders])
                      for seed, n in ((seed, seed.uniform_recompute()) for seed in seeds)
                      for n in [n if n is not None else max(seed.recompute)])
        least_n = tuple(x for x in (fewest_recompute(ctx, seed.with_recompute([0] * stages), lin, uniform=True)
                                    for seed in seeds if seed.stages == stages) if x is not None)
        seeds = tuple(dict.fromkeys(own_n + least_n))
        if not graph:  # and the layouts that pack each rank's layers into its last chunks, N = 1 and 2
            packed = (seed for seed in packed_seeds(ctx, (1, 2)) if min(seed.decoders) >= min_layers
                      and (max_layers is None or max(seed.decoders) <= max_layers) and (chunk_spread is None or regular(seed, chunk_spread)))
            seeds = tuple(dict.fromkeys(seeds + tuple(packed)))
    if recompute and level is None:
        # each seed also with the fewest recomputed layers that make it fit (fewest_recompute);
        # not with one N: a seed that one N makes fit (DeepSeek-V3's recipe split, N = 1 at
        # 69.8 s) can hold the local search in a basin that N = 0 layouts (61.0 s) are not near
        repaired = [fewest_recompute(ctx, seed.with_recompute([0] * stages), lin) for seed in seeds if seed.stages == stages]
        seeds = tuple(dict.fromkeys(seeds + tuple(x for x in repaired if x is not None)))
    # Known layouts: their critical paths as cuts, the best that fits as the incumbent. Those
    # with the MTP modules where the search puts them are measured in one batch on the
    # schedule graph and the linear memory test (the exact model's), which gives every one's
    # longest path at once, and only the fastest that passes is simulated, to confirm it; the
    # others are scored exactly.
    standard = tuple(int(x) for x in mtp)
    graph_seeds = [layout for layout in seeds if layout.mtp == standard and layout.stages == stages]
    candidates = [layout for layout in seeds if layout not in graph_seeds]
    if graph_seeds:
        screened = lin.screen([layout.decoders + layout.recompute for layout in graph_seeds])
        for n_f, n_b in screened.paths():
            cut(n_f, n_b)
        order = np.argsort(screened.makespan_s, kind="stable")
        candidates += [graph_seeds[k] for k in order if screened.fits[k]]
        # one N: the fastest seed that fits recomputing nothing, a start of its own (below)
        plain_seeds = [k for k in order if screened.fits[k] and not graph_seeds[k].any_recompute]
        zero_start = graph_seeds[plain_seeds[0]] if level is not None and plain_seeds else None
    else:
        zero_start = None
    for layout in candidates:
        score = score_of(layout)
        if layout not in graph_seeds:
            cut(*_path_of(ctx, score))
        if score.fits and (best_score is None or layout_makespan(score) < layout_makespan(best_score)):
            best, best_score = layout, score
        if score.fits and layout in graph_seeds:
            break  # the fastest graph seed that fits: the others are slower
    starts: tuple[StageLayout, ...] = ()
    if best is None and len(runs) == 1 and level is None and not graph:
        # no given layout fits: seeds whose chunk rounds are balanced under the memory rows
        # (round_seeds): every answer of two CP-SAT solves (random seeds 0 and 1, each with a
        # twentieth of the time at most), the ROUND_STARTS fastest on the schedule graph. Their
        # local optima differ widely and not in the order of the starts (Llama 3 405B cp 1:
        # starts at 11.36 s descend to 9.15, 9.70 or 10.27 s), and which one leads to the best
        # layout changes with the step-time coefficients: descending from each solve's best
        # answer alone gave 9.15 s, and 10.27 s after a 0.4% refit of the H100 profile
        found = [a for k in (0, 1) for a in round_seeds(ctx, lin, min(0.5, 0.05 * time_limit_s), min_layers, max_layers, chunk_spread, random_seed=k)]
        found = list(dict.fromkeys(found))
        if found:
            order = np.argsort(lin.screen([a.decoders + a.recompute for a in found]).makespan_s, kind="stable")
            starts = tuple(found[k] for k in order[:ROUND_STARTS])
        for seed in starts:
            score = score_of(seed)
            cut(*_path_of(ctx, score))
            if score.fits and (best_score is None or layout_makespan(score) < layout_makespan(best_score)):
                best, best_score = seed, score
        seeds = seeds + starts

    nearest = None

    def descend(layout, budget_s):
        """Local search from a layout (repaired first where it does not fit): a better
        incumbent, and the longest paths of the layouts around the local optimum as cuts (the
        ones CP-SAT's bound needs there)."""
        nonlocal best, best_score, nearest
        if not local or budget_s <= 0:
            return
        decoders, _, paths, recomputed = local_search(ctx, layout.decoders, budget_s, lin=lin, spread=chunk_spread, min_layers=min_layers,
                                                      max_layers=max_layers, neighbour_paths=neighbour_paths, start_recompute=layout.recompute,
                                                      uniform_recompute=level is not None)
        for n_f, n_b in paths:
            cut(n_f, n_b)
        found = make(decoders + recomputed)
        add_rows(decoders + recomputed)
        nearest = found  # a repair that fell short still makes CP-SAT's best hint
        score = score_of(found)
        if score.fits and (best_score is None or layout_makespan(score) < layout_makespan(best_score)):
            best, best_score = found, score

    rows = MemoryRows(model, ctx, lin, run_counts, rc_counts if recompute else None)
    add_rows = rows.add_broken
    if recompute and level is None and tables is None:
        # a rank recomputes only where it must (with one kind of layer the rank tables above
        # already price what its memory forces, and these 16 more booleans slowed the rounds:
        # Llama 3 405B cp 1, free layouts after a regular search, 5.4% -> 7.8% in 10 s)
        rows.recompute_only_where_needed(run_counts, rc_counts)
    for layout in seeds:
        add_rows(layout.decoders + layout.recompute)
    def by_levels() -> LayoutSolution | None:
        """One N (see below): the answer where level_work_bounds settles the search (no N open,
        or only N = 0: the search without recompute), else None (the N still open kept for
        CP-SAT's domain)."""
        nonlocal level_floor, open_levels
        best_makespan = layout_makespan(best_score)
        open_levels, low = level_range(ctx, lin, best_makespan, n_layers if max_layers is None else max_layers, tables)
        level_floor = max(level_floor, low)
        if not open_levels:
            return LayoutSolution(best, best_score.step_time_s, best_makespan, best_score.bound_s, best_makespan, True,
                                  time.perf_counter() - start, best_score.fits, 0, "levels")
        if open_levels == [0]:
            # the cuts so far go in (a descent's, near the incumbent, where one ran; a per-stage
            # search's, shared through `paths`) and the time to CP-SAT's rounds, not to a local
            # search of its own (its rounds need the time: DeepSeek-V3 certifies after 2-4 s of
            # them); the incumbent is its only seed, since each seed brings the memory rows it
            # binds, which slow the rounds (DeepSeek-V3 standalone with every seed: 0.39% at 10 s
            # in two runs of three; with the incumbent alone certified in 4.3-5.7 s)
            zero = [0] * stages
            known = set(cuts) | set(paths or ())
            plain = solve_layout(dataclasses.replace(ctx, lc_full=None), max(time_limit_s - (time.perf_counter() - start), 0.05), workers,
                                 min_layers, refine, seeds=(best.with_recompute(zero),),
                                 round_limit_s=round_limit_s, max_layers=max_layers, chunk_spread=chunk_spread, local=False,
                                 neighbour_paths=neighbour_paths, scores=scores, paths=known, region_fraction=region_fraction)
            if paths is not None:
                paths.update(known)
            if plain.makespan_s <= best_makespan:
                return dataclasses.replace(plain, solve_s=time.perf_counter() - start, bound_source="levels")
            # the incumbent (some N >= 1) stays: no N >= 1 beats it, nor a layout without recompute below plain's bound
            lower = min(plain.lower_bound_s, best_makespan)
            return LayoutSolution(best, best_score.step_time_s, best_makespan, best_score.bound_s, lower, lower >= best_makespan,
                                  time.perf_counter() - start, best_score.fits, plain.rounds, "levels", plain.interrupted)
        return None

    level_floor = -math.inf  # one N: the least of level_work_bounds over the N still open
    open_levels = None  # one N: the N level_work_bounds leaves open, once checked
    check_levels = level is not None and refine and not graph
    if check_levels and best is not None:
        # One N for every stage: the N whose ranks' busy time alone reaches the incumbent are out
        # (level_work_bounds: with N >= 1 every chunk holding a layer recomputes one). Where
        # only N = 0 is left the layouts recompute nothing, and the search without recompute
        # (its region LP and rounds) gets the time left: DeepSeek-V3 on pp 16 x vp 2, where a
        # rank of 4 MoE layers with one recomputed is 63 s against the 60.9 s optimum without.
        # Checked before the local search and after each descent: where the seeds already settle
        # it (a per-stage search's answer, layout_report), the descent's time goes to the search
        # without recompute. The fastest seed recomputing nothing descends first: the one that
        # one N makes fastest can hold the descent in an N = 1 basin (DeepSeek-V3's recipe split,
        # 69.6 s, against 60.9 s from the even split without recompute).
        settled = by_levels()
        if settled is not None:
            return settled
    # integer nanoseconds: a path of <= 2*m*stages ops, each off by <= 0.5 ns per rounded term
    slack = 0.5 * 2 * ctx.microbatches * stages * ((2 if recompute else 1) * len(runs) + 1) / TIME_SCALE
    bound, rounds, proven, stalled = 0.0, 0, False, False
    lp_bound = None  # what rank_order_region and lp_region_bound proved, for every layout
    split_bound = None  # what recompute_split_bound proved, for every layout and recompute vector
    interrupted = False
    try:  # Ctrl-C from here on: the incumbent and the bound proven so far, as a time limit would
        # the local search gets its share of what the seeds left, so that CP-SAT keeps the most: each
        # descent at most local_s (from ROUND_STARTS starts up to that many times local_s, though they
        # settle well within it: 0.3-0.7 s each on Llama 3 405B cp 1, against 1.5 s)
        local_s = min(local_fraction * time_limit_s, 0.25 * max(time_limit_s - (time.perf_counter() - start), 0.0))
        if starts:  # the local search from each (the better start is not the better end)
            for seed in starts:
                descend(seed, local_s)
        elif best is not None:
            for seed in ([zero_start] if zero_start is not None and zero_start != best else []) + [best]:
                descend(seed, local_s)
                if check_levels:
                    settled = by_levels()
                    if settled is not None:
                        return settled
        elif seeds:  # no seed fits: repair the one least over the capacity
            over = [lin.excess(*lin.layout_counts(np.array(seed.decoders + seed.recompute)[None])).sum() for seed in seeds]
            descend(seeds[int(np.argmin(over))], local_s)
        if open_levels is not None:
            model.AddLinearExpressionInDomain(level, cp_model.Domain.FromValues(open_levels))
        if graph:  # the schedule's event graph: every op ends after its rank's previous op and its inputs
            ends = {}
            for rank_ops in ctx.ops:
                for op in rank_ops:
                    ends[op.kind, op.stage, op.microbatch] = model.NewIntVar(0, horizon, "")
            for rank_ops in ctx.ops:
                previous = None
                for op in rank_ops:
                    duration = f_expr[op.stage] if op.kind == "F" else b_expr[op.stage]
                    end = ends[op.kind, op.stage, op.microbatch]
                    preds = ([previous] if previous is not None else []) + [ends[key] for key in op_inputs(op, stages - 1)]
                    for pred in preds or [0]:
                        model.Add(end >= pred + duration)
                    previous = end
                model.Add(z >= previous)
        model.Minimize(z)

        def _take_answers(answers) -> bool:
            """Score CP-SAT's answers on the schedule graph in one batch: each one's longest path
            becomes a cut, the memory rows it breaks come in, the best that fits (the exact model
            confirming) becomes the incumbent; whether anything was new."""
            nonlocal best, best_score
            vectors = np.array(answers, dtype=np.int64)
            new = False
            for i in range(0, len(vectors), 64):
                part = vectors[i:i + 64]
                screened = lin.screen(part)
                values, fits = screened.makespan_s, screened.fits
                for n_f, n_b in screened.paths():
                    new |= cut(n_f, n_b)
                for k in np.argsort(values):
                    if not fits[k]:
                        new |= add_rows(part[k])
                        continue
                    if values[k] >= layout_makespan(best_score):
                        break
                    layout = make(part[k])
                    score = score_of(layout)
                    new |= add_rows(part[k])
                    if score.fits:
                        best, best_score, new = layout, score, True
                        break
            return new

        if refine and best is not None and chunk_spread is None and not graph and recompute and level is None:
            # rounds ask only for layouts below the incumbent: ranks that cannot recompute in one
            # (recomputing_ranks, the dominance of recompute_only_where_needed) recompute nothing
            maybe = recomputing_ranks(ctx, layout_makespan(best_score), lin)
            for r in range(pp):
                if r not in maybe:
                    for s in ctx.stages_of[r]:
                        model.Add(rc[int(s)] == 0)
        if refine and best is not None and chunk_spread is None and not graph and level is None:
            # free layouts: the paths that dwell on one or two overloaded chunks (dwell_paths),
            # around the incumbent's stage times (not with one N: Llama 3 405B cp 1's one-N bound
            # fell with them, 18.79-18.80% -> 18.82-19.23% in 10 s)
            counts, recomputed = lin.layout_counts(np.array(best.decoders + best.recompute)[None])
            for n_f, n_b in dwell_paths(ctx, tuple(x[:, 0] for x in lin.times(counts, recomputed if recompute else None))):
                cut(n_f, n_b)
        if best is not None and best.any_recompute:
            # the region's LP leaves recompute out, so it cannot reach an incumbent that pays for
            # some: the region's integer rows for CP-SAT, and the time to its rounds (Llama 3 405B
            # cp 1, per-chunk recompute, free phase of two_phase: 11.5% -> 6.3-6.6%)
            region_fraction = min(region_fraction, 0.3)
        region_budget = region_fraction * max(time_limit_s - (time.perf_counter() - start), 0.0)
        if refine and best is not None and chunk_spread is None and not graph and len(runs) == 1 and region_budget >= 1.0:
            # Free layouts, with an incumbent: the integer consequences of beating it (rank
            # totals, stage 0) and, within them, the LP relaxation of the schedule graph. Where
            # the LP reaches the incumbent, that certifies it without a CP-SAT round (Llama 3
            # 405B on pp 16 x vp 8, which CP-SAT over the same cuts does not certify in 20 s);
            # otherwise the region's rows and the LP's paths join the model (the rows hold for
            # every layout the rounds ask for: those below the incumbent). Under a second for
            # it, its probes alone would overrun the limit.
            goal = layout_makespan(best_score) - 2 * slack
            t_region = time.perf_counter()
            region = rank_order_region(ctx, goal, lin, time_limit_s=0.2 * region_budget, tables=tables)
            if region is None:
                lp_bound, proven = goal, True
            else:
                for r in range(pp):
                    model.Add(sum(t[r::pp]) >= region.low[r])
                    model.Add(sum(t[r::pp]) <= region.high[r])
                model.Add(t[0] <= region.stage0_high)
                pool = [_path_of(ctx, best_score)] + [(np.array(n_f), np.array(n_b)) for n_f, n_b in sorted(cuts)]
                found_lb, lp_paths = lp_region_bound(ctx, region, goal, pool=pool,
                                                     time_limit_s=region_budget - (time.perf_counter() - t_region),
                                                     lin=lin, min_layers=min_layers, max_layers=max_layers)
                for n_f, n_b in lp_paths:
                    cut(n_f, n_b)
                if found_lb is not None:
                    # a layout outside the region is no faster than the goal, one inside no faster than found_lb
                    lp_bound = min(goal, found_lb - slack)
                    proven = found_lb - slack >= goal
            if lp_bound is not None:
                bound = max(bound, lp_bound)
        if split_fraction is None:  # see the docstring: where it was measured to certify
            split_fraction = 0.0
            if chunk_spread is not None and best is not None:
                split_fraction = 1.0 if max(sum(best.recompute[r::pp]) for r in range(pp)) <= 1 else 0.0
        split_budget = split_fraction * max(time_limit_s - (time.perf_counter() - start), 0.0)
        if refine and best is not None and recompute and not graph and not proven and split_budget >= 0.5:
            goal = layout_makespan(best_score)
            found_lb, split_paths = recompute_split_bound(ctx, goal, lin, time_limit_s=split_budget, workers=workers, paths=cuts,
                                                          chunk_spread=chunk_spread, min_layers=min_layers, max_layers=max_layers,
                                                          hint=best, round_limit_s=round_limit_s)
            for n_f, n_b in split_paths:
                cut(n_f, n_b)
            if found_lb is not None:
                split_bound = min(found_lb, goal - 2 * slack)
                bound = max(bound, split_bound)
                proven = found_lb >= goal - 2 * max(slack, _split_slack(ctx, lin))
        while not proven:
            remaining = time_limit_s - (time.perf_counter() - start)
            if remaining <= 0 and best is not None:
                break
            if refine and best is not None and chunk_spread is None:
                # Free layouts, with an incumbent: ask only for layouts the model prices below it
                # (z < incumbent - 2 slack). Every answer is then either truly better (the new
                # incumbent) or priced too low, and its longest path is a new cut that removes it;
                # and no answer at all (INFEASIBLE) certifies the incumbent. Each round returns
                # every answer CP-SAT found, not only its last, so one round brings many cuts.
                best_makespan = layout_makespan(best_score)
                # a round stops round_limit_s in once it has answers, and goes on while it has
                # none; a round cut short loses its presolve and LP with it: where less than two
                # rounds' time is left, this one takes it all (Llama 3 405B's 128-stage model
                # presolves for ~1 s of a 4 s round)
                status, proved, answers = round_below(model, z, vars_, best_makespan, slack, remaining, workers, under_s=slack,
                                                      answers_by_s=round_limit_s if remaining >= 2 * round_limit_s else None)
                rounds += 1
                bound = max(bound, proved)
                if status == cp_model.INFEASIBLE:
                    proven = True
                    break
                if not answers:  # the round had all the time left
                    continue
                if not _take_answers(answers):
                    for answer in answers:  # nothing new learnt (integer rounding): exclude them
                        model.AddForbiddenAssignments(vars_, [answer])
                continue
            # regular layouts keep a first round of all the time (their LNS workers find the
            # incumbent), later ones are capped; free layouts without an incumbent are capped too, so
            # that the first layout that fits switches to the rounds above (a round that finds
            # nothing gets the rest of the time)
            capped = (best is not None and rounds > 0) if chunk_spread is not None else not stalled
            time_s = min(remaining, round_limit_s) if capped else remaining
            if chunk_spread is not None:
                # regular layouts: CP-SAT's full presolve (their first round has all the time and,
                # with round_solver's lighter one, proved less in it: Llama 3 405B cp 1 with
                # per-chunk recompute, 10 s, 1.8% -> 4.9%), and the LP of every constraint, the max
                # over the rank rows and the recompute tables' element constraints included
                # (CP-SAT's level 2), which proves more per round than the default's: the same
                # case, 10 s on a loaded 2-core machine, 4.9% -> 1.8% (no change on the certified
                # regular cases)
                solver = cp_solver(time_s, workers)
                solver.parameters.linearization_level = 2
            else:
                solver = round_solver(time_s, workers)
            model.ClearHints()
            hint = best if best is not None else nearest
            if hint is not None:
                for var, value in zip(vars_, hint.decoders + hint.recompute):
                    model.AddHint(var, value)
            status = solve(solver, model)
            rounds += 1
            if status == cp_model.UNKNOWN and best is None and chunk_spread is None and time_limit_s - (time.perf_counter() - start) > 0.1:
                stalled = True
                continue
            if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                if best is not None:
                    break
                raise LayoutError("no layout of this configuration fits the GPU memory" if status == cp_model.INFEASIBLE else "the layout search found no layout within its time limit")
            bound = max(bound, solver.BestObjectiveBound() / TIME_SCALE - slack)  # proven whatever the status
            layout = make([solver.Value(v) for v in vars_])
            score = score_of(layout)
            makespan = layout_makespan(score)
            if score.fits and (best_score is None or makespan < layout_makespan(best_score)):
                best, best_score = layout, score
            if not score.fits:  # a memory row not in the model yet, or the integer rounding: add it, or exclude the layout
                if not add_rows(layout.decoders + layout.recompute):
                    model.AddForbiddenAssignments(vars_, [layout.decoders + layout.recompute])
                continue
            add_rows(layout.decoders + layout.recompute)
            if not refine:
                proven = status == cp_model.OPTIMAL
                break
            best_makespan = layout_makespan(best_score)
            if status == cp_model.OPTIMAL and best_makespan <= bound + 2 * slack:
                proven = True
                break
            added = cut(*_path_of(ctx, score))
            if not added and status == cp_model.OPTIMAL:
                proven = True  # its own path was already a cut: CP-SAT's value is its makespan
                break
    except KeyboardInterrupt:
        if best is None:  # nothing that fits to give back
            raise
        interrupted = True
    if paths is not None:
        paths.update(cuts)
    makespan = layout_makespan(best_score)
    source = "rank-lp" if lp_bound is not None and bound <= lp_bound else "recompute-split" if split_bound is not None and bound <= split_bound else "cp-sat"
    if not proven:
        floor = work_bound_s(ctx, lin) - slack
        if floor > bound:
            bound, source = floor, "work"
        if level_floor - slack > bound:
            bound, source = level_floor - slack, "level-work"
    return LayoutSolution(best, best_score.step_time_s, makespan, best_score.bound_s, float(min(bound, makespan) if proven else bound),
                          proven, time.perf_counter() - start, best_score.fits, rounds, source, interrupted)


def clipped_prefix(model: cp_model.CpModel, value, a: int, b: int, upper: int, tag: str):
    """min(max(value, a), b) as a CP-SAT variable: a prefix sum of layers clipped to the kind
    run [a, b), whose differences between neighbouring stages count that run's layers per stage
    (the clips shared by neighbours keep the LP relaxation tight)."""
    high = model.NewIntVar(a, upper, f"h{tag}")
    model.AddMaxEquality(high, [value, a])
    q = model.NewIntVar(a, b, f"q{tag}")
    model.AddMinEquality(q, [high, b])
    return q


def recompute_run_vars(model: cp_model.CpModel, rc, prefix, clipped, run_counts, runs, upper: int) -> list[list]:
    """[stage][run] recomputed layers of each kind-run per stage: the first rc[s] layers of the
    stage, i.e. the layers [P_{s-1}, P_{s-1} + r_s) clipped to each run (run_count_vars' prefix
    sums `prefix`, clipped prefixes `clipped` and counts `run_counts`)."""
    stages = len(rc)
    if len(runs) == 1:
        return [[rc[s]] for s in range(stages)]
    rc_counts = []
    for s in range(stages):
        row = []
        for j, (_, a, b) in enumerate(runs):
            if j == len(runs) - 1:  # the last run: what the others leave of r_s (half the clips)
                row.append(rc[s] - sum(row))
                continue
            q = clipped_prefix(model, (prefix[s - 1] if s else 0) + rc[s], a, b, upper, f"r{j}_{s}")
            row.append(q - (clipped[j][s - 1] if s else a))
        rc_counts.append(row)
        # implied, but the LP relaxation of the clips above lets a run's recomputed count go
        # negative, which prices recompute below nothing and takes the bound down by a third
        # (DeepSeek-V3 pp 16 x vp 2: 42 s instead of 60.7 s); stated, the bound holds
        for j in range(len(runs)):
            model.Add(row[j] >= 0)
            model.Add(row[j] <= run_counts[s][j])
        model.Add(sum(row) == rc[s])
    return rc_counts


def run_count_vars(model: cp_model.CpModel, t, prefix, runs, upper: int, tag: str = "") -> tuple[list, list]:
    """Layers of each kind run per stage as CP-SAT expressions: t itself for one run, else the
    differences of the prefix sums clipped to each run (clipped_prefix; the clips shared by
    neighbouring stages keep the LP relaxation tight). Returns ([stage][run] counts, [run][stage]
    clipped prefix sums, empty for one run)."""
    stages = len(t)
    if len(runs) == 1:
        return [[t[s]] for s in range(stages)], []
    clipped = [[clipped_prefix(model, prefix[s], a, b, upper, f"{tag}{j}_{s}") for s in range(stages)] for j, (_, a, b) in enumerate(runs)]
    return [[clipped[j][s] - (clipped[j][s - 1] if s else a) for j, (_, a, _) in enumerate(runs)] for s in range(stages)], clipped


def recompute_split_bound(ctx: LayoutContext, goal_s: float, lin: "LinearLayouts | None" = None, time_limit_s: float = 5.0,
                          workers: int = 2, paths=(), chunk_spread: int | None = None, min_layers: int = 0,
                          max_layers: int | None = None, hint: StageLayout | None = None,
                          round_limit_s: float = 4.0) -> tuple[float | None, list]:
    """A lower bound on the makespan of every fitting layout and recompute vector of a
    skeleton with full recompute, from a relaxation where recompute is a yes/no per rank
    (Megatron's per-stage counts, per-chunk recompute), and the paths that prove it: (None, [])
    where the skeleton has no recompute. Proves goal_s - 2 slack (every layout is at least
    that: certifies an incumbent of makespan goal_s) where the relaxation has no point below
    it; else CP-SAT's bound over the relaxation.

    The relaxation. Take a fitting layout (L, r) and zero the recompute of every rank that
    fits without it (memory is per rank: the others are untouched, and recompute only adds
    time, so the makespan does not grow); call its recomputing ranks S. Then:
    * every rank outside S recomputes nothing and fits: its memory rows at r = 0 (the
      no-recompute search's rows) hold;
    * every rank in S does not fit at r = 0, so its envelope (each chunk's activations times
      the most micro-batches it ever holds in flight, a row above every in-flight row) is over
      the capacity;
    * every rank in S recomputes the first layer of some stage of its own with layers (Megatron's
      block method recomputes a stage's first r_s), whose recompute adds to that stage's
      backward: with x_s = 1 for one such stage per rank in S, the makespan with recompute x
      (a path's length is monotone in the stage times) is at most (L, r)'s.
    So min over (L, x) of the schedule graph's makespan under those rows bounds every fitting
    layout. Memory: integer KiB rows with coefficients rounded down (the budget up) and the
    envelope rounded up (its threshold down), so every fitting layout satisfies them. Times:
    path cuts as the layout search's (rounded to integer ns: the slack), ranks' busy time.
    Where memory forces recompute only on a few ranks whose layers cost a lot (DeepSeek-V3 on
    pp 16 x vp 2: a 4-layer rank that recomputes a MoE layer adds 480 x 12 ms), the yes/no is
    what the search model's LP relaxation misses: it recomputes a fraction of a layer.
    Rounds as the free search's: answers the model prices below goal_s - 2 slack; each one's
    longest path becomes a cut and the memory rows it breaks come in (lazily: ~100 in-flight
    vectors per rank); INFEASIBLE proves the goal; an answer of the relaxation truly below the
    goal ends it (the relaxation cannot certify it)."""
    start = time.perf_counter()
    lin = lin or LinearLayouts(ctx)
    u = lin.u
    if not lin.recompute or (np.asarray(u["kind_recompute"]) < 0).any():
        return None, []
    pp, vp, m = ctx.pp, ctx.vp, ctx.microbatches
    stages, n = lin.stages, len(ctx.kind_of_layer)
    runs = lin.runs
    kind_of_run = [int(k) for k in lin.kind_of_run]
    graph = schedule_graph(ctx)
    model = cp_model.CpModel()
    t = [model.NewIntVar(min_layers, n if max_layers is None else max_layers, f"t{s}") for s in range(stages)]
    x = [model.NewBoolVar(f"x{s}") for s in range(stages)]  # stage s's first layer recomputed
    prefix = [model.NewIntVar(0, n, f"P{s}") for s in range(stages)]
    for s in range(stages):
        model.Add(prefix[s] == (prefix[s - 1] if s else 0) + t[s])
        model.Add(x[s] <= t[s])
    model.Add(prefix[-1] == n)
    if chunk_spread is not None:
        for r in range(pp):
            low = model.NewIntVar(0, n, "")
            model.AddMinEquality(low, t[r::pp])
            for v in t[r::pp]:
                model.Add(v <= low + chunk_spread)

    # layers of each kind-run per stage as differences of the clipped prefix sums (solve_layout's
    # encoding: the clips are shared by neighbouring stages, which keeps the LP relaxation tight)
    def clip(value, j, tag):
        _, a, b = runs[j]
        return clipped_prefix(model, value, a, b, n + 1, f"{tag}{j}")

    run_counts, clipped = run_count_vars(model, t, prefix, runs, n + 1, "c")
    if len(runs) == 1:
        x_counts = [[x[s]] for s in range(stages)]
    else:
        x_counts = [[clip((prefix[s - 1] if s else 0) + x[s], j, f"x{s}") - (clipped[j][s - 1] if s else runs[j][1])
                     for j in range(len(runs))] for s in range(stages)]
    if len(runs) > 1:
        for s in range(stages):  # implied; stated so the LP relaxation of the clips keeps them (solve_layout)
            model.Add(sum(x_counts[s]) == x[s])
            model.Add(sum(run_counts[s]) == t[s])
            for j in range(len(runs)):
                model.Add(x_counts[s][j] >= 0)
                model.Add(x_counts[s][j] <= run_counts[s][j])
    fwd = [int(round(u["kind_forward"][k] * TIME_SCALE)) for k in kind_of_run]
    bwd = [int(round((u["kind_total"][k] - u["kind_forward"][k]) * TIME_SCALE)) for k in kind_of_run]
    rec = [int(round(u["kind_recompute"][k] * TIME_SCALE)) for k in kind_of_run]
    cf = [int(round(v * TIME_SCALE)) for v in lin.const_forward_s]
    cb = [int(round(v * TIME_SCALE)) for v in lin.const_backward_s]
    f_expr = [sum(fwd[j] * run_counts[s][j] for j in range(len(runs))) + cf[s] for s in range(stages)]
    b_expr = [sum(bwd[j] * run_counts[s][j] + rec[j] * x_counts[s][j] for j in range(len(runs))) + cb[s] for s in range(stages)]
    per_op = (float(np.max(u["kind_total"] + u["kind_recompute"])) * n + float(lin.const_forward_s.max() + lin.const_backward_s.max())) * TIME_SCALE
    slack = _split_slack(ctx, lin)
    cap = min(int(math.floor((goal_s - 2 * slack) * TIME_SCALE)), int(2 * m * stages * per_op) + 1)
    if cap < 0:
        return None, []
    z = model.NewIntVar(0, cap, "makespan")  # only layouts below the goal
    cuts, new_paths = set(), []

    def cut(n_f, n_b) -> bool:
        key = (tuple(np.asarray(n_f).astype(int)), tuple(np.asarray(n_b).astype(int)))
        if key in cuts:
            return False
        cuts.add(key)
        new_paths.append((np.asarray(n_f, dtype=float), np.asarray(n_b, dtype=float)))
        model.Add(z >= path_sum(key, (f_expr, b_expr)))
        return True

    for n_f, n_b in sorted(paths):
        cut(np.array(n_f), np.array(n_b))
    for n_f, n_b in segment_paths(ctx.ops, stages, m):
        if chunk_spread is None or (n_f == n_b).all():
            cut(n_f, n_b)
    kinds_used = sorted(set(kind_of_run))
    candidates = recomputing_ranks(ctx, goal_s, lin)
    recomputing = []
    for r in range(pp):  # busy time over integer kind totals (solve_layout's rows)
        mine = range(r, stages, pp)
        busy = 0
        for k in kinds_used:
            js = [j for j, kind in enumerate(kind_of_run) if kind == k]
            total = model.NewIntVar(0, n, f"L{r}_{k}")
            model.Add(total == sum(run_counts[s][j] for s in mine for j in js))
            again = model.NewIntVar(0, vp, f"R{r}_{k}")
            model.Add(again == sum(x_counts[s][j] for s in mine for j in js))
            busy += (fwd[js[0]] + bwd[js[0]]) * total + rec[js[0]] * again
        model.Add(z >= m * (busy + sum(cf[s] + cb[s] for s in mine)))
        y = model.NewBoolVar(f"y{r}")  # the rank recomputes (is in S)
        model.Add(y <= sum(x[s] for s in mine))
        if r not in candidates:  # no layout below the goal has it recompute: r = 0 rows, no recompute
            model.Add(y == 0)
            for s in mine:
                model.Add(x[s] == 0)
        recomputing.append(y)

    # memory, in thousandths of KiB: coefficients rounded down for the rows (a fitting layout
    # meets them); the envelope of a recomputing rank is over_capacity_without_recompute's
    scale = 1000.0 / BYTE_SCALE
    budget = int(math.ceil(lin.capacity * scale))
    frag = lin.frag
    rows, added = {}, set()
    for r, (base0, base, trans0, trans, head, mtp_act) in enumerate(lin.memory):
        mine = list(range(r, stages, pp))
        held = np.asarray(ctx.held[r])

        def row(coef_of, const, rounding):
            terms = []
            for c, s in enumerate(mine):
                for j, k in enumerate(kind_of_run):
                    coef = int(rounding(coef_of(c, k) * scale))
                    if coef:
                        terms.append(coef * run_counts[s][j])
            return sum(terms) + int(rounding(const * scale))

        rows[r, -1] = row(lambda c, k: base[k] + (1 + frag) * trans[k], base0 + (1 + frag) * trans0, math.floor)
        for i, h in enumerate(held):
            rows[r, i] = row(lambda c, k, h=h: base[k] + (1 + frag) * h[c] * lin.u["kind_activation"][k],
                             base0 + (1 + frag) * (head + h[-1] * mtp_act), math.floor)
        over_capacity_without_recompute(model, ctx, lin, r, run_counts, recomputing[r])
        model.Add(rows[r, -1] <= budget)  # the optimizer transient: recompute does not lower it
        added.add((r, -1))

    def add_rows(decoders, ranks_free) -> bool:
        """Rows an r = 0 layout breaks (or comes nearest to), of the ranks that do not recompute."""
        counts = lin.run_counts(np.asarray(decoders)[None])
        new = False
        for r, values in enumerate(lin.rank_rows(counts, None)):
            if r in ranks_free:
                continue
            values = values[0]
            for i in [int(np.argmax(values))] + [int(i) for i in np.flatnonzero(values > lin.capacity)]:
                if (r, i - 1) not in added:
                    added.add((r, i - 1))
                    constraint = model.Add(rows[r, i - 1] <= budget)
                    if i > 0:
                        constraint.OnlyEnforceIf(recomputing[r].Not())
                    new = True
        return new

    if hint is not None:
        add_rows(hint.decoders, set())
        for var, value in zip(t + x, list(hint.decoders) + [0] * stages):
            model.AddHint(var, value)
    model.Minimize(z)
    bound = None
    while time.perf_counter() - start < time_limit_s:
        found = _Answers(t + x)
        left = time_limit_s - (time.perf_counter() - start)
        solver = round_solver(left, workers)  # as the free search's rounds (round_below)
        status = solve(solver, model, found, stop_when=found.stop_after(round_limit_s if left >= 2 * round_limit_s else None))
        if status == cp_model.INFEASIBLE:
            return goal_s - 2 * slack, new_paths
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
            value = min(solver.BestObjectiveBound() / TIME_SCALE - slack, goal_s - 2 * slack)
            bound = value if bound is None else max(bound, value)
        if not found.answers:
            continue
        answers = np.array(found.answers, dtype=np.int64)
        decoders, marks = answers[:, :stages], answers[:, stages:]
        counts = lin.run_counts(decoders)
        recomputed = lin.recompute_counts(decoders, marks)
        f, b = lin.times(counts, recomputed)
        values = graph.makespan(f, b)
        new = False
        for n_f, n_b in zip(*graph.paths(f, b)):
            new |= cut(n_f, n_b)
        rank_rows = lin.rank_rows(counts, None)
        below = False
        for k in range(len(answers)):
            free = {r for r in range(pp) if marks[k, r::pp].any()}
            ok = all(rank_rows[r][k, 0] <= lin.capacity and (r in free or rank_rows[r][k].max() <= lin.capacity) for r in range(pp))
            if ok and values[k] < goal_s - 2 * slack:
                below = True  # the relaxation has a point below the goal: it cannot certify it
            if not ok:
                new |= add_rows(decoders[k], free)
        if below:
            break
        if not new:
            for answer in found.answers:
                model.AddForbiddenAssignments(t + x, [answer])
    return bound, new_paths


def _split_slack(ctx: LayoutContext, lin: "LinearLayouts") -> float:
    """recompute_split_bound's integer rounding (seconds): a path of <= 2 m ops per stage, each
    off by <= 0.5 ns per rounded term (its layers, recomputed layers and constant)."""
    stages, n = lin.stages, len(ctx.kind_of_layer)
    return 0.5 * 2 * ctx.microbatches * max(stages * (2 * len(lin.runs) + 1), 2 * n + stages) / TIME_SCALE


def recomputing_ranks(ctx: LayoutContext, goal_s: float, lin: "LinearLayouts | None" = None, limit: int = 20000) -> set[int]:
    """The ranks that may recompute in a layout whose makespan is below `goal_s`, where no
    layout recomputes on a rank that fits without it (zeroing such a rank's recompute keeps
    the layout fitting, the other ranks' memory untouched, and does not slow it): such a rank
    holds kind counts per chunk over its capacity at r = 0 (its exact linear rows, transient
    within it) whose busy time with one more recomputed layer (the cheapest kind it holds),
    m * (its layers' forward+backward + its stages' constants + that recompute), is below the
    goal. Enumerated per rank over its chunks' counts of each kind (kinds' order relaxed, as
    many layers as its busy time allows); a rank whose enumeration would pass `limit` vectors is
    kept (no claim)."""
    lin = lin or LinearLayouts(ctx)
    u = lin.u
    pp, vp, m = ctx.pp, ctx.vp, ctx.microbatches
    kinds = sorted(set(int(k) for k in lin.kind_of_run))
    available = {k: sum(b - a for kind, a, b in lin.runs if kind == k) for k in kinds}
    cost = {k: float(u["kind_total"][k]) for k in kinds}
    rec = {k: float(u["kind_recompute"][k]) for k in kinds}
    out = set()
    for r in range(pp):
        const = float(sum(lin.const_forward_s[s] + lin.const_backward_s[s] for s in range(r, lin.stages, pp)))
        room = goal_s / m - const  # seconds per micro-batch the rank's layers and recompute may take
        if room <= 0:
            continue
        most = {k: min(available[k], int(room // cost[k]) if cost[k] > 0 else available[k]) for k in kinds}
        # every vector of counts per (chunk, kind) within each kind's most (a bounded composition)
        size = 1
        for k in kinds:
            size *= math.comb(most[k] + vp, vp)
        if size > limit:
            out.add(r)
            continue
        per_kind = {}
        for k in kinds:
            rows = [np.diff((-1,) + bars + (most[k] + vp,)) - 1 for bars in itertools.combinations(range(most[k] + vp), vp)]
            per_kind[k] = np.array(rows, dtype=float)[:, :vp].reshape(-1, vp)  # the last part: layers not held
        grids = np.meshgrid(*[np.arange(len(per_kind[k])) for k in kinds], indexing="ij")
        counts = np.stack([per_kind[k][g.ravel()] for k, g in zip(kinds, grids)], axis=2)  # [V, chunk, kind]
        totals = counts.sum(axis=1)  # [V, kind]
        present = totals > 0
        cheapest = np.where(present, np.array([rec[k] for k in kinds])[None, :], np.inf).min(axis=1)
        busy = totals @ np.array([cost[k] for k in kinds]) + cheapest
        keep = busy < room
        if not keep.any():
            continue
        counts, totals = counts[keep], totals[keep]
        base0, base, trans0, trans, head, mtp_act = lin.memory[r]
        base_k = np.array([base[k] for k in kinds])
        trans_k = np.array([trans[k] for k in kinds])
        act_k = np.array([u["kind_activation"][k] for k in kinds])
        fixed = base0 + totals @ base_k
        transient = fixed + (1 + lin.frag) * (trans0 + totals @ trans_k)
        held = np.asarray(ctx.held[r], dtype=float)  # [vectors, chunk]
        chunk_bytes = counts @ act_k  # [V, chunk]
        activations = fixed[:, None] + (1 + lin.frag) * (chunk_bytes @ held.T + held[:, -1][None, :] * mtp_act + head)
        over = (transient <= lin.capacity) & (activations.max(axis=1) > lin.capacity)
        if over.any():
            out.add(r)
    return out


def work_bound_s(ctx: LayoutContext, lin: "LinearLayouts | None" = None) -> float:
    """A makespan lower bound for every layout, without CP-SAT: a rank runs each of its
    chunks' m forwards and m backwards one after another, so the makespan is at least the
    busiest rank's m * sum of its stages' (F_s + B_s), at least the mean over ranks, and the
    ranks' sum is m * (every layer's forward+backward + the stages' constant terms) whatever
    the layout (recompute only adds). The floor of a search whose CP-SAT rounds proved less (or
    never ran): the answer then still carries a proven gap."""
    lin = lin or LinearLayouts(ctx)
    counts = lin.run_counts(np.array([[len(ctx.kind_of_layer)] + [0] * (lin.stages - 1)]))  # any layout: the totals per run
    total = float(counts[0].sum(axis=0) @ (lin.forward_s + lin.backward_s)) + float(lin.const_forward_s.sum() + lin.const_backward_s.sum())
    return ctx.microbatches * total / ctx.pp


def level_range(ctx: LayoutContext, lin: "LinearLayouts", below_s: float, most: int, tables=None) -> tuple[list[int], float]:
    """The levels N (0..most) of one --recompute-num-layers that level_work_bounds leaves below
    `below_s`, and the least bound over all levels (-inf where it makes no claim: then every
    level is open). Every N up to the most layers a rank can hold below `below_s` (its
    cheapest layers' busy time) is bounded: the bounds are not monotone in N (a larger N
    recomputes more, but lets a rank whose memory forces many recomputed layers hold them);
    beyond that most, min(N, layers) no longer changes, so the last level stands for all
    larger ones."""
    cheapest = float(np.min(lin.u["kind_total"][sorted(set(int(k) for k in lin.kind_of_run))]))
    cap = most if cheapest <= 0 else min(most, int(below_s / (ctx.microbatches * cheapest)) + 1)
    bounds = level_work_bounds(ctx, lin, range(cap + 1), tables, below_s)
    if not bounds:
        return list(range(most + 1)), -math.inf
    open_levels = [n for n, value in sorted(bounds.items()) if value < below_s]
    if cap in open_levels:
        open_levels += list(range(cap + 1, most + 1))
    return open_levels, min(bounds.values())


def level_work_bounds(ctx: LayoutContext, lin: "LinearLayouts", levels, tables=None, below_s: float = math.inf,
                      max_states: int = 20000) -> dict[int, float]:
    """Per level N of one --recompute-num-layers (every stage recomputes min(N, its layers)):
    a lower bound on the makespan of every such layout, from the ranks' busy time alone. A rank
    runs its chunks' m forwards and m backwards one after another, so the makespan is at least
    m * its seconds per micro-batch: its layers' forward+backward, its stages' constant terms
    and its recompute. With N >= 1 a rank holding L >= 1 layers recomputes
    sum_c min(N, t_c) >= min(N, L) of them, each at least the cheapest recompute among the
    kinds it holds; with `tables` (least_recompute's, one kind of layer) at least what its
    memory forces, which N = 0 must not need and which may not exceed the vp * N that one N
    recomputes at most. The least over every split of each kind's layers among the ranks (their
    order relaxed) of the busiest rank: a min-max DP over ranks, whose states are the layers of
    each kind placed so far. Where that takes more than `max_states` states (many kinds), {}:
    no claim.
    Why: with one N every chunk that holds a layer pays a recompute, so where the busiest
    rank's layers leave no room for one (DeepSeek-V3 on pp 16 x vp 2: 58 MoE layers over 16
    ranks put 4 on some rank, 57.2 s, and one recomputed MoE layer more is 63 s, above the
    no-recompute optimum's 60.9 s), every N >= 1 is out and the search is the one without
    recompute. Rank vectors whose busy time reaches `below_s` are dropped (only speeds it)."""
    u = lin.u
    pp, vp, m = ctx.pp, ctx.vp, ctx.microbatches
    kinds = sorted(set(int(k) for k in lin.kind_of_run))
    count = [sum(b - a for kind, a, b in lin.runs if kind == k) for k in kinds]
    shape = tuple(c + 1 for c in count)
    if int(np.prod(shape)) > max_states:
        return {}
    cost = np.array([float(u["kind_total"][k]) for k in kinds])
    rec = np.array([float(u["kind_recompute"][k]) for k in kinds])
    if (rec < 0).any():
        return {}
    grid = np.stack(np.meshgrid(*[np.arange(c + 1) for c in count], indexing="ij"), axis=-1).reshape(-1, len(kinds))  # [state, kind]
    held = grid.sum(axis=1)
    cheapest = np.where(grid > 0, rec[None, :], np.inf).min(axis=1)  # the cheapest recompute among the kinds held
    cheapest[held == 0] = 0.0
    out = {}
    for level in levels:
        worst = np.full(shape, np.inf)  # the least busiest-rank seconds per micro-batch over the ranks so far, per layers placed
        worst[(0,) * len(kinds)] = 0.0
        for r in range(pp):
            const = float(sum(lin.const_forward_s[s] + lin.const_backward_s[s] for s in range(r, lin.stages, pp)))
            again = np.minimum(level, held).astype(float)
            if tables is not None:  # beyond its table the rank fits no recompute at all
                table = np.asarray(tables[r], dtype=float)
                forced = np.full(len(held), np.inf)
                inside = held < len(table)
                forced[inside] = table[held[inside]]
                if level == 0:
                    again = np.where(forced > 0, np.inf, 0.0)
                else:
                    again = np.where(forced > vp * level, np.inf, np.maximum(again, forced))
            busy = np.full(len(held), np.inf)
            can = np.isfinite(again)
            busy[can] = grid[can] @ cost + const + np.where(again[can] > 0, again[can], 0.0) * cheapest[can]
            busy[m * busy >= below_s] = np.inf
            nxt = np.full(shape, np.inf)
            for v in np.flatnonzero(np.isfinite(busy)):
                take = grid[v]
                src = tuple(slice(0, c + 1 - t) for c, t in zip(count, take))
                dst = tuple(slice(t, c + 1) for c, t in zip(count, take))
                np.minimum(nxt[dst], np.maximum(worst[src], busy[v]), out=nxt[dst])
            worst = nxt
        out[int(level)] = m * float(worst[tuple(count)])
    return out


def dwell_paths(ctx: LayoutContext, seconds: tuple[np.ndarray, ...], budget_terms: int = 40000, heavy: float = 3.0,
                batch: int = 256) -> list[tuple[np.ndarray, ...]]:
    """Longest paths of the schedule graph where one stage, or two, are `heavy` times slower
    than in `seconds` (a layout's per-stage pass times, [stage] each): the paths that dwell on
    those stages for a run of micro-batches and hop between them. Each is a cut for every
    layout (any path is). Why: the search's other cuts are tight near the layouts they came
    from, and CP-SAT's first answers are layouts far from them, whose one or two overloaded
    chunks pace the steady state (DeepSeek-V3 on pp 16 x vp 2: answers priced below the 60.9 s
    incumbent whose paths run 291 micro-batches on one chunk and 480 on the last, 65-74 s);
    every pair of stages gives the rounds those paths up front (its free search without
    recompute certifies in one round, 3.3-3.9 s against 5.1-7.9 s; with per-stage recompute,
    together with MemoryRows.recompute_only_where_needed, in 7.7-9.3 s, where that alone
    stopped at 3.0% in 10 s). Pairs where their terms fit
    `budget_terms` (about 2 * stages terms a path: pp 16 x vp 2's 528 probes, ~0.7 s), else
    single stages only (pp 16 x vp 8: 8,256 pairs make a model CP-SAT does not solve in 10 s)."""
    stages = len(seconds[0])
    probes = [(s,) for s in range(stages)]
    pairs = list(itertools.combinations(range(stages), 2))
    if (len(probes) + len(pairs)) * 2 * stages <= budget_terms:
        probes += pairs
    elif len(probes) * 2 * stages > budget_terms:
        return []
    graph = schedule_graph(ctx)
    out = []
    for i in range(0, len(probes), batch):
        part = probes[i:i + batch]
        scaled = [np.repeat(np.asarray(x, dtype=float)[:, None], len(part), axis=1) for x in seconds]
        for k, probe in enumerate(part):
            for x in scaled:
                x[list(probe), k] *= heavy
        out.extend(zip(*graph.paths(*scaled)))
    return out


@dataclasses.dataclass(frozen=True)
class RankRegion:
    """What every layout whose makespan is below a goal satisfies (rank_order_region): each
    rank holds between low[r] and high[r] decoder layers, stage 0 at most stage0_high."""

    low: tuple[int, ...]
    high: tuple[int, ...]
    stage0_high: int

    def contains(self, decoders) -> bool:
        decoders = np.asarray(decoders)
        pp = len(self.low)
        totals = [int(decoders[r::pp].sum()) for r in range(pp)]
        return decoders[0] <= self.stage0_high and all(lo <= x <= hi for lo, x, hi in zip(self.low, totals, self.high))


def rank_order_region(ctx: LayoutContext, below_s: float, lin: "LinearLayouts | None" = None,
                      time_limit_s: float = 1.0, tables=None) -> RankRegion | None:
    """The integer consequences of a makespan below `below_s`: None where no layout has one,
    else per rank the least and most decoder layers and the most on stage 0, proven on a small
    CP-SAT model of the ranks' integer layer totals (kinds apart, their order, recompute and
    memory relaxed: a relaxation of every layout; the least totals and stage 0's most are
    probed, the most totals follow from busy time and the others' least) with two facts of the
    schedule:

    * busy: a rank runs its m forwards and backwards of every chunk one after another, so the
      makespan is at least m * W_r (W_r its layers' and modules' seconds per micro-batch);
    * rank order: where chunk_segments_hold, a rank r > 0 whose first decoder layer is in
      stage s_r does all its layers' work inside segment_paths' path of s_r, after micro-batch
      0's forward chain through every stage before s_r and with the last micro-batch's backward
      chain back through them: makespan >= m * W_r + sum_{q < s_r} (F_q + B_q). The stages
      before s_r include stage 0 (the embedding and its t_0 layers) and the first decoder stage
      of every rank whose first decoder stage comes earlier, each holding a layer. So with
      ranks numbered 1, 2, ... by their first decoder stage (pos_r, all different), makespan
      >= m * W_r + E + delta * t_0 + delta * (pos_r - 1), delta the cheapest layer's forward
      and backward, E stage 0's own (less the fixed overhead of the empty chunks the rank may
      run outside the segment, where chunks have one).

    With `tables` (least_recompute's, per rank; one kind of layer) a rank's work also counts
    the recompute its layer total forces: every layout that fits recomputes at least that.

    Integrality is what the bound gains: Llama 3 405B on pp 16 x vp 8 (126 layers) keeps ranks
    of 8 layers (ceil(126 / 16)), and the 14 that must hold 8 cannot all start early, which
    forces rank 0 to hold 8 layers and stage 0 none for any layout below Megatron's split; the
    LP relaxation of the path cuts spreads 0.7 of a layer over the first stages instead.
    Coefficients are rounded down (integer nanoseconds), the goal up, so every layout below
    `below_s` is a solution; each probe that runs out of time keeps its proven bound."""
    lin = lin or LinearLayouts(ctx)
    pp, vp, m = ctx.pp, ctx.vp, ctx.microbatches
    n = len(ctx.kind_of_layer)
    goal = int(math.ceil(below_s * TIME_SCALE)) - 1
    if goal < 0:
        return None
    kinds = sorted(set(int(k) for k in lin.kind_of_run))
    count = {k: sum(b - a for kind, a, b in lin.runs if kind == k) for k in kinds}
    per_layer = {int(k): max(int(math.floor((lin.forward_s[j] + lin.backward_s[j]) * TIME_SCALE)), 0) for j, k in enumerate(lin.kind_of_run)}
    delta = min(per_layer.values())
    rec = max(int(math.floor(float(lin.recompute_s[0]) * TIME_SCALE)), 0) if tables is not None else 0
    const = np.floor((lin.const_forward_s + lin.const_backward_s) * TIME_SCALE).astype(np.int64)  # per stage, besides its decoder layers
    # an empty chunk still runs its fixed overhead, forward and backward: the m * (vp - 1) empty
    # chunks' overhead a rank may run outside its segment path is taken off it
    overhead = int(math.ceil(2 * unit_costs(ctx)["overhead"] * TIME_SCALE)) * m * (vp - 1)
    model = cp_model.CpModel()
    layers = {(r, k): model.NewIntVar(0, count[k], "") for r in range(pp) for k in kinds}
    for k in kinds:
        model.Add(sum(layers[r, k] for r in range(pp)) == count[k])
    total = [model.NewIntVar(0, n, f"total{r}") for r in range(pp)]
    z = model.NewIntVar(0, goal, "makespan")
    work = []
    for r in range(pp):
        model.Add(total[r] == sum(layers[r, k] for k in kinds))
        work.append(sum(per_layer[k] * layers[r, k] for k in kinds) + int(const[r::pp].sum()))
        if tables is not None and rec > 0:
            work[r] = work[r] + rec * least_recompute_var(model, total[r], tables[r], f"least{r}")
        model.Add(m * work[r] <= z)
    first = model.NewIntVar(0, n, "t0")  # decoder layers on stage 0
    model.Add(first <= total[0])
    if pp > 1 and chunk_segments_hold(ctx.ops, pp, vp, m):
        layered = [model.NewBoolVar(f"h{r}") for r in range(1, pp)]
        position = [model.NewIntVar(1, pp - 1, f"pos{r}") for r in range(1, pp)]
        model.AddAllDifferent(position)
        for r, h, pos in zip(range(1, pp), layered, position):
            model.Add(total[r] >= 1).OnlyEnforceIf(h)
            model.Add(total[r] == 0).OnlyEnforceIf(h.Not())
            model.Add(z >= m * work[r] - overhead + int(const[0]) + delta * first + delta * (pos - 1)).OnlyEnforceIf(h)
            model.Add(pos >= 1 + sum(layered)).OnlyEnforceIf(h.Not())  # ranks without layers after those with

    def extreme(objective, maximize):
        (model.Maximize if maximize else model.Minimize)(objective)
        solver = cp_solver(random_seed=1)  # CP-SAT's default seed, which this solve always ran with
        solver.parameters.max_time_in_seconds = max(time_limit_s / (pp + 1), 0.01)
        status = solve(solver, model)
        if status == cp_model.INFEASIBLE:
            return None
        if status == cp_model.OPTIMAL:
            return int(solver.ObjectiveValue())
        bound = solver.BestObjectiveBound()  # proven whatever the status
        if not math.isfinite(bound):
            return n if maximize else 0
        return min(int(math.floor(bound + 1e-6)), n) if maximize else max(int(math.ceil(bound - 1e-6)), 0)

    stage0_high = extreme(first, True)
    if stage0_high is None:
        return None
    low = []
    for r in range(pp):
        low.append(extreme(total[r], False))
        if low[-1] is None:
            return None
    # the most layers of a rank: its busy time with the cheapest layers, and what the others'
    # least leave (a probe each would add little: these are the same on Llama 3 405B)
    high = []
    for r in range(pp):
        busy = (goal - m * int(const[r::pp].sum())) // (m * delta) if delta > 0 else n
        if tables is not None:  # nor more than the recompute its memory forces lets it hold
            busy = min(busy, len(tables[r]) - 1)
            while busy > 0 and m * (delta * busy + rec * tables[r][busy] + int(const[r::pp].sum())) > goal:  # from the top: the largest total whose work meets the goal
                busy -= 1
        high.append(int(max(min(busy, n - (sum(low) - low[r]), n), low[r])))
    return RankRegion(tuple(low), tuple(high), min(stage0_high, n))


def _least_in_region(cost: np.ndarray, region: RankRegion, low: np.ndarray, cap: np.ndarray, n: int) -> float:
    """min cost . x over layer counts x with low <= x <= cap (integers), sum x = n and each
    rank's sum within the region: every rank filled to its least total with its cheapest
    stages, then the layers left one at a time where they cost least (exact: each rank's
    least cost is convex in its total, and the totals share one sum); inf where none fits."""
    pp = len(region.low)
    if (low > cap).any():
        return math.inf
    x = low.astype(np.int64).copy()
    cap = cap.astype(np.int64)
    rank = np.arange(len(cost)) % pp
    sums = np.bincount(rank, weights=x, minlength=pp).astype(np.int64)
    if (sums > np.array(region.high)).any():
        return math.inf
    for r in range(pp):
        mine = np.flatnonzero(rank == r)
        while sums[r] < region.low[r]:
            room = mine[x[mine] < cap[mine]]
            if not len(room):
                return math.inf
            s = room[np.argmin(cost[room])]
            step = min(int(cap[s] - x[s]), int(region.low[r] - sums[r]))
            x[s] += step
            sums[r] += step
    left = n - int(x.sum())
    if left < 0:
        return math.inf
    high = np.array(region.high)
    while left > 0:
        room = np.flatnonzero((x < cap) & (sums[rank] < high[rank]))
        if not len(room):
            return math.inf
        s = room[np.argmin(cost[room])]
        step = min(int(cap[s] - x[s]), int(high[rank[s]] - sums[rank[s]]), left)
        x[s] += step
        sums[rank[s]] += step
        left -= step
    return float(cost @ x)


def lp_region_bound(ctx: LayoutContext, region: RankRegion, goal_s: float, pool=(), time_limit_s: float = 3.0,
                    lin: "LinearLayouts | None" = None, min_layers: int = 0, max_layers: int | None = None,
                    step: float = 0.15, nudge: float = 0.15) -> tuple[float | None, list]:
    """A lower bound on the makespan of every layout in `region` (rank_order_region's), from
    the LP relaxation of the schedule graph over the region's layer counts, and the paths that
    prove it (cuts for the CP-SAT model): (None, []) where the model has more than one kind of
    layer (the LP would drop their order) or no round proves anything.

    Cut generation (Kelley's method, stabilised): an LP over the paths so far (z >= each
    path's length, linear in the stage counts) gives a point; the longest paths at a point
    between it and the best point seen (`step` of the way, in-out stabilisation) and at that
    point with each stage nudged up by `nudge` layer (the paths tied there) join the LP. Until
    `goal_s` is reached, time is up or the LP stops gaining (less than 5% of its distance to the
    goal in four rounds).
    The bound is rigorous whatever the LP solver's tolerances: its duals, clipped to >= 0 and
    normalised, weigh the paths into one valid cut z >= abar . x + cbar, whose least over
    the region's integer counts (_least_in_region, exact) bounds every layout there. The LP
    ignores memory and recompute (recompute only adds time), so it relaxes every layout."""
    from scipy.optimize import linprog

    start = time.perf_counter()
    lin = lin or LinearLayouts(ctx)
    if len(lin.runs) != 1:
        return None, []
    graph = schedule_graph(ctx)
    stages, pp = lin.stages, ctx.pp
    n = len(ctx.kind_of_layer)
    unit = float(lin.forward_s[0] + lin.backward_s[0])  # LP in layer units: better conditioned
    if unit <= 0:
        return None, []
    f1, b1 = float(lin.forward_s[0]), float(lin.backward_s[0])
    cf, cb = lin.const_forward_s, lin.const_backward_s
    low = np.full(stages, float(min_layers))
    cap = np.full(stages, float(n if max_layers is None else max_layers))
    cap[0] = min(cap[0], region.stage0_high)
    if _least_in_region(np.zeros(stages), region, low, cap, n) == math.inf:
        return math.inf, []  # no layout of the search's space is in the region: none is below the goal
    rows, consts, paths, seen = [], [], [], set()

    def add(n_f, n_b):
        key = (np.asarray(n_f).astype(np.int64).tobytes(), np.asarray(n_b).astype(np.int64).tobytes())
        if key in seen:
            return
        seen.add(key)
        n_f, n_b = np.asarray(n_f, dtype=float), np.asarray(n_b, dtype=float)
        rows.append((n_f * f1 + n_b * b1) / unit)
        consts.append(float(n_f @ cf + n_b @ cb) / unit)
        paths.append((n_f, n_b))

    for n_f, n_b in pool:
        add(n_f, n_b)
    for n_f, n_b in segment_paths(ctx.ops, stages, ctx.microbatches):
        add(n_f, n_b)
    member = np.zeros((pp, stages))
    for r in range(pp):
        member[r, r::pp] = 1.0
    rank_rows = np.hstack([np.vstack([-member, member]), np.zeros((2 * pp, 1))])
    rank_rhs = np.concatenate([-np.array(region.low, dtype=float), np.array(region.high, dtype=float)])
    a_eq = np.hstack([np.ones((1, stages)), np.zeros((1, 1))])
    bounds = [(low[s], cap[s]) for s in range(stages)] + [(0.0, None)]
    objective = np.zeros(stages + 1)
    objective[-1] = 1.0
    goal = goal_s / unit
    best_lb, center, center_value, history, useful = None, None, math.inf, [], []
    idle = np.zeros(0, dtype=np.int64)  # per path: rounds since its dual was last positive (the LP keeps the last two rounds')
    while time.perf_counter() - start < time_limit_s:
        all_rows, all_consts = np.array(rows), np.array(consts)
        idle = np.concatenate([idle, np.zeros(len(rows) - len(idle), dtype=np.int64)])
        active = np.flatnonzero(idle <= 1)
        a = np.hstack([all_rows[active], -np.ones((len(active), 1))])
        result = linprog(objective, A_ub=np.vstack([a, rank_rows]), b_ub=np.concatenate([-all_consts[active], rank_rhs]),
                         A_eq=a_eq, b_eq=[n], bounds=bounds, method="highs-ds", options={"presolve": False})
        if result.status != 0:
            break
        weight = np.maximum(-result.ineqlin.marginals[:len(active)], 0.0)
        idle += 1
        idle[active[weight > 1e-12]] = 0
        x, level = result.x[:stages], result.fun
        violated = np.flatnonzero(all_rows @ x + all_consts > level * (1 + 1e-9))
        idle[violated] = 0  # paths the LP point breaks come back for the next round
        if weight.sum() > 0.5:
            weight = weight / weight.sum()
            lb = float(weight @ all_consts[active]) + _least_in_region(weight @ all_rows[active], region, low, cap, n)
            if best_lb is None or lb > best_lb:
                best_lb = lb
                useful = [paths[active[i]] for i in np.flatnonzero(weight > 1e-9)]
        if best_lb is not None and best_lb >= goal:
            break
        history.append(level)
        if len(history) > 4 and goal - history[-1] > 0.95 * (goal - history[-5]):
            break  # the LP stopped gaining
        point = x if center is None else center + step * (x - center)
        columns = np.repeat(point[:, None], stages + 1, axis=1)
        columns[np.arange(stages), np.arange(1, stages + 1)] += nudge
        forward, backward = f1 * columns + cf[:, None], b1 * columns + cb[:, None]
        end = graph.ends(forward, backward)
        value = float(end[:-1, 0].max())
        if value < center_value:
            center, center_value = point, value
        for n_f, n_b in zip(*graph.paths(forward, backward, end=end)):
            add(n_f, n_b)
    return (None if best_lb is None else best_lb * unit), useful


def _path_of(ctx: LayoutContext, score) -> tuple[np.ndarray, np.ndarray]:
    """A longest path of the scored layout's schedule (ScheduleGraph.path; critical_path on the
    simulation finds one of the same length)."""
    return schedule_graph(ctx).path(score.forward_s, score.backward_s)


def dp_layout(ctx: LayoutContext) -> tuple[StageLayout | None, float]:
    """MPE eq. 3 for vp = 1, over the critical-path bound: rank s's term is the stages before
    it (their forward+backward, a chain) plus m times its own. A state (s, b) -- stages 0..s
    hold layers [0, b) -- keeps the pairs (worst term so far, chain) that no other pair beats
    in both, since the next stage's term grows with the chain: C(s, b) = Pareto-min over a of
    (max(v, ch + m * T(s, a, b)), ch + T(s, a, b)) for (v, ch) in C(s-1, a). T is stage s
    holding layers [a, b) with the fewest recomputed layers its rank's exact ledger allows
    (with vp = 1 a rank's memory depends on its own stage only, and fewer recomputed layers
    are never slower, so that choice is best for both the term and the chain); inf where none
    fits. Without recompute the pairs collapse to MPE's plain recursion. Returns the best
    layout and its bound (None, inf when nothing fits): the oracle of solve_layout."""
    if ctx.vp != 1:
        raise ValueError("the stage DP covers vp = 1 (a rank's chunks are not contiguous otherwise)")
    pp, n = ctx.pp, len(ctx.kind_of_layer)
    mtp_layers = ctx.problem.model.mtp_layers
    inf = float("inf")
    m = ctx.microbatches

    stage = {(s, a, b): _stage_cost(ctx, s, a, b) for s in range(pp) for a in range(n + 1) for b in range(a, n + 1)}
    # front[s][b]: list of (worst term, chain, previous b, index in front[s-1][a], recompute)
    front = [[[] for _ in range(n + 1)] for _ in range(pp)]
    for b in range(n + 1):
        time_s, r = stage[0, 0, b]
        if time_s < inf:
            front[0][b] = [(m * time_s, time_s, 0, -1, r)]
    for s in range(1, pp):
        for b in range(n + 1):
            pairs = []
            for a in range(b + 1):
                time_s, r = stage[s, a, b]
                if time_s == inf:
                    continue
                for i, (v, ch, _, _, _) in enumerate(front[s - 1][a]):
                    pairs.append((max(v, ch + m * time_s), ch + time_s, a, i, r))
            pairs.sort()
            kept, least_chain = [], inf
            for p in pairs:  # by worst term, then chain: keep each pair whose chain is the least so far
                if p[1] < least_chain:
                    kept.append(p)
                    least_chain = p[1]
            front[s][b] = kept
    if not front[pp - 1][n]:
        return None, inf
    i = min(range(len(front[pp - 1][n])), key=lambda k: front[pp - 1][n][k][0])
    value = front[pp - 1][n][i][0]
    sizes, recompute, b = [], [], n
    for s in range(pp - 1, -1, -1):
        _, _, a, i_prev, r = front[s][b][i]
        sizes.append(b - a)
        recompute.append(r)
        b, i = a, i_prev
    mtp = [0] * pp
    mtp[-1] = mtp_layers
    return StageLayout(pp=pp, vp=1, decoders=tuple(reversed(sizes)), mtp=tuple(mtp), recompute=tuple(reversed(recompute))), value


def _stage_cost(ctx: LayoutContext, s: int, a: int, b: int) -> tuple[float, int]:
    """(forward+backward seconds, recomputed layers) of stage s (vp = 1: rank s) holding layers
    [a, b) with the fewest recomputed layers (its first ones) for which its rank's exact
    ledger fits; (inf, 0) where none does. Scored by score_layout's functions on the one stage."""
    k = len(ctx.kinds)
    counts = np.bincount(np.asarray(ctx.kind_of_layer[a:b], dtype=int), minlength=k).astype(float)
    last = s == ctx.pp - 1
    mtp = ctx.problem.model.mtp_layers if last else 0
    if ctx.mtp_kind is not None:
        counts[ctx.mtp_kind] += mtp
    u = unit_costs(ctx)
    for r in range(b - a + 1 if ctx.recompute_allowed else 1):
        recomputed = np.bincount(np.asarray(ctx.kind_of_layer[a:a + r], dtype=int), minlength=k).astype(float)
        if rank_peak_bytes(ctx, s, counts[None, :], recomputed[None, :], last, mtp) <= ctx.problem.hardware.memory_bytes:
            forward, backward = chunk_times(u, counts[None, :], np.array([mtp]), np.array([s == 0]), np.array([last]), recomputed[None, :])
            return float(forward[0] + backward[0]), r
    return float("inf"), 0


def regular(layout: StageLayout, spread: int) -> bool:
    """The chunks of every rank differ by at most `spread` layers."""
    return all(max(layout.decoders[r::layout.pp]) - min(layout.decoders[r::layout.pp]) <= spread for r in range(layout.pp))


def enumerate_layouts(ctx: LayoutContext, min_layers: int = 0, uniform_recompute: bool = False):
    """Every layout (MTP on the last stage) with its exact score: the brute-force oracle for
    tiny instances. Where the skeleton allows full recompute, every recompute count of every
    stage too (uniform_recompute: only r_s = min(N, layers_s), every N)."""
    stages, n = ctx.pp * ctx.vp, len(ctx.kind_of_layer)
    mtp = [0] * stages
    mtp[-1] = ctx.problem.model.mtp_layers
    for bars in itertools.combinations(range(n + stages - 1), stages - 1):
        sizes, prev = [], -1
        for bar in (*bars, n + stages - 1):
            sizes.append(bar - prev - 1)
            prev = bar
        if min(sizes) < min_layers:
            continue
        layout = StageLayout(pp=ctx.pp, vp=ctx.vp, decoders=tuple(sizes), mtp=tuple(mtp), vee=ctx.vee)
        if not ctx.recompute_allowed:
            choices = [layout.recompute]
        elif uniform_recompute:
            choices = sorted({tuple(min(level, d) for d in sizes) for level in range(max(sizes) + 1)})
        else:
            choices = itertools.product(*(range(d + 1) for d in sizes))
        for recompute in choices:
            chosen = layout.with_recompute(recompute)
            yield chosen, score_layout(ctx, chosen)


def two_phase(ctx: LayoutContext, time_limit_s: float, workers: int, seeds: tuple[StageLayout, ...],
              regular_share: float = 0.4, free_floor: float = 0.3, scores: dict | None = None, paths: set | None = None,
              tables: dict | None = None) -> tuple[LayoutSolution | None, LayoutSolution]:
    """Regular layouts first (chunks of a rank within one layer: a small model that CP-SAT
    certifies or nearly so) with `regular_share` of the time, then free layouts seeded with that
    answer, with what is left and never less than `free_floor` of the limit (so a regular phase
    that overruns its share, CP-SAT presolve included, cannot leave the free phase nothing:
    the free search's bound is the one reported, and it needs CP-SAT rounds of its own). The
    seeds' scores and the ranks' recompute tables are shared by both phases (the exact model
    simulates each seed once; `scores`, `paths`, `tables`: the caller's, to share them with a
    search after this one, layout_report's with one N).
    Returns (the regular search's answer, None where no regular layout fits; the free
    search's), the free one never worse; its bound is the one that holds for every layout
    (a bound of the regular phase holds among regular layouts only, so it is not carried
    over; where the free phase's CP-SAT rounds proved less than work_bound_s, that is its
    bound and bound_source says so). A Ctrl-C in the regular phase skips the free one: its
    answer is returned as both, the second with work_bound_s."""
    start = time.perf_counter()
    regular_seeds = tuple(s for s in seeds if regular(s, 1))
    scores = {} if scores is None else scores
    paths = set() if paths is None else paths  # the regular phase's critical paths: cuts that hold for free layouts too
    tables = {} if tables is None else tables  # each rank's least recompute per layer total, the same for both phases
    first = None
    try:
        first = solve_layout(ctx, regular_share * time_limit_s, workers, seeds=regular_seeds, chunk_spread=1, scores=scores, paths=paths,
                             table_cache=tables)
    except LayoutError:
        pass  # no regular layout fits: the free search alone
    if first is not None and first.interrupted:  # Ctrl-C: no free phase; its answer, bounded for every layout
        floor = min(work_bound_s(ctx), first.makespan_s)
        return first, dataclasses.replace(first, lower_bound_s=floor, optimal=floor >= first.makespan_s * (1 - 1e-9), bound_source="work",
                                          solve_s=0.0)  # the free phase did not run
    more = (first.layout,) if first is not None else ()
    # what the regular search left (it stops early once certified) goes to the free search
    left = max(time_limit_s - (time.perf_counter() - start), free_floor * time_limit_s)
    second = solve_layout(ctx, left, workers, seeds=seeds + more, scores=scores, paths=paths, table_cache=tables)
    return first, second


def own_layout(ctx: LayoutContext) -> StageLayout:
    """The configuration's own Megatron split (costmodel.stage_layout.megatron_layout) with its
    own recompute: block N recomputes min(N, layers) of every stage; uniform recomputes every
    layer (its groups of N > 1 keep fewer inputs, which per-stage counts do not express: the
    layout model scores them as N = 1)."""
    from costmodel.stage_layout import megatron_layout

    cfg, m = ctx.cfg, ctx.problem.model
    own = megatron_layout(m.num_layers, m.mtp_layers, ctx.pp, ctx.vp, int(cfg.first_layers[0]), int(cfg.last_layers[0]), ctx.vee)
    if not ctx.recompute_allowed:
        return own
    return with_launched_recompute(own, int(cfg.recompute_layers[0]) if int(cfg.recompute_method[0]) == 1 else None)


def with_launched_recompute(layout: StageLayout, block_layers: int | None) -> StageLayout:
    """The layout with the recompute Megatron launches on it under full recompute: the block
    method's N recomputes the first min(N, layers) of every stage; uniform (None) every layer."""
    n = max(layout.decoders) if block_layers is None else block_layers
    return layout.with_recompute([min(n, d) for d in layout.decoders])


def launch_recompute(layout: StageLayout) -> dict:
    """The launch plan's recompute fields for a layout whose recompute counts one N gives
    (StageLayout.uniform_recompute): block method with that N (Megatron's
    --recompute-num-layers, the first N layers of every virtual stage), none where N = 0."""
    n = layout.uniform_recompute()
    if n is None:
        raise LayoutError(f"recompute counts {layout.recompute} are not min(N, layers) for one N: Megatron cannot launch them")
    if n == 0:
        return {"recompute": "none", "recompute_method": None, "recompute_num_layers": None}
    return {"recompute": "full", "recompute_method": "block", "recompute_num_layers": n}


_BOUND_NOTES = {
    "cp-sat": "proven by CP-SAT over the critical-path cuts, for every layout of the skeleton",
    "work": "no CP-SAT round proved more in time: the busiest rank's least work (work_bound_s), for every layout of the skeleton",
    "recompute-split": ("proven by recompute_split_bound (recompute as a yes/no per rank: a rank that recomputes is over its "
                        "capacity without it and pays at least one recomputed layer), for every layout and recompute vector"),
    "rank-lp": ("proven by the integer rank totals a faster layout needs (rank_order_region) and the schedule graph's LP "
                "relaxation within them (lp_region_bound), for every layout of the skeleton"),
    "per-stage": ("the search with any recompute count per stage proved it, for all its layouts: those with one "
                  "--recompute-num-layers N among them"),
    "levels": ("every --recompute-num-layers N >= 1 ruled out by the ranks' busy time (level_work_bounds: with one N every "
               "chunk that holds a layer recomputes one), the layouts without recompute bounded by the search without recompute"),
    "vee-cp-sat": ("DualPipeV: proven by CP-SAT over the critical-path cuts of the V's schedule graph (forward, input- and "
                   "weight-gradient passes) and its memory rows (vee_rounds), for every V layout of the skeleton"),
    "vee-rank": ("DualPipeV, CP-SAT's rounds over the V (vee_rounds) proved no more in time, or no layout fits: each rank's "
                 "work after the forward chain to its first stage, least over the integer layer counts (vee_rank_bound), for "
                 "every layout of the skeleton"),
    "vee-work": ("DualPipeV, CP-SAT's rounds over the V (vee_rounds) proved no more in time, or no layout fits: the ranks' "
                 "mean work (work_bound_s), for every layout of the skeleton"),
    "level-work": ("no CP-SAT round proved more in time: the ranks' busy time under one --recompute-num-layers N, least over "
                   "the N (level_work_bounds), for every layout with one N"),
}


def one_n_after_ctrl_c(ctx: LayoutContext, own: StageLayout, found: tuple[LayoutSolution, ...], scores: dict) -> LayoutSolution:
    """A Ctrl-C ended the search over per-stage recompute counts before the search with one N
    (layout_report) on an answer no one N gives, which Megatron cannot launch. The one-N
    layouts at hand: the configuration's own split, the layers of each answer `found` with the
    fewest N that fits them (fewest_recompute, uniform) and the one-N search's packed seeds
    (packed_seeds, N = 1 and 2: Llama 3 405B cp 1, 7.40 s against the split's 7.67 s), ranked
    on the schedule graph with the linear memory test (milliseconds, so that a Ctrl-C still
    ends the search at once), the fastest the exact model confirms taken; with the per-stage
    search's bound (it holds for the one-N layouts among its own: within_superset).
    KeyboardInterrupt where none of them fits (mofa solve then keeps the configuration's own
    split)."""
    lin = LinearLayouts(ctx)
    score_of = memo_scorer(ctx, scores)
    repaired = [fewest_recompute(ctx, s.layout.with_recompute([0] * s.layout.stages), lin, uniform=True) for s in found]
    standard = found[0].layout.mtp
    candidates = [x for x in dict.fromkeys((own, *repaired, *packed_seeds(ctx, (1, 2))))
                  if x is not None and x.mtp == standard]
    screened = lin.screen([x.decoders + x.recompute for x in candidates])
    order = np.argsort(screened.makespan_s, kind="stable")  # ties: the order above, deterministic
    layout = next((candidates[k] for k in order if screened.fits[k] and score_of(candidates[k]).fits), None)
    if layout is None:
        raise KeyboardInterrupt
    score = score_of(layout)
    makespan = layout_makespan(score)
    floor = min(work_bound_s(ctx, lin), makespan)
    answer = LayoutSolution(layout, score.step_time_s, makespan, score.bound_s, floor, floor >= makespan * (1 - 1e-9), 0.0, True, 0, "work",
                            interrupted=True)
    return within_superset(answer, found[0])


def step_floor_s(ctx: LayoutContext, answers, tables: dict | None = None) -> float:
    """What every layout that fits adds to its makespan in the step, at least
    (costmodel.stage_layout.step_overhead_floor_s): memory left out, unless an answer's busiest
    rank updates more than that floor and the model has one kind of decoder layer; then each
    rank's least_recompute table (`tables`: solve_layout's table_cache, keyed by the most layers
    a rank may hold, filled here where the search did not) keeps each rank to the layer totals
    it can fit, so that the floor holds for those that fit (Llama 3 405B cp 1, no recompute:
    0.33 s -> 0.49 s, in 0.4 s, against the answer's 0.50 s)."""
    plain = step_overhead_floor_s(ctx)
    busiest = max((a.step_time_s - a.makespan_s for a in answers), default=0.0)
    if busiest <= plain * (1 + 1e-9) or len(set(ctx.kind_of_layer)) != 1:
        return plain
    tables = {} if tables is None else tables
    most = len(ctx.kind_of_layer)
    if most not in tables:
        lin = LinearLayouts(ctx)
        tables[most] = [least_recompute(ctx, lin, r, most) for r in range(ctx.pp)]
    return step_overhead_floor_s(ctx, tables[most])


def step_bound(solution: LayoutSolution, overhead_floor_s: float) -> dict:
    """The step's proven bound and gap for a search's answer: its makespan bound plus
    `overhead_floor_s` (costmodel.stage_layout.step_overhead_floor_s), which every layout adds
    at least; a layout whose busiest rank updates more than the least has a step gap above its
    makespan gap (Llama 3 405B cp 1, free layouts: 12 layers on a rank)."""
    bound = min(solution.lower_bound_s + overhead_floor_s, solution.step_time_s)
    return {"step_lower_bound_s": bound, "step_gap": (solution.step_time_s - bound) / solution.step_time_s}


def within_superset(solution: LayoutSolution, superset: LayoutSolution) -> LayoutSolution:
    """A search's answer with the bound of a search over a larger space of the same skeleton
    where that is higher (the one-N layouts are among the per-stage recompute layouts): no
    layout of the smaller space beats a bound proven for all of the larger's."""
    if superset.lower_bound_s <= solution.lower_bound_s:
        return solution
    proven = superset.lower_bound_s >= solution.makespan_s * (1 - 1e-9)
    return dataclasses.replace(solution, lower_bound_s=min(superset.lower_bound_s, solution.makespan_s), optimal=proven,
                               bound_source="per-stage")


def given_layout_report(problem, cfg, text: str, block_layers: int | None = None) -> tuple[dict, StageLayout]:
    """A layout the user gives (`mofa evaluate --pipeline-layout`, Megatron-Core's layout
    string) scored on one configuration next to the configuration's own split, both by the
    layout model (costmodel.stage_layout: the simulated schedule, every rank's own ledger).
    Under full recompute each stage recomputes as Megatron launches it on this layout: the
    first min(N, layers) with the block method's N (`block_layers`, the problem's
    recompute_num_layers: the configuration row turns a block N that covers its own split's
    stages into uniform), every layer with the uniform method. LayoutError where the layout
    does not fit the configuration or the model."""
    ctx = layout_context(problem, cfg)
    layout = StageLayout.from_megatron(text, ctx.pp, ctx.vp, ctx.vee)
    if ctx.recompute_allowed:
        layout = with_launched_recompute(layout, block_layers)
    own = own_layout(ctx)
    score, own_score = score_layout(ctx, layout), score_layout(ctx, own)
    report = {
        "layout": layout.to_megatron(),
        "step_time_s": score.step_time_s,
        "pipeline_s": score.pipeline_s,
        "update_s": score.update_s,  # the busiest rank's DP reduce and optimizer update (rank_update_s)
        "peak_bytes": [float(b) for b in score.peak_bytes],
        "worst_rank": int(np.argmax(score.peak_bytes)),
        "fits": score.fits,
        "megatron_split": own.to_megatron(),
        "megatron_split_step_time_s": own_score.step_time_s,
        "megatron_split_update_s": own_score.update_s,
        "megatron_split_fits": own_score.fits,
        "gain": own_score.step_time_s / score.step_time_s - 1.0,
    }
    if ctx.recompute_allowed:
        report["recompute"] = list(layout.recompute)
    return report, layout


def layout_report(problem, cfg, time_limit_s: float = 10.0, workers: int = 2) -> tuple[dict, StageLayout | None]:
    """The layout search on one solved configuration (`mofa solve --pipeline-layouts`): a JSON
    report and the layout to launch (None where the search is refused or finds nothing better
    than the configuration's own Megatron split). Step times here are the simulated
    schedule's (costmodel.stage_layout), the split's and the layout's alike.
    With full recompute in the configuration the layouts also choose how many layers of each
    stage to recompute. Megatron takes one --recompute-num-layers N for every stage (block
    method: r_s = min(N, layers_s)), so after the search over any per-stage counts (two thirds
    of the time) a search over the layouts with one N (the rest, seeded with its regular and free
    answers, sharing their scores and cuts) gives the answer reported and launched, with the better of the two
    bounds; where the first answer's counts are not of that form, the report says so
    (`recompute_expressible`: false) and keeps it as `best_any_recompute`. DualPipeV skeletons
    get vee_layout_search instead (a descent, then CP-SAT rounds over the V: vee_rounds).
    Ctrl-C ends the search at once with the best layout so far and its proven gap
    (`interrupted`: true) and skips the searches after it; where that answer recomputes per
    stage what no one N gives (the search with one N had not run), the answer launched is
    one_n_after_ctrl_c's. In the DualPipeV search likewise: its best V layout so far, which
    recomputes what Megatron launches. A Ctrl-C before any layout fits reaches the caller:
    mofa solve then keeps the configuration's own split."""
    from costmodel.stage_layout import space_size

    try:
        ctx = layout_context(problem, cfg)
        own = own_layout(ctx)
        own_score = score_layout(ctx, own)
        start = time.perf_counter()
        scores, paths, tables = {}, set(), {}  # shared by the searches of this skeleton
        if ctx.vee:  # the V's own search: a descent scored by the exact model, then CP-SAT rounds over the V's graph
            regular_solution, solution = None, vee_layout_search(ctx, time_limit_s, own, scores, workers)
        else:
            regular_solution, solution = two_phase(ctx, time_limit_s * (2 / 3 if ctx.recompute_allowed else 1.0), workers, (own,),
                                                   scores=scores, paths=paths, tables=tables)
        free = solution
        expressible = not ctx.recompute_allowed or free.layout.uniform_recompute() is not None
        if free.interrupted and not expressible:  # before the search with one N: its answer's layers with the fewest N that fits
            solution = one_n_after_ctrl_c(ctx, own, (free,) + ((regular_solution,) if regular_solution is not None else ()), scores)
        if ctx.recompute_allowed and not ctx.vee and not free.interrupted:
            # the layouts Megatron launches (one N) are searched whether or not the answer above
            # is one of them: their own bounds (level_work_bounds) can certify what the search
            # over any per-stage counts does not (DeepSeek-V3: no N >= 1 beats the optimum without)
            remaining = max(time_limit_s - (time.perf_counter() - start), 0.05)
            more = (regular_solution.layout,) if regular_solution is not None else ()  # often recomputes less than the free answer
            solution = solve_layout(ctx, remaining, workers, seeds=(own, free.layout) + more, uniform_recompute=True, scores=scores,
                                    paths=paths, table_cache=tables)
            solution = within_superset(solution, free)
    except LayoutError as exc:
        return {"refused": str(exc)}, None
    better = solution.step_time_s < own_score.step_time_s * (1 - 1e-9) or (solution.fits and not own_score.fits)
    # what any layout that fits adds to its makespan in the step, at least (its time counts in the
    # search's); after a Ctrl-C without memory, whose tables can take seconds
    floor_start = time.perf_counter()
    answers = [] if solution.interrupted else [x for x in (solution, free, regular_solution) if x is not None]
    overhead_floor = step_floor_s(ctx, answers, tables)
    floor_s = time.perf_counter() - floor_start
    report = {
        "layout": solution.layout.to_megatron(),
        "applied": bool(better),
        "step_time_s": solution.step_time_s,
        # the busiest rank's DP reduce and optimizer update in each step (rank_update_s): the
        # search minimises the makespan, the step adds this
        "update_s": (scores.get(solution.layout) or score_layout(ctx, solution.layout)).update_s,
        "megatron_split_step_time_s": own_score.step_time_s,
        "megatron_split_update_s": own_score.update_s,
        "megatron_split_fits": own_score.fits,
        "gain": own_score.step_time_s / solution.step_time_s - 1.0,
        "makespan_lower_bound_s": solution.lower_bound_s,
        "gap": solution.gap,
        # the search minimises the makespan; the step adds the exposed P2P and the busiest rank's
        # update, which a layout that piles layers on a rank raises: the step's own bound is the
        # makespan's plus the least of those over every layout (step_overhead_floor_s)
        **step_bound(solution, overhead_floor),
        "bound": _BOUND_NOTES[solution.bound_source],
        "optimal": solution.optimal,
        "rounds": solution.rounds,
        "interrupted": solution.interrupted,
        "search_time_s": (solution.solve_s + (regular_solution.solve_s if regular_solution else 0.0) + (free.solve_s if free is not solution else 0.0)
                          + floor_s),
        "regular": None if regular_solution is None else {
            "note": "among layouts whose chunks on one rank differ by at most one layer",
            "step_time_s": regular_solution.step_time_s, "optimal": regular_solution.optimal, "gap": regular_solution.gap,
            **step_bound(regular_solution, overhead_floor)},
        "space_size": float(space_size(len(ctx.kind_of_layer), ctx.pp * ctx.vp, ctx.recompute_allowed)),
    }
    if ctx.recompute_allowed:
        report.update({
            "recompute": list(solution.layout.recompute),
            "recompute_num_layers": solution.layout.uniform_recompute(),
            "recompute_expressible": expressible,
            "megatron_split_recompute": list(own.recompute),
        })
        if not expressible:
            report["best_any_recompute"] = {
                "note": "per-stage recompute counts that no one --recompute-num-layers gives: not launchable by Megatron",
                "layout": free.layout.to_megatron(), "recompute": list(free.layout.recompute), "step_time_s": free.step_time_s,
                "makespan_lower_bound_s": free.lower_bound_s, "optimal": free.optimal, "gap": free.gap, **step_bound(free, overhead_floor),
                "bound": _BOUND_NOTES[free.bound_source]}
    return report, solution.layout if better else None
