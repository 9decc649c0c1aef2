// LLVM backend: loop IR -> LLVM IR -> optimized for the host CPU -> rewritten where LLVM 16's
// x86 backend would fail -> object code, loaded by ORC LLJIT. Transcendentals call libm and
// vectorize through SLEEF's vector-ABI functions.
#pragma once
#include <cstdint>
#include <string>

#include "jit/backend/kernel_abi.h"
#include "jit/loop/loop_ir.h"

namespace kiln::jit {

// LLVM IR text for a kernel named `symbol` (before optimization).
std::string emit_llvm_ir(const Kernel& k, const std::string& symbol);
// Compiles a kernel to a relocatable object for the host CPU (O3, vectorized).
std::string compile_to_object(const Kernel& k, const std::string& symbol, std::string* optimized_ir = nullptr);
// The back half of compile_to_object for already optimized LLVM IR text (a KILN_DUMP .opt.ll,
// tests): the rewrite that keeps IR LLVM 16's x86 backend cannot compile from reaching it (lane
// reads of i1 vectors go through bytes), then code generation for `cpu` ("" = the host CPU and
// features) plus `features` ("+avx512f,-fma", ...). `lanes_rewritten` (optional) receives the
// number of lane reads rewritten.
std::string compile_ir_to_object(const std::string& ir, const std::string& cpu = "", const std::string& features = "",
                                 int* lanes_rewritten = nullptr);
// Loads an object produced by compile_to_object into the process JIT and returns `symbol`.
KernelFn load_object(const std::string& object, const std::string& symbol);
// LLVM version and host CPU name + features (part of the on-disk cache key).
std::string llvm_target_id();
// The data layout of host kernels (creates a TargetMachine, which is costly).
std::string host_data_layout();
// Gives the JIT its data layout (host_data_layout() saved by an earlier process); only has an
// effect before the first load_object().
void set_jit_data_layout(const std::string& layout);

}  // namespace kiln::jit
