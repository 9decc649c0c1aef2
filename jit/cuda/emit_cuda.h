// Loop IR -> CUDA C++: one self-contained translation unit (no #include) holding an
// `extern "C" __global__` kernel with the kernel ABI's arguments, each GPU thread running
// parallel indices of [begin, end) in a grid-stride loop.
#pragma once
#include <string>

#include "jit/loop/loop_ir.h"
#include "runtime/core/dtype.h"

namespace kiln::jit {

// CUDA C++ source for `k` under the name `symbol` (throws kiln::Error for a dtype or op the
// emitter cannot express: float16/bfloat16 values, float-only ops on integers). Reduction
// kernels run a warp per parallel index (*lanes = 32: launch 32 threads per index), others a
// thread (*lanes = 1).
std::string emit_cuda(const Kernel& k, const std::string& symbol, int* lanes = nullptr);

// Whether emit_cuda can express `op` on `dtype` values (the CUDA target's lowering filter).
bool cuda_supports(OpKind op, DType dtype);

}  // namespace kiln::jit
