// The release schedule of a plan: which of the segment's nodes give their storage back after
// which step. Made once with the plan, in segment positions (the plan is shared by every run
// and every thread with its signature, whose nodes sit at the same positions).
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "jit/exec/plan_passes.h"

namespace kiln::jit {

const Node* view_base(const Node* n) { return is_view_op(n->op) && !n->inputs.empty() ? n->inputs[0].get() : nullptr; }

namespace {

// The step at which each step's reads happen: its own, or, for a member of a horizontal kernel,
// the step after which that kernel launches.
std::vector<size_t> read_times(const Plan& plan) {
  std::vector<size_t> when(plan.steps.size());
  for (size_t si = 0; si < plan.steps.size(); ++si) {
    if (!when[si]) when[si] = si;
    for (int b : plan.steps[si].batches_after)
      for (int m : plan.batches[static_cast<size_t>(b)].members) when[static_cast<size_t>(m)] = si;
  }
  return when;
}

// The nodes no release may touch: needed ones and the bases they are views of, and the sources
// of the rewrites' storage shares (taken over after the run).
std::unordered_set<const Node*> kept_nodes(const Planning& p) {
  std::unordered_set<const Node*> keep;
  for (size_t i = 0; i < p.seg.nodes.size(); ++i)
    if (p.seg.needed[i])
      for (const Node* n = p.seg.nodes[i]; n && keep.insert(n).second;) n = view_base(n);
  for (const auto& sh : p.plan.rw.shares) keep.insert(p.sc.ext[static_cast<size_t>(sh.from)]);
  for (const auto& sh : p.plan.patterns.shares) keep.insert(p.sc.patterned_ext[static_cast<size_t>(sh.from)]);
  return keep;
}

// Every read of the plan's steps at its read time t: at_pos(pos, t) for a kernel's (or a GEMM
// bias's) input, a position of the extended segment or an external input (-(k + 1)); at_node(n,
// t) for a library or view step's input node. (A step fused into the previous one as its
// epilogue reads at the same time or later.)
template <class AtPos, class AtNode>
void for_each_read(const Plan& plan, const std::vector<Node*>& ext, AtPos at_pos, AtNode at_node) {
  const std::vector<size_t> when = read_times(plan);
  for (size_t si = 0; si < plan.steps.size(); ++si) {
    const PlanStep& s = plan.steps[si];
    if (s.kind == Step::Kind::Kernel)
      for (int i : s.inputs) at_pos(i, when[si]);
    else
      for (const NodePtr& in : ext[static_cast<size_t>(s.node)]->inputs) at_node(in.get(), when[si]);
    if (s.gemm_bias) at_pos(s.bias, when[si]);
  }
}

// The last step reading each node, external inputs included (a read of a view reads its bases
// too).
std::unordered_map<const Node*, size_t> last_reads(const Planning& p) {
  const std::vector<Node*>& ext = p.sc.ext;
  std::unordered_map<const Node*, size_t> last;
  auto read = [&](const Node* n, size_t t) {
    for (; n; n = view_base(n)) last[n] = std::max(last[n], t);
  };
  auto read_at = [&](int pos, size_t t) {
    read(pos >= 0 ? ext[static_cast<size_t>(pos)] : p.sc.externals[static_cast<size_t>(-pos - 1)], t);
  };
  for_each_read(p.plan, ext, read_at, read);
  return last;
}

}  // namespace

void plan_releases(Planning& p) {
  if (p.plan.steps.size() < 2) return;  // (one step: nothing is read after another step)
  const std::unordered_set<const Node*> keep = kept_nodes(p);
  const std::unordered_map<const Node*, size_t> last = last_reads(p);
  p.plan.release_after.assign(p.plan.steps.size(), {});
  for (size_t i = 0; i < p.seg.nodes.size(); ++i) {
    auto it = last.find(p.seg.nodes[i]);
    if (it == last.end() || keep.count(p.seg.nodes[i])) continue;
    p.plan.release_after[it->second].push_back(static_cast<int>(i));
  }
  // External inputs too, as -(k + 1): a run gives them back only where the segment alone held
  // them (launch.cpp).
  for (size_t k = 0; k < p.sc.externals.size(); ++k) {
    auto it = last.find(p.sc.externals[k]);
    if (it == last.end() || keep.count(p.sc.externals[k])) continue;
    p.plan.release_after[it->second].push_back(-static_cast<int>(k) - 1);
  }
}

void plan_last_readers(Planning& p) {
  Plan& plan = p.plan;
  const std::vector<Node*>& ext = p.sc.ext;
  const std::vector<Node*>& externals = p.sc.externals;
  const std::vector<size_t> when = read_times(plan);
  std::unordered_map<const Node*, int> index;
  for (size_t k = 0; k < externals.size(); ++k) index[externals[k]] = static_cast<int>(k);
  // Per external: the last read time and how many reads happen then.
  std::vector<size_t> last(externals.size(), 0);
  std::vector<int> reads_then(externals.size(), 0);
  auto note = [&](int k, size_t t) {
    const size_t u = static_cast<size_t>(k);
    if (reads_then[u] == 0 || t > last[u]) {
      last[u] = t;
      reads_then[u] = 1;
    } else if (t == last[u]) {
      ++reads_then[u];
    }
  };
  auto read_node = [&](const Node* n, size_t t) {
    for (; n; n = view_base(n)) {
      auto it = index.find(n);
      if (it != index.end()) note(it->second, t);
    }
  };
  auto read_at = [&](int pos, size_t t) {
    if (pos < 0)
      note(-pos - 1, t);
    else
      read_node(ext[static_cast<size_t>(pos)], t);
  };
  for_each_read(plan, ext, read_at, read_node);
  for (size_t si = 0; si < plan.steps.size(); ++si) {
    PlanStep& s = plan.steps[si];
    s.last_reader_of.clear();
    if (s.kind != Step::Kind::Kernel || s.fused) continue;
    for (int i : s.inputs)
      if (i < 0 && last[static_cast<size_t>(-i - 1)] == when[si] && reads_then[static_cast<size_t>(-i - 1)] == 1)
        s.last_reader_of.push_back(-i - 1);
  }
}

}  // namespace kiln::jit
