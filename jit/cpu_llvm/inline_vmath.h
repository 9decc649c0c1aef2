// Inline copies of kiln's own 16-lane exp and erf (kernels/cpu/vmath16.h) for LLVM kernels: the
// vectorizer calls `kiln_vm16_expf` / `kiln_vm16_erff`; defining them in the kernel's module and
// inlining them after the vectorizers saves each vector iteration a call and the spills of every
// live vector register around it. The bodies are the C++ functions' instruction sequences, op for
// op, so a value keeps its bits whether it is computed inline, by a call or by the interpreter.
#pragma once
#include <llvm/IR/Module.h>

namespace kiln::jit {

// Defines the 16-lane functions the process computes with kiln's own implementation
// (vmath::uses_own16) in `mod`, marked always-inline; no-op where the process uses a library's.
void define_inline_vector_math(llvm::Module& mod);

// After the optimization pipeline (whose last pass inlines always-inline functions): removes
// the definitions.
void drop_inline_vector_math(llvm::Module& mod);

}  // namespace kiln::jit
