// The order of a schedule's steps for memory: the scheduler emits steps in the segment's
// topological order, which materialize() collects depth-first from the roots. A backward
// collected from its first weight gradient computes the whole chain of activation gradients
// before any weight gradient reads them, and holds them all (a lazy GPT-M backward: 850 MiB over
// its saved activations). Here the steps are list-scheduled as XLA's memory scheduler does: among
// the steps whose inputs are computed, the one that frees the most bytes net of what it
// allocates runs next (ties: the scheduler's order), and a step that read the step before it in
// the scheduler's order still follows it (GEMM epilogues, split tails). The new order is kept
// only where its peak of live bytes, simulated over the steps, is lower.
#include <algorithm>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "jit/diag/diagnostics.h"
#include "jit/exec/plan_passes.h"

namespace kiln::jit {
namespace {

// One value the steps hold: a stored node (a step's output, or an external input the segment
// alone holds), its bytes, and how many steps read it.
struct Buffer {
  double bytes = 0;
  int readers = 0;
  bool kept = false;  // needed after the run (or an external input others hold): never freed
};

struct StepGraph {
  std::vector<std::vector<int>> deps;  // per step: the steps it waits for
  std::vector<std::vector<int>> reads;  // per step: the buffers it reads (each once)
  std::vector<std::vector<int>> writes;  // per step: the buffers it makes
  std::vector<Buffer> buffers;
  std::vector<double> start_bytes;  // (held before the first step: external inputs)
  // Per step: the next step in the scheduler's order may run as its epilogue (a library op, or a
  // split reduction, then a kernel): where that next step reads it, it stays next.
  std::vector<char> takes_epilogue;
};

std::string mib(double bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f", bytes / 1048576.0);
  return s;
}

double bytes_of(const Node& n) {
  double e = static_cast<double>(itemsize(n.dtype));
  for (const auto& d : n.shape) e *= static_cast<double>(d.maybe_int().value_or(1));
  return e;
}

std::vector<Node*> step_outputs(const Step& s) {
  if (s.kind == Step::Kind::Kernel) return s.group.outputs;
  return {s.node};
}

std::vector<Node*> step_reads(const Step& s) {
  if (s.kind == Step::Kind::Kernel) return s.group.inputs;
  std::vector<Node*> r;
  for (const NodePtr& in : s.node->inputs) r.push_back(in.get());
  return r;
}

StepGraph step_graph(const Planning& p) {
  const std::vector<Step>& steps = p.steps;
  const Segment& seg = *p.target;
  StepGraph g;
  g.deps.resize(steps.size());
  g.reads.resize(steps.size());
  g.writes.resize(steps.size());
  g.takes_epilogue.assign(steps.size(), 0);
  for (size_t si = 0; si + 1 < steps.size(); ++si)
    g.takes_epilogue[si] = steps[si + 1].kind == Step::Kind::Kernel &&
                           (steps[si].kind == Step::Kind::Opaque ||
                            (steps[si].kind == Step::Kind::Kernel && steps[si].group.split));
  std::unordered_map<const Node*, int> in_seg, producer, buffer;
  for (size_t i = 0; i < seg.nodes.size(); ++i) in_seg[seg.nodes[i]] = static_cast<int>(i);
  std::unordered_set<const Node*> kept;
  for (size_t i = 0; i < seg.nodes.size(); ++i)
    if (seg.needed[i])
      for (const Node* n = seg.nodes[i]; n && kept.insert(n).second;) n = view_base(n);
  auto buffer_of = [&](const Node* n, bool external) {
    auto [it, fresh] = buffer.emplace(n, static_cast<int>(g.buffers.size()));
    if (fresh) g.buffers.push_back({bytes_of(*n), 0, kept.count(n) > 0 || external});
    return it->second;
  };
  for (size_t si = 0; si < steps.size(); ++si)
    for (Node* o : step_outputs(steps[si])) {
      producer[o] = static_cast<int>(si);
      if (steps[si].kind != Step::Kind::View) g.writes[si].push_back(buffer_of(o, false));
    }
  // An external input the segment alone holds is freed after its last reader (launch.cpp).
  std::unordered_map<const Node*, bool> sole;
  for (size_t k = 0; k < p.sc.externals.size() && k < p.sc.extern_held.size(); ++k)
    sole[p.sc.externals[k]] = p.sc.extern_sole(k);
  for (size_t si = 0; si < steps.size(); ++si) {
    std::unordered_set<int> deps, reads;
    for (Node* r : step_reads(steps[si])) {
      // Through views to the storage they share: every producer on the way is waited for.
      const Node* v = r;
      for (;;) {
        auto pr = producer.find(v);
        if (pr != producer.end() && pr->second != static_cast<int>(si)) deps.insert(pr->second);
        if (!in_seg.count(v) || !view_base(v)) break;
        v = view_base(v);
      }
      if (producer.count(v) && steps[static_cast<size_t>(producer.at(v))].kind != Step::Kind::View) {
        reads.insert(buffer.at(v));
      } else if (!in_seg.count(v) && v->materialized()) {
        auto s = sole.find(v);
        const bool ours = s != sole.end() && s->second;
        const int b = buffer_of(v, !ours);
        if (ours && g.buffers[static_cast<size_t>(b)].readers == 0) g.start_bytes.push_back(g.buffers[static_cast<size_t>(b)].bytes);
        reads.insert(b);
      }
    }
    g.deps[si].assign(deps.begin(), deps.end());
    g.reads[si].assign(reads.begin(), reads.end());
    for (int b : reads) g.buffers[static_cast<size_t>(b)].readers++;
  }
  return g;
}

// The most bytes live at once when the steps run in `order`.
double simulated_peak(const StepGraph& g, const std::vector<int>& order) {
  std::vector<int> left(g.buffers.size());
  for (size_t b = 0; b < g.buffers.size(); ++b) left[b] = g.buffers[b].readers;
  double live = 0;
  for (double b : g.start_bytes) live += b;
  double peak = live;
  for (int s : order) {
    for (int b : g.writes[static_cast<size_t>(s)]) live += g.buffers[static_cast<size_t>(b)].bytes;
    peak = std::max(peak, live);
    for (int b : g.reads[static_cast<size_t>(s)])
      if (--left[static_cast<size_t>(b)] == 0 && !g.buffers[static_cast<size_t>(b)].kept)
        live -= g.buffers[static_cast<size_t>(b)].bytes;
    for (int b : g.writes[static_cast<size_t>(s)])
      if (g.buffers[static_cast<size_t>(b)].readers == 0 && !g.buffers[static_cast<size_t>(b)].kept)
        live -= g.buffers[static_cast<size_t>(b)].bytes;
  }
  return peak;
}

// Whether step `s` is `t`'s epilogue in the scheduler's order: right after it, reading it.
bool epilogue_of(const StepGraph& g, int s, int t) {
  const auto& d = g.deps[static_cast<size_t>(s)];
  return s == t + 1 && g.takes_epilogue[static_cast<size_t>(t)] && std::find(d.begin(), d.end(), t) != d.end();
}

// The list schedule: the ready step freeing the most bytes net of what it makes runs next.
std::vector<int> list_schedule(const StepGraph& g) {
  const size_t n = g.deps.size();
  std::vector<std::vector<int>> users(n);
  std::vector<int> waiting(n, 0);
  for (size_t s = 0; s < n; ++s) {
    waiting[s] = static_cast<int>(g.deps[s].size());
    for (int d : g.deps[s]) users[static_cast<size_t>(d)].push_back(static_cast<int>(s));
  }
  std::vector<int> left(g.buffers.size());
  for (size_t b = 0; b < g.buffers.size(); ++b) left[b] = g.buffers[b].readers;
  std::vector<int> ready, order;
  for (size_t s = 0; s < n; ++s)
    if (!waiting[s]) ready.push_back(static_cast<int>(s));
  auto score = [&](int s) {
    double net = 0;
    for (int b : g.reads[static_cast<size_t>(s)])
      if (left[static_cast<size_t>(b)] == 1 && !g.buffers[static_cast<size_t>(b)].kept)
        net += g.buffers[static_cast<size_t>(b)].bytes;
    for (int b : g.writes[static_cast<size_t>(s)]) net -= g.buffers[static_cast<size_t>(b)].bytes;
    return net;
  };
  int last = -1;
  while (!ready.empty()) {
    size_t pick = 0;
    bool follow = false;  // the last step's epilogue stays right after it
    for (size_t i = 0; i < ready.size() && last >= 0; ++i)
      if (epilogue_of(g, ready[i], last)) {
        pick = i;
        follow = true;
      }
    if (!follow) {
      double best = score(ready[0]);
      for (size_t i = 1; i < ready.size(); ++i) {
        const double sc = score(ready[i]);
        if (sc > best || (sc == best && ready[i] < ready[pick])) {
          best = sc;
          pick = i;
        }
      }
    }
    const int s = ready[pick];
    ready[pick] = ready.back();
    ready.pop_back();
    order.push_back(s);
    last = s;
    for (int b : g.reads[static_cast<size_t>(s)]) --left[static_cast<size_t>(b)];
    for (int u : users[static_cast<size_t>(s)])
      if (--waiting[static_cast<size_t>(u)] == 0) ready.push_back(u);
  }
  return order;
}

}  // namespace

void order_steps_for_memory(Planning& p) {
  const StepGraph g = step_graph(p);
  std::vector<int> given(p.steps.size());
  for (size_t i = 0; i < given.size(); ++i) given[i] = static_cast<int>(i);
  const double given_peak = simulated_peak(g, given);
  p.plan.live_peak_bytes = given_peak;
  if (p.steps.size() < 3) return;
  const std::vector<int> order = list_schedule(g);
  const double peak = order.size() == given.size() ? simulated_peak(g, order) : given_peak;
  if (log_enabled("memory") && p.steps.size() > 16)
    log_line("memory", "plan of " + std::to_string(p.steps.size()) + " steps: " + mib(std::min(peak, given_peak)) +
                           " MiB live at most over its schedule (" + mib(given_peak) + " MiB in the scheduler's order)");
  if (peak >= given_peak) return;
  p.plan.live_peak_bytes = peak;
  std::vector<Step> steps;
  steps.reserve(order.size());
  for (int s : order) steps.push_back(std::move(p.steps[static_cast<size_t>(s)]));
  p.steps = std::move(steps);
}

}  // namespace kiln::jit
