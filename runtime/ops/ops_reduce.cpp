// Reductions: primitives (sum, prod, amax, amin, argmax, argmin, cumsum) and composites.
#include <cmath>
#include <limits>

#include "runtime/autograd/autograd.h"
#include "runtime/autograd/forward_ad.h"
#include "runtime/ops/autocast_policy.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln {
using detail::record;
using detail::str;

namespace {
Tensor reduce(OpKind op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType out, const char* name,
              bool needs_nonempty) {
  KILN_CHECK(x.defined(), name, ": got an undefined tensor");
  std::vector<int64_t> ds = detail::wrap_dims(dims, x.dim(), name);
  if (needs_nonempty) {
    if (x.dim() == 0) {
    } else {
      for (int64_t d : ds) {
        auto z = sym_eq(x.shape()[d], 0);
        KILN_CHECK(!(z && *z), name, "(): expected reduction dim ", d, " to have non-zero size (input shape ",
                   str(x.shape()), ")");
      }
    }
  }
  Attrs a;
  a.ints = ds;
  return record(op, {x}, a, out, detail::reduced_shape(x.shape(), ds, keepdim));
}

}  // namespace

Tensor detail::shift_max(const Tensor& x, const std::vector<int64_t>& dims) {
  return reduce(OpKind::Amax, x.detach(), dims, true, x.dtype(), "amax", false);
}

namespace {
DType sum_type(DType t) { return is_floating(t) ? t : kInt64; }
Tensor as_float(const Tensor& x) { return is_floating(x.dtype()) ? x : detail::cast(x, kFloat32); }

SymInt reduced_count(const Tensor& x, const std::vector<int64_t>& dims) {
  SymInt n = 1;
  for (int64_t d : detail::wrap_dims(dims, x.dim(), "reduce")) n = n * x.shape()[d];
  return n;
}
Tensor count_tensor(const Tensor& x, const std::vector<int64_t>& dims, DType t) {
  return detail::size_value(reduced_count(x, dims), t, x.device());
}
}  // namespace

Tensor sum(const Tensor& x_in, std::vector<int64_t> dims, bool keepdim, std::optional<DType> dtype) {
  // (an explicit dtype is not autocast, as in PyTorch)
  detail::AutocastOp autocast_op(dtype ? detail::AutocastPolicy::Body : detail::AutocastPolicy::Float32OnCuda, {&x_in});
  const Tensor& x = autocast_op[0];
  DType t = dtype.value_or(sum_type(x.defined() ? x.dtype() : kFloat32));
  return reduce(OpKind::Sum, detail::cast(x, t), dims, keepdim, t, "sum", false);
}

Tensor mean(const Tensor& x_in, std::vector<int64_t> dims, bool keepdim) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Body, {&x_in});
  const Tensor& x = autocast_op[0];
  KILN_CHECK(x.defined() && is_floating(x.dtype()), "mean(): could not infer output dtype. Input dtype must be a ",
             "floating point dtype, got ", x.defined() ? dtype_name(x.dtype()) : "undefined");
  return div(sum(x, dims, keepdim), count_tensor(x, dims, x.dtype()));
}

Tensor prod(const Tensor& x_in, std::vector<int64_t> dims, bool keepdim) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Float32, {&x_in});
  const Tensor& x = autocast_op[0];
  DType t = sum_type(x.dtype());
  return reduce(OpKind::Prod, detail::cast(x, t), dims, keepdim, t, "prod", false);
}

Tensor amax(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce(OpKind::Amax, x, dims, keepdim, x.dtype(), "amax", true);
}
Tensor amin(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce(OpKind::Amin, x, dims, keepdim, x.dtype(), "amin", true);
}

namespace {
Tensor arg_reduce(OpKind op, const char* name, const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  if (dim) return reduce(op, x, {*dim}, keepdim, kInt64, name, true);
  KILN_CHECK(sym_gt(numel(x.shape()), 0).value_or(false), name, "(): expected a non-empty tensor");
  Tensor r = reduce(op, x, {}, false, kInt64, name, true);  // index into the flattened tensor
  return keepdim ? reshape(r, std::vector<int64_t>(x.dim(), 1)) : r;
}
}  // namespace

Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_reduce(OpKind::ArgMax, "argmax", x, dim, keepdim);
}
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_reduce(OpKind::ArgMin, "argmin", x, dim, keepdim);
}

namespace {
// max/min along a dim. PyTorch sends their gradient to the returned index alone (amax/amin spread
// it over ties), so with a gradient wanted the values are gathered at the index: the same values
// (the index is the first maximum, or the first NaN, as amax picks), the index's gradient.
std::pair<Tensor, Tensor> value_and_index(const Tensor& x, int64_t dim, bool keepdim, bool is_max) {
  Tensor idx = is_max ? argmax(x, dim, keepdim) : argmin(x, dim, keepdim);
  if (!detail::wants_derivative(x) || x.dim() == 0)
    return {is_max ? amax(x, {dim}, keepdim) : amin(x, {dim}, keepdim), idx};
  int64_t d = detail::wrap_dim(dim, x.dim(), is_max ? "max" : "min");
  Tensor v = gather(x, d, keepdim ? idx : unsqueeze(idx, d));
  return {keepdim ? v : squeeze(v, d), idx};
}
}  // namespace

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  return value_and_index(x, dim, keepdim, true);
}
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  return value_and_index(x, dim, keepdim, false);
}
Tensor max(const Tensor& x) {
  KILN_CHECK(sym_gt(numel(x.shape()), 0).value_or(false),
             "max(): expected a non-empty tensor (there is no identity for max)");
  return amax(x);
}
Tensor min(const Tensor& x) {
  KILN_CHECK(sym_gt(numel(x.shape()), 0).value_or(false),
             "min(): expected a non-empty tensor (there is no identity for min)");
  return amin(x);
}

Tensor all(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  Tensor zeros_count = sum(eq(x, 0), dims, keepdim);
  return eq(zeros_count, 0);
}
Tensor any(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  Tensor nonzero_count = sum(ne(x, 0), dims, keepdim);
  return gt(nonzero_count, 0);
}

Tensor var(const Tensor& x_in, std::vector<int64_t> dims, double correction, bool keepdim) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Body, {&x_in});
  const Tensor& x = autocast_op[0];
  KILN_CHECK(x.defined() && is_floating(x.dtype()), "var(): expected a floating point tensor, got ",
             x.defined() ? dtype_name(x.dtype()) : "undefined");
  Tensor m = mean(x, dims, true);
  Tensor d = sub(x, m);
  Tensor ss = sum(mul(d, d), dims, keepdim);
  SymInt n = reduced_count(x, dims);
  if (auto c = n.maybe_int()) return div(ss, std::max(static_cast<double>(*c) - correction, 0.0));
  return div(ss, clamp(sub(detail::size_value(n, ss.dtype(), x.device()), correction), Scalar(0.0), std::nullopt));
}
namespace {
// root(t) = pow(t, 1/p) (sqrt for p = 2) with PyTorch's gradient convention for norms and std:
// 0 where t is 0 (the plain rule gives 0 * inf = nan there). With a gradient wanted, the root is
// taken of t with its zeros replaced by 1, and those places set to root(0) again.
Tensor root_zero_grad(const Tensor& t, double p, bool wants_grad) {
  auto rt = [&](const Tensor& u) { return p == 2 ? sqrt(u) : pow(u, 1.0 / p); };
  if (!wants_grad) return rt(t);
  Tensor zero = eq(t, 0);
  return where(zero, std::pow(0.0, 1.0 / p), rt(where(zero, 1.0, t)));
}
}  // namespace

Tensor std(const Tensor& x_in, std::vector<int64_t> dims, double correction, bool keepdim) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Body, {&x_in});
  const Tensor& x = autocast_op[0];
  return root_zero_grad(var(x, dims, correction, keepdim), 2, detail::wants_derivative(x));
}

Tensor logsumexp(const Tensor& x_in, std::vector<int64_t> dims, bool keepdim) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Float32OnCuda, {&x_in});
  const Tensor& xin = autocast_op[0];
  Tensor x = as_float(xin);
  // The shift's gradient cancels exactly: detached. Over an empty dim it is -inf, set to 0
  // below: log(sum(exp(x))) = -inf, PyTorch's result.
  Tensor m = detail::shift_max(x, dims);
  m = where(eq(abs(m), std::numeric_limits<double>::infinity()), detail::constant(0, m.dtype(), m.device()), m);
  Tensor s = log(sum(exp(sub(x, m)), dims, keepdim));
  Tensor mk = m;
  if (!keepdim) mk = detail::reshape_to(m, s.shape());
  return add(s, mk);
}

Tensor norm(const Tensor& x_in, double p, std::vector<int64_t> dims, bool keepdim) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Float32OnCuda, {&x_in});
  const Tensor& xin = autocast_op[0];
  Tensor x = as_float(xin);
  // PyTorch's norm gradient is 0 where the norm is 0, and (p < 1) 0 at zero elements.
  bool wants_grad = detail::wants_derivative(x);
  if (p == 2) return root_zero_grad(sum(mul(x, x), dims, keepdim), 2, wants_grad);
  if (p == 1) return sum(abs(x), dims, keepdim);
  if (std::isinf(p)) {  // max/min have no identity: every reduced dim must be non-empty
    for (int64_t d : detail::wrap_dims(dims, x.dim(), "norm")) {
      auto z = sym_eq(x.shape()[d], 0);
      KILN_CHECK(!(z && *z), "norm(): cannot compute the ", p > 0 ? "" : "-", "inf norm over an empty dim (expected ",
                 "reduced dim ", d, " to have non-zero size, got input shape ", str(x.shape()), ")");
    }
    return p > 0 ? amax(abs(x), dims, keepdim) : amin(abs(x), dims, keepdim);
  }
  if (p == 0) return sum(detail::cast(ne(x, 0), x.dtype()), dims, keepdim);
  Tensor a = abs(x);
  Tensor powered;
  if (wants_grad) {  // |x|^p with the gradient 0 at x = 0 (pow's rule gives inf * 0 there when p < 1)
    Tensor zero = eq(a, 0);
    powered = where(zero, std::pow(0.0, p), pow(where(zero, 1.0, a), p));
  } else {
    powered = pow(a, p);
  }
  return root_zero_grad(sum(powered, dims, keepdim), p, wants_grad);
}

Tensor cumsum(const Tensor& x_in, int64_t dim) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Float32OnCuda, {&x_in});
  const Tensor& x = autocast_op[0];
  KILN_CHECK(x.defined(), "cumsum: got an undefined tensor");
  DType t = sum_type(x.dtype());
  Attrs a;
  a.ints = {detail::wrap_dim(dim, x.dim(), "cumsum")};
  // A 0-d tensor (dim 0 or -1): its own value, as a 1-element scan (the kernels need a dim).
  if (x.dim() == 0) return reshape(cumsum(reshape(x, {1}), 0), std::vector<int64_t>{});
  return record(OpKind::Cumsum, {detail::cast(x, t)}, a, t, x.shape());
}

}  // namespace kiln
