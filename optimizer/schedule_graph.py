"""The schedule's dependency graph, shared by every layout of a skeleton (issue 11): the op
lists of costmodel.schedule_sim (an entry waits for its rank's previous entry and its ops'
inputs) levelled once, so that the makespan of any per-stage seconds, and its longest path, is
a few numpy operations per level for many layouts at once. A longest path, as op counts per
stage and pass, is linear in the stage times: it bounds every layout's makespan from below,
the layout search's cuts (optimizer.layout_search)."""

from __future__ import annotations

import functools

import numpy as np

from costmodel.schedule_sim import OP_KINDS, compile_schedule, op_inputs, time_entries
from costmodel.stage_layout import LayoutContext


def critical_path(ops, result, forward_s: np.ndarray, backward_s: np.ndarray, prefer_rank: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(forward ops, backward ops) per stage on a longest path of the simulated schedule's
    dependency graph (each op waits for the rank's previous op and its inputs: F(s-1), and for
    a backward F(s) and B(s+1)). The graph is the same for every layout of the skeleton, so the
    path's length, sum over stages of nF*F_s + nB*B_s, bounds every layout's makespan from
    below: a cut for the layout search. Backtracks from the op that ends last through whichever
    predecessor its start equals (the rank's previous op first with prefer_rank, else an input:
    two of the tied paths of a balanced schedule)."""
    stages = forward_s.shape[0] * forward_s.shape[1]
    where = {(op.kind, op.stage, op.microbatch): (r, i) for r, rank_ops in enumerate(ops) for i, op in enumerate(rank_ops)}
    r, i = max(((r, len(e) - 1) for r, e in enumerate(result.end_s) if len(e)), key=lambda x: result.end_s[x[0]][x[1]])
    tol = 1e-9 * max(result.makespan_s, 1e-30)
    n_f, n_b = np.zeros(stages), np.zeros(stages)
    while True:
        op = ops[r][i]
        (n_f if op.kind == "F" else n_b)[op.stage] += 1
        start = result.start_s[r][i]
        if start <= tol:
            break
        preds = op_inputs(op, stages - 1)
        step = [where[k] for k in preds if abs(result.end_s[where[k][0]][where[k][1]] - start) <= tol]
        if i > 0 and abs(result.end_s[r][i - 1] - start) <= tol:
            step.insert(len(step) * (not prefer_rank), (r, i - 1))
        if not step:
            raise RuntimeError("critical path lost: an op starts when no predecessor ends")
        r, i = step[0]
    return n_f, n_b


class ScheduleGraph:
    """The dependency graph of a schedule's op lists (schedule_sim's rules: an entry waits for
    its rank's previous entry and its ops' inputs from outside it, op_inputs) at zero hop time,
    levelled once (an entry's level is one more than its deepest input's), so that the makespan
    of any per-stage times -- schedule_sim.simulate's at hop 0, the layout search's objective --
    is a few numpy operations per level, for many layouts at once: DeepSeek-V3 at m = 480
    (30,720 ops) in batches of 256, 0.3-0.8 ms a layout against 20-30 ms for simulate, which
    times one layout (hops and blocking sends included) with the same recurrence
    (schedule_sim.time_entries, which ends() calls at zero hop); that makes the search's cut
    generation and its local search affordable. A node is an entry of the op lists
    (compile_schedule's, whose levels and inputs it reads): one op, or DualPipeV's group (a forward run
    with another stage's backward, a backward with its weight gradient), which lasts the sum of
    its ops as schedule_sim times it; weight-gradient passes (W) take their own seconds."""

    KINDS = "".join(OP_KINDS)  # compile_schedule's op_index: kind * stages + stage

    def __init__(self, ops, stages: int):
        schedule = compile_schedule(ops)  # the entries, their inputs and levels (schedule_sim's)
        if schedule.stages != stages:
            raise ValueError(f"the op lists hold {schedule.stages} stages, not {stages}")
        n = schedule.entries
        # each entry's predecessors: its rank's previous entry, then its inputs, each once, packed
        # to the left; n, a sentinel input that ends at 0, pads the row
        preds = np.concatenate([schedule.previous[:, None], schedule.inputs], axis=1)
        repeated = np.zeros(preds.shape, dtype=bool)
        for j in range(1, preds.shape[1]):
            repeated[:, j] = (preds[:, :j] == preds[:, j:j + 1]).any(axis=1)
        preds = np.where(repeated, n, preds)
        preds = np.take_along_axis(preds, np.argsort(preds == n, axis=1, kind="stable"), axis=1)
        preds = preds[:, :max(int((preds < n).sum(axis=1).max(initial=0)), 1)]
        # each node's ops as indices into [F stages | B stages | W stages | a zero]
        self.zero = len(self.KINDS) * stages
        op_index = schedule.op_index
        self.schedule = schedule
        self.preds = preds
        self.op_index = op_index
        self.has_weight = bool((op_index[op_index < self.zero] >= 2 * stages).any())
        self.ops = n
        self.stages = stages

    def _seconds(self, seconds) -> np.ndarray:
        """[3 stages + 1] (or [.., K]) seconds by op index from the per-stage seconds of each
        pass (forward, backward; the backward's input-gradient part and the weight gradient
        where the graph has W passes), and the zero of padding."""
        seconds = [np.asarray(x, dtype=float) for x in seconds]
        if len(seconds) != 2 + self.has_weight:
            raise ValueError("give (forward, backward) seconds, and the weight-gradient seconds where the schedule splits "
                             f"backward into B and W: {len(seconds)} given")
        pad = [np.zeros_like(seconds[0])] * (3 - len(seconds)) + [np.zeros((1,) + seconds[0].shape[1:])]
        return np.concatenate(seconds + pad)

    def ends(self, *seconds: np.ndarray) -> np.ndarray:
        """End time of every node (and a last entry 0 for the sentinel) for per-stage seconds of
        each pass ([stage] in model order: forward, backward, and weight gradient where the
        graph has W passes): [node + 1], or [node + 1, K] for K layouts' [stage, K]."""
        return time_entries(self.schedule, self._seconds(seconds)).end

    def makespan(self, *seconds: np.ndarray, end: np.ndarray | None = None):
        """The longest path: a float for one layout, [K] for K (`end`: their ends() where
        already computed)."""
        return (self.ends(*seconds) if end is None else end)[:-1].max(axis=0)

    def _split(self, counts: np.ndarray) -> tuple[np.ndarray, ...]:
        """Op counts by index [..., 3 stages + 1] -> (forward, backward) per stage, and the
        weight-gradient passes where the graph has them."""
        s = self.stages
        parts = (counts[..., :s], counts[..., s:2 * s]) + ((counts[..., 2 * s:3 * s],) if self.has_weight else ())
        return tuple(np.ascontiguousarray(p) for p in parts)

    def paths(self, *seconds: np.ndarray, end: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """`path` of K layouts at once ([stage, K] seconds): [K, stage] forward and backward
        op counts (and weight-gradient passes, where the graph has them), all K backtracked
        in step (`end`: their ends() where already computed)."""
        end = self.ends(*seconds) if end is None else end
        width = end.shape[1]
        k = end[:-1].argmax(axis=0)
        cols = np.arange(width)
        # the sentinel (self.ops) as a node of its own, its own only input and holding no op, so
        # that every column steps at once until all have reached it, and the ops are counted
        # once at the end (stepping only the live columns and counting per step took 3x as long)
        preds = self._preds_closed
        visited = []
        while (k < self.ops).any():
            visited.append(k)
            p = preds[k]  # [K, inputs]
            k = p[cols, end[p, cols[:, None]].argmax(axis=1)]
        counts = np.zeros((width, self.zero + 1))
        if visited:
            idx = self._op_index_closed[np.stack(visited)]  # [steps, K, group]
            np.add.at(counts, (np.broadcast_to(cols[None, :, None], idx.shape).ravel(), idx.ravel()), 1)
        return self._split(counts)

    @functools.cached_property
    def _preds_closed(self) -> np.ndarray:
        """preds with a last row for the sentinel: its only input itself."""
        return np.concatenate([self.preds, np.full((1, self.preds.shape[1]), self.ops, dtype=self.preds.dtype)])

    @functools.cached_property
    def _op_index_closed(self) -> np.ndarray:
        """op_index with a last row for the sentinel: no op (the padding index)."""
        return np.concatenate([self.op_index, np.full((1, self.op_index.shape[1]), self.zero, dtype=self.op_index.dtype)])

    def path(self, *seconds: np.ndarray) -> tuple[np.ndarray, ...]:
        """(forward ops, backward ops) per stage on a longest path, and its weight-gradient
        passes where the graph has them (backtracked from the node that ends last through an
        input that ends latest): as a linear form in the stage times it equals this layout's
        makespan and bounds every other layout's from below."""
        end = self.ends(*seconds)
        k = int(end[:-1].argmax())
        counts = np.zeros(self.zero + 1)
        while k < self.ops:
            np.add.at(counts, self.op_index[k], 1)
            p = self.preds[k]
            k = int(p[end[p].argmax()])
        return self._split(counts)


_GRAPHS: dict = {}


def schedule_graph(ctx: LayoutContext) -> ScheduleGraph:
    """The skeleton's ScheduleGraph, built once per op-list shape (a few hundred ms at m = 480)."""
    key = (ctx.pp, ctx.vp, tuple(tuple(rank_ops) for rank_ops in ctx.ops))
    if key not in _GRAPHS:
        if len(_GRAPHS) > 8:
            _GRAPHS.clear()
        _GRAPHS[key] = ScheduleGraph(ctx.schedule, ctx.pp * ctx.vp)
    return _GRAPHS[key]


def segment_paths(ops, stages: int, microbatches: int):
    """Paths of the schedule graph through one rank's op list: micro-batch 0's forward through
    stages 0..s-1, rank r's ops from F(s, 0) to B(s', m-1) (s, s' stages of rank r, in its
    order), then the last micro-batch's backward through stages s'-1..0. Each is a lower bound
    for every layout; with s, s' rank r's first and last op it is critical_path_bound_s's term
    for rank r. They tie a stage's forward to every stage before it, which the rank terms alone
    do not (a layout that empties the early stages still waits for the chain)."""
    last = microbatches - 1
    for rank_ops in ops:
        kinds = np.array([op.kind == "F" for op in rank_ops])
        stage_of = np.array([op.stage for op in rank_ops])
        first_f = {op.stage: i for i, op in enumerate(rank_ops) if op.kind == "F" and op.microbatch == 0}
        last_b = {op.stage: i for i, op in enumerate(rank_ops) if op.kind == "B" and op.microbatch == last}
        for s, i in first_f.items():
            for s2, j in last_b.items():
                if j < i:
                    continue
                n_f = np.zeros(stages)
                n_b = np.zeros(stages)
                n_f[:s] += 1
                n_b[:s2] += 1
                seg = slice(i, j + 1)
                np.add.at(n_f, stage_of[seg][kinds[seg]], 1)
                np.add.at(n_b, stage_of[seg][~kinds[seg]], 1)
                yield n_f, n_b


def chunk_segments_hold(ops, pp: int, vp: int, microbatches: int, ranks=None) -> bool:
    """Whether every rank r > 0 (or each of `ranks`) runs, outside its segment from the forward
    of micro-batch 0 to the backward of the last micro-batch of any of its chunks c, only ops of
    its chunks before c (Megatron's 1F1B and interleaved lists: the warm-up walks the chunks in
    order, the cool-down's backwards in reverse). Then a rank whose chunks before c hold no layer
    does all its layers' work inside that segment, which segment_paths' (s, s) path of stage
    s = c * pp + r takes whole: the rank-order argument of rank_order_region rests on it."""
    last = microbatches - 1
    for r in range(1, pp) if ranks is None else ranks:
        rank_ops = ops[r]
        for c in range(vp):
            s = c * pp + r
            i = next((k for k, op in enumerate(rank_ops) if op.kind == "F" and op.stage == s and op.microbatch == 0), None)
            j = next((k for k, op in enumerate(rank_ops) if op.kind == "B" and op.stage == s and op.microbatch == last), None)
            if i is None or j is None or j < i:
                return False
            if any(op.stage // pp >= c for op in rank_ops[:i]) or any(op.stage // pp >= c for op in rank_ops[j + 1:]):
                return False
    return True
