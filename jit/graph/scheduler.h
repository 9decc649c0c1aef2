// The scheduler: splits a segment into steps — fused kernels (pointwise DAGs with views folded
// into index arithmetic, reductions with their pointwise producers and consumers), library or
// reference calls for everything else (GEMM, indexing, cat …), and views (storage sharing).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "runtime/exec/executor.h"

namespace kiln::jit {

// How a node is treated by fusion, by its op (the scheduler also keeps nodes touching 16-bit
// float values opaque unless ScheduleOptions::half_kernels).
enum class NodeClass { Pointwise, Source, View, Reduction, Opaque };
NodeClass classify(const Node& n);
// The reduction ops (sum, prod, amax, amin, argmax, argmin), over any dims: classify() makes one
// over no dims or a few elements pointwise.
bool is_reduction_op(OpKind op);
// argmax / argmin: their partials and combines carry an index beside the value.
inline bool is_arg_reduction(OpKind op) { return op == OpKind::ArgMax || op == OpKind::ArgMin; }
// Sums over at most this many elements (constant sizes) are pointwise: computed inline where
// their value is read, as unrolled adds (a 3-vector's length, a pairwise r² = dx² + dy² + dz²),
// so a kernel over their consumer's domain needs no stored [..] of them.
inline constexpr int64_t kInlineSum = 4;
bool inline_sum(const Node& n);

// One fused kernel: nodes computed inside it (topological order) and those it stores.
struct Group {
  std::vector<Node*> nodes;  // every node computed in the kernel
  std::vector<Node*> outputs;  // nodes the kernel writes to memory
  std::vector<Node*> inputs;  // materialized nodes it reads
  Shape domain;  // iteration domain (a reduction's input shape, else the output shape)
  std::vector<int64_t> reduce_dims;  // reduced dims of `domain` (empty: pointwise)
  bool split = false;  // full reduction: parallel over chunks, partials combined after
  std::vector<std::string> why;  // per output: why it is stored (KILN_LOG=fusion)
};

// A step of the schedule, run in order.
struct Step {
  enum class Kind { Kernel, Opaque, View } kind;
  Group group;  // Kernel
  Node* node = nullptr;  // Opaque / View
};

// How the schedule trades memory traffic for recomputation (from the backend's Target).
struct ScheduleOptions {
  // Store a transcendental value that a reduction and another op read, or that several kernels
  // would recompute (right where compute is dear, as on CPUs); false recomputes it in each stage
  // and kernel instead (where memory traffic is dear, as on GPUs).
  bool store_expensive = true;
  // Fuse float16/bfloat16 values (computed in float32, rounded to 16 bits after each op) rather
  // than running them on the reference kernels.
  bool half_kernels = false;
  // Let a later stage over the same rows join the row kernel whose outputs it reads (one
  // kernel for layer_norm's forward and backward), rather than start a kernel of its own.
  bool merge_row_stages = false;
  // The most reductions a kernel takes in from independent kernels of its iteration space (0: no
  // limit). Each is an accumulator a GPU thread keeps in registers: the twelve layers' bias and
  // layer-norm gradients of a GPT step made one kernel of 74 accumulators, spilling, 18x slower
  // than its memory traffic.
  int max_merged_reductions = 0;
  // Row kernels that keep the values their stages share in fast memory (the backend's row
  // cache), null: none. With store_expensive, a value stored only because a reduction and
  // another op read it is not stored when no other step reads it and its kernel keeps rows:
  // the row cache already computes it once.
  std::function<bool(const Group&)> keeps_rows;
};

// Splits `seg` into steps. Nodes left out of every step are fused intermediates. Nodes in
// `stored` are materialized in any case (used when a kernel could not be formed around them).
std::vector<Step> schedule(const Segment& seg, const std::vector<const Node*>& stored = {}, ScheduleOptions opts = {});

// One line per step, with why nodes were split (KILN_LOG=fusion).
std::string describe(const std::vector<Step>& steps);

}  // namespace kiln::jit
