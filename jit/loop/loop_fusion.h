// Sibling loop fusion: loops of one statement list over the same range whose bodies only store
// (no accumulators) and touch disjoint buffers become one loop, so the values they read are
// loaded once per iteration and shared subexpressions computed once. A column-mode reduction
// kernel computes each column sum and each stored value in a pass of its own over the rows;
// fused, it makes one pass (W2's bias gradients and the dz they sum, W3's dw and db).
#pragma once
#include "jit/loop/loop_ir.h"

namespace kiln::jit {

// Fuses sibling loops of `k` (at every nesting level) where that keeps every buffer's reads
// and writes in order; statements between them that the first loop does not touch move ahead
// of it. Returns the number of loops merged away.
int fuse_sibling_loops(Kernel& k);

}  // namespace kiln::jit
