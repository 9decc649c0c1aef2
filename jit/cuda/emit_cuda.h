// Loop IR -> CUDA C++: one self-contained translation unit (no #include) holding an
// `extern "C" __global__` kernel with the kernel ABI's arguments, each GPU thread (or group of
// lanes) running parallel indices of [begin, end) in a grid-stride loop.
#pragma once
#include <string>

#include "jit/loop/loop_ir.h"
#include "runtime/core/dtype.h"

namespace kiln::jit {

// Threads per block of every kernel (their __launch_bounds__), but those of few long indices.
constexpr int kCudaBlock = 256;
// Threads per block (and lanes per index) of kernels with few long indices.
constexpr int kCudaWideBlock = 1024;

// The bytes of parameters a kernel launch may pass: every driver takes 4096; sm_70+ devices with a
// CUDA 12.1+ driver and compiler take 32764 (cuda_backend.cpp asks the device which holds).
constexpr size_t kCudaParamBytes = 4096;
constexpr size_t kCudaLargeParamBytes = 32764;

// CUDA C++ source for `k` under the name `symbol` (throws kiln::Error for a dtype or op the
// emitter cannot express: float16/bfloat16 values, float-only ops on integers; or arguments taking
// more than `param_bytes`, launch_arg_bytes). *lanes: the
// threads per parallel index to launch (blocks of max(kCudaBlock, lanes) threads): reduction kernels run a warp per
// index (32), or a whole block (kCudaWideBlock) when the kernel has few long indices; others a thread (1).
// *shared_bytes: the dynamic shared memory per block to launch with (the row cache of short-row reductions).
std::string emit_cuda(const Kernel& k, const std::string& symbol, int* lanes = nullptr, int* shared_bytes = nullptr,
                      size_t param_bytes = kCudaParamBytes);

// Whether emit_cuda can express `op` on `dtype` values (the CUDA target's lowering filter).
bool cuda_supports(OpKind op, DType dtype);

}  // namespace kiln::jit
