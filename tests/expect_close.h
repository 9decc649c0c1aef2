// expect_close: element-wise comparison of two tensors for tests of fused/compiled results.
#pragma once
#include <gtest/gtest.h>

#include <cmath>

#include "kiln.h"

// Same sizes and dtype, and every element within atol + rtol * |expected| (NaN matches NaN, an
// infinity the same infinity).
// Float32 results of fused kernels may differ from the reference in the last bits.
inline void expect_close(const kiln::Tensor& a, const kiln::Tensor& b, double rtol = 1e-5, double atol = 1e-6) {
  ASSERT_EQ(a.sizes(), b.sizes());
  ASSERT_EQ(a.dtype(), b.dtype());
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if ((std::isnan(x[i]) && std::isnan(y[i])) || x[i] == y[i]) continue;
    ASSERT_NEAR(x[i], y[i], atol + rtol * std::abs(y[i])) << "element " << i;
  }
}
