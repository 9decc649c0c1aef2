#!/usr/bin/env python3
"""Generates tests/parity/jvp_parity.jsonl: PyTorch's forward-mode derivatives (torch.func.jvp)
and Hessian-vector products (torch.func.jvp over torch.func.grad) for the ops kiln differentiates,
in float64, for tests/test_forward_ad.cpp.

Same format as ../shared/torch-parity/torch_parity.jsonl (op names and attrs in PyTorch's terms,
run by tests/torch_ops.cpp), plus per case:
  tangents  one per input: a tensor for floating inputs, null for the others
  jvp       the tangent of each output (a list when the op has several)
  w         a fixed weight of the output's shape (single-output ops)
  hvp       one per input: d/dε grad_x sum(op(x + ε·t) * w), null for non-floating inputs
    python3 tests/parity/make_jvp_parity.py tests/parity/jvp_parity.jsonl
"""
import json
import math
import sys

import torch
import torch.nn.functional as F

from parity_json import tj

torch.manual_seed(0)
D = torch.float64
cases = []



def R(*s, lo=-1.5, hi=1.5):
    return torch.rand(s, dtype=D) * (hi - lo) + lo


def P(*s):
    return R(*s, lo=0.3, hi=2.0)


def I(hi, *s):
    return torch.randint(0, hi, s, dtype=torch.int64)


def add(op, inputs, attrs, fn, hvp=True):
    try:
        add_case(op, inputs, attrs, fn, hvp)
    except Exception as e:
        print(f"{op}: skipped: {e}", file=sys.stderr)


def add_case(op, inputs, attrs, fn, hvp):
    """fn(*inputs) -> tensor or list of tensors; floating inputs get tangents."""
    n = sum(1 for c in cases if c["op"] == op)
    fl = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.dtype.is_floating_point]
    tangents = {i: R(*inputs[i].shape) for i in fl}

    def f(*xs):
        args = list(inputs)
        for i, x in zip(fl, xs):
            args[i] = x
        return fn(*args)

    primals = tuple(inputs[i] for i in fl)
    tans = tuple(tangents[i] for i in fl)
    out, jv = torch.func.jvp(f, primals, tans)
    multi = isinstance(out, (tuple, list))
    case = {"id": f"{op}/{n}", "op": op,
            "inputs": [tj(x) if isinstance(x, torch.Tensor) else x for x in inputs], "attrs": attrs,
            "tangents": [tj(tangents[i]) if i in tangents else None for i in range(len(inputs))],
            "out": [tj(o) for o in out] if multi else tj(out),
            "jvp": [tj(t) for t in jv] if multi else tj(jv)}
    if hvp and not multi:
        w = R(*out.shape)

        def loss(*xs):
            return (f(*xs) * w).sum()

        try:
            g = torch.func.grad(loss, argnums=tuple(range(len(fl))))
            _, hv = torch.func.jvp(g, primals, tans)
            it = iter(hv)
            case["w"] = tj(w)
            case["hvp"] = [tj(next(it)) if i in tangents else None for i in range(len(inputs))]
        except Exception as e:  # (reported: the case keeps its jvp)
            print(f"{case['id']}: no hvp: {e}", file=sys.stderr)
    cases.append(case)


# ---- unary ----
for op, gen in [("neg", R), ("abs", R), ("exp", R), ("exp2", R), ("expm1", R), ("log", P), ("log2", P),
                ("log1p", P), ("sqrt", P), ("rsqrt", P), ("reciprocal", P), ("sin", R), ("cos", R),
                ("tan", lambda *s: R(*s, lo=-1.2, hi=1.2)), ("atan", R), ("tanh", R), ("sigmoid", R), ("relu", R),
                ("erf", R), ("floor", R), ("ceil", R), ("round", R), ("sign", R), ("square", R)]:
    add(op, [gen(3, 5)], {}, getattr(torch, op))
add("silu", [R(3, 5)], {}, F.silu)
add("softplus", [R(3, 5)], {}, F.softplus)
add("gelu", [R(3, 5)], {"approximate": "none"}, lambda x: F.gelu(x))
add("gelu", [R(3, 5)], {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh"))
add("clamp", [R(3, 4)], {"min": -0.5, "max": 0.7}, lambda x: torch.clamp(x, -0.5, 0.7))
add("to", [R(3, 4)], {"dtype": "float32"}, lambda x: x.to(torch.float32), hvp=False)

# ---- binary (with broadcasting) ----
for op in ["add", "sub", "mul", "maximum", "minimum", "atan2"]:
    add(op, [R(3, 4), R(4)], {}, getattr(torch, op))
    add(op, [R(2, 1, 3), R(4, 1)], {}, getattr(torch, op))
add("div", [R(3, 4), P(4)], {}, torch.div)
add("pow", [P(3, 4), R(3, 4)], {}, torch.pow)
add("pow", [P(3, 4), R(4)], {}, torch.pow)
add("remainder", [R(3, 4), P(3, 4)], {}, torch.remainder)
add("fmod", [R(3, 4), P(4)], {}, torch.fmod)
add("where", [torch.rand(3, 4) > 0.5, R(3, 4), R(4)], {}, torch.where)
add("lerp", [R(2, 3, 4), R(2, 3, 4)], {"weight": 0.3}, lambda a, b: torch.lerp(a, b, 0.3))

# ---- reductions and scans ----
for op in ["sum", "mean", "amax", "amin", "logsumexp", "prod"]:
    for dim, keep in [(None, False), (1, True), ([0, 2], False)]:
        x = R(3, 4, 2)
        dims = tuple(range(3)) if dim is None else dim
        if op in ("sum", "mean"):
            f = (lambda o, d, k: lambda x: getattr(torch, o)(x, dim=d, keepdim=k))(op, dims, keep)
        elif op == "prod":
            if isinstance(dim, list):
                continue
            f = (lambda d, k: (lambda x: torch.prod(x)) if d is None else (lambda x: torch.prod(x, d, keepdim=k)))(dim, keep)
        else:
            f = (lambda o, d, k: lambda x: getattr(torch, o)(x, dim=d, keepdim=k))(op, dims, keep)
        add(op, [x], {"dim": dim, "keepdim": keep}, f)
add("var", [R(4, 5)], {"dim": 1, "keepdim": False}, lambda x: torch.var(x, dim=1))
add("std", [R(4, 5)], {"dim": None, "keepdim": False}, lambda x: torch.std(x))
add("norm", [R(4, 5)], {"dim": 1, "keepdim": False, "ord": 2}, lambda x: torch.linalg.vector_norm(x, 2, dim=1))
add("cumsum", [R(3, 5)], {"dim": 1}, lambda x: torch.cumsum(x, 1))
add("cumprod", [P(3, 5)], {"dim": 1}, lambda x: torch.cumprod(x, 1))

# ---- views and copies ----
add("reshape", [R(2, 3, 4)], {"shape": [4, 6]}, lambda x: x.reshape(4, 6))
add("transpose", [R(2, 3, 4)], {"dim0": 0, "dim1": 2}, lambda x: x.transpose(0, 2))
add("permute", [R(2, 3, 4)], {"dims": [2, 0, 1]}, lambda x: x.permute(2, 0, 1))
add("expand", [R(4, 1)], {"shape": [3, 4, 5]}, lambda x: x.expand(3, 4, 5))
add("squeeze", [R(3, 1, 4)], {"dim": 1}, lambda x: x.squeeze(1))
add("unsqueeze", [R(3, 4)], {"dim": -1}, lambda x: x.unsqueeze(-1))
add("slice", [R(3, 5, 6)], {"slices": [[0, None, None, 1], [1, 1, None, 1], [2, None, None, 2]]},
    lambda x: x[:, 1:, ::2])
add("narrow", [R(3, 5)], {"dim": 1, "start": 1, "length": 2}, lambda x: x.narrow(1, 1, 2))
add("select", [R(3, 5, 2)], {"dim": 1, "index": 2}, lambda x: x.select(1, 2))
add("flip", [R(3, 4)], {"dims": [0, 1]}, lambda x: x.flip(0, 1))
add("repeat", [R(2, 3)], {"repeats": [2, 3]}, lambda x: x.repeat(2, 3))
add("cat", [R(2, 3), R(2, 5)], {"dim": 1}, lambda a, b: torch.cat([a, b], 1))
add("stack", [R(3, 4), R(3, 4)], {"dim": 1}, lambda a, b: torch.stack([a, b], 1))
add("split", [R(2, 7)], {"sizes": [2, 5], "dim": 1}, lambda x: torch.split(x, [2, 5], 1))
add("pad", [R(3, 4)], {"pad": [1, 2, 0, 1], "value": 0.0}, lambda x: F.pad(x, [1, 2, 0, 1]))
add("tril", [R(4, 4)], {"diagonal": 0}, torch.tril)
add("diagonal", [R(4, 4)], {}, torch.diagonal)
add("roll", [R(3, 4)], {"shifts": 1, "dims": 1}, lambda x: torch.roll(x, 1, 1))
add("contiguous_chain", [R(4, 3), R(4)], {"note": "(x.t() + b).exp().sum(0)"}, lambda x, b: (x.t() + b).exp().sum(0))

# ---- indexing ----
add("gather", [R(4, 5), I(5, 4, 3)], {"dim": 1}, lambda x, i: torch.gather(x, 1, i))
add("index_select", [R(4, 5), I(4, 6)], {"dim": 0}, lambda x, i: torch.index_select(x, 0, i))
add("scatter", [R(3, 5), torch.tensor([[0, 1, 2, 3], [4, 3, 2, 1], [1, 0, 4, 2]]), R(3, 4)], {"dim": 1},
    lambda x, i, s: torch.scatter(x, 1, i, s))
add("scatter_add", [R(3, 5), I(5, 3, 4), R(3, 4)], {"dim": 1}, lambda x, i, s: torch.scatter_add(x, 1, i, s))
add("index_add", [R(5, 3), I(5, 4), R(4, 3)], {"dim": 0}, lambda x, i, s: torch.index_add(x, 0, i, s))
add("embedding", [I(10, 2, 5), R(10, 4)], {}, F.embedding)
add("masked_fill", [R(3, 4), torch.rand(3, 4) > 0.5], {"value": 0.5}, lambda x, m: x.masked_fill(m, 0.5))

# ---- linear algebra and nn ----
add("matmul", [R(3, 4), R(4, 5)], {}, torch.matmul)
add("matmul", [R(2, 3, 4), R(4, 5)], {}, torch.matmul)
add("matmul", [R(2, 1, 3, 4), R(3, 4, 2)], {}, torch.matmul)
add("linear", [R(5, 4), R(3, 4), R(3)], {}, F.linear)
add("einsum", [R(2, 3), R(3, 4)], {"equation": "ij,jk->ik"}, lambda a, b: torch.einsum("ij,jk->ik", a, b))
# (PyTorch has no forward AD for _cdist_forward nor for its CPU attention kernels: the same math
# written out is the reference.)
add("cdist", [R(3, 4), R(5, 4)], {}, lambda a, b: ((a[:, None] - b[None]) ** 2).sum(-1).sqrt())


def attention(q, k, v, mask=None, causal=False):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s + mask
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


add("softmax", [R(4, 6)], {"dim": -1}, lambda x: torch.softmax(x, -1))
add("log_softmax", [R(4, 6)], {"dim": 0}, lambda x: torch.log_softmax(x, 0))
add("layer_norm", [R(4, 6), R(6), R(6)], {"normalized_shape": [6], "eps": 1e-05},
    lambda x, w, b: F.layer_norm(x, [6], w, b, 1e-5))
add("cross_entropy", [R(5, 4), I(4, 5)], {"reduction": "mean"}, F.cross_entropy)
add("cross_entropy", [R(5, 4), I(4, 5)], {"reduction": "sum"}, lambda x, t: F.cross_entropy(x, t, reduction="sum"))
add("mse_loss", [R(4, 3), R(4, 3)], {"reduction": "mean"}, F.mse_loss)
add("smooth_l1_loss", [R(4, 3), R(4, 3)], {"reduction": "mean", "beta": 1.0}, F.smooth_l1_loss)
for causal in (False, True):
    add("sdpa", [R(2, 3, 5, 8), R(2, 3, 7, 8), R(2, 3, 7, 8)], {"is_causal": causal},
        (lambda c: lambda q, k, v: attention(q, k, v, causal=c))(causal))
add("sdpa", [R(2, 5, 4), R(2, 6, 4), R(2, 6, 4), R(5, 6)], {"is_causal": False},
    lambda q, k, v, m: attention(q, k, v, m))
add("conv2d", [R(2, 3, 6, 5), R(4, 3, 3, 2), R(4)], {"stride": [2, 1], "padding": [1, 0]},
    lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 0)))

with open(sys.argv[1] if len(sys.argv) > 1 else "jvp_parity.jsonl", "w") as fh:
    for c in cases:
        fh.write(json.dumps(c) + "\n")
print(len(cases), "cases")
