// scaled_dot_product_attention: one fused Attention node where its kernels apply (float32,
// float64, bfloat16, float16; equal head sizes for keys and values, a constant head size up to
// 256, a mask that needs no gradient) and kiln::sdpa_kernel's choice allows it (runtime/ops/attention_policy.h),
// else the unfused graph dropout(softmax(q·kᵀ·scale + mask))·v.
#include <cmath>
#include <cstdio>
#include <limits>

#include "runtime/autograd/autograd.h"
#include "runtime/autograd/forward_ad.h"
#include "runtime/exec/device_runtime.h"
#include "runtime/ops/attention_policy.h"
#include "runtime/ops/autocast_policy.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln {
using detail::record;
using detail::str;

namespace {

constexpr int64_t kMaxFusedHead = 256;

// softmax(q·kᵀ·scale + mask)·v as written (scale: 1/sqrt(head size) when not given, computed from
// the size where it is symbolic).
Tensor unfused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& attn_mask,
                         bool is_causal, std::optional<double> scale, double dropout_p) {
  const Shape &qs = q.shape(), &ks = k.shape();
  const SymInt& d = qs.back();
  Tensor scores = matmul(q, transpose(k, -2, -1));
  if (scale)
    scores = mul(scores, *scale);
  else if (d.is_constant())
    scores = mul(scores, 1.0 / std::sqrt(static_cast<double>(d.as_int())));
  else
    scores = mul(scores, rsqrt(detail::size_value(d, scores.dtype(), scores.device())));
  const double ninf = -std::numeric_limits<double>::infinity();
  if (is_causal) {
    Tensor keep = tril(full_shape({qs[qs.size() - 2], ks[ks.size() - 2]}, true, kBool, q.device()));
    scores = where(keep, scores, ninf);
  } else if (attn_mask) {
    scores = attn_mask->dtype() == kBool ? where(*attn_mask, scores, ninf) : add(scores, *attn_mask);
  }
  return matmul(dropout(softmax(scores, -1), dropout_p), v);
}

// The batch dims of q, k and v broadcast together, or nullopt when they do not.
std::optional<Shape> common_batch(const Tensor& q, const Tensor& k, const Tensor& v) {
  auto batch = [](const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); };
  try {
    Shape b = detail::broadcast_shapes(batch(q), batch(k), "scaled_dot_product_attention");
    return detail::broadcast_shapes(b, batch(v), "scaled_dot_product_attention");
  } catch (const Error&) {
    return std::nullopt;
  }
}

// Whether `m` broadcasts to `full` without growing it.
bool mask_fits(const Shape& m, const Shape& full) {
  if (m.size() > full.size()) return false;
  const size_t lead = full.size() - m.size();
  for (size_t i = 0; i < m.size(); ++i) {
    if (!provably_equal(m[i], 1) && !provably_equal(m[i], full[lead + i])) return false;
  }
  return true;
}

thread_local SdpaBackend t_backend = SdpaBackend::Auto;

}  // namespace

sdpa_kernel::sdpa_kernel(SdpaBackend backend) : was_(t_backend) {
  KILN_CHECK(backend == SdpaBackend::Auto || backend == SdpaBackend::Math || backend == SdpaBackend::Fused,
             "sdpa_kernel: expected SdpaBackend Auto, Math or Fused, got ", static_cast<int>(backend));
  t_backend = backend;
}
sdpa_kernel::~sdpa_kernel() { t_backend = was_; }
SdpaBackend current_sdpa_backend() { return t_backend; }

namespace detail {
uint8_t sdpa_backend_key() { return static_cast<uint8_t>(t_backend); }

bool attention_materializes(const Tensor& q, const Tensor& k) {
  if (t_backend != SdpaBackend::Auto) return t_backend == SdpaBackend::Math;
  if (q.device().type != DeviceType::CUDA) return false;
  // 16-bit and float32 inputs: the tensor-core kernels, faster than the materialized graph at
  // every size (float32 ones too where the device has them).
  const bool tensor_cores = find_device_runtime(DeviceType::CUDA)->tensor_core_attention(q.device().index);
  if (is_half(q.dtype())) return !tensor_cores;
  if (q.dtype() == kFloat32 && tensor_cores) return false;
  double bytes = static_cast<double>(itemsize(q.dtype()));
  const Shape &qs = q.shape(), &ks = k.shape();
  for (size_t d = 0; d + 1 < qs.size(); ++d) {
    if (!qs[d].is_constant()) return false;
    bytes *= static_cast<double>(qs[d].as_int());
  }
  if (!ks[ks.size() - 2].is_constant()) return false;
  return bytes * static_cast<double>(ks[ks.size() - 2].as_int()) < kMinGpuFusedScoresBytes;
}
}  // namespace detail

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    const std::optional<Tensor>& attn_mask_in, bool is_causal,
                                    std::optional<double> scale, double dropout_p) {
  detail::AutocastOp autocast_op(detail::AutocastPolicy::Lower,
                                 {&q_in, &k_in, &v_in, detail::AutocastOp::input(attn_mask_in)});
  const Tensor& q = autocast_op[0];
  const Tensor& k = autocast_op[1];
  const Tensor& v = autocast_op[2];
  const std::optional<Tensor> attn_mask = autocast_op.optional(3);
  KILN_CHECK(q.defined() && k.defined() && v.defined(), "scaled_dot_product_attention: got an undefined tensor");
  KILN_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, "scaled_dot_product_attention: expected q, k, v with ",
             "at least 2 dims, got ", str(q.shape()), ", ", str(k.shape()), ", ", str(v.shape()));
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  KILN_CHECK(detail::same_size(qs.back(), ks.back()),
             "scaled_dot_product_attention: q and k must share the last dim, got ", str(qs), " and ", str(ks));
  KILN_CHECK(detail::same_size(ks[ks.size() - 2], vs[vs.size() - 2]),
             "scaled_dot_product_attention: k and v must share the sequence dim, got ", str(ks), " and ", str(vs));
  KILN_CHECK(!(is_causal && attn_mask), "scaled_dot_product_attention: pass either attn_mask or is_causal, not both");
  KILN_CHECK(dropout_p >= 0 && dropout_p <= 1,
             "scaled_dot_product_attention: dropout_p has to be between 0 and 1, got ", dropout_p);
  KILN_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(),
             "scaled_dot_product_attention: expected q, k, v of one dtype, got ", dtype_name(q.dtype()), ", ",
             dtype_name(k.dtype()), ", ", dtype_name(v.dtype()));

  const SymInt& d = qs.back();
  const bool fused_dtype = is_floating(q.dtype());
  const bool fused_device = q.device().type == DeviceType::CPU || q.device().type == DeviceType::CUDA;
  const bool fused_head = d.is_constant() && d.as_int() >= 1 && d.as_int() <= kMaxFusedHead &&
                          vs.back().is_constant() && vs.back().as_int() == d.as_int();
  const bool mask_grad = attn_mask && attn_mask->requires_grad() && attn_mask->dtype() != kBool;
  // Tangents that a recorded backward will carry (forward-over-reverse: hvp, hessian) need the
  // backward in primitives, which have jvp rules; the fused backward has none.
  const bool tangents = detail::forward_ad_visible() &&
                        (detail::has_visible_tangent(q) || detail::has_visible_tangent(k) ||
                         detail::has_visible_tangent(v) || (attn_mask && detail::has_visible_tangent(*attn_mask)));
  const bool dual_backward =
      tangents && grad_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  // (the jvp rule of the fused node computes in its inputs' dtype: 16-bit tangents run unfused)
  const bool half = is_half(q.dtype());
  if (dual_backward && detail::log_forward_ad())
    std::fprintf(stderr,
                 "[kiln fwad] scaled_dot_product_attention runs unfused: tangents meet a recorded backward "
                 "(forward-over-reverse), and the fused backward has no jvp rule\n");
  std::optional<Shape> batch =
      fused_dtype && fused_device && fused_head && !mask_grad && !dual_backward && !(half && tangents) &&
              q.dim() == k.dim() &&
              q.dim() == v.dim()
          ? common_batch(q, k, v)
          : std::nullopt;
  const SymInt &tq = qs[qs.size() - 2], &tk = ks[ks.size() - 2];
  Shape full;
  if (batch) {
    full = *batch;
    full.push_back(tq);
    full.push_back(tk);
  }
  if (batch && attn_mask &&
      (!mask_fits(attn_mask->shape(), full) || (attn_mask->dtype() != kBool && attn_mask->dtype() != q.dtype())))
    batch = std::nullopt;

  // (everything dropped: zeros, as dropout(p = 1) gives; small scores on the GPU: the materialized
  // graph is faster there, runtime/ops/attention_policy.h)
  if (!batch || dropout_p == 1 || detail::attention_materializes(q, k)) return unfused_attention(q, k, v, attn_mask, is_causal, scale, dropout_p);

  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d.as_int()));
  auto to_batch = [&](const Tensor& t, const SymInt& rows) {
    Shape sh = *batch;
    sh.push_back(rows);
    sh.push_back(d);
    return detail::expand_to(t, sh);
  };
  std::vector<Tensor> inputs = {to_batch(q, tq), to_batch(k, tk), to_batch(v, tk)};
  if (attn_mask)
    inputs.push_back(attn_mask->dtype() == kBool
                         ? where(*attn_mask, full_shape({}, 0.0, q.dtype(), q.device()),
                                 full_shape({}, -std::numeric_limits<double>::infinity(), q.dtype(), q.device()))
                         : *attn_mask);
  // The dropout mask's generator words: drawn like any random op (fresh per call, also in compiled
  // programs) and read again by the backward, which rebuilds the same mask.
  if (dropout_p > 0) inputs.push_back(randint(0, int64_t{1} << 31, {4}, kInt64, q.device()));
  Shape os = *batch;
  os.push_back(tq);
  os.push_back(attention_packed_width(d, q.dtype()));
  Tensor packed = record(OpKind::Attention, inputs, attention_attrs(is_causal, s, dropout_p), q.dtype(), os);
  return detail::slice_window(packed, static_cast<int64_t>(os.size()) - 1, 0, d, 1);
}

}  // namespace kiln
