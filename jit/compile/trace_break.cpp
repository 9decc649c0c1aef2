// TraceSession::take_break: a small value fn needs mid-trace is computed on the call's inputs
// by a program of its own (the break's segment); the trace goes on with that value, which
// becomes a value guard of the continuation.
#include <algorithm>
#include <unordered_map>

#include "jit/compile/trace_session.h"
#include "runtime/exec/executor.h"

namespace kiln::jit {
namespace {

// Turns the thread's trace hooks off while a break's program runs for real.
struct PauseHooks {
  detail::TraceObserver* observer = detail::set_trace_observer(nullptr);
  ShapeOracle* oracle = set_shape_oracle(nullptr);
  ~PauseHooks() {
    detail::set_trace_observer(observer);
    set_shape_oracle(oracle);
  }
};

// "item() of sum", "values of ne (16 elements)": what fn read, for messages.
std::string describe(const std::vector<NodePtr>& values, int64_t elems) {
  const Node* n = values.front().get();
  while ((n->op == OpKind::Contiguous || n->op == OpKind::Cast) && !n->inputs.empty()) n = n->inputs[0].get();
  std::string op = n->op == OpKind::Leaf ? "an argument" : op_name(n->op);
  if (elems == 1 && values.size() == 1) return "item() of " + op;
  return "values of " + op + " (" + std::to_string(elems) + " elements)";
}

}  // namespace

void TraceSession::take_break(const NodePtr* roots, size_t nroots) {
  // The values asked for, and the segment computing them (stopping at slots and stored values).
  std::vector<NodePtr> values;
  for (size_t r = 0; r < nroots; ++r)
    if (roots[r] && !roots[r]->materialized() && std::find(values.begin(), values.end(), roots[r]) == values.end())
      values.push_back(roots[r]);
  std::vector<Node*> seg = topo_order(values, slot_set_);
  for (Node* n : seg)
    if (is_random_op(n->op) && random_done_.count(n->id))
      throw GraphBreak{"random values an earlier data-dependent step computed are needed again by another one"};
  // Carried: nodes of the segment that something outside it still holds (later segments read them).
  std::unordered_map<const Node*, long> internal;
  for (Node* n : seg)
    for (const auto& in : n->inputs) internal[in.get()]++;
  std::set<const Node*> is_value;
  for (const auto& v : values) is_value.insert(v.get());
  std::vector<Node*> carried_raw;
  for (Node* n : seg)
    if (!is_value.count(n) && n->weak_from_this().use_count() > internal[n]) carried_raw.push_back(n);
  std::vector<NodePtr> carried;
  for (Node* n : carried_raw) carried.push_back(n->shared_from_this());
  // The program keeps a copy of the segment: the traced values get storage and lose their inputs.
  std::unordered_map<const Node*, NodePtr> copy;
  std::map<uint64_t, SymInt> offsets;
  auto mapped = [&](const NodePtr& n) {
    auto f = copy.find(n.get());
    return f == copy.end() ? n : f->second;
  };
  std::string sig = std::to_string(slots.size()) + ":";
  for (Node* n : seg) {
    auto c = new_node();
    c->op = n->op;
    for (const auto& in : n->inputs) c->inputs.push_back(mapped(in));
    // Sizes simplified with the facts known now (all of them guarded before this break).
    c->attrs = n->attrs;
    c->attrs.sizes = facts_.simplify(n->attrs.sizes);
    c->attrs.strides = facts_.simplify(n->attrs.strides);
    c->attrs.offset = facts_.simplify(n->attrs.offset);
    c->dtype = n->dtype;
    c->device = n->device;
    c->shape = facts_.simplify(n->shape);
    c->strides = facts_.simplify(n->strides);
    c->offset = facts_.simplify(n->offset);
    c->pending = false;
    detail::pending_add(-1);
    if (is_random_op(n->op)) {
      auto off = rng_offsets.find(n->id);
      if (off == rng_offsets.end()) throw GraphBreak{"a random op the trace did not see being recorded"};
      offsets[c->id] = facts_.simplify(off->second);
      random_done_.insert(n->id);
    }
    sig += std::string(op_name(n->op)) + ",";
    copy[n] = std::move(c);
  }
  std::vector<NodePtr> outs;
  for (const auto& v : values) outs.push_back(mapped(v));
  for (const auto& c : carried) outs.push_back(mapped(c));
  auto step = std::make_unique<BreakStep>();
  int64_t elems = 0;
  for (const auto& o : outs) {
    sig += std::string("|") + dtype_name(o->dtype) + shape_str(o->shape) + shape_str(o->strides) + o->offset.str();
    if (step->dtypes.size() < values.size()) {
      step->dtypes.push_back(o->dtype);
      step->numels.push_back(numel(o->shape).evaluate(hints_));
      elems += step->numels.back();
    }
  }
  step->prog = std::make_shared<Program>(slots, outs, symbols_, std::move(offsets));
  step->num_values = values.size();
  step->what = describe(values, elems);
  step->signature = std::move(sig);
  // Run it on this call's inputs, drawing random numbers as eager mode would.
  std::vector<Tensor> got;
  {
    PauseHooks pause;
    std::vector<Node*> real;
    for (const auto& r : real_) real.push_back(r.get());
    got = step->prog->run(real, syms_, &rng_);
  }
  TracedBreak b;
  b.bytes = value_bytes(got, values.size());
  b.captured_before = captured.size();
  b.relations_before = relations.size();
  b.step = std::move(step);
  for (size_t i = 0; i < values.size(); ++i) values[i]->set_storage(storage_like(*values[i], *got[i].node(), hints_));
  for (size_t j = 0; j < carried.size(); ++j) add_slot(carried[j], got[values.size() + j].node());
  breaks.push_back(std::move(b));
}

}  // namespace kiln::jit
