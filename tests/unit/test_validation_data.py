"""Validation data: source files (common fields + a table of rows), folders, skipped rows,
errors that name the row and field, and points the model cannot explain (issue 9)."""

import pytest
import yaml

from calibration.data import load_dataset, load_points
from calibration.fit import default_knobs, point_result
from calibration.resolve import UNEXPLAINED, resolve
from conftest import PROBLEMS
from costmodel.loader import ProblemError

VALIDATION = PROBLEMS / "validation"

SOURCE = {
    "source": "a test campaign",
    "models": {"tiny": {"source": "test", "num_layers": 4, "hidden_size": 1024, "num_heads": 8, "ffn_hidden_size": 4096, "vocab_size": 32000}},
    "common": {
        "hardware": "h100-sxm",
        "cluster": {"gpus_per_node": 8},
        "training": {"seq_len": 2048},
        "config": {"tp": 1, "pp": 1, "zero_stage": 3},
        "measured": {"metric": "tokens_per_s_per_gpu", "source": "test table"},
    },
    "columns": ["name", "model", "cluster.num_gpus", "training.global_batch_size", "config.mbs", "measured.value"],
    "rows": [["a", "tiny", 8, 64, 8, 100000], ["b", "tiny", 16, 128, 8, 90000]],
    "skipped": [{"row": ["c", "tiny", 8, 64, 8, 1], "reason": "not expressible"}],
}


def write(tmp_path, doc, name="source.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_source_file_gives_one_point_per_row_and_keeps_its_skipped_rows(tmp_path):
    path = write(tmp_path, SOURCE)
    ds = load_dataset([str(path)])
    assert [p.name for p in ds.points] == ["a", "b"]
    a, b = ds.points
    assert a.problem.cluster.num_gpus == 8 and b.problem.cluster.num_gpus == 16
    assert b.problem.training.global_batch_size == 128 and b.problem.config.zero_stage == 3
    assert a.problem.model.name == "tiny" and a.source == "a test campaign"
    assert a.step_time_s() == pytest.approx(64 * 2048 / (100000 * 8))
    assert [s.reason for s in ds.skipped] == ["not expressible"]


def test_a_folder_stands_for_its_files(tmp_path):
    write(tmp_path, SOURCE, "one.yaml")
    two = dict(SOURCE, rows=[["c", "tiny", 8, 64, 8, 100000]])
    write(tmp_path, two, "two.yaml")
    assert [p.name for p in load_points([str(tmp_path)])] == ["a", "b", "c"]


@pytest.mark.parametrize("change,field,message", [
    (lambda d: d["rows"].__setitem__(1, ["b", "tiny", 8]), "rows[1]", "needs 6 values"),
    (lambda d: d["rows"].__setitem__(1, ["b", "tiny", 8, 64, 0, 1]), "rows[1].config.mbs", "greater than 0"),
    (lambda d: d["rows"].__setitem__(0, ["a", "nonexistent", 8, 64, 8, 1]), "rows[0].model", "unknown model preset"),
    (lambda d: d.pop("source"), "source", "names its source"),
    (lambda d: d["columns"].remove("name") or [r.pop(0) for r in d["rows"]], "columns", "column 'name'"),
    (lambda d: d.__setitem__("extra", 1), "extra", "unknown field"),
    (lambda d: d["rows"].__setitem__(1, ["a", "tiny", 16, 128, 8, 90000]), "name", "also defined"),
])
def test_errors_name_the_row_and_field(tmp_path, change, field, message):
    import copy

    doc = copy.deepcopy(SOURCE)
    change(doc)
    with pytest.raises(ProblemError) as err:
        load_dataset([str(write(tmp_path, doc))])
    assert err.value.field == field and message in err.value.message, str(err.value)


def test_a_run_the_model_cannot_fit_is_unexplained_not_scored(tmp_path):
    """A 70B model on one 8-GPU node without sharding cannot fit 80 GB in the model's estimate:
    the point is reported as unexplained with the reason, never scored."""
    import copy

    doc = copy.deepcopy(SOURCE)
    doc["models"]["big"] = {"preset": "llama3.1-70b", "name": "big"}
    doc["common"]["config"]["zero_stage"] = 0
    doc["rows"] = [["big-point", "big", 8, 64, 1, 1000]]
    doc.pop("skipped")
    point = load_points([str(write(tmp_path, doc))])[0]
    cfg, chosen = resolve(point)
    assert "GiB" in chosen[UNEXPLAINED]
    result = point_result(point, point.problem.hardware, cfg, chosen)
    assert result.unexplained and not result.scored


def test_the_shipped_data():
    """Every shipped source loads; every row the model cannot express is listed with a reason;
    the sources span A100 40/80 GB and H100 with at least 20 points on each chip."""
    ds = load_dataset([str(VALIDATION)])
    assert len(ds.points) >= 250
    assert all(s.reason for s in ds.skipped)
    by_chip = {}
    for p in ds.points:
        by_chip.setdefault(p.problem.hardware.chip, []).append(p)
    assert len(by_chip["ga100"]) >= 20 and len(by_chip["gh100"]) >= 20
    assert {p.problem.hardware.name for p in ds.points} >= {"a100-40gb", "a100-80gb", "h100-sxm", "h100-96gb"}
    assert sum(1 for p in ds.points if p.measured.peak_memory_gib) >= 10


def test_a_knob_needs_ten_points_that_exercise_it():
    """default_knobs: an attention implementation's efficiency is fitted only with >= 10 runs
    using it, and a chip gets at most one knob per 10 points."""
    points = load_points([str(VALIDATION)])
    a100 = [p for p in points if p.problem.hardware.chip == "ga100"]
    knobs = default_knobs(a100)
    assert "attention_triton" in knobs and "fp8_gemm" not in knobs and "attention_te" not in knobs
    assert len(knobs) <= len(a100) // 10
    few = [p for p in a100 if p.source.startswith("torchtitan")]  # 5 points
    assert default_knobs(few) == ()  # no knob has ten points behind it: nothing is fitted


PIPELINED = {
    "source": "a pipelined campaign",
    "models": {"deep": {"source": "test", "num_layers": 32, "hidden_size": 2048, "num_heads": 16, "ffn_hidden_size": 8192, "vocab_size": 32000}},
    "common": {
        "hardware": "h100-sxm",
        "cluster": {"num_gpus": 16, "gpus_per_node": 8},
        "training": {"seq_len": 4096, "global_batch_size": 32},
        "config": {"tp": 1, "pp": 4, "zero_stage": 1},
        "microbatches": "per_pipeline_stage",
        "measured": {"metric": "tokens_per_s_per_gpu", "source": "test table"},
    },
    "columns": ["name", "model", "config.pp_schedule", "config.mbs", "unknown", "measured.value"],
    "rows": [["one", "deep", "1f1b", 2, [], 20000], ["inter", "deep", "interleaved_1f1b", 1, ["vp", "mbs"], 20000]],
}


def test_one_micro_batch_per_pipeline_stage_sets_the_micro_batch_size(tmp_path):
    """torchtitan's default before pipeline_parallel_microbatch_size: pp x vp micro-batches, so
    the local batch (32 / dp 4 = 8) over pp 4 is a micro-batch of 2 in 1F1B, and an unknown vp
    is resolved together with the micro-batch size it implies."""
    one, inter = load_points([str(write(tmp_path, PIPELINED))])
    assert one.microbatches == "per_pipeline_stage" and one.problem.config.mbs == 2
    cfg, chosen = resolve(inter)
    assert UNEXPLAINED not in chosen
    assert chosen["vp"] >= 2 and chosen["mbs"] * 4 * chosen["vp"] == 8
    assert int(cfg.vp[0]) == chosen["vp"] and int(cfg.mbs[0]) == chosen["mbs"]


@pytest.mark.parametrize("change,field,message", [
    (lambda d: d["rows"][0].__setitem__(3, 4), "rows[0].config.mbs", "local batch over pp x vp (2)"),
    (lambda d: d["rows"][1].__setitem__(4, ["vp"]), "rows[1].unknown", "makes mbs unknown too"),
    (lambda d: d["common"].__setitem__("microbatches", "sometimes"), "rows[0].microbatches", "not a micro-batch rule"),
])
def test_a_micro_batch_rule_the_row_breaks_is_named(tmp_path, change, field, message):
    import copy

    doc = copy.deepcopy(PIPELINED)
    change(doc)
    with pytest.raises(ProblemError) as err:
        load_dataset([str(write(tmp_path, doc))])
    assert err.value.field == field and message in err.value.message, str(err.value)


def test_an_unstated_gemm_dtype_and_overlap_resolve_to_the_fastest_the_gpu_runs(tmp_path):
    """training.dtypes.compute and an overlap feature may be unknown: on an H100 the resolver
    takes fp8 GEMMs and TP overlapped (each faster there), and the point evaluates as resolved;
    an A100 has no fp8 peak, so there the dtype resolves to bf16."""
    import copy

    doc = copy.deepcopy(SOURCE)
    doc.pop("skipped")
    doc["common"]["config"].update({"tp": 2, "zero_stage": 1})
    doc["columns"] = SOURCE["columns"] + ["hardware", "unknown"]
    doc["rows"] = [["h100", "tiny", 8, 64, 8, 100000, "h100-sxm", ["training.dtypes.compute", "tp_overlap"]],
                   ["a100", "tiny", 8, 64, 8, 100000, "a100-80gb", ["training.dtypes.compute"]]]
    h100, a100 = load_points([str(write(tmp_path, doc))])
    assert h100.problem.training.dtypes.compute == "bf16"  # the stated default, until resolved
    cfg, chosen = resolve(h100)
    assert chosen["training.dtypes.compute"] == "fp8" and chosen["tp_overlap"] is True and int(cfg.tp_overlap[0]) == 1
    resolved = h100.resolved(chosen)
    assert resolved.problem.training.dtypes.compute == "fp8" and h100.problem.training.dtypes.compute == "bf16"
    fp8 = point_result(resolved, resolved.problem.hardware, cfg, chosen)
    bf16 = point_result(h100, h100.problem.hardware, cfg, chosen)
    assert fp8.predicted_step_s < bf16.predicted_step_s
    _, chosen = resolve(a100)
    assert chosen["training.dtypes.compute"] == "bf16"


def test_a_field_that_cannot_be_unknown_is_named(tmp_path):
    import copy

    doc = copy.deepcopy(SOURCE)
    doc["columns"] = SOURCE["columns"] + ["unknown"]
    doc["rows"] = [["a", "tiny", 8, 64, 8, 100000, ["tp"]]]
    with pytest.raises(ProblemError, match=r"rows\[0\].unknown.*cannot resolve \['tp'\]"):
        load_points([str(write(tmp_path, doc))])


def test_validate_shows_each_points_held_out_error_beside_its_in_sample_one(tmp_path):
    """With cross-validation the table gains a column: each point's error when its group was
    held out of the fit ('-' for a point without one); without it the column is absent."""
    from mofa.commands.validate import summary
    from mofa.report import render_validation

    points = load_points([str(write(tmp_path, SOURCE))])
    results = [point_result(p, p.problem.hardware, *resolve(p)) for p in points]
    out = summary(results, {}, {p.hardware: p.problem.hardware.efficiency for p in points}, points)
    assert "held-out" not in render_validation(out)
    out["points"][0]["held_out_error_pct"], out["points"][1]["held_out_error_pct"] = -12.5, None
    out["cross_validation"] = {"held_out": "source", "per_gpu": {}, "per_source": {}, "interval_coverage": None, "log_residual_sd": 0.1}
    text = render_validation(out).splitlines()
    assert "held-out (source) %" in text[0]
    column = text[0].index("held-out (source) %") + len("held-out (source) %")  # right-aligned under its header
    assert text[2][:column].endswith("-12.5") and text[3][:column].endswith("-")
