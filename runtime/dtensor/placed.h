// The node of a DTensor: the global shape, dtype and device, and a PlacedLayout naming the
// shard, the mesh and the placements. Made only here; read by the dispatcher and DTensor.
#pragma once
#include <vector>

#include "runtime/dtensor/dtensor.h"

namespace kiln::dist::detail_dt {

struct PlacedLayout final : kiln::Placed {
  DeviceMesh mesh;
  std::vector<Placement> placements;
};

// The layout of a placed node, or null for a plain one.
inline const PlacedLayout* layout_of(const Node& n) { return static_cast<const PlacedLayout*>(n.placed.get()); }
// A node standing for the tensor of global `shape` (constant sizes) whose shard on this rank is
// `local`; `strides` and `offset` (the global layout, for views: in-place writes through a view
// name their window with them) default to contiguous.
NodePtr make_placed(NodePtr local, const DeviceMesh& mesh, std::vector<Placement> placements, const Shape& shape,
                    Shape strides = {}, SymInt offset = 0);
inline Tensor placed_tensor(NodePtr local, const DeviceMesh& mesh, std::vector<Placement> placements,
                            const Shape& shape) {
  return Tensor::from_node(make_placed(std::move(local), mesh, std::move(placements), shape));
}
// The shard of a placed node as a plain tensor (no autograd).
inline Tensor shard_of(const Node& n) { return Tensor::from_node(n.placed->local); }
// `t` as a DTensor on `mesh`: itself when placed, else read as Replicate (the same value on
// every rank).
DTensor as_placed(const Tensor& t, const DeviceMesh& mesh);
// Installs the dispatcher (dispatch.cpp) as the tensor layer's placed hooks (once; make_placed
// calls it, so no placed node exists before).
void install_placed_hooks();
// Constant sizes of `s` (kiln::Error naming `what` for symbolic ones).
std::vector<int64_t> constant_sizes(const Shape& s, const char* what);

}  // namespace kiln::dist::detail_dt
