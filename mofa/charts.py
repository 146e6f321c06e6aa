"""`mofa report`'s figures: PNGs drawn with matplotlib (Agg, no display) from the results of
solves and batches, and a Markdown page linking them.

Each chart function takes the runs and returns (figure bytes, the data it plotted) or None
when the runs do not support it (why goes into the page): the plotted data is written next to
the pictures (plots.json), so what a figure shows can be checked without reading pixels.
Numbers come from the results (the exact model's evaluation of each configuration); the
reliability curves call the fault model's own functions (costmodel.reliability) with each
run's step time, failure rate, recovery and save time.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass

from costmodel.configs import config_label, features_label

#: small multiples show at most this many runs (the rest are listed in the page)
MAX_PANELS = 12


@dataclass
class Run:
    name: str
    marker: dict  # run.json (or what a plain result.json gives)
    result: dict | None  # result.json
    problem: object = None  # costmodel.specs.Problem, when it can be read back
    failed: dict | None = None

    @property
    def best(self) -> dict | None:
        return (self.result or {}).get("best")

    def get(self, key):
        """A problem-level fact: from the marker, else the problem."""
        value = self.marker.get(key)
        if value is None and self.problem is not None:
            p = self.problem
            value = {"model": p.model.name, "hardware": p.hardware.name, "num_gpus": p.cluster.num_gpus, "supernode_size": p.cluster.supernode_size,
                     "global_batch_size": p.training.global_batch_size, "seq_len": p.training.seq_len}.get(key)
        return value


# --------------------------------------------------------------------------------------
# reading results
# --------------------------------------------------------------------------------------
def _json(path: str):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _problem_from(folder: str, result: dict | None):
    from costmodel.specs import Problem

    doc = _json(os.path.join(folder, "problem.json"))
    if doc is not None:
        return Problem.model_validate(doc)
    source = (result or {}).get("input")
    if isinstance(source, str) and os.path.isfile(source):
        from costmodel.loader import ProblemError, load_problems

        try:
            problems = load_problems(source)
        except ProblemError:
            return None
        if len(problems) == 1:
            return problems[0][2]
    return None


def _read_run_folder(folder: str) -> Run | None:
    marker = _json(os.path.join(folder, "run.json"))
    result = _json(os.path.join(folder, "result.json"))
    failed = _json(os.path.join(folder, "failed.json"))
    if marker is None and result is None:
        return None
    if marker is None:
        marker = {"name": os.path.basename(os.path.abspath(folder)), "input": result.get("input"), "status": result.get("status")}
    return Run(marker["name"], marker, result, None if failed else _problem_from(folder, result), failed)


def load_runs(paths: list[str]) -> list[Run]:
    """Runs of batch folders (their runs/, in the batch's order), run or `solve --out` folders,
    and result.json files. ValueError names a path that is none of these."""
    runs: list[Run] = []
    for path in paths:
        if os.path.isdir(os.path.join(path, "runs")):
            manifest = _json(os.path.join(path, "batch.json")) or {}
            names = [r["name"] for r in manifest.get("runs", [])] or sorted(os.listdir(os.path.join(path, "runs")))
            found = [_read_run_folder(os.path.join(path, "runs", n)) for n in names if os.path.isdir(os.path.join(path, "runs", n))]
            runs += [r for r in found if r is not None]
        elif os.path.isdir(path):
            run = _read_run_folder(path)
            if run is None:
                raise ValueError(f"{path}: not a batch folder, a run folder or a solve --out folder (no runs/, run.json or result.json)")
            runs.append(run)
        elif os.path.isfile(path):
            result = _json(path)
            if not isinstance(result, dict) or "top" not in result:
                raise ValueError(f"{path}: not a mofa solve result (JSON with 'top')")
            name = os.path.splitext(os.path.basename(path))[0]
            if name == "result":
                name = os.path.basename(os.path.dirname(os.path.abspath(path)))
            runs.append(Run(name, {"name": name, "input": result.get("input"), "status": result.get("status")}, result,
                            _problem_from(os.path.dirname(path), result)))
        else:
            raise ValueError(f"{path}: not found")
    return runs


# --------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    _plt().close(fig)
    return buf.getvalue()


def _grid(n: int):
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = _plt().subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat


MEMORY_PARTS = ("params", "grads", "optimizer", "gathered_params", "activations", "optimizer_transient", "comm_buffers", "cuda_context", "fragmentation")
TIME_PARTS = ("compute", "recompute", "tp", "cp", "ep", "fsdp", "offload", "overhead", "pp", "bubble", "dp", "update")


def solved(runs: list[Run]) -> list[Run]:
    return [r for r in runs if r.best]


def memory_chart(runs: list[Run]):
    """Stacked memory ledger of each run's best configuration (worst rank, GiB) against the
    GPU's capacity."""
    runs = solved(runs)
    if not runs:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(runs) + 2), 4.8))
    data = {"runs": [r.name for r in runs], "capacity_gib": [r.best["memory_capacity_bytes"] / 2**30 for r in runs], "parts_gib": {}}
    bottom = [0.0] * len(runs)
    x = list(range(len(runs)))
    for part in MEMORY_PARTS:
        values = [r.best["memory_gib"].get(part, 0.0) for r in runs]
        if not any(values):
            continue
        data["parts_gib"][part] = values
        ax.bar(x, values, bottom=bottom, label=part.replace("_", " "), width=0.7)
        bottom = [b + v for b, v in zip(bottom, values)]
    data["peak_gib"] = [r.best["memory_gib"]["peak"] for r in runs]
    ax.hlines(data["capacity_gib"], [i - 0.45 for i in x], [i + 0.45 for i in x], colors="black", linestyles="--", label="capacity")
    ax.set_xticks(x, _labels([r.name for r in runs]), rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("GiB per GPU (worst rank)")
    ax.set_title("Memory of each run's best configuration")
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig), data


def waterfall_chart(runs: list[Run]):
    """Step-time waterfall of each run's best configuration: each ledger term (exposed
    communication by kind, bubble, update...) stacked on the previous, ending at the step time."""
    runs = solved(runs)[:MAX_PANELS]
    if not runs:
        return None
    fig, axes = _grid(len(runs))
    short = dict(zip([r.name for r in runs], _labels([r.name for r in runs])))
    data = {}
    for ax, r in zip(axes, runs):
        parts = [(k, r.best["breakdown_s"][k]) for k in TIME_PARTS if r.best["breakdown_s"].get(k)]
        start = 0.0
        labels, starts, widths = [], [], []
        for name, value in parts:
            labels.append(name)
            starts.append(start)
            widths.append(value)
            start += value
        step = r.best["step_time_s"]
        labels.append("step")
        starts.append(0.0)
        widths.append(step)
        colors = ["tab:blue" if n in ("compute", "recompute") else "tab:gray" if n == "step" else "tab:orange" for n in labels]
        ax.barh(range(len(labels)), widths, left=starts, color=colors)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("seconds")
        ax.set_title(short[r.name], fontsize=8)
        data[r.name] = {"terms_s": dict(parts), "step_time_s": step}
    fig.suptitle("Step-time waterfall (best configuration)")
    fig.tight_layout()
    return _png(fig), data


def _group_key(r: Run, free: tuple[str, ...]) -> tuple:
    """What runs of one group share: the problem-level facts not in `free`."""
    return tuple(r.get(k) for k in ("model", "hardware", "num_gpus", "supernode_size", "global_batch_size", "seq_len") if k not in free)


def heatmap_charts(runs: list[Run]) -> list[tuple[str, bytes, dict]]:
    """Tokens/s per GPU over sequence length x global batch, for each group of runs that
    differ only in those two (a sweep)."""
    out = []
    groups: dict[tuple, list[Run]] = {}
    for r in solved(runs):
        groups.setdefault(_group_key(r, ("seq_len", "global_batch_size")), []).append(r)
    plt = _plt()
    for key, group in groups.items():
        seqs = sorted({r.get("seq_len") for r in group})
        gbss = sorted({r.get("global_batch_size") for r in group})
        if len(seqs) < 2 or len(gbss) < 2 or len({(r.get("seq_len"), r.get("global_batch_size")) for r in group}) < len(seqs) * len(gbss):
            continue  # a sweep of both fills the grid; two unrelated runs would make a diagonal
        grid = [[None] * len(gbss) for _ in seqs]
        for r in group:
            grid[seqs.index(r.get("seq_len"))][gbss.index(r.get("global_batch_size"))] = r.best["tokens_per_s_per_gpu"]
        fig, ax = plt.subplots(figsize=(1.3 * len(gbss) + 2.5, 0.9 * len(seqs) + 1.8))
        import numpy as np

        values = np.array([[np.nan if v is None else v for v in row] for row in grid])
        im = ax.imshow(values, cmap="viridis", aspect="auto", origin="lower")
        middle = (np.nanmin(values) + np.nanmax(values)) / 2
        for i in range(len(seqs)):
            for j in range(len(gbss)):
                if grid[i][j] is not None:
                    ax.text(j, i, f"{grid[i][j]:,.0f}", ha="center", va="center", color="black" if grid[i][j] > middle else "white", fontsize=8)
        ax.set_xticks(range(len(gbss)), gbss)
        ax.set_yticks(range(len(seqs)), seqs)
        ax.set_xlabel("global batch (sequences)")
        ax.set_ylabel("sequence length")
        model, hardware, gpus, supernode = key
        ax.set_title(f"{model} on {gpus} x {hardware}: tokens/s per GPU", fontsize=9)
        fig.colorbar(im, ax=ax, label="tokens/s per GPU")
        name = f"heatmap_{len(out) + 1}.png"
        out.append((name, _png(fig), {"title": f"{model} on {gpus} x {hardware}", "seq_len": seqs, "global_batch_size": gbss, "tokens_per_s_per_gpu": grid,
                                     "runs": sorted(r.name for r in group)}))
    return out


def topk_chart(runs: list[Run]):
    """The K best configurations of each run (step time), labelled by layout and features."""
    runs = [r for r in solved(runs) if len(r.result.get("top", [])) > 1][:MAX_PANELS]
    if not runs:
        return None
    fig, axes = _grid(len(runs))
    short = dict(zip([r.name for r in runs], _labels([r.name for r in runs])))
    data = {}
    for ax, r in zip(axes, runs):
        top = r.result["top"]
        steps = [t["step_time_s"] for t in top]
        labels = [f"#{i + 1} {config_label(t['config'])}\n{features_label(t['config'])}" for i, t in enumerate(top)]
        ax.barh(range(len(top)), steps, color=["tab:green"] + ["tab:blue"] * (len(top) - 1))
        ax.set_yticks(range(len(top)), labels, fontsize=6)
        ax.invert_yaxis()
        lo = min(steps)
        ax.set_xlim(lo * 0.97, max(steps) * 1.01)
        ax.set_xlabel("step time (s)")
        ax.set_title(short[r.name], fontsize=8)
        data[r.name] = {"step_time_s": steps, "labels": [lab.replace("\n", "; ") for lab in labels]}
    fig.suptitle("Top-K configurations of each run")
    fig.tight_layout()
    return _png(fig), data


def _fault_inputs(r: Run):
    """(rate per s, recovery s, save s, nodes, step s, steps or None) of a run with a fault model."""
    from costmodel.reliability import failure_rate_per_s

    p = r.problem
    if p is None or p.fault_tolerance is None or not r.best or r.best.get("checkpoint_save_s") is None:
        return None
    ft = p.fault_tolerance
    nodes = p.cluster.num_nodes
    return failure_rate_per_s(nodes, ft.failure_rate_per_node_day), ft.mean_recovery_s, r.best["checkpoint_save_s"], nodes, r.best["step_time_s"], ft.failure_rate_per_node_day


def ettr_interval_chart(runs: list[Run], max_lines: int = 8):
    """Steady-state ETTR (eq. 40) against the checkpoint interval at each run's step time,
    the interval eq. 44 chose marked (MoFa Fig. 4)."""
    import numpy as np

    from costmodel.reliability import optimal_interval, steady_state_ettr

    chosen = [(r, f) for r in solved(runs) if (f := _fault_inputs(r)) is not None][:max_lines]
    if not chosen:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    short = dict(zip([r.name for r, _ in chosen], _labels([r.name for r, _ in chosen])))
    data = {}
    for r, (rate, u_b, save, nodes, step, _) in chosen:
        best = int(optimal_interval(np.array([step]), rate, u_b, save)[0])
        intervals = np.unique(np.geomspace(1, max(50 * best, 100), 200).astype(int))
        ettr = steady_state_ettr(np.full(intervals.shape, step), intervals, rate, u_b, save)
        line, = ax.plot(intervals, ettr, label=short[r.name], linewidth=1.2)
        at = float(steady_state_ettr(np.array([step]), best, rate, u_b, save)[0])
        ax.plot([best], [at], "o", color=line.get_color())
        data[r.name] = {"interval_steps": intervals.tolist(), "ettr": ettr.tolist(), "optimal_interval_steps": best, "ettr_at_optimum": at}
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (steps)")
    ax.set_ylabel("steady-state ETTR (eq. 40)")
    ax.set_title("ETTR against checkpoint interval (dot: eq. 44's optimum)")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    return _png(fig), data


def ettr_nodes_chart(runs: list[Run], max_lines: int = 8):
    """Steady-state ETTR at the optimal interval against the number of nodes, each run's
    step time, recovery and save time held (only the failure rate grows with the nodes)."""
    import numpy as np

    from costmodel.reliability import failure_rate_per_s, optimal_interval, steady_state_ettr

    chosen = [(r, f) for r in solved(runs) if (f := _fault_inputs(r)) is not None][:max_lines]
    if not chosen:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    short = dict(zip([r.name for r, _ in chosen], _labels([r.name for r, _ in chosen])))
    data = {}
    for r, (_, u_b, save, nodes, step, per_node_day) in chosen:
        counts = np.unique(np.geomspace(1, max(64 * nodes, 1024), 60).astype(int))
        rates = failure_rate_per_s(counts, per_node_day)
        intervals = np.array([optimal_interval(np.array([step]), rate, u_b, save)[0] for rate in rates])
        ettr = steady_state_ettr(np.full(counts.shape, step), intervals, rates, u_b, save)
        line, = ax.plot(counts, ettr, label=short[r.name], linewidth=1.2)
        here = float(steady_state_ettr(np.array([step]), optimal_interval(np.array([step]), failure_rate_per_s(nodes, per_node_day), u_b, save), failure_rate_per_s(nodes, per_node_day), u_b, save)[0])
        ax.plot([nodes], [here], "o", color=line.get_color())
        data[r.name] = {"nodes": counts.tolist(), "ettr": ettr.tolist(), "run_nodes": nodes, "ettr_at_run_nodes": here}
    ax.set_xscale("log")
    ax.set_xlabel("nodes")
    ax.set_ylabel("steady-state ETTR at the optimal interval")
    ax.set_title("ETTR against cluster size (dot: the run's size)")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    return _png(fig), data


#: Fig. 5's factors: (key, axis label)
FAULT_FACTORS = (("failure_rate_per_node_day", "failure rate (per node per day)"), ("recovery_s", "repair time u_b (s)"),
                 ("checkpoint_save_s", "checkpoint save time T_save (s)"))


def ettr_at_optimum(step_s, rate_per_s, recovery_s, save_s):
    """Steady-state ETTR (eq. 40) at eq. 44's interval, array-valued in any argument: the
    fault model's own functions, nothing re-derived here."""
    import numpy as np

    from costmodel.reliability import optimal_interval, steady_state_ettr

    step_s, rate_per_s, recovery_s, save_s = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (step_s, rate_per_s, recovery_s, save_s)))
    interval = optimal_interval(step_s, rate_per_s, recovery_s, save_s)
    return steady_state_ettr(step_s, interval, rate_per_s, recovery_s, save_s), interval


def ettr_factors_chart(runs: list[Run], max_lines: int = 8, points: int = 41):
    """Steady-state ETTR at the optimal interval against the failure rate, the repair time and
    the checkpoint save time, one factor moved at a time from each run's value (a tenth to ten
    times it), the rest held at the run's (MoFa Fig. 5; the node count is ettr_nodes_chart)."""
    import numpy as np

    from costmodel.reliability import failure_rate_per_s

    chosen = [(r, f) for r in solved(runs) if (f := _fault_inputs(r)) is not None][:max_lines]
    if not chosen:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    short = dict(zip([r.name for r, _ in chosen], _labels([r.name for r, _ in chosen])))
    data = {key: {} for key, _ in FAULT_FACTORS}
    for r, (_, u_b, save, nodes, step, per_node_day) in chosen:
        base = {"failure_rate_per_node_day": per_node_day, "recovery_s": u_b, "checkpoint_save_s": save}
        for ax, (key, label) in zip(axes, FAULT_FACTORS):
            if base[key] <= 0:
                continue  # no range around zero on a log axis
            xs = np.geomspace(base[key] / 10, base[key] * 10, points)
            values = {**{k: np.full(points, float(v)) for k, v in base.items()}, key: xs}
            ettr, interval = ettr_at_optimum(step, failure_rate_per_s(nodes, values["failure_rate_per_node_day"]), values["recovery_s"], values["checkpoint_save_s"])
            here, _ = ettr_at_optimum(step, failure_rate_per_s(nodes, per_node_day), u_b, save)
            line, = ax.plot(xs, ettr, label=short[r.name], linewidth=1.2)
            ax.plot([base[key]], [float(here)], "o", color=line.get_color())
            data[key][r.name] = {key: xs.tolist(), "ettr": ettr.tolist(), "interval_steps": interval.tolist(), "run_value": base[key],
                                 "ettr_at_run_value": float(here), "held": {k: v for k, v in base.items() if k != key} | {"nodes": nodes, "step_time_s": step}}
    for ax, (key, label) in zip(axes, FAULT_FACTORS):
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("steady-state ETTR at the optimal interval")
    axes[0].legend(fontsize=6)
    fig.suptitle("ETTR against failure rate, repair time and checkpoint save time (dot: the run's value)")
    fig.tight_layout()
    return _png(fig), data


def _spec_of(r: Run):
    """The run's best configuration as a typed ConfigSpec (the result's row reads back)."""
    from costmodel.specs import ConfigSpec

    return ConfigSpec.model_validate(r.best["config"])


def _score(problem, specs) -> list[dict]:
    """The exact model's dict of each configuration (one evaluation)."""
    from costmodel.configs import ConfigBatch
    from costmodel.evaluate import evaluate

    batch = ConfigBatch.from_specs(problem, specs)
    ev = evaluate(problem, batch)
    return [ev.as_dict(i, batch) for i in range(len(specs))]


def _admissible(problem, spec, **update):
    """`spec` with `update`, or None where a framework rule rejects it (the problem's own
    feature preferences are not applied: the point is what the alternative would cost)."""
    from pydantic import ValidationError

    from costmodel.rules import config_violations

    try:
        spec = type(spec).model_validate({**spec.model_dump(), **update})
    except ValidationError:
        return None
    return None if config_violations(problem, spec) else spec


def vp_sweep(problem, spec) -> list[tuple[int, object]]:
    """(v, configuration) for each virtual-stage count the frameworks admit for this layout:
    the layer split re-chosen for v (layer_split auto), Megatron's schedule for v (1f1b at
    v=1, interleaved above) unless the configuration uses another, and the PP/EP overlap turned
    off or on only where a rule requires it at that v."""
    from optimizer.space import MAX_VP

    out = []
    megatron = spec.pp_schedule in (None, "1f1b", "interleaved_1f1b")
    for v in range(1, min(MAX_VP, problem.model.num_layers) + 1):
        base = {"vp": v, "first_stage_layers": None, "last_stage_layers": None, "layer_split": "auto"}
        if megatron:
            base["pp_schedule"] = "interleaved_1f1b" if v > 1 else "1f1b"
        tries = [{}, {"pp_overlap": not spec.pp_overlap}, {"ep_overlap": False}, {"pp_overlap": not spec.pp_overlap, "ep_overlap": False}]
        for extra in tries:
            found = _admissible(problem, spec, **base, **extra)
            if found is not None:
                out.append((v, found))
                break
    return out


def vp_chart(runs: list[Run]):
    """Step time of each run's best configuration with the virtual-stage count v varied over
    the values the frameworks admit, everything else held (MoFa Fig. 6): more v shrinks the
    bubble but multiplies the pipeline's point-to-point traffic. Runs with pp > 1 only."""
    chosen = [r for r in solved(runs) if r.problem is not None and r.best["config"]["pp"] > 1][:MAX_PANELS]
    sweeps = [(r, sw) for r in chosen if len(sw := vp_sweep(r.problem, _spec_of(r))) >= 2]
    if not sweeps:
        return None
    fig, axes = _grid(len(sweeps))
    short = dict(zip([r.name for r, _ in sweeps], _labels([r.name for r, _ in sweeps])))
    data = {}
    for ax, (r, sweep) in zip(axes, sweeps):
        entries = _score(r.problem, [s for _, s in sweep])
        vs = [v for v, _ in sweep]
        step = [e["step_time_s"] for e in entries]
        bubble = [e["breakdown_s"]["bubble"] for e in entries]
        pp = [e["breakdown_s"]["pp"] for e in entries]
        fits = [bool(e["fits"] and e["host_fits"]) for e in entries]
        ax.plot(vs, step, "-", color="tab:blue", label="step")
        ax.scatter([v for v, f in zip(vs, fits) if f], [s for s, f in zip(step, fits) if f], color="tab:blue", zorder=3)
        ax.scatter([v for v, f in zip(vs, fits) if not f], [s for s, f in zip(step, fits) if not f], facecolors="none", edgecolors="tab:red",
                   zorder=3, label="does not fit")
        ax.plot(vs, bubble, "--", color="tab:orange", label="bubble")
        ax.plot(vs, pp, ":", color="tab:green", label="exposed PP p2p")
        ax.axvline(r.best["config"]["vp"], color="gray", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(vs, vs, fontsize=7)
        ax.set_xlabel("virtual stages v")
        ax.set_ylabel("seconds")
        ax.set_title(f"{short[r.name]} (pp={r.best['config']['pp']})", fontsize=8)
        ax.legend(fontsize=6)
        data[r.name] = {"vp": vs, "step_time_s": step, "bubble_s": bubble, "pp_s": pp, "fits": fits, "best_vp": r.best["config"]["vp"],
                        "configs": [s.model_dump(mode="json") for _, s in sweep]}
    fig.suptitle("Effect of the virtual-stage count v (grey line: the run's best)")
    fig.tight_layout()
    return _png(fig), data


def optimizer_variants(problem, spec) -> list[tuple[str, object]]:
    """(label, configuration) of the best configuration under each optimizer placement the
    frameworks admit: ZeRO stage 0-3 (1 = Megatron's distributed optimizer), each with and
    without the CPU optimizer (MoFa Table 7 / Fig. 7)."""
    out = []
    for zero in (0, 1, 2, 3):
        for cpu in (False, True):
            found = _admissible(problem, spec, zero_stage=zero, cpu_optimizer=cpu,
                                reshard_after_forward=spec.reshard_after_forward if zero == 3 and spec.zero_stage == 3 else None,
                                dp_shard=spec.dp_shard if zero >= 1 else None)
            if found is not None:
                out.append((f"ZeRO-{zero}" + (" + CPU" if cpu else ""), found))
    return out


def optimizer_chart(runs: list[Run]):
    """Step time and peak memory of each run's best configuration with each optimizer
    placement (ZeRO stage, CPU optimizer), everything else held (MoFa Table 7 / Fig. 7)."""
    import numpy as np

    chosen = [r for r in solved(runs) if r.problem is not None][:MAX_PANELS]
    variants = [(r, vs) for r in chosen if len(vs := optimizer_variants(r.problem, _spec_of(r))) >= 2]
    if not variants:
        return None
    fig, axes = _grid(len(variants))
    short = dict(zip([r.name for r, _ in variants], _labels([r.name for r, _ in variants])))
    data = {}
    for ax, (r, vs) in zip(axes, variants):
        entries = _score(r.problem, [s for _, s in vs])
        labels = [label for label, _ in vs]
        step = [e["step_time_s"] for e in entries]
        peak = [e["memory_gib"]["peak"] for e in entries]
        fits = [bool(e["fits"] and e["host_fits"]) for e in entries]
        x = np.arange(len(vs))
        ax.bar(x - 0.2, step, width=0.4, color=["tab:blue" if f else "white" for f in fits], edgecolor="tab:blue", label="step time (s)")
        ax.set_ylabel("step time (s)", color="tab:blue", fontsize=7)
        twin = ax.twinx()
        twin.bar(x + 0.2, peak, width=0.4, color=["tab:purple" if f else "white" for f in fits], edgecolor="tab:purple", label="peak memory (GiB)")
        twin.axhline(r.best["memory_capacity_bytes"] / 2**30, color="black", linestyle="--", linewidth=0.8)
        twin.set_ylabel("peak GiB (dashed: capacity)", color="tab:purple", fontsize=7)
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=7)
        ax.set_title(f"{short[r.name]}: {config_label(r.best['config'])}", fontsize=6)
        data[r.name] = {"variants": labels, "step_time_s": step, "peak_gib": peak, "fits": fits,
                        "best": "ZeRO-{}".format(r.best["config"]["zero_stage"]) + (" + CPU" if r.best["config"]["cpu_optimizer"] else ""),
                        "configs": [s.model_dump(mode="json") for _, s in vs]}
    fig.suptitle("Optimizer placement: step time (blue) and peak memory (purple); hollow bars do not fit")
    fig.tight_layout()
    return _png(fig), data


def linearity_chart(runs: list[Run]):
    """Cluster linearity: tokens/s per GPU at N GPUs over tokens/s per GPU at the group's
    smallest N, for runs that differ in the GPU count (and the global batch, scaled with it),
    the model, GPU type, sequence length and supernode size held."""
    groups: dict[tuple, list[Run]] = {}
    for r in solved(runs):
        groups.setdefault((r.get("model"), r.get("hardware"), r.get("seq_len"), r.get("supernode_size")), []).append(r)
    groups = {k: g for k, g in groups.items() if len({r.get("num_gpus") for r in g}) >= 2}
    if not groups:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    data = {}
    for (model, hardware, seq, supernode), group in groups.items():
        by_n: dict[int, Run] = {}
        for r in sorted(group, key=lambda r: (r.get("num_gpus"), -r.best["tokens_per_s_per_gpu"])):
            by_n.setdefault(r.get("num_gpus"), r)  # the fastest run at each size
        ns = sorted(by_n)
        base = by_n[ns[0]].best["tokens_per_s_per_gpu"]
        lin = [by_n[n].best["tokens_per_s_per_gpu"] / base for n in ns]
        label = f"{model}, {hardware}, seq {seq}" + (f", supernode {supernode}" if supernode else "")
        ax.plot(ns, lin, "o-", label=label)
        data[label] = {"num_gpus": ns, "linearity": lin, "runs": [by_n[n].name for n in ns]}
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("tokens/s per GPU relative to the smallest size")
    ax.set_title("Cluster linearity")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    return _png(fig), data


def supernode_ep_chart(runs: list[Run]):
    """The best configuration's expert-parallel degree against the GPU count, one line per
    supernode size (MoFa Table 8 / Fig. 9), for MoE models solved at two or more supernode sizes."""
    groups: dict[tuple, list[Run]] = {}
    for r in solved(runs):
        if r.best["config"].get("ep", 1) > 1 or (r.problem is not None and r.problem.model.moe is not None):
            groups.setdefault((r.get("model"), r.get("hardware")), []).append(r)
    groups = {k: g for k, g in groups.items() if len({r.get("supernode_size") for r in g}) >= 2}
    if not groups:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    data = {}
    for (model, hardware), group in groups.items():
        for k, sn in enumerate(sorted({r.get("supernode_size") or 0 for r in group})):
            pts = sorted((r.get("num_gpus"), r.best["config"]["ep"]) for r in group if (r.get("supernode_size") or 0) == sn)
            label = f"{model} on {hardware}, supernode {sn or 'none'}"
            # equal answers would hide one line under the other: alternate marker and dash
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ("o-", "s--", "^:")[k % 3], label=label, markersize=9 - 3 * (k % 3), alpha=0.85)
            data[label] = {"num_gpus": [p[0] for p in pts], "best_ep": [p[1] for p in pts]}
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("EP of the best configuration")
    ax.set_title("Supernode size and the best expert parallelism")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _png(fig), data


def _short(name: str, limit: int = 48) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."


def _labels(names: list[str]) -> list[str]:
    """Axis labels: the runs' names without the prefix they all share (a sweep's base name),
    so the part that differs is what shows."""
    if len(names) > 1:
        prefix = os.path.commonprefix(names)
        cut = prefix.rfind("_") + 1
        if cut and all(len(n) > cut for n in names):
            names = [n[cut:] for n in names]
    return [_short(n) for n in names]


# --------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------
CHARTS = (
    ("memory.png", "Memory against capacity", memory_chart, "no solved run"),
    ("step_time_waterfall.png", "Step-time waterfall", waterfall_chart, "no solved run"),
    ("topk.png", "Top-K comparison", topk_chart, "no run kept more than one configuration (batch --top K, solve --top K)"),
    ("ettr_interval.png", "ETTR against checkpoint interval", ettr_interval_chart, "no solved run with a fault_tolerance section"),
    ("ettr_nodes.png", "ETTR against cluster size", ettr_nodes_chart, "no solved run with a fault_tolerance section"),
    ("ettr_factors.png", "ETTR against failure rate, repair time and save time", ettr_factors_chart, "no solved run with a fault_tolerance section"),
    ("vp.png", "Effect of the virtual-stage count v", vp_chart, "no run whose best configuration pipelines (pp > 1) with two or more admissible v"),
    ("optimizer.png", "Optimizer placement (ZeRO stage, CPU optimizer)", optimizer_chart, "no run with two or more admissible optimizer placements"),
    ("linearity.png", "Cluster linearity", linearity_chart, "no model/GPU/sequence length solved at two or more GPU counts"),
    ("supernode_ep.png", "Supernode size and the best EP", supernode_ep_chart, "no MoE model solved at two or more supernode sizes"),
)


def build_report(runs: list[Run]) -> tuple[dict[str, str | bytes], dict]:
    """({file name: content} of the report folder: PNGs, report.md, plots.json), and the
    plotted data."""
    files: dict[str, str | bytes] = {}
    plotted: dict[str, object] = {}
    sections, skipped = [], []
    for name, title, chart, why_not in CHARTS:
        made = chart(runs)
        if made is None:
            skipped.append(f"{title}: {why_not}")
            continue
        files[name], plotted[name] = made
        sections.append(f"## {title}\n\n![{title}]({name})\n")
    heatmaps = heatmap_charts(runs)
    if not heatmaps:
        skipped.append("Throughput heatmap: no runs differing only in sequence length and global batch (a sweep of both)")
    for name, png, data in heatmaps:
        files[name], plotted[name] = png, data
        sections.append(f"## Throughput: {data['title']}\n\n![tokens/s per GPU over sequence length and global batch]({name})\n")
    hidden = solved(runs)[MAX_PANELS:]
    if hidden:
        skipped.append(f"Waterfall and top-K panels of {len(hidden)} runs past the first {MAX_PANELS}: " + ", ".join(r.name for r in hidden))
    files["report.md"] = _markdown(runs, sections, skipped)
    files["plots.json"] = json.dumps(plotted, indent=1, allow_nan=False) + "\n"
    return files, plotted


def _markdown(runs: list[Run], sections: list[str], skipped: list[str]) -> str:
    from mofa.report import CONVENTION_NOTES, convention_of, table

    lines = ["# MoFa report", "", f"{len(runs)} runs, {len(solved(runs))} with a configuration.", ""]
    rows = []
    for r in runs:
        b = r.best
        if b:
            rows.append([r.name, config_label(b["config"]), features_label(b["config"]), b["step_time_s"], b["tokens_per_s_per_gpu"], f"{100 * b['mfu']:.1f} ({convention_of(b)})",
                         b["memory_gib"]["peak"], "-" if b.get("ettr") is None else 100 * b["ettr"], r.result.get("status")])
        else:
            status = "failed: " + r.failed["error"] if r.failed else (r.result or {}).get("status", r.marker.get("status"))
            rows.append([r.name, "-", "-", "-", "-", "-", "-", "-", status])
    headers = ["run", "layout", "features", "step s", "tokens/s/GPU", "MFU %", "peak GiB", "ETTR %", "status"]
    text = table(headers, rows, "lll" + "r" * 5 + "l").splitlines()
    used = sorted({convention_of(r.best) for r in runs if r.best})
    notes = "; ".join(f"{c}: {CONVENTION_NOTES.get(c, c)}" for c in used)
    lines += ["```", *text, "```", "", f"MFU: model FLOPs over the dense peak, counted in the convention after each figure ({notes}).", ""]
    lines += sections
    if skipped:
        lines += ["## Not drawn", ""] + [f"* {s}" for s in skipped] + [""]
    return "\n".join(lines)


REPORT_FILES_PREFIXES = ("heatmap_",)


def owned(name: str) -> bool:
    """The names a report folder may hold (it is replaced as a set)."""
    return name in {c[0] for c in CHARTS} | {"report.md", "plots.json"} or (name.startswith(REPORT_FILES_PREFIXES) and name.endswith(".png"))
