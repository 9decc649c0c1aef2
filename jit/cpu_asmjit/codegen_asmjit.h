// asmjit backend, the fast tier: the loop IR of a pointwise kernel straight to x86-64 machine
// code (no optimizer; innermost loops vectorized with AVX2 where the IR allows), with the
// kernel ABI (jit/backend/kernel_abi.h), so the executor runs either tier the same way.
#pragma once
#include <stdexcept>

#include "jit/backend/kernel_abi.h"
#include "jit/loop/loop_ir.h"

namespace kiln::jit {

// Thrown when the asmjit tier cannot compile a kernel (the caller falls back to LLVM).
struct AsmjitError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Whether a kernel is of the shape the asmjit tier takes at all (pointwise: no accumulators).
bool asmjit_supports(const Kernel& k);
// Compiles a kernel to machine code that stays loaded for the life of the process.
KernelFn compile_asmjit(const Kernel& k);

}  // namespace kiln::jit
