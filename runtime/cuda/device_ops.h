// Device kernels for the ops the CUDA runtime computes itself (not generated, not cuBLAS):
// Contiguous, Cast, Cat, ViewScatter, Gather, Scatter, ScatterAdd, IndexSelect, IndexAdd,
// Cumsum, integer Remainder, Fmod and Pow, and fused Attention / AttentionBackward, from the templates of
// kernels/cuda/device_kernels.h, each instance compiled by NVRTC on first use and cached per device. Float scatter_add
// / index_add sum each destination in the CPU's order (a stable sort, no float atomics): the same bits on every run.
#pragma once
#include "runtime/ir/node.h"

namespace kiln::cu {

// Computes node `n` (on a CUDA device, inputs materialized there) into fresh dense storage
// with a device kernel queued on the device's stream. False, doing nothing, for what it does
// not handle (other ops, more than 8 dims after coalescing, no NVRTC). Bad indices, integer
// division by zero and negative integer exponents are found at the next cu::sync()
// (cuda_runtime.h).
bool run_device_op(Node& n);

// A dense row-major copy of materialized node `n`'s elements on its device (queued on the
// device's stream), as a node of its own; null where the copy kernel does not take it (more than
// 8 dims of size > 1, no NVRTC). For library calls that need a layout `n` does not have.
NodePtr dense_copy(const Node& n);

// The addresses of a batched GEMM's matrices, computed on the device (queued on its stream, so
// a recorded CUDA graph recomputes them from the same bases): a device array of 3 x batch
// addresses, c's, a's and b's in turn, for batch dims `sizes` with per-operand element strides;
// null where the kernel does not take it (more than 8 dims, no NVRTC).
std::shared_ptr<Storage> gemm_batch_pointers(Device device, const std::vector<int64_t>& sizes,
                                             const std::vector<std::vector<int64_t>>& strides,
                                             const std::vector<const void*>& bases, size_t itemsize);

}  // namespace kiln::cu
