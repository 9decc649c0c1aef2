// A segment's signature: ops, dtypes, sizes, attributes, wiring, which nodes are needed and the
// layout of every stored input. Equal signatures schedule identically, so it keys the plan cache.
#pragma once
#include <cstdint>
#include <vector>

#include "jit/exec/plan.h"

namespace kiln::jit {

// Writes `seg`'s signature into `sc.sig`; sets every node's `pos`; `sc.externals` receives the
// stored inputs in first-use order and `sc.extern_held` the references to each beyond the segment's.
void signature(const Segment& seg, RunScratch& sc);
// The plan cache's hash of a signature.
uint64_t hash_sig(const std::vector<int64_t>& s);

}  // namespace kiln::jit
