// Sharding rules: for each op family, the ways an op can run on shards along one mesh dim.
// A rule looks at the op (kind, attrs, global shapes) and at the inputs' current placements and
// offers strategies: the placement every input must have along mesh dim `m` and the output's
// placement there. The dispatcher (dispatch.cpp) adds the all-Replicate strategy (always
// valid: every rank then computes the whole op), costs each by the bytes its redistributions
// move and takes the cheapest. A rule must only offer strategies whose local ops, run on each
// rank's shards, give the shards (or partial values) of the global result.
// Partial values come from reductions over cut dims (and the masked lookups) and combine only
// with other partials: a rule never asks to turn a whole value into parts (value / n) to add it
// to partials, since (x0 - m/2) + (x1 - m/2) cancels where (x0 + x1) - m is exact (x ~ m ~ 1e20
// gives inf - inf).
#pragma once
#include <vector>

#include "runtime/dtensor/dtensor.h"

namespace kiln::dist::rules {

// What a rule sees of one op.
struct OpView {
  OpKind op;
  const Attrs& attrs;
  std::vector<std::vector<int64_t>> in_shapes;  // global shapes of the inputs
  std::vector<DType> in_dtypes;
  std::vector<int64_t> out_shape;
  DType dtype;
  const std::vector<std::vector<Placement>>& in_placements;  // every mesh dim, per input
  const DeviceMesh& mesh;
  int64_t rank(size_t i) const { return static_cast<int64_t>(in_shapes[i].size()); }
  int64_t out_rank() const { return static_cast<int64_t>(out_shape.size()); }
  // Whether tensor dim `k` of input `i` is cut by any mesh dim other than `m`.
  bool cut_elsewhere(size_t i, int64_t k, size_t m) const;
};

// Computes the shard of an op whose strategy is not the op itself on the shards (given the
// inputs' shards laid out as the strategy asks, and the mesh dim it is for).
using LocalFn = Tensor (*)(const OpView& op, size_t m, const std::vector<Tensor>& shards);

// One way to run the op along a mesh dim.
struct Strategy {
  std::vector<Placement> inputs;
  Placement output;
  LocalFn local = nullptr;  // null: the op itself on the shards
};
using Strategies = std::vector<Strategy>;

// The strategies of an op family along mesh dim `m` (the all-Replicate one is added by the
// caller). Each file of rules/ defines one family.
Strategies pointwise(const OpView& op, size_t m);    // pointwise.cpp: unary, binary, where, casts
Strategies reduction(const OpView& op, size_t m);    // reduction.cpp: sum, prod, amax, amin, arg*, cumsum
Strategies view(const OpView& op, size_t m);         // view.cpp: every view op, contiguous, copies
Strategies matmul(const OpView& op, size_t m);       // matmul.cpp: batched GEMM, im2col
Strategies attention(const OpView& op, size_t m);    // attention.cpp: fused attention, ring attention
Strategies indexing(const OpView& op, size_t m);     // indexing.cpp: cat, gather, scatter, index ops
Strategies view_scatter(const OpView& op, size_t m); // view_scatter.cpp: in-place writes through views

using Rule = Strategies (*)(const OpView&, size_t);
// The rule of `op`, or null when it has none (it then runs on replicated inputs).
Rule rule_for(OpKind op);

// Helpers shared by the rules.
// Placements of `n` inputs, all `p`.
inline std::vector<Placement> all(size_t n, Placement p) { return std::vector<Placement>(n, p); }

}  // namespace kiln::dist::rules
