// Batched GEMM on OpenBLAS (sgemm / dgemm). Operands with a unit stride in either of their
// last two dims go to BLAS directly (as N or T); others are packed first.
#include <cblas.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/reference.h"
#include "runtime/core/error.h"

namespace kiln::kernels {
namespace {

template <class T>
struct Mat {
  const T* p;
  CBLAS_TRANSPOSE trans;
  int64_t ld;
};

// Describes a [rows, cols] matrix at p with strides (rs, cs) for BLAS, packing into `buf` if needed.
template <class T, class S>
Mat<T> prepare(const S* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs, std::vector<T>& buf) {
  if constexpr (std::is_same_v<T, S>) {
    if (cs == 1 && (rows == 1 || rs >= std::max<int64_t>(cols, 1))) return {p, CblasNoTrans, std::max<int64_t>({rs, cols, 1})};
    if (rs == 1 && (cols == 1 || cs >= std::max<int64_t>(rows, 1))) return {p, CblasTrans, std::max<int64_t>({cs, rows, 1})};
  }
  buf.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) buf[i * cols + j] = static_cast<T>(static_cast<compute_t<S>>(p[i * rs + j * cs]));
  return {buf.data(), CblasNoTrans, std::max<int64_t>(cols, 1)};
}

template <class T>
void gemm(const Mat<T>& a, const Mat<T>& b, T* c, int64_t m, int64_t n, int64_t k, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, a.trans, b.trans, m, n, k, 1.0f, a.p, a.ld, b.p, b.ld, 0.0f, c, ldc);
  else
    cblas_dgemm(CblasRowMajor, a.trans, b.trans, m, n, k, 1.0, a.p, a.ld, b.p, b.ld, 0.0, c, ldc);
}

template <class S>
void matmul_typed(const Operand& out, const Operand& a, const Operand& b) {
  using T = std::conditional_t<std::is_same_v<S, double>, double, float>;  // compute type
  const size_t r = out.sizes.size();
  const int64_t m = out.sizes[r - 2], n = out.sizes[r - 1], k = a.sizes[r - 1];
  std::vector<int64_t> batch(out.sizes.begin(), out.sizes.end() - 2);
  auto bst = [&](const Operand& o) { return std::vector<int64_t>(o.strides.begin(), o.strides.end() - 2); };
  const int64_t ars = a.strides[r - 2], acs = a.strides[r - 1], brs = b.strides[r - 2], bcs = b.strides[r - 1];
  const int64_t ors = out.strides[r - 2];
  nd_for<3>(
      batch, {bst(out), bst(a), bst(b)},
      [&](const std::array<int64_t, 3>& off, int64_t cnt, const std::array<int64_t, 3>& st) {
        std::vector<T> abuf, bbuf, cbuf;
        for (int64_t i = 0; i < cnt; ++i) {
          const S* ap = a.ptr<S>() + off[1] + i * st[1];
          const S* bp = b.ptr<S>() + off[2] + i * st[2];
          S* cp = out.ptr<S>() + off[0] + i * st[0];
          Mat<T> A = prepare<T, S>(ap, m, k, ars, acs, abuf);
          Mat<T> B = prepare<T, S>(bp, k, n, brs, bcs, bbuf);
          if constexpr (std::is_same_v<S, T>) {
            if (k == 0) {
              for (int64_t x = 0; x < m * n; ++x) cp[(x / n) * ors + x % n] = 0;
            } else {
              gemm<T>(A, B, cp, m, n, k, ors);
            }
          } else {
            cbuf.assign(static_cast<size_t>(m * n), T(0));
            if (k > 0) gemm<T>(A, B, cbuf.data(), m, n, k, std::max<int64_t>(n, 1));
            for (int64_t x = 0; x < m * n; ++x) cp[(x / n) * ors + x % n] = static_cast<S>(cbuf[x]);
          }
        }
      },
      /*serial=*/true);
}

// Integer matmul (PyTorch supports it on the CPU; BLAS has no integer GEMM): exact int64
// accumulation, wrapping like PyTorch on overflow.
template <class T>
void matmul_int(const Operand& out, const Operand& a, const Operand& b) {
  const size_t r = out.sizes.size();
  const int64_t m = out.sizes[r - 2], n = out.sizes[r - 1], k = a.sizes[r - 1];
  std::vector<int64_t> batch(out.sizes.begin(), out.sizes.end() - 2);
  auto bst = [&](const Operand& o) { return std::vector<int64_t>(o.strides.begin(), o.strides.end() - 2); };
  nd_for<3>(batch, {bst(out), bst(a), bst(b)},
            [&](const std::array<int64_t, 3>& off, int64_t cnt, const std::array<int64_t, 3>& st) {
              for (int64_t q = 0; q < cnt; ++q) {
                const T* ap = a.ptr<T>() + off[1] + q * st[1];
                const T* bp = b.ptr<T>() + off[2] + q * st[2];
                T* cp = out.ptr<T>() + off[0] + q * st[0];
                for (int64_t i = 0; i < m; ++i)
                  for (int64_t j = 0; j < n; ++j) {
                    uint64_t acc = 0;
                    for (int64_t l = 0; l < k; ++l)
                      acc += static_cast<uint64_t>(static_cast<int64_t>(ap[i * a.strides[r - 2] + l * a.strides[r - 1]]) *
                                                   static_cast<int64_t>(bp[l * b.strides[r - 2] + j * b.strides[r - 1]]));
                    cp[i * out.strides[r - 2] + j * out.strides[r - 1]] = static_cast<T>(acc);
                  }
              }
            });
}

template <class T>
void row_blocks_typed(const Operand& out, const Operand& a, const Operand& b,
                      const std::function<void(int64_t, int64_t)>& epilogue) {
  const int64_t m = out.sizes[0], n = out.sizes[1], k = a.sizes[1];
  const int64_t threads = std::max(1, tbb::this_task_arena::max_concurrency());
  const int64_t block = std::max<int64_t>(32, (m + 2 * threads - 1) / (2 * threads));
  const int64_t blocks = (m + block - 1) / block;
  // One BLAS thread per block: TBB provides the parallelism (no spinning BLAS pool beside it).
  const int saved = openblas_get_num_threads();
  openblas_set_num_threads(1);
  parallel_for(int64_t{0}, blocks, [&](int64_t i) {
    const int64_t r0 = i * block, r1 = std::min(m, r0 + block);
    std::vector<T> abuf, bbuf;
    Mat<T> A = prepare<T, T>(a.ptr<T>() + r0 * a.strides[0], r1 - r0, k, a.strides[0], a.strides[1], abuf);
    Mat<T> B = prepare<T, T>(b.ptr<T>(), k, n, b.strides[0], b.strides[1], bbuf);
    T* c = out.ptr<T>() + r0 * out.strides[0];
    if (k == 0) {
      for (int64_t r = 0; r < r1 - r0; ++r)
        for (int64_t j = 0; j < n; ++j) c[r * out.strides[0] + j] = 0;
    } else {
      gemm<T>(A, B, c, r1 - r0, n, k, out.strides[0]);
    }
    epilogue(r0, r1);
  });
  openblas_set_num_threads(saved);
}

}  // namespace

bool matmul_row_blocks(const Operand& out, const Operand& a, const Operand& b,
                       const std::function<void(int64_t, int64_t)>& epilogue) {
  if (out.sizes.size() != 2 || a.sizes.size() != 2 || b.sizes.size() != 2) return false;
  if (out.dtype != a.dtype || out.dtype != b.dtype || out.strides[1] != 1 || out.strides[0] < out.sizes[1]) return false;
  if (out.sizes[0] == 0) return true;
  if (out.dtype == DType::Float32) row_blocks_typed<float>(out, a, b, epilogue);
  else if (out.dtype == DType::Float64) row_blocks_typed<double>(out, a, b, epilogue);
  else return false;
  return true;
}

void matmul(const Operand& out, const Operand& a, const Operand& b) {
  if (out.numel() == 0) return;
  // A tall 2-D product: row blocks over TBB with one BLAS thread each (BLAS's own thread pool
  // would spin beside TBB's workers).
  if (out.sizes.size() == 2 && out.sizes[0] >= 256 && matmul_row_blocks(out, a, b, [](int64_t, int64_t) {})) return;
  switch (out.dtype) {
    case DType::Float32: return matmul_typed<float>(out, a, b);
    case DType::Float64: return matmul_typed<double>(out, a, b);
    case DType::Float16: return matmul_typed<Half>(out, a, b);
    case DType::BFloat16: return matmul_typed<BFloat16>(out, a, b);
    case DType::Int32: return matmul_int<int32_t>(out, a, b);
    case DType::Int64: return matmul_int<int64_t>(out, a, b);
    default: throw Error(detail::cat("matmul: unsupported dtype ", dtype_name(out.dtype)));
  }
}

}  // namespace kiln::kernels
