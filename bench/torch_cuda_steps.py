# PyTorch's side of the step workloads of bench/run.sh --device cuda (W2 train step, W4 MLP over
# 64 batch sizes, W5 tiny call): eager, torch.compile and torch.compile(mode="reduce-overhead")
# (CUDA graphs), timed as bench_cuda.cpp times kiln: steps back to back, one wait per 20 (per
# 2000 for W5), median of 5 loops. One JSON object a line.
import json
import statistics
import sys
import time

import torch

dev = "cuda"


def loop_us(step, n=20):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t = []
    for _ in range(5):
        a = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        t.append((time.perf_counter() - a) * 1e6 / n)
    return statistics.median(t)


def row(w, impl, us, **extra):
    print(json.dumps({"workload": w, "impl": impl, "us": round(us, 2), **extra}), flush=True)


def net():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256), torch.nn.Tanh(),
                               torch.nn.Linear(256, 8)).to(dev)


which = sys.argv[1:] or ["LINRELU", "W5", "W2", "W4"]

if "LINRELU" in which:
    torch.manual_seed(3)
    xl, wl, bl = torch.randn(16384, 256, device=dev), torch.randn(1024, 256, device=dev), torch.randn(1024, device=dev)
    lr = lambda a, b_, c: torch.relu(torch.nn.functional.linear(a, b_, c))
    with torch.no_grad():
        row("LINRELU", "torch-eager", loop_us(lambda: lr(xl, wl, bl)))
        clr = torch.compile(lr)
        row("LINRELU", "torch-compile", loop_us(lambda: clr(xl, wl, bl)))

if "W5" in which:
    x5 = torch.linspace(-2, 2, 16, device=dev)
    f5 = lambda t: torch.relu(t * 2 + 1)
    row("W5", "torch-eager", loop_us(lambda: f5(x5), 2000))
    c5 = torch.compile(f5)
    row("W5", "torch-compile", loop_us(lambda: c5(x5), 2000))
    r5 = torch.compile(f5, mode="reduce-overhead")
    row("W5", "torch-reduce-overhead", loop_us(lambda: r5(x5), 2000))

if "W2" in which:
    for batch in (4096, 65536):
        torch.manual_seed(8)
        x = torch.randn(batch, 64, device=dev)
        y = torch.randn(batch, 8, device=dev) * 0.5
        w = f"W2-{batch}"
        for impl, mode in (("torch-eager", None), ("torch-compile", "default"), ("torch-reduce-overhead", "reduce-overhead")):
            m = net()
            opt = torch.optim.Adam(m.parameters(), lr=1e-3)

            def step(m=m, opt=opt):
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.mse_loss(m(x), y)
                loss.backward()
                opt.step()
                return loss.detach()

            fn = step if mode is None else torch.compile(step, mode=mode)
            call = fn
            if mode == "reduce-overhead":
                def call(fn=fn):
                    torch.compiler.cudagraph_mark_step_begin()
                    return fn()
            a = time.perf_counter()
            call()
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - a) * 1e3
            losses = [float(call()) for _ in range(2)]
            row(w, impl, loop_us(call), first_call_ms=round(first_ms, 1), loss_step3=losses[-1])
        # The floor under any implementation at this precision: the step's eight float32 products
        # alone (forward 3, backward 5; cuBLAS, TF32 off as by default), replayed as one CUDA graph.
        m = net()
        ws = [l.weight.detach() for l in m if isinstance(l, torch.nn.Linear)]
        h1 = torch.randn(batch, 256, device=dev)
        h2 = torch.randn(batch, 256, device=dev)
        dy = torch.randn(batch, 8, device=dev)

        def gemms():
            x @ ws[0].t(), h1 @ ws[1].t(), h2 @ ws[2].t()              # forward
            dy @ ws[2], dy.t() @ h2, h1 @ ws[1], h1.t() @ h1, h1.t() @ x  # backward: dX, dW
        g = torch.cuda.CUDAGraph()
        s_ = torch.cuda.Stream()
        s_.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s_):
            gemms()
        torch.cuda.current_stream().wait_stream(s_)
        with torch.cuda.graph(g):
            gemms()
        row(w, "cublas-gemms-only", loop_us(g.replay))

if "W4" in which:
    m = net()
    torch.manual_seed(9)
    xs = [torch.randn(1000 + 61 * i, 64, device=dev) for i in range(64)]
    with torch.no_grad():
        row("W4", "torch-eager", loop_us(lambda: [m(x) for x in xs], 3))
        c = torch.compile(m, dynamic=True)
        torch.cuda.synchronize()
        a = time.perf_counter()
        for x in xs:
            c(x)
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - a) * 1e3
        row("W4", "torch-compile-dynamic", loop_us(lambda: [c(x) for x in xs], 3), first_pass_ms=round(first_ms, 1))
