// The JIT executor: schedules each segment, runs fused kernels from the code cache over TBB,
// and hands library/reference ops to the interpreter's kernels. Installed as the default
// executor unless KILN_JIT=interp.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <unordered_map>

#include "jit/code_cache.h"
#include "jit/diagnostics.h"
#include "jit/executor.h"
#include "jit/scheduler.h"
#include "runtime/error.h"
#include "runtime/executor.h"

namespace kiln::jit {
namespace {

constexpr int64_t kInlineBelow = 32768;  // elements: run on the calling thread

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
  std::vector<int64_t> ip;
  std::vector<double> fp;
  std::vector<std::shared_ptr<Storage>> out_storage;
  std::vector<std::vector<char>> partials;
  int64_t chunks = 1;
};

const Node* arg_node(const Group& g, const std::vector<Node*>& ins, int a) {
  return a >= 0 ? g.nodes[a] : ins[-a - 1];
}

Binding bind(const Group& g, const Lowered& L) {
  Binding bd;
  std::vector<Node*> ins = canonical_inputs(g);
  for (Node* in : ins)
    bd.buffers.push_back(static_cast<char*>(in->storage->data) + in->offset.as_int() * static_cast<int64_t>(itemsize(in->dtype)));
  for (Node* o : g.outputs) {
    int64_t n = numel(o->shape).as_int();
    auto s = Storage::allocate(static_cast<size_t>(n) * itemsize(o->dtype), o->device);
    bd.buffers.push_back(static_cast<char*>(s->data));
    bd.out_storage.push_back(std::move(s));
  }
  // Split reductions: chunk the rows so each chunk holds enough work.
  int64_t rows = 1, per_row = 1;
  if (L.split) {
    size_t n = g.domain.size();
    if (n == 1) rows = g.domain[0].as_int();
    else {
      for (size_t d = 0; d + 1 < n; ++d) rows *= g.domain[d].as_int();
      per_row = std::max<int64_t>(1, g.domain[n - 1].as_int());
    }
  }
  int64_t chunk = std::max<int64_t>({1, (16384 + per_row - 1) / per_row, (rows + 255) / 256});
  bd.chunks = std::max<int64_t>(1, (rows + chunk - 1) / chunk);
  for (const ArgSource& s : L.iparams) {
    int64_t v = 0;
    switch (s.kind) {
      case ArgSource::Kind::DomainSize: v = g.domain[s.a].as_int(); break;
      case ArgSource::Kind::NodeSize: v = arg_node(g, ins, s.a)->shape[s.b].as_int(); break;
      case ArgSource::Kind::InputStride: v = ins[s.a]->strides[s.b].as_int(); break;
      case ArgSource::Kind::FullValue: v = g.nodes[s.a]->attrs.ints[0]; break;
      case ArgSource::Kind::AttrF0: v = g.nodes[s.a]->attrs.ints[0]; break;
      case ArgSource::Kind::AttrF1: v = g.nodes[s.a]->attrs.ints[1]; break;
      case ArgSource::Kind::Chunks: v = bd.chunks; break;
      case ArgSource::Kind::ChunkSize: v = chunk; break;
    }
    bd.ip.push_back(v);
  }
  for (const ArgSource& s : L.fparams) {
    const Node* n = g.nodes[s.a];
    bd.fp.push_back(s.kind == ArgSource::Kind::AttrF1 ? n->attrs.f1 : n->attrs.f0);
  }
  const Kernel& k = L.kernel;
  for (size_t b = bd.buffers.size(); b < k.buffers.size(); ++b) {
    bd.partials.emplace_back(static_cast<size_t>(bd.chunks) * 8);
    bd.buffers.push_back(bd.partials.back().data());
  }
  return bd;
}

// Combines per-chunk partials of a split reduction into its output.
void combine(const Lowered& L, const Kernel& k, Binding& bd, const Group& g) {
  size_t pb = static_cast<size_t>(L.num_inputs + L.num_outputs), part = 0;
  for (size_t oi = 0; oi < g.outputs.size(); ++oi) {
    const Node* o = g.outputs[oi];
    if (classify(*o) != NodeClass::Reduction) continue;
    OpKind op = o->op;
    bool fl = k.buffers[pb].dtype == DType::Float64;
    const char* vals = bd.partials[part].data();
    const int64_t* idxs = nullptr;
    if (op == OpKind::ArgMax || op == OpKind::ArgMin) idxs = reinterpret_cast<const int64_t*>(bd.partials[part + 1].data());
    double dacc = op == OpKind::Prod ? 1 : 0;
    int64_t iacc = op == OpKind::Prod ? 1 : 0;
    int64_t best = -1;
    bool first = true;
    for (int64_t c = 0; c < bd.chunks; ++c) {
      double dv = fl ? reinterpret_cast<const double*>(vals)[c] : 0;
      int64_t iv = fl ? 0 : reinterpret_cast<const int64_t*>(vals)[c];
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
          if (idxs[c] < 0) break;
          bool mx = op == OpKind::ArgMax;
          bool better = best < 0 || (fl ? (!std::isnan(dacc) && (std::isnan(dv) || (mx ? dv > dacc : dv < dacc)))
                                        : (mx ? iv > iacc : iv < iacc));
          if (better) { dacc = dv; iacc = iv; best = idxs[c]; }
        }
      }
      first = false;
    }
    void* out = bd.out_storage[oi]->data;
    if (op == OpKind::ArgMax || op == OpKind::ArgMin) {
      *static_cast<int64_t*>(out) = std::max<int64_t>(best, 0);
    } else {
      dispatch_dtype(o->dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, bool>) *static_cast<T*>(out) = fl ? dacc != 0 : iacc != 0;
        else if constexpr (std::is_integral_v<T>) *static_cast<T*>(out) = static_cast<T>(fl ? static_cast<int64_t>(dacc) : iacc);  // exact above 2^53
        else *static_cast<T*>(out) = static_cast<T>(static_cast<compute_t<T>>(fl ? dacc : static_cast<double>(iacc)));
      });
    }
    part += (op == OpKind::ArgMax || op == OpKind::ArgMin) ? 2 : 1;
    pb += (op == OpKind::ArgMax || op == OpKind::ArgMin) ? 2 : 1;
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
std::shared_ptr<CompiledKernel> kernel_or_null(const Group& g, const std::string& key) {
  try {
    return get_kernel(key, g);
  } catch (const std::exception& e) {
    static std::mutex mu;
    static std::set<std::string> told;
    std::lock_guard<std::mutex> lock(mu);
    if (told.insert(key).second)
      log_line("jit", std::string("could not compile a kernel (") + e.what() + "); running it on the interpreter");
    return nullptr;
  }
}

void run_kernel(const Group& g, const std::shared_ptr<CompiledKernel>& ck) {
  if (!ck) {
    interpret_group(g);
    return;
  }
  const Lowered& L = *ck->lowered;
  const Kernel& k = L.kernel;
  Binding bd = bind(g, L);
  int64_t extent = eval_index(k, k.parallel_extent, bd.ip);
  int64_t work = std::max<int64_t>(1, numel(g.domain).as_int());
  KernelFn fn = launch_fn(*ck);
  if (extent > 0) {
    if (work < kInlineBelow || extent == 1) {
      fn(0, extent, bd.buffers.data(), bd.ip.data(), bd.fp.data());
    } else {
      int64_t per_index = std::max<int64_t>(1, work / extent);
      int64_t grain = std::max<int64_t>(1, 16384 / per_index);
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, extent, grain), [&](const tbb::blocked_range<int64_t>& r) {
        fn(r.begin(), r.end(), bd.buffers.data(), bd.ip.data(), bd.fp.data());
      });
    }
  } else if (L.split) {
    bd.chunks = 0;
  }
  if (L.split) combine(L, k, bd, g);
  for (size_t i = 0; i < g.outputs.size(); ++i) g.outputs[i]->set_storage(bd.out_storage[i], false);
}

}  // namespace

// ---- plans: the schedule of a segment structure, reused while the structure repeats ----
struct PlanStep {
  Step::Kind kind;
  int node = -1;                       // Opaque / View
  std::vector<int> nodes, outputs;     // Kernel: segment positions
  std::vector<int64_t> domain, reduce_dims;
  bool split = false;
  std::shared_ptr<CompiledKernel> ck;  // null: interpreter fallback
};
struct Plan {
  std::vector<int64_t> sig;
  std::vector<PlanStep> steps;
};
void run_plan(const Plan& plan, Segment& seg);

namespace {

// Exact structure of a segment: ops, dtypes, sizes, attributes, wiring, which nodes are
// needed, and the layout class of every stored input. Equal signatures schedule identically.
std::vector<int64_t> signature(const Segment& seg, std::unordered_map<const Node*, int>& pos) {
  std::vector<int64_t> s;
  s.reserve(seg.nodes.size() * 16);
  pos.reserve(seg.nodes.size() * 2);
  for (size_t i = 0; i < seg.nodes.size(); ++i) pos[seg.nodes[i]] = static_cast<int>(i);
  int externals = 0;
  for (size_t i = 0; i < seg.nodes.size(); ++i) {
    const Node* n = seg.nodes[i];
    s.push_back(static_cast<int64_t>(n->op) << 8 | static_cast<int64_t>(n->dtype) << 1 | (seg.needed[i] ? 1 : 0));
    s.push_back(static_cast<int64_t>(n->shape.size()));
    for (const auto& d : n->shape) s.push_back(d.as_int());
    s.push_back(static_cast<int64_t>(n->attrs.ints.size()));
    for (int64_t v : n->attrs.ints) s.push_back(v);
    if (n->op == OpKind::View || n->op == OpKind::AsStrided)
      for (const auto& d : n->strides) s.push_back(d.as_int());
    s.push_back(static_cast<int64_t>(n->inputs.size()));
    for (const auto& in : n->inputs) {
      auto it = pos.find(in.get());
      if (it != pos.end()) {
        s.push_back(it->second);
        continue;
      }
      pos[in.get()] = -(++externals);
      s.push_back(-externals);
      s.push_back(static_cast<int64_t>(in->dtype) << 8 | static_cast<int64_t>(in->shape.size()) << 1 |
                  (is_contiguous_layout(in->shape, in->strides) ? 1 : 0));
      for (size_t d = 0; d < in->shape.size(); ++d) {
        int64_t sz = in->shape[d].as_int(), st = in->strides[d].as_int();
        s.push_back(sz);
        s.push_back(sz == 1 ? 'u' : st == 0 ? '0' : st == 1 ? '1' : 'g');
      }
    }
  }
  return s;
}

uint64_t hash_sig(const std::vector<int64_t>& s) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : s) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
  return h;
}

std::mutex g_plan_mu;
std::unordered_map<uint64_t, std::vector<std::shared_ptr<const Plan>>> g_plans;
constexpr size_t kMaxPlans = 4096;

std::shared_ptr<const Plan> make_plan(Segment& seg, const std::unordered_map<const Node*, int>& pos,
                                      std::vector<int64_t> sig) {
  // Schedule; a kernel that cannot be formed around a reduction gets that reduction stored.
  std::vector<const Node*> stored;
  std::vector<Step> steps;
  std::vector<std::shared_ptr<CompiledKernel>> kernels;
  for (int attempt = 0;; ++attempt) {
    steps = schedule(seg, stored);
    kernels.assign(steps.size(), nullptr);
    bool again = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].kind != Step::Kind::Kernel) continue;
      std::string key = group_key(steps[i].group);
      try {
        kernels[i] = get_kernel(key, steps[i].group);
      } catch (const LowerError&) {
        if (attempt < 3)
          for (Node* n : steps[i].group.nodes)
            if (classify(*n) == NodeClass::Reduction &&
                std::find(steps[i].group.outputs.begin(), steps[i].group.outputs.end(), n) == steps[i].group.outputs.end()) {
              stored.push_back(n);
              again = true;
            }
        if (!again) kernels[i] = kernel_or_null(steps[i].group, key);
      } catch (const std::exception&) {
        kernels[i] = kernel_or_null(steps[i].group, key);
      }
    }
    if (!again) break;
  }
  if (log_enabled("fusion")) log_line("fusion", "segment of " + std::to_string(seg.nodes.size()) + " nodes:\n" + describe(steps));
  auto plan = std::make_shared<Plan>();
  plan->sig = std::move(sig);
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    PlanStep ps{st.kind};
    if (st.kind != Step::Kind::Kernel) {
      ps.node = pos.at(st.node);
    } else {
      for (Node* n : st.group.nodes) ps.nodes.push_back(pos.at(n));
      for (Node* n : st.group.outputs) ps.outputs.push_back(pos.at(n));
      ps.domain = concrete(st.group.domain);
      ps.reduce_dims = st.group.reduce_dims;
      ps.split = st.group.split;
      ps.ck = kernels[i];
    }
    plan->steps.push_back(std::move(ps));
  }
  return plan;
}

class JitExecutor final : public Executor {
 public:
  void run(Segment& seg) override {
    std::unordered_map<const Node*, int> pos;
    std::vector<int64_t> sig = signature(seg, pos);
    uint64_t h = hash_sig(sig);
    std::shared_ptr<const Plan> plan;
    {
      std::lock_guard<std::mutex> lock(g_plan_mu);
      auto it = g_plans.find(h);
      if (it != g_plans.end())
        for (auto& p : it->second)
          if (p->sig == sig) plan = p;
    }
    if (!plan) {
      plan = make_plan(seg, pos, std::move(sig));
      std::lock_guard<std::mutex> lock(g_plan_mu);
      if (g_plans.size() > kMaxPlans) g_plans.clear();
      g_plans[h].push_back(plan);
    }
    run_plan(*plan, seg);
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

void run_plan(const Plan& plan, Segment& seg) {
    for (const PlanStep& s : plan.steps) {
      switch (s.kind) {
        case Step::Kind::Kernel: {
          Group g;
          for (int i : s.nodes) g.nodes.push_back(seg.nodes[i]);
          for (int i : s.outputs) g.outputs.push_back(seg.nodes[i]);
          g.domain = make_shape(s.domain);
          g.reduce_dims = s.reduce_dims;
          g.split = s.split;
          run_kernel(g, s.ck);
          break;
        }
        case Step::Kind::Opaque: {
          Node* n = seg.nodes[s.node];
          for (auto& in : n->inputs) materialize_view(in.get());  // views of stored data
          interpret_node(*n);
          break;
        }
        case Step::Kind::View:
          materialize_view(seg.nodes[s.node]);
          break;
      }
    }
    for (size_t i = 0; i < seg.nodes.size(); ++i)
      if (seg.needed[i] && !seg.nodes[i]->materialized())
        throw Error(std::string("jit: scheduler left a needed ") + op_name(seg.nodes[i]->op) + " node uncomputed");
}

std::shared_ptr<const Plan> prepare_segment(Segment& seg) {
  if (jit_mode() == JitMode::Interp) return nullptr;
  std::unordered_map<const Node*, int> pos;
  std::vector<int64_t> sig = signature(seg, pos);
  return make_plan(seg, pos, std::move(sig));
}

void run_segment(const Plan* plan, Segment& seg) {
  if (plan) run_plan(*plan, seg);
  else interpreter()->run(seg);
}

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
  if (jit_mode() != JitMode::Interp) set_executor(jit_executor());
  return true;
}();
}  // namespace

}  // namespace kiln::jit
