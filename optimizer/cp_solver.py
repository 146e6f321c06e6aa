"""One way to make and run a CP-SAT solver, for every search here (optimizer.cpsat, the layout
search), with Ctrl-C kept working.

OR-Tools' own SIGINT handling (`catch_sigint_signal`, on by default) stops a solve gracefully,
but leaves the process's SIGINT disposition at the OS default after it (OR-Tools 9.15,
measured: a SIGINT after any solve ended the process with no KeyboardInterrupt). So a Ctrl-C
during `mofa solve --pipeline-layouts` killed it outright, printing nothing, the solved
configuration included. Two uses:
- the skeleton search (optimizer.cpsat) keeps OR-Tools' handling, `ctrl_c_stops_search`: a
  Ctrl-C stops the search as a time limit would and the best configuration so far is reported;
  `solve` then puts Python's handler back;
- the layout search leaves Ctrl-C to Python: `solve` runs its solves in a worker thread, so
  that a Ctrl-C stops the running one at once (stop_search) and raises KeyboardInterrupt in the
  caller; the layout search then returns the best layout it has, with the bound proven so far
  (`LayoutSolution.interrupted`), as a time limit would. Before, the KeyboardInterrupt waited
  for the running solve's own time limit: a round that had the rest of a long --time-limit
  kept a Ctrl-C waiting that long.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from ortools.sat.python import cp_model


def cp_solver(time_limit_s: float | None = None, workers: int = 1, random_seed: int = 0,
              ctrl_c_stops_search: bool = False) -> cp_model.CpSolver:
    """A CpSolver with a wall-clock limit (at least 50 ms; None: none), `workers` and a fixed
    seed; Ctrl-C stops its search (run it with `solve`) or is left to Python (see above)."""
    solver = cp_model.CpSolver()
    solver.parameters.catch_sigint_signal = bool(ctrl_c_stops_search)
    solver.parameters.random_seed = int(random_seed)
    solver.parameters.num_workers = int(workers)
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = max(0.05, float(time_limit_s))
    return solver


def set_domain(model: cp_model.CpModel, var, low: int, high: int) -> None:
    """Set a variable's domain to [low, high] between solves of one model, through its proto (no
    new constraint: presolve then drops the constraints the value decides). The layout search's
    parts fix their booleans this way, least_recompute its per-L layer total and row bounds."""
    domain = model.Proto().variables[var.Index()].domain
    domain[0], domain[1] = int(low), int(high)


def solve(solver: cp_model.CpSolver, model: cp_model.CpModel, callback: cp_model.CpSolverSolutionCallback | None = None,
          stop_when: Callable[[], bool] | None = None):
    """solver.Solve. Where the solver catches SIGINT itself, Python's handler is put back after
    (OR-Tools leaves the OS default there), so that a later Ctrl-C still raises KeyboardInterrupt.
    Where Ctrl-C is left to Python, on the main thread, the solve runs in a worker thread while
    this one waits: a Python signal handler runs only between bytecodes of the main thread, so
    a Solve called there would hold a Ctrl-C until its time limit. On KeyboardInterrupt the
    search is stopped (stop_search, which OR-Tools allows from another thread), its thread
    waited for, and the KeyboardInterrupt raised again. `stop_when` (where Ctrl-C is left to
    Python): checked every 50 ms while the solve runs (in a worker thread then, on any thread);
    once it holds, the search is stopped as a time limit would stop it (the layout search's
    rounds: they stop once they have answers and go on while they have none)."""
    run = (lambda: solver.Solve(model, callback)) if callback is not None else (lambda: solver.Solve(model))
    main = threading.current_thread() is threading.main_thread()
    if solver.parameters.catch_sigint_signal:
        try:
            return run()
        finally:
            if main:
                signal.signal(signal.SIGINT, signal.getsignal(signal.SIGINT))
    if not main and stop_when is None:
        return run()
    done, outcome = in_thread(run, "cp-sat")
    try:
        while not done.wait(0.05):
            if stop_when is not None and stop_when():
                solver.stop_search()
    except KeyboardInterrupt:
        # again until it ends: a stop asked before the solve has begun is lost (OR-Tools 9.15)
        solver.stop_search()
        while not done.wait(0.05):
            solver.stop_search()
        raise
    return result(outcome)


def in_thread(fn: Callable[[], object], name: str) -> tuple[threading.Event, dict]:
    """Run fn() in a daemon thread: (an Event set when it ends, the dict its outcome lands in,
    `value` or `error`; `result` reads it). Wait on the Event with timed waits, not Thread.join:
    a KeyboardInterrupt inside join(timeout) can leave the thread's lock so that a later join
    returns before the thread ends (measured)."""
    done, outcome = threading.Event(), {}

    def worker():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread by result()
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=worker, name=name, daemon=True).start()
    return done, outcome


def result(outcome: dict):
    """What in_thread's fn returned, or its exception raised here."""
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
