"""Model architecture decomposition (MoFa section 3.2, Table 2), array-valued.

For one transformer layer (dense or MoE) on one GPU and one micro-batch this module lists
  * the operators with their FLOPs and GEMM shapes (M, N, K) -- the S_i^comp of eq. 1,
  * the memory-bound operators with the bytes they move,
  * the communication volumes of the TP, CP and EP collectives -- the S_j^commu of eq. 3,
  * the tensors saved for the backward pass (the activation ledger of eqs. 5, 29, 31, 33),
  * the parameters held by the GPU (S_i^para of eq. 4).
Every quantity is a numpy array over a batch of configurations (tp, cp, ep, etp, mbs).

Conventions
  * Tokens: a micro-batch holds b*s tokens; context parallelism gives each rank T = b*s/cp;
    sequence parallelism (on by default; Megatron requires it for MoE with TP) shards the
    residual stream, so norms and residual adds see T/tp tokens. Without it they see all T,
    and the TP all-gather/reduce-scatter pairs become all-reduces of the same volume.
  * Attention FLOPs: the *model* count uses the full s x s score matrix (PaLM Appendix B, the
    convention of MFU); the *hardware* work of a causal flash-attention kernel is the lower
    triangle, a fraction (s+1)/(2s) of it. Unfused attention computes the full matrix.
  * Backward = 2x forward for every matmul (dgrad + wgrad); flash-attention backward does 5
    matmuls against 2 forward, i.e. 2.5x (Dao 2023, FlashAttention-2 section 3.1.2).
  * The activation ledger follows Korthikanti et al. 2022 (arXiv 2205.05198) section 4.1 tensor by
    tensor, so a GPT layer with MHA, GeLU, dropout and unfused attention stores exactly
    34sbh + 5as^2b bytes (divided by t with sequence parallelism), and MemFine Table 2 for
    the MoE block (see `moe_layer`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from costmodel.specs import ModelSpec, TrainingSpec
from costmodel.units import DTYPE_BYTES, FP8_COMPUTE


@dataclass(frozen=True)
class Shard:
    """Per-configuration quantities that fix the shapes a GPU sees in one layer."""

    t: np.ndarray  # tensor parallel
    c: np.ndarray  # context parallel
    e: np.ndarray  # expert parallel
    etp: np.ndarray  # expert tensor parallel
    b: np.ndarray  # micro-batch size
    seq: int
    sp: bool = True  # sequence parallelism: the residual stream is sharded over TP
    chunks: np.ndarray | float = 1.0  # MemFine FCDA: token chunks of each MoE layer's dispatch / experts / combine
    # 1 where a column-parallel GEMM keeps its all-gathered input for the backward (DTensor TP: the
    # matmul saves what it was given), 0 where it keeps the SP shard and re-gathers it (Megatron,
    # Transformer Engine, PyTorch's async TP; torchtitan Table 4: 71.9 GiB without async TP, 67.6 with)
    keeps_gathered: np.ndarray | float = 0.0

    @property
    def tokens_saved_input(self) -> np.ndarray:
        """Tokens of the saved input of a column-parallel GEMM: the SP shard, or all of them."""
        return np.where(self.keeps_gathered > 0, self.tokens, self.tokens_sp)

    @property
    def tokens(self) -> np.ndarray:
        """T: tokens of one micro-batch on one CP rank."""
        return self.b * self.seq / self.c

    @property
    def tokens_sp(self) -> np.ndarray:
        """Tokens of the residual stream on one GPU: sharded over TP with sequence
        parallelism, replicated without it (Korthikanti et al.'s sbh(10 + 24/t) case)."""
        return self.tokens / self.t if self.sp else self.tokens


@dataclass(frozen=True)
class Gemm:
    name: str
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    kind: str = "gemm"  # "gemm" or "grouped_gemm"
    count: np.ndarray | float = 1.0  # GEMMs of this shape (grouped GEMM: local experts)
    modules: tuple[str, ...] = ()  # recompute modules whose recompute re-runs it

    @property
    def flops(self) -> np.ndarray:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class MemoryOp:
    """A memory-bound kernel (norm, activation function, rotary, residual add, permute).
    `kind` names its efficiency (ComputeModel.memory_time): 'elementwise', or 'short_conv' for the
    short causal convolution of linear-attention layers, measured apart (it runs well under the
    elementwise kernels' bandwidth, and its backward reduces the weight gradient over tokens)."""

    name: str
    bytes: np.ndarray
    modules: tuple[str, ...] = ()
    kernels: float = 1.0
    kind: str = "elementwise"


@dataclass(frozen=True)
class SavedTag:
    """Who owns a tensor kept for the backward pass: the Megatron module whose fine-grained
    offload moves it to the host, and the recompute modules whose recompute discards it."""

    offload: str | None
    dropped_by: tuple[str, ...] = ()


#: the module of each saved tensor (see the module docstring's ledger)
SAVED_TAGS: dict[str, SavedTag] = {
    "layer_input": SavedTag("attn_norm"),
    "qkv_input": SavedTag("qkv_linear", ("layernorm",)),
    "q_down_out": SavedTag("qkv_linear"),
    "q_norm_out": SavedTag("qkv_linear"),
    "kv_down_out": SavedTag("qkv_linear"),
    "kv_norm_out": SavedTag("qkv_linear"),
    "q": SavedTag("core_attn", ("mla_up_proj",)),
    "k": SavedTag("core_attn", ("mla_up_proj",)),
    "v": SavedTag("core_attn", ("mla_up_proj",)),
    "kv_expanded": SavedTag("core_attn", ("core_attn",)),  # repeat_kv's copies (training.kv_heads_expanded)
    "softmax_stats": SavedTag("core_attn", ("core_attn",)),
    "softmax_out": SavedTag("core_attn", ("core_attn",)),
    "attn_dropout_mask": SavedTag("core_attn", ("core_attn",)),
    "attn_dropout_out": SavedTag("core_attn", ("core_attn",)),
    "attn_out": SavedTag("attn_proj"),
    "attn_out_fp8": SavedTag("attn_proj"),  # fp8 GEMMs: the output projection's own copy beside the kernel's output
    # gated attention (attention_output_gate): the gate logits and the ungated core output
    "attn_gate": SavedTag("attn_proj"),
    "attn_core_out": SavedTag("attn_proj"),
    "attn_proj_dropout_mask": SavedTag("attn_proj"),
    "input_norm_internals": SavedTag("attn_norm", ("layernorm",)),  # eager norms only
    "ln2_input": SavedTag("mlp_norm"),
    "mlp_norm_internals": SavedTag("mlp_norm", ("layernorm",)),
    "mlp_input": SavedTag("mlp_norm", ("layernorm",)),
    "fc1_out": SavedTag(None, ("mlp",)),
    "act_out": SavedTag(None, ("mlp",)),
    "mlp_dropout_mask": SavedTag(None),
    "router_input": SavedTag("mlp_norm", ("layernorm",)),
    "router_logits": SavedTag(None, ("moe",)),
    "expert_input": SavedTag("expert_fc1", ("moe",)),
    "expert_fc1_out": SavedTag("moe_act", ("moe",)),
    "expert_act_out": SavedTag(None, ("moe_act", "moe")),
    "expert_output": SavedTag(None, ("moe",)),
    "shared_fc1_out": SavedTag(None, ("shared_experts", "moe")),
    "shared_act_out": SavedTag(None, ("shared_experts", "moe")),
    # Gated DeltaNet
    "conv_input": SavedTag("core_attn"),
    "gdn_gates": SavedTag("core_attn"),
    "gdn_core_out": SavedTag("attn_proj"),
    "gdn_z": SavedTag("attn_proj"),
}


#: saved tensors that only a GEMM keeps, for its weight gradient: with fp8 GEMMs the framework keeps
#: the quantized copy it computed with (`fp8_saved_inputs`). The attention output is not among them
#: where a flash kernel also keeps it for its own backward.
FP8_SAVED = ("qkv_input", "q_norm_out", "kv_norm_out", "mlp_input", "act_out", "shared_act_out", "expert_input", "expert_act_out")

#: the saved tensors of the routed experts, proportional to s' (split by MemFine's FCDA)
CHUNKED = ("expert_input", "expert_fc1_out", "expert_act_out", "expert_output")


@dataclass(frozen=True)
class LayerWork:
    """Forward work of one layer on one GPU for one micro-batch."""

    gemms: list[Gemm]
    memory_ops: list[MemoryOp]
    attention_flops_hw: np.ndarray  # core attention kernel work (causal-aware, one document per sequence)
    tp_bytes: list[tuple[str, np.ndarray, str]]  # (collective, full-buffer bytes, paired GEMM)
    cp_bytes: np.ndarray  # K/V block exchanged per ring step (one rank's share)
    cp_a2a_bytes: np.ndarray  # Ulysses: q, k, v and the output one rank holds, all-to-all'd
    ep_a2a_bytes: np.ndarray  # bytes one rank sends in one all-to-all (dispatch or combine)
    etp_bytes: np.ndarray  # full-buffer bytes of the expert-TP all-gather (and reduce-scatter)
    saved: dict[str, np.ndarray]  # tensor name -> bytes kept for backward (tags: SAVED_TAGS)
    params_local: np.ndarray  # parameters this GPU holds for the layer
    expert_params_local: np.ndarray = field(default_factory=lambda: np.zeros(1))
    attention_class: str = "attention"  # the operator class of its attention core (efficiency curve)
    # keys a query sees at most (a sliding window), which the attention curve's length is capped at
    # (compute.ComputeModel.attention_time); None: the whole causal prefix
    attention_keys: float | None = None
    # query rows x query heads of the fused attention kernel's calls on this GPU for one micro-batch
    # (its grid: compute.ComputeModel.attention_time's tail); None: unfused or linear attention
    attention_rows: np.ndarray | float | None = None
    ep_chunks: np.ndarray | float = 1.0  # all-to-alls per dispatch (and per combine): MemFine's FCDA chunks
    ep_buffer_bytes: np.ndarray | float = 0.0  # the combine's receive buffer: this rank's own token copies (one chunk's)
    # weights wider than the compute (fp32 under autocast): the per-micro-batch casts of the GEMM
    # weights (forward) and of their gradients back (backward), bytes (`weight_casts`)
    cast_f_bytes: np.ndarray | float = 0.0
    cast_b_bytes: np.ndarray | float = 0.0

    @property
    def chunked_bytes(self) -> np.ndarray:
        """The saved tensors proportional to s', the tokens the rank's experts receive (MemFine
        Table 2 rows 11-13 and the SwiGLU output): what FCDA splits into chunks."""
        return sum((self.saved[k] for k in CHUNKED if k in self.saved), 0.0 * self.input_bytes)

    def attention_work(self, attention_factor) -> np.ndarray:
        """The attention core's FLOPs on the rank that paces it: document masks shorten softmax
        attention's rows (`attention_factor`, costmodel.documents); the delta rule's work is
        linear in the tokens whatever the documents."""
        if self.attention_class == "linear_attention":
            return self.attention_flops_hw
        if self.attention_keys is not None:
            # a sliding window's rows are already short: documents longer than the window barely
            # shorten them (a document of d tokens takes w(w - 1)/2 of its d*w scores), so the full
            # causal mask's document factor does not apply; documents shorter than the window
            # would shorten them, which is left out (the windowed work is an upper bound there)
            return self.attention_flops_hw
        return self.attention_flops_hw * attention_factor

    @property
    def saved_bytes(self) -> np.ndarray:
        return sum(self.saved.values())

    @property
    def input_bytes(self) -> np.ndarray:
        """The layer input, the only tensor full recompute keeps (eq. 31's M^input)."""
        return self.saved["layer_input"]

    @property
    def memory_bytes(self) -> np.ndarray:
        return sum(op.bytes for op in self.memory_ops)

    def saved_dropped_by(self, module: str) -> np.ndarray:
        """Bytes the recompute of `module` discards (and re-creates in the backward)."""
        return sum((v for k, v in self.saved.items() if module in SAVED_TAGS[k].dropped_by), 0.0 * self.input_bytes)

    def saved_offloaded_by(self, module: str) -> np.ndarray:
        return sum((v for k, v in self.saved.items() if SAVED_TAGS[k].offload == module), 0.0 * self.input_bytes)

    def saved_without_core_attention(self) -> np.ndarray:
        """Selective recompute of the attention core (Korthikanti et al. section 5)."""
        return self.saved_bytes - self.saved_dropped_by("core_attn")


def attention_dims(m: ModelSpec) -> tuple[int, int, int, int]:
    """(query heads, KV heads, QK head dim, V head dim)."""
    if m.mla is not None:
        qk = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim
        return m.num_heads, m.num_heads, qk, m.mla.v_head_dim
    return m.num_heads, m.kv_heads, m.dim_per_head, m.dim_per_head


def linear_attention_dims(m: ModelSpec) -> tuple[int, int, int]:
    """Gated DeltaNet: (q and k width, v width, value heads) over all heads."""
    g = m.linear_attention
    return g.num_key_heads * g.key_head_dim, g.num_value_heads * g.value_head_dim, g.num_value_heads


def attention_params(m: ModelSpec, attention: str = "full_attention") -> tuple[int, int]:
    """(parameters split over TP, parameters replicated over TP) of one attention block,
    excluding the layer's two norms."""
    h = m.hidden_size
    if attention == "linear_attention":
        qk, v, heads = linear_attention_dims(m)
        g = m.linear_attention
        # in_proj_qkvz, in_proj_ba, the depthwise conv on q, k, v, out_proj; A_log, dt_bias, the
        # output norm's weight replicated
        split = h * (2 * qk + 2 * v) + h * 2 * heads + (2 * qk + v) * g.conv_kernel + v * h
        return split, 2 * heads + g.value_head_dim
    qk_norm = 2 * attention_dims(m)[2] if m.qk_layernorm else 0
    if m.mla is not None:
        a = m.num_heads
        mla = m.mla
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if mla.q_lora_rank:
            q_down = h * mla.q_lora_rank + mla.q_lora_rank  # + q_a_layernorm
            q_up = mla.q_lora_rank * a * qk
        else:
            q_down, q_up = 0, h * a * qk
        kv_down = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank  # + kv_a_layernorm
        kv_up = mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)
        out = a * mla.v_head_dim * h
        return q_up + kv_up + out, q_down + kv_down + qk_norm
    a, kv, d, _ = attention_dims(m)
    gate = h * a * d if m.attention_output_gate else 0  # the query projection's second half
    sinks = a if m.attention_sinks else 0  # one logit per head, split with the heads
    return h * a * d + gate + 2 * h * kv * d + a * d * h + sinks, qk_norm


def mlp_params(m: ModelSpec, ffn: int) -> int:
    gated = m.activation == "swiglu"
    return (3 if gated else 2) * m.hidden_size * ffn


Kind = tuple[str, str]  # (attention type, MLP type): ModelSpec.layer_kinds
DENSE: Kind = ("full_attention", "dense")
MOE: Kind = ("full_attention", "moe")


def _kind(kind) -> Kind:
    """A kind, or the old boolean (True: an MoE layer with full attention)."""
    if isinstance(kind, bool):
        return MOE if kind else DENSE
    return kind


def layer_params(m: ModelSpec, kind=DENSE) -> int:
    """Total parameters of one layer (unsharded): attention, MLP or experts, 2 norms."""
    attention, mlp = _kind(kind)
    if mlp == "moe" and m.moe is None:
        return 0
    split, replicated = attention_params(m, attention)
    total = split + replicated + 2 * m.hidden_size
    if mlp == "dense":
        return total + mlp_params(m, m.ffn_hidden_size)
    x = m.moe
    return (
        total
        + m.hidden_size * x.num_experts  # router
        + x.num_experts * mlp_params(m, x.expert_ffn_hidden_size)
        + x.num_shared_experts * mlp_params(m, x.shared_ffn)
    )


def active_matmul_params(m: ModelSpec, kind=DENSE) -> int:
    """Matmul parameters one token passes through in one layer (for model FLOPs)."""
    attention, mlp = _kind(kind)
    if mlp == "moe" and m.moe is None:
        return 0
    split, replicated = attention_params(m, attention)
    attn = split + replicated
    if attention == "linear_attention":
        g = m.linear_attention
        attn -= (2 * linear_attention_dims(m)[0] + linear_attention_dims(m)[1]) * g.conv_kernel  # the conv is not a matmul
    if mlp == "dense":
        return attn + mlp_params(m, m.ffn_hidden_size)
    x = m.moe
    return (
        attn
        + m.hidden_size * x.num_experts
        + x.top_k * mlp_params(m, x.expert_ffn_hidden_size)
        + x.num_shared_experts * mlp_params(m, x.shared_ffn)
    )


def mtp_kind(m: ModelSpec) -> Kind:
    """A multi-token-prediction module's transformer layer: like the model's last layer, with
    full attention (DeepSeek-V3 section 2.2)."""
    return ("full_attention", m.layer_kinds()[-1][1])


def mtp_params(m: ModelSpec) -> int:
    """One MTP module: its layer, the 2h -> h projection and two RMSNorms (DeepSeek-V3 2.2;
    embedding and head are shared with the main model)."""
    h = m.hidden_size
    return layer_params(m, mtp_kind(m)) + 2 * h * h + 2 * h


def total_params(m: ModelSpec) -> int:
    emb = m.vocab_size * m.hidden_size
    head = 0 if m.tied_embeddings else emb
    return (
        sum(n * layer_params(m, kind) for kind, n in m.kind_counts().items())
        + m.mtp_layers * mtp_params(m)
        + emb
        + head
        + m.hidden_size  # final norm
    )


def window_share(seq_len: int, window: int | None) -> float:
    """Share of the full s x s score matrix a causal kernel computes when each query sees at
    most `window` keys (itself included): (s+1)/(2s) without a window."""
    s = seq_len
    if window is None or window >= s:
        return (s + 1) / (2 * s)
    w = window
    return (w * (w + 1) / 2 + (s - w) * w) / (s * s)


def residual_add(name: str, m: ModelSpec, D: int, elements) -> MemoryOp:
    """The residual add that closes an attention, MLP or MoE block, over `elements` hidden
    values of the residual stream. Without dropout: a plain add, two reads and a write (3D
    bytes an element). With dropout (GPT-3 style) it is Megatron's fused bias-dropout-add
    (megatron/model/transformer.py bias_dropout_add_fused_train, a jit-fused kernel on by
    default since 2020, --no-bias-dropout-fusion turns it off; Megatron-DeepSpeed the same): one
    kernel reads the projection output and the residual and writes the sum and the 1-byte
    dropout mask, 3D + 1 bytes, where a separate dropout (read, write, mask) and add would
    move 6D + 1."""
    return MemoryOp(name, (3 * D + (1 if m.dropout else 0)) * elements)


def norm_op(name: str, tr: TrainingSpec, D: int, elements) -> MemoryOp:
    """An RMSNorm (or LayerNorm) over `elements` hidden values. Fused (Apex, Transformer Engine,
    a Triton kernel, torch.compile): one kernel, a read and a write, 2D bytes an element.
    training.norm_kernel eager_fp32 (PyTorch composite ops as torchtitan's norms.RMSNorm and
    Hugging Face write it: x.float(), pow(2), mean, + eps, rsqrt, mul, type_as, * weight): eight
    kernels moving (D + 4) + 8 + 4 + 8 + (4 + D) + 2D = 4D + 28 bytes an element."""
    if tr.norm_kernel == "eager_fp32":
        return MemoryOp(name, (4 * D + 28) * elements, ("layernorm",), kernels=8.0)
    return MemoryOp(name, 2 * D * elements, ("layernorm",))


def norm_saved_extra(tr: TrainingSpec, D: int, elements):
    """What autograd keeps of an eager norm beyond its input and output: the fp32 copy of the
    input (pow and the normalising mul save it) and the normalised tensor before the weight (the
    weight product saves it), (4 + D) bytes an element. A fused norm keeps only its input."""
    return (4 + D) * elements if tr.norm_kernel == "eager_fp32" else 0.0 * elements


def rotary_op(tr: TrainingSpec, D: int, elements) -> MemoryOp:
    """Rotary embedding of q and k (`elements` values). Fused: a read and a write (2D bytes), a
    kernel per tensor. Eager (torchtitan's apply_rotary_emb: x.float() viewed as complex, a
    complex64 product with freqs_cis, type_as): three kernels per tensor, (D + 4) + 8 + (4 + D)
    = 2D + 16 bytes an element (a bf16 rotate-half form, x*cos + rotate(x)*sin, moves as much)."""
    if tr.elementwise == "eager":
        return MemoryOp("rotary", (2 * D + 16) * elements, kernels=6.0)
    return MemoryOp("rotary", 2 * D * elements, kernels=2.0)


def attention_block(m: ModelSpec, tr: TrainingSpec, sh: Shard, D: int, attention: str = "full_attention") -> dict:
    """Operators, communication and saved tensors of the attention half of a layer (and the
    norm that follows it). Sliding-window layers compute the window's band of the score
    matrix; everything else is the full-attention layer's."""
    if attention == "linear_attention":
        return linear_attention_block(m, tr, sh, D)
    h, s = m.hidden_size, tr.seq_len
    t, T, Tsp = sh.t, sh.tokens, sh.tokens_sp
    a, kv, dqk, dv = attention_dims(m)
    a_t = a / t
    kv_t = np.where(kv >= t, kv / t, 1.0)  # fewer KV heads than TP ranks: replicated
    flash = tr.attention_kernel == "flash"
    causal = window_share(s, m.sliding_window if attention == "sliding_attention" else None)

    gemms: list[Gemm] = []
    saved: dict[str, np.ndarray] = {"layer_input": D * Tsp * h}  # norm input (residual stream)
    ops = [norm_op("input_norm", tr, D, Tsp * h)]
    if tr.norm_kernel == "eager_fp32":
        saved["input_norm_internals"] = norm_saved_extra(tr, D, Tsp * h)
    if m.mla is not None:
        mla = m.mla
        # down projections are replicated over TP and see the gathered tokens (Megatron-Core MLA)
        if mla.q_lora_rank:
            gemms.append(Gemm("q_down", T, np.full_like(T, mla.q_lora_rank), np.full_like(T, h)))
            gemms.append(Gemm("q_up", T, a_t * dqk, np.full_like(T, mla.q_lora_rank), modules=("mla_up_proj",)))
            saved["q_down_out"] = D * T * mla.q_lora_rank  # down-proj output (the norm's input)
            saved["q_norm_out"] = D * T * mla.q_lora_rank  # its norm, the up projection's input
            ops.append(MemoryOp("q_norm", 2 * D * T * mla.q_lora_rank))
        else:
            gemms.append(Gemm("q_proj", T, a_t * dqk, np.full_like(T, h)))
        kv_down = mla.kv_lora_rank + mla.qk_rope_head_dim
        gemms.append(Gemm("kv_down", T, np.full_like(T, kv_down), np.full_like(T, h)))
        gemms.append(Gemm("kv_up", T, a_t * (mla.qk_nope_head_dim + dv), np.full_like(T, mla.kv_lora_rank), modules=("mla_up_proj",)))
        saved["kv_down_out"] = D * T * kv_down  # down-proj output (compressed KV and the rope key)
        saved["kv_norm_out"] = D * T * mla.kv_lora_rank  # the compressed KV's norm, the up projection's input
        ops.append(MemoryOp("kv_norm", 2 * D * T * mla.kv_lora_rank))
        first_gemm = "q_down" if mla.q_lora_rank else "q_proj"
    else:
        gate_t = a_t if m.attention_output_gate else 0.0 * a_t  # gated attention: q_proj also emits the gate
        gemms.append(Gemm("qkv", T, (a_t + gate_t + 2 * kv_t) * dqk, np.full_like(T, h)))
        first_gemm = "qkv"
    saved["qkv_input"] = D * sh.tokens_saved_input * h  # norm output, sharded by SP (re-gathered in backward) or gathered
    # Q, K, V as the attention kernel reads them (Korthikanti: "QK^T needs Q and K", "V")
    saved["q"] = D * T * a_t * dqk
    saved["k"] = D * T * kv_t * dqk
    saved["v"] = D * T * kv_t * dv
    ops.append(rotary_op(tr, D, T * (a_t + kv_t) * dqk))  # on q and k
    kv_read = kv_t  # K/V heads the attention kernel reads (and CP exchanges)
    if tr.kv_heads_expanded and m.mla is None:
        # repeat_kv: the kernel keeps the copies for every query head beyond the KV heads
        kv_read = np.maximum(a_t, kv_t)
        saved["kv_expanded"] = D * T * (kv_read - kv_t) * (dqk + dv)
        ops.append(MemoryOp("repeat_kv", D * T * (kv_t + kv_read) * (dqk + dv), ("core_attn",), kernels=2.0))  # read k, v; write the copies
    if m.qk_layernorm:
        ops.append(MemoryOp("qk_norm", 2 * D * T * (a_t + kv_t) * dqk, kernels=2.0))

    full_attn = 2.0 * T * s * a_t * (dqk + dv)  # QK^T and AV over the whole score matrix
    scores = T * s * a_t  # score-matrix elements this GPU holds (unfused)
    if flash:
        attention_hw = full_attn * causal
        saved["softmax_stats"] = 4 * T * a_t  # fp32 log-sum-exp
    else:
        attention_hw = full_attn
        saved["softmax_out"] = D * scores
        ops.append(MemoryOp("softmax", 3 * D * scores, ("core_attn",)))  # write scores, softmax read + write
        if m.dropout:
            saved["attn_dropout_mask"] = 1.0 * scores
            saved["attn_dropout_out"] = D * scores
            ops.append(MemoryOp("attention_dropout", 3 * D * scores, ("core_attn",)))
    saved["attn_out"] = D * T * a_t * dv  # output-projection input
    if m.attention_output_gate and m.mla is None:
        saved["attn_gate"] = D * T * a_t * dv  # sigmoid input
        saved["attn_core_out"] = D * T * a_t * dv  # the product's other factor
        ops.append(MemoryOp("output_gate", 3 * D * T * a_t * dv))  # read core output and gate, write
    gemms.append(Gemm("o_proj", T, np.full_like(T, h), a_t * dv))
    ops.append(residual_add("attention_residual", m, D, Tsp * h))
    if m.dropout:
        saved["attn_proj_dropout_mask"] = 1.0 * Tsp * h
    saved["ln2_input"] = D * Tsp * h
    ops.append(norm_op("pre_mlp_norm", tr, D, Tsp * h))
    if tr.norm_kernel == "eager_fp32":
        saved["mlp_norm_internals"] = norm_saved_extra(tr, D, Tsp * h)

    split, replicated = attention_params(m, attention)
    params = split / t + replicated + 2 * h
    tp = [("ag", D * T * h, first_gemm), ("rs", D * T * h, "o_proj")]
    cp_block = D * T * kv_read * (dqk + dv)  # this rank's K and V, sent around the CP ring
    cp_a2a = D * T * (a_t * (dqk + dv) + kv_read * (dqk + dv))  # Ulysses: q, k, v in and the output back
    return dict(gemms=gemms, ops=ops, attention_hw=attention_hw, saved=saved, params=params, tp=tp, cp_block=cp_block, cp_a2a=cp_a2a,
                # a fused kernel walks only the window's key blocks; an unfused one computes every score
                attention_class="attention", attention_keys=m.sliding_window if attention == "sliding_attention" and flash else None,
                attention_rows=T * a_t if flash else None)


def linear_attention_block(m: ModelSpec, tr: TrainingSpec, sh: Shard, D: int) -> dict:
    """Gated DeltaNet (Yang et al. 2024; Qwen3-Next's GatedDeltaNet), heads split over TP:
    in_proj_qkvz and in_proj_ba GEMMs, a depthwise causal conv on q, k, v, the gates, the
    chunked delta rule, a gated RMSNorm with z, out_proj. The recurrence over chunks of C tokens
    costs per token and value head about 2C(d_k + d_v) (the intra-chunk products) + 6 d_k d_v
    (reading, correcting and updating the d_k x d_v state): linear in the sequence, where softmax
    attention is quadratic. The per-chunk states are recomputed in the backward (as the
    flash-linear-attention kernels do), so only the layer's inputs and outputs are kept."""
    h = m.hidden_size
    g = m.linear_attention
    t, T, Tsp = sh.t, sh.tokens, sh.tokens_sp
    qk, v, heads = linear_attention_dims(m)
    qk_t, v_t, heads_t = qk / t, v / t, heads / t
    gemms = [
        Gemm("in_proj_qkvz", T, (2 * qk_t + 2 * v_t) + 0 * T, np.full_like(T, h)),
        Gemm("in_proj_ba", T, 2 * heads_t + 0 * T, np.full_like(T, h)),
        Gemm("out_proj", T, np.full_like(T, h), v_t + 0 * T),
    ]
    conv = 2 * qk_t + v_t
    ops = [
        norm_op("input_norm", tr, D, Tsp * h),
        MemoryOp("short_conv", 2 * D * T * conv, ("core_attn",), kind="short_conv"),
        MemoryOp("gates", 4 * 4 * T * heads_t, ("core_attn",)),
        MemoryOp("gated_norm", 3 * D * T * v_t),
        residual_add("attention_residual", m, D, Tsp * h),
        norm_op("pre_mlp_norm", tr, D, Tsp * h),
    ]
    saved = {
        "layer_input": D * Tsp * h,
        "qkv_input": D * Tsp * h,
        "conv_input": D * T * conv,
        "q": D * T * qk_t,
        "k": D * T * qk_t,
        "v": D * T * v_t,
        "gdn_gates": 4 * T * 2 * heads_t,
        "gdn_core_out": D * T * v_t,
        "gdn_z": D * T * v_t,
        "attn_out": D * T * v_t,
        "ln2_input": D * Tsp * h,
    }
    core = T * heads_t * (2.0 * g.chunk_size * (g.key_head_dim + g.value_head_dim) + 6.0 * g.key_head_dim * g.value_head_dim)
    split, replicated = attention_params(m, "linear_attention")
    zero = 0.0 * T
    return dict(gemms=gemms, ops=ops, attention_hw=core, saved=saved, params=split / t + replicated + 2 * h,
                tp=[("ag", D * T * h, "in_proj_qkvz"), ("rs", D * T * h, "out_proj")], cp_block=zero, cp_a2a=zero,
                attention_class="linear_attention")


def _mlp(m: ModelSpec, ffn_local, tokens, D: int, prefix: str, modules: tuple[str, ...], eager: bool = False):
    """A (possibly TP-sharded) MLP on `tokens` tokens: GEMMs, saved tensors, activation traffic.
    SwiGLU fused reads the two halves and writes the product (3D bytes an output element); eager
    (silu, then the product) writes and re-reads the silu output: 5D in two kernels."""
    h = m.hidden_size
    gated = m.activation == "swiglu"
    fc1_out = (2 if gated else 1) * ffn_local
    gemms = [Gemm(f"{prefix}fc1", tokens, fc1_out, np.full_like(tokens, h), modules=modules),
             Gemm(f"{prefix}fc2", tokens, np.full_like(tokens, h), ffn_local, modules=modules)]
    saved = {f"{prefix}fc1_out": D * tokens * fc1_out, f"{prefix}act_out": D * tokens * ffn_local}
    if eager and gated:
        act = MemoryOp(f"{prefix}activation", 5 * D * tokens * ffn_local, modules, kernels=2.0)
    else:
        act = MemoryOp(f"{prefix}activation", D * tokens * (fc1_out + ffn_local), modules)  # read fc1 output, write result
    return gemms, saved, act


def layer_work(m: ModelSpec, tr: TrainingSpec, sh: Shard, D: int, kind: tuple) -> LayerWork:
    """The work of a layer of this kind: (attention type, MLP type), and for MoE layers whose
    routing imbalance varies with depth the band of relative MoE depth they lie in
    ((lo, hi), 0 = the first MoE layer, 1 = the last; see `imbalance_factor`)."""
    attention, mlp = kind[:2]
    if mlp == "moe":
        work = moe_layer(m, tr, sh, D, attention, kind[2] if len(kind) > 2 else (0.0, 1.0))
    else:
        work = dense_layer(m, tr, sh, D, attention)
    return fp8_saved_inputs(weight_casts(work, tr, D), m, tr, D)


def fp8_saved_inputs(work: LayerWork, m: ModelSpec, tr: TrainingSpec, D: int) -> LayerWork:
    """fp8 GEMMs keep, for the weight gradient, the fp8 copy of the input they computed with
    (training.fp8_saved_inputs): one byte an element where the activation dtype takes D.
    Transformer Engine 2.x (module/linear.py and layernorm_linear.py: the quantized input or
    norm output is saved with its column-wise usage only, the row-wise copy dropped) and
    torchao's float8 tensorwise linear (0.7: manual_float8_matmul_with_args_in_float8 saves
    input_fp8). A tensor another operator also keeps stays: the SwiGLU input (fc1's output), the
    norm inputs, q/k/v and the expert output; the attention output stays too where a flash
    kernel keeps it for its own backward (Transformer Engine's fused attention saves `out`), and
    the output projection's fp8 copy comes on top. The output head and the router are not fp8
    GEMMs (Megatron's output layer and router are not Transformer Engine modules). MXFP8's
    scales (1/32 byte an element) are not counted."""
    if tr.dtypes.compute not in FP8_COMPUTE or not tr.fp8_saved_inputs:
        return work
    fp8 = DTYPE_BYTES["fp8"]
    saved = {name: bytes_ * fp8 / D if name in FP8_SAVED else bytes_ for name, bytes_ in work.saved.items()}
    flash_keeps_output = (work.attention_class == "attention" and tr.attention_kernel == "flash"
                          and not (m.attention_output_gate and m.mla is None))
    if flash_keeps_output:
        saved["attn_out_fp8"] = work.saved["attn_out"] * fp8 / D
    else:
        saved["attn_out"] = work.saved["attn_out"] * fp8 / D
    return dataclasses.replace(work, saved=saved)


def weight_casts(work: LayerWork, tr: TrainingSpec, D: int) -> LayerWork:
    """Weights kept wider than the compute dtype (training.dtypes.params fp32 under PyTorch's
    bf16 autocast): each forward of a micro-batch casts every GEMM weight it uses (autocast caches
    the cast within one forward, a full recompute casts again), reading D_para and writing D bytes
    a parameter; the backward casts each weight gradient back, D and D_grad bytes. Megatron and
    FSDP's mixed precision keep or gather the weights in the compute dtype: nothing here."""
    d_para, d_grad = DTYPE_BYTES[tr.dtypes.params], DTYPE_BYTES[tr.dtypes.grads]
    if d_para <= D:
        return work
    weights = work.params_local + work.expert_params_local
    return dataclasses.replace(work, cast_f_bytes=(d_para + D) * weights, cast_b_bytes=(D + d_grad) * weights)


@dataclass(frozen=True)
class OpSAC:
    """What torchtitan's per-op selective activation checkpointing re-runs and keeps in one
    dense layer (`op_sac`)."""

    rerun_gemm_share: dict[str, np.ndarray | float]  # GEMM name -> share of its forward re-run in the backward
    rerun_ops: tuple[str, ...]  # memory-bound kernels re-run in the backward
    dropped_share: dict[str, np.ndarray | float]  # saved tensor -> share of it not kept (re-created)
    extra_kept: np.ndarray  # bytes kept that no other setting keeps (a matmul output nothing saves)


def op_sac(work: LayerWork) -> OpSAC:
    """torchtitan's per-op selective activation checkpointing (SelectiveAC, the
    `activation-checkpoint:selective` sub-command of torchtitan 0.3.0; selective_ac_option "op"
    since April 2024): each block is checkpointed with a policy that keeps the outputs of the
    ops in its save set (matmuls, the attention kernels, reduce-scatter, max) except every second
    matmul -- a block's matmuls counted in call order, the even ones recomputed -- and recomputes
    everything else, replaying the whole block (early_stop=False). A Llama block calls wq, wk,
    wv, wo, w1, w3, w2: wq, wv, w1, w2 and the attention kernel are kept; wk, wo, w3 and every
    memory-bound kernel (norms, rotary, SiLU x gate, residual adds) re-run. In the ledger: the
    norm outputs and their eager internals, k, the residual after attention and SiLU x gate's
    output are dropped, and the w3 half of fc1's output; w2's output, which nothing else keeps,
    is kept (one residual-stream tensor). A GELU MLP calls fc1 (5th, kept) and fc2 (6th,
    re-run). The model fuses wq, wk, wv into one GEMM: wk's share of it is k's columns'.
    Modelled for dense layers with softmax flash attention and tp = 1 (rules.py `recompute_ops`:
    under TP the policy also keeps the reduce-scatter outputs and re-gathers the inputs)."""
    sv = work.saved
    fc = {g.name: g for g in work.gemms}
    gated = bool(np.all(fc["fc1"].n == 2 * fc["fc2"].k))  # SwiGLU: fc1 emits the gate and the up projection
    k_share = sv["k"] / (sv["q"] + sv["k"] + sv["v"])
    dropped: dict[str, np.ndarray | float] = {name: 1.0 for name in (
        "qkv_input", "input_norm_internals", "k", "ln2_input", "mlp_norm_internals", "mlp_input", "act_out",
        "attn_proj_dropout_mask", "mlp_dropout_mask", "attn_out_fp8", "kv_expanded") if name in sv}
    if gated:
        dropped["fc1_out"] = 0.5
    return OpSAC(
        rerun_gemm_share={"qkv": k_share, "o_proj": 1.0, "fc1": 0.5 if gated else 0.0, "fc2": 0.0 if gated else 1.0},
        rerun_ops=tuple(op.name for op in work.memory_ops),
        dropped_share=dropped,
        extra_kept=sv["layer_input"] if gated else 0.0 * sv["layer_input"],  # w2's output: one residual-stream tensor
    )


def dense_layer(m: ModelSpec, tr: TrainingSpec, sh: Shard, D: int, attention: str = "full_attention") -> LayerWork:
    at = attention_block(m, tr, sh, D, attention)
    T, Tsp, t, h = sh.tokens, sh.tokens_sp, sh.t, m.hidden_size
    gemms, saved_mlp, act = _mlp(m, m.ffn_hidden_size / t, T, D, "", ("mlp",), tr.elementwise == "eager")
    saved = dict(at["saved"])
    saved["mlp_input"] = D * sh.tokens_saved_input * h
    saved.update(saved_mlp)
    ops = at["ops"] + [act, residual_add("mlp_residual", m, D, Tsp * h)]
    if m.dropout:
        saved["mlp_dropout_mask"] = 1.0 * Tsp * h
    tp = at["tp"] + [("ag", D * T * h, "fc1"), ("rs", D * T * h, "fc2")]
    zero = np.zeros_like(T)
    return LayerWork(
        gemms=at["gemms"] + gemms,
        memory_ops=ops,
        attention_flops_hw=at["attention_hw"],
        tp_bytes=tp,
        cp_bytes=at["cp_block"],
        cp_a2a_bytes=at["cp_a2a"],
        ep_a2a_bytes=zero,
        etp_bytes=zero,
        saved=saved,
        params_local=at["params"] + mlp_params(m, m.ffn_hidden_size) / t,
        expert_params_local=zero,
        attention_class=at.get("attention_class", "attention"),
        attention_keys=at.get("attention_keys"),
        attention_rows=at.get("attention_rows"),
    )


def worst_case_factor(m: ModelSpec, sh: Shard) -> np.ndarray:
    """The largest s' / balanced share there is (MemFine eq. 2, s' -> e*s): every token of the
    EP group routed to this rank, with min(top_k, local experts) of its copies each (a token
    picks top_k distinct experts), against top_k copies of its own tokens when balanced."""
    x = m.moe
    return sh.e * np.minimum(x.top_k, x.num_experts / sh.e) / x.top_k


def imbalance_factor(m: ModelSpec, tr: TrainingSpec, sh: Shard, depth: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """s' / balanced share of the busiest EP rank in the MoE layers at relative depths `depth`
    (lo, hi): the profile of training.moe (linear from the first MoE layer to the last, each end
    capped at the worst case, 'worst' = the worst case), its largest value over the band (the
    band's worst layer), bounded by the capacity factor when tokens are dropped."""
    worst = worst_case_factor(m, sh)
    first, last = (np.minimum(end, worst) for end in tr.moe.ends())
    lo, hi = depth
    factor = np.maximum(first + (last - first) * lo, first + (last - first) * hi)
    if tr.moe.capacity_factor is not None:
        factor = np.minimum(factor, tr.moe.capacity_factor)
    return factor


def routed_tokens(m: ModelSpec, tr: TrainingSpec, sh: Shard, depth: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """Token copies the busiest expert GPU processes in one MoE layer (MemFine's s'): its SP share
    routed top-k ways, gathered over the expert-TP group, times the routing imbalance."""
    return sh.tokens_sp * m.moe.top_k * sh.etp * imbalance_factor(m, tr, sh, depth)


def moe_layer(m: ModelSpec, tr: TrainingSpec, sh: Shard, D: int, attention: str = "full_attention", depth: tuple[float, float] = (0.0, 1.0)) -> LayerWork:
    """MoE layer as Megatron-Core runs it (alltoall or DeepEP dispatcher, grouped GEMM), on the
    busiest EP rank: the slowest rank sets the pace of the all-to-alls, so its tokens s' size the
    expert GEMMs, the permutes and the volume it receives.

    MemFine's FCDA (sh.chunks = c > 1): dispatch, expert computation and combine run c times on
    1/c of the tokens each: the grouped GEMMs at 1/c of the rows (their efficiency at that
    shape), c times the kernels and all-to-alls (latency), and one chunk's expert tensors alive
    at a time (see layer.kind_costs for the chunked recompute).

    Saved tensors match MemFine Table 2 (norm, q/k/v, o, router input and logits, permuted
    tokens, expert FC1 output, expert output before the probability-weighted combine) plus
    one tensor MemFine's table omits: the SwiGLU output, which the expert FC2 saves as its
    input (D*s'*g_e/etp bytes) unless the activation is recomputed."""
    x = m.moe
    at = attention_block(m, tr, sh, D, attention)
    T, Tsp, t, h = sh.tokens, sh.tokens_sp, sh.t, m.hidden_size
    E_local = x.num_experts / sh.e
    recv = routed_tokens(m, tr, sh, depth)
    chunks = sh.chunks + 0.0 * T
    ffn_local = x.expert_ffn_hidden_size / sh.etp

    saved = dict(at["saved"])
    saved["router_input"] = D * Tsp * h
    saved["router_logits"] = D * Tsp * x.num_experts
    gemms = list(at["gemms"])
    gemms.append(Gemm("router", Tsp, np.full_like(T, x.num_experts), np.full_like(T, h), modules=("moe",)))
    gated = m.activation == "swiglu"
    fc1_out = (2 if gated else 1) * ffn_local
    per_expert = recv / E_local / chunks
    gemms.append(Gemm("expert_fc1", per_expert, fc1_out, np.full_like(T, h), "grouped_gemm", E_local * chunks, ("moe",)))
    gemms.append(Gemm("expert_fc2", per_expert, np.full_like(T, h), ffn_local, "grouped_gemm", E_local * chunks, ("moe",)))
    saved["expert_input"] = D * recv * h
    saved["expert_fc1_out"] = D * recv * fc1_out
    saved["expert_act_out"] = D * recv * ffn_local
    saved["expert_output"] = D * recv * h
    ops = at["ops"] + [
        MemoryOp("expert_activation", D * recv * (fc1_out + ffn_local), ("moe_act", "moe"), kernels=chunks),
        MemoryOp("permute", 4 * D * recv * h, ("moe",), kernels=2.0 * chunks),  # permute and unpermute (read + write each)
        MemoryOp("router_softmax", 3 * 4 * Tsp * x.num_experts, ("moe",)),  # fp32 softmax / top-k
        residual_add("mlp_residual", m, D, Tsp * h),
    ]

    tp = list(at["tp"])
    if x.num_shared_experts:
        shared_ffn = x.num_shared_experts * x.shared_ffn / t
        g, sv, act = _mlp(m, shared_ffn, T, D, "shared_", ("shared_experts", "moe"), tr.elementwise == "eager")
        gemms += g
        saved.update(sv)
        ops.append(act)
        tp += [("ag", D * T * h, "shared_fc1"), ("rs", D * T * h, "shared_fc2")]

    expert_params = x.num_experts * mlp_params(m, x.expert_ffn_hidden_size) / (sh.e * sh.etp)
    dense_params = at["params"] + h * x.num_experts + x.num_shared_experts * mlp_params(m, x.shared_ffn) / t
    # the busiest rank receives (dispatch) and sends back (combine) s' token copies
    a2a = D * recv / sh.etp * h
    etp_bytes = np.where(sh.etp > 1, D * recv * h, 0.0)
    return LayerWork(
        gemms=gemms,
        memory_ops=ops,
        attention_flops_hw=at["attention_hw"],
        tp_bytes=tp,
        cp_bytes=at["cp_block"],
        cp_a2a_bytes=at["cp_a2a"],
        ep_a2a_bytes=np.where(sh.e > 1, a2a, 0.0),
        etp_bytes=etp_bytes,
        saved=saved,
        params_local=dense_params + expert_params,
        expert_params_local=expert_params,
        attention_class=at.get("attention_class", "attention"),
        attention_keys=at.get("attention_keys"),
        attention_rows=at.get("attention_rows"),
        ep_chunks=chunks,
        ep_buffer_bytes=np.where(sh.e > 1, D * Tsp * x.top_k * h / chunks, 0.0),
    )


@dataclass(frozen=True)
class EdgeWork:
    """Embedding (first stage) and output head + loss (last stage) for one micro-batch."""

    embedding_params_local: np.ndarray
    head_params_local: np.ndarray
    embedding_memory_bytes: np.ndarray
    head_gemm: Gemm
    head_memory_bytes: np.ndarray  # final norm + cross-entropy passes over the logits
    head_saved: np.ndarray  # final-norm input, the head's saved input + the loss at its peak (fp32 softmax; eager: edges())
    head_output_bytes: np.ndarray  # one micro-batch's logits on this rank (vocab-parallel), as the head writes them
    head_tp_bytes: np.ndarray  # all-gather of the final hidden states before the head


def edges(m: ModelSpec, tr: TrainingSpec, sh: Shard, D: int, pp: np.ndarray) -> EdgeWork:
    """Embedding lookup and output layer. The vocabulary is split over TP (vocab-parallel)."""
    h, V = m.hidden_size, m.vocab_size
    T, Tsp, t = sh.tokens, sh.tokens_sp, sh.t
    logits = T * V / t
    # bytes a logit at the loss's peak. Fused (Megatron's vocab-parallel kernel): the fp32 softmax.
    # Eager (F.cross_entropy(logits.float())): the larger of the forward, with the bf16 logits, their
    # fp32 copy and the log-softmax output (a vocab-parallel DTensor log-softmax, t > 1, also holds
    # x - max beside exp(x - max): torch.distributed.tensor.parallel.loss._log_softmax), and the
    # backward's start, with the saved log-softmax, two fp32 gradients (log-probs, logits) and the
    # bf16 logits unless the loop dropped them (no PP); the vocab-parallel backward (t > 1) fuses
    # the two and holds one more: zeros_like(x), exp(x) and their sum beside the saved x
    # (loss.py _nll_loss_and_log_softmax_backward: `(grad_input + torch.exp(x)) * grad_output`,
    # read in torch 2.5.1)
    # With the cast in the model (logits_fp32), the head's output is the fp32 copy: the forward
    # peaks at the cast (both copies) or in the log-softmax (the copy, x - max, exp(x - max) or the
    # output), and the pipeline keeps the fp32 copy, not the bf16 logits, to the backward.
    out = 4.0 if tr.logits_fp32 else float(D)
    kept_logits = np.where(tr.logits_freed_before_backward & (pp == 1), 0.0, out)
    eager_forward = np.maximum(D + 4.0, 4 + 4 + 4.0 * (t > 1)) if tr.logits_fp32 else D + 4 + 4 + 4.0 * (t > 1)
    d_para = DTYPE_BYTES[tr.dtypes.params]
    head_cast = (d_para + D) * V * h / t if d_para > D else 0.0 * t
    eager_backward = 4 + 8 + 4.0 * (t > 1) + kept_logits
    loss_bytes = np.maximum(eager_forward, eager_backward) if tr.loss_kernel == "eager_fp32" else 4.0 + 0.0 * t
    head = Gemm("head", T, V / t, np.full_like(T, h))
    # the output projection's saved input: the SP shard it re-gathers in the backward (Megatron's
    # ColumnParallelLinear), or, under DTensor TP (tp_backward_overlap off: torchtitan), the
    # all-gathered final hidden states the matmul was given -- async TP never fuses it, since
    # torchtitan compiles each transformer block, not the head (its apply_compile)
    head_input = np.where((not tr.tp_backward_overlap) & sh.sp & (t > 1), T, Tsp)
    return EdgeWork(
        embedding_params_local=V * h / t,
        head_params_local=V * h / t + h,
        embedding_memory_bytes=2 * D * T * h,
        head_gemm=head,
        # final norm; logits written (D), upcast to fp32, softmax and loss: ~4 fp32 passes
        # (+ autocast's cast of the output weight, and of its gradient back, where the weights
        # are wider than the compute: `weight_casts`)
        head_memory_bytes=2 * D * Tsp * h + D * logits + 4 * 4 * logits + head_cast,
        # held for the loss: the final-norm input, the head's input (above), and the loss's peak
        head_saved=D * Tsp * h + D * head_input * h + loss_bytes * logits,
        head_output_bytes=out * logits,
        head_tp_bytes=np.where(t > 1, D * T * h, 0.0),
    )
