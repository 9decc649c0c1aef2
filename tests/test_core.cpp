// Core semantics: laziness, dtypes and promotion, views and in-place ops, errors, printing.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "kiln.h"

using namespace kiln;

TEST(Lazy, OpsOnlyRecordUntilDataIsRead) {
  Tensor x = ones({4, 4});
  reset_stats();
  Tensor y = (x * 2 + 1).exp().sum();
  auto s = stats();
  EXPECT_GE(s.nodes_recorded, 4u);
  EXPECT_EQ(s.nodes_executed, 0u);
  EXPECT_EQ(s.materializations, 0u);
  EXPECT_FALSE(y.is_materialized());
  EXPECT_NEAR(y.item<double>(), 16 * std::exp(3.0), 1e-3);
  s = stats();
  EXPECT_EQ(s.materializations, 1u);
  EXPECT_GE(s.nodes_executed, 4u);
  // Reading again runs nothing.
  y.item<double>();
  EXPECT_EQ(stats().materializations, 1u);
}

TEST(Lazy, PendingLimitFlushes) {
  uint64_t old = pending_limit();
  set_pending_limit(50);
  reset_stats();
  Tensor x = ones({3});
  for (int i = 0; i < 200; ++i) x = x + 1;
  EXPECT_GE(stats().materializations, 2u);
  EXPECT_LT(stats().pending, 60u);
  EXPECT_FLOAT_EQ(x[0].item<float>(), 201.f);
  set_pending_limit(old);
}

// The number operand of an op (the 2 of x * 2) is a constant node that a thread's eager ops
// share per value and dtype: not pending work, never stored by a materialization, and the same
// results; a compile() trace records its own.
TEST(Lazy, ScalarOperandsShareOneConstantPerValue) {
  Tensor x = arange(0.0, 6.0);
  Tensor a = x * 2, b = (x + 1) * 2, c = 2 * x, d = x * 3, e = x.to(kFloat64) * 2, g = x * 2.0;
  const NodePtr two = a.node()->inputs.at(1);
  EXPECT_EQ(b.node()->inputs.at(1), two);
  EXPECT_EQ(c.node()->inputs.at(0), two);
  EXPECT_NE(g.node()->inputs.at(1), two) << "an integer and a floating 2 are recorded apart";
  EXPECT_NE(d.node()->inputs.at(1), two);
  EXPECT_NE(e.node()->inputs.at(1), two) << "another dtype, another constant";
  reset_stats();
  const uint64_t pending = stats().pending;
  Tensor f = x * 2;
  EXPECT_EQ(stats().pending, pending + 1) << "the multiplication is pending work, its shared constant is not";
  eval({a, b, c, f, g});
  EXPECT_FALSE(two->materialized()) << "nothing asked for the constant";
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(c.to_vector<float>(), a.to_vector<float>());
  EXPECT_EQ(g.to_vector<float>(), a.to_vector<float>());
  EXPECT_EQ((x * 2).to_vector<float>(), a.to_vector<float>()) << "a later segment reads it again";
  NodePtr traced;
  auto fn = compile([&](const Tensor& y) {
    Tensor r = y * 2;
    traced = r.node()->inputs.at(1);
    return r;
  });
  EXPECT_EQ(fn(x).to_vector<float>(), a.to_vector<float>());
  EXPECT_NE(traced, two) << "a trace's constants are its own";
}

TEST(Lazy, DeepChainDoesNotOverflowStack) {
  uint64_t old = pending_limit();
  set_pending_limit(1000000);
  Tensor x = zeros({2});
  for (int i = 0; i < 200000; ++i) x = x + 1;
  EXPECT_FLOAT_EQ(x[1].item<float>(), 200000.f);
  set_pending_limit(old);
}

TEST(DTypes, Promotion) {
  EXPECT_EQ((ones({2}, kInt32) / ones({2}, kInt32)).dtype(), kFloat32);
  EXPECT_EQ((ones({2}, kBool) + ones({2}, kInt64)).dtype(), kInt64);
  EXPECT_EQ((ones({2}, kFloat32) * ones({2}, kFloat64)).dtype(), kFloat64);
  EXPECT_EQ((ones({2}, kInt32) + 2).dtype(), kInt32);
  EXPECT_EQ((ones({2}, kInt32) + 2.5).dtype(), kFloat32);
  EXPECT_EQ((ones({2}, kFloat16) + ones({2}, kBFloat16)).dtype(), kFloat32);
  EXPECT_EQ((ones({2}, kFloat32) + scalar_tensor(1.0, kFloat64)).dtype(), kFloat32);  // 0-d is lower priority
  EXPECT_EQ((ones({2}, kInt32) + scalar_tensor(1.0, kFloat64)).dtype(), kFloat64);
  EXPECT_EQ((ones({2}, kBool) + true).dtype(), kBool);
  EXPECT_EQ(ones({2}, kFloat16).exp().dtype(), kFloat16);
  EXPECT_EQ(arange(5).dtype(), kInt64);
  EXPECT_EQ(arange(0.0, 1.0, 0.25).dtype(), kFloat32);
}

TEST(DTypes, HalfRoundTrip) {
  Tensor x = tensor({0.1, 1.0, 65504.0, 1e-7, -2.5});
  std::vector<float> h = x.to(kFloat16).to(kFloat32).to_vector<float>();
  EXPECT_NEAR(h[0], 0.0999755859375f, 1e-9);
  EXPECT_EQ(h[1], 1.0f);
  EXPECT_EQ(h[2], 65504.0f);
  EXPECT_NEAR(h[3], 1.19209e-07f, 1e-9);
  EXPECT_EQ(h[4], -2.5f);
  std::vector<float> b = x.to(kBFloat16).to(kFloat32).to_vector<float>();
  EXPECT_NEAR(b[0], 0.10009765625f, 1e-9);
}

TEST(Views, AliasAndWriteThrough) {
  Tensor base = arange(12).to(kFloat32).reshape({3, 4});
  Tensor row = base[1];
  Tensor col = base.select(1, 2);
  Tensor tr = base.t();
  EXPECT_TRUE(row.is_view());
  row.add_(100);
  EXPECT_FLOAT_EQ(base.index({1, 0}).item<float>(), 104.f);
  EXPECT_FLOAT_EQ(col[1].item<float>(), 106.f);  // another view of the same base sees it
  EXPECT_FLOAT_EQ(tr.index({2, 1}).item<float>(), 106.f);
  base.index_put_({Slice(), Slice(0, 4, 2)}, 0.0);
  EXPECT_FLOAT_EQ(row[0].item<float>(), 0.f);
  EXPECT_FLOAT_EQ(row[1].item<float>(), 105.f);
}

TEST(Views, ViewOfViewWritesThrough) {
  Tensor base = zeros({4, 5});
  Tensor a = base.slice(0, 1, 3);  // rows 1..2
  Tensor b = a.slice(1, 2, 5, 2);  // cols 2, 4
  b.fill_(7);
  std::vector<float> v = base.to_vector<float>();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j) {
      float want = (i >= 1 && i < 3 && (j == 2 || j == 4)) ? 7.f : 0.f;
      EXPECT_EQ(v[i * 5 + j], want) << i << "," << j;
    }
}

TEST(Errors, ClearMessagesAndNothingRecorded) {
  Tensor a = ones({2, 3}), b = ones({4, 3});
  reset_stats();
  try {
    (void)(a + b);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be broadcast"), std::string::npos) << e.what();
  }
  EXPECT_EQ(stats().nodes_recorded, 0u);
  EXPECT_THROW(matmul(a, b), Error);
  EXPECT_THROW(a.sum({2}), Error);
  EXPECT_THROW(amax(zeros({0, 3}), {0}), Error);
  EXPECT_THROW(ones({2}, kInt32) & ones({2}), Error);
  Tensor idx = from_vector<int64_t>({0, 5});
  Tensor g = index_select(ones({3}), 0, idx);
  EXPECT_THROW(g.eval(), Error);
  Tensor x = ones({3}, kInt64);
  EXPECT_THROW(x.add_(0.5), Error);  // float result can't be cast to int64 in place
  EXPECT_EQ(x.dtype(), kInt64);
}

TEST(Printing, LikePyTorch) {
  std::ostringstream os;
  os << tensor({{1.0, 2.5}, {3.0, -4.0}});
  EXPECT_EQ(os.str(), "tensor([[ 1.0000,  2.5000],\n        [ 3.0000, -4.0000]], shape=[2, 2], dtype=float32)");
  EXPECT_EQ(to_string(arange(3)), "tensor([0, 1, 2], shape=[3], dtype=int64)");
  EXPECT_EQ(to_string(ones({2}) > 0), "tensor([True, True], shape=[2], dtype=bool)");
}

TEST(Layouts, SameStructureDifferentStridesGiveRightAnswers) {
  // Equal shapes, dtypes and ops, but one input dense and one a strided slice: anything cached
  // by structure (plans, kernels) must tell them apart.
  Tensor dense = arange(12).to(kFloat32).reshape({4, 3}).contiguous();
  Tensor wide = arange(16).to(kFloat32).reshape({4, 4});
  Tensor sliced = wide.slice(1, 0, 3);
  for (int rep = 0; rep < 2; ++rep) {
    EXPECT_EQ((dense * 2 + 1).to_vector<float>(), (std::vector<float>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}));
    EXPECT_EQ((sliced * 2 + 1).to_vector<float>(), (std::vector<float>{1, 3, 5, 9, 11, 13, 17, 19, 21, 25, 27, 29}));
  }
}
