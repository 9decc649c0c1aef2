# PyTorch's side of `bench_attention --sweep`: F.scaled_dot_product_attention alone over
# FlashAttention's benchmark grid (16k tokens, model width 2048: batch 16384 / T, heads 2048 / d),
# head dims 64 and 128, causal and not, forward and forward+backward; median us, TFLOP/s
# (4 b h T^2 d forward, half causal; backward 2.5 times that), peak allocated bytes over the
# forward+backward. One JSON object per line.
#   python3 torch_sdpa_sweep.py DTYPE [T]
import json
import statistics
import sys

import torch
import torch.nn.functional as F

dt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[sys.argv[1]]
seqs = [int(sys.argv[2])] if len(sys.argv) > 2 else [256, 512, 1024, 2048, 4096, 8192]
dev = torch.device("cuda")


def timed(step, iters=10):
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000)
    return statistics.median(ts)


for d in (64, 128):
    for causal in (False, True):
        for t in seqs:
            b, h = max(1, 16384 // t), 2048 // d
            torch.manual_seed(5)
            q, k, v = (torch.randn(b, h, t, d, device=dev, dtype=dt).requires_grad_() for _ in range(3))
            go = torch.randn(b, h, t, d, device=dev, dtype=dt)

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            def both():
                y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                torch.autograd.grad([(y * go).sum()], [q, k, v])

            f_us = timed(fwd)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fb_us = timed(both)
            peak = torch.cuda.max_memory_allocated() - base
            flops = 4.0 * b * h * t * t * d / (2 if causal else 1)
            print(json.dumps({"workload": f"SDPA-{sys.argv[1]}-d{d}-{'causal' if causal else 'full'}-T{t}",
                              "impl": "torch", "device": "cuda", "fwd_us": round(f_us, 1), "fwd_bwd_us": round(fb_us, 1),
                              "fwd_tflops": round(flops / f_us / 1e6, 1),
                              "fwd_bwd_tflops": round(3.5 * flops / fb_us / 1e6, 1), "peak_bytes": peak}), flush=True)
