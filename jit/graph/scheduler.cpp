#include "jit/graph/scheduler.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace kiln::jit {

namespace {

bool touches_half(const Node& n) {
  if (is_half(n.dtype)) return true;
  for (auto& in : n.inputs)
    if (is_half(in->dtype)) return true;
  return false;
}
}  // namespace

bool inline_sum(const Node& n) {
  if (n.op != OpKind::Sum || n.attrs.ints.empty() || n.inputs.empty()) return false;
  int64_t count = 1;
  for (int64_t d : n.attrs.ints) {
    const auto size = n.inputs[0]->shape[static_cast<size_t>(d)].maybe_int();
    if (!size) return false;
    count *= *size;
  }
  return count <= kInlineSum;
}

bool is_reduction_op(OpKind op) {
  return op == OpKind::Sum || op == OpKind::Prod || op == OpKind::Amax || op == OpKind::Amin || is_arg_reduction(op);
}

NodeClass classify(const Node& n) {
  // Reducing no dims (a 0-d input) is elementwise: the value itself (or index 0); so is a sum
  // over at most kInlineSum elements (the x, y, z of a vector: lowered as adds, unrolled).
  if (is_reduction_op(n.op)) return n.attrs.ints.empty() || inline_sum(n) ? NodeClass::Pointwise : NodeClass::Reduction;
  switch (n.op) {
    case OpKind::Full:
    case OpKind::Arange: return NodeClass::Source;
    case OpKind::View:
    case OpKind::Permute:
    case OpKind::Expand:
    case OpKind::Slice:
    case OpKind::Select:
    case OpKind::Squeeze:
    case OpKind::Unsqueeze:
    case OpKind::Flip: return NodeClass::View;
    case OpKind::Remainder:
    case OpKind::Fmod:
    case OpKind::Pow:
      // Integer forms raise kiln::Error on bad values: keep them on the checked reference path.
      return is_floating(n.inputs.empty() ? n.dtype : n.inputs[0]->dtype) ? NodeClass::Pointwise : NodeClass::Opaque;
    default: break;
  }
  if (n.op >= OpKind::Neg && n.op <= OpKind::Where) return NodeClass::Pointwise;
  if (n.op == OpKind::Contiguous) return NodeClass::Pointwise;
  return NodeClass::Opaque;
}

namespace {

bool all_reduced(const Node& r) { return r.attrs.ints.size() == r.inputs[0]->shape.size(); }

struct Sig {
  Shape domain;
  std::vector<int64_t> dims;
  bool operator==(const Sig& o) const { return dims == o.dims && same_shape(domain, o.domain); }
};

Sig sig_of_reduction(const Node& r) { return {r.inputs[0]->shape, r.attrs.ints}; }

// Shape of the reduction result with and without keepdim.
bool fits_reduced(const Shape& s, const Sig& sig) {
  Shape keep, drop;
  for (size_t i = 0; i < sig.domain.size(); ++i) {
    bool r = std::find(sig.dims.begin(), sig.dims.end(), static_cast<int64_t>(i)) != sig.dims.end();
    keep.push_back(r ? SymInt(1) : sig.domain[i]);
    if (!r) drop.push_back(sig.domain[i]);
  }
  return same_shape(s, keep) || same_shape(s, drop);
}

struct Scheduler {
  const Segment& seg;
  ScheduleOptions opts;
  // The node's class here: 16-bit float values run on the reference kernels unless the target
  // computes them in kernels.
  NodeClass cls(const Node& n) const { return !opts.half_kernels && touches_half(n) ? NodeClass::Opaque : classify(n); }
  std::unordered_map<const Node*, size_t> pos;
  std::unordered_set<const Node*> M;  // nodes that get their own storage
  std::unordered_map<const Node*, std::string> why;  // why a node was materialized
  std::unordered_set<const Node*> costly;  // values whose fused cone calls a transcendental

  explicit Scheduler(const Segment& s) : seg(s) {
    for (size_t i = 0; i < s.nodes.size(); ++i) pos[s.nodes[i]] = i;
  }
  bool in_seg(const Node* n) const { return pos.count(n) > 0; }

  const Node* storage_root(const Node* n) const {
    while (is_view_op(n->op) && in_seg(n) && !n->inputs.empty()) n = n->inputs[0].get();
    return n;
  }
  void require(const Node* n, const char* reason) {
    const Node* r = storage_root(n);
    if (in_seg(r) && !M.count(r)) {
      M.insert(r);
      why[r] = reason;
    }
  }

  // The iteration domain a root's kernel runs over.
  static Shape domain_of(const Node* root) {
    return classify(*root) == NodeClass::Reduction ? root->inputs[0]->shape : root->shape;
  }

  // The fusable ancestors of root (root included), in topological order. Stored pointwise
  // nodes of the same domain are recomputed inline (they are written by a merged kernel),
  // except a library op's epilogue (recompute_rereads_product).
  std::vector<Node*> cone(Node* root) const {
    Shape dom = domain_of(root);
    int inlined = 0;  // stored nodes recomputed inline: bounded so cones stay small
    auto take = [&](Node* i) {
      if (!in_seg(i)) return false;
      NodeClass c = cls(*i);
      if (c != NodeClass::Pointwise && c != NodeClass::Source && c != NodeClass::View && c != NodeClass::Reduction)
        return false;
      if (!M.count(i)) return true;
      if ((c != NodeClass::Pointwise && c != NodeClass::Source) || !same_shape(i->shape, dom)) return false;
      if (costly.count(i)) return false;  // stored because it is expensive: read it back
      auto w = why.find(i);
      if (w != why.end() && (w->second == std::string("kernel depth limit") || w->second == kManyReads)) return false;
      if (recompute_rereads_product(i)) return false;
      return ++inlined <= 16;
    };
    std::vector<Node*> out;
    std::unordered_set<Node*> seen{root};
    std::vector<Node*> stack{root};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      out.push_back(n);
      for (auto& in : n->inputs) {
        Node* i = in.get();
        if (seen.count(i) || !take(i)) continue;
        seen.insert(i);
        stack.push_back(i);
      }
    }
    std::sort(out.begin(), out.end(), [&](Node* a, Node* b) { return pos.at(a) < pos.at(b); });
    return out;
  }

  // Whether recomputing the stored pointwise node n inline would read back, at full size, the
  // product of a library op of this segment (a GEMM's output): n is then that product's
  // epilogue, and reading n moves fewer bytes (the product itself need not be kept at all).
  // "Full size" counts elements: a [B·T, N] product viewed as [B, T, N] (matmul's folded
  // batch) is read at full size just the same.
  bool recompute_rereads_product(const Node* n) const {
    return inline_leaves(n, [&](const Node* i, bool inside, NodeClass c) {
      return inside && c == NodeClass::Opaque && provably_equal(numel(i->shape), numel(n->shape));
    });
  }

  // Walks what computing n inline reads: descends through the segment's unstored pointwise,
  // source and view nodes and calls leaf(node, in the segment, class) on every other node it
  // reaches (stored values, library products, reductions, values from outside the segment);
  // stops, returning true, when leaf does.
  template <class F>
  bool inline_leaves(const Node* n, F&& leaf) const {
    std::unordered_set<const Node*> seen{n};
    std::vector<const Node*> stack{n};
    while (!stack.empty()) {
      const Node* x = stack.back();
      stack.pop_back();
      for (const auto& in : x->inputs) {
        const Node* i = in.get();
        if (!seen.insert(i).second) continue;
        const bool inside = in_seg(i);
        const NodeClass c = inside ? cls(*i) : NodeClass::Opaque;
        if (inside && !M.count(i) && (c == NodeClass::Pointwise || c == NodeClass::Source || c == NodeClass::View))
          stack.push_back(i);
        else if (leaf(i, inside, c))
          return true;
      }
    }
    return false;
  }

  void initial_requirements() {
    // Bound kernel size: store a value every kMaxDepth fused ops along any chain.
    constexpr int kMaxDepth = 128;
    std::unordered_map<const Node*, int> depth;
    for (Node* n : seg.nodes) {
      NodeClass c = cls(*n);
      if (c == NodeClass::Opaque) continue;
      int d = 0;
      for (auto& in : n->inputs) {
        auto it = depth.find(in.get());
        if (it != depth.end()) d = std::max(d, it->second);
      }
      if (d + 1 >= kMaxDepth && !is_view_op(n->op)) {
        require(n, "kernel depth limit");
        depth[n] = 0;
      } else {
        depth[n] = d + 1;
      }
    }
    for (size_t i = 0; i < seg.nodes.size(); ++i) {
      Node* n = seg.nodes[i];
      NodeClass c = cls(*n);
      if (seg.needed[i]) require(n, "used outside the segment");
      if (c == NodeClass::Opaque || n->op == OpKind::AsStrided)
        for (auto& in : n->inputs)
          require(in.get(), c == NodeClass::Opaque ? "input of a library/reference op" : "input of as_strided");
      // Full reductions run split across threads; they are stored, their consumers fused apart.
      if (c == NodeClass::Reduction && all_reduced(*n) && !n->inputs[0]->shape.empty())
        require(n, "full reduction (split)");
    }
    // An expensive value (transcendentals in its fused cone) that a reduction reads and another
    // op reads too would be recomputed in every stage of the kernel: compute it once, store it.
    std::unordered_map<const Node*, int> consumers;
    std::unordered_set<const Node*> read_by_reduction;
    for (Node* n : seg.nodes)
      for (auto& in : n->inputs) {
        consumers[in.get()]++;
        if (cls(*n) == NodeClass::Reduction) read_by_reduction.insert(in.get());
      }
    for (Node* n : seg.nodes) {
      NodeClass c = cls(*n);
      if (c != NodeClass::Pointwise && c != NodeClass::View) continue;
      bool cost = transcendental(n->op);
      for (auto& in : n->inputs) cost = cost || (costly.count(in.get()) && !M.count(in.get()));
      if (!cost) continue;
      costly.insert(n);
      if (opts.store_expensive && c == NodeClass::Pointwise && consumers[n] >= 2 && read_by_reduction.count(n))
        require(n, kReadByReduction);
    }
    // A scalar computed from scalars (an optimizer's bias correction: pow, sqrt, float64 math)
    // that a larger kernel reads would be recomputed for each of that kernel's elements: it is
    // computed once, in a kernel of the segment's scalars, and read back.
    for (Node* n : seg.nodes) {
      if (scalar_shape(n->shape)) continue;
      for (auto& in : n->inputs)
        if (in_seg(in.get()) && scalar_shape(in->shape) && computes_scalar(in.get())) require(in.get(), kScalar);
    }
  }

  static bool scalar_shape(const Shape& s) {
    return std::all_of(s.begin(), s.end(), [](const SymInt& d) { return is_one(d); });
  }

  // Whether the scalar s, fused, would compute something: s or its fused cone (the segment's
  // unstored pointwise, source and view nodes it reads) holds an op other than a cast, a copy
  // or a view.
  bool computes_scalar(const Node* s) const {
    auto arith = [&](const Node* x) {
      return cls(*x) == NodeClass::Pointwise && x->op != OpKind::Cast && x->op != OpKind::Contiguous;
    };
    const NodeClass c = cls(*s);
    if (c != NodeClass::Pointwise && c != NodeClass::View) return false;
    std::unordered_set<const Node*> seen{s};
    std::vector<const Node*> stack{s};
    while (!stack.empty()) {
      const Node* x = stack.back();
      stack.pop_back();
      if (arith(x)) return true;
      for (const auto& in : x->inputs) {
        const Node* i = in.get();
        if (!in_seg(i) || M.count(i) || !seen.insert(i).second) continue;
        const NodeClass ci = cls(*i);
        if (ci == NodeClass::Pointwise || ci == NodeClass::View || ci == NodeClass::Source) stack.push_back(i);
      }
    }
    return false;
  }

  // A value that several kernels compute and whose computation reads many stored values is
  // stored once (as Inductor realizes a buffer with several users past its reads threshold):
  // else a chain of them — a residual stream x_{k+1} = x_k + f_k read by each layer's norm —
  // rereads every earlier term in every layer, the cost growing with depth. In topological
  // order, so that each store cuts the cones counted after it; true when any was stored.
  bool store_widely_recomputed(const std::vector<Step>& steps) {
    std::unordered_map<const Node*, int> kernels_with;
    for (const Step& st : steps)
      if (st.kind == Step::Kind::Kernel)
        for (const Node* n : st.group.nodes)
          if (!M.count(n) && cls(*n) == NodeClass::Pointwise) kernels_with[n]++;
    bool more = false;
    for (Node* n : seg.nodes) {
      auto it = kernels_with.find(n);
      if (it == kernels_with.end() || it->second < 2 || recompute_reads(n) < kRecomputeReads) continue;
      require(n, kManyReads);
      more = true;
    }
    return more;
  }

  // The stored values (and library products, reductions and values from outside the segment)
  // that computing n inline reads.
  size_t recompute_reads(const Node* n) const {
    std::unordered_set<const Node*> reads;
    inline_leaves(n, [&](const Node* i, bool, NodeClass) {
      reads.insert(storage_root(i));
      return false;
    });
    return reads.size();
  }


  static bool transcendental(OpKind op) {
    switch (op) {
      case OpKind::Exp:
      case OpKind::Exp2:
      case OpKind::Expm1:
      case OpKind::Log:
      case OpKind::Log2:
      case OpKind::Log1p:
      case OpKind::Sin:
      case OpKind::Cos:
      case OpKind::Tan:
      case OpKind::Atan:
      case OpKind::Tanh:
      case OpKind::Sigmoid:
      case OpKind::Erf:
      case OpKind::Pow:
      case OpKind::Atan2: return true;
      default: return false;
    }
  }

  // Promotes reductions that cannot live in the group of `root`; returns true if any changed.
  bool settle(Node* root) {
    std::vector<Node*> c = cone(root);
    std::vector<Node*> reds;
    for (Node* n : c)
      if (cls(*n) == NodeClass::Reduction) reds.push_back(n);
    if (reds.empty()) return false;
    Sig sig = sig_of_reduction(*reds.back());
    bool root_fits = cls(*root) == NodeClass::Reduction
                         ? sig_of_reduction(*root) == sig
                         : same_shape(root->shape, sig.domain) || fits_reduced(root->shape, sig);
    bool changed = false;
    for (Node* r : reds) {
      if (r == root) continue;
      if (!root_fits || !(sig_of_reduction(*r) == sig)) {
        M.insert(r);
        why[r] = "reduction of another shape than its consumer's kernel";
        changed = true;
      }
    }
    return changed;
  }

  static constexpr const char* kReadByReduction = "expensive value read by a reduction and another op";
  static constexpr const char* kScalar = "scalar read by a larger kernel";
  static constexpr const char* kManyReads = "computed by several kernels, each reading many stored values";
  // (two kernels: storing costs r + 2 accesses, recomputing 2r)
  static constexpr size_t kRecomputeReads = 3;
  static constexpr int kUnreadTries = 4;  // (each try can undo the last: bounded)

  // Values stored only as kReadByReduction that no other step reads, in a kernel that keeps
  // its rows (opts.keeps_rows): dropped from M; returns them.
  std::vector<const Node*> unstore_row_local(const std::vector<Step>& steps) {
    return unstore_unread(steps, kReadByReduction, [&](const Group& g) { return opts.keeps_rows(g); });
  }

  // Outputs stored as `reason` that no other step reads, in kernels `in_kernel` accepts: dropped
  // from M; returns them.
  std::vector<const Node*> unstore_unread(const std::vector<Step>& steps, const char* reason,
                                          const std::function<bool(const Group&)>& in_kernel) {
    std::unordered_map<const Node*, int> readers;  // steps reading a stored node
    for (const Step& st : steps) {
      if (st.kind == Step::Kind::Kernel)
        for (const Node* in : st.group.inputs) readers[storage_root(in)]++;
      else if (st.node)
        for (auto& in : st.node->inputs) readers[storage_root(in.get())]++;
    }
    std::vector<const Node*> dropped;
    for (const Step& st : steps) {
      if (st.kind != Step::Kind::Kernel || !in_kernel(st.group)) continue;
      for (const Node* o : st.group.outputs) {
        auto w = why.find(o);
        if (w == why.end() || w->second != reason || readers.count(o) || seg.needed[pos.at(o)]) continue;
        M.erase(o);
        why.erase(o);
        dropped.push_back(o);
      }
    }
    return dropped;
  }

  std::vector<Step> run() {
    initial_requirements();
    std::vector<const Node*> dropped;  // by unstore_row_local, tried once
    bool tried_unstore = !opts.keeps_rows;
    int unread_tries = 0;
    for (;;) {
      std::vector<Step> steps = build_steps();
      if (store_widely_recomputed(steps)) continue;
      // Stores that left their value to one kernel after all (kernels merged once values were
      // stored) are dropped; one computed by several kernels again is stored again above. Tried
      // again after later stores change the kernels (a softmax backward that reads y merges the
      // row stages only once the expensive values are stored), a bounded number of times.
      if (unread_tries < kUnreadTries) {
        ++unread_tries;
        if (!unstore_unread(steps, kManyReads, [](const Group&) { return true; }).empty()) continue;
      }
      // A transcendental op that several kernels would each recompute is computed once and
      // stored instead (e.g. a forward erf that the backward's kernels read again); not where
      // recomputing is cheaper than memory traffic (store_expensive off).
      if (!opts.store_expensive) return steps;
      std::unordered_map<const Node*, int> kernels_using;
      for (const Step& st : steps)
        if (st.kind == Step::Kind::Kernel)
          for (const Node* n : st.group.nodes)
            if (!M.count(n) && cls(*n) == NodeClass::Pointwise && transcendental(n->op)) kernels_using[n]++;
      bool more = false;
      for (const auto& [n, k] : kernels_using)
        if (k >= 2) {
          M.insert(n);
          why[n] = "expensive value recomputed in " + std::to_string(k) + " kernels";
          more = true;
        }
      if (more) continue;
      if (!tried_unstore) {
        tried_unstore = true;
        dropped = unstore_row_local(steps);
        if (!dropped.empty()) continue;
      }
      // A dropped value must still be computed by one kernel only; else it is stored again.
      bool restore = false;
      for (const Node* o : dropped) {
        int in_kernels = 0;
        for (const Step& st : steps)
          if (st.kind == Step::Kind::Kernel &&
              std::find(st.group.nodes.begin(), st.group.nodes.end(), o) != st.group.nodes.end())
            in_kernels++;
        if (in_kernels > 1) {
          require(o, kReadByReduction);
          restore = true;
        }
      }
      dropped.clear();
      if (!restore) return steps;
    }
  }

  std::vector<Step> build_steps() {
    for (bool changed = true; changed;) {
      changed = false;
      for (Node* n : seg.nodes)
        if (M.count(n) && cls(*n) != NodeClass::Opaque && !is_view_op(n->op)) changed = settle(n) || changed;
    }
    std::vector<Step> steps;
    std::unordered_map<const Node*, size_t> producer;  // output node -> step index
    for (size_t i = 0; i < seg.nodes.size(); ++i) {
      Node* n = seg.nodes[i];
      NodeClass c = cls(*n);
      if (c == NodeClass::Opaque || n->op == OpKind::AsStrided) {
        Step s{Step::Kind::Opaque, {}, n};
        if (n->op == OpKind::AsStrided) s.kind = Step::Kind::View;
        producer[n] = steps.size();
        steps.push_back(std::move(s));
        continue;
      }
      if (c == NodeClass::View) {
        // Needed views and views read by library ops just share their root's storage.
        bool used_as_buffer = seg.needed[i];
        for (Node* m : seg.nodes)
          if (cls(*m) == NodeClass::Opaque || m->op == OpKind::AsStrided)
            for (auto& in : m->inputs) used_as_buffer = used_as_buffer || in.get() == n;
        if (used_as_buffer) steps.push_back({Step::Kind::View, {}, n});
        continue;
      }
      if (!M.count(n)) continue;
      Group g = make_group(n);
      // Merge into an earlier kernel of the same iteration space when everything this one
      // reads is produced before that kernel.
      size_t first_dep = 0;
      for (Node* in : g.inputs) {
        // The step producing the input itself (an as_strided view gets its storage from a view
        // step of its own) or any view on the way to its storage root.
        for (Node* v = in;; v = v->inputs[0].get()) {
          auto it = producer.find(v);
          if (it != producer.end()) first_dep = std::max(first_dep, it->second + 1);
          if (!is_view_op(v->op) || v->inputs.empty()) break;
        }
      }
      bool merged = false;
      for (size_t k = steps.size(); k-- > first_dep;) {
        Step& s = steps[k];
        if (s.kind != Step::Kind::Kernel || !same_shape(s.group.domain, g.domain)) continue;
        // Pointwise kernels join reduction kernels of their domain; reductions must agree.
        bool compatible = s.group.reduce_dims.empty() || g.reduce_dims.empty() ||
                          (s.group.reduce_dims == g.reduce_dims && s.group.split == g.split);
        if (!compatible || too_many_reductions(s.group, g)) continue;
        merge(s.group, g);
        producer[n] = k;
        merged = true;
        break;
      }
      // Row kernels: a later stage of the same rows (a reduction over the last dim, or a
      // pointwise value of the domain) joins the row kernel whose outputs it reads; those
      // values are then accumulators of earlier stages in that kernel.
      if (!merged && opts.merge_row_stages && first_dep > 0) {
        Step& s = steps[first_dep - 1];
        if (s.kind == Step::Kind::Kernel && same_shape(s.group.domain, g.domain) && row_group(s.group) &&
            (g.reduce_dims.empty() || g.reduce_dims == s.group.reduce_dims) && !g.split) {
          merge(s.group, g);
          producer[n] = first_dep - 1;
          merged = true;
        }
      }
      if (!merged) {
        producer[n] = steps.size();
        steps.push_back({Step::Kind::Kernel, std::move(g), nullptr});
      }
    }
    return steps;
  }

  bool too_many_reductions(const Group& into, const Group& g) const {
    if (opts.max_merged_reductions <= 0) return false;
    auto reductions = [&](const Group& x) {
      int r = 0;
      for (Node* n : x.nodes) r += cls(*n) == NodeClass::Reduction;
      return r;
    };
    return reductions(into) + reductions(g) > opts.max_merged_reductions;
  }

  // A reduction over the last dim only (one row per kept index).
  static bool row_group(const Group& g) {
    return !g.split && g.reduce_dims.size() == 1 && g.reduce_dims[0] + 1 == static_cast<int64_t>(g.domain.size());
  }

  Group make_group(Node* root) {
    Group g;
    g.nodes = cone(root);
    g.outputs = {root};
    g.why = {why.count(root) ? why.at(root) : "stored"};
    std::unordered_set<Node*> inside(g.nodes.begin(), g.nodes.end());
    std::set<Node*> ins;
    for (Node* n : g.nodes)
      for (auto& in : n->inputs)
        if (!inside.count(in.get())) ins.insert(in.get());
    g.inputs.assign(ins.begin(), ins.end());
    std::sort(g.inputs.begin(), g.inputs.end(), [&](Node* a, Node* b) { return a->id < b->id; });
    const Node* red = nullptr;
    for (Node* n : g.nodes)
      if (cls(*n) == NodeClass::Reduction) red = n;
    if (red) {
      g.domain = red->inputs[0]->shape;
      g.reduce_dims = red->attrs.ints;
      g.split = all_reduced(*red) && !g.domain.empty();
    } else {
      g.domain = root->shape;
    }
    return g;
  }

  void merge(Group& into, const Group& g) {
    if (into.reduce_dims.empty()) {
      into.reduce_dims = g.reduce_dims;
      into.split = g.split;
    }
    std::unordered_set<Node*> have(into.nodes.begin(), into.nodes.end());
    for (Node* n : g.nodes)
      if (!have.count(n)) into.nodes.push_back(n);
    std::sort(into.nodes.begin(), into.nodes.end(), [&](Node* a, Node* b) { return pos.at(a) < pos.at(b); });
    into.outputs.insert(into.outputs.end(), g.outputs.begin(), g.outputs.end());
    into.why.insert(into.why.end(), g.why.begin(), g.why.end());
    std::set<Node*> ins(into.inputs.begin(), into.inputs.end());
    std::unordered_set<Node*> inside(into.nodes.begin(), into.nodes.end());
    for (Node* in : g.inputs)
      if (!inside.count(in)) ins.insert(in);
    into.inputs.clear();
    for (Node* in : ins)
      if (!inside.count(in)) into.inputs.push_back(in);
    std::sort(into.inputs.begin(), into.inputs.end(), [&](Node* a, Node* b) { return a->id < b->id; });
  }
};

}  // namespace

std::vector<Step> schedule(const Segment& seg, const std::vector<const Node*>& stored, ScheduleOptions opts) {
  Scheduler s(seg);
  s.opts = opts;
  for (const Node* n : stored) {
    s.M.insert(n);
    s.why[n] = "read at another index by its consumer";
  }
  return s.run();
}

std::string describe(const std::vector<Step>& steps) {
  std::ostringstream os;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    os << "  step " << i << ": ";
    if (s.kind == Step::Kind::Kernel) {
      const Group& g = s.group;
      os << (g.reduce_dims.empty() ? "pointwise"
             : g.split             ? "split-reduction"
                                   : "reduction")
         << " kernel over " << shape_str(g.domain) << ", " << g.nodes.size() << " ops [";
      for (size_t k = 0; k < g.nodes.size(); ++k) os << (k ? " " : "") << op_name(g.nodes[k]->op);
      os << "] -> " << g.outputs.size() << " output(s), " << g.inputs.size() << " input(s)";
      std::map<std::string, int> reasons;
      for (const auto& w : g.why) reasons[w]++;
      os << "; stored:";
      for (const auto& [w, c] : reasons) os << " " << c << "x " << w << ";";
    } else if (s.kind == Step::Kind::Opaque) {
      os << "library/reference op " << op_name(s.node->op) << " " << shape_str(s.node->shape);
    } else {
      os << "view " << op_name(s.node->op);
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace kiln::jit
