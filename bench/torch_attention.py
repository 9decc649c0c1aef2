# PyTorch's side of bench_attention: the same transformer block (pre-norm, qkv projection, causal
# attention, output projection, layer_norm, GELU MLP; batch 16, 4 heads of 64) forward + backward
# of every parameter, with F.scaled_dot_product_attention (is_causal=True), and the attention
# alone. float32, median us per step, peak allocated bytes over a step. One JSON object per line.
#   python3 torch_attention.py DEVICE SEQ ITERS
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
T = int(sys.argv[2]) if len(sys.argv) > 2 else 256
iters = int(sys.argv[3]) if len(sys.argv) > 3 else 10
B, H, D = 16, 4, 64
C = H * D
torch.manual_seed(3)


def param(*shape, scale, shift=0.0):
    return (torch.randn(*shape) * scale + shift).to(dev).requires_grad_()


P = [param(C, scale=0.02, shift=1), param(C, scale=0.02), param(C, 3 * C, scale=1 / math.sqrt(C)),
     param(3 * C, scale=0.02), param(C, C, scale=1 / math.sqrt(C)), param(C, scale=0.02),
     param(C, scale=0.02, shift=1), param(C, scale=0.02), param(C, 4 * C, scale=1 / math.sqrt(C)),
     param(4 * C, scale=0.02), param(4 * C, C, scale=1 / math.sqrt(4 * C)), param(C, scale=0.02)]
x = torch.randn(B, T, C, device=dev)


def block_loss(x):
    h = F.layer_norm(x, (C,), P[0], P[1])
    q, k, v = (h @ P[2] + P[3]).chunk(3, -1)
    heads = lambda z: z.reshape(B, T, H, D).transpose(1, 2)
    a = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True).transpose(1, 2).reshape(B, T, C)
    x1 = x + a @ P[4] + P[5]
    h2 = F.layer_norm(x1, (C,), P[6], P[7])
    out = x1 + F.gelu(h2 @ P[8] + P[9]) @ P[10] + P[11]
    return out.square().mean()


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(step):
    for _ in range(2):
        step()
    sync()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        sync()
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts)


def peak(step):
    step()
    sync()
    if dev.type != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    step()
    sync()
    return torch.cuda.max_memory_allocated() - start


def block_step():
    return torch.autograd.grad(block_loss(x), P)


q, k, v = (torch.randn(B, H, T, D, device=dev).requires_grad_() for _ in range(3))
go = torch.randn(B, H, T, D, device=dev)


def sdpa_step():
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return torch.autograd.grad((y * go).sum(), (q, k, v))


row = {"workload": f"TBLOCK-T{T}", "impl": "torch-eager-sdpa", "device": dev.type, "us": timed(block_step)}
pb = peak(block_step)
if pb is not None:
    row["peak_bytes"] = pb
print(json.dumps(row))
print(json.dumps({"workload": f"SDPA-T{T}", "impl": "torch-sdpa", "device": dev.type, "us": timed(sdpa_step)}))
