"""Attention work under document masks, and its imbalance across context-parallel ranks
(Llama 3 ISCA'25, sections 4 and 7.3.2).

With document masks a token attends only to the earlier tokens of its own document, so a
sequence costs sum_i L_i (L_i + 1) / 2 score entries instead of s (s + 1) / 2. Context
parallelism splits the sequence into 2*cp chunks and gives rank i chunks i and 2*cp - 1 - i
(Megatron / Transformer Engine and Llama 3's all-gather CP): exactly balanced for one causal
sequence, but document boundaries fall anywhere, so ranks get unequal work, and each layer's
CP exchange waits for the slowest rank (Llama 3 measured the slowest rank at 1.44x the fastest
in total compute at 128K, cp = 16).

Model. Documents are packed back to back and cut into sequences; their lengths are exponential
with the given mean (the first document of a sequence starts at its first token: the mask is
per sequence). Sequences are sampled with a fixed seed, so the factors are deterministic; for
each, the attended-key count is summed per CP rank exactly (arithmetic series over the pieces
where a document meets a chunk). Per micro-batch the ring and all-gather variants wait for the
slowest rank; Ulysses (all-to-all) CP gives every rank whole sequences for a subset of heads, so
its ranks are balanced and only the mean applies (its hierarchical a2a+p2p form balances the
all-to-all part and keeps the ring's imbalance over the ring degree). Across data-parallel
groups the work of the many micro-batches of a step averages out; that wait is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

SEED = 20240721  # fixed: the same problem gives the same answer
SAMPLES = 256


@dataclass(frozen=True)
class DocumentMaskWork:
    """Attention work relative to one causal sequence's, per CP rank."""

    mean_factor: float  # the average rank
    slowest_factor: float  # E[max over CP ranks] per micro-batch
    imbalance: float  # E[max] / E[min] over CP ranks


def _rank_work(seq_len: int, mean_tokens: int, cp: int, rng: np.random.Generator) -> np.ndarray:
    """Attended-key counts of each CP rank for one sampled sequence."""
    lengths = []
    total = 0
    while total < seq_len:
        n = max(1, int(np.ceil(rng.exponential(mean_tokens))))
        lengths.append(n)
        total += n
    doc_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    doc_starts = doc_starts[doc_starts < seq_len]
    chunk = seq_len / (2 * cp)
    chunk_edges = np.round(np.arange(2 * cp + 1) * chunk).astype(np.int64)
    edges = np.unique(np.concatenate([doc_starts, chunk_edges]))
    lo, hi = edges[:-1], edges[1:]
    start = doc_starts[np.searchsorted(doc_starts, lo, side="right") - 1]  # document of each piece
    work = (hi - start) * (hi - start + 1) / 2 - (lo - start) * (lo - start + 1) / 2
    per_chunk = np.bincount(np.searchsorted(chunk_edges, lo, side="right") - 1, weights=work, minlength=2 * cp)
    return per_chunk[:cp] + per_chunk[::-1][:cp]  # rank i: chunks i and 2cp-1-i


@lru_cache(maxsize=256)
def document_mask_work(seq_len: int, mean_tokens: int, cp: int) -> DocumentMaskWork:
    rng = np.random.default_rng(SEED)
    causal_per_rank = seq_len * (seq_len + 1) / 2 / cp
    samples = np.array([_rank_work(seq_len, mean_tokens, cp, rng) for _ in range(SAMPLES)])
    return DocumentMaskWork(
        mean_factor=float(samples.mean() / causal_per_rank),
        slowest_factor=float(samples.max(axis=1).mean() / causal_per_rank),
        imbalance=float(samples.max(axis=1).mean() / max(samples.min(axis=1).mean(), 1e-12)),
    )


def attention_factor(seq_len: int, mean_tokens: int | None, cp: np.ndarray, ring: np.ndarray) -> np.ndarray:
    """Multiplier on the causal attention work of the rank that paces a micro-batch.
    `ring`: the ring (or all-gather) degree over which sequence chunks are split (cp for p2p and
    all_gather, cp / cp_a2a for a2a+p2p, 1 for a2a)."""
    if mean_tokens is None:
        return np.ones_like(cp, dtype=float)
    out = np.empty(len(cp))
    for degree in np.unique(ring):
        work = document_mask_work(seq_len, mean_tokens, int(degree))
        out[ring == degree] = work.slowest_factor if degree > 1 else work.mean_factor
    return out
