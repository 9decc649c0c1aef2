// Horizontal kernels: independent pointwise kernels of different domains in one segment (an
// optimizer's per-parameter updates) run as one launch, with the values of the interpreter.
//
//   Horizontal.AdamSgdAdamWUpdatesAreTwoKernels  an optimizer step over an MLP's parameters
//       (the W2 shapes and odd ones) materializes in <= 2 launches (the 0-d bias-correction
//       kernel and one horizontal kernel), equal to the interpreter's step, float32 and float64
//   Horizontal.OptimizerUpdatesOnTheGpu  the same on CUDA (skipped without a device): <= 2
//       launches, equal to the CPU's step
//   Horizontal.RandomIndependentKernels  random sets of independent pointwise chains over random
//       shapes (size-0 and size-1 dims, transposed and broadcast inputs, non-finite values),
//       with dependent chains mixed in; equal to the interpreter at any seed, fewer launches
//   Horizontal.DependentKernelsStayApart  a kernel reading another's output is not batched
//       with it (the launch count shows it), and the values stay right
//
// Tolerances: a horizontal kernel runs its members' loop IR unchanged, so the JIT's values are
// those of the unbatched kernels; against the interpreter: float32 rtol 2e-6 / atol 1e-7
// (fused float32 chains round once per op in both, transcendentals within 4 ulp), float64
// rtol 1e-12.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "jit/exec/code_cache.h"
#include "jit/exec/jit_executor.h"
#include "kiln.h"
#include "tests/expect_close.h"
#include "tests/test_seed.h"

using namespace kiln;

namespace {

using Sizes = std::vector<int64_t>;

uint64_t launches() {
  auto s = jit::cache_stats();
  return s.quick_runs + s.optimized_runs;
}

// Runs `f` on the interpreter, then on the JIT; returns both results.
template <class F>
std::pair<std::vector<Tensor>, std::vector<Tensor>> both(F&& f) {
  set_executor(interpreter());
  std::vector<Tensor> ref = f();
  for (auto& t : ref) t.eval();
  set_executor(jit::jit_executor());
  std::vector<Tensor> got = f();
  return {ref, got};
}

void expect_all_close(const std::vector<Tensor>& got, const std::vector<Tensor>& ref, DType dt) {
  ASSERT_EQ(got.size(), ref.size());
  const double rtol = dt == kFloat64 ? 1e-12 : 2e-6, atol = dt == kFloat64 ? 1e-14 : 1e-7;
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i));
    expect_close(got[i], ref[i], rtol, atol);
  }
}

class Horizontal : public ::testing::Test {
 protected:
  void SetUp() override {
    if (jit::jit_mode() == jit::JitMode::Interp) GTEST_SKIP() << "the JIT is off (KILN_JIT=interp)";
  }
  void TearDown() override { set_executor(jit::jit_executor()); }
};

// The parameters after two optimizer steps of `make_opt` on fixed gradients; `launched`
// receives the launches that materialized the second step's updates.
template <class MakeOpt>
std::vector<Tensor> optimizer_steps(DType dt, const std::vector<Sizes>& shapes, uint64_t seed, MakeOpt make_opt,
                                    uint64_t* launched, Device dev = cpu()) {
  manual_seed(seed);
  std::vector<Tensor> params, grads;
  for (const Sizes& s : shapes) {
    Tensor p = randn(s, dt).to(dev);
    p.eval();
    params.push_back(p.requires_grad_(true));
    grads.push_back(randn(s, dt).to(dev).eval());
  }
  auto opt = make_opt(params);
  for (int step = 0; step < 2; ++step) {
    for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(grads[i] * (1.0 + step));
    for (auto& g : params) g.grad().eval();
    opt->step();
    const uint64_t before = launches();
    std::vector<Tensor> all;
    for (auto& p : params) all.push_back(p.detach());
    eval(all);
    if (launched) *launched = launches() - before;
  }
  std::vector<Tensor> out;
  for (auto& p : params) out.push_back(p.detach().to(cpu()));
  return out;
}

// W2's MLP (64-256-256-8) and an odd one (sizes 1, 3, 7: short and tail-only rows).
const std::vector<std::vector<Sizes>> kNets = {{{256, 64}, {256}, {256, 256}, {256}, {8, 256}, {8}},
                                               {{7, 3}, {7}, {1, 7}, {1}, {5, 1}, {5}, {}}};
using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>&)>;
std::vector<std::pair<const char*, MakeOpt>> optimizers() {
  return {{"Adam", [](std::vector<Tensor>& p) { return std::make_unique<optim::Adam>(p, optim::AdamOptions{1e-3}); }},
          {"AdamW", [](std::vector<Tensor>& p) { return std::make_unique<optim::AdamW>(p, optim::AdamOptions{1e-3}); }},
          {"SGD", [](std::vector<Tensor>& p) {
             optim::SGDOptions o;
             o.lr = 0.05;
             o.momentum = 0.9;
             o.weight_decay = 1e-4;
             return std::make_unique<optim::SGD>(p, o);
           }}};
}

TEST_F(Horizontal, AdamSgdAdamWUpdatesAreTwoKernels) {
  const uint64_t seed = kiln::testing::test_seed(5);
  for (DType dt : {kFloat32, kFloat64})
    for (const auto& shapes : kNets)
      for (const auto& [name, make] : optimizers()) {
        SCOPED_TRACE(std::string(name) + " " + dtype_name(dt) + " " + std::to_string(shapes.size()) + " params");
        uint64_t launched = 0;
        auto [ref, got] = both([&] { return optimizer_steps(dt, shapes, seed, make, nullptr); });
        got = optimizer_steps(dt, shapes, seed, make, &launched);
        expect_all_close(got, ref, dt);
        EXPECT_LE(launched, 2u)
            << "an optimizer step's updates should be the 0-d scalars kernel and one horizontal kernel";
      }
}

// On the GPU: the same steps in <= 2 launches, equal to the CPU's JIT step (float32: CUDA's
// sqrt and division are correctly rounded, as the CPU's; rtol 1e-6; float64 1e-12).
TEST_F(Horizontal, OptimizerUpdatesOnTheGpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  const uint64_t seed = kiln::testing::test_seed(5);
  const Device gpu{DeviceType::CUDA, 0};
  for (DType dt : {kFloat32, kFloat64})
    for (const auto& shapes : kNets)
      for (const auto& [name, make] : optimizers()) {
        SCOPED_TRACE(std::string(name) + " " + dtype_name(dt) + " " + std::to_string(shapes.size()) + " params");
        uint64_t launched = 0;
        std::vector<Tensor> ref = optimizer_steps(dt, shapes, seed, make, nullptr);
        std::vector<Tensor> got = optimizer_steps(dt, shapes, seed, make, &launched, gpu);
        for (size_t i = 0; i < got.size(); ++i)
          expect_close(got[i], ref[i], dt == kFloat64 ? 1e-12 : 1e-6, dt == kFloat64 ? 1e-14 : 1e-7);
        EXPECT_LE(launched, 2u);
      }
}

// A random pointwise chain over `x` (and `y`, broadcast to it): a few ops, some transcendental.
Tensor chain(const Tensor& x, const Tensor& y, std::mt19937_64& rng) {
  Tensor t = x;
  const int ops = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < ops; ++k) switch (rng() % 6) {
      case 0: t = t * y + 0.5; break;
      case 1: t = tanh(t); break;
      case 2: t = exp(t * 0.25) - y; break;
      case 3: t = where(t > 0, t, y * 2.0); break;
      case 4: t = sqrt(abs(t) + 1.0); break;
      default: t = maximum(t, y); break;
    }
  return t;
}

// Random independent (and some dependent) chains on `dev`, against the CPU interpreter.
void random_independent_kernels(Device dev, uint64_t seed) {
  SCOPED_TRACE("on " + dev.str());
  std::mt19937_64 rng(seed);
  int batched_cases = 0;
  for (int c = 0; c < 24; ++c) {
    const DType dt = c % 2 ? kFloat64 : kFloat32;
    const int n = 2 + static_cast<int>(rng() % 6);
    struct Case {
      Sizes shape;
      bool transposed, broadcast_row, dependent;
    };
    std::vector<Case> cases;
    for (int i = 0; i < n; ++i) {
      const int64_t dims[] = {0, 1, 2, 3, 17, 64, 300};
      Sizes s = {dims[rng() % 7], dims[rng() % 7]};
      if (rng() % 4 == 0) s = {dims[rng() % 7]};
      cases.push_back({s, s.size() == 2 && rng() % 3 == 0, rng() % 3 == 0, i > 0 && rng() % 4 == 0});
    }
    const uint64_t data_seed = rng();
    const bool nonfinite = c % 5 == 0;
    auto run = [&](Device on) {
      manual_seed(data_seed);
      std::vector<Tensor> xs, ys;
      for (const Case& k : cases) {
        Tensor x = randn(k.shape, dt);
        if (nonfinite && x.numel() > 0)
          x = where(x > 1.5, full({}, INFINITY, dt), where(x < -1.5, full({}, NAN, dt), x));
        x = x.eval();
        if (k.transposed) x = randn({k.shape[1], k.shape[0]}, dt).eval().t();
        Tensor y = k.broadcast_row && !k.shape.empty() ? randn({k.shape.back()}, dt).eval() : randn(k.shape, dt).eval();
        xs.push_back(x.to(on).eval());
        ys.push_back(y.to(on).eval());
      }
      std::mt19937_64 r(data_seed);
      std::vector<Tensor> outs;
      for (size_t i = 0; i < cases.size(); ++i) {
        Tensor x = xs[i];
        // A dependent chain reads the previous chain's result (when it broadcasts to x's shape).
        if (cases[i].dependent && outs.back().sizes() == x.sizes()) x = x + outs.back();
        outs.push_back(chain(x, ys[i], r));
      }
      return outs;
    };
    set_executor(interpreter());
    std::vector<Tensor> ref = run(cpu());
    eval(ref);
    set_executor(jit::jit_executor());
    std::vector<Tensor> got = run(dev);
    const uint64_t before = launches();
    eval(got);
    const uint64_t launched = launches() - before;
    SCOPED_TRACE("case " + std::to_string(c) + " seed " + std::to_string(seed));
    if (dev == cpu()) {
      expect_all_close(got, ref, dt);
    } else {  // CUDA's exp/tanh within 2 ulp of the CPU's, compounded over up to 4 ops
      for (size_t i = 0; i < got.size(); ++i)
        expect_close(got[i].to(cpu()), ref[i], dt == kFloat64 ? 1e-12 : 2e-5, dt == kFloat64 ? 1e-14 : 1e-6);
    }
    int nonempty = 0;
    for (const Tensor& t : got) nonempty += t.numel() > 0;
    EXPECT_LE(launched, static_cast<uint64_t>(nonempty));
    batched_cases += launched < static_cast<uint64_t>(nonempty);
  }
  EXPECT_GT(batched_cases, 0) << "no case ran fewer launches than it has non-empty kernels";
}

TEST_F(Horizontal, RandomIndependentKernels) {
  const uint64_t seed = kiln::testing::test_seed(5);
  random_independent_kernels(cpu(), seed);
  if (cuda::is_available()) random_independent_kernels(Device{DeviceType::CUDA, 0}, seed);
}

TEST_F(Horizontal, DependentKernelsStayApart) {
  for (DType dt : {kFloat32, kFloat64}) {
    auto [ref, got] = both([&] {
      manual_seed(7);
      Tensor a = randn({300, 17}, dt).eval(), b = randn({64}, dt).eval();
      Tensor s = a.sum();  // a split reduction: a kernel of its own
      Tensor u = tanh(b) * s;  // reads the reduction: after it
      Tensor v = exp(a * 0.1);  // independent of both
      Tensor w = u.sum() + v.mean();  // reads both
      return std::vector<Tensor>{u, v, w};
    });
    eval(got);
    expect_all_close(got, ref, dt);
  }
  // Two pointwise kernels, the second reading the first's stored output: never one launch.
  manual_seed(3);
  Tensor a = randn({100, 100}).eval();
  auto [ref, got] = both([&] {
    Tensor p = exp(a);
    return std::vector<Tensor>{p, (p.t() + 1.0).sum({0})};  // reads p transposed: p is stored, its kernel after p's
  });
  const uint64_t before = launches();
  eval(got);
  EXPECT_GE(launches() - before, 2u);
  expect_close(got[0], ref[0], 2e-6, 1e-7);
  expect_close(got[1], ref[1], 2e-6, 1e-5);
}

}  // namespace

// A pointwise kernel with more arguments than its launch takes (on CUDA 32 KiB of parameters;
// on the CPU none, but ctest's horizontal_wide_kernels lowers the limit with
// KILN_KERNEL_ARG_BYTES) is split by its outputs into kernels that fit: it stays compiled (no step
// on the interpreter) with the interpreter's values. Many same-shaped parameters under AdamW give
// such a kernel: their updates fuse into one over the shared shape (GPT-2's [768] vectors did,
// and ran on the interpreter, 44 ms of a 113 ms step).
TEST_F(Horizontal, WideKernelsAreSplitNotInterpreted) {
  const Device dev = kiln::testing::test_device();
  const bool limited = dev.type == DeviceType::CUDA || std::getenv("KILN_KERNEL_ARG_BYTES");
  const std::vector<Sizes> shapes(dev.type == DeviceType::CUDA ? 1200 : 96, Sizes{48});
  const uint64_t seed = kiln::testing::test_seed(9);
  auto adamw = [](std::vector<Tensor>& p) { return std::make_unique<optim::AdamW>(p, optim::AdamOptions{1e-3}); };
  set_executor(interpreter());
  const std::vector<Tensor> ref = optimizer_steps(kFloat32, shapes, seed, adamw, nullptr);
  set_executor(jit::jit_executor());
  const uint64_t splits = jit::wide_kernel_splits(), interpreted = jit::interpreted_kernel_runs();
  const std::vector<Tensor> got = optimizer_steps(kFloat32, shapes, seed, adamw, nullptr, dev);
  EXPECT_EQ(jit::interpreted_kernel_runs() - interpreted, 0u) << "a kernel step left compiled code";
  if (limited) EXPECT_GT(jit::wide_kernel_splits() - splits, 0u) << "no kernel was wide enough to split";
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    expect_close(got[i], ref[i], 1e-6, 1e-7);  // (the GPU's sqrt and division round as the CPU's)
  }
}
