"""Event-driven simulator of pipeline-parallel schedules: MoFa's digital twin of one step.

The closed forms of `costmodel.pipeline` (Narayanan et al. 2021, MoFa eqs. 5 and 9-12) assume
uniform ranks and count hops by phase; this module replays a schedule op by op instead, so it
can check those forms and price what they do not cover (heterogeneous ranks, hop latency
against chunk time, rounds of more than pp micro-batches).

Schedules as per-rank operation lists (`schedule_ops`). Every schedule but DualPipeV is
Megatron-LM's 1F1B loop with a different warm-up count: rank r runs `warmup` forwards, then
alternates one forward and one backward, then runs the remaining backwards. The k-th forward (backward) of a
rank is the k-th virtual micro-batch of Megatron's interleaved order, `group` consecutive
micro-batches per chunk before moving to the next chunk (backwards take the chunks last-first):
    chunk = (k // group) % vp            (backward: vp - 1 - that)
    micro-batch = (k // (group * vp)) * group + k % group
and rank r's local chunk c is the global virtual stage c * pp + r.
  * 1f1b: Megatron's non-interleaved schedule (forward_backward_pipelining_without_interleaving,
    Narayanan et al. 2021 "PipeDream-Flush"): warm-up min(pp - r - 1, m).
  * interleaved_1f1b: Megatron's forward_backward_pipelining_with_interleaving with `group` =
    microbatch_group_size_per_vp_stage (default pp): warm-up
    min((pp - r - 1) * 2 + (vp - 1) * group, m * vp).
  * flexible: Llama 3's flexible PP (Chu et al., "Scaling Llama 3 Training with Efficient
    Parallelism Strategies", ISCA'25, section 3.1.1): nc >= pp consecutive micro-batches per
    round, warm-up (vp - 1) * nc + 2 * (pp - r - 1) -- Megatron's formula with group = nc.
  * afab: all forwards, then all backwards (GPipe, Huang et al. 2019; with vp > 1 the "looped"
    breadth-first order of Lamy-Poirier 2023 when group = m): warm-up m * vp.
  * dualpipev: DeepSeek's DualPipeV ("cut-in-half" DualPipe, github.com/deepseek-ai/DualPipe,
    MIT; DeepSeek-V3 report section 3.2.1), as PyTorch ports it
    (torch.distributed.pipelining.ScheduleDualPipeV._calculate_single_rank_operations, torch
    2.13): vp = 2 stages per rank in a V (rank r holds stages r and 2pp - 1 - r), m >= 2pp, eight
    phases per rank (`dualpipev_ops`), input- and weight-gradient passes split in the warm-up and
    cool-down (weight gradients deferred through a queue), and the steady state run as
    overlapped pairs: a forward of one stage with the full backward of the other. The order is
    checked against PyTorch's own (tests/data/dualpipev_order.json, regenerated from torch by
    the framework tests).

Simulation (`simulate`). Each rank runs its list strictly in order; an op starts at
max(the rank is free, its inputs have arrived):
    F(s, mb) needs F(s-1, mb);  B(s, mb) needs B(s+1, mb) and F(s, mb);  W(s, mb) needs B(s, mb),
an input from another rank arriving hop_s after its producer finished. With asynchronous P2P
(Megatron --overlap-p2p-communication) the sender goes on at once; with p2p_blocking the sender
is also busy for hop_s after each op whose output leaves the rank. Because no rank reorders its
list, the earliest-start times are the event times of a discrete-event simulation; ops are
resolved in dependency order (levelled once per op lists, `compile_schedule`, then timed a level
at a time, `time_entries`), and a cycle (a rank waiting on itself through others) is reported as a deadlock. A
group of ops in one list entry (a tuple: DualPipeV's full backward (B, W) and its overlapped
forward-and-backward pair (F, B, W)) runs as one op: it starts once every input from outside
the group has arrived, takes the sum of its ops' times (overlapping a forward with
a backward hides their communication, not their compute: DeepSeek's F&B) and releases all its
outputs at its end. Not modelled: contention between compute and communication, links shared by
concurrent transfers, the rendezvous of blocking send/recv pairs, and the optimizer step.

In flight: the stage micro-batches of a rank whose F has finished and whose B (input-gradient
part) has not -- the activations the rank holds (a group's forward counted before its
backward). Since a rank's count changes only when one of its own ops ends, the peak over time
is the peak over its op list, the quantity of MoFa eq. 5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

SCHEDULES = ("1f1b", "interleaved_1f1b", "flexible", "afab", "dualpipev")
OP_KINDS = ("F", "B", "W")


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a pipeline rank: the forward ("F"), backward ("B": the input-gradient
    part, or the whole backward when the schedule does not split it) or weight-gradient ("W")
    pass of global virtual stage `stage` (0..S-1 along the model) on micro-batch `microbatch`."""

    kind: str
    stage: int
    microbatch: int

    def __post_init__(self):
        if self.kind not in OP_KINDS:
            raise ValueError(f"Op kind must be one of {OP_KINDS}, got {self.kind!r}")


# One entry of a rank's list: an op, or a group of ops run as one (DualPipeV's full backward
# (B, W) and its overlapped pair (F, B, W)).
Entry = Op | tuple[Op, ...]


def flat_ops(rank_ops: list[Entry]) -> list[Op]:
    """A rank's ops in order, groups unpacked."""
    return [op for entry in rank_ops for op in (entry if isinstance(entry, tuple) else (entry,))]


# ---------------------------------------------------------------------------------------------
# Schedules


def _check_count(name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def one_f_one_b_warmup(rank: int, pp: int, microbatches: int) -> int:
    """Megatron's non-interleaved 1F1B: later ranks start their steady state sooner."""
    return min(pp - rank - 1, microbatches)


def interleaved_warmup(rank: int, pp: int, vp: int, group: int, microbatches: int) -> int:
    """Forwards before the first backward in Megatron's interleaved 1F1B and in Llama 3's
    flexible PP (group = nc); the two formulas are the same.

    Megatron (get_pp_rank_microbatches): (pp - r - 1) * 2 + (vp - 1) * group, capped at m * vp.
    Llama 3 ISCA'25 section 3.1.1 prints the flexible warm-up as (v - 1) * nc + 2 x (pp - ppr x v
    - 1); that goes negative for ppr >= pp / v and agrees with Megatron's only at ppr = 0, so the
    "x v" is a typo for (v - 1) * nc + 2 * (pp - ppr - 1), which is what is used here.
    (Megatron releases before the microbatch-group option also ran all forwards first when
    m == pp; the current formula, used here, does not special-case it.)"""
    return min((pp - rank - 1) * 2 + (vp - 1) * group, microbatches * vp)


def virtual_microbatch(k: int, vp: int, group: int) -> tuple[int, int]:
    """(forward chunk, micro-batch) of a rank's k-th virtual micro-batch in the interleaved
    order: `group` consecutive micro-batches on chunk 0, the same ones on chunk 1, ..., then the
    next group."""
    chunk = (k // group) % vp
    microbatch = (k // (group * vp)) * group + k % group
    return chunk, microbatch


def _rank_ops(rank: int, pp: int, vp: int, microbatches: int, group: int, warmup: int) -> list[Op]:
    """Megatron's 1F1B loop on one rank: `warmup` forwards, then one forward and one backward
    at a time, then the remaining backwards."""
    total = microbatches * vp

    def forward(k: int) -> Op:
        chunk, mb = virtual_microbatch(k, vp, group)
        return Op("F", chunk * pp + rank, mb)

    def backward(k: int) -> Op:
        chunk, mb = virtual_microbatch(k, vp, group)
        return Op("B", (vp - 1 - chunk) * pp + rank, mb)  # backwards walk the chunks in reverse

    ops = [forward(k) for k in range(warmup)]
    for i in range(total - warmup):
        ops.append(forward(warmup + i))
        ops.append(backward(i))
    ops.extend(backward(k) for k in range(total - warmup, total))
    return ops


def dualpipev_ops(pp: int, microbatches: int) -> list[list[Entry]]:
    """DualPipeV's per-rank order: DeepSeek's dualpipev.py as PyTorch ports it
    (ScheduleDualPipeV._calculate_single_rank_operations, torch 2.13), phase by phase. Rank r
    holds stages s0 = r and s1 = 2pp - 1 - r. A forward takes its stage's next micro-batch; an
    input-gradient pass (B alone) its stage's next backward micro-batch and queues the weight
    gradient, which a later W pops (oldest first); a full backward is the group (B, W); an
    overlapped pair is (F, B, W) of two different stages."""
    _check_count("pp", pp)
    _check_count("microbatches", microbatches)
    if microbatches < 2 * pp:
        raise ValueError(f"dualpipev needs microbatches >= 2 * pp = {2 * pp} (one per stage), got {microbatches}")
    ranks = []
    for r in range(pp):
        s0, s1 = r, 2 * pp - 1 - r
        next_f = {s0: 0, s1: 0}
        next_b = {s0: 0, s1: 0}
        weights: list[Op] = []  # deferred weight gradients, oldest first
        ops: list[Entry] = []

        def forward(stage):
            next_f[stage] += 1
            return Op("F", stage, next_f[stage] - 1)

        def input_grad(stage):
            next_b[stage] += 1
            weights.append(Op("W", stage, next_b[stage] - 1))
            return Op("B", stage, next_b[stage] - 1)

        def full_backward(stage):
            next_b[stage] += 1
            return (Op("B", stage, next_b[stage] - 1), Op("W", stage, next_b[stage] - 1))

        def backward(stage, split):
            return input_grad(stage) if split else full_backward(stage)

        def pending_weight():
            if weights:
                ops.append(weights.pop(0))

        ops += [forward(s0) for _ in range(2 * (pp - r - 1))]  # 1: F0
        for _ in range(r + 1):  # 2: F0 F1
            ops += [forward(s0), forward(s1)]
        for _ in range(pp - r - 1):  # 3: I1 W F1 (zero bubble)
            ops.append(input_grad(s1))
            pending_weight()
            ops.append(forward(s1))
        for i in range(microbatches - 2 * pp + r + 1):  # 4: (F0 B1) (F1 B0), the main step
            if i == 0 and r == pp - 1:  # the V's tip: not overlapped, to shorten the bubble
                ops += [forward(s0), full_backward(s1)]
            else:
                ops.append((forward(s0),) + full_backward(s1))
            ops.append((forward(s1),) + full_backward(s0))
        for _ in range(pp - r - 1):  # 5: B1 (F1 B0)
            ops.append(full_backward(s1))
            ops.append((forward(s1),) + full_backward(s0))
        split = False  # 6: B1 B0, the second half with weight gradients deferred
        for i in range(r + 1):
            split = split or (i == (r + 1) // 2 and r % 2 == 1)
            ops.append(backward(s1, split))
            split = split or (i == (r + 1) // 2 and r % 2 == 0)
            ops.append(backward(s0, split))
        for _ in range(pp - r - 1):  # 7: W B0
            pending_weight()
            ops.append(backward(s0, split))
        for _ in range(r + 1):  # 8: W
            pending_weight()
        ranks.append(ops)
    return ranks


def schedule_ops(schedule: str, pp: int, vp: int, microbatches: int, group: int | None = None) -> list[list[Entry]]:
    """Ordered operations of each pipeline rank for a schedule (see the module docstring).

    group: micro-batches per chunk before the next chunk -- Megatron's
    microbatch_group_size_per_vp_stage for interleaved_1f1b and afab, Llama 3's nc for flexible;
    default pp. Not used by 1f1b or dualpipev (vp = 2, dualpipev_ops). With vp > 1 it must
    divide the micro-batches (Megatron's get_schedule_table also accepts a shorter last group;
    not modelled here), and it must be >= pp for interleaved_1f1b and flexible."""
    _check_count("pp", pp)
    _check_count("vp", vp)
    _check_count("microbatches", microbatches)
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {SCHEDULES}")
    m = microbatches

    if schedule == "dualpipev":
        if vp != 2 or group is not None:
            raise ValueError(f"dualpipev holds vp = 2 stages per rank in a V and takes no group, got vp={vp}, group={group}")
        return dualpipev_ops(pp, m)
    if schedule == "1f1b":
        if vp != 1:
            raise ValueError(f"1f1b is the non-interleaved schedule: vp must be 1, got vp={vp} (use interleaved_1f1b)")
        if group is not None:
            raise ValueError("group applies to interleaved_1f1b, flexible and afab, not to 1f1b")
        return [_rank_ops(r, pp, 1, m, 1, one_f_one_b_warmup(r, pp, m)) for r in range(pp)]

    group = pp if group is None else group
    _check_count("group", group)
    if schedule in ("interleaved_1f1b", "flexible") and vp < 2:
        # Megatron runs the non-interleaved schedule without virtual stages; the interleaved
        # warm-up at vp = 1 would hold pp - r - 1 more micro-batches than Megatron does.
        raise ValueError(f"{schedule} needs vp >= 2 virtual stages per rank, got vp={vp} (use 1f1b)")
    if schedule in ("interleaved_1f1b", "flexible") and group < pp:
        # A round shorter than the ring of pp ranks can make a rank need a forward that waits
        # on its own backward: pp=4, vp=2, m=8, group=2 deadlocks in this simulator.
        raise ValueError(f"{schedule} needs group (nc) >= pp micro-batches per round, got group={group} < pp={pp}")
    if vp > 1 and m % group != 0:
        # the interleaved order walks whole groups; a partial group would skip micro-batches
        raise ValueError(f"{schedule} needs microbatches divisible by group: m={m}, group={group}")

    if schedule == "afab":
        return [_rank_ops(r, pp, vp, m, group, m * vp) for r in range(pp)]
    return [_rank_ops(r, pp, vp, m, group, interleaved_warmup(r, pp, vp, group, m)) for r in range(pp)]


# ---------------------------------------------------------------------------------------------
# Simulation


@dataclass(frozen=True, eq=False)
class SimResult:
    """What one simulated step did. Arrays indexed by rank; start_s / end_s hold one array per
    rank aligned with that rank's op list (the timeline)."""

    makespan_s: float
    busy_s: np.ndarray  # computing (F, B, W)
    idle_s: np.ndarray  # makespan - busy: the bubble, plus time blocked in sends
    send_blocked_s: np.ndarray  # time blocked in sends (zero unless p2p_blocking)
    peak_in_flight: np.ndarray  # chunk activations held at the peak (int)
    start_s: tuple[np.ndarray, ...]
    end_s: tuple[np.ndarray, ...]

    @property
    def bubble_ratio(self) -> np.ndarray:
        """Idle over busy time per rank: Narayanan et al.'s t_pb / t_id, (pp - 1) / (m * vp)
        for uniform chunks and no communication."""
        return self.idle_s / self.busy_s


@dataclass(frozen=True)
class _Layout:
    """Where each stage lives: rank and local chunk (the stage's index among its rank's
    stages in model order), recovered from the op lists so that any placement works."""

    rank_of_stage: tuple[int, ...]
    chunk_of_stage: tuple[int, ...]
    pp: int
    vp: int


def _layout(ops: list[list[Entry]]) -> _Layout:
    if not ops:
        raise ValueError("ops must hold one op list per pipeline rank, got none")
    rank_of: dict[int, int] = {}
    for rank, rank_ops in enumerate(ops):
        for op in flat_ops(rank_ops):
            if rank_of.setdefault(op.stage, rank) != rank:
                raise ValueError(f"stage {op.stage} appears on ranks {rank_of[op.stage]} and {rank}")
    stages = len(rank_of)
    if stages == 0:
        raise ValueError("ops hold no operations")
    if sorted(rank_of) != list(range(stages)):
        raise ValueError(f"stages must be 0..S-1 without gaps, got {sorted(rank_of)}")
    local = [sorted(s for s, r in rank_of.items() if r == rank) for rank in range(len(ops))]
    if len({len(stages_here) for stages_here in local}) != 1:
        raise ValueError(f"every rank must hold the same number of stages, got {[len(x) for x in local]}")
    chunk_of = {s: c for stages_here in local for c, s in enumerate(stages_here)}
    return _Layout(
        tuple(rank_of[s] for s in range(stages)),
        tuple(chunk_of[s] for s in range(stages)),
        len(ops),
        len(local[0]),
    )


def _check_complete(ops: list[list[Entry]], stages: int) -> tuple[int, bool]:
    """Every (stage, micro-batch) has exactly one F and one B, and one W for all or none.
    Returns (micro-batches, whether backward is split)."""
    seen: dict[str, set] = {kind: set() for kind in OP_KINDS}
    for rank_ops in ops:
        for op in flat_ops(rank_ops):
            key = (op.stage, op.microbatch)
            if key in seen[op.kind]:
                raise ValueError(f"duplicate op {op}")
            seen[op.kind].add(key)
    microbatches = len(seen["F"]) // stages
    expected = {(s, mb) for s in range(stages) for mb in range(microbatches)}
    for kind in ("F", "B"):
        if seen[kind] != expected:
            raise ValueError(
                f"{kind} ops must cover every stage 0..{stages - 1} x micro-batch 0..{microbatches - 1} once"
            )
    if seen["W"] and seen["W"] != expected:
        raise ValueError("W ops must cover every (stage, micro-batch) once, or be absent")
    return microbatches, bool(seen["W"])


def _per_chunk_seconds(name: str, value, pp: int, vp: int) -> np.ndarray:
    """A scalar or a 2-D array that broadcasts to [pp, vp]; a 1-D array is refused, since
    broadcasting would read it per chunk even when it was meant per rank."""
    array = np.asarray(value, dtype=float)
    try:
        if array.ndim not in (0, 2):
            raise ValueError
        array = np.broadcast_to(array, (pp, vp))
    except ValueError:
        raise ValueError(
            f"{name} must be a scalar or a [pp, vp] = [{pp}, {vp}] array (or [pp, 1], [1, vp]), got shape {array.shape}"
        ) from None
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"{name} must hold finite seconds >= 0")
    return array


def op_inputs(op: Op, last_stage: int) -> list[tuple[str, int, int]]:
    """The (kind, stage, micro-batch) keys of the ops whose output an op consumes: a forward the
    previous stage's forward; a backward its own forward and the next stage's backward (the last
    stage's gradient starts from the loss, i.e. its own forward); a weight gradient its backward.
    The one statement of the schedule's data dependencies (the layout search builds on it too)."""
    if op.kind == "F":
        return [] if op.stage == 0 else [("F", op.stage - 1, op.microbatch)]
    if op.kind == "B":
        own_forward = ("F", op.stage, op.microbatch)
        return [own_forward] if op.stage == last_stage else [own_forward, ("B", op.stage + 1, op.microbatch)]
    return [("B", op.stage, op.microbatch)]


def _sends(op: Op, layout: _Layout, last_stage: int) -> bool:
    """Whether the op's output goes to another rank (F downstream, B upstream; W stays)."""
    here = layout.rank_of_stage[op.stage]
    if op.kind == "F":
        return op.stage < last_stage and layout.rank_of_stage[op.stage + 1] != here
    if op.kind == "B":
        return op.stage > 0 and layout.rank_of_stage[op.stage - 1] != here
    return False


def _peak_in_flight(rank_ops: list[Entry]) -> int:
    held = peak = 0
    for op in flat_ops(rank_ops):
        if op.kind == "F":
            held += 1
            peak = max(peak, held)
        elif op.kind == "B":
            held -= 1
    return peak


@dataclass(frozen=True, eq=False)
class Level:
    """The entries of one level of a compiled schedule and what they wait for, as contiguous
    index arrays (time_entries reads them a column at a time: taking the elementwise max of
    [entries] or [entries, K] columns in place was 1.2-2x faster than gathering
    [entries, inputs, K] and reducing it)."""

    entries: np.ndarray
    previous: np.ndarray  # each entry's rank's previous entry (n: none)
    inputs: tuple[np.ndarray, ...]  # one per input column any entry of the level uses (n where an entry has fewer)
    crosses: tuple[np.ndarray | None, ...]  # that input comes from another rank (None: no entry's does)


@dataclass(frozen=True, eq=False)
class CompiledSchedule:
    """A schedule's op lists resolved once, for `simulate` to time with any seconds: what does
    not depend on the times (the checks, where each stage lives, each entry's inputs and
    sends, the order the entries can run in) is the same for every layout of a skeleton, and
    building it took about half of a simulation (0.2-0.3 s of 0.5 s for DeepSeek-V3's 30,720
    ops at m = 480). The entries of every rank's list are numbered rank by rank, in list order
    (rank r's are offsets[r]..offsets[r + 1] - 1); n (the number of entries) stands for "none"
    in the index arrays, an input that ends at 0. optimizer.schedule_graph builds its graph on
    the same arrays."""

    ops: tuple  # the op lists, as given
    pp: int
    vp: int
    stages: int
    rank_of_stage: tuple[int, ...]
    chunk_of_stage: tuple[int, ...]  # the stage's index among its rank's stages in model order
    split_backward: bool  # the ops split backward into B and W
    offsets: np.ndarray  # [pp + 1] each rank's first entry
    op_index: np.ndarray  # [entry, group] each op as kind * stages + stage (kinds in OP_KINDS order), 3 * stages: no op
    previous: np.ndarray  # [entry] the rank's previous entry (n for its first)
    inputs: np.ndarray  # [entry, width] entries whose output an op of the entry consumes, from outside it (n: none)
    crosses: np.ndarray  # [entry, width] that input comes from another rank
    sends: np.ndarray  # [entry] outputs of the entry that leave the rank
    steps: tuple[Level, ...]  # entries by depth (one more than the deepest of previous and inputs), with what they wait for
    peak_in_flight: np.ndarray  # [rank] chunk activations held at the peak

    @property
    def entries(self) -> int:
        return len(self.previous)


def compile_schedule(ops: list[list[Entry]]) -> CompiledSchedule:
    """Check and resolve op lists once (see CompiledSchedule); ValueError where they do not
    make a schedule (a stage on two ranks, ranks of unequal stages, a missing or repeated op,
    a deadlock: a rank waiting on itself through others)."""
    if isinstance(ops, CompiledSchedule):
        return ops
    layout = _layout(ops)
    stages = len(layout.rank_of_stage)
    last_stage = stages - 1
    _, split_backward = _check_complete(ops, stages)
    groups = [entry if isinstance(entry, tuple) else (entry,) for rank_ops in ops for entry in rank_ops]
    n = len(groups)
    offsets = np.cumsum([0] + [len(rank_ops) for rank_ops in ops])
    entry_of = {(op.kind, op.stage, op.microbatch): k for k, group in enumerate(groups) for op in group}
    rows, crossing = [], []
    for k, group in enumerate(groups):
        keys = [(op.kind, op.stage, op.microbatch) for op in group]
        here = layout.rank_of_stage[group[0].stage]
        row = [(entry_of[key], layout.rank_of_stage[key[1]] != here) for op in group for key in op_inputs(op, last_stage) if key not in keys]
        rows.append([p for p, _ in row])
        crossing.append([c for _, c in row])
    width = max((len(row) for row in rows), default=0)
    inputs = np.full((n, max(width, 1)), n, dtype=np.int64)
    crosses = np.zeros((n, max(width, 1)), dtype=bool)
    for k, (row, flags) in enumerate(zip(rows, crossing)):
        inputs[k, :len(row)] = row
        crosses[k, :len(row)] = flags
    previous = np.arange(-1, n - 1, dtype=np.int64)
    previous[offsets[:-1][offsets[:-1] < n]] = n
    op_index = np.full((n, max((len(g) for g in groups), default=1)), len(OP_KINDS) * stages, dtype=np.int64)
    for k, group in enumerate(groups):
        op_index[k, :len(group)] = [OP_KINDS.index(op.kind) * stages + op.stage for op in group]
    sends = np.array([sum(_sends(op, layout, last_stage) for op in group) for group in groups], dtype=np.int64)

    # levels: an entry runs once its rank's previous entry and its inputs have (Kahn's order, a
    # generation at a time: an entry's level is one more than its deepest predecessor's)
    parents = np.concatenate([previous[:, None], inputs], axis=1)
    child = np.repeat(np.arange(n), parents.shape[1])[parents.ravel() < n]
    parent = parents.ravel()[parents.ravel() < n]
    by_parent = np.argsort(parent, kind="stable")
    successors, first = child[by_parent], np.searchsorted(parent[by_parent], np.arange(n + 1))
    waiting = np.bincount(child, minlength=n)
    level = np.full(n, -1, dtype=np.int64)
    frontier, depth = np.flatnonzero(waiting == 0), 0
    while frontier.size:
        level[frontier] = depth
        count = first[frontier + 1] - first[frontier]
        offset = np.repeat(first[frontier] - np.cumsum(count) + count, count) + np.arange(count.sum())
        reached, times = np.unique(successors[offset], return_counts=True)
        waiting[reached] -= times
        frontier, depth = reached[waiting[reached] == 0], depth + 1
    if (level < 0).any():
        stuck = {r: ops[r][int(np.flatnonzero(waiting[offsets[r]:offsets[r + 1]] > 0)[0])]
                 for r in range(len(ops)) if (waiting[offsets[r]:offsets[r + 1]] > 0).any()}
        raise ValueError(f"schedule deadlocks: each waiting rank's next op needs an op that cannot run: {stuck}")
    order = np.argsort(level, kind="stable")
    edges = np.searchsorted(level[order], np.arange(level.max() + 2))
    # each level's columns, as views of the entries sorted by level (one row per input column)
    previous_sorted, inputs_sorted, crosses_sorted = previous[order], inputs[order].T.copy(), crosses[order].T.copy()
    used = np.logical_or.reduceat(inputs_sorted < n, edges[:-1], axis=1)  # [column, level] some entry has that input
    crossing = np.logical_or.reduceat(crosses_sorted, edges[:-1], axis=1)
    steps = tuple(Level(entries=order[lo:hi], previous=previous_sorted[lo:hi],
                        inputs=tuple(inputs_sorted[j, lo:hi] for j in np.flatnonzero(used[:, i])),
                        crosses=tuple(crosses_sorted[j, lo:hi] if crossing[j, i] else None for j in np.flatnonzero(used[:, i])))
                  for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])))
    return CompiledSchedule(
        ops=tuple(ops), pp=layout.pp, vp=layout.vp, stages=stages,
        rank_of_stage=layout.rank_of_stage, chunk_of_stage=layout.chunk_of_stage, split_backward=split_backward,
        offsets=offsets, op_index=op_index, previous=previous, inputs=inputs, crosses=crosses, sends=sends, steps=steps,
        peak_in_flight=np.array([_peak_in_flight(rank_ops) for rank_ops in ops]),
    )


class Timing(NamedTuple):
    """time_entries' answer: [entry] arrays, or [entry, K] for K sets of seconds at once."""

    duration: np.ndarray  # each entry's seconds: its ops' summed in list order
    start: np.ndarray | None  # when it starts (None unless asked for)
    end: np.ndarray  # [entry + 1 (, K)] when it ends, and a last 0: the "none" input's end
    free: np.ndarray  # like end, plus the sends the rank blocks on after it: when its next entry may start


def time_entries(schedule: CompiledSchedule, op_seconds: np.ndarray, hop_s: float = 0.0,
                 send_s: np.ndarray | None = None, starts: bool = False) -> Timing:
    """The simulation's recurrence, level by level over the compiled schedule: an entry starts
    once its rank is free (its previous entry ended, plus the sends it blocked on) and its inputs
    have arrived (ended, plus hop_s from another rank), and ends its duration later. The one
    implementation of it: simulate times one layout with it, hops and blocking sends included;
    optimizer.schedule_graph times K layouts at once with it at zero hop (op_seconds [.., K]).
    The additions and maxima are an op-by-op replay's, so the times are equal to the bit
    (adding a zero hop leaves a time as it is).

    op_seconds: [3 stages + 1] (or [3 stages + 1, K]) seconds by op index (compile_schedule's
    op_index: forward stages, backward stages, weight-gradient stages in model order, then a
    zero for padding). send_s: [entry] seconds the rank stays blocked after each entry (None:
    never). starts: also return the start times."""
    n = schedule.entries
    op_seconds = np.asarray(op_seconds, dtype=float)
    duration = op_seconds[schedule.op_index[:, 0]]
    for j in range(1, schedule.op_index.shape[1]):
        duration = duration + op_seconds[schedule.op_index[:, j]]
    batch = (1,) * (op_seconds.ndim - 1)  # a per-entry column broadcast over the K layouts
    end = np.zeros((n + 1,) + op_seconds.shape[1:])
    free = end if send_s is None else np.zeros_like(end)
    start = np.empty(duration.shape) if starts else None
    hop_s = float(hop_s)
    for level in schedule.steps:
        idx = level.entries
        ready = free[level.previous]
        for column, crossing in zip(level.inputs, level.crosses):
            arrival = end[column]
            if crossing is not None and hop_s:
                arrival += (hop_s * crossing).reshape(crossing.shape + batch)
            np.maximum(ready, arrival, out=ready)
        if starts:
            start[idx] = ready
        ready += duration[idx]
        end[idx] = ready
        if send_s is not None:
            free[idx] = ready + send_s[idx].reshape(idx.shape + batch)
    return Timing(duration, start, end, free)


def simulate(
    ops: list[list[Entry]] | CompiledSchedule, forward_s, backward_s, hop_s: float, weight_s=None, p2p_blocking: bool = False
) -> SimResult:
    """Replay per-rank op lists (from `schedule_ops` or built by hand; or compile_schedule's
    resolution of them, for many simulations of one schedule) and time them.

    forward_s, backward_s, weight_s: seconds of one micro-batch of local chunk c on rank r,
    arrays [pp, vp] (or a scalar, [pp, 1], [1, vp]; heterogeneous ranks allowed).
    backward_s is the input-gradient part when the ops split backward into B and W, then
    weight_s is required; otherwise it is the whole backward. hop_s: one point-to-point
    activation (or gradient) transfer between ranks. p2p_blocking: the sender is busy for hop_s
    after each op whose output leaves the rank (Megatron without --overlap-p2p-communication)."""
    schedule = compile_schedule(ops)
    pp, vp, n = schedule.pp, schedule.vp, schedule.entries
    if schedule.split_backward and weight_s is None:
        raise ValueError("the ops split backward into B and W: give weight_s")
    if weight_s is not None and not schedule.split_backward:
        raise ValueError("weight_s given but the ops have no W: backward_s is the whole backward")
    seconds = [_per_chunk_seconds("forward_s", forward_s, pp, vp), _per_chunk_seconds("backward_s", backward_s, pp, vp)]
    seconds.append(_per_chunk_seconds("weight_s", weight_s, pp, vp) if schedule.split_backward else np.zeros((pp, vp)))
    hop_s = float(hop_s)
    if not np.isfinite(hop_s) or hop_s < 0:
        raise ValueError(f"hop_s must be finite seconds >= 0, got {hop_s}")

    where = (np.asarray(schedule.rank_of_stage), np.asarray(schedule.chunk_of_stage))
    send_s = hop_s * schedule.sends if p2p_blocking else None
    timing = time_entries(schedule, np.concatenate([x[where] for x in seconds] + [np.zeros(1)]), hop_s, send_s, starts=True)
    duration, start, end, free = timing.duration, timing.start, timing.end, timing.free
    send_s = np.zeros(n) if send_s is None else send_s

    spans = [slice(int(a), int(b)) for a, b in zip(schedule.offsets[:-1], schedule.offsets[1:])]
    busy = np.array([sum(duration[span].tolist()) for span in spans])
    blocked_s = np.array([sum(send_s[span].tolist()) for span in spans], dtype=float)
    makespan = max(float(free[span.stop - 1]) if span.stop > span.start else 0.0 for span in spans)
    return SimResult(
        makespan_s=makespan,
        busy_s=busy,
        idle_s=makespan - busy,
        send_blocked_s=blocked_s,
        peak_in_flight=schedule.peak_in_flight.copy(),
        start_s=tuple(start[span].copy() for span in spans),
        end_s=tuple(end[span].copy() for span in spans),
    )
