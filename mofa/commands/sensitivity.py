"""`mofa sensitivity`: what moving one variable away from the best configuration does to
memory headroom, communication share, step time and MFU (the sensitivity matrix)."""

from __future__ import annotations

import sys

from mofa.commands._common import add_convention_option, convention_sets

NAME = "sensitivity"
HELP = "vary one variable at a time around the best configuration: memory headroom, comm share, step time, MFU"
DESCRIPTION = ("Solve the problem (or take its config section), then move each --vary variable to half and to twice its value, "
               "one at a time, everything else held, and score each with the exact model: memory headroom (capacity - peak), "
               "the share of the step spent in exposed communication, step time and MFU, as changes from the base, with the memory-ledger line that moved most. "
               "A variant the frameworks would reject is listed with the rule it breaks.")

#: variable -> (where it lives, field): a configuration field or a training field of the problem
VARIABLES = {"tp": ("config", "tp"), "cp": ("config", "cp"), "pp": ("config", "pp"), "ep": ("config", "ep"), "vp": ("config", "vp"),
             "mbs": ("config", "mbs"), "seq": ("training", "seq_len"), "gbs": ("training", "global_batch_size")}
#: the step-time ledger's communication terms (exposed time; costmodel.evaluate.BREAKDOWN_KEYS)
COMM_TERMS = ("tp", "cp", "ep", "fsdp", "pp", "dp")


def add_arguments(p) -> None:
    p.add_argument("problem", help="problem file (YAML)")
    p.add_argument("--vary", default="ep,tp,pp,cp,seq,gbs,mbs", metavar="LIST",
                   help=f"comma-separated variables ({', '.join(VARIABLES)})")
    p.add_argument("--method", choices=("cpsat", "dfs", "exhaustive"), default="cpsat", help="search method for the base configuration")
    add_convention_option(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of text (default: text)")


def metrics(entry: dict) -> dict:
    """The four figures of one evaluated configuration (evaluate's dict)."""
    step = entry["step_time_s"]
    comm = sum(entry["breakdown_s"][k] for k in COMM_TERMS)
    return {"headroom_gib": (entry["memory_capacity_bytes"] - entry["memory_bytes"]["peak"]) / 2**30, "comm_share": comm / step if step else 0.0,
            "step_time_s": step, "mfu": entry["mfu"], "mfu_convention": entry["mfu_convention"], "fits": entry["fits"] and entry["host_fits"],
            "memory_gib": {k: v for k, v in entry["memory_gib"].items() if k != "peak"}, "worst_rank": entry["worst_rank"]}


def memory_driver(base: dict, variant: dict) -> dict:
    """The memory-ledger line (worst rank's) that moved most from the base, so a large headroom
    change explains itself (e.g. ZeRO-3 at pp 2 under 1F1B holding a whole stage's gradients)."""
    deltas = {k: variant["memory_gib"][k] - base["memory_gib"][k] for k in base["memory_gib"]}
    term = max(deltas, key=lambda k: (abs(deltas[k]), k))
    return {"term": term, "delta_gib": deltas[term]}


def score(problem, spec) -> tuple[dict | None, str | None]:
    """(metrics, None) of a configuration, or (None, the first rule it breaks)."""
    from costmodel.configs import ConfigBatch
    from costmodel.evaluate import evaluate
    from costmodel.rules import config_violations

    broken = config_violations(problem, spec)
    if broken:
        field, message = broken[0]
        return None, f"{field}: {message}"
    batch = ConfigBatch.from_specs(problem, [spec])
    return metrics(evaluate(problem, batch).as_dict(0, batch)), None


def variants(problem, spec, variable: str):
    """(label, problem, spec) at half and twice the variable's base value."""
    from pydantic import ValidationError

    where, field = VARIABLES[variable]
    base = getattr(spec, field) if where == "config" else getattr(problem.training, field)
    for value in sorted({base // 2, base * 2} - {0, base}):
        label = f"{variable}={value} (base {base})"
        try:
            if where == "config":
                update = {field: value}
                if field in ("tp", "cp", "pp"):
                    update["dp"] = None  # derived again from the world size
                if field in ("pp", "vp"):
                    update.update(first_stage_layers=None, last_stage_layers=None)  # the split of the base no longer applies
                yield label, problem, type(spec).model_validate({**spec.model_dump(), **update}), None
            else:
                training = type(problem.training).model_validate({**problem.training.model_dump(), field: value})
                yield label, problem.model_copy(update={"training": training}), spec, None
        except ValidationError as exc:
            yield label, None, None, exc.errors(include_url=False)[0]["msg"]


def run(args) -> int:
    from costmodel.loader import ProblemError, load_problem
    from mofa.commands._common import stamped, to_json
    from mofa.report import table
    from optimizer.search import solve

    wanted = [v.strip() for v in args.vary.split(",") if v.strip()]
    unknown = [v for v in wanted if v not in VARIABLES]
    if unknown or not wanted:
        print(f"mofa sensitivity: --vary: unknown variable {', '.join(unknown) or '(none given)'} (choose from {', '.join(VARIABLES)})", file=sys.stderr)
        return 2
    problem = load_problem(args.problem, convention_sets(args))
    spec = problem.config
    if spec is None:
        result = solve(problem, args.method)
        if result.top_configs is None or not len(result.top_configs):
            raise ProblemError(args.problem, None, f"no admissible configuration to vary ({result.status})")
        spec = result.top_configs.spec(0)
    problem = problem.model_copy(update={"config": None})
    base, why = score(problem, spec)
    if base is None:
        raise ProblemError(args.problem, "config", why)
    rows = []
    for variable in wanted:
        for label, p, s, invalid in variants(problem, spec, variable):
            m, why = (None, invalid) if p is None else score(p, s)
            row = {"variable": variable, "variant": label, "rejected": why}
            if m is not None:
                row.update(m)
                row.update({f"delta_{k}": m[k] - base[k] for k in ("headroom_gib", "comm_share", "step_time_s", "mfu")})
                row["step_time_ratio"] = m["step_time_s"] / base["step_time_s"]
                row["memory_driver"] = memory_driver(base, m)
            rows.append(row)
    from costmodel.configs import ConfigBatch, config_label

    base_row = ConfigBatch.from_specs(problem, [spec]).row(0)
    out = stamped({"base_config": base_row, "base": base, "variants": rows}, args.problem)
    if args.json:
        print(to_json(out))
        return 0
    print(f"{problem.name}: base {config_label(base_row)}: headroom {base['headroom_gib']:.1f} GiB, comm {100 * base['comm_share']:.1f}% of the step, "
          f"step {base['step_time_s']:.3f} s, MFU {100 * base['mfu']:.1f}% ({base['mfu_convention']})")
    body = []
    for r in rows:
        if r["rejected"]:
            body.append([r["variant"], "-", "-", "-", "-", "-", "rejected: " + r["rejected"]])
        else:
            driver = r["memory_driver"]
            body.append([r["variant"], f"{r['delta_headroom_gib']:+.1f}", f"{driver['term']} {driver['delta_gib']:+.1f}", f"{100 * r['delta_comm_share']:+.1f}",
                         f"{r['step_time_ratio']:.3f}x", f"{100 * r['delta_mfu']:+.1f}", "fits" if r["fits"] else "DOES NOT FIT"])
    print(table(["variant", "headroom GiB", "most moved GiB", "comm share pp", "step time", f"MFU pp ({base['mfu_convention']})", "memory"], body, "lrlrrrl"))
    return 0
