// Row cache: in a row kernel (Kernel::row_cache > 0), values that several flat loops over the
// same row compute are computed in the first such loop and kept in a per-row region of fast
// memory (CUDA: shared memory per warp; CPU: the stack), one slot of row_cache elements per value
// live at once; later loops read them back instead of recomputing (layer_norm -> gelu -> softmax
// computes gelu and exp once per element). Each backend emits the plan; the plan is the same.
#pragma once
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "jit/loop/loop_ir.h"

namespace kiln::jit {

struct RowCachePlan {
  // Per top-level loop of the kernel body: expressions it reads back from a slot, and
  // expressions it computes and writes to a slot (at the loop's element: var - lo).
  struct LoopCache {
    std::unordered_map<ExprId, int> reads, writes;
  };
  std::map<const Stmt*, LoopCache> loops;
  std::vector<DType> slots;  // each slot's element type (slot_type of its values)
  std::vector<int64_t> slot_offset;  // bytes into the region
  int64_t region = 0;  // bytes of one row's region
  bool empty() const { return slots.empty(); }
};

// How a cached value of type t is kept: bools as int32, 16-bit floats as float32.
DType row_cache_slot_type(DType t);

// Plans the row cache of `k` (flat top-level loops only), with at most `budget` bytes per row
// region: a value that does not fit is recomputed. `cache_loads`: plain loads of a buffer are
// candidates too (worth it where the slot is nearer than the buffer, as shared memory is on a
// GPU; on a CPU the row is in L1 either way and the copy costs a store and a slot).
RowCachePlan plan_row_cache(const Kernel& k, int64_t budget, bool cache_loads);

}  // namespace kiln::jit
