// Concatenation and index ops (dim d = attrs.ints[0]).
//   cat: every input cut alike along a dim other than d; Partial sums stay Partial.
//   gather / scatter / scatter_add: all operands cut alike along a dim other than d where
//   their sizes agree.
//   index_select: the source cut along a dim other than d, or the (1-d) index cut, which cuts
//   the result along d.
//   index_select / gather of a source cut along d itself (an embedding with its vocabulary cut,
//   a vocabulary-parallel loss; 1-d meshes): each rank picks what it holds, -0.0 elsewhere:
//   Partial sums. index_add into a target cut along d: each rank adds the rows it holds.
//   index_add: target and source cut alike along a dim other than d; or the index and the
//   source's rows cut, each rank adding its rows: Partial sums (as embedding's gradient does).
#include <algorithm>

#include "runtime/dtensor/rules/rule.h"
#include "runtime/ops/ops.h"

namespace kiln::dist::rules {
namespace {

// The rows [start, start + length) of dim d of the source that this rank holds (1-d meshes).
ChunkRange held_rows(const OpView& v, size_t m) {
  const int64_t d = v.attrs.ints.at(0);
  return chunk_range(v.in_shapes[0][static_cast<size_t>(d)], v.mesh.shape()[m], v.mesh.coordinate()[m]);
}

// An index tensor made local to the held rows: (where it points at a held row, the local index
// there (0 elsewhere)).
std::pair<Tensor, Tensor> localized(const Tensor& idx, const ChunkRange& mine) {
  Tensor local = idx - mine.start;
  Tensor held = logical_and(local.ge(0), local.lt(mine.length));
  return {held, where(held, local, zeros_like(local))};
}

// The parts a rank adds to a Partial sum where it holds nothing: -0.0, which leaves every value
// (-0.0 included) as it is.
constexpr double kNothing = -0.0;

// index_select(x, d, idx) with x's dim d cut: the rows this rank holds, nothing for the others.
Tensor masked_index_select(const OpView& v, size_t m, const std::vector<Tensor>& shards) {
  const int64_t d = v.attrs.ints.at(0);
  const ChunkRange mine = held_rows(v, m);
  const Tensor &x = shards[0], &idx = shards[1];
  std::vector<int64_t> out_shape = x.sizes();
  out_shape[static_cast<size_t>(d)] = idx.numel();
  if (mine.length == 0) return full(out_shape, kNothing, x.dtype(), x.device());
  auto [held, local] = localized(idx, mine);
  std::vector<int64_t> mask_shape(out_shape.size(), 1);
  mask_shape[static_cast<size_t>(d)] = idx.numel();
  return where(held.reshape(mask_shape), index_select(x, d, local), kNothing);  // (not a product: rows may hold inf)
}

// gather(x, d, idx) with x's dim d cut (a vocabulary-parallel loss picking the targets' log
// probabilities): the picked values this rank holds, nothing for the others.
Tensor masked_gather(const OpView& v, size_t m, const std::vector<Tensor>& shards) {
  const ChunkRange mine = held_rows(v, m);
  const Tensor &x = shards[0], &idx = shards[1];
  if (mine.length == 0) return full(idx.sizes(), kNothing, x.dtype(), x.device());
  auto [held, local] = localized(idx, mine);
  return where(held, gather(x, v.attrs.ints.at(0), local), kNothing);
}

// index_add(x, d, idx, src) with x's dim d cut (an embedding's gradient into a vocabulary-cut
// weight): the source rows whose index this rank holds, added to its rows.
Tensor masked_index_add(const OpView& v, size_t m, const std::vector<Tensor>& shards) {
  const int64_t d = v.attrs.ints.at(0);
  const ChunkRange mine = held_rows(v, m);
  const Tensor &x = shards[0], &idx = shards[1], &src = shards[2];
  if (mine.length == 0) return x;
  auto [held, local] = localized(idx, mine);
  std::vector<int64_t> mask_shape(static_cast<size_t>(src.dim()), 1);
  mask_shape[static_cast<size_t>(d)] = idx.numel();
  return index_add(x, d, local, where(held.reshape(mask_shape), src, kNothing));
}

bool partial_now(const OpView& v, size_t i, size_t m) { return v.in_placements[i][m] == Partial(); }

bool same_size(const OpView& v, int64_t k) {
  for (const auto& s : v.in_shapes)
    if (static_cast<int64_t>(s.size()) <= k || s[static_cast<size_t>(k)] != v.in_shapes[0][static_cast<size_t>(k)])
      return false;
  return true;
}

}  // namespace

Strategies indexing(const OpView& v, size_t m) {
  Strategies out;
  const int64_t d = v.attrs.ints.at(0);
  const size_t n = v.in_shapes.size();
  const bool fp = is_floating(v.dtype);
  const Placement P = Partial(), R = Replicate();
  switch (v.op) {
    case OpKind::Cat:
      for (int64_t k = 0; k < v.out_rank(); ++k)
        if (k != d && same_size(v, k)) out.push_back({all(n, Shard(k)), Shard(k)});
      if (fp && std::all_of(v.in_placements.begin(), v.in_placements.end(),
                            [&](const std::vector<Placement>& p) { return p[m] == P; }))
        out.push_back({all(n, P), P});
      break;
    case OpKind::Gather:
    case OpKind::Scatter:
    case OpKind::ScatterAdd:
      for (int64_t k = 0; k < v.out_rank(); ++k)
        if (k != d && same_size(v, k)) out.push_back({all(n, Shard(k)), Shard(k)});
      if (fp && v.op == OpKind::ScatterAdd && partial_now(v, 0, m)) out.push_back({{P, R, P}, P});
      if (fp && v.op == OpKind::Gather && v.mesh.ndim() == 1) out.push_back({{Shard(d), R}, P, masked_gather});
      break;
    case OpKind::IndexSelect:
      for (int64_t k = 0; k < v.rank(0); ++k)
        if (k != d) out.push_back({{Shard(k), R}, Shard(k)});
      out.push_back({{R, Shard(0)}, Shard(d)});
      if (fp && partial_now(v, 0, m)) out.push_back({{P, R}, P});
      if (fp && v.mesh.ndim() == 1) out.push_back({{Shard(d), R}, P, masked_index_select});
      break;
    case OpKind::IndexAdd:
      for (int64_t k = 0; k < v.rank(0); ++k)
        if (k != d && v.in_shapes[0][static_cast<size_t>(k)] == v.in_shapes[2][static_cast<size_t>(k)])
          out.push_back({{Shard(k), R, Shard(k)}, Shard(k)});
      if (fp && partial_now(v, 0, m)) {  // (the target partial already: see rule.h)
        out.push_back({{P, R, P}, P});
        out.push_back({{P, Shard(0), Shard(d)}, P});
      }
      if (fp && v.mesh.ndim() == 1) out.push_back({{Shard(d), R, R}, Shard(d), masked_index_add});
      break;
    default: break;
  }
  return out;
}

}  // namespace kiln::dist::rules
