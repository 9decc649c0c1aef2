#!/usr/bin/env bash
# The function-transform table (bench/run.sh --transforms): kiln's forward, jvp, grad and hvp of a
# 4-layer tanh MLP beside torch.func's, eager and compiled, same process call, same device.
#   bench/run_transforms.sh --build-dir DIR [--device cpu|cuda] [--batch B] [--width W] [--iters N]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD="$ROOT/build"; DEVICE=cpu; B=""; W=""; ITERS=30
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD="$2"; shift ;;
    --device) DEVICE="$2"; shift ;;
    --batch) B="$2"; shift ;;
    --width) W="$2"; shift ;;
    --iters) ITERS="$2"; shift ;;
    *) echo "run_transforms.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$B" ]; then if [ "$DEVICE" = cuda ]; then B=4096; else B=256; fi; fi
if [ -z "$W" ]; then if [ "$DEVICE" = cuda ]; then W=1024; else W=256; fi; fi
OUT=$(mktemp)
"$BUILD/bench/bench_transforms" --device "$DEVICE" --batch "$B" --width "$W" --iters "$ITERS" | tee -a "$OUT" >&2
if python3 -c "import torch" 2>/dev/null; then
  python3 "$ROOT/bench/torch_transforms.py" "$DEVICE" "$B" "$W" "$ITERS" 2>/dev/null | tee -a "$OUT" >&2 || true
fi
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
k = {(r["row"], r["mode"]): r["median_us"] for r in rows if r["impl"] == "kiln" and "median_us" in r}
t = {(r["row"], r["mode"]): r["median_us"] for r in rows if r["impl"] == "torch" and "median_us" in r}
dev = next((r["device"] for r in rows if "device" in r), "?")
print(f"transforms on {dev}: median us per call (lower is better); ratio = best torch / kiln (> 1: kiln faster)")
print(f"{'row':8} {'kiln eager':>11} {'kiln comp':>10} {'torch eager':>12} {'torch comp':>11} {'ratio':>7}")
for row in ("forward", "jvp", "grad", "hvp"):
    ke, kc = k.get((row, "eager")), k.get((row, "compiled"))
    te, tc = t.get((row, "eager")), t.get((row, "compiled"))
    best_k = min(v for v in (ke, kc) if v) if (ke or kc) else None
    best_t = min(v for v in (te, tc) if v) if (te or tc) else None
    ratio = f"{best_t / best_k:.2f}" if best_k and best_t else "-"
    f = lambda v: f"{v:.1f}" if v else "-"
    print(f"{row:8} {f(ke):>11} {f(kc):>10} {f(te):>12} {f(tc):>11} {ratio:>7}")
fw = k.get(("forward", "compiled")); jv = k.get(("jvp", "compiled"))
if fw and jv:
    print(f"kiln compiled jvp / forward: {jv / fw:.2f}x (the tangent doubles the GEMMs: ~2x is the floor)")
for r in rows:
    if r.get("row") == "check": print("check:", r)
    if "error" in r: print("torch error:", r)
PY
rm -f "$OUT"
