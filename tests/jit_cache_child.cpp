// Child process of tests/test_jit.cpp (the code cache directory and KILN_JIT are read once per
// process, so the disk cache and the executor switch are tested in fresh processes).
//
//   jit_cache_child executor          prints "executor=<current executor> mode=<KILN_JIT mode>"
//   jit_cache_child workload          runs a fixed workload on the interpreter and on the JIT,
//                                     compares, and prints one line of key=value pairs:
//                                     ok compiles disk_hits disk_rebuilds hits compile_ms load_ms
//                                     jit_ms quick_compiles swaps cache_dir (after waiting for
//                                     background compiles)
//   jit_cache_child workload-default  the same with the default executor instead of the JIT
//   jit_cache_child threads           the workload on the JIT from 8 threads at once, 3 times
//   jit_cache_child exit-busy N US    tiered: queues N background LLVM compiles (pointwise graphs
//                                     of distinct structures) while they are held, compiles a
//                                     reduction with LLVM on this thread, releases the held
//                                     compiles, waits US microseconds and returns from main
//                                     (exits while a background compile runs); with a third
//                                     argument "fork", forks first and the child process
//                                     returns from main too (no compile runs in it)
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "jit/exec/code_cache.h"
#include "jit/exec/jit_executor.h"
#include "kiln.h"

namespace {

using kiln::Tensor;

// Deterministic inputs (an LCG; no dependence on the library's random generator).
Tensor input(const std::vector<int64_t>& shape, uint64_t seed, kiln::DType dt = kiln::kFloat32) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& e : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    e = static_cast<double>(x >> 11) * 0x1p-53 * 4 - 2;
  }
  Tensor t = kiln::from_vector(v, shape);  // float64
  t = t.to(dt);
  t.eval();
  return t;
}

// Each entry builds one graph (several kernel structures between them: pointwise chains,
// row reductions with consumers, split full reductions, views, ints, float64).
std::vector<std::function<Tensor()>> workload() {
  return {
      [] {
        return kiln::tanh(kiln::add(kiln::mul(kiln::exp(input({64, 300}, 1)), 0.5), 1.0));
      },
      [] {
        return kiln::softmax(input({64, 300}, 2), -1);
      },
      [] {
        return kiln::log_softmax(input({32, 50}, 3), 0);
      },
      [] {
        return kiln::layer_norm(input({16, 8, 64}, 4), {64});
      },
      [] { return kiln::sum(input({200000}, 5)); },
      [] {
        return kiln::mean(kiln::mul(input({300, 400}, 6), 2.0));
      },
      [] {
        return kiln::argmax(input({40, 77}, 7), 1);
      },
      [] {
        Tensor x = input({50, 60}, 8, kiln::kFloat64);
        return kiln::where(kiln::gt(x, 0), x, kiln::mul(x, 0.1));
      },
      [] {
        return kiln::amax(input({30, 20, 10}, 9).transpose(0, 2), {1}, true);
      },
      [] {
        Tensor x = input({64, 128}, 10), y = input({64}, 11);
        return kiln::sum(kiln::mul(x.slice(1, 0, std::nullopt, 2), y.unsqueeze(1)), {1});
      },
      [] {
        Tensor i = kiln::mul(input({100, 7}, 12), 3).to(kiln::kInt32);
        return kiln::sum(kiln::bitwise_xor(kiln::mul(i, 2), 5), {0});
      },
      [] {
        return kiln::sigmoid(input({1000, 3}, 13).flip({0}));
      },
  };
}

bool close(const std::vector<double>& a, const std::vector<double>& b, std::string& why) {
  if (a.size() != b.size()) {
    why = "size " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (!(std::abs(a[i] - b[i]) <= 1e-4 * std::abs(b[i]) + 1e-5)) {
      why = "element " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
      return false;
    }
  }
  return true;
}

// Pointwise chains of distinct structures (op sequence from the bits of k).
Tensor distinct_chain(int k) {
  Tensor x = input({33, 17}, static_cast<uint64_t>(k) + 100);
  for (int i = 0, bits = k; i < 2 + k % 5; ++i, bits /= 3) {
    switch (bits % 3) {
      case 0: x = kiln::tanh(kiln::add(x, 0.25 * (i + 1))); break;
      case 1: x = kiln::exp(kiln::mul(x, 0.5)); break;
      default: x = kiln::sin(kiln::sub(x, 1.0)); break;
    }
  }
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "exit-busy") {
    int n = argc > 2 ? std::atoi(argv[2]) : 8;
    int us = argc > 3 ? std::atoi(argv[3]) : 0;
    double sum = 0;
    kiln::jit::hold_background_compiles(true);
    for (int k = 0; k < n; ++k) sum += distinct_chain(k).to(kiln::kFloat64).to_vector<double>()[0];
    // A synchronous LLVM compile after the compiles were queued: the function-local statics
    // LLVM constructs on first use exist from here on, while the background compiles run.
    sum += kiln::sum(input({100, 37}, 99), {1}).to(kiln::kFloat64).to_vector<double>()[0];
    kiln::jit::hold_background_compiles(false);
    if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
    if (argc > 4 && std::string(argv[4]) == "fork") {
      std::fflush(stdout);
      pid_t pid = fork();
      if (pid == 0) {
        alarm(10);  // a child whose exit waits for a compile that runs only in its parent hangs
        return 0;
      }
      int st = 0;
      if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        std::printf("forked child failed (status %d)\n", st);
        return 1;
      }
    }
    std::printf("exit-busy n=%d us=%d sum=%g\n", n, us, sum);
    return 0;  // exits with background compiles queued and one running
  }
  if (mode == "executor") {
    const char* names[] = {"interp", "llvm", "asmjit", "tiered"};
    std::printf("executor=%s mode=%s\n", kiln::current_executor().name(),
                names[static_cast<int>(kiln::jit::jit_mode())]);
    return 0;
  }
  if (mode != "workload" && mode != "workload-default" && mode != "threads") {
    std::fprintf(stderr, "usage: %s executor|workload|workload-default|threads\n", argv[0]);
    return 2;
  }
  std::vector<std::vector<double>> ref;
  kiln::set_executor(kiln::interpreter());
  for (auto& g : workload()) ref.push_back(g().to(kiln::kFloat64).to_vector<double>());
  const bool jit = mode != "workload-default" || kiln::jit::jit_mode() != kiln::jit::JitMode::Interp;
  kiln::set_executor(jit ? kiln::jit::jit_executor() : kiln::interpreter());
  kiln::jit::reset_cache_stats();
  std::atomic<bool> ok{true};
  std::mutex mu;
  auto t0 = std::chrono::steady_clock::now();
  auto gs = workload();
  auto run = [&](size_t i) {
    std::vector<double> got = gs[i]().to(kiln::kFloat64).to_vector<double>();
    std::string why;
    if (!close(got, ref[i], why)) {
      std::lock_guard<std::mutex> lock(mu);
      std::printf("graph %zu differs: %s\n", i, why.c_str());
      ok = false;
    }
  };
  if (mode == "threads") {
    // 8 threads request every kernel at once, in different orders: with no disk cache each
    // structure is compiled by one of them while the others wait for it.
    std::vector<std::thread> ts;
    for (size_t t = 0; t < 8; ++t)
      ts.emplace_back([&, t] {
        for (size_t rep = 0; rep < 3; ++rep)
          for (size_t k = 0; k < gs.size(); ++k) run((k * (2 * t + 1) + t + rep) % gs.size());
      });
    for (auto& t : ts) t.join();
  } else {
    for (size_t i = 0; i < gs.size(); ++i) run(i);
  }
  double jit_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  kiln::jit::wait_background_compiles();  // tiered: the LLVM kernels (and their disk entries) are done
  kiln::jit::CacheStats s = kiln::jit::cache_stats();
  std::printf(
      "ok=%d compiles=%llu disk_hits=%llu disk_rebuilds=%llu hits=%llu compile_ms=%.3f load_ms=%.3f jit_ms=%.3f "
      "quick_compiles=%llu swaps=%llu cache_dir=%s pid=%ld\n",
      ok.load() ? 1 : 0, static_cast<unsigned long long>(s.compiles), static_cast<unsigned long long>(s.disk_hits),
      static_cast<unsigned long long>(s.disk_rebuilds), static_cast<unsigned long long>(s.hits), s.compile_ms,
      s.load_ms, jit_ms, static_cast<unsigned long long>(s.quick_compiles),
      static_cast<unsigned long long>(s.background_swaps), kiln::jit::cache_dir().c_str(),
      static_cast<long>(::getpid()));
  return ok.load() ? 0 : 1;
}
