#!/usr/bin/env python3
# PyTorch's twin of bench/bench_gpt.cpp (issue 34): nanoGPT's model and training step, the same
# data, init scheme, optimizer and JSON fields, in eager mode, torch.compile (default) and
# torch.compile(mode="reduce-overhead") (CUDA graphs); bf16 rows run forward + loss under
# torch.autocast(device_type, dtype=torch.bfloat16). One JSON object a line on stdout.
#
#   torch_gpt.py [--config S|M|L] [--dtype fp32|bf16|all] [--mode eager|compile|reduce-overhead|all]
#                [--steps N] [--warmup N] [--device cpu|cuda] [--seed N] [--attn sdpa|manual]
#                [--batches N] [--tie-weights] [--matmul-precision highest|high|medium]
#                [--compile-target step|model] [--peak-flops F]
#                [--batch B] [--seq T] [--d D] [--layers L] [--heads H] [--vocab V] [--mlp M]
#   torch_gpt.py --profile [--config M] [--mode eager|...|all] [--profile-steps N]
#                torch.profiler over a few steps: the table of CUDA time by op
#                (key_averages().table(sort_by="cuda_time_total", row_limit=30)) and one JSON line
#                with the GPU time per step and the share of it in GEMM kernels.
#
# The step: zero_grad(set_to_none), forward + cross_entropy, backward, clip_grad_norm_(1.0),
# AdamW.step(), loss.item(). AdamW is nanoGPT's configure_optimizers: lr 3e-4, betas (0.9, 0.95),
# weight decay 0.1 on 2-D parameters and 0 on the rest, PyTorch's default implementation
# (foreach on CUDA; fused=False). --compile-target step (default) compiles the whole step
# function, as kiln::compile does (Dynamo breaks the graph at loss.backward(): forward and
# backward compiled by AOTAutograd, the clip and the optimizer step compiled as a second graph);
# --compile-target model compiles the model alone, as nanoGPT's train.py does (optimizer eager).
import argparse
import os
import gc
import json
import math
import statistics
import sys
import time
import traceback

import torch
import torch.utils.checkpoint
import torch.nn as nn
from torch.nn import functional as F

CONFIGS = {
    "S": dict(n_embd=64, n_layer=2, n_head=4, block_size=64, batch=16, vocab=65, mlp=256),
    "M": dict(n_embd=256, n_layer=4, n_head=8, block_size=256, batch=32, vocab=65, mlp=1024),
    "L": dict(n_embd=768, n_layer=12, n_head=12, block_size=1024, batch=8, vocab=50304, mlp=3072),
}
DEFAULT_STEPS = {"S": (200, 20), "M": (100, 10), "L": (30, 5)}  # (steps, warmup), as bench_gpt
PEAKS = {"fp32": (494.7e12, "H100 SXM dense TF32 494.7 TFLOPS"), "bf16": (989e12, "H100 SXM dense BF16 989 TFLOPS")}
IMPLS = {"eager": "torch-eager", "compile": "torch-compile", "reduce-overhead": "torch-reduce-overhead"}


# ---------------- the model: nanoGPT (dropout 0, bias on) ----------------
class CausalSelfAttention(nn.Module):
    def __init__(self, c, manual):
        super().__init__()
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"])
        self.n_head, self.n_embd, self.manual = c["n_head"], c["n_embd"], manual
        if manual:
            T = c["block_size"]
            self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.manual:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], c["mlp"])
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(c["mlp"], c["n_embd"])

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c, manual):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["n_embd"])
        self.attn = CausalSelfAttention(c, manual)
        self.ln_2 = nn.LayerNorm(c["n_embd"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c, manual, tie):
        super().__init__()
        self.c = c
        self.checkpoint = False
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab"], c["n_embd"]),
            wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            h=nn.ModuleList([Block(c, manual) for _ in range(c["n_layer"])]),
            ln_f=nn.LayerNorm(c["n_embd"]),
        ))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab"], bias=False)
        if tie:
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c["n_layer"]))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True) if self.checkpoint else block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_optimizer(model, foreach=None):
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, foreach=foreach)


# ---------------- data: the same batches as bench_gpt.cpp ----------------
M64 = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.s = seed & M64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)


DATA_CHECKSUM = "none"  # FNV-1a over every input token, as bench_gpt.cpp's "data_checksum"


def make_batches(c, seed, count, device):
    global DATA_CHECKSUM
    rng = SplitMix64(seed)
    V, B, T = c["vocab"], c["batch"], c["block_size"]
    fnv = 14695981039346656037
    out = []
    for _ in range(count):
        xs, ys = [], []
        for _ in range(B):
            t = rng.next() % V
            row = [t]
            for _ in range(T):
                t = (t + 1 + rng.next() % 3) % V
                row.append(t)
            for tok in row[:-1]:
                fnv = ((fnv ^ tok) * 1099511628211) & M64
            xs.extend(row[:-1])
            ys.extend(row[1:])
        x = torch.tensor(xs, dtype=torch.long).view(B, T).to(device)
        y = torch.tensor(ys, dtype=torch.long).view(B, T).to(device)
        out.append((x, y))
    DATA_CHECKSUM = f"{fnv:016x}"
    return out


# ---------------- one (config, dtype, mode) ----------------
def head(args, c, dtype, impl):
    return {"workload": f"GPT-{c['name']}", "impl": impl, "framework": "torch", "config": c["name"], "dtype": dtype,
            "device": args.device, "attn": args.attn, "batch": c["batch"], "seq": c["block_size"],
            "d_model": c["n_embd"], "n_layer": c["n_layer"], "n_head": c["n_head"], "vocab": c["vocab"],
            "mlp": c["mlp"], "tie_weights": args.tie_weights, "checkpoint": args.checkpoint, "seed": args.seed, "data_checksum": DATA_CHECKSUM,
            "parallel": "fully_shard" if args.fsdp else "tensor_parallel_mlp" if args.tp else "ddp" if args.ddp else "none",
            "world_size": args.world_size}


def emit(row):
    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v
    print(json.dumps({k: clean(v) for k, v in row.items()}), flush=True)


def clip_mixed(params, max_norm):
    """clip_grad_norm_ over parameters some of which are DTensors (tensor parallel)."""
    from torch.distributed.tensor import DTensor
    grads = [p.grad for p in params if p.grad is not None]
    norms = []
    for g in grads:
        n = torch.linalg.vector_norm(g)
        norms.append(n.full_tensor() if isinstance(n, DTensor) else n)
    total = torch.linalg.vector_norm(torch.stack(norms))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)


def build(args, c, dtype, mode):
    """Model, optimizer and a call(x, y) -> loss tensor for one mode."""
    torch.manual_seed(args.seed)
    model = GPT(c, args.attn == "manual", args.tie_weights).to(args.device)
    model.checkpoint = args.checkpoint
    opt = make_optimizer(model)
    if args.tp:  # Megatron's MLP split: c_fc colwise, c_proj rowwise (every rank the same batch)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("cuda", (args.world_size,))
        for block in model.transformer.h:
            parallelize_module(block.mlp, mesh, {"c_fc": ColwiseParallel(), "c_proj": RowwiseParallel()})
        opt = make_optimizer(model, foreach=False)  # (foreach kernels refuse a mix of DTensor and plain params)
    elif args.fsdp:  # FSDP2: each block its own unit, then the root; the optimizer is built on the DTensor params
        from torch.distributed.fsdp import fully_shard
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
        opt = make_optimizer(model)
    elif args.ddp:  # (DDP's default buckets; the model is what DDP wraps, the optimizer steps its params)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])
    bf16 = dtype == "bf16"
    dev_type = "cuda" if args.device.startswith("cuda") else "cpu"
    fwd = model
    if mode != "eager" and args.compile_target == "model":
        fwd = torch.compile(model, mode=None if mode == "compile" else mode)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev_type, dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(x, y)
        loss.backward()
        if args.tp:  # (clip_grad_norm_'s foreach norms refuse a mix of DTensor and plain gradients)
            clip_mixed(model.parameters(), 1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach()

    fn = step
    if mode != "eager" and args.compile_target == "step":
        fn = torch.compile(step, mode=None if mode == "compile" else mode)
    call = fn
    if mode == "reduce-overhead":
        def call(x, y):
            torch.compiler.cudagraph_mark_step_begin()
            return fn(x, y)
    return model, opt, call


def sync(args):
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def run_mode(args, c, dtype, mode, data):
    impl = IMPLS[mode]
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model, opt, call = build(args, c, dtype, mode)
    params = sum(p.numel() for p in model.parameters())  # (a tied weight counts once)
    inner = model.module if args.ddp and not (args.fsdp or args.tp) else model
    wpe = inner.transformer.wpe.weight.numel()
    wte = inner.transformer.wte.weight.numel()
    n_flops = params - wpe - (0 if args.tie_weights else wte)
    flops_per_token = 6 * n_flops + 12 * c["n_layer"] * c["n_head"] * (c["n_embd"] // c["n_head"]) * c["block_size"]
    tokens = c["batch"] * c["block_size"] * (1 if args.tp else args.world_size)  # (every rank's batch; TP: one)
    flops_per_step = flops_per_token * tokens

    times, first_ms, first_loss, final_loss = [], None, None, None
    for i in range(args.warmup + args.steps):
        x, y = data[i % len(data)]
        a = time.perf_counter()
        loss = call(x, y).item()
        ms = (time.perf_counter() - a) * 1e3
        if i == 0:
            first_ms, first_loss = ms, loss
        if i >= args.warmup:
            times.append(ms)
        final_loss = loss
    sync(args)
    ms = statistics.median(times)
    sps = 1e3 / ms
    peak, peak_name = (args.peak_flops, "user") if args.peak_flops else PEAKS[dtype]
    row = head(args, c, dtype, impl)
    row.update(mode=mode, steps=args.steps, warmup=args.warmup, ms=ms, ms_min=min(times),
               ms_mean=statistics.fmean(times), steps_per_s=sps, tokens_per_s=sps * tokens, first_step_ms=first_ms,
               first_loss=first_loss, final_loss=final_loss, params=params, params_flops=n_flops,
               flops_per_step=float(flops_per_step), tflops=flops_per_step * sps / 1e12,
               mfu=flops_per_step * sps / peak if cuda else None, peak_flops=peak, peak_name=peak_name,
               matmul_precision=torch.get_float32_matmul_precision(),
               optimizer="AdamW(lr 3e-4, betas 0.9/0.95, wd 0.1 on 2-D params; default foreach, fused=False)",
               torch_version=torch.__version__)
    if mode != "eager":
        row["compile_target"] = args.compile_target
    if cuda:
        row["peak_alloc_mib"] = torch.cuda.max_memory_allocated() / 2**20
        row["peak_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
    row["world_size"] = args.world_size
    if args.rank == 0:
        emit(row)
    del model, opt, call


def cleanup(args):
    try:
        torch._dynamo.reset()
    except Exception:
        pass
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ---------------- --profile ----------------
GEMM_KEYS = ("gemm", "xmma", "cutlass", "nvjet", "cublas", "sgemm", "hgemm", "triton_tem")
NOT_GEMM_KEYS = ("fmha", "flash", "attention")  # attention kernels (cutlass-based, but not GEMMs alone)


def profile_mode(args, c, dtype, mode, data):
    from torch.profiler import ProfilerActivity, profile
    impl = IMPLS[mode]
    model, opt, call = build(args, c, dtype, mode)
    for i in range(max(args.warmup, 3)):
        call(*data[i % len(data)]).item()
    sync(args)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    n = args.profile_steps
    with profile(activities=acts) as prof:
        for i in range(n):
            call(*data[i % len(data)]).item()
        sync(args)
    ka = prof.key_averages()
    print(f"== torch.profiler: GPT-{c['name']} {dtype} {impl}, {n} steps ==", flush=True)
    try:
        print(ka.table(sort_by="cuda_time_total", row_limit=30), flush=True)
    except Exception:
        print(ka.table(sort_by="device_time_total", row_limit=30), flush=True)
    # GPU kernel time (kernel rows only: their self time; CPU ops would count it twice).
    total_us = gemm_us = 0.0
    for e in ka:
        if not str(getattr(e, "device_type", "")).endswith("CUDA"):
            continue
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0.0)
        total_us += us
        key = e.key.lower()
        if any(k in key for k in GEMM_KEYS) and not any(k in key for k in NOT_GEMM_KEYS):
            gemm_us += us
    row = head(args, c, dtype, impl)
    row.update(mode=mode, profile_steps=n, gpu_ms_per_step=total_us / 1e3 / n, gemm_ms_per_step=gemm_us / 1e3 / n,
               gemm_share=gemm_us / total_us if total_us else None, gemm_kernel_keys=list(GEMM_KEYS), not_gemm_keys=list(NOT_GEMM_KEYS))
    emit(row)
    del model, opt, call


# ---------------- command line ----------------
def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", default=None, choices=list(CONFIGS))
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "all"])
    p.add_argument("--mode", default=None, choices=["eager", "compile", "reduce-overhead", "all"])
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "manual"])
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--tie-weights", action="store_true")
    p.add_argument("--checkpoint", action="store_true", help="every block under torch.utils.checkpoint")
    p.add_argument("--matmul-precision", default="highest", choices=["highest", "high", "medium"])
    p.add_argument("--compile-target", default="step", choices=["step", "model"])
    p.add_argument("--peak-flops", type=float, default=0.0)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel over torchrun's ranks (NCCL)")
    p.add_argument("--fsdp", action="store_true", help="fully_shard (FSDP2) per block over torchrun's ranks (NCCL)")
    p.add_argument("--tp", action="store_true", help="tensor parallel MLPs (parallelize_module) over torchrun's ranks")
    p.add_argument("--profile-steps", type=int, default=5)
    for k in ("batch", "seq", "d", "layers", "heads", "vocab", "mlp"):
        p.add_argument(f"--{k}", type=int, default=None)
    args = p.parse_args()
    if args.config is None:
        args.config = "M" if args.profile else "S"
    if args.mode is None:
        args.mode = "eager" if args.profile else "all"
    c = dict(CONFIGS[args.config], name=args.config)
    for k, ck in (("batch", "batch"), ("seq", "block_size"), ("d", "n_embd"), ("layers", "n_layer"),
                  ("heads", "n_head"), ("vocab", "vocab"), ("mlp", "mlp")):
        if getattr(args, k):
            c[ck] = getattr(args, k)
    if args.d and not args.mlp:
        c["mlp"] = 4 * c["n_embd"]
    if c["n_embd"] % c["n_head"]:
        sys.exit(f"torch_gpt: d_model {c['n_embd']} is not a multiple of n_head {c['n_head']}")
    steps, warmup = DEFAULT_STEPS[args.config]
    args.steps = max(1, args.steps if args.steps is not None else steps)
    args.warmup = args.warmup if args.warmup is not None else warmup
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_gpt: no CUDA device")
    args.rank, args.world_size, args.local_rank = 0, 1, 0
    args.ddp = args.ddp or args.fsdp or args.tp  # (the same ranks; TP: the same batches on every rank)
    if args.ddp:  # one process per GPU under torchrun; each rank trains on its own batches
        torch.distributed.init_process_group("nccl")
        args.rank, args.world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        args.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(args.local_rank)
        args.device = f"cuda:{args.local_rank}"
    torch.set_float32_matmul_precision(args.matmul_precision)
    dtypes = ["fp32", "bf16"] if args.dtype == "all" else [args.dtype]
    modes = ["eager", "compile", "reduce-overhead"] if args.mode == "all" else [args.mode]
    data = make_batches(c, args.seed + (0 if args.tp else 1000 * args.rank), args.batches, args.device)
    failures = 0
    for dtype in dtypes:
        for mode in modes:
            try:
                (profile_mode if args.profile else run_mode)(args, c, dtype, mode, data)
            except Exception as e:  # a failing mode is a row, and the others still run
                failures += 1
                traceback.print_exc(file=sys.stderr)
                msg = f"{type(e).__name__}: {e}".strip().splitlines()
                row = head(args, c, dtype, IMPLS[mode])
                row["error"] = " ".join(msg)[:500]
                emit(row)
            cleanup(args)
    if args.ddp:
        torch.distributed.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
