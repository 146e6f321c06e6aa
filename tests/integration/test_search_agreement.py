"""cpsat (each of its three paths), exhaustive and DFS agree on small problems chosen to exercise the
corners of the space: pp=2 with virtual stages, forced switches, sequence parallelism off, tied
embeddings, unfused attention, MoE with expert-TP and routing imbalance, the e2e objective,
tight memory, and each dimension issue 7 added (ZeRO stages and HSDP, the schedules, the CP
variants with document masks, recompute granularity and fine-grained offload). The bases keep
the new dimensions narrow (Megatron's schedules, ring CP, ZeRO-0/1) so each variant widens one."""

import pytest
import yaml

import optimizer.cpsat
from costmodel.loader import load_problem
from optimizer.search import solve

NARROW = {"search": {"pp_schedule": ["1f1b", "interleaved_1f1b"], "cp_comm": ["p2p"]}, "features": {"zero_stage": [0, 1]}}

DENSE = {
    "model": {"preset": "llama3.1-8b", "num_layers": 16},
    "hardware": "h100-sxm",
    "cluster": {"num_gpus": 16, "gpus_per_node": 8},
    "training": {"global_batch_size": 32, "seq_len": 4096, "steps": 10000},
    "fault_tolerance": {"failure_rate_per_node_day": 0.01, "recovery_time_s": 300, "checkpoint_save_s": 20},
    "search": {"mbs": [1, 2], "vp": [1, 2, 4], **NARROW["search"]},
    "features": NARROW["features"],
}
MOE = {
    "model": {"preset": "mixtral-8x7b", "num_layers": 8},
    "hardware": "h100-sxm",
    "cluster": {"num_gpus": 16, "gpus_per_node": 8},
    "training": {"global_batch_size": 32, "seq_len": 4096},
    "search": {"mbs": [1, 2], "vp": [1, 2], **NARROW["search"]},
    "features": NARROW["features"],
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
    "tight-memory": (DENSE, {"hardware": {"preset": "h100-sxm", "memory_mib": 24576}}),
    "e2e": (DENSE, {"search": {"objective": "e2e"}}),
    "moe": (MOE, {}),
    "moe-imbalanced-etp": (MOE, {"training": {"moe_routing_imbalance": 2.0}, "search": {"etp": [1, 2]}}),
    "moe-ep-overlap-on": (MOE, {"features": {"ep_overlap": "on", "zero_stage": [0, 1]}}),
    "zero-stages-hsdp": (DENSE, {"features": {"zero_stage": [0, 1, 2, 3]}, "search": {"dp_shard": [2, 4], "tp": [1], "pp": [1, 2], "mbs": [1], "vp": [1],
                                                                                      "pp_schedule": ["1f1b", "interleaved_1f1b"], "cp_comm": ["p2p"]}}),
    "schedules": (DENSE, {"search": {"pp_schedule": ["1f1b", "interleaved_1f1b", "flexible", "afab", "dualpipev"], "pp": [2, 4], "tp": [1],
                                     "vp": [1, 2, 4], "mbs": [1], "cp_comm": ["p2p"]}}),
    "cp-variants-document-masks": (DENSE, {"training": {"seq_len": 16384, "mean_document_tokens": 2048},
                                           "search": {"cp": [2, 4], "cp_comm": ["p2p", "all_gather", "a2a", "a2a+p2p"], "cp_a2a": [2],
                                                      "mbs": [1], "vp": [1], "pp_schedule": ["1f1b"]}}),
    "recompute-offload-granularity": (DENSE, {"hardware": {"preset": "h100-sxm", "memory_mib": 24576}, "search": {"tp": [1], "pp": [1, 2], "recompute_block_layers": [1, 2], "recompute_modules": [["core_attn"], ["core_attn", "mlp"], ["layernorm"]],
                                                         "activation_offload": [False, "layer", ["core_attn", "attn_proj"]], "mbs": [1],
                                                         "vp": [1, 2], "pp_schedule": ["1f1b", "interleaved_1f1b"], "cp_comm": ["p2p"]}}),
    "moe-zero3-modules": (MOE, {"features": {"zero_stage": [2, 3], "recompute": ["none", "selective"]},
                                "search": {"recompute_modules": [["moe_act"], ["moe"], ["core_attn", "moe_act"]], "mbs": [1], "vp": [1], "tp": [1], "ep": [2, 8],
                                           "pp_schedule": ["1f1b"], "cp_comm": ["p2p"]}}),
    # search.framework: the frameworks' rules cut skeletons (schedules, CP variants, tp) and
    # features (ZeRO stages with pp, recompute modes, the EP overlap)
    "framework-megatron": (DENSE, {"features": {"zero_stage": [1, 2, 3], "recompute": ["none", "full"], "tp_overlap": "off"},
                                   "search": {"framework": "megatron", "pp_schedule": ["1f1b", "interleaved_1f1b", "afab", "dualpipev"],
                                              "pp": [1, 2, 4], "tp": [1, 2], "mbs": [1], "vp": [1, 2], "cp_comm": ["p2p"]}}),
    "framework-torchtitan": ({**DENSE, "model": "llama3.1-8b"},  # the architecture of its llama3_8b config function
                             {"features": {"zero_stage": [0, 1, 3], "recompute": ["none", "selective", "full"]},
                              "search": {"framework": "torchtitan", "cp": [1, 2], "cp_comm": ["p2p", "all_gather"], "pp": [1, 2], "tp": [1, 2],
                                         "mbs": [1], "vp": [1], "pp_schedule": ["1f1b"]}}),
    "framework-deepspeed": (DENSE, {"features": {"zero_stage": [0, 1, 2, 3]}, "search": {"framework": "deepspeed", "pp": [1, 2, 4], "mbs": [1, 2]}}),
    "framework-moe-megatron": (MOE, {"training": {"steps": 1000}, "search": {"framework": "megatron", "mbs": [1], "vp": [1, 2], "etp": [1, 2]}}),
}


#: what each path reports (the tables' paths say so when no row fits: nothing is left to order)
PATHS = {"exhaustive": ("exhaustive scoring",), "tables": ("bound-ordered scoring", "tables (no admissible row fits)"),
         "solver": ("CP-SAT", "tables (no admissible row fits)")}


def _every_path(problem, monkeypatch, **options):
    """cpsat's result through each of its paths, each checked to report the path it took."""
    results = []
    for name, reported in PATHS.items():
        with monkeypatch.context() as m:
            m.setattr(optimizer.cpsat, "PATH", "exhaustive" if name == "exhaustive" else "tables")
            if name == "solver":
                m.setattr(optimizer.cpsat, "DIRECT_ROWS", 0)
            result = solve(problem, "cpsat", **options)
        assert result.method == "cpsat"
        assert result.stats["path"].startswith(reported), (name, result.stats)
        results.append(result)
    return results


def merged(base, change):
    out = yaml.safe_load(yaml.safe_dump(base))
    for key, value in change.items():
        out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_methods_agree(tmp_path, monkeypatch, name):
    base, change = VARIANTS[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(merged(base, change)))
    problem = load_problem(str(path))
    exhaustive = solve(problem, "exhaustive", top_k=3)
    assert exhaustive.evaluated > 0
    chosen = solve(problem, "cpsat", top_k=3)  # and the path it picks
    assert chosen.stats["path"].startswith(sum(PATHS.values(), ()))
    for result in (*_every_path(problem, monkeypatch, top_k=3), chosen):
        assert result.status == exhaustive.status, (result.stats["path"], result.status, exhaustive.status)
        assert list(result.top_values) == pytest.approx(list(exhaustive.top_values), rel=1e-12), result.stats["path"]
    if len(exhaustive.top_values) and exhaustive.evaluated < 6000:
        dfs = solve(problem, "dfs", top_k=3)
        assert list(dfs.top_values) == pytest.approx(list(exhaustive.top_values), rel=1e-12)
        assert dfs.evaluated == exhaustive.evaluated


DISTINCT = {  # small spaces: the test ranks the whole space to check the grouping independently
    "dense": (DENSE, {"search": {"tp": [1, 2], "pp": [1, 2], "mbs": [1, 2], "vp": [1, 2], **NARROW["search"]}}),
    "zero-stages-hsdp": VARIANTS["zero-stages-hsdp"],
}


@pytest.mark.parametrize("name", list(DISTINCT))
def test_distinct_layouts_agree(tmp_path, monkeypatch, name):
    """--distinct-layouts: cpsat (each path) and exhaustive return the same K layouts, each its best
    configuration, and they are the K best layouts of the whole ranked space."""
    from optimizer.result import LAYOUT_FIELDS

    base, change = DISTINCT[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(merged(base, change)))
    problem = load_problem(str(path))
    k = 4

    def layouts(result):
        return [tuple(int(getattr(result.top_configs, f)[i]) for f in LAYOUT_FIELDS) for i in range(len(result.top_values))]

    everything = solve(problem, "exhaustive", top_k=10**9)  # the whole feasible space, ranked
    expected, values = [], []
    for layout, value in zip(layouts(everything), everything.top_values):
        if layout not in expected:
            expected.append(layout)
            values.append(value)
    expected, values = expected[:k], values[:k]
    assert len(expected) == k
    plain = solve(problem, "exhaustive", top_k=k)
    exhaustive = solve(problem, "exhaustive", top_k=k, distinct_layouts=True)
    assert layouts(exhaustive) == expected and list(exhaustive.top_values) == values
    for result in _every_path(problem, monkeypatch, top_k=k, distinct_layouts=True):  # (DFS offers to the same TopK; it is too slow to score here)
        assert result.status == "optimal"
        assert layouts(result) == expected
        assert list(result.top_values) == pytest.approx(values, rel=1e-12)
        for i in range(k):  # the same configuration, not only the same layout
            assert result.top_configs.spec(i) == exhaustive.top_configs.spec(i)
    if name == "dense":  # without the option the top K repeat a layout (they differ in a toggle)
        assert len(set(layouts(plain))) < k
