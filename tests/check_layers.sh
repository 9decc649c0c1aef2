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
# The executor and the pattern matcher sit below kiln::compile's front end: the include graph of
# jit/ is one-way (compile -> patterns, exec -> graph, loop, backend). The patterns may include
# their public header, jit/compile/patterns.h, and nothing else of jit/compile.
rule jit/exec '^(jit/(exec|patterns|graph|loop|backend|diag|dist|cpu_[a-z]+|cuda)/|runtime/|kernels/)' "the executor never includes jit/compile (compile()'s front end)"
rule jit/patterns '^(jit/(patterns|graph|diag)/|jit/compile/patterns\.h$|runtime/|kernels/)' "the patterns include only their public header from jit/compile"
rule jit/diag '^(jit/diag/|runtime/)' "diagnostics know no other jit layer"
# The distributed layer (docs/ARCHITECTURE.md, "The distributed layer (planned)"): checked as each folder lands.
# Process groups: one interface, one folder per backend, named only by runtime/dist/backends.cpp.
[ -d runtime/dist ] && rule runtime/dist '^runtime/(dist|core|ir|tensor|exec|cuda|ops|autograd)/' "process groups sit on the runtime only"
for b in runtime/dist/nccl runtime/dist/gloo runtime/dist/mpi; do
  [ -d "$b" ] && rule "$b" "^($b/|runtime/dist/[a-z_]+\.h$|runtime/(core|cuda)/)" "a collective backend includes only the process-group interface, core and its device's runtime"
done
if [ -d runtime/dist ]; then
  while IFS= read -r f; do
    [ "$f" = runtime/dist/backends.cpp ] && continue
    case "$f" in runtime/dist/nccl/*|runtime/dist/gloo/*|runtime/dist/mpi/*) continue ;; esac
    if grep -qE '#include "runtime/dist/(nccl|gloo|mpi)/' "$f"; then
      echo "$f includes a collective backend folder: only runtime/dist/backends.cpp may"
      bad=1
    fi
  done < <(find runtime jit guards \( -name '*.h' -o -name '*.cpp' \))
fi
# DTensor: placements, redistribution and the sharding rules per op family, over process groups.
[ -d runtime/dtensor ] && rule runtime/dtensor '^runtime/(dtensor/|dist/[a-z_]+\.h$|core/|ir/|tensor/|ops/|autograd/)' "DTensor uses the process-group interface, never a backend folder"
# Module-level parallelism (DDP, distribute_module, parallel styles) is written against public headers.
[ -d runtime/parallel ] && rule runtime/parallel '^runtime/(parallel/|core/|ops/ops\.h|tensor/tensor\.h|autograd/autograd\.h|ir/symint\.h|nn/nn\.h|optim/optim\.h|dist/dist\.h|dtensor/dtensor\.h)' "parallel/ uses only public headers"
# Collectives inside kiln::compile: graph nodes the executor runs; never compile()'s front end.
[ -d jit/dist ] && rule jit/dist '^(jit/(dist|graph|diag)/|runtime/)' "jit/dist includes the graph layer and the runtime only"
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
