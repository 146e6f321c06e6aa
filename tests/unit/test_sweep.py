"""Sweeps in problem files: the cartesian product, deterministic names, and one-line errors
naming the file and the swept field."""

import pytest
import yaml

from costmodel.loader import ProblemError, load_problem, load_problems

BASE = {
    "name": "small",
    "model": "llama3.1-8b",
    "hardware": "h100-sxm",
    "cluster": {"num_gpus": 16, "gpus_per_node": 8},
    "training": {"global_batch_size": 64, "seq_len": 4096},
}


def write(tmp_path, data, name="p.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_cartesian_product_in_file_order_with_names(tmp_path):
    data = {**BASE, "sweep": {"cluster.num_gpus": [16, 32], "training.seq_len": [2048, 4096, 8192], "hardware": ["h100-sxm", "a100-80gb"]}}
    runs = load_problems(write(tmp_path, data))
    assert len(runs) == 2 * 3 * 2
    names = [name for name, _, _ in runs]
    assert names[0] == "p_num_gpus=16_seq_len=2048_hardware=h100-sxm"
    assert names[1] == "p_num_gpus=16_seq_len=2048_hardware=a100-80gb"  # the last field varies fastest
    assert names[-1] == "p_num_gpus=32_seq_len=8192_hardware=a100-80gb"
    assert len(set(names)) == len(names)
    for name, values, problem in runs:
        assert problem.cluster.num_gpus == values["num_gpus"]
        assert problem.training.seq_len == values["seq_len"]
        assert problem.hardware.name == values["hardware"]
        assert problem.name == "small" + name[len("p"):]
        assert problem.training.global_batch_size == 64  # what is not swept stays
    assert [n for n, _, _ in load_problems(write(tmp_path, data))] == names  # deterministic


def test_preset_field_and_bare_config_keys(tmp_path):
    data = {**BASE, "sweep": {"hardware.memory_mib": [40000, 81559], "training.global_batch_size": [32]}}
    runs = load_problems(write(tmp_path, data))
    assert [p.hardware.memory_mib for _, _, p in runs] == [40000, 81559]
    assert all(p.hardware.name == "h100-sxm" for _, _, p in runs)
    data = {**BASE, "config": {"tp": 1, "pp": 1, "mbs": 1}, "sweep": {"tp": [1, 2]}}
    assert [p.config.tp for _, _, p in load_problems(write(tmp_path, data))] == [1, 2]


def test_shared_leaf_names_use_the_full_path(tmp_path):
    ft = {"failure_rate_per_node_day": 0.01, "recovery_time_s": 600, "checkpoint_save_s": 10}
    data = {**BASE, "fault_tolerance": ft, "config": {"tp": 1, "pp": 1, "mbs": 1},
            "sweep": {"config.checkpoint_interval": [10, 20], "fault_tolerance.checkpoint_interval": ["optimal"]}}
    runs = load_problems(write(tmp_path, data))
    assert [n for n, _, _ in runs] == ["p_config.checkpoint_interval=10_fault_tolerance.checkpoint_interval=optimal",
                                       "p_config.checkpoint_interval=20_fault_tolerance.checkpoint_interval=optimal"]
    assert [p.config.checkpoint_interval for _, _, p in runs] == [10, 20]


def test_a_file_without_a_sweep_is_one_problem(tmp_path):
    runs = load_problems(write(tmp_path, BASE))
    assert [(n, v) for n, v, _ in runs] == [("p", {})]


@pytest.mark.parametrize("sweep, field, fragment", [
    ({"cluster.num_gpu": [8]}, "sweep.cluster.num_gpu", "unknown field 'num_gpu' in cluster"),
    ({"clusters.num_gpus": [8]}, "sweep.clusters.num_gpus", "unknown field 'clusters'"),
    ({"cluster.num_gpus.x": [8]}, "sweep.cluster.num_gpus.x", "is a value, not a section"),
    ({"cluster.num_gpus": []}, "sweep.cluster.num_gpus", "non-empty list"),
    ({"cluster.num_gpus": 8}, "sweep.cluster.num_gpus", "non-empty list"),
    ({"cluster.num_gpus": [8, {"a": 1}]}, "sweep.cluster.num_gpus[1]", "number, text or a boolean"),
    ({"cluster.num_gpus": [8, 8]}, "sweep.cluster.num_gpus", "lists '8' twice"),
    ({"name": ["a", "b"]}, "sweep.name", "cannot be swept"),
    ([1, 2], "sweep", "mapping of field paths"),
])
def test_bad_sweeps_are_one_line_naming_the_field(tmp_path, sweep, field, fragment):
    path = write(tmp_path, {**BASE, "sweep": sweep})
    with pytest.raises(ProblemError) as err:
        load_problems(path)
    assert err.value.field == field and fragment in err.value.message
    assert str(err.value).startswith(path) and "\n" not in str(err.value)


def test_a_bad_expanded_value_names_the_combination_and_field(tmp_path):
    path = write(tmp_path, {**BASE, "sweep": {"cluster.num_gpus": [16, -8]}})
    with pytest.raises(ProblemError) as err:
        load_problems(path)
    assert err.value.path == f"{path} [num_gpus=-8]" and err.value.field == "cluster.num_gpus"


def test_single_problem_commands_refuse_a_sweep(tmp_path):
    path = write(tmp_path, {**BASE, "sweep": {"cluster.num_gpus": [16, 32]}})
    with pytest.raises(ProblemError) as err:
        load_problem(path)
    assert err.value.field == "sweep" and "mofa batch" in err.value.message


def test_set_overrides_still_reach_inside_presets(tmp_path):
    problem = load_problem(write(tmp_path, BASE), ["hardware.memory_mib=40000", "training.seq_len=2048"])
    assert problem.hardware.memory_mib == 40000 and problem.training.seq_len == 2048
    with pytest.raises(ProblemError) as err:
        load_problem(write(tmp_path, BASE), ["training.seq_len.x=1"])
    assert err.value.field == "training.seq_len.x"
