// TraceSession: what compile() learns while fn runs on placeholder inputs — the tensors it
// captures from outside, the ones it writes, and the size facts it relies on.
#pragma once
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "guards/guard_set.h"
#include "jit/compile/break_steps.h"
#include "runtime/autograd/autograd.h"
#include "runtime/ir/sym_facts.h"
#include "runtime/tensor/trace.h"

namespace kiln::jit {

// Thrown out of fn when the trace cannot go on (a large value needed while tracing, an
// unsupported combination); fn then runs eagerly.
struct GraphBreak {
  std::string reason;
};

// A data-dependent step the trace went through: the segment computing the values fn read, and
// those values on the traced call.
struct TracedBreak {
  std::unique_ptr<BreakStep> step;
  std::vector<uint8_t> bytes;
  size_t captured_before = 0;  // captured tensors read before the break
  size_t relations_before = 0;  // size relations relied on before it
};

class TraceSession final : public detail::TraceObserver, public ShapeOracle {
 public:
  // A tensor fn read from outside, with its state before the trace (restored afterwards).
  struct Captured {
    std::shared_ptr<TensorImpl> impl;
    int grad_of = -1;  // index of the captured parameter whose .grad() this is
    NodePtr node;  // its (materialized) node as the trace read it
    NodePtr node_before;
    std::shared_ptr<TensorImpl> grad_before;
    std::shared_ptr<GradNode> grad_fn_before;
    bool requires_grad_before = false;
    uint64_t version_before = 0;
    bool written = false;
  };

  TraceSession(uint64_t start_id, std::map<std::string, int64_t> hints);
  ~TraceSession() override;
  // Makes this session observe the current thread (until stop() or destruction).
  void start();
  void stop();

  // Placeholders stand for arguments; `i` is the flat argument index.
  void add_placeholder(TensorImpl& impl, int i);
  // Lets small data-dependent steps become graph breaks kept compiled (else they throw
  // GraphBreak): the symbols' traced values are `syms`, and `real` holds the call's tensor
  // arguments (materialized), one per placeholder.
  void enable_breaks(std::vector<std::string> symbols, std::vector<int64_t> syms, std::vector<NodePtr> real);
  // Puts every captured tensor back as it was before the trace.
  void restore();

  void on_read(const std::shared_ptr<TensorImpl>& impl) override;
  void on_write(const std::shared_ptr<TensorImpl>& impl) override;
  bool on_materialize(const std::vector<Node*>& order, const NodePtr* roots, size_t nroots) override;
  void on_random(const Node& n) override;
  [[noreturn]] void cannot_trace(const std::string& why) override;
  void on_grad(TensorImpl& leaf, bool accumulate) override;
  // Whether the trace relied on `impl`'s .grad() being defined or not (a backward accumulated
  // into it before fn set it).
  bool relied_on_grad(const TensorImpl* impl) const { return grad_relied_.count(impl) > 0; }
  int64_t hint(const SymInt& e) override;
  void assume(const SymInt& e, SymRel rel) override;
  const SymFacts* facts() const override { return &facts_; }
  // A fact the guards establish outside the trace (a symbol's lower bound): later
  // decisions use it; it is not added to `relations` (the caller guards it).
  void know(const SymInt& e, SymRel rel) { facts_.add(e, rel); }
  // Rewrites the size expressions of every node the trace made behind `roots` (shapes, strides,
  // offsets, size attributes; not materialized nodes) with the facts; returns how many changed.
  size_t simplify_graph(const std::vector<NodePtr>& roots);

  std::vector<Captured> captured;
  std::vector<guards::SizeRelation> relations;
  std::map<int, bool> placeholder_written;  // flat argument -> written in place
  std::vector<std::weak_ptr<TensorImpl>> created_written;  // tensors made in the trace, then written
  // Program inputs in the order the trace met them: placeholders, captured tensors, and the
  // values each break carries to later segments.
  std::vector<NodePtr> slots;
  std::vector<TracedBreak> breaks;
  // Per random node id: its first number's offset from the generator state at the call's start.
  std::map<uint64_t, SymInt> rng_offsets;
  SymInt rng_total;  // numbers all random ops of the trace reserve

 private:
  void capture(const std::shared_ptr<TensorImpl>& owner);
  void add_slot(NodePtr traced, NodePtr real);
  // Computes the unmaterialized `roots` on the call's inputs and records the break.
  void take_break(const NodePtr* roots, size_t nroots);
  uint64_t start_id_;
  std::map<std::string, int64_t> hints_;
  SymFacts facts_;
  std::set<std::string> seen_;
  std::unordered_map<const TensorImpl*, int> cap_index_, placeholder_;
  std::set<const TensorImpl*> aliases_, grad_touched_, grad_relied_;
  bool active_ = false;
  detail::TraceObserver* prev_observer_ = nullptr;
  ShapeOracle* prev_oracle_ = nullptr;
  std::pair<uint64_t, uint64_t> rng_;
  // Graph breaks: on/off, symbol values, per slot the call's value, nodes that are slots, and
  // random nodes a break computed (they must not be drawn again).
  bool breaks_enabled_ = false;
  std::vector<std::string> symbols_;
  std::vector<int64_t> syms_;
  std::vector<NodePtr> real_;
  std::set<const Node*> slot_set_;
  std::set<uint64_t> random_done_;
};

}  // namespace kiln::jit
