// Gradients that are slice windows scattered into zeros (the gradient of a slice): their sum
// (autograd.cpp), a split's merged into one tensor rather than added, and a window's values read
// back (gradient_sum.cpp).
#pragma once

#include <optional>

#include "runtime/tensor/tensor.h"

namespace kiln::detail {

// a + b; where both are slice windows of one dim scattered into zeros (the gradients of a
// split's pieces), their windows on one zero tensor, and their concatenation once they tile it.
Tensor sum_gradients(const Tensor& a, const Tensor& b);
// Where g is one window [0, length) of dim `dim` scattered into zeros (the gradient of that
// slice), the window's values (sizes may be symbolic); else nothing.
std::optional<Tensor> leading_window_source(const Tensor& g, int64_t dim, const SymInt& length);

}  // namespace kiln::detail
