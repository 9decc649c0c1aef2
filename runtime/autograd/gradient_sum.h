// The sum of two gradients that reach one backward node (autograd.cpp), slice windows of a split
// merged into one tensor rather than added (gradient_sum.cpp).
#pragma once

#include "runtime/tensor/tensor.h"

namespace kiln::detail {

// a + b; where both are slice windows of one dim scattered into zeros (the gradients of a
// split's pieces), their windows on one zero tensor, and their concatenation once they tile it.
Tensor sum_gradients(const Tensor& a, const Tensor& b);

}  // namespace kiln::detail
