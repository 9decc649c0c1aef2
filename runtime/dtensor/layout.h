// Internal helpers of DTensor: placements checked against a tensor and a mesh, and the size a
// tensor dim has at a mesh dim (after the earlier mesh dims' chunks).
#pragma once
#include <vector>

#include "runtime/dtensor/dtensor.h"
#include "runtime/tensor/record.h"

namespace kiln::dist::detail_dt {

// `placements` with Shard dims made non-negative; kiln::Error naming `what` when their number
// differs from the mesh's dims or a dim is out of range.
std::vector<Placement> normalized(std::vector<Placement> placements, int64_t ndim, const DeviceMesh& mesh,
                                  const char* what);
// The size of tensor dim `tensor_dim` on the rank at `coord` before mesh dim `mesh_dim` cuts it
// (the global size chunked by the earlier mesh dims that shard the same tensor dim).
int64_t size_before(const std::vector<int64_t>& shape, const std::vector<Placement>& placements, const DeviceMesh& mesh,
                    const std::vector<int64_t>& coord, size_t mesh_dim, int64_t tensor_dim);

}  // namespace kiln::dist::detail_dt

namespace kiln::dist::detail_dt {
// The transition without gradients: `local` laid out by `src` becomes the shard of `dst`
// (collectives on the mesh dims' groups; see redistribute.cpp).
Tensor redistribute_local(Tensor local, const std::vector<int64_t>& shape, const std::vector<Placement>& src,
                          const std::vector<Placement>& dst, const DeviceMesh& mesh);
// `p` with every Partial read as Replicate (the placements a gradient flows back with).
std::vector<Placement> partials_replicated(std::vector<Placement> p);
}  // namespace kiln::dist::detail_dt
