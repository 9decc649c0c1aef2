// GEMM libraries on the shapes kiln's CPU workloads multiply (issue "CPU speed", deliverable 2):
// OpenBLAS (kiln's BLAS), BLIS, oneDNN (dnnl_sgemm) and libxsmm (JIT-generated batch-reduce
// kernels over 64-blocks), single precision, 1 and N threads, median of repeated runs; and
// kiln itself (kiln::matmul, eager: its TBB tiles over one-thread BLAS calls, as W2 runs). Each
// library is loaded with dlopen(RTLD_LOCAL | RTLD_DEEPBIND), so their cblas symbols do not
// collide; a library that is not installed is reported as missing. Prints one JSON line per
// (shape, library, threads) with GFLOP/s, and checks every result against OpenBLAS's.
//   bench_gemm [--threads N] [--min-ms T]
// (bench/run.sh does not run it: the table of docs/BENCHMARKS.md comes from it, run pinned.)
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <tbb/global_control.h>

#include "kiln.h"

#ifdef KILN_BENCH_XSMM
#define __BLAS 0  // (libxsmm's BLAS fallback off: its kernels alone are measured)
#include <libxsmm_source.h>
#endif

namespace {

struct Shape {
  const char* where;  // the workload and the product
  int64_t m, k, n;
  bool ta, tb;  // a is stored [k, m] / b is stored [n, k]
};

// W2 (batch 4096, 64-256-256-8) forward and backward; the transformer block of bench_attention
// (4096 tokens, model 256, MLP 1024) and one attention head's products (T 256, head 64).
const Shape kShapes[] = {
    {"W2 fwd x@w1", 4096, 64, 256, false, false},    {"W2 fwd h@w2", 4096, 256, 256, false, false},
    {"W2 fwd h@w3", 4096, 256, 8, false, false},     {"W2 bwd dz@w2T", 4096, 256, 256, false, true},
    {"W2 bwd hT@dz", 256, 4096, 256, true, false},   {"W2 bwd xT@dz", 64, 4096, 256, true, false},
    {"W2 bwd dy@w3T", 4096, 8, 256, false, true},    {"block qkv", 4096, 256, 768, false, false},
    {"block mlp up", 4096, 256, 1024, false, false}, {"block mlp down", 4096, 1024, 256, false, false},
    {"head q@kT", 256, 64, 256, false, true},        {"head p@v", 256, 256, 64, false, false},
};

using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                            int);
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

void* open_lib(const std::vector<const char*>& names) {
  for (const char* n : names)
    if (void* h = dlopen(n, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)) return h;
  return nullptr;
}

// c[m, n] = op(a) op(b), row-major, with `threads` threads: one library's way.
using Gemm = std::function<void(const Shape&, const float*, const float*, float*, int threads)>;

struct Library {
  std::string name;
  Gemm gemm;  // empty: not installed
  // The timed call when it differs from gemm (kiln: its own output, not copied into c).
  std::function<void(const Shape&, const float*, const float*, int threads)> timed;
  std::function<bool(const Shape&)> takes = [](const Shape&) { return true; };
};

Library cblas(const char* name, std::vector<const char*> sonames, const char* set_threads) {
  Library lib{name, nullptr};
  void* h = open_lib(sonames);
  if (!h) return lib;
  auto sgemm = reinterpret_cast<CblasSgemm>(dlsym(h, "cblas_sgemm"));
  auto threads = reinterpret_cast<void (*)(int)>(dlsym(h, set_threads));
  if (!sgemm || !threads) return lib;
  lib.gemm = [sgemm, threads](const Shape& s, const float* a, const float* b, float* c, int t) {
    threads(t);
    sgemm(kRowMajor, s.ta ? kTrans : kNoTrans, s.tb ? kTrans : kNoTrans, int(s.m), int(s.n), int(s.k), 1.f, a,
          int(s.ta ? s.m : s.k), b, int(s.tb ? s.k : s.n), 0.f, c, int(s.n));
  };
  return lib;
}

Library onednn() {
  Library lib{"onednn", nullptr};
  void* h = open_lib({"libdnnl.so.2", "libdnnl.so.3", "libdnnl.so"});
  void* omp = open_lib({"libgomp.so.1"});
  if (!h || !omp) return lib;
  auto sgemm = reinterpret_cast<DnnlSgemm>(dlsym(h, "dnnl_sgemm"));
  auto threads = reinterpret_cast<void (*)(int)>(dlsym(omp, "omp_set_num_threads"));
  if (!sgemm || !threads) return lib;
  lib.gemm = [sgemm, threads](const Shape& s, const float* a, const float* b, float* c, int t) {
    threads(t);
    sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.m, s.n, s.k, 1.f, a, s.ta ? s.m : s.k, b, s.tb ? s.k : s.n, 0.f, c,
          s.n);
  };
  return lib;
}

// libxsmm: C row-major = A B is Cᵀ = Bᵀ Aᵀ column-major; each (row block, column block) of C is
// one batch-reduce kernel call over the 64-deep blocks of k. Untransposed operands only (the
// kernels take no transposes), threads over row blocks.
Library xsmm() {
  Library lib{"libxsmm", nullptr};
#ifdef KILN_BENCH_XSMM
  libxsmm_init();
  lib.takes = [](const Shape& s) { return !s.ta && !s.tb; };
  lib.gemm = [](const Shape& s, const float* a, const float* b, float* c, int t) {
    const int64_t bm = std::min<int64_t>(64, s.m), bn = std::min<int64_t>(64, s.n), bk = std::min<int64_t>(64, s.k);
    const libxsmm_blasint lda = libxsmm_blasint(s.n), ldb = libxsmm_blasint(s.k), ldc = libxsmm_blasint(s.n);
    const float alpha = 1.f, beta = 0.f;
    auto run_rows = [&](int64_t r0, int64_t r1) {
      std::vector<const float*> ap, bp;
      for (int64_t i0 = r0; i0 < r1; i0 += bm) {
        const int64_t mm = std::min(bm, s.m - i0);
        for (int64_t j0 = 0; j0 < s.n; j0 += bn) {
          const int64_t nn = std::min(bn, s.n - j0);
          ap.clear();
          bp.clear();
          int64_t kk = bk;
          for (int64_t p0 = 0; p0 < s.k; p0 += bk) {
            kk = std::min(bk, s.k - p0);
            ap.push_back(b + p0 * s.n + j0);  // (column-major "A" = Bᵀ block)
            bp.push_back(a + i0 * s.k + p0);
          }
          // (the last k block may be short: a kernel per distinct depth)
          const unsigned long long full = s.k % bk ? ap.size() - 1 : ap.size();
          auto kern =
              libxsmm_smmdispatch_reducebatch_addr(libxsmm_blasint(nn), libxsmm_blasint(mm), libxsmm_blasint(bk), &lda,
                                                   &ldb, &ldc, &alpha, &beta, nullptr, nullptr);
          float* cp = c + i0 * s.n + j0;
          if (full)
            kern(ap.data(), bp.data(), cp, &full);
          else
            std::fill(cp, cp, 0.f);
          if (full < ap.size()) {
            const float one = 1.f, zero = full ? 1.f : 0.f;
            auto tail =
                libxsmm_smmdispatch_reducebatch_addr(libxsmm_blasint(nn), libxsmm_blasint(mm), libxsmm_blasint(kk),
                                                     &lda, &ldb, &ldc, &one, &zero, nullptr, nullptr);
            const unsigned long long one_block = 1;
            tail(ap.data() + full, bp.data() + full, cp, &one_block);
          }
        }
      }
    };
    const int64_t blocks = (s.m + bm - 1) / bm;
    if (t <= 1 || blocks < 2) return run_rows(0, s.m);
    std::vector<std::thread> ts;
    for (int w = 0; w < t; ++w) {
      const int64_t b0 = blocks * w / t, b1 = blocks * (w + 1) / t;
      ts.emplace_back(run_rows, b0 * bm, std::min(s.m, b1 * bm));
    }
    for (auto& th : ts) th.join();
  };
#endif
  return lib;
}

// kiln::matmul over the caller's memory (from_blob, transposes as views), with kiln's threads
// limited to `threads` as a user would (tbb::global_control).
Library kiln_matmul() {
  Library lib{"kiln", nullptr};
  auto product = [](const Shape& s, const float* a, const float* b, int t) {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(t));
    kiln::Tensor A = kiln::from_blob(const_cast<float*>(a), {s.ta ? s.k : s.m, s.ta ? s.m : s.k}, kiln::kFloat32);
    kiln::Tensor B = kiln::from_blob(const_cast<float*>(b), {s.tb ? s.n : s.k, s.tb ? s.k : s.n}, kiln::kFloat32);
    kiln::Tensor C = kiln::matmul(s.ta ? A.t() : A, s.tb ? B.t() : B);
    C.eval();
    return C;
  };
  lib.gemm = [product](const Shape& s, const float* a, const float* b, float* c, int t) {
    kiln::Tensor C = product(s, a, b, t);
    std::memcpy(c, C.data<float>(), sizeof(float) * size_t(s.m * s.n));
  };
  lib.timed = [product](const Shape& s, const float* a, const float* b, int t) { product(s, a, b, t); };
  return lib;
}

double median_ms(const std::function<void()>& f, double min_ms) {
  f();  // (warm: JIT, buffers, thread pools)
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    int reps = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double ms = 0;
    do {
      f();
      ++reps;
      ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    } while (ms < min_ms / 5);
    runs.push_back(ms / reps);
  }
  std::sort(runs.begin(), runs.end());
  return runs[2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  double min_ms = 300;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--min-ms") && i + 1 < argc)
      min_ms = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--min-ms T]\n", argv[0]);
      return 2;
    }
  }
  std::vector<Library> libs = {cblas("openblas", {"libopenblas.so.0", "libopenblas.so"}, "openblas_set_num_threads"),
                               cblas("blis",
                                     {"libblis.so.4", "/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4",
                                      "/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4"},
                                     "bli_thread_set_num_threads"),
                               onednn(), xsmm(), kiln_matmul()};
  for (const Library& l : libs)
    if (!l.gemm) std::printf("{\"library\": \"%s\", \"missing\": true}\n", l.name.c_str());
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (const Shape& s : kShapes) {
    std::vector<float> a(size_t(s.m * s.k)), b(size_t(s.k * s.n)), ref(size_t(s.m * s.n)), c(ref.size());
    for (float& x : a) x = nd(rng);
    for (float& x : b) x = nd(rng);
    libs[0].gemm(s, a.data(), b.data(), ref.data(), 1);
    double scale = 0;
    for (float x : ref) scale = std::max(scale, double(std::abs(x)));
    for (const Library& l : libs) {
      if (!l.gemm || !l.takes(s)) continue;
      for (int t : {1, threads}) {
        std::fill(c.begin(), c.end(), NAN);
        l.gemm(s, a.data(), b.data(), c.data(), t);
        double err = 0;
        for (size_t i = 0; i < c.size(); ++i) err = std::max(err, double(std::abs(c[i] - ref[i])));
        const double ms = median_ms(
            [&] { l.timed ? l.timed(s, a.data(), b.data(), t) : l.gemm(s, a.data(), b.data(), c.data(), t); }, min_ms);
        std::printf(
            "{\"shape\": \"%s\", \"m\": %lld, \"k\": %lld, \"n\": %lld, \"library\": \"%s\", \"threads\": %d, "
            "\"us\": %.1f, \"gflops\": %.1f, \"max_err_rel\": %.1e}\n",
            s.where, (long long)s.m, (long long)s.k, (long long)s.n, l.name.c_str(), t, ms * 1e3,
            2.0 * s.m * s.k * s.n / (ms * 1e-3) * 1e-9, err / std::max(scale, 1.0));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
