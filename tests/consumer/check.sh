#!/usr/bin/env bash
# Builds and runs the consumer project. Usage: check.sh find_package|add_subdirectory SRC BUILD
#
# find_package: installs BUILD into a scratch prefix, where the public headers must be and the
# internal ones must not. Both modes: the consumer links libkiln.so (hidden visibility), so
# every kiln symbol it uses must be exported (checked against `nm -D`, besides the link itself);
# libkiln must export the kiln_vm_* entry points JIT kernels call and no internals; the consumer
# runs on the default executor and under each KILN_JIT tier, with no kernel falling back to the
# interpreter (KILN_LOG=jit reports each fallback).
set -euo pipefail
mode=$1 src=$2 build=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "check.sh ($mode): $*" >&2
  exit 1
}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [ "$mode" = find_package ]; then
  prefix=$work/prefix
  cmake --install "$build" --prefix "$prefix" >/dev/null
  inc=$prefix/include/kiln
  # Every header named below must exist in the source tree: a renamed or removed one fails here
  # instead of making its check pass vacuously.
  for h in kiln.h runtime/core/export.h runtime/tensor/tensor.h runtime/tensor/xtensor_interop.h \
           jit/compile/compile.h guards/value.h runtime/parallel/tensor_parallel.h runtime/dtensor/dtensor.h \
           runtime/parallel/data_parallel.h runtime/dist/dist.h; do
    [ -f "$src/$h" ] || fail "the public header $h named by this check does not exist in the source tree"
    [ -f "$inc/$h" ] || fail "public header $h is not installed"
  done
  for h in jit/exec/code_cache.h jit/exec/jit_executor.h jit/exec/plan.h jit/loop/lower.h jit/backend/backend.h \
           runtime/ir/symint_impl.h runtime/ir/sym_facts.h runtime/tensor/trace.h runtime/tensor/record.h \
           guards/guard_set.h runtime/dist/group.h runtime/dist/backend.h runtime/dtensor/placed.h; do
    [ -f "$src/$h" ] || fail "the internal header $h named by this check does not exist in the source tree"
    [ ! -e "$inc/$h" ] || fail "internal header $h is installed"
  done
  [ ! -e "$inc/kernels" ] || fail "kernels/ headers are installed"
  # What the README shows compiles with the installed headers alone.
  "$src/tests/consumer/readme_snippets.sh" "$src/README.md" "$inc" "$work/snippets" ||
    fail "a C++ snippet of README.md does not compile against the installed headers"
  cmake -S "$src/tests/consumer" -B "$work/b" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
  lib=$(find "$prefix" -name libkiln.so | head -1)
else
  cmake -S "$src/tests/consumer" -B "$work/b" "${gen[@]}" -DKILN_SOURCE="$src" -DCMAKE_BUILD_TYPE=Release >/dev/null
  lib=$work/b/kiln/libkiln.so
fi
cmake --build "$work/b" -j 2 >/dev/null
[ -f "$lib" ] || fail "no libkiln.so found"

# What libkiln exports.
nm -D --defined-only "$lib" | awk '{print $NF}' | sort -u >"$work/exported"
for s in kiln_vm_expf kiln_vm_exp kiln_vm8_expf kiln_vm4_exp kiln_vm_powf kiln_vm8_atan2f; do
  grep -qx "$s" "$work/exported" || fail "$s is not exported (JIT kernels resolve it from the process)"
done
if nm -DC --defined-only "$lib" | grep -E ' [TBDR] ((kiln::(jit|guards|kernels|sym|vmath|SymFacts)::)|asmjit::|llvm::)'; then
  fail "libkiln exports internal functions or data (above)"
fi
# Every kiln symbol the consumer needs is exported (the link would have failed otherwise; this
# names them).
nm -D --undefined-only "$work/b/consumer" | awk '{print $NF}' | sed 's/@.*//' | grep -E '4kiln|^kiln' |
  sort -u >"$work/needed" || true
[ -s "$work/needed" ] || fail "the consumer uses no kiln symbol from libkiln?"
missing=$(comm -23 "$work/needed" "$work/exported")
[ -z "$missing" ] || fail "the consumer needs symbols libkiln does not export: $missing"

# Run it: the default executor, then every tier, without the disk cache (fresh compiles).
export KILN_CACHE_DIR=off
"$work/b/consumer"
for jit in llvm asmjit interp; do
  if ! KILN_JIT=$jit KILN_LOG=jit "$work/b/consumer" >"$work/out.$jit" 2>&1; then
    cat "$work/out.$jit" >&2
    fail "the consumer failed under KILN_JIT=$jit"
  fi
  if grep -q 'could not compile' "$work/out.$jit"; then
    cat "$work/out.$jit" >&2
    fail "a kernel fell back to the interpreter under KILN_JIT=$jit"
  fi
done
echo "check.sh ($mode): $(wc -l <"$work/needed") kiln symbols linked from libkiln ($(wc -l <"$work/exported") exported)"
