// Running a plan: kernel binding, the split-reduction combine, the step runners and execute().
#include "jit/exec/launch.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "jit/diag/diagnostics.h"
#include "jit/diag/profile.h"
#include "jit/exec/jit_executor.h"
#include "jit/loop/compose.h"
#include "kernels/cpu/node_operand.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/reference.h"
#include "runtime/core/error.h"
#include "runtime/exec/device_runtime.h"

namespace kiln::jit {
namespace {

std::atomic<uint64_t> g_written_over{0};
std::atomic<uint64_t> g_inputs_released{0};

// Gives back an external input's storage: the segment held the only references to its node
// (which dies with the segment's edges), and no step reads it after this one.
void release_input(Node& n) {
  if (!n.storage) return;
  n.storage.reset();
  g_inputs_released.fetch_add(1, std::memory_order_relaxed);
}

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

// Whether kernel `k` reads buffer `in` only at the index it stores buffer `out` at, and every
// such read comes before that store (one store of `out`, no accumulators, both in one body): `out`
// may then be written over `in`, element for element. (Every backend computes an expression once
// in its scope, at its first use in statement order.)
bool reads_where_it_writes(const Kernel& k, int in, int out) {
  if (!k.accs.empty()) return false;
  const Stmt* store = nullptr;
  const std::vector<Stmt>* body = nullptr;
  std::function<bool(const std::vector<Stmt>&)> find = [&](const std::vector<Stmt>& ss) {
    for (const Stmt& s : ss) {
      if (s.kind == Stmt::Kind::Store && s.buffer == in) return false;
      if (s.kind == Stmt::Kind::Store && s.buffer == out) {
        if (store) return false;
        store = &s;
        body = &ss;
      }
      if (!find(s.body)) return false;
    }
    return true;
  };
  if (!find(k.body) || !store) return false;
  // The expressions computed by the statements of the store's body up to the store itself.
  std::vector<char> before(k.exprs.size(), 0);
  std::function<void(ExprId)> mark = [&](ExprId e) {
    if (e < 0 || before[static_cast<size_t>(e)]) return;
    before[static_cast<size_t>(e)] = 1;
    const Expr& x = k.exprs[static_cast<size_t>(e)];
    mark(x.a);
    mark(x.b);
    mark(x.c);
  };
  for (const Stmt& s : *body) {
    if (s.kind == Stmt::Kind::Loop) return false;  // (a nested loop between: not one body)
    mark(s.index);
    mark(s.value);
    if (&s == store) break;
  }
  for (size_t e = 0; e < k.exprs.size(); ++e) {
    const Expr& x = k.exprs[e];
    if (x.kind == Expr::Kind::Load && x.i == in && (x.a != store->index || !before[e])) return false;
  }
  return true;
}

// Whether output `o` may take over input `in`'s storage: the same dtype, shape and dense layout
// from the storage's start, the storage exactly its size.
bool same_dense_block(const Node& o, const Node& in) {
  if (o.dtype != in.dtype || o.device != in.device || !in.storage || !in.offset.is_constant() ||
      in.offset.as_int() != 0 || o.shape.size() != in.shape.size())
    return false;
  for (size_t d = 0; d < o.shape.size(); ++d)
    if (o.shape[d].as_int() != in.shape[d].as_int()) return false;
  if (!is_contiguous_layout(in.shape, in.strides)) return false;
  return in.storage->nbytes == static_cast<size_t>(numel(o.shape).as_int()) * itemsize(o.dtype);
}

// The storage output `oi` of kernel step `s` writes: its donated input's (Node::write_over),
// where the step reads that input last and only where it writes the output; else fresh.
std::shared_ptr<Storage> output_storage(const Group& g, size_t oi, const Lowered& L, const std::vector<Node*>& ins,
                                        const PlanStep* s) {
  Node* o = g.outputs[oi];
  if (s && o->write_over) {
    const char* why = "the kernel does not read the old value";
    for (size_t i = 0; i < ins.size(); ++i) {
      if (ins[i] != o->write_over) continue;
      const int k = -s->inputs[i] - 1;
      if (s->inputs[i] >= 0)
        why = "the old value is not an input of the program here";
      else if (std::find(s->last_reader_of.begin(), s->last_reader_of.end(), k) == s->last_reader_of.end())
        why = "a later step (or another in the same launch) reads the old value";
      else if (!same_dense_block(*o, *ins[i]))
        why = "the old value's storage is not a dense block of the new one's size";
      else if (!reads_where_it_writes(L.kernel, static_cast<int>(i), L.num_inputs + static_cast<int>(oi)))
        why = "the kernel reads the old value away from where it writes the new one";
      else {
        g_written_over.fetch_add(1, std::memory_order_relaxed);
        return ins[i]->storage;
      }
      break;
    }
    if (log_enabled("memory"))
      log_line("memory", "updated state " + shape_str(o->shape) + " " + dtype_name(o->dtype) +
                             " computed into new memory (its old storage kept until the step ends): " + why);
  }
  return Storage::allocate(static_cast<size_t>(numel(o->shape).as_int()) * itemsize(o->dtype), o->device,
                           op_name(o->op));
}

// Fills `bd` (cleared first, capacity kept) for group `g` whose canonical inputs are `ins`
// (kernel step `s`, where known: its outputs may be written over donated inputs).
void bind_kernel(Binding& bd, const Group& g, const Lowered& L, const std::vector<Node*>& ins,
                 const PlanStep* s = nullptr) {
  bd.buffers.clear();
  bd.out_storage.clear();
  bd.partials.clear();
  bd.device_partials.clear();
  for (Node* in : ins)
    bd.buffers.push_back(static_cast<char*>(in->storage->data) +
                         in->offset.as_int() * static_cast<int64_t>(itemsize(in->dtype)));
  for (size_t oi = 0; oi < g.outputs.size(); ++oi) {
    auto st = output_storage(g, oi, L, ins, s);
    bd.buffers.push_back(static_cast<char*>(st->data));
    bd.out_storage.push_back(std::move(st));
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
      bd.device_partials.push_back(Storage::allocate(bytes, dev, "split reduction partials"));
      bd.buffers.push_back(static_cast<char*>(bd.device_partials.back()->data));
    }
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

}  // namespace

void prepare_combines(const CompiledKernel& ck, const Group& g, DeviceType device) {
  const Lowered& L = *ck.lowered;
  if (!L.split) return;
  size_t pb = static_cast<size_t>(L.num_inputs + L.num_outputs);
  for (const Node* o : g.outputs) {
    if (classify(*o) != NodeClass::Reduction) continue;
    combine_code(device, o->op, L.kernel.buffers[pb].dtype, o->dtype, L.split_columns);
    pb += is_arg_reduction(o->op) ? 2 : 1;
  }
}

namespace {

// The second stage of a split reduction, on the group's device (the host included): per
// reduction output, its combine kernel folds the per-chunk partials (per kept element for split
// columns: partials at chunk * columns + element) in chunk order into the output.
void combine_partials(const Lowered& L, Binding& bd, const Group& g) {
  const DeviceType device = g.outputs[0]->device.type;
  size_t pb = static_cast<size_t>(L.num_inputs + L.num_outputs), part = 0;
  for (size_t oi = 0; oi < g.outputs.size(); ++oi) {
    const Node* o = g.outputs[oi];
    if (classify(*o) != NodeClass::Reduction) continue;
    const bool arg = is_arg_reduction(o->op);
    const Code& code = combine_code(device, o->op, L.kernel.buffers[pb].dtype, o->dtype, L.split_columns);
    char* bufs[3] = {bd.scratch(part), arg ? bd.scratch(part + 1) : nullptr, nullptr};
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

}  // namespace

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

namespace {

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
std::atomic<uint64_t> g_interpreted_runs{0};

void run_kernel(const Group& g, const std::shared_ptr<CompiledKernel>& ck, const std::vector<Node*>& ins, Binding& bd,
                int64_t work, const PlanStep* s = nullptr) {
  if (!ck) {
    g_interpreted_runs.fetch_add(1, std::memory_order_relaxed);
    interpret_group(g);
    return;
  }
  const Lowered& L = *ck->lowered;
  const Kernel& k = L.kernel;
  bind_kernel(bd, g, L, ins, s);
  int64_t extent = eval_index(k, k.parallel_extent, bd.args.ip);
  if (extent > 0) {
    const Code& code = launch_code(*ck);
    code.backend->launch(code, launch_of(bd, extent, work));
  } else if (L.split) {
    bd.args.chunks = 0;
  }
  if (L.split) combine_partials(L, bd, g);
  for (size_t i = 0; i < g.outputs.size(); ++i) g.outputs[i]->set_storage(std::move(bd.out_storage[i]), false);
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
  m->set_storage(Storage::allocate(static_cast<size_t>(numel(m->shape).as_int()) * itemsize(m->dtype), m->device,
                                   op_name(m->op)),
                 false);
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
  bool done = kernels::matmul_row_blocks(
      kernels::operand_of(*m), kernels::operand_of(*m->inputs[0]), kernels::operand_of(*m->inputs[1]),
      [&](int64_t r0, int64_t r1) { code.backend->run_range(code, r0 * per_row, r1 * per_row, l); });
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
    bind_kernel(bd, g, *ms.lowered, sc.ins, &ms);
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
      for (size_t i = 0; i < v.size(); ++i) t.append(i ? "," : "").append(std::to_string(v[i]));
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

// Runs step `si` of `plan`; true when it also ran the next step (as its epilogue).
bool run_step(const Plan& plan, size_t si, const std::vector<Node*>& ext, RunScratch& sc) {
  const PlanStep& s = plan.steps[si];
  switch (s.kind) {
    case Step::Kind::Kernel:
      if (s.epilogue && s.combine && run_split_with_epilogue(s, plan.steps[si + 1], ext, sc)) return true;
      run_kernel(load_group(s, ext, sc), s.ck, sc.ins, sc.binding, s.work, &s);
      return false;
    case Step::Kind::Opaque: {
      if (s.gemm_bias && run_gemm_bias(s, ext, sc)) return true;
      if (s.epilogue && run_gemm_epilogue(s, plan.steps[si + 1], ext, sc)) return true;
      Node* n = ext[s.node];
      if (s.epilogue) n->storage.reset();  // not fusable this run: compute it apart
      for (auto& in : n->inputs) materialize_view(in.get());  // views of stored data
      interpret_node(*n);
      return false;
    }
    case Step::Kind::View: materialize_view(ext[s.node]); return false;
  }
  return false;
}

}  // namespace

namespace {

// Whether a segment's intermediates are released at their last reader (KILN_LIVENESS=0: kept
// until the segment ends, as before).
bool liveness_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_LIVENESS");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

}  // namespace

void execute(const Plan& plan, const Segment& seg, RunScratch& sc, bool release_inputs) {
  const std::vector<Node*>& ext = sc.ext;
  const Device device = seg.nodes.empty() ? cpu() : seg.nodes[0]->device;
  const bool prof = profile_enabled() && device.type == DeviceType::CPU;
  DeviceStepTimer device_timer(profile_enabled(), device);  // (a device's own clock)
  // (the schedule is the plan's: Plan::release_after, in segment positions)
  const bool release = liveness_enabled() && !plan.release_after.empty();
  std::vector<int> deferred;
  bool epilogue_done = false;  // the previous step also ran this one
  for (size_t si = 0; si < plan.steps.size(); ++si) {
    const PlanStep& s = plan.steps[si];
    if (s.kind == Step::Kind::Kernel && s.fused && epilogue_done) {
      epilogue_done = false;
    } else if (!(s.kind == Step::Kind::Kernel && s.batched)) {  // (batched: runs in a horizontal kernel)
      ProfileScope timed(prof, [&] { return profile_label(plan, si, ext); });
      epilogue_done = run_step(plan, si, ext, sc);
      device_timer.step([&] { return profile_label(plan, si, ext); });
    }
    for (int b : s.batches_after) {
      const Batch& batch = plan.batches[static_cast<size_t>(b)];
      auto label = [&] { return "horizontal kernel of " + std::to_string(batch.members.size()) + " pointwise steps"; };
      {
        ProfileScope h(prof, label);
        run_horizontal(plan, batch, ext, sc);
      }
      device_timer.step(label);
    }
    // (after a step that also ran the next as its epilogue, that next step's turn releases both)
    if (release) {
      deferred.insert(deferred.end(), plan.release_after[si].begin(), plan.release_after[si].end());
      if (!epilogue_done) {
        for (int pos : deferred) {
          if (pos >= 0)
            seg.nodes[static_cast<size_t>(pos)]->storage.reset();
          else if (release_inputs && sc.extern_sole(static_cast<size_t>(-pos - 1)))
            release_input(*sc.externals[static_cast<size_t>(-pos - 1)]);
        }
        deferred.clear();
      }
    }
  }
  if (!plan.rw.identity) finish_rewrite(plan.rw, ext);
  if (!plan.patterns.identity) finish_rewrite(plan.patterns, sc.patterned_ext);
  for (size_t i = 0; i < seg.nodes.size(); ++i)
    if (seg.needed[i] && !seg.nodes[i]->materialized())
      throw Error(std::string("jit: scheduler left a needed ") + op_name(seg.nodes[i]->op) + " node uncomputed");
}

uint64_t gemm_epilogue_runs() { return g_epilogue_runs.load(); }
uint64_t gemm_epilogue_in_place_runs() { return g_epilogue_in_place_runs.load(); }
uint64_t interpreted_kernel_runs() { return g_interpreted_runs.load(); }
uint64_t outputs_written_over_inputs() { return g_written_over.load(); }
uint64_t inputs_released() { return g_inputs_released.load(); }

}  // namespace kiln::jit
