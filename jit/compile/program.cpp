#include "jit/compile/program.h"

#include <algorithm>
#include <climits>
#include <sstream>
#include <unordered_map>

#include "jit/exec/jit_executor.h"
#include "runtime/exec/executor.h"
#include "runtime/tensor/trace.h"

namespace kiln::jit {

struct Program::Instance {
  std::vector<NodePtr> owned;
  std::vector<Node*> inputs;
  std::vector<Node*> outputs;
  std::vector<Node*> rands;  // random ops in recording order: fresh Philox counters per call
  std::vector<int64_t> rand_offsets;  // ... and their offsets from a given generator state (or empty)
  Segment seg;
  std::unique_ptr<PreparedSegment> prepared;
  std::unique_ptr<GraphReplay> graphs;  // on a GPU: the instance's device graphs
  // Program::donate's pairs this instance's structure allows: the output computed by the
  // program, no other output a view of the input.
  std::vector<std::pair<size_t, size_t>> donations;
};

namespace {
Shape eval_shape(const Shape& s, const std::map<std::string, int64_t>& env) {
  Shape out;
  out.reserve(s.size());
  for (const auto& d : s) out.emplace_back(d.is_constant() ? d : SymInt(d.evaluate(env)));
  return out;
}
SymInt eval_int(const SymInt& v, const std::map<std::string, int64_t>& env) {
  return v.is_constant() ? v : SymInt(v.evaluate(env));
}
void not_pending(Node& n) {
  if (n.pending) {
    n.pending = false;
    detail::pending_add(-1);
  }
}
// A concrete node of `n`'s type with the layout (shape, strides, offset) under `env` (op, inputs
// and attrs left to the caller).
NodePtr concrete_like(const Node& n, const Shape& shape, const Shape& strides, const SymInt& offset,
                      const std::map<std::string, int64_t>& env) {
  auto c = new_node();
  c->dtype = n.dtype;
  c->device = n.device;
  c->shape = eval_shape(shape, env);
  c->strides = eval_shape(strides, env);
  c->offset = eval_int(offset, env);
  not_pending(*c);
  return c;
}
}  // namespace

bool is_random_op(OpKind op) { return op == OpKind::RandUniform || op == OpKind::RandNormal || op == OpKind::RandInt; }

Program::Program(std::vector<NodePtr> inputs, std::vector<NodePtr> outputs, std::vector<std::string> symbols,
                 std::map<uint64_t, SymInt> rng_offsets)
    : inputs_(std::move(inputs)),
      outputs_(std::move(outputs)),
      symbols_(std::move(symbols)),
      rng_offsets_(std::move(rng_offsets)) {
  std::set<std::string> used;
  auto note = [&](const SymInt& v) {
    if (v.is_constant()) return;
    for (auto& name : v.symbols()) used.insert(name);
  };
  std::set<const Node*> stop;
  for (const auto& in : inputs_) {
    input_layouts_.push_back({in->shape, in->strides, in->offset});
    for_each_size(std::as_const(*in), note);
    stop.insert(in.get());
  }
  // The traced graph is a template: it never runs, so it does not count as pending eager work
  // (which would make later eager code materialize early, op by op, past the pending limit).
  for (Node* n : topo_order(outputs_, stop)) {
    for_each_size(std::as_const(*n), note);
    not_pending(*n);
  }
  for (const auto& in : inputs_) not_pending(*in);
  for (const auto& [id, off] : rng_offsets_) note(off);
  for (size_t i = 0; i < symbols_.size(); ++i)
    if (used.count(symbols_[i])) used_.push_back(i);
}
Program::~Program() = default;

void Program::donate(std::vector<std::pair<size_t, size_t>> write_back) {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_CHECK(instances_.empty(), "compiled program: donations are set before the first run");
  donations_ = std::move(write_back);
}

void Program::use_graphs(GraphPolicy policy) {
  std::lock_guard<std::mutex> lock(mu_);
  graphs_ = std::make_unique<GraphPolicy>(std::move(policy));
  for (auto& [key, inst] : instances_) graph_instance(*inst);  // (a break's segment ran while traced)
}

Program::Instance* Program::oldest_free_graph() {
  Instance* oldest = nullptr;
  int64_t stamp = INT64_MAX;
  for (auto& [key, inst] : instances_)
    if (inst->graphs && inst->graphs->oldest_free() < stamp) {
      stamp = inst->graphs->oldest_free();
      oldest = inst.get();
    }
  return oldest;
}

std::unique_ptr<DeviceGraph> Program::graph_to_reuse() {
  // At the function's limit, the least recently used free graph of this program makes room
  // (its executable is updated in place to the new recording when they line up; its instance
  // records again when next met). With none free, the new graph goes past the limit.
  // Graphs kept past the limit (none was free at an earlier recording) go too.
  while (graphs_->counters->kept >= graphs_->counters->limit) {
    Instance* oldest = oldest_free_graph();
    if (!oldest) return nullptr;
    std::unique_ptr<DeviceGraph> g = oldest->graphs->take_oldest_free();
    if (graphs_->counters->kept < graphs_->counters->limit) return g;
  }
  return nullptr;
}

void Program::graph_instance(Instance& inst) {
  // Random ops draw fresh numbers per run (counters set on the host): such instances run without graphs.
  if (!graphs_ || !inst.prepared || !inst.rands.empty() || inst.graphs) return;
  if (auto dev = GraphReplay::device_of(inst.seg.nodes, inst.inputs))
    inst.graphs = std::make_unique<GraphReplay>(*graphs_, *dev, inst.inputs, inst.outputs);
}

size_t Program::instances() const {
  std::lock_guard<std::mutex> lock(mu_);
  return instances_.size();
}

std::vector<const Node*> Program::body() const {
  std::set<const Node*> stop;
  for (const auto& n : inputs_) stop.insert(n.get());
  auto order = topo_order(outputs_, stop);
  return {order.begin(), order.end()};
}

std::vector<std::string> Program::symbols_used() const {
  std::vector<std::string> out;
  for (size_t i : used_) out.push_back(symbols_[i]);
  return out;
}

Program::Instance& Program::instance(const std::vector<int64_t>& syms) {
  bool same = last_ != nullptr;
  for (size_t i = 0; same && i < used_.size(); ++i) same = last_key_[i] == syms[used_[i]];
  if (same) return *last_;
  std::vector<int64_t> key;
  for (size_t i : used_) key.push_back(syms[i]);
  auto it = instances_.find(key);
  if (it != instances_.end()) {
    last_ = it->second.get();
    last_key_ = std::move(key);
    return *last_;
  }
  std::map<std::string, int64_t> env;
  for (size_t i : used_) env[symbols_[i]] = syms[i];
  auto inst = std::make_unique<Instance>();
  std::unordered_map<const Node*, NodePtr> map;
  std::set<const Node*> stop;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const NodePtr& in = inputs_[i];
    const Layout& lay = input_layouts_[i];
    NodePtr leaf = new_leaf(in->dtype, in->device, eval_shape(lay.shape, env), eval_shape(lay.strides, env),
                            eval_int(lay.offset, env));
    not_pending(*leaf);
    map[in.get()] = leaf;
    stop.insert(in.get());
    inst->inputs.push_back(leaf.get());
    inst->owned.push_back(std::move(leaf));
  }
  std::vector<Node*> order = topo_order(outputs_, stop);
  auto mapped = [&](const NodePtr& n) -> NodePtr {
    auto f = map.find(n.get());
    if (f != map.end()) return f->second;
    // A constant (materialized when traced); anything else is a value the program never gets.
    KILN_CHECK(n->materialized(), "compiled program: internal error: ", op_name(n->op), " ", shape_str(n->shape),
               " is neither an input nor computed by the program");
    return n;
  };
  std::vector<std::pair<uint64_t, Node*>> rands;
  for (Node* n : order) {
    NodePtr c = concrete_like(*n, n->shape, n->strides, n->offset, env);
    c->op = n->op;
    for (const auto& in : n->inputs) c->inputs.push_back(mapped(in));
    c->attrs = n->attrs;
    c->attrs.sizes = eval_shape(n->attrs.sizes, env);
    c->attrs.strides = eval_shape(n->attrs.strides, env);
    c->attrs.offset = eval_int(n->attrs.offset, env);
    bind_size_attrs(*c);
    if (is_random_op(c->op)) rands.push_back({n->id, c.get()});
    map[n] = c;
    inst->seg.nodes.push_back(c.get());
    inst->owned.push_back(std::move(c));
  }
  std::sort(rands.begin(), rands.end());
  for (auto& [id, r] : rands) {
    inst->rands.push_back(r);
    auto off = rng_offsets_.find(id);
    if (off != rng_offsets_.end()) inst->rand_offsets.push_back(off->second.evaluate(env));
  }
  if (inst->rand_offsets.size() != inst->rands.size()) inst->rand_offsets.clear();
  std::set<const Node*> outs;
  for (const auto& o : outputs_) {
    NodePtr m = mapped(o);
    inst->outputs.push_back(m.get());
    outs.insert(m.get());
    if (m == o) inst->owned.push_back(o);  // constant output: keep it alive
  }
  for (Node* n : inst->seg.nodes) inst->seg.needed.push_back(outs.count(n) > 0);
  for (const auto& [o, j] : donations_) {
    Node* out = inst->outputs[o];
    Node* in = inst->inputs[j];
    bool ok = std::find(inst->seg.nodes.begin(), inst->seg.nodes.end(), out) != inst->seg.nodes.end() &&
              !is_view_op(out->op);
    for (const Node* v : inst->outputs)  // an output over the old state would see the write
      for (; ok && v; v = is_view_op(v->op) && !v->inputs.empty() ? v->inputs[0].get() : nullptr) ok = v != in;
    if (ok) inst->donations.push_back({o, j});
  }
  if (!inst->seg.nodes.empty()) inst->prepared = std::make_unique<PreparedSegment>(inst->seg);
  graph_instance(*inst);
  last_ = inst.get();
  last_key_ = key;
  instances_[std::move(key)] = std::move(inst);
  return *last_;
}

std::vector<Tensor> Program::run(const std::vector<Node*>& inputs, const std::vector<int64_t>& syms,
                                 const std::pair<uint64_t, uint64_t>* rng_base) {
  // Views in the program were laid out against inputs that start at their storage's first
  // element: an input at another offset (a narrowed argument, a slice of a packed gradient) is
  // copied to a dense buffer first.
  // (The common case — every input at offset 0 — copies nothing: no per-call allocation.)
  std::vector<Tensor> dense;
  std::vector<Node*> moved;
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto off = inputs[i]->offset.maybe_int();
    if (off && *off == 0) continue;
    if (moved.empty()) moved = inputs;
    dense.push_back(Tensor::from_node(inputs[i]->shared_from_this()).clone());
    dense.back().eval();
    moved[i] = dense.back().node().get();
  }
  const std::vector<Node*>& ins = moved.empty() ? inputs : moved;
  std::lock_guard<std::mutex> lock(mu_);
  Instance& inst = instance(syms);
  KILN_CHECK(inputs.size() == inst.inputs.size(), "compiled program: expected ", inst.inputs.size(), " inputs, got ",
             inputs.size());
  std::vector<Tensor> out;
  if (inst.graphs && inst.graphs->replay(ins, out)) return out;
  // (asked before the inputs are bound: binding shares their storage)
  const bool record = inst.graphs && inst.graphs->wants_record(ins);
  struct Reset {
    Instance& i;
    ~Reset() {
      for (Node* n : i.seg.nodes) n->storage.reset();
      for (Node* n : i.inputs) n->storage.reset();
    }
  } reset{inst};
  auto bind = [&] {
    for (size_t i = 0; i < ins.size(); ++i) {
      Node* dst = inst.inputs[i];
      const Node* src = ins[i];
      dst->storage = src->storage;
      dst->offset = src->offset;
      bool same = dst->strides.size() == src->strides.size();
      for (size_t d = 0; same && d < src->strides.size(); ++d)
        same = src->strides[d].is_constant() && dst->strides[d].as_int() == src->strides[d].as_int();
      if (!same) dst->strides = src->strides;
    }
  };
  bind();
  if (rng_base) {
    KILN_CHECK(inst.rand_offsets.size() == inst.rands.size(), "compiled program: a random op has no generator offset");
    for (size_t i = 0; i < inst.rands.size(); ++i) {
      inst.rands[i]->attrs.seed = rng_base->first;
      inst.rands[i]->attrs.counter = rng_base->second + static_cast<uint64_t>(inst.rand_offsets[i]);
    }
  } else {
    for (Node* r : inst.rands) {
      int64_t n = 1;
      for (const auto& d : r->shape) n *= d.as_int();
      std::tie(r->attrs.seed, r->attrs.counter) = detail::rng_reserve(static_cast<uint64_t>(n));
    }
  }
  if (record) {
    if (inst.graphs->record(
            ins, [&] { inst.prepared->run(); },
            [&](size_t i, const std::shared_ptr<Storage>& s) { inst.inputs[i]->storage = s; }, out, graph_to_reuse()))
      return out;
    for (Node* n : inst.seg.nodes) n->storage.reset();  // what the failed recording left
    bind();
  } else if (inst.graphs) {
    inst.graphs->note_ungraphed();
  }
  // Donated state: the caller's node and storage held by no one else (a second tensor, a view or
  // a pending op over it would see the write), bound as given (not a dense copy).
  struct Donated {
    Instance& i;
    ~Donated() {
      for (const auto& [o, j] : i.donations) i.outputs[o]->write_over = nullptr;
    }
  } donated{inst};
  if (!inst.graphs)
    for (const auto& [o, j] : inst.donations) {
      const Node* caller = inputs[j];
      if (ins[j] == caller && caller->storage && caller->storage.use_count() == 2 &&
          caller->weak_from_this().use_count() == 1)
        inst.outputs[o]->write_over = inst.inputs[j];
    }
  if (inst.prepared) inst.prepared->run();
  out.reserve(inst.outputs.size());
  for (Node* o : inst.outputs) {
    KILN_CHECK(o->materialized(), "compiled program: output ", op_name(o->op), " was not computed");
    out.push_back(leaf_over(*o, o->storage));
  }
  return out;
}

std::string graph_dot(const std::vector<NodePtr>& inputs, const std::vector<NodePtr>& outputs,
                      const std::set<const Node*>& highlight, const std::string& label) {
  std::set<const Node*> stop;
  for (const auto& n : inputs) stop.insert(n.get());
  std::vector<Node*> order = topo_order(outputs, stop);
  std::ostringstream os;
  os << "digraph kiln {\n  label=\"" << label << "\";\n  node [shape=box, fontname=monospace];\n";
  std::unordered_map<const Node*, std::string> names;
  auto name_of = [&](const Node* n) {
    auto it = names.find(n);
    if (it != names.end()) return it->second;
    std::string nm = "n" + std::to_string(names.size());
    names[n] = nm;
    bool is_input = stop.count(n) > 0;
    os << "  " << nm << " [label=\""
       << (is_input            ? "input"
           : n->materialized() ? "constant"
                               : op_name(n->op))
       << " " << dtype_name(n->dtype) << " " << shape_str(n->shape)
       << ((n->op == OpKind::Attention || n->op == OpKind::AttentionBackward) && attention_causal(n->attrs) ? " causal"
                                                                                                            : "")
       << (n->op == OpKind::Attention && attention_mask_input(*n) ? " masked" : "")
       << ((n->op == OpKind::Attention || n->op == OpKind::AttentionBackward) && attention_dropout(n->attrs) > 0
               ? " dropout"
               : "")
       << "\"";
    if (highlight.count(n))
      os << ", style=filled, fillcolor=orange";
    else if (is_input)
      os << ", style=filled, fillcolor=lightblue";
    os << "];\n";
    return nm;
  };
  for (const auto& n : inputs) name_of(n.get());
  for (Node* n : order) {
    std::string me = name_of(n);
    for (const auto& in : n->inputs) os << "  " << name_of(in.get()) << " -> " << me << ";\n";
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    os << "  out" << i << " [label=\"output " << i << "\", shape=ellipse];\n";
    os << "  " << name_of(outputs[i].get()) << " -> out" << i << ";\n";
  }
  os << "}\n";
  return os.str();
}

}  // namespace kiln::jit
