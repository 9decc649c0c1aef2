// compile(): the cache of guarded entries, the trace on a miss, and the replay on a hit.
#include "jit/compile.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>

#include "guards/guard_set.h"
#include "jit/diagnostics.h"
#include "jit/partition.h"
#include "jit/program.h"
#include "jit/trace_session.h"
#include "runtime/autograd.h"
#include "runtime/executor.h"
#include "runtime/record.h"

namespace kiln::detail {
namespace {

using jit::Program;
using jit::TraceSession;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int64_t node_bytes(const Node& n, const std::map<std::string, int64_t>& hints) {
  return numel(n.shape).evaluate(hints) * static_cast<int64_t>(itemsize(n.dtype));
}

// The backward of a compiled function: runs the compiled backward program on the values the
// forward saved and the output's gradient.
struct CompiledGrad final : GradNode {
  std::shared_ptr<Program> bwd;
  std::vector<int64_t> syms;
  std::vector<Tensor> saved;
  std::vector<int> slot;  // per `next` edge: index into the program's outputs, or -1 (unused input)
  DType out_dtype = DType::Float32;
  bool released = false;
  std::string fn_name;

  std::vector<Tensor> apply(const Tensor& g, bool create_graph) override {
    KILN_CHECK(!create_graph, "compile(", fn_name, "): double backward (create_graph=true) through a compiled ",
               "function is not supported; call the function uncompiled for higher-order gradients");
    KILN_CHECK(!released, "compile(", fn_name, "): trying to backward through the compiled graph a second time; ",
               "pass retain_graph=true the first time");
    Tensor gc = detail::cast(g, out_dtype).contiguous();
    std::vector<NodePtr> roots;
    for (const auto& s : saved) roots.push_back(s.node());
    roots.push_back(gc.node());
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
    released = true;
  }
  const char* name() const override { return "CompiledFunctionBackward"; }
};

// One compiled entry: its guards and programs, and how program outputs map back.
struct Entry {
  guards::GuardSet guards;
  std::shared_ptr<Program> fwd;
  std::vector<Value> results;        // result template (tensors filled per call)
  std::vector<int64_t> out_spec;
  std::vector<int> result_tensor;    // per result value: fwd output index (-1 scalar)
  std::vector<int> cap_written;      // per fwd output after the results: captured index written
  std::vector<int> cap_grad;         // ... captured parameter whose .grad() is set
  std::vector<int> arg_written;      // ... flat argument written in place
  std::vector<int> cap_grad_cleared; // captured parameters whose .grad() fn cleared
  // Autograd (outputs that need grad, backward run later by the caller).
  std::shared_ptr<Program> bwd;
  int diff_result = -1;              // result value that carries the CompiledGrad
  size_t saved_begin = 0, saved_count = 0;
  std::vector<int> diff_args, diff_caps;  // differentiable inputs, in `next` order
  std::vector<int> grad_slot;        // per differentiable input: bwd output or -1
  DType diff_dtype = DType::Float32;
  size_t num_tensor_args = 0;
};

}  // namespace

class CompiledCore {
 public:
  explicit CompiledCore(CompileOptions o) : opt_(std::move(o)) {}

  std::vector<Value> call(const std::vector<Value>& args, const std::vector<int64_t>& spec, const TraceFn& fn,
                          std::vector<int64_t>& out_spec) {
    if (trace_observer()) return run_eager(args, fn, out_spec, false);  // inside another trace: inline
    std::vector<int64_t> syms;
    // Fast path: the entry that served the last hit (entries are immutable and never freed).
    if (Entry* last = last_hit_.load(std::memory_order_acquire); last && last->guards.check(args, spec, syms, nullptr)) {
      hits_.fetch_add(1, std::memory_order_relaxed);
      return replay(*last, args, syms, out_spec);
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (eager_) {
      stats_.eager_calls++;
      lock.unlock();
      return run_eager(args, fn, out_spec, true);
    }
    std::string first_why;
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
      std::string* why = it == entries_.rbegin() ? &first_why : nullptr;
      if ((*it)->guards.check(args, spec, syms, why)) {
        hits_.fetch_add(1, std::memory_order_relaxed);
        last_hit_.store(it->get(), std::memory_order_release);
        Entry& e = **it;
        lock.unlock();
        return replay(e, args, syms, out_spec);
      }
    }
    stats_.misses++;
    if (!entries_.empty()) {
      stats_.last_miss = first_why;
      if (jit::log_enabled("recompiles"))
        jit::log_line("recompiles", "compile(" + opt_.name + "): recompiling (entry " +
                                        std::to_string(entries_.size() + 1) + "): " + first_why);
    }
    if (static_cast<int>(entries_.size()) >= opt_.recompile_limit) {
      eager_ = true;
      std::fprintf(stderr, "[kiln] warning: compile(%s) reached its recompile limit (%d entries; last miss: %s); "
                   "running it in lazy eager mode from now on\n", opt_.name.c_str(), opt_.recompile_limit,
                   first_why.c_str());
      stats_.eager_calls++;
      lock.unlock();
      return run_eager(args, fn, out_spec, true);
    }
    auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Entry> e;
    try {
      e = trace(args, spec, fn);
    } catch (const jit::GraphBreak& b) {
      eager_ = true;
      std::fprintf(stderr, "[kiln] warning: compile(%s) cannot compile fn: %s; it runs in lazy eager mode "
                   "(compiled segments around eager steps are not supported)\n", opt_.name.c_str(), b.reason.c_str());
      stats_.eager_calls++;
      lock.unlock();
      return run_eager(args, fn, out_spec, true);
    }
    std::string why;
    if (!e->guards.check(args, spec, syms, &why))
      throw Error("compile(" + opt_.name + "): internal error: a fresh entry rejects the call it was traced for (" +
                  why + ")");
    auto out = replay(*e, args, syms, out_spec);
    stats_.compile_ms += ms_since(t0);
    stats_.entries++;
    last_hit_.store(e.get(), std::memory_order_release);
    entries_.push_back(std::move(e));
    return out;
  }

  CompileStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    CompileStats s = stats_;
    s.hits = hits_.load();
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

  static std::vector<Value> split_results(const std::vector<Value>& out, std::vector<int64_t>& out_spec) {
    size_t k = static_cast<size_t>(std::get<int64_t>(out[0]));
    out_spec.clear();
    for (size_t i = 0; i < k; ++i) out_spec.push_back(std::get<int64_t>(out[1 + i]));
    return {out.begin() + 1 + static_cast<long>(k), out.end()};
  }

  // Which dims become symbols on this trace (automatic dynamic shapes).
  std::set<std::pair<int, int>> dynamic_dims(const std::vector<Value>& args) {
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

  std::unique_ptr<Entry> trace(const std::vector<Value>& args, const std::vector<int64_t>& spec, const TraceFn& fn);
  std::vector<Value> replay(Entry& e, const std::vector<Value>& args, const std::vector<int64_t>& syms,
                            std::vector<int64_t>& out_spec);

  CompileOptions opt_;
  mutable std::mutex mu_;
  std::atomic<Entry*> last_hit_{nullptr};
  std::atomic<int64_t> hits_{0};
  std::vector<std::unique_ptr<Entry>> entries_;
  CompileStats stats_;
  bool eager_ = false;
  std::map<int, std::vector<int64_t>> seen_sizes_;
  std::set<std::pair<int, int>> changed_;
};

std::unique_ptr<Entry> CompiledCore::trace(const std::vector<Value>& args, const std::vector<int64_t>& spec,
                                           const TraceFn& fn) {
  auto e = std::make_unique<Entry>();
  guards::GuardSet& G = e->guards;
  G.spec = spec;
  G.grad_mode = grad_enabled();
  std::set<std::pair<int, int>> dyn = dynamic_dims(args);
  // Placeholders: leaves without storage, sizes constant or symbolic.
  std::map<std::string, int64_t> hints;
  std::vector<Value> trace_args;
  std::vector<NodePtr> placeholders;
  std::vector<Tensor> placeholder_tensors;
  std::vector<int> placeholder_arg;
  uint64_t start_id = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    G.kinds.push_back(value_kind(args[i]));
    const Tensor* t = as_tensor(args[i]);
    G.scalars.push_back(t ? Value(int64_t{0}) : args[i]);  // tensors are guarded by G.tensors
    if (!t) {
      G.tensor_slot.push_back(-1);
      trace_args.push_back(args[i]);
      continue;
    }
    KILN_CHECK(t->defined(), "compile(", opt_.name, "): argument ", i, " is an undefined tensor");
    const Node& n = *t->node();
    guards::TensorGuard g;
    g.dtype = n.dtype;
    g.device = n.device;
    g.requires_grad = t->requires_grad();
    g.sizes = concrete(n.shape);
    g.symbols.assign(g.sizes.size(), -1);
    g.contiguous = is_contiguous_layout(n.shape, n.strides);
    auto ph = std::make_shared<Node>();
    if (!start_id) start_id = ph->id;
    ph->op = OpKind::Leaf;
    ph->dtype = n.dtype;
    ph->device = n.device;
    Shape shape = n.shape;
    if (g.contiguous) {
      for (size_t d = 0; d < g.sizes.size(); ++d)
        if (dyn.count({static_cast<int>(i), static_cast<int>(d)}) && g.sizes[d] >= 2) {
          int s = static_cast<int>(G.symbol_names.size());
          std::string name = "s" + std::to_string(s);
          G.symbol_names.push_back(name);
          g.symbols[d] = s;
          shape[d] = SymInt::symbol(name);
          hints[name] = g.sizes[d];
          // 0 and 1 stay specialized: a symbol stands for sizes of at least 2.
          G.relations.push_back({shape[d] - SymInt(2), SymRel::Ge});
        }
      ph->strides = contiguous_strides(shape);
    } else {
      g.strides = concrete(n.strides);
      ph->strides = n.strides;
    }
    ph->shape = shape;
    ph->offset = 0;
    G.tensor_slot.push_back(static_cast<int>(G.tensors.size()));
    G.tensors.push_back(g);
    Tensor pt = Tensor::from_node(ph);
    if (g.requires_grad) pt.requires_grad_(true);
    placeholders.push_back(ph);
    placeholder_tensors.push_back(pt);
    placeholder_arg.push_back(static_cast<int>(i));
    trace_args.emplace_back(pt);
  }
  e->num_tensor_args = placeholders.size();
  if (!start_id) start_id = std::make_shared<Node>()->id;

  TraceSession ts(start_id, hints);
  for (size_t k = 0; k < placeholders.size(); ++k) ts.add_placeholder(*placeholder_tensors[k].impl(), placeholder_arg[k]);
  std::vector<Value> results;
  std::vector<NodePtr> outputs;  // fwd program outputs
  std::vector<NodePtr> tangents, grads;
  std::vector<Tensor> diff_inputs;
  {
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
    std::vector<Value> out = fn(trace_args);
    results = split_results(out, e->out_spec);
    // Results: tensors become program outputs; scalars are constants of the trace.
    std::vector<Tensor> result_tensors;
    for (auto& v : results) {
      if (auto* t = std::get_if<Tensor>(&v)) {
        KILN_CHECK(t->defined(), "compile(", opt_.name, "): fn returned an undefined tensor");
        e->result_tensor.push_back(static_cast<int>(outputs.size()));
        outputs.push_back(t->node());
        result_tensors.push_back(*t);
        v = Tensor();
      } else {
        e->result_tensor.push_back(-1);
      }
    }
    // Side effects on captured tensors: in-place writes and gradients set by a backward in fn.
    bool grads_set = false;
    for (size_t k = 0; k < ts.captured.size(); ++k) {
      auto& c = ts.captured[k];
      if (c.written) {
        e->cap_written.push_back(static_cast<int>(k));
        outputs.push_back(c.impl->node());
      }
    }
    for (size_t k = 0; k < ts.captured.size(); ++k) {
      auto& c = ts.captured[k];
      if (c.impl->grad != c.grad_before) {
        if (!c.impl->grad) {
          e->cap_grad_cleared.push_back(static_cast<int>(k));
          continue;
        }
        e->cap_grad.push_back(static_cast<int>(k));
        outputs.push_back(c.impl->grad->node());
        grads_set = true;
      }
    }
    for (auto& [i, w] : ts.placeholder_written) {
      if (!w) continue;
      size_t k = std::find(placeholder_arg.begin(), placeholder_arg.end(), i) - placeholder_arg.begin();
      e->arg_written.push_back(i);
      outputs.push_back(placeholder_tensors[k].node());
    }
    // A tensor fn created, wrote in place and kept (not returned) would go stale on replay.
    for (auto& w : ts.created_written) {
      auto impl = w.lock();
      if (!impl) continue;
      bool returned = false;
      for (const auto& r : result_tensors) returned |= r.impl() == impl;
      KILN_CHECK(returned, "compile(", opt_.name, "): fn keeps a tensor it created and then modified in place ",
                 "(optimizer state created on the first step?); create such state before calling the compiled ",
                 "function");
    }
    // Outputs that need grad with the backward left to the caller: trace the joint graph.
    std::vector<int> diff_results;
    size_t rt = 0;
    for (size_t r = 0; r < results.size(); ++r)
      if (e->result_tensor[r] >= 0) {
        if (result_tensors[rt].requires_grad() && !grads_set && grad_enabled()) diff_results.push_back(static_cast<int>(r));
        ++rt;
      }
    if (!diff_results.empty()) {
      if (diff_results.size() > 1)
        throw jit::GraphBreak{"more than one result needs grad (only one differentiable result is supported)"};
      int r = diff_results[0];
      int ti = 0;
      for (int q = 0; q < r; ++q) ti += e->result_tensor[q] >= 0;
      const Tensor& out_t = result_tensors[ti];
      for (size_t k = 0; k < placeholders.size(); ++k)
        if (placeholder_tensors[k].requires_grad()) {
          e->diff_args.push_back(placeholder_arg[k]);
          diff_inputs.push_back(placeholder_tensors[k]);
        }
      for (size_t k = 0; k < ts.captured.size(); ++k) {
        auto& c = ts.captured[k];
        if (!c.requires_grad_before || c.grad_of >= 0) continue;
        if (c.grad_fn_before)
          throw jit::GraphBreak{"fn reads a tensor with gradient history from outside; pass it as an argument"};
        e->diff_caps.push_back(static_cast<int>(k));
        diff_inputs.push_back(Tensor(c.impl));
      }
      auto tan = std::make_shared<Node>();
      tan->op = OpKind::Leaf;
      tan->dtype = out_t.dtype();
      tan->device = out_t.device();
      tan->shape = out_t.shape();
      tan->strides = contiguous_strides(tan->shape);
      tan->offset = 0;
      tangents.push_back(tan);
      e->diff_result = r;
      e->diff_dtype = out_t.dtype();
      std::vector<Tensor> gs = kiln::grad({out_t}, diff_inputs, {Tensor::from_node(tan)}, false, false, true);
      for (const auto& g : gs) {
        e->grad_slot.push_back(g.defined() ? static_cast<int>(grads.size()) : -1);
        if (g.defined()) grads.push_back(g.node());
      }
    }
    undo.done = true;
    ts.stop();
    ts.restore();
  }
  // Program inputs: the placeholders, then the captured tensors as the trace read them.
  std::vector<NodePtr> inputs = placeholders;
  for (auto& c : ts.captured) inputs.push_back(c.node);
  G.relations.insert(G.relations.end(), ts.relations.begin(), ts.relations.end());
  for (auto& c : ts.captured) {
    guards::CapturedTensor cg;
    cg.grad_of = c.grad_of >= 0;
    cg.impl = c.grad_of >= 0 ? ts.captured[c.grad_of].impl : c.impl;
    const Node& n = *c.node;
    cg.guard.dtype = n.dtype;
    cg.guard.device = n.device;
    cg.guard.requires_grad = c.requires_grad_before;
    cg.guard.sizes = concrete(n.shape);
    cg.guard.symbols.assign(cg.guard.sizes.size(), -1);
    cg.guard.contiguous = is_contiguous_layout(n.shape, n.strides);
    if (!cg.guard.contiguous) cg.guard.strides = concrete(n.strides);
    cg.watch_grad = c.grad_of < 0 && ts.relied_on_grad(c.impl.get());
    cg.has_grad = c.grad_before != nullptr;
    G.captured.push_back(std::move(cg));
  }
  e->results = results;
  std::string tag = opt_.name + "_" + std::to_string(entries_.size());
  std::set<const Node*> highlight;
  if (!tangents.empty()) {
    jit::PartitionOptions po;
    po.memory_budget = opt_.memory_budget;
    po.save_all = opt_.save_all;
    jit::Partition part = jit::partition(inputs, tangents, outputs, grads,
                                         [&](const Node& n) { return node_bytes(n, hints); }, po);
    e->saved_begin = outputs.size();
    e->saved_count = part.saved.size();
    for (const auto& s : part.saved) {
      outputs.push_back(s);
      highlight.insert(s.get());
    }
    std::vector<NodePtr> bwd_inputs = part.saved;
    bwd_inputs.push_back(tangents[0]);
    e->bwd = std::make_shared<Program>(bwd_inputs, grads, G.symbol_names);
    stats_.saved_bytes = part.saved_bytes;
    stats_.save_all_bytes = part.save_all_bytes;
    stats_.recomputed = part.recomputed;
    if (!jit::dump_dir().empty()) {
      std::vector<NodePtr> joint_in = inputs, joint_out = outputs;
      joint_in.push_back(tangents[0]);
      joint_out.insert(joint_out.end(), grads.begin(), grads.end());
      jit::dump_file(tag + "_joint.dot", jit::graph_dot(joint_in, joint_out, highlight, tag + " joint graph"));
      jit::dump_file(tag + "_backward.dot", jit::graph_dot(bwd_inputs, grads, highlight, tag + " backward"));
    }
    if (jit::log_enabled("recompiles"))
      jit::log_line("recompiles", "compile(" + opt_.name + "): partitioned: forward saves " +
                                      std::to_string(part.saved.size()) + " values (" + std::to_string(part.saved_bytes) +
                                      " bytes; saving everything: " + std::to_string(part.save_all_bytes) +
                                      "), backward recomputes " + std::to_string(part.recomputed) + " ops");
  }
  e->fwd = std::make_shared<Program>(inputs, outputs, G.symbol_names);
  if (!jit::dump_dir().empty())
    jit::dump_file(tag + "_forward.dot", jit::graph_dot(inputs, outputs, highlight, tag + " forward"));
  if (jit::log_enabled("guards")) jit::log_line("guards", "compile(" + opt_.name + ") entry " + tag + ":\n" + G.str());
  return e;
}

std::vector<Value> CompiledCore::replay(Entry& e, const std::vector<Value>& args, const std::vector<int64_t>& syms,
                                        std::vector<int64_t>& out_spec) {
  // Inputs: tensor arguments, then captured tensors read now (pending ones computed first).
  std::vector<Node*> raw;
  raw.reserve(e.num_tensor_args + e.guards.captured.size());
  std::vector<NodePtr> pending;
  auto add = [&](const NodePtr& n) {
    raw.push_back(n.get());
    if (!n->materialized()) pending.push_back(n);
  };
  for (const auto& a : args)
    if (const Tensor* t = as_tensor(a)) add(t->node());
  for (const auto& c : e.guards.captured) {
    auto impl = c.impl.lock();
    TensorImpl* src = c.grad_of ? impl->grad.get() : impl.get();
    add(src->node());
  }
  if (!pending.empty()) materialize(pending);
  std::vector<Tensor> outs = e.fwd->run(raw, syms);
  // Results.
  std::vector<Value> results = e.results;
  for (size_t r = 0; r < results.size(); ++r)
    if (e.result_tensor[r] >= 0) results[r] = outs[e.result_tensor[r]];
  size_t o = 0;
  for (size_t r = 0; r < e.result_tensor.size(); ++r) o += e.result_tensor[r] >= 0;
  // Side effects, exactly as eager mode leaves them.
  for (int k : e.cap_written) {
    auto impl = e.guards.captured[k].impl.lock();
    if (e.guards.captured[k].grad_of) impl = impl->grad;
    impl->node_ = outs[o++].node();
    impl->version++;
  }
  for (int k : e.cap_grad) {
    auto impl = e.guards.captured[k].impl.lock();
    Tensor g = outs[o++];
    g.impl()->requires_grad = false;
    impl->grad = g.impl();
  }
  for (int k : e.cap_grad_cleared) e.guards.captured[k].impl.lock()->grad = nullptr;
  for (int i : e.arg_written) {
    NoGradGuard ng;
    Tensor target = *as_tensor(args[i]);
    target.assign_(outs[o++]);
  }
  if (e.bwd) {
    auto node = std::make_shared<CompiledGrad>();
    node->bwd = e.bwd;
    node->syms = syms;
    node->saved.assign(outs.begin() + static_cast<long>(e.saved_begin),
                       outs.begin() + static_cast<long>(e.saved_begin + e.saved_count));
    node->slot = e.grad_slot;
    node->out_dtype = e.diff_dtype;
    node->fn_name = opt_.name;
    for (int i : e.diff_args) node->next.push_back(grad_edge(*as_tensor(args[i])));
    for (int k : e.diff_caps) node->next.push_back(grad_edge(Tensor(e.guards.captured[k].impl.lock())));
    Tensor& out = std::get<Tensor>(results[e.diff_result]);
    out.impl()->requires_grad = true;
    out.impl()->grad_fn = node;
  }
  out_spec = e.out_spec;
  return results;
}

std::shared_ptr<CompiledCore> make_compiled_core(CompileOptions options) {
  KILN_CHECK(options.recompile_limit >= 1, "compile: recompile_limit must be at least 1, got ", options.recompile_limit);
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
