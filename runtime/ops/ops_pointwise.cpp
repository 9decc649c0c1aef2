// Pointwise ops: type promotion, unary, binary, ternary, and the C++ operators.
#include <cmath>

#include "runtime/autograd/autograd.h"
#include "runtime/autograd/forward_ad.h"
#include "runtime/ops/autocast_policy.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln {
using detail::as_dtype;
using detail::cast;
using detail::record;
using detail::record_refs;

namespace {

// torch's combine_categories(higher, lower).
std::optional<DType> combine(std::optional<DType> higher, std::optional<DType> lower) {
  if (!higher) return lower;
  if (!lower) return higher;
  if (is_floating(*higher)) return higher;
  if (*higher == DType::Bool || is_floating(*lower)) return promote_types(*higher, *lower);
  return higher;
}

void promote_into(std::optional<DType>& acc, DType t) { acc = acc ? promote_types(*acc, t) : t; }
}  // namespace

namespace {
// Accumulates torch.result_type over tensors and scalars without temporary containers.
struct Promotion {
  std::optional<DType> dim_r, zero_r, wrapped_r;
  Promotion& add(const Tensor& t) {
    const Node& n = *t.node();
    promote_into(n.shape.empty() ? zero_r : dim_r, n.dtype);
    return *this;
  }
  Promotion& add(Scalar s) {
    promote_into(wrapped_r, s.default_dtype());
    return *this;
  }
  DType result() const {
    auto r = combine(dim_r, combine(zero_r, wrapped_r));
    return r ? *r : DType::Float32;
  }
};
}  // namespace

DType result_type(const std::vector<Tensor>& tensors, const std::vector<Scalar>& scalars) {
  Promotion p;
  for (const auto& t : tensors) p.add(t);
  for (const auto& s : scalars) p.add(s);
  return p.result();
}

namespace {
enum class UnaryKind { SameType, FloatOut, BoolOut, NoBool };

// The unary ops autocast runs in float32 on CUDA (PyTorch's list).
bool float32_on_cuda(OpKind op) {
  switch (op) {
    case OpKind::Exp:
    case OpKind::Expm1:
    case OpKind::Log:
    case OpKind::Log2:
    case OpKind::Log1p:
    case OpKind::Rsqrt:
    case OpKind::Reciprocal:
    case OpKind::Tan: return true;
    default: return false;
  }
}

Tensor unary(OpKind op, const Tensor& x_in, UnaryKind kind) {
  detail::AutocastOp autocast_op(
      float32_on_cuda(op) ? detail::AutocastPolicy::Float32OnCuda : detail::AutocastPolicy::Body, {&x_in});
  const Tensor& x = autocast_op[0];
  KILN_CHECK(x.defined(), op_name(op), ": got an undefined tensor");
  DType in = x.dtype();
  switch (kind) {
    case UnaryKind::FloatOut: {
      const DType out = is_floating(in) ? in : kFloat32;
      Tensor hold;
      return record_refs(op, {&as_dtype(x, out, hold)}, Attrs{}, out, x.shape());
    }
    case UnaryKind::BoolOut: return record_refs(op, {&x}, Attrs{}, kBool, x.shape());
    case UnaryKind::NoBool:
      KILN_CHECK(in != kBool, op_name(op), ": not supported for bool tensors (expected a numeric dtype, got bool)");
      [[fallthrough]];
    case UnaryKind::SameType: return record_refs(op, {&x}, Attrs{}, in, x.shape());
  }
  return x;
}
}  // namespace

#define KILN_UNARY(name, op, kind) \
  Tensor name(const Tensor& x) { return unary(OpKind::op, x, UnaryKind::kind); }
KILN_UNARY(neg, Neg, NoBool)
KILN_UNARY(abs, Abs, NoBool)
KILN_UNARY(exp, Exp, FloatOut)
KILN_UNARY(exp2, Exp2, FloatOut)
KILN_UNARY(expm1, Expm1, FloatOut)
KILN_UNARY(log, Log, FloatOut)
KILN_UNARY(log2, Log2, FloatOut)
KILN_UNARY(log1p, Log1p, FloatOut)
KILN_UNARY(sqrt, Sqrt, FloatOut)
KILN_UNARY(rsqrt, Rsqrt, FloatOut)
KILN_UNARY(reciprocal, Reciprocal, FloatOut)
KILN_UNARY(sin, Sin, FloatOut)
KILN_UNARY(cos, Cos, FloatOut)
KILN_UNARY(tan, Tan, FloatOut)
KILN_UNARY(atan, Atan, FloatOut)
KILN_UNARY(tanh, Tanh, FloatOut)
KILN_UNARY(sigmoid, Sigmoid, FloatOut)
KILN_UNARY(relu, Relu, NoBool)
KILN_UNARY(erf, Erf, FloatOut)
KILN_UNARY(floor, Floor, NoBool)
KILN_UNARY(ceil, Ceil, NoBool)
KILN_UNARY(round, Round, NoBool)
KILN_UNARY(sign, Sign, SameType)
KILN_UNARY(isnan, IsNan, BoolOut)
KILN_UNARY(isfinite, IsFinite, BoolOut)
KILN_UNARY(logical_not, LogicalNot, BoolOut)
#undef KILN_UNARY

Tensor bitwise_not(const Tensor& x) {
  KILN_CHECK(!is_floating(x.dtype()), "bitwise_not: expected an integer or bool tensor, got ", dtype_name(x.dtype()));
  return record(OpKind::BitwiseNot, {x}, Attrs{}, x.dtype(), x.shape());
}

Tensor square(const Tensor& x) { return mul(x, x); }

// One backward node that keeps only x (PyTorch's SiluBackward: s (1 + x (1 - s)), s = sigmoid x);
// recorded primitive by primitive it kept x and sigmoid(x).
Tensor silu(const Tensor& x_in) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Body, {&x_in});
  const Tensor& x = autocast_op[0];
  Tensor f = is_floating(x.dtype()) ? x : cast(x, kFloat32);
  return detail::with_custom_grad(
      "silu", {f}, [&] { return mul(f, sigmoid(f)); },
      [f](const Tensor& g, bool) {
        Tensor s = sigmoid(f);
        return std::vector<Tensor>{mul(g, mul(s, add(mul(f, sub(1.0, s)), 1.0)))};
      });
}

Tensor softplus(const Tensor& x_in, double beta, double threshold) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Float32OnCuda, {&x_in});
  const Tensor& x = autocast_op[0];
  Tensor f = is_floating(x.dtype()) ? x : cast(x, kFloat32);
  // Stable form max(z, 0) + log1p(exp(-|z|)) with z = beta*x; linear above the threshold. The
  // max and -|z| are spelled as selections between smooth pieces (z > 0: z and -z, else 0 and
  // z), so every derivative is that of log1p(exp(z)) at z = 0 too: the gradient sigmoid(0) = 1/2
  // and the second derivative 1/4 (max and abs rules would give 1/2 by splitting a tie and 0).
  Tensor z = beta == 1 ? f : mul(f, beta);
  Tensor pos = gt(z, 0.0);
  Tensor soft = add(where(pos, z, 0.0), log1p(exp(where(pos, neg(z), z))));
  if (beta != 1) soft = div(soft, beta);
  return where(gt(z, threshold), f, soft);
}

namespace {
constexpr double kGeluTanhK = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluTanhC = 0.044715;

Tensor gelu_value(const Tensor& f, bool exact) {
  if (exact) return mul(mul(f, 0.5), add(erf(mul(f, M_SQRT1_2)), 1.0));
  Tensor inner = mul(add(f, mul(mul(mul(f, f), f), kGeluTanhC)), kGeluTanhK);
  return mul(mul(f, 0.5), add(tanh(inner), 1.0));
}

// d gelu / dx, as PyTorch's GeluBackward: exact 0.5 (1 + erf(x / sqrt 2)) + x phi(x); tanh form
// 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2), t = tanh(k (x + c x^3)).
Tensor gelu_derivative(const Tensor& f, bool exact) {
  if (exact)
    return add(mul(add(erf(mul(f, M_SQRT1_2)), 1.0), 0.5), mul(f, mul(exp(mul(mul(f, f), -0.5)), 0.3989422804014327)));
  Tensor t = tanh(mul(add(f, mul(mul(mul(f, f), f), kGeluTanhC)), kGeluTanhK));
  Tensor dinner = mul(add(mul(mul(f, f), 3 * kGeluTanhC), 1.0), kGeluTanhK);
  return add(mul(add(t, 1.0), 0.5), mul(mul(mul(f, 0.5), sub(1.0, mul(t, t))), dinner));
}
}  // namespace

// One backward node that keeps only x (PyTorch's GeluBackward): recorded primitive by primitive,
// every intermediate of the formula ([B, T, 4d] five times in a transformer's MLP) was kept for
// the backward. 16-bit inputs compute in float32 and round once, value and gradient, as
// PyTorch's kernels do (its opmath type), not after each op of the formula.
Tensor gelu(const Tensor& x_in, const std::string& approximate) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Body, {&x_in});
  const Tensor& x = autocast_op[0];
  Tensor f = is_floating(x.dtype()) ? x : cast(x, kFloat32);
  KILN_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be 'none' or 'tanh', got '",
             approximate, "'");
  const bool exact = approximate == "none";
  const DType dt = f.dtype(), op = is_half(dt) ? kFloat32 : dt;
  return detail::with_custom_grad(
      "gelu", {f}, [&] { return cast(gelu_value(cast(f, op), exact), dt); },
      [f, exact, dt, op](const Tensor& g, bool) {
        return std::vector<Tensor>{cast(mul(cast(g, op), gelu_derivative(cast(f, op), exact)), dt)};
      });
}

Tensor to(const Tensor& x, DType dtype) {
  KILN_CHECK(x.defined(), "to: got an undefined tensor");
  return cast(x, dtype);
}

Tensor to(const Tensor& x, Device device) {
  KILN_CHECK(x.defined(), "to: got an undefined tensor");
  if (x.device() == device) return x;
  Tensor c = x.contiguous();
  Attrs a;
  a.ints = {static_cast<int64_t>(device.type), device.index};
  return detail::record(OpKind::ToDevice, {c}, std::move(a), c.dtype(), c.shape());
}

// ---------- binary ----------
namespace {
enum class BinKind { Arith, TrueDiv, FloatOut, Compare, Logical, Bitwise, IntOk };

Tensor binary(OpKind op, const Tensor& a, const Tensor& b, DType compute, BinKind kind) {
  Shape out = detail::broadcast_shapes(a.shape(), b.shape(), op_name(op));
  DType res = compute;
  switch (kind) {
    case BinKind::TrueDiv:
    case BinKind::FloatOut:
      if (!is_floating(compute)) compute = res = kFloat32;
      break;
    case BinKind::Compare: res = kBool; break;
    case BinKind::Logical: res = kBool; break;
    case BinKind::Bitwise:
      KILN_CHECK(!is_floating(compute), op_name(op), ": expected integer or bool tensors, got ", dtype_name(a.dtype()),
                 " and ", dtype_name(b.dtype()));
      break;
    case BinKind::Arith:
      KILN_CHECK(!(compute == kBool && op == OpKind::Sub), "sub: subtraction of two bool tensors is not supported");
      break;
    case BinKind::IntOk: break;
  }
  Tensor ha, hb;
  return record_refs(op, {&as_dtype(a, compute, ha), &as_dtype(b, compute, hb)}, Attrs{}, res, std::move(out));
}

// PyTorch refuses subtraction when either operand (tensor or number) is bool.
void check_sub(OpKind op, bool a_bool, bool b_bool) {
  KILN_CHECK(op != OpKind::Sub || !(a_bool || b_bool), "sub: subtraction with a bool tensor is not supported; ",
             "use logical_not() or ~ to invert a mask");
}

// pow runs in float32 on CUDA under autocast (PyTorch's list); the other binary ops cast nothing.
detail::AutocastPolicy binary_policy(OpKind op) {
  return op == OpKind::Pow ? detail::AutocastPolicy::Float32OnCuda : detail::AutocastPolicy::Body;
}

Tensor binary_tt(OpKind op, const Tensor& a_in, const Tensor& b_in, BinKind kind) {
  detail::AutocastOp autocast_op(binary_policy(op), {&a_in, &b_in});
  const Tensor &a = autocast_op[0], &b = autocast_op[1];
  KILN_CHECK(a.defined() && b.defined(), op_name(op), ": got an undefined tensor");
  check_sub(op, a.dtype() == kBool, b.dtype() == kBool);
  return binary(op, a, b, Promotion().add(a).add(b).result(), kind);
}
Tensor binary_ts(OpKind op, const Tensor& a_in, Scalar b, BinKind kind) {
  detail::AutocastOp autocast_op(binary_policy(op), {&a_in});
  const Tensor& a = autocast_op[0];
  KILN_CHECK(a.defined(), op_name(op), ": got an undefined tensor");
  check_sub(op, a.dtype() == kBool, b.kind() == Scalar::Kind::Bool);
  DType t = Promotion().add(a).add(b).result();
  return binary(op, a, detail::scalar_operand(b, t, a.device()), t, kind);
}
Tensor binary_st(OpKind op, Scalar a, const Tensor& b_in, BinKind kind) {
  detail::AutocastOp autocast_op(binary_policy(op), {&b_in});
  const Tensor& b = autocast_op[0];
  KILN_CHECK(b.defined(), op_name(op), ": got an undefined tensor");
  check_sub(op, a.kind() == Scalar::Kind::Bool, b.dtype() == kBool);
  DType t = Promotion().add(b).add(a).result();
  return binary(op, detail::scalar_operand(a, t, b.device()), b, t, kind);
}
}  // namespace

#define KILN_BINARY(name, op, kind)                                                                    \
  Tensor name(const Tensor& a, const Tensor& b) { return binary_tt(OpKind::op, a, b, BinKind::kind); } \
  Tensor name(const Tensor& a, Scalar b) { return binary_ts(OpKind::op, a, b, BinKind::kind); }        \
  Tensor name(Scalar a, const Tensor& b) { return binary_st(OpKind::op, a, b, BinKind::kind); }
KILN_BINARY(add, Add, Arith)
KILN_BINARY(sub, Sub, Arith)
KILN_BINARY(mul, Mul, Arith)
KILN_BINARY(div, Div, TrueDiv)
KILN_BINARY(pow, Pow, IntOk)
KILN_BINARY(maximum, Maximum, Arith)
KILN_BINARY(minimum, Minimum, Arith)
KILN_BINARY(atan2, Atan2, FloatOut)
KILN_BINARY(remainder, Remainder, IntOk)
KILN_BINARY(fmod, Fmod, IntOk)
KILN_BINARY(eq, Eq, Compare)
KILN_BINARY(ne, Ne, Compare)
KILN_BINARY(lt, Lt, Compare)
KILN_BINARY(le, Le, Compare)
KILN_BINARY(gt, Gt, Compare)
KILN_BINARY(ge, Ge, Compare)
KILN_BINARY(logical_and, LogicalAnd, Logical)
KILN_BINARY(logical_or, LogicalOr, Logical)
KILN_BINARY(logical_xor, LogicalXor, Logical)
KILN_BINARY(bitwise_and, BitwiseAnd, Bitwise)
KILN_BINARY(bitwise_or, BitwiseOr, Bitwise)
KILN_BINARY(bitwise_xor, BitwiseXor, Bitwise)
#undef KILN_BINARY

namespace {
// alpha * b in the result type of (a, b): alpha takes no part in type promotion (PyTorch).
Tensor scaled_by_alpha(const Tensor& a, const Tensor& b, Scalar alpha, const char* op) {
  KILN_CHECK(a.defined() && b.defined(), op, ": got an undefined tensor");
  DType t = result_type({a, b});
  KILN_CHECK(alpha.kind() != Scalar::Kind::Bool || t == kBool, op,
             ": boolean alpha only supported for boolean results");
  KILN_CHECK(is_floating(t) || alpha.kind() != Scalar::Kind::Float, op,
             ": for integral input tensors, argument alpha must not be a floating point number");
  return cast(mul(cast(b, t), alpha), t);
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (alpha.kind() == Scalar::Kind::Int && alpha.to_int() == 1) return add(a, b);
  return add(a, scaled_by_alpha(a, b, alpha, "add"));
}
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (alpha.kind() == Scalar::Kind::Int && alpha.to_int() == 1) return sub(a, b);
  check_sub(OpKind::Sub, a.dtype() == kBool, b.dtype() == kBool);
  return sub(a, scaled_by_alpha(a, b, alpha, "sub"));
}

// ---------- ternary ----------
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  KILN_CHECK(cond.defined() && a.defined() && b.defined(), "where: got an undefined tensor");
  KILN_CHECK(cond.dtype() == kBool, "where: expected condition to be a bool tensor, got ", dtype_name(cond.dtype()));
  Shape out = detail::broadcast_shapes(detail::broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  DType t = result_type({a, b});
  return record(OpKind::Where, {cond, cast(a, t), cast(b, t)}, Attrs{}, t, std::move(out));
}
Tensor where(const Tensor& c, const Tensor& a, Scalar b) {
  DType t = result_type({a}, {b});
  return where(c, a, detail::scalar_operand(b, t, a.device()));
}
Tensor where(const Tensor& c, Scalar a, const Tensor& b) {
  DType t = result_type({b}, {a});
  return where(c, detail::scalar_operand(a, t, b.device()), b);
}
Tensor where(const Tensor& c, Scalar a, Scalar b) {
  DType t = result_type({}, {a, b});
  return where(c, detail::scalar_operand(a, t, c.device()), detail::scalar_operand(b, t, c.device()));
}

// clamp's values come from maximum/minimum, but its gradients follow PyTorch's clamp_backward
// (and clamp_backward_min_max), not those of maximum/minimum, which would split ties at a
// boundary in half: x gets the gradient where min <= x <= max (boundaries included), min where
// x < min < max, max where x > max or max < min. When a gradient is wanted the (detached) values
// are rebuilt with where() so that each gradient reaches the right operand.
Tensor clamp(const Tensor& x, std::optional<Scalar> mn, std::optional<Scalar> mx) {
  KILN_CHECK(mn || mx, "clamp: at least one of 'min' or 'max' must not be None");
  // torch.clamp: min first, then max (so min > max gives max); NaN propagates.
  Tensor r = x;
  if (mn) r = maximum(r, *mn);
  if (mx) r = minimum(r, *mx);
  if (!detail::wants_derivative(x)) return r;
  Tensor in_range;
  if (mn) in_range = ge(x, *mn);
  if (mx) in_range = in_range.defined() ? logical_and(in_range, le(x, *mx)) : le(x, *mx);
  return where(in_range, x, r.detach());
}
Tensor clamp(const Tensor& x, const std::optional<Tensor>& mn, const std::optional<Tensor>& mx) {
  KILN_CHECK(mn || mx, "clamp: at least one of 'min' or 'max' must not be None");
  Tensor r = x;
  if (mn) r = maximum(r, *mn);
  if (mx) r = minimum(r, *mx);
  const bool wants_grad = detail::wants_derivative(x) || (mn && detail::wants_derivative(*mn)) ||
                          (mx && detail::wants_derivative(*mx));
  if (!wants_grad) return r;
  Tensor v = r.detach();
  Tensor in_range;
  if (mn) in_range = ge(x, *mn);
  if (mx) in_range = in_range.defined() ? logical_and(in_range, le(x, *mx)) : le(x, *mx);
  Tensor out = where(in_range, x, v);
  if (mn) {
    Tensor below = lt(x, *mn);
    if (mx) below = logical_and(below, lt(*mn, *mx));
    out = where(below, *mn, out);  // the value there is min
  }
  if (mx) {
    Tensor above = gt(x, *mx);
    if (mn) above = logical_or(above, lt(*mx, *mn));
    // The value there is max, unless a NaN (in x or min) made it NaN: max + NaN keeps both.
    out = where(above, where(isnan(v), add(*mx, v), *mx), out);
  }
  return out;
}

Tensor lerp(const Tensor& a, const Tensor& b, Scalar w) { return add(a, mul(sub(b, a), w)); }
Tensor lerp(const Tensor& a, const Tensor& b, const Tensor& w) { return add(a, mul(sub(b, a), w)); }

Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value) {
  KILN_CHECK(mask.defined() && mask.dtype() == kBool, "masked_fill: expected a bool mask, got ",
             mask.defined() ? dtype_name(mask.dtype()) : "undefined");
  detail::broadcast_shapes(mask.shape(), x.shape(), "masked_fill");  // result: the broadcast shape
  detail::check_fill_value(value, x.dtype(), "masked_fill");
  return where(mask, detail::scalar_operand(value, x.dtype(), x.device()), x);
}
Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value) {
  KILN_CHECK(mask.defined() && mask.dtype() == kBool, "masked_fill: expected a bool mask");
  KILN_CHECK(value.dim() == 0, "masked_fill: expected a 0-dim value tensor, got shape ", detail::str(value.shape()));
  detail::broadcast_shapes(mask.shape(), x.shape(), "masked_fill");  // result: the broadcast shape
  return where(mask, cast(value, x.dtype()), x);
}

// ---------- operators ----------
#define KILN_OPERATOR(sym, fn)                                               \
  Tensor operator sym(const Tensor& a, const Tensor& b) { return fn(a, b); } \
  Tensor operator sym(const Tensor& a, Scalar b) { return fn(a, b); }        \
  Tensor operator sym(Scalar a, const Tensor& b) { return fn(a, b); }
KILN_OPERATOR(+, add)
KILN_OPERATOR(-, sub)
KILN_OPERATOR(*, mul)
KILN_OPERATOR(/, div)
KILN_OPERATOR(==, eq)
KILN_OPERATOR(!=, ne)
KILN_OPERATOR(<, lt)
KILN_OPERATOR(<=, le)
KILN_OPERATOR(>, gt)
KILN_OPERATOR(>=, ge)
KILN_OPERATOR(&, bitwise_and)
KILN_OPERATOR(|, bitwise_or)
KILN_OPERATOR(^, bitwise_xor)
#undef KILN_OPERATOR
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator!(const Tensor& a) { return logical_not(a); }
Tensor operator~(const Tensor& a) { return bitwise_not(a); }

}  // namespace kiln
