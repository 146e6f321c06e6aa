"""FLOP counts per training step (MoFa eq. 15; PaLM Appendix B for MFU).

Model FLOPs (the MFU numerator) count what the model needs, not what the implementation does:
2 FLOPs per matmul parameter a token passes through, forward, times 3 for forward + backward,
plus the attention score and value matmuls over the full s x s matrix (PaLM's 12*L*H*Q*T per
token for standard attention; for MLA and GQA the same with their head dims). The embedding
lookup is not a matmul and is not counted. MoE layers count the router, the top-k routed
experts and the shared experts a token actually visits.

Hardware FLOPs (HFU) add the forward work that recompute repeats (Korthikanti et al. 2022).
"""

from __future__ import annotations

import numpy as np

from costmodel.architecture import active_matmul_params, attention_dims
from costmodel.specs import ModelSpec


def attention_flops_per_token(m: ModelSpec, seq_len: int, causal: bool = False) -> float:
    """Forward FLOPs of QK^T and AV for one token in one layer: the full score matrix (PaLM's
    convention) or, with `causal`, the lower triangle a causal kernel computes."""
    a, _, dqk, dv = attention_dims(m)
    share = (seq_len + 1) / (2 * seq_len) if causal else 1.0
    return 2.0 * seq_len * a * (dqk + dv) * share


def layer_forward_flops_per_token(m: ModelSpec, seq_len: int, moe: bool, causal: bool = False) -> float:
    if moe and m.moe is None:
        return 0.0  # a dense model has no MoE layer
    return 2.0 * active_matmul_params(m, moe) + attention_flops_per_token(m, seq_len, causal)


def model_flops_per_token(m: ModelSpec, seq_len: int, causal: bool = False) -> float:
    fwd = (
        m.num_dense_layers * layer_forward_flops_per_token(m, seq_len, False, causal)
        + m.num_moe_layers * layer_forward_flops_per_token(m, seq_len, True, causal)
        + 2.0 * m.hidden_size * m.vocab_size
    )
    return 3.0 * fwd


def recompute_flops_per_token(m: ModelSpec, seq_len: int, recompute: np.ndarray) -> np.ndarray:
    """Extra forward FLOPs per token repeated in the backward pass."""
    selective = m.num_layers * attention_flops_per_token(m, seq_len)
    full = m.num_dense_layers * layer_forward_flops_per_token(m, seq_len, False) + m.num_moe_layers * layer_forward_flops_per_token(
        m, seq_len, True
    )
    return np.select([recompute == 1, recompute == 2], [selective, full], 0.0)


def palm_flops_per_token(m: ModelSpec, seq_len: int, num_params: float) -> float:
    """PaLM Appendix B: 6N + 12*L*H*Q*T (N all parameters)."""
    return 6.0 * num_params + 12.0 * m.num_layers * m.num_heads * m.dim_per_head * seq_len
