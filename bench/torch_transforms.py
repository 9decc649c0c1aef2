# PyTorch's side of bench_transforms: the same 4-layer tanh MLP (batch B, width W, float32) and
# its mean-squared loss; forward, torch.func.jvp, the loss's gradient (torch.func.vjp) and its
# Hessian-vector product (torch.func.jvp of torch.func.grad), eager and under torch.compile,
# median us per call. One JSON object per line.
#   python3 torch_transforms.py DEVICE B W ITERS
import json
import math
import statistics
import sys
import time

import torch

dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu")
B = int(sys.argv[2]) if len(sys.argv) > 2 else 256
W = int(sys.argv[3]) if len(sys.argv) > 3 else 256
iters = int(sys.argv[4]) if len(sys.argv) > 4 else 30
torch.manual_seed(5)
params = []
for _ in range(4):
    params.append((torch.randn(W, W) / math.sqrt(W)).to(dev))
    params.append((torch.randn(W) * 0.1).to(dev))
x, t, y = (torch.randn(B, W).to(dev) for _ in range(3))


def mlp(h):
    for l in range(4):
        h = torch.tanh(h @ params[2 * l] + params[2 * l + 1])
    return h


def loss(h):
    return ((mlp(h) - y) ** 2).mean()


rows = {
    "forward": lambda x, t: mlp(x),
    "jvp": lambda x, t: torch.func.jvp(mlp, (x,), (t,))[1],
    "grad": lambda x, t: torch.func.vjp(loss, x)[1](torch.ones((), device=dev))[0],
    "hvp": lambda x, t: torch.func.jvp(torch.func.grad(loss), (x,), (t,))[1],
}


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


for name, fn in rows.items():
    for mode in ("eager", "compiled"):
        f = fn
        if mode == "compiled":
            try:
                f = torch.compile(fn)
                f(x, t)
            except Exception as e:  # reported, not hidden
                print(json.dumps({"impl": "torch", "row": name, "mode": mode, "error": str(e)[:200]}))
                continue
        for _ in range(3):
            f(x, t)
        sync()
        ts = []
        for _ in range(iters):
            a = time.perf_counter()
            f(x, t)
            sync()
            ts.append((time.perf_counter() - a) * 1e6)
        print(json.dumps({"impl": "torch", "row": name, "mode": mode, "device": dev.type, "batch": B, "width": W,
                          "median_us": round(statistics.median(ts), 1), "min_us": round(min(ts), 1)}), flush=True)
