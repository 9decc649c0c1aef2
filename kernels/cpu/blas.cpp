// Batched GEMM on oneDNN's sgemm where it is installed, else OpenBLAS (float32), and OpenBLAS's
// dgemm (float64). Operands with a unit stride in either of their last two dims go to BLAS
// directly (as N or T); others are packed first.
//
// Threads: OpenBLAS runs single-threaded in a kiln process, and kiln's GEMMs get their
// parallelism from TBB instead: each product is cut into tiles (row blocks × column blocks,
// and the batch), one single-threaded BLAS call per tile. So BLAS never runs more threads than
// TBB lets kiln use (the arena's concurrency, which follows the process affinity mask, capped
// by a tbb::global_control), and no OpenBLAS pool spins beside TBB's workers.
#include <cblas.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <array>
#include <vector>

#include "kernels/cpu/gemm_block.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/reference.h"
#include "runtime/core/error.h"

namespace kiln::kernels {
namespace {

// OpenBLAS at one thread. The count is process-wide in OpenBLAS's pthreads build (set once; set
// again only if someone else changed it, never saved and restored around a call) and per calling
// thread in its OpenMP build (each thread sets its own once).
void single_threaded_blas() {
  static const bool openmp = openblas_get_parallel() == 2;
  if (openmp) {
    thread_local const bool set = (openblas_set_num_threads(1), true);
    (void)set;
  } else if (openblas_get_num_threads() != 1) {
    openblas_set_num_threads(1);
  }
}
// OpenBLAS's pthreads build starts its worker pool when it is loaded (one thread per core of the
// affinity mask, unless OPENBLAS_NUM_THREADS says otherwise), and each worker spins on
// sched_yield for a while before it sleeps. Once kiln has set one thread the pool is never used:
// at load, kiln ends it (the same shutdown OpenBLAS itself runs before every fork; a later
// threaded call, by someone who raised the count again, starts it anew).
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));
const bool g_blas_single = [] {
  single_threaded_blas();
  if (openblas_get_parallel() == 1 && blas_thread_shutdown_) blas_thread_shutdown_();
  return true;
}();

// ---- the float32 GEMM library ----
// oneDNN's sgemm (the C API's dnnl_sgemm, libdnnl.so.2, installed by setup.sh) where it loads:
// faster than OpenBLAS on kiln's products and on the W2 step end to end (bench/bench_gemm;
// figures in docs/BENCHMARKS.md).
// Loaded at first use, like a plugin, so that a machine without it runs on OpenBLAS;
// KILN_GEMM=openblas keeps OpenBLAS, KILN_GEMM=onednn insists on oneDNN. Its OpenMP runtime runs
// one thread per calling thread (each call sets the calling thread's count back to 1 when the
// application raised it), so its products stay on kiln's tiles as OpenBLAS's do.
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
struct Onednn {
  DnnlSgemm sgemm = nullptr;
  void (*omp_set_num_threads)(int) = nullptr;
  int (*omp_get_max_threads)() = nullptr;
};
const Onednn& onednn() {
  static const Onednn lib = [] {
    Onednn l;
    const char* want = std::getenv("KILN_GEMM");
    const std::string w = want ? want : "";
    KILN_CHECK(w.empty() || w == "openblas" || w == "onednn", "KILN_GEMM: expected openblas or onednn, got '", w, "'");
    if (w == "openblas") return l;
    void* h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    void* omp = h ? dlopen("libgomp.so.1", RTLD_NOW | RTLD_LOCAL) : nullptr;  // (libdnnl's own dependency)
    if (h && omp) {
      l.sgemm = reinterpret_cast<DnnlSgemm>(dlsym(h, "dnnl_sgemm"));
      l.omp_set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(omp, "omp_set_num_threads"));
      l.omp_get_max_threads = reinterpret_cast<int (*)()>(dlsym(omp, "omp_get_max_threads"));
    }
    if (!l.sgemm || !l.omp_set_num_threads || !l.omp_get_max_threads) {
      KILN_CHECK(w.empty(), "KILN_GEMM=onednn: oneDNN does not load (", h ? "no dnnl_sgemm" : dlerror(),
                 "); install libdnnl2 or unset KILN_GEMM");
      l = {};
    }
    return l;
  }();
  return lib;
}

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
    if (cs == 1 && (rows == 1 || rs >= std::max<int64_t>(cols, 1)))
      return {p, CblasNoTrans, std::max<int64_t>({rs, cols, 1})};
    if (rs == 1 && (cols == 1 || cs >= std::max<int64_t>(rows, 1)))
      return {p, CblasTrans, std::max<int64_t>({cs, rows, 1})};
  }
  buf.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      buf[i * cols + j] = static_cast<T>(static_cast<compute_t<S>>(p[i * rs + j * cs]));
  return {buf.data(), CblasNoTrans, std::max<int64_t>(cols, 1)};
}

// c = alpha op(a) op(b) + beta c, row-major, single-threaded, in float32 on oneDNN when it is
// used (sgemm_library()), else (and in float64) on OpenBLAS.
template <class T>
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
               int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (const Onednn& dnnl = onednn(); dnnl.sgemm) {
      // OpenMP's count is per calling thread, and the application may have raised it on this one
      // (its own omp_set_num_threads): checked on every call, not only the first.
      if (dnnl.omp_get_max_threads() != 1) dnnl.omp_set_num_threads(1);
      const int status = dnnl.sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      KILN_CHECK(status == 0, "matmul: oneDNN's sgemm failed (status ", status, ") for ", m, "x", k, "x", n);
      return;
    }
  }
  single_threaded_blas();
  const auto t = [](bool x) { return x ? CblasTrans : CblasNoTrans; };
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, t(ta), t(tb), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    cblas_dgemm(CblasRowMajor, t(ta), t(tb), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <class T>
void gemm(const Mat<T>& a, const Mat<T>& b, T* c, int64_t m, int64_t n, int64_t k, int64_t ldc) {
  blas_gemm<T>(a.trans == CblasTrans, b.trans == CblasTrans, m, n, k, T(1), a.p, a.ld, b.p, b.ld, T(0), c, ldc);
}

// Threads kiln may use here: the current arena's concurrency (TBB's default follows the process
// affinity mask) capped by a tbb::global_control limit.
int gemm_threads() {
  const size_t limit = tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(tbb::this_task_arena::max_concurrency(), limit)));
}

// How a batch of m×n×k products is cut: `tiles` tiles in all (1: one serial loop), each product
// into rt × ct tiles of `rows` × `cols`.
struct Grid {
  int64_t tiles, rt, ct, rows, cols;
};
constexpr double kTileFlops = 1 << 21;  // the least work worth a task (~2 MFLOP)
// Slack for uneven progress (a core shared with other work), and no more: each tile packs its
// panels of A and B again, so 4 tiles a thread ran W2 slower than 2 (docs/BENCHMARKS.md).
constexpr int64_t kTilesPerThread = 2;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

Grid plan(int64_t m, int64_t n, int64_t k, int64_t batch, int threads) {
  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(std::max<int64_t>(k, 1));
  const double total = flops * static_cast<double>(batch);
  int64_t want = 1;
  if (threads > 1)
    want = static_cast<int64_t>(std::clamp(total / kTileFlops, 1.0, static_cast<double>(kTilesPerThread * threads)));
  Grid best{want > 1 ? batch : 1, 1, 1, m, n};
  const int64_t per = ceil_div(want, batch);  // tiles wanted per product
  if (per <= 1) return best;
  // Among the cuts into at most `per` tiles (rows in multiples of 8, columns of 16, for BLAS's
  // micro-kernels), the one with the most tiles, then the squarest: a tile packs its rows of A
  // and its columns of B, k·(rows + cols) values for 2·rows·cols·k flops. Sides of at least 64,
  // or of 32 or 16 where that leaves a thread idle.
  for (int64_t side : {64, 32, 16}) {
    const int64_t max_rt = std::max<int64_t>(1, m / side), max_ct = std::max<int64_t>(1, n / side);
    double best_cost = 0;
    int64_t best_got = 0;
    for (int64_t rt = 1; rt <= std::min(per, max_rt); ++rt) {
      const int64_t ct = std::min(per / rt, max_ct);
      const int64_t rows = std::min(m, ceil_div(ceil_div(m, rt), 8) * 8);
      const int64_t cols = std::min(n, ceil_div(ceil_div(n, ct), 16) * 16);
      const int64_t got = ceil_div(m, rows) * ceil_div(n, cols);
      const double cost = static_cast<double>(rows + cols) / (static_cast<double>(rows) * static_cast<double>(cols));
      if (got > best_got || (got == best_got && cost < best_cost)) {
        best = {0, ceil_div(m, rows), ceil_div(n, cols), rows, cols};
        best_got = got;
        best_cost = cost;
      }
    }
    if (best_got * batch >= std::min<int64_t>(want, threads)) break;
  }
  best.tiles = batch * best.rt * best.ct;
  return best;
}

// out = a·b over the batch dims (a and b broadcast to out's), in tiles over TBB; after all of a
// row block's columns are computed, `epilogue(r0, r1)` (2-D only) runs on its rows.
template <class S>
void gemm_tiled(const Operand& out, const Operand& a, const Operand& b,
                const std::function<void(int64_t, int64_t)>* epilogue) {
  using T = std::conditional_t<std::is_same_v<S, double>, double, float>;  // compute type
  const size_t r = out.sizes.size();
  const int64_t m = out.sizes[r - 2], n = out.sizes[r - 1], k = a.sizes[r - 1];
  const int64_t ars = a.strides[r - 2], acs = a.strides[r - 1], brs = b.strides[r - 2], bcs = b.strides[r - 1];
  const int64_t ors = out.strides[r - 2];
  // Element offsets of (out, a, b) for each product of the batch.
  std::vector<std::array<int64_t, 3>> offs;
  std::vector<int64_t> batch(out.sizes.begin(), out.sizes.end() - 2);
  auto bst = [&](const Operand& o) { return std::vector<int64_t>(o.strides.begin(), o.strides.end() - 2); };
  nd_for<3>(
      batch, {bst(out), bst(a), bst(b)},
      [&](const std::array<int64_t, 3>& off, int64_t cnt, const std::array<int64_t, 3>& st) {
        for (int64_t i = 0; i < cnt; ++i) offs.push_back({off[0] + i * st[0], off[1] + i * st[1], off[2] + i * st[2]});
      },
      /*serial=*/true);
  const Grid g = plan(m, n, k, static_cast<int64_t>(offs.size()), gemm_threads());

  auto tile = [&](const std::array<int64_t, 3>& off, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const int64_t mt = r1 - r0, nt = c1 - c0;
    S* cp = out.ptr<S>() + off[0] + r0 * ors + c0;
    if (k == 0) {
      for (int64_t i = 0; i < mt; ++i)
        for (int64_t j = 0; j < nt; ++j) cp[i * ors + j] = S(0);
      return;
    }
    std::vector<T> abuf, bbuf;
    Mat<T> A = prepare<T, S>(a.ptr<S>() + off[1] + r0 * ars, mt, k, ars, acs, abuf);
    Mat<T> B = prepare<T, S>(b.ptr<S>() + off[2] + c0 * bcs, k, nt, brs, bcs, bbuf);
    if constexpr (std::is_same_v<S, T>) {
      gemm<T>(A, B, cp, mt, nt, k, ors);
    } else {
      std::vector<T> cbuf(static_cast<size_t>(mt * nt));
      gemm<T>(A, B, cbuf.data(), mt, nt, k, std::max<int64_t>(nt, 1));
      for (int64_t i = 0; i < mt; ++i)
        for (int64_t j = 0; j < nt; ++j) cp[i * ors + j] = static_cast<S>(cbuf[i * nt + j]);
    }
  };
  // One row block of one product: its column tiles (in parallel when several), then the epilogue.
  auto row_block = [&](int64_t item) {
    const auto& off = offs[static_cast<size_t>(item / g.rt)];
    const int64_t r0 = (item % g.rt) * g.rows, r1 = std::min(m, r0 + g.rows);
    if (g.ct == 1) {
      tile(off, r0, r1, 0, n);
    } else {
      parallel_for(int64_t{0}, g.ct, [&](int64_t j) { tile(off, r0, r1, j * g.cols, std::min(n, (j + 1) * g.cols)); });
    }
    if (epilogue) (*epilogue)(r0, r1);
  };
  const int64_t items = static_cast<int64_t>(offs.size()) * g.rt;
  if (g.tiles <= 1 || items == 1) {
    for (int64_t i = 0; i < items; ++i) row_block(i);
  } else {
    parallel_for(int64_t{0}, items, row_block);
  }
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
                      acc +=
                          static_cast<uint64_t>(static_cast<int64_t>(ap[i * a.strides[r - 2] + l * a.strides[r - 1]]) *
                                                static_cast<int64_t>(bp[l * b.strides[r - 2] + j * b.strides[r - 1]]));
                    cp[i * out.strides[r - 2] + j * out.strides[r - 1]] = static_cast<T>(acc);
                  }
              }
            });
}

}  // namespace

template <class T>
void gemm_block(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  blas_gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char* sgemm_library() { return onednn().sgemm ? "onednn" : "openblas"; }
template void gemm_block<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                                int64_t, float, float*, int64_t);
template void gemm_block<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                                 int64_t, double, double*, int64_t);

bool matmul_row_blocks(const Operand& out, const Operand& a, const Operand& b,
                       const std::function<void(int64_t, int64_t)>& epilogue) {
  if (out.sizes.size() != 2 || a.sizes.size() != 2 || b.sizes.size() != 2) return false;
  if (out.dtype != a.dtype || out.dtype != b.dtype || out.strides[1] != 1 || out.strides[0] < out.sizes[1])
    return false;
  if (out.sizes[0] == 0) return true;
  if (out.dtype == DType::Float32)
    gemm_tiled<float>(out, a, b, &epilogue);
  else if (out.dtype == DType::Float64)
    gemm_tiled<double>(out, a, b, &epilogue);
  else
    return false;
  return true;
}

void matmul(const Operand& out, const Operand& a, const Operand& b) {
  if (out.numel() == 0) return;
  switch (out.dtype) {
    case DType::Float32: return gemm_tiled<float>(out, a, b, nullptr);
    case DType::Float64: return gemm_tiled<double>(out, a, b, nullptr);
    case DType::Float16: return gemm_tiled<Half>(out, a, b, nullptr);
    case DType::BFloat16: return gemm_tiled<BFloat16>(out, a, b, nullptr);
    case DType::Int32: return matmul_int<int32_t>(out, a, b);
    case DType::Int64: return matmul_int<int64_t>(out, a, b);
    default: throw Error(detail::cat("matmul: unsupported dtype ", dtype_name(out.dtype)));
  }
}

}  // namespace kiln::kernels
