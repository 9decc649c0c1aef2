// Batched GEMM, attention and conv helpers.
//   matmul a [..., M, K] x b [..., K, N]: batch dims cut alike, rows of a (M), columns of b (N),
//   or the contraction K cut in both (giving Partial sums).
//   attention (and its backward): batch dims (batch, heads) cut alike in q, k, v (and out and its
//   gradient), the mask cut where it has that dim; not with dropout, whose mask is drawn per
//   batch index of the whole tensor.
//   im2col: the batch dim.
#include "runtime/dtensor/rules/rule.h"

namespace kiln::dist::rules {
namespace {

Strategies gemm(const OpView& v) {
  Strategies out;
  const int64_t r = v.rank(0);
  if (r < 2 || v.rank(1) != r) return out;
  for (int64_t k = 0; k < r - 2; ++k) out.push_back({{Shard(k), Shard(k)}, Shard(k)});
  out.push_back({{Shard(r - 2), Replicate()}, Shard(r - 2)});
  out.push_back({{Replicate(), Shard(r - 1)}, Shard(r - 1)});
  out.push_back({{Shard(r - 1), Shard(r - 2)}, Partial()});
  // (Not a Partial sum times a whole value: with infinities the parts' products do not add up
  // to the product of their sum; see pointwise.cpp.)
  return out;
}

Strategies attention(const OpView& v) {
  Strategies out;
  if (attention_dropout(v.attrs) > 0) return out;
  const int64_t r = v.rank(0);
  // q, k, v (forward) or q, k, v, out, grad_out (backward) have the batch dims; then the mask.
  const size_t batched = v.op == OpKind::Attention ? 3 : 5;
  const size_t mask = batched;  // (no dropout words here)
  for (int64_t k = 0; k < r - 2; ++k) {
    Strategy s{{}, Shard(k)};
    for (size_t i = 0; i < v.in_shapes.size(); ++i) {
      if (i < batched) {
        s.inputs.push_back(Shard(k));
      } else if (i == mask) {
        const int64_t mk = k - (r - v.rank(i));
        const bool has = mk >= 0 && v.in_shapes[i][static_cast<size_t>(mk)] == v.in_shapes[0][static_cast<size_t>(k)];
        s.inputs.push_back(has ? Shard(mk) : Replicate());
      } else {
        s.inputs.push_back(Replicate());
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

Strategies matmul(const OpView& v, size_t) {
  switch (v.op) {
    case OpKind::Matmul: return gemm(v);
    case OpKind::Attention:
    case OpKind::AttentionBackward: return attention(v);
    case OpKind::Im2Col: return {{{Shard(0)}, Shard(0)}};  // (col2im's attrs name the whole output: replicated)
    default: return {};
  }
}

}  // namespace kiln::dist::rules
