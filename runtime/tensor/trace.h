// Hooks through which kiln::compile (jit/) observes a trace. runtime/ calls them; it never
// knows who listens. With no trace active on the thread every hook is one branch.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/ir/node.h"

namespace kiln {
struct TensorImpl;
}

namespace kiln::detail {

// What a trace sees of the world outside its inputs.
class TraceObserver {
 public:
  virtual ~TraceObserver() = default;
  // A tensor's node is about to be used (every op input, every in-place target).
  virtual void on_read(const std::shared_ptr<TensorImpl>& impl) = 0;
  // An in-place op is about to rebind `impl` (the owner: the base for views).
  virtual void on_write(const std::shared_ptr<TensorImpl>& impl) = 0;
  // A leaf's .grad() is about to change: set (set_grad, zero_grad) or accumulated into
  // (backward), which also reads whether it was defined.
  virtual void on_grad(TensorImpl& leaf, bool accumulate) = 0;
  // Data is needed now (item(), data(), printing): `order` is the pending subgraph of the
  // `nroots` nodes asked for. Returns true when the observer computed those nodes itself
  // (materialization then stops there); false lets it run as usual.
  virtual bool on_materialize(const std::vector<Node*>& order, const NodePtr* roots, size_t nroots) = 0;
  // A random op was recorded: it reserved numel(n.shape) numbers of the generator.
  virtual void on_random(const Node& n) = 0;
  // Whether random ops recorded now reserve numbers of the generator (false for graphs that never
  // run, such as pattern graphs: they leave the user's generator where it is).
  virtual bool draws() const { return true; }
  // Something fn does cannot be traced (a DTensor op): the trace stops and fn runs eagerly.
  // (Without an override: a kiln::Error saying `why`.)
  [[noreturn]] virtual void cannot_trace(const std::string& why);
};

// Graphs recorded apart from the user's program while alive on this thread (a pattern's search
// graph, the probe of a vjp rule): an observer that sees nothing and keeps the pending limit from
// computing them (they have no data: asking for it is a kiln::Error), no shape oracle, and random
// ops that draw nothing from the user's generator. The trace and oracle it found come back after.
class Untraced final : public TraceObserver {
 public:
  Untraced();
  ~Untraced() override;
  Untraced(const Untraced&) = delete;
  Untraced& operator=(const Untraced&) = delete;
  void on_read(const std::shared_ptr<TensorImpl>&) override {}
  void on_write(const std::shared_ptr<TensorImpl>&) override {}
  void on_grad(TensorImpl&, bool) override {}
  bool on_materialize(const std::vector<Node*>&, const NodePtr*, size_t) override;
  void on_random(const Node&) override {}
  bool draws() const override { return false; }

 private:
  TraceObserver* observer_;
  ShapeOracle* oracle_;
};

// The observer of the trace running on this thread, or null (inline: read on every op).
extern thread_local TraceObserver* t_trace_observer __attribute__((tls_model("initial-exec")));
inline TraceObserver* trace_observer() { return t_trace_observer; }
// Installs `o` for this thread (null: none); returns the previous one.
TraceObserver* set_trace_observer(TraceObserver* o);
// The backward node the autograd engine is applying on this thread ("mul"), or null: names
// the op whose gradient relied on a size in compile()'s diagnostics.
const char* backward_op();

// The Philox generator's (seed, counter).
std::pair<uint64_t, uint64_t> rng_state();
void set_rng_state(std::pair<uint64_t, uint64_t> s);
// Reserves `n` numbers from the generator: the (seed, counter) a new random op of n elements gets.
std::pair<uint64_t, uint64_t> rng_reserve(uint64_t n);

// The generator positions random ops recorded on this thread are given while alive (nested
// records each see them), in order: kiln::checkpoint's forward keeps them, drawn from the
// process's generator as without checkpoint.
class RngRecord {
 public:
  struct Draw {
    uint64_t seed, counter, n;
  };
  using Draws = std::vector<Draw>;
  RngRecord();
  ~RngRecord();
  RngRecord(const RngRecord&) = delete;
  RngRecord& operator=(const RngRecord&) = delete;
  const Draws& draws() const { return draws_; }

 private:
  friend std::pair<uint64_t, uint64_t> rng_reserve(uint64_t n);
  Draws draws_;
  RngRecord* outer_;
};

// While alive, random ops recorded on this thread get the positions of `draws` in order, not the
// process's generator's (which other threads draw from meanwhile, undisturbed): checkpoint's
// recomputation draws exactly the forward's numbers. A draw beyond them, or of another size, is a
// kiln::Error (fn must compute the same function both times).
class RngReplay {
 public:
  explicit RngReplay(const RngRecord::Draws& draws);
  ~RngReplay();
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;
  std::pair<uint64_t, uint64_t> next(uint64_t n);

 private:
  const RngRecord::Draws& draws_;
  size_t at_ = 0;
  RngReplay* outer_;
};

}  // namespace kiln::detail
