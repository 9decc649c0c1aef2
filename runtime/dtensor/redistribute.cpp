// DTensor::redistribute: every transition, one mesh dim at a time, as collectives on that mesh
// dim's group. First the mesh dims that change are brought to Replicate, last mesh dim first (a
// Shard is all-gathered, a Partial all-reduced, or reduce-scattered straight into its target
// Shard when no other mesh dim cuts that tensor dim); then the targets are taken, first mesh dim
// first (a Shard is this rank's torch.chunk piece, a Partial sum each rank's 1/n). Uneven pieces
// are padded to the chunk size for the collective and cut back after it. The gradient goes back
// through the same rules to the input's placements (a Partial input's gradient as Replicate).
#include <set>

#include "runtime/autograd/autograd.h"
#include "runtime/dtensor/layout.h"
#include "runtime/dtensor/placed.h"
#include "runtime/ops/ops.h"

namespace kiln::dist {
namespace detail_dt {
std::vector<Placement> partials_replicated(std::vector<Placement> p) {
  for (Placement& x : p)
    if (x.is_partial()) x = Replicate();
  return p;
}
}  // namespace detail_dt

namespace {

// `t` padded with zeros along `dim` to `size`.
Tensor pad_to(const Tensor& t, int64_t dim, int64_t size) {
  const int64_t have = t.size(dim);
  if (have == size) return t;
  std::vector<int64_t> shape = t.sizes();
  shape[static_cast<size_t>(dim)] = size - have;
  return cat({t, zeros(shape, t.dtype(), t.device())}, dim);
}

// Shard(k) -> Replicate along one mesh dim: every rank's piece (padded to the chunk size),
// gathered, cut to the size before this mesh dim.
Tensor gather_pieces(const Tensor& local, int64_t k, int64_t full, const ProcessGroup& g) {
  const int64_t piece = (full + g.size() - 1) / g.size();
  Tensor all = functional::all_gather(pad_to(local, k, piece), k, g);
  return all.narrow(k, 0, full);
}

// Partial -> Shard(k) along one mesh dim: the reduction's piece of this rank, straight.
Tensor reduce_scatter_piece(const Tensor& local, int64_t k, ReduceOp op, const ProcessGroup& g) {
  const int64_t full = local.size(k), n = g.size(), piece = (full + n - 1) / n;
  Tensor mine = functional::reduce_scatter(pad_to(local, k, piece * n), op, k, g);
  return mine.narrow(k, 0, chunk_range(full, n, g.rank()).length);
}

// Replicate -> Partial(op) along one mesh dim: values whose reduction over the group is `t`.
Tensor partition_value(const Tensor& t, ReduceOp op, int n) {
  switch (op) {
    case ReduceOp::Sum: return is_floating(t.dtype()) ? t / static_cast<double>(n) : t;  // (ints: see below)
    case ReduceOp::Avg:
    case ReduceOp::Max:
    case ReduceOp::Min: return t;
    case ReduceOp::Product: break;
  }
  throw Error("DTensor::redistribute: Replicate -> Partial(product) has no local form");
}

}  // namespace

Tensor detail_dt::redistribute_local(Tensor local, const std::vector<int64_t>& shape, const std::vector<Placement>& src,
                          const std::vector<Placement>& dst, const DeviceMesh& mesh) {
  NoGradGuard no_grad;
  const size_t nd = src.size();
  const std::vector<int64_t>& coord = mesh.coordinate();
  std::vector<Placement> cur = src;
  // Mesh dims to bring to Replicate: those that change, and any later mesh dim cutting a tensor
  // dim that a changing one cuts before or after (nested pieces come apart from the inside and
  // are cut again from the outside).
  std::set<size_t> undo;
  for (size_t d = 0; d < nd; ++d)
    if (src[d] != dst[d]) undo.insert(d);
  auto cuts = [](const Placement& p, int64_t k) { return p.is_shard() && p.dim == k; };
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t d : std::set<size_t>(undo))
      for (size_t e = d + 1; e < nd; ++e)
        if (!undo.count(e) && src[e].is_shard() && (cuts(src[d], src[e].dim) || cuts(dst[d], src[e].dim))) {
          undo.insert(e);
          grew = true;
        }
  }
  auto cuts_elsewhere = [&](size_t d, int64_t k) {
    for (size_t e = 0; e < nd; ++e)
      if (e != d && ((cur[e].is_shard() && cur[e].dim == k) || (dst[e].is_shard() && dst[e].dim == k))) return true;
    return false;
  };
  for (size_t d = nd; d-- > 0;) {
    if (!undo.count(d)) continue;
    const ProcessGroup g = mesh.get_group(static_cast<int64_t>(d));
    if (cur[d].is_shard()) {
      const int64_t k = cur[d].dim;
      local = gather_pieces(local, k, detail_dt::size_before(shape, cur, mesh, coord, d, k), g);
    } else if (cur[d].is_partial()) {
      if (dst[d].is_shard() && !cuts_elsewhere(d, dst[d].dim)) {
        local = reduce_scatter_piece(local, dst[d].dim, cur[d].op, g);
        cur[d] = dst[d];
        continue;
      }
      local = functional::all_reduce(local, cur[d].op, g);
    }
    cur[d] = Replicate();
  }
  for (size_t d = 0; d < nd; ++d) {
    if (cur[d] == dst[d]) continue;
    if (dst[d].is_shard()) {
      const int64_t k = dst[d].dim;
      const ChunkRange c = chunk_range(local.size(k), mesh.shape()[d], coord[d]);
      local = local.narrow(k, c.start, c.length).contiguous();
    } else if (dst[d].is_partial()) {
      KILN_CHECK(is_floating(local.dtype()) || dst[d].op != ReduceOp::Sum || mesh.shape()[d] == 1,
                 "DTensor::redistribute: Replicate -> Partial(sum) of a ", dtype_name(local.dtype()),
                 " tensor cannot divide it evenly; use a floating dtype");
      local = partition_value(local, dst[d].op, static_cast<int>(mesh.shape()[d]));
    }
    cur[d] = dst[d];
  }
  return local;
}


DTensor DTensor::redistribute(const DeviceMesh& mesh, std::vector<Placement> placements) const {
  const DeviceMesh& own = device_mesh();
  KILN_CHECK(mesh.mesh() == own.mesh() && mesh.shape() == own.shape(), "DTensor::redistribute: to another mesh (",
             kiln::detail::str(mesh.shape()), " vs ", kiln::detail::str(own.shape()),
             "); redistribution stays on the tensor's mesh");
  placements = detail_dt::normalized(std::move(placements), dim(), own, "DTensor::redistribute");
  if (placements == this->placements()) return *this;
  const std::vector<Placement> src = this->placements(), dst = placements;
  const std::vector<int64_t> shape = sizes();
  Tensor local = detail_dt::redistribute_local(detail_dt::shard_of(*node()), shape, src, dst, own);
  Tensor out = detail_dt::placed_tensor(local.node(), own, std::move(placements), node()->shape);
  // The gradient arrives with any placements and goes back to the input's (a Partial input's
  // gradient as Replicate).
  kiln::detail::attach_custom_grad(out, "redistribute", {*this}, [src, own](const Tensor& g, bool) {
    return std::vector<Tensor>{detail_dt::as_placed(g, own).redistribute(detail_dt::partials_replicated(src))};
  });
  return DTensor(out);
}

}  // namespace kiln::dist
