// Views and copies. A cut dim follows the view to the dim it becomes (permute, unsqueeze,
// squeeze, select, slice, flip and expand renumber or keep it) unless the view changes that dim
// (sliced, selected, flipped, squeezed, expanded): then it must be whole first. A reshape keeps
// a cut of input dim k only where it stays the same block of the flattened tensor: an output
// dim c with as many elements before it as k has, and both sizes divisible by the mesh dim (so
// the torch.chunk pieces line up). Partial values pass through every view and copy (they are
// linear), except as_strided, which is left whole.
#include <algorithm>

#include "runtime/dtensor/rules/rule.h"

namespace kiln::dist::rules {
namespace {

int64_t product(const std::vector<int64_t>& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

// The output dim of a reshape that input dim `k`, cut in `n` pieces, becomes; -1 if none.
int64_t reshape_dim(const std::vector<int64_t>& in, const std::vector<int64_t>& out, int64_t k, int64_t n) {
  const size_t ku = static_cast<size_t>(k);
  if (product(in, 0, in.size()) == 0) return -1;
  const int64_t before = product(in, 0, ku);
  // The same dim (as many elements before it and the same size): any pieces line up.
  for (size_t c = 0; c < out.size(); ++c)
    if (product(out, 0, c) == before && out[c] == in[ku]) return static_cast<int64_t>(c);
  if (in[ku] % n != 0) return -1;
  for (size_t c = 0; c < out.size(); ++c)
    if (product(out, 0, c) == before && out[c] != 1 && out[c] % n == 0) return static_cast<int64_t>(c);
  return -1;
}

// Where the view takes a cut of input dim k (-1: nowhere, the dim must be whole).
int64_t view_dim(const OpView& v, int64_t k, size_t m) {
  const auto& ints = v.attrs.ints;
  const auto has = [&](int64_t d) { return std::find(ints.begin(), ints.end(), d) != ints.end(); };
  switch (v.op) {
    case OpKind::Permute:
      for (size_t j = 0; j < ints.size(); ++j)
        if (ints[j] == k) return static_cast<int64_t>(j);
      return -1;
    case OpKind::Expand: {
      const int64_t lead = v.out_rank() - v.rank(0);
      return v.in_shapes[0][static_cast<size_t>(k)] == v.out_shape[static_cast<size_t>(k + lead)] ? k + lead : -1;
    }
    case OpKind::Slice: return ints[0] == k ? -1 : k;
    case OpKind::Flip: return has(k) ? -1 : k;
    case OpKind::Select:
    case OpKind::Squeeze: return k == ints[0] ? -1 : (k > ints[0] ? k - 1 : k);
    case OpKind::Unsqueeze: return k >= ints[0] ? k + 1 : k;
    case OpKind::View:
      if (v.cut_elsewhere(0, k, m)) return -1;
      return reshape_dim(v.in_shapes[0], v.out_shape, k, v.mesh.shape()[m]);
    case OpKind::Contiguous:
    case OpKind::ToDevice: return k;
    default: return -1;
  }
}

}  // namespace

Strategies view(const OpView& v, size_t m) {
  Strategies out;
  const Placement& p = v.in_placements[0][m];
  if (p.is_shard()) {
    const int64_t to = view_dim(v, p.dim, m);
    if (to >= 0) out.push_back({{p}, Shard(to)});
  } else if (p.is_partial() && v.op != OpKind::AsStrided) {
    out.push_back({{p}, p});
  }
  return out;
}

}  // namespace kiln::dist::rules
