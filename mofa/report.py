"""Human-readable rendering of evaluation and search results (plain aligned text), and the
JSON clean-up both share."""

from __future__ import annotations

import math

from costmodel.configs import config_label, features_label


def finite(obj):
    """JSON has no infinity or NaN: report them as null."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)
    lines = []
    for n, row in enumerate(cells):
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align)]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value) -> str:
    """A table cell: floats to about four significant figures, thousands separated from 10,000
    up (a column of GPU-hours or costs read 80484.7 next to 117,624 when only 100,000 and up
    were)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1e4:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.1f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    return str(value)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds == float("inf"):
        return "never (failures outpace progress)"
    days = seconds / 86400
    if days >= 1:
        return f"{seconds:,.0f} s ({days:.1f} days)"
    return f"{seconds:,.1f} s"


#: what each FLOPs convention counts, for the footnotes of reports (costmodel.flops has the formulas)
CONVENTION_NOTES = {
    "palm": "PaLM Appendix B: 6N per token + attention over the full s x s matrix, no recompute",
    "palm_causal": "PaLM's count with the causal (lower-triangle) attention work",
    "megatron": "Megatron-LM's formula (Narayanan et al. 2021; no router gate); HFU adds the recompute forward",
    "verl": "verl's estimator: 6 x N x tokens + 6 x sum(seq^2) x head_dim x heads x layers (router, top-k experts, no shared expert)",
    "tgs": "MemFine eq. 10 tokens per GPU per second; FLOP figures in PaLM's count",
}


def convention_of(result: dict) -> str:
    """The FLOP convention of a result's MFU/HFU/TFLOP/s (results written before conventions
    existed counted PaLM's)."""
    return result.get("mfu_convention", "palm")


def mfu_label(result: dict) -> str:
    """'MFU 41.2% (megatron)': an MFU never printed without the convention it counts in."""
    return f"MFU {100 * result['mfu']:.1f}% ({convention_of(result)})"


def bounds_line(bounds: dict, step: float) -> str:
    """The lower bounds per phase beside the step (costmodel.bounds), each as a share of it."""
    share = lambda v: f"{v:.3g} s ({100 * v / step:.0f}%)" if step else f"{v:.3g} s"
    comm = ", ".join(f"{k} {bounds['comm_' + k]:.3g}" for k in ("tp", "cp", "ep", "dp") if bounds.get("comm_" + k))
    return (f"lower bounds (ideal hardware, busiest rank): compute {share(bounds['compute'])}, memory {share(bounds['memory'])}, "
            f"communication {share(bounds['comm'])}" + (f" [{comm} s]" if comm else ""))


def render_evaluation(problem_name: str, result: dict) -> str:
    c = result["config"]
    out = [f"{problem_name}: {config_label(c)}", f"features: {features_label(c)}", ""]
    step = result["step_time_s"]
    rows = [[k, v, 100 * v / step if step else 0.0] for k, v in result["breakdown_s"].items() if v]
    rows.append(["step time", step, 100.0])
    out.append(table(["step (s)", "seconds", "%"], rows))
    if "step_time_interval_s" in result:
        lo, hi = result["step_time_interval_s"]
        out.append(f"calibrated interval: {lo:.2f} - {hi:.2f} s")
    if result.get("lower_bounds_s"):
        out.append(bounds_line(result["lower_bounds_s"], step))
    out.append("")
    mem = result["memory_gib"]
    mrows = [[k.replace("_", " "), v] for k, v in mem.items() if k != "peak" and v]
    fit = "fits" if result["fits"] else "DOES NOT FIT"
    mrows.append([f"peak ({result['worst_rank']} rank)", mem["peak"]])
    out.append(table(["memory", "GiB"], mrows))
    capacity = result["memory_capacity_bytes"]
    out.append(f"{fit} in {capacity / 2**30:.2f} GiB ({capacity // 2**20:,} MiB exposed)" + ("" if result["host_fits"] else f"; host memory short ({result['host_memory_gb']:.0f} GB needed)"))
    out.append("")
    conv = convention_of(result)
    tgs = f"TGS {result['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU (MemFine eq. 10)"
    flops = f"{result['tflops_per_gpu']:.1f} TFLOP/s per GPU ({conv}), {mfu_label(result)}, HFU {100 * result['hfu']:.1f}% ({conv})"
    first, second = (tgs, flops) if result.get("flops_convention") == "tgs" else (flops, tgs)
    out.append(f"throughput: {first}, {second}, {result['microbatches']:g} micro-batches")
    if result.get("ettr") is not None:
        out.append(
            f"reliability: ETTR {100 * result['ettr']:.2f}% with a checkpoint every {result['checkpoint_interval']} steps "
            f"(save {result['checkpoint_save_s']:.2f} s); end-to-end {duration(result['e2e_time_s'])}"
        )
    if "pipeline_replay" in result:
        out.append(render_replay(result["pipeline_replay"]))
    return "\n".join(out)


def render_replay(replay: dict) -> str:
    """The digital twin's line: the replayed pipeline against the closed form, idle time and
    activations in flight per rank."""
    if "refused" in replay:
        return f"pipeline replay: not replayed: {replay['refused']}"
    idle, held, model = replay["idle_s"], replay["peak_in_flight"], replay["model_in_flight"]
    shape = f"pp {replay['pp']}" + (f" x vp {replay['vp']}" if replay["vp"] > 1 else "")
    flight = f"{min(held)}-{max(held)}" if min(held) != max(held) else f"{held[0]}"
    agree = ("as the memory model counts" if held == model else
             f"the memory model counts {min(model)}-{max(model)} (ranks {', '.join(str(r) for r, (a, b) in enumerate(zip(held, model)) if a != b)} differ)")
    return (f"pipeline replay ({replay['schedule']}, {shape}, {replay['microbatches']} micro-batches; costmodel.twin): "
            f"{replay['simulated_s']:.4f} s op by op against {replay['closed_form_s']:.4f} s in the closed form "
            f"({100 * replay['difference']:+.2f}%)\n  idle per rank {min(idle):.4f}-{max(idle):.4f} s; "
            f"chunk activations held at the peak {flight}, {agree}")


def render_solve(problem, out: dict) -> str:
    name = problem.name
    head = f"{name}: {out['method']} minimising {out['objective_name']} time -> {out['status']}"
    if out["status"] == "optimal":
        head += " (certified by the exact model)"
    elif out["gap"] is not None:
        head += f" (gap {100 * out['gap']:.2f}% to the proven bound)"
    if (out.get("stats") or {}).get("interrupted"):
        head += ", stopped by Ctrl-C: the best found so far"
    lines = [head, f"solved in {out['solve_time_s']:.2f} s, {out['evaluated']:,} exact evaluations, space of {out['space_size'] or 0:,} configurations"]
    if (out.get("stats") or {}).get("path"):
        lines.append(f"path: {out['stats']['path']}")
    lines.append("")
    if out["status"] == "infeasible":
        lines.append("no admissible configuration: " + (out.get("explanation") or "every candidate breaks a rule or does not fit"))
        return "\n".join(lines)
    if not out["top"]:
        tables_s = (out.get("stats") or {}).get("tables_s")
        took = f" (scoring this problem's tables alone took {tables_s:.1f} s)" if tables_s else ""
        lines.append(f"no configuration found before the time limit{took}: allow more time with --time-limit")
        return "\n".join(lines)
    headers = ["#", "tp", "cp", "pp", "vp", "dp", "ep", "mbs", "schedule", "features", "mem GiB", f"TFLOP/s ({convention_of(out['top'][0])})", "T_step", "compute", "TP", "CP", "EP", "FSDP", "PP", "bubble", "DP", "update", "ETTR %", "interval", "E2E days"]
    rows = []
    for rank, r in enumerate(out["top"], 1):
        c, b = r["config"], r["breakdown_s"]
        e2e = r.get("e2e_time_s")
        schedule = c["pp_schedule"] if c["pp"] > 1 else "-"
        # the CP variant beside its degree: configurations may differ in it alone
        cp = f"{c['cp']} {c['cp_comm']}" + (f"({c['cp_a2a']})" if c.get("cp_a2a") else "") if c["cp"] > 1 else c["cp"]
        rows.append([rank, c["tp"], cp, c["pp"], c["vp"], c["dp"], c["ep"], c["mbs"], schedule, features_label(c), r["memory_gib"]["peak"], r["tflops_per_gpu"],
                     r["step_time_s"], b["compute"] + b["recompute"], b["tp"], b["cp"], b["ep"], b["fsdp"], b["pp"], b["bubble"], b["dp"], b["update"],
                     100 * r["ettr"] if r.get("ettr") is not None else "-", r.get("checkpoint_interval") or "-", e2e / 86400 if e2e else "-"])
    lines.append(table(headers, rows, "r" * 8 + "ll" + "r" * 15))
    best = out["top"][0]
    lines += ["", "best: " + config_label(best["config"]) + f"; features {features_label(best['config'])}"]
    if "step_time_interval_s" in best:
        lo, hi = best["step_time_interval_s"]
        lines.append(f"step time {best['step_time_s']:.2f} s (calibrated interval {lo:.2f} - {hi:.2f} s)")
    if best.get("lower_bounds_s"):
        lines.append(bounds_line(best["lower_bounds_s"], best["step_time_s"]))
    return "\n".join(lines)


def render_clusters(clusters: dict) -> str:
    """The candidate clusters of a cluster-choosing solve, and the Pareto front when asked."""
    def hours(x):
        return x / 3600 if x is not None else "-"

    def rows_of(items):
        return [[c["hardware"], c["num_gpus"], c["status"], f"{100 * c['gap']:.2f}%" if c["gap"] is not None else "-", hours(c["time_to_train_s"]),
                 c["gpu_hours"] if c["gpu_hours"] is not None else "-", c["cost"] if c["cost"] is not None else "-",
                 100 * c["ettr"] if c["ettr"] is not None else "-", "yes" if c["admitted"] else (c["why_not"] or "no")] for c in items]

    headers = ["hardware", "GPUs", "status", "gap", "train h", "GPU-hours", "cost", "ETTR %", "admitted"]
    chosen = clusters["chosen"]
    head = f"clusters ranked by {clusters['objective']}: {clusters['status']}"
    if clusters["gap"] is not None and clusters["status"] != "optimal":
        head += f" (gap {100 * clusters['gap']:.2f}% to the proven bound)"
    head += f"; chosen {chosen['num_gpus']} x {chosen['hardware']}" if chosen else "; no cluster admitted"
    lines = [head, table(headers, rows_of(clusters["candidates"]), "lrllrrrrl")]
    if "pareto" in clusters:
        p = clusters["pareto"]
        lines += ["", f"Pareto front of (time to train, {'cost' if p['axes'][1] == 'cost' else 'GPUs'}, ETTR): "
                      + ("certified" if p["certified"] else "not certified (a cluster's solve stopped early)"),
                  table(headers, rows_of(p["points"]), "lrllrrrrl")]
    return "\n".join(lines)


def render_compare(rows: list[dict]) -> str:
    headers = ["problem", "method", "status", "objective", "seconds", "evaluated"]
    body = []
    for entry in rows:
        for method in ("cpsat", "dfs", "exhaustive"):
            r = entry.get(method)
            if r is None:
                body.append([entry["problem"], method, "skipped (space too large)", "-", "-", "-"])
            else:
                body.append([entry["problem"], method, r["status"], r["objective"] if r["objective"] is not None else "-", r["solve_time_s"], r["evaluated"]])
        body.append([entry["problem"], "agree", "yes" if entry["agree"] else "NO", "", "", ""])
    return table(headers, body, "llllrr")


def render_calibration(doc: dict) -> str:
    eff = doc["efficiency"]
    cal = eff["calibration"]
    lines = [f"{doc['hardware']}: fitted {', '.join(f'{k}={v:.3f}' for k, v in doc['knobs'].items())}", ""]
    rows = [[r["name"], "unexplained" if r.get("unexplained") else ("yes" if r["fitted"] else "validate"), r["measured_step_s"], r["predicted_step_s"],
             f"{r['error_pct']:+.1f}", "-" if r["loo_error_pct"] is None else f"{r['loo_error_pct']:+.1f}",
             ", ".join(f"{k}={v}" for k, v in r["resolved"].items()) or "-"]
            for r in doc["residuals"]]
    held = cal.get("cross_validation") or "point"
    lines.append(table(["point", "fitted", "measured s", "predicted s", "error %", f"held-out ({held}) %", "unknowns resolved"], rows, "llrrrrl"))
    loo = f"{cal['loo_mape_pct']:.2f}%" if cal.get("loo_mape_pct") is not None else "-"
    lines += ["", f"{cal['points']} fitted points: MAPE {cal['mape_pct']:.2f}% (in sample), worst {cal['max_abs_error_pct']:.1f}%, "
              f"leave-one-{held}-out MAPE {loo}; log-residual sd {cal['log_residual_sd']:.3f} (the prediction interval)"]
    for r in doc["residuals"]:
        if r.get("unexplained"):
            lines.append(f"unexplained (not fitted, not scored): {r['name']}: {r['unexplained']}")
    cv = doc.get("cross_validation")
    if cv:
        for name, s in {**cv["per_gpu"], **cv["per_source"]}.items():
            lines.append(f"  held out: {name}: MAPE {s['mape_pct']:.2f}% over {s['n']} points, worst {s['max_abs_error_pct']:.1f}%")
        if cv["interval_coverage"] is not None:
            lines.append(f"  90% intervals cover {100 * cv['interval_coverage']:.0f}% of the held-out points")
    return "\n".join(lines)


def mfu_pair(point: dict) -> str:
    """'40.1/38.7': a validation point's measured and predicted MFU, in the output's convention."""
    if point.get("measured_mfu") is None:
        return "-"
    predicted = point.get("predicted_mfu")
    return f"{100 * point['measured_mfu']:.1f}/" + ("-" if predicted is None else f"{100 * predicted:.1f}")


def render_validation(out: dict) -> str:
    def pct(v):
        return "-" if v is None else f"{v:+.1f}"

    cv = out.get("cross_validation")
    held = [[pct(r.get("held_out_error_pct"))] if cv else [] for r in out["points"]]  # leave-one-group-out error
    rows = [[r["name"], r["hardware"], "yes" if r["fitted"] else "no", r["measured_step_s"], r["predicted_step_s"],
             "unexplained" if r["unexplained"] else pct(r["error_pct"]), *h,
             "-" if r["measured_peak_gib"] is None else f"{r['measured_peak_gib']:.1f}",
             "-" if r["predicted_peak_gib"] is None else f"{r['predicted_peak_gib']:.1f}",
             mfu_pair(r), ", ".join(f"{k}={v}" for k, v in r["resolved"].items()) or "-"]
            for r, h in zip(out["points"], held)]
    conv = out["points"][0].get("mfu_convention", "palm") if out["points"] else "palm"
    headers = ["point", "GPU", "fitted", "measured s", "predicted s", "error %", *([f"held-out ({cv['held_out']}) %"] if cv else []),
               "meas GiB", "pred GiB", f"MFU % meas/pred ({conv})", "unknowns resolved"]
    lines = [table(headers, rows, "lllrrr" + ("r" if cv else "") + "rrrl"), ""]

    def figures(s):
        if not s["n"]:
            return "no scored points"
        return f"MAPE {s['mape_pct']:.2f}% over {s['n']} points, worst {s['max_abs_error_pct']:.1f}%"

    for name, s in out["per_hardware"].items():
        extra = f"; {s['unexplained']} unexplained" if s["unexplained"] else ""
        lines.append(f"{name} ({s['profile']} profile): {figures(s)}{extra}")
    lines.append("")
    for name, s in out["per_source"].items():
        extra = f"; {s['unexplained']} unexplained" if s["unexplained"] else ""
        lines.append(f"{name}: {figures(s)}{extra}")
    if out["mape_pct"] is not None:
        lines += ["", f"all scored points (in sample where the profile was fitted on them): MAPE {out['mape_pct']:.2f}%, worst {out['max_abs_error_pct']:.1f}%"]
    memory = out["peak_memory"]
    if memory["n"]:
        within = lambda s: f"; {s['within_bar']} of {s['n']} within {memory['bar_pct']:g}%"  # noqa: E731
        lines.append(f"peak memory where the source states it: {figures(memory)}{within(memory)}")
        for name, s in memory.get("per_source", {}).items():
            lines.append(f"  {name}: {figures(s)}{within(s)}")
    for u in out["unexplained"]:
        lines.append(f"unexplained: {u['name']}: {u['reason']}")
    if out.get("skipped"):
        lines.append(f"{len(out['skipped'])} measured rows the model cannot express (listed with their reasons in the files' skipped sections)")
    if cv:
        lines += ["", f"cross-validation, leave one {cv['held_out']} out (held-out predictions):"]
        for name, s in cv["per_gpu"].items():
            lines.append(f"  {name}: MAPE {s['mape_pct']:.2f}% over {s['n']} points, worst {s['max_abs_error_pct']:.1f}%")
        for name, s in cv["per_source"].items():
            lines.append(f"  {name}: MAPE {s['mape_pct']:.2f}% over {s['n']} points, worst {s['max_abs_error_pct']:.1f}%")
        if cv["interval_coverage"] is not None:
            lines.append(f"  90% intervals (log-residual sd {cv['log_residual_sd']:.3f}) cover {100 * cv['interval_coverage']:.0f}% of the held-out points")
    if out.get("memory_checks"):
        lines += ["", table(["memory check", "predicted", "published", "unit", "error %"],
                            [[m["name"], m["predicted"], m["published"], m["unit"], f"{m['error_pct']:+.1f}"] for m in out["memory_checks"]], "lrrlr")]
    return "\n".join(lines)