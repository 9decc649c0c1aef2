// Views (share storage, alias their base) and movement ops (copies).
#include <algorithm>
#include <numeric>

#include "runtime/ops/ops.h"
#include "runtime/ops/advindex.h"
#include "runtime/tensor/record.h"

namespace kiln {
using detail::make_view;
using detail::record;
using detail::str;
using detail::wrap_dim;

namespace detail {
void check_expandable(const Shape& from, const Shape& to, const char* op) {
  bool ok = from.size() <= to.size();
  for (size_t i = 0; ok && i < from.size(); ++i) {
    const SymInt& f = from[from.size() - 1 - i];
    const SymInt& t = to[to.size() - 1 - i];
    if (is_one(f)) continue;  // a literal 1 expands to anything: nothing to ask
    auto same = sym_eq(f, t);  // before asking whether f is 1 (which could specialize it)
    ok = same && *same;
    if (!ok) {
      auto one = sym_eq(f, 1);
      ok = one && *one;
    }
  }
  KILN_CHECK(ok, op, ": shape ", str(from), " cannot be expanded to shape ", str(to));
}
}  // namespace detail

namespace {
ViewStep step(OpKind op, std::vector<int64_t> ints = {}, Shape shape = {}) {
  ViewStep s{op, Attrs{}, std::move(shape)};
  s.attrs.ints = std::move(ints);
  return s;
}

// PyTorch's computeStride: strides for viewing (shape, strides) as new_shape, if possible.
std::optional<Shape> view_strides(const std::vector<int64_t>& old_shape, const std::vector<int64_t>& old_strides,
                                  const std::vector<int64_t>& new_shape) {
  int64_t numel = 1;
  for (int64_t s : old_shape) numel *= s;
  if (numel == 0 || old_shape.empty()) return contiguous_strides(make_shape(new_shape));
  std::vector<int64_t> ns(new_shape.size());
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base = old_strides.back(), tensor_numel = 1, view_numel = 1;
  for (int64_t td = static_cast<int64_t>(old_shape.size()) - 1; td >= 0; --td) {
    tensor_numel *= old_shape[td];
    if (td == 0 || (old_shape[td - 1] != 1 && old_strides[td - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        ns[view_d] = view_numel * chunk_base;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (td > 0) {
        chunk_base = old_strides[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return make_shape(ns);
}

// `shape` with its -1 dimension inferred from `numel` (symbolic in compile() traces: the
// inferred size is numel / known, relying on numel % known == 0).
Shape infer_shape(const std::vector<int64_t>& shape, const SymInt& numel, const char* op) {
  Shape out = make_shape(shape);
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      KILN_CHECK(infer < 0, op, ": only one dimension can be inferred, got shape ", str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      KILN_CHECK(shape[i] >= 0, op, ": invalid shape dimension ", shape[i], " in ", str(shape));
      known *= shape[i];
    }
  }
  bool ok =
      infer >= 0 ? known != 0 && sym_eq(mod(numel, known), 0).value_or(false) : sym_eq(numel, known).value_or(false);
  KILN_CHECK(ok, op, ": shape ", str(shape), " is invalid for input of size ", numel.as_int());
  if (infer >= 0) out[infer] = floordiv(numel, known);
  return out;
}

Tensor view_impl(const Tensor& x, const std::vector<int64_t>& shape, bool allow_copy, const char* op) {
  const Node& n = *x.node();
  auto sym = [](const SymInt& d) { return !d.is_constant(); };
  bool symbolic =
      std::any_of(n.shape.begin(), n.shape.end(), sym) || std::any_of(n.strides.begin(), n.strides.end(), sym);
  if (symbolic) {
    // Symbolic sizes or strides (a compile() trace): views of dense data keep them symbolic,
    // and reshape copies other layouts instead of asking for their strides.
    bool dense = is_contiguous_layout(n.shape, n.strides);
    if (dense || allow_copy) {
      Tensor c = dense ? x : record(OpKind::Contiguous, {x}, Attrs{}, x.dtype(), x.shape());
      Shape ns = infer_shape(shape, kiln::numel(n.shape), op);
      ViewStep s = step(OpKind::View, {}, ns);
      s.attrs.strides = contiguous_strides(ns);
      return make_view(c, std::move(s));
    }
  }
  std::vector<int64_t> ns = concrete(infer_shape(shape, x.numel(), op));
  auto st = view_strides(x.sizes(), x.strides(), ns);
  if (!st) {
    KILN_CHECK(allow_copy, op, ": view size is not compatible with input tensor's size and stride; use reshape");
    Tensor c = record(OpKind::Contiguous, {x}, Attrs{}, x.dtype(), x.shape());
    return view_impl(c, shape, false, op);
  }
  ViewStep s = step(OpKind::View, {}, make_shape(ns));
  s.attrs.strides = *st;
  return make_view(x, std::move(s));
}
}  // namespace

Tensor reshape(const Tensor& x, const std::vector<int64_t>& shape) { return view_impl(x, shape, true, "reshape"); }
Tensor Tensor::view(const std::vector<int64_t>& shape) const { return view_impl(*this, shape, false, "view"); }
Tensor Tensor::reshape_sym(const Shape& shape) const {
  // Symbolic reshape: a view when contiguous, otherwise a copy first.
  Tensor c = is_contiguous() ? *this : contiguous();
  ViewStep s = step(OpKind::View, {}, shape);
  s.attrs.strides = contiguous_strides(shape);
  return make_view(c, std::move(s));
}

Tensor flatten(const Tensor& x, int64_t start, int64_t end) {
  int64_t n = x.dim();
  if (n == 0) return reshape(x, {1});
  start = wrap_dim(start, n, "flatten");
  end = wrap_dim(end, n, "flatten");
  KILN_CHECK(start <= end, "flatten: start_dim ", start, " cannot come after end_dim ", end);
  const Shape& xs = x.shape();
  if (std::any_of(xs.begin(), xs.end(), [](const SymInt& d) { return !d.is_constant(); })) {
    // Symbolic sizes (a compile() trace): the flattened size is their product, no guard.
    Shape out(xs.begin(), xs.begin() + start);
    SymInt p = 1;
    for (int64_t i = start; i <= end; ++i) p = p * xs[i];
    out.push_back(p);
    out.insert(out.end(), xs.begin() + end + 1, xs.end());
    return x.reshape_sym(out);
  }
  std::vector<int64_t> s, sz = x.sizes();
  for (int64_t i = 0; i < start; ++i) s.push_back(sz[i]);
  int64_t p = 1;
  for (int64_t i = start; i <= end; ++i) p *= sz[i];
  s.push_back(p);
  for (int64_t i = end + 1; i < n; ++i) s.push_back(sz[i]);
  return reshape(x, s);
}

Tensor squeeze(const Tensor& x, std::optional<int64_t> dim) {
  if (dim) {
    int64_t d = wrap_dim(*dim, x.dim(), "squeeze");
    if (x.dim() == 0) return x;
    auto one = sym_eq(x.shape()[d], 1);
    if (!one || !*one) return x;
    return make_view(x, step(OpKind::Squeeze, {d}));
  }
  Tensor r = x;
  for (int64_t d = x.dim() - 1; d >= 0; --d) {
    auto one = sym_eq(x.shape()[d], 1);
    if (one && *one) r = make_view(r, step(OpKind::Squeeze, {d}));
  }
  return r;
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  int64_t d = wrap_dim(dim, x.dim() + 1, "unsqueeze");
  return make_view(x, step(OpKind::Unsqueeze, {d}));
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  int64_t n = x.dim();
  KILN_CHECK(static_cast<int64_t>(dims.size()) == n, "permute: number of dims don't match (expected ", n, ", got ",
             dims.size(), ")");
  std::vector<int64_t> p;
  std::vector<bool> seen(n, false);
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, n, "permute");
    KILN_CHECK(!seen[w], "permute: repeated dim ", d, " in ", str(dims));
    seen[w] = true;
    p.push_back(w);
  }
  return make_view(x, step(OpKind::Permute, p));
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  int64_t n = x.dim();
  if (n == 0) return x;
  d0 = wrap_dim(d0, n, "transpose");
  d1 = wrap_dim(d1, n, "transpose");
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[d0], p[d1]);
  return make_view(x, step(OpKind::Permute, p));
}

Tensor Tensor::t() const {
  KILN_CHECK(dim() <= 2, "t: expects a tensor with <= 2 dimensions, got ", dim());
  return dim() < 2 ? *this : kiln::transpose(*this, 0, 1);
}

Tensor Tensor::expand_sym(const Shape& shape) const {
  detail::check_expandable(this->shape(), shape, "expand");
  return make_view(*this, step(OpKind::Expand, {}, shape));
}

Tensor expand(const Tensor& x, const std::vector<int64_t>& shape) {
  KILN_CHECK(shape.size() >= static_cast<size_t>(x.dim()), "expand: the number of sizes provided (", shape.size(),
             ") must be greater or equal to the number of dimensions in the tensor (", x.dim(), ")");
  Shape target;
  size_t lead = shape.size() - x.dim();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      KILN_CHECK(i >= lead, "expand: -1 is not allowed in a leading, non-existing dimension");
      target.push_back(x.shape()[i - lead]);
    } else {
      KILN_CHECK(shape[i] >= 0, "expand: invalid size ", shape[i]);
      target.push_back(shape[i]);
    }
  }
  return x.expand_sym(target);
}
Tensor broadcast_to(const Tensor& x, const std::vector<int64_t>& shape) { return expand(x, shape); }
Tensor expand_as(const Tensor& x, const Tensor& other) { return x.expand_sym(other.shape()); }

namespace {
// view_as / reshape_as: other's (possibly symbolic) shape, checked against x's element count.
Tensor view_to(const Tensor& x, const Shape& shape, bool allow_copy, const char* op) {
  bool symbolic = std::any_of(shape.begin(), shape.end(), [](const SymInt& d) { return !d.is_constant(); }) ||
                  std::any_of(x.shape().begin(), x.shape().end(), [](const SymInt& d) { return !d.is_constant(); });
  if (!symbolic) return allow_copy ? reshape(x, concrete(shape)) : x.view(concrete(shape));
  SymInt n = kiln::numel(shape), m = kiln::numel(x.shape());
  KILN_CHECK(sym_eq(n, m).value_or(false), op, ": shape ", str(shape), " is invalid for input of size ", m.str());
  KILN_CHECK(allow_copy || is_contiguous_layout(x.shape(), x.node()->strides), op,
             ": view size is not compatible with input tensor's size and stride; use reshape_as");
  return x.reshape_sym(shape);
}
}  // namespace
Tensor view_as(const Tensor& x, const Tensor& other) { return view_to(x, other.shape(), false, "view_as"); }
Tensor Tensor::view_symint(const Shape& shape) const { return view_to(*this, shape, false, "view"); }
Tensor Tensor::reshape_symint(const Shape& shape) const { return view_to(*this, shape, true, "reshape"); }
Tensor Tensor::expand_symint(const Shape& shape) const {
  KILN_CHECK(shape.size() >= static_cast<size_t>(dim()), "expand: the number of sizes provided (", shape.size(),
             ") must be greater or equal to the number of dimensions in the tensor (", dim(), ")");
  return expand_sym(shape);
}
Tensor Tensor::narrow_symint(int64_t dim, const SymInt& start, const SymInt& length) const {
  KILN_CHECK(this->dim() > 0, "narrow: cannot narrow a 0-d tensor");
  int64_t d = wrap_dim(dim, this->dim(), "narrow");
  const SymInt& n = shape()[d];
  KILN_CHECK(sym_ge(start, 0).value_or(false) && sym_ge(length, 0).value_or(false) &&
                 sym_le(start + length, n).value_or(false),
             "narrow: start (", start.str(), ") + length (", length.str(), ") exceeds dimension size (", n.str(), ")");
  return detail::slice_window(*this, d, start, start + length, 1);
}
Tensor reshape_as(const Tensor& x, const Tensor& other) { return view_to(x, other.shape(), true, "reshape_as"); }

std::vector<Tensor> broadcast_tensors(const std::vector<Tensor>& ts) {
  Shape s;
  for (const auto& t : ts) s = detail::broadcast_shapes(s, t.shape(), "broadcast_tensors");
  std::vector<Tensor> out;
  for (const auto& t : ts) out.push_back(detail::expand_to(t, s));
  return out;
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  return record(OpKind::Contiguous, {x}, Attrs{}, x.dtype(), x.shape());
}

Tensor Tensor::slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t stp) const {
  KILN_CHECK(this->dim() > 0, "slice: cannot slice a 0-d tensor");
  int64_t d = wrap_dim(dim, this->dim(), "slice");
  KILN_CHECK(stp > 0, "slice: step must be greater than zero, got ", stp, " (use flip for reversed order)");
  const SymInt& n = shape()[d];
  if (auto c = n.maybe_int()) {
    auto clampi = [n = *c](int64_t v) {
      if (v < 0) v += n;
      return std::clamp<int64_t>(v, 0, n);
    };
    int64_t b = start ? clampi(*start) : 0, e = stop ? clampi(*stop) : *c;
    if (e < b) e = b;
    return make_view(*this, step(OpKind::Slice, {d, b, e, stp}));
  }
  // A symbolic size: the bounds clamp symbolically (PyTorch's rule, no guard).
  auto clamps = [&n](int64_t v) -> SymInt { return v < 0 ? sym_max(n + SymInt(v), 0) : sym_min(SymInt(v), n); };
  SymInt b = start ? clamps(*start) : SymInt(0), e = stop ? clamps(*stop) : n;
  return detail::slice_window(*this, d, b, sym_max(e, b), stp);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  KILN_CHECK(this->dim() > 0, "select: cannot select on a 0-d tensor");
  int64_t d = wrap_dim(dim, this->dim(), "select");
  const SymInt& n = shape()[d];
  if (auto c = n.maybe_int()) {
    KILN_CHECK(index >= -*c && index < *c, "select: index ", index, " is out of bounds for dimension ", d,
               " with size ", *c);
    return make_view(*this, step(OpKind::Select, {d, index < 0 ? index + *c : index}));
  }
  // A symbolic size: in bounds is a guarded relation, a negative index counts from the end.
  bool ok = index >= 0 ? sym_lt(SymInt(index), n).value_or(false) : sym_ge(n + SymInt(index), 0).value_or(false);
  KILN_CHECK(ok, "select: index ", index, " is out of bounds for dimension ", d, " with size ", n.str());
  if (index >= 0) return make_view(*this, step(OpKind::Select, {d, index}));
  ViewStep s = step(OpKind::Select, {d, detail::size_hint(n + SymInt(index))});
  s.attrs.sizes = {n + SymInt(index)};
  return make_view(*this, std::move(s));
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  KILN_CHECK(this->dim() > 0, "narrow: cannot narrow a 0-d tensor");
  int64_t d = wrap_dim(dim, this->dim(), "narrow");
  const SymInt& n = shape()[d];
  if (auto c = n.maybe_int()) {
    KILN_CHECK(start >= -*c && start <= *c, "narrow: start (", start, ") is out of bounds for dimension of size ", *c);
    if (start < 0) start += *c;
    KILN_CHECK(length >= 0 && start + length <= *c, "narrow: start (", start, ") + length (", length,
               ") exceeds dimension size (", *c, ")");
    return make_view(*this, step(OpKind::Slice, {d, start, start + length, 1}));
  }
  SymInt b = start < 0 ? n + SymInt(start) : SymInt(start);
  KILN_CHECK(length >= 0 && sym_ge(b, 0).value_or(false) && sym_le(b + SymInt(length), n).value_or(false),
             "narrow: start (", start, ") + length (", length, ") exceeds dimension size (", n.str(), ")");
  return detail::slice_window(*this, d, b, b + SymInt(length), 1);
}

Tensor Tensor::index(const std::vector<TensorIndex>& idx) const {
  if (detail::has_index_tensor(idx)) return detail::advanced_index(*this, idx);
  int64_t consumed = 0, ellipses = 0;
  for (const auto& i : idx) {
    if (std::holds_alternative<int64_t>(i) || std::holds_alternative<Slice>(i)) ++consumed;
    if (std::holds_alternative<EllipsisIndex>(i)) ++ellipses;
  }
  KILN_CHECK(ellipses <= 1, "index: an index can only have a single ellipsis");
  KILN_CHECK(consumed <= dim(), "index: too many indices for tensor of dimension ", dim(), " (got ", consumed, ")");
  Tensor r = *this;
  int64_t d = 0;
  for (const auto& i : idx) {
    if (auto* n = std::get_if<int64_t>(&i)) {
      r = r.select(d, *n);
    } else if (auto* s = std::get_if<Slice>(&i)) {
      r = r.slice(d, s->start, s->stop, s->step);
      ++d;
    } else if (std::holds_alternative<NoneIndex>(i)) {
      r = r.unsqueeze(d);
      ++d;
    } else {
      d += dim() - consumed;
    }
  }
  return r;
}

Tensor cat(const std::vector<Tensor>& ts, int64_t dim) {
  KILN_CHECK(!ts.empty(), "cat: expected a non-empty list of tensors");
  int64_t n = ts[0].dim();
  KILN_CHECK(n > 0, "cat: zero-dimensional tensor cannot be concatenated");
  int64_t d = wrap_dim(dim, n, "cat");
  DType t = result_type(ts);
  Shape out = ts[0].shape();
  SymInt total = 0;
  std::vector<Tensor> ins;
  for (size_t k = 0; k < ts.size(); ++k) {
    KILN_CHECK(ts[k].dim() == n, "cat: tensors must have the same number of dimensions: got ", n, " and ", ts[k].dim());
    for (int64_t i = 0; i < n; ++i) {
      if (i == d) continue;
      auto same = sym_eq(ts[k].shape()[i], out[i]);
      KILN_CHECK(same && *same, "cat: sizes of tensors must match except in dimension ", d, ": expected size ",
                 out[i].str(), " but got size ", ts[k].shape()[i].str(), " for tensor number ", k);
    }
    total = total + ts[k].shape()[d];
    ins.push_back(detail::cast(ts[k], t));
  }
  out[d] = total;
  Attrs a;
  a.ints = {d};
  return record(OpKind::Cat, ins, a, t, out);
}

Tensor stack(const std::vector<Tensor>& ts, int64_t dim) {
  KILN_CHECK(!ts.empty(), "stack: expected a non-empty list of tensors");
  int64_t d = wrap_dim(dim, ts[0].dim() + 1, "stack");
  std::vector<Tensor> u;
  for (size_t k = 0; k < ts.size(); ++k) {
    KILN_CHECK(ts[k].dim() == ts[0].dim(), "stack: expects each tensor to be equal size, but got ", str(ts[0].shape()),
               " at entry 0 and ", str(ts[k].shape()), " at entry ", k);
    for (int64_t i = 0; i < ts[0].dim(); ++i) {
      auto same = sym_eq(ts[k].shape()[i], ts[0].shape()[i]);
      KILN_CHECK(same && *same, "stack: expects each tensor to be equal size, but got ", str(ts[0].shape()),
                 " at entry 0 and ", str(ts[k].shape()), " at entry ", k);
    }
    u.push_back(unsqueeze(ts[k], d));
  }
  return cat(u, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  int64_t d = wrap_dim(dim, x.dim(), "split");
  const SymInt& n = x.shape()[d];
  int64_t sum = 0;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0, "split: split sizes must be non-negative, got ", str(sizes));
    sum += s;
  }
  KILN_CHECK(detail::same_size(SymInt(sum), n), "split: split sizes ", str(sizes),
             " must sum to the size of dimension ", d, " (", n.str(), ")");
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(x.narrow(d, at, s));
    at += s;
  }
  return out;
}

namespace {
// Pieces of `size` (symbolic allowed) along d; the last one holds the rest. Their number is
// fixed by the traced size and guarded as a relation, not a specialization.
std::vector<Tensor> split_pieces(const Tensor& x, const SymInt& size, int64_t d) {
  const SymInt& n = x.shape()[d];
  if (n.is_constant() && size.is_constant()) {
    int64_t nn = n.as_int(), sz = size.as_int();
    std::vector<int64_t> sizes;
    for (int64_t at = 0; at < nn; at += sz) sizes.push_back(std::min(sz, nn - at));
    if (sizes.empty()) sizes.push_back(0);
    return split(x, sizes, d);
  }
  SymInt count = floordiv(n + size - SymInt(1), size);
  int64_t c = std::max<int64_t>(detail::size_hint(count), 1);
  KILN_CHECK(detail::same_size(sym_max(count, 1), SymInt(c)), "split: internal error (piece count)");
  std::vector<Tensor> out;
  for (int64_t i = 0; i < c; ++i) {
    SymInt b = size * SymInt(i), e = i + 1 < c ? size * SymInt(i + 1) : n;
    out.push_back(detail::slice_window(x, d, b, e, 1));
  }
  return out;
}
}  // namespace

std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim) {
  KILN_CHECK(size > 0, "split: split_size must be positive, got ", size);
  return split_pieces(x, size, wrap_dim(dim, x.dim(), "split"));
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  KILN_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  int64_t d = wrap_dim(dim, x.dim(), "chunk");
  const SymInt& n = x.shape()[d];
  if (auto empty = sym_eq(n, 0); empty && *empty) {  // PyTorch: `chunks` empty pieces of a size-0 dim
    std::vector<Tensor> out;
    for (int64_t i = 0; i < chunks; ++i) out.push_back(x.narrow(d, 0, 0));
    return out;
  }
  return split_pieces(x, sym_max(floordiv(n + SymInt(chunks - 1), chunks), 1), d);
}

Tensor flip(const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> ds = detail::wrap_dims(dims, x.dim(), "flip");
  KILN_CHECK(!dims.empty() || x.dim() == 0, "flip: expected at least one dim");
  if (ds.empty()) return x.clone();
  Tensor v = make_view(x, step(OpKind::Flip, ds));
  return record(OpKind::Contiguous, {v}, Attrs{}, x.dtype(), x.shape());
}

Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats) {
  KILN_CHECK(repeats.size() >= static_cast<size_t>(x.dim()), "repeat: number of repeat dims (", repeats.size(),
             ") can not be smaller than number of dimensions of tensor (", x.dim(), ")");
  for (int64_t r : repeats) KILN_CHECK(r >= 0, "repeat: repeats must be non-negative, got ", str(repeats));
  Shape padded(repeats.size() - x.dim(), SymInt(1));
  padded.insert(padded.end(), x.shape().begin(), x.shape().end());
  Shape inter, exp, fin;
  for (size_t i = 0; i < repeats.size(); ++i) {
    inter.push_back(1);
    inter.push_back(padded[i]);
    exp.push_back(repeats[i]);
    exp.push_back(padded[i]);
    fin.push_back(padded[i] * SymInt(repeats[i]));
  }
  // Always a fresh tensor (never an alias of x, even for all-ones repeats).
  Tensor e = detail::reshape_to(contiguous(x), inter).expand_sym(exp);
  return detail::reshape_to(record(OpKind::Contiguous, {e}, Attrs{}, x.dtype(), e.shape()), fin);
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& p, double value) {
  KILN_CHECK(p.size() % 2 == 0, "pad: padding length must be divisible by 2, got ", p.size());
  KILN_CHECK(static_cast<int64_t>(p.size() / 2) <= x.dim(), "pad: padding length too large (", p.size(),
             ") for a tensor of dimension ", x.dim());
  Shape out = x.shape();
  Tensor src = x;
  int64_t n = x.dim();
  for (size_t k = 0; k < p.size() / 2; ++k) {
    int64_t d = n - 1 - static_cast<int64_t>(k);
    int64_t l = p[2 * k], r = p[2 * k + 1];
    out[d] = out[d] + SymInt(l + r);
    KILN_CHECK(sym_ge(out[d], 0).value_or(false), "pad: resulting padded dimension ", d, " has negative size ",
               out[d].str());
    // Negative padding crops the input.
    const SymInt& sd = src.shape()[d];
    src = detail::slice_window(src, d, SymInt(std::max<int64_t>(-l, 0)), sd - SymInt(std::max<int64_t>(-r, 0)), 1);
  }
  Tensor result = full_shape(out, value, x.dtype(), x.device());
  Tensor win = result;
  for (size_t k = 0; k < p.size() / 2; ++k) {
    int64_t d = n - 1 - static_cast<int64_t>(k);
    int64_t l = std::max<int64_t>(p[2 * k], 0);
    win = detail::slice_window(win, d, SymInt(l), SymInt(l) + src.shape()[d], 1);
  }
  win.assign_(src);
  return result;
}

namespace {
Tensor triangle(const Tensor& x, int64_t k, bool lower, const char* op) {
  KILN_CHECK(x.dim() >= 2, op, ": input tensor must have at least 2 dimensions, got ", x.dim());
  const SymInt &h = x.shape()[x.dim() - 2], &w = x.shape()[x.dim() - 1];
  Tensor diff =
      sub(detail::arange_of(w, x.device()).unsqueeze(0), detail::arange_of(h, x.device()).unsqueeze(1));  // col - row
  Tensor keep = lower ? le(diff, k) : ge(diff, k);
  return where(keep, x, detail::constant(0, x.dtype(), x.device()));
}
}  // namespace

Tensor tril(const Tensor& x, int64_t k) { return triangle(x, k, true, "tril"); }
Tensor triu(const Tensor& x, int64_t k) { return triangle(x, k, false, "triu"); }

}  // namespace kiln
