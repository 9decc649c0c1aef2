// JVP rules: one tangent builder per differentiable primitive, used by forward-mode AD.
#pragma once
#include <vector>

#include "runtime/tensor/tensor.h"

namespace kiln::detail {

// The tangent of the output of one recorded primitive, given its inputs, their tangents
// (undefined: zero) and its output; undefined when no tangent reaches the output. Written with
// ordinary ops, so tangents are lazy nodes of the same graph as the primal.
Tensor jvp(OpKind op, const Attrs& attrs, const std::vector<Tensor>& inputs, const std::vector<Tensor>& tangents,
           const Tensor& out, const Shape& view_shape);

}  // namespace kiln::detail
