// The JIT executor: schedules each segment, runs fused kernels from the code cache over TBB,
// and hands library/reference ops to the interpreter's kernels. Installed as the default
// executor unless KILN_JIT=interp.

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <tuple>
#include <map>
#include <set>
#include <unordered_map>

#include "jit/compile/pattern_matcher.h"
#include "jit/exec/code_cache.h"
#include "kernels/cpu/node_operand.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/reference.h"
#include "jit/diag/diagnostics.h"
#include "jit/diag/profile.h"
#include "jit/exec/executor.h"
#include "jit/exec/tiering.h"
#include "jit/graph/passes.h"
#include "jit/loop/compose.h"
#include "jit/graph/scheduler.h"
#include "runtime/core/error.h"
#include "runtime/exec/device_runtime.h"
#include "runtime/exec/executor.h"
#include "runtime/tensor/trace.h"

namespace kiln::jit {
namespace {

int64_t eval_index(const Kernel& k, ExprId id, const std::vector<int64_t>& ip) {
  const Expr& e = k.exprs[id];
  auto a = [&] { return eval_index(k, e.a, ip); };
  auto b = [&] { return eval_index(k, e.b, ip); };
  switch (e.kind) {
    case Expr::Kind::IConst: return e.i;
    case Expr::Kind::Param: return ip[e.i];
    case Expr::Kind::IAdd: return a() + b();
    case Expr::Kind::ISub: return a() - b();
    case Expr::Kind::IMul: return a() * b();
    case Expr::Kind::IDiv: return a() / b();
    case Expr::Kind::IMod: return a() % b();
    case Expr::Kind::IMin: return std::min(a(), b());
    default: throw Error("jit: parallel extent is not an index expression");
  }
}

struct Binding {
  std::vector<char*> buffers;
  BoundArgs args;
  std::vector<std::shared_ptr<Storage>> out_storage;
  std::vector<std::vector<char>> partials;               // scratch on the host
  std::vector<std::shared_ptr<Storage>> device_partials;  // scratch on a device
};

// Fills `bd` (cleared first, capacity kept) for group `g` whose canonical inputs are `ins`.
void bind_kernel(Binding& bd, const Group& g, const Lowered& L, const std::vector<Node*>& ins) {
  bd.buffers.clear();
  bd.out_storage.clear();
  bd.partials.clear();
  bd.device_partials.clear();
  for (Node* in : ins)
    bd.buffers.push_back(static_cast<char*>(in->storage->data) + in->offset.as_int() * static_cast<int64_t>(itemsize(in->dtype)));
  for (Node* o : g.outputs) {
    int64_t n = numel(o->shape).as_int();
    auto s = Storage::allocate(static_cast<size_t>(n) * itemsize(o->dtype), o->device);
    bd.buffers.push_back(static_cast<char*>(s->data));
    bd.out_storage.push_back(std::move(s));
  }
  bind_args(L, g, ins, bd.args);
  const Kernel& k = L.kernel;
  // Scratch after the outputs: per-chunk partials (split), per-kept-element accumulators (column).
  const int64_t scratch = bd.args.scratch;
  const Device dev = g.outputs.empty() ? cpu() : g.outputs[0]->device;
  for (size_t b = bd.buffers.size(); b < k.buffers.size(); ++b) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(scratch, 1)) * 8;
    if (dev.type == DeviceType::CPU) {
      bd.partials.emplace_back(bytes);
      bd.buffers.push_back(bd.partials.back().data());
    } else {
      bd.device_partials.push_back(Storage::allocate(bytes, dev));
      bd.buffers.push_back(static_cast<char*>(bd.device_partials.back()->data));
    }
  }
}


// Combines per-chunk partials of a split reduction into its output (on the host): per kept
// element (split column reductions: partials at chunk * columns + element), in chunk order.
void combine(const Lowered& L, const Kernel& k, Binding& bd, const Group& g) {
  size_t pb = static_cast<size_t>(L.num_inputs + L.num_outputs), part = 0;
  const int64_t columns = L.split_columns ? bd.args.columns : 1;
  for (size_t oi = 0; oi < g.outputs.size(); ++oi) {
    const Node* o = g.outputs[oi];
    if (classify(*o) != NodeClass::Reduction) continue;
    OpKind op = o->op;
    const DType pdt = k.buffers[pb].dtype;  // float64/int64 accumulators; max/min keep a float32 input's type
    bool fl = is_floating(pdt);
    const char* vals = bd.partials[part].data();
    const int64_t* idxs = nullptr;
    if (op == OpKind::ArgMax || op == OpKind::ArgMin) idxs = reinterpret_cast<const int64_t*>(bd.partials[part + 1].data());
    for (int64_t col = 0; col < columns; ++col) {
      double dacc = op == OpKind::Prod ? 1 : 0;
      int64_t iacc = op == OpKind::Prod ? 1 : 0;
      int64_t best = -1;
      bool first = true;
      for (int64_t c = 0; c < bd.args.chunks; ++c) {
        const int64_t at = c * columns + col;
        double dv = !fl ? 0
                    : pdt == DType::Float32 ? static_cast<double>(reinterpret_cast<const float*>(vals)[at])
                                            : reinterpret_cast<const double*>(vals)[at];
        int64_t iv = fl ? 0 : reinterpret_cast<const int64_t*>(vals)[at];
        switch (op) {
          case OpKind::Sum: dacc += dv; iacc += iv; break;
          case OpKind::Prod: dacc *= dv; iacc *= iv; break;
          case OpKind::Amax: case OpKind::Amin: {
            bool mx = op == OpKind::Amax;
            if (first) { dacc = dv; iacc = iv; }
            else if (fl) {
              if (!std::isnan(dacc) && (std::isnan(dv) || (mx ? dv > dacc : dv < dacc))) dacc = dv;
            } else if (mx ? iv > iacc : iv < iacc) iacc = iv;
            break;
          }
          default: {  // arg reductions: partial index -1 means an empty chunk
            if (idxs[at] < 0) break;
            bool mx = op == OpKind::ArgMax;
            bool better = best < 0 || (fl ? (!std::isnan(dacc) && (std::isnan(dv) || (mx ? dv > dacc : dv < dacc)))
                                          : (mx ? iv > iacc : iv < iacc));
            if (better) { dacc = dv; iacc = iv; best = idxs[at]; }
          }
        }
        first = false;
      }
      void* out = bd.out_storage[oi]->data;
      if (op == OpKind::ArgMax || op == OpKind::ArgMin) {
        static_cast<int64_t*>(out)[col] = std::max<int64_t>(best, 0);
      } else {
        dispatch_dtype(o->dtype, [&](auto tag) {
          using T = decltype(tag);
          T* to = static_cast<T*>(out) + col;
          if constexpr (std::is_same_v<T, bool>) *to = fl ? dacc != 0 : iacc != 0;
          else if constexpr (std::is_integral_v<T>) *to = static_cast<T>(fl ? static_cast<int64_t>(dacc) : iacc);  // exact above 2^53
          else *to = static_cast<T>(static_cast<compute_t<T>>(fl ? dacc : static_cast<double>(iacc)));
        });
      }
    }
    part += (op == OpKind::ArgMax || op == OpKind::ArgMin) ? 2 : 1;
    pb += (op == OpKind::ArgMax || op == OpKind::ArgMin) ? 2 : 1;
  }
}

// The combine kernel of a split reduction's partials on `device` (op, partial and output
// dtypes, per column or whole): from the code cache (memory and disk), memoized here by its
// parameters, since it is looked up at every launch.
const Code& combine_code(DeviceType device, OpKind op, DType pdt, DType dtype, bool columns) {
  static std::mutex mu;
  static std::map<std::tuple<DeviceType, OpKind, DType, DType, bool>, std::shared_ptr<CompiledKernel>> codes;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = codes.find({device, op, pdt, dtype, columns});
    if (it != codes.end()) return launch_code(*it->second);
  }
  std::shared_ptr<CompiledKernel> c = get_built_kernel(combine_kernel(op, pdt, dtype, columns), device);
  std::lock_guard<std::mutex> lock(mu);
  return launch_code(*codes.emplace(std::make_tuple(device, op, pdt, dtype, columns), std::move(c)).first->second);
}

// The combine kernels `ck`'s partials need on `device`, compiled now (while the plan is made).
void prepare_combines(const CompiledKernel& ck, const Group& g, DeviceType device) {
  const Lowered& L = *ck.lowered;
  if (!L.split || device == DeviceType::CPU) return;
  size_t pb = static_cast<size_t>(L.num_inputs + L.num_outputs);
  for (const Node* o : g.outputs) {
    if (classify(*o) != NodeClass::Reduction) continue;
    combine_code(device, o->op, L.kernel.buffers[pb].dtype, o->dtype, L.split_columns);
    pb += o->op == OpKind::ArgMax || o->op == OpKind::ArgMin ? 2 : 1;
  }
}

// The second stage of a split reduction whose partials stay on a device: a combine kernel per
// reduction output, queued after the first stage.
void combine_on_device(const Lowered& L, const Kernel& k, Binding& bd, const Group& g, DeviceType device) {
  size_t pb = static_cast<size_t>(L.num_inputs + L.num_outputs), part = 0;
  for (size_t oi = 0; oi < g.outputs.size(); ++oi) {
    const Node* o = g.outputs[oi];
    if (classify(*o) != NodeClass::Reduction) continue;
    const bool arg = o->op == OpKind::ArgMax || o->op == OpKind::ArgMin;
    const DType pdt = k.buffers[pb].dtype;
    const Code& code = combine_code(device, o->op, pdt, o->dtype, L.split_columns);
    char* bufs[3] = {static_cast<char*>(bd.device_partials[part]->data), nullptr, nullptr};
    if (arg) bufs[1] = static_cast<char*>(bd.device_partials[part + 1]->data);
    bufs[arg ? 2 : 1] = static_cast<char*>(bd.out_storage[oi]->data);
    const int64_t params[2] = {bd.args.chunks, bd.args.columns};
    Launch l;
    l.extent = L.split_columns ? bd.args.columns : 1;
    l.work = params[0] * params[1];
    l.buffers = bufs;
    l.iparams = params;
    code.backend->launch(code, l);
    part += arg ? 2 : 1;
    pb += arg ? 2 : 1;
  }
}

// Gives a view (and the views it is built on) the storage of its computed root.
void materialize_view(Node* v) {
  std::vector<Node*> chain;
  for (Node* n = v; n && !n->materialized() && is_view_op(n->op); n = n->inputs.empty() ? nullptr : n->inputs[0].get())
    chain.push_back(n);
  for (size_t i = chain.size(); i-- > 0;) interpret_node(*chain[i]);
}

void interpret_group(const Group& g) {
  for (Node* n : g.nodes) {
    for (auto& in : n->inputs) materialize_view(in.get());
    interpret_node(*n);
  }
}

// The compiled kernel for a group, or null after logging (once per key) why there is none.
std::shared_ptr<CompiledKernel> kernel_or_null(const Group& g, const std::string& key, DeviceType device) {
  try {
    return get_kernel(key, g, device);
  } catch (const std::exception& e) {
    static std::mutex mu;
    static std::set<std::string> told;
    std::lock_guard<std::mutex> lock(mu);
    if (told.insert(key).second)
      log_line("jit", std::string("could not compile a kernel (") + e.what() + "); running it on the interpreter");
    return nullptr;
  }
}

// The launch of a bound kernel over `extent` parallel indices.
Launch launch_of(const Binding& bd, int64_t extent, int64_t work = 0) {
  Launch l;
  l.extent = extent;
  l.work = work;
  l.buffers = bd.buffers.data();
  l.iparams = bd.args.ip.data();
  l.fparams = bd.args.fp.data();
  return l;
}

// Runs a kernel step; `ins` are the group's canonical inputs, `work` its domain's size.
void run_kernel(const Group& g, const std::shared_ptr<CompiledKernel>& ck, const std::vector<Node*>& ins,
                Binding& bd, int64_t work) {
  if (!ck) {
    interpret_group(g);
    return;
  }
  const Lowered& L = *ck->lowered;
  const Kernel& k = L.kernel;
  bind_kernel(bd, g, L, ins);
  int64_t extent = eval_index(k, k.parallel_extent, bd.args.ip);
  if (extent > 0) {
    const Code& code = launch_code(*ck);
    code.backend->launch(code, launch_of(bd, extent, work));
  } else if (L.split) {
    bd.args.chunks = 0;
  }
  if (L.split) {
    if (!bd.device_partials.empty()) combine_on_device(L, k, bd, g, g.outputs[0]->device.type);
    else combine(L, k, bd, g);
  }
  for (size_t i = 0; i < g.outputs.size(); ++i) g.outputs[i]->set_storage(std::move(bd.out_storage[i]), false);
}

}  // namespace

// ---- plans: the schedule of a segment structure, reused while the structure repeats ----
struct PlanStep {
  Step::Kind kind;
  int node = -1;                       // Opaque / View
  std::vector<int> nodes, outputs;     // Kernel: extended positions (segment, then folded constants)
  std::vector<int> inputs;             // Kernel: canonical inputs, positions or -(k + 1) = external k
  std::vector<int64_t> domain, reduce_dims;
  int64_t work = 1;                    // elements of the domain
  bool split = false;
  std::shared_ptr<CompiledKernel> ck;  // null: interpreter fallback
  bool epilogue = false;  // Opaque GEMM: the next (pointwise) step runs on its row blocks;
                          // device split Kernel: the next (0-d) step runs in its combine kernel
  bool fused = false;     // Kernel: run as the previous step's epilogue
  bool in_place = false;  // Opaque GEMM with an epilogue: the epilogue's one output is written over
                          // the product (nothing else reads it), element for element
  std::shared_ptr<CompiledKernel> combine;  // device split Kernel: combine + the next step's kernel
  std::vector<int> batches_after;     // horizontal kernels (Plan::batches) run right after this step
  bool batched = false;               // Kernel: runs in a horizontal kernel, not in its own slot
  std::shared_ptr<Lowered> lowered;   // batched: its own lowering (binds its arguments)
  // Opaque GEMM on a device: the next step (+ a row vector, then ReLU if `relu`) runs as the
  // GEMM's epilogue (DeviceRuntime::gemm_bias) producing position `bias_out` from `bias`.
  bool gemm_bias = false, relu = false;
  int bias = 0, bias_out = 0;
};
// Independent pointwise kernel steps run as one launch.
struct Batch {
  std::vector<int> members;  // kernel steps, in step order
  std::shared_ptr<CompiledKernel> ck;
};
struct Plan {
  std::vector<int64_t> sig;
  std::vector<Batch> batches;
  Rewrite patterns;  // registered rewrites (lazy eager), re-applied on every run before the passes
  Rewrite rw;        // graph passes on the segment `patterns` gives, re-applied on every run
  std::vector<Rewrite::Guard> guards;  // the constant values both rely on, in segment positions
  std::vector<PlanStep> steps;
};

namespace {

// Per-thread buffers of one run (a nested run on the same thread gets fresh ones).
struct RunScratch {
  std::vector<int64_t> sig;
  std::vector<Node*> externals, ext, ins;
  std::vector<Node*> patterned_ext;  // the segment's nodes and the made ones (Plan::patterns)
  Segment patterned;
  std::unordered_map<const Node*, int> extern_ids;  // only for segments with many external inputs
  Group group;
  Binding binding;
  // Horizontal kernels: each member's binding, and the arguments of the one launch.
  std::vector<Binding> members;
  std::vector<char*> batch_buffers;
  std::vector<int64_t> batch_ip;
  std::vector<double> batch_fp;
  std::vector<Node*> batch_outputs;
  bool busy = false;
};

// Exact structure of a segment: ops, dtypes, sizes, attributes, wiring, which nodes are
// needed, and the layout class of every stored input. Equal signatures schedule identically.
// Sets every node's `pos`; `externals` receives the stored inputs in first-use order.
void signature(const Segment& seg, RunScratch& sc) {
  std::vector<int64_t>& s = sc.sig;
  std::vector<Node*>& externals = sc.externals;
  s.clear();
  externals.clear();
  sc.extern_ids.clear();
  const size_t N = seg.nodes.size();
  s.push_back(static_cast<int64_t>(patterns_generation()));  // (registered rewrites change plans)
  if (N && seg.nodes[0]->device.type != DeviceType::CPU)  // a device's plans are its own
    s.push_back(-1000 - static_cast<int64_t>(seg.nodes[0]->device.type) * 64 - seg.nodes[0]->device.index);
  for (size_t i = 0; i < N; ++i) seg.nodes[i]->pos = static_cast<int32_t>(i);
  for (size_t i = 0; i < N; ++i) {
    const Node* n = seg.nodes[i];
    s.push_back(static_cast<int64_t>(n->op) << 8 | static_cast<int64_t>(n->dtype) << 1 | (seg.needed[i] ? 1 : 0));
    s.push_back(static_cast<int64_t>(n->shape.size()));
    for (const auto& d : n->shape) s.push_back(d.as_int());
    s.push_back(static_cast<int64_t>(n->attrs.ints.size()));
    for (int64_t v : n->attrs.ints) s.push_back(v);
    if (n->op == OpKind::View || n->op == OpKind::AsStrided)
      for (const auto& d : n->strides) s.push_back(d.as_int());
    s.push_back(static_cast<int64_t>(n->inputs.size()));
    for (const auto& inp : n->inputs) {
      Node* in = inp.get();
      int32_t p = in->pos;
      if (!in->materialized() && p >= 0 && static_cast<size_t>(p) < N && seg.nodes[p] == in) {
        s.push_back(p);
        continue;
      }
      int id = 0;
      if (externals.size() < 32) {
        for (size_t k = 0; k < externals.size() && !id; ++k)
          if (externals[k] == in) id = static_cast<int>(k) + 1;
      } else {
        if (sc.extern_ids.empty())
          for (size_t k = 0; k < externals.size(); ++k) sc.extern_ids.emplace(externals[k], static_cast<int>(k) + 1);
        auto it = sc.extern_ids.find(in);
        if (it != sc.extern_ids.end()) id = it->second;
      }
      if (id) {
        s.push_back(-id);
        continue;
      }
      externals.push_back(in);
      if (!sc.extern_ids.empty()) sc.extern_ids.emplace(in, static_cast<int>(externals.size()));
      s.push_back(-static_cast<int64_t>(externals.size()));
      s.push_back(static_cast<int64_t>(in->dtype) << 8 | static_cast<int64_t>(in->shape.size()) << 1 |
                  (is_contiguous_layout(in->shape, in->strides) ? 1 : 0));
      for (size_t d = 0; d < in->shape.size(); ++d) {
        int64_t sz = in->shape[d].as_int(), st = in->strides[d].as_int();
        s.push_back(sz);
        // The stride itself (a size-1 dim's does not matter): kernels take small ones as
        // constants (jit/loop/lower.cpp), so a class (0, 1, general) is not enough.
        s.push_back(sz == 1 ? 0 : st);
      }
    }
  }
}

uint64_t hash_sig(const std::vector<int64_t>& s) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : s) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
  return h;
}

std::mutex g_plan_mu;
std::unordered_map<uint64_t, std::vector<std::shared_ptr<const Plan>>> g_plans;
constexpr size_t kMaxPlans = 4096;

bool passes_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_PASSES");
    return !(v && std::string(v) == "off");
  }();
  return on;
}

// Whether every reduction kernel of `steps` reduces rows (the last dim) kept in the target's
// row cache.
bool row_cached(const std::vector<Step>& steps, const Target& t) {
  for (const Step& st : steps) {
    const Group& g = st.group;
    if (st.kind != Step::Kind::Kernel || g.reduce_dims.empty()) continue;
    const bool rows = std::find(g.reduce_dims.begin(), g.reduce_dims.end(), static_cast<int64_t>(g.domain.size()) - 1) !=
                      g.reduce_dims.end();
    if (!rows || !row_cache_fits(g, t)) return false;
  }
  return true;
}

// Bytes the kernel steps of a schedule read and write (each canonical input once per kernel).
double kernel_traffic(const std::vector<Step>& steps) {
  auto bytes = [](const Node* n) {
    double e = static_cast<double>(itemsize(n->dtype));
    for (const auto& d : n->shape) e *= static_cast<double>(d.maybe_int().value_or(1));
    return e;
  };
  double total = 0;
  for (const Step& st : steps) {
    if (st.kind != Step::Kind::Kernel) continue;
    for (const Node* n : canonical_inputs(st.group)) total += bytes(n);
    for (const Node* n : st.group.outputs) total += bytes(n);
  }
  return total;
}

// Most kernels in one horizontal kernel, and most arguments (buffers and params: a CUDA
// kernel's parameters must fit in 4 KiB).
constexpr size_t kMaxBatch = 32;
constexpr int kMaxBatchArgs = 448;

// Pointwise kernel steps that may run in a horizontal kernel: compiled last (alone, or only as
// part of one), when the segment has two or more. Steps that a GEMM or a split reduction may
// take as its epilogue are compiled with the others.
std::vector<bool> horizontal_candidates(const std::vector<Step>& steps) {
  std::vector<bool> d(steps.size(), false);
  size_t n = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    if (st.kind != Step::Kind::Kernel || !st.group.reduce_dims.empty() || st.group.split) continue;
    if (i > 0 && ((steps[i - 1].kind == Step::Kind::Opaque && steps[i - 1].node->op == OpKind::Matmul) ||
                  (steps[i - 1].kind == Step::Kind::Kernel && steps[i - 1].group.split)))
      continue;
    d[i] = true;
    ++n;
  }
  if (n < 2) d.assign(steps.size(), false);
  return d;
}

// Horizontal kernels: independent pointwise kernel steps of different domains (an optimizer's
// update of each parameter) run as one launch. Each candidate (`deferred`) may run anywhere
// after the steps producing what it reads and before the first step reading what it writes;
// a candidate whose output another candidate reads stays in place. Each batch runs at the
// latest point its members allow (fewest batches: greedy by deadline). Candidates that join
// no batch are compiled alone.
void batch_horizontal(Plan& plan, const std::vector<Step>& steps, const std::vector<bool>& deferred, const Target& tgt,
                      DeviceType device) {
  const int N = static_cast<int>(steps.size());
  auto args = [](const Kernel& k) { return static_cast<int>(k.buffers.size()) + k.num_params + k.num_fparams; };
  // Where each stored value is computed, and what each step reads (view chains walked to their
  // stored roots). A step run as the previous one's epilogue reads at that step.
  std::unordered_map<const Node*, int> producer;
  for (int i = 0; i < N; ++i) {
    if (steps[i].kind == Step::Kind::Kernel)
      for (const Node* o : steps[i].group.outputs) producer[o] = i;
    else
      producer[steps[i].node] = i;
  }
  auto for_each_read = [&](int i, const auto& f) {
    std::vector<Node*> ins;
    if (steps[i].kind == Step::Kind::Kernel) ins = canonical_inputs(steps[i].group);
    else for (const auto& in : steps[i].node->inputs) ins.push_back(in.get());
    for (const Node* in : ins)
      for (const Node* v = in;; v = v->inputs[0].get()) {
        auto it = producer.find(v);
        if (it != producer.end() && it->second != i) f(it->second);
        if (!is_view_op(v->op) || v->inputs.empty()) break;
      }
  };
  std::vector<std::shared_ptr<Lowered>> lowered(steps.size());
  std::vector<bool> cand(steps.size(), false);
  for (int j = 0; j < N; ++j) {
    if (!deferred[j]) continue;
    try {
      lowered[j] = lower(steps[j].group, tgt);
    } catch (const std::exception&) {
    }  // (compiled alone below, where the error is handled)
    cand[j] = lowered[j] && horizontal_member(*lowered[j]);
  }
  for (int j = 0; j < N; ++j)  // a candidate another candidate reads stays in place
    if (deferred[j]) for_each_read(j, [&](int p) { cand[p] = false; });
  // Window of each candidate: it may run right after step t for lo <= t <= hi.
  std::vector<int> lo(steps.size(), -1), hi(steps.size(), N - 1);
  for (int i = 0; i < N; ++i) {
    const int at = plan.steps[i].fused ? i - 1 : i;
    for_each_read(i, [&](int p) {
      if (cand[i]) lo[i] = std::max(lo[i], p);
      if (cand[p]) hi[p] = std::min(hi[p], at - 1);
    });
  }
  std::vector<int> order;
  for (int j = 0; j < N; ++j)
    if (cand[j]) order.push_back(j);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return hi[a] < hi[b]; });
  std::vector<bool> taken(steps.size(), false), alone = deferred;
  for (size_t k = 0; k < order.size(); ++k) {
    const int first = order[k];
    if (taken[first]) continue;
    const int t = hi[first];
    std::vector<int> members{first};
    int a = args(lowered[first]->kernel);
    taken[first] = true;
    for (size_t m = k + 1; m < order.size() && members.size() < kMaxBatch; ++m) {
      const int j = order[m];
      const int aj = args(lowered[j]->kernel);
      if (taken[j] || lo[j] > t || a + aj > kMaxBatchArgs) continue;
      members.push_back(j);
      a += aj;
      taken[j] = true;
    }
    if (members.size() < 2) continue;
    std::sort(members.begin(), members.end());
    std::vector<const Kernel*> ks;
    for (int j : members) ks.push_back(&lowered[j]->kernel);
    Batch b;
    try {
      b.ck = get_built_kernel(horizontal_kernel(ks), device);
    } catch (const std::exception& ex) {
      log_line("jit", std::string("horizontal kernel not built (") + ex.what() + "); running its kernels apart");
      continue;
    }
    std::string list;
    for (int j : members) {
      plan.steps[j].batched = true;
      plan.steps[j].lowered = lowered[j];
      alone[j] = false;
      list += (list.empty() ? "" : ", ") + std::to_string(j);
    }
    b.members = std::move(members);
    plan.steps[t].batches_after.push_back(static_cast<int>(plan.batches.size()));
    plan.batches.push_back(std::move(b));
    if (log_enabled("fusion"))
      log_line("fusion", "steps " + list + " (independent pointwise kernels) run as one horizontal kernel after step " + std::to_string(t));
  }
  for (int j = 0; j < N; ++j) {
    if (!alone[j]) continue;
    const std::string key = group_key(steps[j].group, tgt);
    plan.steps[j].ck = kernel_or_null(steps[j].group, key, device);
  }
}

// The segment a plan's passes and schedule see: `seg` with the registered rewrites' replacements
// made and their readers relinked (Plan::patterns), or `seg` itself.
Segment& patterned(const Plan& plan, Segment& seg, RunScratch& sc) {
  if (plan.patterns.identity) return seg;
  apply_rewrite(plan.patterns, seg, sc.patterned_ext, seg.keep_alive);
  // A replacement's random op (sdpa's dropout words) draws fresh numbers on every run, as the
  // op it replaced did when it was recorded.
  for (size_t j = 0; j < plan.patterns.made.size(); ++j)
    if (plan.patterns.made[j].random) {
      Node& r = *sc.patterned_ext[seg.nodes.size() + j];
      std::tie(r.attrs.seed, r.attrs.counter) = detail::rng_reserve(static_cast<uint64_t>(numel(r.shape).as_int()));
    }
  sc.patterned.nodes.clear();
  for (int p : plan.patterns.order) sc.patterned.nodes.push_back(sc.patterned_ext[static_cast<size_t>(p)]);
  sc.patterned.needed = plan.patterns.needed;
  return sc.patterned;
}

// Both rewrites of a plan applied to `seg`: sc.ext holds the node of every position.
void apply_rewrites(const Plan& plan, Segment& seg, RunScratch& sc) {
  Segment& base = patterned(plan, seg, sc);
  if (plan.rw.identity) sc.ext.assign(base.nodes.begin(), base.nodes.end());
  else apply_rewrite(plan.rw, base, sc.ext, seg.keep_alive);
}

// Runs the registered rewrites and the graph passes on `seg` (applying their rewrites: `sc.ext`
// then names every extended position) and schedules the result.
// `passes`: run both (their rewrites are re-applied on each run of the plan).
std::shared_ptr<const Plan> make_plan(Segment& seg, RunScratch& sc, bool passes = true) {
  auto plan = std::make_shared<Plan>();
  const DeviceType device = seg.nodes.empty() ? DeviceType::CPU : seg.nodes[0]->device.type;
  plan->sig = sc.sig;
  if (passes) plan->patterns = segment_patterns(seg);
  Segment& base = patterned(*plan, seg, sc);
  if (passes && passes_enabled()) plan->rw = run_passes(base);
  // Guards in the segment's positions (a constant the patterns made is the plan's own).
  plan->guards = plan->patterns.guards;
  for (const Rewrite::Guard& g : plan->rw.guards) {
    const int p = plan->patterns.identity ? g.pos : plan->patterns.order[static_cast<size_t>(g.pos)];
    if (p < static_cast<int>(seg.nodes.size())) plan->guards.push_back({p, g.f0, g.i0, g.has_i0});
  }
  Segment rewritten;
  const Segment* target = &base;
  if (plan->rw.identity) {
    sc.ext.assign(base.nodes.begin(), base.nodes.end());
  } else {
    apply_rewrite(plan->rw, base, sc.ext, seg.keep_alive);
    for (int p : plan->rw.order) rewritten.nodes.push_back(sc.ext[p]);
    rewritten.needed = plan->rw.needed;
    target = &rewritten;
  }
  std::unordered_map<const Node*, int> pos;
  for (size_t i = 0; i < sc.ext.size(); ++i) pos[sc.ext[i]] = static_cast<int>(i);
  for (size_t k = 0; k < sc.externals.size(); ++k) pos.emplace(sc.externals[k], -static_cast<int>(k) - 1);
  // Schedule; a kernel that cannot be formed around a reduction gets that reduction stored.
  std::vector<const Node*> stored;
  std::vector<Step> steps;
  std::vector<std::shared_ptr<CompiledKernel>> kernels;
  std::vector<bool> deferred;  // pointwise kernel steps compiled last, alone or as horizontal kernels
  const Target* tgt = nullptr;  // null: no JIT backend for the device (its kernels run on the interpreter)
  try {
    tgt = &target_for(device);
  } catch (const std::exception& e) {
    static std::once_flag told;
    std::call_once(told, [&] { log_line("jit", std::string(e.what()) + "; running kernels on the interpreter"); });
  }
  // Generated device kernels are loaded and launched on a device's first ordinal only; other
  // ordinals run their nodes one by one through the device runtime (library kernels, cuBLAS).
  if (tgt && device != DeviceType::CPU && seg.nodes[0]->device.index != 0) {
    static std::once_flag told;
    std::call_once(told, [&] {
      log_line("jit", "generated kernels run on " + Device{device, 0}.str() + " only; " + seg.nodes[0]->device.str() +
                          " runs its ops one by one through the device runtime");
    });
    tgt = nullptr;
  }
  ScheduleOptions opts;
  opts.half_kernels = tgt && tgt->half_kernels;
  opts.merge_row_stages = tgt && tgt->merge_row_stages;
  if (tgt && tgt->recompute_in_row_cache_only)  // a host row kernel computes a cached value once
    opts.keeps_rows = [tgt](const Group& g) {
      return g.reduce_dims.size() == 1 && g.reduce_dims[0] + 1 == static_cast<int64_t>(g.domain.size()) &&
             row_cache_fits(g, *tgt);
    };
  for (int attempt = 0;; ++attempt) {
    steps = schedule(*target, stored, opts);
    if (tgt && !tgt->store_expensive) {  // also try recomputing: keep the schedule moving fewer bytes
      ScheduleOptions recompute = opts;
      recompute.store_expensive = false;
      std::vector<Step> alt = schedule(*target, stored, recompute);
      if (kernel_traffic(alt) < kernel_traffic(steps) && (!tgt->recompute_in_row_cache_only || row_cached(alt, *tgt)))
        steps = std::move(alt);
    }
    kernels.assign(steps.size(), nullptr);
    deferred = horizontal_candidates(steps);
    // Device kernels compile in parallel (NVRTC takes 40-150 ms a kernel): the code cache is
    // filled for every kernel step at once, and the loop below finds them (and their errors).
    if (tgt && device != DeviceType::CPU) {
      std::vector<size_t> ks;
      for (size_t i = 0; i < steps.size(); ++i)
        if (steps[i].kind == Step::Kind::Kernel && !deferred[i]) ks.push_back(i);
      if (ks.size() > 1)
        kernels::parallel_for(0, static_cast<int64_t>(ks.size()), [&](int64_t j) {
          const Group& g = steps[ks[static_cast<size_t>(j)]].group;
          try {
            prepare_combines(*get_kernel(group_key(g, *tgt), g, device), g, device);
          } catch (const std::exception&) {
          }  // (met again below, where it is handled)
        });
    }
    bool again = false;
    for (size_t i = 0; tgt && i < steps.size(); ++i) {
      if (steps[i].kind != Step::Kind::Kernel || deferred[i]) continue;
      std::string key = group_key(steps[i].group, *tgt);
      try {
        kernels[i] = get_kernel(key, steps[i].group, device);
      } catch (const LowerError&) {
        if (opts.merge_row_stages) {  // a merged row stage the kernel cannot express: schedule without merging
          opts.merge_row_stages = false;
          again = true;
          break;
        }
        if (attempt < 3)
          for (Node* n : steps[i].group.nodes)
            if (classify(*n) == NodeClass::Reduction &&
                std::find(steps[i].group.outputs.begin(), steps[i].group.outputs.end(), n) == steps[i].group.outputs.end()) {
              stored.push_back(n);
              again = true;
            }
        if (!again) kernels[i] = kernel_or_null(steps[i].group, key, device);
      } catch (const std::exception&) {
        kernels[i] = kernel_or_null(steps[i].group, key, device);
      }
    }
    if (!again) break;
  }
  if (log_enabled("fusion")) log_line("fusion", "segment of " + std::to_string(target->nodes.size()) + " nodes:\n" + describe(steps));
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    PlanStep ps{st.kind};
    if (st.kind != Step::Kind::Kernel) {
      ps.node = pos.at(st.node);
    } else {
      for (Node* n : st.group.nodes) ps.nodes.push_back(pos.at(n));
      for (Node* n : st.group.outputs) ps.outputs.push_back(pos.at(n));
      for (Node* n : canonical_inputs(st.group)) ps.inputs.push_back(pos.at(n));
      ps.domain = concrete(st.group.domain);
      for (int64_t d : ps.domain) ps.work *= d;
      ps.reduce_dims = st.group.reduce_dims;
      ps.split = st.group.split;
      ps.ck = kernels[i];
    }
    plan->steps.push_back(std::move(ps));
  }
  // Step i is a 2-D GEMM and step i + 1 a pointwise kernel over exactly its output shape.
  auto gemm_then_pointwise = [&](size_t i) {
    if (steps[i].kind != Step::Kind::Opaque || steps[i + 1].kind != Step::Kind::Kernel) return false;
    const Node* m = steps[i].node;
    const Group& g = steps[i + 1].group;
    return m->op == OpKind::Matmul && m->shape.size() == 2 && !g.split && g.reduce_dims.empty() &&
           same_shape(g.domain, m->shape);
  };
  // Whether the product of GEMM step i is read by anything but step i + 1: another step, or
  // (needed) a tensor or node outside the segment.
  auto product_read_elsewhere = [&](size_t i) {
    const Node* m = steps[i].node;
    auto reads = [&](const Node* n) {
      for (const auto& in : n->inputs)
        if (in.get() == m) return true;
      return false;
    };
    for (size_t j = 0; j < steps.size(); ++j) {
      if (j == i + 1) continue;
      if (steps[j].kind == Step::Kind::Kernel) {
        for (const Node* n : steps[j].group.nodes)
          if (reads(n)) return true;
      } else if (reads(steps[j].node)) {
        return true;
      }
    }
    for (size_t k = 0; k < target->nodes.size(); ++k)
      if (target->nodes[k] == m && target->needed[k]) return true;
    return false;
  };
  // GEMM epilogues: a 2-D GEMM followed by a pointwise kernel over exactly its output that
  // reads it element for element runs as one step (row blocks, epilogue while in cache). When
  // the kernel has one output of the product's type and nothing else reads the product, that
  // output is written over the product (one buffer instead of two: half the memory traffic).
  for (size_t i = 0; device == DeviceType::CPU && i + 1 < steps.size(); ++i) {
    if (!gemm_then_pointwise(i) || !kernels[i + 1]) continue;
    const Node* m = steps[i].node;
    const Group& g = steps[i + 1].group;
    if (m->dtype != DType::Float32 && m->dtype != DType::Float64) continue;
    bool ok = std::find(g.nodes.begin(), g.nodes.end(), m) == g.nodes.end();
    for (const Node* n : g.nodes)
      for (const auto& in : n->inputs)
        if (in.get() == m && (is_view_op(n->op) || !same_shape(n->shape, m->shape))) ok = false;
    if (!ok) continue;
    plan->steps[i].epilogue = true;
    plan->steps[i + 1].fused = true;
    // Every value the kernel derives from the product must be read at the element it is
    // written to: elementwise nodes over the product's shape only (no views, no inline sums,
    // which read a row's other elements).
    bool in_place = g.outputs.size() == 1 && g.outputs[0]->dtype == m->dtype && same_shape(g.outputs[0]->shape, m->shape);
    std::set<const Node*> derived{m};
    for (const Node* n : g.nodes) {  // (topological order)
      bool from_m = false;
      for (const auto& in : n->inputs) from_m = from_m || derived.count(in.get()) > 0;
      if (!from_m) continue;
      derived.insert(n);
      const bool reduces = n->op == OpKind::Sum || n->op == OpKind::Prod || n->op == OpKind::Amax ||
                           n->op == OpKind::Amin || n->op == OpKind::ArgMax || n->op == OpKind::ArgMin;
      if (classify(*n) != NodeClass::Pointwise || reduces || !same_shape(n->shape, m->shape)) in_place = false;
    }
    plan->steps[i].in_place = in_place && !product_read_elsewhere(i);
    if (log_enabled("fusion"))
      log_line("fusion", "step " + std::to_string(i + 1) + " runs as the epilogue of GEMM step " + std::to_string(i) +
                             (plan->steps[i].in_place ? ", writing over the product" : ""));
  }
  // GEMM + bias (+ ReLU) on a device: a pointwise step after a 2-D float32 GEMM that only adds
  // a row vector to the product (then applies ReLU) becomes the GEMM's epilogue, when nothing
  // else reads the bare product.
  for (size_t i = 0; device != DeviceType::CPU && tgt && i + 1 < steps.size(); ++i) {
    if (!gemm_then_pointwise(i)) continue;
    const Node* m = steps[i].node;
    const Group& g = steps[i + 1].group;
    if (m->dtype != DType::Float32 || g.outputs.size() != 1) continue;
    const Node* add = nullptr;
    const Node* relu = nullptr;
    bool ok = true;
    for (const Node* n : g.nodes) {
      if (n->op == OpKind::Add && !add) add = n;
      else if (n->op == OpKind::Relu && !relu) relu = n;
      else ok = false;
    }
    if (!ok || !add || add->inputs.size() != 2 || !same_shape(add->shape, m->shape) || add->dtype != DType::Float32) continue;
    if (relu && (relu->inputs[0].get() != add || g.outputs[0] != relu)) continue;
    if (!relu && g.outputs[0] != add) continue;
    const int mi = add->inputs[0].get() == m ? 0 : add->inputs[1].get() == m ? 1 : -1;
    if (mi < 0) continue;
    const Node* bias = add->inputs[1 - mi].get();
    if (bias->dtype != DType::Float32 || bias->shape.empty() || !same_shape({bias->shape.back()}, {m->shape[1]})) continue;
    // The bare product must have no other reader, in this segment or after it.
    if (product_read_elsewhere(i) || !pos.count(bias)) continue;
    PlanStep& ps = plan->steps[i];
    ps.gemm_bias = true;
    ps.relu = relu != nullptr;
    ps.bias = pos.at(bias);
    ps.bias_out = pos.at(g.outputs[0]);
    plan->steps[i + 1].fused = true;
    if (log_enabled("fusion"))
      log_line("fusion", "step " + std::to_string(i + 1) + " (+ bias" + (relu ? ", ReLU" : "") + ") runs as the epilogue of GEMM step " +
                             std::to_string(i));
  }
  // Device split reductions: a 0-d pointwise step reading the reduction (`sum() * 0.5`) runs in
  // the combine kernel of the partials, one launch instead of two.
  for (size_t i = 0; device != DeviceType::CPU && i + 1 < steps.size(); ++i) {
    if (steps[i].kind != Step::Kind::Kernel || steps[i + 1].kind != Step::Kind::Kernel || !kernels[i] || !kernels[i + 1]) continue;
    const Lowered& L = *kernels[i]->lowered;
    const Group& e = steps[i + 1].group;
    if (!L.split || L.split_columns || L.partial_ops.size() != 1 || !e.domain.empty() || !e.reduce_dims.empty()) continue;
    const OpKind op = L.partial_ops[0];
    if (op == OpKind::ArgMax || op == OpKind::ArgMin) continue;
    const Node* red = nullptr;
    for (const Node* o : steps[i].group.outputs)
      if (classify(*o) == NodeClass::Reduction) red = o;
    const std::vector<Node*> eins = canonical_inputs(e);
    const auto at = std::find(eins.begin(), eins.end(), red);
    if (!red || at == eins.end()) continue;
    const int epi_in = static_cast<int>(at - eins.begin());
    const DType pdt = L.kernel.buffers[static_cast<size_t>(L.num_inputs + L.num_outputs)].dtype;
    try {
      if (!find_backend(device, Tier::Optimizing)) continue;
      Kernel k = combine_with_epilogue(combine_kernel(op, pdt, red->dtype), kernels[i + 1]->lowered->kernel, epi_in);
      plan->steps[i].combine = get_built_kernel(k, device);
    } catch (const std::exception& ex) {
      log_line("jit", std::string("combine with epilogue not built (") + ex.what() + "); running them apart");
      continue;
    }
    plan->steps[i].epilogue = true;
    plan->steps[i + 1].fused = true;
    if (log_enabled("fusion")) log_line("fusion", "step " + std::to_string(i + 1) + " runs in the combine kernel of split step " + std::to_string(i));
  }
  if (tgt) batch_horizontal(*plan, steps, deferred, *tgt, device);
  return plan;
}

std::atomic<uint64_t> g_epilogue_runs{0}, g_epilogue_in_place_runs{0};

// Fills the scratch group (and its canonical inputs) of kernel step `s` from this run's nodes.
Group& load_group(const PlanStep& s, const std::vector<Node*>& ext, RunScratch& sc) {
  Group& g = sc.group;
  g.nodes.clear();
  g.outputs.clear();
  sc.ins.clear();
  for (int i : s.nodes) g.nodes.push_back(ext[i]);
  for (int i : s.outputs) g.outputs.push_back(ext[i]);
  for (int i : s.inputs) sc.ins.push_back(i >= 0 ? ext[i] : sc.externals[-i - 1]);
  g.domain.assign(s.domain.begin(), s.domain.end());
  g.reduce_dims = s.reduce_dims;
  g.split = s.split;
  return g;
}

// A GEMM step and its pointwise epilogue (the next step) as one: row blocks of the product,
// each followed by the epilogue kernel on the same rows. False when this run cannot (the
// kernel's parallel index does not map onto rows); the caller then runs them apart.
bool run_gemm_epilogue(const PlanStep& mm, const PlanStep& ks, const std::vector<Node*>& ext, RunScratch& sc) {
  Node* m = ext[mm.node];
  Group& g = load_group(ks, ext, sc);
  const int64_t rows = m->shape[0].as_int();
  for (auto& in : m->inputs) materialize_view(in.get());
  m->set_storage(Storage::allocate(static_cast<size_t>(numel(m->shape).as_int()) * itemsize(m->dtype), m->device), false);
  const Lowered& L = *ks.ck->lowered;
  Binding& bd = sc.binding;
  bind_kernel(bd, g, L, sc.ins);
  const int64_t extent = eval_index(L.kernel, L.kernel.parallel_extent, bd.args.ip);
  if (rows == 0 || extent <= 0 || extent % rows != 0) return false;
  const int64_t per_row = extent / rows;
  const Node* o = g.outputs[0];
  if (mm.in_place && same_shape(o->strides, m->strides) && o->offset.as_int() == 0 && m->offset.as_int() == 0) {
    bd.out_storage[0] = m->storage;  // the product's buffer, each element rewritten where it was read
    bd.buffers[sc.ins.size()] = static_cast<char*>(m->storage->data);
    g_epilogue_in_place_runs.fetch_add(1, std::memory_order_relaxed);
  }
  const Code& code = launch_code(*ks.ck);
  const Launch l = launch_of(bd, extent);
  bool done = kernels::matmul_row_blocks(kernels::operand_of(*m), kernels::operand_of(*m->inputs[0]),
                                         kernels::operand_of(*m->inputs[1]), [&](int64_t r0, int64_t r1) {
                                           code.backend->run_range(code, r0 * per_row, r1 * per_row, l);
                                         });
  if (!done) return false;
  for (size_t i = 0; i < g.outputs.size(); ++i) g.outputs[i]->set_storage(std::move(bd.out_storage[i]), false);
  g_epilogue_runs.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// A device split reduction whose 0-d tail (the next step) runs in its combine kernel: the
// first stage, then one launch combining the partials and running the tail. False when this run
// cannot (no chunks); the caller then runs them apart.
bool run_split_with_epilogue(const PlanStep& s, const PlanStep& e, const std::vector<Node*>& ext, RunScratch& sc) {
  const Group g = load_group(s, ext, sc);  // a copy: the tail's group is loaded into the scratch next
  const std::vector<Node*> ins = sc.ins;
  const Lowered& L = *s.ck->lowered;
  Binding& bd = sc.binding;
  bind_kernel(bd, g, L, ins);
  const int64_t extent = eval_index(L.kernel, L.kernel.parallel_extent, bd.args.ip);
  if (extent <= 0 || bd.device_partials.size() != 1) return false;
  const Code& code = launch_code(*s.ck);
  code.backend->launch(code, launch_of(bd, extent, s.work));
  std::shared_ptr<Storage> partials = bd.device_partials[0];
  char* red_out = nullptr;
  for (size_t i = 0; i < g.outputs.size(); ++i) {
    if (classify(*g.outputs[i]) == NodeClass::Reduction) red_out = static_cast<char*>(bd.out_storage[i]->data);
    g.outputs[i]->set_storage(std::move(bd.out_storage[i]), false);
  }
  const int64_t chunks = bd.args.chunks;
  // The tail, bound as its own kernel; its buffers follow the combine's (partials, output).
  Group& tg = load_group(e, ext, sc);
  bind_kernel(bd, tg, *e.ck->lowered, sc.ins);
  std::vector<char*> bufs = {static_cast<char*>(partials->data), red_out};
  bufs.insert(bufs.end(), bd.buffers.begin(), bd.buffers.end());
  std::vector<int64_t> ip = {chunks};
  ip.insert(ip.end(), bd.args.ip.begin(), bd.args.ip.end());
  Launch c;
  c.extent = 1;
  c.work = chunks;
  c.buffers = bufs.data();
  c.iparams = ip.data();
  c.fparams = bd.args.fp.data();
  const Code& code_c = launch_code(*s.combine);
  code_c.backend->launch(code_c, c);
  for (size_t i = 0; i < tg.outputs.size(); ++i) tg.outputs[i]->set_storage(std::move(bd.out_storage[i]), false);
  return true;
}

// A device GEMM step with its bias (+ ReLU) epilogue as one call of the device runtime. False
// when the device cannot take it this run (the two steps then run apart).
bool run_gemm_bias(const PlanStep& s, const std::vector<Node*>& ext, RunScratch& sc) {
  Node* m = ext[s.node];
  Node* bias = s.bias >= 0 ? ext[s.bias] : sc.externals[-s.bias - 1];
  Node* out = ext[s.bias_out];
  for (auto& in : m->inputs) materialize_view(in.get());
  materialize_view(bias);
  if (!bias->materialized() || !device_runtime(m->device).gemm_bias(*out, *m->inputs[0], *m->inputs[1], *bias, s.relu))
    return false;
  g_epilogue_runs.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// A horizontal kernel: each member bound as its own kernel, their arguments concatenated in
// member order, one launch over the sum of their parallel extents.
void run_horizontal(const Plan& plan, const Batch& b, const std::vector<Node*>& ext, RunScratch& sc) {
  const size_t n = b.members.size();
  if (sc.members.size() < n) sc.members.resize(n);
  std::vector<char*>& bufs = sc.batch_buffers;
  std::vector<int64_t>& ip = sc.batch_ip;
  std::vector<double>& fp = sc.batch_fp;
  std::vector<Node*>& outs = sc.batch_outputs;
  bufs.clear();
  ip.clear();
  fp.clear();
  outs.clear();
  int64_t work = 0;
  for (size_t m = 0; m < n; ++m) {
    const PlanStep& ms = plan.steps[static_cast<size_t>(b.members[m])];
    const Group& g = load_group(ms, ext, sc);
    Binding& bd = sc.members[m];
    bind_kernel(bd, g, *ms.lowered, sc.ins);
    bufs.insert(bufs.end(), bd.buffers.begin(), bd.buffers.end());
    ip.insert(ip.end(), bd.args.ip.begin(), bd.args.ip.end());
    fp.insert(fp.end(), bd.args.fp.begin(), bd.args.fp.end());
    outs.insert(outs.end(), g.outputs.begin(), g.outputs.end());
    work += ms.work;
  }
  const Kernel& k = b.ck->lowered->kernel;
  const int64_t extent = eval_index(k, k.parallel_extent, ip);
  if (extent > 0) {
    const Code& code = launch_code(*b.ck);
    Launch l;
    l.extent = extent;
    l.work = work;
    l.buffers = bufs.data();
    l.iparams = ip.data();
    l.fparams = fp.data();
    code.backend->launch(code, l);
  }
  size_t o = 0;
  for (size_t m = 0; m < n; ++m)
    for (auto& st : sc.members[m].out_storage) outs[o++]->set_storage(std::move(st), false);
}

// KILN_PROFILE's name for a step: a kernel by its ops (each once, in order) and domain; a
// library op by its op and operand shapes.
std::string profile_label(const Plan& plan, size_t si, const std::vector<Node*>& ext) {
  const PlanStep& s = plan.steps[si];
  if (s.kind == Step::Kind::Kernel) {
    std::vector<std::string> ops;
    for (int pos : s.nodes) {
      std::string o = op_name(ext[static_cast<size_t>(pos)]->op);
      if (std::find(ops.begin(), ops.end(), o) == ops.end()) ops.push_back(o);
    }
    const auto ints = [](const std::vector<int64_t>& v) {
      std::string t = "[";
      for (size_t i = 0; i < v.size(); ++i) t += (i ? "," : "") + std::to_string(v[i]);
      return t + "]";
    };
    std::string l = "kernel " + ints(s.domain);
    if (!s.reduce_dims.empty()) l += " reducing dims " + ints(s.reduce_dims);
    l += ":";
    for (size_t i = 0; i < ops.size() && i < 8; ++i) l += " " + ops[i];
    if (ops.size() > 8) l += " (+" + std::to_string(ops.size() - 8) + " ops)";
    return l;
  }
  const Node* n = ext[static_cast<size_t>(s.node)];
  std::string l = std::string(s.kind == Step::Kind::View ? "view " : "") + op_name(n->op);
  for (size_t i = 0; i < n->inputs.size(); ++i) l += (i ? " x " : " ") + shape_str(n->inputs[i]->shape);
  if (s.epilogue && si + 1 < plan.steps.size()) l += " (+ its pointwise epilogue when fused)";
  return l;
}

void execute(const Plan& plan, const Segment& seg, RunScratch& sc) {
  const std::vector<Node*>& ext = sc.ext;
  bool epilogue_done = false;
  const bool prof = profile_enabled() && !seg.nodes.empty() && seg.nodes[0]->device.type == DeviceType::CPU;
  for (size_t si = 0; si < plan.steps.size(); ++si) {
    const PlanStep& s = plan.steps[si];
    const bool skipped = s.kind == Step::Kind::Kernel && (s.batched || (s.fused && epilogue_done));
    std::optional<ProfileScope> timed;
    if (prof && !skipped) timed.emplace(true, [&] { return profile_label(plan, si, ext); });
    switch (s.kind) {
      case Step::Kind::Kernel: {
        if (s.fused && epilogue_done) {  // ran as the previous step's epilogue
          epilogue_done = false;
          break;
        }
        if (s.batched) break;  // runs in a horizontal kernel
        if (s.epilogue && s.combine && run_split_with_epilogue(s, plan.steps[si + 1], ext, sc)) {
          epilogue_done = true;
          break;
        }
        run_kernel(load_group(s, ext, sc), s.ck, sc.ins, sc.binding, s.work);
        break;
      }
      case Step::Kind::Opaque: {
        Node* n = ext[s.node];
        if (s.gemm_bias && run_gemm_bias(s, ext, sc)) {
          epilogue_done = true;
          break;
        }
        if (s.epilogue && run_gemm_epilogue(s, plan.steps[si + 1], ext, sc)) {
          epilogue_done = true;
          break;
        }
        if (s.epilogue) n->storage.reset();  // not fusable this run: compute it apart
        for (auto& in : n->inputs) materialize_view(in.get());  // views of stored data
        interpret_node(*n);
        break;
      }
      case Step::Kind::View:
        materialize_view(ext[s.node]);
        break;
    }
    timed.reset();
    for (int b : s.batches_after) {
      ProfileScope h(prof, [&] {
        return "horizontal kernel of " + std::to_string(plan.batches[static_cast<size_t>(b)].members.size()) + " pointwise steps";
      });
      run_horizontal(plan, plan.batches[static_cast<size_t>(b)], ext, sc);
    }
  }
  if (!plan.rw.identity) finish_rewrite(plan.rw, ext);
  if (!plan.patterns.identity) finish_rewrite(plan.patterns, sc.patterned_ext);
  for (size_t i = 0; i < seg.nodes.size(); ++i)
    if (seg.needed[i] && !seg.nodes[i]->materialized())
      throw Error(std::string("jit: scheduler left a needed ") + op_name(seg.nodes[i]->op) + " node uncomputed");
}

thread_local RunScratch t_scratch;
// The plans this thread ran last, most recent first (a hit takes no lock).
thread_local std::array<std::pair<uint64_t, std::shared_ptr<const Plan>>, 8> t_recent;

class JitExecutor final : public Executor {
 public:
  void run(Segment& seg) override {
    std::unique_ptr<RunScratch> own;
    RunScratch* scp = &t_scratch;
    if (scp->busy) {
      own = std::make_unique<RunScratch>();
      scp = own.get();
    }
    RunScratch& sc = *scp;
    struct Busy {
      RunScratch& s;
      explicit Busy(RunScratch& r) : s(r) { s.busy = true; }
      ~Busy() { s.busy = false; }
    } busy(sc);
    std::optional<ProfileScope> lookup;
    if (profile_enabled() && !seg.nodes.empty() && seg.nodes[0]->device.type == DeviceType::CPU)
      lookup.emplace(true, [] { return std::string("(executor: segment signature, plan lookup or planning, rewrites)"); });
    signature(seg, sc);
    uint64_t h = hash_sig(sc.sig);
    std::shared_ptr<const Plan> plan;
    for (const auto& [ch, p] : t_recent)  // this thread's recent plans: no lock
      if (ch == h && p->sig == sc.sig && guards_hold(p->guards, seg)) {
        plan = p;
        break;
      }
    if (!plan) {
      std::lock_guard<std::mutex> lock(g_plan_mu);
      auto it = g_plans.find(h);
      if (it != g_plans.end())
        for (auto& p : it->second)
          if (p->sig == sc.sig && guards_hold(p->guards, seg)) {
            plan = p;
            break;
          }
    }
    if (plan) {
      apply_rewrites(*plan, seg, sc);
    } else {
      plan = make_plan(seg, sc);
      std::lock_guard<std::mutex> lock(g_plan_mu);
      if (g_plans.size() > kMaxPlans) g_plans.clear();
      g_plans[h].push_back(plan);
    }
    if (t_recent[0].second != plan) {
      std::move_backward(t_recent.begin(), t_recent.end() - 1, t_recent.end());
      t_recent[0] = {h, plan};
    }
    lookup.reset();
    execute(*plan, seg, sc);
  }
  const char* name() const override {
    switch (jit_mode()) {
      case JitMode::Asmjit: return "asmjit";
      case JitMode::Tiered: return "tiered";
      default: return "llvm";
    }
  }
};

}  // namespace

struct PreparedSegment::Impl {
  Segment* seg;
  std::shared_ptr<const Plan> plan;  // null: the interpreter, or the parts below
  RunScratch sc;
  // Nodes on several devices: one prepared part per device and phase, run in order (the
  // passes of a per-run split would rewrite these persistent nodes).
  std::vector<DevicePart> parts;
  std::vector<std::unique_ptr<PreparedSegment>> prepared_parts;
};

PreparedSegment::PreparedSegment(Segment& seg) : impl_(std::make_unique<Impl>()) {
  impl_->seg = &seg;
  bool devices = false;
  for (Node* n : seg.nodes) devices = devices || n->device != seg.nodes[0]->device;
  if (devices) {
    impl_->parts = split_by_device(seg);
    for (DevicePart& p : impl_->parts) impl_->prepared_parts.push_back(std::make_unique<PreparedSegment>(p.seg));
    return;
  }
  if (jit_mode() == JitMode::Interp) return;
  signature(seg, impl_->sc);  // also fixes the external inputs (the same node objects every run)
  // No passes: their rewrite relinks edges on each run, and these nodes persist.
  impl_->plan = make_plan(seg, impl_->sc, false);
  impl_->sc.ext.assign(seg.nodes.begin(), seg.nodes.end());
}

PreparedSegment::~PreparedSegment() = default;

void PreparedSegment::run() {
  if (!impl_->prepared_parts.empty()) {
    for (auto& p : impl_->prepared_parts) p->run();
    return;
  }
  if (!impl_->plan) {
    interpreter()->run(*impl_->seg);
    return;
  }
  execute(*impl_->plan, *impl_->seg, impl_->sc);
}

uint64_t gemm_epilogue_runs() { return g_epilogue_runs.load(); }
uint64_t gemm_epilogue_in_place_runs() { return g_epilogue_in_place_runs.load(); }

std::shared_ptr<Executor> jit_executor() {
  static auto ex = std::make_shared<JitExecutor>();
  return ex;
}

JitMode jit_mode() {
  static const JitMode m = [] {
    const char* v = std::getenv("KILN_JIT");
    std::string s = v ? v : "";
    if (s == "interp") return JitMode::Interp;
    if (s == "llvm") return JitMode::Llvm;
    if (s == "asmjit") return JitMode::Asmjit;
    if (s.empty() || s == "tiered") return JitMode::Tiered;
    throw Error("KILN_JIT must be interp, llvm, asmjit or tiered; got '" + s + "'");
  }();
  return m;
}

namespace {
// Installs the JIT as the default executor when the library loads.
const bool g_installed = [] {
  if (jit_mode() != JitMode::Interp) {
    set_executor(jit_executor());
    set_device_executor(DeviceType::CUDA, jit_executor());  // the plan reads the segment's device
  }
  return true;
}();
}  // namespace

}  // namespace kiln::jit
