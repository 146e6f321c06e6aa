"""The launch files the framework tests check: every shipped problem (problems/tuning,
problems/mofa) solved with `mofa solve --out` as a user would, and its result.json exported
with `mofa export`'s own path (load_plan, then the exporter), for the three best
configurations.

A shipped problem's best configurations are often ones a framework cannot express (ZeRO-2
with a pipeline, TP for plain DeepSpeed, a CP variant torchtitan lacks): the exporter refuses
those with the reason, and the tests check the refusal. So that each framework's own code
also sees configurations it can run from every problem where one exists, each problem is
solved a second time per framework with the search restricted to what that framework runs
(`--set search.framework=...`, the exporter's own rules); those results are exported the same
way. A narrowed problem the search
finds infeasible is recorded as such (the framework cannot train that model on that cluster).

Solving is the slow part: it runs once per test session, in two worker processes, into a
temporary folder; MOFA_FRAMEWORK_RESULTS=DIR keeps it (reused when it holds the results)."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import pathlib
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROBLEMS = sorted([*(ROOT / "problems" / "tuning").glob("*.yaml"), *(ROOT / "problems" / "mofa").glob("*.yaml")])
TOP = 3

#: the search restricted to what each framework runs: search.framework applies the very rules
#: its exporter refuses by (costmodel.frameworks); torchtitan reduces gradients in fp32 only, a
#: property of the run the problem states, not a search choice
NARROWED = {
    "megatron": ["search.framework=megatron"],
    "torchtitan": ["search.framework=torchtitan", "training.dtypes.grads=fp32"],
    "deepspeed": ["search.framework=deepspeed"],
    # DeepSeek-V3's own pipeline degree: no split flag splits 61 layers over pp 16 x vp 2, so
    # the plan is launched with the layout split's --pipeline-model-parallel-layout
    "megatron-layout": ["search.framework=megatron", "search.pp=[16]", "search.vp=[2]"],
    # Megatron's fine-grained activation offload (its module list checked by TransformerConfig; the
    # Bridge export refuses it: its validation needs NVTE_CPU_OFFLOAD_V1=1, which an override file cannot set)
    "megatron-offload": ["search.framework=megatron", "features.activation_offload=on",
                         "search.activation_offload=[[core_attn, attn_proj], [qkv_linear, core_attn, attn_proj]]"],
    # DualPipeV on pp 16: Llama 3 405B's 126 layers take its uneven V split (6 on rank 0, 8 elsewhere)
    "torchtitan-dualpipev": ["search.framework=torchtitan", "training.dtypes.grads=fp32", "search.pp=[16]", "search.pp_schedule=[dualpipev]"],
}
#: torchtitan's only Llama 3 405B config function quantizes its GEMMs to fp8 (Float8LinearConverter)
NARROWED_EXTRA = {("torchtitan", "llama3-405b"): ["training.dtypes.compute=fp8"], ("torchtitan-dualpipev", "llama3-405b"): ["training.dtypes.compute=fp8"]}
#: one solve takes ~15 s on the 2-core machine, so CI solves these (problem, search) pairs, one
#: or more per model (~1.5 min); MOFA_FRAMEWORK_ALL=1 solves every shipped problem with the
#: default search and each narrowed one (~110 solves, ~10 min)
QUICK = (("llama3_405b_16384xh100_seq8k", "default"), ("llama3_405b_16384xh100_seq8k", "megatron"),
         ("llama3_405b_16384xh100_seq8k", "torchtitan"), ("llama3_405b_16384xh100_seq8k", "torchtitan-dualpipev"), ("llama3_405b_8192gpu_gbs8192", "default"),
         ("table5_llama3_405b_64gpu", "default"), ("deepseek_v3_1024gpu_sn8", "default"),
         ("deepseek_v3_8192gpu_sn256", "default"), ("table5_deepseek_v3_128gpu", "default"),
         ("deepseek_v3_1024gpu_sn8", "deepspeed"), ("deepseek_v3_1024gpu_sn8", "megatron-layout"), ("llama2_70b_128gpu", "default"),
         ("llama3_405b_16384xh100_seq8k", "megatron-offload"),
         ("llama2_70b_128gpu", "deepspeed"))
#: which export format each narrowed search serves
NARROWED_FORMATS = {"megatron": ("megatron", "megatron-bridge"), "torchtitan": ("torchtitan",), "deepspeed": ("deepspeed",),
                    "megatron-layout": ("megatron", "megatron-bridge"), "megatron-offload": ("megatron",),
                    "torchtitan-dualpipev": ("torchtitan",)}


def need(module: str):
    """The framework module, or a skip when it is not installed. With MOFA_FRAMEWORK_TESTS=1
    (set by .ci/frameworks, whose environment has every framework) a missing one fails."""
    if os.environ.get("MOFA_FRAMEWORK_TESTS") == "1":
        import importlib
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is not installed (the framework environment: .ci/frameworks)")


@dataclass(frozen=True)
class Export:
    problem: str      # the problem file's stem
    search: str       # "default" or the framework the search was narrowed to
    rank: int         # 1 = the best configuration of that result
    result: str       # the result.json it came from
    fmt: str
    label: str        # the configuration
    text: str | None  # the exported file, None when refused
    refused: str | None
    plan: object = None

    @property
    def name(self) -> str:
        return f"{self.problem}[{self.search}#{self.rank}]"


def _solve(job: tuple[str, str, list[str], str]) -> tuple[str, str, str, int]:
    """Run `mofa solve` (the CLI, in this worker) into its folder; (problem, search, folder, exit code)."""
    from mofa.cli import main

    path, search, sets, folder = job
    argv = ["solve", path, "--top", str(TOP), "--out", folder]
    for s in sets:
        argv += ["--set", s]
    result = os.path.join(folder, "result.json")
    if os.path.exists(result):
        return path, search, folder, 0
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    if code not in (0, 1):  # 1: nothing to launch; anything else is a broken narrowing
        raise RuntimeError(f"mofa {' '.join(argv)}: exit {code}: {err.getvalue()}")
    return path, search, folder, code


def _model(path: pathlib.Path) -> str:
    from costmodel.loader import load_problem
    return load_problem(str(path)).model.name


def _status(folder: str) -> str:
    import json
    try:
        with open(os.path.join(folder, "result.json")) as fh:
            return json.load(fh)["status"]
    except FileNotFoundError:
        return "not written"


@functools.lru_cache(maxsize=None)
def solved() -> tuple[tuple[str, str, str, int], ...]:
    """(problem stem, search, result folder, exit code) of every shipped problem and search."""
    base = os.environ.get("MOFA_FRAMEWORK_RESULTS") or tempfile.mkdtemp(prefix="mofa-framework-results-")
    jobs = []
    for path in PROBLEMS:
        model = _model(path)
        for search, sets in [("default", []), *NARROWED.items()]:
            if os.environ.get("MOFA_FRAMEWORK_ALL") != "1" and (path.stem, search) not in QUICK:
                continue
            sets = [*sets, *NARROWED_EXTRA.get((search, model), [])]
            jobs.append((str(path), search, sets, os.path.join(base, path.stem, search)))
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        done = list(pool.map(_solve, jobs))
    return tuple((pathlib.Path(p).stem, s, folder, code) for p, s, folder, code in done)


@functools.lru_cache(maxsize=None)
def exports(fmt: str) -> tuple[Export, ...]:
    """Every export of `fmt` from the shipped results: the default search's top configurations
    and those of the search narrowed for `fmt`'s framework, each exported as `mofa export` does."""
    from mofa.commands.export import load_plan
    from mofa.launch import ExportError, export

    out = []
    for problem, search, folder, code in solved():
        if search != "default" and fmt not in NARROWED_FORMATS[search]:
            continue
        result = os.path.join(folder, "result.json")
        if not os.path.exists(result):
            continue  # infeasible: nothing to launch (recorded by infeasible())
        rank = 1
        while True:
            plan, error = load_plan(result, rank)
            if plan is None:
                assert "holds" in error or "no configuration" in error, error  # past the last configuration
                break
            try:
                text, refused = export(plan, fmt), None
            except ExportError as exc:
                text, refused = None, str(exc)
            out.append(Export(problem, search, rank, result, fmt, plan.label(), text, refused, plan))
            rank += 1
    return tuple(out)


def accepted(fmt: str) -> list[Export]:
    return [e for e in exports(fmt) if e.text is not None]


def refused(fmt: str) -> list[Export]:
    return [e for e in exports(fmt) if e.text is None]


def infeasible() -> list[tuple[str, str]]:
    """(problem, search) pairs whose solve found nothing to launch."""
    return [(p, s) for p, s, folder, code in solved() if code != 0 or _status(folder) in ("infeasible", "unknown", "not written")]


def coverage() -> str:
    """Which problems each format was exported (or refused) for: the report the tests print."""
    lines = []
    for fmt in ("megatron", "megatron-bridge", "torchtitan", "deepspeed"):
        ok = sorted({e.problem for e in accepted(fmt)})
        lines.append(f"{fmt}: {len(accepted(fmt))} exported from {len(ok)} problems, {len(refused(fmt))} refused")
    return "\n".join(lines)
