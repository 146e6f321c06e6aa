"""MoFa's digital twin of a step's pipeline: the plan's schedule replayed op by op.

The exact model prices a pipeline with closed forms (costmodel.pipeline.pipeline_time: steady
state, bubble, exposed P2P). The twin takes the pass times that model priced from
(Evaluation.passes: each rank class's forward, backward and weight-gradient time per
micro-batch, and one hop), spreads each rank's passes evenly over its virtual stages, builds the
schedule's per-rank operation lists (costmodel.schedule_sim.schedule_ops, the orders Megatron-LM
and PyTorch's DualPipeV run) and replays them (costmodel.schedule_sim.simulate). What it checks
is the schedule algebra on the plan's own numbers -- bubble, ramp hops, the steady-state hops the
closed form hides or exposes, the activations each rank holds -- not the per-chunk split of a
rank's work, which both sides share.

Ranks. The model prices a class per distinct rank composition (costmodel.pipeline.rank_classes:
rank 0, every distinct middle rank, rank pp - 1); the replay gives every rank the times of the
class whose layers it holds (under DualPipeV rank pp - 1 is a middle rank too, with no head). It
once priced rank 1 for every middle rank, and the replay found the ranks that held other layers
(DeepSeek-V3 interleaved on pp 16: ranks 2-14 all-MoE, rank 1 two dense layers).

Not in the replay (the closed form has them): the contention coefficients of eq. 23 (the hop is
replayed at its own length, alpha and beta at 1), and the once-per-window stalls of a ZeRO-2/3
gradient reduce-scatter are spread over every chunk rather than held in one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.configs import PP_SCHEDULE_CODES, ConfigBatch
from costmodel.evaluate import Evaluation, kind_of_layers, model_kinds
from costmodel.pipeline import in_flight, layers_by_rank, rank_classes, simulated_schedule
from costmodel.specs import Problem
from costmodel.schedule_sim import schedule_ops, simulate

# one step's operations beyond which a replay is refused (the event loop runs ~1e5 ops/s)
MAX_OPS = 2_000_000


class TwinError(ValueError):
    """The plan's pipeline cannot be replayed; the message says why."""


@dataclass(frozen=True)
class PipelineReplay:
    """A replayed step's pipeline next to the closed form that priced it."""

    schedule: str
    pp: int
    vp: int
    microbatches: int
    closed_form_s: float  # Evaluation.pipeline_s: steady state + bubble + exposed P2P
    simulated_s: float  # the replay's makespan
    idle_s: tuple[float, ...]  # per rank: makespan less busy time (bubble and waiting on hops)
    peak_in_flight: tuple[int, ...]  # per rank: chunk activations held at the peak, replayed
    model_in_flight: tuple[int, ...]  # ... and as the memory model counts them (pipeline.in_flight)

    @property
    def difference(self) -> float:
        """(closed form - replay) / replay: positive where the closed form is the slower."""
        return self.closed_form_s / self.simulated_s - 1.0

    def as_dict(self) -> dict:
        return {
            "schedule": self.schedule, "pp": self.pp, "vp": self.vp, "microbatches": self.microbatches,
            "closed_form_s": self.closed_form_s, "simulated_s": self.simulated_s, "difference": self.difference,
            "idle_s": list(self.idle_s), "peak_in_flight": list(self.peak_in_flight), "model_in_flight": list(self.model_in_flight),
        }


def rank_class_of(problem: Problem, cfg: ConfigBatch, i: int) -> list[int]:
    """The class (an index into Evaluation.passes, rank_classes' order) whose times each rank of
    configuration i takes: rank 0 the first, rank pp - 1 the last, a middle rank the middle
    class holding its layers."""
    pp, vp = int(cfg.pp[i]), int(cfg.vp[i])
    vee = int(cfg.pp_schedule[i]) == PP_SCHEDULE_CODES["dualpipev"]
    m, tr = problem.model, problem.training
    kinds, num_kinds = kind_of_layers(m, tr), len(model_kinds(m, tr))
    by_rank = layers_by_rank(kinds, num_kinds, pp, vp, int(cfg.first_layers[i]), int(cfg.last_layers[i]), vee)
    classes = rank_classes(kinds, num_kinds, cfg)
    middle = {tuple(int(c[i]) for c in classes[k].counts): k for k in range(len(classes) - 2, 0, -1)}  # rank 1's class wins a tie
    return [0] + [middle[tuple(int(c) for c in by_rank[r])] for r in range(1, pp - 1)] + [len(classes) - 1] * (pp > 1)


def replay_pipeline(problem: Problem, ev: Evaluation, cfg: ConfigBatch, i: int) -> PipelineReplay:
    """Replay configuration i of an evaluated batch; TwinError where there is nothing to replay
    (no pipeline) or the schedule cannot be built for it."""
    pp, vp = int(cfg.pp[i]), int(cfg.vp[i])
    schedule, group = simulated_schedule(cfg, i)
    micro = float(ev.microbatches[i])
    if pp == 1:
        raise TwinError("no pipeline to replay (pp = 1)")
    if micro != int(micro):
        raise TwinError(f"{micro:g} micro-batches per step is not a whole number")
    m = int(micro)
    if 2 * pp * vp * m > MAX_OPS:
        raise TwinError(f"{2 * pp * vp * m:,} operations to replay (more than {MAX_OPS:,})")
    try:
        ops = schedule_ops(schedule, pp, vp, m, group)
    except ValueError as exc:
        raise TwinError(f"the {schedule} schedule cannot be built for this plan: {exc}") from None

    passes = ev.passes
    classes = rank_class_of(problem, cfg, i)

    def per_chunk(times) -> np.ndarray:  # [pp, vp]: a rank's pass spread evenly over its stages
        return np.repeat(np.array([[float(times[c][i]) / vp] for c in classes]), vp, axis=1)

    forward, backward = per_chunk(passes.forward_s), per_chunk(passes.backward_s)
    hop = float(passes.hop_s[i])
    vee = schedule == "dualpipev"
    if vee:  # the input-gradient pass and the deferred weight gradient
        weight = per_chunk(passes.weight_s)
        result = simulate(ops, forward, backward - weight, hop, weight_s=weight)
    else:
        result = simulate(ops, forward, backward, hop, p2p_blocking=bool(cfg.pp_overlap[i] != 1))
    one = cfg.take(np.array([i]))
    model_flight = tuple(int(in_flight(np.float64(r), one, np.float64(m))[0]) for r in range(pp))
    return PipelineReplay(
        schedule=schedule, pp=pp, vp=vp, microbatches=m,
        closed_form_s=float(ev.pipeline_s[i]), simulated_s=result.makespan_s,
        idle_s=tuple(float(x) for x in result.idle_s),
        peak_in_flight=tuple(int(x) for x in result.peak_in_flight),
        model_in_flight=model_flight,
    )
