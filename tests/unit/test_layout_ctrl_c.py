"""Ctrl-C in the layout search: it ends the search as a time limit would, with the best layout
found so far and the bound proven by then (LayoutSolution.interrupted), and a running CP-SAT
solve stops at once instead of at its own time limit (optimizer.cp_solver.solve).

The Ctrl-C is injected where it lands in practice, in the CP-SAT solves: optimizer.cp_solver's
`solve`, which every layout module calls through it, is wrapped to raise KeyboardInterrupt at
its k-th call, for every k the search reaches.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from ortools.sat.python import cp_model

import optimizer.cp_solver
from optimizer.layout_oracles import enumerate_layouts
from optimizer.layout_rounds import memo_scorer, round_below
from optimizer.layout_search import solve_layout, two_phase
from optimizer.layout_vee import vee_layout_search, vee_rounds

from conftest import sigint_as_in_a_terminal
from test_layout_search import best_by_enumeration, context


def interrupting(monkeypatch, at: int) -> list:
    """Make the layout search's at-th CP-SAT solve raise KeyboardInterrupt (as a Ctrl-C while
    it runs does); returns the list that counts the calls."""
    calls, real = [], optimizer.cp_solver.solve

    def solve(solver, model, callback=None, **kwargs):
        calls.append(1)
        if len(calls) == at:
            raise KeyboardInterrupt
        return real(solver, model, callback, **kwargs)

    monkeypatch.setattr(optimizer.cp_solver, "solve", solve)
    return calls


def uninterrupted(search, *args, **kwargs):
    """search(*args, **kwargs), where a KeyboardInterrupt that escapes it fails the test (and
    does not end the session, as pytest lets one do)."""
    try:
        return search(*args, **kwargs)
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt escaped the search")


def slowest_fitting(ctx, among=lambda layout: True):
    """(makespan, layout) of the slowest layout that fits (`among` those)."""
    return max(((score.pipeline_s - score.pp_exposed_s, layout) for layout, score in enumerate_layouts(ctx) if score.fits and among(layout)),
               key=lambda x: x[0])


@pytest.mark.parametrize("memory_mib", [81559, 39000])
def test_ctrl_c_in_a_round_returns_the_best_so_far(tmp_path, monkeypatch, memory_mib):
    """Free layouts from the slowest layout that fits (so the rounds have work to do): a Ctrl-C
    in any of the search's CP-SAT solves returns a layout that fits, no slower than the seed,
    with a bound below every fitting layout's makespan (all enumerated), marked interrupted;
    after the last solve a search is not interrupted."""
    ctx = context(tmp_path, 2, 2, memory_mib)
    best, _ = best_by_enumeration(ctx, "makespan")
    seed_makespan, seed = slowest_fitting(ctx)
    calls = interrupting(monkeypatch, 0)
    whole = solve_layout(ctx, time_limit_s=20, seeds=(seed,))
    total = len(calls)
    assert total >= 1 and whole.optimal and not whole.interrupted
    for at in range(1, total + 1):
        interrupting(monkeypatch, at)
        solution = uninterrupted(solve_layout, ctx, time_limit_s=20, seeds=(seed,))
        assert solution.interrupted, at
        assert solution.fits and best * (1 - 1e-12) <= solution.makespan_s <= seed_makespan * (1 + 1e-12)
        assert solution.lower_bound_s <= best * (1 + 1e-9)
        assert not solution.optimal or solution.makespan_s == pytest.approx(best, rel=1e-6)


def test_ctrl_c_before_any_layout_fits_is_raised(tmp_path, monkeypatch):
    """No seed: a Ctrl-C in the first solve, before any layout that fits is known, has nothing
    to give back and reaches the caller."""
    ctx = context(tmp_path, 2, 2, 81559)
    interrupting(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        solve_layout(ctx, time_limit_s=20)


def test_ctrl_c_in_the_regular_phase_skips_the_free_one(tmp_path, monkeypatch):
    """two_phase: a Ctrl-C during the regular phase returns its best so far as both answers;
    the free one's bound is the work bound, which holds for every layout (the regular
    phase's holds among regular layouts only)."""
    from optimizer.layout_bounds import work_bound_s
    from optimizer.layout_rounds import regular

    ctx = context(tmp_path, 2, 2, 81559)
    best, _ = best_by_enumeration(ctx, "makespan")
    _, seed = slowest_fitting(ctx, lambda layout: regular(layout, 1))  # the regular phase's incumbent
    calls = interrupting(monkeypatch, 1)
    first, second = uninterrupted(two_phase, ctx, 20.0, 2, (seed,))
    assert len(calls) == 1 and first.interrupted and second.interrupted
    assert second.layout == first.layout and second.bound_source == "work"
    assert second.lower_bound_s == pytest.approx(min(work_bound_s(ctx), first.makespan_s)) and second.lower_bound_s <= best * (1 + 1e-9)


def test_a_ctrl_c_stops_a_running_solve_at_once():
    """cp_solver.solve with Ctrl-C left to Python (the layout search's): a SIGINT one second
    into a solve with a 60 s limit that cannot finish sooner (a 13-mark Golomb ruler, one
    worker) raises KeyboardInterrupt within seconds, not at the limit. In a child process."""
    code = (
        "import os, signal, threading, time\n"
        "from ortools.sat.python import cp_model\n"
        "from optimizer.cp_solver import cp_solver, solve\n"
        "n, top = 13, 200\n"
        "m = cp_model.CpModel(); x = [m.NewIntVar(0, top, f'x{i}') for i in range(n)]\n"
        "m.Add(x[0] == 0)\n"
        "for i in range(n - 1): m.Add(x[i + 1] > x[i])\n"
        "d = [m.NewIntVar(1, top, '') for i in range(n) for j in range(i + 1, n)]\n"
        "k = 0\n"
        "for i in range(n):\n"
        "    for j in range(i + 1, n):\n"
        "        m.Add(d[k] == x[j] - x[i]); k += 1\n"
        "m.AddAllDifferent(d); m.Minimize(x[-1])\n"
        "threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "t0 = time.perf_counter()\n"
        "try:\n"
        "    status = solve(cp_solver(60.0, 1), m); print('ended', status, round(time.perf_counter() - t0))\n"
        "except KeyboardInterrupt:\n"
        "    print('KeyboardInterrupt after', round(time.perf_counter() - t0))\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, preexec_fn=sigint_as_in_a_terminal)
    assert child.returncode == 0, child.stderr
    what, seconds = child.stdout.rsplit(" ", 1)
    assert what == "KeyboardInterrupt after" and int(seconds) < 30, child.stdout


def test_a_ctrl_c_stops_both_round_seed_solves():
    """round_seed_pair runs two CP-SAT solves side by side (the second in a thread of its own): a
    SIGINT two seconds in, with a limit of 60 deterministic seconds each (minutes of wall time on
    Llama 3 405B's 128 stages), raises KeyboardInterrupt within seconds, and the second solve's
    thread has ended by then. In a child process."""
    code = (
        "import os, signal, threading, time\n"
        "from costmodel.configs import ConfigBatch\n"
        "from costmodel.loader import load_problem\n"
        "from costmodel.stage_layout import layout_context\n"
        "from optimizer.layout_linear import LinearLayouts\n"
        "from optimizer.layout_seeds import round_seed_pair\n"
        "problem = load_problem('problems/tuning/llama3_405b_16384xh100_seq8k.yaml', ['config=null'])\n"
        "cfg = ConfigBatch.from_columns(16384, tp=8, pp=16, vp=8, mbs=1, first_layers=7, last_layers=7, zero_stage=1)\n"
        "ctx = layout_context(problem, cfg); lin = LinearLayouts(ctx)\n"
        "threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "t0 = time.perf_counter()\n"
        "try:\n"
        "    found = round_seed_pair(ctx, lin, 60.0); print('ended', len(found), round(time.perf_counter() - t0))\n"
        "except KeyboardInterrupt:\n"
        "    time.sleep(0.2)\n"
        "    print('KeyboardInterrupt', threading.active_count(), round(time.perf_counter() - t0))\n")
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root,
                           preexec_fn=sigint_as_in_a_terminal)
    assert child.returncode == 0, child.stderr
    what, threads, seconds = child.stdout.split()
    assert what == "KeyboardInterrupt" and int(threads) == 1 and int(seconds) < 30, child.stdout


def golomb(n: int = 13, top: int = 200):
    """A 13-mark Golomb ruler (marks x, length x[-1]): layouts are easy to find below a long
    length, and proving none below the optimum (106) takes one worker far more than a minute."""
    model = cp_model.CpModel()
    x = [model.NewIntVar(0, top, f"x{i}") for i in range(n)]
    model.Add(x[0] == 0)
    for i in range(n - 1):
        model.Add(x[i + 1] > x[i])
    model.AddAllDifferent([x[j] - x[i] for i in range(n) for j in range(i + 1, n)])
    model.Minimize(x[-1])
    return model, x


def test_a_round_stops_once_it_has_answers_and_goes_on_while_it_has_none():
    """round_below with answers_by_s (cp_solver.solve's stop_when): asked for rulers shorter
    than 190 (answers at once), a round with a 60 s limit stops about answers_by_s in with its
    answers, not at the limit; asked for rulers shorter than 100 (there are none, and one
    worker cannot prove it in seconds), it goes past answers_by_s to its own limit."""
    model, x = golomb()
    t0 = time.perf_counter()
    status, _, answers = round_below(model, x[-1], x, 190.5e-9, 0.0, 60.0, 1, answers_by_s=0.5)
    took = time.perf_counter() - t0
    assert answers and all(answer[-1] <= 190 for answer in answers)
    assert status == cp_model.FEASIBLE and took < 30
    model, x = golomb()
    t0 = time.perf_counter()
    status, _, answers = round_below(model, x[-1], x, 99.5e-9, 0.0, 3.0, 1, answers_by_s=0.5)
    assert not answers and time.perf_counter() - t0 >= 2.5


def test_one_n_after_ctrl_c_launches_what_megatron_can(tmp_path):
    """A Ctrl-C before the search with one N, on a per-stage answer no one N gives (pp 2 x vp 2
    with per-stage recompute at 44000 MiB, where only layouts that recompute fit, every layout
    and recompute vector enumerated): the answer is the fastest that fits of its layers with the
    fewest N that fits, the configuration's own split and the packed seeds; one N gives it,
    and its bound (the per-stage answer's, which holds for every layout) is below the least
    makespan of every one-N layout that fits."""
    from costmodel.stage_layout import score_layout
    from optimizer.layout_linear import fewest_recompute
    from optimizer.layout_rounds import LayoutSolution, layout_makespan
    from optimizer.layout_report import one_n_after_ctrl_c
    from optimizer.layout_seeds import packed_seeds

    from test_layout_search import recompute_context

    ctx = recompute_context(tmp_path, 2, 2, 44000)
    scored = [(layout, score) for layout, score in enumerate_layouts(ctx) if score.fits]
    least_any = min(layout_makespan(score) for _, score in scored)
    least_one_n = min(layout_makespan(score) for layout, score in scored if layout.uniform_recompute() is not None)
    per_stage = [(layout, score) for layout, score in scored if layout.uniform_recompute() is None]
    # the configuration's own split: here the slowest one-N layout that fits (7 layers have no first/last 2 split on 4 stages)
    own = max(((layout, score) for layout, score in scored if layout.uniform_recompute() is not None), key=lambda x: layout_makespan(x[1]))[0]
    for layout, score in per_stage[::max(1, len(per_stage) // 12)]:
        found = LayoutSolution(layout, score.step_time_s, layout_makespan(score), score.bound_s, least_any, False, 1.0, True, 3,
                               interrupted=True)
        answer = one_n_after_ctrl_c(ctx, own, (found,), {})
        assert answer.interrupted and answer.fits and answer.layout.uniform_recompute() is not None
        assert score_layout(ctx, answer.layout).fits
        assert least_one_n * (1 - 1e-12) <= answer.makespan_s
        assert answer.lower_bound_s == pytest.approx(min(least_any, answer.makespan_s)) and answer.bound_source == "per-stage"
        repaired = fewest_recompute(ctx, layout.with_recompute([0] * 4), uniform=True)
        candidates = [x for x in (own, repaired, *packed_seeds(ctx, (1, 2))) if x is not None and score_layout(ctx, x).fits]
        assert answer.layout in candidates
        assert answer.makespan_s == pytest.approx(min(layout_makespan(score_layout(ctx, x)) for x in candidates), rel=1e-12)


@pytest.mark.parametrize("memory_mib", [81559, 40000])
def test_ctrl_c_in_the_dualpipev_search_returns_its_best_so_far(tmp_path, monkeypatch, memory_mib):
    """DualPipeV on pp 2 (every V layout enumerated): from the slowest V layout that fits, a
    Ctrl-C in any of vee_layout_search's CP-SAT solves (its rank bound, its rounds) returns a
    V layout that fits, no slower than the start, with a bound below every fitting V layout's
    makespan, marked interrupted; uninterrupted it certifies the least."""
    from costmodel.configs import ConfigBatch
    from costmodel.loader import load_problem
    from costmodel.stage_layout import layout_context

    from test_layout_search import TINY

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    cfg = ConfigBatch.from_columns(64, tp=8, pp=2, vp=2, ep=8, mbs=1, first_layers=2, last_layers=2, zero_stage=1, pp_schedule=4)
    ctx = layout_context(load_problem(str(path), [f"hardware.memory_mib={memory_mib}"]), cfg)
    assert ctx.vee
    fitting = [(score.pipeline_s - score.pp_exposed_s, layout) for layout, score in enumerate_layouts(ctx) if score.fits]
    best = min(value for value, _ in fitting)
    start_makespan, start = max(fitting, key=lambda x: x[0])
    # one CP-SAT worker: each run takes the same solves, so the at-th call is the same solve in
    # every run (with two, a run could take one solve fewer and miss the Ctrl-C: 1 run in 5)
    calls = interrupting(monkeypatch, 0)
    whole = vee_layout_search(ctx, 10.0, start, workers=1)
    total = len(calls)
    assert total >= 2 and whole.optimal and not whole.interrupted
    for at in range(1, total + 1):
        interrupting(monkeypatch, at)
        solution = uninterrupted(vee_layout_search, ctx, 10.0, start, workers=1)
        assert solution.interrupted and solution.fits and solution.layout.vee, at
        assert best * (1 - 1e-12) <= solution.makespan_s <= start_makespan * (1 + 1e-12)
        assert solution.lower_bound_s <= best * (1 + 1e-9)
    # the rounds alone, from that start: a Ctrl-C in their last solve keeps what they found
    calls = interrupting(monkeypatch, 0)
    found, _, proven, _, stopped = vee_rounds(ctx, start, memo_scorer(ctx), time.perf_counter() + 10.0, workers=1)
    assert proven and not stopped and found != start
    interrupting(monkeypatch, len(calls))
    kept, bound, proven, _, stopped = uninterrupted(vee_rounds, ctx, start, memo_scorer(ctx), time.perf_counter() + 10.0, workers=1)
    assert stopped and not proven and kept == found and bound <= best * (1 + 1e-9)
