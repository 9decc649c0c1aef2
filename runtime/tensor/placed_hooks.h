// How the tensor layer reaches DTensors (runtime/dtensor) without depending on them: a node with
// `placed` set stands for a tensor laid out over a device mesh, and the few places that meet
// one hand it to these hooks, which runtime/dtensor installs when it is linked in.
//   - recording an op or a view with a placed input records it on the shards instead (the
//     op family's sharding rule picks the placements, collectives move what must move);
//   - reading values (item(), to_vector(), printing) reads the whole tensor;
//   - a gradient accumulated into a placed leaf takes the leaf's placements.
#pragma once
#include "runtime/tensor/tensor.h"

namespace kiln::detail {

struct PlacedHooks {
  // The op over `inputs` (at least one placed) recorded on the shards; returns the placed result
  // (or a plain one where the op leaves the mesh: a copy to another device type).
  NodePtr (*record)(OpKind op, const NodeList& inputs, const Attrs& attrs, DType dtype, const Shape& shape,
                    Device device) = nullptr;
  // The view step of placed `in` whose global layout is (shape, strides, offset).
  NodePtr (*view)(OpKind op, const NodePtr& in, const Attrs& attrs, const Shape& shape, const Shape& strides,
                  const SymInt& offset) = nullptr;
  // The whole tensor a placed tensor stands for, on every rank.
  Tensor (*full)(const Tensor& t) = nullptr;
  // `grad` laid out as placed leaf `leaf` (returned as is when already).
  Tensor (*as_placed_like)(const Tensor& grad, const Tensor& leaf) = nullptr;
};
// The installed hooks (all null without runtime/dtensor).
PlacedHooks& placed_hooks();

// Whether any of `inputs` is placed.
inline bool any_placed(const NodeList& inputs) {
  for (const NodePtr& n : inputs)
    if (n->placed) [[unlikely]]
      return true;
  return false;
}
// The hooks, or kiln::Error when a placed node arrives without them.
const PlacedHooks& placed_hooks_checked();

}  // namespace kiln::detail
