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
- the layout search leaves Ctrl-C to Python: it raises KeyboardInterrupt when the running solve
  returns (at its time limit, a few seconds in the layout rounds), and `mofa solve` keeps the
  configuration with its own split (mofa.commands.solve.solve_output).
"""

from __future__ import annotations

import signal
import threading

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


def solve(solver: cp_model.CpSolver, model: cp_model.CpModel, callback: cp_model.CpSolverSolutionCallback | None = None):
    """solver.Solve; where the solver caught SIGINT itself, Python's handler is put back after
    (OR-Tools leaves the OS default there), so that a later Ctrl-C still raises KeyboardInterrupt."""
    try:
        return solver.Solve(model, callback) if callback is not None else solver.Solve(model)
    finally:
        if solver.parameters.catch_sigint_signal and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.getsignal(signal.SIGINT))
