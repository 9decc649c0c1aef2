// Pointwise ops (unary, binary with broadcasting, where, casts): every input that has the
// output's dim (not broadcast along it) is cut like the output; broadcast inputs stay whole.
// Partial sums pass through the ops that are linear in them and add nothing but sums: negation,
// float casts, sums and differences of partials. Not products with whole values: (a + b) * r
// and a * r + b * r differ when r is infinite (2 * inf vs inf - inf), so those reduce first.
#include <algorithm>

#include "runtime/dtensor/rules/rule.h"

namespace kiln::dist::rules {
namespace {

// Output dim `d` seen from input `i` (aligned from the right): its dim, or -1 when the input
// does not have it or broadcasts along it.
int64_t input_dim(const OpView& v, size_t i, int64_t d) {
  const int64_t k = d - (v.out_rank() - v.rank(i));
  if (k < 0 || v.in_shapes[i][static_cast<size_t>(k)] != v.out_shape[static_cast<size_t>(d)]) return -1;
  return k;
}

// The output cut along its dim `d`.
Strategy shard_output(const OpView& v, int64_t d) {
  Strategy s{{}, Shard(d)};
  for (size_t i = 0; i < v.in_shapes.size(); ++i) {
    const int64_t k = input_dim(v, i, d);
    s.inputs.push_back(k < 0 ? Replicate() : Shard(k));
  }
  return s;
}

bool sum_partial(const Placement& p) { return p.is_partial() && p.op == ReduceOp::Sum; }

}  // namespace

Strategies pointwise(const OpView& v, size_t m) {
  Strategies out;
  const size_t n = v.in_shapes.size();
  // Cut the output where some input is cut now (the cost picks among them).
  for (size_t i = 0; i < n; ++i) {
    const Placement& p = v.in_placements[i][m];
    if (!p.is_shard()) continue;
    const int64_t d = p.dim + (v.out_rank() - v.rank(i));
    if (input_dim(v, i, d) == p.dim) out.push_back(shard_output(v, d));
  }
  // Partial sums, where the op is linear in them (floating values only).
  if (!is_floating(v.dtype)) return out;
  bool any_partial = false;
  for (size_t i = 0; i < n; ++i) any_partial = any_partial || sum_partial(v.in_placements[i][m]);
  if (!any_partial) return out;  // (so a unary op's input is partial already)
  const Placement P = Partial(ReduceOp::Sum);
  switch (v.op) {
    case OpKind::Neg: out.push_back({{P}, P}); break;
    case OpKind::Cast:
      // (widening only: parts rounded to a narrower type do not add up to the rounded sum)
      if (is_floating(v.in_dtypes[0]) && itemsize(v.dtype) >= itemsize(v.in_dtypes[0])) out.push_back({{P}, P});
      break;
    case OpKind::Add:
    case OpKind::Sub:  // (only partials already: see rule.h on making Partial values)
      if (std::all_of(v.in_placements.begin(), v.in_placements.end(),
                      [&](const std::vector<Placement>& p) { return sum_partial(p[m]); }))
        out.push_back({all(n, P), P});
      break;
    default: break;
  }
  return out;
}

}  // namespace kiln::dist::rules
