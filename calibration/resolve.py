"""Resolve the fields a source leaves unstated: the optimizer picks the fastest admissible
value under everything the source does state (the assumption being that the authors ran a
well-tuned configuration), with the hardware profile being calibrated."""

from __future__ import annotations

from calibration.data import COMPUTE_DTYPE, Point, local_batch, with_compute_dtype
from costmodel.configs import ConfigBatch
from costmodel.evaluate import evaluate
from costmodel.layout import layout_name
from costmodel.rules import config_violations
from costmodel.specs import FEATURES, ConfigSpec, HardwareSpec, Problem
from costmodel.units import GIB
from optimizer.exhaustive import solve_exhaustive

#: the key of a resolution that says why the model cannot explain the point
UNEXPLAINED = "unexplained"


def resolve(point: Point, hardware: HardwareSpec | None = None) -> tuple[ConfigBatch | None, dict]:
    """(the configuration to score, the values chosen for the unknown fields). A point the
    model cannot explain -- its stated configuration does not fit the memory estimate, or no
    admissible value of its unknown fields fits -- says so under the key UNEXPLAINED; its
    configuration (None when no admissible one exists) is returned for display only and is never
    scored into an accuracy figure. An unknown GEMM dtype (COMPUTE_DTYPE) is chosen like the
    configuration's fields and lands among the picks: evaluate the point as point.resolved(picks)."""
    problem = point.problem if hardware is None else point.problem.model_copy(update={"hardware": hardware})
    unknown = point.unknown
    if COMPUTE_DTYPE in unknown:
        rest = tuple(u for u in unknown if u != COMPUTE_DTYPE)
        dtypes = [d for d in MIXED_PRECISION_DTYPES if d in problem.hardware.peak_tflops]
        return _fastest([({COMPUTE_DTYPE: d}, with_compute_dtype(problem, d), point.microbatches, rest) for d in dtypes],
                        f"{problem.hardware.name} runs none of {', '.join(MIXED_PRECISION_DTYPES)}")
    return _resolve_point(problem, point.microbatches, unknown)


#: the GEMM dtypes an unstated mixed-precision run may have used, in the order ties go
MIXED_PRECISION_DTYPES = ("bf16", "fp8")


def _resolve_point(problem: Problem, microbatches: str, unknown: tuple[str, ...]) -> tuple[ConfigBatch | None, dict]:
    if microbatches == "per_pipeline_stage" and "vp" in unknown:
        return _resolve_per_stage_microbatches(problem, unknown)
    return _resolve(problem, unknown)


def _fastest(candidates: list[tuple[dict, Problem, str, tuple[str, ...]]], none: str) -> tuple[ConfigBatch | None, dict]:
    """The fastest explained resolution of (fixed picks, problem, micro-batch rule, unknown
    fields) candidates, its picks with the fixed ones; else the first failure (or `none`)."""
    best, failure = None, None
    for fixed, sub, microbatches, unknown in candidates:
        cfg, picks = _resolve_point(sub, microbatches, unknown)
        if cfg is not None and UNEXPLAINED not in picks:
            step = float(evaluate(sub, cfg.take([0])).step_time_s[0])
            if best is None or step < best[0]:
                best = (step, cfg, {**fixed, **picks})
        elif failure is None:
            failure = (cfg, {**fixed, **picks})
    if best is not None:
        return best[1], best[2]
    return failure or (None, {UNEXPLAINED: none})


def _resolve_per_stage_microbatches(problem: Problem, unknown: tuple[str, ...]) -> tuple[ConfigBatch | None, dict]:
    """vp unknown under torchtitan's one micro-batch per pipeline stage: every vp whose pp x vp
    micro-batches divide the local batch is resolved with its micro-batch size, the fastest wins."""
    known = problem.config
    local = local_batch(problem)
    rest = tuple(u for u in unknown if u not in ("vp", "mbs"))
    least_vp = 2 if known.pp_schedule == "interleaved_1f1b" else 1
    candidates = []
    for vp in range(least_vp, int(min(local, problem.model.num_layers) // known.pp) + 1):  # a stage holds a layer at least
        mbs = local / (known.pp * vp)
        if mbs != int(mbs):
            continue
        sub = problem.model_copy(update={"config": known.model_copy(update={"vp": vp, "mbs": int(mbs)})})
        candidates.append(({"vp": vp, "mbs": int(mbs)}, sub, "stated", rest))
    return _fastest(candidates, "no vp gives a whole number of micro-batches per pipeline stage")


def _resolve(problem: Problem, unknown: tuple[str, ...]) -> tuple[ConfigBatch | None, dict]:
    known: ConfigSpec = problem.config
    if not unknown:
        cfg = ConfigBatch.from_specs(problem, [known])
        peak = float(evaluate(problem, cfg).memory_bytes["peak"][0])
        if peak > problem.hardware.memory_bytes:
            return cfg, {UNEXPLAINED: f"the stated configuration needs {peak / GIB:.1f} of {problem.hardware.memory_bytes / GIB:.1f} GiB in the model's memory estimate"}
        return cfg, {}
    fixed = ConfigBatch.from_specs(problem, [known])
    search = {"tp": [known.tp], "cp": [known.cp], "pp": [known.pp], "ep": [known.ep]}
    if known.etp is not None:
        search["etp"] = [known.etp]
    if "vp" not in unknown:
        search["vp"] = [known.vp]
    if "mbs" not in unknown:
        search["mbs"] = [known.mbs]
    if known.first_stage_layers is not None or known.last_stage_layers is not None or "vp" not in unknown:
        # a known layout: keep its first/last stage layers
        first, last = int(fixed.first_layers[0]), int(fixed.last_layers[0])
        search["layer_split"] = [_layout_of(problem, known, first, last)]
    elif known.layer_split != "auto":
        search["layer_split"] = [known.layer_split]
    features = {}
    for name in FEATURES:
        features[name] = "allowed" if name in unknown else ("on" if getattr(known, name) else "off")
    features["recompute"] = ["none", "selective", "full"] if "recompute" in unknown else [known.recompute]
    features["zero_stage"] = [known.zero_stage]
    features["activation_offload"] = "on" if known.activation_offload else "off"
    reshard = known.reshard_after_forward if known.reshard_after_forward is not None else True
    features["fsdp_reshard_after_forward"] = "on" if reshard else "off"
    search["activation_offload"] = [known.activation_offload if known.activation_offload is not True else "layer"]
    search["cp_comm"] = [known.cp_comm]
    if known.cp_a2a:
        search["cp_a2a"] = [known.cp_a2a]
    if known.dp_shard:
        search["dp_shard"] = [known.dp_shard]
    if known.recompute == "selective":
        search["recompute_modules"] = [known.recompute_modules or ["core_attn"]]
    if known.recompute == "full" and known.recompute_method == "block" and known.recompute_num_layers:
        search["recompute_block_layers"] = [known.recompute_num_layers]
    schedule = known.pp_schedule
    if schedule is not None:
        search["pp_schedule"] = [schedule]
        if known.pp_group:
            search["pp_group"] = [known.pp_group]
    elif "vp" in unknown:
        search["pp_schedule"] = ["1f1b", "interleaved_1f1b"]  # Megatron's, by vp
    else:
        search["pp_schedule"] = ["interleaved_1f1b" if known.vp > 1 else "1f1b"]
    sub = problem.model_copy(update={
        "config": None,
        "search": problem.search.model_copy(update=search),
        "features": problem.features.model_copy(update=features),
    })
    result = solve_exhaustive(sub, "step", 1)
    if result.top_configs is None:
        # the run happened, so it fitted: the model cannot explain it. Say which of its rules
        # or its memory estimate stands in the way; never score it with them switched off.
        roomy = sub.hardware.model_copy(update={"memory_mib": 2**40, "host_memory_gb_per_node": 1e12})
        unlimited = solve_exhaustive(sub.model_copy(update={"hardware": roomy}), "step", 1)
        if unlimited.top_configs is None:
            broken = config_violations(problem, known)
            why = f" (with them at their defaults: {'; '.join(f'{f}: {m}' for f, m in broken)})" if broken else ""
            return None, {UNEXPLAINED: f"no value of the unknown fields is admissible under the stated ones{why}"}
        peak = float(evaluate(sub.model_copy(update={"hardware": roomy}), unlimited.top_configs.take([0])).memory_bytes["peak"][0])
        return unlimited.top_configs.take([0]), {
            UNEXPLAINED: f"no value of the unknown fields fits the model's memory estimate (the fastest needs {peak / GIB:.1f} of {sub.hardware.memory_bytes / GIB:.1f} GiB)"
        }
    chosen = result.top_configs.row(0)
    picks = {name: chosen[name] for name in unknown if name != "layer_split"}
    if "layer_split" in unknown:
        picks["layer_split"] = f"{chosen['first_stage_layers']}/{chosen['last_stage_layers']} layers on the first/last stage"

    return result.top_configs, picks


def _layout_of(problem: Problem, spec: ConfigSpec, first: int, last: int) -> str:
    return layout_name(problem.model.num_layers, spec.pp, spec.vp, first, last, spec.pp_schedule)
