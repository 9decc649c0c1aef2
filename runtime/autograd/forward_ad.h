// Forward-mode AD, as torch.autograd.forward_ad: a dual tensor carries a primal value and a
// tangent; every op on it records its jvp rule (ordinary lazy ops, so the tangent is computed
// in the same graph as the primal, fused with it where the JIT can). Levels nest: inside an
// inner level, the tangents of an outer one ride along on primals and tangents alike, so
// jvp-of-jvp and forward-over-reverse (hessians) compose.
#pragma once
#include <cstdint>

#include "runtime/core/export.h"
#include "runtime/tensor/tensor.h"

namespace kiln::fwad {

// RAII: enters a new dual level on this thread, exits it (dropping every tangent made at it) on
// destruction. Levels nest and must exit in reverse order of entry.
class KILN_API DualLevel {
 public:
  DualLevel();
  ~DualLevel();
  DualLevel(const DualLevel&) = delete;
  DualLevel& operator=(const DualLevel&) = delete;
  // This level's id (what make_dual / unpack_dual take as `level`).
  uint64_t level() const { return level_; }

 private:
  uint64_t level_;
};

// A tensor with `primal`'s value and autograd identity (gradients flow back to primal) whose
// tangent at `level` (default: the innermost live level) is `tangent`. The tangent must have the
// primal's shape, dtype and device, both floating point; kiln::Error otherwise, or outside any
// dual level. Unlike PyTorch the result is not a view: writing to it in place does not write
// `primal`.
KILN_API Tensor make_dual(const Tensor& primal, const Tensor& tangent, int64_t level = -1);

struct UnpackedDual {
  Tensor primal;  // t's value without its tangent at the level (tangents of outer levels kept)
  Tensor tangent;  // undefined when t has none at the level
};
// t's primal and tangent at `level` (default: the innermost live level).
KILN_API UnpackedDual unpack_dual(const Tensor& t, int64_t level = -1);

// The innermost live level on this thread, or -1 when none is.
KILN_API int64_t current_level();

}  // namespace kiln::fwad

// Internal to the library (not exported).
namespace kiln::detail {
// Whether any dual level is live (and visible) on this thread: the ops' fast path.
bool forward_ad_visible();
// KILN_LOG=fwad (or all): levels say how many tangents they recorded, ops what forward mode
// changed in them.
bool log_forward_ad();
// Records the tangents of `out` for every visible level at which an input has one, through the
// jvp rule of `op` (inputs by address; `view_shape` for View/Expand).
void attach_tangents(Tensor& out, OpKind op, const Attrs& attrs, const Tensor* const* inputs, size_t count,
                     const Shape& view_shape = {});
// Makes dst's tangents those of src (in-place writes rebind a tensor to a new value); the
// shared_ptr form also registers dst with the levels, which drop its tangents when they exit
// (the other leaves entries of exited levels in place: never read again, freed with dst).
void copy_tangents(TensorImpl& dst, const TensorImpl& src);
void copy_tangents(const std::shared_ptr<TensorImpl>& dst, const TensorImpl& src);
// Whether t has a tangent at a visible level (compile() runs such calls eagerly).
bool has_visible_tangent(const Tensor& t);
// Whether a derivative of an op's result in `t` is wanted, in either mode: a gradient (grad
// enabled, t requires it) or a tangent (t has one at a visible level). Composite ops that follow
// PyTorch's convention at non-differentiable points (norm and std at 0, max/min ties, clamp
// bounds) build their values that way exactly when this holds, so both modes agree there.
bool wants_derivative(const Tensor& t);
}  // namespace kiln::detail
