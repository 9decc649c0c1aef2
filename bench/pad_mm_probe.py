# Whether padding a GEMM's dims to multiples of 8 pays on this GPU (PyTorch's cuBLAS, same
# library kiln calls): unpadded vs padded (padding copies included), per dtype and shape.
#   python3 bench/pad_mm_probe.py
import json
import torch
import torch.nn.functional as F


def t(fn, iters=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1000 / iters


def up(n):
    return (n + 7) // 8 * 8


for dt in (torch.float16, torch.bfloat16, torch.float32):
    for tf32 in ((False, True) if dt == torch.float32 else (False,)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for m, k, n in ((4096, 4095, 4096), (4096, 1001, 4096), (8192, 2047, 8192), (1024, 1023, 1024), (4095, 4096, 4095), (256, 1001, 256)):
            a = torch.randn(m, k, device="cuda", dtype=dt)
            b = torch.randn(k, n, device="cuda", dtype=dt)
            plain = t(lambda: a @ b)
            kp, mp, np_ = up(k), up(m), up(n)
            def padded():
                ap = F.pad(a, (0, kp - k, 0, mp - m))
                bp = F.pad(b, (0, np_ - n, 0, kp - k))
                return (ap @ bp)[:m, :n]
            pad = t(padded)
            print(json.dumps({"dtype": str(dt).split(".")[-1], "tf32": tf32, "m": m, "k": k, "n": n,
                              "plain_us": round(plain, 1), "padded_us": round(pad, 1), "ratio": round(plain / pad, 3)}))
