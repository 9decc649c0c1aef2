// The min-cut partitioner: splits a joint forward+backward graph into what the forward saves
// and what the backward recomputes, by a max-flow over node bytes (like AOTAutograd's
// min_cut_rematerialization_partition). Cheap pointwise ops are recomputed; GEMM, conv,
// reductions, indexing and random ops are saved unless the memory budget trades them away.
#pragma once
#include <functional>
#include <vector>

#include "runtime/ir/node.h"

namespace kiln::jit {

struct PartitionOptions {
  // Fraction of the min-cut's saved bytes allowed; below 1, ops that are not recomputed by
  // default become recomputable, cheapest per byte first, until the saved bytes fit.
  double memory_budget = 1.0;
  // Save every forward value the backward reads (eager autograd's choice; for comparison).
  bool save_all = false;
};

struct Partition {
  std::vector<NodePtr> saved;  // forward values (or inputs) the backward reads
  int64_t saved_bytes = 0;  // their bytes at the traced sizes
  int64_t save_all_bytes = 0;  // bytes eager autograd would save
  int recomputed = 0;  // forward ops the backward recomputes
  int pinned = 0;  // forward values pinned because the backward compares them
};

// Partitions the graph behind `fwd_outputs` and `bwd_outputs`, whose leaves are `inputs`
// (forward) and `tangents` (backward cotangents). `bytes` prices a node at the traced sizes.
Partition partition(const std::vector<NodePtr>& inputs, const std::vector<NodePtr>& tangents,
                    const std::vector<NodePtr>& fwd_outputs, const std::vector<NodePtr>& bwd_outputs,
                    const std::function<int64_t(const Node&)>& bytes, const PartitionOptions& options = {});

// Whether the partitioner recomputes `op` only under a memory budget (GEMM, conv, reductions ...).
bool costly_to_recompute(OpKind op);

}  // namespace kiln::jit
