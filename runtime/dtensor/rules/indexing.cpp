// Concatenation and index ops (dim d = attrs.ints[0]).
//   cat: every input cut alike along a dim other than d; Partial sums stay Partial.
//   gather / scatter / scatter_add: all operands cut alike along a dim other than d where
//   their sizes agree.
//   index_select: the source cut along a dim other than d, or the (1-d) index cut, which cuts
//   the result along d.
//   index_select of a source cut along d itself (an embedding with its vocabulary cut, 1-d
//   meshes): each rank picks the rows it holds and zeros for the others: Partial sums.
//   index_add: target and source cut alike along a dim other than d; or the index and the
//   source's rows cut, each rank adding its rows: Partial sums (as embedding's gradient does).
#include "runtime/dtensor/rules/rule.h"
#include "runtime/ops/ops.h"

namespace kiln::dist::rules {
namespace {

// index_select(x, d, idx) with x holding rows [start, start + len) of dim d: the rows this
// rank holds, zeros where another rank holds the row.
Tensor masked_index_select(const OpView& v, size_t m, const std::vector<Tensor>& shards) {
  const int64_t d = v.attrs.ints.at(0), size = v.in_shapes[0][static_cast<size_t>(d)];
  const ChunkRange mine = chunk_range(size, v.mesh.shape()[m], v.mesh.coordinate()[m]);
  const Tensor& x = shards[0];
  const Tensor& idx = shards[1];
  std::vector<int64_t> out_shape = x.sizes();
  out_shape[static_cast<size_t>(d)] = idx.numel();
  if (mine.length == 0) return zeros(out_shape, x.dtype(), x.device());
  Tensor local = idx - mine.start;
  Tensor held = logical_and(local.ge(0), local.lt(mine.length));
  Tensor rows = index_select(x, d, where(held, local, zeros_like(local)));
  std::vector<int64_t> mask_shape(out_shape.size(), 1);
  mask_shape[static_cast<size_t>(d)] = idx.numel();
  return where(held.reshape(mask_shape), rows, 0.0);  // (not a product: rows may hold inf)
}

bool same_size(const OpView& v, int64_t k) {
  for (const auto& s : v.in_shapes)
    if (static_cast<int64_t>(s.size()) <= k || s[static_cast<size_t>(k)] != v.in_shapes[0][static_cast<size_t>(k)])
      return false;
  return true;
}

}  // namespace

Strategies indexing(const OpView& v, size_t) {
  Strategies out;
  const int64_t d = v.attrs.ints.at(0);
  const size_t n = v.in_shapes.size();
  const bool fp = is_floating(v.dtype);
  const Placement P = Partial(), R = Replicate();
  switch (v.op) {
    case OpKind::Cat:
      for (int64_t k = 0; k < v.out_rank(); ++k)
        if (k != d && same_size(v, k)) out.push_back({all(n, Shard(k)), Shard(k)});
      if (fp) out.push_back({all(n, P), P});
      break;
    case OpKind::Gather:
    case OpKind::Scatter:
    case OpKind::ScatterAdd:
      for (int64_t k = 0; k < v.out_rank(); ++k)
        if (k != d && same_size(v, k)) out.push_back({all(n, Shard(k)), Shard(k)});
      if (fp && v.op == OpKind::ScatterAdd) out.push_back({{P, R, P}, P});
      break;
    case OpKind::IndexSelect:
      for (int64_t k = 0; k < v.rank(0); ++k)
        if (k != d) out.push_back({{Shard(k), R}, Shard(k)});
      out.push_back({{R, Shard(0)}, Shard(d)});
      if (fp) out.push_back({{P, R}, P});
      if (fp && v.mesh.ndim() == 1) out.push_back({{Shard(d), R}, P, masked_index_select});
      break;
    case OpKind::IndexAdd:
      for (int64_t k = 0; k < v.rank(0); ++k)
        if (k != d && v.in_shapes[0][static_cast<size_t>(k)] == v.in_shapes[2][static_cast<size_t>(k)])
          out.push_back({{Shard(k), R, Shard(k)}, Shard(k)});
      if (fp) {
        out.push_back({{P, R, P}, P});
        out.push_back({{P, Shard(0), Shard(d)}, P});
      }
      break;
    default: break;
  }
  return out;
}

}  // namespace kiln::dist::rules
