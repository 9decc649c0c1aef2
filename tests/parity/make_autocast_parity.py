"""Generates tests/parity/autocast_parity.jsonl: the dtype PyTorch's autocast gives each op's
result, per device type (cpu, cuda) and autocast dtype (bfloat16, float16), for inputs of
float32, of the autocast dtype, and mixed. Run where torch (2.x) and a CUDA device are present:

    python3 tests/parity/make_autocast_parity.py > tests/parity/autocast_parity.jsonl

Each line: {"device": "cuda", "autocast": "bfloat16", "op": "matmul", "inputs": ["float32",
"bfloat16"], "out": "bfloat16", "torch": "2.11.0"}. Ops whose PyTorch call fails for a dtype
combination are left out. The kiln test (tests/test_autocast.cpp) runs the same op under
kiln::autocast and compares the result dtype.
"""
import json
import sys

import torch
import torch.nn.functional as F

D = 8


def t(dtype, device, shape=(D, D)):
    g = torch.Generator().manual_seed(0)
    return (torch.rand(shape, generator=g) + 0.5).to(device=device, dtype=dtype)


def targets(device):
    return torch.randint(0, D, (D,), device=device)


# op name -> (number of float tensor inputs, function of those tensors)
OPS = {
    "matmul": (2, lambda a, b: a @ b),
    "mm": (2, lambda a, b: torch.mm(a, b)),
    "bmm": (2, lambda a, b: torch.bmm(a.unsqueeze(0), b.unsqueeze(0))),
    "baddbmm": (3, lambda c, a, b: torch.baddbmm(c.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0))),
    "addmm": (3, lambda c, a, b: torch.addmm(c, a, b)),
    "linear": (3, lambda x, w, b: F.linear(x, w, b[0])),
    "scaled_dot_product_attention": (
        3, lambda q, k, v: F.scaled_dot_product_attention(q[None, None], k[None, None], v[None, None])),
    "conv2d": (2, lambda x, w: F.conv2d(x[None, None], w[None, None, :3, :3])),
    "softmax": (1, lambda x: torch.softmax(x, -1)),
    "log_softmax": (1, lambda x: torch.log_softmax(x, -1)),
    "layer_norm": (3, lambda x, w, b: F.layer_norm(x, (D,), w[0], b[0])),
    "exp": (1, torch.exp),
    "log": (1, torch.log),
    "pow": (1, lambda x: torch.pow(x, 2.5)),
    "rsqrt": (1, torch.rsqrt),
    "sum": (1, lambda x: torch.sum(x)),
    "prod": (1, lambda x: torch.prod(x, 0)),
    "cumsum": (1, lambda x: torch.cumsum(x, 0)),
    "mse_loss": (2, lambda a, b: F.mse_loss(a, b)),
    "cross_entropy": (1, lambda x: F.cross_entropy(x, targets(x.device))),
    "nll_loss": (1, lambda x: F.nll_loss(x, targets(x.device))),
    "norm": (1, lambda x: torch.norm(x)),
    "add": (2, lambda a, b: a + b),
    "mul": (2, lambda a, b: a * b),
    "relu": (1, torch.relu),
    "gelu": (1, F.gelu),
    "tanh": (1, torch.tanh),
    "mean": (1, lambda x: x.mean()),
    "cat": (2, lambda a, b: torch.cat([a, b])),
    "stack": (2, lambda a, b: torch.stack([a, b])),
    "where": (2, lambda a, b: torch.where(a > 1.0, a, b)),
    "embedding": (1, lambda w: F.embedding(targets(w.device), w)),
}


def main():
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        for ac in (torch.bfloat16, torch.float16):
            for name, (n, fn) in OPS.items():
                combos = [[torch.float32] * n, [ac] * n]
                if n >= 2:
                    combos.append([torch.float32] + [ac] * (n - 1))
                for combo in combos:
                    try:
                        xs = [t(d, device) for d in combo]
                        with torch.autocast(device_type=device, dtype=ac):
                            out = fn(*xs)
                    except Exception:
                        continue
                    row = {"device": device, "autocast": str(ac).split(".")[-1], "op": name,
                           "inputs": [str(d).split(".")[-1] for d in combo], "out": str(out.dtype).split(".")[-1],
                           "torch": torch.__version__.split("+")[0]}
                    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
