#include "jit/compile/trace_session.h"

#include "jit/compile/call_site.h"

#include "jit/diag/diagnostics.h"
#include "runtime/exec/executor.h"

namespace kiln::jit {

TraceSession::TraceSession(uint64_t start_id, std::map<std::string, int64_t> hints)
    : start_id_(start_id), hints_(std::move(hints)), rng_(detail::rng_state()) {}

TraceSession::~TraceSession() { stop(); }

void TraceSession::start() {
  prev_observer_ = detail::set_trace_observer(this);
  prev_oracle_ = set_shape_oracle(this);
  active_ = true;
}

void TraceSession::stop() {
  if (!active_) return;
  detail::set_trace_observer(prev_observer_);
  set_shape_oracle(prev_oracle_);
  active_ = false;
}

void TraceSession::add_placeholder(TensorImpl& impl, int i) {
  placeholder_[&impl] = i;
  add_slot(impl.node_, nullptr);
}

void TraceSession::add_slot(NodePtr traced, NodePtr real) {
  slot_set_.insert(traced.get());
  slots.push_back(std::move(traced));
  real_.push_back(std::move(real));
}

void TraceSession::enable_breaks(std::vector<std::string> symbols, std::vector<int64_t> syms,
                                 std::vector<NodePtr> real) {
  breaks_enabled_ = true;
  symbols_ = std::move(symbols);
  syms_ = std::move(syms);
  for (size_t i = 0; i < real.size(); ++i) real_[i] = std::move(real[i]);
}

void TraceSession::capture(const std::shared_ptr<TensorImpl>& owner) {
  TensorImpl& impl = *owner;
  Captured c;
  c.impl = owner;
  for (size_t k = 0; k < captured.size(); ++k)
    if (captured[k].impl->grad.get() == &impl) c.grad_of = static_cast<int>(k);
  c.node_before = impl.node_;
  c.grad_before = impl.grad;
  c.grad_fn_before = impl.grad_fn;
  c.requires_grad_before = impl.requires_grad;
  c.version_before = impl.version;
  cap_index_[&impl] = static_cast<int>(captured.size());
  // Work recorded before the trace is done now, so the trace starts from stored values.
  if (!impl.node_->materialized()) materialize({impl.node_});
  c.node = impl.node_;
  add_slot(c.node, c.node);
  captured.push_back(std::move(c));
}

void TraceSession::on_read(const std::shared_ptr<TensorImpl>& owner) {
  TensorImpl& impl = *owner;
  if (placeholder_.count(&impl) || cap_index_.count(&impl) || aliases_.count(&impl)) return;
  if (!impl.node_ || impl.node_->id >= start_id_) return;  // made during the trace
  for (const auto& c : captured)
    if (c.node == impl.node_) {
      // A handle made in the trace naming a captured value (autograd snapshots, detach()).
      aliases_.insert(&impl);
      return;
    }
  capture(owner);
}

void TraceSession::on_write(const std::shared_ptr<TensorImpl>& owner) {
  TensorImpl& impl = *owner;
  auto p = placeholder_.find(&impl);
  if (p != placeholder_.end()) {
    placeholder_written[p->second] = true;
    return;
  }
  on_read(owner);
  auto c = cap_index_.find(&impl);
  if (c != cap_index_.end())
    captured[c->second].written = true;
  else
    created_written.push_back(owner);
}

bool TraceSession::on_materialize(const std::vector<Node*>& order, const NodePtr* roots, size_t nroots) {
  bool traced = false;
  for (Node* n : order) traced |= n->id >= start_id_;
  if (!traced) return false;  // work recorded before the trace
  std::string last = op_name(order.back()->op);
  if (!breaks_enabled_)
    throw GraphBreak{
        "a value was needed while tracing (item(), data(), printing or a data-dependent size; last op: " + last + ")"};
  int64_t elems = 0;
  for (size_t r = 0; r < nroots; ++r)
    if (roots[r] && !roots[r]->materialized()) elems += numel(roots[r]->shape).evaluate(hints_);
  if (elems > kMaxBreakElements)
    throw GraphBreak{"a value of " + std::to_string(elems) + " elements was needed while tracing (printing, data() " +
                     "or to_vector() of a large tensor; last op: " + last + "); only values of at most " +
                     std::to_string(kMaxBreakElements) + " elements become value guards"};
  take_break(roots, nroots);
  return true;
}

void TraceSession::cannot_trace(const std::string& why) { throw GraphBreak{why}; }

void TraceSession::on_random(const Node& n) {
  rng_offsets[n.id] = rng_total;
  rng_total = rng_total + numel(n.shape);
}

void TraceSession::on_grad(TensorImpl& leaf, bool accumulate) {
  if (accumulate && !grad_touched_.count(&leaf)) grad_relied_.insert(&leaf);
  grad_touched_.insert(&leaf);
}

int64_t TraceSession::hint(const SymInt& e) { return e.evaluate(hints_); }

void TraceSession::assume(const SymInt& e, SymRel rel) {
  std::string key = e.str() + "#" + std::to_string(static_cast<int>(rel));
  if (!seen_.insert(key).second) return;
  std::string by = kiln_call_site();
  if (const char* op = detail::backward_op()) by += std::string(by.empty() ? "" : " in ") + "the backward of " + op;
  relations.push_back({e, rel, by});
  facts_.add(e, rel);
  if (log_enabled("recompiles"))
    log_line("recompiles",
             "trace relies on " + e.str() + " " + rel_str(rel) + " 0" + (by.empty() ? std::string() : " (" + by + ")") +
                 (rel == SymRel::Eq && e.symbols().size() == 1 && (e - SymInt::symbol(e.symbols()[0])).maybe_int()
                      ? ": a size is specialized"
                      : ""));
  if (log_enabled("symbols"))
    log_line("symbols", "fact " + e.str() + " " + rel_str(rel) + " 0; facts now:\n" + facts_.str());
}

size_t TraceSession::simplify_graph(const std::vector<NodePtr>& roots) {
  if (facts_.empty()) return 0;
  size_t changed = 0;
  auto fix = [&](SymInt& v) {
    if (v.is_constant()) return;
    SymInt s = facts_.simplify(v);
    if (s.same_as(v)) return;
    if (log_enabled("symbols")) log_line("symbols", "  " + v.str() + " -> " + s.str());
    v = std::move(s);
    ++changed;
  };
  std::set<const Node*> seen;
  std::vector<Node*> stack;
  for (const auto& r : roots)
    if (r && seen.insert(r.get()).second) stack.push_back(r.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n->id < start_id_ || n->materialized()) continue;  // made before the trace, or a constant of it
    for_each_size(*n, fix);
    for (const auto& in : n->inputs)
      if (seen.insert(in.get()).second) stack.push_back(in.get());
  }
  for (auto& [id, off] : rng_offsets) fix(off);
  fix(rng_total);
  return changed;
}

void TraceSession::restore() {
  for (auto it = captured.rbegin(); it != captured.rend(); ++it) {
    TensorImpl& impl = *it->impl;
    impl.node_ = it->node_before;
    impl.grad = it->grad_before;
    impl.grad_fn = it->grad_fn_before;
    impl.requires_grad = it->requires_grad_before;
    impl.version = it->version_before;
  }
  detail::set_rng_state(rng_);
}

}  // namespace kiln::jit
