// Tests of the asmjit tier (registered with KILN_JIT=asmjit; the ".interp" registration skips them).
//
//   AsmjitDifferential.RandomPointwiseGraphs  400 random pointwise graphs (tests/jit_random_graphs.h
//       with pointwise_only: unary/binary ops, comparisons, where, casts, broadcasting with 0- and
//       1-sized dims, views; float32/float64/int32/int64/bool; dense, permuted, strided and
//       broadcast inputs) and 200 mixed ones (reductions on LLVM, pointwise kernels on asmjit),
//       each checked against the interpreter at the tolerances of tests/test_jit.cpp.
//   AsmjitTiers.TieredSwapsToLlvm             in a child process with KILN_JIT=tiered and no disk
//       cache: kernels first run asmjit code (background compiles held), then, after waiting,
//       LLVM code; both give the interpreter's answers.
//   AsmjitFallback.UnsupportedKernelsUseLlvm  a reduction kernel and an oversized pointwise kernel
//       are refused by the asmjit tier (AsmjitError), and the executor runs the latter on LLVM.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "jit/exec/code_cache.h"
#include "jit/cpu_asmjit/codegen_asmjit.h"
#include "jit/exec/jit_executor.h"
#include "jit/exec/tiering.h"
#include "jit/loop/lower.h"
#include "jit/graph/scheduler.h"
#include "kiln.h"
#include "jit_random_graphs.h"

namespace {

using kiln::jit::cache_stats;
using kiln::jit::CacheStats;
using kiln::jit::JitMode;

#define SKIP_UNLESS_ASMJIT_MODE()               \
  if (kiln::jit::jit_mode() != JitMode::Asmjit) \
  GTEST_SKIP() << "registered with KILN_JIT=asmjit (this is another registration)"

TEST(AsmjitDifferential, RandomPointwiseGraphs) {
  SKIP_UNLESS_ASMJIT_MODE();
  const uint64_t seed = test_seed();
  const int pointwise = env_int("KILN_ASMJIT_GRAPHS", 400), mixed = pointwise / 2;
  std::printf("[ asmjit ] KILN_TEST_SEED=%llu, %d pointwise + %d mixed graphs\n", static_cast<unsigned long long>(seed),
              pointwise, mixed);
  kiln::jit::reset_cache_stats();
  int failures = 0;
  for (int g = 0; g < pointwise + mixed && failures < 5; ++g) {
    const bool pw = g < pointwise;
    const int i = pw ? g : g - pointwise;
    kiln::set_executor(kiln::interpreter());
    Program p = make_program(seed + (pw ? 77 : 0), i / 4, i % 4, pw);
    std::string err = check_program(p);
    if (!err.empty()) {
      ++failures;
      ADD_FAILURE() << "KILN_TEST_SEED=" << seed << (pw ? " pointwise" : " mixed") << " graph " << i << ": " << err;
    }
  }
  kiln::set_executor(kiln::jit::jit_executor());
  CacheStats s = cache_stats();
  std::printf(
      "[ asmjit ] kernels: %llu asmjit (%.1f us each), %llu LLVM, %llu asmjit fallbacks; launches: %llu asmjit, "
      "%llu LLVM\n",
      static_cast<unsigned long long>(s.quick_compiles),
      s.quick_compiles ? s.quick_compile_us / static_cast<double>(s.quick_compiles) : 0.0,
      static_cast<unsigned long long>(s.compiles), static_cast<unsigned long long>(s.quick_fallbacks),
      static_cast<unsigned long long>(s.quick_runs), static_cast<unsigned long long>(s.optimized_runs));
  EXPECT_GT(s.quick_compiles, 100u);
  EXPECT_EQ(s.quick_fallbacks, 0u) << "a pointwise kernel of the random graphs went to LLVM";
  EXPECT_EQ(s.background_swaps, 0u);
}

// A graph with pointwise kernels only (float32 and float64, a broadcast operand, a comparison).
std::vector<Tensor> tiered_graph() {
  Tensor x = make_input({kF32, {37, 3000}, 0, 0, false, false, 21});
  Tensor b = make_input({kF32, {3000}, 0, 0, false, false, 22});
  Tensor d = make_input({kF64, {5, 7}, 0, 0, false, false, 23});
  Tensor y = kiln::tanh(kiln::add(kiln::mul(x, 0.5), b));
  Tensor z = kiln::where(kiln::gt(y, 0.0), y, kiln::mul(y, 0.1));
  z.eval();  // two segments: two kernels (in one they would run as one horizontal kernel)
  Tensor w = kiln::sqrt(kiln::abs(kiln::sub(kiln::mul(d, d), 0.25)));
  return {z, w};
}

std::string check_tiered_graph() {
  kiln::set_executor(kiln::interpreter());
  std::vector<Tensor> ref = tiered_graph();
  kiln::eval(ref);
  kiln::set_executor(kiln::jit::jit_executor());
  std::vector<Tensor> got = tiered_graph();
  kiln::eval(got);
  Info info;
  info.exact = false;
  for (size_t i = 0; i < ref.size(); ++i) {
    std::string m = compare(read(ref[i]), read(got[i]), info);
    if (!m.empty()) return "output " + std::to_string(i) + ": " + m;
  }
  return "";
}

TEST(AsmjitTiers, TieredSwapsToLlvm) {
  if (kiln::jit::jit_mode() == JitMode::Interp) GTEST_SKIP() << "JIT-only test";
  if (kiln::jit::jit_mode() != JitMode::Tiered) {
    // The mode is read once per process: run this test again in a tiered child.
    std::string cmd = "env KILN_JIT=tiered KILN_CACHE_DIR=off /proc/" + std::to_string(getpid()) +
                      "/exe --gtest_filter=AsmjitTiers.TieredSwapsToLlvm 2>&1";
    FILE* f = popen(cmd.c_str(), "r");
    ASSERT_NE(f, nullptr);
    std::string out;
    char buf[4096];
    while (size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
    int st = pclose(f);
    EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0) << out;
    EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos) << out;
    return;
  }
  // Tiered, without a disk cache: asmjit code first (the background LLVM compiles are held back).
  kiln::jit::hold_background_compiles(true);
  kiln::jit::reset_cache_stats();
  std::string err = check_tiered_graph();
  CacheStats a = cache_stats();
  kiln::jit::hold_background_compiles(false);
  EXPECT_EQ(err, "") << "asmjit tier";
  EXPECT_GE(a.quick_compiles, 2u);
  EXPECT_EQ(a.compiles, 0u) << "an LLVM compile ran while background compiles were held";
  EXPECT_EQ(a.quick_runs, a.quick_compiles);
  EXPECT_EQ(a.optimized_runs, 0u);
  EXPECT_EQ(a.background_swaps, 0u);
  // After waiting: every kernel swapped to LLVM code; the same plans now launch it.
  kiln::jit::wait_background_compiles();
  CacheStats b = cache_stats();
  EXPECT_EQ(b.background_swaps, a.quick_compiles);
  EXPECT_EQ(b.compiles, a.quick_compiles);
  err = check_tiered_graph();
  CacheStats c = cache_stats();
  EXPECT_EQ(err, "") << "LLVM tier";
  EXPECT_EQ(c.quick_compiles, a.quick_compiles) << "the second run compiled again";
  EXPECT_EQ(c.quick_runs, a.quick_runs) << "asmjit code ran after the swap";
  EXPECT_EQ(c.optimized_runs, a.quick_runs);
  std::printf(
      "[ asmjit ] tiered: %llu kernels, %.1f us asmjit compile each, %.2f ms LLVM compile each in the background\n",
      static_cast<unsigned long long>(a.quick_compiles), a.quick_compile_us / static_cast<double>(a.quick_compiles),
      b.compile_ms / static_cast<double>(b.compiles));
}

// The one pointwise kernel of `y`'s graph.
std::shared_ptr<kiln::jit::Lowered> lower_single(const Tensor& y) {
  kiln::Segment seg;
  std::vector<kiln::Node*> order;
  std::function<void(kiln::Node*)> visit = [&](kiln::Node* n) {
    if (n->materialized() || std::find(order.begin(), order.end(), n) != order.end()) return;
    for (auto& in : n->inputs) visit(in.get());
    order.push_back(n);
  };
  visit(y.node().get());
  seg.nodes = order;
  for (kiln::Node* n : order) seg.needed.push_back(n == y.node().get());
  std::vector<kiln::jit::Step> steps = kiln::jit::schedule(seg);
  EXPECT_EQ(steps.size(), 1u) << kiln::jit::describe(steps);
  return kiln::jit::lower(steps.at(0).group, kiln::jit::target_for(kiln::DeviceType::CPU));
}

TEST(AsmjitFallback, UnsupportedKernelsUseLlvm) {
  SKIP_UNLESS_ASMJIT_MODE();
  // A reduction kernel: not the asmjit tier's shape.
  Tensor x = make_input({kF32, {16, 100}, 0, 0, false, false, 31});
  auto red = lower_single(kiln::sum(kiln::mul(x, x), {1}));
  EXPECT_FALSE(kiln::jit::asmjit_supports(red->kernel));
  EXPECT_THROW(kiln::jit::compile_asmjit(red->kernel), kiln::jit::AsmjitError);
  // A pointwise kernel past the asmjit tier's size limit (a long chain with distinct scalars).
  auto chain = [&] {
    Tensor y = x;
    for (int i = 0; i < 60; ++i) y = kiln::add(kiln::mul(y, 1.0 + 1e-3 * i), 1e-4 * i);
    return y;
  };
  auto big = lower_single(chain());
  EXPECT_TRUE(kiln::jit::asmjit_supports(big->kernel));
  EXPECT_THROW(kiln::jit::compile_asmjit(big->kernel), kiln::jit::AsmjitError);
  // The executor: the same chain on LLVM (counted as an asmjit fallback), with the right answer.
  kiln::jit::reset_cache_stats();
  kiln::set_executor(kiln::interpreter());
  Tensor ref = chain();
  ref.eval();
  kiln::set_executor(kiln::jit::jit_executor());
  testing::internal::CaptureStderr();
  Tensor got = chain();
  got.eval();
  std::string captured = testing::internal::GetCapturedStderr();
  EXPECT_EQ(captured.find("[kiln:jit]"), std::string::npos) << "fell back to the interpreter: " << captured;
  CacheStats s = cache_stats();
  EXPECT_EQ(s.quick_fallbacks, 1u);
  EXPECT_EQ(s.quick_compiles, 0u);
  EXPECT_EQ(s.compiles + s.disk_hits, 1u);
  EXPECT_EQ(s.optimized_runs, 1u);
  Info info;
  info.exact = false;
  info.rel_err = 1e-4;
  EXPECT_EQ(compare(read(ref), read(got), info), "");
}

}  // namespace
