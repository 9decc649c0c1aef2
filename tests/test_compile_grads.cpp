// Gradients and kiln::compile: backward() inside a compiled function fills .grad() of argument
// leaves as eager mode does (accumulating), and functions with several differentiable results
// stay compiled with the backward left to the caller.
#include <gtest/gtest.h>

#include "kiln.h"
#include "tests/expect_close.h"
#include "tests/test_seed.h"

using namespace kiln;

namespace {

Tensor leaf(const std::vector<int64_t>& shape) { return randn(shape, kFloat64).requires_grad_(); }

}  // namespace

TEST(CompileGrads, BackwardInsideFillsArgumentGrads) {
  manual_seed(kiln::testing::test_seed(7));
  auto step = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    Tensor loss = ((x.matmul(w) + b).tanh() * x.sum({1}, true)).sum();
    loss.backward();
    return loss;
  };
  auto f = compile(step);
  for (int64_t n : {4, 7, 9, 4}) {
    Tensor x = leaf({n, 3}), w = leaf({3, 5}), b = leaf({5});
    Tensor xe = x.detach().requires_grad_(), we = w.detach().requires_grad_(), be = b.detach().requires_grad_();
    expect_close(f(x, w, b), step(xe, we, be), 1e-12, 1e-12);
    ASSERT_TRUE(x.grad().defined() && w.grad().defined() && b.grad().defined());
    expect_close(x.grad(), xe.grad(), 1e-12, 1e-12);
    expect_close(w.grad(), we.grad(), 1e-12, 1e-12);
    expect_close(b.grad(), be.grad(), 1e-12, 1e-12);
  }
  EXPECT_EQ(f.stats().eager_calls, 0);
  EXPECT_LE(f.stats().entries, 2);
}

TEST(CompileGrads, BackwardInsideAccumulatesLikeEager) {
  manual_seed(kiln::testing::test_seed(7));
  auto step = [](const Tensor& x, const Tensor& w) {
    Tensor loss = (x * w).square().sum();
    loss.backward();
    return loss;
  };
  auto f = compile(step);
  Tensor w = leaf({6}), we = w.detach().requires_grad_();
  for (int i = 0; i < 3; ++i) {
    Tensor x = randn({6}, kFloat64);
    f(x, w);
    step(x, we);
    expect_close(w.grad(), we.grad(), 1e-12, 1e-12);  // sums the three steps' gradients
  }
  EXPECT_EQ(f.stats().eager_calls, 0);
}

TEST(CompileGrads, SeveralDifferentiableResultsStayCompiled) {
  manual_seed(kiln::testing::test_seed(7));
  auto fn = [](const Tensor& x, const Tensor& w) {
    std::vector<Tensor> parts = chunk(x.matmul(w).sigmoid(), 3, 1);
    parts.push_back(x.to(kFloat32).exp().sum({0}));  // another dtype
    return parts;
  };
  auto f = compile(fn);
  for (int64_t n : {5, 8, 11}) {
    Tensor x = leaf({n, 4}), w = leaf({4, 6});
    Tensor xe = x.detach().requires_grad_(), we = w.detach().requires_grad_();
    std::vector<Tensor> got = f(x, w), want = fn(xe, we);
    ASSERT_EQ(got.size(), want.size());
    // Weights reach only some results: the others get no gradient, as in eager mode.
    std::vector<Tensor> gs = {randn(got[0].sizes(), kFloat64), randn(got[2].sizes(), kFloat64),
                              randn(got[3].sizes(), kFloat32)};
    backward({got[0], got[2], got[3]}, gs);
    backward({want[0], want[2], want[3]}, gs);
    for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], want[i], 1e-6, 1e-6);
    expect_close(x.grad(), xe.grad(), 1e-5, 1e-6);
    expect_close(w.grad(), we.grad(), 1e-12, 1e-12);
  }
  EXPECT_EQ(f.stats().eager_calls, 0);
  EXPECT_LE(f.stats().entries, 2);
}

TEST(CompileGrads, ResultsThatAreViewsOfArguments) {
  // The second result is the argument itself (an identity transpose): its gradient is a slice
  // of the packed gradients, at an offset, and must reach x unchanged.
  auto fn = [](const Tensor& x, const Tensor& y) { return std::vector<Tensor>{y * 2.0, x.transpose(0, 0)}; };
  auto f = compile(fn);
  Tensor x = zeros({2, 2}, kFloat64).requires_grad_(), y = zeros({3}, kFloat64).requires_grad_();
  backward(f(x, y), {tensor({1, 2, 3}, kFloat64), tensor({{10, 20}, {30, 40}}, kFloat64)});
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{10, 20, 30, 40}));
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{2, 4, 6}));
}

TEST(CompileGrads, NarrowedArgumentsAreReadAtTheirOffset) {
  auto f = compile([](const Tensor& x) { return x.transpose(0, 0) + 0.0; });
  Tensor big = arange(0, 12, 1, kFloat64).reshape({4, 3});
  Tensor part = big.narrow(0, 1, 2);  // dense rows 1..2, offset 3
  expect_close(f(part), part, 0, 0);
  expect_close(f(big.narrow(0, 2, 2)), big.narrow(0, 2, 2), 0, 0);
}

// Recomputation never changes results: the backward of amax/amin compares x with the saved
// result (eq(x, out): "equals the extremum"); maximum/minimum compare x with y. A min cut that
// recomputed x in the backward by other code than the forward's (another tier, another kernel
// shape: vector body vs scalar tail) could round it differently, and the mask came out empty:
// all-NaN (0/0) gradients for amin(maximum(erf(x*x), x*x)). The partitioner keeps both sides
// of such comparisons from the forward; compiled gradients must equal eager ones (default cut
// and save_all, float32 at sizes that give vector bodies and tails), with no NaN.
TEST(CompileGrads, RecomputedComparisonsKeepTheirMasks) {
  manual_seed(kiln::testing::test_seed(11));
  using Fn = std::function<Tensor(const Tensor&)>;
  const std::vector<std::pair<std::string, Fn>> fns = {
      {"amin(maximum(erf(x*x), x*x))", [](const Tensor& x) { return amin(maximum(erf(x * x), x * x)); }},
      {"amax(minimum(tanh(x)*3, sin(x)+x))", [](const Tensor& x) { return amax(minimum(tanh(x) * 3, sin(x) + x)); }},
      {"amax(exp(x)*x, dim 1).sum()", [](const Tensor& x) { return amax(exp(x) * x, {1}).sum(); }},
      {"max(erf(x)+x, dim 1).values.sum()", [](const Tensor& x) { return max(erf(x) + x, 1).first.sum(); }},
      {"min(log1p(x*x), dim 0).values.sum()", [](const Tensor& x) { return min(log1p(x * x), 0).first.sum(); }},
      {"(maximum(erf(x), tanh(x)) * x).sum()", [](const Tensor& x) { return (maximum(erf(x), tanh(x)) * x).sum(); }},
  };
  for (bool save_all : {false, true}) {
    for (const auto& [name, fn] : fns) {
      CompileOptions o;
      o.save_all = save_all;
      auto f = compile([fn = fn](const Tensor& x) { return fn(x); }, o);
      for (std::vector<int64_t> shape : {std::vector<int64_t>{3, 5}, {7, 37}, {33, 129}, {5, 1031}}) {
        SCOPED_TRACE(name + (save_all ? " save_all" : " min-cut") + " shape [" + std::to_string(shape[0]) + "," +
                     std::to_string(shape[1]) + "]");
        Tensor base = randn(shape, kFloat32) * 2;
        Tensor x = base.detach().requires_grad_(), xe = base.detach().requires_grad_();
        Tensor y = f(x);
        y.backward();
        Tensor ye = fn(xe);
        ye.backward();
        ASSERT_TRUE(x.grad().defined());
        expect_close(y, ye, 1e-6, 1e-6);
        Tensor g = x.grad().to(kFloat64), ge = xe.grad().to(kFloat64);
        EXPECT_FALSE(isnan(g).any().item<bool>()) << "NaN in the compiled gradient";
        expect_close(g, ge, 1e-5, 1e-5);
      }
      EXPECT_EQ(f.stats().eager_calls, 0);
    }
  }
}

// A split's pieces inside a compiled step whose batch size changes (symbolic sizes): their
// gradients reach the input as eager's do (one cat where the windows are constant, an add of the
// scatters where they are symbolic), every piece used and one left out.
TEST(CompileGrads, SplitPiecesGradientsAtEverySize) {
  manual_seed(kiln::testing::test_seed(8));
  for (bool skip_middle : {false, true}) {
    SCOPED_TRACE(skip_middle ? "one piece unused" : "every piece used");
    auto step = [skip_middle](const Tensor& x, const Tensor& w) {
      std::vector<Tensor> q = chunk(x.matmul(w), 3, 1), r = unbind(x, 0);
      Tensor loss = (q[0].tanh() * q[2]).sum() + r[0].square().sum();
      if (!skip_middle) loss = loss + q[1].sigmoid().sum();
      loss.backward();
      return loss;
    };
    auto f = compile(step);
    for (int64_t n : {4, 7, 9, 4}) {
      Tensor x = leaf({n, 5}), w = leaf({5, 6});
      Tensor xe = x.detach().requires_grad_(), we = w.detach().requires_grad_();
      expect_close(f(x, w), step(xe, we), 1e-12, 1e-12);
      expect_close(x.grad(), xe.grad(), 1e-12, 1e-12);
      expect_close(w.grad(), we.grad(), 1e-12, 1e-12);
    }
    EXPECT_EQ(f.stats().eager_calls, 0);
  }
}
