// Materialization: collect the pending subgraph of the requested nodes and run it.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <memory>

#include "runtime/executor.h"
#include "runtime/trace.h"

namespace kiln {
namespace {
std::atomic<uint64_t> g_recorded{0}, g_executed{0}, g_materializations{0};
std::atomic<int64_t> g_pending{0};
std::atomic<uint64_t> g_pending_limit{10000};
std::mutex g_exec_mu;
std::shared_ptr<Executor> g_executor;
// Every executor ever installed stays alive, so a run that read g_current may finish on it
// while another thread installs a different one.
std::vector<std::shared_ptr<Executor>> g_installed;
std::atomic<Executor*> g_current{nullptr};
}  // namespace

namespace detail {
void count_recorded() { g_recorded.fetch_add(1, std::memory_order_relaxed); }
void count_executed(uint64_t n) { g_executed.fetch_add(n, std::memory_order_relaxed); }
void pending_add(int64_t d) { g_pending.fetch_add(d, std::memory_order_relaxed); }
}  // namespace detail

Stats stats() {
  Stats s;
  s.nodes_recorded = g_recorded.load();
  s.nodes_executed = g_executed.load();
  s.materializations = g_materializations.load();
  int64_t p = g_pending.load();
  s.pending = p > 0 ? static_cast<uint64_t>(p) : 0;
  return s;
}

void reset_stats() {
  g_recorded = 0;
  g_executed = 0;
  g_materializations = 0;
}

void set_pending_limit(uint64_t n) { g_pending_limit = n; }
uint64_t pending_limit() { return g_pending_limit.load(); }

void set_executor(std::shared_ptr<Executor> ex) {
  std::lock_guard<std::mutex> lock(g_exec_mu);
  g_executor = std::move(ex);
  if (g_executor && std::find(g_installed.begin(), g_installed.end(), g_executor) == g_installed.end())
    g_installed.push_back(g_executor);
  g_current.store(g_executor.get(), std::memory_order_release);
}

Executor& current_executor() {
  if (Executor* e = g_current.load(std::memory_order_acquire)) return *e;
  std::lock_guard<std::mutex> lock(g_exec_mu);
  if (!g_executor) {
    g_executor = interpreter();
    g_installed.push_back(g_executor);
    g_current.store(g_executor.get(), std::memory_order_release);
  }
  return *g_executor;
}

namespace {
std::atomic<uint32_t> g_epoch{0};

// Reusable buffers of one materialize() call; nested calls on a thread get their own.
struct Scratch {
  std::vector<Node*> order;
  std::vector<std::pair<Node*, size_t>> stack;
  std::vector<int32_t> internal;  // per segment position: edges from inside the segment
  Segment seg;
};
thread_local std::vector<std::unique_ptr<Scratch>> t_scratch;
thread_local size_t t_depth = 0;

void materialize_roots(const NodePtr* roots, size_t nroots) {
  if (t_scratch.size() <= t_depth) t_scratch.push_back(std::make_unique<Scratch>());
  Scratch& sc = *t_scratch[t_depth];
  struct Depth {
    Depth() { ++t_depth; }
    ~Depth() { --t_depth; }
  } depth;
  // Iterative post-order DFS over unmaterialized nodes; a node is visited when its mark is
  // this call's epoch (0 is never used, so fresh nodes are unvisited).
  uint32_t epoch = g_epoch.fetch_add(1, std::memory_order_relaxed) + 1;
  if (epoch == 0) epoch = g_epoch.fetch_add(1, std::memory_order_relaxed) + 1;
  std::vector<Node*>& order = sc.order;
  auto& stack = sc.stack;
  order.clear();
  for (size_t r = 0; r < nroots; ++r) {
    Node* root = roots[r].get();
    if (!root || root->materialized() || root->mark == epoch) continue;
    stack.push_back({root, 0});
    root->mark = epoch;
    while (!stack.empty()) {
      auto& [n, i] = stack.back();
      if (i < n->inputs.size()) {
        Node* in = n->inputs[i++].get();
        if (!in->materialized() && in->mark != epoch) {
          in->mark = epoch;
          stack.push_back({in, 0});
        }
      } else {
        n->pos = static_cast<int32_t>(order.size());
        order.push_back(n);
        stack.pop_back();
      }
    }
  }
  if (order.empty()) return;
  if (auto* o = detail::trace_observer(); o && o->on_materialize(order, roots, nroots)) return;
  // A node is needed after the run if something outside the segment holds it: a tensor
  // handle or a node not in this segment (use_count beyond the segment's own edges).
  sc.internal.assign(order.size(), 0);
  for (Node* n : order)
    for (auto& in : n->inputs)
      if (!in->materialized()) sc.internal[in->pos]++;
  Segment& seg = sc.seg;
  seg.nodes.assign(order.begin(), order.end());
  seg.needed.assign(order.size(), false);
  for (size_t r = 0; r < nroots; ++r)
    if (roots[r] && !roots[r]->materialized()) seg.needed[roots[r]->pos] = true;
  for (size_t i = 0; i < order.size(); ++i)
    if (!seg.needed[i]) seg.needed[i] = order[i]->weak_from_this().use_count() > sc.internal[i];
  // The roots' owners keep every node alive through edges; what an executor unlinks it adds
  // to keep_alive, released below after the segment's nodes are cut loose.
  seg.keep_alive.clear();
  struct Release {  // drops the segment's references even when the executor throws
    Segment& s;
    ~Release() {
      s.keep_alive.clear();
      s.nodes.clear();
    }
  } release{seg};
  g_materializations.fetch_add(1, std::memory_order_relaxed);
  current_executor().run(seg);
  detail::count_executed(order.size());
  for (Node* n : order)
    if (n->materialized()) n->inputs.clear();
}
}  // namespace

void materialize(const std::vector<NodePtr>& roots) { materialize_roots(roots.data(), roots.size()); }
void materialize(const NodePtr& root) { materialize_roots(&root, 1); }

}  // namespace kiln
