// The JIT executor and the KILN_JIT switch.
#pragma once
#include <memory>

#include "runtime/exec/executor.h"

namespace kiln::jit {

// KILN_JIT: interp = the reference interpreter; llvm = LLVM kernels only; asmjit = asmjit
// kernels where the asmjit tier can compile them, LLVM otherwise; tiered (default) = asmjit
// at once, replaced by LLVM code compiled in the background (disk cache hits load LLVM code).
enum class JitMode { Interp, Llvm, Asmjit, Tiered };
// The mode from KILN_JIT (read once; throws kiln::Error on an unknown value).
JitMode jit_mode();
// The JIT executor (scheduler + fused kernels + code cache).
std::shared_ptr<Executor> jit_executor();

// GEMMs that ran with their pointwise epilogue fused (row blocks over TBB), since start.
uint64_t gemm_epilogue_runs();
// GEMM epilogues (of those) that wrote their output over the product.
uint64_t gemm_epilogue_in_place_runs();
// Kernel steps run on the interpreter because no kernel could be compiled for them, since start
// (KILN_LOG=jit says why, once per kernel).
uint64_t interpreted_kernel_runs();
// Kernel outputs written over the storage of the input they replace (donated state: a compiled
// program's optimizer update, Node::write_over).
uint64_t outputs_written_over_inputs();
// External inputs of lazy segments given back after their last reader because the segment held
// the only references to them (saved activations a lazy backward passes), since start.
uint64_t inputs_released();
// The most bytes any plan made since reset_planned_live_peak() holds live at once over its
// schedule (Plan::live_peak_bytes): the lower bound of a run's peak over what it was given.
double planned_live_peak();
void reset_planned_live_peak();
// Kernels split by their outputs because their arguments exceeded the launch limit, since start.
uint64_t wide_kernel_splits();

// A segment's schedule and compiled kernels bound to its node objects, made once and run many
// times with fresh input storage (kiln::compile replays programs this way).
class PreparedSegment {
 public:
  // Schedules and compiles `seg` (its inputs need not hold storage yet); the interpreter runs
  // it under KILN_JIT=interp. `seg` must outlive this object and keep its nodes.
  explicit PreparedSegment(Segment& seg);
  ~PreparedSegment();
  // Runs the segment: every `needed` node ends materialized; node inputs are kept.
  void run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::jit
