// compile(): the cache of guarded entries, the trace on a miss, and the replay on a hit.
#include "jit/compile/compile.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>

#include "guards/guard_set.h"
#include "runtime/ops/ops.h"
#include "jit/diag/diagnostics.h"
#include "jit/exec/code_cache.h"
#include "jit/compile/break_steps.h"
#include "jit/compile/partition.h"
#include "jit/patterns/pattern_matcher.h"
#include "jit/compile/program.h"
#include "jit/compile/trace_session.h"
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/forward_ad.h"
#include "runtime/exec/executor.h"
#include "runtime/exec/memory_ledger.h"
#include "runtime/ops/attention_policy.h"
#include "runtime/ops/autocast_policy.h"
#include "runtime/tensor/record.h"

namespace kiln::detail {
namespace {

using jit::ms_since;
using jit::Program;
using jit::TraceSession;

int64_t node_bytes(const Node& n, const std::map<std::string, int64_t>& hints) {
  return numel(n.shape).evaluate(hints) * static_cast<int64_t>(itemsize(n.dtype));
}

// The backward of a compiled function: runs the compiled backward program on the values the
// forward saved and the gradients of its differentiable results. With several such results the
// engine hands it their gradients packed into one flat vector (see PackGrad).
struct CompiledGrad final : GradNode {
  std::shared_ptr<Program> bwd;
  std::vector<int64_t> syms;
  std::vector<Tensor> saved;
  std::vector<int> slot;  // per `next` edge: index into the program's outputs, or -1 (unused input)
  std::vector<DType> out_dtypes;  // per differentiable result
  std::vector<std::vector<int64_t>> out_shapes;  // ... its sizes (several results: packed layout)
  std::vector<int64_t> offsets;  // ... its offset in the packed gradient
  bool released_ = false;
  std::string fn_name;

  std::vector<Tensor> apply(const Tensor& g, bool create_graph) override {
    KILN_CHECK(!create_graph, "compile(", fn_name, "): double backward (create_graph=true) through a compiled ",
               "function is not supported; call the function uncompiled for higher-order gradients");
    KILN_CHECK(!released_, "compile(", fn_name, "): trying to backward through the compiled graph a second time; ",
               "pass retain_graph=true the first time");
    std::vector<NodePtr> roots;
    for (const auto& s : saved) roots.push_back(s.node());
    if (out_dtypes.size() == 1) {
      roots.push_back(detail::cast(g, out_dtypes[0]).contiguous().node());
    } else {
      for (size_t i = 0; i < out_dtypes.size(); ++i) {
        int64_t n = 1;
        for (int64_t d : out_shapes[i]) n *= d;
        Tensor part = g.narrow(0, offsets[i], n).reshape(out_shapes[i]);
        roots.push_back(detail::cast(part, out_dtypes[i]).contiguous().node());
      }
    }
    materialize(roots);
    std::vector<Node*> ins;
    for (const auto& r : roots) ins.push_back(r.get());
    std::vector<Tensor> outs = bwd->run(ins, syms);
    std::vector<Tensor> grads(slot.size());
    for (size_t i = 0; i < slot.size(); ++i)
      if (slot[i] >= 0) grads[i] = outs[slot[i]];
    return grads;
  }
  void release() override {
    saved.clear();
    released_ = true;
  }
  const char* name() const override { return "CompiledFunctionBackward"; }
  bool released() const override { return released_; }
};

// The gradient of one of several differentiable results of a compiled function, placed at the
// result's offset in a zero flat vector: the engine sums what meets at the CompiledGrad, so it
// receives every result's gradient side by side (zeros for results the loss does not reach).
struct PackGrad final : GradNode {
  int64_t offset = 0, total = 0;
  DType dtype = DType::Float64;

  std::vector<Tensor> apply(const Tensor& g, bool) override {
    Tensor flat = detail::cast(g, dtype).contiguous().reshape({-1});
    int64_t n = flat.numel();
    return {kiln::pad(flat, {offset, total - offset - n})};
  }
  const char* name() const override { return "CompiledFunctionResultBackward"; }
};

}  // namespace

// How a traced call's final program lands: its results, side effects and backward.
struct Outcome {
  std::shared_ptr<Program> fwd;
  std::vector<Value> results;  // result template (tensors filled per call)
  std::vector<int64_t> out_spec;
  std::vector<int> result_tensor;  // per result value: fwd output index (-1 scalar)
  std::vector<int> cap_written;  // per fwd output after the results: captured index written
  std::vector<int> cap_grad;  // ... captured parameter whose .grad() is set
  std::vector<int> arg_written;  // ... flat argument written in place
  std::vector<int> arg_grad;  // ... flat argument whose .grad() a backward in fn added to
  std::vector<int> cap_grad_cleared;  // captured parameters whose .grad() fn cleared
  std::vector<int> grads_let_go;  // of cap_grad: those no captured input reads (.grad() of the same)
  // Autograd (outputs that need grad, backward run later by the caller).
  std::shared_ptr<Program> bwd;
  std::vector<int> diff_results;  // result values that carry the CompiledGrad
  size_t saved_begin = 0, saved_count = 0;
  std::vector<int> diff_args, diff_caps;  // differentiable inputs, in `next` order
  std::vector<int> grad_slot;  // per differentiable input: bwd output or -1
  std::vector<DType> diff_dtypes;  // ... and their dtypes
  SymInt rng_total;  // (entries with breaks) numbers the call's random ops reserve
};

namespace {

// One compiled entry: its guards, and its program or (with graph breaks) its tree of segments.
struct Entry {
  guards::GuardSet guards;
  Outcome out;  // the program (no breaks)
  std::unique_ptr<jit::BreakStep> breaks;  // the first graph break: its continuations end in Outcomes
};

// Where a call finds a captured tensor: its current node, or its .grad()'s.
TensorImpl* captured_source(const guards::CapturedTensor& c) {
  auto impl = c.impl.lock();
  return c.grad_of ? impl->grad.get() : impl.get();
}

// Lets go, before a call runs, of the gradients it will set without reading them
// (Outcome::grads_let_go). Their memory may be a CUDA graph's output, and a graph replays only when
// nobody else holds its outputs: a training step holding last step's gradients in `.grad` made two
// graphs, and two memory pools, take turns.
void release_overwritten_grads(const Outcome& out, const std::vector<guards::CapturedTensor>& captured) {
  for (int k : out.grads_let_go)
    if (auto impl = captured[static_cast<size_t>(k)].impl.lock()) impl->grad = nullptr;
}

// The trace's stand-ins for the tensor arguments: leaves without storage, sizes constant or
// symbolic.
struct Placeholders {
  std::map<std::string, int64_t> hints;  // each symbol's size on the traced call
  std::vector<Value> trace_args;  // fn's arguments in the trace
  std::vector<NodePtr> nodes;
  std::vector<Tensor> tensors;
  std::vector<int> arg;  // per placeholder: its flat argument index
  uint64_t start_id = 0;  // the first node the trace made
};

// What the phases of a trace hand one another.
struct TraceState {
  const std::vector<Value>& args;
  Entry& e;
  Placeholders& ph;
  jit::TraceSession& ts;
  std::vector<Value> results;
  std::vector<NodePtr> outputs;  // fwd program outputs
  std::vector<std::pair<size_t, size_t>> write_back;  // (output, input slot) of captured state written in place
  std::vector<NodePtr> tangents, grads;
  std::vector<Tensor> diff_inputs;
  std::vector<guards::CapturedTensor> cgs;  // every captured tensor's guard, in the order the trace read them
  std::string tag;  // names the entry in dump files
};

// What fn's run leaves to the later phases inside the session (kept until the session stops).
struct FnRun {
  std::vector<Value> out;  // what fn returned
  std::vector<Tensor> result_tensors;  // its tensor results
  bool grads_set = false;  // a backward in fn set gradients
};

// A guard on a tensor as `n` lays it out: dtype, device, constant sizes (no symbols), strides
// where the layout is not contiguous.
guards::TensorGuard tensor_guard(const Node& n, bool requires_grad) {
  guards::TensorGuard g;
  g.dtype = n.dtype;
  g.device = n.device;
  g.requires_grad = requires_grad;
  g.sizes = concrete(n.shape);
  g.symbols.assign(g.sizes.size(), -1);
  g.contiguous = is_contiguous_layout(n.shape, n.strides);
  if (!g.contiguous) g.strides = concrete(n.strides);
  return g;
}

}  // namespace

class CompiledCore {
 public:
  explicit CompiledCore(CompileOptions o) : opt_(std::move(o)) {
    KILN_CHECK(opt_.cuda_graph_limit >= 1, "compile(", opt_.name, "): cuda_graph_limit must be at least 1, got ",
               opt_.cuda_graph_limit);
    graph_counters_->limit = opt_.cuda_graph_limit;
  }

  std::vector<Value> call(const std::vector<Value>& args, const std::vector<int64_t>& spec, const TraceFn& fn,
                          std::vector<int64_t>& out_spec) {
    if (trace_observer()) return run_eager(args, fn, out_spec, false);  // inside another trace: inline
    if (const char* why = untraceable_argument(args)) [[unlikely]]
      return run_untraceable_eagerly(why, args, fn, out_spec);
    std::vector<int64_t> syms;
    // Fast path: the entry that served the last hit (entries are immutable and never freed;
    // continuations after breaks are only ever added).
    if (Entry* last = last_hit_.load(std::memory_order_acquire);
        last && last->guards.check(args, spec, syms, nullptr)) {
      if (!last->breaks) {
        hits_.fetch_add(1, std::memory_order_relaxed);
        return replay(*last, args, syms, out_spec);
      }
      std::vector<Value> out;
      if (replay_path(*last, args, syms, out, out_spec, nullptr)) {
        hits_.fetch_add(1, std::memory_order_relaxed);
        return out;
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (eager_) return fall_back_to_eager(lock, args, fn, out_spec);
    std::string first_why;
    Entry* missed = nullptr;  // input guards passed, but no continuation was traced for the break values
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
      std::string* why = it == entries_.rbegin() ? &first_why : nullptr;
      if (!(*it)->guards.check(args, spec, syms, why)) continue;
      Entry& e = **it;
      last_hit_.store(&e, std::memory_order_release);
      lock.unlock();
      if (!e.breaks) {
        hits_.fetch_add(1, std::memory_order_relaxed);
        return replay(e, args, syms, out_spec);
      }
      std::vector<Value> out;
      if (replay_path(e, args, syms, out, out_spec, &first_why)) {
        hits_.fetch_add(1, std::memory_order_relaxed);
        return out;
      }
      lock.lock();
      missed = &e;
      break;
    }
    stats_.misses++;
    if (missed) stats_.value_misses++;
    if (!entries_.empty()) {
      stats_.last_miss = first_why;
      if (jit::log_enabled("recompiles"))
        jit::log_line("recompiles", "compile(" + opt_.name + "): recompiling (compile " +
                                        std::to_string(stats_.entries + 1) + "): " + first_why);
      warn_size_specialized(first_why);
    }
    if (stats_.entries >= opt_.recompile_limit) {
      eager_ = true;
      std::fprintf(stderr,
                   "[kiln] warning: compile(%s) reached its recompile limit (%d compiles; last miss: %s); "
                   "running it in lazy eager mode from now on\n",
                   opt_.name.c_str(), opt_.recompile_limit, first_why.c_str());
      return fall_back_to_eager(lock, args, fn, out_spec);
    }
    auto t0 = std::chrono::steady_clock::now();
    const bool timed = jit::log_enabled("recompiles");
    const jit::CacheStats cache0 = timed ? jit::cache_stats() : jit::CacheStats{};
    double trace_ms = 0;
    std::unique_ptr<Entry> fresh;
    try {
      fresh = trace(args, spec, fn);
      trace_ms = ms_since(t0);
    } catch (const jit::GraphBreak& b) {
      eager_ = true;
      std::fprintf(stderr, "[kiln] warning: compile(%s) cannot compile fn: %s; it runs in lazy eager mode\n",
                   opt_.name.c_str(), b.reason.c_str());
      return fall_back_to_eager(lock, args, fn, out_spec);
    }
    // A new continuation of the missed entry, or a new entry.
    Entry* e = missed && merge(*missed, *fresh, syms) ? missed : fresh.get();
    if (e == fresh.get() && jit::log_enabled("guards")) {
      const guards::GuardSet& G = e->guards;
      std::string text = G.str();
      if (e->breaks) text += path_str(*e->breaks, *e->breaks->head.load(), 0, G.symbol_names, G.captured.size());
      jit::log_line("guards", "compile(" + opt_.name + ") entry " + opt_.name + "_" + std::to_string(entries_.size()) +
                                  ":\n" + text);
    }
    std::string why;
    if (!e->guards.check(args, spec, syms, &why))
      throw Error("compile(" + opt_.name + "): internal error: a fresh entry rejects the call it was traced for (" +
                  why + ")");
    std::vector<Value> out;
    bool served = true;
    if (!e->breaks)
      out = replay(*e, args, syms, out_spec);
    else
      served = replay_path(*e, args, syms, out, out_spec, &why);
    const double total_ms = ms_since(t0);
    stats_.compile_ms += total_ms;
    stats_.entries++;
    if (timed) {
      const jit::CacheStats c = jit::cache_stats();
      jit::log_line("recompiles", "compile(" + opt_.name + "): compile " + std::to_string(stats_.entries) + " took " +
                                      std::to_string(total_ms) + " ms: tracing and partitioning " +
                                      std::to_string(trace_ms) + " ms, the first run " +
                                      std::to_string(total_ms - trace_ms) +
                                      " ms (kernels: " + std::to_string(c.disk_hits - cache0.disk_hits) +
                                      " loaded from disk in " + std::to_string(c.load_ms - cache0.load_ms) + " ms, " +
                                      std::to_string(c.compiles - cache0.compiles) + " compiled in " +
                                      std::to_string(c.compile_ms - cache0.compile_ms) + " ms)");
    }
    last_hit_.store(e, std::memory_order_release);
    if (e == fresh.get()) entries_.push_back(std::move(fresh));
    if (!served) {
      // The break values differ between the trace and its replay (kernels that round differently).
      return fall_back_to_eager(lock, args, fn, out_spec);
    }
    return out;
  }

  CompileStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    CompileStats s = stats_;
    s.hits = hits_.load();
    s.graphs = graph_counters_->recorded;
    s.graph_updates = graph_counters_->updated;
    s.graph_replays = graph_counters_->replays;
    s.ungraphed_runs = graph_counters_->ungraphed;
    s.graph_bytes = graph_counters_->pool_bytes;
    s.graphs_kept = graph_counters_->kept;
    return s;
  }

  bool guards_pass(const std::vector<Value>& args, const std::vector<int64_t>& spec) {
    thread_local std::vector<int64_t> syms;
    if (Entry* last = last_hit_.load(std::memory_order_acquire); last && last->guards.check(args, spec, syms, nullptr))
      return true;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it)
      if ((*it)->guards.check(args, spec, syms, nullptr)) return true;
    return false;
  }

 private:
  std::vector<Value> run_eager(const std::vector<Value>& args, const TraceFn& fn, std::vector<int64_t>& out_spec,
                               bool) {
    std::vector<Value> out = fn(args);
    return split_results(out, out_spec);
  }

  // Arguments a trace cannot capture yet: DTensors (a node placed over a device mesh) and dual
  // tensors made outside fn (their tangents are not inputs of the traced program). Such a call
  // runs in lazy eager mode, said once per function and kind.
  static const char* untraceable_argument(const std::vector<Value>& args) {
    for (const Value& a : args) {
      const Tensor* t = as_tensor(a);
      if (!t || !t->defined()) continue;
      if (t->node()->placed) return "a DTensor (kiln::compile does not trace DTensor programs yet)";
      if (detail::has_visible_tangent(*t))
        return "a dual tensor argument (a tangent made outside fn); tangents are traced when fn makes its "
               "duals itself (kiln::jvp, kiln::hvp ... inside fn)";
    }
    return nullptr;
  }
  std::vector<Value> run_untraceable_eagerly(const char* why, const std::vector<Value>& args, const TraceFn& fn,
                                             std::vector<int64_t>& out_spec) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.eager_calls++;
      if (untraceable_warned_.insert(why).second)
        std::fprintf(stderr, "[kiln] warning: compile(%s) got %s, so such calls run in lazy eager mode\n",
                     opt_.name.c_str(), why);
    }
    return run_eager(args, fn, out_spec, true);
  }

  // A call run in lazy eager mode, outside the lock (counted).
  // A recompile because Tensor::size(), sizes() or numel() made a size that had become symbolic
  // a constant again: every new size then compiles again. Said once per function on stderr
  // (without KILN_LOG), with the fix: LibTorch code ported to kiln writes x.size(0).
  void warn_size_specialized(const std::string& why) {
    const std::string by = ", specialized by ";
    const size_t at = why.find(by);
    if (size_warned_ || at == std::string::npos) return;
    // Only where fn itself read the size (the outermost kiln call): a size an op reads inside
    // kiln (view()'s numel()) is not the user's to change.
    const std::string caller = why.substr(at + by.size());
    bool by_size_read = false;
    for (const char* read : {"Tensor.size()", "Tensor.sizes()", "Tensor.numel()"})
      by_size_read = by_size_read || caller.rfind(read, 0) == 0;
    if (!by_size_read) return;
    size_warned_ = true;
    std::fprintf(stderr,
                 "[kiln] warning: compile(%s) recompiles for a new size (%s): Tensor::size(), sizes() and numel() "
                 "turn a symbolic size into a constant, so each new size compiles again; use sym_size(d) or "
                 "sym_sizes() (or -1 in reshape) to keep it symbolic. Not said again for %s.\n",
                 opt_.name.c_str(), why.c_str(), opt_.name.c_str());
  }

  std::vector<Value> fall_back_to_eager(std::unique_lock<std::mutex>& lock, const std::vector<Value>& args,
                                        const TraceFn& fn, std::vector<int64_t>& out_spec) {
    stats_.eager_calls++;
    lock.unlock();
    return run_eager(args, fn, out_spec, true);
  }

  static std::vector<Value> split_results(const std::vector<Value>& out, std::vector<int64_t>& out_spec) {
    size_t k = static_cast<size_t>(std::get<int64_t>(out[0]));
    out_spec.clear();
    for (size_t i = 0; i < k; ++i) out_spec.push_back(std::get<int64_t>(out[1 + i]));
    return {out.begin() + 1 + static_cast<long>(k), out.end()};
  }

  // Every (argument, dim) of a mark option names a dim of a tensor argument (else kiln::Error).
  void check_marks(const std::vector<std::pair<int, int>>& marks, const char* what, const std::vector<Value>& args) {
    for (auto [arg, dim] : marks) {
      KILN_CHECK(arg >= 0 && static_cast<size_t>(arg) < args.size(), "compile(", opt_.name, "): ", what,
                 " names argument ", arg, ", but fn got ", args.size(), " flattened arguments");
      const Tensor* t = as_tensor(args[static_cast<size_t>(arg)]);
      KILN_CHECK(t, "compile(", opt_.name, "): ", what, " names argument ", arg, " (dim ", dim,
                 "), which is not a tensor");
      KILN_CHECK(dim >= 0 && dim < t->dim(), "compile(", opt_.name, "): ", what, " names dim ", dim, " of argument ",
                 arg, ", a tensor of rank ", t->dim(), " (expected 0 <= dim < ", t->dim(), ")");
    }
  }

  // Which dims become symbols on this trace (automatic dynamic shapes).
  std::set<std::pair<int, int>> dynamic_dims(const std::vector<Value>& args) {
    check_marks(opt_.mark_dynamic, "mark_dynamic", args);
    check_marks(opt_.mark_static, "mark_static", args);
    std::set<std::pair<int, int>> dyn;
    std::set<std::pair<int, int>> fixed(opt_.mark_static.begin(), opt_.mark_static.end());
    for (size_t i = 0; i < args.size(); ++i) {
      const Tensor* t = as_tensor(args[i]);
      if (!t) continue;
      std::vector<int64_t> sz = t->sizes();
      auto seen = seen_sizes_.find(static_cast<int>(i));
      for (size_t d = 0; d < sz.size(); ++d) {
        std::pair<int, int> key{static_cast<int>(i), static_cast<int>(d)};
        if (fixed.count(key)) continue;
        bool changed = seen != seen_sizes_.end() && seen->second.size() == sz.size() && seen->second[d] != sz[d];
        if (changed) changed_.insert(key);
        if (opt_.dynamic == CompileOptions::Dynamic::Always || changed_.count(key) ||
            (opt_.dynamic != CompileOptions::Dynamic::Never &&
             std::find(opt_.mark_dynamic.begin(), opt_.mark_dynamic.end(), key) != opt_.mark_dynamic.end()))
          if (opt_.dynamic != CompileOptions::Dynamic::Never) dyn.insert(key);
      }
      if (seen == seen_sizes_.end()) seen_sizes_[static_cast<int>(i)] = sz;
    }
    return dyn;
  }

  // Traces fn on placeholders for `args` into a fresh entry: the phases below, in order.
  std::unique_ptr<Entry> trace(const std::vector<Value>& args, const std::vector<int64_t>& spec, const TraceFn& fn);
  // Placeholders for the tensor arguments; fills the guard set's argument guards and symbols.
  Placeholders make_placeholders(const std::vector<Value>& args, guards::GuardSet& G);
  // The session's symbol bounds, placeholders and graph breaks (on this call's arguments).
  static void prepare_session(TraceState& st);
  // Runs fn, differentiates and rewrites the joint graph inside the trace session, which is
  // stopped and restored however this ends.
  void trace_in_session(TraceState& st, const TraceFn& fn);
  // fn on the placeholders: its results, side effects, and tensors it must not keep.
  void run_fn(TraceState& st, const TraceFn& fn, FnRun& run);
  // In-place writes and gradients fn left on captured tensors and arguments: program outputs.
  static void collect_side_effects(TraceState& st, FnRun& run);
  // The joint graph: tangents for the results that need grad, and their gradients.
  static void differentiate(TraceState& st, const FnRun& run);
  // Size expressions simplified with the facts the guards establish.
  void simplify_sizes(TraceState& st);
  // Guards on the tensors fn read from outside; the entry keeps those before the first break.
  static void guard_captured(TraceState& st);
  // The forward program (and the backward), CUDA graphs, dumps, logs.
  void partition_and_build(TraceState& st);
  // The min-cut between forward and backward, and the backward program.
  void partition_backward(TraceState& st, std::set<const Node*>& highlight);
  // Graph breaks: a chain of segments, each continuation guarded by the values read at its break.
  static void chain_breaks(TraceState& st);
  // Runs an entry without breaks.
  std::vector<Value> replay(Entry& e, const std::vector<Value>& args, const std::vector<int64_t>& syms,
                            std::vector<int64_t>& out_spec);
  // Lands a final program's outputs: results, side effects, the backward node. `captured(k)`
  // is the call's captured tensor k.
  template <class Captured>
  std::vector<Value> land(const Outcome& e, std::vector<Tensor>& outs, const std::vector<Value>& args,
                          const std::vector<int64_t>& syms, const Captured& captured, std::vector<int64_t>& out_spec);
  // Runs an entry with graph breaks: each break's segment, the continuation its values pick,
  // then the final segment; nothing lands (and the generator does not advance) before every
  // value guard passed. False when no continuation was traced for these values (`why` says).
  bool replay_path(Entry& e, const std::vector<Value>& args, std::vector<int64_t>& syms, std::vector<Value>& results,
                   std::vector<int64_t>& out_spec, std::string* why);
  // Hangs the continuation `fresh` was traced for into `into` (same guards, same path up to
  // the break values that were new); false (keep `fresh` as an entry of its own) otherwise.
  bool merge(Entry& into, Entry& fresh, const std::vector<int64_t>& syms);
  // A continuation's value guards and later guards in words, from `b` on (KILN_LOG=guards).
  static std::string path_str(const jit::BreakStep& step, const jit::Branch& b, int depth,
                              const std::vector<std::string>& names, size_t ncap);

  CompileOptions opt_;
  mutable std::mutex mu_;
  std::atomic<Entry*> last_hit_{nullptr};
  std::atomic<int64_t> hits_{0};
  std::shared_ptr<jit::GraphCounters> graph_counters_ = std::make_shared<jit::GraphCounters>();
  std::vector<std::unique_ptr<Entry>> entries_;
  CompileStats stats_;
  bool eager_ = false;
  bool size_warned_ = false;  // warn_size_specialized has spoken
  std::set<const char*> untraceable_warned_;  // what run_untraceable_eagerly has spoken of
  std::map<int, std::vector<int64_t>> seen_sizes_;
  std::set<std::pair<int, int>> changed_;
};

std::unique_ptr<Entry> CompiledCore::trace(const std::vector<Value>& args, const std::vector<int64_t>& spec,
                                           const TraceFn& fn) {
  auto e = std::make_unique<Entry>();
  e->guards.spec = spec;
  e->guards.grad_mode = grad_enabled();
  e->guards.autocast = detail::autocast_key();
  e->guards.sdpa_backend = detail::sdpa_backend_key();
  Placeholders ph = make_placeholders(args, e->guards);
  TraceSession ts(ph.start_id, ph.hints);
  TraceState st{args, *e, ph, ts};
  prepare_session(st);
  trace_in_session(st, fn);
  simplify_sizes(st);
  guard_captured(st);
  partition_and_build(st);
  chain_breaks(st);
  return e;
}

Placeholders CompiledCore::make_placeholders(const std::vector<Value>& args, guards::GuardSet& G) {
  std::set<std::pair<int, int>> dyn = dynamic_dims(args);
  Placeholders ph;
  for (size_t i = 0; i < args.size(); ++i) {
    G.kinds.push_back(value_kind(args[i]));
    const Tensor* t = as_tensor(args[i]);
    G.scalars.push_back(t ? Value(int64_t{0}) : args[i]);  // tensors are guarded by G.tensors
    if (!t) {
      G.tensor_slot.push_back(-1);
      ph.trace_args.push_back(args[i]);
      continue;
    }
    KILN_CHECK(t->defined(), "compile(", opt_.name, "): argument ", i, " is an undefined tensor");
    const Node& n = *t->node();
    guards::TensorGuard g = tensor_guard(n, t->requires_grad());
    Shape shape = n.shape;
    if (g.contiguous) {
      for (size_t d = 0; d < g.sizes.size(); ++d) {
        std::pair<int, int> key{static_cast<int>(i), static_cast<int>(d)};
        // A dim whose size changed between calls is symbolic at any size, 0 and 1 included (a
        // batch of one between bigger ones): the trace then guards only what it asks about it.
        int64_t lo = changed_.count(key) ? 0 : 2;
        if (dyn.count(key) && g.sizes[d] >= lo) {
          int s = static_cast<int>(G.symbol_names.size());
          std::string name = "s" + std::to_string(s);
          G.symbol_names.push_back(name);
          g.symbols[d] = s;
          shape[d] = SymInt::symbol(name);
          ph.hints[name] = g.sizes[d];
          // A symbol stands for sizes >= lo: 0 for a dim that changed, 2 for one made dynamic
          // up front (Dynamic::Always, mark_dynamic), whose 0 and 1 stay specialized.
          G.relations.push_back({shape[d] - SymInt(lo), SymRel::Ge});
        }
      }
    }
    // (contiguous: row-major strides over the possibly symbolic sizes; else the argument's own)
    NodePtr leaf = new_leaf(n.dtype, n.device, std::move(shape), g.contiguous ? Shape{} : n.strides);
    if (!ph.start_id) ph.start_id = leaf->id;
    G.tensor_slot.push_back(static_cast<int>(G.tensors.size()));
    G.tensors.push_back(g);
    Tensor pt = Tensor::from_node(leaf);
    if (g.requires_grad) pt.requires_grad_(true);
    ph.nodes.push_back(leaf);
    ph.tensors.push_back(pt);
    ph.arg.push_back(static_cast<int>(i));
    ph.trace_args.emplace_back(pt);
  }
  if (!ph.start_id) ph.start_id = new_node()->id;
  return ph;
}

void CompiledCore::prepare_session(TraceState& st) {
  const guards::GuardSet& G = st.e.guards;
  Placeholders& ph = st.ph;
  for (const auto& r : G.relations) st.ts.know(r.expr, r.rel);  // each symbol's lower bound
  for (size_t k = 0; k < ph.nodes.size(); ++k) st.ts.add_placeholder(*ph.tensors[k].impl(), ph.arg[k]);
  // Small values fn reads mid-trace are computed on this call's arguments (graph breaks).
  std::vector<NodePtr> real;
  for (int i : ph.arg) real.push_back(as_tensor(st.args[i])->node());
  materialize(real);
  std::vector<int64_t> hint_syms;
  for (const auto& name : G.symbol_names) hint_syms.push_back(ph.hints.at(name));
  st.ts.enable_breaks(G.symbol_names, hint_syms, real);
}

void CompiledCore::trace_in_session(TraceState& st, const TraceFn& fn) {
  TraceSession& ts = st.ts;
  ts.start();
  struct Undo {
    TraceSession& ts;
    bool done = false;
    ~Undo() {
      if (!done) {
        ts.stop();
        ts.restore();
      }
    }
  } undo{ts};
  FnRun run;  // (its tensors live on until the session has stopped, as fn's results would)
  run_fn(st, fn, run);
  differentiate(st, run);
  // Registered rewrites (kiln::patterns) on the joint graph, before it is partitioned (inside
  // the trace: sizes the replacements rely on are guarded).
  stats_.pattern_matches =
      static_cast<int>(jit::apply_patterns({&st.outputs, &st.grads}, st.ph.start_id, "compile(" + opt_.name + ")"));
  undo.done = true;
  ts.stop();
  ts.restore();
}

void CompiledCore::run_fn(TraceState& st, const TraceFn& fn, FnRun& run) {
  run.out = fn(st.ph.trace_args);
  st.results = split_results(run.out, st.e.out.out_spec);
  // Results: tensors become program outputs; scalars are constants of the trace.
  for (auto& v : st.results) {
    if (auto* t = std::get_if<Tensor>(&v)) {
      KILN_CHECK(t->defined(), "compile(", opt_.name, "): fn returned an undefined tensor");
      st.e.out.result_tensor.push_back(static_cast<int>(st.outputs.size()));
      st.outputs.push_back(t->node());
      run.result_tensors.push_back(*t);
      v = Tensor();
    } else {
      st.e.out.result_tensor.push_back(-1);
    }
  }
  collect_side_effects(st, run);
  // A tensor fn created, wrote in place and kept (neither returned nor the base of a returned
  // view) would go stale on replay.
  for (auto& w : st.ts.created_written) {
    auto impl = w.lock();
    if (!impl) continue;
    bool returned = false;
    for (const auto& r : run.result_tensors) returned |= r.impl() == impl || r.impl()->base == impl;
    KILN_CHECK(returned, "compile(", opt_.name, "): fn keeps a tensor it created and then modified in place ",
               "(optimizer state created on the first step?); create such state before calling the compiled ",
               "function");
  }
}

void CompiledCore::collect_side_effects(TraceState& st, FnRun& run) {
  TraceSession& ts = st.ts;
  const Placeholders& ph = st.ph;
  // Side effects on captured tensors: in-place writes and gradients set by a backward in fn.
  for (size_t k = 0; k < ts.captured.size(); ++k) {
    auto& c = ts.captured[k];
    if (c.written) {
      st.e.out.cap_written.push_back(static_cast<int>(k));
      const auto slot = std::find(ts.slots.begin(), ts.slots.end(), c.node) - ts.slots.begin();
      if (slot < static_cast<long>(ts.slots.size()))
        st.write_back.push_back({st.outputs.size(), static_cast<size_t>(slot)});
      st.outputs.push_back(Tensor(c.impl).node());
    }
  }
  for (size_t k = 0; k < ts.captured.size(); ++k) {
    auto& c = ts.captured[k];
    if (c.impl->grad != c.grad_before) {
      if (!c.impl->grad) {
        st.e.out.cap_grad_cleared.push_back(static_cast<int>(k));
        continue;
      }
      st.e.out.cap_grad.push_back(static_cast<int>(k));
      st.outputs.push_back(c.impl->grad->node());
      run.grads_set = true;
      const bool read = std::any_of(ts.captured.begin(), ts.captured.end(),
                                    [&](const auto& r) { return r.grad_of == static_cast<int>(k); });
      if (!read) st.e.out.grads_let_go.push_back(static_cast<int>(k));
    }
  }
  for (auto& [i, w] : ts.placeholder_written) {
    if (!w) continue;
    size_t k = std::find(ph.arg.begin(), ph.arg.end(), i) - ph.arg.begin();
    st.e.out.arg_written.push_back(i);
    st.write_back.push_back({st.outputs.size(), k});  // (placeholder k is input slot k)
    st.outputs.push_back(ph.tensors[k].node());
  }
  // Gradients a backward in fn accumulated into arguments (placeholders start without one;
  // the call adds the argument's own earlier gradient, as AccumulateGrad does).
  for (size_t k = 0; k < ph.nodes.size(); ++k) {
    const auto& g = ph.tensors[k].impl()->grad;
    if (!g) continue;
    st.e.out.arg_grad.push_back(ph.arg[k]);
    st.outputs.push_back(g->node());
    run.grads_set = true;
  }
}

void CompiledCore::differentiate(TraceState& st, const FnRun& run) {
  const Placeholders& ph = st.ph;
  // Outputs that need grad with the backward left to the caller: trace the joint graph.
  std::vector<int> diff_results;
  size_t rt = 0;
  for (size_t r = 0; r < st.results.size(); ++r)
    if (st.e.out.result_tensor[r] >= 0) {
      // (a result whose graph a backward in fn already went through, as kiln::grad does without
      // retain_graph, has no backward left: as in eager mode)
      const auto& fn_of = run.result_tensors[rt].impl()->grad_fn;
      if (run.result_tensors[rt].requires_grad() && !run.grads_set && grad_enabled() && !(fn_of && fn_of->released()))
        diff_results.push_back(static_cast<int>(r));
      ++rt;
    }
  if (diff_results.empty()) return;
  std::vector<Tensor> diff_outs;
  for (int r : diff_results) {
    int ti = 0;
    for (int q = 0; q < r; ++q) ti += st.e.out.result_tensor[q] >= 0;
    diff_outs.push_back(run.result_tensors[ti]);
  }
  for (size_t k = 0; k < ph.nodes.size(); ++k)
    if (ph.tensors[k].requires_grad()) {
      st.e.out.diff_args.push_back(ph.arg[k]);
      st.diff_inputs.push_back(ph.tensors[k]);
    }
  for (size_t k = 0; k < st.ts.captured.size(); ++k) {
    auto& c = st.ts.captured[k];
    if (!c.requires_grad_before || c.grad_of >= 0) continue;
    if (c.grad_fn_before)
      throw jit::GraphBreak{"fn reads a tensor with gradient history from outside; pass it as an argument"};
    st.e.out.diff_caps.push_back(static_cast<int>(k));
    st.diff_inputs.push_back(Tensor(c.impl));
  }
  std::vector<Tensor> tangent_tensors;
  for (const Tensor& out_t : diff_outs) {
    NodePtr tan = new_leaf(out_t.dtype(), out_t.device(), out_t.shape());
    st.tangents.push_back(tan);
    tangent_tensors.push_back(Tensor::from_node(tan));
    st.e.out.diff_dtypes.push_back(out_t.dtype());
  }
  st.e.out.diff_results = diff_results;
  std::vector<Tensor> gs = kiln::grad(diff_outs, st.diff_inputs, tangent_tensors, false, false, true);
  for (const auto& g : gs) {
    st.e.out.grad_slot.push_back(g.defined() ? static_cast<int>(st.grads.size()) : -1);
    if (g.defined()) st.grads.push_back(g.node());
  }
}

void CompiledCore::simplify_sizes(TraceState& st) {
  // Program inputs: the placeholders, the captured tensors as the trace read them and the values
  // breaks carry, in the order the trace met them. Size expressions are simplified with the facts
  // the guards establish (break segments were simplified with the facts known at their break,
  // and keep their inputs' layouts).
  std::vector<NodePtr> roots = st.ts.slots;
  for (const auto* v : {&st.outputs, &st.grads, &st.tangents}) roots.insert(roots.end(), v->begin(), v->end());
  size_t changed = st.ts.simplify_graph(roots);
  if (jit::log_enabled("symbols"))
    jit::log_line("symbols", "compile(" + opt_.name + "): " + std::to_string(changed) +
                                 " size expressions simplified with the facts:\n" + st.ts.facts()->str());
}

void CompiledCore::guard_captured(TraceState& st) {
  TraceSession& ts = st.ts;
  guards::GuardSet& G = st.e.guards;
  for (auto& c : ts.captured) {
    guards::CapturedTensor cg;
    cg.grad_of = c.grad_of >= 0;
    cg.impl = c.grad_of >= 0 ? ts.captured[c.grad_of].impl : c.impl;
    cg.guard = tensor_guard(*c.node, c.requires_grad_before);
    cg.watch_grad = c.grad_of < 0 && ts.relied_on_grad(c.impl.get());
    cg.has_grad = c.grad_before != nullptr;
    st.cgs.push_back(std::move(cg));
  }
  // Guards before the first break are the entry's; those after break j, its continuation's.
  size_t ncap = ts.breaks.empty() ? st.cgs.size() : ts.breaks[0].captured_before;
  size_t nrel = ts.breaks.empty() ? ts.relations.size() : ts.breaks[0].relations_before;
  G.captured.assign(st.cgs.begin(), st.cgs.begin() + static_cast<long>(ncap));
  G.relations.insert(G.relations.end(), ts.relations.begin(), ts.relations.begin() + static_cast<long>(nrel));
}

void CompiledCore::partition_and_build(TraceState& st) {
  Entry& e = st.e;
  TraceSession& ts = st.ts;
  const std::vector<NodePtr>& inputs = ts.slots;
  e.out.results = st.results;
  st.tag = opt_.name + "_" + std::to_string(entries_.size());
  std::set<const Node*> highlight;
  if (!st.tangents.empty()) partition_backward(st, highlight);
  e.out.fwd = std::make_shared<Program>(inputs, st.outputs, e.guards.symbol_names,
                                        ts.breaks.empty() ? std::map<uint64_t, SymInt>{} : ts.rng_offsets);
  // State the program updates is written over its old storage where the caller holds it alone
  // (only in a program without breaks: there the state is an input of it).
  if (ts.breaks.empty()) e.out.fwd->donate(st.write_back);
  if (opt_.cuda_graphs) {
    // State written in place (captured tensors, arguments) is written back into its own storage
    // by the graph (only in a program without breaks: there the state is an input of it).
    e.out.fwd->use_graphs({graph_counters_, ts.breaks.empty() ? st.write_back : decltype(st.write_back){}, opt_.name});
    if (e.out.bwd) e.out.bwd->use_graphs({graph_counters_, {}, opt_.name + " backward"});
    for (auto& tb : ts.breaks) tb.step->prog->use_graphs({graph_counters_, {}, opt_.name + " " + tb.step->what});
  }
  e.out.rng_total = ts.rng_total;
  stats_.symbols = e.out.fwd->symbols_used();
  stats_.size_relations = static_cast<int>(ts.relations.size());
  if (!jit::dump_dir().empty())
    jit::dump_file(st.tag + "_forward.dot", jit::graph_dot(inputs, st.outputs, highlight, st.tag + " forward"));
}

void CompiledCore::partition_backward(TraceState& st, std::set<const Node*>& highlight) {
  const std::vector<NodePtr>& inputs = st.ts.slots;
  const std::map<std::string, int64_t>& hints = st.ph.hints;
  jit::PartitionOptions po;
  po.memory_budget = opt_.memory_budget;
  po.save_all = opt_.save_all;
  jit::Partition part = jit::partition(
      inputs, st.tangents, st.outputs, st.grads, [&](const Node& n) { return node_bytes(n, hints); }, po);
  st.e.out.saved_begin = st.outputs.size();
  st.e.out.saved_count = part.saved.size();
  for (const auto& s : part.saved) {
    st.outputs.push_back(s);
    highlight.insert(s.get());
  }
  std::vector<NodePtr> bwd_inputs = part.saved;
  bwd_inputs.insert(bwd_inputs.end(), st.tangents.begin(), st.tangents.end());
  st.e.out.bwd = std::make_shared<Program>(bwd_inputs, st.grads, st.e.guards.symbol_names);
  stats_.saved_bytes = part.saved_bytes;
  stats_.save_all_bytes = part.save_all_bytes;
  stats_.recomputed = part.recomputed;
  if (!jit::dump_dir().empty()) {
    std::vector<NodePtr> joint_in = inputs, joint_out = st.outputs;
    joint_in.insert(joint_in.end(), st.tangents.begin(), st.tangents.end());
    joint_out.insert(joint_out.end(), st.grads.begin(), st.grads.end());
    jit::dump_file(st.tag + "_joint.dot", jit::graph_dot(joint_in, joint_out, highlight, st.tag + " joint graph"));
    jit::dump_file(st.tag + "_backward.dot", jit::graph_dot(bwd_inputs, st.grads, highlight, st.tag + " backward"));
  }
  if (jit::log_enabled("recompiles"))
    jit::log_line("recompiles", "compile(" + opt_.name + "): partitioned: forward saves " +
                                    std::to_string(part.saved.size()) + " values (" + std::to_string(part.saved_bytes) +
                                    " bytes; saving everything: " + std::to_string(part.save_all_bytes) +
                                    "), backward recomputes " + std::to_string(part.recomputed) + " ops");
}

void CompiledCore::chain_breaks(TraceState& st) {
  Entry& e = st.e;
  std::vector<jit::TracedBreak>& breaks = st.ts.breaks;
  const std::vector<guards::SizeRelation>& relations = st.ts.relations;
  std::unique_ptr<jit::BreakStep> next;
  std::shared_ptr<Outcome> end;
  if (!breaks.empty()) end = std::make_shared<Outcome>(std::move(e.out));
  for (size_t j = breaks.size(); j-- > 0;) {
    jit::TracedBreak& tb = breaks[j];
    auto br = std::make_unique<jit::Branch>();
    br->bytes = tb.bytes;
    size_t cap_end = j + 1 < breaks.size() ? breaks[j + 1].captured_before : st.cgs.size();
    size_t rel_end = j + 1 < breaks.size() ? breaks[j + 1].relations_before : relations.size();
    br->guards.captured.assign(st.cgs.begin() + static_cast<long>(tb.captured_before),
                               st.cgs.begin() + static_cast<long>(cap_end));
    br->guards.relations.assign(relations.begin() + static_cast<long>(tb.relations_before),
                                relations.begin() + static_cast<long>(rel_end));
    if (next)
      br->next = std::move(next);
    else
      br->end = end;
    if (!jit::dump_dir().empty())
      jit::dump_file(st.tag + "_break" + std::to_string(j) + ".dot",
                     jit::graph_dot(tb.step->prog->inputs(), tb.step->prog->outputs(), {},
                                    st.tag + " break " + std::to_string(j) + " (" + tb.step->what + ")"));
    tb.step->add(std::move(br));
    next = std::move(tb.step);
  }
  e.breaks = std::move(next);
}

std::vector<Value> CompiledCore::replay(Entry& e, const std::vector<Value>& args, const std::vector<int64_t>& syms,
                                        std::vector<int64_t>& out_spec) {
  // Inputs: tensor arguments, then captured tensors read now (pending ones computed first).
  std::vector<Node*> raw;
  raw.reserve(args.size() + e.guards.captured.size());
  std::vector<NodePtr> pending;
  auto add = [&](const NodePtr& n) {
    raw.push_back(n.get());
    if (!n->materialized()) pending.push_back(n);
  };
  for (const auto& a : args)
    if (const Tensor* t = as_tensor(a)) add(t->node());
  for (const auto& c : e.guards.captured) add(captured_source(c)->node());
  if (!pending.empty()) materialize(pending);
  release_overwritten_grads(e.out, e.guards.captured);
  std::vector<Tensor> outs = e.out.fwd->run(raw, syms);
  return land(
      e.out, outs, args, syms, [&](size_t k) -> const guards::CapturedTensor& { return e.guards.captured[k]; },
      out_spec);
}

template <class Captured>
std::vector<Value> CompiledCore::land(const Outcome& e, std::vector<Tensor>& outs, const std::vector<Value>& args,
                                      const std::vector<int64_t>& syms, const Captured& captured,
                                      std::vector<int64_t>& out_spec) {
  // Results.
  std::vector<Value> results = e.results;
  for (size_t r = 0; r < results.size(); ++r)
    if (e.result_tensor[r] >= 0) results[r] = outs[e.result_tensor[r]];
  size_t o = 0;
  for (size_t r = 0; r < e.result_tensor.size(); ++r) o += e.result_tensor[r] >= 0;
  // Side effects, exactly as eager mode leaves them.
  for (int k : e.cap_written) {
    auto impl = captured(k).impl.lock();
    if (captured(k).grad_of) impl = impl->grad;
    memory_ledger_inherit(*impl->node_, *outs[o].node());  // (the new value holds the same)
    impl->node_ = outs[o++].node();
    impl->version++;
  }
  for (int k : e.cap_grad) {
    auto impl = captured(k).impl.lock();
    Tensor g = outs[o++];
    g.impl()->requires_grad = false;
    impl->grad = g.impl();
    memory_ledger_mark(*g.node(), MemoryRole::Gradient);
  }
  for (int k : e.cap_grad_cleared) captured(k).impl.lock()->grad = nullptr;
  for (int i : e.arg_written) {
    NoGradGuard ng;
    Tensor target = *as_tensor(args[i]);
    target.assign_(outs[o++]);
  }
  for (int i : e.arg_grad) {
    const auto& impl = as_tensor(args[i])->impl();
    Tensor g = outs[o++];
    if (impl->grad) {
      NoGradGuard ng;
      g = kiln::add(Tensor(impl->grad), g);
    }
    g.impl()->requires_grad = false;
    impl->grad = g.impl();
  }
  if (e.bwd) {
    auto node = std::make_shared<CompiledGrad>();
    node->bwd = e.bwd;
    node->syms = syms;
    node->saved.assign(outs.begin() + static_cast<long>(e.saved_begin),
                       outs.begin() + static_cast<long>(e.saved_begin + e.saved_count));
    node->slot = e.grad_slot;
    node->out_dtypes = e.diff_dtypes;
    node->fn_name = opt_.name;
    for (int i : e.diff_args) node->next.push_back(grad_edge(*as_tensor(args[i])));
    for (int k : e.diff_caps) node->next.push_back(grad_edge(Tensor(captured(k).impl.lock())));
    if (e.diff_results.size() == 1) {
      Tensor& out = std::get<Tensor>(results[e.diff_results[0]]);
      out.impl()->requires_grad = true;
      out.impl()->grad_fn = node;
    } else {
      // Several differentiable results: each packs its gradient into the node's flat input.
      bool same =
          std::all_of(e.diff_dtypes.begin(), e.diff_dtypes.end(), [&](DType t) { return t == e.diff_dtypes[0]; });
      int64_t total = 0;
      for (int r : e.diff_results) {
        const Tensor& out = std::get<Tensor>(results[r]);
        node->out_shapes.push_back(out.sizes());
        node->offsets.push_back(total);
        total += out.numel();
      }
      std::shared_ptr<GradNode> join = node;
      for (size_t i = 0; i < e.diff_results.size(); ++i) {
        Tensor& out = std::get<Tensor>(results[e.diff_results[i]]);
        auto pack = std::make_shared<PackGrad>();
        pack->offset = node->offsets[i];
        pack->total = total;
        pack->dtype = same ? e.diff_dtypes[0] : DType::Float64;
        pack->next.push_back(Edge{join});
        out.impl()->requires_grad = true;
        out.impl()->grad_fn = pack;
      }
    }
  }
  out_spec = e.out_spec;
  return results;
}

bool CompiledCore::replay_path(Entry& e, const std::vector<Value>& args, std::vector<int64_t>& syms,
                               std::vector<Value>& results, std::vector<int64_t>& out_spec, std::string* why) {
  // Slots as the trace met them: arguments, captured tensors, then what each break carries.
  std::vector<Node*> raw;
  std::vector<Tensor> carried;
  std::vector<const guards::CapturedTensor*> captured;
  std::vector<NodePtr> pending;
  auto add = [&](const guards::CapturedTensor& c) {
    const NodePtr& n = captured_source(c)->node();
    raw.push_back(n.get());
    if (!n->materialized()) pending.push_back(n);
    captured.push_back(&c);
  };
  for (const auto& a : args)
    if (const Tensor* t = as_tensor(a)) {
      const NodePtr& n = t->node();
      raw.push_back(n.get());
      if (!n->materialized()) pending.push_back(n);
    }
  for (const auto& c : e.guards.captured) add(c);
  // Random ops draw from the generator state at the call's start; it advances only once the
  // call's every value guard has passed.
  const std::pair<uint64_t, uint64_t> rng = detail::rng_state();
  const jit::BreakStep* step = e.breaks.get();
  const Outcome* end = nullptr;
  for (int depth = 0; !end; ++depth) {
    if (!pending.empty()) materialize(pending);
    pending.clear();
    std::vector<Tensor> vals = step->prog->run(raw, syms, &rng);
    std::string miss;
    const jit::Branch* b = step->find(jit::value_bytes(vals, step->num_values), syms, e.guards.symbol_names,
                                      captured.size(), why ? &miss : nullptr);
    if (!b) {
      if (why) *why = "break " + std::to_string(depth) + " " + miss;
      return false;
    }
    for (size_t j = step->num_values; j < vals.size(); ++j) {
      raw.push_back(vals[j].node().get());
      carried.push_back(std::move(vals[j]));
    }
    for (const auto& c : b->guards.captured) add(c);
    step = b->next.get();
    end = b->end.get();
  }
  if (!pending.empty()) materialize(pending);
  std::vector<Tensor> outs = end->fwd->run(raw, syms, &rng);
  uint64_t drawn = 0;
  if (end->rng_total.is_constant()) {
    drawn = static_cast<uint64_t>(end->rng_total.as_int());
  } else {
    std::map<std::string, int64_t> env;
    for (size_t i = 0; i < syms.size(); ++i) env[e.guards.symbol_names[i]] = syms[i];
    drawn = static_cast<uint64_t>(end->rng_total.evaluate(env));
  }
  detail::rng_reserve(drawn);
  results = land(
      *end, outs, args, syms, [&](size_t k) -> const guards::CapturedTensor& { return *captured[k]; }, out_spec);
  return true;
}

bool CompiledCore::merge(Entry& into, Entry& fresh, const std::vector<int64_t>& syms) {
  if (!into.breaks || !fresh.breaks || fresh.guards.str() != into.guards.str()) return false;
  jit::BreakStep* old = into.breaks.get();
  jit::BreakStep* neu = fresh.breaks.get();
  size_t ncap = into.guards.captured.size();
  std::vector<int64_t> s = syms;
  for (int depth = 0;; ++depth) {
    if (old->signature != neu->signature) return false;
    jit::Branch* nb = neu->head.load();
    jit::Branch* ob = old->find(nb->bytes, s, into.guards.symbol_names, ncap, nullptr);
    if (!ob) {
      if (jit::log_enabled("guards"))
        jit::log_line("guards", "compile(" + opt_.name + ") new continuation:\n" +
                                    path_str(*old, *nb, depth, into.guards.symbol_names, ncap));
      old->add(std::move(neu->owned.front()));
      return true;
    }
    if (ob->end || nb->end) return ob->end && nb->end;  // already there (another thread), or another path
    if (ob->guards.captured.size() != nb->guards.captured.size()) return false;
    ncap += ob->guards.captured.size();
    old = ob->next.get();
    neu = nb->next.get();
  }
}

std::string CompiledCore::path_str(const jit::BreakStep& step, const jit::Branch& b, int depth,
                                   const std::vector<std::string>& names, size_t ncap) {
  std::string out = "break " + std::to_string(depth) + " (" + step.what + ") == " + step.values_str(b.bytes) + "\n" +
                    b.guards.str(names, ncap);
  if (b.next) {
    const jit::Branch* nb = b.next->head.load();
    out += path_str(*b.next, *nb, depth + 1, names, ncap + b.guards.captured.size());
  }
  return out;
}

std::shared_ptr<CompiledCore> make_compiled_core(CompileOptions options) {
  KILN_CHECK(options.recompile_limit >= 1, "compile: recompile_limit must be at least 1, got ",
             options.recompile_limit);
  KILN_CHECK(options.memory_budget > 0 && options.memory_budget <= 1, "compile: memory_budget must be in (0, 1], got ",
             options.memory_budget);
  return std::make_shared<CompiledCore>(std::move(options));
}

std::vector<Value> compiled_call(CompiledCore& core, const std::vector<Value>& args, const std::vector<int64_t>& spec,
                                 const TraceFn& fn, std::vector<int64_t>& out_spec) {
  return core.call(args, spec, fn, out_spec);
}

CompileStats compiled_stats(const CompiledCore& core) { return core.stats(); }

bool compiled_guards_pass(CompiledCore& core, const std::vector<Value>& args, const std::vector<int64_t>& spec) {
  return core.guards_pass(args, spec);
}

}  // namespace kiln::detail
