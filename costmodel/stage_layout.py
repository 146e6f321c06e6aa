"""Heterogeneous pipeline layouts: which layers each (pipeline rank, virtual stage) chunk holds,
scored by the exact model (issue 11).

Why a layout of its own: Megatron's --decoder-first/last-pipeline-num-layers and the
embedding/loss-accounted split (costmodel.layout) can only move layers off the two edge ranks.
Megatron-Core's `--pipeline-model-parallel-layout` lets every virtual stage hold any number of
layers, e.g. DeepSeek-V3's "Et*3|(tt|)*29,m|L": E the embedding, t a decoder layer (dense or MoE
by its position in the model), m an MTP module, L the output head and loss; `|` separates the
pp*vp virtual stages in model order, stage s living on rank s % pp as its local chunk s // pp.

A `StageLayout` holds, per stage in model order, its decoder layers and MTP modules (the
embedding is always on stage 0, the head and loss on the last stage, as Megatron requires); the
layer kinds (dense, MoE, ...) of a stage follow from the model's layer order
(`StageLayout.kind_counts`).

Scoring (`score_layout`) reuses the per-kind layer costs the exact model computes once per
configuration (MPE's reuse, seed 002): a chunk's forward and backward time is the sum of its
layers' kind costs plus its edge modules (`chunk_times`, composed as costmodel.evaluate composes
a rank), and the pipeline time is the event-driven simulation of the schedule with those chunk
times (costmodel.schedule_sim, MoFa's digital twin): with heterogeneous chunks the rank-level
closed form (costmodel.pipeline: m * max_r R_r + (sum_r R_r - max_r R_r) / vp) misses ranks
waiting on each other by up to 38%, so it is reported (`closed_form_s`) but not used. The
layout search's objective starts from `critical_path_bound_s`, a lower bound on the simulated
makespan: the slowest rank's m micro-batches plus the chain of stages before it. Memory per
rank is costmodel.memory's ledger with the activations the rank really holds at its peak: the
schedule's op list says, at every forward, how many micro-batches of each local chunk are in
flight (`held_chunks`), and the peak is the largest sum of those chunks' activation bytes.
Exposed P2P is the skeleton's (layout-independent here: the P2P hops hide behind the mean
chunk). The step-level DP reduce and optimizer update are each rank's own (`rank_update_s`, as
costmodel.evaluate prices a rank class: the rank's parameters from its ledger, its cool-down
backward as the overlap window), the busiest rank's counting: a layout that piles layers on a
rank gives it more gradients to reduce (Llama 3 405B cp 1 on pp 16 x vp 8, 12 layers on rank 14:
0.50 s against the even split's 0.33 s). For a Megatron split it equals the exact model's term.
ZeRO-2/3's traffic inside the pipeline (FSDP's layer gathers, the earlier gradient windows'
reduce-scatters) is each stage's own (`zero_traffic_s`: the exact model's terms of a rank, applied
to the stage); the memory ledger is the rank's (sharded states, gathered layers, gradient window).

Per-stage full recompute (`StageLayout.recompute`): where the skeleton has full recompute (any
method and N), a layout says how many decoder layers of each stage are fully recomputed, its
first r (Megatron's block method, so their kinds follow from position). A recomputed layer
costs what the exact model charges under full recompute, read off the skeleton's own layer
costs (`LayoutContext.lc_full`, `unit_costs`): its backward re-runs its forward
(costmodel.evaluate's recompute term), it keeps only its input per in-flight micro-batch, and
while it is recomputed one layer's complete set is live (costmodel.memory's block-method
working set; once per rank, of the largest kind it recomputes). The other layers cost what the
skeleton without full recompute charges (`LayoutContext.cfg_plain`, whose ledger every rank's
peak is read from). A layout recomputing min(N, layers) of every stage scores as the
configuration with block N, and one recomputing nothing as recompute none
(tests/unit/test_stage_layout.py).
Megatron takes one --recompute-num-layers for every chunk: `StageLayout.uniform_recompute`
says which N a layout's counts are, if any.

Supported skeletons: every schedule costmodel.schedule_sim builds op lists for (1f1b,
interleaved_1f1b, Llama 3's flexible with its nc micro-batches per round, afab / looped GPipe,
dualpipev: a layout is scored on the skeleton's own op lists and in-flight vectors, so on
Megatron's split it is the exact model under each of them), ZeRO 0-3 (the layout search, whose
linear model holds ZeRO-2/3's per-stage traffic only with one gradient window per stage, ZeRO-3
kept after the forward and one kind of decoder layer, refuses the rest:
optimizer.layout_linear.check_linear), activation offload (in_flight_bytes: MoFa's
whole layer keeps each chunk in flight's input, an empty chunk's too, and Megatron's modules the
rest of each layer; both two layers' offloaded sets in transit, once per rank; the host memory
the offloaded activations take is each rank's, checked against its share of the node's:
rank_host_bytes), MemFine's FCDA chunks (one chunk of a layer's expert tensors alive while it
runs, once per rank; MACT's "auto" count resolved for the configuration's own split), except
under full recompute, where the exact model holds the chunk in the recomputed layer's working set
and a layout recomputes only some layers: `check_supported` refuses that with the reason.

DualPipeV (`StageLayout.vee`): rank r holds stages r and 2pp - 1 - r (its V), so rank 0 holds
the embedding's stage and the head's. Its op lists are DeepSeek's order as PyTorch ports it
(schedule_sim.dualpipev_ops: overlapped forward/backward pairs run as one op, weight gradients
deferred), simulated with each stage's weight-gradient part split off its backward
(`stage_weights`); every rank's in-flight vectors come from the same replay. On the V split it
reproduces the exact model's peak, DP/update and exposed P2P (tests/unit/test_stage_layout.py);
where rank 0's two stages differ (DeepSeek-V3: dense layers and the embedding on one, MTP and
the head on the other) it is finer than the exact model, which holds 2pp + 1 mean chunks in
flight there and the replay mostly the first stage's (8 of 9 on pp 4). solve_layout does not
search it (optimizer.layout_search.check_searchable); vee_layout_search does (a local search on
the V's schedule graph, then CP-SAT rounds over its path cuts, certified by this scorer), and
`mofa evaluate --pipeline-layout` scores one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from costmodel.compute import ComputeModel
from costmodel.configs import MOE_CHUNKS_AUTO, PP_SCHEDULE_CODES, ConfigBatch
from costmodel.evaluate import evaluate, kind_of_layers, layer_costs, mact, model_kinds, mtp_kind
from costmodel.memory import MemoryContext, communicator_count, memory_context, rank_memory, rank_params
from costmodel.network import Network
from costmodel.pipeline import RankLayers, grad_windows, pipeline_compute_s, pipeline_time, simulated_schedule, stage_sizes
from costmodel.placement import stage_groups
from costmodel.schedule_sim import CompiledSchedule, compile_schedule, flat_ops, schedule_ops, simulate
from costmodel.specs import Problem
from costmodel.units import DTYPE_BYTES, US
from costmodel.update import (cooldown_passes, optimizer_time, reduce_scatter_grads, window_compute_s, windows_exposed, zero3_gathers,
                              zero3_gathers_per_step)

SYMBOLS = "EtmL"


class LayoutError(ValueError):
    """A layout string or count list that Megatron would not accept, or that does not fit the
    model; the message names the problem in one line."""


class StageLayout(BaseModel):
    """Decoder layers and MTP modules of every virtual stage, in model order (pp*vp stages;
    stage s on rank s % pp, local chunk s // pp; under DualPipeV's V, `vee`, stage s < pp on
    rank s and stage s >= pp on rank 2pp - 1 - s, its local chunk 1)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pp: int
    vp: int
    decoders: tuple[int, ...]
    mtp: tuple[int, ...]
    # decoder layers of each stage fully recomputed: its first r (Megatron's block method), so
    # their kinds follow from position; () means none anywhere (filled with zeros)
    recompute: tuple[int, ...] = ()
    # DualPipeV's placement (vp = 2): rank r holds stages r and 2pp - 1 - r, so rank 0 holds the
    # embedding's stage and the head's (torchtitan's "v" stage style); the layout string is the
    # same model-order notation, the schedule says where its stages run
    vee: bool = False

    @model_validator(mode="before")
    @classmethod
    def _no_recompute(cls, data):
        if isinstance(data, dict) and not data.get("recompute"):
            data = {**data, "recompute": (0,) * len(data.get("decoders", ()))}
        return data

    @model_validator(mode="after")
    def _check(self):
        stages = self.pp * self.vp
        if self.pp < 1 or self.vp < 1:
            raise LayoutError(f"pp and vp must be >= 1, got pp={self.pp} vp={self.vp}")
        if len(self.decoders) != stages or len(self.mtp) != stages:
            raise LayoutError(f"a layout of pp={self.pp} x vp={self.vp} needs {stages} stages, got {len(self.decoders)}")
        if self.vee and self.vp != 2:
            raise LayoutError(f"DualPipeV's V holds two stages per rank, got vp={self.vp}")
        if min(self.decoders) < 0 or min(self.mtp) < 0:
            raise LayoutError("layer counts must be >= 0")
        if len(self.recompute) != stages or any(not 0 <= r <= n for r, n in zip(self.recompute, self.decoders)):
            raise LayoutError(f"recompute counts must be one per stage, each between 0 and the stage's decoder layers: {self.recompute}")
        last_decoder = max((s for s, n in enumerate(self.decoders) if n), default=-1)
        first_mtp = min((s for s, n in enumerate(self.mtp) if n), default=stages)
        if first_mtp < last_decoder:
            raise LayoutError(f"MTP modules follow the decoder layers: stage {first_mtp} holds one before stage {last_decoder}'s decoder layers")
        return self

    @property
    def stages(self) -> int:
        return self.pp * self.vp

    @property
    def num_layers(self) -> int:
        return sum(self.decoders)

    @property
    def mtp_layers(self) -> int:
        return sum(self.mtp)

    def rank_of(self, stage: int) -> int:
        return stage_ranks(self.pp, self.vp, self.vee)[stage]

    def rank_stages(self, rank: int) -> np.ndarray:
        """The rank's stages in local-chunk order."""
        return rank_stages(self.pp, self.vp, self.vee)[rank]

    def kind_counts(self, kind_of_layer: list[int], num_kinds: int) -> np.ndarray:
        """[stage, kind] decoder layers of each kind (the model's layers in order; MTP apart)."""
        if len(kind_of_layer) != self.num_layers:
            raise LayoutError(f"the layout holds {self.num_layers} decoder layers, the model has {len(kind_of_layer)}")
        edges = np.concatenate([[0], np.cumsum(self.decoders)])
        kinds = np.asarray(kind_of_layer)
        return np.array([np.bincount(kinds[edges[s]:edges[s + 1]], minlength=num_kinds) for s in range(self.stages)], dtype=float).reshape(self.stages, num_kinds)

    def recompute_kind_counts(self, kind_of_layer: list[int], num_kinds: int) -> np.ndarray:
        """[stage, kind] fully recomputed decoder layers of each kind: a stage's first
        `recompute[s]` layers (Megatron's block method)."""
        edges = np.concatenate([[0], np.cumsum(self.decoders)])
        kinds = np.asarray(kind_of_layer)
        return np.array([np.bincount(kinds[edges[s]:edges[s] + self.recompute[s]], minlength=num_kinds) for s in range(self.stages)],
                        dtype=float).reshape(self.stages, num_kinds)

    @property
    def any_recompute(self) -> bool:
        return any(self.recompute)

    def uniform_recompute(self) -> int | None:
        """The one --recompute-num-layers N (block method) that gives every stage this layout's
        recompute counts, r_s = min(N, layers_s); the smallest such N, None where no N does
        (Megatron takes one N for every chunk)."""
        candidates = {r for r, n in zip(self.recompute, self.decoders) if r < n}
        if len(candidates) > 1:
            return None
        n = candidates.pop() if candidates else max(self.recompute, default=0)
        return n if all(r == min(n, d) for r, d in zip(self.recompute, self.decoders)) else None

    def with_recompute(self, recompute) -> "StageLayout":
        """This layout with these per-stage recompute counts (LayoutError where a count is
        negative or above its stage's layers)."""
        recompute = tuple(int(r) for r in recompute)
        if len(recompute) != self.stages or any(not 0 <= r <= n for r, n in zip(recompute, self.decoders)):
            raise LayoutError(f"recompute counts must be one per stage, each between 0 and the stage's decoder layers: {recompute}")
        return StageLayout(pp=self.pp, vp=self.vp, decoders=self.decoders, mtp=self.mtp, recompute=tuple(int(r) for r in recompute), vee=self.vee)

    def to_megatron(self) -> str:
        """Megatron-Core's --pipeline-model-parallel-layout, every stage written out."""
        parts = []
        for s in range(self.stages):
            text = ("E" if s == 0 else "") + "t" * self.decoders[s] + "m" * self.mtp[s] + ("L" if s == self.stages - 1 else "")
            parts.append(text)
        return "|".join(parts)

    @classmethod
    def from_megatron(cls, text: str, pp: int, vp: int, vee: bool = False) -> "StageLayout":
        """Parse Megatron-Core's layout string: stages separated by `|`, symbols E t m L,
        `X*n` repeating one symbol and `(...)*n` a group; spaces and commas are ignored. `vee`:
        the stages run in DualPipeV's V (the string is the same, in model order)."""
        expanded = re.sub(r"[\s,]", "", text)
        for _ in range(64):  # nested groups expand inside out
            new = re.sub(r"\(([^()]*)\)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), expanded)
            if new == expanded:
                break
            expanded = new
        expanded = re.sub(r"([EtmL])\*(\d+)", lambda g: g.group(1) * int(g.group(2)), expanded)
        bad = sorted(set(expanded) - set(SYMBOLS + "|"))
        if bad:
            raise LayoutError(f"layout {text!r}: unknown symbol {bad[0]!r} (Megatron's are E, t, m, L, |, (...)*n)")
        stages = expanded.split("|")
        if len(stages) != pp * vp:
            raise LayoutError(f"layout {text!r} has {len(stages)} stages, pp={pp} x vp={vp} needs {pp * vp}")
        for s, stage in enumerate(stages):
            if "E" in stage and (s != 0 or not stage.startswith("E") or stage.count("E") > 1):
                raise LayoutError(f"layout {text!r}: the embedding E must open the first stage")
            if "L" in stage and (s != len(stages) - 1 or not stage.endswith("L") or stage.count("L") > 1):
                raise LayoutError(f"layout {text!r}: the loss L must close the last stage")
            if re.search(r"m.*t", stage):
                raise LayoutError(f"layout {text!r}: stage {s} has an MTP module before a decoder layer")
        if not stages[0].startswith("E") or not stages[-1].endswith("L"):
            raise LayoutError(f"layout {text!r}: the first stage must hold E and the last stage L")
        return cls(pp=pp, vp=vp, decoders=tuple(st.count("t") for st in stages), mtp=tuple(st.count("m") for st in stages), vee=vee)

    @classmethod
    def from_stage_sizes(cls, pp: int, vp: int, sizes, mtp_layers: int, vee: bool = False) -> "StageLayout":
        mtp = [0] * (pp * vp)
        mtp[-1] = mtp_layers
        return cls(pp=pp, vp=vp, decoders=tuple(int(n) for n in sizes), mtp=tuple(mtp), vee=vee)


@functools.lru_cache(maxsize=256)
def stage_ranks(pp: int, vp: int, vee: bool = False) -> tuple[int, ...]:
    """The rank of every stage (model order): s % pp, or DualPipeV's V (s < pp on rank s, the
    rest back down: rank 2pp - 1 - s)."""
    return tuple((s if s < pp else 2 * pp - 1 - s) if vee else s % pp for s in range(pp * vp))


@functools.lru_cache(maxsize=256)
def rank_stages(pp: int, vp: int, vee: bool = False) -> tuple[np.ndarray, ...]:
    """Each rank's stages in local-chunk order (stage s is local chunk s // pp under either
    placement): np.arange(r, pp * vp, pp), or (r, 2pp - 1 - r) under the V."""
    ranks = np.array(stage_ranks(pp, vp, vee))
    return tuple(np.flatnonzero(ranks == r) for r in range(pp))


def megatron_layout(num_layers: int, mtp_layers: int, pp: int, vp: int, first: int, last: int, vee: bool = False) -> StageLayout:
    """The layout Megatron builds from first/last-rank layer counts (costmodel.pipeline.stage_sizes,
    the model's own reading of --decoder-first/last-pipeline-num-layers and the embedding/loss
    accounting); MTP modules on the last stage. `vee`: DualPipeV's split of the same counts
    (rank 0 holding the first and the last stage, as torchtitan's flags build it)."""
    sizes, _ = stage_sizes(num_layers, pp, vp, first, last, vee)
    if sizes.sum() != num_layers or sizes.min() < 0:
        raise LayoutError(f"first={first} last={last} does not split {num_layers} layers over pp={pp} x vp={vp}")
    return StageLayout.from_stage_sizes(pp, vp, sizes, mtp_layers, vee)


def balanced_layout(num_layers: int, mtp_layers: int, pp: int, vp: int) -> StageLayout:
    """Layers spread over the stages by count alone, the remainder on the middle stages: what
    an even split becomes when pp*vp does not divide the layer count."""
    stages = pp * vp
    base, extra = divmod(num_layers, stages)
    start = (stages - extra) // 2
    sizes = [base + (start <= s < start + extra) for s in range(stages)]
    return StageLayout.from_stage_sizes(pp, vp, sizes, mtp_layers)


# ---------------------------------------------------------------------------------------------
# The in-flight chunks of each rank


@functools.lru_cache(maxsize=64)
def held_chunks(schedule: str, pp: int, vp: int, microbatches: int, group: int | None = None) -> tuple[np.ndarray, ...]:
    """Per rank, the distinct vectors (over its local chunks) of micro-batches in flight right
    after each forward, those dominated by another removed: the rank's activation peak is the
    largest of them weighted by its chunks' activation bytes. Replays schedule_sim's op lists."""
    ops = schedule_ops(schedule, pp, vp, microbatches, group)
    out = []
    for rank, rank_ops in enumerate(ops):
        held = np.zeros(vp, dtype=np.int64)
        seen = set()
        for op in flat_ops(rank_ops):  # a group's forward counted before its backward (schedule_sim's rule)
            c = op.stage // pp
            if op.kind == "F":
                held[c] += 1
                seen.add(tuple(held))
            elif op.kind == "B":
                held[c] -= 1
        vectors = np.array(sorted(seen))
        # v is dominated where some w holds at least as many of every chunk (and they differ: the
        # set holds each once); compared a block of rows at a time, to bound the memory at large m
        dominated = np.concatenate([(vectors[None, :, :] >= vectors[i:i + 256, None, :]).all(axis=2).sum(axis=1) > 1
                                    for i in range(0, len(vectors), 256)])
        out.append(vectors[~dominated])
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Scoring


@dataclasses.dataclass(frozen=True)
class LayoutContext:
    """Everything of one skeleton configuration (a one-row ConfigBatch) that every layout of it
    shares: the per-kind layer costs (computed once), the memory context, the micro-batches,
    the step's non-pipeline terms."""

    problem: Problem
    cfg: ConfigBatch  # the skeleton
    cfg_plain: ConfigBatch  # the skeleton without full recompute: what the memory ledger of a layout reads
    lc: object  # per-kind costs of layers that keep their activations (cfg_plain's)
    lc_full: object | None  # per-kind costs under the skeleton's full recompute (None: the skeleton has none, nothing is recomputed)
    kinds: list
    kind_of_layer: list[int]
    mtp_kind: int | None
    microbatches: int
    chunk_overhead_s: float
    mc: MemoryContext
    communicators: np.ndarray
    hop_s: float
    held: tuple[np.ndarray, ...]
    schedule: CompiledSchedule  # the skeleton's schedule, its op lists resolved once (schedule_sim.compile_schedule)
    net: Network  # what each rank's DP reduce and optimizer update are priced on (rank_update_s)
    groups: object  # costmodel.placement.stage_groups of the skeleton
    # (GPU bytes per layer of each kind, host bytes per layer of each kind, GPU bytes per chunk
    # whatever its layers) of one micro-batch in flight: in_flight_bytes, read off the ledger once
    in_flight: tuple | None = None

    @property
    def pp(self) -> int:
        return int(self.cfg.pp[0])

    @property
    def ops(self) -> tuple:
        """schedule_sim's op lists of the skeleton's schedule, one per rank."""
        return self.schedule.ops

    @property
    def recompute_allowed(self) -> bool:
        """Whether layouts may fully recompute layers: the skeleton has full recompute (any
        method and N), which the layout replaces by its per-stage counts."""
        return self.lc_full is not None

    @property
    def vp(self) -> int:
        return int(self.cfg.vp[0])

    @property
    def mtp_on_last(self) -> tuple[int, ...]:
        """MTP modules per stage where the searches put them: all on the last stage (the rank
        with the head and loss; score_layout refuses them elsewhere)."""
        stages = self.pp * self.vp
        return (0,) * (stages - 1) + (self.problem.model.mtp_layers,)

    @property
    def vee(self) -> bool:
        """DualPipeV's V placement (StageLayout.vee): the skeleton's schedule."""
        return int(self.cfg.pp_schedule[0]) == PP_SCHEDULE_CODES["dualpipev"]

    @property
    def stages_of(self) -> tuple[np.ndarray, ...]:
        """Each rank's stages in local-chunk order (rank_stages)."""
        return rank_stages(self.pp, self.vp, self.vee)


def check_supported(cfg: ConfigBatch) -> None:
    """Refuse skeletons whose memory or time the per-chunk layout model does not cover. Every
    schedule is covered: a layout is scored on the skeleton's own op lists (schedule_ops)."""
    if cfg.moe_chunks[0] != 1 and cfg.derived().any_full_recompute:
        raise LayoutError("layout search does not model FCDA moe_chunks under full recompute")


def without_full_recompute(cfg: ConfigBatch) -> ConfigBatch:
    """The configuration with full recompute switched off (recompute none, no method, no N);
    every other field kept."""
    zero = np.zeros(len(cfg))
    columns = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
    full = cfg.recompute == 2
    columns.update(recompute=np.where(full, 0.0, cfg.recompute), recompute_method=np.where(full, 0.0, cfg.recompute_method),
                   recompute_layers=np.where(full, zero, cfg.recompute_layers))
    return ConfigBatch(**columns)


def in_flight_only(cfg: ConfigBatch) -> ConfigBatch:
    """The configuration whose memory ledger holds no activations but those of the micro-batches
    in flight: activation offload off, and FCDA's chunk of expert tensors alive while a layer runs
    left out (moe_chunks 1; layer costs computed under `cfg` keep their own); every other field
    kept. What optimizer.layout_linear.rank_memory_model reads its linear terms off, the sets
    offload and FCDA hold whatever the in-flight count apart."""
    columns = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
    columns.update(activation_offload=np.zeros_like(cfg.activation_offload), moe_chunks=np.ones_like(cfg.moe_chunks))
    return ConfigBatch(**columns)


def layout_context(problem: Problem, cfg: ConfigBatch) -> LayoutContext:
    """The shared part of scoring layouts of one configuration row."""
    if len(cfg) != 1:
        raise ValueError("layout_context takes one configuration")
    auto = cfg.moe_chunks == MOE_CHUNKS_AUTO
    if auto.any():  # MemFine's MACT: the chunk count the configuration's own split needs, fixed for its layouts
        cfg = mact(problem, cfg, auto)
    check_supported(cfg)
    m, tr, hw, cl = problem.model, problem.training, problem.hardware, problem.cluster
    base = evaluate(problem, cfg)
    micro = float(base.microbatches[0])
    if micro != int(micro) or micro < 1:
        raise LayoutError(f"the configuration runs {micro} micro-batches per step: not an integer")
    # a layout's layers are either recomputed or keep their activations: the costs of both kinds
    # come from the exact model, on the skeleton as it is (full recompute) and without it
    full = cfg.derived().any_full_recompute
    plain = without_full_recompute(cfg) if full else cfg
    lc = layer_costs(problem, plain)
    lc_full = layer_costs(problem, cfg) if full else None
    kinds = model_kinds(m, tr)
    net = Network(hw, cl)
    groups = stage_groups(cl.placement, cfg, net, experts=m.moe is not None)
    mc = memory_context(problem)
    pp, vp = int(cfg.pp[0]), int(cfg.vp[0])
    sim_schedule, sim_group = simulated_schedule(cfg, 0)
    held = held_chunks(sim_schedule, pp, vp, int(micro), sim_group)
    ctx = LayoutContext(
        problem=problem, cfg=cfg, cfg_plain=plain, lc=lc, lc_full=lc_full, kinds=kinds, kind_of_layer=kind_of_layers(m, tr),
        mtp_kind=kinds.index(mtp_kind(m, tr)) if m.mtp_layers else None, microbatches=int(micro),
        chunk_overhead_s=hw.efficiency.stage_overhead_us * US, mc=mc, communicators=communicator_count(cfg, cfg.derived(), m.moe is not None),
        hop_s=float(net.p2p_hop(lc.hop_bytes, groups.pp)[0]), held=held,
        schedule=compile_schedule(schedule_ops(sim_schedule, pp, vp, int(micro), sim_group)), net=net, groups=groups,
    )
    return dataclasses.replace(ctx, in_flight=in_flight_bytes(ctx))


@dataclasses.dataclass(frozen=True)
class LayoutScore:
    """A layout scored: per-stage (model order) forward and backward seconds of one
    micro-batch, per-rank work and peak memory, the pipeline and step time."""

    forward_s: np.ndarray  # [stage]
    backward_s: np.ndarray
    rank_work_s: np.ndarray  # [rank]
    peak_bytes: np.ndarray  # [rank]
    host_bytes: np.ndarray  # [rank] host memory at its most (rank_host_bytes)
    fits: bool  # every rank's peak within the GPU's memory and its host bytes within its share of the node's
    pipeline_s: float  # the simulated schedule's makespan + exposed P2P
    pp_exposed_s: float
    update_s: float  # the busiest rank's exposed DP communication and optimizer update (rank_update_s)
    step_time_s: float
    bound_s: float  # critical_path_bound_s: a lower bound on the makespan (the layout search's objective)
    closed_form_s: float  # costmodel.pipeline's rank-level closed form, for comparison


def _scalar(a) -> float:
    return float(np.asarray(a).ravel()[0])


def unit_costs(ctx: LayoutContext) -> dict:
    """Seconds and bytes per unit of each thing a stage can hold, as the exact model composes a
    rank (costmodel.evaluate): per layer kind its forward and forward+backward time and its
    activation bytes on the GPU and on the host per micro-batch in flight (in_flight_bytes;
    `chunk_activation`: what every chunk in flight keeps whatever its layers); the embedding's
    and the head's forward and both passes; one MTP module's
    extra (projection and its own head); the fixed overhead of a chunk. Linear in the counts,
    so the layout search uses these numbers directly.
    A fully recomputed layer of a kind, from the skeleton's costs under full recompute
    (ctx.lc_full) as costmodel.evaluate and costmodel.memory compose them: its backward re-runs
    its forward (`kind_recompute`: the extra over a plain layer's both passes), per micro-batch
    in flight it keeps its input instead of its activations (`kind_dropped`: the bytes it saves),
    and while its backward recomputes it, one layer's complete set is live (`kind_working`,
    once per rank: recompute_working_bytes). Zero where the skeleton has no full recompute."""
    lc = ctx.lc
    k_total = np.array([_scalar(k.total) for k in lc.kinds])
    k_act = np.array([_scalar(k.activation) for k in lc.kinds])
    gpu_act, host_act, chunk_act = ctx.in_flight
    if ctx.lc_full is not None:
        full = ctx.lc_full.kinds
        recompute = np.array([_scalar(k.total + k.forward) for k in full]) - k_total
        dropped = k_act - np.array([_scalar(k.input_bytes) for k in full])
        working = np.array([_scalar(k.saved_full) for k in full])
    else:
        recompute = dropped = working = np.zeros(len(lc.kinds))
    return {
        "kind_forward": np.array([_scalar(k.forward) for k in lc.kinds]),
        "kind_total": k_total,
        "kind_activation": gpu_act,
        "kind_host": host_act,
        "chunk_activation": chunk_act,
        "kind_recompute": recompute,
        "kind_dropped": dropped,
        "kind_working": working,
        "embedding_forward": _scalar(lc.embedding_f),
        "embedding_total": _scalar(lc.embedding_f + lc.embedding_b),
        "head_forward": _scalar(lc.head_forward),
        "head_total": _scalar(lc.head_compute + lc.head_tp),
        # DualPipeV's weight-gradient pass (inside the backward above): the layers' weight-gradient
        # GEMMs and the head's, as costmodel.evaluate splits it off
        "kind_weight": np.array([_scalar(k.weight_grad) for k in lc.kinds]),
        "head_weight": _scalar(lc.head_weight_grad),
        "mtp_extra": _scalar(lc.mtp_compute),
        "head_saved": _scalar(lc.head_saved),
        "overhead": ctx.chunk_overhead_s,
    }


def in_flight_bytes(ctx: LayoutContext) -> tuple[np.ndarray, np.ndarray, float]:
    """(GPU bytes per layer of each kind, host bytes per layer of each kind, GPU bytes per chunk
    whatever its layers) that one more micro-batch in flight of a chunk adds to a rank, read off
    costmodel.memory's ledger (activation_bytes) as differences in its in-flight count, so no rule
    of it is restated here: without offload a layer's activations; MoFa's whole-layer offload
    sends them to the host and keeps each in-flight chunk's input (Megatron's input_tensors list:
    an empty chunk's too); fine-grained offload sends the chosen modules' saved inputs and keeps
    the rest. What the ledger holds whatever the in-flight count (offload's two layers' sets in
    transit, FCDA's chunk of expert tensors) cancels out: a jump at a rank's first layer of a kind,
    optimizer.layout_linear.rank_memory_model."""
    kinds = len(ctx.kinds)
    if not ctx.cfg_plain.derived().any_offload:
        return np.array([_scalar(k.activation) for k in ctx.lc.kinds]), np.zeros(kinds), 0.0

    def added(counts) -> tuple[float, float]:
        """(GPU, host) bytes one chunk in flight adds to a middle rank holding `counts`."""
        busy, idle = (rank_ledger(ctx, counts, False, False, 0, n) for n in (1.0, 0.0))
        return _scalar(busy.activations - idle.activations), _scalar(busy.host - idle.host)

    chunk, _ = added(np.zeros(kinds))
    per_kind = [added(ctx.vp * np.eye(kinds)[k]) for k in range(kinds)]  # one layer of the kind in every chunk
    return np.array([gpu - chunk for gpu, _ in per_kind]), np.array([host for _, host in per_kind]), chunk


def stage_kind_counts(ctx: LayoutContext, layout: StageLayout) -> np.ndarray:
    """[stage, kind] layers of each kind on every stage, its MTP modules counted in their kind."""
    counts = layout.kind_counts(ctx.kind_of_layer, len(ctx.kinds))
    if ctx.mtp_kind is not None:
        counts[:, ctx.mtp_kind] += np.asarray(layout.mtp)
    return counts


def stage_weights(ctx: LayoutContext, layout: StageLayout) -> np.ndarray:
    """DualPipeV's weight-gradient seconds of one micro-batch of each stage (model order): the
    part of stage_times' backward that its W pass runs (costmodel.evaluate's `wgrad`)."""
    counts = stage_kind_counts(ctx, layout)
    u = unit_costs(ctx)
    return counts @ u["kind_weight"] + (np.arange(layout.stages) == layout.stages - 1) * u["head_weight"]


def stage_times(ctx: LayoutContext, layout: StageLayout) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of one micro-batch of each stage (model order), with
    ZeRO-2/3's traffic inside the pipeline where the skeleton shards gradients (zero_traffic_s)."""
    counts = stage_kind_counts(ctx, layout)
    first = np.arange(layout.stages) == 0
    last = np.arange(layout.stages) == layout.stages - 1
    recomputed = layout.recompute_kind_counts(ctx.kind_of_layer, len(ctx.kinds))
    mtp = np.asarray(layout.mtp, dtype=float)
    forward, backward = chunk_times(unit_costs(ctx), counts, mtp, first, last, recomputed)
    if ctx.cfg.derived().any_zero2:
        extra_f, extra_b = zero_traffic_s(ctx, counts, mtp, forward + backward)
        forward, backward = forward + extra_f, backward + extra_b
    return forward, backward


def zero_traffic_s(ctx: LayoutContext, counts: np.ndarray, mtp: np.ndarray, both_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ZeRO-2/3's data-parallel traffic inside the pipeline, per stage (model order), seconds per
    micro-batch added to its forward and its backward: costmodel.evaluate's terms of a rank
    (costmodel.update: zero3_gathers, window_traffic, window_compute_s), each stage priced on its
    own layers and parameters as a rank of one virtual stage. ZeRO-3 gathers a stage's layers,
    the first exposed and the rest prefetched behind the layer before (an empty stage gathers
    nothing), the embedding and the head with the stages that hold them; a stage's earlier
    gradient windows reduce-scatter its own gradients behind its rank's compute between two
    windows, less what the rank's prefetches overlap (one budget per rank, as the exact model
    keeps it). Where a rank's stages are alike the sums over them are the exact model's terms;
    where they differ (a first or last stage with the embedding or the head, a stage emptied by
    the layout) this is finer: a heavy stage's reduce-scatter hides less. counts: [stage, kind]
    layers of every stage in model order (MTP included); mtp: MTP modules per stage; both_s:
    each stage's forward + backward seconds without it (the compute the windows hide behind)."""
    terms = stage_zero_terms(ctx, counts, mtp)
    micro = float(ctx.microbatches)
    window = stage_windows_s(ctx, terms.reduce_scatter_s, both_s - 2.0 * unit_costs(ctx)["overhead"], terms.window_used)
    return terms.exposed_f / micro, terms.exposed_b / micro + window


@dataclasses.dataclass(frozen=True)
class StageZeroTerms:
    """zero_traffic_s' terms of each stage (model order) that depend on its own layers only."""

    exposed_f: np.ndarray  # ZeRO-3's gathers in the forward passes of one step, seconds
    exposed_b: np.ndarray  # and in the backward passes
    window_used: np.ndarray  # the compute its prefetches overlap in one step, seconds
    reduce_scatter_s: np.ndarray  # one reduce-scatter of its gradients, seconds


def stage_zero_terms(ctx: LayoutContext, counts: np.ndarray, mtp: np.ndarray) -> StageZeroTerms:
    """zero_traffic_s' per-stage terms of layer counts [stage, kind] and MTP modules [stage]."""
    lc, cfg, x = ctx.lc, ctx.cfg_plain, ctx.cfg_plain.derived()
    hw, tr = ctx.problem.hardware, ctx.problem.training
    moe = ctx.problem.model.moe is not None
    stages = len(counts)
    micro = np.array([float(ctx.microbatches)])
    windows = grad_windows(cfg, micro)
    first = np.arange(stages) == 0
    last = np.arange(stages) == stages - 1
    per_kind = [counts[:, k] for k in range(len(ctx.kinds))]
    # each stage's parameters as costmodel.memory composes a rank's: the embedding with stage 0,
    # the head and the MTP modules' projections with the stages holding them
    dense_s, expert_s = rank_params(RankLayers(per_kind, False, last), lc, ctx.mc.tied_embeddings, mtp)
    dense_s, expert_s = np.array(dense_s, dtype=float), np.array(expert_s, dtype=float)
    first_stage = rank_params(RankLayers([c[:1] for c in per_kind], True, last[:1]), lc, ctx.mc.tied_embeddings, mtp[:1])
    dense_s[0], expert_s[0] = _scalar(first_stage[0]), _scalar(first_stage[1])
    u = unit_costs(ctx)
    layers = counts.sum(axis=1)
    per_layer = np.maximum(layers, 1.0)
    zero = np.zeros(stages)
    exposed_f, exposed_b, used = zero, zero, zero
    d_para, d_grad = tr.bytes_of("params"), tr.bytes_of("grads")
    if x.any_zero3:
        expert_layer = counts @ np.array([_scalar(k.expert_params) for k in lc.kinds])
        dense_layer = counts @ np.array([_scalar(k.params) for k in lc.kinds]) - expert_layer
        edge_params = first * _scalar(lc.embedding_params) + last * _scalar(lc.head_params)
        gathers_f, gathers_b = zero3_gathers_per_step(cfg.reshard_after_forward, cfg.pp, micro, windows)
        f_layer = counts @ u["kind_forward"] / per_layer
        b_layer = counts @ u["kind_total"] / per_layer - f_layer
        gathers = zero3_gathers(dense_layer / per_layer, expert_layer / per_layer, edge_params, layers, gathers_f, gathers_b, 1.0, x, ctx.groups,
                                ctx.net, hw, d_para, f_layer, b_layer, moe)
        exposed_f, exposed_b, used = gathers.exposed_f + zero, gathers.exposed_b + zero, gathers.window_used + zero
    rs = reduce_scatter_grads(d_grad * dense_s, d_grad * expert_s, x, ctx.groups, ctx.net, moe) + zero
    return StageZeroTerms(exposed_f, exposed_b, used, rs)


def stage_windows_s(ctx: LayoutContext, reduce_scatter_s, compute_s, window_used_s) -> np.ndarray:
    """zero_traffic_s' gradient windows: seconds per micro-batch each stage's earlier windows add
    to its backward ([..., stage], model order; vectorized over leading axes). A stage's
    reduce-scatter hides behind its rank's compute between two windows (window_compute_s: the
    rank's compute of one step, `compute_s` per micro-batch of each of its stages without the
    chunk overheads, less what its prefetches overlap, `window_used_s` per stage)."""
    cfg, x = ctx.cfg_plain, ctx.cfg_plain.derived()
    micro = float(ctx.microbatches)
    windows = float(grad_windows(cfg, np.array([micro]))[0])
    rank_of = np.array(stage_ranks(ctx.pp, ctx.vp, ctx.vee))
    on_rank = (rank_of[:, None] == np.arange(ctx.pp)).astype(float)  # [stage, rank]
    gap = window_compute_s(micro, np.asarray(compute_s) @ on_rank, np.asarray(window_used_s) @ on_rank, windows, ctx.vp)
    return windows_exposed(reduce_scatter_s, 1.0, x, ctx.problem.hardware, windows, gap[..., rank_of]) / micro


def chunk_times(u: dict, counts: np.ndarray, mtp: np.ndarray, first: np.ndarray, last: np.ndarray,
                recomputed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of chunks with these [chunk, kind] layer counts (MTP
    layers included), MTP modules and edge modules, from `unit_costs`. As costmodel.evaluate
    composes a rank: the forward holds the layers' forwards, the embedding, the head's forward
    and one chunk overhead; the backward everything else, with the recompute of the
    [chunk, kind] `recomputed` layers."""
    forward = counts @ u["kind_forward"] + first * u["embedding_forward"] + last * u["head_forward"] + u["overhead"]
    total = counts @ u["kind_total"] + first * u["embedding_total"] + last * u["head_total"] + mtp * u["mtp_extra"] + 2.0 * u["overhead"]
    if recomputed is not None:
        total = total + recomputed @ u["kind_recompute"]
    return forward, total - forward


def recompute_working_bytes(u: dict, recomputed: np.ndarray) -> np.ndarray:
    """The working set a rank holds on top of its in-flight activations while a recomputed
    layer runs its backward: one layer's complete saved set, of the largest kind the rank
    recomputes (costmodel.memory's block-method `working`), 0 where it recomputes nothing.
    `recomputed`: [..., kind] the rank's recomputed layers."""
    return ((np.asarray(recomputed) > 0) * u["kind_working"]).max(axis=-1, initial=0.0)


def rank_ledger(ctx: LayoutContext, kind_counts: np.ndarray, first: bool, last: bool, mtp_layers: int, in_flight: float, lc=None,
                cfg: ConfigBatch | None = None):
    """costmodel.memory's ledger of one rank holding these layers (kind_counts over the model
    kinds, MTP layers included) with `in_flight` average chunks of activations (under ctx's
    cfg_plain, or `cfg`)."""
    lc = ctx.lc if lc is None else lc
    cfg = ctx.cfg_plain if cfg is None else cfg
    rank = RankLayers([np.array([float(c)]) for c in kind_counts], first, np.array([last]))
    return rank_memory(rank, np.array([float(in_flight)]), lc, cfg, cfg.derived(), ctx.mc, ctx.communicators, mtp_layers,
                       np.array([float(ctx.microbatches)]))


def rank_peak_bytes(ctx: LayoutContext, rank: int, chunks: np.ndarray, recomputed: np.ndarray, last: bool, mtp_layers: int) -> float:
    """The peak of rank_peak_ledger's ledger."""
    return _scalar(rank_peak_ledger(ctx, rank, chunks, recomputed, last, mtp_layers).peak)


def rank_peak_ledger(ctx: LayoutContext, rank: int, chunks: np.ndarray, recomputed: np.ndarray, last: bool, mtp_layers: int):
    """The exact ledger of a rank whose local chunks hold these [chunk, kind] layers
    (MTP included) and recompute these [chunk, kind] ones: its activations at the peak are the
    largest in-flight vector of ctx.held weighted by each chunk's bytes (a recomputed layer
    keeps its input, the others their activations; under activation offload what stays on the
    GPU, in_flight_bytes) plus the working set of a recomputed layer
    (recompute_working_bytes), handed to the ledger of ctx.cfg_plain (no recompute) as that
    many of the rank's mean chunks in flight. Its host memory is the mean chunk's (rank_host_bytes
    has each chunk's)."""
    u = unit_costs(ctx)
    kept = u["chunk_activation"] + chunks @ u["kind_activation"]  # [chunk] one micro-batch of each local chunk, nothing recomputed
    chunk_bytes = kept - recomputed @ u["kind_dropped"]
    held = float((ctx.held[rank] @ chunk_bytes).max()) + float(recompute_working_bytes(u, recomputed.sum(axis=0)))
    mean_chunk = kept.sum() / len(kept)
    in_flight = held / mean_chunk if mean_chunk > 0 else 0.0
    return rank_ledger(ctx, chunks.sum(axis=0), rank == 0, last, mtp_layers, in_flight)


def rank_host_bytes(ctx: LayoutContext, rank: int, chunks: np.ndarray, last: bool, mtp_layers: int) -> float:
    """Host memory a rank whose local chunks hold these [chunk, kind] layers (MTP included)
    uses at its most: its ledger's with nothing in flight (a CPU optimizer's states) plus its
    offloaded activations, the largest in-flight vector of ctx.held weighted by each chunk's
    offloaded bytes (unit_costs' kind_host)."""
    idle = rank_ledger(ctx, chunks.sum(axis=0), rank == 0, last, mtp_layers, 0.0)
    return _scalar(idle.host) + float((ctx.held[rank] @ (chunks @ unit_costs(ctx)["kind_host"])).max(initial=0.0))


def rank_update_s(ctx: LayoutContext, ledger, forward_s: float, backward_s: float) -> float:
    """Exposed DP communication and optimizer update of one rank (its ledger's parameters;
    forward_s / backward_s: one micro-batch over all its chunks), priced as costmodel.evaluate
    prices each rank class (costmodel.update.optimizer_time): the reduce of the rank's own
    gradients hides behind its cool-down backward, eq. 24's window of (vp - 1) * pp / vp rank
    passes interleaved, one pass otherwise. A layout that puts more layers on a rank gives it
    more to reduce and update, so the step's share is the busiest rank's, not the skeleton's."""
    return _scalar(rank_update_batch_s(ctx, ledger.dense_params, ledger.expert_params, forward_s, backward_s))


def rank_update_batch_s(ctx: LayoutContext, dense_params, expert_params, forward_s, backward_s) -> np.ndarray:
    """rank_update_s over arrays: ranks holding these parameters (dense, expert) and running
    these seconds of one micro-batch's forward / backward over their chunks."""
    cfg, tr, hw = ctx.cfg, ctx.problem.training, ctx.problem.hardware
    x = cfg.derived()
    cooldown = cooldown_passes(cfg, x)
    comp = ComputeModel(hw, tr.dtypes.compute, DTYPE_BYTES[tr.dtypes.compute], tr.attention_impl)
    dtypes = (tr.bytes_of("params"), tr.bytes_of("grads"), tr.bytes_of("optimizer"))
    ot = optimizer_time(np.asarray(dense_params, dtype=float), np.asarray(expert_params, dtype=float), x, ctx.groups, ctx.net, hw, dtypes,
                        comp, cooldown * np.asarray(backward_s, dtype=float), cooldown * np.asarray(forward_s, dtype=float), cfg.vp,
                        ctx.problem.model.moe is not None, tr.optimizer_impl)
    value = np.asarray(ot.dp_exposed + ot.update, dtype=float)
    return np.broadcast_to(value, np.broadcast(value, np.asarray(dense_params), np.asarray(forward_s)).shape)


#: the most (layer counts, recompute counts) pairs per rank that update_floor_s enumerates (arrays of
#: a few MB; DeepSeek-V3's 3 dense and 58 MoE layers make 56k); beyond it (a model with many
#: kinds of layers, under full recompute) the update term's floor is left at zero
FLOOR_PAIRS = 500_000


def step_overhead_floor_s(ctx: LayoutContext, least_recompute=None) -> float:
    """A lower bound on what any layout of the skeleton (any per-stage recompute) adds to its
    simulated makespan in the step: the exposed P2P (layout_pp_exposed, which reads the mean
    chunk: least over the model's recomputed layers of each kind) plus the busiest rank's DP
    reduce and update (rank_update_s: least, over every way of sharing the layers of each kind
    among the ranks, of the largest over the ranks, each rank at its least over its own
    recompute counts). Each term at its own least, so for every layout
        step >= makespan + this,
    and a makespan bound plus this bounds the step (the layout search's step gap: it minimises
    the makespan). Exact for the update term where the ranks' layer totals are its only
    freedom; it leaves out the per-stage limits, and memory unless `least_recompute` (see
    update_floor_s) is given, so it can be below every layout that fits. The embedding's rank,
    the head's and the MTP modules' (the last rank) are fixed."""
    return pp_exposed_floor_s(ctx) + update_floor_s(ctx, least_recompute)


def _decoder_grid(ctx: LayoutContext) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(decoder kinds, their layer totals, every vector of counts up to those totals [C, kinds])."""
    kinds = sorted(set(ctx.kind_of_layer))
    totals = np.bincount(np.asarray(ctx.kind_of_layer), minlength=len(ctx.kinds))[kinds]
    grid = np.indices(tuple(totals + 1)).reshape(len(kinds), -1).T
    return kinds, totals, grid


def pp_exposed_floor_s(ctx: LayoutContext) -> float:
    """The least exposed P2P of any layout (layout_pp_exposed): it reads the mean stage's
    forward, which every layout shares, and its backward, which grows with the recomputed
    layers; least over every count of recomputed layers of each kind."""
    u = unit_costs(ctx)
    kinds, totals, grid = _decoder_grid(ctx)
    stages = ctx.pp * ctx.vp
    mtp = ctx.problem.model.mtp_layers
    counts = np.zeros((1, len(ctx.kinds)))
    counts[0, kinds] = totals
    if ctx.mtp_kind is not None:
        counts[0, ctx.mtp_kind] += mtp
    forward, backward = chunk_times(u, counts, np.array([float(mtp)]), np.array([True]), np.array([True]))
    forward_s, backward_s = forward[0] + (stages - 1) * u["overhead"], backward[0] + (stages - 1) * u["overhead"]
    weight_s = float(counts[0] @ u["kind_weight"] + u["head_weight"]) if ctx.vee else 0.0
    recomputes = grid @ u["kind_recompute"][kinds] if ctx.recompute_allowed else np.zeros(1)
    mean = lambda total: np.full(stages, total / stages)  # noqa: E731
    return min(layout_pp_exposed(ctx, mean(forward_s), mean(backward_s + extra), np.zeros(stages), mean(weight_s) if ctx.vee else None)
               for extra in np.unique(recomputes))


def update_floor_s(ctx: LayoutContext, least_recompute=None) -> float:
    """The least, over every way of sharing the decoder layers of each kind among the ranks, of
    the busiest rank's DP reduce and update (rank_update_s), each rank at its least over the
    layers of each kind it may recompute: a bisection over the candidate values, each tested by
    a reachability pass over the ranks (which per-kind totals the ranks so far can hold with
    every one at or below it).
    `least_recompute` (one kind of decoder layer: per rank, the fewest layers it must recompute
    to fit at each layer total, the table ending at the first total that fits no more;
    optimizer.layout_linear.least_recompute) restricts every rank to what fits its memory, so
    the floor holds for the layouts that fit (Llama 3 405B cp 1 without recompute: memory
    piles up to 12 layers on the last ranks, 0.50 s against the 0.33 s of 8). Without it
    memory is left out."""
    u = unit_costs(ctx)
    kinds, totals, grid = _decoder_grid(ctx)
    k_all = len(ctx.kinds)
    stages = ctx.stages_of
    head_rank = next(r for r, st in enumerate(stages) if ctx.pp * ctx.vp - 1 in st)
    mtp_layers = ctx.problem.model.mtp_layers
    if ctx.recompute_allowed:  # (layers, recomputed) pairs: recomputed <= layers kind by kind
        if len(grid) ** 2 > FLOOR_PAIRS:
            return 0.0
        layer_of, again_of = np.nonzero((grid[None, :, :] <= grid[:, None, :]).all(axis=-1))
    else:
        layer_of, again_of = np.arange(len(grid)), np.zeros(len(grid), dtype=int)  # grid[0]: nothing recomputed
    if least_recompute is not None and len(kinds) != 1:
        raise ValueError("least_recompute tables are per layer total: one kind of decoder layer")
    values = []
    for r, st in enumerate(stages):
        first, last = bool(0 in st), r == head_rank
        mtp = mtp_layers if last else 0
        fixed = np.zeros(k_all)
        if ctx.mtp_kind is not None:
            fixed[ctx.mtp_kind] += mtp
        # a rank's parameters are linear in its layers of each kind (its ledger)
        base = rank_ledger(ctx, fixed, first, last, mtp, 0.0)
        slopes = [rank_ledger(ctx, fixed + np.eye(k_all)[k], first, last, mtp, 0.0) for k in kinds]
        dense = _scalar(base.dense_params) + grid @ np.array([_scalar(s.dense_params) - _scalar(base.dense_params) for s in slopes])
        expert = _scalar(base.expert_params) + grid @ np.array([_scalar(s.expert_params) - _scalar(base.expert_params) for s in slopes])
        counts = np.tile(fixed, (len(grid), 1))
        counts[:, kinds] += grid
        recomputed = np.zeros((len(layer_of), k_all))
        recomputed[:, kinds] = grid[again_of]
        n = len(layer_of)
        forward, backward = chunk_times(u, counts[layer_of], np.full(n, float(mtp)), np.full(n, first), np.full(n, last), recomputed)
        extra = (len(st) - 1) * u["overhead"]  # the rank's other chunks' overhead, one per pass
        each = rank_update_batch_s(ctx, dense[layer_of], expert[layer_of], forward + extra, backward + extra)
        if least_recompute is not None:  # a total the rank cannot fit, or fewer recomputed layers than it needs
            table = np.asarray(least_recompute[r], dtype=int)
            fits = layer_of < len(table)
            fits[fits] &= grid[again_of[fits], 0] >= table[layer_of[fits]]
            each = np.where(fits, each, np.inf)
        least = np.full(len(grid), np.inf)
        np.minimum.at(least, layer_of, each)
        values.append(least)
    values = np.array(values)  # [rank, layer-count vector]
    candidates = np.unique(values[np.isfinite(values)])

    shape = tuple(int(t) + 1 for t in totals)

    def reachable(cap: float) -> bool:
        """Whether the ranks, each holding a count vector whose value is at most `cap`, can hold
        every layer: the per-kind totals reachable rank by rank, a sum of sets (a convolution of
        their indicator arrays, by numpy's FFT: scipy.signal.fftconvolve's import alone took
        1.7 s; counts of ways, so 0.5 separates none from some)."""
        held = np.zeros(shape)
        held[(0,) * len(kinds)] = 1.0
        full = tuple(2 * n - 1 for n in shape)  # the convolution's shape: no wrap-around
        axes = tuple(range(len(full)))
        for r in range(len(stages)):
            allowed = (values[r] <= cap).reshape(shape).astype(float)
            ways = np.fft.irfftn(np.fft.rfftn(held, full, axes) * np.fft.rfftn(allowed, full, axes), full, axes)
            held = (ways[tuple(slice(0, n) for n in shape)] > 0.5).astype(float)
        return bool(held[tuple(n - 1 for n in shape)] > 0.5)

    if not reachable(candidates[-1]):  # no layout fits the tables: nothing to bound but the layouts memory aside
        return update_floor_s(ctx)
    lo, hi = 0, len(candidates) - 1  # the answer is a candidate: the busiest rank's value
    while lo < hi:
        mid = (lo + hi) // 2
        if reachable(candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(candidates[lo])


def rank_counts(ctx: LayoutContext, layout: StageLayout) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Per rank: kind counts (MTP included), MTP modules, and per local chunk kind counts."""
    counts = stage_kind_counts(ctx, layout)
    mine = [layout.rank_stages(r) for r in range(layout.pp)]
    per_rank = np.array([counts[st].sum(axis=0) for st in mine])
    mtp = np.array([int(np.asarray(layout.mtp)[st].sum()) for st in mine])
    chunks = [counts[st] for st in mine]
    return per_rank, mtp, chunks


def layout_ledgers(ctx: LayoutContext, layout: StageLayout) -> list:
    """Each rank's exact memory ledger under a layout (rank_peak_ledger of its chunks)."""
    last_rank = layout.rank_of(layout.stages - 1)
    per_rank, mtp, chunks = rank_counts(ctx, layout)
    recomputed = layout.recompute_kind_counts(ctx.kind_of_layer, len(ctx.kinds))
    return [rank_peak_ledger(ctx, r, chunks[r], recomputed[st], r == last_rank, int(mtp[r])) for r, st in enumerate(ctx.stages_of)]


def layout_host_bytes(ctx: LayoutContext, layout: StageLayout, ledgers: list) -> np.ndarray:
    """[rank] each rank's host memory at its most under a layout (rank_host_bytes; without
    activation offload its ledger's, `ledgers`: layout_ledgers)."""
    if not ctx.cfg_plain.derived().any_offload:
        return np.array([_scalar(ledger.host) for ledger in ledgers])
    last_rank = layout.rank_of(layout.stages - 1)
    _, mtp, chunks = rank_counts(ctx, layout)
    return np.array([rank_host_bytes(ctx, r, chunks[r], r == last_rank, int(mtp[r])) for r in range(layout.pp)])


def score_layout(ctx: LayoutContext, layout: StageLayout) -> LayoutScore:
    """The exact model's step time and per-rank peak memory of a heterogeneous layout."""
    pp, vp = ctx.pp, ctx.vp
    if (layout.pp, layout.vp) != (pp, vp):
        raise LayoutError(f"layout is pp={layout.pp} x vp={layout.vp}, the configuration pp={pp} x vp={vp}")
    if layout.mtp_layers != ctx.problem.model.mtp_layers:
        raise LayoutError(f"the layout holds {layout.mtp_layers} MTP modules, the model has {ctx.problem.model.mtp_layers}")
    if layout.vee != ctx.vee:
        raise LayoutError("the layout's placement is not the schedule's: DualPipeV runs its stages in a V, the others stage s on rank s % pp")
    last_rank = layout.rank_of(layout.stages - 1)
    if any(n and layout.rank_of(s) != last_rank for s, n in enumerate(layout.mtp)):
        raise LayoutError("MTP modules on a rank without the head and loss are not modelled: put them on the last rank")
    if layout.any_recompute and not ctx.recompute_allowed:
        raise LayoutError("the layout recomputes layers, the configuration has no full recompute")
    forward, backward = stage_times(ctx, layout)
    mine = ctx.stages_of
    work = np.array([(forward + backward)[st].sum() for st in mine])
    ledgers = layout_ledgers(ctx, layout)
    peaks = np.array([_scalar(ledger.peak) for ledger in ledgers])
    host = layout_host_bytes(ctx, layout, ledgers)
    rest = max(rank_update_s(ctx, ledger, forward[st].sum(), backward[st].sum()) for ledger, st in zip(ledgers, mine))
    f, b = per_chunk(forward, mine), per_chunk(backward, mine)
    if ctx.vee:  # the input-gradient pass and the deferred weight gradient (schedule_sim's split)
        weight = stage_weights(ctx, layout)
        w = per_chunk(weight, mine)
        makespan = simulate(ctx.schedule, f, b - w, 0.0, weight_s=w).makespan_s
    else:
        weight = np.zeros_like(forward)
        makespan = simulate(ctx.schedule, f, b, 0.0).makespan_s
    pp_exposed = layout_pp_exposed(ctx, forward, backward, work, weight)
    pipeline = makespan + pp_exposed
    fits = bool((peaks <= ctx.problem.hardware.memory_bytes).all() and (host <= ctx.mc.host_share_bytes).all())
    return LayoutScore(forward, backward, work, peaks, host, fits,
                       pipeline, pp_exposed, rest, pipeline + rest, critical_path_bound_s(f + b, ctx.microbatches, f if ctx.vee else None),
                       pipeline_compute_s(work, ctx.microbatches, vp))


def per_chunk(values: np.ndarray, stages_of) -> np.ndarray:
    """[pp, vp] per (rank, local chunk) from per-stage values (model order), each rank's stages
    in chunk order (LayoutContext.stages_of): schedule_sim's layout."""
    return np.array([values[st] for st in stages_of])


def critical_path_bound_s(chunk_s: np.ndarray, microbatches: int, forward_s: np.ndarray | None = None) -> float:
    """A lower bound on the makespan of the 1F1B-family schedules for any per-chunk times
    ([pp, vp] forward+backward seconds): rank r cannot start before the first micro-batch's
    forward has crossed stages 0..r-1 (local chunk 0 of ranks < r), then runs m * R_r of work,
    and its last op (the backward of chunk 0, last micro-batch) must still travel back through
    those stages:  max_r  sum_{r' < r} chunk_s[r', 0] + m * R_r.
    Equal to the makespan for uniform chunks ((m*vp + pp - 1)(F + B), Narayanan et al.); below
    it where heterogeneous chunks make ranks wait (tests/unit/test_stage_layout.py).
    `forward_s` given (DualPipeV, whose ranks end on deferred weight gradients, not on chunk 0's
    backward): the forward chain before each rank alone, max_r sum_{r' < r} forward_s[r', 0] + m * R_r."""
    chunk_s = np.asarray(chunk_s, dtype=float)
    chain = chunk_s if forward_s is None else np.asarray(forward_s, dtype=float)
    before = np.concatenate([[0.0], np.cumsum(chain[:, 0])[:-1]])
    return float((before + microbatches * chunk_s.sum(axis=1)).max())


def layout_pp_exposed(ctx: LayoutContext, forward: np.ndarray, backward: np.ndarray, work: np.ndarray,
                      weight: np.ndarray | None = None) -> float:
    """Exposed P2P of the pipeline (costmodel.pipeline.pipeline_time's eq. 23 term, DualPipeV's
    own under the V), its steady-state hops hidden behind the mean chunk of the stages (a hop
    travels while its neighbour's chunk runs); `weight`: DualPipeV's weight-gradient part of
    each stage's backward."""
    cfg = ctx.cfg
    mean_f = np.array([forward.mean()])
    mean_b = np.array([backward.mean()])
    mean_w = np.array([0.0 if weight is None else weight.mean()])
    w = [np.array([x]) for x in (work[0], work.max(), work[-1])]
    pipe = pipeline_time(w, cfg, np.array([float(ctx.microbatches)]), np.array([ctx.hop_s]), mean_f, mean_b, mean_w,
                         ctx.problem.hardware.efficiency.pp_overlap)
    return _scalar(pipe.pp_exposed)


def space_size(num_layers: int, stages: int, recompute: bool = False) -> int:
    """Layouts of L decoder layers over S stages, any stage possibly empty: C(L + S - 1, S - 1).
    With a recompute count per stage (0..its layers), each stage is two bins, its recomputed
    layers and the rest: C(L + 2S - 1, 2S - 1)."""
    bins = 2 * stages if recompute else stages
    return math.comb(num_layers + bins - 1, bins - 1)
