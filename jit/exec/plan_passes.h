// The planning passes of make_plan (make_plan.cpp runs them in order) and what they share.
// Internal to jit/exec.
#pragma once
#include <memory>
#include <unordered_map>
#include <vector>

#include "jit/backend/target.h"
#include "jit/exec/plan.h"

namespace kiln::jit {

// The state of one plan being made, handed from pass to pass.
struct Planning {
  Plan& plan;
  Segment& seg;
  RunScratch& sc;
  DeviceType device;
  const Target* tgt = nullptr;  // null: no JIT backend for the device (kernels run on the interpreter)
  Segment rewritten;  // the segment after the graph passes, when they rewrote it
  const Segment* target = nullptr;  // the segment the schedule sees
  std::unordered_map<const Node*, int> pos;  // node -> extended position, or -(k + 1) for external k
  std::vector<Step> steps;
  std::vector<std::shared_ptr<CompiledKernel>> kernels;  // per step (null: interpreter, or deferred)
  std::vector<bool> deferred;  // pointwise kernel steps compiled last, alone or in horizontal kernels
};

// The node a view reads through: its base (a view is materialized from its base's storage);
// null for a node that is no view.
const Node* view_base(const Node* n);

// The steps reordered for a lower peak of live bytes where a list schedule finds one
// (plan_order.cpp).
void order_steps_for_memory(Planning& p);

// Pointwise kernel steps that may run in a horizontal kernel (compiled last), when the schedule
// has two or more; steps a GEMM or a split reduction may take as its epilogue are not.
std::vector<bool> horizontal_candidates(const std::vector<Step>& steps);

// Pointwise kernel steps whose arguments exceed the target's launch limit (Target::max_arg_bytes),
// split by their outputs into kernels that fit (split_wide.cpp).
void split_wide_kernels(Planning& p);

// The fusions across steps (plan_fusions.cpp), each deciding where it applies:
// a CPU GEMM and the pointwise kernel after it, run on the GEMM's row blocks;
void fuse_gemm_epilogues(Planning& p);
// a device GEMM + bias (+ ReLU), one call of the device runtime;
void fuse_gemm_bias(Planning& p);
// a device split reduction and its 0-d tail, one combine kernel;
void fuse_split_tails(Planning& p);
// independent pointwise kernels (an optimizer's per-parameter updates), one horizontal launch;
// the deferred steps that join none are compiled alone.
void batch_horizontal(Planning& p);

// The release schedule (Plan::release_after): each segment node that is not needed after the run
// (nor a needed view's base, nor the source of a rewrite's storage share) is released after the
// last step that reads it (plan_lifetimes.cpp).
void plan_releases(Planning& p);

// The external inputs each kernel step reads last and alone (PlanStep::last_reader_of; reads
// through views of them included): where a donated output may take an input's storage.
void plan_last_readers(Planning& p);

}  // namespace kiln::jit
