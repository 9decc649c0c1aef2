// GEMM threading: kiln's GEMMs run as tiles over TBB with the BLAS at one thread (oneDNN's sgemm
// where installed, else OpenBLAS; CTest also runs this suite with KILN_GEMM=openblas), so BLAS
// never runs more threads than TBB lets kiln use (the arena's concurrency, under a
// tbb::global_control limit), and the tiles give the products of a plain loop.
#include <cblas.h>
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "jit/exec/code_cache.h"
#include "kernels/cpu/gemm_block.h"
#include "kiln.h"

using namespace kiln;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU time (user + system, in clock ticks) of each thread of this process, by thread id.
std::map<int, long> thread_ticks() {
  std::map<int, long> out;
  DIR* d = opendir("/proc/self/task");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string path = std::string("/proc/self/task/") + e->d_name + "/stat";
    FILE* f = std::fopen(path.c_str(), "r");
    if (!f) continue;
    char buf[1024];
    size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = 0;
    const char* p = std::strrchr(buf, ')');  // fields after the command name: state is field 3
    if (!p) continue;
    long utime = 0, stime = 0;
    // Fields 3..15: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime.
    if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &utime, &stime) == 2)
      out[std::atoi(e->d_name)] = utime + stime;
  }
  closedir(d);
  return out;
}

std::string thread_name(int tid) {
  char buf[64] = {};
  if (FILE* f = std::fopen(("/proc/self/task/" + std::to_string(tid) + "/comm").c_str(), "r")) {
    if (!std::fgets(buf, sizeof buf, f)) buf[0] = 0;
    std::fclose(f);
  }
  std::string s = buf;
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// Threads other than the caller that used at least `min_ticks` of CPU between two snapshots
// ("name[tid] ticks" of each in `who`).
int busy_others(const std::map<int, long>& a, const std::map<int, long>& b, long min_ticks,
                std::string* who = nullptr) {
  const int self = static_cast<int>(gettid());
  int busy = 0;
  for (const auto& [tid, t] : b) {
    if (tid == self) continue;
    auto it = a.find(tid);
    const long used = t - (it == a.end() ? 0 : it->second);
    if (used < min_ticks) continue;
    ++busy;
    if (who) *who += " " + thread_name(tid) + "[" + std::to_string(tid) + "] " + std::to_string(used) + " ticks;";
  }
  return busy;
}

double process_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// GEMMs of every kind kiln runs: a short wide product with a long k (OpenBLAS threaded it on its
// own before), a batch of small products, a Linear layer (bias + tanh: the JIT's GEMM epilogue),
// a float64 product with a transposed operand.
struct Workload {
  Tensor x8, w8, ba, bb, xl, wl, bl, d64a, d64b;
  Workload() {
    manual_seed(11);
    x8 = randn({8, 4096}).eval();
    w8 = randn({4096, 256}).eval();
    ba = randn({8, 128, 256}).eval();
    bb = randn({8, 256, 128}).eval();
    xl = randn({1024, 256}).eval();
    wl = randn({256, 256}).eval();
    bl = randn({256}).eval();
    d64a = randn({64, 512}, kFloat64).eval();
    d64b = randn({384, 512}, kFloat64).eval();
  }
  void run() const {
    eval({matmul(x8, w8), matmul(ba, bb), tanh(add(matmul(xl, wl.t()), bl)), matmul(d64a, d64b.t())});
  }
};

// Waits (up to 2 s) until no thread but the caller uses CPU: TBB workers of an earlier limit
// or arena going to sleep.
void wait_quiet(const char* what) {
  for (int i = 0; i < 40; ++i) {
    auto a = thread_ticks();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::string who;
    if (busy_others(a, thread_ticks(), 1, &who) == 0) return;
    if (i == 39) std::printf("[ blas ] %s: not quiet before the runs:%s\n", what, who.c_str());
  }
}

// Runs the workload for about 0.5 s under `scope` (which sets up the thread limit and calls its
// argument), then checks that no more than `allowed` threads ran it.
void check_threads(const char* what, int allowed, const std::function<void(const std::function<void()>&)>& scope) {
  Workload w;
  w.run();  // compile the kernels (the tiered JIT's LLVM compiles run on a TBB worker)
  jit::wait_background_compiles();
  wait_quiet(what);
  scope([&] {
    w.run();
    wait_quiet(what);
    const auto ticks0 = thread_ticks();
    const double cpu0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    int runs = 0;
    while (seconds_since(t0) < 0.5 || runs < 3) {
      w.run();
      ++runs;
    }
    const double wall = seconds_since(t0), cpu = process_cpu_seconds() - cpu0;
    const auto ticks1 = thread_ticks();
    EXPECT_EQ(openblas_get_num_threads(), 1) << what;
    // CPU time over wall time: at most `allowed` threads busy at once (with slack for timer
    // granularity and bookkeeping).
    EXPECT_LE(cpu, allowed * wall * 1.15 + 0.03)
        << what << ": " << runs << " runs, cpu " << cpu << " s in " << wall << " s";
    if (allowed == 1) {
      // Nothing but this thread ran: no TBB worker, no BLAS thread (3 ticks: 30 ms at 100 Hz).
      std::string who;
      EXPECT_EQ(busy_others(ticks0, ticks1, 3, &who), 0)
          << what << ": other threads used CPU during " << runs << " runs:" << who;
    }
  });
}

TEST(BlasThreads, OpenBlasAtOneThread) {
  Workload().run();
  EXPECT_EQ(openblas_get_num_threads(), 1);
}

TEST(BlasThreads, GlobalControlOfOne) {
  check_threads("global_control(1)", 1, [](const std::function<void()>& f) {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, 1);
    f();
  });
}

TEST(BlasThreads, ArenaOfOne) {
  check_threads("task_arena(1)", 1, [](const std::function<void()>& f) {
    tbb::task_arena arena(1);
    arena.execute(f);
  });
}

TEST(BlasThreads, GlobalControlOfTwo) {
  check_threads("global_control(2)", 2, [](const std::function<void()>& f) {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, 2);
    f();
  });
}

// The application raises OpenMP's thread count on its own thread (its own OpenMP code, or a
// library that does) after kiln has run products there: kiln's oneDNN calls still run one
// thread each, so a limit of one is still one.
TEST(BlasThreads, ApplicationOpenMpCountIsIgnored) {
  Workload().run();  // kiln has called oneDNN on this thread before (and loaded it)
  void* omp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!omp || std::string(kernels::sgemm_library()) != "onednn") GTEST_SKIP() << "float32 products are not on oneDNN";
  auto set = reinterpret_cast<void (*)(int)>(dlsym(omp, "omp_set_num_threads"));
  ASSERT_NE(set, nullptr);
  set(4);
  check_threads("omp_set_num_threads(4), global_control(1)", 1, [](const std::function<void()>& f) {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, 1);
    f();
  });
  set(1);
}

// Products cut into tiles (rows × columns × batch) for 8 threads equal a plain loop in double,
// for every dtype, transposed and broadcast operands, edge tiles and k = 0.
TEST(BlasTiles, MatchPlainLoop) {
  struct Case {
    std::vector<int64_t> as, bs;  // shapes of a and b
    bool ta = false, tb = false;  // operands given transposed (a non-unit last stride)
  };
  const std::vector<Case> cases = {{{1, 1}, {1, 1}},
                                   {{8, 4096}, {4096, 256}},
                                   {{300, 700}, {700, 200}, true, false},
                                   {{1000, 64}, {64, 48}},
                                   {{257, 33}, {33, 1000}, false, true},
                                   {{33, 4096}, {4096, 17}, true, true},
                                   {{5, 0}, {0, 7}},
                                   {{3, 40, 300}, {300, 50}},
                                   {{2, 1, 24, 200}, {1, 3, 200, 72}, false, true},
                                   {{16, 64, 96}, {16, 96, 64}}};
  tbb::global_control gc(tbb::global_control::max_allowed_parallelism, 8);
  tbb::task_arena arena(8);
  manual_seed(5);
  for (DType dt : {kFloat32, kFloat64, DType::Float16, DType::BFloat16}) {
    for (const Case& c : cases) {
      auto make = [&](std::vector<int64_t> s, bool trans) {
        if (trans) std::swap(s[s.size() - 1], s[s.size() - 2]);
        Tensor t = to(randn(s, kFloat64), dt);
        return (trans ? transpose(t, -1, -2) : t).eval();
      };
      Tensor a = make(c.as, c.ta), b = make(c.bs, c.tb);
      Tensor got;
      arena.execute([&] { got = matmul(a, b).eval(); });
      // Plain loop over the broadcast batch, in double, from the operands as stored.
      Tensor ac = contiguous(to(a, kFloat64)), bc = contiguous(to(b, kFloat64));
      const size_t ra = c.as.size(), rb = c.bs.size();
      const int64_t m = c.as[ra - 2], k = c.as[ra - 1], n = c.bs[rb - 1];
      std::vector<int64_t> os = got.sizes();
      const int64_t batch = got.numel() / std::max<int64_t>(m * n, 1);
      Tensor ab = contiguous(expand(ac, [&] {
        auto s = os;
        s[s.size() - 1] = k;
        return s;
      }()));
      Tensor bb = contiguous(expand(bc, [&] {
        auto s = os;
        s[s.size() - 2] = k;
        return s;
      }()));
      auto av = ab.to_vector<double>(), bv = bb.to_vector<double>(), gv = got.to_vector<double>();
      const double tol = dt == kFloat32 ? 5e-5 : dt == kFloat64 ? 1e-12 : dt == DType::Float16 ? 2e-3 : 1e-2;
      for (int64_t q = 0; q < batch; ++q)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0, mag = 0;
            for (int64_t l = 0; l < k; ++l) {
              const double x = av[(q * m + i) * k + l], y = bv[(q * k + l) * n + j];
              s += x * y;
              mag += std::abs(x * y);
            }
            ASSERT_NEAR(gv[(q * m + i) * n + j], s, tol * (mag + 1e-30))
                << dtype_name(dt) << " " << shape_str(make_shape(c.as)) << " @ " << shape_str(make_shape(c.bs))
                << " at [" << q << ", " << i << ", " << j << "]";
          }
    }
  }
}

}  // namespace

// float32 products run on oneDNN wherever libdnnl.so.2 loads (unless KILN_GEMM says otherwise),
// on OpenBLAS elsewhere.
TEST(BlasLibrary, OneDnnWhereInstalled) {
  const char* want = std::getenv("KILN_GEMM");
  const bool installed = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL) != nullptr;
  const std::string expected = want ? want : installed ? "onednn" : "openblas";
  EXPECT_EQ(std::string(kernels::sgemm_library()), expected);
}
