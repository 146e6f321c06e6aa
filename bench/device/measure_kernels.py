"""Measure the kernels the cost model times, on the one GPU this runs on.

Writes CSV tables (one row per measured kernel call, times are medians of CUDA-event timings
after warm-up, with the L2 cache flushed before every timed call by triton's do_bench) that
`calibration/kernels.py` fits the model's shape terms to:

  gemm.csv        bf16 and fp8 GEMMs over a grid of (M, N, K) output x reduction shapes, the
                  layouts a Linear layer runs (forward x W^T, data gradient dY W, weight gradient
                  dY^T X); fp8 through torch._scaled_mm with per-tensor scales (torchao's
                  tensorwise recipe and cuBLASLt's fp8 path, which Transformer Engine also uses)
  grouped_gemm.csv  MoE expert GEMMs through torch._grouped_mm (one launch for all experts)
  attention.csv   scaled_dot_product_attention forward and backward per backend (flash = the
                  FlashAttention-2 kernels PyTorch ships; cudnn = cuDNN's fused attention, the one
                  Transformer Engine calls; efficient = the memory-efficient kernel), causal and not
  memory.csv      memory-bound kernels (copy, add, layer norm, SiLU x gate) in bytes moved
  launch.csv      back-to-back tiny kernels: the per-kernel floor (launch + tail)
  meta.json       device, driver, library versions, clocks before and after

Run on the GPU machine:  python3 -u bench/device/measure_kernels.py --out DIR [--quick]
Inputs are random normal (never zeros: they run faster than real data); every output is checked
against a float32 reference on a slice, so a wrong kernel cannot be timed.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from triton.testing import do_bench

WARMUP_MS = 5
REP_MS = 20


class Table:
    """A CSV file written row by row (flushed), so a killed run keeps what it measured."""

    def __init__(self, path: str, columns: list[str]):
        self.f = open(path, "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=columns)
        self.w.writeheader()
        self.n = 0

    def add(self, **row):
        self.w.writerow(row)
        self.f.flush()
        self.n += 1


def bench_ms(fn, **kw) -> float:
    return float(do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median", **kw))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().float(), ref.detach().float()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def nvsmi(query: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:  # noqa: BLE001 -- recorded, not fatal
        return f"unavailable: {e}"


# ---------------------------------------------------------------------------------------------
# GEMMs
# ---------------------------------------------------------------------------------------------
SIZES = [256, 512, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 8192, 12288, 16384, 28672]


def gemm_shapes(quick: bool, seed: int = 20261123) -> list[tuple[int, int, int]]:
    """A fixed random sample of (M, N, K) from SIZES^3 between 1e8 and 3e13 FLOPs, plus the
    square cube; deterministic so reruns measure the same shapes."""
    rng = random.Random(seed)
    cube = [(m, n, k) for m in SIZES for n in SIZES for k in SIZES if 1e8 <= 2 * m * n * k <= 3e13]
    rng.shuffle(cube)
    take = cube[: 60 if quick else 420]
    squares = [(s, s, s) for s in SIZES if 2 * s**3 <= 3e13]
    return sorted(set(take + squares))


def transformer_shapes() -> list[tuple[str, int, int, int]]:
    """(name, tokens, out_features, in_features) of the Linear layers of real models under TP
    (Llama 3.1 8B/70B/405B, MPT-7B/30B, Mixtral/DeepSeek experts)."""
    models = {  # hidden, ffn (per gate/up), q+kv out features of the fused QKV
        "llama8b": (4096, 14336, 4096 + 2 * 1024),
        "llama70b": (8192, 28672, 8192 + 2 * 1024),
        "llama405b": (16384, 53248, 16384 + 2 * 1024),
        "mpt7b": (4096, 16384, 3 * 4096),
        "mpt30b": (7168, 28672, 3 * 7168),
    }
    out = []
    for name, (h, ffn, qkv) in models.items():
        for tp in (1, 2, 4, 8):
            if h >= 16384 and tp < 8:
                continue
            for tokens in (2048, 8192, 16384):
                out += [
                    (f"{name}.qkv.tp{tp}", tokens, qkv // tp, h),
                    (f"{name}.proj.tp{tp}", tokens, h, h // tp),
                    (f"{name}.fc1.tp{tp}", tokens, 2 * ffn // tp, h),
                    (f"{name}.fc2.tp{tp}", tokens, h, ffn // tp),
                ]
    return out


def gemm_section(out_dir: str, quick: bool, table: Table, dev) -> None:
    has_fp8 = hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")
    one = torch.ones((), device=dev, dtype=torch.float32)

    def run_shape(m, n, k, layout: str, dtype: str, label: str):
        """layout 'linear' = x[M,K] W[N,K]^T (forward), 'nn' = dY[M,K'] W (data gradient),
        'tn' = dY^T X (weight gradient): the output is M x N over a reduction of K in all."""
        try:
            if dtype == "bf16":
                if layout == "linear":
                    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                    b = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
                    fn = lambda: F.linear(a, b)  # noqa: E731
                    ref = lambda: a[:64].float() @ b.float().t()  # noqa: E731
                elif layout == "nn":
                    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                    b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
                    fn = lambda: torch.mm(a, b)  # noqa: E731
                    ref = lambda: a[:64].float() @ b.float()  # noqa: E731
                else:  # tn: a is stored K x M (tokens major) and used transposed
                    a = torch.randn(k, m, device=dev, dtype=torch.bfloat16)
                    b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
                    fn = lambda: torch.mm(a.t(), b)  # noqa: E731
                    ref = lambda: a.t()[:64].float() @ b.float()  # noqa: E731
                err = rel_err(fn()[:64], ref())
                tol = 2e-2
            else:
                if not has_fp8 or m % 16 or n % 16 or k % 16:
                    return
                a = (torch.randn(m, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
                w = (torch.randn(n, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
                fast = layout == "linear"  # torchao: fast accumulation for the forward only
                fn = lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast)  # noqa: E731
                ref = lambda: a[:64].float() @ w.float().t()  # noqa: E731
                err = rel_err(fn()[:64], ref())
                tol = 2e-2
            if not math.isfinite(err) or err > tol:
                print(f"  WRONG {label} {dtype} {m}x{n}x{k}: rel err {err:.2e}", flush=True)
                return
            ms = bench_ms(fn)
            table.add(dtype=dtype, layout=layout, label=label, m=m, n=n, k=k, flops=2.0 * m * n * k, time_ms=ms, tflops=2.0 * m * n * k / ms / 1e9, rel_err=err)
            del a
        except torch.cuda.OutOfMemoryError:
            print(f"  OOM {label} {m}x{n}x{k}", flush=True)
        finally:
            torch.cuda.empty_cache()

    shapes = gemm_shapes(quick)
    t0 = time.time()
    for dtype in ("bf16", "fp8"):
        for m, n, k in shapes:
            run_shape(m, n, k, "linear", dtype, "grid")
        print(f"  gemm grid {dtype}: {len(shapes)} shapes, {time.time() - t0:.0f} s", flush=True)
    layers = transformer_shapes()[: 24 if quick else None]
    for dtype in ("bf16", "fp8"):
        for name, tokens, out_f, in_f in layers:
            run_shape(tokens, out_f, in_f, "linear", dtype, name + ".fwd")
            run_shape(tokens, in_f, out_f, "nn", dtype, name + ".dgrad")
            run_shape(out_f, in_f, tokens, "tn", dtype, name + ".wgrad")
        print(f"  gemm layers {dtype}: {len(layers)} layers, {time.time() - t0:.0f} s", flush=True)


def grouped_gemm_section(table: Table, dev, quick: bool) -> None:
    if not hasattr(torch, "_grouped_mm"):
        print("  torch._grouped_mm missing: grouped GEMMs not measured", flush=True)
        return
    cases = [(e, t, k, n) for e in (8, 32, 128) for t in (128, 512, 2048) for (k, n) in ((2048, 768), (7168, 2048), (4096, 14336), (2048, 1536))]
    if quick:
        cases = cases[:8]
    for e, t, k, n in cases:
        if e * t * k * n * 2 > 3e13:
            continue
        try:
            a = torch.randn(e * t, k, device=dev, dtype=torch.bfloat16)
            b = torch.randn(e, n, k, device=dev, dtype=torch.bfloat16).transpose(-2, -1)  # E x K x N, column-major per group
            offs = torch.arange(t, e * t + 1, t, device=dev, dtype=torch.int32)
            fn = lambda: torch._grouped_mm(a, b, offs=offs)  # noqa: E731
            out = fn()
            err = rel_err(out[:64], a[:64].float() @ b[0].float())
            if not math.isfinite(err) or err > 2e-2:
                print(f"  WRONG grouped {e}x{t} {k}->{n}: {err:.2e}", flush=True)
                continue
            ms = bench_ms(fn)
            flops = 2.0 * e * t * k * n
            table.add(experts=e, tokens_per_expert=t, k=k, n=n, flops=flops, time_ms=ms, tflops=flops / ms / 1e9, rel_err=err)
        except Exception as exc:  # noqa: BLE001 -- an unsupported layout is recorded and skipped
            print(f"  grouped {e}x{t} {k}->{n} failed: {str(exc).splitlines()[0][:160]}", flush=True)
        finally:
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------
def attention_section(table: Table, dev, quick: bool) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    seqs = [512, 1024, 2048, 4096, 8192, 16384, 32768]
    cases = []
    for d in (128, 64):
        for s in seqs:
            heads = 16 if d == 128 else 32
            batch = max(1, 16384 // s)
            for causal in (True, False):
                if not causal and s > 8192:
                    continue
                cases.append((batch, heads, s, d, causal))
    for heads in (2, 4, 8, 32, 64):  # TP/CP-thin calls: few heads of one sequence
        cases.append((1, heads, 8192, 128, True))
    gqa = [(2, 64, 4096, 128, True, 8), (1, 64, 8192, 128, True, 8), (1, 32, 16384, 128, True, 8)]  # Llama-style 8 KV heads
    if quick:
        cases = cases[::4]
    cases = [c + (c[1],) for c in cases] + gqa
    for name, backend in backends.items():
        for b, h, s, d, causal, kv_heads in cases:
            try:
                q = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                k, v = (torch.randn(b, kv_heads, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
                gqa_kw = {"enable_gqa": True} if kv_heads != h else {}
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa_kw)
                    # check on the first 256 queries of head 0 against an fp32 reference
                    qs, ks, vs = (x[:1, :1].float() for x in (q, k, v))
                    scores = (qs[..., :256, :] @ ks.transpose(-2, -1)) / math.sqrt(d)
                    if causal:
                        scores = scores.masked_fill(torch.ones(256, s, device=dev, dtype=torch.bool).triu(1), float("-inf"))
                    ref = torch.softmax(scores, -1) @ vs
                    err = rel_err(out[:1, :1, :256], ref)
                    if not math.isfinite(err) or err > 2e-2:
                        print(f"  WRONG attention {name} {b}x{h}x{s}x{d} causal={causal}: {err:.2e}", flush=True)
                        continue
                    fwd = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa_kw))
                    grad = torch.randn_like(out)
                    bwd = bench_ms(lambda: out.backward(grad, retain_graph=True), grad_to_none=[q, k, v])
                # forward FLOPs: QK^T and PV, 4 b h s^2 d, half of it under a causal mask
                flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                table.add(backend=name, batch=b, heads=h, kv_heads=kv_heads, seq=s, head_dim=d, causal=int(causal), fwd_flops=flops, fwd_ms=fwd, bwd_ms=bwd, fwd_tflops=flops / fwd / 1e9, bwd_tflops=2.5 * flops / bwd / 1e9, rel_err=err)
            except Exception as exc:  # noqa: BLE001 -- a backend that refuses a shape is recorded as such
                print(f"  attention {name} {b}x{h}x{s}x{d} causal={causal} failed: {str(exc).splitlines()[0][:160]}", flush=True)
            finally:
                q = k = v = out = None
                torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Memory-bound kernels and the launch floor
# ---------------------------------------------------------------------------------------------
def memory_section(table: Table, dev) -> None:
    for mib in (4, 16, 64, 256, 1024):
        n = mib * 2**20 // 2  # bf16 elements
        x = torch.randn(n, device=dev, dtype=torch.bfloat16)
        y = torch.randn(n, device=dev, dtype=torch.bfloat16)
        o = torch.empty_like(x)
        rows = n // 4096
        x2 = x.view(rows, 4096)
        w = torch.ones(4096, device=dev, dtype=torch.bfloat16)
        kernels = {
            "copy": (lambda: o.copy_(x), 2 * 2 * n),
            "add": (lambda: torch.add(x, y, out=o), 3 * 2 * n),
            "layer_norm": (lambda: F.layer_norm(x2, (4096,), w, w), 2 * 2 * n),
            "silu_mul": (lambda: F.silu(x) * y, 4 * 2 * n),  # two kernels: silu writes, mul reads it back
        }
        for name, (fn, nbytes) in kernels.items():
            ms = bench_ms(fn)
            table.add(kernel=name, mib=mib, bytes=nbytes, time_ms=ms, gb_per_s=nbytes / ms / 1e6)
        del x, y, o
        torch.cuda.empty_cache()


def launch_section(table: Table, dev) -> None:
    x = torch.randn(16, device=dev)
    for count in (100, 1000):
        torch.cuda.synchronize()
        for _ in range(50):
            x.add_(1.0)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(count):
            x.add_(1.0)
        end.record()
        torch.cuda.synchronize()
        table.add(kind="eager_add", count=count, us_per_kernel=start.elapsed_time(end) * 1e3 / count)
    for s in (64, 128, 256):
        a = torch.randn(s, s, device=dev, dtype=torch.bfloat16)
        table.add(kind=f"gemm_{s}", count=1, us_per_kernel=bench_ms(lambda: a @ a) * 1e3)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="a small subset of every table (a smoke run)")
    p.add_argument("--only", default="launch,memory,gemm,grouped,attention")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(dev)
    meta = {
        "taken_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": props.name,
        "sm_count": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": sys.version.split()[0],
        "driver_clocks_before": nvsmi("driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu"),
        "timing": f"triton.testing.do_bench median, warmup {WARMUP_MS} ms, rep {REP_MS} ms, L2 flushed before each call",
    }
    only = set(args.only.split(","))
    sections = [
        ("launch", ["kind", "count", "us_per_kernel"], launch_section),
        ("memory", ["kernel", "mib", "bytes", "time_ms", "gb_per_s"], memory_section),
        ("gemm", ["dtype", "layout", "label", "m", "n", "k", "flops", "time_ms", "tflops", "rel_err"], None),
        ("grouped", ["experts", "tokens_per_expert", "k", "n", "flops", "time_ms", "tflops", "rel_err"], None),
        ("attention", ["backend", "batch", "heads", "kv_heads", "seq", "head_dim", "causal", "fwd_flops", "fwd_ms", "bwd_ms", "fwd_tflops", "bwd_tflops", "rel_err"], None),
    ]
    for name, cols, fn in sections:
        if name not in only:
            continue
        t0 = time.time()
        fname = {"grouped": "grouped_gemm"}.get(name, name)
        table = Table(os.path.join(args.out, f"{fname}.csv"), cols)
        try:
            if name == "gemm":
                gemm_section(args.out, args.quick, table, dev)
            elif name == "grouped":
                grouped_gemm_section(table, dev, args.quick)
            elif name == "attention":
                attention_section(table, dev, args.quick)
            else:
                fn(table, dev)
        except Exception:  # noqa: BLE001 -- one broken section must not lose the others
            traceback.print_exc()
        print(f"{name}: {table.n} rows in {time.time() - t0:.0f} s", flush=True)
        meta[f"{name}_rows"] = table.n
    write_meta(meta, args.out)
    print(json.dumps(meta, indent=1))
    return 0


def write_meta(meta: dict, out_dir: str) -> None:
    """meta.json of a run: what main gathered, with the clocks read at its end."""
    meta["driver_clocks_after"] = nvsmi("driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu")
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
