// VJP rules: one graph builder per primitive, used by eager backward and (later) tracing.
#pragma once
#include <vector>

#include "runtime/tensor/tensor.h"

namespace kiln::detail {

// Whether gradients flow through `op` at all.
bool is_differentiable(OpKind op);
// Which values op's vjp rule reads for the gradients of the inputs that need one (`needs`): per
// input, then (last) the output (value_free.cpp). The backward node keeps only those (x * mask
// with only x needing a gradient keeps the mask, not x); for the rest it keeps shapes, so the forward's intermediates
// they name are freed as soon as nothing else needs them, as PyTorch saves only what each formula
// uses (matmul keeps its operands, not its product; exp its output, not its input; sums,
// differences, views, copies, casts and concatenation nothing). Found from the rule itself: run on
// stand-ins (this call's shapes, dtypes and attrs), its gradient graph searched for each of them;
// remembered per op, attributes, dtypes, defined inputs and those needing gradients.
std::vector<bool> vjp_reads(OpKind op, const Attrs& attrs, const std::vector<Tensor>& inputs, const Tensor& out,
                            const Shape& view_shape, const std::vector<bool>& needs);
// A tensor of `shape`, `dtype` and `device` standing in for one a backward node did not keep:
// a constant (no storage), NaN where floating, 0 otherwise; expanded, or with `strides` where
// they are a permutation of a dense layout (a rule may read the layout: matmul's transposed
// right operand).
Tensor stand_in(const Shape& shape, DType dtype, Device device, const Shape* strides = nullptr);
// Which of `stand_ins` (undefined entries: false) any of `grads` is computed from (searching what
// a rule built from them and from its output gradient `g`, not g's own history); whether any is.
std::vector<bool> reads_which(const std::vector<Tensor>& grads, const std::vector<Tensor>& stand_ins, const Tensor& g);
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
