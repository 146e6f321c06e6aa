"""The models people train now (issue 8): per-layer kinds from Hugging Face configs (Qwen3.5's
hybrid Gated DeltaNet + attention, GPT-OSS's sliding windows, GPT-2's keys), MTP, and that
every layer kind lands on the pipeline rank the framework puts it on."""

import numpy as np
import pytest

from conftest import ROOT
from costmodel import architecture as arch
from costmodel.configs import ConfigBatch
from costmodel.evaluate import evaluate, kind_of_layers, model_kinds
from costmodel.flops import attention_flops_per_token, layer_forward_flops_per_token, model_flops_per_token
from costmodel.loader import ProblemError, build_problem
from costmodel.pipeline import rank_classes
from costmodel.presets import MODELS
from costmodel.presets.hf import model_from_hf_config
from costmodel.rules import violations

DATA = ROOT / "tests" / "data"
CONFIGS = ROOT / "costmodel" / "presets" / "hf_configs"  # the presets' bundled config.json files


def qwen35():
    return model_from_hf_config(CONFIGS / "qwen3_5_35b_a3b.json")


def test_qwen35_imports_with_its_hybrid_layout():
    """Note 004 (model card, config.json): 40 layers, hidden 2048, 256 experts, 8 routed + 1
    shared, 10 x (3 x Gated DeltaNet + 1 x attention) under text_config."""
    m = qwen35()
    assert (m.num_layers, m.hidden_size, m.moe.num_experts, m.moe.top_k, m.moe.num_shared_experts) == (40, 2048, 256, 8, 1)
    types = [a for a, _ in m.layer_kinds()]
    assert types == (["linear_attention"] * 3 + ["full_attention"]) * 10
    assert all(mlp == "moe" for _, mlp in m.layer_kinds())
    assert m.attention_output_gate and any("vision_config" in n for n in m.notes)
    assert not any("attn_output_gate" in n for n in m.notes)  # modelled now, no longer a note


def test_qwen35_attention_flops_count_only_the_full_attention_layers():
    m, s = qwen35(), 262144
    full = attention_flops_per_token(m, s)
    linear = attention_flops_per_token(m, s, attention="linear_attention")
    assert full == pytest.approx(2.0 * s * 16 * (256 + 256))  # PaLM's full score matrix, 16 heads of 256
    assert linear < full / 1000  # Gated DeltaNet: linear in the sequence
    quadratic = sum(attention_flops_per_token(m, s, attention=a) for a, _ in m.layer_kinds()) - 30 * linear
    assert quadratic == pytest.approx(10 * full)  # only the 10 full-attention layers pay s^2


def test_qwen35_counts_the_shared_expert():
    m = qwen35()
    x = m.moe
    with_shared = arch.active_matmul_params(m, ("full_attention", "moe"))
    routed_only = with_shared - x.num_shared_experts * arch.mlp_params(m, x.shared_ffn)
    assert with_shared - routed_only == 3 * 2048 * 512  # one SwiGLU shared expert of 512
    assert arch.total_params(m) == pytest.approx(35e9, rel=0.05)  # the model card's 35B (language model)


def test_gpt_oss_sliding_window_layers():
    """GPT-OSS-120B: 36 layers alternating 128-token sliding-window and full attention; 116.8B
    parameters (OpenAI's model card)."""
    m = model_from_hf_config(CONFIGS / "gpt_oss_120b.json")
    assert m.sliding_window == 128 and m.layer_kinds()[0] == ("sliding_attention", "moe")
    assert arch.total_params(m) == pytest.approx(116.8e9, rel=0.01)
    s = 8192
    sliding = attention_flops_per_token(m, s, attention="sliding_attention")
    assert sliding == pytest.approx(2.0 * 128 * 64 * (64 + 64))  # each query sees 128 keys
    causal = attention_flops_per_token(m, s, causal=True, attention="sliding_attention")
    assert causal == pytest.approx(2.0 * s * 64 * 128 * (128 * 129 / 2 + (s - 128) * 128) / s**2)


def test_gpt2_keys_and_unknown_keys_reported():
    m = model_from_hf_config(DATA / "gpt2_config.json")
    assert (m.num_layers, m.hidden_size, m.num_heads, m.activation, m.norm, m.position_embedding) == (12, 768, 12, "gelu", "layernorm", "learned")
    assert m.tied_embeddings and m.linear_bias
    assert arch.total_params(m) == pytest.approx(124e6, rel=0.02)
    assert m.notes == ["unknown keys, ignored: my_custom_key"]


def test_malformed_config_json_is_one_line_naming_the_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"num_hidden_layers": 4,')
    with pytest.raises(ProblemError) as err:
        build_problem({"model": {"hf_config": str(bad)}, "hardware": "h100-sxm", "cluster": {"num_gpus": 8, "gpus_per_node": 8},
                       "training": {"global_batch_size": 8, "seq_len": 1024}}, str(tmp_path / "p.yaml"))
    assert err.value.field == "model" and "config.json is not valid JSON" in str(err.value) and "\n" not in str(err.value)


def problem_for(model, gpus=64, **training):
    data = {"model": model.model_dump(), "hardware": "h100-sxm", "cluster": {"num_gpus": gpus, "gpus_per_node": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, **training}}
    return build_problem(data, str(ROOT / "p.yaml"))


def test_every_layer_kind_lands_on_its_rank():
    """Qwen3.5 on pp = 4: rank r holds layers 10r..10r+9 of the 3-linear-1-full pattern, so the
    two middle ranks hold different layers and each is a rank class of its own."""
    m = qwen35()
    cfg = ConfigBatch.from_columns(64, tp=2, pp=4, first_layers=10, last_layers=10)
    kinds = model_kinds(m)
    classes = rank_classes(kind_of_layers(m), len(kinds), cfg)
    full = kinds.index(("full_attention", "moe"))
    # full-attention layers (index 3, 7, 11, ...): 3, 7 | 11, 15, 19 | 23, 27 | 31, 35, 39
    assert [float(r.counts[full][0]) for r in classes] == [2, 3, 2, 3]
    assert [float(sum(r.counts)[0]) for r in classes] == [10] * 4
    assert [float(r.rank[0]) for r in classes] == [0, 1, 2, 3]
    assert [float(r.ranks[0]) for r in classes] == [1, 1, 1, 1]


def test_leading_dense_layers_stay_on_the_first_stages():
    """DeepSeek-V3's 3 leading dense layers on pp = 16 with Megatron's uneven split (2 layers on
    the first rank, 4 on the middle ones, 3 on the last): 2 on rank 0, the third on rank 1; ranks
    2-14 hold four MoE layers each, a class of 13 ranks priced at rank 2."""
    m = MODELS["deepseek-v3"]
    kinds = model_kinds(m)
    dense = kinds.index(("full_attention", "dense"))
    classes = rank_classes(kind_of_layers(m), len(kinds), ConfigBatch.from_columns(1024, pp=16, first_layers=2, last_layers=3))
    assert [float(r.counts[dense][0]) for r in classes] == [2, 1, 0, 0]
    assert [float(sum(r.counts)[0]) for r in classes] == [2, 4, 4, 3]
    assert [(float(r.rank[0]), float(r.ranks[0])) for r in classes] == [(0, 1), (1, 1), (2, 13), (15, 1)]


def test_a_batch_pads_its_layouts_to_the_most_middle_classes():
    """One batch, two layouts: pp 16 (two middle compositions) and pp 4 with 16 / 15 layers on the
    edges (the dense layers all on rank 0, one middle composition): the pp-4 row repeats rank 1's
    class with no ranks, so the fill and drain count every rank once."""
    m = MODELS["deepseek-v3"]
    kinds = model_kinds(m)
    cfg = ConfigBatch.from_columns(1024, pp=np.array([16.0, 4.0]), first_layers=np.array([2.0, 16.0]), last_layers=np.array([3.0, 15.0]))
    classes = rank_classes(kind_of_layers(m), len(kinds), cfg)
    assert len(classes) == 4
    assert [float(r.ranks[1]) for r in classes] == [1, 2, 0, 1]
    assert [float(sum(r.counts)[1]) for r in classes] == [16, 15, 15, 15]
    assert [float(sum(c.ranks[i] * sum(c.counts)[i] for c in classes)) for i in range(2)] == [61.0, 61.0]


def test_mtp_adds_a_layer_and_a_loss_to_the_last_stage():
    base = MODELS["deepseek-v3"].model_copy(update={"num_layers": 8, "mtp_layers": 0})
    with_mtp = base.model_copy(update={"mtp_layers": 1})
    assert arch.total_params(with_mtp) - arch.total_params(base) == arch.mtp_params(base)
    assert model_flops_per_token(with_mtp, 4096) > model_flops_per_token(base, 4096) + 3 * layer_forward_flops_per_token(base, 4096, ("full_attention", "moe"))
    cfg = dict(tp=1, pp=2, ep=8, etp=1, first_layers=4, last_layers=4, mbs=1)
    evs = [evaluate(problem_for(m, gpus=64), ConfigBatch.from_columns(64, **cfg)) for m in (base, with_mtp)]
    assert int(evs[1].worst_rank[0]) != 0  # the last rank (pp = 2: also the second) carries the MTP module
    assert float(evs[1].memory_bytes["peak"][0]) > float(evs[0].memory_bytes["peak"][0])
    assert float(evs[1].step_time_s[0]) > float(evs[0].step_time_s[0])


def test_linear_attention_is_not_split_by_context_parallelism():
    problem = problem_for(qwen35())
    ok = ConfigBatch.from_columns(64, tp=2, cp=1, ep=8, etp=1, first_layers=40, last_layers=40)
    bad = ConfigBatch.from_columns(64, tp=2, cp=2, ep=8, etp=1, first_layers=40, last_layers=40)
    assert not violations(problem, ok)["cp_linear_attention"][0] and violations(problem, bad)["cp_linear_attention"][0]
    ev = evaluate(problem, ok)
    assert np.isfinite(ev.step_time_s[0]) and ev.memory_bytes["activations"][0] > 0


def test_gated_attention_costs_time_and_memory():
    """The gate's GEMM columns and its saved tensors (gate logits, ungated output) make a
    gated-attention layer slower and its activations larger than the same layer without it."""
    gated = qwen35()
    plain = gated.model_copy(update={"attention_output_gate": False})
    cfg = ConfigBatch.from_columns(64, tp=2, cp=1, ep=8, etp=1, first_layers=40, last_layers=40)
    ev = [evaluate(problem_for(m), cfg) for m in (plain, gated)]
    assert float(ev[1].step_time_s[0]) > float(ev[0].step_time_s[0])
    assert float(ev[1].memory_bytes["activations"][0]) > float(ev[0].memory_bytes["activations"][0])


def test_document_masks_leave_the_linear_attention_work_alone():
    """Document masks shorten softmax attention's rows (costmodel.documents); the delta rule's
    work is linear in the tokens whatever the documents. A Qwen3.5 made of Gated DeltaNet layers
    alone steps in the same time with and without masks; with its full-attention layers back,
    the masks make it faster."""
    hybrid = qwen35()
    linear = hybrid.model_copy(update={"layer_types": ["linear_attention"] * hybrid.num_layers, "mtp_layers": 0})
    cfg = ConfigBatch.from_columns(64, tp=2, cp=1, ep=8, etp=1, first_layers=40, last_layers=40)

    def step(m, **training):
        return float(evaluate(problem_for(m, seq_len=32768, **training), cfg).step_time_s[0])

    assert step(linear, mean_document_tokens=2048) == pytest.approx(step(linear), rel=1e-12)
    assert step(hybrid, mean_document_tokens=2048) < step(hybrid)


def test_per_op_checkpointing_is_refused_where_it_is_not_modelled():
    """torchtitan's per-op policy (recompute_modules [ops]) is modelled for dense softmax-attention
    layers without TP: under TP 2, on an MoE model or on Qwen3.5's hybrid layers the rule
    recompute_ops says so; with another module it is a one-line configuration error."""
    from costmodel.configs import RECOMPUTE_MODULE_BITS
    from costmodel.specs import ConfigSpec

    ops = dict(recompute=1, recompute_modules=RECOMPUTE_MODULE_BITS["ops"])
    dense = problem_for(MODELS["llama3.1-8b"])
    cfg = lambda **kw: ConfigBatch.from_columns(64, first_layers=32, last_layers=32, **ops, **kw)  # noqa: E731
    assert not violations(dense, cfg(tp=1))["recompute_ops"][0]
    assert violations(dense, cfg(tp=2))["recompute_ops"][0]
    hybrid = problem_for(qwen35())
    assert violations(hybrid, ConfigBatch.from_columns(64, ep=8, first_layers=40, last_layers=40, **ops))["recompute_ops"][0]
    with pytest.raises(ValueError, match="takes no other module"):
        ConfigSpec(recompute="selective", recompute_modules=["ops", "core_attn"])


def test_sliding_window_layers_run_the_short_attention_curve(monkeypatch):
    """A GPT-OSS sliding-window layer's fused attention kernel walks 128 keys a query, so the step
    prices it at the fused-attention curve's rate for a 128-token call, not for the 8K-token
    sequence (measured with FlexAttention on an H200: tests/unit/test_kernel_fit.py); its
    full-attention layers keep the sequence's. Unfused attention computes every score, window or
    not: no cap. Recorded at ComputeModel.attention_time as evaluate calls it."""
    from costmodel.compute import ComputeModel

    calls = []
    real = ComputeModel.attention_time

    def recording(self, flops, query_tokens=np.inf, kind="attention", keys=None, rows=None, diagonal_share=1.0):
        calls.append((kind, keys))
        return real(self, flops, query_tokens, kind, keys, rows, diagonal_share)

    monkeypatch.setattr(ComputeModel, "attention_time", recording)
    m = model_from_hf_config(CONFIGS / "gpt_oss_120b.json")
    cfg = ConfigBatch.from_columns(64, tp=1, cp=1, ep=8, etp=1, first_layers=36, last_layers=36)
    evaluate(problem_for(m, seq_len=8192, attention_impl="flex"), cfg)
    assert sorted(set(calls), key=str) == [("attention", 128), ("attention", None)]
    calls.clear()
    evaluate(problem_for(m, seq_len=8192, attention_kernel="unfused"), cfg)
    assert set(calls) == {("attention", None)}

    # document masks shorten full-causal rows; a window's rows are short already
    f = lambda x: np.array([float(x)])  # noqa: E731
    sh = arch.Shard(t=f(1), c=f(1), e=f(8), etp=f(1), b=f(1), seq=8192)
    tr = problem_for(m, seq_len=8192).training
    sliding, full = (arch.layer_work(m, tr, sh, 2, (kind, "moe")) for kind in ("sliding_attention", "full_attention"))
    assert float(sliding.attention_work(np.array([0.3]))[0]) == float(sliding.attention_flops_hw[0])
    assert float(full.attention_work(np.array([0.3]))[0]) == pytest.approx(0.3 * float(full.attention_flops_hw[0]))

    s, half = 8192.0, ComputeModel(problem_for(m).hardware, "bf16", 2).eff.attention_seq_half
    comp = ComputeModel(problem_for(m).hardware, "bf16", 2, "flex")
    flops = np.array([1e12])
    ratio = (real(comp, flops, s) - comp.overhead) / (real(comp, flops, s, keys=128) - comp.overhead)
    assert float(ratio[0]) == pytest.approx((128 / (128 + half)) / (s / (s + half)), rel=1e-9)


def test_short_convolution_backward_runs_at_its_measured_ratio():
    """The short convolution of Gated DeltaNet layers: its backward is priced at the measured
    4.4x its forward (fla's weight gradient reduces over the tokens), not an elementwise
    kernel's 2x; a Qwen3.5 of linear-attention layers alone steps slower for it, and the
    convolution is timed as its own kind of memory-bound kernel."""
    hybrid = qwen35()
    linear = hybrid.model_copy(update={"layer_types": ["linear_attention"] * hybrid.num_layers, "mtp_layers": 0})
    cfg = ConfigBatch.from_columns(64, tp=2, cp=1, ep=8, etp=1, first_layers=40, last_layers=40)
    problem = problem_for(linear, seq_len=8192)
    assert problem.hardware.efficiency.short_conv_backward_ratio > 4.0
    eff = problem.hardware.efficiency.model_copy(update={"short_conv_backward_ratio": 2.0})
    elementwise = problem.model_copy(update={"hardware": problem.hardware.model_copy(update={"efficiency": eff})})
    assert float(evaluate(problem, cfg).step_time_s[0]) > float(evaluate(elementwise, cfg).step_time_s[0])
    from costmodel.compute import ComputeModel

    kinds = []
    real = ComputeModel.memory_time
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ComputeModel, "memory_time", lambda self, nbytes, kernels=1.0, kind="elementwise": kinds.append(kind) or real(self, nbytes, kernels, kind))
        evaluate(problem, cfg)
    assert "short_conv" in kinds


def test_attention_grid_is_the_ranks_query_rows_and_heads(monkeypatch):
    """The fused kernel's grid is a rank's query rows x query heads of one micro-batch (GPT-OSS-120B:
    64 query heads over TP 4 = 16, micro-batch 2 of 8K tokens over CP 2 = 8K rows), and the grid
    tail weighs on the diagonal share of its work, 1/CP (ComputeModel.attention_time); unfused
    attention has no kernel grid. Recorded at ComputeModel.attention_time as evaluate calls it."""
    from costmodel.compute import ComputeModel

    calls = []
    real = ComputeModel.attention_time

    def recording(self, flops, query_tokens=np.inf, kind="attention", keys=None, rows=None, diagonal_share=1.0):
        calls.append((None if rows is None else float(np.ravel(rows)[0]), float(np.ravel(diagonal_share)[0])))
        return real(self, flops, query_tokens, kind, keys, rows, diagonal_share)

    monkeypatch.setattr(ComputeModel, "attention_time", recording)
    m = model_from_hf_config(CONFIGS / "gpt_oss_120b.json")
    cfg = ConfigBatch.from_columns(64, tp=4, cp=2, ep=8, etp=1, mbs=2, first_layers=36, last_layers=36)
    evaluate(problem_for(m, seq_len=8192), cfg)
    assert set(calls) == {(2 * 4096 * 16.0, 0.5)}
    calls.clear()
    evaluate(problem_for(m, seq_len=8192, attention_kernel="unfused"), cfg)
    assert {rows for rows, _ in calls} == {None}
