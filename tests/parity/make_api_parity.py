#!/usr/bin/env python3
"""Generates tests/parity/api_parity.jsonl: PyTorch's own outputs and gradients for the API of
issue 10 deliverable 6 (int-dim reductions, clamp_min/max, squeeze of dims, unbind, movedim,
diagonal, roll, cumprod, cumsum/sum with dtype, sort/argsort/topk, einsum, cdist, in-place unary
ops, masked_fill_, comparison and cast methods, mT, *_as, advanced indexing and index_put).

Same format as ../shared/torch-parity/torch_parity.jsonl (see its README). CPU only:
    python3 tests/parity/make_api_parity.py OUT.jsonl
multinomial and randperm are random (kiln's Philox stream differs from PyTorch's), so they
are checked by property in tests/test_api.cpp instead.
"""
import json
import math
import sys

import torch

from parity_json import tj

torch.manual_seed(0)
torch.set_default_dtype(torch.float32)
cases = []



def add0(op, inputs, attrs, fn, grad=True):
    """fn(*inputs) -> tensor or tuple/list of tensors."""
    n = sum(1 for c in cases if c["op"] == op)
    ins = [x.clone().requires_grad_(grad and isinstance(x, torch.Tensor) and x.dtype.is_floating_point)
           if isinstance(x, torch.Tensor) else x for x in inputs]
    out = fn(*ins)
    multi = isinstance(out, (tuple, list))
    outs = list(out) if multi else [out]
    case = {"id": f"{op}/{n}", "op": op, "inputs": [tj(x) if isinstance(x, torch.Tensor) else x for x in inputs],
            "attrs": attrs, "out": [tj(o) for o in outs] if multi else tj(outs[0])}
    diff = [x for x in ins if isinstance(x, torch.Tensor) and x.requires_grad]
    gouts = [torch.randn_like(o) if o.dtype.is_floating_point and o.requires_grad else None for o in outs]
    if grad and diff and any(g is not None for g in gouts):
        loss = sum((o * g).sum() for o, g in zip(outs, gouts) if g is not None)
        gs = torch.autograd.grad(loss, diff, allow_unused=True)
        it = iter(gs)
        grads = []
        for x in ins:
            if isinstance(x, torch.Tensor) and x.requires_grad:
                g = next(it)
                grads.append(tj(g if g is not None else torch.zeros_like(x)))
            else:
                grads.append(None)
        case["grads"] = grads
        case["gout"] = [tj(g) if g is not None else None for g in gouts] if multi else tj(gouts[0])
    cases.append(case)


def add(*a, **k):
    """add0, reporting (not raising) a case PyTorch rejects, so one run writes every other case."""
    try:
        add0(*a, **k)
    except Exception as e:  # noqa: BLE001
        print("SKIP", a[0], repr(e)[:200])


r = lambda *s: torch.randn(*s)
r64 = lambda *s: torch.randn(*s, dtype=torch.float64)

# ---- reductions over a single int dim ----
for op in ["sum", "mean", "prod", "amax", "amin", "logsumexp"]:
    add(op, [r(3, 4)], {"dim": 1}, lambda x, op=op: getattr(x, op)(1))
    add(op, [r(2, 3, 4)], {"dim": -1, "keepdim": True}, lambda x, op=op: getattr(x, op)(-1, keepdim=True))
for op in ["var", "std"]:
    add(op, [r(3, 5)], {"dim": 0}, lambda x, op=op: getattr(x, op)(0))
    add(op, [r(3, 5)], {"dim": -1, "correction": 0, "keepdim": True},
        lambda x, op=op: getattr(x, op)(-1, correction=0, keepdim=True))
for op in ["any", "all"]:
    add(op, [r(3, 4) > 0], {"dim": 1}, lambda x, op=op: getattr(x, op)(1))
add("max", [r(3, 4)], {}, lambda x: x.max())
add("min", [r(3, 4)], {}, lambda x: x.min())
add("max", [r(3, 4)], {"dim": 1}, lambda x: tuple(x.max(1)))
add("min", [r(3, 4)], {"dim": 0, "keepdim": True}, lambda x: tuple(x.min(0, keepdim=True)))
add("sum", [torch.randint(-5, 5, (3, 4))], {"dim": 1, "dtype": "float64"}, lambda x: x.sum(1, dtype=torch.float64))
add("cumsum", [torch.randint(-5, 5, (3, 4))], {"dim": 1, "dtype": "float32"}, lambda x: x.cumsum(1, dtype=torch.float32))
add("cumsum", [r(3, 4)], {"dim": 0, "dtype": "float64"}, lambda x: x.cumsum(0, dtype=torch.float64))
add("cumprod", [r(3, 5)], {"dim": 1}, lambda x: x.cumprod(1))
add("cumprod", [torch.tensor([[2.0, 0.0, 3.0, -1.5], [0.5, 1.5, 0.0, 0.0]])], {"dim": -1}, lambda x: x.cumprod(-1))
add("cumprod", [r64(4, 3)], {"dim": 0}, lambda x: x.cumprod(0))
add("cumprod", [torch.randint(-3, 4, (2, 4))], {"dim": 1}, lambda x: x.cumprod(1))

# ---- clamps, *_as, comparisons, casts, mT ----
add("clamp_min", [r(4, 3)], {"min": 0.2}, lambda x: x.clamp_min(0.2))
add("clamp_max", [r(4, 3)], {"max": -0.1}, lambda x: x.clamp_max(-0.1))
add("clamp_min", [r(4, 3), r(3)], {}, lambda x, m: x.clamp_min(m))
add("expand_as", [r(3, 1), r(2, 3, 4)], {}, lambda x, o: x.expand_as(o))
add("view_as", [r(12), r(3, 4)], {}, lambda x, o: x.view_as(o))
add("reshape_as", [r(4, 3).t(), r(2, 6)], {}, lambda x, o: x.reshape_as(o))
for op in ["eq", "ne", "lt", "le", "gt", "ge"]:
    x = torch.tensor([[0.0, 1.0, -1.0], [2.0, 0.0, 0.5]])
    add(op, [x, 0], {}, lambda a, b, op=op: getattr(a, op)(b))
    add(op, [x, torch.tensor([0.0, 1.0, 1.0])], {}, lambda a, b, op=op: getattr(a, op)(b))
for op in ["float", "double", "long", "int", "bool"]:
    add(op, [torch.tensor([[-1.5, 0.0, 2.7], [3.0, -0.2, 1.0]])], {}, lambda x, op=op: getattr(x, op)())
add("mT", [r(2, 3, 4)], {}, lambda x: x.mT)
add("mT", [r(3, 5)], {}, lambda x: x.mT)

# ---- movement ----
add("squeeze", [r(1, 3, 1, 2)], {"dim": [0, 2]}, lambda x: x.squeeze((0, 2)))
add("squeeze", [r(1, 3, 1, 2)], {"dim": [1, -2]}, lambda x: x.squeeze((1, -2)))
add("unbind", [r(3, 4)], {"dim": 1}, lambda x: x.unbind(1))
add("unbind", [r(2, 3, 2)], {"dim": 0}, lambda x: x.unbind(0))
add("movedim", [r(2, 3, 4, 5)], {"source": 1, "destination": -1}, lambda x: x.movedim(1, -1))
add("movedim", [r(2, 3, 4, 5)], {"source": [0, 1], "destination": [3, 0]}, lambda x: x.movedim((0, 1), (3, 0)))
add("diagonal", [r(4, 5)], {}, lambda x: x.diagonal())
add("diagonal", [r(4, 5)], {"offset": 2}, lambda x: x.diagonal(2))
add("diagonal", [r(4, 5)], {"offset": -3}, lambda x: x.diagonal(-3))
add("diagonal", [r(2, 3, 4)], {"offset": 1, "dim1": 2, "dim2": 0}, lambda x: x.diagonal(1, 2, 0))
add("roll", [r(5)], {"shifts": 2}, lambda x: x.roll(2))
add("roll", [r(3, 4)], {"shifts": -1}, lambda x: x.roll(-1))
add("roll", [r(3, 4)], {"shifts": [1, -5], "dims": [0, 1]}, lambda x: x.roll((1, -5), (0, 1)))
add("roll", [r(3, 4)], {"shifts": 7, "dims": 0}, lambda x: x.roll(7, 0))

# ---- sort / argsort / topk ----
nan = float("nan")
add("sort", [r(3, 6)], {"dim": 1}, lambda x: tuple(torch.sort(x, dim=1, stable=True)))
add("sort", [r(5, 3)], {"dim": 0, "descending": True}, lambda x: tuple(torch.sort(x, dim=0, descending=True, stable=True)))
add("sort", [torch.tensor([3.0, nan, 1.0, 2.0, 1.0, -5.0, nan])], {"dim": 0},
    lambda x: tuple(torch.sort(x, dim=0, stable=True)))
add("sort", [torch.tensor([3.0, nan, 1.0, 2.0, 1.0, -5.0, nan])], {"dim": 0, "descending": True},
    lambda x: tuple(torch.sort(x, dim=0, descending=True, stable=True)))
add("sort", [torch.tensor([[3, 1, 2, 1], [0, 0, -4, 9]])], {"dim": -1}, lambda x: tuple(torch.sort(x, dim=-1, stable=True)))
add("argsort", [r(4, 5)], {"dim": -1}, lambda x: torch.argsort(x, dim=-1, stable=True))
add("argsort", [torch.tensor([2.0, 1.0, 2.0, 1.0, 0.0])], {"dim": 0, "descending": True},
    lambda x: torch.argsort(x, dim=0, descending=True, stable=True))
add("topk", [r(3, 7)], {"k": 3}, lambda x: tuple(torch.topk(x, 3)))
add("topk", [r(6, 2)], {"k": 2, "dim": 0, "largest": False}, lambda x: tuple(torch.topk(x, 2, 0, largest=False)))
add("topk", [r64(10)], {"k": 10}, lambda x: tuple(torch.topk(x, 10)))

# ---- einsum / cdist ----
for eq, shapes in [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ij,jk", [(3, 4), (4, 2)]), ("ii->i", [(4, 4)]),
                   ("ii", [(3, 3)]), ("i,j->ij", [(3,), (4,)]), ("...ij,...jk->...ik", [(2, 3, 4), (4, 2)]),
                   ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
                   ("bij->j", [(2, 3, 4)]), ("iij,j->i", [(3, 3, 2), (2,)]), ("ab,ab->", [(3, 4), (3, 4)]),
                   ("b...,b...->b", [(2, 3, 2), (2, 3, 2)])]:
    add("einsum", [r(*s) for s in shapes], {"equation": eq}, lambda *xs, eq=eq: torch.einsum(eq, *xs))
for p in [2.0, 1.0, 0.0, 3.0, float("inf")]:
    add("cdist", [r(4, 3), r(5, 3)], {"p": p}, lambda a, b, p=p: torch.cdist(a, b, p=p), grad=p != 0.0)
add("cdist", [r(2, 3, 4), r(2, 2, 4)], {"p": 2.0}, lambda a, b: torch.cdist(a, b))
add("cdist", [r64(3, 2), r64(4, 2)], {"p": 1.5}, lambda a, b: torch.cdist(a, b, p=1.5))

# ---- in-place ----
for op in ["exp_", "relu_", "sigmoid_", "tanh_", "neg_", "abs_"]:
    add(op, [r(3, 4)], {}, lambda x, op=op: getattr(x.clone(), op)())
add("sqrt_", [torch.rand(3, 4) + 0.1], {}, lambda x: x.clone().sqrt_())
add("log_", [torch.rand(3, 4) + 0.1], {}, lambda x: x.clone().log_())
add("clamp_min_", [r(3, 4)], {"min": 0.1}, lambda x: x.clone().clamp_min_(0.1))
add("clamp_max_", [r(3, 4)], {"max": 0.1}, lambda x: x.clone().clamp_max_(0.1))
add("masked_fill_", [r(3, 4), r(3, 4) > 0], {"value": -2.5}, lambda x, m: x.clone().masked_fill_(m, -2.5))
add("masked_fill_", [r(3, 4), r(4) > 0], {"value": 0.0}, lambda x, m: x.clone().masked_fill_(m, 0.0))


# ---- advanced indexing: spec entries int, null (None), "..." , [start, stop, step], {"tensor": k} ----
def build_index(spec, tensors):
    out = []
    for e in spec:
        if isinstance(e, dict):
            out.append(tensors[e["tensor"]])
        elif e == "...":
            out.append(Ellipsis)
        elif isinstance(e, list):
            out.append(slice(*e))
        else:
            out.append(e)
    return tuple(out)


def idx_case(x, tensors, spec):
    add("index", [x] + tensors, {"spec": spec}, lambda x, *ts: x[build_index(spec, ts)])


L = lambda *v: torch.tensor(v, dtype=torch.int64)
idx_case(r(4, 3), [L(2, 0, -1)], [{"tensor": 0}])
idx_case(r(2, 3, 4), [L(1, 1, 0, 2)], [[None, None, None], {"tensor": 0}])
idx_case(r(2, 3, 4), [L(3, 0)], ["...", {"tensor": 0}])
idx_case(r(2, 3, 4), [L(0, 3, 3)], [1, [0, 2, None], {"tensor": 0}])
idx_case(r(2, 3, 4), [L(0, 1), L(2, 1)], [{"tensor": 0}, {"tensor": 1}])
idx_case(r(2, 3, 4), [L(0, 1), L(1, 2)], [{"tensor": 0}, [None, None, None], {"tensor": 1}])
idx_case(r(2, 3, 4), [L(0, 2).reshape(2, 1), L(1, 3).reshape(1, 2)], [[None, None, None], {"tensor": 0}, {"tensor": 1}])
idx_case(r(2, 3, 4), [r(2, 3) > 0], [{"tensor": 0}])
idx_case(r(2, 3, 4), [torch.tensor([True, False, True])], [[None, None, None], {"tensor": 0}])
idx_case(r(3, 4), [L(1, 0).reshape(2, 1)], [{"tensor": 0}, None])


def put_case(x, v, tensors, spec, accumulate):
    add("index_put", [x, v] + tensors, {"spec": spec, "accumulate": accumulate},
        lambda x, v, *ts: x.clone().index_put_(tuple(t for t in ts), v, accumulate=accumulate)
        if all(isinstance(e, dict) for e in spec) else _put(x, v, ts, spec, accumulate))


def _put(x, v, ts, spec, accumulate):
    y = x.clone()
    if accumulate:
        y[build_index(spec, ts)] += v
    else:
        y[build_index(spec, ts)] = v
    return y


put_case(r(4, 3), r(2, 3), [L(3, 0)], [{"tensor": 0}], False)
put_case(r(4, 3), r(4, 3), [L(3, 0, 3, 1)], [{"tensor": 0}], True)
put_case(r(3, 4), r(3, 2), [L(1, 3)], [[None, None, None], {"tensor": 0}], False)
put_case(r(2, 3), r(2), [L(1, 0), L(2, 2)], [{"tensor": 0}, {"tensor": 1}], False)
put_case(r(2, 3), r(3), [L(1, 1, 0), L(2, 2, 0)], [{"tensor": 0}, {"tensor": 1}], True)
put_case(r(3, 4), torch.tensor(0.5), [r(3, 4) > 0], [{"tensor": 0}], False)

out = sys.argv[1] if len(sys.argv) > 1 else "api_parity.jsonl"
with open(out, "w") as f:
    for c in cases:
        f.write(json.dumps(c) + "\n")
print(f"wrote {len(cases)} cases to {out} (torch {torch.__version__})")
