#!/usr/bin/env bash
# The dependency rules of the source tree (docs/ARCHITECTURE.md, "Layers"), checked on every
# #include "..." of the library's sources. Usage: check_layers.sh SRC. Prints each violation.
set -uo pipefail
cd "$1"
bad=0
# rule FOLDER_REGEX ALLOWED_REGEX WHY: every project include of files under FOLDER must match ALLOWED.
rule() {
  local folder=$1 allowed=$2 why=$3 f inc
  while IFS= read -r f; do
    while IFS= read -r inc; do
      if [[ ! $inc =~ $allowed ]]; then
        echo "$f includes $inc: $why"
        bad=1
      fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
  done < <(find "$folder" \( -name '*.h' -o -name '*.cpp' \))
}
# runtime/ never knows the JIT or compile()'s guards.
rule runtime '^(runtime|kernels)/' "runtime/ never includes jit/ or guards/"
# The reference kernels sit below the eager front end.
rule kernels '^(kernels/|runtime/(core|ir)/)' "kernels/ include only kernels/, runtime/core and runtime/ir"
# nn and optim are written against the public API only.
rule runtime/nn '^runtime/(nn/|core/|ops/ops\.h|tensor/tensor\.h|autograd/autograd\.h|ir/symint\.h)' "nn/ uses only public headers"
rule runtime/optim '^runtime/(optim/|core/|ops/ops\.h|tensor/tensor\.h|autograd/autograd\.h|ir/symint\.h)' "optim/ uses only public headers"
# The backend contract: loop IR, the contract itself, core vocabulary, and the host launch.
rule jit/backend '^(jit/(backend|loop)/|runtime/(core|ir)/|kernels/cpu/parallel\.h)' "the backend contract includes only the loop IR and core headers"
# A backend includes the loop IR, the contract, diagnostics, core vocabulary, its own folder and
# its device's kernels (the math its generated code calls).
for b in jit/cpu_llvm jit/cpu_asmjit; do
  [ -d "$b" ] && rule "$b" "^($b/|jit/(backend|loop|diag)/|runtime/core/|kernels/cpu/)" "a backend includes only the loop IR and the backend contract"
done
for b in jit/cuda; do
  [ -d "$b" ] && rule "$b" "^($b/|jit/(backend|loop|diag)/|runtime/core/|runtime/cuda/|kernels/cuda/)" "a backend includes only the loop IR, the backend contract and its device's runtime"
done
# Lowering and graph passes know no backend, no executor and no compile() front end.
rule jit/loop '^(jit/(loop|backend|graph)/|runtime/(core|ir|exec)/)' "lowering knows no backend"
rule jit/graph '^(jit/(graph|diag)/|runtime/(core|ir|exec)/)' "graph passes know no backend"
# Only the build's backend list names a backend folder.
while IFS= read -r f; do
  [ "$f" = jit/exec/builtin_backends.cpp ] && continue
  case "$f" in jit/cpu_*|jit/cuda*) continue ;; esac
  if grep -qE '#include "jit/(cpu_[a-z]+|cuda[a-z_]*)/' "$f"; then
    echo "$f includes a backend folder: only jit/exec/builtin_backends.cpp may"
    bad=1
  fi
done < <(find runtime kernels guards jit \( -name '*.h' -o -name '*.cpp' \))
exit $bad
