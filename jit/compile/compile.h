// kiln::compile: a tensor function that checks cheap guards on each call and replays compiled
// code without re-recording; a missed guard traces it (with symbolic sizes once a size has
// changed) into one graph — forward, backward and optimizer updates — which is fused and cached.
//
// What a trace sees: tensor arguments, and tensors fn reads from outside (module parameters,
// optimizer state), whose current values are read on every call; in-place updates of those
// tensors and gradients accumulated into .grad() land exactly as in eager mode. What it does
// not see: work outside tensors (printing, counters, C++ variables), which happens at trace time
// only, and C++ values read inside fn, which are constants of the trace — pass values that
// change as arguments (scalars are specialized and guarded) or keep them in tensors. A step that
// needs a small value while tracing (item(), to_vector() of at most 64 elements, a count that
// sets a size) is a graph break kept compiled: the value is computed on the call's inputs, fn
// goes on tracing with it, and the entry runs in segments — the one computing the value, then
// the continuation traced for that exact value (a value guard; a new value traces a new
// continuation, counted against recompile_limit). Nothing lands before every value guard
// passed. A larger value (printing or data() of a big tensor) makes fn run in lazy eager mode,
// with a warning.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "guards/value.h"
#include "runtime/core/export.h"

namespace kiln {

struct CompileOptions {
  std::string name = "fn";  // names fn in logs and dump files
  int recompile_limit = 8;  // compiles (entries and continuations) before fn falls back to lazy eager mode
  // Sizes: automatic (first call specialized, a size that changes becomes a symbol at any
  // value, 0 and 1 included), always dynamic (every size but 0 and 1 symbolic from the first
  // call), or always static.
  enum class Dynamic { Automatic, Always, Never } dynamic = Dynamic::Automatic;
  std::vector<std::pair<int, int>> mark_dynamic;  // (flat argument, dim): symbolic from the start
  std::vector<std::pair<int, int>> mark_static;  // (flat argument, dim): always specialized
  // Activation memory budget for functions whose outputs need grad: the fraction of the
  // min-cut's saved bytes allowed (more recomputation below 1).
  double memory_budget = 1.0;
  bool save_all = false;  // save every value backward reads instead of the min-cut (tests)
  // On a GPU, replay each entry as a CUDA graph (recorded at its second run) instead of
  // launching its kernels one by one.
  bool cuda_graphs = true;
  // CUDA graphs kept at most (each holds its own device memory); past it the least recently
  // used whose outputs nobody holds are dropped, and recorded again when their sizes come back.
  int cuda_graph_limit = 128;
};

// Counters of one compiled function.
struct CompileStats {
  int entries = 0;  // compiles that produced code (entries, and continuations after breaks)
  int64_t hits = 0;  // calls served by an entry
  int64_t misses = 0;  // calls that traced
  int64_t value_misses = 0;  // ... of them, calls whose break values no continuation was traced for
  int64_t eager_calls = 0;  // calls run in lazy eager mode (past the limit or after a break)
  double compile_ms = 0;  // total trace + partition + schedule/compile time
  int64_t saved_bytes = 0;  // newest autograd entry: bytes the forward saves for backward
  int64_t save_all_bytes = 0;  // ... and what saving every value backward reads would cost
  int recomputed = 0;  // ... forward ops its backward recomputes
  int pattern_matches = 0;  // newest compile: instances of registered rewrites it replaced (kiln::patterns)
  std::vector<std::string> symbols;  // newest compile: the size symbols its (final) program uses, after
                                     // simplification with the facts its guards establish
  int size_relations = 0;  // ... size relations its trace relied on (guards beyond each symbol's lower bound)
  int64_t graphs = 0;  // CUDA graphs recorded
  int64_t graph_updates = 0;  // ... of which made by updating a dropped graph's executable in place
                              // (at cuda_graph_limit, or replacing a graph of the same size)
  int64_t graph_replays = 0;  // runs served by a CUDA graph
  int64_t ungraphed_runs = 0;  // runs on a GPU that went without a graph (outputs of every graph
                               // still held, state shared elsewhere, recording impossible)
  int64_t graph_bytes = 0;  // device memory the graphs hold now (their private pools)
  int64_t graphs_kept = 0;  // CUDA graphs kept now (<= CompileOptions::cuda_graph_limit)
  std::string last_miss;  // why the newest miss missed ("arg 0 dim 0: expected 4096, got 1000",
                          // "break 0 (item() of sum): expected 3, got 5")
};

namespace detail {
class CompiledCore;
using TraceFn = std::function<std::vector<Value>(const std::vector<Value>&)>;
KILN_API std::shared_ptr<CompiledCore> make_compiled_core(CompileOptions options);
// Runs one call: guards, then replay, trace or eager. `out_spec` receives the result structure.
KILN_API std::vector<Value> compiled_call(CompiledCore& core, const std::vector<Value>& args,
                                          const std::vector<int64_t>& spec, const TraceFn& fn,
                                          std::vector<int64_t>& out_spec);
KILN_API CompileStats compiled_stats(const CompiledCore& core);
// Whether some entry's guards admit these arguments (runs the guards only).
KILN_API bool compiled_guards_pass(CompiledCore& core, const std::vector<Value>& args,
                                   const std::vector<int64_t>& spec);

// A per-thread argument buffer reused across calls (no allocation per call); nested calls
// (a compiled function called while another runs) get their own.
class ArgBuffer {
 public:
  ArgBuffer() : v_(acquire()) {}
  ~ArgBuffer() {
    v_.clear();
    --depth();
  }
  ArgBuffer(const ArgBuffer&) = delete;
  ArgBuffer& operator=(const ArgBuffer&) = delete;
  std::vector<Value>& values() { return v_; }

 private:
  static size_t& depth() {
    thread_local size_t d = 0;
    return d;
  }
  static std::vector<Value>& acquire() {
    thread_local std::vector<std::unique_ptr<std::vector<Value>>> pool;
    size_t& d = depth();
    if (pool.size() <= d) pool.push_back(std::make_unique<std::vector<Value>>());
    return *pool[d++];
  }
  std::vector<Value>& v_;
};

// Flattening of arguments and results: tensors, scalars, vectors, tuples and pairs.
template <class T, class = void>
struct Flat;
// put(x, out, spec, borrow): arguments are flattened with borrow = true (tensors by pointer).
template <>
struct Flat<Tensor> {
  static void put(const Tensor& t, std::vector<Value>& out, std::vector<int64_t>&, bool borrow = false) {
    if (borrow)
      out.emplace_back(&t);
    else
      out.emplace_back(t);
  }
  static Tensor get(const std::vector<Value>& in, size_t& p, const std::vector<int64_t>&, size_t&) {
    return *as_tensor(in[p++]);
  }
};
template <>
struct Flat<bool> {
  static void put(bool v, std::vector<Value>& out, std::vector<int64_t>&, bool = false) { out.emplace_back(v); }
  static bool get(const std::vector<Value>& in, size_t& p, const std::vector<int64_t>&, size_t&) {
    return std::get<bool>(in[p++]);
  }
};
template <class T>
struct Flat<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static void put(T v, std::vector<Value>& out, std::vector<int64_t>&, bool = false) {
    out.emplace_back(static_cast<int64_t>(v));
  }
  static T get(const std::vector<Value>& in, size_t& p, const std::vector<int64_t>&, size_t&) {
    return static_cast<T>(std::get<int64_t>(in[p++]));
  }
};
template <class T>
struct Flat<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static void put(T v, std::vector<Value>& out, std::vector<int64_t>&, bool = false) {
    out.emplace_back(static_cast<double>(v));
  }
  static T get(const std::vector<Value>& in, size_t& p, const std::vector<int64_t>&, size_t&) {
    return static_cast<T>(std::get<double>(in[p++]));
  }
};
template <class T>
struct Flat<std::vector<T>> {
  static void put(const std::vector<T>& v, std::vector<Value>& out, std::vector<int64_t>& spec, bool borrow = false) {
    spec.push_back(static_cast<int64_t>(v.size()));
    for (const auto& x : v) Flat<T>::put(x, out, spec, borrow);
  }
  static std::vector<T> get(const std::vector<Value>& in, size_t& p, const std::vector<int64_t>& spec, size_t& s) {
    std::vector<T> v;
    int64_t n = spec.at(s++);
    for (int64_t i = 0; i < n; ++i) v.push_back(Flat<T>::get(in, p, spec, s));
    return v;
  }
};
template <class... T>
struct Flat<std::tuple<T...>> {
  static void put(const std::tuple<T...>& t, std::vector<Value>& out, std::vector<int64_t>& spec, bool borrow = false) {
    std::apply([&](const auto&... x) { (Flat<std::decay_t<decltype(x)>>::put(x, out, spec, borrow), ...); }, t);
  }
  static std::tuple<T...> get(const std::vector<Value>& in, size_t& p, const std::vector<int64_t>& spec, size_t& s) {
    return std::tuple<T...>{Flat<T>::get(in, p, spec, s)...};  // braced: left to right
  }
};
template <class A, class B>
struct Flat<std::pair<A, B>> {
  static void put(const std::pair<A, B>& t, std::vector<Value>& out, std::vector<int64_t>& spec, bool borrow = false) {
    Flat<A>::put(t.first, out, spec, borrow);
    Flat<B>::put(t.second, out, spec, borrow);
  }
  static std::pair<A, B> get(const std::vector<Value>& in, size_t& p, const std::vector<int64_t>& spec, size_t& s) {
    A a = Flat<A>::get(in, p, spec, s);
    B b = Flat<B>::get(in, p, spec, s);
    return {std::move(a), std::move(b)};
  }
};
}  // namespace detail

// A compiled function: call it like fn.
template <class F>
class Compiled {
 public:
  Compiled(F fn, CompileOptions options) : fn_(std::move(fn)), core_(detail::make_compiled_core(std::move(options))) {}

  template <class... A>
  auto operator()(A&&... args) {
    using R = std::invoke_result_t<F&, std::decay_t<A>&...>;
    detail::ArgBuffer buffer;
    std::vector<Value>& flat = buffer.values();
    std::vector<int64_t> spec;
    (detail::Flat<std::decay_t<A>>::put(args, flat, spec, true), ...);
    const std::vector<int64_t>& arg_spec = spec;
    detail::TraceFn trace = [this, &arg_spec](const std::vector<Value>& in) -> std::vector<Value> {
      size_t p = 0, s = 0;
      std::tuple<std::decay_t<A>...> call{detail::Flat<std::decay_t<A>>::get(in, p, arg_spec, s)...};
      // The result structure rides in front: its length, its entries, then the values.
      std::vector<Value> values;
      std::vector<int64_t> ospec;
      if constexpr (std::is_void_v<R>) {
        std::apply(fn_, call);
      } else {
        R r = std::apply(fn_, call);
        detail::Flat<std::decay_t<R>>::put(r, values, ospec);
      }
      std::vector<Value> out;
      out.emplace_back(static_cast<int64_t>(ospec.size()));
      for (int64_t v : ospec) out.emplace_back(v);
      out.insert(out.end(), values.begin(), values.end());
      return out;
    };
    std::vector<int64_t> out_spec;
    std::vector<Value> out = detail::compiled_call(*core_, flat, spec, trace, out_spec);
    if constexpr (!std::is_void_v<R>) {
      size_t p = 0, s = 0;
      return detail::Flat<std::decay_t<R>>::get(out, p, out_spec, s);
    }
  }

  // The counters of this function.
  CompileStats stats() const { return detail::compiled_stats(*core_); }

  // Runs only the guards for these arguments: true when a compiled entry would serve the call
  // (value guards after graph breaks need fn's values and are not checked).
  template <class... A>
  bool guards_pass(const A&... args) {
    detail::ArgBuffer buffer;
    std::vector<Value>& flat = buffer.values();
    std::vector<int64_t> spec;
    (detail::Flat<std::decay_t<A>>::put(args, flat, spec, true), ...);
    return detail::compiled_guards_pass(*core_, flat, spec);
  }

 private:
  F fn_;
  std::shared_ptr<detail::CompiledCore> core_;
};

// Compiles `fn` (any callable over Tensors, vectors/tuples/pairs of them, and int/double/bool).
template <class F>
Compiled<std::decay_t<F>> compile(F&& fn, CompileOptions options = {}) {
  return Compiled<std::decay_t<F>>(std::forward<F>(fn), std::move(options));
}

// The counters of a compiled function.
template <class F>
CompileStats compile_stats(const Compiled<F>& f) {
  return f.stats();
}

}  // namespace kiln
