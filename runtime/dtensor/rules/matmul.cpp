// Batched GEMM and conv helpers.
//   matmul a [..., M, K] x b [..., K, N]: batch dims cut alike, rows of a (M), columns of b (N),
//   or the contraction K cut in both (giving Partial sums).
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

}  // namespace

Strategies matmul(const OpView& v, size_t) {
  switch (v.op) {
    case OpKind::Matmul: return gemm(v);
    case OpKind::Im2Col: return {{{Shard(0)}, Shard(0)}};  // (col2im's attrs name the whole output: replicated)
    default: return {};
  }
}

}  // namespace kiln::dist::rules
