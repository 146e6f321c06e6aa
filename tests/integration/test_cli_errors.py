"""Bad input: one line on stderr naming the file, the field and the problem; exit code 2;
never a traceback."""

import subprocess
import sys

import pytest
import yaml

VALID = {
    "model": "llama3.1-8b",
    "hardware": "h100-sxm",
    "cluster": {"num_gpus": 16, "gpus_per_node": 8},
    "training": {"global_batch_size": 64, "seq_len": 8192},
    "config": {"tp": 2, "pp": 2, "mbs": 1},
}


def run(*args):
    return subprocess.run([sys.executable, "-m", "mofa", *args], capture_output=True, text=True, timeout=120)


def write(tmp_path, data, name="problem.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def mutate(change):
    data = yaml.safe_load(yaml.safe_dump(VALID))
    change(data)
    return data


def assert_one_line_error(result, path, *fragments):
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert path in lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.stdout == ""


def test_valid_problem_evaluates(tmp_path):
    result = run("evaluate", write(tmp_path, VALID), "--json")
    assert result.returncode == 0, result.stderr


CASES = {
    "missing field": (lambda d: d["training"].pop("global_batch_size"), ["training.global_batch_size", "missing"]),
    "wrong type": (lambda d: d["cluster"].update(num_gpus="many"), ["cluster.num_gpus", "integer"]),
    "zero GPUs": (lambda d: d["cluster"].update(num_gpus=0), ["cluster.num_gpus", "greater than 0"]),
    "negative GPUs": (lambda d: d["cluster"].update(num_gpus=-8), ["cluster.num_gpus", "greater than 0"]),
    "tp does not divide heads": (lambda d: d["config"].update(tp=3), ["config.tp", "num_heads"]),
    "unknown model preset": (lambda d: d.update(model="llama9-1t"), ["model", "unknown model preset 'llama9-1t'"]),
    "unknown hardware preset": (lambda d: d.update(hardware="tpu-v9"), ["hardware", "unknown hardware preset"]),
    "seq not divisible by 2cp": (lambda d: (d["training"].update(seq_len=8190), d["config"].update(cp=2, pp=1)), ["config.cp", "2*cp"]),
    "unknown field": (lambda d: d["training"].update(global_batch=3), ["training.global_batch", "unknown field"]),
    "negative failure rate": (
        lambda d: d.update(fault_tolerance={"failure_rate_per_node_day": -1, "recovery_time_s": 60, "checkpoint_save_s": 5}),
        ["fault_tolerance.failure_rate_per_node_day"],
    ),
    "world size": (lambda d: d["config"].update(tp=8, pp=4), ["config.tp", "num_gpus"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_field(tmp_path, case):
    change, fragments = CASES[case]
    path = write(tmp_path, mutate(change))
    assert_one_line_error(run("evaluate", path), path, *fragments)


def test_yaml_syntax_error(tmp_path):
    path = write(tmp_path, "model: llama3.1-8b\ncluster: {num_gpus: 8\ntraining: x\n")
    assert_one_line_error(run("evaluate", path), path, "YAML syntax error", "line")


def test_empty_file(tmp_path):
    path = write(tmp_path, "  \n")
    assert_one_line_error(run("evaluate", path), path, "empty")


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.yaml")
    assert_one_line_error(run("evaluate", path), path, "not found")


def test_top_level_not_a_mapping(tmp_path):
    path = write(tmp_path, "- just\n- a list\n")
    assert_one_line_error(run("evaluate", path), path, "mapping")


def test_bad_set_override(tmp_path):
    path = write(tmp_path, VALID)
    assert_one_line_error(run("evaluate", path, "--set", "tp=3"), path, "config.tp")
    assert_one_line_error(run("evaluate", path, "--set", "bogus_key=1"), path, "config.bogus_key", "unknown field")


def test_hf_config(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "hidden_act": "silu",
    }))
    data = mutate(lambda d: d.update(model={"hf_config": "config.json", "name": "my-llama"}))
    result = run("evaluate", write(tmp_path, data), "--json")
    assert result.returncode == 0, result.stderr
    preset = run("evaluate", write(tmp_path, VALID, "preset.yaml"), "--json")
    # the HF config of Llama-3.1-8B and the preset describe the same model
    assert json.loads(result.stdout)["step_time_s"] == json.loads(preset.stdout)["step_time_s"]
    bad = mutate(lambda d: d.update(model={"hf_config": "missing.json"}))
    path = write(tmp_path, bad, "bad.yaml")
    assert_one_line_error(run("evaluate", path), path, "model", "not found")


@pytest.mark.parametrize("args,fragment", [
    (["--nodes", "0"], "--nodes"),
    (["--nodes", "4", "--failure-rate", "-1"], "--failure-rate"),
])
def test_ettr_bad_arguments(args, fragment):
    base = {"--nodes": "4", "--failure-rate": "0.01", "--repair-time": "60", "--save-time": "2", "--step-time": "10"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    flat = [x for kv in base.items() for x in kv]
    result = run("ettr", *flat)
    assert result.returncode == 2 and "Traceback" not in result.stderr and fragment in result.stderr
