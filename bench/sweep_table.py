# The attention sweep's table (bench/run_cuda.sh): kiln's sdpa beside PyTorch's per workload of
# `bench_attention --sweep` and `torch_sdpa_sweep.py` (JSON lines, any dtypes), then the issue's
# checks: forward+backward torch/kiln >= 1.1 over the whole grid, per dtype (float32 twice: kiln's
# 3xTF32 under the default precision and its TF32 under "high", "kiln-tf32"); bf16 forward at
# d 128, T >= 2048 >= 50% of the card's dense bf16 peak.
#   python3 sweep_table.py SWEEP_JSONL
import json
import sys

PEAK = 989.0  # H100 / H200 SXM dense BF16 TFLOP/s
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
by = {}
for r in rows:
    by.setdefault(r["workload"], {})[r["impl"]] = r
print(f"{'sdpa':32} {'kiln fwd+bwd us':>15} {'torch':>9} {'torch/kiln':>10} {'kiln fwd TF/s':>13} {'% bf16 peak':>11} "
      f"{'torch fwd TF/s':>14} {'kiln MiB':>9} {'torch MiB':>9}")
worst, fwd_big = {}, []
for w, d in by.items():
    t = d.get("torch")
    for impl in ("kiln", "kiln-tf32"):  # (float32: 3xTF32, and TF32 under --precision high)
        k = d.get(impl)
        if not k or not t:
            continue
        dtype = w.split("-")[1] + ("-tf32" if impl == "kiln-tf32" else "")
        r = t["fwd_bwd_us"] / k["fwd_bwd_us"]
        worst[dtype] = min(worst.get(dtype, float("inf")), r)
        if dtype == "bfloat16" and "-d128-" in w and int(w.rsplit("T", 1)[1]) >= 2048:
            fwd_big.append(k["fwd_tflops"] / PEAK)
        name = w + (" tf32" if impl == "kiln-tf32" else "")
        print(f"{name:32} {k['fwd_bwd_us']:15.1f} {t['fwd_bwd_us']:9.1f} {r:10.2f} {k['fwd_tflops']:13.1f} "
              f"{100 * k['fwd_tflops'] / PEAK:10.1f}% {t['fwd_tflops']:14.1f} {k['peak_bytes'] / 2**20:9.0f} "
              f"{t['peak_bytes'] / 2**20:9.0f}")
print()
for dtype, v in worst.items():
    print(f"{'sdpa ' + dtype + ' fwd+bwd torch/kiln, worst of the grid':48} {v:8.3f}  target >= 1.1x   "
          f"{'PASS' if v >= 1.1 else 'FAIL'}")
if fwd_big:
    m = min(fwd_big)
    print(f"{'sdpa bf16 fwd d128 T>=2048, share of peak':48} {m:8.3f}  target >= 0.50   {'PASS' if m >= 0.5 else 'FAIL'}")
