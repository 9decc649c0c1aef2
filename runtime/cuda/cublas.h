// cuBLAS, loaded at run time (libcublas.so.13 / .12): GEMM and batched GEMM of Matmul nodes on
// the device's stream.
#pragma once
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

}  // namespace kiln::cu
