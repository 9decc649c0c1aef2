// cuBLASLt, loaded at run time (libcublasLt.so.13 / .12): GEMMs whose pointwise epilogue runs in
// the GEMM kernel (bias, bias + ReLU), on the device's stream.
#pragma once
#include <string>

#include "runtime/ir/node.h"

namespace kiln::cu {

// Whether libcublasLt was found (and why not: "" when it was).
bool have_cublaslt();
const std::string& cublaslt_unavailable_reason();

// out = a b + bias, then ReLU when `relu`: `a` [M, K] and `b` [K, N] float32 matrices (any
// layout cuBLAS takes as a matrix), `bias` [N] or a view of it broadcast over the rows, all
// materialized on out's CUDA device; out gets fresh device memory. Returns false, computing
// nothing, when cuBLASLt is missing or the dtypes or layouts do not fit.
bool gemm_bias(Node& out, const Node& a, const Node& b, const Node& bias, bool relu);

}  // namespace kiln::cu
