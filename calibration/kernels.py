"""Fit the model's kernel-level terms to kernel timings measured on the GPU itself.

The step-time calibration (`calibration/fit.py`) fits a few levels to whole training runs; the
*shape* of efficiency -- how a GEMM slows down for thin shards and short reductions, how fused
attention speeds up with longer sequences, how much slower its backward is, what a
memory-bound kernel and a launch cost -- is physics of the chip that end-to-end runs can barely
separate. Those terms are fitted here to tables taken with `bench/device/measure_kernels.py`
(`calibration/kernels/<chip>/run*/`), by least squares on log time, through the cost model's own
`ComputeModel` (one implementation of eqs. 1 and 19: the fit scores exactly the formula the
model runs):

  GEMM (bf16, fp8):   T = 2MNK / min(bw * AI * B_hbm, peak_fraction * P * wave(M,N) * K/(K + k_half)) + t_launch
  fused attention:    T_fwd = F / (peak_fraction * P * L/(L + seq_half)) * (1 + tail/waves) + t_launch,
                      T_bwd = ratio * T_fwd (waves: the call's query tiles, 128 rows of a head, per SM)
  memory-bound:       T = bytes / (fraction * B_hbm) + kernels * t_launch
  Gated DeltaNet:     T_fwd = max(F / (peak_fraction * P), floor) + t_launch, T_bwd = ratio * T_fwd
                      (F: the FLOPs architecture.linear_attention_block counts; fla's chunked kernels)
  short convolution:  T_fwd = bytes / (fraction * B_hbm) + t_call + t_launch, T_bwd = ratio * T_fwd
  FlexAttention:      the fused-attention curve with its own peak_fraction (impl 'flex'); a sliding
                      window of w keys caps the curve's length at min(L, w), tested on the windowed
                      calls, which the fit never sees

The output tile (wave quantization) is chosen among the tiles cuBLAS runs on the chip by the
same criterion. GEMMs are fitted on the random (M, N, K) grid and *tested* on the layers of real
models (forward, data-gradient and weight-gradient GEMMs of Llama 3 and MPT under TP 1-8), which
the fit never saw: that error is the one to quote. The result is a small YAML file per chip,
`costmodel/presets/kernels/<chip>.yaml`, that the hardware presets start from.

Several folders may be given, each with its preset: the first is the chip's reference device
(every term it has tables for is fitted on it); a table the first lacks is taken from the next
folder that has one (the H200's short-convolution and FlexAttention tables); and every other
folder's tables are scored with the reference fit, unchanged (`transfer`): how far the terms of
one device of a chip carry to another.

Run: python -m calibration.kernels calibration/kernels/h100-sxm [calibration/kernels/h200]
         --hardware h100-sxm [h200] [--write]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares

from costmodel.compute import ComputeModel
from costmodel.presets.hardware import HARDWARE, chip_of
from costmodel.specs import HardwareSpec

ROOT = Path(__file__).resolve().parents[1]
KERNEL_PRESETS = ROOT / "costmodel" / "presets" / "kernels"
#: output tiles cuBLAS/CUTLASS run for large bf16/fp8 GEMMs on Hopper and Ampere
TILES = ((128, 128), (128, 256), (256, 128))
#: attention curves are fitted at this head dim (see fit_attention)
FIT_HEAD_DIM = 128
#: the backends of torch's scaled_dot_product_attention -> the model's attention_impl names
BACKEND_IMPL = {"flash": "sdpa", "cudnn": "te"}


@dataclass(frozen=True)
class FitQuality:
    n: int
    median_abs_pct: float
    p90_abs_pct: float

    @staticmethod
    def of(log_ratio: np.ndarray) -> "FitQuality":
        pct = np.abs(np.expm1(log_ratio)) * 100.0
        return FitQuality(int(pct.size), float(np.median(pct)), float(np.percentile(pct, 90)))

    def text(self) -> str:
        return f"median |err| {self.median_abs_pct:.1f}%, p90 {self.p90_abs_pct:.1f}% (n={self.n})"


def read_runs(folder: Path, table: str, runs: str = "run*") -> list[dict]:
    """Rows of `table` from every run folder (`runs`, a glob under `folder`), each timing the
    geometric mean over the runs that measured the same kernel (a second run is a repeat, not
    new shapes)."""
    groups: dict[tuple, list[dict]] = {}
    for run in sorted(folder.glob(runs)):
        path = run / f"{table}.csv"
        if not path.exists():
            continue
        with path.open() as f:
            for row in csv.DictReader(f):
                key = tuple((k, v) for k, v in row.items() if not k.endswith(("_ms", "tflops", "gb_per_s", "rel_err", "us_per_kernel")))
                groups.setdefault(key, []).append(row)
    out = []
    for rows in groups.values():
        merged = dict(rows[0])
        for col in rows[0]:
            if col.endswith(("_ms", "us_per_kernel")):
                merged[col] = math.exp(sum(math.log(float(r[col])) for r in rows) / len(rows))
        merged["repeats"] = len(rows)
        out.append(merged)
    return out


def run_to_run(folder: Path, table: str, col: str) -> FitQuality:
    """The spread between repeated runs of the same kernels: the floor under any fit error."""
    groups: dict[tuple, list[float]] = {}
    for run in sorted(folder.glob("run*")):
        with (run / f"{table}.csv").open() as f:
            for row in csv.DictReader(f):
                key = tuple((k, v) for k, v in row.items() if not k.endswith(("_ms", "tflops", "gb_per_s", "rel_err")))
                groups.setdefault(key, []).append(float(row[col]))
    pairs = [v for v in groups.values() if len(v) >= 2]
    return FitQuality.of(np.array([math.log(v[1] / v[0]) for v in pairs]))


def _with(hw: HardwareSpec, **efficiency) -> HardwareSpec:
    data = hw.model_dump()
    for key, value in efficiency.items():
        data["efficiency"][key] = value
    return HardwareSpec.model_validate(data)


# --------------------------------------------------------------------------------------------
# GEMMs
# --------------------------------------------------------------------------------------------
def gemm_predict(hw: HardwareSpec, dtype: str, m, n, k, peak_fraction, bw_fraction, k_half, tile, overhead_us) -> np.ndarray:
    curve = {"peak_fraction": float(peak_fraction), "bandwidth_fraction": float(bw_fraction)}
    spec = _with(hw, mode="modified_roofline", gemm_k_half=float(k_half), gemm_tile=tile, kernel_overhead_us=float(overhead_us),
                 **{"fp8_gemm" if dtype == "fp8" else "gemm": curve})
    comp = ComputeModel(spec, dtype, 1 if dtype == "fp8" else 2)
    return comp.gemm_time_of(np.asarray(m, float), np.asarray(n, float), np.asarray(k, float))


#: the GEMM model's shape terms, each switched on or off: (k_half fitted, output tile or None)
GEMM_FORMS: dict[str, tuple[bool, tuple[int, int] | None]] = {
    "roofline": (False, None),
    "roofline+k_half": (True, None),
    **{f"roofline+wave{t[0]}x{t[1]}": (False, t) for t in TILES},
    **{f"roofline+k_half+wave{t[0]}x{t[1]}": (True, t) for t in TILES},
}


def _gemm_columns(rows: list[dict]) -> tuple[np.ndarray, ...]:
    return tuple(np.array([float(r[c]) for r in rows]) for c in ("m", "n", "k")) + (np.array([float(r["time_ms"]) for r in rows]) * 1e-3,)


def _fit_form(hw: HardwareSpec, dtype: str, rows: list[dict], form: str) -> tuple[np.ndarray, float]:
    """Least squares on log time of one form: x = (peak_fraction, bandwidth_fraction, launch_us[, k_half])."""
    with_k, tile = GEMM_FORMS[form]
    m, n, k, t = _gemm_columns(rows)

    def predict(x, m, n, k):
        return gemm_predict(hw, dtype, m, n, k, x[0], x[1], x[3] if with_k else 0.0, tile, x[2])

    x0, lo, hi = [0.7, 0.7, 5.0] + [128.0] * with_k, [0.2, 0.1, 0.0] + [0.0] * with_k, [1.0, 1.0, 50.0] + [8192.0] * with_k
    sol = least_squares(lambda x: np.log(predict(x, m, n, k) / t), x0=x0, bounds=(lo, hi))
    return sol.x, predict


def _family(row: dict) -> str:
    return row["label"].split(".")[0]


def fit_gemm(hw: HardwareSpec, rows: list[dict], dtype: str) -> dict:
    """Choose the GEMM form and fit it.

    Every form is scored by leave-one-model-out cross-validation on the layers of real models:
    fitted on the random (M, N, K) grid plus the layers of all other models, it predicts the
    forward, data-gradient and weight-gradient GEMMs of the held-out model (Llama 3 8B/70B/405B,
    MPT-7B/30B under TP 1-8). The form with the lowest cross-validated median error is refitted
    on everything; its cross-validated error is the figure to quote."""
    grid = [r for r in rows if r["dtype"] == dtype and r["label"] == "grid"]
    layers = [r for r in rows if r["dtype"] == dtype and r["label"] != "grid"]
    families = sorted({_family(r) for r in layers})
    scores: dict[str, tuple[FitQuality, np.ndarray]] = {}
    for form in GEMM_FORMS:
        held = np.empty(len(layers))
        for fam in families:
            train = grid + [r for r in layers if _family(r) != fam]
            test_idx = [i for i, r in enumerate(layers) if _family(r) == fam]
            x, predict = _fit_form(hw, dtype, train, form)
            m, n, k, t = _gemm_columns([layers[i] for i in test_idx])
            held[test_idx] = np.log(predict(x, m, n, k) / t)
        scores[form] = (FitQuality.of(held), held)
    best = min(scores, key=lambda f: scores[f][0].median_abs_pct)
    x, predict = _fit_form(hw, dtype, grid + layers, best)
    with_k, tile = GEMM_FORMS[best]
    m, n, k, t = _gemm_columns(grid + layers)
    held = scores[best][1]
    return {
        "form": best,
        "peak_fraction": float(x[0]),
        "bandwidth_fraction": float(x[1]),
        "overhead_us": float(x[2]),
        "k_half": float(x[3]) if with_k else 0.0,
        "tile": list(tile) if tile else None,
        "fit": FitQuality.of(np.log(predict(x, m, n, k) / t)),
        "cross_validated_layers": scores[best][0],
        "forms": {f: q for f, (q, _) in scores.items()},
        "by_pass": {p[1:]: FitQuality.of(held[np.array([r["label"].endswith(p) for r in layers])]) for p in (".fwd", ".dgrad", ".wgrad")},
    }


# --------------------------------------------------------------------------------------------
# Fused attention
# --------------------------------------------------------------------------------------------
def attention_predict(hw: HardwareSpec, flops, seq, peak_fraction, seq_half, overhead_us, tail=0.0, rows=None) -> np.ndarray:
    spec = _with(hw, mode="modified_roofline", attention={"peak_fraction": float(peak_fraction), "bandwidth_fraction": 0.8},
                 attention_seq_half=float(seq_half), attention_tail_waves=float(tail), kernel_overhead_us=float(overhead_us))
    return ComputeModel(spec, "bf16", 2).attention_time(np.asarray(flops, float), np.asarray(seq, float),
                                                        rows=None if rows is None else np.asarray(rows, float))


def query_rows(rs: list[dict]) -> np.ndarray:
    """Query rows x query heads of each call (batch x heads x sequence): the kernel's grid."""
    return np.array([float(r["batch"]) * float(r["heads"]) * float(r["seq"]) for r in rs])


def fit_attention(hw: HardwareSpec, rows: list[dict], overhead_us: float) -> dict:
    """Per backend: peak_fraction, seq_half and the grid's tail (in waves) of the causal forward at
    head dim 128 (the training case: Llama, Qwen, Mixtral, DeepSeek's MLA heads are wider still),
    over every head count (TP-thin calls of 2-8 heads leave the grid a few waves, whose tail the
    third term is); one backward/forward ratio for the backends the model names (the profile has
    one). The TP-thin calls' error is reported apart, with the fit and with a fit that has no tail
    term (what the model had before it). What the model has no term for is reported apart, not
    fitted: non-causal calls, and head dim 64."""
    out: dict = {"backends": {}}
    ratios = []
    for backend in sorted({r["backend"] for r in rows}):
        causal = [r for r in rows if r["backend"] == backend and int(r["causal"]) and int(r["head_dim"]) == FIT_HEAD_DIM]
        rs = [r for r in causal if int(r["heads"]) >= 16]
        thin = [r for r in causal if int(r["heads"]) < 16]
        full = [r for r in rows if r["backend"] == backend and not int(r["causal"])]
        other_dims = [r for r in rows if r["backend"] == backend and int(r["heads"]) >= 16 and int(r["causal"]) and int(r["head_dim"]) != FIT_HEAD_DIM]
        col = lambda rs_, c: np.array([float(r[c]) for r in rs_])  # noqa: E731
        flops, seq, fwd = col(causal, "fwd_flops"), col(causal, "seq"), col(causal, "fwd_ms") * 1e-3
        grid = query_rows(causal)
        sol = least_squares(lambda x: np.log(attention_predict(hw, flops, seq, x[0], x[1], overhead_us, x[2], grid) / fwd),
                            x0=[0.5, 512.0, 1.0], bounds=([0.02, 0.0, 0.0], [1.0, 16384.0, 64.0]))
        # the same fit without the tail term, on the calls of 16 heads or more (the model before it)
        wide = np.array([int(r["heads"]) >= 16 for r in causal])
        plain = least_squares(lambda x: np.log(attention_predict(hw, flops[wide], seq[wide], x[0], x[1], overhead_us) / fwd[wide]),
                              x0=[0.5, 512.0], bounds=([0.02, 0.0], [1.0, 16384.0]))
        bwd = col(rs, "bwd_ms") / col(rs, "fwd_ms")
        ratio = float(np.exp(np.median(np.log(bwd))))
        if backend in BACKEND_IMPL:
            ratios.append(np.log(bwd))

        def err(rs_, x=sol.x):
            tail = x[2] if len(x) > 2 else 0.0
            return FitQuality.of(np.log(attention_predict(hw, col(rs_, "fwd_flops"), col(rs_, "seq"), x[0], x[1], overhead_us, tail, query_rows(rs_))
                                        / (col(rs_, "fwd_ms") * 1e-3))) if rs_ else None

        by_dim = {int(d): err([r for r in other_dims if r["head_dim"] == d]) for d in sorted({r["head_dim"] for r in other_dims})}
        out["backends"][backend] = {
            "impl": BACKEND_IMPL.get(backend),
            "peak_fraction": float(sol.x[0]),
            "seq_half": float(sol.x[1]),
            "tail_waves": float(sol.x[2]),
            "backward_ratio_median": ratio,
            "fit": err(rs),
            "few_heads": err(thin),
            "few_heads_without_tail": err(thin, plain.x),
            "other_head_dims_not_modelled": by_dim,
            "non_causal_not_modelled": err(full),
        }
    all_ratios = np.concatenate(ratios)
    out["backward_ratio"] = float(np.exp(np.median(all_ratios)))
    out["backward_fit"] = FitQuality.of(all_ratios - np.log(out["backward_ratio"]))
    return out


def fit_grouped(hw: HardwareSpec, rows: list[dict], bf16: dict) -> dict | None:
    """MoE expert GEMMs (torch._grouped_mm, one launch for all experts): the grouped-GEMM peak
    fraction, with the bandwidth fraction and launch floor of the plain GEMMs."""
    if not rows:
        return None
    e, tok, k, n = (np.array([float(r[c]) for r in rows]) for c in ("experts", "tokens_per_expert", "k", "n"))
    t = np.array([float(r["time_ms"]) for r in rows]) * 1e-3

    def predict(frac):
        spec = _with(hw, mode="modified_roofline", gemm_k_half=0.0, gemm_tile=None, kernel_overhead_us=bf16["overhead_us"],
                     grouped_gemm={"peak_fraction": float(frac), "bandwidth_fraction": bf16["bandwidth_fraction"]})
        return ComputeModel(spec, "bf16", 2).gemm_time_of(tok, n, k, "grouped_gemm", e)

    sol = least_squares(lambda x: np.log(predict(x[0]) / t), x0=[0.6], bounds=([0.05], [1.0]))
    return {"peak_fraction": float(sol.x[0]), "fit": FitQuality.of(sol.fun)}


# --------------------------------------------------------------------------------------------
# Linear attention (Gated DeltaNet)
# --------------------------------------------------------------------------------------------
#: calls with at least this many tokens x value heads set the backward ratio (see fit_linear_attention)
LINEAR_RATIO_MIN_WORK = 16384 * 32


def linear_attention_predict(hw: HardwareSpec, flops, peak_fraction, floor_us, overhead_us) -> np.ndarray:
    spec = _with(hw, mode="modified_roofline", linear_attention={"peak_fraction": float(peak_fraction), "bandwidth_fraction": 0.8},
                 linear_attention_floor_us=float(floor_us), kernel_overhead_us=float(overhead_us))
    return ComputeModel(spec, "bf16", 2).attention_time(np.asarray(flops, float), kind="linear_attention")


def fit_linear_attention(hw: HardwareSpec, rows: list[dict], overhead_us: float) -> dict | None:
    """flash-linear-attention's chunked Gated DeltaNet (bench/device/measure_linear_attention.py):
    the forward's peak fraction at the FLOPs the model counts and its per-call floor (fla
    dispatches ~10 Triton kernels a call from Python: a call with little GPU work waits on that),
    both by least squares on log time over every row; the backward/forward ratio from the calls
    with at least 16K tokens x 32 value heads (Qwen3.5's heads on one rank), where the GPU work
    dominates. Reported apart, not fitted: the backward of the smaller calls, whose ratio ranges
    2-6 (TP-thin calls of 2-8 value heads leave most SMs idle in the sequential state pass)."""
    if not rows:
        return None
    col = lambda rs_, c: np.array([float(r[c]) for r in rs_])  # noqa: E731
    work = lambda r: int(r["batch"]) * int(r["seq"]) * int(r["v_heads"])  # noqa: E731
    flops, fwd = col(rows, "fwd_flops"), col(rows, "fwd_ms") * 1e-3
    sol = least_squares(lambda x: np.log(linear_attention_predict(hw, flops, x[0], x[1], overhead_us) / fwd),
                        x0=[0.1, 300.0], bounds=([0.005, 0.0], [1.0, 5000.0]))
    large = [r for r in rows if work(r) >= LINEAR_RATIO_MIN_WORK]
    small = [r for r in rows if work(r) < LINEAR_RATIO_MIN_WORK]
    ratios = np.log(col(large, "bwd_ms") / col(large, "fwd_ms"))
    ratio = float(np.exp(np.median(ratios)))

    def backward_err(rs_):
        if not rs_:
            return None
        return FitQuality.of(np.log(ratio * linear_attention_predict(hw, col(rs_, "fwd_flops"), *sol.x, overhead_us) / (col(rs_, "bwd_ms") * 1e-3)))

    return {
        "peak_fraction": float(sol.x[0]),
        "floor_us": float(sol.x[1]),
        "backward_ratio": ratio,
        "fit": FitQuality.of(sol.fun),
        "backward_fit": backward_err(large),
        "small_calls_backward_not_modelled": backward_err(small),
    }


# --------------------------------------------------------------------------------------------
# Memory-bound kernels and the launch floor
# --------------------------------------------------------------------------------------------
KERNELS_PER_OP = {"copy": 1, "add": 1, "layer_norm": 1, "silu_mul": 2}


def fit_memory(hw: HardwareSpec, rows: list[dict], overhead_us: float) -> dict:
    nbytes = np.array([float(r["bytes"]) for r in rows])
    kernels = np.array([KERNELS_PER_OP[r["kernel"]] for r in rows], float)
    t = np.array([float(r["time_ms"]) for r in rows]) * 1e-3

    def predict(frac):
        spec = _with(hw, mode="modified_roofline", memory_bound_fraction=float(frac), kernel_overhead_us=overhead_us)
        return ComputeModel(spec, "bf16", 2).memory_time(nbytes, kernels)

    sol = least_squares(lambda x: np.log(predict(x[0]) / t), x0=[0.75], bounds=([0.2], [1.0]))
    return {"fraction": float(sol.x[0]), "fit": FitQuality.of(sol.fun)}


# --------------------------------------------------------------------------------------------
# Short convolution and FlexAttention sliding windows (the hybrid-attention tables)
# --------------------------------------------------------------------------------------------
def short_conv_predict(hw: HardwareSpec, nbytes, fraction, call_us, overhead_us) -> np.ndarray:
    spec = _with(hw, mode="modified_roofline", short_conv_fraction=float(fraction), short_conv_call_us=float(call_us),
                 kernel_overhead_us=float(overhead_us))
    return ComputeModel(spec, "bf16", 2).memory_time(np.asarray(nbytes, float), kind="short_conv")


def fit_short_conv(hw: HardwareSpec, rows: list[dict], overhead_us: float) -> dict | None:
    """fla's causal short convolution (width 4, SiLU) as a memory-bound kernel of its own: the
    HBM fraction of its forward (the bytes it must move: read x, write y) and a per-call cost
    beyond them (fla dispatches its kernels from Python: at 8K tokens x 8,192 channels the call
    takes 2.5 times its bytes' time at the fitted fraction), by least squares on log time over every call, and its
    backward/forward ratio (the median). The residual of the TP-thin calls (1,024 channels),
    whose time follows the tokens more than the bytes, is reported apart."""
    if not rows:
        return None
    col = lambda rs_, c: np.array([float(r[c]) for r in rs_])  # noqa: E731
    nbytes, fwd = col(rows, "fwd_bytes"), col(rows, "fwd_ms") * 1e-3
    sol = least_squares(lambda x: np.log(short_conv_predict(hw, nbytes, x[0], x[1], overhead_us) / fwd), x0=[0.5, 50.0], bounds=([0.02, 0.0], [1.0, 2000.0]))
    ratio = float(np.exp(np.median(np.log(col(rows, "bwd_ms") / col(rows, "fwd_ms")))))
    thin = np.array([int(r["channels"]) < 4096 for r in rows])
    backward = np.log(ratio * short_conv_predict(hw, nbytes, *sol.x, overhead_us) / (col(rows, "bwd_ms") * 1e-3))
    return {
        "fraction": float(sol.x[0]),
        "call_us": float(sol.x[1]),
        "backward_ratio": ratio,
        "fit": FitQuality.of(sol.fun),
        "fit_thin_calls": FitQuality.of(sol.fun[thin]) if thin.any() else None,
        "backward_fit": FitQuality.of(backward),
    }


def window_predict(hw: HardwareSpec, flops, seq, keys, peak_fraction, seq_half, overhead_us, tail=0.0, rows=None) -> np.ndarray:
    spec = _with(hw, mode="modified_roofline", attention={"peak_fraction": float(peak_fraction), "bandwidth_fraction": 0.8},
                 attention_seq_half=float(seq_half), attention_tail_waves=float(tail), kernel_overhead_us=float(overhead_us))
    comp = ComputeModel(spec, "bf16", 2)
    rows = [None] * len(flops) if rows is None else rows
    return np.array([comp.attention_time(np.array([f]), float(s), keys=k, rows=g)[0] for f, s, k, g in zip(flops, seq, keys, rows)])


#: how a sliding window could set the attention curve's length: the model's rule first
WINDOW_RULES = {
    "min(L, w)": lambda seq, w: np.minimum(seq, w),
    "L (no window term)": lambda seq, w: seq,
    "min(L, 2w)": lambda seq, w: np.minimum(seq, 2 * w),
}


def fit_window(hw: HardwareSpec, rows: list[dict], seq_half: float, overhead_us: float, tail: float = 0.0) -> dict | None:
    """FlexAttention (bench/device/measure_linear_attention.py's window table): its peak fraction
    from the full causal calls with at least 16 heads, at the profile's seq_half and grid tail
    (one each per profile); then the *held-out* sliding-window calls (at least 16 heads)
    predicted under each way a window could set the curve's length (WINDOW_RULES; the model's is
    min(L, w)). Its backward/forward ratio is reported, not fitted (the profile has one for every
    implementation). Reported apart, held out too: calls of 8 heads or fewer (TP-thin), whose
    grid tail comes from the other backends' fit."""
    if not rows:
        return None
    col = lambda rs_, c: np.array([float(r[c]) for r in rs_])  # noqa: E731
    wide = [r for r in rows if int(r["heads"]) >= 16]
    full = [r for r in wide if int(r["window"]) == 0]
    windowed = [r for r in wide if int(r["window"]) > 0]
    few = [r for r in rows if int(r["heads"]) < 16]
    sol = least_squares(lambda x: np.log(window_predict(hw, col(full, "fwd_flops"), col(full, "seq"), [None] * len(full), x[0], seq_half, overhead_us,
                                                        tail, query_rows(full)) / (col(full, "fwd_ms") * 1e-3)), x0=[0.4], bounds=([0.02], [1.0]))
    frac = float(sol.x[0])

    def err(rs_, rule):
        keys = [None if int(r["window"]) == 0 else float(WINDOW_RULES[rule](float(r["seq"]), float(r["window"]))) for r in rs_]
        return FitQuality.of(np.log(window_predict(hw, col(rs_, "fwd_flops"), col(rs_, "seq"), keys, frac, seq_half, overhead_us, tail, query_rows(rs_))
                                    / (col(rs_, "fwd_ms") * 1e-3)))

    keys = [float(min(float(r["seq"]), float(r["window"]))) for r in windowed]
    predicted = window_predict(hw, col(windowed, "fwd_flops"), col(windowed, "seq"), keys, frac, seq_half, overhead_us, tail, query_rows(windowed))
    return {
        "peak_fraction": frac,
        "seq_half": seq_half,
        "tail_waves": tail,
        "fit": FitQuality.of(sol.fun),
        "held_out_windows": {rule: err(windowed, rule) for rule in WINDOW_RULES},
        # (heads, seq, window, predicted / measured) of each held-out call under the model's rule
        "held_out_rows": [(int(r["heads"]), int(r["seq"]), int(r["window"]), float(p / (float(r["fwd_ms"]) * 1e-3)))
                          for r, p in zip(windowed, predicted)],
        "backward_ratio_median": float(np.exp(np.median(np.log(col(wide, "bwd_ms") / col(wide, "fwd_ms"))))),
        "few_heads": err(few, "min(L, w)") if few else None,
    }


def fit_chip(folder: Path, hw: HardwareSpec) -> dict:
    gemm_rows = read_runs(folder, "gemm")
    bf16 = fit_gemm(hw, gemm_rows, "bf16")
    fp8 = fit_gemm(hw, gemm_rows, "fp8") if any(r["dtype"] == "fp8" for r in gemm_rows) else None
    overhead = bf16["overhead_us"]
    meta = json.loads(next(iter(sorted(folder.glob("run*/meta.json")))).read_text())
    # the hybrid-attention kernels (bench/device/measure_linear_attention.py) are a folder of their own
    linear_rows = read_runs(folder, "gdn", runs="linear_attention")
    attention = fit_attention(hw, read_runs(folder, "attention"), overhead)
    seq_half, tail = profile_seq_half(attention), profile_tail_waves(attention)
    return {
        "folder": str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder),
        "device": meta["device"],
        "taken_utc": sorted(json.loads(p.read_text())["taken_utc"] for p in [*folder.glob("run*/meta.json"), *folder.glob("linear_attention/meta.json")]),
        "software": f"torch {meta['torch']}, CUDA {meta['cuda']}, cuDNN {meta['cudnn']}",
        "gemm_bf16": bf16,
        "gemm_fp8": fp8,
        "grouped_gemm": fit_grouped(hw, read_runs(folder, "grouped_gemm"), bf16),
        "attention": attention,
        "memory": fit_memory(hw, read_runs(folder, "memory"), overhead),
        "linear_attention": fit_linear_attention(hw, linear_rows, overhead),
        "attention_seq_half": seq_half,
        "attention_tail_waves": tail,
        **fit_hybrid(folder, hw, seq_half, overhead, tail),
        "repeat_spread_gemm": run_to_run(folder, "gemm", "time_ms"),
    }


def fit_hybrid(folder: Path, hw: HardwareSpec, seq_half: float, overhead_us: float, tail: float) -> dict:
    """The short-convolution and FlexAttention terms from a folder's linear_attention/ tables,
    at a profile's seq_half, grid tail and launch floor (the reference device's, where they come
    from another device of the chip)."""
    return {
        "short_conv": fit_short_conv(hw, read_runs(folder, "conv", runs="linear_attention"), overhead_us),
        "flex_attention": fit_window(hw, read_runs(folder, "window", runs="linear_attention"), seq_half, overhead_us, tail),
    }


def profile_seq_half(attention: dict) -> float:
    """One seq_half per profile: the geometric mean of the implementations' the model names."""
    halves = [b["seq_half"] for b in attention["backends"].values() if b["impl"]]
    return round(float(np.exp(np.mean(np.log(np.maximum(halves, 1.0))))), 1)


def profile_tail_waves(attention: dict) -> float:
    """One grid tail per profile, as seq_half: the geometric mean of the implementations' the
    model names."""
    tails = [b["tail_waves"] for b in attention["backends"].values() if b["impl"]]
    return round(float(np.exp(np.mean(np.log(np.maximum(tails, 1e-3))))), 3)


def transfer(ref: dict, folder: Path, hw: HardwareSpec) -> dict:
    """Another device's tables scored with the reference fit's terms, unchanged (its own datasheet
    peaks and HBM bandwidth): GEMMs (every row), grouped GEMMs, causal attention at head dim 128
    per backend the model names (calls of 16 heads or more, and the TP-thin ones apart), memory-bound
    kernels, Gated DeltaNet."""
    col = lambda rs_, c: np.array([float(r[c]) for r in rs_])  # noqa: E731
    out: dict = {"folder": str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder), "hardware": hw.name}
    gemm_rows = read_runs(folder, "gemm")
    for dtype in ("bf16", "fp8"):
        g, rows = ref[f"gemm_{dtype}"], [r for r in gemm_rows if r["dtype"] == dtype]
        if not g or not rows:
            continue
        m, n, k, t = _gemm_columns(rows)
        pred = gemm_predict(hw, dtype, m, n, k, g["peak_fraction"], g["bandwidth_fraction"], g["k_half"], tuple(g["tile"]) if g["tile"] else None, g["overhead_us"])
        out[f"gemm_{dtype}"] = FitQuality.of(np.log(pred / t))
        # the rows the roofline puts under the bandwidth ceiling: the HBM-bound share of the GEMMs
        intensity = 2.0 * m * n * k / ((m * k + k * n + m * n) * (1 if dtype == "fp8" else 2))
        bound = intensity * hw.memory_bandwidth_gb_per_s * 1e9 * g["bandwidth_fraction"] < hw.peak(dtype) * 1e12 * g["peak_fraction"]
        out[f"gemm_{dtype}_bandwidth_bound"] = FitQuality.of(np.log(pred / t)[bound]) if bound.any() else None
    overhead = ref["gemm_bf16"]["overhead_us"]
    for backend, b in ref["attention"]["backends"].items():
        causal = [r for r in read_runs(folder, "attention") if r["backend"] == backend and int(r["causal"]) and int(r["head_dim"]) == FIT_HEAD_DIM]
        for key, rows in ((f"attention_{backend}", [r for r in causal if int(r["heads"]) >= 16]),
                          (f"attention_{backend}_few_heads", [r for r in causal if int(r["heads"]) < 16])):
            if b["impl"] and rows:
                out[key] = FitQuality.of(np.log(attention_predict(hw, col(rows, "fwd_flops"), col(rows, "seq"), b["peak_fraction"], b["seq_half"], overhead,
                                                                  b["tail_waves"], query_rows(rows)) / (col(rows, "fwd_ms") * 1e-3)))
    rows = read_runs(folder, "memory")
    if rows:
        kernels = np.array([KERNELS_PER_OP[r["kernel"]] for r in rows], float)
        spec = _with(hw, mode="modified_roofline", memory_bound_fraction=ref["memory"]["fraction"], kernel_overhead_us=overhead)
        out["memory"] = FitQuality.of(np.log(ComputeModel(spec, "bf16", 2).memory_time(col(rows, "bytes"), kernels) / (col(rows, "time_ms") * 1e-3)))
    la, rows = ref.get("linear_attention"), read_runs(folder, "gdn", runs="linear_attention")
    if la and rows:
        out["gated_deltanet"] = FitQuality.of(np.log(linear_attention_predict(hw, col(rows, "fwd_flops"), la["peak_fraction"], la["floor_us"], overhead)
                                                     / (col(rows, "fwd_ms") * 1e-3)))
    return out


def fit_devices(folders: list[Path], hws: list[HardwareSpec]) -> dict:
    """The reference device's fit (the first folder), with the hybrid-attention terms it has no
    tables for taken from the next folder that has them (at the reference's seq_half and launch
    floor), and every other folder's tables scored with the result (`transfer`)."""
    fit = fit_chip(folders[0], hws[0])
    rel = lambda f: str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f)  # noqa: E731
    borrowed = []
    for folder, hw in zip(folders[1:], hws[1:]):
        other = fit_hybrid(folder, hw, fit["attention_seq_half"], fit["gemm_bf16"]["overhead_us"], fit["attention_tail_waves"])
        for key, value in other.items():
            if fit[key] is None and value is not None:
                fit[key] = {**value, "from": rel(folder)}
                meta = json.loads((folder / "linear_attention" / "meta.json").read_text())
                borrowed.append(f"{key} from {rel(folder)} ({meta['device']}, {meta['taken_utc']})")
    fit["transfer"] = [transfer(fit, folder, hw) for folder, hw in zip(folders[1:], hws[1:])]
    fit["folders"] = [rel(f) for f in folders]
    fit["borrowed_text"] = "".join(f"; {b}" for b in borrowed)
    return fit


def profile_fields(fit: dict) -> dict:
    """The EfficiencyProfile fields the kernel fit fixes (the rest stay with the preset)."""
    bf16, fp8, att = fit["gemm_bf16"], fit["gemm_fp8"], fit["attention"]
    fields = {
        "gemm": {"peak_fraction": round(bf16["peak_fraction"], 4), "bandwidth_fraction": round(bf16["bandwidth_fraction"], 4)},
        "gemm_k_half": round(bf16["k_half"], 1),
        "gemm_tile": bf16["tile"],
        "kernel_overhead_us": round(bf16["overhead_us"], 2),
        "attention_backward_ratio": round(att["backward_ratio"], 3),
        "memory_bound_fraction": round(fit["memory"]["fraction"], 4),
        "attention_impls": {},
    }
    if fit["grouped_gemm"]:
        fields["grouped_gemm"] = {"peak_fraction": round(fit["grouped_gemm"]["peak_fraction"], 4), "bandwidth_fraction": round(bf16["bandwidth_fraction"], 4)}
    if fit.get("linear_attention"):
        la = fit["linear_attention"]
        fields["linear_attention"] = {"peak_fraction": round(la["peak_fraction"], 4), "bandwidth_fraction": 0.8}
        fields["linear_attention_floor_us"] = round(la["floor_us"], 1)
        fields["linear_attention_backward_ratio"] = round(la["backward_ratio"], 3)
    if fp8:
        fields["fp8_gemm"] = {"peak_fraction": round(fp8["peak_fraction"], 4), "bandwidth_fraction": round(fp8["bandwidth_fraction"], 4)}
    for b in att["backends"].values():
        if b["impl"]:
            fields["attention_impls"][b["impl"]] = {"peak_fraction": round(b["peak_fraction"], 4), "bandwidth_fraction": 0.8}
    if fit.get("flex_attention"):
        fields["attention_impls"]["flex"] = {"peak_fraction": round(fit["flex_attention"]["peak_fraction"], 4), "bandwidth_fraction": 0.8}
    fields["attention_seq_half"] = profile_seq_half(att)
    fields["attention_tail_waves"] = profile_tail_waves(att)
    if fit.get("short_conv"):
        fields["short_conv_fraction"] = round(fit["short_conv"]["fraction"], 4)
        fields["short_conv_call_us"] = round(fit["short_conv"]["call_us"], 1)
        fields["short_conv_backward_ratio"] = round(fit["short_conv"]["backward_ratio"], 3)
    return fields


def _plain(obj):
    if isinstance(obj, FitQuality):
        return {"n": obj.n, "median_abs_pct": round(obj.median_abs_pct, 2), "p90_abs_pct": round(obj.p90_abs_pct, 2)}
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, float):
        return round(obj, 6)
    return obj


def report(fit: dict) -> str:
    lines = [f"kernel fit for {fit['device']} ({fit['software']}), tables in {fit['folder']}",
             f"  repeat-to-repeat spread of the same GEMMs: {fit['repeat_spread_gemm'].text()}"]
    for dtype in ("bf16", "fp8"):
        g = fit[f"gemm_{dtype}"]
        if not g:
            continue
        lines += [f"  GEMM {dtype}: form {g['form']}: peak_fraction {g['peak_fraction']:.3f}, bandwidth_fraction {g['bandwidth_fraction']:.3f}, k_half {g['k_half']:.0f}, tile {g['tile']}, launch {g['overhead_us']:.2f} us",
                  f"    in sample (grid + layers): {g['fit'].text()}",
                  f"    cross-validated on the layers of a held-out model: {g['cross_validated_layers'].text()}",
                  "      by pass: " + ", ".join(f"{p} {q.text()}" for p, q in g["by_pass"].items()),
                  "    forms compared (cross-validated median/p90 |err|): " + ", ".join(f"{f} {q.median_abs_pct:.1f}/{q.p90_abs_pct:.1f}%" for f, q in g["forms"].items())]
    if fit["grouped_gemm"]:
        lines.append(f"  grouped GEMM (MoE experts): peak_fraction {fit['grouped_gemm']['peak_fraction']:.3f}; fit {fit['grouped_gemm']['fit'].text()}")
    att = fit["attention"]
    for name, b in att["backends"].items():
        lines.append(f"  attention {name} (impl {b['impl']}): peak_fraction {b['peak_fraction']:.3f}, seq_half {b['seq_half']:.0f}, "
                     f"tail {b['tail_waves']:.2f} waves, bwd/fwd {b['backward_ratio_median']:.2f}; causal fit, 16+ heads {b['fit'].text()}")
        if b["few_heads"]:
            lines.append(f"    2-8 heads per call (in the fit): {b['few_heads'].text()}; without the tail term {b['few_heads_without_tail'].text()}")
        for d, q in b["other_head_dims_not_modelled"].items():
            lines.append(f"    not modelled, head dim {d}: {q.text()}")
        if b["non_causal_not_modelled"]:
            lines.append(f"    not modelled, non-causal: {b['non_causal_not_modelled'].text()}")
    lines.append(f"  attention backward/forward {att['backward_ratio']:.2f}: {att['backward_fit'].text()}")
    lines.append(f"  memory-bound fraction {fit['memory']['fraction']:.3f}: {fit['memory']['fit'].text()}")
    la = fit.get("linear_attention")
    if la:
        lines.append(f"  Gated DeltaNet (fla chunked): peak_fraction {la['peak_fraction']:.4f}, per-call floor {la['floor_us']:.0f} us, "
                     f"bwd/fwd {la['backward_ratio']:.2f}; forward fit {la['fit'].text()}, backward of the large calls {la['backward_fit'].text()}")
        if la["small_calls_backward_not_modelled"]:
            lines.append(f"    not modelled, the backward of calls under 16K tokens x 32 value heads: {la['small_calls_backward_not_modelled'].text()}")
    conv = fit.get("short_conv")
    if conv:
        lines.append(f"  short convolution (fla causal_conv1d, width 4): HBM fraction {conv['fraction']:.3f}, per call {conv['call_us']:.0f} us, "
                     f"bwd/fwd {conv['backward_ratio']:.2f}; forward fit {conv['fit'].text()}, backward {conv['backward_fit'].text()}")
        if conv["fit_thin_calls"]:
            lines.append(f"    of which the 1,024-channel calls (TP 8): {conv['fit_thin_calls'].text()}")
    flex = fit.get("flex_attention")
    if flex:
        lines.append(f"  FlexAttention (impl flex, head dim 64): peak_fraction {flex['peak_fraction']:.3f} at seq_half {flex['seq_half']:.0f} "
                     f"and tail {flex['tail_waves']:.2f} waves, "
                     f"bwd/fwd {flex['backward_ratio_median']:.2f}; full causal fit {flex['fit'].text()}")
        lines.append("    held-out sliding windows, by the curve length a window sets: "
                     + ", ".join(f"{rule} {q.text()}" for rule, q in flex["held_out_windows"].items()))
        lines.append("    each under min(L, w), predicted / measured: "
                     + ", ".join(f"{h} heads x {s} tokens, window {w}: {x:.2f}" for h, s, w, x in flex["held_out_rows"]))
        if flex["few_heads"]:
            lines.append(f"    held out, 8 heads or fewer per call (the tail from the fused backends): {flex['few_heads'].text()}")
    for t in fit.get("transfer", []):
        lines.append(f"  {t['folder']} ({t['hardware']}) scored with these terms, unchanged:")
        lines += [f"    {key}: {q.text()}" for key, q in t.items() if isinstance(q, FitQuality)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m calibration.kernels", description=__doc__.splitlines()[0])
    p.add_argument("folders", type=Path, nargs="+", help="folders of run*/ tables from bench/device/measure_kernels.py, "
                   "the chip's reference device first (module docstring)")
    p.add_argument("--hardware", required=True, nargs="+", help="the preset of each folder, whose datasheet peaks its tables are scored against")
    p.add_argument("--write", action="store_true", help=f"write {KERNEL_PRESETS.relative_to(ROOT)}/<chip>.yaml")
    args = p.parse_args(argv)
    for name in args.hardware:
        if name not in HARDWARE:
            print(f"--hardware: unknown preset {name!r}", file=sys.stderr)
            return 2
    if len(args.hardware) != len(args.folders):
        print(f"--hardware: {len(args.hardware)} presets for {len(args.folders)} folders", file=sys.stderr)
        return 2
    hws = [HARDWARE[name] for name in args.hardware]
    if len({chip_of(hw) for hw in hws}) > 1:
        print(f"--hardware: {', '.join(args.hardware)} are not one chip", file=sys.stderr)
        return 2
    fit = fit_devices([f.resolve() for f in args.folders], hws)
    print(report(fit))
    hw = hws[0]
    if args.write:
        from mofa.atomic import write_atomically  # noqa: PLC0415 -- only the writer needs it

        chip = chip_of(hw)
        doc = {
            "chip": chip,
            "source": f"kernel timings on one {fit['device']} ({fit['software']}), {', '.join(fit['taken_utc'])}, "
                      f"tables {fit['folder']}{fit['borrowed_text']}, fitted by python -m calibration.kernels "
                      f"{' '.join(fit['folders'])} --hardware {' '.join(args.hardware)}",
            "efficiency": profile_fields(fit),
            "fit": _plain({k: v for k, v in fit.items() if k not in ("folder", "folders", "device", "software", "taken_utc", "borrowed_text")}),
        }
        KERNEL_PRESETS.mkdir(parents=True, exist_ok=True)
        write_atomically(str(KERNEL_PRESETS / f"{chip}.yaml"), "# written by python -m calibration.kernels; do not edit by hand\n" + yaml.safe_dump(doc, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
