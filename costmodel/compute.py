"""Operator latency: MoFa eq. 1 (T = S^comp / P^comp) with P^comp from one of three models.

  * 'roofline' (eq. 19): P = min(AI * B_hbm, P_peak)
  * 'modified_roofline': eq. 19 scaled by efficiencies (the lambda^comp of eq. 17):
        P = min(bw_fraction * AI * B_hbm, peak_fraction * P_peak)
  * 'profiled': measured (arithmetic intensity, TFLOP/s) points, interpolated in log(AI).
Every kernel also pays `kernel_overhead_us` (launch and tail), which is what makes many
small GEMMs (tiny experts, large TP) slower than their FLOPs suggest.
"""

from __future__ import annotations

import numpy as np

from costmodel.architecture import Gemm
from costmodel.specs import Curve, HardwareSpec
from costmodel.units import GB, TFLOP, US


class ComputeModel:
    def __init__(self, hw: HardwareSpec, compute_dtype: str, dtype_bytes: int):
        self.hw = hw
        self.eff = hw.efficiency
        self.peak = hw.peak(compute_dtype) * TFLOP
        self.hbm = hw.memory_bandwidth_gb_per_s * GB
        self.dtype_bytes = dtype_bytes
        self.overhead = self.eff.kernel_overhead_us * US
        self._tables = {
            kind: (np.log(np.array([p[0] for p in pts])), np.array([p[1] for p in pts]) * TFLOP)
            for kind, pts in self.eff.profiled.items()
            if pts
        }

    def _achieved(self, kind: str, intensity: np.ndarray) -> np.ndarray:
        """Achieved FLOP/s for an operator class at an arithmetic intensity (FLOP/byte)."""
        mode = self.eff.mode
        if mode == "profiled" and kind in self._tables:
            log_ai, flops = self._tables[kind]
            return np.interp(np.log(np.maximum(intensity, 1e-9)), log_ai, flops)
        curve: Curve = getattr(self.eff, kind)
        if mode == "roofline":
            return np.minimum(intensity * self.hbm, self.peak)
        return np.minimum(curve.bandwidth_fraction * intensity * self.hbm, curve.peak_fraction * self.peak)

    def gemm_time(self, g: Gemm) -> np.ndarray:
        """Forward time of a GEMM (or of all GEMMs of a grouped GEMM). Arithmetic intensity is
        that of one GEMM: 2MNK / (bytes of A, B and C)."""
        m = np.maximum(g.m, 1e-9)
        one = 2.0 * m * g.n * g.k
        moved = self.dtype_bytes * (m * g.k + g.k * g.n + m * g.n)
        rate = self._achieved(g.kind, one / moved)
        return g.flops / rate + self.overhead

    def attention_time(self, flops: np.ndarray) -> np.ndarray:
        """Fused attention is compute-bound at training sequence lengths; its efficiency is
        its own curve (MoFa Fig. 10 shows it far below the GEMM roofline)."""
        rate = self._achieved("attention", np.full_like(flops, 1e4))
        return flops / rate + self.overhead

    def memory_time(self, nbytes: np.ndarray, kernels: float = 1.0) -> np.ndarray:
        """Elementwise / memory-bound kernels: bytes moved at a fraction of HBM bandwidth."""
        frac = 1.0 if self.eff.mode == "roofline" else self.eff.memory_bound_fraction
        return nbytes / (frac * self.hbm) + kernels * self.overhead
