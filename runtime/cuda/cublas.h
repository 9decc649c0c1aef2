// cuBLAS, loaded at run time (libcublas.so.13 / .12): GEMM and batched GEMM of Matmul nodes on
// the device's stream.
#pragma once
#include <cublas_api.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "runtime/ir/node.h"

namespace kiln::cu {

// Whether libcublas was found (and why not: "" when it was).
bool have_cublas();
const std::string& cublas_unavailable_reason();

// Computes Matmul node `n` ([..., M, K] x [..., K, N], inputs materialized on its CUDA device)
// into fresh device memory with cuBLAS. Returns false, computing nothing, for what cuBLAS cannot
// take as it is: integer dtypes, or operand layouts that are not (batched, transposed) matrices.
bool gemm(Node& n);

// A row-major operand [rows, cols] with strides (srow, scol) as cuBLAS's column-major
// [cols, rows] matrix: op N with leading dimension srow, or its transpose (op T, ld scol) when
// the operand is column-major. False for other layouts (broadcast rows, general strides).
bool as_column_major(int64_t rows, int64_t cols, int64_t srow, int64_t scol, cublasOperation_t& op, int64_t& ld);
// Throws a kiln::Error naming `library`, the call `what` and status `s` unless it is success
// (cuBLAS and cuBLASLt share the status codes).
void check_status(cublasStatus_t s, const char* library, const char* what);
// Scratch memory cuBLAS and cuBLASLt calls on device `index` work in: one block of
// kBlasWorkspace bytes per device, kept for the process (calls ordered on one stream take turns;
// set explicitly so cuBLAS allocates nothing per stream, graph recordings included).
constexpr size_t kBlasWorkspace = size_t{32} << 20;
void* blas_workspace(int index);
// Held while a cuBLAS or cuBLASLt call, or a CUDA graph replay (its captured GEMMs), queues work
// that uses the workspace: one library call's kernels (a split-K GEMM and its reduction) must
// stay adjacent on the stream, never with another thread's call between them. Allocate a call's
// output before taking it and before cu::enter() (a freed block's last user is queued by then).
std::mutex& blas_mutex();
// cuBLAS's data and compute types for a floating dtype (TF32 as set_float32_matmul_precision
// allows); false for other dtypes.
bool cuda_type(DType d, cudaDataType_t& t, cublasComputeType_t& c);

}  // namespace kiln::cu
