#include "jit/compile/partition.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <set>
#include <unordered_map>

#include "jit/compile/program.h"

namespace kiln::jit {
namespace {

constexpr double kInf = 1e300;

// Dinic's max-flow on a small dense-ish graph.
class FlowNetwork {
 public:
  explicit FlowNetwork(int n) : adj_(n), level_(n), it_(n) {}
  void add(int u, int v, double cap) {
    adj_[u].push_back(static_cast<int>(edges_.size()));
    edges_.push_back({v, cap});
    adj_[v].push_back(static_cast<int>(edges_.size()));
    edges_.push_back({u, 0});
  }
  double max_flow(int s, int t) {
    double flow = 0;
    while (bfs(s, t)) {
      std::fill(it_.begin(), it_.end(), 0);
      while (double f = dfs(s, t, kInf)) flow += f;
    }
    return flow;
  }
  // Vertices reachable from s in the residual graph (the source side of a min cut).
  std::vector<bool> source_side(int s) const {
    std::vector<bool> seen(adj_.size());
    std::vector<int> stack{s};
    seen[s] = true;
    while (!stack.empty()) {
      int u = stack.back();
      stack.pop_back();
      for (int e : adj_[u])
        if (edges_[e].cap > 1e-9 && !seen[edges_[e].to]) {
          seen[edges_[e].to] = true;
          stack.push_back(edges_[e].to);
        }
    }
    return seen;
  }

 private:
  struct E {
    int to;
    double cap;
  };
  bool bfs(int s, int t) {
    std::fill(level_.begin(), level_.end(), -1);
    std::queue<int> q;
    level_[s] = 0;
    q.push(s);
    while (!q.empty()) {
      int u = q.front();
      q.pop();
      for (int e : adj_[u])
        if (edges_[e].cap > 1e-9 && level_[edges_[e].to] < 0) {
          level_[edges_[e].to] = level_[u] + 1;
          q.push(edges_[e].to);
        }
    }
    return level_[t] >= 0;
  }
  double dfs(int u, int t, double f) {
    if (u == t) return f;
    for (size_t& i = it_[u]; i < adj_[u].size(); ++i) {
      E& e = edges_[adj_[u][i]];
      if (e.cap > 1e-9 && level_[e.to] == level_[u] + 1) {
        double d = dfs(e.to, t, std::min(f, e.cap));
        if (d > 0) {
          e.cap -= d;
          edges_[adj_[u][i] ^ 1].cap += d;
          return d;
        }
      }
    }
    return 0;
  }
  std::vector<std::vector<int>> adj_;
  std::vector<E> edges_;
  std::vector<int> level_;
  std::vector<size_t> it_;
};

bool is_reduction(OpKind op) { return op >= OpKind::Sum && op <= OpKind::Cumsum; }
bool is_comparison(OpKind op) {
  switch (op) {
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge: return true;
    default: return false;
  }
}

}  // namespace

bool costly_to_recompute(OpKind op) {
  switch (op) {
    case OpKind::Matmul:
    case OpKind::Im2Col:
    case OpKind::Col2Im:
    case OpKind::Cat:
    case OpKind::ViewScatter:
    case OpKind::Attention:
    case OpKind::AttentionBackward:
    case OpKind::Gather:
    case OpKind::Scatter:
    case OpKind::ScatterAdd:
    case OpKind::IndexSelect:
    case OpKind::IndexAdd:
    case OpKind::ToDevice:
    case OpKind::Collective:
    case OpKind::RandUniform:
    case OpKind::RandNormal:
    case OpKind::RandInt: return true;
    default: return is_reduction(op);
  }
}

namespace {

// The joint graph indexed for the cut: every node (leaves first, then the body) by number, and
// which side of the graph each one is on.
struct JointGraph {
  const std::vector<NodePtr>& bwd_outputs;
  const std::function<int64_t(const Node&)>& bytes;
  std::set<const Node*> leaves;
  std::vector<Node*> body;
  std::vector<const Node*> nodes;
  std::unordered_map<const Node*, int> idx;
  std::unordered_map<const Node*, NodePtr> owner;
  int N = 0;
  std::vector<bool> fwd, tan, is_input;  // forward-required, tangent-dependent, inputs
  bool in_graph(const NodePtr& n) const { return idx.count(n.get()) > 0; }
};

void index_joint(JointGraph& g, const std::vector<NodePtr>& inputs, const std::vector<NodePtr>& tangents,
                 const std::vector<NodePtr>& fwd_outputs) {
  for (const auto& n : inputs) g.leaves.insert(n.get());
  for (const auto& n : tangents) g.leaves.insert(n.get());
  std::vector<NodePtr> all_outputs = fwd_outputs;
  all_outputs.insert(all_outputs.end(), g.bwd_outputs.begin(), g.bwd_outputs.end());
  g.body = topo_order(all_outputs, g.leaves);
  // Index every node: leaves first, then the body.
  auto add_node = [&](const Node* n) {
    if (g.idx.count(n)) return;
    g.idx[n] = static_cast<int>(g.nodes.size());
    g.nodes.push_back(n);
  };
  for (const auto& n : inputs) {
    add_node(n.get());
    g.owner[n.get()] = n;
  }
  for (const auto& n : tangents) {
    add_node(n.get());
    g.owner[n.get()] = n;
  }
  for (Node* n : g.body) {
    add_node(n);
    for (const auto& in : n->inputs) g.owner[in.get()] = in;
  }
  for (const auto& n : all_outputs) g.owner[n.get()] = n;
  const int N = g.N = static_cast<int>(g.nodes.size());
  // Forward-required nodes and tangent-dependent nodes.
  g.fwd.assign(N, false);
  g.tan.assign(N, false);
  g.is_input.assign(N, false);
  for (const auto& n : inputs) g.is_input[g.idx[n.get()]] = true;
  {
    std::vector<Node*> f = topo_order(fwd_outputs, g.leaves);
    for (Node* n : f) g.fwd[g.idx[n]] = true;
    for (const auto& n : fwd_outputs)
      if (g.idx.count(n.get())) g.fwd[g.idx[n.get()]] = true;
  }
  for (const auto& n : tangents) g.tan[g.idx[n.get()]] = true;
  for (Node* n : g.body)
    for (const auto& in : n->inputs)
      if (g.idx.count(in.get()) && g.tan[g.idx[in.get()]]) g.tan[g.idx[n]] = true;
}

// Eager autograd's choice: every forward value (or input) some backward op reads.
std::set<int> eager_saved(JointGraph& g) {
  std::set<int> save_all;
  for (Node* n : g.body) {
    int v = g.idx[n];
    if (g.fwd[v]) continue;
    for (const auto& in : n->inputs)
      if (g.in_graph(in)) {
        int u = g.idx[in.get()];
        if ((g.fwd[u] || g.is_input[u]) && !g.tan[u]) save_all.insert(u);
      }
  }
  for (const auto& o : g.bwd_outputs)
    if (g.in_graph(o)) {
      int u = g.idx[o.get()];
      if ((g.fwd[u] || g.is_input[u]) && !g.tan[u]) save_all.insert(u);
    }
  return save_all;
}

double weight(const JointGraph& g, int v) {
  if (!g.is_input[v] && is_view_op(g.nodes[v]->op)) return kInf;  // views are free to recompute
  return static_cast<double>(std::max<int64_t>(g.bytes(*g.nodes[v]), 1));
}

// The cheapest set of forward values to save with `banned` ones never recomputed (into `saved`);
// returns its bytes.
int64_t min_cut(JointGraph& g, const std::set<int>& save_all, const std::set<int>& banned, std::set<int>& saved) {
  const int N = g.N;
  const int S = 2 * N, T = 2 * N + 1;
  FlowNetwork net(2 * N + 2);
  for (int v = 0; v < N; ++v) {
    if (g.is_input[v] || banned.count(v)) net.add(S, 2 * v, kInf);
    if (g.tan[v]) {
      net.add(2 * v, T, kInf);
      continue;
    }
    net.add(2 * v, 2 * v + 1, weight(g, v));
  }
  for (Node* n : g.body)
    for (const auto& in : n->inputs)
      if (g.in_graph(in)) net.add(2 * g.idx[in.get()] + 1, 2 * g.idx[n], kInf);
  for (const auto& o : g.bwd_outputs)
    if (g.in_graph(o) && !g.tan[g.idx[o.get()]]) net.add(2 * g.idx[o.get()] + 1, T, kInf);
  // An uncuttable source-to-sink path (infinite flow) would leave a forward value the
  // backward needs neither saved nor recomputable: save what eager autograd saves instead.
  if (net.max_flow(S, T) >= kInf / 2) {
    saved = save_all;
    int64_t all = 0;
    for (int v : saved) all += g.bytes(*g.nodes[v]);
    return all;
  }
  std::vector<bool> side = net.source_side(S);
  saved.clear();
  int64_t total = 0;
  for (int v = 0; v < N; ++v)
    if (!g.tan[v] && side[2 * v] && !side[2 * v + 1]) {
      saved.insert(v);
      total += g.bytes(*g.nodes[v]);
    }
  return total;
}

// Comparisons the backward makes between two forward values (amax/amin's "equals the
// result" mask eq(x, out), maximum/minimum's lt/gt/eq of x and y) must see exactly the bits the
// forward saw: a value recomputed by other code (another kernel, a reduction split differently)
// could round differently and empty the mask. Both operands — and the views between them and
// their bases — are pinned to the forward: the cut then either saves them or computes the
// comparison in the forward program and saves its mask.
std::set<int> pinned_comparisons(JointGraph& g) {
  auto& idx = g.idx;
  std::set<int> pinned;
  for (Node* n : g.body) {
    const int c = idx[n];
    if (g.fwd[c] || g.tan[c] || !is_comparison(n->op) || n->inputs.size() != 2) continue;
    bool both = true;
    for (const auto& in : n->inputs) {
      const Node* u = in.get();
      while (u && is_view_op(u->op) && !u->inputs.empty() && idx.count(u) && !g.is_input[idx[u]])
        u = u->inputs[0].get();
      both = both && u && idx.count(u) && (g.fwd[idx[u]] || g.is_input[idx[u]]) && !g.tan[idx[u]];
    }
    if (!both) continue;
    // Only the bases are pinned, and only forward ones: views are index arithmetic over their
    // base (no rounding of their own), and a view attached to the source would, with its
    // infinite weight (views are never saved), open an uncuttable path to the sink; a
    // backward-only node attached to the source would look available without being saved.
    for (const auto& in : n->inputs)
      for (const Node* u = in.get(); u && idx.count(u) && !g.is_input[idx[u]];
           u = is_view_op(u->op) && !u->inputs.empty() ? u->inputs[0].get() : nullptr)
        if (g.fwd[idx[u]] && !is_view_op(u->op)) pinned.insert(idx[u]);
  }
  return pinned;
}

// The forward values the forward saves: the min cut with costly ops (and `pinned` ones) never
// recomputed, then, under a memory budget, costly ops recomputable one by one until it fits.
std::set<int> cut(JointGraph& g, const std::set<int>& save_all, const std::set<int>& pinned,
                  const PartitionOptions& options) {
  const auto& nodes = g.nodes;
  std::set<int> saved;
  std::set<int> banned = pinned;
  std::vector<int> candidates;
  for (int v = 0; v < g.N; ++v)
    if (g.fwd[v] && !g.is_input[v] && costly_to_recompute(nodes[v]->op) && !pinned.count(v)) {
      banned.insert(v);
      OpKind op = nodes[v]->op;
      // Random ops must draw the same numbers, collectives must run once on every rank: never recomputed.
      if (op != OpKind::RandUniform && op != OpKind::RandNormal && op != OpKind::RandInt && op != OpKind::Collective)
        candidates.push_back(v);
    }
  int64_t best = min_cut(g, save_all, banned, saved);
  if (options.memory_budget < 1.0) {
    // Knapsack by greed: unban reductions before GEMM-like ops, bigger results first.
    std::stable_sort(candidates.begin(), candidates.end(), [&](int a, int b) {
      bool ra = is_reduction(nodes[a]->op), rb = is_reduction(nodes[b]->op);
      if (ra != rb) return ra;
      return g.bytes(*nodes[a]) > g.bytes(*nodes[b]);
    });
    double target = options.memory_budget * static_cast<double>(best);
    for (int v : candidates) {
      if (static_cast<double>(best) <= target) break;
      banned.erase(v);
      best = min_cut(g, save_all, banned, saved);
    }
  }
  return saved;
}

}  // namespace

Partition partition(const std::vector<NodePtr>& inputs, const std::vector<NodePtr>& tangents,
                    const std::vector<NodePtr>& fwd_outputs, const std::vector<NodePtr>& bwd_outputs,
                    const std::function<int64_t(const Node&)>& bytes, const PartitionOptions& options) {
  JointGraph g{bwd_outputs, bytes};
  index_joint(g, inputs, tangents, fwd_outputs);
  Partition result;
  std::set<int> save_all = eager_saved(g);
  for (int u : save_all) result.save_all_bytes += bytes(*g.nodes[u]);
  std::set<int> pinned = pinned_comparisons(g);
  result.pinned = static_cast<int>(pinned.size());
  std::set<int> saved = options.save_all ? save_all : cut(g, save_all, pinned, options);
  for (int v : saved) {
    result.saved.push_back(g.owner.at(g.nodes[v]));
    result.saved_bytes += bytes(*g.nodes[v]);
  }
  // Forward ops the backward recomputes: backward-side body nodes that are forward values.
  std::set<const Node*> stop = g.leaves;
  for (const auto& s : result.saved) stop.insert(s.get());
  for (Node* n : topo_order(bwd_outputs, stop))
    if (g.fwd[g.idx[n]]) result.recomputed++;
  return result;
}

}  // namespace kiln::jit
