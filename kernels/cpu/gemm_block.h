// One single-threaded BLAS product on dense row-major blocks, for kernels that tile their own
// work (attention): c = alpha · op(a) · op(b) + beta · c; and which library computes them.
#pragma once
#include <cstdint>

namespace kiln::kernels {

// op(a) is [m, k] (a stored [k, m] when ta), op(b) is [k, n] (b stored [n, k] when tb);
// lda/ldb/ldc are row strides in elements. float and double.
template <class T>
void gemm_block(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                int64_t ldb, T beta, T* c, int64_t ldc);

// The library behind float32 products: "onednn" (libdnnl.so.2 loaded) or "openblas" (KILN_GEMM).
const char* sgemm_library();

}  // namespace kiln::kernels
