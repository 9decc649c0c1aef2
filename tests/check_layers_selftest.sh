#!/usr/bin/env bash
# check_layers.sh must reject what it states: a tree with one forbidden include per rule below
# fails with that include named; the same tree without them passes.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"/{jit/exec,jit/patterns,jit/compile,jit/backend,jit/loop,jit/graph,jit/diag,runtime/dist/nccl,runtime/dtensor,runtime/nn,runtime/optim,kernels,guards}
echo '#include "jit/exec/plan.h"' > "$tmp/jit/exec/ok.cpp"
echo '#include "jit/compile/patterns.h"' > "$tmp/jit/patterns/ok.cpp"
echo '#include "runtime/dist/process_group.h"' > "$tmp/runtime/dtensor/ok.cpp"
"$here/check_layers.sh" "$tmp" || { echo "selftest: a clean tree was rejected"; exit 1; }
expect() {  # FILE INCLUDE: adding it must make the check fail and name it
  echo "#include \"$2\"" >> "$tmp/$1"
  out=$("$here/check_layers.sh" "$tmp") && { echo "selftest: $1 including $2 passed"; exit 1; }
  grep -q "$1 includes $2" <<<"$out" || { echo "selftest: wrong report: $out"; exit 1; }
  sed -i '$d' "$tmp/$1"
}
expect jit/exec/ok.cpp jit/compile/compile.h
expect jit/patterns/ok.cpp jit/compile/program.h
expect jit/patterns/ok.cpp jit/exec/plan.h
expect runtime/dtensor/ok.cpp runtime/dist/nccl/nccl_group.h
echo "selftest: every forbidden include was reported"
