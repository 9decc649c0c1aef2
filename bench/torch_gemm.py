#!/usr/bin/env python3
"""PyTorch's CPU GEMM (torch.mm: MKL or oneDNN, whichever the build uses) on bench_gemm's shapes,
one JSON line per (shape, threads) in bench_gemm's format, library "torch", for the GEMM table
of docs/BENCHMARKS.md. Pin it with taskset like bench_gemm.

    python3 bench/torch_gemm.py [--threads N] [--min-ms T]
"""
import argparse
import json
import statistics
import time

import torch

# (where, m, k, n, a stored [k, m], b stored [n, k]): bench/bench_gemm.cpp's kShapes.
SHAPES = [
    ("W2 fwd x@w1", 4096, 64, 256, False, False), ("W2 fwd h@w2", 4096, 256, 256, False, False),
    ("W2 fwd h@w3", 4096, 256, 8, False, False), ("W2 bwd dz@w2T", 4096, 256, 256, False, True),
    ("W2 bwd hT@dz", 256, 4096, 256, True, False), ("W2 bwd xT@dz", 64, 4096, 256, True, False),
    ("W2 bwd dy@w3T", 4096, 8, 256, False, True), ("block qkv", 4096, 256, 768, False, False),
    ("block mlp up", 4096, 256, 1024, False, False), ("block mlp down", 4096, 1024, 256, False, False),
    ("head q@kT", 256, 64, 256, False, True), ("head p@v", 256, 256, 64, False, False),
]


def median_ms(f, min_ms):
    f()
    runs = []
    for _ in range(5):
        reps, t0 = 0, time.perf_counter()
        while True:
            f()
            reps += 1
            ms = (time.perf_counter() - t0) * 1e3
            if ms >= min_ms / 5:
                break
        runs.append(ms / reps)
    return statistics.median(runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-ms", type=float, default=300)
    o = ap.parse_args()
    g = torch.Generator().manual_seed(7)
    blas = "mkl" if torch.backends.mkl.is_available() else "other"
    for where, m, k, n, ta, tb in SHAPES:
        a = torch.randn((k, m) if ta else (m, k), generator=g)
        b = torch.randn((n, k) if tb else (k, n), generator=g)
        A, B = (a.t() if ta else a), (b.t() if tb else b)
        ref = (A.double() @ B.double())
        out = torch.empty(m, n)
        for t in sorted({1, o.threads}):
            torch.set_num_threads(t)
            torch.mm(A, B, out=out)
            err = (out.double() - ref).abs().max().item() / max(ref.abs().max().item(), 1.0)
            ms = median_ms(lambda: torch.mm(A, B, out=out), o.min_ms)
            print(json.dumps({"shape": where, "m": m, "k": k, "n": n, "library": "torch", "blas": blas, "threads": t,
                              "us": round(ms * 1e3, 1), "gflops": round(2.0 * m * k * n / (ms * 1e-3) * 1e-9, 1),
                              "max_err_rel": float(f"{err:.1e}")}), flush=True)


if __name__ == "__main__":
    main()
