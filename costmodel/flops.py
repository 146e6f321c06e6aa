"""FLOP counts per training step (MoFa eq. 15; PaLM Appendix B for MFU).

Model FLOPs (the MFU numerator) count what the model needs, not what the implementation does:
2 FLOPs per matmul parameter a token passes through, forward, times 3 for forward + backward,
plus the attention score and value matmuls over the full s x s matrix (PaLM's 12*L*H*Q*T per
token for standard attention; for MLA and GQA the same with their head dims). The embedding
lookup is not a matmul and is not counted. MoE layers count the router, the top-k routed
experts and the shared experts a token actually visits.

Hardware FLOPs (HFU) add the forward work that recompute repeats (Korthikanti et al. 2022).

Conventions (seed note 004, "MFU 口径" and "verl 代码路径"): published MFU and TFLOP/s figures
count different FLOPs, so every figure this project prints names its convention, one of
FLOPS_CONVENTIONS, and `convention_flops_per_token` is the one place that counts each:

* palm -- PaLM Appendix B: 6N + the attention matmuls over the whole s x s score matrix, N the
  matmul parameters a token passes through (the ledger above; for MoE the active ones);
* palm_causal -- the same with the attention over the lower triangle a causal kernel computes
  (how Meta's Llama 3 TFLOP/s read at 128K);
* megatron -- Megatron-LM's formula (Narayanan et al. 2021 eq. 3, 72Bslh^2(1 + s/6h + V/12lh)
  without recompute, generalised to GQA, SwiGLU and MoE in Megatron-LM's
  num_floating_point_operations): the ledger without the MoE router gate, which Megatron does
  not count; its HFU (96Bslh^2(...) under full recompute) adds the recompute forward;
* verl -- verl's estimators (flops_counter.py @fa856c3, qwen2 / qwen3_moe): 6 x N x tokens +
  6 x sum(seq_i^2) x head_dim x heads x layers, N = attention projections + MLP (MoE: top-k
  experts and the router, no shared expert) per layer + 2 x vocab x hidden (embedding and head,
  tied or not); every layer gets the quadratic term (verl has no estimator for linear attention);
* tgs -- MemFine eq. 10, TGS = gbs x s / (T x N) tokens per GPU per second: no FLOP count of its
  own, so its FLOP figures are PaLM's and its headline figure is the token rate.
"""

from __future__ import annotations

from typing import get_args

import numpy as np

from costmodel.architecture import DENSE, _kind, active_matmul_params, attention_dims, attention_params, mlp_params, mtp_kind, window_share
from costmodel.specs import FlopsConvention, ModelSpec


def attention_flops_per_token(m: ModelSpec, seq_len: int, causal: bool = False, attention: str = "full_attention") -> float:
    """Forward FLOPs of the attention core for one token in one layer. Softmax attention: QK^T
    and AV over the keys a query may see -- the whole sequence (PaLM's convention) or, with
    `causal`, the lower triangle a causal kernel computes; a sliding-window layer sees at most
    its window. Gated DeltaNet: the chunked delta rule, linear in the sequence
    (architecture.linear_attention_block)."""
    if attention == "linear_attention":
        g = m.linear_attention
        return g.num_value_heads * (2.0 * g.chunk_size * (g.key_head_dim + g.value_head_dim) + 6.0 * g.key_head_dim * g.value_head_dim)
    a, _, dqk, dv = attention_dims(m)
    window = m.sliding_window if attention == "sliding_attention" else None
    if causal:
        share = window_share(seq_len, window)
    else:
        share = 1.0 if window is None else min(window, seq_len) / seq_len
    return 2.0 * seq_len * a * (dqk + dv) * share


def layer_forward_flops_per_token(m: ModelSpec, seq_len: int, kind=DENSE, causal: bool = False) -> float:
    attention, mlp = _kind(kind)
    if mlp == "moe" and m.moe is None:
        return 0.0  # a dense model has no MoE layer
    return 2.0 * active_matmul_params(m, (attention, mlp)) + attention_flops_per_token(m, seq_len, causal, attention)


def mtp_forward_flops_per_token(m: ModelSpec, seq_len: int, causal: bool = False) -> float:
    """One MTP module: its layer, the 2h -> h projection and its own output head."""
    h = m.hidden_size
    return layer_forward_flops_per_token(m, seq_len, mtp_kind(m), causal) + 2.0 * 2 * h * h + 2.0 * h * m.vocab_size


def model_flops_per_token(m: ModelSpec, seq_len: int, causal: bool = False) -> float:
    fwd = (
        sum(n * layer_forward_flops_per_token(m, seq_len, kind, causal) for kind, n in m.kind_counts().items())
        + m.mtp_layers * mtp_forward_flops_per_token(m, seq_len, causal)
        + 2.0 * m.hidden_size * m.vocab_size
    )
    return 3.0 * fwd


def recompute_flops_per_token(m: ModelSpec, seq_len: int, cfg, causal: bool = False) -> np.ndarray:
    """Extra forward FLOPs per token repeated in the backward pass (HFU's addition): selective
    recompute re-runs the matmuls of the chosen modules (core_attn: attention; mlp: the dense MLP;
    moe: router, routed and shared experts; shared_experts; mla_up_proj: MLA's up projections;
    layernorm and moe_act are elementwise: no matmul FLOPs); full recompute the whole forward
    of the layers it covers (every layer with method uniform; the first N of each virtual stage
    with method block, counted on a middle rank)."""
    from costmodel.configs import RECOMPUTE_MODULE_BITS as BITS  # configs imports the specs, not us

    mods = np.where(cfg.recompute == 1, cfg.recompute_modules, 0.0).astype(np.int64)

    def on(name):
        return ((mods & BITS[name]) != 0) * 1.0

    attention = sum(n * attention_flops_per_token(m, seq_len, causal, a) for (a, _), n in m.kind_counts().items())
    dense_mlp = m.num_dense_layers * 2.0 * mlp_params(m, m.ffn_hidden_size)
    shared = moe_block = up_proj = 0.0
    if m.moe is not None:
        x = m.moe
        shared = m.num_moe_layers * 2.0 * x.num_shared_experts * mlp_params(m, x.shared_ffn)
        moe_block = m.num_moe_layers * 2.0 * (m.hidden_size * x.num_experts + x.top_k * mlp_params(m, x.expert_ffn_hidden_size)) + shared
    if m.mla is not None:
        a, mla = m.num_heads, m.mla
        up = (mla.q_lora_rank or 0) * a * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) + mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)
        up_proj = m.num_layers * 2.0 * up
    selective = (on("core_attn") * attention + on("mlp") * dense_mlp + on("moe") * moe_block
                 + (1.0 - on("moe")) * on("shared_experts") * shared + on("mla_up_proj") * up_proj)
    full = sum(n * layer_forward_flops_per_token(m, seq_len, kind, causal) for kind, n in m.kind_counts().items())
    stage = np.maximum(np.floor(m.num_layers / np.maximum(cfg.pp * cfg.vp, 1.0)), 1.0)
    covered = np.where(cfg.recompute_method == 1, np.minimum(cfg.recompute_layers, stage) / stage, 1.0)
    return np.select([cfg.recompute == 1, cfg.recompute == 2], [selective, covered * full], 0.0)


def palm_flops_per_token(m: ModelSpec, seq_len: int, num_params: float) -> float:
    """PaLM Appendix B: 6N + 12*L*H*Q*T (N all parameters)."""
    return 6.0 * num_params + 12.0 * m.num_layers * m.num_heads * m.dim_per_head * seq_len


#: the FLOP-counting conventions of published MFU and TFLOP/s figures (module docstring)
FLOPS_CONVENTIONS = get_args(FlopsConvention)


def mfu_convention(convention: str) -> str:
    """The FLOP count behind a convention's MFU: TGS (MemFine eq. 10) counts tokens, not FLOPs,
    so its MFU and TFLOP/s figures are PaLM's."""
    return "palm" if convention == "tgs" else convention


def router_flops_per_token(m: ModelSpec) -> float:
    """The MoE router gate's matmul, forward + backward (6 x hidden x experts per MoE layer):
    counted by PaLM's ledger and verl, not by Megatron-LM's formula."""
    if m.moe is None:
        return 0.0
    moe_layers = sum(n for (_, mlp), n in m.kind_counts().items() if mlp == "moe") + (m.mtp_layers if mtp_kind(m)[1] == "moe" else 0)
    return 6.0 * m.hidden_size * m.moe.num_experts * moe_layers


def verl_flops_per_token(m: ModelSpec, seq_len) -> float:
    """verl's _estimate_qwen2_flops / _estimate_qwen3_moe_flops (seed note 004, "verl 代码路径"),
    per token of sequences of `seq_len` tokens (sum(seq_i^2) / sum(seq_i) = seq_len): 6N + 6 x
    seq_len x head_dim x heads x layers. The projections come from the architecture ledger
    (attention_params, mlp_params); the router is hidden x experts and the shared experts are
    left out, as verl does; MTP modules are not counted (verl does not)."""
    h = m.hidden_size
    n = 0.0
    for (attention, mlp), count in m.kind_counts().items():
        split, replicated = attention_params(m, attention)
        if mlp == "dense":
            ffn = mlp_params(m, m.ffn_hidden_size)
        else:
            ffn = m.moe.top_k * mlp_params(m, m.moe.expert_ffn_hidden_size) + h * m.moe.num_experts
        n += count * (split + ffn)  # verl's q, k, v, o projections (no norms)
    n += 2.0 * m.vocab_size * h
    return 6.0 * n + 6.0 * np.asarray(seq_len, dtype=float) * m.dim_per_head * m.num_heads * m.num_layers


def convention_flops_per_token(m: ModelSpec, seq_len: int, convention: str = "palm") -> float:
    """Model FLOPs per token (forward + backward) in one of FLOPS_CONVENTIONS: the MFU
    numerator of that convention divided by the tokens of the step."""
    if convention not in FLOPS_CONVENTIONS:
        raise ValueError(f"unknown FLOPs convention {convention!r} (one of {', '.join(FLOPS_CONVENTIONS)})")
    if convention == "verl":
        return float(verl_flops_per_token(m, seq_len))
    flops = model_flops_per_token(m, seq_len, causal=convention == "palm_causal")
    if convention == "megatron":
        flops -= router_flops_per_token(m)
    return flops


def step_time_floor_s(problem) -> float:
    """A step time no configuration of `problem` can beat: the least FLOPs a training step
    executes, spread evenly over every GPU running at the hardware's highest peak. Why it is a
    floor: the exact model charges each operator its FLOPs at an achieved rate of at most
    peak_fraction (<= 1, specs.Curve) times a dtype's peak; every token passes through every
    matmul of its layers forward and backward (3 x 2 FLOPs per parameter it meets), and
    through attention to at least one key (itself), which is model_flops_per_token at a
    one-token causal sequence; the slowest rank does at least the average share. Everything
    else (communication, bubbles, memory-bound work, the optimizer) only adds.

    It is loose (an MFU of 100% and then some), but it is what DFS and exhaustive enumeration,
    which build no tighter bound, can prove when a time limit stops them (their gap)."""
    m, tr = problem.model, problem.training
    flops = model_flops_per_token(m, 1, causal=True) * tr.global_batch_size * tr.seq_len
    peak = max(problem.hardware.peak_tflops.values()) * 1e12
    return flops / (problem.cluster.num_gpus * peak)
