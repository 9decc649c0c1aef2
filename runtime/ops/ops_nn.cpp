// nn functional ops, recorded as subgraphs of primitives (softmax, norms, losses, attention, conv).
#include <cmath>
#include <limits>

#include "runtime/autograd/autograd.h"
#include "runtime/autograd/autograd_rules.h"
#include "runtime/ops/autocast_policy.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln {
using detail::record;
using detail::str;

namespace {
Tensor as_float(const Tensor& x) { return is_floating(x.dtype()) ? x : detail::cast(x, kFloat32); }

Tensor reduce_loss(const Tensor& l, const std::string& reduction, const char* op) {
  if (reduction == "mean") return mean(l);
  if (reduction == "sum") return sum(l);
  KILN_CHECK(reduction == "none", op, ": reduction must be 'mean', 'sum' or 'none', got '", reduction, "'");
  return l;
}
}  // namespace

namespace {
// A composite whose backward reads only its output y, as PyTorch's SoftmaxBackward and
// LogSoftmaxBackward keep only their result: y computed without recording gradients, then
// `vjp(g, y)` (differentiable in g and y where the gradient graph is itself differentiated).
// Recorded primitive by primitive, softmax kept exp's [.., n] result beside the y its consumer
// keeps (attention's probabilities twice) and log_softmax kept exp's result beside nothing.
template <class Vjp>
Tensor keeping_output(const char* name, const Tensor& x, const std::function<Tensor()>& value, Vjp vjp) {
  if (!grad_enabled() || !x.requires_grad()) return value();
  Tensor y;
  {
    NoGradGuard ng;
    y = value();
  }
  detail::attach_custom_grad(y, name, {x},
                             detail::CustomVjpOfOutput([vjp](const Tensor& g, const Tensor& out, bool) {
                               return std::vector<Tensor>{vjp(g, out)};
                             }));
  return y;
}
}  // namespace

Tensor softmax(const Tensor& x_in, int64_t dim) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Float32OnCuda, {&x_in});
  const Tensor& xin = autocast_op[0];
  Tensor x = as_float(xin);
  int64_t d = detail::wrap_dim(dim, x.dim(), "softmax");
  if (x.dim() == 0) return div(exp(sub(x, x)), 1);
  // The max shift only guards exp against overflow (its gradient cancels exactly). Over an
  // empty dim the result is empty. Normalized by one reciprocal a row, as PyTorch's CPU kernel
  // does (x * (1 / sum)): a multiply per element instead of a division.
  // Backward (PyTorch's _softmax_backward_data): dx = y * (g - sum(g * y)).
  return keeping_output(
      "softmax", x,
      [&] {
        Tensor e = exp(sub(x, detail::shift_max(x, {d})));
        return mul(e, reciprocal(sum(e, {d}, true)));
      },
      [d](const Tensor& g, const Tensor& y) { return mul(y, sub(g, sum(mul(g, y), {d}, true))); });
}

Tensor log_softmax(const Tensor& x_in, int64_t dim) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Float32OnCuda, {&x_in});
  const Tensor& xin = autocast_op[0];
  Tensor x = as_float(xin);
  int64_t d = detail::wrap_dim(dim, x.dim(), "log_softmax");
  if (x.dim() == 0) return sub(x, x);
  // Backward (PyTorch's _log_softmax_backward_data): dx = g - exp(y) * sum(g).
  return keeping_output(
      "log_softmax", x,
      [&] {
        Tensor shifted = sub(x, detail::shift_max(x, {d}));
        return sub(shifted, log(sum(exp(shifted), {d}, true)));
      },
      [d](const Tensor& g, const Tensor& y) { return sub(g, mul(exp(y), sum(g, {d}, true))); });
}

namespace {
// Whether two shapes are equal dim by dim (guarded relations in compile() traces).
bool same_sizes(const Shape& a, const Shape& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!detail::same_size(a[i], b[i])) return false;
  return true;
}
}  // namespace

namespace {
// x^ = (x - mean) * r over `dims`, r = rsqrt(var + eps) (biased variance), with the mean and r.
struct Normalized {
  Tensor xhat, r, mean;
};
Normalized normalized(const Tensor& x, const std::vector<int64_t>& dims, double eps) {
  Tensor m = mean(x, dims, true);
  Tensor c = sub(x, m);
  Tensor r = rsqrt(add(mean(mul(c, c), dims, true), eps));
  return {mul(c, r), r, m};
}
}  // namespace

Tensor layer_norm(const Tensor& x_in, const std::vector<int64_t>& ns, const std::optional<Tensor>& w_in,
                  const std::optional<Tensor>& b_in, double eps) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Float32OnCuda,
                                 {&x_in, detail::AutocastOp::input(w_in), detail::AutocastOp::input(b_in)});
  const Tensor& x = autocast_op[0];
  const std::optional<Tensor> w = autocast_op.optional(1);
  const std::optional<Tensor> b = autocast_op.optional(2);
  KILN_CHECK(x.defined() && is_floating(x.dtype()), "layer_norm: expected a floating point input");
  int64_t k = static_cast<int64_t>(ns.size());
  KILN_CHECK(k >= 1 && k <= x.dim(), "layer_norm: normalized_shape ", str(ns), " does not fit input shape ",
             str(x.shape()));
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < k; ++i) {
    int64_t d = x.dim() - k + i;
    KILN_CHECK(detail::same_size(x.shape()[d], ns[i]), "layer_norm: given normalized_shape=", str(ns),
               ", expected input with shape [*, ", str(ns).substr(1), ", but got input of size ", str(x.shape()));
    dims.push_back(d);
  }
  auto check_param = [&](const std::optional<Tensor>& p, const char* name) {
    if (p) KILN_CHECK(p->sizes() == ns, "layer_norm: ", name, " must have shape ", str(ns), ", got ", str(p->shape()));
  };
  check_param(w, "weight");
  check_param(b, "bias");
  const Tensor wt = w ? *w : Tensor(), bt = b ? *b : Tensor();
  auto affine = [&](Tensor y) {
    if (w) y = mul(y, *w);
    if (b) y = add(y, *b);
    return y;
  };
  if (!grad_enabled() || !(x.requires_grad() || (w && w->requires_grad()) || (b && b->requires_grad())))
    return affine(normalized(x, dims, eps).xhat);
  // With gradients: the compact backward (as PyTorch's), not the decomposition's. With g = dy * w
  // and x^ = (x - mean) * r, r = rsqrt(var + eps), over the normalized dims:
  //   dx = r * (g - mean(g) - x^ * mean(g * x^)),  dw = sum(dy * x^),  db = sum(dy)
  // (the leading dims summed). One stage of row reductions, where the decomposition's chain
  // rule needs two (the mean of a gradient that depends on the variance's gradient). Kept for it
  // what PyTorch's native_layer_norm keeps: the input (as given: an autocast's float32 copy is
  // not kept), the mean and r, [N, 1] each; x^ is recomputed from them (the same bits).
  Normalized f;
  Tensor y;
  {
    NoGradGuard ng;
    f = normalized(x, dims, eps);
    y = affine(f.xhat);
  }
  const Tensor xs = detail::snapshot(x_in), ws = w ? detail::snapshot(*w) : Tensor(),
               bs = b ? detail::snapshot(*b) : Tensor(), m = f.mean, r = f.r;
  const DType dt = x.dtype();
  detail::attach_custom_grad(
      y, "layer_norm", {x, wt, bt}, [xs, ws, bs, m, r, dt, dims, eps](const Tensor& g, bool create_graph) {
        const Tensor xf = detail::cast(xs, dt);
        Tensor xh, rr = r;
        if (create_graph) {  // differentiable in x
          const Normalized n = normalized(xf, dims, eps);
          xh = n.xhat;
          rr = n.r;
        } else {
          xh = mul(sub(xf, m), r);
        }
        Tensor gw = ws.defined() ? mul(g, ws) : g;
        Tensor dx = mul(rr, sub(sub(gw, mean(gw, dims, true)), mul(xh, mean(mul(gw, xh), dims, true))));
        std::vector<Tensor> grads = {detail::cast(dx, dt), Tensor(), Tensor()};
        if (ws.defined() && ws.requires_grad())
          grads[1] = detail::cast(detail::sum_to(mul(g, xh), ws.shape()), ws.dtype());
        if (bs.defined() && bs.requires_grad()) grads[2] = detail::cast(detail::sum_to(g, bs.shape()), bs.dtype());
        return grads;
      });
  return y;
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& target, const std::string& reduction) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Float32, {&logits_in});
  const Tensor& logits = autocast_op[0];
  KILN_CHECK(logits.defined() && target.defined(), "cross_entropy: got an undefined tensor");
  KILN_CHECK(logits.dim() >= 1, "cross_entropy: expected logits with at least 1 dim");
  int64_t cdim = logits.dim() == 1 ? 0 : 1;
  if (is_floating(target.dtype())) {  // class probabilities
    Tensor lsm = log_softmax(logits, cdim);
    KILN_CHECK(same_sizes(target.shape(), logits.shape()),
               "cross_entropy: probability targets must match logits shape ", str(logits.shape()), ", got ",
               str(target.shape()));
    Tensor l = neg(sum(mul(lsm, target), {cdim}));
    return reduce_loss(l, reduction, "cross_entropy");
  }
  KILN_CHECK(target.dtype() == kInt64, "cross_entropy: expected int64 class indices, got ", dtype_name(target.dtype()));
  Shape want = logits.shape();
  want.erase(want.begin() + cdim);
  KILN_CHECK(same_sizes(target.shape(), want), "cross_entropy: expected target of shape ", str(want),
             " for logits of shape ", str(logits.shape()), ", got ", str(target.shape()));
  // -log_softmax(x)[t] = s - (x[t] - m), with m the row max and s = log(sum(exp(x - m))): the
  // row statistics and the picked logits, not log_softmax's [N, C] (float32 under autocast: 1.6
  // GiB for GPT-2's 8192 x 50304, written only for this gather to read 8192 of it). The picked
  // logit is gathered from the logits as given and then cast (the same value), so an autocast's
  // float32 copy of the logits need not exist either.
  auto row_stats = [&](const Tensor& x) {
    Tensor m = amax(x, {cdim}, true);
    return std::pair<Tensor, Tensor>{m, log(sum(exp(sub(x, m)), {cdim}, true))};
  };
  auto loss_of = [&](const Tensor& m, const Tensor& s) {
    Tensor xt = detail::cast(gather(logits_in, cdim, unsqueeze(target, cdim)), logits.dtype());
    return squeeze(sub(s, sub(xt, m)), cdim);
  };
  if (!grad_enabled() || !logits.requires_grad()) {
    auto [m, s] = row_stats(logits);
    return reduce_loss(loss_of(m, s), reduction, "cross_entropy");
  }
  // With a gradient: the compact backward (as PyTorch's), d(-log_softmax(x)[t]) = (softmax(x) -
  // onehot(t)) * g, one pointwise kernel (the class index compared with an iota), not a scatter
  // of g then log_softmax's backward with its row sum; softmax(x) = exp(x - m - s) from the
  // logits as given and the two row statistics it keeps.
  Tensor l, m, s;
  {
    NoGradGuard ng;
    std::tie(m, s) = row_stats(logits);
    l = loss_of(m, s);
  }
  const Tensor xs = detail::snapshot(logits_in), ts = target.detach();
  const DType dt = logits.dtype();
  detail::attach_custom_grad(l, "cross_entropy", {logits}, [xs, ts, m, s, dt, cdim](const Tensor& g, bool create_graph) {
    const Tensor x = detail::cast(xs, dt);
    Tensor p = create_graph ? softmax(x, cdim) : exp(sub(sub(x, m), s));
    Tensor classes = arange_symint(xs.shape()[static_cast<size_t>(cdim)], xs.device());  // [C] at dim cdim
    for (int64_t d = 0; d < cdim; ++d) classes = unsqueeze(classes, 0);
    for (int64_t d = cdim + 1; d < xs.dim(); ++d) classes = unsqueeze(classes, -1);
    Tensor onehot = detail::cast(eq(classes, unsqueeze(ts, cdim)), p.dtype());
    return std::vector<Tensor>{detail::cast(mul(sub(p, onehot), unsqueeze(g, cdim)), dt)};
  });
  return reduce_loss(l, reduction, "cross_entropy");
}

Tensor mse_loss(const Tensor& x_in, const Tensor& y_in, const std::string& reduction) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Float32, {&x_in, &y_in});
  const Tensor& x = autocast_op[0];
  const Tensor& y = autocast_op[1];
  Tensor d = sub(x, y);
  return reduce_loss(mul(d, d), reduction, "mse_loss");
}

Tensor smooth_l1_loss(const Tensor& x_in, const Tensor& y_in, const std::string& reduction, double beta) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Float32, {&x_in, &y_in});
  const Tensor& x = autocast_op[0];
  const Tensor& y = autocast_op[1];
  KILN_CHECK(beta >= 0, "smooth_l1_loss: beta must be non-negative, got ", beta);
  Tensor d = abs(sub(x, y));
  Tensor l = beta == 0 ? d : where(lt(d, beta), div(mul(mul(d, d), 0.5), beta), sub(d, 0.5 * beta));
  return reduce_loss(l, reduction, "smooth_l1_loss");
}

Tensor dropout(const Tensor& x, double p, bool training) {
  KILN_CHECK(p >= 0 && p <= 1, "dropout: probability has to be between 0 and 1, got ", p);
  if (!training || p == 0) return x;
  if (p == 1) return mul(x, 0);
  Tensor keep = lt(rand_like(as_float(x)), 1 - p);
  // One backward node that keeps the boolean mask (PyTorch's NativeDropoutBackward), not x and
  // the mask in x's dtype.
  return detail::with_custom_grad(
      "dropout", {x}, [&] { return div(mul(x, detail::cast(keep, x.dtype())), 1 - p); },
      [keep, p](const Tensor& g, bool) { return std::vector<Tensor>{mul(div(g, 1 - p), detail::cast(keep, g.dtype()))}; });
}

Tensor conv2d(const Tensor& x_in, const Tensor& w_in, const std::optional<Tensor>& b_in, std::vector<int64_t> stride,
              std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Lower, {&x_in, &w_in, detail::AutocastOp::input(b_in)});
  const Tensor& xin = autocast_op[0];
  const Tensor& w = autocast_op[1];
  const std::optional<Tensor> b = autocast_op.optional(2);
  KILN_CHECK(xin.defined() && w.defined(), "conv2d: got an undefined tensor");
  KILN_CHECK(xin.dim() == 3 || xin.dim() == 4, "conv2d: expected 3-D or 4-D input, got shape ", str(xin.shape()));
  KILN_CHECK(w.dim() == 4, "conv2d: expected 4-D weight [out, in/groups, kh, kw], got shape ", str(w.shape()));
  auto pair = [](std::vector<int64_t>& v, const char* name) {
    if (v.size() == 1) v.push_back(v[0]);
    KILN_CHECK(v.size() == 2, "conv2d: ", name, " must have 1 or 2 values, got ", v.size());
  };
  pair(stride, "stride");
  pair(padding, "padding");
  pair(dilation, "dilation");
  KILN_CHECK(stride[0] > 0 && stride[1] > 0 && dilation[0] > 0 && dilation[1] > 0 && padding[0] >= 0 && padding[1] >= 0,
             "conv2d: expected positive stride/dilation and non-negative padding");
  KILN_CHECK(groups > 0, "conv2d: groups must be positive, got ", groups);
  bool batched = xin.dim() == 4;
  Tensor x = batched ? xin : unsqueeze(xin, 0);
  KILN_CHECK(x.dtype() == w.dtype(), "conv2d: input and weight must have the same dtype, got ", dtype_name(x.dtype()),
             " and ", dtype_name(w.dtype()));
  // Batch and image sizes stay symbolic in compile() traces; channels must match the weight.
  const SymInt n = x.shape()[0], h = x.shape()[2], wd = x.shape()[3];
  int64_t c = x.size(1);
  int64_t o = w.size(0), cg = w.size(1), kh = w.size(2), kw = w.size(3);
  KILN_CHECK(c == cg * groups, "conv2d: expected input with ", cg * groups, " channels (weight ", str(w.shape()),
             ", groups=", groups, "), got ", c);
  KILN_CHECK(o % groups == 0, "conv2d: out_channels (", o, ") must be divisible by groups (", groups, ")");
  // The padded input must hold the dilated kernel; then (PyTorch's) floor division is exact.
  SymInt hspan = h + 2 * padding[0] - dilation[0] * (kh - 1) - 1,
         wspan = wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1;
  KILN_CHECK(sym_ge(hspan, 0).value_or(false) && sym_ge(wspan, 0).value_or(false), "conv2d: kernel size ", kh, "x", kw,
             " (dilated) is larger than padded input ", (h + 2 * padding[0]).str(), "x", (wd + 2 * padding[1]).str());
  SymInt ho = floordiv(hspan, stride[0]) + 1, wo = floordiv(wspan, stride[1]) + 1;
  if (b) KILN_CHECK(b->dim() == 1 && b->size(0) == o, "conv2d: bias must have shape [", o, "], got ", str(b->shape()));
  Attrs a;
  a.ints = {kh, kw, stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1]};
  Tensor cols = record(OpKind::Im2Col, {x}, a, x.dtype(), Shape{n, c * kh * kw, ho * wo});
  Tensor colsg = detail::reshape_to(cols, Shape{n, groups, cg * kh * kw, ho * wo});
  Tensor wg = reshape(w, {groups, o / groups, cg * kh * kw});
  Tensor y = detail::reshape_to(matmul(wg, colsg), Shape{n, o, ho, wo});
  if (b) y = add(y, reshape(*b, {1, o, 1, 1}));
  return batched ? y : squeeze(y, 0);
}

}  // namespace kiln
