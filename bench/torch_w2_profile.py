"""PyTorch 2.x eager's W2 step (MLP 64-256-256-8, tanh, MSE, Adam, batch 4096) under
torch.profiler: per-op CPU time, to set beside KILN_PROFILE=1 bench_workloads --profile W2.

    python3 bench/torch_w2_profile.py [--threads N] [--iters N]
"""
import argparse

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dims, batch = [64, 256, 256, 8], 4096
    x, y = torch.randn(batch, dims[0]), torch.randn(batch, dims[-1]) * 0.5
    net = torch.nn.Sequential(torch.nn.Linear(dims[0], dims[1]), torch.nn.Tanh(), torch.nn.Linear(dims[1], dims[2]),
                              torch.nn.Tanh(), torch.nn.Linear(dims[2], dims[3]))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(net(x), y)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(a.iters):
            step()
    print(f"torch {torch.__version__}, {a.threads} threads, {a.iters} steps")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
