// xtensor interop: zero-copy in both directions, copies for non-contiguous views.
#include <gtest/gtest.h>

#include <xtensor/xarray.hpp>
#include <xtensor/xio.hpp>

#include "kiln.h"
#include "runtime/tensor/xtensor_interop.h"

using namespace kiln;

TEST(XTensor, FromXtensorIsZeroCopy) {
  xt::xarray<float> a = {{1, 2, 3}, {4, 5, 6}};
  Tensor t = from_xtensor(a);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.data<float>(), a.data());
  a(1, 2) = 60;  // the tensor sees the container's memory
  EXPECT_FLOAT_EQ((t * 2).sum().item<float>(), 2 * (1 + 2 + 3 + 4 + 5 + 60));
}

TEST(XTensor, FromXtensorRvalueTakesOwnership) {
  Tensor t = from_xtensor(xt::xtensor<double, 1>({1.5, 2.5}));
  EXPECT_EQ(t.dtype(), kFloat64);
  EXPECT_DOUBLE_EQ(t.sum().item<double>(), 4.0);
}

TEST(XTensor, ToXtensorViewsContiguousAndCopiesStrided) {
  Tensor t = arange(6).to(kFloat32).reshape({2, 3});
  auto x = to_xtensor<float>(t);
  EXPECT_EQ(x.data(), t.data<float>());  // zero-copy
  EXPECT_FLOAT_EQ(x(1, 2), 5.f);
  auto y = to_xtensor<float>(t.t());  // strided view -> copy
  EXPECT_EQ(y.shape()[0], 3u);
  EXPECT_FLOAT_EQ(y(2, 1), 5.f);
  EXPECT_THROW(to_xtensor<double>(t), Error);
}

TEST(XTensor, ToXtensorOutlivesTensor) {
  auto make = [] { return to_xtensor<float>(full({4}, 3.0f)); };
  auto x = make();  // the adaptor keeps kiln's storage alive
  EXPECT_FLOAT_EQ(xt::sum(x)(), 12.f);
}
