// Kernels too wide for their device's launch: a pointwise kernel whose arguments (buffers and
// parameters) exceed Target::max_arg_bytes (or KILN_KERNEL_ARG_BYTES) is split by its outputs into narrower kernels, each
// recomputing the nodes its outputs need. Without it such a kernel (an optimizer's update of
// every same-shaped parameter fused into one) ran on the interpreter.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <unordered_set>

#include "jit/backend/backend.h"
#include "jit/diag/diagnostics.h"
#include "jit/exec/jit_executor.h"
#include "jit/exec/plan_passes.h"

namespace kiln::jit {
namespace {

std::atomic<uint64_t> g_splits{0};

// The bytes of arguments `g`'s kernel takes (launch_arg_bytes), or 0 when it cannot be lowered
// (compile_steps meets that error).
size_t arg_bytes(const Group& g, const Target& t) {
  try {
    return launch_arg_bytes(lower(g, t)->kernel);  // (the lowering lives to the end of the expression)
  } catch (const std::exception&) {
    return 0;
  }
}

// The part of pointwise group `g` computing outputs [lo, hi): those outputs and every node of `g`
// they read (recomputed in each part that reads it), in `g`'s order.
Group part_of(const Group& g, size_t lo, size_t hi) {
  Group part;
  part.domain = g.domain;
  std::unordered_set<const Node*> inside(g.nodes.begin(), g.nodes.end()), need;
  std::vector<const Node*> todo(g.outputs.begin() + static_cast<std::ptrdiff_t>(lo),
                                g.outputs.begin() + static_cast<std::ptrdiff_t>(hi));
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (!inside.count(n) || !need.insert(n).second) continue;
    for (const NodePtr& in : n->inputs) todo.push_back(in.get());
  }
  for (Node* n : g.nodes)
    if (need.count(n)) part.nodes.push_back(n);
  for (size_t i = lo; i < hi; ++i) {
    part.outputs.push_back(g.outputs[i]);
    if (i < g.why.size()) part.why.push_back(g.why[i]);
  }
  const std::vector<Node*> ins = canonical_inputs(part);
  for (Node* in : g.inputs)
    if (std::find(ins.begin(), ins.end(), in) != ins.end()) part.inputs.push_back(in);
  return part;
}

// `g` as kernels within `limit` bytes of arguments (itself when it fits or cannot be split).
void split_group(const Group& g, const Target& t, size_t limit, std::vector<Group>& out) {
  const size_t bytes = arg_bytes(g, t);
  const bool pointwise = g.reduce_dims.empty() && !g.split;
  if (bytes <= limit || !pointwise || g.outputs.size() < 2) {
    out.push_back(g);
    return;
  }
  const size_t half = g.outputs.size() / 2;
  split_group(part_of(g, 0, half), t, limit, out);
  split_group(part_of(g, half, g.outputs.size()), t, limit, out);
}

// The argument bytes above which kernels are split: the target's launch limit, or
// KILN_KERNEL_ARG_BYTES where that is lower (on any device: narrower kernels, and the split tested
// where the launch has no limit); 0: none.
size_t arg_limit(const Target& t) {
  static const size_t env = [] {
    const char* v = std::getenv("KILN_KERNEL_ARG_BYTES");
    return v && *v ? static_cast<size_t>(std::max(256LL, std::atoll(v))) : size_t{0};
  }();
  const size_t own = static_cast<size_t>(t.max_arg_bytes);
  return own && env ? std::min(own, env) : own ? own : env;
}

}  // namespace

void split_wide_kernels(Planning& p) {
  const size_t limit = p.tgt ? arg_limit(*p.tgt) : 0;
  if (!limit) return;
  std::vector<Step> steps;
  steps.reserve(p.steps.size());
  for (Step& st : p.steps) {
    // (8 bytes a buffer: a group of fewer inputs and outputs than a quarter of the limit fits)
    const size_t buffers = st.kind == Step::Kind::Kernel ? st.group.outputs.size() + canonical_inputs(st.group).size() : 0;
    if (st.kind != Step::Kind::Kernel || 8 * buffers * 4 < limit) {
      steps.push_back(std::move(st));
      continue;
    }
    std::vector<Group> parts;
    split_group(st.group, *p.tgt, limit, parts);
    if (parts.size() > 1) g_splits.fetch_add(1, std::memory_order_relaxed);
    if (parts.size() > 1 && log_enabled("fusion"))
      log_line("fusion", "a kernel of " + std::to_string(st.group.outputs.size()) + " outputs needs more than " +
                          std::to_string(limit) + " bytes of arguments: split into " + std::to_string(parts.size()) +
                          " kernels");
    for (Group& g : parts) {
      Step s{Step::Kind::Kernel};
      s.group = std::move(g);
      steps.push_back(std::move(s));
    }
  }
  p.steps = std::move(steps);
}

uint64_t wide_kernel_splits() { return g_splits.load(); }

}  // namespace kiln::jit
