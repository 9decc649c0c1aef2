#!/usr/bin/env bash
# Prints the fault matrix of docs/BENCHMARKS.md: each fault case of tests/dist_fault_worker run
# through kiln-run on 2 ranks, with the backend, how long the surviving ranks took to raise, the
# launcher's exit status and the error they raised (first 160 chars).
#   tests/fault_matrix.sh BUILD_DIR gloo|nccl
set -uo pipefail
build=$1 backend=$2
run=$build/examples/kiln-run worker=$build/tests/dist_fault_worker
export KILN_TEST_BACKEND=$backend KILN_TEST_TIMEOUT_MS=${KILN_TEST_TIMEOUT_MS:-20000}
[ "$backend" = nccl ] && export KILN_TEST_DEVICE=cuda
case_row() {  # name, then VAR=value ... scenario
  local name=$1; shift
  local out rc
  out=$(env "$@" 2>&1); rc=$?
  local t msg
  t=$(grep -o 'error after [0-9.e-]* s' <<<"$out" | head -1 | awk '{print $3}')
  msg=$(grep -m1 -o 'error after.*' <<<"$out" | cut -c1-200)
  [ -z "$msg" ] && msg=$(grep -m1 -E 'FAIL|threads:|ok' <<<"$out" | cut -c1-160)
  printf '| %s | %s | %s | %s | %s |\n' "$name" "$backend" "${t:--}" "$rc" "$msg"
}
echo "| case | backend | s to error | kiln-run status | what the ranks said |"
echo "|---|---|---|---|---|"
case_row "4 threads x own group x 4 kinds x 4 sizes" KILN_TEST_THREADS=4 "$run" --nproc 2 "$worker" threads
for dbg in 1 0; do
  for m in kind size dtype; do
    case_row "mismatch: $m, KILN_DIST_DEBUG=$dbg" KILN_TEST_MISMATCH=$m KILN_DIST_DEBUG=$dbg "$run" --nproc 2 "$worker" mismatch
  done
done
for when in before ddp; do
  for how in exit abort kill; do
    case_row "rank 1 dies: $how, $when" KILN_TEST_DEATH=$how KILN_TEST_WHEN=$when "$run" --nproc 2 "$worker" rank_exits
  done
done
for r in shape count dtype; do
  case_row "DDP replicas differ: $r" KILN_TEST_REPLICA=$r "$run" --nproc 2 "$worker" ddp_shapes
done
