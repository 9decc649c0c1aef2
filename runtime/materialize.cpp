// Materialization: collect the pending subgraph of the requested nodes and run it.
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "runtime/executor.h"
#include "runtime/trace.h"

namespace kiln {
namespace {
std::atomic<uint64_t> g_recorded{0}, g_executed{0}, g_materializations{0};
std::atomic<int64_t> g_pending{0};
std::atomic<uint64_t> g_pending_limit{10000};
std::mutex g_exec_mu;
std::shared_ptr<Executor> g_executor;
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
}

Executor& current_executor() {
  std::lock_guard<std::mutex> lock(g_exec_mu);
  if (!g_executor) g_executor = interpreter();
  return *g_executor;
}

void materialize(const std::vector<NodePtr>& roots) {
  // Iterative post-order DFS over unmaterialized nodes.
  std::vector<Node*> order;
  std::unordered_map<Node*, int> state;  // 1 = visiting, 2 = done
  std::vector<std::pair<Node*, size_t>> stack;
  for (const auto& r : roots) {
    if (!r || r->materialized() || state.count(r.get())) continue;
    stack.push_back({r.get(), 0});
    state[r.get()] = 1;
    while (!stack.empty()) {
      auto& [n, i] = stack.back();
      if (i < n->inputs.size()) {
        Node* in = n->inputs[i++].get();
        if (!in->materialized() && !state.count(in)) {
          state[in] = 1;
          stack.push_back({in, 0});
        }
      } else {
        state[n] = 2;
        order.push_back(n);
        stack.pop_back();
      }
    }
  }
  if (order.empty()) return;
  if (auto* o = detail::trace_observer()) o->on_materialize(order);
  // A node is needed after the run if something outside the segment holds it: a tensor
  // handle or a node not in this segment (use_count beyond the segment's own edges).
  std::unordered_map<Node*, long> internal;
  for (Node* n : order)
    for (auto& in : n->inputs) internal[in.get()]++;
  std::unordered_map<Node*, bool> is_root;
  for (const auto& r : roots) is_root[r.get()] = true;
  Segment seg;
  seg.nodes = order;
  seg.needed.resize(order.size());
  // Find each node's owning shared_ptr use_count via an input edge or a root.
  std::unordered_map<Node*, long> uses;
  for (Node* n : order)
    for (auto& in : n->inputs) uses[in.get()] = in.use_count();
  for (size_t i = 0; i < order.size(); ++i) {
    Node* n = order[i];
    bool needed = is_root.count(n) > 0;
    if (!needed) {
      auto it = uses.find(n);
      long total = it == uses.end() ? 0 : it->second;
      needed = total > internal[n];
    }
    seg.needed[i] = needed;
  }
  // Own every node while the executor runs (after the use counts above were taken).
  for (const auto& r : roots)
    if (r && !r->materialized()) seg.keep_alive.push_back(r);
  for (Node* n : order)
    for (auto& in : n->inputs)
      if (!in->materialized()) seg.keep_alive.push_back(in);
  g_materializations.fetch_add(1, std::memory_order_relaxed);
  current_executor().run(seg);
  detail::count_executed(order.size());
  for (Node* n : order)
    if (n->materialized()) n->inputs.clear();
}

}  // namespace kiln
