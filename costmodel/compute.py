"""Operator latency: MoFa eq. 1 (T = S^comp / P^comp) with P^comp from one of three models.

  * 'roofline' (eq. 19): P = min(AI * B_hbm, P_peak)
  * 'modified_roofline': eq. 19 scaled by efficiencies (the lambda^comp of eq. 17):
        P = min(bw_fraction * AI * B_hbm, peak_fraction * P_peak)
  * 'profiled': measured (arithmetic intensity, TFLOP/s) points, interpolated in log(AI).
Every kernel also pays `kernel_overhead_us` (launch and tail), which is what makes many
small GEMMs (tiny experts, large TP) slower than their FLOPs suggest.

Shape (issue 9): under the modified roofline a GEMM's compute ceiling is
    peak_fraction * P_peak * wave(M, N) * K / (K + k_half)
where wave(M, N) is the share of the SMs the output tiles keep busy over their waves
(ceil(M/tm) * ceil(N/tn) tiles on `sm_count` SMs: the last wave runs partly idle; none when the
profile has no tile, as for Hopper's persistent cuBLAS kernels) and the K-term the main loop's share
of a tile's time (prologue and epilogue). Which terms a chip needs is decided by its measured
kernel timings (calibration/kernels.py, leave-one-model-out on real layers). The backward of a GEMM is
a data-gradient GEMM (M x K output over N) and a weight-gradient GEMM (K x N output over the M
tokens): each is timed at its own shape. Fused attention runs at peak_fraction * L/(L + seq_half)
with L the query tokens of one call (at most the keys a sliding window leaves a query), slowed by
its grid's tail where few heads leave few waves of query tiles (`attention_tail_waves`), its
backward `attention_backward_ratio` times the forward (linear attention: its own peak fraction, never under a per-call floor, and its own
backward ratio); each fused-attention implementation (Transformer Engine, PyTorch SDPA, Triton,
FlexAttention) may have its own curve. Memory-bound kernels move their bytes at a fraction of HBM
bandwidth, the short convolution of linear-attention layers at its own, with a per-call cost and
its own backward ratio. With fp8 compute, GEMMs run at the fp8 peak with their own curve (`fp8_gemm`);
attention and everything else stay in bf16 (Transformer Engine's and torchao's behaviour).
MXFP8 is timed the same way, at the peak the GPU lists for it: Blackwell's tensor cores take
the E8M0 block scales inside the MMA at the dense fp8 rate (NVIDIA Blackwell datasheets list
one "FP8/FP6" rate for both), so it costs no more than per-tensor fp8 there; the quantization
kernels of either recipe are not modelled.
"""

from __future__ import annotations

import numpy as np

from costmodel.architecture import Gemm
from costmodel.specs import Curve, HardwareSpec
from costmodel.units import FP8_COMPUTE, GB, TFLOP, US


#: query rows of one head a fused-attention tile holds (FlashAttention-2/3 and cuDNN's kernels on
#: A100 and Hopper at head dims 64-128: block_m = 128), the unit of the kernel's grid
ATTENTION_QUERY_TILE = 128


class ComputeModel:
    def __init__(self, hw: HardwareSpec, compute_dtype: str, dtype_bytes: int, attention_impl: str | None = None):
        self.hw = hw
        self.eff = hw.efficiency
        self.attention_curve = self.eff.attention_impls.get(attention_impl, self.eff.attention) if attention_impl else self.eff.attention
        self.fp8 = compute_dtype in FP8_COMPUTE
        self.peak = hw.peak(compute_dtype) * TFLOP  # GEMMs
        self.attention_peak = hw.peak("bf16" if self.fp8 and "bf16" in hw.peak_tflops else compute_dtype) * TFLOP
        self.hbm = hw.memory_bandwidth_gb_per_s * GB
        self.dtype_bytes = dtype_bytes
        self.overhead = self.eff.kernel_overhead_us * US
        self._tables = {
            kind: (np.log(np.array([p[0] for p in pts])), np.array([p[1] for p in pts]) * TFLOP)
            for kind, pts in self.eff.profiled.items()
            if pts
        }

    def _achieved(self, kind: str, intensity: np.ndarray, shape=1.0) -> np.ndarray:
        """Achieved FLOP/s for an operator class at an arithmetic intensity (FLOP/byte)."""
        mode = self.eff.mode
        if mode == "profiled" and kind in self._tables:
            log_ai, flops = self._tables[kind]
            return np.interp(np.log(np.maximum(intensity, 1e-9)), log_ai, flops)
        peak = self.attention_peak if kind in ("attention", "linear_attention") else self.peak
        if kind in ("gemm", "grouped_gemm") and self.fp8:
            kind = "fp8_gemm"
        curve: Curve = self.attention_curve if kind == "attention" else getattr(self.eff, kind)
        if mode == "roofline":
            return np.minimum(intensity * self.hbm, peak)
        return np.minimum(curve.bandwidth_fraction * intensity * self.hbm, curve.peak_fraction * peak * shape)

    def best_rate(self, kind: str) -> float:
        """The fastest an operator class runs (FLOP/s): peak x its curve's peak fraction (the
        roofline's peak; the profiled table's best point) -- what the lower bounds of
        costmodel.bounds divide FLOPs by, never above any rate `_achieved` returns."""
        if self.eff.mode == "profiled" and kind in self._tables:
            return float(self._tables[kind][1].max())
        return float(self._achieved(kind, np.array([np.inf]))[0])

    def _shape(self, m, n, k) -> np.ndarray | float:
        """wave(M, N) * K / (K + k_half) (module docstring); 1 without shape dependence."""
        eff = self.eff
        if eff.mode != "modified_roofline":
            return 1.0
        out = 1.0
        if eff.gemm_k_half > 0:
            out = k / (k + eff.gemm_k_half)
        sms = self.hw.sm_count
        if sms and eff.gemm_tile:
            tm, tn = eff.gemm_tile
            tiles = np.ceil(m / tm) * np.ceil(np.maximum(n, 1.0) / tn)
            out = out * tiles / (np.ceil(tiles / sms) * sms)
        return out

    def gemm_time_of(self, m, n, k, kind: str = "gemm", count=1.0) -> np.ndarray:
        """Time of `count` GEMMs with an M x N output over a reduction of K. Arithmetic
        intensity is that of one GEMM: 2MNK / (bytes of A, B and C)."""
        m = np.maximum(m, 1e-9)
        one = 2.0 * m * n * k
        moved = self.dtype_bytes * (m * k + k * n + m * n)
        rate = self._achieved(kind, one / moved, self._shape(m, n, k))
        return one * count / rate + self.overhead

    def gemm_time(self, g: Gemm) -> np.ndarray:
        """Forward time of a GEMM (or of all GEMMs of a grouped GEMM)."""
        return self.gemm_time_of(g.m, g.n, g.k, g.kind, g.count)

    def gemm_backward_times(self, g: Gemm) -> tuple[np.ndarray, np.ndarray]:
        """(data-gradient, weight-gradient) times: dX = dY W^T is M x K over N; dW = X^T dY is
        K x N over the M tokens."""
        return self.gemm_time_of(g.m, g.k, g.n, g.kind, g.count), self.gemm_time_of(g.k, g.n, g.m, g.kind, g.count)

    def attention_time(self, flops: np.ndarray, query_tokens: np.ndarray | float = np.inf, kind: str = "attention",
                       keys: float | None = None, rows: np.ndarray | float | None = None,
                       diagonal_share: np.ndarray | float = 1.0) -> np.ndarray:
        """Fused attention is compute-bound at training sequence lengths; its efficiency is
        its own curve (MoFa Fig. 10 shows it far below the GEMM roofline), lower for short
        calls (module docstring). Under a sliding window of `keys` keys the curve's length is
        min(query tokens, keys): each block of queries walks only the window's key blocks, so its
        start-up and epilogue weigh as in a call that long (FlexAttention on an H200, GPT-OSS's
        heads: a 128-token window at 16K tokens runs at 0.25 of the full causal call's rate, a
        1,024-token window at 0.73; the curve gives 0.24 and 0.73; a short call's fixed cost, as
        the 128-token window at 4K tokens pays, is not in it; calibration/kernels.py).
        The kernel's grid, `rows` (query rows x query heads of its calls on this GPU) in tiles of
        ATTENTION_QUERY_TILE rows of one head, fills waves of the SMs; its end costs about
        `attention_tail_waves` waves of tile time, whatever the waves (the causal grid's last,
        longest tiles with SMs idle): time x (1 + tail/waves). Negligible with many heads, it is
        what TP-thin calls pay (Hopper, 2-8 heads at 8K tokens: 0.45-0.85 of the rate of 32;
        the fit and its held-out chip: calibration/kernels.py). Only the causal self-attention
        calls were measured: the tail weighs on `diagonal_share` of the work, the diagonal blocks
        of a CP rank's sequence (1/ring; a rank's other blocks are rectangles of equal tiles)."""
        fused = self.eff.mode == "modified_roofline" and kind == "attention"
        half = self.eff.attention_seq_half if fused else 0.0
        length = query_tokens if keys is None else np.minimum(query_tokens, keys)
        shape = 1.0 if half == 0 else length / (length + half)
        tail = self.eff.attention_tail_waves if fused and rows is not None and self.hw.sm_count else 0.0
        if tail:
            shape = shape / (1.0 + diagonal_share * tail * ATTENTION_QUERY_TILE * self.hw.sm_count / np.maximum(rows, 1.0))
        rate = self._achieved(kind, np.full_like(flops, 1e4), shape)
        if kind == "linear_attention" and self.eff.mode == "modified_roofline":
            # a call never beats its host-side dispatch (EfficiencyProfile.linear_attention_floor_us)
            return np.maximum(flops / rate, self.eff.linear_attention_floor_us * US) + self.overhead
        return flops / rate + self.overhead

    def memory_time(self, nbytes: np.ndarray, kernels: float = 1.0, kind: str = "elementwise") -> np.ndarray:
        """Elementwise / memory-bound kernels: bytes moved at a fraction of HBM bandwidth (the
        short convolution of linear-attention layers at its own, where measured)."""
        frac = 1.0 if self.eff.mode == "roofline" else self.eff.memory_bound_fraction
        if kind == "short_conv" and self.eff.mode == "modified_roofline":
            frac = self.eff.short_conv_fraction or frac
            return nbytes / (frac * self.hbm) + kernels * self.overhead + self.eff.short_conv_call_us * US
        return nbytes / (frac * self.hbm) + kernels * self.overhead

    def memory_backward_ratio(self, kind: str) -> float:
        """Backward / forward time of a memory-bound kernel: twice the traffic for elementwise
        kernels (read the output gradient and the saved input, write the input gradient), the
        measured ratio for the short convolution."""
        measured = kind == "short_conv" and self.eff.mode == "modified_roofline"
        return self.eff.short_conv_backward_ratio if measured else 2.0
