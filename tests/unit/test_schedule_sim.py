"""Pipeline-schedule simulator (costmodel.schedule_sim) against the closed forms it must reproduce.

Unless a test says otherwise a chunk's forward takes F = 1 s and its backward B = 2 s (backward
about twice the forward, Narayanan et al. 2021), the same on every rank, with no hop latency.
"""

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from costmodel.schedule_sim import Op, compile_schedule, dualpipev_ops, op_inputs, schedule_ops, simulate, time_entries

F, B = 1.0, 2.0


def run(schedule, pp, vp, m, group=None, forward_s=F, backward_s=B, hop_s=0.0, **kwargs):
    return simulate(schedule_ops(schedule, pp, vp, m, group), forward_s, backward_s, hop_s, **kwargs)


# --- makespan and bubble, uniform chunks, no hop ----------------------------------------------


@pytest.mark.parametrize("schedule", ["1f1b", "afab"])
@pytest.mark.parametrize("pp,m", [(1, 4), (2, 1), (4, 2), (4, 4), (4, 8), (8, 32)])
def test_gpipe_and_1f1b_makespan(schedule, pp, m):
    """GPipe (Huang et al. 2019) and 1F1B (Narayanan et al. 2021, SC'21): (m + pp - 1)(F + B),
    a bubble of (pp - 1)(F + B) on every rank, bubble ratio (pp - 1) / m."""
    result = run(schedule, pp, 1, m)
    assert result.makespan_s == (m + pp - 1) * (F + B)
    np.testing.assert_allclose(result.idle_s, (pp - 1) * (F + B))
    np.testing.assert_allclose(result.bubble_ratio, (pp - 1) / m)


@pytest.mark.parametrize(
    "schedule,pp,vp,m,group",
    [
        ("interleaved_1f1b", 4, 2, 8, None),
        ("interleaved_1f1b", 4, 4, 16, None),
        ("interleaved_1f1b", 8, 2, 8, None),
        ("interleaved_1f1b", 4, 2, 8, 8),
        ("flexible", 4, 2, 12, 6),
        ("flexible", 4, 7, 12, 6),
        ("afab", 4, 2, 8, None),
    ],
)
def test_interleaved_makespan_and_bubble_ratio(schedule, pp, vp, m, group):
    """Narayanan et al. 2021's interleaved schedule: (m*vp + pp - 1)(F_c + B_c) with per-chunk
    times; bubble ratio (pp - 1) / (m * vp) on every rank (Llama 3, ISCA'25 section 3.1.1, for
    any nc)."""
    result = run(schedule, pp, vp, m, group)
    assert result.makespan_s == (m * vp + pp - 1) * (F + B)
    np.testing.assert_allclose(result.bubble_ratio, (pp - 1) / (m * vp))


def test_pp16_vp8_m64_is_fast_and_exact():
    """Llama 3 405B's pipeline shape (pp=16, vp=8) with 64 micro-batches, 16,384 ops: the
    interleaved closed form, in well under a second."""
    start = time.perf_counter()
    result = run("interleaved_1f1b", 16, 8, 64)
    elapsed_s = time.perf_counter() - start
    assert result.makespan_s == (64 * 8 + 16 - 1) * (F + B)
    assert elapsed_s < 1.0


# --- the schedules' op order ------------------------------------------------------------------


def test_megatron_interleaved_order():
    """pp=2, vp=2, m=4 (group = pp = 2), rank 0: Megatron warms up (2-0-1)*2 + (2-1)*2 = 4
    forwards (chunk 0 on micro-batches 0-1, then chunk 1 on the same), alternates, and cools down;
    backwards walk the chunks last-first. Local chunk c is stage c*pp + r."""
    expected = [
        ("F", 0, 0), ("F", 0, 1), ("F", 2, 0), ("F", 2, 1),
        ("F", 0, 2), ("B", 2, 0), ("F", 0, 3), ("B", 2, 1),
        ("F", 2, 2), ("B", 0, 0), ("F", 2, 3), ("B", 0, 1),
        ("B", 2, 2), ("B", 2, 3), ("B", 0, 2), ("B", 0, 3),
    ]
    rank0 = schedule_ops("interleaved_1f1b", 2, 2, 4)[0]
    assert rank0 == [Op(*op) for op in expected]


def test_1f1b_order():
    """Megatron's non-interleaved 1F1B, pp=3, m=4: rank 0 warms up pp - 0 - 1 = 2 forwards,
    the last rank none."""
    ops = schedule_ops("1f1b", 3, 1, 4)
    assert [(op.kind, op.microbatch) for op in ops[0]] == [
        ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3),
    ]
    assert [(op.kind, op.microbatch) for op in ops[2]] == [
        ("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3),
    ]
    assert {op.stage for op in ops[1]} == {1}


# --- activations in flight --------------------------------------------------------------------


@pytest.mark.parametrize("pp", [1, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8, 16])
def test_1f1b_in_flight(pp, m):
    """Megatron's 1F1B: rank r holds its pp - r - 1 warm-up micro-batches plus one, capped at m
    (MoFa's eq. 5 would say 2pp - 2r - 1 at vp = 1; costmodel.pipeline.in_flight corrects it)."""
    expected = [min(pp - r, m) for r in range(pp)]
    assert run("1f1b", pp, 1, m).peak_in_flight.tolist() == expected


@pytest.mark.parametrize("pp,vp,m", [(4, 2, 4), (4, 2, 8), (4, 2, 16), (8, 4, 8), (8, 4, 16), (2, 3, 2)])
def test_interleaved_in_flight(pp, vp, m):
    """Megatron's interleaved 1F1B: the warm-up (pp - r - 1)*2 + (vp - 1)*pp plus one chunk,
    vp*pp + pp - 2r - 1 (MoFa eq. 5), capped at m*vp."""
    expected = [min(vp * pp + pp - 2 * r - 1, m * vp) for r in range(pp)]
    assert run("interleaved_1f1b", pp, vp, m).peak_in_flight.tolist() == expected


@pytest.mark.parametrize("pp,vp,nc", [(4, 2, 6), (4, 2, 8), (4, 3, 6), (4, 3, 12), (8, 4, 12)])
def test_flexible_in_flight(pp, vp, nc):
    """Llama 3 flexible PP (ISCA'25 section 3.1.1): warm-up (vp - 1)*nc + 2(pp - r - 1), plus
    one, which is (nc - pp)(vp - 1) more than Megatron's interleaved schedule (nc = pp)."""
    m = 24
    flexible = run("flexible", pp, vp, m, nc).peak_in_flight
    interleaved = run("interleaved_1f1b", pp, vp, m).peak_in_flight
    assert flexible.tolist() == [(vp - 1) * nc + 2 * (pp - r - 1) + 1 for r in range(pp)]
    assert (flexible - interleaved).tolist() == [(nc - pp) * (vp - 1)] * pp


@pytest.mark.parametrize("pp,vp,m,group", [(4, 1, 8, None), (4, 2, 8, None), (4, 2, 8, 8), (2, 3, 6, 1)])
def test_afab_holds_everything(pp, vp, m, group):
    """All-forward-all-backward keeps every chunk activation of the step: m * vp on each rank."""
    assert run("afab", pp, vp, m, group).peak_in_flight.tolist() == [m * vp] * pp


def test_llama3_figure9_memory_ordering():
    """Llama 3 ISCA'25 Figure 9: a 26-layer model, pp=4, bs=12 micro-batches; interleaved 1F1B
    (nc = pp = 4) vs flexible PP (nc = 6) vs all-forward-all-backward. vp = 7: with the embedding
    and the loss counted as a layer each (Llama 3's layout, MoFa's embedding_loss split),
    26 + 2 = 28 = 4 * 7 virtual stages of one layer; nc only matters with vp > 1, and 28 is
    not divisible by pp*vp for any other vp > 1. Peak chunk activations:
    interleaved 4*7 + 4 - 2r - 1, flexible 6*6 + 2(3 - r) + 1, afab 12*7 = 84."""
    interleaved = run("interleaved_1f1b", 4, 7, 12).peak_in_flight
    flexible = run("flexible", 4, 7, 12, 6).peak_in_flight
    afab = run("afab", 4, 7, 12).peak_in_flight
    assert interleaved.tolist() == [31, 29, 27, 25]
    assert flexible.tolist() == [43, 41, 39, 37]
    assert afab.tolist() == [84, 84, 84, 84]
    assert np.all(afab > flexible) and np.all(flexible > interleaved)


# --- point-to-point latency -------------------------------------------------------------------


@pytest.mark.parametrize("hop_s", [0.1, 0.5])
def test_llama3_figure3_more_microbatches_per_round_hide_hops(hop_s):
    """Llama 3 ISCA'25 Figure 3 / section 3.1.1: with asynchronous P2P, nc > pp micro-batches
    per round give each chunk slack to hide its hop. pp=4, vp=2, m=12, hop <= F:
      * nc = pp = 4 exposes 2(vp*pp - 1) = 14 hops, the warm-up and cool-down chains of MoFa
        eqs. 9 and 11 (costmodel.pipeline's overlap floor);
      * nc = 6 and nc = 12 expose only 2(pp - 1) = 6, the fill and drain of a plain pipeline.
    Without a hop all three take the same (m*vp + pp - 1)(F + B) = 81 s."""
    ideal_s = (12 * 2 + 4 - 1) * (F + B)
    by_nc = {nc: run("flexible", 4, 2, 12, nc, hop_s=hop_s).makespan_s for nc in (4, 6, 12)}
    assert by_nc[4] == pytest.approx(ideal_s + 14 * hop_s)
    assert by_nc[6] == pytest.approx(ideal_s + 6 * hop_s)
    assert by_nc[12] == pytest.approx(ideal_s + 6 * hop_s)
    assert by_nc[6] < by_nc[4]
    assert {run("flexible", 4, 2, 12, nc).makespan_s for nc in (4, 6, 12)} == {ideal_s}


def test_longer_rounds_keep_helping_as_hops_grow():
    """Hop equal to F (1 s), pp=4, vp=2, m=12: makespan falls strictly as nc grows 4 -> 6 -> 12
    (95, 89, 87 s: 14, 8 and 6 exposed hops) -- the Llama 3 Figure 3 trend."""
    makespans = [run("flexible", 4, 2, 12, nc, hop_s=1.0).makespan_s for nc in (4, 6, 12)]
    assert makespans == [95.0, 89.0, 87.0]


@pytest.mark.parametrize("pp,m", [(2, 1), (4, 8), (8, 16)])
def test_gpipe_hops_async_and_blocking(pp, m):
    """afab, vp = 1, hop h. Async: forward k ends on rank r at (k + r + 1)F + r*h, so the
    forward phase ends at (m + pp - 1)F + (pp - 1)h and, symmetrically, the backward phase adds
    (m + pp - 1)B + (pp - 1)h: 2(pp - 1) exposed hops. Blocking: every forward but the last
    rank's and every backward but the first rank's occupies its rank F + h (B + h), so each
    phase's chain is (m + pp - 2) steps of op + h and one final op: 2(m + pp - 2) hops; ranks
    block m (first, last) or 2m (middle) sends."""
    h = 0.25
    base_s = (m + pp - 1) * (F + B)
    assert run("afab", pp, 1, m, hop_s=h).makespan_s == pytest.approx(base_s + 2 * (pp - 1) * h)
    blocking = run("afab", pp, 1, m, hop_s=h, p2p_blocking=True)
    assert blocking.makespan_s == pytest.approx(base_s + 2 * (m + pp - 2) * h)
    sends = [m if r in (0, pp - 1) else 2 * m for r in range(pp)]
    np.testing.assert_allclose(blocking.send_blocked_s, np.array(sends) * h)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 8])
def test_1f1b_exposes_steady_state_hops(m):
    """Non-interleaved 1F1B has no slack to hide a hop even with async P2P. pp = 2 by hand:
    rank 1's F(i+2) waits for rank 0's B(i) -> F(i+2), which waits for rank 1's B(i): a round
    trip of 2 hops every 2 micro-batches, 2*ceil(m/2) hops in all -- more than the 2(pp-1) = 2
    of the fill and drain alone."""
    h = 0.125
    makespan_s = run("1f1b", 2, 1, m, hop_s=h).makespan_s
    assert makespan_s == pytest.approx((m + 1) * (F + B) + 2 * math.ceil(m / 2) * h)


# --- heterogeneous ranks ----------------------------------------------------------------------


def slow_rank_times(pp, vp, slow_rank, factor=1.5):
    forward_s, backward_s = np.full((pp, vp), F), np.full((pp, vp), B)
    forward_s[slow_rank] *= factor
    backward_s[slow_rank] *= factor
    return forward_s, backward_s


@pytest.mark.parametrize("schedule,vp", [("1f1b", 1), ("interleaved_1f1b", 2)])
@pytest.mark.parametrize("slow_rank", [0, 1, 3])
def test_slowest_rank_paces_the_steady_state(schedule, vp, slow_rank):
    """One rank 1.5x slower (R_slow = 1.5 vp (F + B) per micro-batch): pp more micro-batches add
    exactly pp * R_slow, and the slow rank's own idle time does not grow -- it never waits in
    the steady state."""
    pp, m = 4, 8
    forward_s, backward_s = slow_rank_times(pp, vp, slow_rank)
    r_slow_s = 1.5 * vp * (F + B)
    short = run(schedule, pp, vp, m, forward_s=forward_s, backward_s=backward_s)
    long = run(schedule, pp, vp, m + pp, forward_s=forward_s, backward_s=backward_s)
    assert long.makespan_s - short.makespan_s == pytest.approx(pp * r_slow_s)
    assert long.idle_s[slow_rank] == pytest.approx(short.idle_s[slow_rank])


@pytest.mark.parametrize("schedule,vp,m", [("1f1b", 1, 8), ("interleaved_1f1b", 2, 8), ("interleaved_1f1b", 4, 12)])
def test_slow_last_rank_matches_mofa_pipeline_time(schedule, vp, m):
    """With the slowest rank last, makespan = m * max_r R_r + (sum_r R_r - max_r R_r) / vp
    (costmodel.pipeline.pipeline_time, the heterogeneous form of Narayanan et al.'s bubble).
    (With the slow rank earlier the simulator finishes sooner: its extra warm-up forwards
    overlap the fill, so that form is an upper bound there.)"""
    pp = 4
    forward_s, backward_s = slow_rank_times(pp, vp, pp - 1)
    per_rank_s = (forward_s + backward_s).sum(axis=1)
    expected_s = m * per_rank_s.max() + (per_rank_s.sum() - per_rank_s.max()) / vp
    result = run(schedule, pp, vp, m, forward_s=forward_s, backward_s=backward_s)
    assert result.makespan_s == pytest.approx(expected_s)
    early = run(schedule, pp, vp, m, forward_s=forward_s[::-1], backward_s=backward_s[::-1])
    assert early.makespan_s < expected_s


def test_gpipe_heterogeneous_is_a_flow_shop():
    """afab with per-rank times: each phase is a flow shop of m identical jobs, so makespan =
    sum_r F_r + (m - 1) max_r F_r + sum_r B_r + (m - 1) max_r B_r (the first and last rank
    differ, as embedding and loss make them; the forward and backward bottlenecks differ too)."""
    forward_s = np.array([[0.8], [1.0], [1.3], [1.1]])
    backward_s = np.array([[1.9], [2.4], [2.0], [2.2]])
    m = 6
    expected_s = forward_s.sum() + (m - 1) * forward_s.max() + backward_s.sum() + (m - 1) * backward_s.max()
    assert run("afab", 4, 1, m, forward_s=forward_s, backward_s=backward_s).makespan_s == pytest.approx(expected_s)


# --- split backward, timeline, invalid input --------------------------------------------------


def with_weight_after_each_backward(ops):
    """The same order with each B followed at once by its W."""
    split = []
    for rank_ops in ops:
        split.append([])
        for op in rank_ops:
            split[-1].append(op)
            if op.kind == "B":
                split[-1].append(Op("W", op.stage, op.microbatch))
    return split


@pytest.mark.parametrize(
    "pp,m,input_grad_s,weight_grad_s", [(4, 8, 1.2, 0.8), (8, 16, 1.0, 1.0), (2, 3, 1.5, 0.5), (4, 2, 1.2, 0.8)]
)
def test_split_backward_takes_weight_gradients_off_the_drain(pp, m, input_grad_s, weight_grad_s):
    """1F1B with the backward split into B (input gradient) and W (weight gradient) run right
    after it: the gradient leaves as soon as B ends, so W drops out of the fill-and-drain chain
    (the observation behind Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR'24):
    makespan m(F + B + W) + (pp - 1)(F + B), the 1F1B form less (pp - 1)W. In-flight counts end
    at B, so they stay 1F1B's min(pp - r, m)."""
    ops = with_weight_after_each_backward(schedule_ops("1f1b", pp, 1, m))
    result = simulate(ops, F, input_grad_s, 0.0, weight_s=weight_grad_s)
    expected_s = m * (F + input_grad_s + weight_grad_s) + (pp - 1) * (F + input_grad_s)
    assert result.makespan_s == pytest.approx(expected_s)
    assert result.peak_in_flight.tolist() == [min(pp - r, m) for r in range(pp)]


def test_timeline_respects_order_and_dependencies():
    """Heterogeneous chunks, hops, blocking sends: every op starts after its rank's previous op
    (plus a blocking send) and after each input has arrived; ends are starts plus durations."""
    pp, vp, m, h = 4, 2, 8, 0.3
    rng = np.random.default_rng(0)
    forward_s, backward_s = rng.uniform(0.5, 1.5, (pp, vp)), rng.uniform(1.0, 3.0, (pp, vp))
    ops = schedule_ops("interleaved_1f1b", pp, vp, m)
    result = simulate(ops, forward_s, backward_s, h, p2p_blocking=True)
    end = {
        (op.kind, op.stage, op.microbatch): result.end_s[r][i]
        for r, rank_ops in enumerate(ops)
        for i, op in enumerate(rank_ops)
    }
    for r, rank_ops in enumerate(ops):
        starts, ends = result.start_s[r], result.end_s[r]
        assert np.all(starts[1:] >= ends[:-1] - 1e-12)
        for i, op in enumerate(rank_ops):
            c, s, mb = op.stage // pp, op.stage, op.microbatch
            assert ends[i] - starts[i] == pytest.approx((forward_s if op.kind == "F" else backward_s)[r, c])
            if op.kind == "F" and s > 0:
                assert starts[i] >= end[("F", s - 1, mb)] + h - 1e-12
            if op.kind == "B":
                assert starts[i] >= end[("F", s, mb)] - 1e-12
                if s < pp * vp - 1:
                    assert starts[i] >= end[("B", s + 1, mb)] + h - 1e-12
    last_end_s = max(e.max() for e in result.end_s)
    assert last_end_s <= result.makespan_s <= last_end_s + h  # at most a trailing blocking send
    np.testing.assert_allclose(result.busy_s + result.idle_s, result.makespan_s)


def _replay(ops, forward_s, backward_s, hop_s, weight_s=None, p2p_blocking=False):
    """An op-by-op replay, the plain statement of simulate's rules: sweep the ranks, each runs
    its next entries while their inputs have ended; an entry starts when its rank is free and
    its inputs have arrived (a hop from another rank). (makespan, busy, blocked, starts, ends)."""
    rank_of = {op.stage: r for r, rank_ops in enumerate(ops) for e in rank_ops for op in (e if isinstance(e, tuple) else (e,))}
    chunk_of = {s: sorted(x for x in rank_of if rank_of[x] == r).index(s) for s, r in rank_of.items()}
    last = len(rank_of) - 1
    seconds = {"F": forward_s, "B": backward_s, "W": weight_s}
    end_of, free, blocked = {}, [0.0] * len(ops), [0.0] * len(ops)
    starts, ends, busy = [[] for _ in ops], [[] for _ in ops], [0.0] * len(ops)
    while any(len(starts[r]) < len(ops[r]) for r in range(len(ops))):
        for r, rank_ops in enumerate(ops):
            while len(starts[r]) < len(rank_ops):
                group = rank_ops[len(starts[r])]
                group = group if isinstance(group, tuple) else (group,)
                keys = [(op.kind, op.stage, op.microbatch) for op in group]
                inputs = [k for op in group for k in op_inputs(op, last) if k not in keys]
                if any(k not in end_of for k in inputs):
                    break
                arrival = max((end_of[k] + (hop_s if rank_of[k[1]] != r else 0.0) for k in inputs), default=0.0)
                start = max(free[r], arrival)
                duration = sum(float(seconds[op.kind][r, chunk_of[op.stage]]) for op in group)
                sends = sum((op.kind == "F" and op.stage < last and rank_of[op.stage + 1] != r)
                            or (op.kind == "B" and op.stage > 0 and rank_of[op.stage - 1] != r) for op in group)
                send_s = hop_s * sends if p2p_blocking else 0.0
                starts[r].append(start)
                ends[r].append(start + duration)
                end_of.update((k, start + duration) for k in keys)
                free[r] = start + duration + send_s
                blocked[r] += send_s
                busy[r] += duration
    return max(free), busy, blocked, starts, ends


@pytest.mark.parametrize("schedule,pp,vp,m,group", [("1f1b", 4, 1, 8, None), ("interleaved_1f1b", 4, 2, 8, None),
                                                    ("interleaved_1f1b", 3, 3, 8, 4), ("flexible", 4, 2, 12, 6),
                                                    ("afab", 4, 2, 8, None), ("dualpipev", 4, 2, 16, None)])
@pytest.mark.parametrize("p2p_blocking", [False, True])
def test_simulate_times_every_op_as_an_op_by_op_replay_to_the_bit(schedule, pp, vp, m, group, p2p_blocking):
    """simulate times the compiled op lists level by level (numpy); an op-by-op replay of the
    same rules gives the same makespan, busy, blocked, start and end times exactly (==, not
    approximately), for heterogeneous chunks, a hop and blocking sends, DualPipeV's groups
    included; and simulating the compiled schedule is simulating its op lists."""
    rng = np.random.default_rng(pp * 100 + m)
    ops = schedule_ops(schedule, pp, vp, m, group)
    forward, backward = rng.uniform(0.1, 2.0, (pp, vp)), rng.uniform(0.2, 4.0, (pp, vp))
    weight = rng.uniform(0.0, 1.0, (pp, vp)) if schedule == "dualpipev" else None
    hop = 0.0137
    result = simulate(ops, forward, backward, hop, weight_s=weight, p2p_blocking=p2p_blocking)
    makespan, busy, blocked, starts, ends = _replay(ops, forward, backward, hop, weight, p2p_blocking)
    assert result.makespan_s == makespan
    assert result.busy_s.tolist() == busy and result.send_blocked_s.tolist() == blocked
    assert [x.tolist() for x in result.start_s] == starts and [x.tolist() for x in result.end_s] == ends
    again = simulate(compile_schedule(ops), forward, backward, hop, weight_s=weight, p2p_blocking=p2p_blocking)
    assert again.makespan_s == result.makespan_s and all(np.array_equal(a, b) for a, b in zip(again.end_s, result.end_s))


@pytest.mark.parametrize("schedule,pp,vp,m", [("interleaved_1f1b", 4, 2, 8), ("afab", 3, 2, 6), ("dualpipev", 4, 2, 16)])
def test_time_entries_times_many_sets_of_seconds_as_it_times_each(schedule, pp, vp, m):
    """time_entries is the one recurrence behind simulate (one layout) and the layout search's
    schedule graph (K layouts at once, [op index, K] seconds): a batch of K gives, column by
    column, exactly (==) what K single calls give, with a hop and blocking sends too; and a
    single call's ends are simulate's."""
    rng = np.random.default_rng(pp * 10 + m)
    compiled = compile_schedule(schedule_ops(schedule, pp, vp, m))
    k = 5
    op_seconds = np.concatenate([rng.uniform(0.1, 2.0, (3 * pp * vp, k)), np.zeros((1, k))])
    if schedule != "dualpipev":
        op_seconds[2 * pp * vp:3 * pp * vp] = 0.0  # no weight-gradient passes: their seconds are never read
    hop = 0.0137
    send_s = hop * compiled.sends
    batch = time_entries(compiled, op_seconds, hop, send_s, starts=True)
    assert batch.end.shape == (compiled.entries + 1, k)
    for j in range(k):
        one = time_entries(compiled, op_seconds[:, j], hop, send_s, starts=True)
        for field in ("duration", "start", "end", "free"):
            assert np.array_equal(getattr(batch, field)[:, j], getattr(one, field)), field
    where = (np.asarray(compiled.rank_of_stage), np.asarray(compiled.chunk_of_stage))
    per_chunk = [np.zeros((pp, vp)) for _ in range(3)]
    for kind in range(3):
        per_chunk[kind][where] = op_seconds[kind * pp * vp:(kind + 1) * pp * vp, 0]
    weight = per_chunk[2] if schedule == "dualpipev" else None
    result = simulate(compiled, per_chunk[0], per_chunk[1], hop, weight_s=weight, p2p_blocking=True)
    one = time_entries(compiled, op_seconds[:, 0], hop, send_s)
    assert one.start is None
    spans = zip(compiled.offsets[:-1], compiled.offsets[1:])
    assert all(np.array_equal(one.end[a:b], e) for (a, b), e in zip(spans, result.end_s))


def test_deadlock_is_reported():
    """Rank 1 puts the backward of micro-batch 0 before its forward: it waits on itself."""
    ops = [[Op("F", 0, 0), Op("B", 0, 0)], [Op("B", 1, 0), Op("F", 1, 0)]]
    with pytest.raises(ValueError, match="deadlock"):
        simulate(ops, F, B, 0.0)


@pytest.mark.parametrize(
    "args,match",
    [
        (("1f1b", 4, 2, 8), "vp must be 1"),
        (("1f1b", 4, 1, 8, 4), "not to 1f1b"),
        (("interleaved_1f1b", 4, 1, 8), "vp >= 2"),
        (("interleaved_1f1b", 4, 2, 6), "divisible"),
        (("interleaved_1f1b", 4, 2, 8, 2), "group"),
        (("flexible", 4, 2, 12, 3), "group"),
        (("flexible", 4, 2, 12, 8), "divisible"),
        (("zero_bubble", 4, 1, 8), "unknown schedule"),
        (("1f1b", 0, 1, 8), "pp must be"),
        (("1f1b", 4, 1, 0), "microbatches must be"),
        (("dualpipev", 4, 2, 7), "microbatches >= 2 [*] pp"),
        (("dualpipev", 4, 1, 8), "vp = 2"),
        (("dualpipev", 4, 2, 8, 4), "no group"),
    ],
)
def test_invalid_schedules_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        schedule_ops(*args)


def test_invalid_simulation_inputs_are_refused():
    ops = schedule_ops("interleaved_1f1b", 4, 2, 8)
    with pytest.raises(ValueError, match=r"\[pp, vp\]"):
        simulate(ops, np.ones((4, 3)), B, 0.0)
    with pytest.raises(ValueError, match=r"\[pp, vp\]"):  # a 1-D array: per rank or per chunk?
        simulate(schedule_ops("interleaved_1f1b", 2, 2, 4), np.ones(2), B, 0.0)
    with pytest.raises(ValueError, match="hop_s"):
        simulate(ops, F, B, -1.0)
    with pytest.raises(ValueError, match="no W"):
        simulate(ops, F, B, 0.0, weight_s=1.0)
    with pytest.raises(ValueError, match="give weight_s"):
        simulate(with_weight_after_each_backward(ops), F, B, 0.0)
    with pytest.raises(ValueError, match="B ops must cover"):
        simulate([rank_ops[:-1] for rank_ops in ops], F, B, 0.0)
    with pytest.raises(ValueError, match="kind"):
        Op("X", 0, 0)


# --- DualPipeV: PyTorch's order, and what the simulation makes of it ---------------------------


def torch_name(entry) -> str:
    """An entry of dualpipev_ops as torch prints its _Action: '3F0', '3I0' (input gradient),
    '3W0', '3B0' (full backward), '(3F5;4B1)OVERLAP_F_B'."""
    if isinstance(entry, Op):
        return f"{entry.stage}{'I' if entry.kind == 'B' else entry.kind}{entry.microbatch}"
    if len(entry) == 2:  # (B, W): a full backward
        return f"{entry[0].stage}B{entry[0].microbatch}"
    forward, backward, _ = entry
    return f"({forward.stage}F{forward.microbatch};{backward.stage}B{backward.microbatch})OVERLAP_F_B"


def test_dualpipev_order_is_pytorchs():
    """Every rank's list, op for op, is the one torch 2.13's ScheduleDualPipeV builds (its port of
    DeepSeek's dualpipev.py), for 11 (pp, m) pairs from pp 1 to 16 and m = 2pp to 3pp
    (tests/data/dualpipev_order.json; the framework tests regenerate it from torch)."""
    data = json.loads((Path(__file__).parents[1] / "data" / "dualpipev_order.json").read_text())
    assert len(data["orders"]) == 11
    for case, ranks in data["orders"].items():
        pp, m = (int(x) for x in case[2:].split("_m"))
        assert [[torch_name(e) for e in rank] for rank in dualpipev_ops(pp, m)] == ranks, case


@pytest.mark.parametrize("pp,m", [(1, 2), (2, 4), (4, 8), (4, 13), (8, 32)])
def test_dualpipev_runs_every_pass_once_and_holds_2pp_plus_1(pp, m):
    """The V: rank r holds stages r and 2pp - 1 - r; every (stage, micro-batch) gets its forward,
    input- and weight-gradient passes once (simulate checks it), and every rank holds 2pp + 1
    chunk activations at its peak: DeepSeek's DualPipe table, "PP + 1" stage activations for PP
    stages on PP / 2 devices."""
    ops = dualpipev_ops(pp, m)
    for r, rank_ops in enumerate(ops):
        stages = {op.stage for entry in rank_ops for op in (entry if isinstance(entry, tuple) else (entry,))}
        assert stages == {r, 2 * pp - 1 - r}
    result = simulate(ops, F, B / 2, 0.0, weight_s=B / 2)
    assert result.peak_in_flight.tolist() == [min(2 * pp + 1, 2 * m)] * pp
    assert result.busy_s == pytest.approx(np.full(pp, 2 * m * (F + B)))


def test_dualpipev_pair_releases_its_outputs_when_it_ends():
    """An overlapped pair runs as one op of F + B + W seconds; its forward's output leaves when
    the pair ends (dualpipev.py sends after the pair), so the next rank's forward starts a hop
    after the pair's end, not after the forward alone."""
    pp, m, hop = 2, 4, 0.25
    ops = dualpipev_ops(pp, m)
    result = simulate(ops, F, 1.0, hop, weight_s=1.0)
    rank0_pairs = [i for i, e in enumerate(ops[0]) if isinstance(e, tuple) and len(e) == 3]
    feeding = [i for i in rank0_pairs if ops[0][i][0].stage == 0]  # forward output to stage 1, rank 1
    assert rank0_pairs and feeding
    for i in rank0_pairs:
        assert result.end_s[0][i] - result.start_s[0][i] == pytest.approx(F + 1.0 + 1.0)
    for i in feeding:
        consumer = [j for j, e in enumerate(ops[1]) if Op("F", 1, ops[0][i][0].microbatch) in (e if isinstance(e, tuple) else (e,))]
        assert result.start_s[1][consumer[0]] >= result.end_s[0][i] + hop - 1e-12
