// PyTorch conveniences composed from existing primitives: one-bound clamps, squeeze of a dim
// list, unbind, movedim, diagonal (an as-strided view), roll, cumprod, cumsum with a dtype,
// bool vectors, and the Tensor method forms (comparisons, casts, mT, in-place unary ops).
// Sizes are taken from shape() (SymInt), so compile() traces keep them symbolic.
#include <algorithm>
#include <cstring>

#include "runtime/ops/autocast_policy.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln {
using detail::str;
using detail::wrap_dim;

// ---- clamp with one bound ----
Tensor clamp_min(const Tensor& x, Scalar min) { return clamp(x, std::optional<Scalar>(min), std::nullopt); }
Tensor clamp_min(const Tensor& x, const Tensor& min) {
  return clamp(x, std::optional<Tensor>(min), std::optional<Tensor>());
}
Tensor clamp_max(const Tensor& x, Scalar max) { return clamp(x, std::nullopt, std::optional<Scalar>(max)); }
Tensor clamp_max(const Tensor& x, const Tensor& max) {
  return clamp(x, std::optional<Tensor>(), std::optional<Tensor>(max));
}

// ---- movement ----
Tensor squeeze(const Tensor& x, const std::vector<int64_t>& dims) {
  KILN_CHECK(x.defined(), "squeeze: got an undefined tensor");
  std::vector<int64_t> ds;
  for (int64_t d : dims) {
    int64_t w = x.dim() == 0 ? wrap_dim(d, 1, "squeeze") : wrap_dim(d, x.dim(), "squeeze");
    KILN_CHECK(std::find(ds.begin(), ds.end(), w) == ds.end(), "squeeze: dim ", w,
               " appears multiple times in the list of dims");
    ds.push_back(w);
  }
  if (x.dim() == 0) return x;
  std::sort(ds.rbegin(), ds.rend());  // highest first, so lower positions stay valid
  Tensor r = x;
  for (int64_t d : ds) r = squeeze(r, std::optional<int64_t>(d));
  return r;
}
Tensor squeeze(const Tensor& x, std::initializer_list<int64_t> dims) { return squeeze(x, std::vector<int64_t>(dims)); }

std::vector<Tensor> unbind(const Tensor& x, int64_t dim) {
  KILN_CHECK(x.defined(), "unbind: got an undefined tensor");
  KILN_CHECK(x.dim() > 0, "unbind: dimension specified as ", dim, " but tensor has no dimensions");
  int64_t d = wrap_dim(dim, x.dim(), "unbind");
  int64_t n = x.size(d);  // the number of results is a C++ value: this size is specialized
  std::vector<Tensor> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(x.select(d, i));
  return out;
}

Tensor movedim(const Tensor& x, const std::vector<int64_t>& source, const std::vector<int64_t>& destination) {
  KILN_CHECK(x.defined(), "movedim: got an undefined tensor");
  KILN_CHECK(source.size() == destination.size(), "movedim: Invalid source or destination dims: source (", str(source),
             " dims) should contain the same number of dims as destination (", str(destination), " dims)");
  int64_t n = x.dim();
  int64_t rank = std::max<int64_t>(n, 1);
  std::vector<int64_t> perm(n, -1);
  std::vector<bool> src_used(n, false);
  for (size_t i = 0; i < source.size(); ++i) {
    int64_t s = wrap_dim(source[i], rank, "movedim"), t = wrap_dim(destination[i], rank, "movedim");
    if (n == 0) continue;
    KILN_CHECK(!src_used[s], "movedim: repeated dim in `source` (", str(source), ")");
    KILN_CHECK(perm[t] < 0, "movedim: repeated dim in `destination` (", str(destination), ")");
    src_used[s] = true;
    perm[t] = s;
  }
  if (n == 0) return x;
  int64_t next = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (perm[t] >= 0) continue;
    while (src_used[next]) ++next;
    perm[t] = next++;
  }
  return permute(x, perm);
}
Tensor movedim(const Tensor& x, int64_t source, int64_t destination) {
  return movedim(x, std::vector<int64_t>{source}, std::vector<int64_t>{destination});
}

Tensor diagonal(const Tensor& x, int64_t offset, int64_t dim1, int64_t dim2) {
  KILN_CHECK(x.defined(), "diagonal: got an undefined tensor");
  KILN_CHECK(x.dim() >= 2, "diagonal: expected a tensor with at least 2 dims, got ", x.dim());
  int64_t d1 = wrap_dim(dim1, x.dim(), "diagonal"), d2 = wrap_dim(dim2, x.dim(), "diagonal");
  KILN_CHECK(d1 != d2, "diagonal dimensions cannot be identical ", dim1, ", ", dim2);
  // An as-strided view of dense data (a non-contiguous input is copied first).
  Tensor base = x.is_contiguous() ? x : contiguous(x);
  const Shape& sh = base.shape();
  const Shape& st = base.node()->strides;
  SymInt n1 = sh[d1], n2 = sh[d2];
  SymInt len;
  SymInt off = 0;
  // Length max(min(n1, n2 - offset), 0) (offset >= 0) or max(min(n1 + offset, n2), 0).
  if (offset >= 0) {
    len = sym_max(sym_min(n1, n2 - SymInt(offset)), SymInt(0));
    off = SymInt(offset) * st[d2];
  } else {
    len = sym_max(sym_min(n1 + SymInt(offset), n2), SymInt(0));
    off = SymInt(-offset) * st[d1];
  }
  if (auto empty = sym_eq(len, 0); empty && *empty) off = 0;
  Shape shape, strides;
  for (int64_t i = 0; i < base.dim(); ++i) {
    if (i == d1 || i == d2) continue;
    shape.push_back(sh[i]);
    strides.push_back(st[i]);
  }
  shape.push_back(len);
  strides.push_back(st[d1] + st[d2]);
  Attrs a;
  a.sizes = shape;
  a.strides = strides;
  a.offset = off;
  return detail::make_view(base, ViewStep{OpKind::AsStrided, a, shape});
}

Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) {
  KILN_CHECK(x.defined(), "roll: got an undefined tensor");
  if (dims.empty()) {
    KILN_CHECK(shifts.size() == 1, "roll: `shifts` required to be of size 1 when `dims` is empty, got ", shifts.size());
    return detail::reshape_to(roll(flatten(x), shifts, {0}), x.shape());
  }
  KILN_CHECK(shifts.size() == dims.size(), "roll: shifts and dimensions must align. shifts: ", shifts.size(),
             ", dims: ", dims.size());
  Tensor r = x;
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], x.dim(), "roll");
    const SymInt& n = r.shape()[d];
    if (auto z = sym_eq(n, 0); z && *z) continue;
    // cat(x[n - s:], x[:n - s]) with s = shift mod n (sizes stay symbolic).
    SymInt s = mod(SymInt(shifts[i]), n);
    if (auto z = sym_eq(s, 0); z && *z) continue;
    Tensor tail = detail::slice_window(r, d, n - s, n, 1);
    Tensor head = detail::slice_window(r, d, SymInt(0), n - s, 1);
    r = cat({tail, head}, d);
  }
  return r;
}
Tensor roll(const Tensor& x, int64_t shift, std::optional<int64_t> dim) {
  if (!dim) return roll(x, std::vector<int64_t>{shift}, std::vector<int64_t>{});
  return roll(x, std::vector<int64_t>{shift}, std::vector<int64_t>{*dim});
}

// ---- scans ----
Tensor cumsum(const Tensor& x_in, int64_t dim, std::optional<DType> dtype) {
  detail::AutocastOp autocast_op(dtype ? detail::AutocastPolicy::Body : detail::AutocastPolicy::Float32OnCuda, {&x_in});
  const Tensor& x = autocast_op[0];
  KILN_CHECK(x.defined(), "cumsum: got an undefined tensor");
  return cumsum(dtype ? to(x, *dtype) : x, dim);
}

Tensor cumprod(const Tensor& x_in, int64_t dim, std::optional<DType> dtype) {
  detail::AutocastOp autocast_op(dtype ? detail::AutocastPolicy::Body : detail::AutocastPolicy::Float32OnCuda, {&x_in});
  const Tensor& x = autocast_op[0];
  KILN_CHECK(x.defined(), "cumprod: got an undefined tensor");
  Tensor v = x;
  if (dtype)
    v = to(v, *dtype);
  else if (!is_floating(v.dtype()))
    v = to(v, kInt64);  // integer and bool inputs scan in int64
  if (v.dim() == 0) {
    wrap_dim(dim, 1, "cumprod");
    return v.clone();
  }
  int64_t d = wrap_dim(dim, v.dim(), "cumprod");
  // y[i] = prod over j of (j <= i ? x[j] : 1): the product reduction of a triangular
  // selection (exact, and prod's gradient handles zeros as PyTorch does).
  Tensor m = movedim(v, d, -1);  // [..., n]
  const SymInt& n = m.shape().back();
  Tensor ar = detail::arange_of(n, v.device());
  Tensor keep = le(unsqueeze(ar, 0), unsqueeze(ar, 1));  // [n(i), n(j)]: j <= i
  Tensor sel = where(keep, unsqueeze(m, -2), Scalar(1));  // [..., n(i), n(j)]
  Tensor y = prod(sel, std::vector<int64_t>{-1});  // [..., n]
  return movedim(to(y, v.dtype()), -1, d);
}

// ---- bool vectors ----
template <>
Tensor from_vector<bool>(const std::vector<bool>& values, std::optional<std::vector<int64_t>> shape, Device device) {
  std::vector<int32_t> v(values.begin(), values.end());
  return to(from_vector(v, std::move(shape), device), kBool);
}

template <>
std::vector<bool> Tensor::to_vector<bool>() const {
  std::vector<uint8_t> v = kiln::to(*this, kBool).template to_vector<uint8_t>();
  return std::vector<bool>(v.begin(), v.end());
}

// ---- method forms ----
Tensor Tensor::sum(std::vector<int64_t> d, bool k, DType t) const { return kiln::sum(*this, std::move(d), k, t); }
Tensor Tensor::max() const { return kiln::max(*this); }
Tensor Tensor::min() const { return kiln::min(*this); }
std::pair<Tensor, Tensor> Tensor::max(int64_t d, bool k) const { return kiln::max(*this, d, k); }
std::pair<Tensor, Tensor> Tensor::min(int64_t d, bool k) const { return kiln::min(*this, d, k); }
Tensor Tensor::cumsum(int64_t d, std::optional<DType> t) const { return kiln::cumsum(*this, d, t); }
Tensor Tensor::cumprod(int64_t d, std::optional<DType> t) const { return kiln::cumprod(*this, d, t); }
Tensor Tensor::clamp_min(Scalar v) const { return kiln::clamp_min(*this, v); }
Tensor Tensor::clamp_max(Scalar v) const { return kiln::clamp_max(*this, v); }
Tensor Tensor::expand_as(const Tensor& o) const { return kiln::expand_as(*this, o); }
Tensor Tensor::view_as(const Tensor& o) const { return kiln::view_as(*this, o); }
Tensor Tensor::reshape_as(const Tensor& o) const { return kiln::reshape_as(*this, o); }
Tensor Tensor::squeeze(std::initializer_list<int64_t> d) const { return kiln::squeeze(*this, d); }
Tensor Tensor::squeeze(const std::vector<int64_t>& d) const { return kiln::squeeze(*this, d); }
std::vector<Tensor> Tensor::unbind(int64_t d) const { return kiln::unbind(*this, d); }
Tensor Tensor::movedim(int64_t s, int64_t t) const { return kiln::movedim(*this, s, t); }
Tensor Tensor::movedim(const std::vector<int64_t>& s, const std::vector<int64_t>& t) const {
  return kiln::movedim(*this, s, t);
}
Tensor Tensor::diagonal(int64_t o, int64_t a, int64_t b) const { return kiln::diagonal(*this, o, a, b); }
Tensor Tensor::roll(int64_t s, std::optional<int64_t> d) const { return kiln::roll(*this, s, d); }
Tensor Tensor::roll(const std::vector<int64_t>& s, const std::vector<int64_t>& d) const {
  return kiln::roll(*this, s, d);
}
#define KILN_CMP_METHOD(name)                                                 \
  Tensor Tensor::name(const Tensor& o) const { return kiln::name(*this, o); } \
  Tensor Tensor::name(Scalar o) const { return kiln::name(*this, o); }
KILN_CMP_METHOD(eq)
KILN_CMP_METHOD(ne)
KILN_CMP_METHOD(lt)
KILN_CMP_METHOD(le)
KILN_CMP_METHOD(gt)
KILN_CMP_METHOD(ge)
#undef KILN_CMP_METHOD
Tensor Tensor::to_float() const { return kiln::to(*this, kFloat32); }
Tensor Tensor::to_double() const { return kiln::to(*this, kFloat64); }
Tensor Tensor::to_long() const { return kiln::to(*this, kInt64); }
Tensor Tensor::to_int() const { return kiln::to(*this, kInt32); }
Tensor Tensor::to_bool() const { return kiln::to(*this, kBool); }
Tensor Tensor::mT() const {
  KILN_CHECK(dim() >= 2, "tensor.mT is only supported on matrices or batches of matrices. Got ", dim(), "-D tensor.");
  return kiln::transpose(*this, -2, -1);
}
Tensor& Tensor::masked_fill_(const Tensor& m, Scalar v) { return assign_(kiln::masked_fill(*this, m, v)); }
Tensor& Tensor::masked_fill_(const Tensor& m, const Tensor& v) { return assign_(kiln::masked_fill(*this, m, v)); }
#define KILN_INPLACE_UNARY(name) \
  Tensor& Tensor::name##_() { return assign_(kiln::name(*this)); }
KILN_INPLACE_UNARY(exp)
KILN_INPLACE_UNARY(log)
KILN_INPLACE_UNARY(sqrt)
KILN_INPLACE_UNARY(rsqrt)
KILN_INPLACE_UNARY(relu)
KILN_INPLACE_UNARY(sigmoid)
KILN_INPLACE_UNARY(tanh)
KILN_INPLACE_UNARY(neg)
KILN_INPLACE_UNARY(abs)
KILN_INPLACE_UNARY(sin)
KILN_INPLACE_UNARY(cos)
KILN_INPLACE_UNARY(floor)
KILN_INPLACE_UNARY(ceil)
KILN_INPLACE_UNARY(round)
KILN_INPLACE_UNARY(reciprocal)
KILN_INPLACE_UNARY(square)
#undef KILN_INPLACE_UNARY
Tensor& Tensor::clamp_min_(Scalar v) { return assign_(kiln::clamp_min(*this, v)); }
Tensor& Tensor::clamp_max_(Scalar v) { return assign_(kiln::clamp_max(*this, v)); }
Tensor& Tensor::pow_(Scalar e) { return assign_(kiln::pow(*this, e)); }

}  // namespace kiln
