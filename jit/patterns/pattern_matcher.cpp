#include "jit/patterns/pattern_matcher.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "jit/compile/patterns.h"
#include "jit/graph/topo_order.h"
#include "jit/diag/diagnostics.h"
#include "runtime/autograd/autograd.h"
#include "runtime/core/error.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/symint.h"
#include "runtime/tensor/record.h"
#include "runtime/tensor/trace.h"

namespace kiln::jit {

void register_builtin_patterns();  // builtin_patterns.cpp

namespace {

// One traced form of a rewrite: the search function's graph over leaves, without gradients or
// with the gradients of the tensor inputs in `diff` (then the last leaf is the tangent).
struct Variant {
  std::vector<NodePtr> leaves;  // tensor inputs, then the tangent (joint variants)
  std::vector<NodePtr> outputs;  // the result, then the gradients of the inputs in `diff`
  std::vector<int> diff;
  std::unordered_map<const Node*, int> leaf_of;  // pattern leaf -> its index
  std::unordered_map<const Node*, int> scalar_of;  // pattern constant -> the scalar it stands for
  size_t size = 0;  // op nodes
  size_t nscalars = 0;  // scalar wildcards
  int float_leaf = -1;  // the first floating input: casts and draws to its dtype follow the bound input's
  // A joint form without its result among the outputs: for graphs where nothing reads the
  // result (a loss whose gradient does not need the value), only the gradients.
  bool result_dead = false;
};

// A registered rewrite: its functions and examples, and the forms traced from them.
struct Registered {
  std::string name;
  patterns::PatternFn search, replace;
  std::vector<Tensor> examples;
  std::vector<double> scalars;
  patterns::ExtraCheck check;
  // The forward-only form (traced at registration), and the joint ones, most gradients first,
  // then the gradient-only ones (traced once a graph holds every op of it, under joint_once:
  // written once, read only after ensure_joint()).
  Variant forward;
  mutable std::vector<Variant> joint;
  std::set<OpKind> ops;  // the ops of the forward-only form but its result's: every form needs them
  mutable std::once_flag joint_once;
  mutable std::atomic<bool> check_refusal_logged{false};
  // Only the forms with gradients are matched (set_gradient_forms_only: a rewrite whose point
  // is the backward, with a forward that is the replacement's own).
  mutable std::atomic<bool> gradient_forms_only{false};
};

const char* const kCheckSaidNo = "its extra check said no";

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<const Registered>> rewrites;
  std::map<std::string, int64_t> counts;
};
Registry& registry() {
  static Registry r;
  return r;
}

// Bumped by every change to the registry or the switch: lazy-eager plans made before are stale.
std::atomic<uint64_t> g_generation{0};

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("KILN_PATTERNS");
    return !(v && (std::string_view(v) == "off" || std::string_view(v) == "0"));
  }()};
  return on;
}

// Tracing a pattern is no part of the user's trace (detail::Untraced).
using detail::Untraced;

// A pattern graph never runs: it is not pending eager work.
void not_pending(const std::vector<Node*>& nodes) {
  for (Node* n : nodes)
    if (n->pending) {
      n->pending = false;
      detail::pending_add(-1);
    }
}

Variant trace_variant(const Registered& r, const std::vector<int>& diff) {
  Untraced untraced;
  Variant v;
  v.diff = diff;
  std::vector<Tensor> ins;
  for (const Tensor& e : r.examples) {
    v.leaves.push_back(new_leaf(e.dtype(), e.device(), e.shape()));
    ins.push_back(Tensor::from_node(v.leaves.back()));
  }
  for (int i : diff) ins[i].requires_grad_(true);
  Tensor out;
  if (diff.empty()) {
    NoGradGuard ng;
    out = r.search(ins, r.scalars);
  } else {
    EnableGradGuard eg;
    out = r.search(ins, r.scalars);
  }
  KILN_CHECK(out.defined(), "patterns: search function of '", r.name, "' returned an undefined tensor");
  v.outputs.push_back(out.node());
  if (!diff.empty()) {
    if (!out.requires_grad()) return {};
    v.leaves.push_back(new_leaf(out.dtype(), out.device(), out.shape()));
    std::vector<Tensor> wrt;
    for (int i : diff) wrt.push_back(ins[i]);
    std::vector<Tensor> gs = kiln::grad({out}, wrt, {Tensor::from_node(v.leaves.back())}, false, false, true);
    for (const Tensor& g : gs) {
      if (!g.defined()) return {};  // (an input the result does not depend on: no such variant)
      v.outputs.push_back(g.node());
    }
  }
  std::set<const Node*> leaves;
  for (size_t i = 0; i < v.leaves.size(); ++i) {
    v.leaf_of[v.leaves[i].get()] = static_cast<int>(i);
    leaves.insert(v.leaves[i].get());
    if (v.float_leaf < 0 && is_floating(v.leaves[i]->dtype)) v.float_leaf = static_cast<int>(i);
  }
  v.nscalars = r.scalars.size();
  std::vector<bool> found(r.scalars.size(), false);
  const std::vector<Node*> nodes = topo_order(v.outputs, leaves);
  not_pending(nodes);
  for (const auto& l : v.leaves) not_pending({l.get()});
  for (Node* n : nodes) {
    for (const auto& in : n->inputs)
      KILN_CHECK(!in->materialized(), "patterns: search function of '", r.name,
                 "' reads a tensor that is not one of its inputs (pass it as an input)");
    ++v.size;
    if (n->op != OpKind::Full || !n->attrs.sizes.empty()) continue;
    for (size_t k = 0; k < r.scalars.size(); ++k)
      if (n->attrs.f0 == r.scalars[k]) {
        v.scalar_of[n] = static_cast<int>(k);
        found[k] = true;
        break;
      }
  }
  KILN_CHECK(!v.leaf_of.count(v.outputs[0].get()), "patterns: search function of '", r.name,
             "' returns one of its inputs (nothing to match)");
  if (diff.empty())
    for (size_t k = 0; k < found.size(); ++k)
      KILN_CHECK(found[k], "patterns: scalar ", k, " (", r.scalars[k], ") of '", r.name,
                 "' appears as no constant in the search function's graph");
  return v;
}

bool commutative(OpKind op) {
  switch (op) {
    case OpKind::Add:
    case OpKind::Mul:
    case OpKind::Maximum:
    case OpKind::Minimum:
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::LogicalAnd:
    case OpKind::LogicalOr:
    case OpKind::LogicalXor:
    case OpKind::BitwiseAnd:
    case OpKind::BitwiseOr:
    case OpKind::BitwiseXor: return true;
    default: return false;
  }
}

// Ops whose attributes hold sizes or random state that a structural match cannot compare.
bool unmatchable(OpKind op) {
  switch (op) {
    case OpKind::RandNormal:
    case OpKind::RandInt:
    case OpKind::AsStrided:
    case OpKind::ViewScatter:
    case OpKind::Im2Col:
    case OpKind::Col2Im:
    case OpKind::ToDevice:
    case OpKind::Collective: return true;
    default: return false;
  }
}

// Ops whose attributes name dims (or whose result is laid out by its shape): matched at the
// pattern's rank only. Pointwise ops match at any rank.
bool rank_bound(OpKind op) {
  switch (op) {
    case OpKind::Sum:
    case OpKind::Prod:
    case OpKind::Amax:
    case OpKind::Amin:
    case OpKind::ArgMax:
    case OpKind::ArgMin:
    case OpKind::Cumsum:
    case OpKind::View:
    case OpKind::Permute:
    case OpKind::Expand:
    case OpKind::Slice:
    case OpKind::Select:
    case OpKind::Squeeze:
    case OpKind::Unsqueeze:
    case OpKind::Flip:
    case OpKind::Cat:
    case OpKind::Gather:
    case OpKind::Scatter:
    case OpKind::ScatterAdd:
    case OpKind::IndexSelect:
    case OpKind::IndexAdd:
    case OpKind::Matmul:
    case OpKind::Contiguous:
    case OpKind::Attention:
    case OpKind::AttentionBackward: return true;
    default: return false;
  }
}

bool same_layout(const Node& a, const Node& b) {
  if (a.strides.size() != b.strides.size()) return false;
  for (size_t d = 0; d < a.strides.size(); ++d)
    if (!provably_equal(a.strides[d], b.strides[d])) return false;
  return provably_equal(a.offset, b.offset);
}

// The target graph: its nodes, who reads each, and which are roots.
struct Target {
  std::unordered_map<const Node*, std::vector<Node*>> consumers;
  std::unordered_set<const Node*> roots;
  std::vector<Node*> order;
  std::set<OpKind> ops;  // every op the graph holds
  uint64_t first_id = 0;  // older nodes are never rewritten
  uint64_t fresh_id = 0;  // nodes made by this pass are not matched again
};

struct Binding {
  std::unordered_map<const Node*, Node*> map;  // pattern node -> target node
  std::vector<const Node*> follow;  // matched casts/draws of the floating input's dtype
  std::vector<NodePtr> views;  // views of stored data made to bind inputs (below)
  std::vector<Node*> leaves;
  std::vector<double> scalars;
  std::vector<bool> scalar_bound;
};

class Matcher {
 public:
  Matcher(const Variant& v, const Target& t) : v_(v), t_(t) {}

  bool match(const Node* p, Node* t, Binding& b) const {
    if (auto it = b.map.find(p); it != b.map.end()) return it->second == t || same_stored_view(it->second, t, b);
    if (auto l = v_.leaf_of.find(p); l != v_.leaf_of.end()) {
      b.leaves[l->second] = t;
      b.map[p] = t;
      return true;
    }
    if (auto s = v_.scalar_of.find(p); s != v_.scalar_of.end()) {
      if (t->op != OpKind::Full || !t->attrs.sizes.empty() || !t->shape.empty()) return false;
      double& value = b.scalars[s->second];
      if (b.scalar_bound[s->second] && value != t->attrs.f0) return false;
      value = t->attrs.f0;
      b.scalar_bound[s->second] = true;
      b.map[p] = t;
      return true;
    }
    if (p->op == OpKind::Permute && t->shape.size() == p->shape.size() && stored_memory(t, b))
      return match_stored_permute(p, t, b);
    if (t->op != p->op || unmatchable(p->op) || t->materialized() || t->id < t_.first_id || t->id >= t_.fresh_id ||
        t->inputs.size() != p->inputs.size() || (rank_bound(p->op) && t->shape.size() != p->shape.size()) ||
        (p->op != OpKind::Full &&
         t->attrs.ints != p->attrs.ints))  // (a constant's value is f0; ints repeat an integer's)
      return false;
    // (a cast or draw to the pattern's floating dtype is one to the matched inputs' floating dtype:
    // checked in match_at once the inputs are bound)
    if (p->op == OpKind::Cast || p->op == OpKind::RandUniform) {
      if (v_.float_leaf >= 0 && p->dtype == v_.leaves[static_cast<size_t>(v_.float_leaf)]->dtype)
        b.follow.push_back(t);
      else if (p->dtype != t->dtype)
        return false;
    }
    // (a uniform draw matches any draw of its range: its numbers are its own, a replacement draws others)
    if ((p->op == OpKind::Full || p->op == OpKind::Arange || p->op == OpKind::RandUniform) &&
        (p->attrs.f0 != t->attrs.f0 || p->attrs.f1 != t->attrs.f1 || !p->attrs.sizes.empty() ||
         !t->attrs.sizes.empty()))
      return false;
    b.map[p] = t;
    if (commutative(p->op) && p->inputs.size() == 2) {
      Binding keep = b;
      if (match(p->inputs[0].get(), t->inputs[0].get(), b) && match(p->inputs[1].get(), t->inputs[1].get(), b))
        return true;
      b = std::move(keep);
      return match(p->inputs[0].get(), t->inputs[1].get(), b) && match(p->inputs[1].get(), t->inputs[0].get(), b);
    }
    for (size_t i = 0; i < p->inputs.size(); ++i)
      if (!match(p->inputs[i].get(), t->inputs[i].get(), b)) return false;
    return true;
  }

  // Whether the pattern subgraph at `p` matches somewhere in the graph (inputs and scalars bound
  // freely, other consumers allowed); with `depth` > 0, else whether its operands that are ops
  // (at least one) each do, at depth - 1. Inputs and constants occur anywhere.
  bool occurs(const Node* p, int depth) const {
    if (free_node(p)) return true;
    for (Node* t : t_.order) {
      if (t->op != p->op) continue;
      Binding b = empty_binding();
      if (match(p, t, b)) return true;
    }
    if (depth == 0) return false;
    int ops = 0;
    for (const auto& in : p->inputs) {
      if (free_node(in.get())) continue;
      ++ops;
      if (!occurs(in.get(), depth - 1)) return false;
    }
    return ops > 0;
  }

  // Matches every output of the variant, the first at `anchor`; the rest anywhere.
  // The binding of the variant at `anchor`, or nullopt; `*held` receives a matched intermediate
  // that the program still holds (a tensor alive outside the graph: the match cannot replace it).
  std::optional<Binding> match_at(Node* anchor, const Node** held = nullptr) const {
    Binding b = empty_binding();
    if (!match(v_.outputs[0].get(), anchor, b)) return std::nullopt;
    if (!match_rest(1, b)) return std::nullopt;
    for (const Node* l : b.leaves)
      if (!l) return std::nullopt;  // (an input only the result reads, in a form without it)
    for (const Node* t : b.follow)
      if (t->dtype != b.leaves[static_cast<size_t>(v_.float_leaf)]->dtype) return std::nullopt;
    if (!exclusive(b, held)) return std::nullopt;
    return b;
  }

 private:
  // A binding of nothing yet, sized for the variant.
  Binding empty_binding() const {
    Binding b;
    b.leaves.assign(v_.leaves.size(), nullptr);
    b.scalars.assign(v_.nscalars, 0.0);
    b.scalar_bound.assign(b.scalars.size(), false);
    return b;
  }
  // A pattern input, scalar wildcard or constant: it binds (nearly) anything.
  bool free_node(const Node* p) const { return v_.leaf_of.count(p) || v_.scalar_of.count(p) || p->op == OpKind::Full; }

  // A transposed input (k.transpose(-2, -1)) met as stored data: in lazy eager a view of a
  // computed tensor is computed at once and keeps no input. Any stored `t` is permute(t', perm)
  // with t' = t permuted back (a view of the same memory, made here): the pattern's operand
  // matches t'. Two views of the same stored memory and layout are one value (the forward reads
  // k through kᵀ, the backward through (kᵀ)ᵀ).
  Storage* stored_memory(const Node* t, const Binding& b) const {
    if (t->materialized()) return t->storage.get();
    for (const NodePtr& v : b.views)
      if (v.get() == t) return stored_memory(v->inputs[0].get(), b);
    return nullptr;
  }
  bool same_stored_view(const Node* a, const Node* c, const Binding& b) const {
    Storage* m = stored_memory(a, b);
    return m && m == stored_memory(c, b) && a->dtype == c->dtype && a->shape.size() == c->shape.size() &&
           std::equal(a->shape.begin(), a->shape.end(), c->shape.begin(),
                      [](const SymInt& x, const SymInt& y) { return provably_equal(x, y); }) &&
           same_layout(*a, *c);
  }
  bool match_stored_permute(const Node* p, Node* t, Binding& b) const {
    const std::vector<int64_t>& perm = p->attrs.ints;
    ViewStep back{OpKind::Permute, {}, {}};
    back.attrs.ints.assign(perm.size(), 0);
    for (size_t d = 0; d < perm.size(); ++d) back.attrs.ints[static_cast<size_t>(perm[d])] = static_cast<int64_t>(d);
    NodePtr u = detail::apply_view(t->shared_from_this(), back);
    b.views.push_back(u);
    b.map[p] = t;
    return match(p->inputs[0].get(), u.get(), b);
  }

  bool match_rest(size_t k, Binding& b) const {
    if (k == v_.outputs.size()) return true;
    const Node* p = v_.outputs[k].get();
    if (auto it = b.map.find(p); it != b.map.end()) return match_rest(k + 1, b);
    // (a gradient is recorded after the forward result it differentiates; the attempts are
    // bounded so that generic gradient patterns cannot blow up on large graphs)
    const uint64_t after = v_.result_dead ? 0 : b.map.at(v_.outputs[0].get())->id;
    for (Node* t : t_.order) {
      if (t->op != p->op || t->id <= after || ++attempts_ > kMaxAttempts) continue;
      Binding keep = b;
      if (match(p, t, b) && match_rest(k + 1, b)) return true;
      b = std::move(keep);
    }
    return false;
  }

  // Every node the rewrite removes is read only inside the match (a constant of no inputs may
  // have other readers: it costs nothing to keep, and lazy eager shares one node per value).
  bool exclusive(const Binding& b, const Node** held) const {
    std::unordered_set<const Node*> matched, outputs;
    for (const auto& [p, t] : b.map)
      if (!v_.leaf_of.count(p) && !v_.scalar_of.count(p)) matched.insert(t);
    for (const auto& o : v_.outputs) outputs.insert(b.map.at(o.get()));
    for (const Node* t : matched) {
      if (outputs.count(t) || (t->op == OpKind::Full && t->inputs.empty())) continue;
      if (t_.roots.count(t)) {
        if (held) *held = t;
        return false;
      }
      auto it = t_.consumers.find(t);
      if (it == t_.consumers.end()) continue;
      for (const Node* c : it->second)
        if (!matched.count(c)) return false;
    }
    return true;
  }

  static constexpr int64_t kMaxAttempts = 4096;
  const Variant& v_;
  const Target& t_;
  mutable int64_t attempts_ = 0;
};

Target index(const std::vector<std::vector<NodePtr>*>& roots, uint64_t first_id, uint64_t fresh_id) {
  Target t;
  t.first_id = first_id;
  t.fresh_id = fresh_id;
  std::vector<NodePtr> rs;
  for (const auto* v : roots)
    for (const auto& n : *v)
      if (n) {
        rs.push_back(n);
        t.roots.insert(n.get());
      }
  t.order = topo_order(rs, {});
  for (Node* n : t.order) {
    t.ops.insert(n->op);
    for (const auto& in : n->inputs) t.consumers[in.get()].push_back(n);
  }
  return t;
}

// Builds the replacement on what `b` bound; null when its results do not fit the matched ones.
// Whether a view op reads `n`: a view node's strides and offset were laid out for its input's.
bool has_view_consumer(const Target& t, const Node* n) {
  auto it = t.consumers.find(n);
  if (it == t.consumers.end()) return false;
  for (const Node* c : it->second)
    if (is_view_op(c->op)) return true;
  return false;
}

// `x`'s values laid out as `want` is: a dense copy permuted as want's dims are in memory (want
// a permutation of a dense block, as the gradient of a transposed input is), or nullopt.
std::optional<Tensor> in_layout_of(const Tensor& x, const Node& want) {
  const size_t r = want.shape.size();
  std::vector<int64_t> order(r);  // want's dims, outermost in memory first
  for (size_t d = 0; d < r; ++d) order[d] = static_cast<int64_t>(d);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return detail::size_hint(want.strides[a]) > detail::size_hint(want.strides[b]);
  });
  std::vector<int64_t> back(r);
  for (size_t d = 0; d < r; ++d) back[order[d]] = static_cast<int64_t>(d);
  Tensor y = x.permute(order).contiguous().permute(back);
  if (!same_layout(*y.node(), want)) return std::nullopt;
  return y;
}

std::optional<std::vector<NodePtr>> build_replacement(const Registered& r, const Variant& v, const Binding& b,
                                                      const Target& t, bool roots_keep_layout, std::string& why) {
  std::vector<Tensor> ins;
  const size_t ntensors = r.examples.size();
  for (size_t i = 0; i < ntensors; ++i) ins.push_back(Tensor::from_node(b.leaves[i]->shared_from_this()));
  if (r.check && !r.check(ins, b.scalars)) {
    why = kCheckSaidNo;
    return std::nullopt;
  }
  std::vector<Tensor> outs;
  if (v.diff.empty()) {
    NoGradGuard ng;
    outs.push_back(r.replace(ins, b.scalars));
  } else {
    EnableGradGuard eg;
    std::vector<Tensor> wrt;
    for (int i : v.diff) wrt.push_back(ins[i].requires_grad_(true));
    Tensor out = r.replace(ins, b.scalars);
    if (!out.defined() || !out.requires_grad()) return std::nullopt;
    outs.push_back(out);
    Tensor tangent = Tensor::from_node(b.leaves.back()->shared_from_this());
    for (const Tensor& g : kiln::grad({out}, wrt, {tangent}, false, false, true)) {
      if (!g.defined()) return std::nullopt;
      outs.push_back(g);
    }
  }
  if (v.result_dead) outs.erase(outs.begin());
  std::vector<NodePtr> nodes;
  for (size_t k = 0; k < outs.size(); ++k) {
    const Node& want = *b.map.at(v.outputs[k].get());
    bool fits = outs[k].defined() && outs[k].dtype() == want.dtype && outs[k].shape().size() == want.shape.size();
    for (size_t d = 0; fits && d < want.shape.size(); ++d) fits = detail::same_size(outs[k].shape()[d], want.shape[d]);
    if (!fits) {
      why = "the replacement's result " + std::to_string(k) + " differs in dtype or shape from what it replaces";
      return std::nullopt;
    }
    // Views of what it replaces were laid out for its layout (and so were tensors holding it, when
    // a root takes the replacement's storage): give them that layout (a copy), or refuse.
    if ((has_view_consumer(t, &want) || (roots_keep_layout && t.roots.count(&want))) &&
        !same_layout(*outs[k].node(), want)) {
      auto laid = in_layout_of(outs[k], want);
      if (!laid) {
        why = "the replacement's result " + std::to_string(k) + " has another layout than what views of it expect";
        return std::nullopt;
      }
      outs[k] = *laid;
    }
    nodes.push_back(outs[k].node());
  }
  return nodes;
}

void redirect(const Target& t, const std::vector<std::vector<NodePtr>*>& roots, Node* from, const NodePtr& to) {
  if (auto it = t.consumers.find(from); it != t.consumers.end())
    for (Node* c : it->second)
      for (auto& in : c->inputs)
        if (in.get() == from) in = to;
  for (auto* v : roots)
    for (auto& n : *v)
      if (n.get() == from) n = to;
}

void trace_joint(const Registered& r);

// The form matched after `v`: the forward one, then the joint ones in order; null after the last.
const Variant* next_form(const Registered& r, const Variant* v) {
  if (v == &r.forward) return r.joint.empty() ? nullptr : &r.joint[0];
  const size_t i = static_cast<size_t>(v - r.joint.data()) + 1;
  return i < r.joint.size() ? &r.joint[i] : nullptr;
}

// Traces a rewrite's joint forms once, on first need (see Registered::joint). The caller is
// inside a compile() trace: the forms are traced on a thread of their own, outside that trace's
// thread-local state (its observer, shape oracle and recorded nodes).
void ensure_joint(const Registered& r) {
  std::call_once(r.joint_once, [&r] {
    std::exception_ptr error;
    std::thread t([&] {
      try {
        trace_joint(r);
      } catch (...) {
        error = std::current_exception();
      }
    });
    t.join();
    if (error) std::rethrow_exception(error);
  });
}

void trace_joint(const Registered& r) {
  // The joint forms, most gradients first: one per non-empty subset of the floating inputs.
  std::vector<int> floating;
  for (size_t i = 0; i < r.examples.size(); ++i)
    if (is_floating(r.examples[i].dtype())) floating.push_back(static_cast<int>(i));
  std::vector<std::vector<int>> subsets;
  for (uint32_t mask = (1u << floating.size()) - 1; mask > 0; --mask) {
    std::vector<int> s;
    for (size_t j = 0; j < floating.size(); ++j)
      if (mask & (1u << j)) s.push_back(floating[j]);
    subsets.push_back(std::move(s));
  }
  std::stable_sort(subsets.begin(), subsets.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  std::vector<Variant> forms;
  for (const auto& s : subsets) {
    jit::Variant v = jit::trace_variant(r, s);
    if (!v.outputs.empty()) forms.push_back(std::move(v));
  }
  // Gradient-only forms, for the joint forms whose gradients read what the forward computed
  // (softmax's probabilities, not just the inputs: else any product would match them).
  const size_t traced = forms.size();
  for (size_t i = 0; i < traced; ++i) {
    const jit::Variant& j = forms[i];
    if (j.diff.empty()) continue;
    std::set<const Node*> leaves;
    for (const auto& l : j.leaves) leaves.insert(l.get());
    const std::vector<Node*> fwd = jit::topo_order({j.outputs[0]}, leaves);
    std::vector<NodePtr> grads(j.outputs.begin() + 1, j.outputs.end());
    bool reads_forward = false, all_ops = true;
    for (const NodePtr& g : grads) all_ops &= !j.leaf_of.count(g.get());
    for (Node* n : jit::topo_order(grads, leaves))
      reads_forward |= n != j.outputs[0].get() && !leaves.count(n) && std::find(fwd.begin(), fwd.end(), n) != fwd.end();
    if (!reads_forward || !all_ops) continue;
    jit::Variant v = j;
    v.outputs = std::move(grads);
    v.result_dead = true;
    forms.push_back(std::move(v));
  }
  r.joint = std::move(forms);
}

std::vector<std::shared_ptr<const Registered>> snapshot() {
  static std::once_flag builtins;
  std::call_once(builtins, [] {
    // (their example tensors are recorded where a segment may be running: no flush may run one)
    Untraced untraced;
    register_builtin_patterns();
  });
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  return reg.rewrites;
}

}  // namespace

namespace {

// Replaces the instances of `rewrites` in the graph behind `roots`; with `roots_keep_layout` a
// replaced root must keep its layout (lazy eager: the root takes the replacement's storage).
// `constants` receives every constant node a match relied on.
size_t replace_instances(const std::vector<std::shared_ptr<const Registered>>& rewrites,
                         const std::vector<std::vector<NodePtr>*>& roots, uint64_t first_id, uint64_t fresh_id,
                         const std::string& where, bool roots_keep_layout, std::vector<Node*>* constants) {
  size_t replaced = 0;
  std::set<const Node*> told_held;  // (each held intermediate said once)
  Target t = index(roots, first_id, fresh_id);
  for (const auto& r : rewrites) {
    // (a graph without every op of the forward form holds no instance of any form)
    if (!std::includes(t.ops.begin(), t.ops.end(), r->ops.begin(), r->ops.end())) continue;
    // Nor does a graph where an operand of the forward form's result occurs nowhere, not even as
    // its own operands (the joint forms hold the forward; the gradient-only forms read those
    // operands or theirs): the joint forms are traced only for graphs that pass.
    {
      const Matcher m(r->forward, t);
      bool present = true;
      for (const auto& in : r->forward.outputs[0]->inputs) present = present && m.occurs(in.get(), 1);
      if (!present) continue;
    }
    ensure_joint(*r);
    // Anchors from the outputs back; at each, the forward-only form first (it leaves the
    // backward as it is), the joint forms where the backward reads what the forward would drop.
    for (size_t i = t.order.size(); i-- > 0;) {
      Node* anchor = t.order[i];
      for (const Variant* form = &r->forward; form; form = next_form(*r, form)) {
        const Variant& v = *form;
        if (anchor->op != v.outputs[0]->op || (v.diff.empty() && r->gradient_forms_only)) continue;
        const Node* held = nullptr;
        std::optional<Binding> b = Matcher(v, t).match_at(anchor, &held);
        if (held && log_enabled("patterns") && told_held.insert(held).second)
          log_line("patterns", where + ": " + r->name + " matches at " + op_name(anchor->op) + " #" +
                                   std::to_string(anchor->id) + " but is not applied: the program still holds its " +
                                   op_name(held->op) + " #" + std::to_string(held->id) + " " + shape_str(held->shape) +
                                   " (a Tensor alive when the value was asked for); let it go first");
        if (!b) continue;
        std::string why;
        std::optional<std::vector<NodePtr>> rep;
        try {
          rep = build_replacement(*r, v, *b, t, roots_keep_layout, why);
        } catch (const std::exception& e) {
          why = std::string("the replacement threw: ") + e.what();
        }
        if (!rep) {
          // (a check saying no is the common case of broad rewrites such as pad_mm on every
          // GEMM: said once per rewrite and process)
          const bool checked = why == kCheckSaidNo;
          if (log_enabled("patterns") && (!checked || !r->check_refusal_logged.exchange(true)))
            log_line("patterns", where + ": " + r->name + " matched at " + op_name(anchor->op) + " #" +
                                     std::to_string(anchor->id) + " but was not replaced: " + why +
                                     (checked ? " (further refusals of its check are not logged)" : ""));
          break;
        }
        for (size_t k = 0; k < rep->size(); ++k) redirect(t, roots, b->map.at(v.outputs[k].get()), (*rep)[k]);
        if (constants)
          for (const auto& [p, n] : b->map)
            if (n->op == OpKind::Full) constants->push_back(n);
        ++replaced;
        {
          Registry& reg = registry();
          std::lock_guard<std::mutex> lock(reg.mu);
          reg.counts[r->name]++;
        }
        if (log_enabled("patterns"))
          log_line("patterns",
                   where + ": " + r->name + " replaced " + std::to_string(v.size) + " ops at " + op_name(anchor->op) +
                       " #" + std::to_string(anchor->id) +
                       (v.diff.empty() ? "" : " (with the gradients of " + std::to_string(v.diff.size()) + " inputs)"));
        t = index(roots, first_id, fresh_id);
        i = t.order.size();
        break;
      }
    }
  }
  return replaced;
}

}  // namespace

size_t apply_patterns(const std::vector<std::vector<NodePtr>*>& roots, uint64_t first_id, const std::string& where) {
  if (!patterns::enabled()) return 0;
  const auto rewrites = snapshot();
  if (rewrites.empty()) return 0;
  const uint64_t fresh_id = new_node()->id;  // nodes made from here on are replacements
  return replace_instances(rewrites, roots, first_id, fresh_id, where, false, nullptr);
}

Rewrite segment_patterns(const Segment& seg) {
  Rewrite rw;
  if (!patterns::enabled() || seg.nodes.empty()) return rw;
  // (most segments hold no rewrite's ops: decided from the op kinds before anything is indexed)
  std::set<OpKind> ops;
  for (const Node* n : seg.nodes) ops.insert(n->op);
  std::vector<std::shared_ptr<const Registered>> rewrites;
  for (const auto& r : snapshot())
    if (std::includes(ops.begin(), ops.end(), r->ops.begin(), r->ops.end())) rewrites.push_back(r);
  if (rewrites.empty()) return rw;
  const int N = static_cast<int>(seg.nodes.size());
  std::unordered_map<const Node*, int> at;  // node -> position: segment nodes, made nodes, externals
  for (int i = 0; i < N; ++i) at[seg.nodes[i]] = i;
  // The segment's edges as they are: restored below, whatever happens (they also keep every
  // node alive while the matcher relinks them).
  std::vector<NodeList> before(static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) {
    before[i] = seg.nodes[i]->inputs;
    for (size_t k = 0; k < before[i].size(); ++k)
      if (at.emplace(before[i][k].get(), -static_cast<int>(rw.ext_src.size()) - 1).second)
        rw.ext_src.push_back({i, static_cast<int>(k)});
  }
  std::vector<NodePtr> roots;
  std::vector<int> root_pos;
  for (int i = 0; i < N; ++i)
    if (seg.needed[i]) {
      roots.push_back(seg.nodes[i]->shared_from_this());
      root_pos.push_back(i);
    }
  struct Restore {
    const Segment& seg;
    std::vector<NodeList>& before;
    ~Restore() {
      for (size_t i = 0; i < before.size(); ++i) seg.nodes[i]->inputs = std::move(before[i]);
    }
  } restore{seg, before};
  const std::string where = "eager segment of " + std::to_string(N) + " nodes";
  auto refuse = [&](const std::string& why) {
    if (log_enabled("patterns")) log_line("patterns", where + ": not rewritten: " + why);
    return Rewrite{};
  };
  std::vector<Node*> constants;
  const uint64_t fresh_id = new_node()->id;  // nodes made from here on are replacements
  size_t replaced = 0;
  {
    Untraced untraced;  // (the replacements are recorded, never computed, and no trace sees them)
    replaced = replace_instances(rewrites, {&roots}, 0, fresh_id, where, true, &constants);
  }
  if (!replaced) return Rewrite{};
  // The rewritten graph, as positions: segment nodes kept, then the made nodes.
  for (Node* n : topo_order(roots, {})) {
    if (auto it = at.find(n); it != at.end()) {
      if (it->second < 0) return refuse("a replacement reads a node outside the segment");
      rw.order.push_back(it->second);
      continue;
    }
    if (n->id < fresh_id) return refuse("a replacement reads a node outside the segment");
    Rewrite::Made m{n->op, n->dtype, n->device, n->shape, n->strides, n->offset, n->attrs, {}};
    m.random = n->op == OpKind::RandUniform || n->op == OpKind::RandNormal || n->op == OpKind::RandInt;
    for (const auto& in : n->inputs) {
      auto it = at.find(in.get());
      if (it == at.end()) return refuse("a replacement reads data of its own (a tensor made from values)");
      m.inputs.push_back(it->second);
    }
    const int p = N + static_cast<int>(rw.made.size());
    at[n] = p;
    rw.order.push_back(p);
    rw.made.push_back(std::move(m));
  }
  std::vector<bool> needed(static_cast<size_t>(N) + rw.made.size(), false);
  for (int i = 0; i < N; ++i) needed[i] = seg.needed[i];
  for (size_t j = 0; j < roots.size(); ++j) {
    if (roots[j].get() == seg.nodes[root_pos[j]]) continue;
    const int from = at.at(roots[j].get());
    if (from < 0) return refuse("a replacement returns a tensor computed before the segment");
    rw.shares.push_back({root_pos[j], from});
    needed[from] = true;
  }
  for (int p : rw.order) {
    rw.needed.push_back(needed[p]);
    if (p >= N) continue;
    const NodeList& now = seg.nodes[p]->inputs;
    for (size_t k = 0; k < now.size(); ++k)
      if (now[k] != before[p][k]) rw.edges.push_back({p, static_cast<int>(k), at.at(now[k].get())});
  }
  // Constants a match relied on (a scale, a mask value) are guarded: another value is another plan.
  for (const Node* c : constants) {
    auto it = at.find(c);
    if (it == at.end() || it->second < 0 || it->second >= N)
      return refuse("a match relied on a constant computed before the segment");
    rw.guards.push_back(guard_on(*c, it->second));
  }
  rw.identity = false;
  return rw;
}

uint64_t patterns_generation() { return g_generation.load(std::memory_order_relaxed); }

void set_gradient_forms_only(const std::string& name) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (const auto& r : reg.rewrites)
    if (r->name == name) r->gradient_forms_only = true;
}

}  // namespace kiln::jit

namespace kiln::patterns {

void register_replacement(const std::string& name, PatternFn search, PatternFn replace,
                          std::vector<Tensor> example_tensors, std::vector<double> example_scalars,
                          ExtraCheck extra_check) {
  KILN_CHECK(!name.empty(), "patterns: register_replacement needs a name");
  KILN_CHECK(search && replace, "patterns: register_replacement('", name, "') needs a search and a replace function");
  KILN_CHECK(!example_tensors.empty(), "patterns: register_replacement('", name,
             "') needs at least one example tensor");
  for (size_t i = 0; i < example_tensors.size(); ++i)
    KILN_CHECK(example_tensors[i].defined(), "patterns: example tensor ", i, " of '", name, "' is undefined");
  auto r = std::make_shared<jit::Registered>();
  r->name = name;
  r->search = std::move(search);
  r->replace = std::move(replace);
  // Only the examples' dtypes, devices and shapes are kept: as bare leaves that are no pending
  // eager work (an example from empty() would be, for as long as the rewrite is registered).
  for (const Tensor& e : example_tensors) {
    NodePtr l = new_leaf(e.dtype(), e.device(), e.shape());
    jit::not_pending({l.get()});
    r->examples.push_back(Tensor::from_node(l));
  }
  r->scalars = std::move(example_scalars);
  r->check = std::move(extra_check);
  size_t floating = 0;
  for (const Tensor& e : r->examples) floating += is_floating(e.dtype());
  KILN_CHECK(floating <= 6, "patterns: '", name, "' has ", floating,
             " floating tensor inputs; at most 6 are traced with gradients");
  // The forward-only form now (it validates the search function); the joint forms when a graph
  // first holds every op of it (most graphs hold none of most patterns' ops).
  jit::Variant fwd = jit::trace_variant(*r, {});
  KILN_CHECK(!fwd.outputs.empty(), "patterns: search function of '", name, "' builds no graph");
  {
    std::set<const Node*> leaves;
    for (const auto& l : fwd.leaves) leaves.insert(l.get());
    // (the result itself excluded: gradient-only forms match graphs that never compute it; so
    // is a transposed input, which lazy eager may hold as stored data: Matcher::match_stored_permute)
    for (const Node* n : jit::topo_order(fwd.outputs, leaves))
      if (!leaves.count(n) && n != fwd.outputs[0].get() &&
          !(n->op == OpKind::Permute && leaves.count(n->inputs[0].get())))
        r->ops.insert(n->op);
  }
  r->forward = std::move(fwd);
  jit::Registry& reg = jit::registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = std::find_if(reg.rewrites.begin(), reg.rewrites.end(), [&](const auto& x) { return x->name == name; });
  if (it != reg.rewrites.end())
    *it = std::move(r);
  else
    reg.rewrites.push_back(std::move(r));
  jit::g_generation++;
}

bool unregister_replacement(const std::string& name) {
  jit::Registry& reg = jit::registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = std::find_if(reg.rewrites.begin(), reg.rewrites.end(), [&](const auto& x) { return x->name == name; });
  if (it == reg.rewrites.end()) return false;
  reg.rewrites.erase(it);
  jit::g_generation++;
  return true;
}

std::vector<std::string> registered() {
  jit::snapshot();  // (kiln's own are registered on first use)
  jit::Registry& reg = jit::registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::vector<std::string> names;
  for (const auto& r : reg.rewrites) names.push_back(r->name);
  return names;
}

void set_enabled(bool on) {
  if (jit::enabled_flag().exchange(on) != on) jit::g_generation++;
}
bool enabled() { return jit::enabled_flag(); }

std::map<std::string, int64_t> match_counts() {
  jit::Registry& reg = jit::registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  return reg.counts;
}

}  // namespace kiln::patterns
