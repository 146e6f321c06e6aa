"""Batch runs: many problems (sweeps expanded) solved by a pool of workers, each finished run
written to its own folder the moment it finishes, and a summary table of them all.

A batch folder holds

    batch.json            what was asked: the inputs, the solve options, the runs in order
    runs/NAME/            one folder per run, replaced as a set (mofa.atomic.write_file_set):
        run.json          the completion marker: name, input file, swept values, input hash, status
        problem.json      the expanded, validated problem (what `mofa report` re-reads)
        result.json, best.yaml, the launch files, export_errors.txt   (as `solve --out` writes them)
        failed.json       instead of the result: the run's one-line error
    summary/              summary.csv, summary.jsonl (and summary.parquet with pyarrow), as a set

Because a run folder appears whole or not at all, a batch killed at any moment (SIGKILL
included) loses no finished run and leaves no half-written one; `--resume` skips each run
whose folder holds a result made from the same input (the hash of the validated problem and
the solve options, so an edited problem file or a changed preset reruns). Failed runs are
retried on resume. The summary is rebuilt from the run folders, so a resumed batch's table
holds every run whichever process solved it.

Runs are solved where the backend puts them (a local process pool, or Ray tasks that may run
on other machines); the files come back to this process, which writes them.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from costmodel.loader import ProblemError
from mofa.atomic import check_target, write_atomically, write_file_set
from mofa.commands.solve import OUTPUT_FILES
from mofa.version import version

RUNS = "runs"
SUMMARY = "summary"
MANIFEST = "batch.json"
MARKER = "run.json"
FAILED = "failed.json"
PROBLEM = "problem.json"
#: the files of a run folder (a folder holding only these may be replaced)
RUN_FILES = OUTPUT_FILES + (MARKER, FAILED, PROBLEM)
#: what may sit at the top of a batch folder (anything else: it is not a batch folder)
BATCH_ENTRIES = (MANIFEST, RUNS, SUMMARY, "report")


@dataclass(frozen=True)
class SolveOptions:
    method: str = "cpsat"
    objective: str | None = None
    top: int = 3
    time_limit_s: float | None = None
    distinct_layouts: bool = False

    def as_dict(self) -> dict:
        """The options as the manifest and the input hash record them. distinct_layouts only
        when set: batches written before the option existed still resume without redoing."""
        out = {"method": self.method, "objective": self.objective, "top": self.top, "time_limit_s": self.time_limit_s}
        if self.distinct_layouts:
            out["distinct_layouts"] = True
        return out


@dataclass(frozen=True)
class Job:
    """One run: a problem (None when its file could not be loaded: `error` says why)."""

    name: str
    source: str
    values: dict = field(default_factory=dict)
    problem: object = None  # costmodel.specs.Problem
    error: str | None = None
    input_hash: str = ""


def problem_files(inputs: Iterable[str]) -> list[str]:
    """Problem files of the arguments: a file as given, a folder's *.yaml files (sorted, not
    recursive). ProblemError for a path that is neither, or a folder without problems."""
    files = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(str(f) for f in p.glob("*.yaml") if f.is_file())
            if not found:
                raise ProblemError(item, None, "folder holds no problem files (*.yaml)")
            files += found
        elif p.exists():
            files.append(item)
        else:
            raise ProblemError(item, None, "file not found")
    return files


def input_hash(problem, options: SolveOptions) -> str:
    """What a run's result depends on: the validated problem (presets resolved, so a changed
    preset counts), the solve options and the tool's version."""
    doc = {"problem": problem.model_dump(mode="json"), "options": options.as_dict(), "mofa_version": version()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _error_hash(source: str, message: str, options: SolveOptions) -> str:
    return hashlib.sha256(json.dumps([source, message, options.as_dict(), version()]).encode()).hexdigest()


def collect_jobs(inputs: Iterable[str], options: SolveOptions, overrides: list[str] | None = None) -> list[Job]:
    """The runs of the inputs, sweeps expanded, in argument and file order. A file that cannot
    be loaded is one failed run (named by its stem) carrying its one-line error; two runs with
    the same name are a ProblemError (their folders would collide)."""
    from costmodel.loader import load_problems

    jobs: list[Job] = []
    seen: dict[str, str] = {}
    for path in problem_files(inputs):
        try:
            expanded = load_problems(path, overrides)
        except ProblemError as exc:
            name = Path(path).stem
            expanded = None
            new = [Job(name, path, error=str(exc), input_hash=_error_hash(path, str(exc), options))]
        if expanded is not None:
            new = [Job(name, path, values, problem, input_hash=input_hash(problem, options)) for name, values, problem in expanded]
        for job in new:
            if job.name in seen:
                raise ProblemError(path, None, f"a run named '{job.name}' comes from {seen[job.name]} too: rename one file")
            seen[job.name] = path
            jobs.append(job)
    return jobs


# --------------------------------------------------------------------------------------
# one run
# --------------------------------------------------------------------------------------
def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _marker(job: Job, status: str, wall_s: float) -> dict:
    meta = {"mofa_version": version(), "name": job.name, "input": job.source, "sweep": job.values, "input_hash": job.input_hash, "status": status, "wall_s": wall_s}
    p = job.problem
    if p is not None:
        meta.update(model=p.model.name, hardware=p.hardware.name, num_gpus=p.cluster.num_gpus, gpus_per_node=p.cluster.gpus_per_node,
                    supernode_size=p.cluster.supernode_size, global_batch_size=p.training.global_batch_size, seq_len=p.training.seq_len)
    return meta


def _dumps(obj) -> str:
    return json.dumps(obj, indent=2, allow_nan=False) + "\n"


def run_job(job: Job, options: SolveOptions) -> dict[str, str]:
    """Solve one run: {file name: text} of its folder. Never raises for the run's own failure
    (an error in the problem, or an exception in the search): that is failed.json with one
    line, so the batch goes on."""
    from mofa.commands.solve import output_files, solve_output

    start = time.perf_counter()
    if job.error is not None:
        files = {FAILED: _dumps({"name": job.name, "input": job.source, "error": _one_line(job.error)})}
        files[MARKER] = _dumps(_marker(job, "failed", time.perf_counter() - start))
        return files
    try:
        out, plans = solve_output(job.problem, job.source, options.method, options.objective, options.top, options.time_limit_s,
                                  options.distinct_layouts)
        files = output_files(job.problem, out, plans)
        status = out["status"]
    except ProblemError as exc:
        files, status = {FAILED: _dumps({"name": job.name, "input": job.source, "error": _one_line(exc)})}, "failed"
    except Exception as exc:  # a bug or a resource failure in one run must not end the batch
        where = traceback.extract_tb(exc.__traceback__)[-1]
        message = f"{job.source}: {type(exc).__name__}: {_one_line(exc)} (at {Path(where.filename).name}:{where.lineno})"
        files, status = {FAILED: _dumps({"name": job.name, "input": job.source, "error": message})}, "failed"
    files[PROBLEM] = job.problem.model_dump_json(indent=1) + "\n"
    files[MARKER] = _dumps(_marker(job, status, time.perf_counter() - start))
    return files


# --------------------------------------------------------------------------------------
# the batch folder
# --------------------------------------------------------------------------------------
class BatchFolderError(OSError):
    pass


def run_folder(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, RUNS, name)


def read_json(path: str):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def is_done(out_dir: str, job: Job) -> bool:
    """The run's folder holds a result made from this input (its marker is written with the
    result, as one set, so a marker means the whole folder is there)."""
    marker = read_json(os.path.join(run_folder(out_dir, job.name), MARKER))
    return isinstance(marker, dict) and marker.get("input_hash") == job.input_hash and marker.get("status") != "failed"


def prepare_folder(out_dir: str, jobs: list[Job], options: SolveOptions, inputs: list[str], resume: bool) -> None:
    """Check the batch folder and write its manifest. A folder holding a batch is only reused
    with resume; a folder holding anything else is refused (BatchFolderError)."""
    if os.path.lexists(out_dir):
        if not os.path.isdir(out_dir):
            raise BatchFolderError(f"{out_dir} exists and is not a folder")
        entries = sorted(os.listdir(out_dir))
        foreign = [e for e in entries if e not in BATCH_ENTRIES and not e.startswith(".")]
        if foreign:
            raise BatchFolderError(f"{out_dir} holds files mofa batch did not write ({', '.join(foreign[:5])}); give a new or empty folder")
        if entries and not resume and (MANIFEST in entries or RUNS in entries):
            raise BatchFolderError(f"{out_dir} already holds a batch: add --resume to continue it, or give a new folder")
        runs = os.path.join(out_dir, RUNS)
        if os.path.isdir(runs):
            for job in jobs:
                if os.path.lexists(run_folder(out_dir, job.name)):
                    check_target(run_folder(out_dir, job.name), RUN_FILES)
    os.makedirs(os.path.join(out_dir, RUNS), exist_ok=True)
    manifest = {"mofa_version": version(), "input": inputs, "options": options.as_dict(), "runs": [{"name": j.name, "input": j.source, "sweep": j.values} for j in jobs]}
    write_atomically(os.path.join(out_dir, MANIFEST), _dumps(manifest))


def write_run(out_dir: str, name: str, files: dict[str, str]) -> None:
    write_file_set(run_folder(out_dir, name), files, owned=RUN_FILES)


# --------------------------------------------------------------------------------------
# backends: each yields (job, files) as runs finish
# --------------------------------------------------------------------------------------
def _serial(jobs: list[Job], options: SolveOptions):
    for job in jobs:
        yield job, run_job(job, options)


def _local(jobs: list[Job], options: SolveOptions, workers: int):
    """A process pool. Spawned workers (not forked): OR-Tools' threads and a fork do not mix."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(run_job, job, options): job for job in jobs}
        for future in as_completed(futures):
            yield futures[future], future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _ray(jobs: list[Job], options: SolveOptions, workers: int, address: str | None):
    """Ray tasks, one per run (each reserving one CPU); the files come back here. With no
    address (neither --ray-address nor RAY_ADDRESS) a local Ray instance is started."""
    import ray

    started = False
    if not ray.is_initialized():
        kwargs = {"address": address} if address else {"num_cpus": workers}
        ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", **kwargs)
        started = True
    try:
        task = ray.remote(num_cpus=1)(run_job)
        pending = {task.remote(job, options): job for job in jobs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), ray.get(ref)
    finally:
        if started:
            ray.shutdown()


def execute(jobs: list[Job], options: SolveOptions, out_dir: str, workers: int = 1, backend: str = "local",
            ray_address: str | None = None, on_done: Callable[[Job, str], None] | None = None) -> dict[str, int]:
    """Solve `jobs` and write each run's folder as it finishes; {'done': n, 'failed': n}."""
    counts = {"done": 0, "failed": 0}
    if not jobs:
        return counts
    if backend == "ray":
        stream = _ray(jobs, options, workers, ray_address)
    elif workers <= 1 or len(jobs) == 1:
        stream = _serial(jobs, options)
    else:
        stream = _local(jobs, options, min(workers, len(jobs)))
    for job, files in stream:
        write_run(out_dir, job.name, files)
        status = "failed" if FAILED in files else "done"
        counts[status] += 1
        if on_done is not None:
            on_done(job, status)
    return counts
