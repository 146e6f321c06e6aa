"""Pipeline-level cost model: MoFa eqs. 9-12 (interleaved 1F1B) and eq. 23 (PP overlap), for
the schedules people run: 1F1B, Megatron's interleaved 1F1B, Llama 3's flexible schedule,
all-forward-all-backward (GPipe, looped when vp > 1) and DeepSeek's DualPipeV.

Layer split: costmodel.layout (first and last rank's layers; the rest split evenly).
Rank r holds virtual stages r, r+pp, ..., r+(vp-1)*pp; under DualPipeV (vp = 2, V shape) rank r
holds stages r and 2pp-1-r, so rank 0 holds both the embedding and the head.

Rank classes bound everything that differs between ranks (rank_classes): the first (embedding,
most activations in flight), one per distinct composition of the middle ranks (an MoE model's
leading dense layers on rank 1, a hybrid-attention pattern that a rank's layer count does not
repeat), each priced at the earliest rank holding it (the most in flight) and counted once per
rank in the fill and drain, and the last (output head and loss). The schedule model takes
per-rank times, so heterogeneous stages slot in.

Which zero-bubble-family schedule: DualPipeV (DeepSeek's "cut-in-half" DualPipe; in DeepSeek's
repository and torchtitan). It is the one with a published closed form for its bubble and
memory (DeepSeek-V3 report Table 2 and the DualPipe README; the event simulation of PyTorch's
order, costmodel.schedule_sim.dualpipev_ops, confirms the memory and corrects the bubble where
the forward or the weight gradient outlasts the input gradient), it is what DeepSeek-V3 trained with
(our H800 validation point), and its forward/backward pairing is the EP-overlap the model
already has (eq. 22). Megatron's combined 1F1B is that EP overlap (ep_overlap); torchtitan's
ZBV has no published closed form to check a model against.

Pipeline time. With R_r the forward+backward time of one micro-batch on rank r (all its
virtual stages) and m micro-batches, the 1F1B-family schedules take
    T = m * max_r R_r + (sum_r R_r - max_r R_r) / vp + T_pp
which for equal ranks is (m*vp + pp - 1) * (F_chunk + B_chunk), Narayanan et al. 2021 eq. for
the interleaved bubble. This replaces MoFa's eqs. 9-11, whose printed steady-state term
mixes per-chunk and per-rank quantities (v*l*T^FWD next to l*T^BWD); the sum of its three
phases is the same expression when those are made consistent. Llama 3's flexible schedule and
looped all-forward-all-backward keep the bubble ratio (pp - 1)/(m*vp) (section 3.1.1); they
differ in memory (in_flight) and in how well they hide P2P (p2p_slack).

PP communication (tau = one hop of an activation micro-batch: s*b*h/cp elements, divided by tp
with sequence parallelism, as Megatron's get_tensor_shapes sends it):
  * without overlap every forward and backward chunk-step blocks on its hop, and the fill and
    drain each add pp-1 hops on the critical path: (2*m*vp + 2*(pp-1)) * tau. For vp = 1 this
    is MoFa's steady-state count (4*m*v - 2*m + 2*p - 2) * T^PP.
  * with overlap (eq. 23) the hops of the steady state hide behind the k chunks that run while
    they travel (k = 1 for Megatron's schedules, 1 + nc - pp for the flexible schedule, every
    micro-batch for afab): each adds max(beta*tau - k*chunk, (alpha-1)*min(k*chunk, beta*tau))
    (beta slowing the hop, alpha the compute it overlaps), while the warm-up and cool-down
    chains keep vp*pp - 1 exposed hops each (MoFa eqs. 9 and 11 count exactly these).
  * DualPipeV sends a step's outputs when the step ends, an overlapped pair's forward output
    included (dualpipev.py's _forward_backward_chunk, torch's ScheduleDualPipeV runtime), and
    its steady state has no slack: every rank's next pair waits on its neighbours' last ones.
    The event simulation of the schedule (costmodel.schedule_sim.dualpipev_ops) exposes
    2 * (pp - 1) / pp hops per micro-batch in the steady state (a micro-batch crosses the V's
    2 * (pp - 1) links while pp micro-batches share the cycle), on top of the warm-up and
    cool-down chains (2 * (2pp - 1) hops, as above). DeepSeek's in-house kernels send the
    forward's output inside the pair and report PP communication fully hidden (V3 report
    section 3.2.1); the model prices the code the exports launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.arrays import argmax_masks, blend, unique_rows
from costmodel.configs import PP_SCHEDULE_CODES as SCHEDULE
from costmodel.configs import ConfigBatch
from costmodel.overlap import beyond_window

@dataclass(frozen=True)
class RankLayers:
    """Layer counts of one rank class by layer kind (ModelSpec.kinds order), its edge modules,
    the rank it stands for and how many ranks hold its layers."""

    counts: list[np.ndarray]
    first: bool  # holds the embedding
    last: np.ndarray  # bool array: holds the output head and loss (and the MTP modules)
    rank: np.ndarray | float = 0.0  # the earliest rank holding these layers: the most in flight (in_flight falls with the rank)
    ranks: np.ndarray | float = 1.0  # pipeline ranks holding these layers (the fill and drain sum over them)

    @property
    def layers(self) -> np.ndarray:
        return sum(self.counts)


def stage_sizes(num_layers: int, pp: int, vp: int, first: int, last: int, vee: bool) -> tuple[np.ndarray, np.ndarray]:
    """(layers of each virtual stage in model order, the rank holding it). Megatron's layouts:
    rank r holds stages r, r+pp, ...; the embedding/loss-accounted layout gives the first and the
    last stage one layer less; otherwise a rank's layers split evenly over its stages (as evenly
    as they go where vp does not divide them: the layout split). DualPipeV:
    2*pp stages in a V, rank r holding stages r and 2pp-1-r; `first` is rank 0's layers (both
    ends: the extra one on stage 0, with the embedding, away from the head), the other ranks
    split theirs over two stages (costmodel.layout.vee_split)."""
    if vee:
        stages = 2 * pp
        rank = np.array([s if s < pp else 2 * pp - 1 - s for s in range(stages)])
        middle = max((num_layers - first - last) // (pp - 2), 0) if pp > 2 else last
        own = np.where(rank == 0, first, np.where(rank == pp - 1, last, middle))
        # the rank's extra layer on its stage nearer the model's start
        sizes = own // 2 + (own % 2) * (np.arange(stages) < pp)
        return sizes, rank
    stages = pp * vp
    rank = np.arange(stages) % pp
    if pp == 1:
        return np.array([num_layers]), np.zeros(1, dtype=int)
    middle = (num_layers - first - last) // max(pp - 2, 1) if pp > 2 else 0
    count = np.where(rank == 0, first, np.where(rank == pp - 1, last, middle))
    # a rank's layers that vp does not divide (the layout split, costmodel.layout): one more on
    # its chunks farthest from the pipe's ends, the first rank's last ones (away from the
    # embedding), every other rank's first ones (away from the head)
    local, extra = np.arange(stages) // pp, count % vp
    sizes = count // vp + np.where(rank == 0, local >= vp - extra, local < extra)
    if (num_layers + 2) % stages == 0 and first == last == vp * (num_layers + 2) // stages - 1:
        sizes[:] = (num_layers + 2) // stages  # embedding_loss: every stage l, the end stages l - 1
        sizes[0] -= 1
        sizes[-1] -= 1
    return sizes, rank


def layers_by_rank(kind_of_layer, num_kinds: int, pp: int, vp: int, first: int, last: int, vee: bool) -> np.ndarray:
    """[pp, num_kinds]: how many layers of each kind every pipeline rank holds, the layers laid
    out in model order over stage_sizes' stages."""
    kinds = np.asarray(kind_of_layer)
    n_layers = len(kinds)
    sizes, rank = stage_sizes(n_layers, pp, vp, first, last, vee)
    layer_rank = np.repeat(rank, np.maximum(sizes, 0))[:n_layers]
    # a layout whose stages hold fewer layers than the model (DualPipeV's 2*pp equal stages of a
    # layer count they do not divide): the rest belong to no rank; the layers_split and
    # dualpipev_layout rules reject such rows, but the scorer must not fail on them
    layer_rank = np.pad(layer_rank, (0, n_layers - len(layer_rank)), constant_values=-1)
    return np.stack([np.bincount(kinds[layer_rank == r], minlength=num_kinds) for r in range(pp)])


def rank_classes(kind_of_layer: list[int], num_kinds: int, cfg: ConfigBatch) -> list[RankLayers]:
    """The rank classes the model prices: the first rank, every distinct middle-rank composition
    (rank 1's first, then the others in rank order), the last rank (the first and the last
    coincide when pp is 1, the second and the last when pp is 2), with the kinds of the layers
    each holds, laid out exactly as the framework lays them out (stage_sizes): layer kinds placed
    in model order (an MoE model's leading dense layers land on the first stages, hybrid-attention
    patterns wherever they fall). A middle class stands for every middle rank holding the same
    layers, priced at the earliest of them (the most in flight); a layout with fewer distinct
    middle ranks than the batch's most repeats rank 1's class with no ranks. Under DualPipeV (V
    shape) rank 0 holds the first and the last virtual stage, so the embedding and the head,
    and rank pp - 1 none. Only rank 1 stood for the middle once: on DeepSeek-V3 interleaved over
    pp 16 it holds two dense layers where ranks 2-14 hold only MoE layers, and the replay
    (costmodel.twin) could not price those ranks."""
    p, v = cfg.pp, cfg.vp
    vee = cfg.pp_schedule == SCHEDULE["dualpipev"]
    kinds = np.asarray(kind_of_layer)
    columns = [p, v, cfg.first_layers, cfg.last_layers, vee * 1.0]
    key = np.zeros(len(p), dtype=np.int64)
    for column in columns:  # a mixed-radix key: these are small integers
        key = key * (int(column.max(initial=0)) + 1) + column.astype(np.int64)
    first_row, inverse = unique_rows(key)
    layouts = np.stack([c[first_row] for c in columns], axis=1).astype(int)
    middles = []  # per layout: [(composition, earliest rank, ranks holding it)], rank 1's first
    for pp, vp, first, last, v_shape in layouts:
        by_rank = layers_by_rank(kinds, num_kinds, pp, vp, first, last, bool(v_shape))
        classes = {tuple(by_rank[min(1, pp - 1)]): [min(1, pp - 1), 0]}
        for r in range(1, pp - 1):
            classes.setdefault(tuple(by_rank[r]), [r, 0])[1] += 1
        middles.append((by_rank[0], by_rank[pp - 1], list(classes.items())))
    n_middle = max(len(c) for _, _, c in middles)
    table = np.zeros((len(layouts), n_middle + 2, num_kinds))  # layout x class x kind
    rank = np.zeros((len(layouts), n_middle + 2))
    ranks = np.zeros((len(layouts), n_middle + 2))
    for i, ((pp, *_), (head, tail, classes)) in enumerate(zip(layouts, middles)):
        classes = classes + [(classes[0][0], (classes[0][1][0], 0))] * (n_middle - len(classes))  # padding: no ranks
        table[i, 0], table[i, -1] = head, tail
        rank[i, -1], ranks[i, 0], ranks[i, -1] = pp - 1, 1, pp > 1
        for c, (counts, (earliest, held)) in enumerate(classes, start=1):
            table[i, c], rank[i, c], ranks[i, c] = counts, earliest, held
    inverse = inverse.ravel()

    def rank_layers(c, first, last):
        return RankLayers([table[inverse, c, k] for k in range(num_kinds)], first, last, rank[inverse, c], ranks[inverse, c])

    return ([rank_layers(0, True, (p == 1) | vee)]
            + [rank_layers(c, False, (p <= 2) & ~vee) for c in range(1, n_middle + 1)]
            + [rank_layers(n_middle + 1, False, ~vee)])


def simulated_schedule(cfg: ConfigBatch, i: int) -> tuple[str, int | None]:
    """(schedule, group) of configuration i as costmodel.schedule_sim.schedule_ops takes them.
    Megatron's two codes are one schedule told apart by vp, as in_flight reads them (vp > 1:
    interleaved); group is pp_group (Llama 3's nc, Megatron's microbatch group) where set and
    the schedule takes one."""
    names = {code: name for name, code in SCHEDULE.items()}
    schedule = names[int(cfg.pp_schedule[i])]
    if schedule in ("1f1b", "interleaved_1f1b"):
        schedule = "interleaved_1f1b" if cfg.vp[i] > 1 else "1f1b"
    takes_group = schedule in ("interleaved_1f1b", "flexible", "afab") and cfg.pp_group[i] > 0
    return schedule, (int(cfg.pp_group[i]) if takes_group else None)


def group_size(cfg: ConfigBatch) -> np.ndarray:
    """Consecutive micro-batches per round of a virtual stage (Llama 3's nc; Megatron's
    --microbatch-group-size-per-virtual-pipeline-stage, default pp)."""
    return np.where(cfg.pp_group > 0, cfg.pp_group, cfg.pp)


def in_flight(rank, cfg: ConfigBatch, microbatches) -> np.ndarray:
    """Micro-batch chunks (one virtual stage's activations for one micro-batch) that rank
    `rank` holds at its peak (eq. 5's factor), by schedule:
      * 1f1b (vp = 1): Megatron warms up pp - r - 1, so pp - r are held (eq. 5 would give
        2pp - 2r - 1, which overstates rank 0 by pp - 1 micro-batches);
      * interleaved_1f1b: warm-up (pp - r - 1)*2 + (vp - 1)*pp, one more in the first steady
        step: vp*pp + pp - 2r - 1, MoFa's eq. 5 exactly;
      * flexible (Llama 3 section 3.1.1): warm-up (vp - 1)*nc + 2*(pp - r - 1) (the paper prints
        "pp - ppr*v - 1", negative for ppr >= pp/v: a typo; at ppr = 0 it agrees), i.e.
        (nc - pp)*(vp - 1) more than interleaved when nc > pp;
      * afab (GPipe; looped when vp > 1): every chunk of every micro-batch;
      * dualpipev: 2*pp + 1 chunks on every rank (DeepSeek's DualPipe table: PP + 1 stage
        activations for PP stages on PP/2 devices);
    capped at m*vp."""
    p, v, s = cfg.pp, cfg.vp, cfg.pp_schedule
    r = rank
    if not (s > SCHEDULE["interleaved_1f1b"]).any():  # Megatron's two schedules only: by vp
        return np.minimum(blend(v > 1, v * p + p - 2 * r - 1, p - r), microbatches * v)
    nc = group_size(cfg)
    count = np.select(
        [s == SCHEDULE["1f1b"], s == SCHEDULE["interleaved_1f1b"], s == SCHEDULE["flexible"], s == SCHEDULE["afab"]],
        [p - r, v * p + p - 2 * r - 1, (v - 1) * nc + 2 * (p - r - 1) + 1, microbatches * v],
        2 * p + 1,
    )
    return np.minimum(count, microbatches * v)


def grad_windows(cfg: ConfigBatch, microbatches) -> np.ndarray:
    """Gradient reduce-scatters of one virtual stage per step under ZeRO-2/3: the unsharded
    gradients live through one run of consecutive backward micro-batches of the stage (Llama 3
    Figure 4). Without pipelining that is every micro-batch (DeepSpeed's ZeRO-2, FSDP's
    SHARD_GRAD_OP under gradient accumulation); 1F1B with one stage per rank and all-forward-
    all-backward run the stage's backwards back to back (one window); the interleaved schedule
    every round of nc micro-batches; DualPipeV every micro-batch."""
    s = cfg.pp_schedule
    rounds = microbatches / group_size(cfg)
    per_schedule = np.select(
        [s == SCHEDULE["1f1b"], s == SCHEDULE["afab"], s == SCHEDULE["dualpipev"]],
        [1.0 + 0.0 * rounds, 1.0 + 0.0 * rounds, microbatches + 0.0 * rounds],
        rounds,
    )
    return np.maximum(np.where(cfg.pp == 1, microbatches, per_schedule), 1.0)


def p2p_slack(cfg: ConfigBatch, microbatches) -> np.ndarray:
    """Chunks of compute that can hide one pipeline hop in the steady state with asynchronous
    P2P: one neighbouring chunk (Megatron's --overlap-p2p-communication), plus the extra
    micro-batches of a round beyond pp (Llama 3 Figure 3); afab has every micro-batch queued."""
    s = cfg.pp_schedule
    if not ((s == SCHEDULE["flexible"]) | (s == SCHEDULE["afab"])).any():
        return 1.0
    extra = np.where(s == SCHEDULE["flexible"], np.maximum(group_size(cfg) - cfg.pp, 0.0), 0.0)
    return np.where(s == SCHEDULE["afab"], microbatches * cfg.vp, 1.0 + extra)


def fill_and_drain_s(total_work, r_max, vp):
    """Warm-up plus cool-down of the 1F1B-family schedules: the pipe's work beyond the pacing
    rank's, once, spread over the vp chunks a rank interleaves."""
    return (total_work - r_max) / vp


def pipeline_compute_s(rank_work, microbatches, vp) -> float:
    """Pipeline time without P2P for any per-rank work R_r (heterogeneous layouts,
    costmodel.stage_layout): m * max_r R_r + fill_and_drain_s(sum_r R_r, max_r R_r, vp)."""
    work = np.asarray(rank_work, dtype=float)
    return float(microbatches * work.max() + fill_and_drain_s(work.sum(), work.max(), vp))


@dataclass(frozen=True)
class PipelinePasses:
    """What pipeline_time prices, per rank class (rank_classes: the first, the middle ones, the
    last): one micro-batch's forward and whole backward over all the rank's virtual
    stages, the weight-gradient part of that backward (DualPipeV splits it off; zero for other
    schedules), and one P2P hop. Kept for the digital twin (costmodel.twin), which replays the
    schedule op by op on these times."""

    forward_s: tuple[np.ndarray, ...]
    backward_s: tuple[np.ndarray, ...]
    weight_s: tuple[np.ndarray, ...]
    hop_s: np.ndarray


@dataclass(frozen=True)
class PipelineTime:
    total: np.ndarray
    bubble: np.ndarray
    pp_exposed: np.ndarray
    bottleneck: list  # masks of the rank class with the most work (rank_work's order)
    pp_without_overlap: np.ndarray  # the exposed PP time without overlap ...
    pp_overlap_floor: np.ndarray  # ... and the part overlap cannot hide (warm-up and cool-down chains)


def pipeline_time(rank_work: list[np.ndarray], cfg: ConfigBatch, microbatches, hop, chunk_f, chunk_b, chunk_w, pp_overlap_coef,
                  bubble_b=None, rank_counts=None) -> PipelineTime:
    """rank_work: per-micro-batch forward+backward time of each rank class (rank_classes: the
    first, the middle ones, the last); rank_counts: the ranks each stands for (default: three
    classes, the middle one every rank between the ends); chunk_f/chunk_b/chunk_w: forward, backward and its weight-gradient part of one
    virtual-stage chunk of the busiest middle rank (eq. 23, DualPipeV's bubble); bubble_b: the
    backward chunk DualPipeV's bubble weighs, without the once-per-window stalls (default chunk_b).

    1f1b, interleaved, flexible and afab: T = m * max_r R_r + (sum_r R_r - max_r R_r) / vp, the
    bubble ratio (pp - 1) / (m * vp) of Narayanan et al. and Llama 3 section 3.1.1 for equal
    ranks. DualPipeV: m * max_r R_r + (pp - 1) * (F + max(F, I) + max(I - W, 0)) per chunk, I = B - W
    the input-gradient part. DeepSeek-V3 report Table 2 gives (PP/2 - 1)(F&B + B - 3W), with
    PP/2 = pp devices and F&B = F + B (overlapping a forward with a backward hides the expert
    all-to-all, which ep_overlap, eq. 22, already takes off): F + 2I - W, the same where I >= F
    and I >= W (B = 2F, W = F gives 2F either way). Where the forward or the weight gradient
    outlasts the input gradient the V still fills and drains its forwards, and the event
    simulation of PyTorch's DualPipeV order gives the form used here, exact up to the V's tip
    (never below the simulation, at most one chunk above: tests/unit/test_schedules.py), which
    also sets the steady-state hops (module docstring)."""
    p, v = cfg.pp, cfg.vp
    if rank_counts is None:  # first, middle, last
        rank_counts = [1.0, np.maximum(p - 2, 0), 1.0 * (p > 1)]
    r_max = np.maximum.reduce(rank_work)
    total_work = sum(count * work for count, work in zip(rank_counts, rank_work))
    steady = microbatches * r_max
    vee = cfg.pp_schedule == SCHEDULE["dualpipev"]
    bubble = fill_and_drain_s(total_work, r_max, v)
    if vee.any():
        bubble_b = chunk_b if bubble_b is None else bubble_b
        chunk_i = bubble_b - chunk_w  # the input-gradient part of the backward
        each_rank = chunk_f + np.maximum(chunk_f, chunk_i) + np.maximum(chunk_i - chunk_w, 0.0)
        bubble = np.where(vee, (p - 1) * each_rank, bubble)

    no_overlap = (p > 1) * (2 * microbatches * v + 2 * (p - 1)) * hop
    c = pp_overlap_coef
    slack = p2p_slack(cfg, microbatches)

    def exposed(chunk):  # eq. 23 per hop: what the overlapped region adds beyond the chunks hiding it
        return beyond_window(hop, slack * chunk, c)

    steady_hidden = microbatches * v * (exposed(chunk_f) + exposed(chunk_b))
    if vee.any():  # no slack to hide a hop behind: beta * hop each
        steady_hidden = np.where(vee, microbatches * 2.0 * (p - 1) / p * exposed(0.0 * chunk_f), steady_hidden)
    floor = (p > 1) * 2 * (v * p - 1) * hop
    pp = blend((cfg.pp_overlap == 1) | vee, floor + steady_hidden, no_overlap)
    return PipelineTime(steady + bubble + pp, bubble, pp, argmax_masks(rank_work), no_overlap, floor)
