"""Measure whole training steps of Llama-style models on the one GPU this runs on.

Each row is one configuration (model, sequence length, micro-batch, recompute, attention backend):
a plain PyTorch decoder (RMSNorm, fused QKV and gate/up projections, RoPE, GQA through
scaled_dot_product_attention, SwiGLU, untied or tied embeddings), fp32 parameters under bf16
autocast, fused AdamW, a cross-entropy loss on fp32 logits -- eager PyTorch, no compile, one GPU,
so the step is compute, memory-bound kernels and the optimizer, with no communication at all.
The step time is the median of CUDA-event timings of 8 steps after 3 warm-up steps; peak memory is
torch.cuda.max_memory_allocated / max_memory_reserved over the timed steps. A configuration that
runs out of memory is recorded as such (fits = 0).

Run on the GPU machine:  python3 -u bench/device/measure_steps.py --out DIR
Writes DIR/steps.csv and DIR/steps_meta.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

#: name -> (hidden, heads, kv_heads, ffn, layers, vocab, tied); Llama 3.2 1B/3B as published
#: (Hugging Face config.json of meta-llama/Llama-3.2-1B and -3B), Llama 3.1 8B cut to 4 layers
MODELS = {
    "llama3.2-1b": (2048, 32, 8, 8192, 16, 128256, True),
    "llama3.2-3b": (3072, 24, 8, 8192, 28, 128256, True),
    "llama3.1-8b-4l": (4096, 32, 8, 14336, 4, 128256, False),
}


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, h: int, nh: int, nkv: int, f: int):
        super().__init__()
        self.nh, self.nkv, self.d = nh, nkv, h // nh
        self.n1, self.n2 = nn.RMSNorm(h), nn.RMSNorm(h)
        self.wqkv = nn.Linear(h, (nh + 2 * nkv) * self.d, bias=False)
        self.wo = nn.Linear(nh * self.d, h, bias=False)
        self.w13 = nn.Linear(h, 2 * f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = self.wqkv(self.n1(x)).split([self.nh * self.d, self.nkv * self.d, self.nkv * self.d], dim=-1)
        q = rope(q.view(b, s, self.nh, self.d).transpose(1, 2), cos, sin)
        k = rope(k.view(b, s, self.nkv, self.d).transpose(1, 2), cos, sin)
        v = v.view(b, s, self.nkv, self.d).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, self.nh * self.d))
        gate, up = self.w13(self.n2(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Decoder(nn.Module):
    def __init__(self, h, nh, nkv, f, layers, vocab, tied, recompute: bool):
        super().__init__()
        self.emb = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(Block(h, nh, nkv, f) for _ in range(layers))
        self.norm = nn.RMSNorm(h)
        self.head = nn.Linear(h, vocab, bias=False)
        if tied:
            self.head.weight = self.emb.weight
        self.recompute, self.d = recompute, h // nh

    def forward(self, tokens):
        s = tokens.shape[1]
        pos = torch.arange(s, device=tokens.device, dtype=torch.float32)
        freqs = torch.outer(pos, 1.0 / (500000.0 ** (torch.arange(0, self.d, 2, device=tokens.device) / self.d)))
        cos, sin = torch.cat((freqs.cos(), freqs.cos()), -1), torch.cat((freqs.sin(), freqs.sin()), -1)
        x = self.emb(tokens)
        for blk in self.blocks:
            x = checkpoint(blk, x, cos, sin, use_reentrant=False) if self.recompute else blk(x, cos, sin)
        return self.head(self.norm(x))


def run(model_name: str, seq: int, mbs: int, recompute: bool, backend: str) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    h, nh, nkv, f, layers, vocab, tied = MODELS[model_name]
    row = dict(model=model_name, seq=seq, mbs=mbs, recompute="full" if recompute else "none", backend=backend, params=0, fits=0,
               step_ms=float("nan"), step_ms_spread=float("nan"), peak_allocated_bytes=0, peak_reserved_bytes=0, tokens_per_s=float("nan"))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = opt = None
    try:
        torch.manual_seed(0)
        with torch.device("cuda"):  # initialised on the GPU: a CPU init of billions of weights takes longer than the steps
            model = Decoder(h, nh, nkv, f, layers, vocab, tied, recompute)
        row["params"] = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        tokens = torch.randint(0, vocab, (mbs, seq + 1), device="cuda")
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        back = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

        def step():
            # the backend holds for the backward too: recompute must run the kernel the forward ran
            with sdpa_kernel([back]):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(inputs)
                loss = F.cross_entropy(logits.float().view(-1, vocab), labels.reshape(-1))
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        for _ in range(3):
            loss = step()
        if not torch.isfinite(loss):
            raise RuntimeError("non-finite loss")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(8):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        row.update(fits=1, step_ms=times[len(times) // 2], step_ms_spread=(times[-1] - times[0]) / times[len(times) // 2],
                   peak_allocated_bytes=torch.cuda.max_memory_allocated(), peak_reserved_bytes=torch.cuda.max_memory_reserved(),
                   tokens_per_s=mbs * seq / (times[len(times) // 2] * 1e-3))
    except Exception as exc:  # noqa: BLE001 -- out of memory is a measurement; anything else is reported and skipped
        if not isinstance(exc, torch.cuda.OutOfMemoryError):
            print(f"  {model_name} s{seq} b{mbs} failed: {str(exc).splitlines()[0][:200]}", flush=True)
            row["fits"] = -1
        row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        row["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    finally:
        del model, opt
        torch.cuda.empty_cache()
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--from-index", type=int, default=0, help="skip the first N configurations (resume a run)")
    p.add_argument("--budget-s", type=float, default=420, help="stop starting new configurations after this long")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    configs = []
    for name in MODELS:
        for seq in (2048, 8192):
            for mbs in (1, 4):
                for recompute in (False, True):
                    configs.append((name, seq, mbs, recompute, "flash"))
        configs += [(name, 4096, 2, False, "flash"), (name, 4096, 2, False, "cudnn"), (name, 8192, 1, False, "cudnn")]
    t0 = time.time()
    with open(os.path.join(args.out, "steps.csv"), "w", newline="") as fh:
        writer = None
        for cfg in configs[args.from_index:]:
            if time.time() - t0 > args.budget_s:
                print(f"budget spent: {cfg} and later not measured", flush=True)
                break
            row = run(*cfg)
            if writer is None:
                writer = csv.DictWriter(fh, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)
            fh.flush()
            print(f"{row['model']:16s} s{row['seq']:<5d} b{row['mbs']} {row['recompute']:4s} {row['backend']:5s} fits={row['fits']} "
                  f"step {row['step_ms']:8.1f} ms  peak {row['peak_allocated_bytes'] / 2**30:6.1f} GiB alloc {row['peak_reserved_bytes'] / 2**30:6.1f} reserved", flush=True)
    props = torch.cuda.get_device_properties(0)
    meta = {"taken_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": props.name, "memory_bytes": props.total_memory,
            "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "seconds": round(time.time() - t0, 1)}
    with open(os.path.join(args.out, "steps_meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
