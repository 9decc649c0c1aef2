# PyTorch's side of bench/run.sh --device cuda: the same workloads as bench/bench_cuda.cpp, in
# eager mode and under torch.compile, on the same GPU in the same call. One JSON object a line.
import json
import statistics
import sys
import time

import torch

iters = int(sys.argv[1]) if len(sys.argv) > 1 else 20
dev = "cuda"


def time_us(step, warm=3):
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    t = []
    for _ in range(iters):
        a = time.perf_counter()
        step()
        torch.cuda.synchronize()
        t.append((time.perf_counter() - a) * 1e6)
    return statistics.median(t)


def row(w, impl, us, nbytes=0):
    r = {"workload": w, "impl": impl, "us": round(us, 2)}
    if nbytes:
        r["gbs"] = round(nbytes / us / 1e3, 1)
    print(json.dumps(r), flush=True)


def w1_step(p, v, g, k=0.5, c=0.1, dt=0.01):
    a = g - p * k - v * c
    v2 = v + a * dt
    p2 = p + v2 * dt
    return p2, v2, (v2 * v2).sum() * 0.5


n = 4 << 20
torch.manual_seed(1)
p = torch.randn(n, 3, device=dev)
v = torch.randn(n, 3, device=dev)
g = torch.tensor([0.0, -9.81, 0.0], device=dev)
nbytes = 4.0 * n * 3 * 4
row("W1", "torch-eager", time_us(lambda: w1_step(p, v, g)), nbytes)
cw1 = torch.compile(w1_step)
row("W1", "torch-compile", time_us(lambda: cw1(p, v, g)), nbytes)
pc, vc = torch.empty_like(p), torch.empty_like(v)
row("W1", "torch-copy", time_us(lambda: (pc.copy_(p), vc.copy_(v))), nbytes)


def w3_forward(x, w, b):
    return torch.softmax(torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, 1e-5)), -1)


rows, cols = 8192, 1024
torch.manual_seed(2)
x = torch.randn(rows, cols, device=dev)
w = torch.randn(cols, device=dev) * 0.1 + 1
b = torch.randn(cols, device=dev) * 0.1
gy = torch.randn(rows, cols, device=dev)
fbytes = 2.0 * rows * cols * 4
row("W3F", "torch-eager", time_us(lambda: w3_forward(x, w, b)), fbytes)
cw3 = torch.compile(w3_forward)
row("W3F", "torch-compile", time_us(lambda: cw3(x, w, b)), fbytes)


def fb(fwd):
    def step():
        xl, wl, bl = (t.detach().requires_grad_() for t in (x, w, b))
        loss = (fwd(xl, wl, bl) * gy).sum()
        return torch.autograd.grad(loss, (xl, wl, bl))
    return step


row("W3B", "torch-eager", time_us(fb(w3_forward)))
row("W3B", "torch-compile", time_us(fb(cw3)))
print(json.dumps({"workload": "memory", "torch_peak_allocated_mib": round(torch.cuda.max_memory_allocated() / 1048576, 1)}))
