// Reductions and scans. A dim kept by the reduction stays cut (renumbered when dims go); a
// reduced dim that is cut gives partial results: Partial(sum) for sums, Partial(max/min) for
// amax/amin (when no shard is empty), Partial(product) for products. arg* need the reduced dim
// whole. Partials of the same reduction pass through it. A scan keeps every cut but its own dim.
#include <algorithm>

#include "runtime/dtensor/rules/rule.h"

namespace kiln::dist::rules {
namespace {

bool reduced(const OpView& v, int64_t k) {
  const auto& d = v.attrs.ints;
  if (d.empty()) return v.out_rank() < v.rank(0);
  return std::find(d.begin(), d.end(), k) != d.end();
}

// The output dim of kept input dim `k`.
int64_t kept_dim(const OpView& v, int64_t k) {
  if (v.out_rank() == v.rank(0)) return k;  // keepdim
  int64_t out = k;
  for (int64_t j = 0; j < k; ++j) out -= reduced(v, j) ? 1 : 0;
  return out;
}

// The partial a reduction over shards leaves, if any.
std::optional<ReduceOp> partial_of(const OpView& v, int64_t k, size_t m) {
  switch (v.op) {
    case OpKind::Sum: return ReduceOp::Sum;
    case OpKind::Prod: return ReduceOp::Product;
    case OpKind::Amax:
    case OpKind::Amin: {
      // An empty shard has no max: only where every piece along this mesh dim has elements.
      const int64_t size = v.in_shapes[0][static_cast<size_t>(k)], n = v.mesh.shape()[m];
      if (v.cut_elsewhere(0, k, m) || size < n || chunk_range(size, n, n - 1).length == 0) return std::nullopt;
      return v.op == OpKind::Amax ? ReduceOp::Max : ReduceOp::Min;
    }
    default: return std::nullopt;
  }
}

}  // namespace

Strategies reduction(const OpView& v, size_t m) {
  Strategies out;
  if (v.op == OpKind::Cumsum) {
    const int64_t scan = v.attrs.ints.at(0);
    for (int64_t k = 0; k < v.rank(0); ++k)
      if (k != scan) out.push_back({{Shard(k)}, Shard(k)});
    if (is_floating(v.dtype) && v.in_placements[0][m] == Partial()) out.push_back({{Partial()}, Partial()});
    return out;
  }
  for (int64_t k = 0; k < v.rank(0); ++k) {
    if (!reduced(v, k)) {
      out.push_back({{Shard(k)}, Shard(kept_dim(v, k))});
    } else if (auto op = partial_of(v, k, m)) {
      out.push_back({{Shard(k)}, Partial(*op)});
    }
  }
  const Placement& p = v.in_placements[0][m];
  if (p.is_partial()) {
    const bool same = (v.op == OpKind::Sum && p.op == ReduceOp::Sum) || (v.op == OpKind::Amax && p.op == ReduceOp::Max) ||
                      (v.op == OpKind::Amin && p.op == ReduceOp::Min) ||
                      (v.op == OpKind::Prod && p.op == ReduceOp::Product);
    if (same) out.push_back({{p}, p});
  }
  return out;
}

}  // namespace kiln::dist::rules
