// The kernel view (dtype, sizes, strides, data pointer) of a materialized node.
#pragma once
#include "kernels/cpu/strided.h"
#include "runtime/ir/node.h"

namespace kiln::kernels {

// `n` as a kernel operand (requires storage and concrete sizes).
inline Operand operand_of(const Node& n) {
  Operand o;
  o.dtype = n.dtype;
  o.sizes = concrete(n.shape);
  o.strides = concrete(n.strides);
  o.data = static_cast<char*>(n.storage->data) + n.offset.as_int() * static_cast<int64_t>(itemsize(n.dtype));
  return o;
}

}  // namespace kiln::kernels
