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
