// Value: one flattened argument or result of a compiled function.
#pragma once
#include <cstdint>
#include <variant>

#include "runtime/tensor/tensor.h"

namespace kiln {

// A tensor or a scalar (int, double, bool), as compile() flattens arguments and results.
// Arguments hold their tensors borrowed (`const Tensor*`: the caller's handles outlive the
// call, and a guard hit copies no handle); results own theirs.
using Value = std::variant<Tensor, int64_t, double, bool, const Tensor*>;

// The tensor a value holds (owned or borrowed), or null for a scalar.
inline const Tensor* as_tensor(const Value& v) {
  if (auto* t = std::get_if<Tensor>(&v)) return t;
  if (auto* p = std::get_if<const Tensor*>(&v)) return *p;
  return nullptr;
}
// 0 for a tensor (owned or borrowed), 1 int, 2 double, 3 bool.
inline uint8_t value_kind(const Value& v) { return v.index() == 4 ? 0 : static_cast<uint8_t>(v.index()); }

}  // namespace kiln
