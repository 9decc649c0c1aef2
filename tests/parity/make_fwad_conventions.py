#!/usr/bin/env python3
"""Generates tests/parity/fwad_conventions.json: at points where an op is not differentiable,
PyTorch's forward-mode derivative (torch.func.jvp) and its gradient along the same direction
(autograd's grad . v), in float64, for tests/test_forward_ad.cpp
(JvpRules.NonDifferentiablePointsFollowTheGradientConvention). Each case is a scalar function of
one 4-vector x; the direction is v.
    python3 tests/parity/make_fwad_conventions.py tests/parity/fwad_conventions.json
"""
import json
import sys

import torch

D = torch.float64
zero = torch.zeros(4, dtype=D)
same = torch.full((4,), 1.5, dtype=D)
ties = torch.tensor([2.0, 2.0, -1.0, 2.0], dtype=D)
at_bounds = torch.tensor([-1.0, 0.5, 1.0, 3.0], dtype=D)
other = torch.tensor([2.0, 1.0, -1.0, 5.0], dtype=D)  # ties with `ties` at 0 and 2
v = torch.tensor([0.3, -0.7, 1.1, 0.2], dtype=D)

cases = {
    "norm(p=2) at 0": (lambda a: torch.linalg.vector_norm(a, 2), zero),
    "norm(p=3) at 0": (lambda a: torch.linalg.vector_norm(a, 3), zero),
    "norm(p=0.5) at 0": (lambda a: torch.linalg.vector_norm(a, 0.5), zero),
    "std(correction=0) of equal values": (lambda a: torch.std(a, 0, correction=0), same),
    "std(correction=1) of equal values": (lambda a: torch.std(a, 0, correction=1), same),
    "var(correction=0) of equal values": (lambda a: torch.var(a, 0, correction=0), same),
    "amax over ties": (lambda a: torch.amax(a), ties),
    "max(dim) over ties": (lambda a: torch.max(a, 0).values, ties),
    "clamp at its bounds": (lambda a: torch.clamp(a, -1.0, 1.0).sum(), at_bounds),
    "abs at 0": (lambda a: torch.abs(a).sum(), zero),
    "maximum over ties": (lambda a: torch.maximum(a, other).sum(), ties),
    "minimum over ties": (lambda a: torch.minimum(a, other).sum(), ties),
    "pow(x, 2) at 0": (lambda a: torch.pow(a, 2).sum(), zero),
}

out = {}
for name, (f, x) in cases.items():
    _, t = torch.func.jvp(f, (x,), (v,))
    xg = x.clone().requires_grad_(True)
    f(xg).backward()
    out[name] = {"x": x.tolist(), "v": v.tolist(), "jvp": t.item(), "grad_v": (xg.grad * v).sum().item()}
json.dump({"torch": torch.__version__, "cases": out}, open(sys.argv[1], "w"), indent=1)
print(json.dumps(out, indent=1))
