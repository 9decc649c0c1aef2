// The CUDA backend (jit/cuda): driver loading, the CUDA C++ emitter, NVRTC and launches.
//
//   CudaDriver.*        runs everywhere: without a driver nothing is registered and nothing crashes.
//   CudaNvrtc.*         needs NVRTC only (no GPU): every kernel of the random graphs, lowered for
//                       sm_90, compiles; a compile error becomes a kiln::Error quoting NVRTC's log.
//   CudaDifferential.*  needs a GPU: random graphs (tests/jit_random_graphs.h) are scheduled,
//                       evaluated on the interpreter, and each kernel step is lowered for the
//                       device's target and run twice with the same arguments: on the GPU
//                       (NVRTC CUBIN, device memory) and with the LLVM tier on the host; every
//                       output and scratch buffer is compared.
//   CudaBackend.*       needs a GPU: registration, the disk-cache image round trip.
//
// Tolerances (GPU vs LLVM on the same loop IR and arguments): integers and bools exactly; NaN
// where the other has NaN; infinities equal; otherwise |gpu - cpu| <= rtol * (|cpu| + scale),
// scale the largest finite |value| of that buffer, rtol 1e-3 for float32 and 1e-9 for float64
// (1e-3 also for float64 buffers of kernels that compute float32 values: a float64 sum of
// float32 exp values differs by float32 ulps, ~1e-8 relative, as first seen on an H100).
// The two sides use different math libraries: CUDA's device functions (CUDA C++ Programming
// Guide, "Mathematical Functions": e.g. expf 2 ulp, logf 1 ulp, tanhf 2 ulp, erff 2 ulp, sinf/
// cosf 2 ulp, tanf 4 ulp, powf 4 ulp; double versions 1-2 ulp) against glibc's libmvec (<= 4
// ulp) / SLEEF (<= 1 ulp) on the CPU, so a transcendental may differ by up to ~8 ulp per op,
// amplified along the random chains (cancellation, exp of a perturbed value). Division and
// sqrt are IEEE on both sides (--prec-div/--prec-sqrt, no FMA contraction, no flush to
// zero), so chains without transcendentals agree to the last bit except for reduction order.
// The worst observed difference is printed. KILN_CUDA_GRAPHS sets the number of graphs.
#include "jit_random_graphs.h"
#include "temp_dir.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "jit/backend/backend.h"
#include "jit/backend/host_code.h"
#include "jit/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_runtime.h"
#include "runtime/cuda/driver.h"
#include "runtime/cuda/nvrtc.h"
#include "jit/cuda/emit_cuda.h"
#include "kernels/cuda/device_kernels.h"
#include "jit/exec/jit_executor.h"
#include "jit/loop/compose.h"
#include "expect_close.h"

namespace {

namespace cu = kiln::cu;
using kiln::jit::Backend;
using kiln::jit::Lowered;

#define SKIP_WITHOUT_GPU() \
  if (!cu::available()) GTEST_SKIP() << "no usable CUDA device: " << cu::unavailable_reason()
#define SKIP_WITHOUT_NVRTC() \
  if (!cu::have_nvrtc()) GTEST_SKIP() << "NVRTC (libnvrtc.so.13 / .12) not found"

int graphs() { return env_int("KILN_CUDA_GRAPHS", 240); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A random program scheduled and evaluated on the interpreter: every node holds storage, so
// each kernel step's inputs can be bound.
struct Prepared {
  std::vector<Tensor> values;
  kiln::Segment seg;
  std::vector<kiln::jit::Step> steps;
};

Prepared prepare(const Program& p) {
  kiln::set_executor(kiln::interpreter());
  Prepared r;
  r.values = replay(p);
  std::vector<Tensor> outs;
  for (int o : p.outputs) outs.push_back(r.values[o]);
  r.seg = make_segment(outs);
  kiln::jit::ScheduleOptions opts;  // the CUDA target's fusion: later row stages join their row kernel
  opts.merge_row_stages = true;
  r.steps = kiln::jit::schedule(r.seg, {}, opts);
  for (kiln::Node* n : r.seg.nodes) kiln::interpret_node(*n);
  return r;
}

int64_t eval_index(const kiln::jit::Kernel& k, kiln::jit::ExprId id, const std::vector<int64_t>& ip) {
  using K = kiln::jit::Expr::Kind;
  const kiln::jit::Expr& e = k.exprs[id];
  auto a = [&] { return eval_index(k, e.a, ip); };
  auto b = [&] { return eval_index(k, e.b, ip); };
  switch (e.kind) {
    case K::IConst: return e.i;
    case K::Param: return ip[e.i];
    case K::IAdd: return a() + b();
    case K::ISub: return a() - b();
    case K::IMul: return a() * b();
    case K::IDiv: return a() / b();
    case K::IMod: return a() % b();
    case K::IMin: return std::min(a(), b());
    default: throw kiln::Error("parallel extent is not an index expression");
  }
}

// The arguments of one kernel step (as jit/exec/executor.cpp binds them): host pointers for the
// inputs (into their storage), zeroed host memory for outputs and scratch.
struct Bound {
  std::vector<char*> host;
  std::vector<const kiln::Storage*> storage;  // inputs: their storage (copied whole to the device)
  std::vector<size_t> offset;  // inputs: byte offset of element 0 in it
  std::vector<std::vector<char>> owned;  // outputs, then scratch
  std::vector<int64_t> ip;
  std::vector<double> fp;
  int64_t extent = 0, work = 1;
};

Bound bind(const kiln::jit::Group& g, const Lowered& L) {
  Bound bd;
  std::vector<kiln::Node*> ins = kiln::jit::canonical_inputs(g);
  for (kiln::Node* in : ins) {
    size_t off = static_cast<size_t>(in->offset.as_int()) * kiln::itemsize(in->dtype);
    bd.storage.push_back(in->storage.get());
    bd.offset.push_back(off);
    bd.host.push_back(static_cast<char*>(in->storage->data) + off);
  }
  for (kiln::Node* o : g.outputs)
    bd.owned.emplace_back(
        std::max<size_t>(1, static_cast<size_t>(kiln::numel(o->shape).as_int()) * kiln::itemsize(o->dtype)));
  kiln::jit::BoundArgs args;
  kiln::jit::bind_args(L, g, ins, args);  // the executor's own binding of the argument recipe
  bd.ip = args.ip;
  bd.fp = args.fp;
  for (size_t b = ins.size() + g.outputs.size(); b < L.kernel.buffers.size(); ++b)
    bd.owned.emplace_back(static_cast<size_t>(std::max<int64_t>(args.scratch, 1)) * 8);
  for (auto& o : bd.owned) bd.host.push_back(o.data());
  for (const auto& d : g.domain) bd.work *= d.as_int();
  bd.extent = eval_index(L.kernel, L.kernel.parallel_extent, bd.ip);
  return bd;
}

kiln::jit::Launch launch_of(const Bound& bd, char* const* buffers) {
  kiln::jit::Launch l;
  l.extent = bd.extent;
  l.work = bd.work;
  l.buffers = buffers;
  l.iparams = bd.ip.data();
  l.fparams = bd.fp.data();
  return l;
}

// Device memory for one launch: inputs copied whole, outputs and scratch from `bd.owned`.
struct DeviceArgs {
  std::vector<CUdeviceptr> blocks;
  std::vector<char*> buffers;
  ~DeviceArgs() {
    cu::issue_launches(0);  // (a launch still queued may read these blocks)
    for (CUdeviceptr p : blocks) cu::api().mem_free(p);
  }
  CUdeviceptr alloc(size_t n, const void* src) {
    CUdeviceptr p = 0;
    cu::check(cu::api().mem_alloc(&p, std::max<size_t>(n, 1)), "cuMemAlloc");
    blocks.push_back(p);
    if (n) cu::check(cu::api().memcpy_htod(p, src, n), "cuMemcpyHtoD");
    return p;
  }
};

void upload(const Bound& bd, DeviceArgs& d) {
  cu::make_current(0);
  for (size_t i = 0; i < bd.storage.size(); ++i)
    d.buffers.push_back(reinterpret_cast<char*>(d.alloc(bd.storage[i]->nbytes, bd.storage[i]->data) + bd.offset[i]));
  for (const auto& o : bd.owned) d.buffers.push_back(reinterpret_cast<char*>(d.alloc(o.size(), o.data())));
}

// Copies the outputs and scratch back from the device (after the launches queued on device 0's
// stream: Backend::launch queues, its launch thread issues).
std::vector<std::vector<char>> download(const Bound& bd, const DeviceArgs& d) {
  cu::sync(0);
  std::vector<std::vector<char>> r;
  size_t first = bd.storage.size();
  for (size_t i = 0; i < bd.owned.size(); ++i) {
    r.emplace_back(bd.owned[i].size());
    cu::check(
        cu::api().memcpy_dtoh(r.back().data(), reinterpret_cast<CUdeviceptr>(d.buffers[first + i]), r.back().size()),
        "cuMemcpyDtoH");
  }
  return r;
}

struct Diff {
  int64_t elements = 0, float_elements = 0, differing = 0;
  double worst = 0;  // max |gpu - cpu| / (|cpu| + scale) over floats
  std::string worst_where;
};
Diff g_diff;

// Compares buffer contents of dtype `dt`; "" or a description of the first mismatch.
// `f32_math`: the kernel computes float32 values, so its float64 buffers (float64 accumulators
// of float32 values) carry float32-sized differences too. `reduced`: elements summed into each
// output (1 for pointwise kernels). `allow_abs + allow_rel * |cpu|`: the error bound of the
// value the buffer holds (the generator's, both sides: a layer_norm of a constant row is
// rounding noise of its mean times rsqrt(eps)), where known.
std::string compare_buffers(kiln::DType dt, const std::vector<char>& gpu, const std::vector<char>& cpu, Diff& st,
                            bool f32_math, int64_t reduced = 1, double allow_abs = 0, double allow_rel = 0) {
  std::ostringstream os;
  os.precision(17);
  auto check = [&](auto tag) -> std::string {
    using T = decltype(tag);
    const size_t n = cpu.size() / sizeof(T);
    const T* g = reinterpret_cast<const T*>(gpu.data());
    const T* c = reinterpret_cast<const T*>(cpu.data());
    st.elements += static_cast<int64_t>(n);
    if constexpr (std::is_floating_point_v<T>) {
      const double rtol = sizeof(T) == 4 || f32_math ? 1e-3 : 1e-9;
      // The graphs' inputs are of magnitude ~1: a reduction that cancels to ~0 (the sum of a
      // layer_norm's outputs) keeps an absolute rounding error up to ~n * eps of its summands
      // (summed in another order on each side), which no relative bound on the tiny result
      // covers: float64 allows 16 n eps (summands up to ~16; 25829 of them: 9e-11).
      const double atol =
          sizeof(T) == 4 || f32_math
              ? 1e-5
              : std::max(1e-12, 16.0 * static_cast<double>(reduced) * std::numeric_limits<double>::epsilon());
      double scale = 0;
      for (size_t i = 0; i < n; ++i)
        if (std::isfinite(static_cast<double>(c[i]))) scale = std::max(scale, std::abs(static_cast<double>(c[i])));
      st.float_elements += static_cast<int64_t>(n);
      for (size_t i = 0; i < n; ++i) {
        double a = g[i], b = c[i];
        if ((std::isnan(a) && std::isnan(b)) || a == b) continue;
        if (std::isfinite(a) && std::isfinite(b) && std::abs(a - b) <= atol + allow_abs + allow_rel * std::abs(b))
          continue;
        if (!std::isfinite(a) || !std::isfinite(b)) {
          os << "element " << i << ": gpu " << a << ", cpu " << b;
          return os.str();
        }
        st.differing++;
        double rel = std::abs(a - b) / (std::abs(b) + scale);
        if (rel > st.worst) {
          st.worst = rel;
          std::ostringstream w;
          w.precision(10);
          w << kiln::dtype_name(dt) << " gpu " << a << " cpu " << b;
          st.worst_where = w.str();
        }
        if (rel > rtol) {
          os << "element " << i << ": gpu " << a << ", cpu " << b << " (relative " << rel << " > " << rtol << ")";
          return os.str();
        }
      }
    } else {
      for (size_t i = 0; i < n; ++i)
        if (g[i] != c[i]) {
          os << "element " << i << ": gpu " << static_cast<int64_t>(g[i]) << ", cpu " << static_cast<int64_t>(c[i]);
          return os.str();
        }
    }
    return "";
  };
  switch (dt) {
    case kiln::DType::Bool: return check(uint8_t{});
    case kiln::DType::Int32: return check(int32_t{});
    case kiln::DType::Int64: return check(int64_t{});
    case kiln::DType::Float32: return check(float{});
    case kiln::DType::Float64: return check(double{});
    default: return std::string("unexpected buffer dtype ") + kiln::dtype_name(dt);
  }
}

std::atomic<int> g_symbols{0};
std::string fresh_symbol(const char* what) {
  return std::string("kiln_cudatest_") + what + "_" + std::to_string(g_symbols++);
}

Backend* gpu_backend() { return kiln::jit::find_backend(kiln::DeviceType::CUDA, kiln::jit::Tier::Optimizing); }
Backend* cpu_backend() { return kiln::jit::find_backend(kiln::DeviceType::CPU, kiln::jit::Tier::Optimizing); }

// Unary / binary ops seen in compiled kernels (coverage report).
void ops_of(const kiln::jit::Kernel& k, std::set<std::string>& seen) {
  for (const kiln::jit::Expr& e : k.exprs)
    if (e.kind == kiln::jit::Expr::Kind::Unary || e.kind == kiln::jit::Expr::Kind::Binary)
      seen.insert(std::string(kiln::op_name(e.op)) + ":" + kiln::dtype_name(k.exprs[e.a].dtype));
}

// ============================================================== every op

// A kernel that applies every unary and binary op the emitter handles to every dtype it takes,
// every cast, Where, the index arithmetic, Param/FParam/FConst and every accumulator kind, on
// inputs full of edge values (NaN, infinities, -0, huge, INT_MIN ...). Buffers 0-9: x and y of
// float32, float64, int32, int64, bool; 10-14: one output per result dtype (row p holds the
// results for input element p; `cols` per dtype).
struct OpsKernel {
  kiln::jit::Kernel k;
  int cols[5] = {0, 0, 0, 0, 0};
  std::vector<std::string> names[5];
  static constexpr int64_t n = 24;  // input elements
};

int dt_slot(kiln::DType t) {
  switch (t) {
    case kiln::DType::Float32: return 0;
    case kiln::DType::Float64: return 1;
    case kiln::DType::Int32: return 2;
    case kiln::DType::Int64: return 3;
    default: return 4;
  }
}
const kiln::DType kOpsTypes[5] = {kiln::DType::Float32, kiln::DType::Float64, kiln::DType::Int32, kiln::DType::Int64,
                                  kiln::DType::Bool};

OpsKernel make_ops_kernel() {
  using E = kiln::jit::Expr;
  using S = kiln::jit::Stmt;
  using O = kiln::OpKind;
  OpsKernel r;
  kiln::jit::Kernel& k = r.k;
  k.name = "every_op";
  for (int i = 0; i < 5; ++i) {
    k.buffers.push_back({kOpsTypes[i], false});
    k.buffers.push_back({kOpsTypes[i], false});
  }
  for (int i = 0; i < 5; ++i) k.buffers.push_back({kOpsTypes[i], true});
  k.num_params = 1;
  k.num_fparams = 1;
  const kiln::jit::ExprId p = k.var(0);
  std::vector<std::pair<kiln::DType, kiln::jit::ExprId>> results;
  auto push = [&](const std::string& name, kiln::DType t, kiln::jit::ExprId e) {
    r.names[dt_slot(t)].push_back(name);
    results.push_back({t, e});
  };
  auto load = [&](int buf, kiln::jit::ExprId idx) {
    E e{E::Kind::Load};
    e.dtype = k.buffers[buf].dtype;
    e.i = buf;
    e.a = idx;
    return k.add(e);
  };
  auto un = [&](O op, kiln::DType out, kiln::jit::ExprId a) {
    E e{E::Kind::Unary};
    e.dtype = out;
    e.op = op;
    e.a = a;
    return k.add(e);
  };
  auto bin = [&](O op, kiln::DType out, kiln::jit::ExprId a, kiln::jit::ExprId b) {
    E e{E::Kind::Binary};
    e.dtype = out;
    e.op = op;
    e.a = a;
    e.b = b;
    return k.add(e);
  };
  auto cast = [&](kiln::DType to, kiln::jit::ExprId a) {
    E e{E::Kind::Cast};
    e.dtype = to;
    e.a = a;
    return k.add(e);
  };
  const O unary_ops[] = {O::Neg,   O::Abs,  O::Exp,     O::Exp2,       O::Expm1,      O::Log,       O::Log2,
                         O::Log1p, O::Sqrt, O::Rsqrt,   O::Reciprocal, O::Sin,        O::Cos,       O::Tan,
                         O::Atan,  O::Tanh, O::Sigmoid, O::Relu,       O::Erf,        O::Floor,     O::Ceil,
                         O::Round, O::Sign, O::IsNan,   O::IsFinite,   O::LogicalNot, O::BitwiseNot};
  const O binary_ops[] = {O::Add,        O::Sub,        O::Mul,       O::Div,       O::Pow,        O::Maximum,
                          O::Minimum,    O::Atan2,      O::Remainder, O::Fmod,      O::Eq,         O::Ne,
                          O::Lt,         O::Le,         O::Gt,        O::Ge,        O::LogicalAnd, O::LogicalOr,
                          O::LogicalXor, O::BitwiseAnd, O::BitwiseOr, O::BitwiseXor};
  auto float_only = [](O op) {
    switch (op) {
      case O::Exp:
      case O::Exp2:
      case O::Expm1:
      case O::Log:
      case O::Log2:
      case O::Log1p:
      case O::Sqrt:
      case O::Rsqrt:
      case O::Reciprocal:
      case O::Sin:
      case O::Cos:
      case O::Tan:
      case O::Atan:
      case O::Tanh:
      case O::Sigmoid:
      case O::Erf:
      case O::Div:
      case O::Pow:
      case O::Atan2:
      case O::Remainder:
      case O::Fmod: return true;
      default: return false;
    }
  };
  auto boolean = [](O op) {
    return op == O::IsNan || op == O::IsFinite || op == O::LogicalNot || op == O::Eq || op == O::Ne || op == O::Lt ||
           op == O::Le || op == O::Gt || op == O::Ge || op == O::LogicalAnd || op == O::LogicalOr ||
           op == O::LogicalXor;
  };
  // y is read at another index: pairs of different edge values meet.
  const kiln::jit::ExprId q =
      k.iop(E::Kind::IMod, k.iop(E::Kind::IAdd, k.iop(E::Kind::IMul, p, k.iconst(7)), k.iconst(3)), k.param(0));
  for (int ti = 0; ti < 5; ++ti) {
    const kiln::DType t = kOpsTypes[ti];
    const bool fl = kiln::is_floating(t), bl = t == kiln::DType::Bool;
    const kiln::jit::ExprId x = load(2 * ti, p), y = load(2 * ti + 1, q);
    for (O op : unary_ops) {
      if (!fl && float_only(op)) continue;
      if (fl && op == O::BitwiseNot) continue;
      if (bl && !(op == O::LogicalNot || op == O::BitwiseNot || op == O::Sign || op == O::IsNan || op == O::IsFinite ||
                  op == O::Abs || op == O::Neg || op == O::Floor))
        continue;
      push(std::string(kiln::op_name(op)) + ":" + kiln::dtype_name(t), boolean(op) ? kiln::DType::Bool : t,
           un(op, boolean(op) ? kiln::DType::Bool : t, x));
    }
    for (O op : binary_ops) {
      if (!fl && float_only(op)) continue;
      if (fl && (op == O::BitwiseAnd || op == O::BitwiseOr || op == O::BitwiseXor)) continue;
      push(std::string(kiln::op_name(op)) + ":" + kiln::dtype_name(t), boolean(op) ? kiln::DType::Bool : t,
           bin(op, boolean(op) ? kiln::DType::Bool : t, x, y));
    }
    for (kiln::DType to : kOpsTypes)
      if (to != t) push(std::string("cast:") + kiln::dtype_name(t) + "->" + kiln::dtype_name(to), to, cast(to, x));
  }
  // Where, FParam, FConst (incl. -0, inf, NaN), index arithmetic.
  {
    const kiln::jit::ExprId c = load(8, p), a = load(0, p), b = load(1, q);
    E w{E::Kind::Where};
    w.dtype = kiln::DType::Float32;
    w.a = c;
    w.b = a;
    w.c = b;
    push("where:float32", kiln::DType::Float32, k.add(w));
    E fp{E::Kind::FParam};
    fp.dtype = kiln::DType::Float64;
    fp.i = 0;
    push("fparam*x:float64", kiln::DType::Float64, bin(O::Mul, kiln::DType::Float64, k.add(fp), load(2, p)));
    for (double v : {-0.0, 1.5, kInf, -kInf, kNaN, 1e-40}) {
      E fc{E::Kind::FConst};
      fc.dtype = kiln::DType::Float32;
      fc.f = v;
      push("x+fconst:float32", kiln::DType::Float32, bin(O::Add, kiln::DType::Float32, a, k.add(fc)));
    }
    const kiln::jit::ExprId big = k.iop(E::Kind::IAdd, p, k.iconst(1000));
    push("idiv", kiln::DType::Int64, k.iop(E::Kind::IDiv, big, k.iconst(7)));
    push("imod", kiln::DType::Int64, k.iop(E::Kind::IMod, big, k.iconst(7)));
    push("imin", kiln::DType::Int64, k.iop(E::Kind::IMin, p, k.iconst(5)));
    push("isub", kiln::DType::Int64, k.iop(E::Kind::ISub, p, k.iconst(3)));
    push("param", kiln::DType::Int64, k.param(0));
  }
  std::vector<S> body;
  // Every accumulator over x[(p + j) % n], j in [0, 5): float32 values into float64 sums and
  // float32 max/min (NaN flag), int64 values into int64 accumulators.
  k.num_vars = 2;
  const kiln::jit::ExprId j = k.var(1);
  const kiln::jit::ExprId idx = k.iop(E::Kind::IMod, k.iop(E::Kind::IAdd, p, j), k.param(0));
  std::vector<S> loop_body;
  std::vector<S> after;
  const O acc_ops[] = {O::Sum, O::Prod, O::Amax, O::Amin, O::ArgMax, O::ArgMin};
  for (int src = 0; src < 2; ++src) {
    const kiln::DType vt = src == 0 ? kiln::DType::Float32 : kiln::DType::Int64;
    const kiln::jit::ExprId v = load(src == 0 ? 0 : 6, idx);
    for (O op : acc_ops) {
      kiln::DType at = src == 1                          ? kiln::DType::Int64
                       : (op == O::Sum || op == O::Prod) ? kiln::DType::Float64
                                                         : kiln::DType::Float32;
      const int a = static_cast<int>(k.accs.size());
      k.accs.push_back({op, at, vt});
      S init{S::Kind::AccInit};
      init.acc = a;
      body.push_back(init);
      S up{S::Kind::AccUpdate};
      up.acc = a;
      up.value = v;
      up.index = j;
      loop_body.push_back(up);
      E ae{op == O::ArgMax || op == O::ArgMin ? E::Kind::AccIndex : E::Kind::Acc};
      ae.dtype = op == O::ArgMax || op == O::ArgMin ? kiln::DType::Int64 : at;
      ae.i = a;
      const std::string name = std::string("acc_") + kiln::op_name(op) + ":" + kiln::dtype_name(vt);
      r.names[dt_slot(ae.dtype)].push_back(name);
      results.push_back({ae.dtype, -1 - static_cast<int>(k.exprs.size())});  // placeholder, replaced below
      k.exprs.push_back(ae);  // not shared: read after the loop
    }
  }
  S loop{S::Kind::Loop};
  loop.var = 1;
  loop.lo = k.iconst(0);
  loop.hi = k.iconst(5);
  loop.body = loop_body;
  body.push_back(loop);
  for (int t = 0; t < 5; ++t) r.cols[t] = static_cast<int>(r.names[t].size());
  int col[5] = {0, 0, 0, 0, 0};
  for (auto [t, e] : results) {
    if (e < 0) e = -1 - e;
    const int slot = dt_slot(t);
    S st{S::Kind::Store};
    st.buffer = 10 + slot;
    st.index = k.iop(E::Kind::IAdd, k.iop(E::Kind::IMul, p, k.iconst(r.cols[slot])), k.iconst(col[slot]++));
    st.value = e;
    body.push_back(st);
  }
  k.body = body;
  E ext{E::Kind::Param};
  ext.i = 0;
  k.parallel_extent = k.add(ext);
  return r;
}

// Host inputs of the every-op kernel: edge values in x, the same set rotated in y.
std::vector<std::vector<char>> ops_inputs() {
  const int64_t n = OpsKernel::n;
  const double f[] = {0.0,  -0.0,  1.0, -1.0, 0.5,   -2.5, 3.75,  1e-3, 100.0, -100.0, 1e30,  kNaN,
                      kInf, -kInf, 2.5, 88.5, -0.75, 7.0,  1e-40, 0.3,  -3.0,  1e300,  12.25, -1e-5};
  const int64_t i[] = {0,         1,  -1, 7, -7, 2,  3,    -3, 100,       -100,      2147483647, -2147483647 - 1,
                       123456789, -5, 64, 5, 9,  -2, 1000, 13, INT64_MAX, INT64_MIN, 31,         -64};
  std::vector<std::vector<char>> v;
  auto fill = [&](auto tag, auto gen) {
    using T = decltype(tag);
    std::vector<char> b(n * sizeof(T));
    for (int64_t k = 0; k < n; ++k) {
      T x = gen(k);
      std::memcpy(b.data() + k * sizeof(T), &x, sizeof(T));
    }
    v.push_back(b);
    v.push_back(b);  // y: read at (7p + 3) % n
  };
  fill(float{}, [&](int64_t k) { return static_cast<float>(f[k]); });
  fill(double{}, [&](int64_t k) { return f[k]; });
  fill(int32_t{}, [&](int64_t k) { return static_cast<int32_t>(i[k]); });
  fill(int64_t{}, [&](int64_t k) { return i[k]; });
  fill(uint8_t{}, [&](int64_t k) { return static_cast<uint8_t>(k % 3 == 0); });
  return v;
}

// ============================================================== driver

// Prints the op:dtype pairs a test covered.
void print_ops(const char* what, const std::set<std::string>& ops) {
  std::string list;
  for (const std::string& o : ops) list += o + " ";
  std::printf("[ cuda ] %s: %s\n", what, list.c_str());
}

TEST(CudaDriver, AvailabilityIsReportedWithoutCrashing) {
  if (cu::available()) {
    EXPECT_TRUE(cu::unavailable_reason().empty());
    EXPECT_GE(cu::device_count(), 1);
    std::printf("[ cuda ] %d device(s); device 0: %s, sm_%d; driver %d; NVRTC %d (%s)\n", cu::device_count(),
                cu::device_name(0).c_str(), cu::compute_capability(0), cu::driver_version(), cu::nvrtc_version(),
                cu::nvrtc_path().c_str());
    ASSERT_NE(gpu_backend(), nullptr) << "a CUDA device is usable but no CUDA backend is registered";
  } else {
    std::printf("[ cuda ] not available: %s\n", cu::unavailable_reason().c_str());
    EXPECT_FALSE(cu::unavailable_reason().empty());
    EXPECT_EQ(cu::device_count(), 0);
    EXPECT_THROW(cu::api(), kiln::Error);
    EXPECT_EQ(gpu_backend(), nullptr) << "the CUDA backend must be registered only where a device is usable";
    EXPECT_THROW(kiln::jit::tiering_for(kiln::DeviceType::CUDA), kiln::Error);
  }
  // The CPU backends are there either way.
  EXPECT_NE(cpu_backend(), nullptr);
}

TEST(CudaDriver, CheckNamesTheError) {
  try {
    cu::check(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc");
    FAIL() << "check() did not throw";
  } catch (const kiln::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cuMemAlloc"), std::string::npos) << m;
    // Without a driver there are no error names: the number is given instead.
    if (cu::available())
      EXPECT_NE(m.find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos) << m;
    else
      EXPECT_NE(m.find("2"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(cu::check(CUDA_SUCCESS, "nothing"));
}

// ============================================================== NVRTC (no GPU needed)

TEST(CudaNvrtc, RandomGraphKernelsCompile) {
  SKIP_UNDER_INTERP_REGISTRATION();
  SKIP_WITHOUT_NVRTC();
  const int cc = cu::available() ? cu::compute_capability(0) : 90;
  const kiln::jit::Target target = kiln::jit::cuda_target(cc);
  const uint64_t seed = test_seed();
  int kernels = 0, rejected = 0;
  std::vector<double> ms;
  std::set<std::string> ops;
  std::map<std::string, int> rejections;
  for (int g = 0; g < graphs(); ++g) {
    Program p = make_program(seed, g / 4, g % 4);
    Prepared pr = prepare(p);
    for (const kiln::jit::Step& st : pr.steps) {
      if (st.kind != kiln::jit::Step::Kind::Kernel) continue;
      std::shared_ptr<Lowered> L;
      try {
        L = kiln::jit::lower(st.group, target);
      } catch (const kiln::jit::LowerError& e) {
        ++rejected;
        rejections[std::string(e.what()).substr(0, 60)]++;
        continue;
      }
      std::string sym = fresh_symbol("nvrtc");
      std::string src;
      try {
        src = kiln::jit::emit_cuda(L->kernel, sym);
        auto t0 = std::chrono::steady_clock::now();
        bool ptx = false;
        std::string bin = kiln::cu::nvrtc_compile(src, sym, cc, &ptx);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        EXPECT_FALSE(bin.empty());
      } catch (const std::exception& e) {
        ADD_FAILURE() << "graph " << g << " (" << p.header << "): " << e.what() << "\nloop IR:\n"
                      << L->kernel.str() << "\nCUDA source:\n"
                      << src;
        return;
      }
      ops_of(L->kernel, ops);
      ++kernels;
    }
  }
  std::printf("[ cuda ] NVRTC compiled %d kernels for sm_%d (median %.1f ms, max %.1f ms); %d groups not lowered\n",
              kernels, cc, median(ms), ms.empty() ? 0 : *std::max_element(ms.begin(), ms.end()), rejected);
  for (auto& [why, n] : rejections) std::printf("[ cuda ]   not lowered x%d: %s\n", n, why.c_str());
  print_ops("ops compiled", ops);
  EXPECT_GT(kernels, 0);
}

// The second stage of split reductions on the GPU: every reduction op, with the accumulator and
// output dtypes lowering produces, compiles.
TEST(CudaNvrtc, CombineKernelsCompile) {
  SKIP_WITHOUT_NVRTC();
  using kiln::DType;
  using kiln::OpKind;
  struct C {
    OpKind op;
    DType acc, out;
  };
  const C cases[] = {{OpKind::Sum, DType::Float64, DType::Float32},  {OpKind::Sum, DType::Int64, DType::Int64},
                     {OpKind::Prod, DType::Float64, DType::Float64}, {OpKind::Amax, DType::Float32, DType::Float32},
                     {OpKind::Amin, DType::Int64, DType::Int32},     {OpKind::ArgMax, DType::Float64, DType::Int64},
                     {OpKind::ArgMin, DType::Int64, DType::Int64},   {OpKind::Amax, DType::Int64, DType::Bool}};
  for (const C& c : cases) {
    int lanes = 0;
    const std::string sym = std::string("kiln_combine_") + kiln::op_name(c.op);
    const std::string src = kiln::jit::emit_cuda(kiln::jit::combine_kernel(c.op, c.acc, c.out), sym, &lanes);
    EXPECT_EQ(lanes, kiln::jit::kCudaWideBlock) << sym;  // a block reduces the partials
    EXPECT_NO_THROW(kiln::cu::nvrtc_compile(src, sym, 90)) << src;
    if (c.op == OpKind::ArgMax || c.op == OpKind::ArgMin) continue;
    // Split column reductions: a warp per column over the chunks' partials.
    const std::string csrc =
        kiln::jit::emit_cuda(kiln::jit::combine_kernel(c.op, c.acc, c.out, true), sym + "_columns", &lanes);
    EXPECT_EQ(lanes, 32) << sym;
    EXPECT_NO_THROW(kiln::cu::nvrtc_compile(csrc, sym + "_columns", 90)) << csrc;
  }
}

// A split reduction's 0-d tail (`sum() * 0.5`) runs in the combine kernel on devices: the merged
// kernel keeps a block of lanes for the partials and compiles; the tail reads the combine's output.
TEST(CudaNvrtc, CombineWithEpilogueCompiles) {
  SKIP_UNDER_INTERP_REGISTRATION();
  SKIP_WITHOUT_NVRTC();
  kiln::set_executor(kiln::interpreter());
  Tensor x = kiln::randn({5000, 3});
  x.eval();
  Tensor e = (x * x).sum() * 0.5 + 1;
  kiln::Segment seg = make_segment({e});
  const kiln::jit::Target target = kiln::jit::cuda_target(90);
  std::vector<kiln::jit::Step> steps = kiln::jit::schedule(seg);
  ASSERT_EQ(steps.size(), 2u);
  auto split = kiln::jit::lower(steps[0].group, target), tail = kiln::jit::lower(steps[1].group, target);
  ASSERT_TRUE(split->split);
  ASSERT_TRUE(steps[1].group.domain.empty());
  kiln::jit::Kernel k = kiln::jit::combine_with_epilogue(
      kiln::jit::combine_kernel(kiln::OpKind::Sum, kiln::DType::Float64, kiln::DType::Float32), tail->kernel, 0);
  EXPECT_EQ(k.buffers.size(), 2 + tail->kernel.buffers.size());
  int lanes = 0;
  const std::string src = kiln::jit::emit_cuda(k, "kiln_combine_then_tail", &lanes);
  EXPECT_EQ(lanes, kiln::jit::kCudaWideBlock) << src;
  EXPECT_NE(src.find("b1[((i64)0ll)]"), std::string::npos) << "the tail reads the combined value\n" << src;
  EXPECT_NO_THROW(kiln::cu::nvrtc_compile(src, "kiln_combine_then_tail", 90)) << src;
}

// Independent pointwise kernels as one horizontal kernel (an optimizer step's updates): the
// members are picked by a search over their ends, computed once a thread before its loop, and
// the kernel compiles (its results on a GPU: test_horizontal).
TEST(CudaNvrtc, HorizontalKernelPicksMembersBySearch) {
  SKIP_UNDER_INTERP_REGISTRATION();
  SKIP_WITHOUT_NVRTC();
  kiln::set_executor(kiln::interpreter());
  std::vector<Tensor> outs;
  for (int64_t n : {3, 17, 64, 1, 300}) {
    Tensor x = kiln::randn({n, 2});
    x.eval();
    outs.push_back(kiln::exp(x) * 2 + 1);
  }
  kiln::Segment seg = make_segment(outs);
  const kiln::jit::Target target = kiln::jit::cuda_target(90);
  std::vector<kiln::jit::Step> steps = kiln::jit::schedule(seg);
  std::vector<std::shared_ptr<Lowered>> lowered;
  std::vector<const kiln::jit::Kernel*> members;
  for (const kiln::jit::Step& st : steps) {
    if (st.kind != kiln::jit::Step::Kind::Kernel) continue;
    lowered.push_back(kiln::jit::lower(st.group, target));
    members.push_back(&lowered.back()->kernel);
  }
  ASSERT_EQ(members.size(), 5u);
  const kiln::jit::Kernel k = kiln::jit::horizontal_kernel(members);
  ASSERT_EQ(k.member_ends.size(), 5u);
  const std::string src = kiln::jit::emit_cuda(k, "kiln_horizontal_search");
  const size_t loop = src.find("for (i64 i0 =");
  ASSERT_NE(loop, std::string::npos) << src;
  // Four tests of i0 against an end (a search over five members), each a name computed before
  // the grid-stride loop.
  size_t tests = 0;
  for (size_t at = src.find("if (i0 < t"); at != std::string::npos; at = src.find("if (i0 < t", at + 1)) {
    ++tests;
    const size_t name_end = src.find(')', at);
    const std::string name = src.substr(at + 9, name_end - at - 9);
    const size_t defined = src.find("const i64 " + name + " =");
    EXPECT_LT(defined, loop) << name << " is computed inside the loop\n" << src;
  }
  EXPECT_EQ(tests, 4u) << src;
  EXPECT_NO_THROW(kiln::cu::nvrtc_compile(src, "kiln_horizontal_search", 90)) << src;
}

// A pointwise kernel over long rows (cross-entropy's gradient over [rows, 50304] in bfloat16)
// runs tiles of a row, a warp's lanes over each, and computes what the row shares (its log of
// the sum of exponentials, its target's position, its index) once before the tile loop: the
// lanes' loop divides nothing and takes no log. It compiles.
TEST(CudaNvrtc, RowTilesComputeWhatTheRowSharesOnce) {
  SKIP_UNDER_INTERP_REGISTRATION();
  SKIP_WITHOUT_NVRTC();
  kiln::set_executor(kiln::interpreter());
  const int64_t N = 50304;
  Tensor x = kiln::randn({4, 4, N}).to(kiln::kBFloat16);
  Tensor mx = kiln::randn({4, 4, 1}), se = kiln::rand({4, 4, 1}) + 1, g = kiln::randn({});
  Tensor target = kiln::randint(0, N, {4, 4});
  for (Tensor* t : {&x, &mx, &se, &g, &target}) t->eval();
  Tensor onehot = kiln::eq(kiln::arange(0, N, 1, kiln::kInt64), target.unsqueeze(-1)).to(kiln::kFloat32);
  Tensor grad = ((kiln::exp(x.to(kiln::kFloat32) - mx - kiln::log(se)) - onehot) * g).to(kiln::kBFloat16);
  kiln::Segment seg = make_segment({grad});
  kiln::jit::ScheduleOptions opts;
  opts.half_kernels = true;
  std::vector<kiln::jit::Step> steps = kiln::jit::schedule(seg, {}, opts);
  ASSERT_EQ(steps.size(), 1u);
  const kiln::jit::Target target90 = kiln::jit::cuda_target(90);
  auto L = kiln::jit::lower(steps[0].group, target90);
  ASSERT_EQ(L->kernel.body.size(), 1u);
  ASSERT_EQ(L->kernel.body[0].kind, kiln::jit::Stmt::Kind::Loop) << L->kernel.str();
  EXPECT_NE(kiln::jit::group_key(steps[0].group, target90), kiln::jit::group_key(steps[0].group, kiln::jit::host_target()));
  int lanes = 0;
  const std::string src = kiln::jit::emit_cuda(L->kernel, "kiln_row_tiles", &lanes);
  EXPECT_EQ(lanes, 32) << src;
  const size_t loop = src.find("+ lane;");
  ASSERT_NE(loop, std::string::npos) << src;
  const std::string body = src.substr(loop);
  EXPECT_EQ(body.find("logf("), std::string::npos) << "the row's log is taken in the lanes' loop\n" << src;
  EXPECT_EQ(body.find(" / (u64)"), std::string::npos) << "the lanes' loop divides\n" << src;
  EXPECT_EQ(body.find(" % (u64)"), std::string::npos) << "the lanes' loop divides\n" << src;
  EXPECT_NE(body.find("expf("), std::string::npos) << src;
  EXPECT_NO_THROW(kiln::cu::nvrtc_compile(src, "kiln_row_tiles", 90)) << src;
  // Too few tiles for the GPU (one row of 768; 8 rows): an element a thread.
  for (std::vector<int64_t> shape : {std::vector<int64_t>{768}, std::vector<int64_t>{8, 768}}) {
    Tensor a = kiln::randn(shape), b = kiln::randn(shape);
    a.eval();
    b.eval();
    kiln::Segment small = make_segment({kiln::sqrt(a * a + b) * 0.5});
    std::vector<kiln::jit::Step> st = kiln::jit::schedule(small, {}, opts);
    ASSERT_EQ(st.size(), 1u);
    auto flat = kiln::jit::lower(st[0].group, target90);
    int flat_lanes = 0;
    (void)kiln::jit::emit_cuda(flat->kernel, "kiln_flat", &flat_lanes);
    EXPECT_EQ(flat_lanes, 1) << flat->kernel.str();
  }
}

TEST(CudaNvrtc, EveryOpCompiles) {
  SKIP_WITHOUT_NVRTC();
  OpsKernel ok = make_ops_kernel();
  const std::string src = kiln::jit::emit_cuda(ok.k, "kiln_every_op");
  try {
    EXPECT_FALSE(
        kiln::cu::nvrtc_compile(src, "kiln_every_op", cu::available() ? cu::compute_capability(0) : 90).empty());
  } catch (const std::exception& e) {
    FAIL() << e.what() << "\n" << src;
  }
  // The reference it is compared with on a GPU: the LLVM tier compiles the same kernel.
  EXPECT_NO_THROW(cpu_backend()->compile(ok.k, "kiln_every_op_llvm_check", nullptr));
  int total = 0;
  for (int t = 0; t < 5; ++t) total += ok.cols[t];
  std::printf("[ cuda ] every-op kernel: %d results, %zu bytes of CUDA C++\n", total, src.size());
}

// The device runtime's kernel templates (kernels/cuda/device_kernels.h): every instance it may
// launch (every op template x dtype combination) compiles for sm_90, and each extern "C" kernel
// is in the CUBIN — the float32 tensor-core attention kernels (the largest: two product forms
// each) at the head buckets of each shape class (32, 96, 256: the source's Fwd, Bwd, Stages and
// Cols take no other branches), the others at every bucket. One program per template and element
// type holds its instances (the runtime compiles them one by one; the source and wrappers are the
// same), the programs compiled on every core; one instance is also compiled alone. The Hopper
// warpgroup forward compiles for sm_90a (its instructions exist there alone); an arch-specific
// compile for an architecture NVRTC does not know is an error. (Once: the templates do not depend
// on the executor the .interp run selects.)
TEST(CudaNvrtc, DeviceKernelsCompile) {
  SKIP_WITHOUT_NVRTC();
  if (kiln::testing::interpreted()) GTEST_SKIP() << "the device kernels do not depend on the executor";
  using kiln::kernels::DeviceKernelInstance;
  std::map<std::tuple<int, int, int>, std::vector<DeviceKernelInstance>> groups;
  std::set<int> kinds;
  for (const DeviceKernelInstance& k : kiln::kernels::all_device_kernels()) {
    if (k.tf32_passes && k.head != 32 && k.head != 96 && k.head != 256) continue;
    const bool attention = k.head != 0;  // (the big ones: a program per element type)
    groups[{static_cast<int>(k.kernel), attention ? static_cast<int>(k.a) : 0, k.tf32_passes}].push_back(k);
    kinds.insert(static_cast<int>(k.kernel));
  }
  EXPECT_EQ(kinds.size(), 32u);
  std::vector<std::vector<DeviceKernelInstance>*> todo;
  for (auto& [key, ks] : groups) todo.push_back(&ks);
  std::vector<std::string> cubins(todo.size()), errors(todo.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers;
  for (unsigned w = 0; w < std::max(1u, std::thread::hardware_concurrency()); ++w)
    workers.emplace_back([&] {
      for (size_t i; (i = next++) < todo.size();) try {
          cubins[i] = kiln::cu::nvrtc_compile(kiln::kernels::device_kernel_program(*todo[i]),
                                              "kiln_device_kernels_" + std::to_string(i), 90, nullptr,
                                              kiln::kernels::needs_sm90a((*todo[i])[0].kernel));
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
    });
  for (std::thread& w : workers) w.join();
  size_t total = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    EXPECT_EQ(errors[i], "");
    for (const DeviceKernelInstance& k : *todo[i]) {
      EXPECT_NE(cubins[i].find(kiln::kernels::device_kernel_name(k) + std::string(1, '\0')), std::string::npos)
          << kiln::kernels::device_kernel_name(k) << " is not in the CUBIN";
      ++total;
    }
  }
  const DeviceKernelInstance one{kiln::kernels::DeviceKernel::ScatterWrite, kiln::kFloat16, kiln::kInt32};
  EXPECT_FALSE(
      kiln::cu::nvrtc_compile(kiln::kernels::device_kernel_program({one}), kiln::kernels::device_kernel_name(one), 90)
          .empty());
  std::printf("[ cuda ] %zu device kernel instances compiled for sm_90\n", total);
  // copies, cat (5 unit widths), indexing, cumsum, claims, int ops, sort keys, the radix sort,
  // batch pointers, ordered adds, attention (row kernels; tiled for heads 32, 64, 128), tensor-core attention (bfloat16,
  // float16 at 8 buckets; float32 in TF32, 3xTF32 and careful 3xTF32 at 3, and the scan; the
  // warpgroup kernels at 2)
  EXPECT_EQ(total, 7u * 7 + 5 + 7 * 2 * 3 + 7 + 2 + 2 * 3 + 1 + 2 * 2 + 3 + 1 + 4 * 2 + 3 * 2 * 4 + 3 * 3 + 4 * 2 * 8 +
                       4 * 2 * 3 + 3 * 3 + 1 + 3 * 2 * 2);
  EXPECT_THROW(kiln::cu::nvrtc_compile(kiln::kernels::device_kernel_program({one}), "kiln_arch_specific", 999,
                                       nullptr, true),
               kiln::Error);
}

TEST(CudaNvrtc, CompileErrorQuotesTheLog) {
  SKIP_WITHOUT_NVRTC();
  const std::string src = "extern \"C\" __global__ void kiln_broken(int* p) { *p = kiln_undeclared_name; }\n";
  try {
    kiln::cu::nvrtc_compile(src, "kiln_broken", 90);
    FAIL() << "NVRTC accepted a broken kernel";
  } catch (const kiln::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("kiln_broken"), std::string::npos) << m;
    EXPECT_NE(m.find("NVRTC_ERROR_COMPILATION"), std::string::npos) << m;
    EXPECT_NE(m.find("kiln_undeclared_name"), std::string::npos) << "the log is not quoted: " << m;
  }
}

// float16/bfloat16 values: loaded to float32, rounded to 16 bits after each op, stored as 16
// bits; such kernels compile (their parity with the CPU runs on a GPU: torch-parity on cuda,
// CudaDevice.RandomEagerProgramsMatchTheCpu).
TEST(CudaNvrtc, HalfKernelsCompile) {
  SKIP_WITHOUT_NVRTC();
  for (kiln::DType t : {kiln::DType::Float16, kiln::DType::BFloat16}) {
    EXPECT_TRUE(kiln::jit::cuda_target(90).supports(kiln::OpKind::Add, t));
    kiln::jit::Kernel k;
    k.name = "half";
    k.buffers = {{t, false}, {t, true}};
    kiln::jit::Expr ld{kiln::jit::Expr::Kind::Load};
    ld.dtype = t;
    ld.i = 0;
    ld.a = k.var(0);
    kiln::jit::Expr ex{kiln::jit::Expr::Kind::Unary};
    ex.dtype = t;
    ex.op = kiln::OpKind::Exp;
    ex.a = k.add(ld);
    kiln::jit::Stmt st{kiln::jit::Stmt::Kind::Store};
    st.buffer = 1;
    st.index = k.var(0);
    st.value = k.add(ex);
    k.body.push_back(st);
    const bool h = t == kiln::DType::Float16;
    const std::string src = kiln::jit::emit_cuda(k, "kiln_half");
    EXPECT_NE(src.find(h ? "kiln_h2f(b0[" : "kiln_bf2f(b0["), std::string::npos) << src;
    EXPECT_NE(src.find(h ? "kiln_rh(expf(" : "kiln_rbf(expf("), std::string::npos) << src;
    EXPECT_NE(src.find(h ? "b1[i0] = kiln_f2h(" : "b1[i0] = kiln_f2bf("), std::string::npos) << src;
    EXPECT_NO_THROW(kiln::cu::nvrtc_compile(src, "kiln_half", 90)) << src;
  }
}

TEST(CudaNvrtc, EmitterRejectsWhatItCannotExpress) {
  // A float-only op on integers: a clear error, not wrong code.
  kiln::jit::Kernel m;
  m.name = "int_exp";
  m.buffers = {{kiln::DType::Int64, false}, {kiln::DType::Int64, true}};
  kiln::jit::Expr ld{kiln::jit::Expr::Kind::Load};
  ld.dtype = kiln::DType::Int64;
  ld.i = 0;
  ld.a = m.var(0);
  kiln::jit::ExprId x = m.add(ld);
  kiln::jit::Expr ex{kiln::jit::Expr::Kind::Unary};
  ex.dtype = kiln::DType::Int64;
  ex.op = kiln::OpKind::Exp;
  ex.a = x;
  kiln::jit::Stmt st{kiln::jit::Stmt::Kind::Store};
  st.buffer = 1;
  st.index = m.var(0);
  st.value = m.add(ex);
  m.body.push_back(st);
  try {
    kiln::jit::emit_cuda(m, "kiln_int_exp");
    FAIL() << "exp on int64 was emitted";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("on integers"), std::string::npos) << e.what();
  }
}

// ============================================================== GPU

TEST(CudaBackend, RegisteredForTheDevice) {
  SKIP_WITHOUT_GPU();
  Backend* b = gpu_backend();
  ASSERT_NE(b, nullptr);
  const int cc = cu::compute_capability(0);
  EXPECT_EQ(std::string(b->name()), "cuda");
  EXPECT_EQ(b->device(), kiln::DeviceType::CUDA);
  EXPECT_EQ(b->tier(), kiln::jit::Tier::Optimizing);
  EXPECT_EQ(b->target().name, "cuda-sm" + std::to_string(cc));
  EXPECT_EQ(b->target().parallel, kiln::jit::Target::Parallel::DeviceGrid);
  EXPECT_NE(b->cache_id().find("sm_" + std::to_string(cc)), std::string::npos) << b->cache_id();
  EXPECT_NE(b->cache_id().find("nvrtc"), std::string::npos) << b->cache_id();
  EXPECT_NE(b->cache_id().find("driver"), std::string::npos) << b->cache_id();
  kiln::jit::Tiering t = kiln::jit::tiering_for(kiln::DeviceType::CUDA);
  EXPECT_EQ(t.optimizing, b);
  EXPECT_EQ(kiln::jit::target_for(kiln::DeviceType::CUDA).name, b->target().name);
  std::printf("[ cuda ] backend %s, target %s, cache id %s\n", b->name(), b->target().name.c_str(),
              b->cache_id().c_str());
}

TEST(CudaDifferential, RandomGraphsMatchLlvm) {
  SKIP_UNDER_INTERP_REGISTRATION();
  SKIP_WITHOUT_GPU();
  Backend* gpu = gpu_backend();
  Backend* cpu = cpu_backend();
  ASSERT_NE(gpu, nullptr);
  ASSERT_NE(cpu, nullptr);
  const uint64_t seed = test_seed();
  int kernels = 0, rejected = 0, launched_empty = 0, failures = 0, splits = 0, columns = 0, reductions = 0;
  std::vector<double> compile_ms;
  std::set<std::string> ops;
  g_diff = Diff{};
  for (int g = 0; g < graphs() && failures < 5; ++g) {
    Program p = make_program(seed, g / 4, g % 4);
    Prepared pr = prepare(p);
    for (const kiln::jit::Step& st : pr.steps) {
      if (st.kind != kiln::jit::Step::Kind::Kernel) continue;
      std::shared_ptr<Lowered> L;
      try {
        L = kiln::jit::lower(st.group, gpu->target());
      } catch (const kiln::jit::LowerError&) {
        ++rejected;
        continue;
      }
      std::string where =
          "KILN_TEST_SEED=" + std::to_string(seed) + " graph " + std::to_string(g) + " (" + p.header + ")";
      try {
        Bound bd = bind(st.group, *L);
        DeviceArgs dev;
        upload(bd, dev);  // zeroed outputs and scratch, before the CPU run writes them
        const std::string sym = fresh_symbol("k");
        auto t0 = std::chrono::steady_clock::now();
        std::shared_ptr<kiln::jit::Code> gcode = gpu->compile(L->kernel, sym, nullptr);
        compile_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        std::shared_ptr<kiln::jit::Code> ccode = cpu->compile(L->kernel, sym, nullptr);
        if (bd.extent <= 0) ++launched_empty;
        gpu->launch(*gcode, launch_of(bd, dev.buffers.data()));
        cpu->launch(*ccode, launch_of(bd, bd.host.data()));
        std::vector<std::vector<char>> got = download(bd, dev);
        const size_t first = bd.storage.size();
        bool f32_math = false;
        for (const kiln::jit::Expr& e : L->kernel.exprs) f32_math |= e.dtype == kiln::DType::Float32;
        int64_t reduced = 1;
        for (int64_t d : st.group.reduce_dims) reduced *= st.group.domain[static_cast<size_t>(d)].as_int();
        for (size_t i = 0; i < got.size(); ++i) {
          kiln::DType dt = L->kernel.buffers[first + i].dtype;
          // The program value this buffer holds, if it is one: its error bound, on each side.
          double allow_abs = 0, allow_rel = 0;
          for (size_t k = 0; k < pr.values.size() && i < st.group.outputs.size(); ++k)
            if (pr.values[k].node().get() == st.group.outputs[i] && !p.info[k].exact) {
              allow_abs = 2 * p.info[k].abs_err;
              allow_rel = 2 * p.info[k].rel_err;
            }
          std::string m = compare_buffers(dt, got[i], bd.owned[i], g_diff, f32_math, reduced, allow_abs, allow_rel);
          if (!m.empty()) {
            ADD_FAILURE() << where << ": buffer " << first + i << " (" << kiln::dtype_name(dt) << "): " << m
                          << "\ngraph:\n"
                          << p.str() << "loop IR:\n"
                          << L->kernel.str() << "\nCUDA source:\n"
                          << kiln::jit::emit_cuda(L->kernel, sym);
            ++failures;
            break;
          }
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << where << ": " << e.what() << "\nloop IR:\n" << L->kernel.str();
        ++failures;
      }
      ops_of(L->kernel, ops);
      ++kernels;
      splits += L->split;
      columns += L->column;
      reductions += !L->kernel.accs.empty();
    }
  }
  std::printf(
      "[ cuda ] %d kernels compared GPU vs LLVM (%d with reductions: %d split, %d column; %d empty launches); "
      "%d groups not lowered\n",
      kernels, reductions, splits, columns, launched_empty, rejected);
  std::printf("[ cuda ] compile (NVRTC + module load) per kernel: median %.1f ms, max %.1f ms\n", median(compile_ms),
              compile_ms.empty() ? 0 : *std::max_element(compile_ms.begin(), compile_ms.end()));
  std::printf(
      "[ cuda ] %lld elements (%lld floating), %lld floating elements differ; worst relative difference %.3g (%s)\n",
      static_cast<long long>(g_diff.elements), static_cast<long long>(g_diff.float_elements),
      static_cast<long long>(g_diff.differing), g_diff.worst, g_diff.worst_where.c_str());
  print_ops("ops run", ops);
  EXPECT_GT(kernels, 0);
}

// Every op on edge values: GPU vs LLVM, result by result. Exact for integers, bools, casts and
// the IEEE operations (+ - * / sqrt, fmod, floor ...); transcendentals (and float sums and
// products, which the LLVM tier may reassociate) within 16 ulp of each other relative to the
// larger magnitude (CUDA's bound plus libmvec's / SLEEF's), NaN for NaN. (relu is not applied
// to bool: the LLVM tier compares i1 as signed there, relu(true) = false.)
TEST(CudaBackend, EveryOpMatchesLlvm) {
  SKIP_WITHOUT_GPU();
  Backend* gpu = gpu_backend();
  Backend* cpu = cpu_backend();
  ASSERT_NE(gpu, nullptr);
  OpsKernel ok = make_ops_kernel();
  const int64_t n = OpsKernel::n;
  Bound bd;
  std::vector<std::vector<char>> ins = ops_inputs();
  std::vector<std::shared_ptr<kiln::Storage>> keep;
  for (auto& in : ins) {
    auto st = std::make_shared<kiln::Storage>();
    st->data = in.data();
    st->nbytes = in.size();
    keep.push_back(st);
    bd.storage.push_back(st.get());
    bd.offset.push_back(0);
    bd.host.push_back(in.data());
  }
  for (int t = 0; t < 5; ++t) bd.owned.emplace_back(std::max<size_t>(1, n * ok.cols[t] * kiln::itemsize(kOpsTypes[t])));
  for (auto& o : bd.owned) bd.host.push_back(o.data());
  bd.ip = {n};
  bd.fp = {0.25};
  bd.extent = n;
  bd.work = n;
  DeviceArgs dev;
  upload(bd, dev);
  auto gcode = gpu->compile(ok.k, "kiln_every_op_gpu", nullptr);
  auto ccode = cpu->compile(ok.k, "kiln_every_op_cpu", nullptr);
  gpu->launch(*gcode, launch_of(bd, dev.buffers.data()));
  cpu->launch(*ccode, launch_of(bd, bd.host.data()));
  std::vector<std::vector<char>> got = download(bd, dev);
  int bad = 0, inexact = 0;
  double worst_ulps = 0;
  std::string worst;
  for (int t = 0; t < 5; ++t) {
    const kiln::DType dt = kOpsTypes[t];
    for (int c = 0; c < ok.cols[t]; ++c) {
      const std::string& name = ok.names[t][c];
      const bool transcendental = name.find("exp") == 0 || name.find("log") == 0 || name.find("sin") == 0 ||
                                  name.find("cos") == 0 || name.find("tan") == 0 || name.find("atan") == 0 ||
                                  name.find("erf") == 0 || name.find("sigmoid") == 0 || name.find("pow") == 0 ||
                                  name.find("expm1") == 0 || name.find("exp2") == 0 ||
                                  // float sums and products: the LLVM tier may reassociate them
                                  name == "acc_sum:float32" || name == "acc_prod:float32";
      for (int64_t p = 0; p < n; ++p) {
        const size_t at = static_cast<size_t>(p * ok.cols[t] + c);
        double a = 0, b = 0;
        bool same = false;
        switch (dt) {
          case kiln::DType::Float32: {
            float x, y;
            std::memcpy(&x, got[t].data() + at * 4, 4);
            std::memcpy(&y, bd.owned[t].data() + at * 4, 4);
            a = x, b = y;
            same = std::memcmp(&x, &y, 4) == 0 || (std::isnan(x) && std::isnan(y)) || x == y;
            break;
          }
          case kiln::DType::Float64: {
            std::memcpy(&a, got[t].data() + at * 8, 8);
            std::memcpy(&b, bd.owned[t].data() + at * 8, 8);
            same = (std::isnan(a) && std::isnan(b)) || a == b;
            break;
          }
          default: {
            const size_t w = kiln::itemsize(dt);
            same = std::memcmp(got[t].data() + at * w, bd.owned[t].data() + at * w, w) == 0;
            int64_t x = 0, y = 0;
            if (w == 1)
              x = static_cast<uint8_t>(got[t][at]), y = static_cast<uint8_t>(bd.owned[t][at]);
            else if (w == 4) {
              int32_t u, v;
              std::memcpy(&u, got[t].data() + at * 4, 4);
              std::memcpy(&v, bd.owned[t].data() + at * 4, 4);
              x = u;
              y = v;
            } else {
              std::memcpy(&x, got[t].data() + at * 8, 8);
              std::memcpy(&y, bd.owned[t].data() + at * 8, 8);
            }
            a = static_cast<double>(x), b = static_cast<double>(y);
          }
        }
        if (same) continue;
        double ulps = kInf;
        if (transcendental && kiln::is_floating(dt) && std::isfinite(a) && std::isfinite(b)) {
          const double ulp = dt == kiln::DType::Float32 ? 0x1p-23 : 0x1p-52;
          const double tiny = dt == kiln::DType::Float32 ? 0x1p-126 : 0x1p-1022;
          ulps = std::abs(a - b) / (std::max({std::abs(a), std::abs(b), tiny}) * ulp);
        }
        if (ulps <= 16) {
          ++inexact;
          if (ulps > worst_ulps) {
            worst_ulps = ulps;
            std::ostringstream w;
            w.precision(17);
            w << name << " at input " << p << ": gpu " << a << ", cpu " << b;
            worst = w.str();
          }
          continue;
        }
        if (++bad <= 20) {
          ADD_FAILURE() << name << " at input " << p << ": gpu " << std::setprecision(17) << a << ", cpu " << b;
        }
      }
    }
  }
  std::printf(
      "[ cuda ] every-op kernel: %d results differ beyond the bounds, %d transcendental results differ "
      "within 16 ulp (worst %.2f ulp: %s)\n",
      bad, inexact, worst_ulps, worst.c_str());
}

// An in-memory blob store (the disk cache's BlobStore stand-in).
struct MemoryStore : kiln::jit::BlobStore {
  std::map<std::string, std::string> blobs;
  bool read(const std::string& k, std::string& v) override {
    auto it = blobs.find(k);
    if (it == blobs.end()) return false;
    v = it->second;
    return true;
  }
  void write(const std::string& k, const std::string& v) override { blobs[k] = v; }
};

TEST(CudaBackend, ImageRoundTrip) {
  SKIP_UNDER_INTERP_REGISTRATION();
  SKIP_WITHOUT_GPU();
  Backend* gpu = gpu_backend();
  ASSERT_NE(gpu, nullptr);
  MemoryStore store;
  const uint64_t seed = test_seed();
  int tried = 0;
  for (int g = 0; g < graphs() && tried < 12; ++g) {
    Program p = make_program(seed, g / 4, g % 4);
    Prepared pr = prepare(p);
    for (const kiln::jit::Step& st : pr.steps) {
      if (st.kind != kiln::jit::Step::Kind::Kernel || tried >= 12) continue;
      std::shared_ptr<Lowered> L;
      try {
        L = kiln::jit::lower(st.group, gpu->target());
      } catch (const kiln::jit::LowerError&) {
        continue;
      }
      Bound bd = bind(st.group, *L);
      if (bd.extent <= 0) continue;
      ++tried;
      const std::string sym = fresh_symbol("img");
      std::string image;
      auto fresh = gpu->compile(L->kernel, sym, &image);
      ASSERT_FALSE(image.empty());
      ASSERT_EQ(image.rfind("kiln-cuda-image 2 ", 0), 0u) << image.substr(0, 40);
      auto loaded = gpu->load(image, sym, store);  // as a later process would, from the disk cache
      ASSERT_EQ(loaded->backend, gpu);
      DeviceArgs a, b;
      upload(bd, a);
      upload(bd, b);
      gpu->launch(*fresh, launch_of(bd, a.buffers.data()));
      gpu->launch(*loaded, launch_of(bd, b.buffers.data()));
      std::vector<std::vector<char>> ra = download(bd, a), rb = download(bd, b);
      for (size_t i = 0; i < ra.size(); ++i)
        EXPECT_EQ(ra[i], rb[i]) << "buffer " << i << " differs after the round trip (" << p.header << ")";
    }
  }
  EXPECT_GT(tried, 0);
  std::printf("[ cuda ] %d kernels: compile -> image -> load gave the same bits\n", tried);
  // Not an image: a clear error.
  EXPECT_THROW(gpu->load("not an image", "kiln_x", store), kiln::Error);
  // A truncated CUBIN: the driver's error, as kiln::Error.
  EXPECT_THROW(gpu->load("kiln-cuda-image 2 1 0 0 1 cubin\n\x7f"
                         "ELF garbage",
                         "kiln_x", store),
               kiln::Error);
}

// The disk cache on the GPU, across processes: this binary re-run as a child (the
// CudaCacheChild test, which only runs with KILN_CUDA_CACHE_CHILD=1) in a fresh
// KILN_CACHE_DIR: cold (kernels compiled and stored), warm (every kernel loaded from disk,
// nothing compiled, same bits), then every stored entry corrupted (each one rejected, rebuilt,
// same bits).
TEST(CudaCacheChild, Workload) {
  if (!std::getenv("KILN_CUDA_CACHE_CHILD")) GTEST_SKIP() << "the child of CudaBackend.DiskCacheColdWarmCorrupted";
  kiln::manual_seed(7);
  kiln::Tensor x = kiln::randn({300, 77}, kiln::kFloat32, kiln::cuda());  // no CPU kernel: every entry is a GPU one
  kiln::Tensor y = kiln::softmax(kiln::tanh(x * 1.75 - 0.5), -1) * x.sum({0}, true);
  kiln::Tensor s = (y * y).sum();
  std::vector<float> v = y.to_vector<float>();
  uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    h = (h ^ b) * 1099511628211ull;
  }
  const kiln::jit::CacheStats st = kiln::jit::cache_stats();
  std::printf("child: hash %llu sum %.9g compiles %llu disk_hits %llu rebuilds %llu\n",
              static_cast<unsigned long long>(h), s.item<double>(), static_cast<unsigned long long>(st.compiles),
              static_cast<unsigned long long>(st.disk_hits), static_cast<unsigned long long>(st.disk_rebuilds));
}

TEST(CudaBackend, DiskCacheColdWarmCorrupted) {
  SKIP_WITHOUT_GPU();
  kiln::testing::TempDir tmp("kiln-cuda-cache");
  ASSERT_FALSE(tmp.path().empty());
  const std::string& dir = tmp.path();
  struct Run {
    std::string hash;
    double compiles = -1, disk_hits = -1, rebuilds = -1;
    std::string out;
  };
  auto run = [&] {
    // This binary, by its resolved path (in the shell, /proc/self/exe would be the shell).
    static const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::string cmd =
        "KILN_CUDA_CACHE_CHILD=1 KILN_CACHE_DIR=" + dir + " '" + self + "' --gtest_filter=CudaCacheChild.Workload 2>&1";
    Run r;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[4096];
    while (p && fgets(buf, sizeof buf, p)) r.out += buf;
    if (p) pclose(p);
    const size_t at = r.out.find("child: hash ");
    if (at != std::string::npos) {
      char h[64] = {0};
      double sum = 0;
      std::sscanf(r.out.c_str() + at, "child: hash %63s sum %lf compiles %lf disk_hits %lf rebuilds %lf", h, &sum,
                  &r.compiles, &r.disk_hits, &r.rebuilds);
      r.hash = h;
    }
    return r;
  };
  Run cold = run();
  ASSERT_FALSE(cold.hash.empty()) << cold.out;
  EXPECT_GT(cold.compiles, 0) << cold.out;
  Run warm = run();
  EXPECT_EQ(warm.hash, cold.hash) << warm.out;
  EXPECT_EQ(warm.compiles, 0) << warm.out;
  EXPECT_GE(warm.disk_hits, cold.compiles) << warm.out;
  int corrupted = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".kobj") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(e.path()) / 2));
    f.put('\x5a');
    f.put('\xa5');
    ++corrupted;
  }
  EXPECT_GE(corrupted, cold.compiles);
  Run bad = run();
  EXPECT_EQ(bad.hash, cold.hash) << bad.out;
  EXPECT_EQ(bad.compiles, cold.compiles) << bad.out;  // every kernel rejected its entry and was rebuilt
  EXPECT_EQ(bad.rebuilds, bad.compiles) << bad.out;
  EXPECT_EQ(bad.disk_hits, 0) << bad.out;
  std::printf(
      "[ cuda ] disk cache: %g kernels compiled cold, %g loaded warm; %d entries corrupted, %g rejected and rebuilt\n",
      cold.compiles, warm.disk_hits, corrupted, bad.rebuilds);
}

}  // namespace

// GEMM + bias (+ ReLU) on the GPU: Linear layers followed by ReLU (and a last one without) run
// as cuBLASLt GEMMs with the bias (+ ReLU) epilogue, eager and compiled, forward and backward,
// and match the same network on the CPU (float32: 1e-4 relative, 1e-5 absolute: summation order
// differs between cuBLASLt and the CPU's GEMM). The epilogue path is counted in inference, so a
// plan that silently stops fusing fails here; gradients (training) are checked too.
TEST(CudaBackend, GemmBiasReluEpilogueMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  kiln::manual_seed(kiln::testing::test_seed(31));
  auto net = [](kiln::Device dev) {
    kiln::manual_seed(4);
    auto n = std::make_shared<kiln::nn::Sequential>(std::vector<std::shared_ptr<kiln::nn::Module>>{
        std::make_shared<kiln::nn::Linear>(48, 96), std::make_shared<kiln::nn::ReLU>(),
        std::make_shared<kiln::nn::Linear>(96, 80), std::make_shared<kiln::nn::ReLU>(),
        std::make_shared<kiln::nn::Linear>(80, 5)});
    n->to(dev);
    return n;
  };
  auto cpu_net = net(kiln::cpu()), gpu_net = net(kiln::cuda());
  auto f = kiln::compile([&](const Tensor& x) { return gpu_net->forward(x); });
  for (int64_t rows : {1, 7, 300}) {
    kiln::NoGradGuard inference;  // (with grad, autograd keeps the pre-activation: not fused)
    Tensor x = kiln::randn({rows, 48});
    Tensor want = cpu_net->forward(x);
    const uint64_t before = kiln::jit::gemm_epilogue_runs();
    Tensor eager = gpu_net->forward(x.cuda());
    Tensor compiled = f(x.cuda());
    kiln::eval({eager, compiled});
    EXPECT_GE(kiln::jit::gemm_epilogue_runs() - before, 6u)
        << "rows " << rows << ": 3 epilogues each, eager and compiled";
    expect_close(eager.cpu(), want, 1e-4, 1e-5);
    expect_close(compiled.cpu(), want, 1e-4, 1e-5);
  }
  // Gradients through the fused forward (the backward reads the ReLU outputs).
  Tensor x = kiln::randn({64, 48});
  Tensor lc = cpu_net->forward(x).square().sum(), lg = gpu_net->forward(x.cuda()).square().sum();
  lc.backward();
  lg.backward();
  auto pc = cpu_net->parameters(), pg = gpu_net->parameters();
  for (size_t k = 0; k < pc.size(); ++k) expect_close(pg[k].grad().cpu(), pc[k].grad(), 1e-4, 1e-4);
}
