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

// A generator of this thread's own while alive, starting at `start`: random ops recorded on this
// thread draw from it (and rng_state / set_rng_state read and move it); the process's generator
// is neither read nor moved, so other threads drawing meanwhile are undisturbed. Nests.
// (kiln::checkpoint's recomputation draws the forward's numbers again this way.)
class ThreadGenerator {
 public:
  explicit ThreadGenerator(std::pair<uint64_t, uint64_t> start);
  ~ThreadGenerator();
  ThreadGenerator(const ThreadGenerator&) = delete;
  ThreadGenerator& operator=(const ThreadGenerator&) = delete;

 private:
  std::pair<uint64_t, uint64_t> state_;
  std::pair<uint64_t, uint64_t>* outer_;
};

}  // namespace kiln::detail
