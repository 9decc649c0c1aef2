// The JIT executor and the KILN_JIT switch.
#pragma once
#include <memory>

#include "runtime/executor.h"

namespace kiln::jit {

// KILN_JIT: interp = the reference interpreter; llvm = LLVM kernels only; asmjit = asmjit
// kernels where the asmjit tier can compile them, LLVM otherwise; tiered (default) = asmjit
// at once, replaced by LLVM code compiled in the background (disk cache hits load LLVM code).
enum class JitMode { Interp, Llvm, Asmjit, Tiered };
// The mode from KILN_JIT (read once; throws kiln::Error on an unknown value).
JitMode jit_mode();
// The JIT executor (scheduler + fused kernels + code cache).
std::shared_ptr<Executor> jit_executor();

// A segment's schedule and compiled kernels, made once and run many times over the same node
// objects with fresh input storage (kiln::compile replays programs this way).
struct Plan;
// Schedules and compiles `seg` (its inputs need not hold storage yet); null under KILN_JIT=interp.
std::shared_ptr<const Plan> prepare_segment(Segment& seg);
// Runs `seg` by `plan` (the interpreter when null). Every `needed` node ends materialized; node
// inputs are kept.
void run_segment(const Plan* plan, Segment& seg);

}  // namespace kiln::jit
