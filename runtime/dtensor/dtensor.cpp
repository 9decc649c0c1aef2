// DTensor: placements, torch.chunk pieces, local shapes, from_local / distribute_tensor.
#include "runtime/dtensor/dtensor.h"

#include "runtime/dtensor/layout.h"
#include "runtime/ops/ops.h"

namespace kiln::dist {

std::string Placement::str() const {
  switch (kind) {
    case Kind::Shard: return "S(" + std::to_string(dim) + ")";
    case Kind::Replicate: return "R";
    case Kind::Partial: return std::string("P(") + reduce_op_name(op) + ")";
  }
  return "?";
}

ChunkRange chunk_range(int64_t size, int64_t n, int64_t index) {
  KILN_CHECK(n > 0 && index >= 0 && index < n, "chunk_range: piece ", index, " of ", n);
  const int64_t piece = (size + n - 1) / n;  // torch.chunk: ceil(size / n), the tail shorter or empty
  const int64_t start = std::min(size, index * piece);
  return {start, std::min(size, start + piece) - start};
}

namespace detail_dt {

std::vector<Placement> normalized(std::vector<Placement> placements, int64_t ndim, const DeviceMesh& mesh,
                                  const char* what) {
  KILN_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), what, ": ", placements.size(),
             " placements for a ", mesh.ndim(), "-d mesh");
  for (Placement& p : placements)
    if (p.is_shard()) {
      KILN_CHECK(p.dim >= -ndim && p.dim < ndim, what, ": ", p.str(), " is out of range for a ", ndim, "-d tensor");
      if (p.dim < 0) p.dim += ndim;
    }
  return placements;
}

int64_t size_before(const std::vector<int64_t>& shape, const std::vector<Placement>& placements, const DeviceMesh& mesh,
                    const std::vector<int64_t>& coord, size_t mesh_dim, int64_t tensor_dim) {
  int64_t size = shape[static_cast<size_t>(tensor_dim)];
  for (size_t d = 0; d < mesh_dim; ++d)
    if (placements[d].is_shard() && placements[d].dim == tensor_dim)
      size = chunk_range(size, mesh.shape()[d], coord[d]).length;
  return size;
}

}  // namespace detail_dt

std::vector<int64_t> DTensor::local_shape(const std::vector<int64_t>& shape, const std::vector<Placement>& placements,
                                          const DeviceMesh& mesh, const std::vector<int64_t>& coordinate) {
  std::vector<int64_t> s = shape;
  for (size_t d = 0; d < placements.size(); ++d)
    if (placements[d].is_shard()) {
      int64_t& size = s[static_cast<size_t>(placements[d].dim)];
      size = chunk_range(size, mesh.shape()[d], coordinate[d]).length;
    }
  return s;
}

DTensor DTensor::from_local(const Tensor& local, const DeviceMesh& mesh, std::vector<Placement> placements,
                            std::optional<std::vector<int64_t>> shape) {
  KILN_CHECK(local.defined(), "DTensor::from_local: undefined local tensor");
  placements = detail_dt::normalized(std::move(placements), local.dim(), mesh, "DTensor::from_local");
  std::vector<int64_t> global = shape ? *shape : local.sizes();
  if (!shape)
    for (size_t d = 0; d < placements.size(); ++d)
      if (placements[d].is_shard()) global[static_cast<size_t>(placements[d].dim)] *= mesh.shape()[d];
  KILN_CHECK(static_cast<int64_t>(global.size()) == local.dim(), "DTensor::from_local: shape has ", global.size(),
             " dims, the local tensor ", local.dim());
  const std::vector<int64_t> expect = local_shape(global, placements, mesh, mesh.coordinate());
  KILN_CHECK(expect == local.sizes(), "DTensor::from_local: this rank's shard of a ", kiln::detail::str(global),
             " tensor with these placements is ", kiln::detail::str(expect), ", the local tensor is ",
             kiln::detail::str(local.shape()), shape ? "" : " (without shape= the shards are taken to be even)");
  return DTensor(local, mesh, std::move(placements), std::move(global));
}

DTensor distribute_tensor(const Tensor& tensor, const DeviceMesh& mesh, std::vector<Placement> placements) {
  placements = detail_dt::normalized(std::move(placements), tensor.dim(), mesh, "distribute_tensor");
  Tensor local = tensor;
  for (size_t d = 0; d < placements.size(); ++d) {
    KILN_CHECK(!placements[d].is_partial(), "distribute_tensor: ", placements[d].str(),
               " is not a placement of a full tensor; use DTensor::from_local");
    if (placements[d].is_shard()) {
      const ChunkRange c = chunk_range(local.size(placements[d].dim), mesh.shape()[d], mesh.coordinate()[d]);
      local = local.narrow(placements[d].dim, c.start, c.length);
    }
  }
  return DTensor(local.contiguous(), mesh, std::move(placements), tensor.sizes());
}

Tensor DTensor::full_tensor() const {
  return redistribute(mesh_, std::vector<Placement>(placements_.size(), Replicate())).to_local();
}

std::string DTensor::str() const {
  std::string p;
  for (size_t i = 0; i < placements_.size(); ++i) p += (i ? ", " : "") + placements_[i].str();
  return "DTensor(shape " + kiln::detail::str(shape_) + ", placements [" + p + "], local " +
         kiln::detail::str(local_.shape()) + ")";
}

}  // namespace kiln::dist
