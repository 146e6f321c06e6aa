"""The activation ledger against Korthikanti et al. 2022 (arXiv 2205.05198, section 4) and
MemFine (Table 2, eq. 2)."""

import numpy as np
import pytest

from costmodel import architecture as arch
from costmodel.presets import MODELS
from costmodel.specs import TrainingSpec


def shard(t=1, c=1, e=1, etp=1, b=1, seq=2048):
    f = lambda x: np.array([float(x)])
    return arch.Shard(t=f(t), c=f(c), e=f(e), etp=f(etp), b=f(b), seq=seq)


GPT = MODELS["gpt3-175b"]  # MHA, GeLU MLP of 4h, dropout, layernorm: Korthikanti's transformer
UNFUSED = TrainingSpec(global_batch_size=8, seq_len=2048, attention_kernel="unfused")


@pytest.mark.parametrize("t", [1, 2, 8])
@pytest.mark.parametrize("b", [1, 4])
def test_korthikanti_per_layer_bytes(t, b):
    """Eq. 2 of section 4.1: 34sbh + 5as^2b bytes per layer; with tensor and sequence
    parallelism (section 4.2.2) everything divides by t: (34sbh + 5as^2b)/t."""
    s, h, a = 2048, GPT.hidden_size, GPT.num_heads
    work = arch.dense_layer(GPT, UNFUSED, shard(t=t, b=b), D=2)
    expected = (34 * s * b * h + 5 * a * s * s * b) / t
    assert float(work.saved_bytes[0]) == expected


@pytest.mark.parametrize("t", [1, 8])
def test_korthikanti_selective_recompute(t):
    """Section 5: selective recompute of the attention core leaves 34sbh/t."""
    s, b, h = 2048, 2, GPT.hidden_size
    work = arch.dense_layer(GPT, UNFUSED, shard(t=t, b=b), D=2)
    assert float(work.saved_without_core_attention()[0]) == 34 * s * b * h / t


def test_full_recompute_keeps_the_layer_input():
    """Section 5: full recompute stores 2sbh per layer (sequence-parallel: /t)."""
    s, b, h = 2048, 1, GPT.hidden_size
    work = arch.dense_layer(GPT, UNFUSED, shard(t=8, b=b), D=2)
    assert float(work.input_bytes[0]) == 2 * s * b * h / 8


def test_flash_attention_stores_no_score_matrix():
    flash = TrainingSpec(global_batch_size=8, seq_len=2048, attention_kernel="flash")
    s, b, h, a = 2048, 1, GPT.hidden_size, GPT.num_heads
    work = arch.dense_layer(GPT, flash, shard(t=1, b=b), D=2)
    lse = 4 * s * b * a  # fp32 log-sum-exp per query and head
    assert float(work.saved_bytes[0]) == 34 * s * b * h + lse


@pytest.mark.parametrize("t,c", [(1, 1), (2, 1), (1, 2)])
def test_memfine_moe_layer(t, c):
    """MemFine eq. 2 for one MoE layer (b=1): (1/tc) D b [s(5h + a h_d + 2 k_a h_d + e_n)
    + s'(2h + 2 g_e)], with s' the routed token copies. Our ledger also keeps the SwiGLU output
    that the expert FC2 saves as its input (D s' g_e / (tc)) and flash attention's fp32
    log-sum-exp; nothing else differs."""
    m = MODELS["mixtral-8x7b"]  # GQA, SwiGLU experts, no shared expert, a*h_d = h
    s, b, D = 4096, 1, 2
    flash = TrainingSpec(global_batch_size=8, seq_len=s)
    work = arch.moe_layer(m, flash, shard(t=t, c=c, e=1, etp=1, b=b, seq=s), D)
    h, a, hd, kv, E, g = m.hidden_size, m.num_heads, m.dim_per_head, m.kv_heads, m.moe.num_experts, m.moe.expert_ffn_hidden_size
    s_prime = s * m.moe.top_k  # balanced routing: every token copy lands on one expert rank
    memfine = D * b * (s * (5 * h + a * hd + 2 * kv * hd + E) + s_prime * (2 * h + 2 * g)) / (t * c)
    extra = D * b * s_prime * g / (t * c) + 4 * b * s * a / (t * c)
    assert float(work.saved_bytes[0]) == pytest.approx(memfine + extra, rel=1e-12)


def test_routing_imbalance_scales_expert_activations():
    """The former scalar field still reads (as a flat profile); it scales s' on an EP group
    large enough for that imbalance (ep 4 of Mixtral's 8 experts: at most 4x)."""
    m = MODELS["mixtral-8x7b"]
    balanced = arch.moe_layer(m, TrainingSpec(global_batch_size=8, seq_len=4096), shard(e=4, seq=4096), 2)
    skewed = arch.moe_layer(m, TrainingSpec(global_batch_size=8, seq_len=4096, moe_routing_imbalance=3.0), shard(e=4, seq=4096), 2)
    expert_keys = ("expert_input", "expert_fc1_out", "expert_act_out", "expert_output")
    for k in expert_keys:
        assert float(skewed.saved[k][0]) == pytest.approx(3 * float(balanced.saved[k][0]))
    assert float(skewed.saved["q"][0]) == float(balanced.saved["q"][0])


@pytest.mark.parametrize("t", [2, 8])
def test_korthikanti_tensor_parallel_without_sequence_parallel(t):
    """Section 4.2.1, eq. 3: with tensor parallelism alone the layer stores
    sbh(10 + 24/t) + 5as^2b/t bytes: norms, their outputs and dropout masks stay replicated."""
    s, b, h, a = 2048, 2, GPT.hidden_size, GPT.num_heads
    no_sp = arch.Shard(t=np.array([float(t)]), c=np.array([1.0]), e=np.array([1.0]), etp=np.array([1.0]), b=np.array([float(b)]), seq=s, sp=False)
    work = arch.dense_layer(GPT, UNFUSED, no_sp, D=2)
    assert float(work.saved_bytes[0]) == s * b * h * (10 + 24 / t) + 5 * a * s * s * b / t


@pytest.mark.parametrize("dropout", [True, False])
def test_residual_add_is_the_fused_bias_dropout_add(dropout):
    """With dropout the residual add is Megatron's fused bias-dropout-add: one kernel moving
    3D + 1 bytes per residual-stream element (two reads, a write, the 1-byte mask), no
    separate dropout pass; without dropout a plain add (3D). Without sequence parallelism it
    runs on every token."""
    s, b, h, D = 2048, 1, GPT.hidden_size, 2
    model = GPT.model_copy(update={"dropout": dropout})
    sh = arch.Shard(t=np.array([8.0]), c=np.array([1.0]), e=np.array([1.0]), etp=np.array([1.0]), b=np.array([float(b)]), seq=s, sp=False)
    work = arch.dense_layer(model, UNFUSED, sh, D=D)
    residual = {op.name: float(op.bytes[0]) for op in work.memory_ops if "residual" in op.name or "dropout" in op.name}
    per_add = (3 * D + dropout) * s * b * h
    assert residual == {"attention_residual": per_add, "mlp_residual": per_add} | ({"attention_dropout": residual["attention_dropout"]} if dropout else {})


def test_eager_elementwise_moves_what_pytorch_composite_ops_move():
    """Eager PyTorch Llama code without compilation (torchtitan, Hugging Face).
    training.norm_kernel eager_fp32: an fp32 RMSNorm in eight kernels, 4D + 28 bytes an element
    (x.float(), pow, mean, mul, type_as, * weight) where a fused norm moves 2D, and autograd keeps
    an fp32 copy and the unweighted output of each norm, (4 + D) bytes an element more.
    training.elementwise eager: the complex fp32 rotary 2D + 16 where a fused one moves 2D; silu
    then the product 5D an FFN element where SwiGLU fused moves 3D."""
    m = MODELS["llama3.1-8b"]
    sh = shard(b=1, seq=4096)
    spec = lambda **kw: TrainingSpec(global_batch_size=8, seq_len=4096, **kw)
    fused = arch.dense_layer(m, spec(), sh, D=2)
    norms = arch.dense_layer(m, spec(norm_kernel="eager_fp32"), sh, D=2)
    eager = arch.dense_layer(m, spec(elementwise="eager"), sh, D=2)
    T, h, f = 4096, m.hidden_size, m.ffn_hidden_size
    qk = (m.num_heads + m.num_kv_heads) * (h // m.num_heads)
    ops = lambda work: {op.name: op for op in work.memory_ops}
    for norm in ("input_norm", "pre_mlp_norm"):
        assert float(ops(fused)[norm].bytes[0]) == 4 * T * h and float(ops(norms)[norm].bytes[0]) == 36 * T * h
        assert ops(norms)[norm].kernels == 8.0 and float(ops(eager)[norm].bytes[0]) == 4 * T * h
    assert float(norms.saved_bytes[0] - fused.saved_bytes[0]) == 2 * 6 * T * h
    assert float(ops(fused)["rotary"].bytes[0]) == 4 * T * qk and float(ops(eager)["rotary"].bytes[0]) == 20 * T * qk
    assert float(ops(fused)["activation"].bytes[0]) == 6 * T * f and float(ops(eager)["activation"].bytes[0]) == 10 * T * f
    assert float(eager.saved_bytes[0]) == float(fused.saved_bytes[0])
    # GEMMs and attention do not change
    for work in (norms, eager):
        assert [g.name for g in work.gemms] == [g.name for g in fused.gemms]
        assert float(work.attention_flops_hw[0]) == float(fused.attention_flops_hw[0])


@pytest.mark.parametrize("t", [2, 8])
def test_dtensor_tp_keeps_the_gathered_input_of_column_parallel_gemms(t):
    """Megatron saves the sequence-parallel shard of the qkv and fc1 inputs and re-gathers it in
    the backward; DTensor TP's matmuls save the all-gathered input they were given
    (Shard.keeps_gathered): (t - 1) x 2sbh more bytes per layer, nothing else changes."""
    s, b, h = 2048, 2, GPT.hidden_size
    f = lambda x: np.array([float(x)])
    megatron = arch.dense_layer(GPT, UNFUSED, shard(t=t, b=b), D=2)
    dtensor = arch.dense_layer(GPT, UNFUSED, arch.Shard(t=f(t), c=f(1), e=f(1), etp=f(1), b=f(b), seq=s, keeps_gathered=f(1)), D=2)
    for name in ("qkv_input", "mlp_input"):
        assert float(megatron.saved[name][0]) == 2 * s * b * h / t
        assert float(dtensor.saved[name][0]) == 2 * s * b * h
    assert float(dtensor.saved_bytes[0] - megatron.saved_bytes[0]) == pytest.approx(2 * 2 * s * b * h * (1 - 1 / t))


@pytest.mark.parametrize("loss_kernel,freed,t,pp,per_logit,fp32_out", [
    ("fused", False, 1, 1, 4, False),  # Megatron's kernel: the fp32 softmax
    ("eager_fp32", False, 1, 1, 14, False),  # a script keeping `logits`: 4 + 8 fp32 gradients + 2 bf16 logits at the backward
    ("eager_fp32", True, 1, 1, 12, False),  # torchtitan: `del pred` before backward
    # vocab-parallel (DTensor loss_parallel): its forward holds x - max and exp(x - max) (14), its fused
    # backward the saved log-probs, zeros_like, exp and their sum (16)
    ("eager_fp32", True, 8, 1, 16, False),
    ("eager_fp32", True, 1, 4, 14, False),  # pipelined: the schedule keeps the stage output (the logits)
    ("eager_fp32", True, 8, 4, 18, False),
    # the model casts (`self.output(h).float()`): the bf16 logits die at the cast, so the vocab-parallel
    # forward holds the fp32 copy, x - max and exp(x - max), 12; a pipeline keeps the fp32 copy to the backward
    ("eager_fp32", True, 1, 1, 12, True),
    ("eager_fp32", True, 8, 1, 16, True),
    ("eager_fp32", True, 1, 4, 16, True),
    ("eager_fp32", True, 8, 4, 20, True),
])
def test_loss_bytes_per_logit_at_its_peak(loss_kernel, freed, t, pp, per_logit, fp32_out):
    s, b = 2048, 1
    m = MODELS["llama3.1-8b"]
    tr = TrainingSpec(global_batch_size=8, seq_len=s, loss_kernel=loss_kernel, logits_freed_before_backward=freed, logits_fp32=fp32_out)
    edge = arch.edges(m, tr, shard(t=t, b=b, seq=s), 2, np.array([float(pp)]))
    norm = 2 * 2 * s * b * m.hidden_size / t  # the final norm's input and output (SP-sharded)
    logits = s * b * m.vocab_size / t
    assert float(edge.head_saved[0]) == pytest.approx(norm + per_logit * logits)
    assert float(edge.head_output_bytes[0]) == (4 if fp32_out else 2) * logits


def test_dtensor_head_keeps_its_gathered_input():
    """torchtitan's output projection (DTensor ColwiseParallel, input Shard(1) -> Replicate) saves
    the all-gathered final hidden states for its weight gradient, with or without async TP (which
    fuses inside the compiled blocks only); Megatron's head keeps the SP shard and re-gathers."""
    s, b, t = 2048, 1, 8
    m = MODELS["llama3.1-8b"]
    f = lambda x: np.array([float(x)])

    def saved(sp=True, **kw):
        sh = arch.Shard(t=f(t), c=f(1), e=f(1), etp=f(1), b=f(b), seq=s, sp=sp)
        return float(arch.edges(m, TrainingSpec(global_batch_size=8, seq_len=s, **kw), sh, 2, np.array([1.0])).head_saved[0])

    assert saved(tp_backward_overlap=False) - saved() == pytest.approx(2 * s * b * m.hidden_size * (1 - 1 / t))
    assert saved(sp=False, tp_backward_overlap=False) == saved(sp=False)  # without SP the input is whole either way


def test_autocast_casts_fp32_weights_each_forward_and_their_gradients_back():
    """fp32 weights under bf16 autocast (training.dtypes.params fp32): every GEMM weight is read
    in fp32 and written in bf16 once per forward (6 bytes a parameter), its gradient cast back
    to fp32 in the backward (2 + 4 bytes); bf16 weights (Megatron, FSDP's mixed precision) move
    nothing of the kind."""
    m = MODELS["llama3.1-8b"]
    fp32 = TrainingSpec(global_batch_size=8, seq_len=2048, dtypes={"params": "fp32", "grads": "fp32", "optimizer": "fp32"})
    bf16 = TrainingSpec(global_batch_size=8, seq_len=2048)
    kind = ("full_attention", "dense")
    cast = arch.layer_work(m, fp32, shard(), 2, kind)
    plain = arch.layer_work(m, bf16, shard(), 2, kind)
    assert float(cast.cast_f_bytes[0]) == float(cast.cast_b_bytes[0]) == 6 * float(cast.params_local[0])
    assert plain.cast_f_bytes == plain.cast_b_bytes == 0.0
    V, h = m.vocab_size, m.hidden_size
    head = lambda tr: float(arch.edges(m, tr, shard(), 2, np.array([1.0])).head_memory_bytes[0])
    assert head(fp32) - head(bf16) == pytest.approx(6 * V * h)


def test_torchtitan_op_sac_keeps_attention_and_every_other_matmul():
    """torchtitan's per-op selective AC (recompute_modules [ops]; SelectiveAC in
    torchtitan/distributed/activation_checkpoint.py: matmuls and attention saved "except every
    second mm"): of a Llama block's wq, wk, wv, wo, w1, w3, w2 it keeps wq, wv, w1 and w2's outputs
    and the attention output with its log-sum-exp, beside the block input; it re-runs wk, wo, w3
    and every memory-bound kernel."""
    from costmodel.configs import RECOMPUTE_MODULE_BITS, ConfigBatch
    from costmodel.layer import kept_bytes

    m = MODELS["llama3.1-8b"]
    s, b, h, a = 8192, 2, m.hidden_size, m.num_heads
    kv_d, ffn = m.kv_heads * m.dim_per_head, m.ffn_hidden_size
    tr = TrainingSpec(global_batch_size=16, seq_len=s)
    work = arch.dense_layer(m, tr, shard(b=b, seq=s), D=2)
    cfg = ConfigBatch.from_columns(8, recompute=1, recompute_modules=RECOMPUTE_MODULE_BITS["ops"], first_layers=32, last_layers=32)
    tokens = s * b
    expected = 2 * tokens * (h + h + kv_d + h + ffn + h) + 4 * tokens * a  # x, wq, wv, attention out, w1, w2; lse
    assert float(kept_bytes(work, cfg)[0]) == expected
    policy = arch.op_sac(work)
    assert policy.rerun_gemm_share["o_proj"] == 1.0 and policy.rerun_gemm_share["fc1"] == 0.5 and policy.rerun_gemm_share["fc2"] == 0.0
    assert float(policy.rerun_gemm_share["qkv"][0]) == pytest.approx(kv_d / (h + 2 * kv_d))  # wk's columns of the fused wq|wk|wv
    assert set(policy.rerun_ops) == {op.name for op in work.memory_ops}


def _fp8(**kw):
    return TrainingSpec(global_batch_size=8, seq_len=kw.pop("seq_len", 2048), dtypes={"compute": "fp8"}, **kw)


@pytest.mark.parametrize("t", [1, 8])
def test_fp8_gemms_keep_their_inputs_in_fp8(t):
    """Transformer Engine 2.x keeps the fp8 copy of a GEMM's input for the weight gradient
    (module/linear.py, layernorm_linear.py: the quantized input, column-wise usage only). In
    Korthikanti's GPT layer (section 4.1) the inputs only a GEMM keeps are the QKV input (2sbh),
    the unfused attention's output before the projection (2sbh), the MLP input (2sbh) and the
    GeLU output (8sbh): half of each goes, 34sbh -> 27sbh; the score-matrix terms stay. With
    fp8_saved_inputs off the ledger is the bf16 one."""
    s, b, h, a = 2048, 1, GPT.hidden_size, GPT.num_heads
    sh = shard(t=t, b=b)
    fp8 = arch.layer_work(GPT, _fp8(attention_kernel="unfused"), sh, 2, arch.DENSE)
    assert float(fp8.saved_bytes[0]) == (27 * s * b * h + 5 * a * s * s * b) / t
    kept_wide = arch.layer_work(GPT, _fp8(attention_kernel="unfused", fp8_saved_inputs=False), sh, 2, arch.DENSE)
    assert float(kept_wide.saved_bytes[0]) == (34 * s * b * h + 5 * a * s * s * b) / t


def test_fp8_projection_copy_sits_beside_the_flash_output():
    """A flash kernel keeps its output for its own backward, so the output projection's fp8
    copy of it is one byte an element more, not one less; the SwiGLU input (fc1's output) stays
    in bf16 for the activation's backward."""
    m = MODELS["llama3.1-8b"]
    s, b, h, ffn = 8192, 1, m.hidden_size, m.ffn_hidden_size
    sh = shard(b=b, seq=s)
    bf16 = arch.layer_work(m, TrainingSpec(global_batch_size=8, seq_len=s), sh, 2, arch.DENSE)
    fp8 = arch.layer_work(m, _fp8(seq_len=s), sh, 2, arch.DENSE)
    tokens = s * b
    assert fp8.saved["attn_out"][0] == bf16.saved["attn_out"][0] and fp8.saved["attn_out_fp8"][0] == tokens * h
    assert fp8.saved["fc1_out"][0] == bf16.saved["fc1_out"][0]
    # norm outputs (QKV and MLP inputs) and the SwiGLU output halve; the projection's copy comes on top
    less = tokens * (h + h + ffn) - tokens * h
    assert float(bf16.saved_bytes[0] - fp8.saved_bytes[0]) == less


def test_fp8_expert_gemms_keep_the_permuted_tokens_in_fp8():
    """Grouped expert GEMMs keep their inputs (the permuted tokens, the SwiGLU output) in fp8;
    the expert FC1 output (the activation's input) and the expert output (the weighted
    combine's input) stay in bf16, as does the router's input (the router is no fp8 GEMM)."""
    m = MODELS["mixtral-8x7b"]
    sh = shard(e=4, seq=4096)
    bf16 = arch.layer_work(m, TrainingSpec(global_batch_size=8, seq_len=4096), sh, 2, arch.MOE)
    fp8 = arch.layer_work(m, _fp8(seq_len=4096), sh, 2, arch.MOE)
    for name, ratio in (("expert_input", 0.5), ("expert_act_out", 0.5), ("expert_fc1_out", 1.0), ("expert_output", 1.0), ("router_input", 1.0)):
        assert float(fp8.saved[name][0]) == ratio * float(bf16.saved[name][0]), name


def test_expanded_kv_heads_are_kept_and_exchanged():
    """torchtitan's Llama repeats K and V to every query head before SDPA (repeat_kv): the
    kernel keeps the copies for its backward and context parallelism exchanges them, 32 heads
    of Llama 3.1 8B's K/V where the kernel that reads the 8 KV heads (Megatron, Transformer
    Engine) keeps and sends 8. Per-op checkpointing re-makes the copies (repeat_kv is no saved op)."""
    from costmodel.configs import RECOMPUTE_MODULE_BITS, ConfigBatch
    from costmodel.layer import kept_bytes

    m = MODELS["llama3.1-8b"]
    s, h, d = 8192, m.hidden_size, m.dim_per_head
    sh = shard(c=2, seq=s)
    plain = arch.dense_layer(m, TrainingSpec(global_batch_size=8, seq_len=s), sh, D=2)
    expanded = arch.dense_layer(m, TrainingSpec(global_batch_size=8, seq_len=s, kv_heads_expanded=True), sh, D=2)
    tokens = s / 2
    assert float(expanded.saved["kv_expanded"][0]) == 2 * tokens * (m.num_heads - m.kv_heads) * 2 * d
    assert float(expanded.cp_bytes[0]) == 2 * tokens * m.num_heads * 2 * d == 4 * float(plain.cp_bytes[0])
    cfg = ConfigBatch.from_columns(8, recompute=1, recompute_modules=RECOMPUTE_MODULE_BITS["ops"], first_layers=32, last_layers=32)
    assert float(kept_bytes(expanded, cfg)[0]) == float(kept_bytes(plain, cfg)[0])
