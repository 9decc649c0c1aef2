// One JVP rule per differentiable primitive, written with ordinary ops so tangents are lazy nodes
// that fuse with the primal computation and are themselves differentiable (reverse-over-forward,
// nested levels).
#include "runtime/autograd/jvp_rules.h"

#include <cmath>

#include "runtime/autograd/autograd_rules.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln::detail {

namespace {

// (The unary pointwise ops with floating results sit from Neg to Sign in OpKind.)
static_assert(static_cast<int>(OpKind::Sign) - static_cast<int>(OpKind::Neg) == 22 &&
                  static_cast<int>(OpKind::IsNan) == static_cast<int>(OpKind::Sign) + 1,
              "OpKind's unary pointwise ops moved: update jvp()'s range");

// a + b where an undefined operand is zero.
Tensor plus(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return add(a, b);
}

// t, or zeros shaped like `like` when t is undefined.
Tensor or_zeros(const Tensor& t, const Tensor& like) { return t.defined() ? t : zeros_like(like); }

// A reduction of `t` over `dims` shaped as the op's output.
Tensor reduce_like(const Tensor& t, const std::vector<int64_t>& dims, const Tensor& out) {
  if (dims.empty()) return reshape_to(t, out.shape());  // over no dim (a 0-d input)
  return reshape_to(sum(t, dims, true), out.shape());
}

// The tangent of a view: the same view of the tangent (a reshape copies when the tangent's
// layout cannot be viewed; an AsStrided window is placed in a dense tangent, as in the primal).
Tensor view_tangent(OpKind op, const Attrs& a, const Tensor& t, const Shape& view_shape) {
  switch (op) {
    case OpKind::View: return reshape_to(t, view_shape);
    case OpKind::AsStrided: return view_step(contiguous(t), ViewStep{op, a, a.sizes});
    default: return view_step(t, ViewStep{op, a, view_shape});
  }
}

// Forward-mode derivative of the fused attention: softmax(S) with S = q kᵀ·scale (+ mask, causal),
// P = exp(S - lse): dlse = Σ P∘dS, dO = P·dv + (P∘(dS - dlse))·v, packed like the output.
Tensor attention_tangent(const Attrs& a, const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                         const Tensor& out) {
  KILN_CHECK(attention_dropout(a) == 0,
             "jvp: forward-mode AD through scaled_dot_product_attention with dropout is not supported");
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  const int64_t r = q.dim();
  const double scale = attention_scale(a);
  const SymInt d = q.shape()[r - 1];
  const Tensor lse = slice_window(out, r - 1, d, d + 1, 1);
  Tensor s = mul(matmul(q, transpose(k, -2, -1)), scale);
  const bool has_mask = in.size() > 3 && in[3].dtype() != kInt64;
  if (has_mask) s = add(s, in[3]);
  if (attention_causal(a)) {
    const SymInt tq = q.shape()[r - 2], tk = k.shape()[r - 2];
    Tensor above = gt(unsqueeze(arange_of(tk, q.device()), 0), unsqueeze(arange_of(tq, q.device()), 1));
    s = where(above, -INFINITY, s);
  }
  Tensor p = exp(sub(s, lse));
  Tensor ds;
  if (t[0].defined()) ds = matmul(t[0], transpose(k, -2, -1));
  if (t[1].defined()) ds = plus(ds, matmul(q, transpose(t[1], -2, -1)));
  if (ds.defined()) ds = mul(ds, scale);
  if (has_mask && t[3].defined()) ds = plus(ds, t[3]);
  Tensor dlse, dout;
  if (ds.defined()) {
    Tensor pds = mul(p, ds);
    dlse = sum(pds, {-1}, true);
    dout = matmul(sub(pds, mul(p, dlse)), v);
  }
  if (t[2].defined()) dout = plus(dout, matmul(p, t[2]));
  if (!dlse.defined()) dlse = zeros_like(lse);
  return kiln::cat({dout, dlse}, -1);
}

}  // namespace

Tensor jvp(OpKind op, const Attrs& a, const std::vector<Tensor>& in, const std::vector<Tensor>& t, const Tensor& out,
           const Shape& view_shape) {
  const Tensor& x = in[0];
  const Tensor& tx = t[0];
  // A unary pointwise op has a diagonal Jacobian: its tangent is its vjp rule applied to it.
  if (op >= OpKind::Neg && op <= OpKind::Sign) return vjp(op, a, in, out, tx, view_shape)[0];
  // A view's tangent is the same view of the tangent.
  if (is_view_op(op)) return view_tangent(op, a, tx, view_shape);
  switch (op) {
    case OpKind::ToDevice: return to(tx, out.device());
    case OpKind::Cast: return is_floating(out.dtype()) ? cast(tx, out.dtype()) : Tensor();
    case OpKind::Contiguous: return contiguous(tx);
    // ---- binary (tangents broadcast to the output in forward_ad.cpp) ----
    case OpKind::Add: return plus(t[0], t[1]);
    case OpKind::Sub: return t[1].defined() ? (tx.defined() ? sub(tx, t[1]) : neg(t[1])) : tx;
    case OpKind::Mul: return plus(tx.defined() ? mul(tx, in[1]) : Tensor(), t[1].defined() ? mul(x, t[1]) : Tensor());
    case OpKind::Div: {
      const Tensor& y = in[1];
      Tensor r = tx.defined() ? div(tx, y) : Tensor();
      return t[1].defined() ? plus(r, neg(div(mul(t[1], x), mul(y, y)))) : r;
    }
    case OpKind::Pow: {
      const Tensor& e = in[1];
      Tensor r;
      if (tx.defined()) r = where(eq(e, 0), 0.0, mul(tx, mul(e, pow(x, sub(e, 1)))));
      if (t[1].defined()) r = plus(r, where(logical_and(eq(x, 0), ge(e, 0)), 0.0, mul(t[1], mul(out, log(x)))));
      return r;
    }
    case OpKind::Maximum:
    case OpKind::Minimum: {
      // PyTorch: ties take the mean of both tangents; otherwise the winner's (y's where unordered).
      const Tensor& y = in[1];
      Tensor tx0 = or_zeros(tx, x), ty0 = or_zeros(t[1], y);
      Tensor x_wins = op == OpKind::Maximum ? gt(x, y) : lt(x, y);
      return where(eq(x, y), mul(add(tx0, ty0), 0.5), where(x_wins, tx0, ty0));
    }
    case OpKind::Atan2: {
      const Tensor& y = in[1];
      Tensor den = add(mul(x, x), mul(y, y));
      den = where(eq(den, 0), 1.0, den);
      Tensor num = plus(tx.defined() ? mul(tx, y) : Tensor(), t[1].defined() ? neg(mul(t[1], x)) : Tensor());
      return div(num, den);
    }
    case OpKind::Remainder:
      return t[1].defined() ? plus(tx, neg(mul(t[1], floor(div(x, in[1]))))) : tx;
    case OpKind::Fmod: {
      if (!t[1].defined()) return tx;
      Tensor q = div(x, in[1]);
      Tensor trunc = where(lt(q, 0), ceil(q), floor(q));
      return plus(tx, neg(mul(t[1], trunc)));
    }
    case OpKind::Where:
      return where(x, t[1].defined() ? t[1] : zeros_like(in[1]), t[2].defined() ? t[2] : zeros_like(in[2]));
    // ---- reductions ----
    case OpKind::Sum: return reduce_like(tx, a.ints, out);
    case OpKind::Prod: return reduce_like(mul(tx, prod_partials(x, out, a.ints)), a.ints, out);
    case OpKind::Amax:
    case OpKind::Amin: return reduce_like(mul(tx, extremum_partials(x, out, a.ints)), a.ints, out);
    case OpKind::Cumsum: return cumsum(tx, a.ints[0]);
    // ---- copies ----
    case OpKind::Cat: {
      std::vector<Tensor> parts;
      for (size_t i = 0; i < in.size(); ++i) parts.push_back(t[i].defined() ? t[i] : zeros_like(in[i], out.dtype()));
      return record(OpKind::Cat, parts, a, out.dtype(), out.shape());
    }
    case OpKind::ViewScatter:
      return record(OpKind::ViewScatter, {contiguous(or_zeros(tx, x)), or_zeros(t[1], in[1])}, a, out.dtype(),
                    out.shape());
    // ---- indexing (the index input has no tangent) ----
    case OpKind::Gather: return gather(tx, a.ints[0], in[1]);
    case OpKind::Scatter: return scatter(or_zeros(tx, x), a.ints[0], in[1], or_zeros(t[2], in[2]));
    case OpKind::ScatterAdd: return scatter_add(or_zeros(tx, x), a.ints[0], in[1], or_zeros(t[2], in[2]));
    case OpKind::IndexSelect: return index_select(tx, a.ints[0], in[1]);
    case OpKind::IndexAdd: return index_add(or_zeros(tx, x), a.ints[0], in[1], or_zeros(t[2], in[2]));
    // ---- linear algebra ----
    case OpKind::Matmul:
      return plus(tx.defined() ? matmul(tx, in[1]) : Tensor(), t[1].defined() ? matmul(x, t[1]) : Tensor());
    case OpKind::Im2Col: return record(OpKind::Im2Col, {tx}, a, out.dtype(), out.shape());
    case OpKind::Col2Im: return record(OpKind::Col2Im, {tx}, a, out.dtype(), out.shape());
    case OpKind::Attention: return attention_tangent(a, in, t, out);
    default:
      throw Error(cat("jvp: forward-mode AD through ", op_name(op), " is not supported (it has no jvp rule)"));
  }
}

}  // namespace kiln::detail
