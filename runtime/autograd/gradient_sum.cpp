// The sum of two gradients reaching one backward node. The gradient of a slice is its window
// scattered into zeros of the whole (autograd_rules.cpp, into_zeros): the pieces of a split,
// chunk or unbind each bring one, and summing them with add made a zero-filled tensor of the
// whole per piece and an add per piece. Windows that slice one dim apart instead go onto one
// zero tensor, and once they tile the dim they are the concatenation of their sources: one cat,
// as PyTorch's SplitBackward gives.
#include "runtime/autograd/gradient_sum.h"

#include <algorithm>
#include <optional>

#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln::detail {
namespace {

// One window [start, start + length) of dim `dim` of a dense zero-based tensor, with its source.
struct Piece {
  int64_t start = 0, length = 0;
  NodePtr src;
  bool dropped = false;  // src lacks the dim (a select's window)
};

// A gradient made of slice windows scattered onto zeros: the windows' dim and the pieces.
struct Pieces {
  int64_t dim = -1;
  std::vector<Piece> pieces;
};

// A tensor of zeros (the base into_zeros scatters onto).
bool is_zeros(const Node& n) { return n.op == OpKind::Full && n.attrs.f0 == 0 && n.attrs.sizes.empty(); }

bool constant_shape(const Shape& s) {
  return std::all_of(s.begin(), s.end(), [](const SymInt& x) { return x.is_constant(); });
}

// The window of ViewScatter node n as a slice of one dim of its dense base (or one index of it,
// unbind's select: `dropped`), if it is one; `dim` must match when already set.
std::optional<Piece> window_of(const Node& n, int64_t& dim) {
  const Shape& base = n.shape;
  const Attrs& a = n.attrs;
  if (!constant_shape(base) || !constant_shape(a.sizes) || !constant_shape(a.strides) || !a.offset.is_constant())
    return std::nullopt;
  const Shape dense = contiguous_strides(base);
  const size_t r = base.size();
  int64_t d = -1;
  bool dropped = false;
  if (a.sizes.size() == r) {
    for (size_t i = 0; i < r; ++i) {
      if (a.strides[i].as_int() != dense[i].as_int() && base[i].as_int() > 1) return std::nullopt;
      if (a.sizes[i].as_int() != base[i].as_int()) {
        if (d >= 0) return std::nullopt;
        d = static_cast<int64_t>(i);
      }
    }
  } else if (a.sizes.size() + 1 == r) {  // (select: the window lacks one dim; find which)
    for (size_t cand = 0; cand < r && d < 0; ++cand) {
      bool ok = true;
      for (size_t i = 0, j = 0; i < r && ok; ++i) {
        if (i == cand) continue;
        ok = a.sizes[j].as_int() == base[i].as_int() &&
             (a.strides[j].as_int() == dense[i].as_int() || base[i].as_int() <= 1);
        ++j;
      }
      if (ok) d = static_cast<int64_t>(cand), dropped = true;
    }
  }
  if (d < 0) return std::nullopt;  // (the whole tensor, or not a slice)
  const int64_t stride = dense[static_cast<size_t>(d)].as_int(), off = a.offset.as_int();
  if (stride <= 0 || off % stride != 0) return std::nullopt;
  if (dim >= 0 && dim != d) return std::nullopt;
  dim = d;
  return Piece{off / stride, dropped ? 1 : a.sizes[static_cast<size_t>(d)].as_int(), n.inputs[1], dropped};
}

// `g` read as slice windows on zeros (a chain of ViewScatter nodes down to a Full of 0).
std::optional<Pieces> pieces_of(const Tensor& g) {
  Pieces p;
  NodePtr n = g.node();
  while (n->op == OpKind::ViewScatter) {
    auto w = window_of(*n, p.dim);
    if (!w || n->inputs[1]->dtype != n->dtype) return std::nullopt;
    p.pieces.push_back(*w);
    n = n->inputs[0];
  }
  if (p.pieces.empty() || !is_zeros(*n)) return std::nullopt;
  return p;
}

Tensor source(const Piece& p, const Shape& base, int64_t dim) {
  Shape s = base;
  s[static_cast<size_t>(dim)] = p.length;
  Tensor t = Tensor::from_node(p.src);
  if (p.dropped) {
    Shape without = s;
    without.erase(without.begin() + dim);
    t = unsqueeze(expand_to(t, without), dim);
  }
  return expand_to(t, s);
}

}  // namespace

std::optional<Tensor> leading_window_source(const Tensor& g, int64_t dim, const SymInt& length) {
  const Node& n = *g.node();
  if (n.op != OpKind::ViewScatter || !is_zeros(*n.inputs[0]) || !n.attrs.offset.is_constant() ||
      n.attrs.offset.as_int() != 0 || n.inputs[1]->dtype != n.dtype)
    return std::nullopt;
  Shape want = n.shape;
  want[static_cast<size_t>(dim)] = length;
  const Shape dense = contiguous_strides(n.shape);
  bool window = n.attrs.sizes.size() == want.size() && n.attrs.strides.size() == want.size();
  for (size_t i = 0; window && i < want.size(); ++i)
    window = same_size(n.attrs.sizes[i], want[i]) && same_size(n.attrs.strides[i], dense[i]);
  if (!window) return std::nullopt;
  return expand_to(Tensor::from_node(n.inputs[1]), want);
}

Tensor sum_gradients(const Tensor& a, const Tensor& b) {
  auto pa = pieces_of(a), pb = pieces_of(b);
  const bool mergeable = pa && pb && pa->dim == pb->dim && a.dtype() == b.dtype() && a.device() == b.device() &&
                         same_shape(a.node()->shape, b.node()->shape);
  if (!mergeable) return add(a, b);
  std::vector<Piece> all = pa->pieces;
  all.insert(all.end(), pb->pieces.begin(), pb->pieces.end());
  std::sort(all.begin(), all.end(), [](const Piece& x, const Piece& y) { return x.start < y.start; });
  for (size_t i = 1; i < all.size(); ++i)
    if (all[i].start < all[i - 1].start + all[i - 1].length) return add(a, b);  // (overlapping windows sum)
  const Shape& base = a.node()->shape;
  const int64_t dim = pa->dim, size = base[static_cast<size_t>(dim)].as_int();
  if (all.front().start == 0 && all.back().start + all.back().length == size) {
    bool tiles = true;
    for (size_t i = 1; i < all.size(); ++i) tiles = tiles && all[i].start == all[i - 1].start + all[i - 1].length;
    if (tiles) {
      std::vector<Tensor> parts;
      for (const Piece& p : all) parts.push_back(source(p, base, dim));
      return cat(parts, dim);
    }
  }
  // Not yet whole: b's windows onto a's zeros.
  Tensor out = a;
  const Shape dense = contiguous_strides(base);
  for (const Piece& p : pb->pieces) {
    Attrs w;
    w.sizes = base;
    w.sizes[static_cast<size_t>(dim)] = p.length;
    w.strides = dense;
    w.offset = p.start * dense[static_cast<size_t>(dim)].as_int();
    out = record(OpKind::ViewScatter, {out, source(p, base, dim)}, w, a.dtype(), base);
  }
  return out;
}

}  // namespace kiln::detail
