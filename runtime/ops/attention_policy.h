// Which form scaled_dot_product_attention takes (kiln::sdpa_kernel, runtime/ops/sdpa_kernel.h).
// On CUDA, 16-bit inputs take the tensor-core kernels at every size (sm_80 and later); float32
// and float64 have CUDA-core kernels only, slower than the materialized graph — batched cuBLAS
// products around one fused softmax kernel — wherever the Tq x Tk scores fit comfortably (H100,
// docs/BENCHMARKS.md); there they are worth only the memory they save. Shared by the op itself and
// by the pattern that rewrites hand-written attention into it, so both choose alike. Internal to
// runtime/ and jit/patterns.
#pragma once
#include <cstdint>

#include "runtime/ops/sdpa_kernel.h"
#include "runtime/tensor/tensor.h"

namespace kiln::detail {

// Under SdpaBackend::Auto, scores of at least this many bytes take the fused kernels on the GPU.
constexpr double kMinGpuFusedScoresBytes = double(int64_t{1} << 30);

// Whether attention over q [..., Tq, D] and k [..., Tk, D] runs as the materialized graph on this
// thread: always under Math, never under Fused; under Auto on CUDA for 16-bit inputs where the
// device has no tensor-core kernels, for float32 inputs there and float64 ones when every size is
// known and the scores take less than kMinGpuFusedScoresBytes (symbolic sizes may grow); never
// elsewhere.
bool attention_materializes(const Tensor& q, const Tensor& k);

// This thread's backend as a guard key (0: Auto) for kiln::compile's entries.
uint8_t sdpa_backend_key();

}  // namespace kiln::detail
