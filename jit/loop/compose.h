// Kernels built from other kernels' loop IR: a split reduction's combine followed by its 0-d
// tail, and horizontal kernels (several independent pointwise kernels behind one parallel index).
#pragma once
#include <vector>

#include "jit/loop/lower.h"

namespace kiln::jit {

// `c` (a combine_kernel of one value) followed in the same kernel by `epi`, a pointwise kernel
// of one parallel index (the 0-d tail of a full reduction: `sum() * 0.5`) whose buffer `epi_in`
// is the reduction's output. Buffers: c's, then epi's; params likewise.
Kernel combine_with_epilogue(const Kernel& c, const Kernel& epi, int epi_in);

// Whether `L` may be a member of a horizontal kernel: a pointwise kernel whose parallel indices
// are independent (no accumulators, no split or column scheme, no row cache).
bool horizontal_member(const Lowered& L);

// Independent pointwise kernels as one: parallel index p runs member j's body at index
// p - off_j when 0 <= p - off_j < extent_j (off_j: the sum of the earlier members' extents).
// Buffers, params and float params are the members' in member order.
Kernel horizontal_kernel(const std::vector<const Kernel*>& members);

}  // namespace kiln::jit
