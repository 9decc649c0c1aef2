#include "jit/graph/passes.h"

#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>

#include "jit/diag/diagnostics.h"
#include "runtime/core/error.h"

namespace kiln::jit {
namespace {

std::mutex g_totals_mu;
PassCounts g_totals;

bool is_float(DType t) { return t == DType::Float32 || t == DType::Float64; }

// Ops whose attributes are all covered by the plan signature (ints, shape, view strides), so
// that two nodes compare equal in every segment of the same signature.
bool cse_candidate(OpKind op) {
  if (op >= OpKind::Neg && op <= OpKind::Cumsum) return true;
  if (is_view_op(op)) return op != OpKind::AsStrided;
  switch (op) {
    case OpKind::Contiguous:
    case OpKind::Cat:
    case OpKind::Gather:
    case OpKind::Scatter:
    case OpKind::ScatterAdd:
    case OpKind::IndexSelect:
    case OpKind::IndexAdd:
    case OpKind::Matmul:
    case OpKind::Im2Col:
    case OpKind::Attention:
    case OpKind::AttentionBackward: return true;
    default: return false;
  }
}

bool foldable(OpKind op) {
  switch (op) {
    case OpKind::Neg:
    case OpKind::Abs:
    case OpKind::Relu:
    case OpKind::Sqrt:
    case OpKind::Cast:
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Div:
    case OpKind::Maximum:
    case OpKind::Minimum: return true;
    default: return false;
  }
}

// The value a Full node fills with, in its dtype (as the reference kernel converts it).
double full_value(const Node& n) {
  switch (n.dtype) {
    case DType::Float32: return static_cast<double>(static_cast<float>(n.attrs.f0));
    case DType::Int32:
      return n.attrs.ints.empty() ? n.attrs.f0 : static_cast<double>(static_cast<int32_t>(n.attrs.ints[0]));
    default: return n.attrs.f0;
  }
}

// One pointwise op in the compute type T, as the reference kernels do it.
template <class T>
T fold_op(OpKind op, T a, T b) {
  switch (op) {
    case OpKind::Neg: return -a;
    case OpKind::Abs: return std::abs(a);
    case OpKind::Relu: return (std::isnan(a) || a > 0) ? a : T(0);
    case OpKind::Sqrt: return std::sqrt(a);
    case OpKind::Cast: return a;
    case OpKind::Add: return a + b;
    case OpKind::Sub: return a - b;
    case OpKind::Mul: return a * b;
    case OpKind::Div: return a / b;
    case OpKind::Maximum: return (std::isnan(a) || std::isnan(b)) ? a + b : (a > b ? a : b);
    case OpKind::Minimum: return (std::isnan(a) || std::isnan(b)) ? a + b : (a < b ? a : b);
    default: throw Error("passes: op cannot be folded");
  }
}

double fold_value(const Rewrite::Fold& f, const std::vector<Node*>& ext) {
  double a = full_value(*ext[f.args[0]]), b = f.nargs > 1 ? full_value(*ext[f.args[1]]) : 0;
  if (f.dtype == DType::Float32) return fold_op<float>(f.op, static_cast<float>(a), static_cast<float>(b));
  return fold_op<double>(f.op, a, b);
}

bool same_layout(const Node& a, const Node& b) {
  if (!same_shape(a.shape, b.shape) || a.strides.size() != b.strides.size() || !a.offset.same_as(b.offset))
    return false;
  for (size_t d = 0; d < a.strides.size(); ++d)
    if (!a.strides[d].same_as(b.strides[d])) return false;
  return true;
}

bool dense(const Node& n) {
  auto z = n.offset.maybe_int();
  return !is_view_op(n.op) && z && *z == 0;
}

struct Analysis {
  const Segment& seg;
  const int n;
  Rewrite rw;
  std::map<const Node*, int> pos;  // segment node -> position
  std::map<const Node*, int> extern_id;  // external input -> -(k + 1)
  std::vector<std::vector<int>> in;  // resolved input references per node
  std::vector<int> res;  // each node's replacement (itself if kept)
  enum class Fate { Keep, Cse, Fold, Noop };
  std::vector<Fate> fate;
  std::vector<bool> has_view_consumer;
  std::vector<bool> full_node;  // per extended position: a Full constant
  std::map<std::vector<int64_t>, int> cse_table;
  std::ostringstream log;

  explicit Analysis(const Segment& s) : seg(s), n(static_cast<int>(s.nodes.size())) {}

  const Node* node_at(int ref) const { return ref >= 0 && ref < n ? seg.nodes[ref] : nullptr; }
  const Node* ref_node(int ref) const {
    if (ref >= n) return nullptr;  // a folded constant
    return ref >= 0 ? seg.nodes[ref] : extern_node[-ref - 1];
  }
  std::vector<const Node*> extern_node;
  DType ref_dtype(int ref) const { return ref >= n ? rw.folds[ref - n].dtype : ref_node(ref)->dtype; }
  bool ref_is_full(int ref) const { return ref >= 0 && ref < static_cast<int>(full_node.size()) && full_node[ref]; }

  // The resolved input references of every node (externals numbered in first-use order).
  void collect() {
    for (int i = 0; i < n; ++i) pos[seg.nodes[i]] = i;
    in.resize(n);
    has_view_consumer.assign(n, false);
    for (int i = 0; i < n; ++i) {
      const Node* x = seg.nodes[i];
      for (size_t k = 0; k < x->inputs.size(); ++k) {
        const Node* y = x->inputs[k].get();
        auto it = pos.find(y);
        int ref;
        if (it != pos.end()) {
          ref = it->second;
          if (is_view_op(x->op)) has_view_consumer[ref] = true;
        } else {
          auto [e, fresh] = extern_id.emplace(y, -static_cast<int>(extern_node.size()) - 1);
          if (fresh) {
            extern_node.push_back(y);
            rw.ext_src.push_back({i, static_cast<int>(k)});
          }
          ref = e->second;
        }
        in[i].push_back(ref);
      }
    }
    res.resize(n);
    fate.assign(n, Fate::Keep);
    full_node.assign(n, false);
    for (int i = 0; i < n; ++i) full_node[i] = seg.nodes[i]->op == OpKind::Full;
  }

  int resolve(int ref) const { return ref >= 0 && ref < n ? res[ref] : ref; }

  // A folded constant for node i, when all its inputs are constants it can fold exactly.
  bool try_fold(int i) {
    const Node& x = *seg.nodes[i];
    if (!foldable(x.op) || !is_float(x.dtype) || in[i].empty() || in[i].size() > 2) return false;
    for (int r : in[i]) {
      if (!ref_is_full(r)) return false;
      DType t = ref_dtype(r);
      if (x.op == OpKind::Cast) {
        bool int_ok = t == DType::Int32 && r < n && ref_node(r)->attrs.ints.size() == 1;
        if (!is_float(t) && !int_ok) return false;
      } else if (t != x.dtype) {
        return false;
      }
    }
    Rewrite::Fold f{x.op, x.dtype, i, static_cast<int>(in[i].size()), {in[i][0], in[i].size() > 1 ? in[i][1] : -1}};
    rw.folds.push_back(f);
    full_node.push_back(true);
    res[i] = n + static_cast<int>(rw.folds.size()) - 1;
    fate[i] = Fate::Fold;
    log << "  fold " << op_name(x.op) << " #" << i << " of constants\n";
    return true;
  }

  // A Full input equal to `v` (recorded as a guard when the rewrite uses it); `sign`: a
  // floating zero must also have v's sign (x + 0 is not x at x = -0, x + -0 is; x - 0 is).
  bool full_is(int ref, double v, std::vector<Rewrite::Guard>& guards, bool sign = false) const {
    if (ref < 0 || ref >= n || !full_node[ref]) return false;
    const Node& c = *seg.nodes[ref];
    if (full_value(c) != v) return false;
    if (sign && is_floating(c.dtype) && std::signbit(full_value(c)) != std::signbit(v)) return false;
    bool int_dtype = !is_floating(c.dtype) && c.dtype != DType::Bool;
    if (int_dtype && (c.attrs.ints.empty() || c.attrs.ints[0] != static_cast<int64_t>(v))) return false;
    guards.push_back(guard_on(c, ref));
    return true;
  }

  // The input node i is an identity of, if any.
  bool try_noop(int i) {
    const Node& x = *seg.nodes[i];
    std::vector<Rewrite::Guard> guards;
    constexpr int kNone = std::numeric_limits<int>::min();  // (-1 names the first external input)
    int r = kNone;
    auto operand = [&](int k) { return in[i][k]; };
    switch (x.op) {
      case OpKind::Mul:
        if (full_is(operand(1), 1, guards))
          r = operand(0);
        else if (full_is(operand(0), 1, guards))
          r = operand(1);
        break;
      case OpKind::Add:
        if (full_is(operand(1), -0.0, guards, true))
          r = operand(0);
        else if (full_is(operand(0), -0.0, guards, true))
          r = operand(1);
        break;
      case OpKind::Sub:
        if (full_is(operand(1), 0.0, guards, true)) r = operand(0);
        break;
      case OpKind::Div:
        if (full_is(operand(1), 1, guards)) r = operand(0);
        break;
      case OpKind::Cast:
      case OpKind::View:
      case OpKind::Expand:
      case OpKind::Contiguous: r = operand(0); break;
      default: return false;
    }
    if (r == kNone || r >= n) return false;
    const Node& y = *ref_node(r);
    if (y.dtype != x.dtype || !same_shape(y.shape, x.shape)) return false;
    if (x.op == OpKind::View || x.op == OpKind::Expand) {
      if (!same_layout(x, y)) return false;
    } else if (x.op == OpKind::Contiguous) {
      if (!is_contiguous_layout(y.shape, y.strides)) return false;
    }
    // A view of x placed itself relative to x's storage: only an input of the same layout in
    // the same kind of storage (dense, offset 0, every call) can stand in for x there.
    if (has_view_consumer[i] && !is_view_op(x.op) && !(r >= 0 && dense(y) && dense(x))) return false;
    // A needed x keeps its own storage; views of it must keep aliasing that storage.
    if (has_view_consumer[i] && seg.needed[i]) return false;
    res[i] = r;
    fate[i] = Fate::Noop;
    rw.guards.insert(rw.guards.end(), guards.begin(), guards.end());
    log << "  no-op " << op_name(x.op) << " #" << i << " -> " << (r >= 0 ? "#" + std::to_string(r) : "input") << "\n";
    return true;
  }

  bool try_cse(int i) {
    const Node& x = *seg.nodes[i];
    if (!cse_candidate(x.op)) return false;
    std::vector<int64_t> key{static_cast<int64_t>(x.op), static_cast<int64_t>(x.dtype),
                             static_cast<int64_t>(x.shape.size())};
    for (const auto& d : x.shape) key.push_back(d.as_int());
    for (const auto& d : x.strides) key.push_back(d.as_int());
    key.push_back(static_cast<int64_t>(x.attrs.ints.size()));
    key.insert(key.end(), x.attrs.ints.begin(), x.attrs.ints.end());
    key.push_back(static_cast<int64_t>(in[i].size()));
    key.insert(key.end(), in[i].begin(), in[i].end());
    auto [it, fresh] = cse_table.emplace(std::move(key), i);
    if (fresh) return false;
    const Node& y = *seg.nodes[it->second];
    if (!same_layout(x, y)) return false;
    res[i] = it->second;
    fate[i] = Fate::Cse;
    log << "  cse " << op_name(x.op) << " #" << i << " = #" << it->second << "\n";
    return true;
  }

  void run() {
    collect();
    for (int i = 0; i < n; ++i) {
      res[i] = i;
      for (int& r : in[i]) r = resolve(r);
      if (try_fold(i) || try_noop(i) || try_cse(i)) continue;
    }
    // Liveness, from the needed nodes backwards.
    const int total = n + static_cast<int>(rw.folds.size());
    std::vector<bool> needed(total, false), live(total, false);
    for (int i = 0; i < n; ++i) {
      if (!seg.needed[i]) continue;
      if (fate[i] == Fate::Cse || fate[i] == Fate::Fold) {
        rw.shares.push_back({i, res[i]});
        needed[res[i]] = true;
        live[res[i]] = true;
      } else {
        needed[i] = true;
        live[i] = true;
      }
    }
    for (int i = n; i-- > 0;) {
      if (!live[i]) continue;
      for (int r : in[i])
        if (r >= 0) live[r] = true;
    }
    for (int j = 0; j < static_cast<int>(rw.folds.size()); ++j)
      if (live[n + j]) rw.order.push_back(n + j);
    for (int i = 0; i < n; ++i) {
      if (live[i]) {
        rw.order.push_back(i);
        const Node* x = seg.nodes[i];
        for (size_t k = 0; k < in[i].size(); ++k) {
          auto it = pos.find(x->inputs[k].get());
          int orig = it != pos.end() ? it->second : extern_id.at(x->inputs[k].get());
          if (orig != in[i][k]) rw.edges.push_back({i, static_cast<int>(k), in[i][k]});
        }
      } else if (fate[i] == Fate::Keep) {
        ++rw.counts.dead;
        log << "  dead " << op_name(seg.nodes[i]->op) << " #" << i << "\n";
      }
      if (fate[i] == Fate::Cse) ++rw.counts.cse;
      if (fate[i] == Fate::Fold) ++rw.counts.folded;
      if (fate[i] == Fate::Noop) ++rw.counts.noop;
    }
    for (int p : rw.order) rw.needed.push_back(needed[p]);
    rw.identity =
        rw.order.size() == static_cast<size_t>(n) && rw.edges.empty() && rw.shares.empty() && rw.folds.empty();
    if (rw.identity) {
      rw.guards.clear();
      rw.ext_src.clear();
    }
  }
};

}  // namespace

Rewrite run_passes(const Segment& seg) {
  Analysis a(seg);
  a.run();
  {
    std::lock_guard<std::mutex> lock(g_totals_mu);
    g_totals.cse += a.rw.counts.cse;
    g_totals.noop += a.rw.counts.noop;
    g_totals.folded += a.rw.counts.folded;
    g_totals.dead += a.rw.counts.dead;
  }
  if (!a.rw.identity && log_enabled("passes")) {
    const PassCounts& c = a.rw.counts;
    log_line("passes", "segment of " + std::to_string(seg.nodes.size()) + " nodes: cse " + std::to_string(c.cse) +
                           ", no-op " + std::to_string(c.noop) + ", folded " + std::to_string(c.folded) + ", dead " +
                           std::to_string(c.dead) + ", " + std::to_string(a.rw.order.size()) + " left\n" + a.log.str());
  }
  return std::move(a.rw);
}

Rewrite::Guard guard_on(const Node& c, int pos) {
  return {pos, c.attrs.f0, c.attrs.ints.empty() ? 0 : c.attrs.ints[0], !c.attrs.ints.empty()};
}

bool guards_hold(const std::vector<Rewrite::Guard>& guards, const Segment& seg) {
  for (const Rewrite::Guard& g : guards) {
    const Node& c = *seg.nodes[g.pos];
    // (bit for bit: a rewrite that relied on +0 must not serve -0)
    if (c.op != OpKind::Full || std::bit_cast<uint64_t>(c.attrs.f0) != std::bit_cast<uint64_t>(g.f0)) return false;
    if (g.has_i0 != !c.attrs.ints.empty() || (g.has_i0 && c.attrs.ints[0] != g.i0)) return false;
  }
  return true;
}

void apply_rewrite(const Rewrite& rw, const Segment& seg, std::vector<Node*>& ext, std::vector<NodePtr>& owned) {
  ext.assign(seg.nodes.begin(), seg.nodes.end());
  std::vector<NodePtr> externals;
  externals.reserve(rw.ext_src.size());
  for (const auto& [node, slot] : rw.ext_src) externals.push_back(seg.nodes[node]->inputs[slot]);
  for (const Rewrite::Fold& f : rw.folds) {
    const Node& like = *ext[f.like];
    auto c = new_node();
    c->op = OpKind::Full;
    c->dtype = f.dtype;
    c->device = like.device;
    c->shape = like.shape;
    c->strides = contiguous_strides(like.shape);
    c->offset = 0;
    c->attrs.f0 = fold_value(f, ext);
    ext.push_back(c.get());
    owned.push_back(std::move(c));
  }
  for (const Rewrite::Made& m : rw.made) {
    auto c = new_node();
    c->op = m.op;
    c->dtype = m.dtype;
    c->device = m.device;
    c->shape = m.shape;
    c->strides = m.strides;
    c->offset = m.offset;
    c->attrs = m.attrs;
    c->inputs.reserve(m.inputs.size());
    for (int p : m.inputs) c->inputs.push_back(p >= 0 ? ext[p]->shared_from_this() : externals[-p - 1]);
    ext.push_back(c.get());
    owned.push_back(std::move(c));
  }
  for (const Rewrite::Edge& e : rw.edges) {
    NodePtr to = e.to >= 0 ? ext[e.to]->shared_from_this() : externals[-e.to - 1];
    NodePtr& slot = seg.nodes[e.node]->inputs[e.slot];
    owned.push_back(std::move(slot));  // the unlinked node may still be read (and shared) this run
    slot = std::move(to);
  }
}

void finish_rewrite(const Rewrite& rw, const std::vector<Node*>& ext) {
  for (const Rewrite::Share& s : rw.shares) {
    Node* from = ext[s.from];
    KILN_CHECK(from->materialized(), "passes: a shared node was not computed");
    ext[s.node]->set_storage(from->storage, false);
  }
}

PassCounts pass_totals() {
  std::lock_guard<std::mutex> lock(g_totals_mu);
  return g_totals;
}

}  // namespace kiln::jit
