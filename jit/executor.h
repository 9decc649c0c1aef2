// The JIT executor and the KILN_JIT switch.
#pragma once
#include <memory>

#include "runtime/executor.h"

namespace kiln::jit {

enum class JitMode { Interp, Llvm };
// KILN_JIT: interp -> the reference interpreter; llvm/tiered/asmjit (default) -> the LLVM JIT.
JitMode jit_mode();
// The LLVM-backed executor (scheduler + fused kernels + code cache).
std::shared_ptr<Executor> jit_executor();

}  // namespace kiln::jit
