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

// A segment's schedule and compiled kernels, made once and run many times over the same node
// objects with fresh input storage (kiln::compile replays programs this way).
struct Plan;
// Schedules and compiles `seg` (its inputs need not hold storage yet); null under KILN_JIT=interp.
std::shared_ptr<const Plan> prepare_segment(Segment& seg);
// Runs `seg` by `plan` (the interpreter when null). Every `needed` node ends materialized; node
// inputs are kept.
void run_segment(const Plan* plan, Segment& seg);

}  // namespace kiln::jit
