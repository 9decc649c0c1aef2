// Linear algebra: matmul and friends, recorded as batched GEMM nodes (run on OpenBLAS).
#include "runtime/ops/autocast_policy.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln {
using detail::record;
using detail::str;

namespace {
Tensor gemm(const Tensor& a, const Tensor& b) {  // a [..., M, K], b [..., K, N], same batch
  Shape out(a.shape().begin(), a.shape().end() - 1);
  out.push_back(b.shape().back());
  return record(OpKind::Matmul, {a, b}, Attrs{}, a.dtype(), out);
}

void check_mm(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.defined() && b.defined(), op, ": got an undefined tensor");
  KILN_CHECK(a.dim() >= 1 && b.dim() >= 1, op, ": both arguments need at least 1 dimension, got ", a.dim(), "-d and ",
             b.dim(), "-d");
  KILN_CHECK(a.dtype() == b.dtype(), op, ": expected both operands to have the same dtype, got ", dtype_name(a.dtype()),
             " and ", dtype_name(b.dtype()));
  KILN_CHECK(a.dtype() != kBool, op, ": expected numeric operands, got bool");
}

// [..., M, K] x [K, N] with a dense left operand: one [prod(...)·M, K] x [K, N] product viewed
// back, as PyTorch's matmul folds it. One GEMM instead of a batch against an expanded right
// operand, and the right operand's gradient becomes one [K, rows] x [rows, N] product rather
// than a batch of products summed over the batch.
bool folds_into_one_gemm(const Tensor& a, const Tensor& b) {
  return a.dim() > 2 && b.dim() == 2 && is_contiguous_layout(a.node()->shape, a.node()->strides);
}

Tensor folded_gemm(const Tensor& a, const Tensor& b) {
  const Shape& as = a.shape();
  Shape out(as.begin(), as.end() - 1);
  out.push_back(b.shape().back());
  Tensor rows = a.view_symint({numel(Shape(as.begin(), as.end() - 1)), as.back()});
  return gemm(rows, b).view_symint(out);
}
}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Lower, {&a_in, &b_in});
  const Tensor& a = autocast_op[0];
  const Tensor& b = autocast_op[1];
  check_mm(a, b, "matmul");
  const SymInt& k1 = a.shape().back();
  const SymInt& k2 = b.dim() == 1 ? b.shape()[0] : b.shape()[b.dim() - 2];
  auto same = sym_eq(k1, k2);
  KILN_CHECK(same && *same, "matmul: shapes ", str(a.shape()), " and ", str(b.shape()),
             " cannot be multiplied (inner sizes ", k1.str(), " and ", k2.str(), " differ)");
  if (a.dim() == 1 && b.dim() == 1) return reshape(gemm(unsqueeze(a, 0), unsqueeze(b, 1)), {});
  Tensor A = a.dim() == 1 ? unsqueeze(a, 0) : a;
  Tensor B = b.dim() == 1 ? unsqueeze(b, 1) : b;
  if (folds_into_one_gemm(A, B)) {
    Tensor r = folded_gemm(A, B);
    return b.dim() == 1 ? squeeze(r, -1) : r;
  }
  Shape ba(A.shape().begin(), A.shape().end() - 2), bb(B.shape().begin(), B.shape().end() - 2);
  Shape batch = detail::broadcast_shapes(ba, bb, "matmul");
  auto with_batch = [&](const Tensor& t) {
    Shape s = batch;
    s.push_back(t.shape()[t.dim() - 2]);
    s.push_back(t.shape()[t.dim() - 1]);
    return detail::expand_to(t, s);
  };
  Tensor r = gemm(with_batch(A), with_batch(B));
  if (a.dim() == 1) r = squeeze(r, -2);
  if (b.dim() == 1) r = squeeze(r, -1);
  return r;
}

Tensor mm(const Tensor& a_in, const Tensor& b_in) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Lower, {&a_in, &b_in});
  const Tensor& a = autocast_op[0];
  const Tensor& b = autocast_op[1];
  check_mm(a, b, "mm");
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D tensors, got ", a.dim(), "-d and ", b.dim(), "-d");
  KILN_CHECK(detail::same_size(a.shape()[1], b.shape()[0]), "mm: mat1 and mat2 shapes cannot be multiplied (",
             a.shape()[0].str(), "x", a.shape()[1].str(), " and ", b.shape()[0].str(), "x", b.shape()[1].str(), ")");
  return gemm(a, b);
}

Tensor bmm(const Tensor& a_in, const Tensor& b_in) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Lower, {&a_in, &b_in});
  const Tensor& a = autocast_op[0];
  const Tensor& b = autocast_op[1];
  check_mm(a, b, "bmm");
  KILN_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D tensors, got ", a.dim(), "-d and ", b.dim(), "-d");
  KILN_CHECK(detail::same_size(a.shape()[0], b.shape()[0]), "bmm: batch sizes differ (", a.shape()[0].str(), " and ",
             b.shape()[0].str(), ")");
  KILN_CHECK(detail::same_size(a.shape()[2], b.shape()[1]), "bmm: shapes ", str(a.shape()), " and ", str(b.shape()),
             " cannot be multiplied");
  return gemm(a, b);
}

Tensor linear(const Tensor& x_in, const Tensor& w_in, const std::optional<Tensor>& b_in) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Lower, {&x_in, &w_in, detail::AutocastOp::input(b_in)});
  const Tensor& x = autocast_op[0];
  const Tensor& w = autocast_op[1];
  const std::optional<Tensor> b = autocast_op.optional(2);
  KILN_CHECK(w.defined() && w.dim() == 2, "linear: weight must be 2-D [out, in], got ",
             w.defined() ? str(w.shape()) : "undefined");
  KILN_CHECK(x.defined() && x.dim() >= 1 && detail::same_size(x.shape().back(), w.shape()[1]),
             "linear: input's last dim (", x.defined() && x.dim() ? x.shape().back().str() : "none",
             ") must equal weight's in_features (", w.shape()[1].str(), ")");
  Tensor y = matmul(x, w.t());
  return b ? add(y, *b) : y;
}

Tensor outer(const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.dim() == 1 && b.dim() == 1, "outer: expected 1-D tensors, got ", a.dim(), "-d and ", b.dim(), "-d");
  return mul(unsqueeze(a, 1), unsqueeze(b, 0));
}

}  // namespace kiln
