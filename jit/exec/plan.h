// A segment's plan: its schedule as steps, the fusions chosen across steps (GEMM epilogues,
// split-reduction tails, horizontal kernels), the rewrites it applies and the constant values
// they rely on. Made once per segment structure (make_plan.cpp, a pipeline of named planning
// passes) and run many times (launch.cpp); the executor caches plans by segment signature.
#pragma once
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "jit/exec/code_cache.h"
#include "jit/graph/passes.h"
#include "jit/graph/scheduler.h"
#include "jit/loop/lower.h"

namespace kiln::jit {

struct PlanStep {
  Step::Kind kind;
  int node = -1;  // Opaque / View
  std::vector<int> nodes, outputs;  // Kernel: extended positions (segment, then folded constants)
  std::vector<int> inputs;  // Kernel: canonical inputs, positions or -(k + 1) = external k
  std::vector<int64_t> domain, reduce_dims;
  int64_t work = 1;  // elements of the domain
  bool split = false;
  std::shared_ptr<CompiledKernel> ck;  // null: interpreter fallback
  bool epilogue = false;  // Opaque GEMM: the next (pointwise) step runs on its row blocks;
                          // device split Kernel: the next (0-d) step runs in its combine kernel
  bool fused = false;  // Kernel: run as the previous step's epilogue
  bool in_place = false;  // Opaque GEMM with an epilogue: the epilogue's one output is written over
                          // the product (nothing else reads it), element for element
  std::shared_ptr<CompiledKernel> combine;  // device split Kernel: combine + the next step's kernel
  std::vector<int> batches_after;  // horizontal kernels (Plan::batches) run right after this step
  bool batched = false;  // Kernel: runs in a horizontal kernel, not in its own slot
  std::shared_ptr<Lowered> lowered;  // batched: its own lowering (binds its arguments)
  // Opaque GEMM on a device: the next step (+ a row vector, then ReLU if `relu`) runs as the
  // GEMM's epilogue (DeviceRuntime::gemm_bias) producing position `bias_out` from `bias`.
  bool gemm_bias = false, relu = false;
  int bias = 0, bias_out = 0;
  // Kernel: the external inputs (index k of -(k + 1)) this step reads last, and alone at its
  // read time: an output donated over one of them (Node::write_over) may take its storage.
  std::vector<int> last_reader_of;
};

// Independent pointwise kernel steps run as one launch.
struct Batch {
  std::vector<int> members;  // kernel steps, in step order
  std::shared_ptr<CompiledKernel> ck;
};

struct Plan {
  std::vector<int64_t> sig;
  std::vector<Batch> batches;
  Rewrite patterns;  // registered rewrites (lazy eager), re-applied on every run before the passes
  Rewrite rw;  // graph passes on the segment `patterns` gives, re-applied on every run
  std::vector<Rewrite::Guard> guards;  // the constant values both rely on, in segment positions
  std::vector<PlanStep> steps;
  // Per step: the segment positions whose storage is given back once it has run (plan_releases;
  // empty for a one-step plan). Without it a segment (a whole compiled training step) held every
  // stored value until its end. A negative entry -(k + 1) is external input k, given back only
  // in a run where the segment held the only references to it (RunScratch::extern_sole): the
  // saved activations a lazy backward reads, freed as it passes them, as PyTorch's engine does.
  std::vector<std::vector<int>> release_after;
  // The most bytes the steps hold live at once over the schedule: what the steps make and the
  // external inputs the segment alone held, each from its step to its last reader (plan_order.cpp's
  // model; the lower bound a run of this order can reach).
  double live_peak_bytes = 0;
};

// A kernel's arguments for one launch: buffers (inputs, fresh outputs, scratch) and parameters.
struct Binding {
  std::vector<char*> buffers;
  BoundArgs args;
  std::vector<std::shared_ptr<Storage>> out_storage;
  std::vector<std::vector<char>> partials;  // scratch on the host
  std::vector<std::shared_ptr<Storage>> device_partials;  // scratch on a device
  // Scratch buffer `i` (split-reduction partials), wherever it lives.
  char* scratch(size_t i) {
    return device_partials.empty() ? partials[i].data() : static_cast<char*>(device_partials[i]->data);
  }
};

// Per-thread buffers of one run (a nested run on the same thread gets fresh ones).
struct RunScratch {
  std::vector<int64_t> sig;
  std::vector<Node*> externals, ext, ins;
  std::vector<Node*> patterned_ext;  // the segment's nodes and the made ones (Plan::patterns)
  Segment patterned;
  std::unordered_map<const Node*, int> extern_ids;  // only for segments with many external inputs
  // Per external input: its references beyond the segment's own edges when the signature was
  // taken (0: no tensor handle nor node outside the segment holds it).
  std::vector<long> extern_held;
  bool extern_sole(size_t k) const { return extern_held[k] == 0; }
  Group group;
  Binding binding;
  // Horizontal kernels: each member's binding, and the arguments of the one launch.
  std::vector<Binding> members;
  std::vector<char*> batch_buffers;
  std::vector<int64_t> batch_ip;
  std::vector<double> batch_fp;
  std::vector<Node*> batch_outputs;
  bool busy = false;
};

// Plans `seg`, whose signature is in `sc` (segment_signature.h): the registered rewrites and
// graph passes (when `passes`), the schedule, its kernels and the fusions across steps. Leaves
// `sc.ext` naming the node of every extended position.
std::shared_ptr<const Plan> make_plan(Segment& seg, RunScratch& sc, bool passes = true);
// A cached plan's rewrites applied to a new segment of its signature (`sc.ext` as make_plan).
void apply_rewrites(const Plan& plan, Segment& seg, RunScratch& sc);

}  // namespace kiln::jit
