// Placements along one mesh dim of an n-d mesh, the others kept: what the parallel styles and
// fully_shard ask of parameters and activations.
#pragma once
#include <vector>

#include "runtime/dtensor/dtensor.h"

namespace kiln::dist::parallel_detail {

// `t`'s placements (all Replicate for a plain tensor) with mesh dim `m` set to `p`.
inline std::vector<Placement> with_dim(const Tensor& t, const DeviceMesh& mesh, size_t m, const Placement& p) {
  std::vector<Placement> out = is_dtensor(t) ? DTensor(t).placements()
                                             : std::vector<Placement>(static_cast<size_t>(mesh.ndim()), Replicate());
  out[m] = p;
  return out;
}

// A mesh dim given as in Python (-1: the last), checked against the mesh; `what` names the caller.
inline size_t mesh_dim_index(int64_t dim, const DeviceMesh& mesh, const char* what) {
  const int64_t nd = mesh.ndim();
  KILN_CHECK(dim >= -nd && dim < nd, what, ": mesh dim ", dim, " of a ", nd, "-d mesh");
  return static_cast<size_t>(dim < 0 ? dim + nd : dim);
}

}  // namespace kiln::dist::parallel_detail
