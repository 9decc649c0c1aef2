// VJP rules: one graph builder per primitive, used by eager backward and (later) tracing.
#pragma once
#include <vector>

#include "runtime/tensor/tensor.h"

namespace kiln::detail {

// Whether gradients flow through `op` at all.
bool is_differentiable(OpKind op);
// Whether op's vjp rule reads the values of its inputs or output (value_free.cpp). Where it does
// not (sums, differences, views, copies, casts, concatenation: only shapes, dtypes and devices),
// the backward node keeps no handle on them, so the forward's intermediates they name are freed as
// soon as nothing else needs them, as PyTorch saves only what each formula uses. Found from the
// rule itself: run once per op on stand-ins (this call's shapes, dtypes and attrs), its gradient
// graph searched for them; remembered per op.
bool vjp_reads_values(OpKind op, const Attrs& attrs, const std::vector<Tensor>& inputs, const Tensor& out,
                      const Shape& view_shape);
// A tensor of `shape`, `dtype` and `device` standing in for one a shape-only backward node did
// not keep: one expanded constant (no storage), NaN where floating, 0 otherwise.
Tensor stand_in(const Shape& shape, DType dtype, Device device);
// Whether any of `grads` is computed from one of `stand_ins` (searching what a rule built from
// them and from its output gradient `g`, not g's own history).
bool reads_any(const std::vector<Tensor>& grads, const std::vector<Tensor>& stand_ins, const Tensor& g);
// Whether each backward of a shape-only node checks that its stand-ins went unread (debug builds,
// and KILN_POISON=1): a rule that read one raises kiln::Error rather than giving NaN or zeros.
bool check_stand_ins();
// Gradients for each input of one recorded primitive, given its inputs, output and the
// output's gradient `g` (undefined entries: no gradient). `view_shape` is the shape of
// View/Expand steps.
std::vector<Tensor> vjp(OpKind op, const Attrs& attrs, const std::vector<Tensor>& inputs, const Tensor& out,
                        const Tensor& g, const Shape& view_shape);
// Sums a broadcast gradient back to `shape`.
Tensor sum_to(const Tensor& g, const Shape& shape);
// g of a reduction's output shape (keepdim or not) broadcast back over x (reduced over `dims`).
Tensor expand_reduced(const Tensor& g, const Tensor& x, const std::vector<int64_t>& dims);
// The partial derivatives d out / d x of prod(x, dims) and of amax/amin(x, dims), x's shape
// (shared by the vjp and jvp rules).
Tensor prod_partials(const Tensor& x, const Tensor& out, const std::vector<int64_t>& dims);
Tensor extremum_partials(const Tensor& x, const Tensor& out, const std::vector<int64_t>& dims);

}  // namespace kiln::detail
