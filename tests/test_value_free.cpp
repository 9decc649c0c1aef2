// Shape-only backward nodes (runtime/autograd/value_free.cpp): which vjp rules read no values is
// found from the rules themselves, and a stand-in that a rule does read is found, never turned
// into NaN or zero gradients silently.
//
//   ValueFree.DerivedFromTheRules  ops whose rules use only shapes (sums, differences, views,
//       copies, casts, concatenation, im2col) come out value-free; those reading an operand, a mask
//       or an index (mul, where, relu, gather, matmul) do not
//   ValueFree.EachNodeKeepsOnlyWhatItsRuleReads  per value: matmul keeps its operands (not its
//       product), exp its output, log its input, where its condition; only what the gradients
//       of the inputs that need one read (x * mask keeps the mask)
//   ValueFree.PartlyKeptNodesGiveFiniteDifferences  gradients through such nodes (float64)
//   ValueFree.AReadStandInIsFound  a gradient built from a stand-in through a comparison, a mask,
//       an integer cast or a view is found; one built from g alone is not
//   ValueFree.GradientsEqualTheKeptNodes  a program mixing shape-only and value-reading nodes:
//       gradients equal finite differences (float64)
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "kiln.h"
#include "runtime/autograd/autograd_rules.h"
#include "runtime/tensor/record.h"
#include "tests/expect_close.h"
#include "tests/test_seed.h"

using namespace kiln;

namespace {

// Whether `op`'s rule reads any value, asked with x (and y) as its inputs and `out` its output,
// every input wanting a gradient.
bool reads(OpKind op, const std::vector<Tensor>& in, const Tensor& out, const Attrs& a = {}) {
  const std::vector<bool> r = detail::vjp_reads(op, a, in, out, out.shape(), std::vector<bool>(in.size(), true));
  return std::find(r.begin(), r.end(), true) != r.end();
}

// The gradients backward() leaves in a and b for f(a, b).sum-like scalars: central differences
// of f at each element (float64), within 1e-6 relative and 1e-8.
void expect_backward_matches_differences(const std::function<Tensor(const Tensor&, const Tensor&)>& f,
                                         const Tensor& a, const Tensor& b) {
  f(a, b).backward();
  const double eps = 1e-6;
  for (const Tensor* t : {&a, &b}) {
    std::vector<double> v = t->detach().to_vector<double>(), want(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      auto at = [&](double d) {
        std::vector<double> u = v;
        u[i] += d;
        Tensor p = from_vector(u, t->sizes());
        return (t == &a ? f(p, b.detach()) : f(a.detach(), p)).item<double>();
      };
      want[i] = (at(eps) - at(-eps)) / (2 * eps);
    }
    expect_close(t->grad(), from_vector(want, t->sizes()), 1e-6, 1e-8);
  }
}

}  // namespace

TEST(ValueFree, DerivedFromTheRules) {
  manual_seed(kiln::testing::test_seed(40));
  const Tensor x = randn({3, 4}), y = randn({3, 4});
  Attrs sum0;
  sum0.ints = {0};
  EXPECT_FALSE(reads(OpKind::Add, {x, y}, x + y));
  EXPECT_FALSE(reads(OpKind::Sub, {x, y}, x - y));
  EXPECT_FALSE(reads(OpKind::Neg, {x}, -x));
  EXPECT_FALSE(reads(OpKind::Sum, {x}, x.sum({0}), sum0));
  EXPECT_FALSE(reads(OpKind::Cast, {x}, x.to(kFloat64)));
  EXPECT_FALSE(reads(OpKind::Contiguous, {x}, x.contiguous()));
  Attrs perm;
  perm.ints = {1, 0};
  EXPECT_FALSE(reads(OpKind::Permute, {x}, x.t(), perm));
  EXPECT_TRUE(reads(OpKind::Mul, {x, y}, x * y));
  EXPECT_TRUE(reads(OpKind::Div, {x, y}, x / y));
  EXPECT_TRUE(reads(OpKind::Relu, {x}, relu(x)));  // (its mask: out > 0)
  EXPECT_TRUE(reads(OpKind::Tanh, {x}, tanh(x)));
  EXPECT_TRUE(reads(OpKind::Where, {gt(x, 0), x, y}, where(gt(x, 0), x, y)));  // (the condition)
  EXPECT_TRUE(reads(OpKind::Matmul, {x, y.t()}, matmul(x, y.t())));
  EXPECT_TRUE(reads(OpKind::Amax, {x}, amax(x, {0}), sum0));  // (ties: x == out)
}

// Per value: a node keeps what its rule reads and nothing else (PyTorch's derivatives.yaml).
TEST(ValueFree, EachNodeKeepsOnlyWhatItsRuleReads) {
  manual_seed(kiln::testing::test_seed(42));
  const Tensor x = randn({3, 4}), y = randn({4, 5}), z = randn({3, 4});
  auto which = [](OpKind op, const std::vector<Tensor>& in, const Tensor& out, const Attrs& a = {},
                  std::vector<bool> needs = {}) {
    if (needs.empty()) needs.assign(in.size(), true);
    return detail::vjp_reads(op, a, in, out, out.shape(), needs);
  };
  using V = std::vector<bool>;
  EXPECT_EQ(which(OpKind::Matmul, {x, y}, matmul(x, y)), (V{true, true, false}));  // not the product
  EXPECT_EQ(which(OpKind::Exp, {x}, exp(x)), (V{false, true}));  // its output, not its input
  EXPECT_EQ(which(OpKind::Log, {x}, log(x)), (V{true, false}));
  EXPECT_EQ(which(OpKind::Mul, {x, z}, x * z), (V{true, true, false}));
  // Only the inputs that need a gradient count: x * mask keeps the mask, not x (dropout).
  EXPECT_EQ(which(OpKind::Mul, {x, z}, x * z, {}, {true, false}), (V{false, true, false}));
  EXPECT_EQ(which(OpKind::Matmul, {x, y}, matmul(x, y), {}, {false, true}), (V{true, false, false}));
  EXPECT_EQ(which(OpKind::Add, {x, z}, x + z), (V{false, false, false}));
  // (a mask-only where reads its condition, not its branches)
  EXPECT_EQ(which(OpKind::Where, {gt(x, 0), x, z}, where(gt(x, 0), x, z)), (V{true, false, false, false}));
}

// Gradients through nodes that keep part of their values (an input, the output, or both), in a
// chain where the dropped ones are read by no one else: equal to finite differences (float64), in
// lazy eager and with the stand-ins checked (any read of one raises).
TEST(ValueFree, PartlyKeptNodesGiveFiniteDifferences) {
  manual_seed(kiln::testing::test_seed(43));
  const Tensor a = randn({3, 4}, kFloat64).requires_grad_(true), w = randn({4, 4}, kFloat64).requires_grad_(true);
  auto f = [](const Tensor& p, const Tensor& q) {
    Tensor h = exp(matmul(p, q) * 0.3);  // matmul keeps p and q; exp its output only
    const Tensor c = full({3, 4}, 0.7, kFloat64);  // (x * c with only x needing a gradient keeps c)
    return (log(h + 2.0) * h).sum({}) + tanh(matmul(h, q)).sum({}) + (sin(h) * c).sum({});
  };
  expect_backward_matches_differences(f, a, w);
}

TEST(ValueFree, AReadStandInIsFound) {
  const Tensor s = detail::stand_in(make_shape({3, 4}), kFloat32, cpu());
  const Tensor g = randn({3, 4});
  EXPECT_FALSE(detail::reads_any({g * 2.0, g.sum({0})}, {s}, g));
  EXPECT_TRUE(detail::reads_any({where(gt(s, 0), g, 0)}, {s}, g));  // a comparison (gave zeros)
  EXPECT_TRUE(detail::reads_any({g * s.to(kInt64)}, {s}, g));  // an integer stand-in (gave 0)
  EXPECT_TRUE(detail::reads_any({g.t() * s.t()}, {s}, g));  // through views
  EXPECT_TRUE(detail::reads_any({Tensor(), g * s}, {s}, g));
}

TEST(ValueFree, GradientsEqualTheKeptNodes) {
  manual_seed(kiln::testing::test_seed(41));
  const Tensor a = randn({4, 5}, kFloat64).requires_grad_(true), b = randn({5}, kFloat64).requires_grad_(true);
  auto f = [](const Tensor& p, const Tensor& q) {
    Tensor h = cat({p + q, (p - q).t().contiguous().t()}, 0);  // value-free: add, sub, views, cat
    return (relu(h) * h).sum({}) + where(gt(h, 0.3), h, -h).sum({});
  };
  expect_backward_matches_differences(f, a, b);
}
