// Activation checkpointing, as torch.utils.checkpoint: trade computation for memory.
//
//   Tensor h = kiln::checkpoint([&](const std::vector<Tensor>& in) { return block(in[0]); }, {x});
//
// The forward runs `fn` without recording gradients, so none of its intermediates are kept for
// the backward; the backward runs `fn` again on the saved inputs (with the random generator where
// the forward found it, so dropout draws the same mask), and backpropagates through that
// recomputation: the inputs get their gradients, and so do the parameters `fn` reads (a module's
// weights), accumulated into their .grad() as without checkpointing. Eager, and nested. Inside
// kiln::compile the block is traced as it is: the compiled step's partition chooses what to
// recompute. As PyTorch's reentrant checkpoint: the parameters' gradients accumulate (also under
// kiln::grad, which asks only for the inputs'), and a backward with create_graph through the
// block is refused (kiln::Error). `fn` must compute the same function both times: no state it changes, no
// data-dependent control flow that differs.
#pragma once
#include <functional>
#include <vector>

#include "runtime/core/export.h"
#include "runtime/tensor/tensor.h"

namespace kiln {

KILN_API Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs);

}  // namespace kiln
