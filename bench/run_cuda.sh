#!/usr/bin/env bash
# bench/run.sh --device cuda: kiln's bench_cuda and PyTorch's bench/torch_cuda.py on the same GPU
# in one call, then one table with ratios and the issue's targets. Usage: run_cuda.sh BENCH_CUDA [--quick]
set -euo pipefail
BIN=$1
ITERS=20
[ "${2:-}" = --quick ] && ITERS=5
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=$(mktemp -d)
CACHE=$(mktemp -d)
# NVRTC keeps its own cache of compiled kernels (the driver's, ~/.nv/ComputeCache, keyed by the
# source): a kernel compiled once on the host before recompiles much faster. Cold figures start
# from an empty one, as on a new host.
export CUDA_CACHE_PATH=$CACHE/nv
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >&2 || true
KILN_CACHE_DIR=$CACHE/w "$BIN" --iters "$ITERS" > "$OUT/kiln.jsonl"
python3 "$HERE/torch_cuda.py" "$ITERS" > "$OUT/torch.jsonl" 2> "$OUT/torch.err" || { cat "$OUT/torch.err" >&2; exit 1; }
python3 "$HERE/torch_cuda_steps.py" > "$OUT/torchsteps.jsonl" 2> "$OUT/torchsteps.err" || { tail -20 "$OUT/torchsteps.err" >&2; exit 1; }
# Compile times: the same 40 kernels in two processes over one cache directory (cold, then warm).
KILN_CACHE_DIR=$CACHE/c "$BIN" --compile-times 40 | sed 's/"compile"/"compile-cold"/' > "$OUT/cold.jsonl"
KILN_CACHE_DIR=$CACHE/c "$BIN" --compile-times 40 | sed 's/"compile"/"compile-warm"/' > "$OUT/warm.jsonl"
KILN_CACHE_DIR=$CACHE/s "$BIN" --w2-start | sed 's/"w2-start"/"w2-start-cold"/' > "$OUT/start-cold.jsonl"
KILN_CACHE_DIR=$CACHE/s "$BIN" --w2-start | sed 's/"w2-start"/"w2-start-warm"/' > "$OUT/start-warm.jsonl"
# The transformer block with hand-written attention (patterns on / off) beside PyTorch's block with
# F.scaled_dot_product_attention; peak bytes of one step at T = 256, 1024, 4096.
ABIN="$(dirname "$BIN")/bench_attention"
if [ -x "$ABIN" ]; then
  KILN_CACHE_DIR=$CACHE/a "$ABIN" --device cuda --seq 256 --iters "$ITERS" > "$OUT/attn.jsonl"
  KILN_CACHE_DIR=$CACHE/a "$ABIN" --device cuda --sdpa --seq 256 --iters "$ITERS" >> "$OUT/attn.jsonl"
  for T in 256 1024 4096; do
    for M in on off; do KILN_CACHE_DIR=$CACHE/a "$ABIN" --device cuda --memory $M --seq $T >> "$OUT/attn.jsonl"; done
  done
  for T in 256 1024 4096; do python3 "$HERE/torch_attention.py" cuda $T "$ITERS" >> "$OUT/attn.jsonl"; done
  # sdpa alone over FlashAttention's grid (T 256..8192, head dims 64 and 128, causal and not),
  # bf16 and fp32 (the issue's targets name both).
  for DT in bfloat16 float32; do
    KILN_CACHE_DIR=$CACHE/a "$ABIN" --sweep --device cuda --dtype $DT >> "$OUT/sweep.jsonl.txt"
    python3 "$HERE/torch_sdpa_sweep.py" $DT >> "$OUT/sweep.jsonl.txt"
  done
  # float32 in TF32 (set_float32_matmul_precision("high"); PyTorch's float32 sdpa is 3xTF32 either way)
  KILN_CACHE_DIR=$CACHE/a "$ABIN" --sweep --device cuda --dtype float32 --precision high >> "$OUT/sweep.jsonl.txt"
fi
cat "$OUT"/*.jsonl > "$OUT/all.jsonl"
python3 - "$OUT/all.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t = {(r["workload"], r.get("impl")): r for r in rows}
def us(w, i): return t[(w, i)]["us"] if (w, i) in t else float("nan")
print(f"{'workload':8} {'impl':22} {'time':>12} {'GB/s':>8}")
for r in rows:
    if "us" in r:
        extra = {k: v for k, v in r.items() if k not in ("workload", "impl", "us", "gbs")}
        print(f"{r['workload']:8} {r['impl']:22} {r['us']:10.1f}us {r.get('gbs', ''):>8} {extra if extra else ''}")
checks = []
def check(name, value, target, ok):
    checks.append((name, value, target, ok))
w1 = min(us("W1", "kiln-eager"), us("W1", "kiln-compiled"))
copy = us("W1", "torch-copy")
check("W1 vs copy bandwidth time (torch copy_)", w1 / copy, "<= 1.10x", w1 / copy <= 1.10)
check("W1 speedup over torch.compile", us("W1", "torch-compile") / w1, ">= 1.2x", us("W1", "torch-compile") / w1 >= 1.2)
w3f = min(us("W3F", "kiln-eager"), us("W3F", "kiln-compiled"))
check("W3 forward speedup over torch.compile", us("W3F", "torch-compile") / w3f, ">= 2x", us("W3F", "torch-compile") / w3f >= 2)
w3b = min(us("W3B", "kiln-eager"), us("W3B", "kiln-compiled"))
best = min(us("W3B", "torch-eager"), us("W3B", "torch-compile"))
check("W3 fwd+bwd speedup over faster torch", best / w3b, ">= 3x", best / w3b >= 3)
cold = t.get(("compile-cold", None), {}).get("median_ms", float("nan"))
warm = t.get(("compile-warm", None), {}).get("median_ms", float("nan"))
check("NVRTC cold compile median ms/kernel", cold, "<= 30", cold <= 30)
check("disk-cache warm load median ms/kernel", warm, "<= 1", warm <= 1)
# The step workloads (issue "GPU speed"): kiln compiled (CUDA graphs) against PyTorch's fastest mode.
def fastest(w):
    return min(us(w, i) for i in ("torch-eager", "torch-compile", "torch-reduce-overhead") if (w, i) in t)
for batch, target in ((4096, 4.0), (65536, 1.8)):
    w = f"W2-{batch}"
    if (w, "kiln-compiled") in t:
        r = fastest(w) / us(w, "kiln-compiled")
        check(f"W2 batch {batch} speedup over fastest torch", r, f">= {target}x", r >= target)
        if (w, "cublas-gemms-only") in t:
            f = fastest(w) / us(w, "cublas-gemms-only")
            check(f"W2 batch {batch}: fastest torch / its GEMMs alone (cap)", f, "(info)", True)
        k = t[(w, "kiln-compiled")]
        d = abs(k["loss_step3_graphs"] - k["loss_step3_eager"]) / abs(k["loss_step3_eager"])
        check(f"W2 batch {batch} loss after 3 steps vs eager (rel)", d, "<= 1e-5", d <= 1e-5)
if ("W4", "kiln-compiled") in t:
    k = t[("W4", "kiln-compiled")]
    check("W4 first pass ms (compiles included)", k["first_pass_ms"], "<= 100", k["first_pass_ms"] <= 100)
    check("W4 compiles in the first pass", k["compiles"], "<= 2", k["compiles"] <= 2)
    r = us("W4", "torch-compile-dynamic") / us("W4", "kiln-compiled")
    check("W4 steady speedup over torch.compile(dynamic)", r, ">= 1.7x", r >= 1.7)
if ("LINRELU", "kiln-compiled-epilogue") in t:
    r = us("LINRELU", "kiln-compiled-apart") / us("LINRELU", "kiln-compiled-epilogue")
    check("Linear+ReLU: GEMM epilogue vs GEMM + kernel", r, "> 1x", r > 1)
    r = min(us("LINRELU", "torch-eager"), us("LINRELU", "torch-compile")) / us("LINRELU", "kiln-compiled-epilogue")
    check("Linear+ReLU: speedup over faster torch", r, "(info)", True)
if ("W5", "kiln-compiled") in t:
    check("W5 compiled us/call", us("W5", "kiln-compiled"), "<= 4", us("W5", "kiln-compiled") <= 4)
    check("W5 lazy eager us/call", us("W5", "kiln-eager"), "<= 6", us("W5", "kiln-eager") <= 6)
    if ("W5", "driver-launch-floor") in t:
        check("W5 driver floor: empty-kernel launch us (pipelined)", us("W5", "driver-launch-floor"), "(info)", True)
        check("W5 lazy eager host issue us/call", us("W5", "kiln-eager-issue"), "(info)", True)
    for i in ("kiln-compiled", "kiln-eager"):
        r = us("W5", "torch-eager") / us("W5", i)
        check(f"W5 {i} speedup over torch eager", r, ">= 4x", r >= 4)
for r in rows:
    if r["workload"] == "w2-start-cold":
        check("W2 cold first call ms (trace + NVRTC + run)", r["first_call_ms"], "<= 300", r["first_call_ms"] <= 300)
    if r["workload"] == "w2-start-warm":
        check("W2 warm start to first replay ms (3 calls)", r["to_first_replay_ms"], "<= 5", r["to_first_replay_ms"] <= 5)
w3m = {r["impl"]: r for r in rows if r["workload"] == "W3B-budget"}
if len(w3m) == 3:
    # The min-cut against saving every value backward reads, then the budget below the min-cut.
    # The peak counts what the step allocates over its start: saved values and the backward's
    # intermediates; one [8192, 1024] float tensor (dx) is the least any schedule needs.
    a, b, sa = w3m["kiln-compiled-1.0"], w3m["kiln-compiled-0.5"], w3m["save-all"]
    check("W3B peak MiB: min-cut vs saving all", a["peak_over_start_mib"] / sa["peak_over_start_mib"], "< 1", a["peak_over_start_mib"] < sa["peak_over_start_mib"])
    one = 8192 * 1024 * 4 / 2**20
    check("W3B peak MiB at budget 1.0 in [8192, 1024] tensors", a["peak_over_start_mib"] / one, "(info)", True)
    check("W3B peak MiB at memory_budget 0.5 vs 1.0", b["peak_over_start_mib"] / a["peak_over_start_mib"], "< 1",
          b["peak_over_start_mib"] < a["peak_over_start_mib"])
tb = {r["impl"]: r for r in rows if r["workload"] == "TBLOCK-T256" and "us" in r}
if "kiln-patterns-on" in tb and "kiln-patterns-off" in tb:
    r = tb["kiln-patterns-off"]["us"] / tb["kiln-patterns-on"]["us"]
    check("Block T=256: patterns on vs off speedup", r, ">= 2x", r >= 2)
    if "torch-eager-sdpa" in tb:
        r = tb["kiln-patterns-on"]["us"] / tb["torch-eager-sdpa"]["us"]
        check("Block T=256: kiln (patterns) / torch F.sdpa", r, "<= 1.3x", r <= 1.3)
peaks = sorted((int(r["workload"][8:]), r["peak_bytes"]) for r in rows
               if r["workload"].startswith("TBLOCK-T") and r.get("impl") == "kiln-patterns-on" and "peak_bytes" in r)
if len(peaks) >= 2:
    g = (peaks[-1][1] / peaks[0][1]) / (peaks[-1][0] / peaks[0][0])
    check(f"Block peak bytes growth T={peaks[0][0]}..{peaks[-1][0]} (1 = linear)", g, "< 2", g < 2)
print()
for name, v, target, ok in checks:
    print(f"{name:45} {v:10.3f}  target {target:9} {'PASS' if ok else 'FAIL'}")
for r in rows:
    if r["workload"] in ("memory", "w2-start-cold", "w2-start-warm"):
        print("memory:", {k: v for k, v in r.items() if k != "workload"})
    if r["workload"].startswith("TBLOCK-T") and "peak_bytes" in r:
        print(f"peak: {r['workload']} {r['impl']}: {r['peak_bytes'] / 2**20:.0f} MiB")
PY
# The attention sweep: kiln's sdpa beside PyTorch's, TFLOP/s and share of the card's dense bf16 peak.
if [ -s "$OUT/sweep.jsonl.txt" ]; then
  echo
  python3 "$HERE/sweep_table.py" "$OUT/sweep.jsonl.txt"
fi
# The GPT training step: kiln eager/compiled beside torch eager/compile/reduce-overhead.
GBIN="$(dirname "$BIN")/bench_gpt"
if [ -x "$GBIN" ]; then
  echo
  bash "$HERE/run_gpt.sh" "$GBIN" ${2:+"$2"} ${KILN_GPT_FULL:+--full} || echo "run_gpt.sh failed" >&2
fi
rm -rf "$OUT" "$CACHE"
