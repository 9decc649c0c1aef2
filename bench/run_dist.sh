#!/usr/bin/env bash
# The distributed tables (issue "Many processes, many GPUs"), kiln beside PyTorch in one call:
#  1. all-reduce bus bandwidth, 1 MiB to 1 GiB: bench_allreduce under kiln-run beside
#     bench/torch_allreduce.py under torchrun, at the largest GPU count (and 2 when more);
#  2. data-parallel training of the GPT benchmark's config M on 1, 2, ... GPUs: bench_gpt --ddp
#     (lazy eager and compiled) beside torch_gpt.py --ddp (eager and torch.compile), tokens/s
#     summed over the ranks and the scaling efficiency against one GPU;
#  3. (--parts sharded) the same GPT fully sharded (bench_gpt --fsdp beside torch_gpt.py --fsdp,
#     FSDP2) and with tensor-parallel MLPs (--tp, beside parallelize_module) on 2, ... GPUs:
#     tokens/s, peak memory per GPU, kiln / torch.
#
#   bench/run_dist.sh [--build-dir DIR] [--gpus "1 2 4"] [--config M] [--dtype fp32] [--quick]
#                     [--device cuda|cpu] [--keep DIR] [--parts "allreduce gpt"] [--impls "kiln torch"]
#                     [--table DIR]   (prints the tables of rows kept in DIR, runs nothing)
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BUILD="$ROOT/build"
DEVICE=cuda
CONFIG=M
DTYPE=fp32
QUICK=0
KEEP=""
GPUS=""
PARTS="allreduce gpt"
IMPLS="kiln torch"
TABLE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD="$2"; shift ;;
    --gpus) GPUS="$2"; shift ;;
    --config) CONFIG="$2"; shift ;;
    --dtype) DTYPE="$2"; shift ;;
    --device) DEVICE="$2"; shift ;;
    --quick) QUICK=1 ;;
    --keep) KEEP="$2"; shift ;;
    --parts) PARTS="$2"; shift ;;
    --impls) IMPLS="$2"; shift ;;
    --table) TABLE="$2"; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "run_dist.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-python3}
has() { case " $1 " in *" $2 "*) return 0 ;; esac; return 1; }
if [ -n "$TABLE" ]; then PARTS=""; KEEP="$TABLE"; GPUS=1; fi
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
if [ -z "$GPUS" ]; then
  if [ "$DEVICE" = cuda ]; then
    N=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$N" -ge 1 ] || { echo "run_dist.sh: no GPU" >&2; exit 2; }
  else
    N=2
  fi
  GPUS=1; k=2; while [ $k -le "$N" ]; do GPUS="$GPUS $k"; k=$((k * 2)); done
fi
MAXN=${GPUS##* }
OUT=${KEEP:-$(mktemp -d)}
mkdir -p "$OUT"
RUN="$BUILD/examples/kiln-run"
STEPS=(); [ "$QUICK" = 1 ] && STEPS=(--steps 30 --warmup 8)

# ---- 1. all-reduce bandwidth ----
MAXMIB=1024; [ "$QUICK" = 1 ] && MAXMIB=256
for n in $GPUS; do
  has "$PARTS" allreduce || break
  [ "$n" -ge 2 ] || continue
  [ "$n" = "$MAXN" ] || [ "$n" = 2 ] || continue
  has "$IMPLS" kiln && timeout 600 "$RUN" --nproc "$n" "$BUILD/bench/bench_allreduce" --device "$DEVICE" --max-mib "$MAXMIB" \
    >> "$OUT/allreduce.jsonl" 2>> "$OUT/allreduce.log" || echo "run_dist.sh: kiln all-reduce on $n failed (see $OUT/allreduce.log)" >&2
  has "$IMPLS" torch && timeout 600 "$PY" -m torch.distributed.run --nproc_per_node "$n" "$HERE/torch_allreduce.py" --device "$DEVICE" \
    --max-mib "$MAXMIB" >> "$OUT/allreduce.jsonl" 2>> "$OUT/allreduce.log" ||
    echo "run_dist.sh: torch all-reduce on $n failed (see $OUT/allreduce.log)" >&2
done

# ---- 2. data-parallel GPT ----
for n in $GPUS; do
  has "$PARTS" gpt || break
  has "$IMPLS" kiln && for mode in eager compiled; do
    timeout 900 "$RUN" --nproc "$n" "$BUILD/bench/bench_gpt" --ddp --config "$CONFIG" --dtype "$DTYPE" --mode "$mode" \
      --device "$DEVICE" "${STEPS[@]}" >> "$OUT/gpt.jsonl" 2>> "$OUT/gpt.log" ||
      echo "run_dist.sh: kiln $mode on $n failed (see $OUT/gpt.log)" >&2
  done
  has "$IMPLS" torch && for mode in eager compile; do
    timeout 900 "$PY" -m torch.distributed.run --nproc_per_node "$n" "$HERE/torch_gpt.py" --ddp --config "$CONFIG" \
      --dtype "$DTYPE" --mode "$mode" --device "$DEVICE" "${STEPS[@]}" >> "$OUT/gpt.jsonl" 2>> "$OUT/gpt.log" ||
      echo "run_dist.sh: torch $mode on $n failed (see $OUT/gpt.log)" >&2
  done
done

# ---- 3. fully sharded and tensor parallel GPT ----
for n in $GPUS; do
  has "$PARTS" sharded || break
  [ "$n" -ge 2 ] || continue
  for par in fsdp tp; do
    has "$IMPLS" kiln && timeout 900 "$RUN" --nproc "$n" "$BUILD/bench/bench_gpt" --$par --config "$CONFIG" \
      --dtype "$DTYPE" --mode eager --device "$DEVICE" "${STEPS[@]}" >> "$OUT/sharded.jsonl" 2>> "$OUT/sharded.log" ||
      echo "run_dist.sh: kiln --$par on $n failed (see $OUT/sharded.log)" >&2
    has "$IMPLS" torch && for mode in eager compile; do
      timeout 900 "$PY" -m torch.distributed.run --nproc_per_node "$n" "$HERE/torch_gpt.py" --$par --config "$CONFIG" \
        --dtype "$DTYPE" --mode "$mode" --device "$DEVICE" "${STEPS[@]}" >> "$OUT/sharded.jsonl" 2>> "$OUT/sharded.log" ||
        echo "run_dist.sh: torch --$par $mode on $n failed (see $OUT/sharded.log)" >&2
    done
  done
done

"$PY" - "$OUT" <<'PYEOF'
import json, sys, collections
out = sys.argv[1]
def rows(name):
    try:
        return [json.loads(l) for l in open(f"{out}/{name}") if l.startswith("{")]
    except FileNotFoundError:
        return []
ar = rows("allreduce.jsonl")
if ar:
    print("\n## All-reduce bus bandwidth (float32 sum, GB/s)\n")
    print("| GPUs | MiB | kiln | torch | kiln / torch |")
    print("|---|---|---|---|---|")
    t = collections.defaultdict(dict)
    for r in ar: t[(r["world_size"], r["mib"])][r["impl"]] = r["busbw_gbs"]
    for (n, mib), v in sorted(t.items()):
        k, p = v.get("kiln"), v.get("torch")
        ratio = f"{k / p:.3f}" if k and p else "-"
        print(f"| {n} | {mib:g} | {k if k is not None else '-'} | {p if p is not None else '-':.2f} | {ratio} |"
              if p is not None else f"| {n} | {mib:g} | {k} | - | - |")
g = rows("gpt.jsonl")
if g:
    print("\n## Data-parallel GPT (tokens/s over all ranks; scaling = tokens/s at N / (N x at 1))\n")
    print("| impl | GPUs | steps/s | tokens/s | scaling | final loss | error |")
    print("|---|---|---|---|---|---|---|")
    base = {}
    for r in g:
        if r.get("world_size", 1) == 1 and "tokens_per_s" in r: base[r["impl"]] = r["tokens_per_s"]
    for r in sorted(g, key=lambda r: (r["impl"], r.get("world_size", 1))):
        n = r.get("world_size", 1)
        tps = r.get("tokens_per_s")
        sc = f"{tps / (n * base[r['impl']]):.3f}" if tps and r["impl"] in base else "-"
        print(f"| {r['impl']} | {n} | {r.get('steps_per_s', '-') if 'error' in r else round(r['steps_per_s'], 1)} | "
              f"{round(tps) if tps else '-'} | {sc} | {r.get('final_loss', '-')} | {r.get('error', '')[:80]} |")
    best = collections.defaultdict(dict)
    for r in g:
        if "tokens_per_s" in r: best[r.get("world_size", 1)][r["impl"]] = r["tokens_per_s"]
    print()
    for n, v in sorted(best.items()):
        k = max([v[i] for i in v if i.startswith("kiln")] or [0]); p = max([v[i] for i in v if i.startswith("torch")] or [0])
        if k and p: print(f"GPUs {n}: kiln best / torch best = {k / p:.3f}")
sh = rows("sharded.jsonl")
if sh:
    print("\n## Fully sharded and tensor-parallel GPT (tokens/s over the job; peak MiB on rank 0)\n")
    print("| parallel | impl | GPUs | steps/s | tokens/s | peak MiB | final loss | error |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(sh, key=lambda r: (r.get("parallel", ""), r.get("world_size", 1), r["impl"])):
        tps = r.get("tokens_per_s")
        print(f"| {r.get('parallel')} | {r['impl']} | {r.get('world_size', 1)} | "
              f"{round(r['steps_per_s'], 1) if 'steps_per_s' in r else '-'} | {round(tps) if tps else '-'} | "
              f"{round(r['peak_alloc_mib']) if r.get('peak_alloc_mib') else '-'} | {r.get('final_loss', '-')} | "
              f"{r.get('error', '')[:80]} |")
    best = collections.defaultdict(dict)
    for r in sh:
        if "tokens_per_s" in r: best[(r.get("parallel"), r.get("world_size", 1))][r["impl"]] = r["tokens_per_s"]
    print()
    for (par, n), v in sorted(best.items()):
        k = max([v[i] for i in v if i.startswith("kiln")] or [0]); p = max([v[i] for i in v if i.startswith("torch")] or [0])
        if k and p: print(f"{par} on {n} GPUs: kiln best / torch best = {k / p:.3f}")
PYEOF
echo "(raw rows in $OUT)"
