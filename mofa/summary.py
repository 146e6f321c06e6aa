"""A batch's summary table: one row per run, the long table of the design notes (layout,
memory ledger, FLOPs, step-time ledger, throughput, MFU, reliability, solver figures).

Every number is read from the run's result.json (the typed SolveResult's dict: the exact
model's evaluation of the best configuration), never recomputed here; the only arithmetic is
unit conversion (seconds to days, GiB already given). Written as CSV, JSON lines and, when
pyarrow is importable, Parquet -- the three files as one set.
"""

from __future__ import annotations

import csv
import io
import json
import os

from costmodel.configs import features_label


#: memory ledger columns (GiB, the worst rank's), from result.json's memory_gib
MEMORY_COLUMNS = (("params_gib", "params"), ("grads_gib", "grads"), ("optimizer_gib", "optimizer"), ("gathered_params_gib", "gathered_params"),
                  ("activations_gib", "activations"), ("optimizer_transient_gib", "optimizer_transient"), ("comm_buffers_gib", "comm_buffers"),
                  ("cuda_context_gib", "cuda_context"), ("fragmentation_gib", "fragmentation"), ("peak_gib", "peak"))
#: step-time ledger columns (seconds), from result.json's breakdown_s; t_comm_* are exposed communication by kind
TIME_COLUMNS = (("t_compute_s", "compute"), ("t_recompute_s", "recompute"), ("t_comm_tp_s", "tp"), ("t_comm_cp_s", "cp"), ("t_comm_ep_s", "ep"),
                ("t_comm_fsdp_s", "fsdp"), ("t_comm_pp_s", "pp"), ("t_comm_dp_s", "dp"), ("t_offload_s", "offload"), ("t_overhead_s", "overhead"),
                ("t_bubble_s", "bubble"), ("t_update_s", "update"))

COLUMNS = (("run", "model", "hardware", "num_gpus", "supernode_size", "tp", "cp", "pp", "vp", "ep", "etp", "dp", "zero_stage", "mbs",
            "global_batch_size", "seq_len", "pp_schedule", "features")
           + tuple(c for c, _ in MEMORY_COLUMNS) + ("memory_capacity_gib", "model_flops_per_step")
           + tuple(c for c, _ in TIME_COLUMNS)
           + ("t_step_s", "t_bound_compute_s", "t_bound_memory_s", "t_bound_comm_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "mfu_convention", "flops_convention", "ettr", "checkpoint_interval_steps",
              "e2e_days", "method", "objective", "status", "gap", "solve_time_s", "sweep", "input", "error"))

GIB = 2**30
SECONDS_PER_DAY = 86400.0


def summary_row(marker: dict, result: dict | None, failed: dict | None) -> dict:
    """One row of the table from a run folder's run.json, result.json and failed.json."""
    row = dict.fromkeys(COLUMNS)
    row.update(run=marker["name"], input=marker.get("input"), sweep=json.dumps(marker.get("sweep") or {}, sort_keys=False),
               model=marker.get("model"), hardware=marker.get("hardware"), num_gpus=marker.get("num_gpus"), supernode_size=marker.get("supernode_size"),
               global_batch_size=marker.get("global_batch_size"), seq_len=marker.get("seq_len"), status=marker.get("status"))
    if failed is not None:
        row["error"] = failed.get("error")
        return row
    if result is None:
        return row
    row.update(method=result.get("method"), objective=result.get("objective_name"), status=result.get("status"), gap=result.get("gap"),
               solve_time_s=result.get("solve_time_s"))
    best = result.get("best")
    if not best:
        row["error"] = result.get("explanation")
        return row
    c = best["config"]
    row.update({k: c.get(k) for k in ("tp", "cp", "pp", "vp", "ep", "etp", "dp", "zero_stage", "mbs")})
    row["pp_schedule"] = c.get("pp_schedule") if c.get("pp", 1) > 1 else None
    row["features"] = features_label(c)
    for column, key in MEMORY_COLUMNS:
        row[column] = best["memory_gib"].get(key)
    row["memory_capacity_gib"] = best["memory_capacity_bytes"] / GIB
    row["model_flops_per_step"] = best.get("model_flops_per_step")
    for column, key in TIME_COLUMNS:
        row[column] = best["breakdown_s"].get(key)
    row.update(t_step_s=best["step_time_s"], tokens_per_s=best.get("tokens_per_s"), tokens_per_s_per_gpu=best["tokens_per_s_per_gpu"],
               tflops_per_gpu=best["tflops_per_gpu"], mfu=best["mfu"], mfu_convention=best.get("mfu_convention", "palm"), flops_convention=best.get("flops_convention", "palm"), ettr=best.get("ettr"),
               checkpoint_interval_steps=best.get("checkpoint_interval"))
    bounds = best.get("lower_bounds_s") or {}
    row.update(t_bound_compute_s=bounds.get("compute"), t_bound_memory_s=bounds.get("memory"), t_bound_comm_s=bounds.get("comm"))
    e2e = best.get("e2e_time_s")
    row["e2e_days"] = e2e / SECONDS_PER_DAY if e2e is not None else None
    return row


def read_run(folder: str) -> tuple[dict | None, dict | None, dict | None]:
    """(run.json, result.json, failed.json) of a run folder (None where absent)."""
    out = []
    for name in ("run.json", "result.json", "failed.json"):
        try:
            with open(os.path.join(folder, name)) as fh:
                out.append(json.load(fh))
        except (OSError, ValueError):
            out.append(None)
    return tuple(out)


def rows_of(folders: list[str]) -> list[dict]:
    rows = []
    for folder in folders:
        marker, result, failed = read_run(folder)
        if marker is not None:
            rows.append(summary_row(marker, result, failed))
    return rows


def csv_text(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else repr(v) if isinstance(v, float) else v) for k, v in row.items()})
    return buf.getvalue()


def jsonl_text(rows: list[dict]) -> str:
    return "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows)


def parquet_bytes(rows: list[dict]) -> bytes | None:
    """The table as Parquet, or None without pyarrow."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    columns = {c: [row[c] for row in rows] for c in COLUMNS}
    table = pa.table({c: pa.array(v, type=pa.string() if c in ("sweep", "error", "features") else None) for c, v in columns.items()}) if rows else pa.table({c: pa.array([], pa.string()) for c in COLUMNS})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def summary_files(rows: list[dict]) -> dict[str, str | bytes]:
    files: dict[str, str | bytes] = {"summary.csv": csv_text(rows), "summary.jsonl": jsonl_text(rows)}
    parquet = parquet_bytes(rows)
    if parquet is not None:
        files["summary.parquet"] = parquet
    return files


SUMMARY_FILES = ("summary.csv", "summary.jsonl", "summary.parquet")
