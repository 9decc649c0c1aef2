// One VJP rule per differentiable primitive, written with ordinary ops so the gradient graph
// is itself differentiable (double backward) and lazy.
#include "runtime/autograd/autograd_rules.h"
#include "runtime/autograd/gradient_sum.h"

#include <cmath>
#include <numeric>

#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln::detail {

bool is_differentiable(OpKind op) {
  switch (op) {
    case OpKind::Leaf:
    case OpKind::Full:
    case OpKind::Arange:
    case OpKind::RandUniform:
    case OpKind::RandNormal:
    case OpKind::RandInt:
    case OpKind::IsNan:
    case OpKind::IsFinite:
    case OpKind::LogicalNot:
    case OpKind::BitwiseNot:
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge:
    case OpKind::LogicalAnd:
    case OpKind::LogicalOr:
    case OpKind::LogicalXor:
    case OpKind::BitwiseAnd:
    case OpKind::BitwiseOr:
    case OpKind::BitwiseXor:
    case OpKind::ArgMax:
    case OpKind::ArgMin: return false;
    default: return true;
  }
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  const Shape& gs = g.shape();
  if (identical_shape(gs, shape)) return g;
  std::vector<int64_t> dims;
  size_t lead = gs.size() - shape.size();
  for (size_t i = 0; i < gs.size(); ++i) {
    if (i < lead) {
      dims.push_back(static_cast<int64_t>(i));
      continue;
    }
    if (is_one(shape[i - lead])) {  // summed, whatever gs[i] is: nothing to ask
      if (!is_one(gs[i])) dims.push_back(static_cast<int64_t>(i));
      continue;
    }
    auto same = sym_eq(shape[i - lead], gs[i]);  // before asking about 1 (could specialize a size)
    if (same && *same) continue;
    auto one = sym_eq(shape[i - lead], 1);
    if (one && *one) dims.push_back(static_cast<int64_t>(i));
  }
  Tensor r = dims.empty() ? g : sum(g, dims, true);
  return reshape_to(r, shape);
}

namespace {
Tensor zeros_of(const Tensor& like) { return zeros_like(like); }

// Scatters g into a zero tensor of `x`'s shape through the view step `s`.
Tensor into_zeros(const Tensor& x, const ViewStep& s, const Tensor& g) {
  Tensor z = contiguous(zeros_of(x));
  Tensor win = make_view(z, s);
  win.assign_(g);
  return z;
}

Tensor inverse_view(OpKind op, const Attrs& a, const Tensor& x, const Tensor& g) {
  switch (op) {
    case OpKind::View: return reshape_to(g, x.shape());
    case OpKind::Permute: {
      std::vector<int64_t> inv(a.ints.size());
      for (size_t i = 0; i < a.ints.size(); ++i) inv[a.ints[i]] = static_cast<int64_t>(i);
      return permute(g, inv);
    }
    case OpKind::Expand: return sum_to(g, x.shape());
    case OpKind::Squeeze: return unsqueeze(g, a.ints[0]);
    case OpKind::Unsqueeze: return squeeze(g, a.ints[0]);
    case OpKind::Flip: return flip(g, a.ints);
    case OpKind::Slice:
    case OpKind::Select:
    case OpKind::AsStrided: {
      ViewStep s{op, a, a.sizes};
      return into_zeros(x, s, g);
    }
    default: throw Error(cat("vjp: ", op_name(op), " is not a view"));
  }
}

// The grad_out input of AttentionBackward from the gradient g of Attention's packed output
// [..., Tq, W]. Where only the output rows were used (scaled_dot_product_attention), g is their
// gradient scattered into zeros: the scatter's source is dO itself, and the log-sum-exp has no
// gradient (not materialized: W columns of zeros and a copy). 16-bit packed outputs: dO alone
// (their log-sum-exp pieces carry no gradient). Else the whole packed gradient.
Tensor attention_grad_out(const Tensor& g, const SymInt& d) {
  const int64_t r = g.dim();
  if (std::optional<Tensor> dout = leading_window_source(g, r - 1, d)) return *dout;
  return is_half(g.dtype()) ? slice_window(g, r - 1, 0, d, 1) : g;
}

}  // namespace

Tensor expand_reduced(const Tensor& g, const Tensor& x, const std::vector<int64_t>& dims) {
  // g has the reduced shape (keepdim or not); bring it back to x's rank, then broadcast.
  Tensor r = g;
  if (g.dim() != x.dim())
    for (int64_t d : dims) r = unsqueeze(r, d);
  return expand_to(r, x.shape());
}

Tensor prod_partials(const Tensor& x, const Tensor& out, const std::vector<int64_t>& dims) {
  // out / x, except where x is 0: there the product of the others if it is the only zero, else 0.
  Tensor outx = expand_reduced(out, x, dims);
  Tensor is_zero = eq(x, 0);
  Tensor nz = where(is_zero, ones_like(x), x);
  Tensor prod_nz = expand_reduced(prod(nz, dims, true), x, dims);
  Tensor zeros_cnt = expand_reduced(sum(is_zero, dims, true), x, dims);
  Tensor at_zero = where(eq(zeros_cnt, 1), prod_nz, zeros_like(x));
  return where(is_zero, at_zero, div(outx, nz));
}

Tensor extremum_partials(const Tensor& x, const Tensor& out, const std::vector<int64_t>& dims) {
  // PyTorch: ties share evenly.
  Tensor outx = expand_reduced(out, x, dims);
  Tensor mask = to(eq(x, outx), x.dtype());
  Tensor cnt = expand_reduced(sum(mask, dims, true), x, dims);
  return div(mask, cnt);
}

std::vector<Tensor> vjp(OpKind op, const Attrs& a, const std::vector<Tensor>& in, const Tensor& out, const Tensor& g,
                        const Shape& view_shape) {
  const Tensor& x = in[0];
  auto st = [&](const Tensor& t, size_t i) { return sum_to(t, in[i].shape()); };
  const double ln2 = std::log(2.0);
  switch (op) {
    // ---- unary ----
    case OpKind::Neg: return {neg(g)};
    case OpKind::Abs: return {mul(g, sign(x))};
    case OpKind::Exp: return {mul(g, out)};
    case OpKind::Exp2: return {mul(g, mul(out, ln2))};
    case OpKind::Expm1: return {mul(g, add(out, 1))};
    case OpKind::Log: return {div(g, x)};
    case OpKind::Log2: return {div(g, mul(x, ln2))};
    case OpKind::Log1p: return {div(g, add(x, 1))};
    case OpKind::Sqrt: return {div(g, mul(out, 2))};
    case OpKind::Rsqrt: return {mul(g, mul(pow(out, 3), -0.5))};
    case OpKind::Reciprocal: return {neg(mul(g, mul(out, out)))};
    case OpKind::Sin: return {mul(g, cos(x))};
    case OpKind::Cos: return {neg(mul(g, sin(x)))};
    case OpKind::Tan: return {mul(g, add(mul(out, out), 1))};
    case OpKind::Atan: return {div(g, add(mul(x, x), 1))};
    case OpKind::Tanh: return {mul(g, sub(1, mul(out, out)))};
    case OpKind::Sigmoid: return {mul(g, mul(out, sub(1, out)))};
    case OpKind::Relu: return {where(gt(out, 0), g, 0)};
    case OpKind::Erf: return {mul(g, mul(exp(neg(mul(x, x))), 2.0 / std::sqrt(M_PI)))};
    case OpKind::Floor:
    case OpKind::Ceil:
    case OpKind::Round:
    case OpKind::Sign: return {zeros_of(x)};
    case OpKind::ToDevice: return {to(g, x.device())};
    case OpKind::Cast:
    case OpKind::Contiguous: return {is_floating(x.dtype()) ? cast(g, x.dtype()) : Tensor()};
    // ---- binary ----
    case OpKind::Add: return {st(g, 0), st(g, 1)};
    case OpKind::Sub: return {st(g, 0), st(neg(g), 1)};
    case OpKind::Mul: return {st(mul(g, in[1]), 0), st(mul(g, x), 1)};
    case OpKind::Div: return {st(div(g, in[1]), 0), st(neg(div(mul(g, x), mul(in[1], in[1]))), 1)};
    case OpKind::Pow: {
      const Tensor& e = in[1];
      Tensor gx = where(eq(e, 0), 0.0, mul(g, mul(e, pow(x, sub(e, 1)))));
      Tensor gexp = where(logical_and(eq(x, 0), ge(e, 0)), 0.0, mul(g, mul(out, log(x))));
      return {st(gx, 0), st(gexp, 1)};
    }
    case OpKind::Maximum:
    case OpKind::Minimum: {
      // PyTorch: ties split the gradient in half; an operand gets nothing only where it strictly
      // loses, so where either is NaN (no order) both get the whole gradient.
      const Tensor& y = in[1];
      Tensor x_loses = op == OpKind::Maximum ? lt(x, y) : gt(x, y);
      Tensor y_loses = op == OpKind::Maximum ? gt(x, y) : lt(x, y);
      Tensor share = where(eq(x, y), mul(g, 0.5), g);
      return {st(where(x_loses, 0.0, share), 0), st(where(y_loses, 0.0, share), 1)};
    }
    case OpKind::Atan2: {
      // PyTorch: 0 (and -0) at (0, 0), where the formula is 0/0.
      const Tensor& y = in[1];
      Tensor den = add(mul(x, x), mul(y, y));
      den = where(eq(den, 0), 1.0, den);
      return {st(div(mul(g, y), den), 0), st(neg(div(mul(g, x), den)), 1)};
    }
    case OpKind::Remainder: return {st(g, 0), st(neg(mul(g, floor(div(x, in[1])))), 1)};
    case OpKind::Fmod: {
      Tensor q = div(x, in[1]);
      Tensor trunc = where(lt(q, 0), ceil(q), floor(q));
      return {st(g, 0), st(neg(mul(g, trunc)), 1)};
    }
    case OpKind::Where: return {Tensor(), sum_to(where(x, g, 0), in[1].shape()), sum_to(where(x, 0, g), in[2].shape())};
    // ---- reductions ----
    case OpKind::Sum: return {expand_reduced(g, x, a.ints)};
    case OpKind::Prod: return {mul(expand_reduced(g, x, a.ints), prod_partials(x, out, a.ints))};
    case OpKind::Amax:
    case OpKind::Amin: return {mul(expand_reduced(g, x, a.ints), extremum_partials(x, out, a.ints))};
    case OpKind::Cumsum: {
      int64_t d = a.ints[0];
      return {flip(cumsum(flip(g, {d}), d), {d})};
    }
    // ---- views ----
    case OpKind::View:
    case OpKind::Permute:
    case OpKind::Expand:
    case OpKind::Slice:
    case OpKind::Select:
    case OpKind::Squeeze:
    case OpKind::Unsqueeze:
    case OpKind::Flip:
    case OpKind::AsStrided: return {inverse_view(op, a, x, g)};
    // ---- copies ----
    case OpKind::Cat: {
      std::vector<Tensor> r;
      int64_t d = a.ints[0];
      SymInt at = 0;
      for (const auto& t : in) {
        const SymInt& n = t.shape()[d];
        r.push_back(is_floating(t.dtype()) ? slice_window(g, d, at, at + n, 1) : Tensor());
        at = at + n;
      }
      return r;
    }
    case OpKind::ViewScatter: {
      // The window of the (dense) gradient goes to src; the rest, window zeroed, to base.
      ViewStep s{OpKind::AsStrided, a, a.sizes};
      Tensor gc = contiguous(g);
      Tensor gb = gc.clone();
      make_view(gb, s).fill_(0);
      return {gb, make_view(gc, s)};
    }
    // ---- indexing ----
    case OpKind::Gather: return {scatter_add(zeros_of(x), a.ints[0], in[1], g), Tensor()};
    case OpKind::Scatter: return {scatter(g, a.ints[0], in[1], 0), Tensor(), gather(g, a.ints[0], in[1])};
    case OpKind::ScatterAdd: return {g, Tensor(), gather(g, a.ints[0], in[1])};
    case OpKind::IndexSelect: return {index_add(zeros_of(x), a.ints[0], in[1], g), Tensor()};
    case OpKind::IndexAdd: return {g, Tensor(), index_select(g, a.ints[0], in[1])};
    // ---- linear algebra ----
    case OpKind::Matmul: {
      // A 2-D right operand laid out transposed (a Linear layer's w.t()): its gradient is the
      // transpose of gᵀ·x, so the gradient of w itself reads as a dense [n, k] product rather
      // than a strided view (an optimizer's update of w then reads it contiguously).
      const Tensor& b = in[1];
      const Shape& bs = b.shape();
      const auto& bst = b.node()->strides;
      const bool b_transposed =
          x.dim() == 2 && b.dim() == 2 && is_one(bst[0]) && !is_one(bs[1]) && provably_equal(bst[1], bs[0]);
      Tensor gb = b_transposed ? transpose(matmul(transpose(g, -2, -1), x), -2, -1) : matmul(transpose(x, -2, -1), g);
      return {matmul(g, transpose(b, -2, -1)), gb};
    }
    case OpKind::Im2Col: {
      Attrs c = a;
      c.sizes = x.shape();
      return {record(OpKind::Col2Im, {g}, c, g.dtype(), x.shape())};
    }
    case OpKind::Col2Im: {
      return {record(OpKind::Im2Col, {g}, a, g.dtype(), x.shape())};
    }
    // ---- fused attention: dq, dk, dv stacked by one node (the mask gets none: masks that need
    // a gradient are not fused) ----
    case OpKind::Attention: {
      const Shape& qs = x.shape();
      const int64_t r = static_cast<int64_t>(qs.size());
      const SymInt tq = qs[r - 2], tk = in[1].shape()[r - 2];
      Shape s = qs;
      s[r - 2] = tq + tk + tk;
      // (inputs after q, k, v: the mask, then the dropout mask's generator words; neither differentiable)
      std::vector<Tensor> bin = {in[0], in[1], in[2], out, attention_grad_out(g, qs.back())};
      for (size_t i = 3; i < in.size(); ++i) bin.push_back(in[i]);
      Tensor packed = record(OpKind::AttentionBackward, bin, a, x.dtype(), s);
      std::vector<Tensor> r3 = {slice_window(packed, r - 2, 0, tq, 1), slice_window(packed, r - 2, tq, tq + tk, 1),
                                slice_window(packed, r - 2, tq + tk, tq + tk + tk, 1)};
      r3.resize(in.size());
      return r3;
    }
    case OpKind::AttentionBackward:
      throw Error(
          "vjp: the fused attention's gradient has no gradient of its own (double backward through "
          "scaled_dot_product_attention is not supported)");
    default: throw Error(cat("vjp: no gradient rule for ", op_name(op)));
  }
}

}  // namespace kiln::detail
