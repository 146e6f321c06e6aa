"""cpsat, exhaustive and DFS agree on small problems chosen to exercise the corners of the
space: pp=2 with virtual stages, forced switches, sequence parallelism off, tied embeddings,
unfused attention, MoE with expert-TP and routing imbalance, the e2e objective, tight memory."""

import pytest
import yaml

from costmodel.loader import load_problem
from optimizer.search import solve

DENSE = {
    "model": {"preset": "llama3.1-8b", "num_layers": 16},
    "hardware": "h100-sxm",
    "cluster": {"num_gpus": 16, "gpus_per_node": 8},
    "training": {"global_batch_size": 32, "seq_len": 4096, "steps": 10000},
    "fault_tolerance": {"failure_rate_per_node_day": 0.01, "recovery_time_s": 300, "checkpoint_save_s": 20},
    "search": {"mbs": [1, 2], "vp": [1, 2, 4]},
}
MOE = {
    "model": {"preset": "mixtral-8x7b", "num_layers": 8},
    "hardware": "h100-sxm",
    "cluster": {"num_gpus": 16, "gpus_per_node": 8},
    "training": {"global_batch_size": 32, "seq_len": 4096},
    "search": {"mbs": [1, 2], "vp": [1, 2]},
}

VARIANTS = {
    "dense": (DENSE, {}),
    "pp2-interleaved": (DENSE, {"search": {"pp": [2], "vp": [1, 2, 4], "mbs": [1]}}),
    "pp-overlap-on": (DENSE, {"features": {"pp_overlap": "on"}}),
    "dp-overlap-and-cpu-on": (DENSE, {"features": {"dp_overlap": "on", "cpu_optimizer": "on"}}),
    "tp-overlap-on-full-recompute": (DENSE, {"features": {"tp_overlap": "on", "recompute": "full"}}),
    "no-sequence-parallel": (DENSE, {"training": {"sequence_parallel": False}}),
    "gpt-tied-unfused": ({**DENSE, "model": {"preset": "gpt3-175b", "num_layers": 8, "hidden_size": 2048, "num_heads": 16, "ffn_hidden_size": 8192}},
                         {"training": {"attention_kernel": "unfused"}}),
    "tight-memory": (DENSE, {"hardware": {"preset": "h100-sxm", "memory_gb": 24}}),
    "e2e": (DENSE, {"search": {"objective": "e2e"}}),
    "moe": (MOE, {}),
    "moe-imbalanced-etp": (MOE, {"training": {"moe_routing_imbalance": 2.0}, "search": {"etp": [1, 2]}}),
    "moe-ep-overlap-on": (MOE, {"features": {"ep_overlap": "on"}}),
}


def merged(base, change):
    out = yaml.safe_load(yaml.safe_dump(base))
    for key, value in change.items():
        out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_methods_agree(tmp_path, name):
    base, change = VARIANTS[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(merged(base, change)))
    problem = load_problem(str(path))
    exhaustive = solve(problem, "exhaustive", top_k=3)
    cpsat = solve(problem, "cpsat", top_k=3)
    assert cpsat.status == exhaustive.status, (cpsat.status, exhaustive.status)
    assert list(cpsat.top_values) == pytest.approx(list(exhaustive.top_values), rel=1e-12)
    if len(exhaustive.top_values) and exhaustive.space_size < 60000:
        dfs = solve(problem, "dfs", top_k=3)
        assert list(dfs.top_values) == pytest.approx(list(exhaustive.top_values), rel=1e-12)
        assert dfs.evaluated == exhaustive.evaluated
