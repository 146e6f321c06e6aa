"""What a transfer overlapped with computation adds to the critical path: the two forms of MoFa's
overlap equations, stated once for every feature that overlaps (TP, CP, EP, P2P, DP, offload).

Both take OverlapCoefficients: alpha slows the computation while it shares the GPU with the
transfer, beta slows the transfer (SM and memory-bandwidth contention).

- `contended` (eqs. 20-22, 34-35): the transfer and a computation it is matched with run
  side by side from start to end, so the whole computation pays alpha: the pair lasts
  max(alpha * T_comp, beta * T_comm). Used where the kernels are built to overlap as a pair
  (chunked TP GEMMs, ring attention steps, EP all-to-all beside the expert GEMMs, offload copies
  beside a layer).
- `beyond_window` (eqs. 23-24): a transfer launched asynchronously beside a window of
  computation it does not own (a gradient reduce-scatter beside the next layers' backward, a
  P2P hop beside a chunk, a TP input-gradient collective beside the wgrad GEMM): only the
  computation it actually overlaps, min(window, beta * T_comm), pays alpha, and what runs past
  the window is exposed.
"""

from __future__ import annotations

import numpy as np


def contended(t_compute, t_comm, coef) -> np.ndarray:
    """Eq. 20's overlapped region beyond the computation: max(alpha*T_c, beta*T_m) - T_c."""
    return np.maximum(coef.alpha * t_compute, coef.beta * t_comm) - t_compute


def beyond_window(t_comm, window, coef) -> np.ndarray:
    """Eq. 24's overlapped region beyond the window: the transfer lasts beta*T_m, the computation
    it overlaps, min(window, beta*T_m), is slowed by alpha; what the pair adds beyond the window
    is max(beta*T_m - window, (alpha - 1) * min(window, beta*T_m))."""
    rest = coef.beta * t_comm
    return np.maximum(rest - window, (coef.alpha - 1.0) * np.minimum(window, rest))


__all__ = ["contended", "beyond_window"]
