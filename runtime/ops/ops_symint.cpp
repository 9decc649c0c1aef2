// Creation ops with SymInt sizes: shapes computed from Tensor::sym_size stay symbolic.
#include <algorithm>

#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln {
namespace {
void check_sym_sizes(const Shape& shape, const char* op) {
  for (const auto& d : shape)
    KILN_CHECK(sym_ge(d, 0).value_or(false), op, ": sizes must be non-negative, got ", detail::str(shape));
}
}  // namespace

Tensor full_symint(const Shape& shape, Scalar value, std::optional<DType> dtype, Device device) {
  check_sym_sizes(shape, "full");
  if (std::all_of(shape.begin(), shape.end(), [](const SymInt& d) { return d.is_constant(); }))
    return full(concrete(shape), value, dtype, device);
  return full_shape(shape, value, dtype ? *dtype : value.default_dtype(), device);
}
Tensor zeros_symint(const Shape& shape, DType dtype, Device device) { return full_symint(shape, 0, dtype, device); }
Tensor ones_symint(const Shape& shape, DType dtype, Device device) { return full_symint(shape, 1, dtype, device); }

Tensor arange_symint(const SymInt& end, Device device) {
  KILN_CHECK(sym_ge(end, 0).value_or(false), "arange: upper bound must be non-negative, got ", end.str());
  return detail::arange_of(end, device);
}

}  // namespace kiln
