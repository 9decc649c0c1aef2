#!/usr/bin/env python3
"""PyTorch 2.x on the CPU: the workloads of bench_workloads (W1, W2, W3F, W3B, W5) in PyTorch
eager and under torch.compile, one JSON row per (workload, mode), for bench/run.sh's table.

    python3 bench/torch_cpu.py [--threads N] [--quick] [--only W1,W2,...] [--no-compile]

Same sizes as bench_workloads: W1 particles step N = 2^20 ([N, 3] positions and velocities, a
spring and damper, an energy sum); W2 MLP 64-256-256-8 (tanh), MSE, Adam (lr 1e-3), batch 4096;
W3 softmax(gelu(layer_norm(x, w, b))) on 1024 x 1024, forward and forward+backward; W5
relu(2x + 1) on 16 elements (per-call latency). float32. Threads: torch.set_num_threads(N);
pin the process with taskset (bench/run.sh --pin) to compare on the same cores as kiln.
Times: median per call over repetitions after warm-up (torch.compile's compile time is reported
apart, as compile_s: the first call's time).
"""
import argparse
import json
import os
import statistics
import sys
import time

W1_BYTES = (1 << 20) * 3 * 4 * 4  # p and v read, p2 and v2 written ([2^20, 3] float32 each)


def timed(fn, reps, inner=1, warmup=2):
    for _ in range(warmup):
        fn()
    t = []
    for _ in range(reps):
        a = time.perf_counter()
        for _ in range(inner):
            fn()
        t.append((time.perf_counter() - a) * 1e3 / inner)
    return statistics.median(t), min(t), len(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="W1,W2,W3F,W3B,W5")
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    want = set(a.only.split(","))
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    version = torch.__version__.split("+")[0]
    modes = ["eager"] + ([] if a.no_compile else ["compile"])
    q = a.quick

    def row(workload, mode, ms, mn, reps, inner=1, **extra):
        r = {"workload": workload, "impl": f"torch{version}-{mode}", "ms": ms, "min_ms": mn, "reps": reps, "inner": inner,
             "threads": a.threads, "cores": len(cores), "max_abs_diff": None}
        r.update(extra)
        print(json.dumps(r), flush=True)

    def run(workload, make, reps, inner=1):
        """make(compiled) -> a step function; torch.compile's first call is timed as compile_s."""
        for mode in modes:
            try:
                step = make(mode == "compile")
                t0 = time.perf_counter()
                step()
                first = time.perf_counter() - t0
                ms, mn, n = timed(step, reps, inner)
                extra = {"compile_s": round(first, 2)} if mode == "compile" else {}
                if workload == "W1":  # bytes moved as bench_workloads counts them
                    extra["gbs"] = W1_BYTES / (ms * 1e-3) / 1e9
                row(workload, mode, ms, mn, n, inner, **extra)
            except Exception as e:  # a mode that fails is reported, not fatal
                print(json.dumps({"workload": workload, "impl": f"torch{version}-{mode}", "error": str(e)[:300]}), flush=True)

    def comp(f, compiled):
        return torch.compile(f) if compiled else f

    if "W1" in want:
        n = 1 << 20
        p, v = torch.randn(n, 3), torch.randn(n, 3) * 0.5
        g = torch.tensor([0.0, 0.0, -9.81])
        k, c, dt = 4.0, 0.5, 0.01

        def make(compiled):
            def w1(p, v):
                acc = g - k * p - c * v
                v2 = v + dt * acc
                p2 = p + dt * v2
                return p2, v2, 0.5 * (v2 * v2).sum()
            f = comp(w1, compiled)
            return lambda: f(p, v)
        run("W1", make, 15 if q else 40)

    if "W2" in want:
        dims, batch = [64, 256, 256, 8], 4096
        x, y = torch.randn(batch, dims[0]), torch.randn(batch, dims[-1]) * 0.5

        def make(compiled):
            net = torch.nn.Sequential(torch.nn.Linear(dims[0], dims[1]), torch.nn.Tanh(), torch.nn.Linear(dims[1], dims[2]),
                                      torch.nn.Tanh(), torch.nn.Linear(dims[2], dims[3]))
            opt = torch.optim.Adam(net.parameters(), lr=1e-3)

            def w2(x, y):
                opt.zero_grad(set_to_none=True)
                loss = F.mse_loss(net(x), y)
                loss.backward()
                opt.step()
                return loss
            f = comp(w2, compiled)
            return lambda: f(x, y)
        run("W2", make, 8 if q else 25)

    if "W3F" in want or "W3B" in want:
        rows, cols = 1024, 1024
        x = torch.randn(rows, cols)
        w, b = 1 + 0.1 * torch.randn(cols), 0.1 * torch.randn(cols)
        gy = torch.randn(rows, cols)

        def fwd(x, w, b):
            return torch.softmax(F.gelu(F.layer_norm(x, (cols,), w, b, 1e-5)), -1)
        if "W3F" in want:
            def make(compiled):
                f = comp(fwd, compiled)
                def step():
                    with torch.no_grad():
                        return f(x, w, b)
                return step
            run("W3F", make, 10 if q else 30)
        if "W3B" in want:
            xr, wr, br = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()

            def make(compiled):
                f = comp(fwd, compiled)
                def step():
                    yv = f(xr, wr, br)
                    return torch.autograd.grad(yv, (xr, wr, br), gy)
                return step
            run("W3B", make, 10 if q else 30)

    if "W5" in want:
        x = torch.randn(16)

        def make(compiled):
            f = comp(lambda x: torch.relu(2 * x + 1), compiled)
            return lambda: f(x)
        run("W5", make, 15 if q else 41, inner=2000 if q else 5000)

    print(json.dumps({"workload": "TORCH-INFO", "impl": f"torch{version}", "threads": a.threads, "cores": cores}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
