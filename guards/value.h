// Value: one flattened argument or result of a compiled function.
#pragma once
#include <cstdint>
#include <variant>

#include "runtime/tensor.h"

namespace kiln {

// A tensor or a scalar (int, double, bool), as compile() flattens arguments and results.
using Value = std::variant<Tensor, int64_t, double, bool>;

}  // namespace kiln
