"""`mofa batch`: solve many problems (sweeps expanded), each run written to its own folder the
moment it finishes, then a summary table (mofa.batch, mofa.summary)."""

from __future__ import annotations

import os
import sys

NAME = "batch"
HELP = "solve many problems (sweeps expanded) into a batch folder with a summary table"
DESCRIPTION = ("Solve every problem of the given files and folders (a folder: its *.yaml files), a file's sweep expanded to one "
               "problem per combination. Each run is written to OUT/runs/NAME as soon as it finishes (result.json, best.yaml, launch "
               "files, or failed.json with its one-line error), replacing the folder as a set; OUT/summary/ holds summary.csv and "
               "summary.jsonl (and summary.parquet with pyarrow). A killed batch loses no finished run; --resume skips them. "
               "Exit code 0 when every run produced a result, 1 when some failed, 2 for bad arguments.")

EXIT_SOME_FAILED = 1


def add_arguments(p) -> None:
    from mofa.commands._common import add_convention_option
    from mofa.commands.solve import add_distinct_option

    p.add_argument("inputs", nargs="+", metavar="PROBLEMS_OR_DIRS", help="problem files (YAML) and folders of them")
    p.add_argument("--out", required=True, metavar="DIR", help="the batch folder (new, or an earlier batch with --resume)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="N", help="runs solved at once (default: the number of CPUs)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local: a process pool on this machine; ray: Ray tasks (pip install 'mofa[ray]')")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="the Ray cluster to use (default: $RAY_ADDRESS, else a local Ray instance with --workers CPUs)")
    p.add_argument("--resume", action="store_true", help="continue the batch in --out: skip every run already solved from the same input")
    p.add_argument("--method", choices=("cpsat", "dfs", "exhaustive"), default="cpsat", help="search method of each run (see mofa solve)")
    p.add_argument("--objective", choices=("step", "e2e"), help="minimise the step time or the end-to-end time (default: each problem's search.objective)")
    p.add_argument("--top", type=int, default=3, metavar="K", help="keep the K best configurations of each run (the report compares them)")
    p.add_argument("--time-limit", type=float, metavar="S", help="stop each run's search after S seconds (default: no limit)")
    add_convention_option(p)
    add_distinct_option(p)


class _Progress:
    """A progress bar with the live done/failed count (rich) on a terminal; one line per
    finished run otherwise (a log file gets a readable record, not escape codes)."""

    def __init__(self, total: int, skipped: int):
        self.total, self.skipped = total, skipped
        self.done = self.failed = 0
        self.bar = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                                console=Console(stderr=True))
            self.task = self.bar.add_task(self._text(), total=total)

    def _text(self) -> str:
        return f"done {self.done}  failed {self.failed}" + (f"  skipped {self.skipped}" if self.skipped else "")

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
        elif self.skipped:
            print(f"mofa batch: {self.skipped} run(s) already done, skipped", file=sys.stderr)
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()

    def update(self, job, status: str) -> None:
        if status == "failed":
            self.failed += 1
        else:
            self.done += 1
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=self._text())
        else:
            print(f"[{self.done + self.failed}/{self.total}] {job.name}: {status} ({self._text()})", file=sys.stderr, flush=True)


def _fail(message: str) -> int:
    print(f"mofa batch: {message}", file=sys.stderr)
    return 2


def run(args) -> int:
    import math

    from mofa.atomic import write_file_set
    from mofa.commands._common import convention_sets
    from mofa.batch import SUMMARY, BatchFolderError, SolveOptions, collect_jobs, execute, is_done, prepare_folder, run_folder
    from mofa.summary import SUMMARY_FILES, rows_of, summary_files

    if args.workers < 1:
        return _fail("--workers must be at least 1")
    if args.top < 1:
        return _fail("--top must be at least 1")
    if args.time_limit is not None and not (args.time_limit > 0 and math.isfinite(args.time_limit)):
        return _fail("--time-limit must be positive")
    address = args.ray_address or os.environ.get("RAY_ADDRESS") or None
    if args.backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            return _fail("--backend ray needs Ray: pip install 'mofa[ray]'")
    options = SolveOptions(args.method, args.objective, args.top, args.time_limit, args.distinct_layouts)
    jobs = collect_jobs(args.inputs, options, convention_sets(args) or None)  # ProblemError (exit 2): a missing input, colliding run names
    try:
        prepare_folder(args.out, jobs, options, list(args.inputs), args.resume)
    except OSError as exc:
        return _fail(f"cannot write to --out {args.out}: {exc.strerror or exc}" if not isinstance(exc, BatchFolderError) else str(exc))
    todo = [job for job in jobs if not (args.resume and is_done(args.out, job))]
    with _Progress(len(todo), len(jobs) - len(todo)) as progress:
        counts = execute(todo, options, args.out, args.workers, args.backend, address, on_done=progress.update)
    rows = rows_of([run_folder(args.out, job.name) for job in jobs])
    write_file_set(os.path.join(args.out, SUMMARY), summary_files(rows), owned=SUMMARY_FILES)
    failed = sum(1 for row in rows if row["status"] == "failed")
    print(f"{len(rows)} runs: {len(rows) - failed} solved, {failed} failed ({counts['done'] + counts['failed']} this time, "
          f"{len(jobs) - len(todo)} skipped as done); summary in {os.path.join(args.out, SUMMARY)}")
    for row in rows:
        if row["status"] == "failed":
            print(f"  failed: {row['run']}: {row['error']}")
    return EXIT_SOME_FAILED if failed else 0
