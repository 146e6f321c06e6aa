"""Measure the kernels of hybrid-attention layers on the one GPU this runs on.

Writes CSV tables that `calibration/kernels.py` reads for the operator classes the dense
tables (`measure_kernels.py`) do not cover:

  gdn.csv     flash-linear-attention's chunked Gated DeltaNet (`chunk_gated_delta_rule`, the
              kernel Qwen3-Next / Qwen3.5 train with: q/k L2-normalised in the kernel, chunk 64,
              grouped value heads), forward and backward, over sequence length, batch and the
              heads one TP rank holds. Each row carries the forward FLOPs the cost model counts
              (costmodel.architecture.linear_attention_block: per token and value head
              2C(d_k + d_v) + 6 d_k d_v), so its rate is the model's efficiency directly.
  conv.csv    fla's causal short convolution (width 4, SiLU) on the q, k, v channels, forward
              and backward, with the bytes it must move (a memory-bound kernel).
  window.csv  FlexAttention (torch.compile'd, what torchtitan runs GPT-OSS with) over a causal
              sliding window and the full causal mask on the same shapes, forward and backward,
              with the FLOPs of the blocks the window leaves (causal x window share).
  meta.json   device, versions, clocks before and after.

Run on the GPU machine (fla-core carried as a wheel: it is pure Python and Triton):
  python3 -u bench/device/measure_linear_attention.py --out DIR [--deadline-s 400]
Every timing is triton's do_bench median (L2 flushed before each call) on random inputs; the
Gated DeltaNet output is first checked against fla's fp32 recurrent reference on a short
sequence, the window kernel against SDPA with the same mask, so a wrong kernel is not timed.
A deadline stops between cases, keeping every row written so far.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(__file__))
from measure_kernels import Table, nvsmi, rel_err, write_meta  # noqa: E402

WARMUP_MS = 5
REP_MS = 30
CHUNK = 64  # fla's chunk for the gated delta rule


def bench_ms(fn, **kw) -> float:
    return float(do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median", **kw))


def gdn_flops(tokens: int, v_heads: int, dk: int, dv: int) -> float:
    """Forward FLOPs of the chunked delta rule as the cost model counts them."""
    return tokens * v_heads * (2.0 * CHUNK * (dk + dv) + 6.0 * dk * dv)


def gdn_inputs(b, t, h, hv, dk, dv, dev, grad=True):
    q = torch.randn(b, t, h, dk, device=dev, dtype=torch.bfloat16)
    k = torch.randn(b, t, h, dk, device=dev, dtype=torch.bfloat16)
    v = torch.randn(b, t, hv, dv, device=dev, dtype=torch.bfloat16)
    g = F.logsigmoid(torch.randn(b, t, hv, device=dev, dtype=torch.float32)).to(torch.bfloat16)
    beta = torch.rand(b, t, hv, device=dev, dtype=torch.float32).sigmoid().to(torch.bfloat16)
    for x in (q, k, v, g, beta):
        x.requires_grad_(grad)
    return q, k, v, g, beta


def gdn_check(dev) -> float:
    """chunk kernel (in-kernel L2 norm) against fla's naive fp32 recurrence, one short sequence."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    q, k, v, g, beta = gdn_inputs(1, 512, 4, 4, 128, 128, dev, grad=False)
    out, _ = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    qn, kn = F.normalize(q.float(), dim=-1), F.normalize(k.float(), dim=-1)
    ref, _ = naive_recurrent_gated_delta_rule(qn, kn, v.float(), beta.float(), g.float())
    return rel_err(out, ref)


def gdn_section(table: Table, dev, deadline: float) -> None:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    # fla 0.6 refuses its gated dq/dk/dw/dg backward kernel under Triton 3.4-3.7.0 on Hopper
    # (fla issue #640: wrong values from that compiler). The lent machine has Triton 3.6 and no
    # way to fetch 3.7.1 or tilelang, so the refusal is lifted for timing only: the backward is
    # timed as Triton 3.6 compiles it and its values are not used (meta.json says so).
    import fla.ops.common.chunk_o as chunk_o

    chunk_o.TRITON_ABOVE_3_7_1 = True
    err = gdn_check(dev)
    print(f"  gdn check against the fp32 recurrence: rel err {err:.2e}", flush=True)
    if not math.isfinite(err) or err > 3e-2:
        print("  WRONG gated delta rule: not timed", flush=True)
        return
    # Qwen3.5 / Qwen3-Next: 16 q/k heads, 32 value heads, 128 wide; TP t holds 16/t and 32/t
    # (each new shape autotunes fla's kernels, ~20 s: the list is what a 15-minute lease allows)
    cases = [(1, s, 16, 32, 128, 128) for s in (4096, 16384, 65536)]
    cases += [(4, 4096, 16, 32, 128, 128)]
    cases += [(1, 16384, 16 // t, 32 // t, 128, 128) for t in (2, 4, 8)]
    for b, s, h, hv, dk, dv in cases:
        if time.time() > deadline:
            print("  deadline: gdn stops", flush=True)
            return
        try:
            q, k, v, g, beta = gdn_inputs(b, s, h, hv, dk, dv, dev)
            run = lambda: chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]  # noqa: E731
            out = run()
            fwd = bench_ms(run)
            grad = torch.randn_like(out)
            try:
                bwd = bench_ms(lambda: out.backward(grad, retain_graph=True), grad_to_none=[q, k, v, g, beta])
            except Exception as exc:  # noqa: BLE001 -- the forward is kept
                print(f"  gdn backward failed: {str(exc).splitlines()[0][:160]}", flush=True)
                bwd = float("nan")
            flops = gdn_flops(b * s, hv, dk, dv)
            table.add(batch=b, seq=s, k_heads=h, v_heads=hv, k_dim=dk, v_dim=dv, chunk=CHUNK, fwd_flops=flops,
                      fwd_ms=fwd, bwd_ms=bwd, fwd_tflops=flops / fwd / 1e9, bwd_tflops=2.0 * flops / bwd / 1e9, check_rel_err=err)
            print(f"  gdn b{b} s{s} h{h}/{hv} d{dk}: fwd {fwd:.3f} ms bwd {bwd:.3f} ms ({flops / fwd / 1e9:.0f} TFLOP/s fwd)", flush=True)
        except Exception as exc:  # noqa: BLE001 -- a shape the kernel refuses is recorded as such
            print(f"  gdn b{b} s{s} h{h}/{hv} failed: {str(exc).splitlines()[0][:160]}", flush=True)
        finally:
            q = k = v = g = beta = out = None
            torch.cuda.empty_cache()


def conv_section(table: Table, dev, deadline: float) -> None:
    from fla.modules.causal_conv1d import causal_conv1d

    for t in (1, 8):
        for tokens in (8192, 32768):
            if time.time() > deadline:
                return
            d = 8192 // t  # q, k, v channels of Qwen3.5's GDN on one TP rank (2 x 2048 + 4096)
            try:
                x = torch.randn(1, tokens, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                w = torch.randn(d, 4, device=dev, dtype=torch.bfloat16, requires_grad=True)
                run = lambda: causal_conv1d(x, w, activation="silu")[0]  # noqa: E731
                out = run()
                ref = F.silu(F.conv1d(F.pad(x.float().transpose(1, 2), (3, 0)), w.float().unsqueeze(1), groups=d)).transpose(1, 2)
                err = rel_err(out, ref)
                if not math.isfinite(err) or err > 2e-2:
                    print(f"  WRONG conv {tokens}x{d}: {err:.2e}", flush=True)
                    continue
                fwd = bench_ms(run)
                grad = torch.randn_like(out)
                bwd = bench_ms(lambda: out.backward(grad, retain_graph=True), grad_to_none=[x, w])
                nbytes = 2.0 * 2 * tokens * d  # read x, write y (bf16)
                table.add(tokens=tokens, channels=d, width=4, fwd_bytes=nbytes, fwd_ms=fwd, bwd_ms=bwd,
                          fwd_gb_per_s=nbytes / fwd / 1e6, rel_err=err)
                print(f"  conv {tokens}x{d}: fwd {fwd:.3f} ms bwd {bwd:.3f} ms ({nbytes / fwd / 1e6:.0f} GB/s)", flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"  conv {tokens}x{d} failed: {str(exc).splitlines()[0][:160]}", flush=True)
            finally:
                x = w = out = None
                torch.cuda.empty_cache()


def window_section(table: Table, dev, deadline: float) -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # every case is a new shape and mask (dynamic=False): more recompiles than dynamo's default
    # limit of 8, past which it would fall back to eager FlexAttention, which materializes the scores
    torch._dynamo.config.recompile_limit = 64
    flex = torch.compile(flex_attention, dynamic=False)
    # GPT-OSS-120B attention: 64 q heads, 8 KV heads, head dim 64, alternating 128-token windows
    # (the longest sequence first: it is what a sliding layer saves; a 1K window last, if time allows)
    cases = [(1, s, 64 // t, 8 // t, 64, win) for t in (1, 8) for s in (16384, 4096) for win in (128, None)]
    cases += [(1, 16384, 64, 8, 64, 1024)]
    for b, s, h, kv, d, win in cases:
        if time.time() > deadline:
            print("  deadline: window stops", flush=True)
            return
        try:
            if win is None:
                mask_mod = lambda b_, h_, qi, ki: qi >= ki  # noqa: E731
                share = (s + 1) / (2.0 * s)
            else:
                mask_mod = lambda b_, h_, qi, ki, w=win: (qi >= ki) & (qi - ki < w)  # noqa: E731
                share = (win * (win + 1) / 2 + (s - win) * win) / (s * s)
            block = create_block_mask(mask_mod, None, None, s, s, device=dev)
            q = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
            k, v = (torch.randn(b, kv, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
            run = lambda: flex(q, k, v, block_mask=block, enable_gqa=True)  # noqa: E731
            out = run()
            # check the first 256 queries of head 0 against dense masked attention in fp32
            qi = torch.arange(256, device=dev)[:, None]
            ki = torch.arange(s, device=dev)[None, :]
            allowed = (qi >= ki) if win is None else (qi >= ki) & (qi - ki < win)
            scores = (q[:1, :1, :256].float() @ k[:1, :1].float().transpose(-2, -1)) / math.sqrt(d)
            ref = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v[:1, :1].float()
            err = rel_err(out[:1, :1, :256], ref)
            if not math.isfinite(err) or err > 2e-2:
                print(f"  WRONG flex {b}x{h}x{s} window={win}: {err:.2e}", flush=True)
                continue
            fwd = bench_ms(run)
            grad = torch.randn_like(out)
            bwd = bench_ms(lambda: out.backward(grad, retain_graph=True), grad_to_none=[q, k, v])
            flops = 4.0 * b * h * s * s * d * share
            try:  # the share of (q block, kv block) tiles the kernel visits: its hardware work
                density, block_size = 1.0 - float(block.sparsity()) / 100.0, int(block.BLOCK_SIZE[0])
            except Exception:  # noqa: BLE001 -- an older BlockMask without sparsity()
                density, block_size = float("nan"), 0
            table.add(batch=b, heads=h, kv_heads=kv, seq=s, head_dim=d, window=win or 0, fwd_flops=flops, fwd_ms=fwd, bwd_ms=bwd,
                      fwd_tflops=flops / fwd / 1e9, bwd_tflops=2.5 * flops / bwd / 1e9, rel_err=err,
                      block_size=block_size, block_density=density)
            print(f"  flex {b}x{h}x{s} window={win}: fwd {fwd:.3f} ms bwd {bwd:.3f} ms ({flops / fwd / 1e9:.0f} TFLOP/s fwd)", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"  flex {b}x{h}x{s} window={win} failed: {str(exc).splitlines()[0][:160]}", flush=True)
        finally:
            q = k = v = out = None
            torch.cuda.empty_cache()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--deadline-s", type=float, default=400.0, help="stop starting new cases after this many seconds")
    p.add_argument("--only", default="gdn,conv,window")
    args = p.parse_args()
    start = time.time()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(dev)
    try:
        import fla

        fla_version = getattr(fla, "__version__", "unknown")
    except Exception as exc:  # noqa: BLE001
        fla_version = f"not importable: {exc}"
    meta = {
        "taken_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": props.name,
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "fla": fla_version,
        "python": sys.version.split()[0],
        "gdn_backward": "fla's Hopper refusal (issue #640, Triton < 3.7.1) lifted for timing; backward values unchecked",
        "driver_clocks_before": nvsmi("driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu"),
        "timing": f"triton.testing.do_bench median, warmup {WARMUP_MS} ms, rep {REP_MS} ms, L2 flushed before each call",
    }
    print(json.dumps(meta), flush=True)
    sections = [
        ("gdn", ["batch", "seq", "k_heads", "v_heads", "k_dim", "v_dim", "chunk", "fwd_flops", "fwd_ms", "bwd_ms", "fwd_tflops", "bwd_tflops", "check_rel_err"], gdn_section),
        ("conv", ["tokens", "channels", "width", "fwd_bytes", "fwd_ms", "bwd_ms", "fwd_gb_per_s", "rel_err"], conv_section),
        ("window", ["batch", "heads", "kv_heads", "seq", "head_dim", "window", "fwd_flops", "fwd_ms", "bwd_ms", "fwd_tflops", "bwd_tflops", "rel_err", "block_size", "block_density"], window_section),
    ]
    deadline = start + args.deadline_s
    for name, cols, fn in sections:
        if name not in args.only.split(","):
            continue
        t0 = time.time()
        table = Table(os.path.join(args.out, f"{name}.csv"), cols)
        try:
            fn(table, dev, deadline)
        except Exception:  # noqa: BLE001 -- one broken section must not lose the others
            traceback.print_exc()
        print(f"{name}: {table.n} rows in {time.time() - t0:.0f} s", flush=True)
        meta[f"{name}_rows"] = table.n
    write_meta(meta, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
