// DTensor: placements, torch.chunk pieces, local shapes, the placed node, from_local /
// distribute_tensor / to_local.
#include "runtime/dtensor/dtensor.h"

#include "runtime/autograd/autograd.h"
#include "runtime/dtensor/layout.h"
#include "runtime/dtensor/placed.h"
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

std::vector<int64_t> constant_sizes(const Shape& s, const char* what) {
  std::vector<int64_t> out;
  for (const SymInt& d : s) {
    KILN_CHECK(d.is_constant(), what, ": a DTensor with a symbolic size (", kiln::detail::str(s),
               "); DTensors have constant sizes");
    out.push_back(d.as_int());
  }
  return out;
}

NodePtr make_placed(NodePtr local, const DeviceMesh& mesh, std::vector<Placement> placements, const Shape& shape,
                    Shape strides, SymInt offset) {
  KILN_CHECK(!local->placed, "DTensor: a shard cannot itself be a DTensor");
  install_placed_hooks();
  auto layout = std::make_shared<PlacedLayout>();
  layout->local = local;
  layout->mesh = mesh;
  layout->placements = std::move(placements);
  NodePtr n = new_node();
  n->op = OpKind::Leaf;
  n->dtype = local->dtype;
  n->device = local->device;
  n->strides = strides.empty() ? contiguous_strides(shape) : std::move(strides);
  n->shape = shape;
  n->offset = std::move(offset);
  n->pending = false;  // never computed itself (its shard is)
  kiln::detail::pending_add(-1);
  n->placed = std::move(layout);
  return n;
}

DTensor as_placed(const Tensor& t, const DeviceMesh& mesh) {
  if (t.node()->placed) return DTensor(t);
  Tensor out = placed_tensor(t.node(), mesh, std::vector<Placement>(static_cast<size_t>(mesh.ndim()), Replicate()),
                             t.shape());
  // The plain tensor's gradient is the whole of the DTensor's.
  kiln::detail::attach_custom_grad(out, "as_replicate", {t}, [mesh](const Tensor& g, bool) {
    return std::vector<Tensor>{as_placed(g, mesh).full_tensor()};
  });
  return DTensor(out);
}

}  // namespace detail_dt

DTensor::DTensor(const Tensor& t) : Tensor(t) {
  KILN_CHECK(t.defined() && t.node()->placed, "DTensor: expected a DTensor, got a plain tensor",
             t.defined() ? " of shape " + kiln::detail::str(t.shape()) : std::string(" (undefined)"),
             "; make one with distribute_tensor or DTensor::from_local");
}

bool is_dtensor(const Tensor& t) { return t.defined() && t.node()->placed != nullptr; }

Tensor full_tensor(const Tensor& t) { return is_dtensor(t) ? DTensor(t).full_tensor() : t; }
Tensor to_local(const Tensor& t) { return is_dtensor(t) ? DTensor(t).to_local() : t; }
DTensor redistribute(const Tensor& t, std::vector<Placement> placements) {
  return DTensor(t).redistribute(std::move(placements));
}

const DeviceMesh& DTensor::device_mesh() const { return detail_dt::layout_of(*node())->mesh; }
const std::vector<Placement>& DTensor::placements() const { return detail_dt::layout_of(*node())->placements; }

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
  KILN_CHECK(!is_dtensor(local), "DTensor::from_local: the local tensor is already a DTensor");
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
  const std::vector<Placement> src = placements;
  Tensor out = detail_dt::placed_tensor(local.node(), mesh, std::move(placements), make_shape(global));
  // The gradient comes back to the shard with these placements (a Partial one as Replicate).
  kiln::detail::attach_custom_grad(out, "from_local", {local}, [src, mesh](const Tensor& g, bool) {
    return std::vector<Tensor>{
        detail_dt::as_placed(g, mesh).redistribute(detail_dt::partials_replicated(src)).to_local()};
  });
  return DTensor(out);
}

Tensor DTensor::to_local() const {
  Tensor out = detail_dt::shard_of(*node());
  // The shard's gradient is a DTensor with these placements.
  kiln::detail::attach_custom_grad(
      out, "to_local", {*this},
      [mesh = device_mesh(), pl = placements(), shape = node()->shape](const Tensor& g, bool) {
        Tensor local = is_dtensor(g) ? DTensor(g).to_local() : g;
        return std::vector<Tensor>{detail_dt::placed_tensor(local.node(), mesh, pl, shape)};
      });
  return out;
}

DTensor distribute_tensor(const Tensor& tensor, const DeviceMesh& mesh, std::vector<Placement> placements) {
  KILN_CHECK(!is_dtensor(tensor), "distribute_tensor: the tensor is already a DTensor; use redistribute");
  placements = detail_dt::normalized(std::move(placements), tensor.dim(), mesh, "distribute_tensor");
  for (const Placement& p : placements)
    KILN_CHECK(!p.is_partial(), "distribute_tensor: ", p.str(),
               " is not a placement of a full tensor; use DTensor::from_local");
  // The full tensor read as Replicate, redistributed (each rank cuts its pieces, no communication).
  return detail_dt::as_placed(tensor, mesh).redistribute(std::move(placements));
}

Tensor DTensor::full_tensor() const {
  return redistribute(device_mesh(), std::vector<Placement>(placements().size(), Replicate())).to_local();
}

std::string DTensor::str() const {
  std::string p;
  for (size_t i = 0; i < placements().size(); ++i) p += (i ? ", " : "") + placements()[i].str();
  return "DTensor(shape " + kiln::detail::str(shape()) + ", placements [" + p + "], local " +
         kiln::detail::str(node()->placed->local->shape) + ")";
}

}  // namespace kiln::dist
