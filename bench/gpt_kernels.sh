#!/usr/bin/env bash
# Where a compiled GPT step's device time goes, kernel by kernel (run there, on the GPU host): the
# step recorded as a CUDA graph, every kernel node of its last replay timed alone by Nsight
# Compute, summed by kernel and grid (bench/ncu_table.py). KILN_DUMP=DIR beside it names the
# generated kernels (DIR/kiln_<hash>.loop.txt and .cu).
#
#   bench/gpt_kernels.sh [BENCH_GPT] [--config L] [--dtype bf16] [--top 40] [--csv FILE]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN="$HERE/../build/bench/bench_gpt"
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then BIN=$1; shift; fi
CONFIG=L DTYPE=bf16 TOP=40 CSV=""
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=$2; shift ;;
    --dtype) DTYPE=$2; shift ;;
    --top) TOP=$2; shift ;;
    --csv) CSV=$2; shift ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "gpt_kernels.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$CSV" ] || CSV=$(mktemp --suffix=.csv)
# Three calls: the first compiles, the second records the graph, the third replays it.
ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  "$BIN" --config "$CONFIG" --dtype "$DTYPE" --mode compiled --steps 1 --warmup 2 --device cuda > "$CSV"
# The replay's kernels: the third call's, found as the tail the second call repeats.
python3 "$HERE/ncu_table.py" "$CSV" --last "${KILN_GRAPH_KERNELS:-auto}" --top "$TOP"
