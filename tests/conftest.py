import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROBLEMS = ROOT / "problems"
__all__ = ["ROOT", "PROBLEMS", "sigint_as_in_a_terminal"]


def sigint_as_in_a_terminal() -> None:
    """preexec_fn of the child processes whose Ctrl-C the tests send: SIGINT back at the OS
    default, as a terminal leaves it. A runner that starts the tests with SIGINT ignored (a
    background job of a shell without job control, nohup) hands that on to every child, where
    Python then installs no KeyboardInterrupt handler and the signal does nothing."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
