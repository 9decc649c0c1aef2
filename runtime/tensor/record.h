// Internal helpers shared by the op files: recording nodes, dims, broadcasting, layouts.
#pragma once
#include <initializer_list>
#include <vector>

#include "runtime/exec/executor.h"
#include "runtime/tensor/tensor.h"

namespace kiln::detail {

// Records a non-view node with a contiguous layout and returns a tensor naming it.
Tensor record(OpKind op, NodeList inputs, Attrs attrs, DType dtype, Shape shape, Device device);
// Same, on the device of the first input.
Tensor record(OpKind op, const std::vector<Tensor>& inputs, Attrs attrs, DType dtype, Shape shape);
// Same, for a braced list of inputs (no temporary vector unless autograd records).
Tensor record(OpKind op, std::initializer_list<Tensor> inputs, Attrs attrs, DType dtype, Shape shape);
// Same, for tensors given by address (the op's callers keep them alive; nothing is copied).
Tensor record_refs(OpKind op, std::initializer_list<const Tensor*> inputs, Attrs attrs, DType dtype, Shape shape);
// Records a view node of `in` with the given layout.
NodePtr record_view_node(OpKind op, const NodePtr& in, Attrs attrs, Shape shape, Shape strides, SymInt offset);

// Normalizes a possibly negative dim against rank `ndim` (throws naming `op`).
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// Normalizes, sorts and dedups reduction dims (empty = all dims).
std::vector<int64_t> wrap_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);
// Broadcast result of two shapes (throws naming `op`).
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// `t` cast to `dtype` (no node if already).
Tensor cast(const Tensor& t, DType dtype);
// `t` itself when it already has `dtype` (not copied), else its cast, kept in `hold`.
inline const Tensor& as_dtype(const Tensor& t, DType dtype, Tensor& hold) {
  if (t.dtype() == dtype) return t;
  hold = cast(t, dtype);
  return hold;
}
// Throws unless `from` broadcasts to exactly `to`.
void check_expandable(const Shape& from, const Shape& to, const char* op);
// `t` expanded to `shape` (no node if already that shape).
Tensor expand_to(const Tensor& t, const Shape& shape);
// A 0-d constant tensor.
Tensor constant(Scalar v, DType dtype, Device device);
// A 0-d constant for the number operand of an op (the 2 of x * 2), which only that op reads:
// outside compile() traces a thread reuses one node per recent value.
Tensor scalar_operand(Scalar v, DType dtype, Device device);
// A 0-d tensor holding the size value `v` (symbolic in compile() traces: no guard on it).
Tensor size_value(const SymInt& v, DType dtype, Device device);
// The traced value of a size: its constant, or the shape oracle's hint (no guard recorded).
int64_t size_hint(const SymInt& v);
// `t` reshaped to `shape` (symbolic sizes stay symbolic; no node when already that shape).
Tensor reshape_to(const Tensor& t, const Shape& shape);
// The max of detached `x` over `dims`, kept, that softmax-like ops shift by before exp: where a
// reduced dim is empty it is the lowest value (-inf) instead of amax's error, so a symbolic dim
// needs no question about being 0 (the empty result never reads it).
Tensor shift_max(const Tensor& x, const std::vector<int64_t>& dims);
// The window [start, stop) with `step` of dim `d` (bounds already within [0, size] and
// start <= stop); symbolic bounds stay symbolic.
Tensor slice_window(const Tensor& x, int64_t d, const SymInt& start, const SymInt& stop, int64_t step);
// 0, 1, ..., n-1 (int64; n symbolic in compile() traces).
Tensor arange_of(const SymInt& n, Device device);
// Whether two sizes are equal (in compile() traces the answer is guarded, not a specialization).
bool same_size(const SymInt& a, const SymInt& b);
// Throws unless the number `v` converts to `dtype` without overflow (a floating value filled
// into an integer tensor: inf, NaN or out of range would be an undefined cast in the kernels).
void check_fill_value(Scalar v, DType dtype, const char* op);
// Shape of a reduction over `dims` (sorted, wrapped).
Shape reduced_shape(const Shape& s, const std::vector<int64_t>& dims, bool keepdim);
// Applies one view step to a node, recording a view node; used by view ops and replays.
NodePtr apply_view(const NodePtr& in, const ViewStep& step);
// Applies a view step to `x` with autograd, returning a plain (untracked) tensor.
Tensor view_step(const Tensor& x, const ViewStep& step);
// Records a view step on tensor `x` and returns the view tensor (tracking its base).
Tensor make_view(const Tensor& x, ViewStep step);
// Shape as "[2, 3]" for messages (in a compile() trace, symbolic sizes as the traced values).
std::string str(const Shape& s);
std::string str(const std::vector<int64_t>& v);

}  // namespace kiln::detail

namespace kiln::detail {
// A leaf tensor over `storage` (contiguous, offset 0).
Tensor leaf(std::shared_ptr<Storage> storage, Shape shape, DType dtype, Device device);
// Checks sizes are non-negative (throws naming `op`).
void check_sizes(const std::vector<int64_t>& shape, const char* op);
}  // namespace kiln::detail
