# torch.distributed's all-reduce bandwidth, the twin of bench/bench_allreduce.cpp (same sizes,
# iterations and JSON fields). Run with torchrun:
#   python3 -m torch.distributed.run --nproc_per_node 4 bench/torch_allreduce.py [--device cuda|cpu]
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--min-mib", type=float, default=1)
    p.add_argument("--max-mib", type=float, default=1024)
    a = p.parse_args()
    cuda = a.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    mib = a.min_mib
    while mib <= a.max_mib * 1.0001:
        count = int(mib * 1024 * 1024 / 4)
        t = torch.ones(count, dtype=torch.float32, device=dev)
        iters = 50 if mib <= 16 else 20 if mib <= 256 else 10
        for _ in range(5):
            dist.all_reduce(t)
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        sync()
        s = (time.perf_counter() - start) / iters
        algbw = count * 4 / s / 1e9
        if rank == 0:
            print(json.dumps({"impl": "torch", "device": str(dev), "world_size": n, "mib": mib, "iters": iters,
                              "us": s * 1e6, "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (n - 1) / n,
                              "torch_version": torch.__version__}), flush=True)
        mib *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
