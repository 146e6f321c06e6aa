"""The linear model of a layout (issue 11): each stage's pass times and each rank's memory
rows as linear forms in the layer counts, read off the exact model by probing it, so that
numpy screens many layouts at once and CP-SAT can hold them as constraints.

Memory per rank is the exact ledger (costmodel.memory.rank_memory), affine in the rank's kind
counts for the supported skeletons:
    peak_r = base_r(counts) + (1 + frag) * max(activations_r, optimizer transient_r)
with activations_r = max over the rank's in-flight vectors h (costmodel.stage_layout.held_chunks)
of sum_c h_c * bytes of local chunk c; each h is one linear constraint. The coefficients are read
off the exact ledger by probing it (no formula is copied), and the answer is re-scored. Under
activation offload a chunk's bytes are what stays on the GPU (costmodel.stage_layout.
in_flight_bytes: a constant per chunk in flight under MoFa's whole-layer offload, its
input), and the in-flight rows add the two layers' offloaded sets in transit of the largest kind
the rank holds (LinearLayouts.in_transit, which also holds FCDA's chunk of expert tensors). A
rank's host memory is linear too (rank_host_terms: its ledger's at nothing in flight, a CPU
optimizer's states, plus what its chunks offload per micro-batch in flight, one row per h
against the GPU's share of the node's host memory, LinearLayouts.host_rows).

Layer kinds: a stage holds a contiguous run of the model's layers, so with prefix sums P_s the
layers of kind-run [a, b) in stage s are clip(P_s, a, b) - clip(P_{s-1}, a, b).

Recompute (skeletons with full recompute): an integer r_s per stage, 0 <= r_s <= t_s, the
stage's first r_s layers, so the recomputed layers of kind-run [a, b) are
clip(P_{s-1} + r_s, a, b) - clip(P_{s-1}, a, b); each adds its recompute to the stage's
backward and takes what it does not keep off every memory row, and a rank that recomputes adds
one layer's working set (costmodel.stage_layout). The fewest layers each rank must recompute
at each of its layer totals (least_recompute) is what memory forces on every layout."""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import math

import numpy as np
from ortools.sat.python import cp_model

from costmodel.memory import pipeline_buffer_count
from costmodel.pipeline import grad_windows
from costmodel.stage_layout import (
    LayoutContext,
    LayoutError,
    StageLayout,
    chunk_times,
    layout_host_bytes,
    layout_ledgers,
    rank_ledger,
    recompute_working_bytes,
    stage_ranks,
    stage_times,
    stage_windows_s,
    stage_zero_terms,
    unit_costs,
    in_flight_only,
)
from costmodel.update import windows_exposed
from optimizer import cp_solver
from optimizer.schedule_graph import ScheduleGraph, schedule_graph


BYTE_SCALE = 1024.0  # integer KiB


def kind_runs(kind_of_layer: list[int]) -> list[tuple[int, int, int]]:
    """(kind, first layer, end) of each maximal run of equal kinds in model order."""
    runs = []
    for kind, group in itertools.groupby(enumerate(kind_of_layer), key=lambda x: x[1]):
        idx = [i for i, _ in group]
        runs.append((kind, idx[0], idx[-1] + 1))
    return runs


def rank_memory_model(ctx: LayoutContext, rank: int) -> tuple[float, np.ndarray, float, np.ndarray, float, np.ndarray, np.ndarray]:
    """(base_0, base per kind, transient_0, transient per kind, head bytes, largest per kind,
    in transit per kind) of a rank, read off the exact ledger at zero activations: peak = base +
    largest + (1+frag)*max(act + head + in transit, trans), where `largest` is the most of
    largest[k] over the kinds the rank holds: what the ledger keeps of its largest layer (ZeRO-3
    freed after the forward holds the gathered copies of the largest layer running and the next,
    or of the edge module where that is larger), a jump at a rank's first layer of a kind rather
    than a cost per layer; and `in transit` likewise the most over the kinds it holds of the
    activations the ledger holds whatever the in-flight count: activation offload's two layers'
    offloaded sets, FCDA's chunk of a layer's expert tensors (a jump at the first; 0 without
    either). Probed at 0..3 layers of each kind, the ledger of stage_layout.in_flight_only for all
    but the last (which those sets do not change); refused where the steps beyond the first differ."""
    last_rank = stage_ranks(ctx.pp, ctx.vp, ctx.vee)[-1]
    first, last = rank == 0, rank == last_rank
    mtp = ctx.problem.model.mtp_layers if last else 0
    no_head = dataclasses.replace(ctx.lc, head_saved=0.0 * ctx.lc.head_saved)
    frag = ctx.mc.fragmentation
    k = len(ctx.kinds)
    x = ctx.cfg_plain.derived()
    sets = x.any_offload or x.any_chunks  # sets the ledger holds whatever the in-flight count
    plain = in_flight_only(ctx.cfg_plain) if sets else None

    def probe(counts):
        ledger = rank_ledger(ctx, counts, first, last, mtp, 0.0, lc=no_head, cfg=plain)
        trans = float(ledger.optimizer_transient[0])
        return float(ledger.peak[0]) - (1.0 + frag) * trans, trans

    def in_transit(counts) -> float:
        return float(rank_ledger(ctx, counts, first, last, mtp, 0.0, lc=no_head).activations[0]) if sets else 0.0

    close = functools.partial(math.isclose, rel_tol=1e-9, abs_tol=1.0)  # bytes
    base0, trans0 = probe(np.zeros(k))
    transit0 = in_transit(np.zeros(k))
    base, trans, largest, transit = np.zeros(k), np.zeros(k), np.zeros(k), np.zeros(k)
    for j in range(k):
        (b1, t1), (b2, t2), (b3, t3) = (probe(n * np.eye(k)[j]) for n in (1, 2, 3))
        base[j], trans[j] = b2 - b1, t2 - t1
        largest[j] = b1 - base0 - base[j]
        w1, w3 = in_transit(np.eye(k)[j]), in_transit(3 * np.eye(k)[j])
        transit[j] = w1 - transit0
        if not (close(b3 - b2, base[j]) and close(t3 - t2, trans[j]) and close(t1 - trans0, trans[j]) and close(w3, w1)) or largest[j] < -1.0:
            raise LayoutError(f"the layout search does not model this skeleton's memory: rank {rank}'s ledger is not linear in its layers "
                              "beyond a jump at the first; `mofa evaluate --pipeline-layout` scores a layout under it")
    head = float(np.asarray(ctx.lc.head_saved).ravel()[0]) * (1 + mtp) if last else 0.0
    return base0 + pipeline_buffer_range(ctx, rank)[0], base, trans0, trans, head + transit0, np.maximum(largest, 0.0), np.maximum(transit, 0.0)


def pipeline_buffer_range(ctx: LayoutContext, rank: int) -> tuple[float, float]:
    """(least, most) bytes PyTorch pipelining's buffers per micro-batch (torchtitan;
    costmodel.memory.pipeline_buffer_count) move a rank's peak from what rank_memory_model
    reads at zero micro-batches in flight, over every layout ((0, 0) for other pipelines). The
    ledger counts them on the rank's in-flight chunks, its held bytes over its mean chunk (not
    linear in the counts): at most vp times its most-held chunk's micro-batches, plus a
    recomputed layer's working set over the smallest chunk that can recompute it. The count is
    piecewise linear in that number, so its least and most over [0, that most] are at an end or
    a break (1, the step's chunks). rank_memory_model adds the least, which keeps the linear rows
    at or below the exact peak of every layout (the last rank's output buffer, which the count
    takes back once a micro-batch is in flight, made them stricter by a hop, up to every chunk's
    input with torch <= 2.6's kept outputs: a certificate could have missed a layout that fits);
    the tests that must not miss a rank over the capacity add the difference."""
    if not ctx.mc.buffers_per_microbatch or ctx.pp <= 1:
        return 0.0, 0.0
    u = unit_costs(ctx)
    most = ctx.vp * float(ctx.held[rank].max())
    act = u["kind_activation"]
    if u["kind_working"].max() > 0 and (act > 0).any():
        most += ctx.vp * float(u["kind_working"].max() / act[act > 0].min())
    chunks = float(ctx.microbatches * ctx.vp)
    points = np.array([x for x in (0.0, 1.0, chunks, most) if x <= most])  # zero first
    last = rank == stage_ranks(ctx.pp, ctx.vp, ctx.vee)[-1]
    count = pipeline_buffer_count(ctx.mc, ctx.cfg_plain, np.array([float(ctx.microbatches)]), points, rank == 0, float(last))
    count = count - count[0]
    scale = (1.0 + ctx.mc.fragmentation) * float(np.asarray(ctx.lc.hop_bytes).ravel()[0])
    return scale * float(count.min()), scale * float(count.max())


def rank_memory_terms(ctx: LayoutContext, rank: int) -> tuple[tuple[float, np.ndarray, float, np.ndarray, float, np.ndarray], np.ndarray,
                                                                np.ndarray]:
    """rank_memory_model's (base_0, base per kind, transient_0, transient per kind, head bytes)
    with the MTP modules of the last rank folded into the constants, and [chunk] the bytes one
    micro-batch in flight of each local chunk holds whatever its decoder layers (`chunk_act`:
    the MTP modules' activations, with the last local chunk; the input every chunk keeps under
    MoFa's whole-layer activation offload, stage_layout.in_flight_bytes): the rank fits when
        base_0 + base . counts + largest + (1+frag) * max(transient_0 + transient . counts,
                                               max_h sum_c h_c (act . chunk_c + chunk_act_c) + head + in transit) <= capacity
    over its in-flight vectors h (ctx.held); and, apart, rank_memory_model's largest per kind and
    in transit per kind (each its most over the kinds the rank holds, the MTP modules' kind
    included on the last rank). The CP-SAT model and the local search read it."""
    base0, base, trans0, trans, head, largest, transit = rank_memory_model(ctx, rank)
    u = unit_costs(ctx)
    chunk_act = np.full(ctx.vp, float(u["chunk_activation"]))
    if rank == stage_ranks(ctx.pp, ctx.vp, ctx.vee)[-1] and ctx.mtp_kind is not None:
        mtp_layers = ctx.problem.model.mtp_layers
        base0 += mtp_layers * base[ctx.mtp_kind]
        trans0 += mtp_layers * trans[ctx.mtp_kind]
        chunk_act[-1] += mtp_layers * u["kind_activation"][ctx.mtp_kind]
        if mtp_layers:  # the MTP modules' layers are always held: their kind's jumps are every layout's
            base0 += largest[ctx.mtp_kind]
            largest = np.maximum(largest - largest[ctx.mtp_kind], 0.0)
            head += transit[ctx.mtp_kind]
            transit = np.maximum(transit - transit[ctx.mtp_kind], 0.0)
    return (base0, base, trans0, trans, head, chunk_act), largest, transit


def rank_host_terms(ctx: LayoutContext, rank: int) -> tuple[float, np.ndarray, np.ndarray] | None:
    """(host_0, host per kind, [chunk] host per micro-batch in flight whatever its decoder
    layers) of a rank: stage_layout.rank_host_bytes in linear form,
        host_0 + host . counts + max_h sum_c h_c (kind_host . chunk_c + chunk_host_c),
    its ledger's host memory at nothing in flight (a CPU optimizer's states; probed at 0..3 layers
    of each kind, the MTP modules on the last rank) plus what its chunks offload per micro-batch
    in flight (unit_costs' kind_host; the MTP modules' with the last local chunk). None where the
    ledger's host memory is not affine in the layers (then the exact score alone tests it)."""
    last_rank = stage_ranks(ctx.pp, ctx.vp, ctx.vee)[-1]
    first, last = rank == 0, rank == last_rank
    mtp = ctx.problem.model.mtp_layers if last else 0
    k = len(ctx.kinds)
    edge = np.zeros(k)
    if last and ctx.mtp_kind is not None:
        edge[ctx.mtp_kind] = mtp

    def idle(counts) -> float:
        return float(np.asarray(rank_ledger(ctx, counts + edge, first, last, mtp, 0.0).host).ravel()[0])

    host0 = idle(np.zeros(k))
    per_kind = np.zeros(k)
    for j in range(k):
        h1, h2, h3 = (idle(n * np.eye(k)[j]) for n in (1, 2, 3))
        per_kind[j] = h1 - host0
        if not (math.isclose(h2 - h1, per_kind[j], rel_tol=1e-9, abs_tol=1.0) and math.isclose(h3 - h2, per_kind[j], rel_tol=1e-9, abs_tol=1.0)):
            return None
    kind_host = unit_costs(ctx)["kind_host"]
    chunk_host = np.zeros(ctx.vp)
    if last:
        chunk_host[-1] = float(edge @ kind_host)
    return host0, per_kind, chunk_host


@dataclasses.dataclass(frozen=True)
class WindowTerms:
    """ZeRO-2/3's earlier gradient windows (costmodel.stage_layout.stage_windows_s) in the form
    the search holds them: per stage, one reduce-scatter of its gradients,
        rs_s = rs_const[s] + rs_first[s] * [t_s > 0] + rs_jump[s] * [stage holds a jump_runs layer]
               + rs_run . (layers of each kind-run),
    (rs_jump: the experts' collective, which starts with a stage's first MoE layer), and the
    compute its rank hides it behind, per micro-batch of each stage without the chunk overheads,
    compute_run . counts + recompute . recomputed + compute_const[s], less the prefetches' overlap
    used_const[s] + used_first[s] * [t_s > 0] + used_layer * t_s (per step; with tabulated
    gathers, GatherTables.used_* instead). The seconds per micro-batch a stage's backward gains
    are then
        (windows - 1) / m * hidden(rs_s, max(gap_r, 0)),
    gap_r = (m * sum of the rank's compute - its used) / (windows * vp)
    (costmodel.update.windows_exposed: with DP overlap max(beta rs - gap, (alpha - 1) min(gap, beta rs)),
    without it rs whole). That is at least (alpha - 1) / alpha * beta rs whatever the gap (where
    beta rs <= gap it is (alpha - 1) beta rs; beyond, below alpha gap it is (alpha - 1) gap >
    (alpha - 1) / alpha * beta rs, from alpha gap on beta rs - gap >= (alpha - 1) / alpha * beta rs),
    so LinearLayouts keeps `linear` = (windows - 1) / m * that share of rs without its jump in
    its linear terms and the rest here (window_s)."""

    windows: float
    overlap: bool  # DP overlap: the windows hide behind compute (else rs is exposed whole, linear but for its jump)
    linear: float  # of each second of rs_s without its jump, what LinearLayouts' linear terms already hold
    rs_const: np.ndarray
    rs_first: np.ndarray
    rs_jump: np.ndarray
    jump_runs: np.ndarray  # [run] bool: the kind-runs whose first layer in a stage starts the jump's collective
    rs_run: np.ndarray
    compute_const: np.ndarray
    compute_run: np.ndarray
    used_const: np.ndarray
    used_first: np.ndarray
    used_layer: float


@dataclasses.dataclass(frozen=True)
class GatherTables:
    """ZeRO-3's gathers of a stage with more than one kind of decoder layer beyond LinearLayouts'
    linear terms, seconds per micro-batch: a stage other than the last holding layers
    [start, start + t) adds middle_*[start, t] (0 where start + t > n), the last stage holding
    [start, n) with the MTP modules last_*[start]. Where a stage has earlier gradient windows,
    the compute their prefetches overlap per step (the windows' `used`, whole, not a rest) by the
    same index: used_middle[start, t], used_last[start] (None without windows)."""

    middle_f: np.ndarray
    middle_b: np.ndarray
    last_f: np.ndarray
    last_b: np.ndarray
    used_middle: np.ndarray | None = None
    used_last: np.ndarray | None = None


def _affine_in_layers(probe, stages: int, what: str) -> tuple[np.ndarray, np.ndarray, float]:
    """(value at 0 layers, the jump of a stage's first layer, the slope per layer) of
    probe(n): [stage] values with every stage holding n layers; refused where n = 1..3 are not
    on one line whose slope is the same for every stage."""
    v0, v1, v2, v3 = (np.asarray(probe(n), dtype=float) for n in range(4))
    slope = v2 - v1
    close = functools.partial(np.allclose, rtol=1e-9, atol=1e-15)
    if not (close(slope, slope[0]) and close(v3 - v2, slope)):
        raise LayoutError(f"the layout search does not model this skeleton's ZeRO traffic: {what} not linear in a stage's layers")
    return v0 + np.zeros(stages), v1 - v0 - slope, float(slope[0])


class LinearLayouts:
    """A skeleton's layouts in the linear form the search works with, vectorized over many
    layouts: layers of each kind-run per stage (clipped prefix sums), per-stage forward and
    backward seconds (chunk_times' composition) and the rank memory test of rank_memory_terms.
    The local search screens neighbours with it; the exact model (score_layout) has the last
    word on what fits.
    ZeRO-2/3's traffic inside the pipeline, where the skeleton has it: per stage a fixed exposed
    first gather where it holds a layer (ZeRO-3: once per window kept after the forward, every
    micro-batch freed after it) and a prefetch per layer, or with more than one kind of layer the
    gathers of the stage's mean layer, by table (`gathers`, GatherTables); and where a stage
    reduces its gradients more than once per step (the interleaved schedule with more
    micro-batches than a round, DualPipeV's window per micro-batch) its earlier windows'
    reduce-scatters hidden behind its rank's compute between two windows: a max and a min of
    affine forms (`windows`, WindowTerms), with the experts' collective starting at a stage's
    first MoE layer and, with tabulated gathers, the prefetches' overlap by the same tables.
    Construction checks the stage times and rank peaks against the exact model's on probe
    layouts and refuses the skeleton (LayoutError) where they differ."""

    def __init__(self, ctx: LayoutContext):
        self.ctx = ctx
        u = unit_costs(ctx)
        self.stages = ctx.pp * ctx.vp
        self.runs = kind_runs(ctx.kind_of_layer)
        self.kind_of_run = np.array([k for k, _, _ in self.runs])
        mtp = np.array(ctx.mtp_on_last, dtype=float)
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
        # ZeRO-2/3's traffic inside the pipeline (costmodel.stage_layout.zero_traffic_s), read off
        # by probing it: the edge stages' own, a cost per layer and one per stage holding a layer
        self.first_forward_s = self.first_backward_s = np.zeros(self.stages)
        self.windows: WindowTerms | None = None  # ZeRO-2/3's earlier gradient windows, where a stage has them
        self.gathers: GatherTables | None = None  # ZeRO-3's gathers of mean layers, with more than one kind of layer
        if ctx.cfg.derived().any_zero2:
            self._add_zero_traffic(u, edge, mtp, first, last)
            self._check_times()
        terms = [rank_memory_terms(ctx, r) for r in range(ctx.pp)]
        self.memory = [linear for linear, _, _ in terms]
        # per rank, [kind] what holding a layer of that kind adds to its peak beyond `memory`'s
        # linear terms (rank_memory_model's largest: ZeRO-3 freed after the forward; 0 elsewhere),
        # the most over the kinds it holds: exact in rank_rows and MemoryRows, an upper bound (the
        # most over every kind) where a test must not miss a rank over the capacity, left out
        # (a lower bound) where a row must hold for every fitting layout
        self.largest = [largest for _, largest, _ in terms]
        # per rank, [kind] what the ledger holds of the largest layers it holds whatever the
        # in-flight count (activation offload's two layers' offloaded sets in transit, FCDA's chunk
        # of expert tensors, rank_memory_model; 0 without either), the most
        # over the kinds it holds: in the in-flight rows only (not the transient's), exact in
        # rank_rows and MemoryRows, at its most over every kind in the seeds' rows, left out
        # where a row must hold for every fitting layout
        self.in_transit = [transit for _, _, transit in terms]
        # per rank, how far PyTorch pipelining's buffers per micro-batch can lift its peak above
        # `memory`'s rows, which hold them at their least (pipeline_buffer_range; 0 elsewhere):
        # added where a test must not miss a rank over the capacity
        self.buffer_spread = np.array([np.subtract(*pipeline_buffer_range(ctx, r)[::-1]) for r in range(ctx.pp)])
        self.frag = ctx.mc.fragmentation
        self.capacity = ctx.problem.hardware.memory_bytes
        self._check_memory()
        # per rank, its host memory in linear form (rank_host_terms), where a rank can use any
        # (a CPU optimizer, activation offload) and the terms meet the exact score on the probe
        # layouts; else None and the exact score alone tests the host (a layout over it is
        # excluded when scored)
        self.host_capacity = float(ctx.mc.host_share_bytes)
        self.host = [rank_host_terms(ctx, r) for r in range(ctx.pp)]
        uses_host = any(t[0] or t[1].any() for t in self.host if t is not None) or u["kind_host"].any()
        if any(t is None for t in self.host) or not uses_host or not self._host_rows_exact():
            self.host = None

    def _add_zero_traffic(self, u: dict, edge: np.ndarray, mtp: np.ndarray, first: np.ndarray, last: np.ndarray) -> None:
        """Probe stage_zero_terms with every stage holding 0..3 layers of one kind: ZeRO-3's
        gathers (the edge stages' at 0 layers, a per-layer prefetch and the first layer's
        exposed gather; with more than one kind of decoder layer by table, _add_gather_tables)
        and, where a stage has earlier gradient windows, the terms of WindowTerms (its
        reduce-scatter per kind of layer, and the jump of a collective that only some kinds
        start: the experts')."""
        ctx, micro = self.ctx, float(self.ctx.microbatches)

        def terms(kind: int, layers: int):
            counts = edge.copy()
            counts[:, kind] += layers
            return stage_zero_terms(ctx, counts, mtp)

        kind = int(self.kind_of_run[0])
        kinds = sorted(set(self.kind_of_run.tolist()))
        windows = float(grad_windows(ctx.cfg, np.array([micro]))[0])
        if len(kinds) > 1 and ctx.cfg_plain.derived().any_zero3:
            self._add_gather_tables(edge, mtp, windows > 1)  # a stage gathers its mean layer: tables
            used_const = used_first = np.zeros(self.stages)
            used_layer = 0.0
        else:
            f0, f_first, f_slope = _affine_in_layers(lambda n: terms(kind, n).exposed_f / micro, self.stages, "its gathers")
            b0, b_first, b_slope = _affine_in_layers(lambda n: terms(kind, n).exposed_b / micro, self.stages, "its gathers")
            self.const_forward_s, self.const_backward_s = self.const_forward_s + f0, self.const_backward_s + b0
            self.forward_s, self.backward_s = self.forward_s + f_slope, self.backward_s + b_slope
            self.first_forward_s, self.first_backward_s = f_first, b_first
            if windows > 1:
                used_const, used_first, used_layer = _affine_in_layers(lambda n: terms(kind, n).window_used, self.stages,
                                                                       "its prefetches' overlap")
        if windows <= 1:
            return
        rs_const, rs_first, rs_slope = {}, {}, {}
        for k in kinds:
            rs_const[k], rs_first[k], rs_slope[k] = _affine_in_layers(lambda n: terms(k, n).reduce_scatter_s, self.stages, "its reduce-scatters")
        # a stage's first layer starts its collectives: every kind the dense one, some kinds (MoE)
        # the experts' too, a jump of its own where the stage holds one of them
        low = np.min([rs_first[k] for k in kinds], axis=0)
        jumping = [k for k in kinds if not np.allclose(rs_first[k], low, rtol=1e-9, atol=1e-15)]
        jump = rs_first[jumping[0]] - low if jumping else np.zeros(self.stages)
        jump = np.where(np.isclose(jump, 0.0, rtol=0.0, atol=1e-9 * float(np.abs(jump).max(initial=0.0))), 0.0, jump)  # float dust
        if any(not np.allclose(rs_first[k] - low, jump, rtol=1e-9, atol=1e-15) for k in jumping):
            raise LayoutError(f"the layout search does not model zero_stage {int(ctx.cfg.zero_stage[0])} here: the reduce-scatters of its "
                              "stages' earlier gradient windows start collectives with more than two kinds of layer, not linear in a "
                              "stage's layers; `mofa evaluate --pipeline-layout` scores a layout under it")
        forward, backward = chunk_times(u, edge, mtp, first, last)
        rs_run = np.array([rs_slope[k] for k in self.kind_of_run.tolist()])
        # the part of the windows linear in the reduce-scatter, in the linear terms (what the
        # bounds and the LP see): their value at the gap that exposes least, beta rs / alpha
        # (WindowTerms.linear); without DP overlap, whatever the gap: all of it but the jump
        x, coef = ctx.cfg_plain.derived(), ctx.problem.hardware.efficiency.dp_overlap
        overlap = bool(x.dp_overlap[0])
        linear = float(windows_exposed(1.0, 1.0, x, ctx.problem.hardware, windows, float(coef.beta) / float(coef.alpha))[0]) / micro
        self.const_backward_s = self.const_backward_s + linear * rs_const[kind]
        self.first_backward_s = self.first_backward_s + linear * low
        self.backward_s = self.backward_s + linear * rs_run
        if overlap or jumping:
            self.windows = WindowTerms(
                windows=windows, overlap=overlap, linear=linear, rs_const=rs_const[kind], rs_first=low, rs_jump=jump,
                jump_runs=np.isin(self.kind_of_run, jumping), rs_run=rs_run,
                compute_const=forward + backward - 2.0 * u["overhead"], compute_run=u["kind_total"][self.kind_of_run],
                used_const=used_const, used_first=used_first, used_layer=used_layer)

    def _add_gather_tables(self, edge: np.ndarray, mtp: np.ndarray, windows: bool) -> None:
        """ZeRO-3 with more than one kind of decoder layer: a stage gathers its mean layer
        (costmodel.stage_layout.stage_zero_terms), a ratio of its counts, so its gathers are
        tabulated by the exact model over every run of layers [start, start + t) (GatherTables).
        The linear terms keep a * t + b * [t > 0] per stage, below every table entry (a and b
        from the least entry at each t), plus the stage's own modules' gathers; the tables keep
        the rest (gather_rest_s), >= 0. With earlier gradient windows (`windows`) the prefetches'
        overlap per step, whole, by the same index (GatherTables.used_*; it depends on the stage's
        layers alone, not on the edge modules)."""
        ctx, micro = self.ctx, float(self.ctx.microbatches)
        n, kinds, stages = len(ctx.kind_of_layer), len(ctx.kinds), self.stages
        prefix = np.zeros((n + 1, kinds))
        prefix[1:] = np.cumsum(np.eye(kinds)[np.asarray(ctx.kind_of_layer)], axis=0)
        start, t = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
        valid = start + t <= n
        runs = (prefix[np.minimum(start + t, n)] - prefix[start]).reshape(-1, kinds)
        # every run as a middle stage: padded so that the first and the last row hold the edges
        padded = np.vstack([np.zeros((1, kinds)), runs, np.zeros((1, kinds))])
        middle = stage_zero_terms(ctx, padded, np.zeros(len(padded)))
        mid = [np.where(valid, x[1:-1].reshape(n + 1, n + 1) / micro, np.inf) for x in (middle.exposed_f, middle.exposed_b)]
        own = stage_zero_terms(ctx, edge, mtp)  # each stage's modules (the embedding, the head) without layers
        last, used_last = [np.zeros(n + 1), np.zeros(n + 1)], np.zeros(n + 1)
        for begin in range(n + 1):  # the last stage holds layers [begin, n) and the MTP modules
            counts = edge.copy()
            counts[-1] += prefix[n] - prefix[begin]
            found = stage_zero_terms(ctx, counts, mtp)
            last[0][begin], last[1][begin] = found.exposed_f[-1] / micro, found.exposed_b[-1] / micro
            used_last[begin] = found.window_used[-1]
        layers = np.arange(n + 1)
        rests, linear = [], []
        for table, tail, own_s in zip(mid, last, (own.exposed_f / micro, own.exposed_b / micro)):
            least = table.min(axis=0)  # at each t, over the starts
            slope = min(((least[k] - least[1]) / (k - 1) for k in range(2, n + 1)), default=0.0)
            jump = least[1] - slope
            if slope < 0 or jump < 0:  # the bounds drop a stage's fixed part: both stay >= 0
                slope = max(min(least[k] / k for k in range(1, n + 1)), 0.0)
                jump = 0.0
            below = jump * (layers > 0) + slope * layers  # by t
            tail_t = n - layers  # the last stage's layers at each start
            tail_const = float((tail - jump * (tail_t > 0) - slope * tail_t).min())
            rests.append((np.where(valid, table - below[None, :], 0.0), tail - jump * (tail_t > 0) - slope * tail_t - tail_const))
            linear.append((slope, jump, np.concatenate([own_s[:-1], [tail_const]])))
        (slope_f, jump_f, const_f), (slope_b, jump_b, const_b) = linear
        self.forward_s, self.backward_s = self.forward_s + slope_f, self.backward_s + slope_b
        self.first_forward_s, self.first_backward_s = np.full(stages, jump_f), np.full(stages, jump_b)
        self.const_forward_s, self.const_backward_s = self.const_forward_s + const_f, self.const_backward_s + const_b
        used_middle = np.where(valid, middle.window_used[1:-1].reshape(n + 1, n + 1), 0.0) if windows else None
        self.gathers = GatherTables(middle_f=rests[0][0], middle_b=rests[1][0], last_f=rests[0][1], last_b=rests[1][1],
                                    used_middle=used_middle, used_last=used_last if windows else None)

    def without_stage_jumps(self) -> "LinearLayouts | None":
        """A copy whose stage times leave out what a stage pays for holding a layer beyond the
        per-layer terms: ZeRO-3's exposed first gather, the gather tables' rest and the gradient
        windows' rest (each >= 0; the windows' linear share per layer stays). It prices every
        layout at most at its makespan and needs no boolean per stage in CP-SAT (what slows its
        rounds: solve_layout's relaxed_bound). None where it has none to leave out, or where a
        first-layer term is negative (leaving it out would not relax)."""
        if self.windows is None and self.gathers is None and not (self.first_forward_s.any() or self.first_backward_s.any()):
            return None
        if min(self.first_forward_s.min(), self.first_backward_s.min()) < -1e-12:  # float dust aside
            return None
        plain = copy.copy(self)
        plain.first_forward_s, plain.first_backward_s = np.zeros(self.stages), np.zeros(self.stages)
        plain.windows, plain.gathers = None, None
        return plain

    def _table_index(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([K, stage] first layer, [K, stage] layers) of K layouts' run counts: GatherTables' index."""
        layers = counts.sum(axis=-1).astype(np.int64)
        return np.cumsum(layers, axis=1) - layers, layers

    def gather_rest_s(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[K, stage] forward and backward seconds per micro-batch of ZeRO-3's gathers beyond the
        linear terms (GatherTables; 0 without)."""
        g = self.gathers
        if g is None:
            zero = np.zeros(counts.shape[:2])
            return zero, zero
        start, layers = self._table_index(counts)
        out = []
        for middle, last in ((g.middle_f, g.last_f), (g.middle_b, g.last_b)):
            rest = middle[start, layers]
            rest[:, -1] = last[start[:, -1]]
            out.append(rest)
        return out[0], out[1]

    def window_s(self, counts: np.ndarray, recomputed: np.ndarray | None = None) -> np.ndarray:
        """[K, stage] the seconds per micro-batch the earlier gradient windows add to each
        stage's backward in K layouts' run counts [K, stage, run] beyond the linear terms'
        (WindowTerms; 0 without)."""
        w = self.windows
        if w is None:
            return np.zeros(counts.shape[:2])
        layers = counts.sum(axis=-1)
        held = layers > 0
        jumped = counts[..., w.jump_runs].sum(axis=-1) > 0
        rs = w.rs_const + held * w.rs_first + jumped * w.rs_jump + counts @ w.rs_run
        compute = w.compute_const + counts @ w.compute_run
        if recomputed is not None:
            compute = compute + recomputed @ self.recompute_s
        used = w.used_const + held * w.used_first + layers * w.used_layer
        g = self.gathers
        if g is not None and g.used_middle is not None:
            start, count = self._table_index(counts)
            tabulated = g.used_middle[start, count]
            tabulated[:, -1] = g.used_last[start[:, -1]]
            used = used + tabulated
        return stage_windows_s(self.ctx, rs, compute, used) - w.linear * (rs - jumped * w.rs_jump)

    def _probe_layouts(self) -> list[StageLayout]:
        """The layouts _check_times and _check_memory compare on: an even split and layouts
        piling layers onto single stages (seeded)."""
        n = len(self.ctx.kind_of_layer)
        rng = np.random.default_rng(0)
        probes = [np.bincount(np.arange(n) * self.stages // n, minlength=self.stages)]
        for _ in range(3):
            probes.append(np.bincount(rng.integers(0, self.stages, n), minlength=self.stages))
        return [StageLayout(pp=self.ctx.pp, vp=self.ctx.vp, decoders=tuple(int(d) for d in decoders), mtp=self.ctx.mtp_on_last,
                            recompute=(0,) * self.stages, vee=self.ctx.vee) for decoders in probes]

    def _check_times(self) -> None:
        """Refuse the skeleton where `times` differs from the exact model's stage_times on probe
        layouts (_probe_layouts)."""
        for layout in self._probe_layouts():
            exact = np.add(*stage_times(self.ctx, layout))
            counts = self.run_counts(np.array([layout.decoders]))
            mine = np.add(*self.times(counts))[:, 0]
            if not np.allclose(mine, exact, rtol=1e-9, atol=1e-12):
                raise LayoutError("the layout search does not model this skeleton's ZeRO traffic: its linear stage times differ from the "
                                  "exact model's; `mofa evaluate --pipeline-layout` scores a layout under it")

    def _check_memory(self) -> None:
        """Refuse the skeleton where rank_rows' peaks differ from the exact ledger's
        (stage_layout.layout_ledgers) on probe layouts (_probe_layouts) by more than 1 KiB: above
        it (a row stricter than the ledger could keep a certificate from a layout that fits), or
        below it beyond what PyTorch pipelining's buffers per micro-batch can move
        (buffer_spread: the rows hold them at their least, pipeline_buffer_range; up to 0.53 GiB
        on Llama 3 405B at pp 16)."""
        for layout in self._probe_layouts():
            exact = np.array([float(np.asarray(ledger.peak).ravel()[0]) for ledger in layout_ledgers(self.ctx, layout)])
            mine = self.capacity - self.headroom(self.run_counts(np.array([layout.decoders])))[0]
            if (mine > exact + 1024.0).any() or (mine + self.buffer_spread < exact - 1024.0).any():
                raise LayoutError("the layout search does not model this skeleton's memory: its linear rank peaks differ from the exact "
                                  "ledger's; `mofa evaluate --pipeline-layout` scores a layout under it")

    def _host_rows_exact(self) -> bool:
        """Whether host_rows meet stage_layout.layout_host_bytes on the probe layouts
        (_probe_layouts) within 1 KiB."""
        for layout in self._probe_layouts():
            exact = layout_host_bytes(self.ctx, layout, layout_ledgers(self.ctx, layout))
            mine = np.array([rows.max(axis=1)[0] for rows in self.host_rows(self.run_counts(np.array([layout.decoders])))])
            if not np.allclose(mine, exact, rtol=0.0, atol=1024.0):
                return False
        return True

    def host_rows(self, counts: np.ndarray) -> list[np.ndarray] | None:
        """Per rank, [K, vectors] its host bytes at each in-flight vector of ctx.held (the host
        memory is their max, rank_host_terms) of K layouts' run counts [K, stage, run]; None
        without host terms."""
        if self.host is None:
            return None
        kind_host = self.u["kind_host"][self.kind_of_run]  # [run]
        out = []
        for r, (host0, per_kind, chunk_host) in enumerate(self.host):
            mine = counts[:, self.ctx.stages_of[r], :]  # [K, chunk, run]
            idle = host0 + mine.sum(axis=1) @ per_kind[self.kind_of_run]
            held = np.asarray(self.ctx.held[r], dtype=float).reshape(-1, self.ctx.vp)  # [vectors, chunk]
            offloaded = (mine @ kind_host + chunk_host) @ held.T if len(held) else np.zeros((len(counts), 1))
            out.append(idle[:, None] + offloaded)
        return out

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
        held = counts.sum(axis=-1) > 0  # [K, stage] stages holding a layer (ZeRO-3's first gather)
        rest_f, rest_b = self.gather_rest_s(counts)
        backward = counts @ self.backward_s + self.const_backward_s + held * self.first_backward_s + self.window_s(counts, recomputed) + rest_b
        if recomputed is not None:
            backward = backward + recomputed @ self.recompute_s
        return (counts @ self.forward_s + self.const_forward_s + held * self.first_forward_s + rest_f).T, backward.T

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

    def rank_held_floor_s(self, most: int) -> np.ndarray | None:
        """[rank, total 0..most] the least seconds per micro-batch that a rank's chunks holding a
        layer add to its busy time beyond the per-layer and per-stage linear terms (ZeRO-3's
        exposed first gather, the gradient windows' rest: what without_stage_jumps leaves out),
        over every split of its total T over its chunks: min over t (sum t = T) of sum_s g_s(t_s),
        a DP over the chunks, with g_s(t) the stage's seconds beyond the linear terms with t
        layers on a rank of T and 0 where t = 0 (an empty chunk may run outside a rank's segment:
        rank_order_region). The windows' rest depends on the rank's compute between two windows
        (its gap), which with one kind of layer is its total's, so g_s depends on (t, T) alone.
        None where it does not: more than one kind of layer, a stage's prefetch overlap that
        depends on whether it holds a layer, or recompute under the windows (recomputed layers
        widen the gap, which may shorten them); and where nothing is left out (all zero: ZeRO-2
        without DP overlap, whose windows are linear).
        Llama 3 405B cp 2 under ZeRO-2 (two windows per stage): the rest is 0.85% of a layer's
        time per stage, which the ranks' busy time must carry to see the even split's."""
        if len(self.runs) != 1 or self.without_stage_jumps() is None:
            return None
        w = self.windows
        if w is not None and (self.recompute or np.any(w.used_first) or self.gathers is not None):
            return None
        pp, stages = self.ctx.pp, self.stages
        cache = self.__dict__.setdefault("_held_floor_cache", {})  # the rows of the totals computed so far
        if "floor" in cache and (cache["floor"] is None or cache["floor"].shape[1] > most):
            return None if cache["floor"] is None else cache["floor"][:, :most + 1]
        floor = np.zeros((pp, most + 1))
        for r, mine in enumerate(self.ctx.stages_of):
            mine = [int(s) for s in mine]
            # g[T][j, t]: stage mine[j] with t layers, the rank's other T - t on one other chunk of its own
            layouts, where = [], []
            for total in range(1, most + 1):
                for j, s in enumerate(mine):
                    for t in range(1, total + 1):
                        if t < total and len(mine) == 1:
                            continue
                        counts = np.zeros(stages, dtype=np.int64)
                        counts[s] = t
                        if t < total:
                            counts[mine[(j + 1) % len(mine)]] = total - t
                        layouts.append(counts)
                        where.append((total, j, t, s))
            if not layouts:
                continue
            counts = np.array(layouts)[:, :, None]
            forward, backward = self.times(counts)
            linear = counts @ (self.forward_s + self.backward_s) + (self.const_forward_s + self.const_backward_s)[None, :]
            beyond = forward.T + backward.T - linear  # [K, stage]
            beyond = np.where(beyond > 1e-9 * float(self.forward_s[0] + self.backward_s[0]), beyond, 0.0)  # float dust: 0 (a lower floor)
            g = np.full((most + 1, len(mine), most + 1), np.inf)
            g[:, :, 0] = 0.0
            for k, (total, j, t, s) in enumerate(where):
                g[total, j, t] = beyond[k, s]
            for total in range(1, most + 1):
                best = np.full(total + 1, np.inf)  # least over the chunks so far, by the layers they hold
                best[0] = 0.0
                for j in range(len(mine)):
                    best = np.array([min(best[a] + g[total, j, b - a] for a in range(b + 1)) for b in range(total + 1)])
                floor[r, total] = best[total]
        cache["floor"] = floor if floor.any() else None
        return cache["floor"]

    def rank_rows(self, counts: np.ndarray, recomputed: np.ndarray | None = None) -> list[np.ndarray]:
        """Per rank, [K, 1 + vectors] the peak bytes of each memory row (rank_memory_terms):
        the optimizer transient's, then each in-flight vector's; the rank's peak is their max.
        Recomputed layers keep their input instead of their activations and add the working
        set of the largest kind the rank recomputes (stage_layout.recompute_working_bytes)."""
        out = []
        for r, (base0, base, trans0, trans, head, chunk_act) in enumerate(self.memory):
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
            activations = chunk_bytes @ held.T + (held @ chunk_act)[None, :] + head + working + self.most_held(self.in_transit[r], mine)[:, None]
            out.append((fixed + self.most_held(self.largest[r], mine))[:, None] + (1 + self.frag) * np.concatenate([transient[:, None], activations], axis=1))
        return out

    def most_held(self, per_kind: np.ndarray, mine: np.ndarray) -> np.ndarray:
        """[K] the most of `per_kind` ([kind] bytes: a rank's largest or in_transit) over the
        kinds a rank holds, from its run counts [K, chunk, run]."""
        values = per_kind[self.kind_of_run]  # [run]
        held = mine.sum(axis=1) > 0  # [K, run]
        return (held * values).max(axis=1, initial=0.0)

    def most_layers(self) -> np.ndarray:
        """[stage] the most layers a stage holds in any layout that fits: its rank's fixed bytes
        and, in the in-flight row that holds its chunk most, its activations, per layer of the
        kind cheapest at that (what recompute drops off included), against the room the rank's
        constant leaves (rank_rows' terms; the rest of the row >= 0, so a lower bound on the
        peak)."""
        out = np.full(self.stages, len(self.ctx.kind_of_layer), dtype=np.int64)
        kinds = sorted(set(self.kind_of_run.tolist()))
        act = self.u["kind_activation"] - (self.u["kind_dropped"] if self.recompute else 0.0)
        for r, (base0, base, trans0, trans, head, _) in enumerate(self.memory):
            if min(base[k] for k in kinds) < 0:
                continue  # a layer elsewhere on the rank could lower its peak: no bound from it
            held = np.asarray(self.ctx.held[r], dtype=float)
            for c, s in enumerate(self.ctx.stages_of[r]):
                top = float(held[:, c].max(initial=0.0))
                per_layer = min(float(base[k] + (1 + self.frag) * top * max(act[k], 0.0)) for k in kinds)
                if per_layer > 0:
                    out[s] = min(out[s], max(int(math.floor((self.capacity - base0) / per_layer)), 0))
        return out

    def rank_total_rows(self, rank: int, spread: int | None = None) -> tuple[np.ndarray, float, np.ndarray, list] | None:
        """A rank's memory in its per-kind layer totals alone, below its peak in every layout
        (without recompute) whose chunks on the rank differ by at most `spread` layers (None:
        any): (fixed bytes per layer of each kind [kind], the transient row's constant and
        [kind] per layer, and in-flight rows, each ([n] bytes at a total of n layers, [kind]
        bytes per layer of each kind); the constants hold the rank's fixed bytes base_0). The
        rank fits only where
            fixed . totals + transient_0 + transient . totals <= capacity, and for every row
            fixed . totals + in_flight[n] + per_kind . totals <= capacity.
        rank_rows' terms, the largest layer's bytes and those in transit (>= 0) left out. An
        in-flight vector h holds sum_c h_c sum_k act_k t_ck of activations (t_ck: chunk c's
        layers of kind k), at least G_h(n) = the least sum_c h_c t_c over the chunk counts the
        spread allows (the layers where h holds the fewest micro-batches) and between h_min and
        h_max per layer, so it is at least act_max G_h(n) - sum_k (act_max - act_k) h_max n_k
        (exact where the rank holds only the costliest kind, as DeepSeek-V3's
        MoE ranks) and at least act_min G_h(n) + sum_k (act_k - act_min) h_min n_k: a row per
        vector and form, less those another's dominates. None where a kind's fixed bytes
        are negative (a layer could then lower the peak) or the skeleton recomputes (its tables
        price that)."""
        cache = self.__dict__.setdefault("_total_rows_cache", {})  # the same rows for every goal of a bisection
        if (rank, spread) not in cache:
            cache[rank, spread] = self._rank_total_rows(rank, spread)
        return cache[rank, spread]

    def _rank_total_rows(self, rank: int, spread: int | None) -> tuple[np.ndarray, float, np.ndarray, list] | None:
        """rank_total_rows, computed."""
        if self.recompute:
            return None
        base0, base, trans0, trans, head, chunk_act = self.memory[rank]
        kinds = sorted(set(self.kind_of_run.tolist()))
        if min(float(base[k]) for k in kinds) < 0:
            return None
        vp, n_layers = self.ctx.vp, len(self.ctx.kind_of_layer)
        act = np.zeros(len(self.ctx.kinds))
        act[kinds] = np.maximum(self.u["kind_activation"][kinds], 0.0)
        act_low, act_high = float(act[kinds].min()), float(act[kinds].max())
        held = np.asarray(self.ctx.held[rank], dtype=float)  # [vectors, chunk]
        fill = np.sort(held, axis=1)  # each vector's chunks, fewest micro-batches first
        total = fill.sum(axis=1)
        cap = n_layers if spread is None else spread
        least = np.full((len(held), n_layers + 1), np.inf)  # G_h(n)
        for n in range(n_layers + 1):
            # each chunk holds a..a + cap layers; the n - vp a above the floor go where the
            # vector holds the fewest micro-batches, up to cap each
            for a in range(0, n // vp + 1):
                extra = n - vp * a
                if extra > vp * cap:
                    continue
                full, part = divmod(extra, cap) if cap else (0, 0)
                value = a * total + cap * fill[:, :full].sum(axis=1) + (part * fill[:, full] if full < vp else 0.0)
                least[:, n] = np.minimum(least[:, n], value)
        scale = 1 + self.frag
        constant = base0 + scale * ((held @ chunk_act) + head)  # [vectors]
        mask = np.zeros(len(self.ctx.kinds), dtype=bool)
        mask[kinds] = True
        forms = [(constant[:, None] + scale * act_high * least, -held.max(axis=1), -scale * (act_high - act))]
        if act_low < act_high:
            forms.append((constant[:, None] + scale * act_low * least, held.min(axis=1), scale * (act - act_low)))
        rows = []
        for tables, weights, per_kind in forms:
            # a vector's row goes where no other's is as high at every total with as large a
            # kinds' term (a row per vector made the rank-totals solves 3x slower on DeepSeek-V3,
            # 288 element constraints, for the same bound)
            for j in range(len(held)):
                if not any((tables[i] >= tables[j]).all() and weights[i] >= weights[j] and (i < j or (tables[i] > tables[j]).any()
                                                                                         or weights[i] > weights[j])
                           for i in range(len(held)) if i != j):
                    rows.append((tables[j], np.where(mask, per_kind * abs(weights[j]), 0.0)))
        kind_bytes = np.where(mask, base, 0.0)
        kind_transient = np.where(mask, scale * trans, 0.0)
        return kind_bytes, float(base0 + scale * trans0), kind_transient, rows

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
            base = self.memory[r][1]
            for c, s in enumerate(mine):
                out[s] = base[k] + (1 + self.frag) * self.act[j] * self.ctx.held[r][:, c].max()
        return out

    def excess(self, counts: np.ndarray, recomputed: np.ndarray | None = None) -> np.ndarray:
        """[K, rank] bytes of each rank's peak over the capacity, plus its host memory's over the
        host share where the model has host terms (0 where both fit)."""
        over = np.stack([np.maximum(rows.max(axis=1) - self.capacity, 0.0) for rows in self.rank_rows(counts, recomputed)], axis=1)
        host = self.host_rows(counts)
        if host is not None:
            over = over + np.stack([np.maximum(rows.max(axis=1, initial=-np.inf) - self.host_capacity, 0.0) for rows in host], axis=1)
        return over

    def fits(self, counts: np.ndarray, recomputed: np.ndarray | None = None) -> np.ndarray:
        """[K] whether every rank's linear memory test passes (its host memory's too)."""
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
    rank that recomputes.
    With PyTorch pipelining's buffers per micro-batch (torchtitan: buffer_spread > 0) the
    optimizer-transient row counts buffers too, which recompute shrinks with the rank's in-flight
    count: there the rank may also be over through that row (at its most), either one."""
    base0, base, trans0, trans, head, chunk_act = lin.memory[rank]
    mine = [int(s) for s in ctx.stages_of[rank]]
    held = np.asarray(ctx.held[rank])
    top = held.max(axis=0) if len(held) else np.zeros(len(mine))
    act = lin.u["kind_activation"]
    scale = 1000.0 / BYTE_SCALE
    kinds = [int(k) for k in lin.kind_of_run]
    envelope = sum(coef * run_counts[s][j] for c, s in enumerate(mine) for j, k in enumerate(kinds)
                   if (coef := int(math.ceil((base[k] + (1 + lin.frag) * top[c] * act[k]) * scale))))
    # the largest layer's bytes at their most over the kinds (an upper bound: never misses a rank over)
    fixed = base0 + float(lin.largest[rank].max(initial=0.0)) + lin.buffer_spread[rank]
    envelope += int(math.ceil((fixed + (1 + lin.frag) * (head + top @ chunk_act)) * scale))
    over = int(math.floor(lin.capacity * scale)) + 1
    if lin.buffer_spread[rank] <= 0:  # the transient row does not depend on recompute: over there, over with it too
        model.Add(envelope >= over).OnlyEnforceIf(enforce)
        return
    transient = sum(coef * run_counts[s][j] for s in mine for j, k in enumerate(kinds)
                    if (coef := int(math.ceil((base[k] + (1 + lin.frag) * trans[k]) * scale))))
    transient += int(math.ceil((fixed + (1 + lin.frag) * trans0) * scale))
    by_activations, by_transient = model.NewBoolVar(f"over_act{rank}"), model.NewBoolVar(f"over_trans{rank}")
    model.Add(envelope >= over).OnlyEnforceIf(by_activations)
    model.Add(transient >= over).OnlyEnforceIf(by_transient)
    model.AddBoolOr([by_activations, by_transient]).OnlyEnforceIf(enforce)


class MemoryRows:
    """The rank memory test of LinearLayouts.rank_rows as CP-SAT rows over a layout model's
    layers of each kind-run per stage (and recomputed ones): per rank one row for the
    optimizer transient and one per in-flight vector h, in integer KiB (and, where the model has
    host terms, one host row per vector h, LinearLayouts.host_rows). A rank of interleaved
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
        self.needs = []  # per rank, where recompute_only_where_needed ran: 1 where the rank recomputes
        for r, (base0, base, trans0, trans, head, chunk_act) in enumerate(lin.memory):
            mine = [int(s) for s in ctx.stages_of[r]]
            kind_count = {k: [] for k in range(len(ctx.kinds))}
            for s in mine:
                for j, k in enumerate(kind_of_run):
                    kind_count[k].append(run_counts[s][j])
            base_expr = sum(int(round(base[k] / BYTE_SCALE)) * sum(v) for k, v in kind_count.items() if v) + int(round(base0 / BYTE_SCALE))
            trans_expr = sum(int(round(trans[k] / BYTE_SCALE)) * sum(v) for k, v in kind_count.items() if v) + int(round(trans0 / BYTE_SCALE))
            holds = {}  # kind -> y_k, 1 where the rank holds a layer of kind k

            def most_held(per_kind: np.ndarray, tag: str, r=r, kind_count=kind_count, holds=holds):
                """v >= per_kind[k] * y_k over the kinds (v only relaxes the rows upward from 0,
                so its least value is the max; rounded down, so that the rows stay relaxed)."""
                v = model.NewIntVar(0, int(per_kind.max() // BYTE_SCALE), f"{tag}{r}")
                for k, counts in kind_count.items():
                    if counts and per_kind[k] >= BYTE_SCALE:
                        if k not in holds:
                            holds[k] = model.NewBoolVar(f"holds{r}_{k}")
                            model.Add(sum(counts) <= n_layers * holds[k])
                        model.Add(v >= int(per_kind[k] // BYTE_SCALE) * holds[k])
                return v

            if lin.largest[r].any():  # the largest layer the rank holds (LinearLayouts.largest)
                base_expr = base_expr + most_held(lin.largest[r], "g")
            # offload's sets in transit and FCDA's chunk, in the in-flight rows only (LinearLayouts.in_transit)
            in_transit = most_held(lin.in_transit[r], "transit") if lin.in_transit[r].any() else 0
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
                const = int(round((head + h @ chunk_act) / BYTE_SCALE))
                self.rows[r, i] = base_expr * 1000 + scaled_frag * (act_expr + const + in_transit)
        self.bounds = {}  # a row's bound where it is not the GPU's (the host rows')
        if lin.host is not None:
            # host memory (LinearLayouts.host_rows) per rank and in-flight vector, in KiB with
            # the coefficients rounded down: a row never stricter than the exact score
            kind_host = u["kind_host"]
            host_budget = int(math.floor(lin.host_capacity / BYTE_SCALE))
            for r, (host0, per_kind, chunk_host) in enumerate(lin.host):
                mine = [int(s) for s in ctx.stages_of[r]]
                held = np.asarray(ctx.held[r], dtype=np.int64).reshape(-1, ctx.vp)
                for i, h in enumerate(held if len(held) else np.zeros((1, ctx.vp), dtype=np.int64)):
                    coef = {(s, j): int(math.floor((per_kind[k] + h[c] * kind_host[k]) / BYTE_SCALE))
                            for c, s in enumerate(mine) for j, k in enumerate(kind_of_run)}
                    self.rows[r, "host", i] = (sum(v * run_counts[s][j] for (s, j), v in coef.items() if v)
                                               + int(math.floor((host0 + h @ chunk_host) / BYTE_SCALE)))
                    self.bounds[r, "host", i] = host_budget
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
        argument, here over the search's own integer recompute counts). y_r is also at most
        the rank's recomputed layers (y_r = 1 exactly where it recomputes), which keeps the LP
        from pricing a rank's recompute at a fraction of y_r: DeepSeek-V3 on pp 16 x vp 2,
        free layouts with per-chunk recompute, split into the layouts that recompute nothing
        and those that do (solve_layout's parts, two then): certified within 10 s in 8 runs of
        16 (8.5-9.9 s), and in none of 3 without it (4.9-5.9% in 10 s); such runs vary that
        much because the search certifies just inside its time. The booleans are kept
        (`needs`, by rank) for solve_layout's parts."""
        model, lin, ctx = self.model, self.lin, self.ctx
        n_layers = len(ctx.kind_of_layer)
        for r in range(ctx.pp):
            y = model.NewBoolVar(f"needs_recompute{r}")
            recomputed = sum(rc_counts[s][j] for s in ctx.stages_of[r] for j in range(len(lin.kind_of_run)))
            model.Add(recomputed <= n_layers * y)
            model.Add(recomputed >= y)
            over_capacity_without_recompute(model, ctx, lin, r, run_counts, y)
            self.needs.append(y)

    def add(self, key) -> bool:
        """Bring one row into the model; whether it was new."""
        if key in self.added:
            return False
        self.added.add(key)
        self.model.Add(self.rows[key] <= self.bounds.get(key, self.budget * 1000))
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
        for r, values in enumerate(self.lin.host_rows(counts) or ()):
            for i in np.flatnonzero(values[0] > self.lin.host_capacity):  # the host rows it breaks
                new |= self.add((r, "host", int(i)))
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


def least_recompute(ctx: LayoutContext, lin: LinearLayouts, rank: int, most: int, spread: int | None = None) -> tuple[int, ...]:
    """The fewest layers rank `rank` must recompute to fit its memory when it holds L layers,
    for L = 0, 1, ... up to `most` or the first L that no recompute makes fit (the tuple ends
    there): over every split of the L layers among its chunks (with `spread`, the regular
    layouts' splits only: chunks within that many layers of each other) and every recompute
    count per chunk, its linear memory rows (rank_memory_terms, the in-flight vectors ctx.held, the
    working set once it recomputes anything). One kind of decoder layer; a small CP-SAT per L,
    its coefficients rounded so that it relaxes the rows (activations down, what recompute
    saves up, the room up), so every layout that fits recomputes at least this many layers on
    the rank. Non-decreasing in L, and so is fitting at all (the first L that fits no more ends
    the table): a layout with one layer fewer (a kept one, else a recomputed one, which keeps
    its input, over a KiB) still fits; with `spread`, taken from its fullest chunk, which keeps
    the split regular.
    The regular tables are what the regular search needs: on Llama 3 405B cp 1 the free split
    piles a rank's layers into its last chunk, which holds few micro-batches at the peak (ranks
    12-15 hold 12 layers recomputing none), where a regular split of 8 holds one in every chunk
    and ranks 12-15 recompute one each.
    Cost: one model per rank, whose layer total and row bounds are set for each L, solved
    without presolve; and an L whose value the previous L's answer plus one kept layer in some
    chunk already meets (it cannot be less: non-decreasing) takes no solve at all (Llama 3
    405B's 16 ranks: 2.4 s -> 0.7 s on 2 cores, 468 solves -> 329, the same tables)."""
    assert len(lin.runs) == 1
    assert spread is None or spread >= 1  # spread 0 splits only multiples of vp: not non-decreasing
    u, vp = lin.u, ctx.vp
    base0, base, trans0, trans, head, chunk_act = lin.memory[rank]
    k = int(lin.kind_of_run[0])
    act = int(u["kind_activation"][k] // BYTE_SCALE)
    dropped = int(-(-u["kind_dropped"][k] // BYTE_SCALE))
    working = int(u["kind_working"][k] // BYTE_SCALE)
    held = np.asarray(ctx.held[rank], dtype=np.int64)
    consts = [head + float(h @ chunk_act) for h in held]
    model = cp_model.CpModel()
    total = model.NewIntVar(0, most, "L")
    t = [model.NewIntVar(0, most, "") for _ in range(vp)]
    rc = [model.NewIntVar(0, most, "") for _ in range(vp)]
    model.Add(sum(t) == total)
    for c in range(vp):
        model.Add(rc[c] <= t[c])
    if spread is not None:
        fewest = model.NewIntVar(0, most, "")
        for c in range(vp):
            model.Add(t[c] >= fewest)
            model.Add(t[c] <= fewest + spread)
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

    out: list[int] = []
    witness = None  # the previous L's optimal (t, rc): layers and recomputed layers per chunk
    for n in range(most + 1):
        fixed = base0 + n * base[k] + (lin.largest[rank][k] if n else 0.0)
        if fixed + (1 + lin.frag) * (trans0 + n * trans[k]) > lin.capacity:  # recompute does not lower this row
            break
        room = (lin.capacity - fixed) / (1 + lin.frag)  # bytes the activations may take
        bounds = [int(math.floor((room - const) / BYTE_SCALE)) + 1 for const in consts]
        if witness is not None:
            # the previous answer with one more kept layer in some chunk: where one passes the
            # rows, this L needs no more recompute than the previous one
            w_t, w_rc = witness
            grown = [[x + (c == j) for j, x in enumerate(w_t)] for c in range(vp)]
            grown = [t_c for t_c in grown if spread is None or max(t_c) - min(t_c) <= spread]
            fits = [t_c for t_c in grown if all(v <= b for v, b in zip(loads(t_c, w_rc, int(sum(w_rc) > 0)), bounds))]
            if fits:
                witness = (fits[0], w_rc)
                out.append(out[-1])
                continue
        cp_solver.set_domain(model, total, n, n)
        floor = out[-1] if out else 0
        cp_solver.set_domain(model, floor_var, floor, floor)
        for room_var, bound in zip(rooms, bounds):
            cp_solver.set_domain(model, room_var, bound, bound)
        solver = cp_solver.cp_solver(random_seed=1)  # CP-SAT's default seed, which this solve always ran with
        solver.parameters.max_deterministic_time = 5.0
        # 17 variables: presolving them took longer than the search (Llama 3 405B's tables,
        # 16 ranks: 1.7 s -> 0.7 s on 2 cores, the same values)
        solver.parameters.cp_model_presolve = False
        status = cp_solver.solve(solver, model)
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
