#include "jit/cpu_llvm/codegen_llvm.h"

#include <llvm/Analysis/TargetLibraryInfo.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/IRReader/IRReader.h>
#include <llvm/Object/ELFObjectFile.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Transforms/IPO/AlwaysInliner.h>
#include <llvm/Support/ErrorHandling.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>

#include <deque>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <functional>
#include <map>
#include <vector>
#include <mutex>
#include <unordered_map>

#include "jit/cpu_llvm/inline_vmath.h"
#include "jit/diag/diagnostics.h"
#include "jit/loop/row_cache.h"
#include "kernels/cpu/vmath.h"
#include "runtime/core/error.h"

namespace kiln::jit {
namespace {

using namespace llvm;

std::mutex g_mu;  // LLVM setup and the JIT's symbol table
std::string g_layout_hint;  // set_jit_data_layout(), read when the JIT is created

// LLVM reports backend failures (e.g. LLVM 16's x86 "Cannot select" on some AVX-512 mask
// broadcasts) through report_fatal_error, which would abort the process. The handler turns
// them into a kiln::Error thrown out of the compile, which the code cache turns into an
// interpreter fallback for that kernel (logged once). The compile's own LLVMContext and
// TargetMachine are lost on that path.
[[noreturn]] void llvm_fatal(void*, const char* reason, bool) { throw Error(std::string("llvm: ") + reason); }

void init_llvm() {
  static std::once_flag once;
  std::call_once(once, [] {
    install_fatal_error_handler(llvm_fatal, nullptr);
    InitializeNativeTarget();
    InitializeNativeTargetAsmPrinter();
  });
}

// The host's triple, CPU and features, read once (cpuid parsing is too slow to repeat).
struct HostInfo {
  std::string triple, cpu;
  std::vector<std::string> features;  // "+name" / "-name", sorted
};
const HostInfo& host_info() {
  static const HostInfo info = [] {
    init_llvm();
    HostInfo h;
    h.triple = sys::getProcessTriple();
    h.cpu = sys::getHostCPUName().str();
    StringMap<bool> feats;
    if (sys::getHostCPUFeatures(feats))
      for (auto& f : feats) h.features.push_back((f.second ? "+" : "-") + f.first().str());
    std::sort(h.features.begin(), h.features.end());
    return h;
  }();
  return info;
}

orc::JITTargetMachineBuilder host_jtmb() {
  const HostInfo& h = host_info();
  orc::JITTargetMachineBuilder b{Triple(h.triple)};
  b.setCPU(h.cpu);
  b.addFeatures(h.features);
  b.setCodeGenOptLevel(CodeGenOpt::Aggressive);
  return b;
}

std::unique_ptr<TargetMachine> create_machine(orc::JITTargetMachineBuilder jtmb) {
  auto tm = jtmb.createTargetMachine();
  if (!tm) throw Error("llvm: cannot create target machine: " + toString(tm.takeError()));
  return std::move(*tm);
}
std::unique_ptr<TargetMachine> host_machine() { return create_machine(host_jtmb()); }

// The vector-ABI math libraries, loaded globally so kernels resolve their symbols: glibc's
// libmvec first (faster where it has a function; <= 4 ulp per glibc's manual), then SLEEF's
// GNU-ABI build (<= 1 ulp) for the rest — both export the same _ZGV* names. Needed by every
// process that loads kernels, not only by those that compile them (disk cache hits).
struct VectorMath {
  void* mvec = dlopen("libmvec.so.1", RTLD_NOW | RTLD_GLOBAL);
  void* sleef = dlopen("libsleefgnuabi.so.3", RTLD_NOW | RTLD_GLOBAL);
  bool has(const char* name) const { return (mvec && dlsym(mvec, name)) || (sleef && dlsym(sleef, name)); }
};
const VectorMath& sleef_library() {
  static const VectorMath libs;
  return libs;
}

// Whether kernels use 512-bit vectors: the host has AVX-512F and kiln's float32 math is its
// AVX-512 variant (kernels/cpu/vmath.h), so 16-lane loops call it natively.
bool wide_vectors(const TargetMachine& tm) {
  return vmath::have_vector16() && tm.getTargetFeatureString().contains("+avx512f");
}

// ---- vector math: kiln's scalar math entry points -> their AVX2 vector forms ----
// Kernels call kiln_vm_<f>[f] (kernels/cpu/vmath.h), never libm: every tier and the interpreter
// compute a transcendental with the same per-element function, so a value's bits do not depend
// on which tier runs it, on the vector width or on whether it falls in a loop's scalar tail.
// The vectorizer may use only the 8 x float / 4 x double forms (the ones the asmjit tier calls);
// at other widths it calls the scalar form per element (the same bits).
const std::vector<VecDesc>& vector_functions(const TargetMachine& tm) {
  // Leaked like the JIT below: background compiles may still run while statics are destroyed.
  static auto& names = *new std::deque<std::string>();
  static auto& descs = *new std::vector<VecDesc>();
  static std::once_flag once;
  std::call_once(once, [&] {
    if (!vmath::have_vector() || !tm.getTargetFeatureString().contains("+avx2")) return;
    for (int i = 0; i < vmath::kCount; ++i) {
      const std::string fn = vmath::name(static_cast<vmath::Fn>(i));
      for (bool f32 : {true, false}) {
        names.push_back("kiln_vm_" + fn + (f32 ? "f" : ""));
        StringRef s = names.back();
        names.push_back(std::string(f32 ? "kiln_vm8_" : "kiln_vm4_") + fn + (f32 ? "f" : ""));
        descs.push_back({s, names.back(), ElementCount::getFixed(f32 ? 8 : 4)});
        if (f32 && wide_vectors(tm)) {
          names.push_back("kiln_vm16_" + fn + "f");
          descs.push_back({s, names.back(), ElementCount::getFixed(16)});
        }
      }
    }
  });
  return descs;
}

// ---- IR emission ----
// Stack bytes a row kernel may keep a row's cached values in (jit/loop/row_cache.h).
constexpr int64_t kRowCacheBytes = 256 * 1024;

struct Emitter {
  const Kernel& k;
  LLVMContext& ctx;
  Module& mod;
  IRBuilder<> b;
  Function* fn = nullptr;
  std::vector<Value*> bufs, iparams, fparams, vars;
  std::vector<Value*> acc_val, acc_idx;
  std::vector<Value*> acc_nan;  // float max/min: whether a NaN was seen (else nullptr)
  std::vector<std::unordered_map<ExprId, Value*>> scopes;
  // Row cache (jit/loop/row_cache.h): one stack array of k.row_cache elements per slot; the
  // loop being emitted reads and writes its element `rcx` (its variable minus its start).
  RowCachePlan rc;
  std::vector<Value*> rc_slots;
  const RowCachePlan::LoopCache* cur_cache = nullptr;
  Value* rcx = nullptr;

  Emitter(const Kernel& kk, LLVMContext& c, Module& m) : k(kk), ctx(c), mod(m), b(c) {}

  Type* reg_type(DType t) {
    switch (t) {
      case DType::Bool: return b.getInt1Ty();
      case DType::Int32: return b.getInt32Ty();
      case DType::Int64: return b.getInt64Ty();
      case DType::Float32: return b.getFloatTy();
      case DType::Float64: return b.getDoubleTy();
      default: throw Error(std::string("llvm codegen: unsupported dtype ") + dtype_name(t));
    }
  }
  Type* mem_type(DType t) { return t == DType::Bool ? b.getInt8Ty() : reg_type(t); }

  Value* lookup(ExprId id) {
    for (size_t s = scopes.size(); s-- > 0;) {
      auto it = scopes[s].find(id);
      if (it != scopes[s].end()) return it->second;
    }
    return nullptr;
  }

  Value* call_math(const std::string& name, DType t, std::vector<Value*> args) {
    std::string fname = "kiln_vm_" + name + (t == DType::Float32 ? "f" : "");  // kernels/cpu/vmath.h
    Type* ty = reg_type(t);
    std::vector<Type*> tys(args.size(), ty);
    FunctionCallee f = mod.getOrInsertFunction(fname, FunctionType::get(ty, tys, false));
    if (auto* F = dyn_cast<Function>(f.getCallee())) {
      F->setDoesNotThrow();
      F->setDoesNotAccessMemory();
      F->addFnAttr(Attribute::WillReturn);
    }
    CallInst* c = b.CreateCall(f, args);
    c->setDoesNotAccessMemory();
    c->setDoesNotThrow();
    return c;
  }
  Value* intrinsic(Intrinsic::ID id, Value* x) { return b.CreateUnaryIntrinsic(id, x); }
  Value* fconst(DType t, double v) { return ConstantFP::get(reg_type(t), v); }

  Value* is_nan(Value* x) { return b.CreateFCmpUNO(x, x); }

  Value* convert(Value* v, DType from, DType to) {
    if (from == to) return v;
    Type* tt = reg_type(to);
    bool ff = is_floating(from), ft = is_floating(to);
    if (to == DType::Bool)
      return ff ? b.CreateFCmpUNE(v, ConstantFP::get(v->getType(), 0.0))
                : b.CreateICmpNE(v, ConstantInt::get(v->getType(), 0));
    if (from == DType::Bool) return ft ? b.CreateUIToFP(v, tt) : b.CreateZExt(v, tt);
    if (ff && ft) return b.CreateFPCast(v, tt);
    if (ff) return b.CreateFPToSI(v, tt);
    if (ft) return b.CreateSIToFP(v, tt);
    return b.CreateSExtOrTrunc(v, tt);
  }

  Value* unary(OpKind op, DType t, Value* x) {
    bool fl = is_floating(t);
    switch (op) {
      case OpKind::Neg: return fl ? b.CreateFNeg(x) : b.CreateNeg(x);
      case OpKind::Abs:
        return fl ? intrinsic(Intrinsic::fabs, x)
                  : b.CreateSelect(b.CreateICmpSLT(x, ConstantInt::get(x->getType(), 0)), b.CreateNeg(x), x);
      case OpKind::Sign:
        if (t == DType::Bool) return x;
        if (fl) {
          Value* pos = b.CreateUIToFP(b.CreateFCmpOGT(x, fconst(t, 0)), x->getType());
          Value* neg = b.CreateUIToFP(b.CreateFCmpOLT(x, fconst(t, 0)), x->getType());
          return b.CreateFSub(pos, neg);  // NaN -> 0, as PyTorch
        } else {
          Value* zero = ConstantInt::get(x->getType(), 0);
          return b.CreateSub(b.CreateZExt(b.CreateICmpSGT(x, zero), x->getType()),
                             b.CreateZExt(b.CreateICmpSLT(x, zero), x->getType()));
        }
      case OpKind::Relu:
        if (fl) return b.CreateSelect(b.CreateFCmpUGT(x, fconst(t, 0)), x, fconst(t, 0));
        return b.CreateSelect(b.CreateICmpSGT(x, ConstantInt::get(x->getType(), 0)), x,
                              ConstantInt::get(x->getType(), 0));
      case OpKind::Floor: return fl ? intrinsic(Intrinsic::floor, x) : x;
      case OpKind::Ceil: return fl ? intrinsic(Intrinsic::ceil, x) : x;
      case OpKind::Round: return fl ? intrinsic(Intrinsic::nearbyint, x) : x;
      case OpKind::LogicalNot:
        return fl ? b.CreateFCmpOEQ(x, fconst(t, 0)) : b.CreateICmpEQ(x, ConstantInt::get(x->getType(), 0));
      case OpKind::BitwiseNot: return b.CreateNot(x);
      default: break;
    }
    if (!fl && (op == OpKind::IsNan || op == OpKind::IsFinite))
      return b.getInt1(op == OpKind::IsFinite);  // ints: never NaN
    if (!fl) throw Error(std::string("llvm codegen: ") + op_name(op) + " on integers");
    switch (op) {
      case OpKind::Exp: return call_math("exp", t, {x});
      case OpKind::Exp2: return call_math("exp2", t, {x});
      case OpKind::Expm1: return call_math("expm1", t, {x});
      case OpKind::Log: return call_math("log", t, {x});
      case OpKind::Log2: return call_math("log2", t, {x});
      case OpKind::Log1p: return call_math("log1p", t, {x});
      case OpKind::Sqrt: return intrinsic(Intrinsic::sqrt, x);
      case OpKind::Rsqrt: return b.CreateFDiv(fconst(t, 1), intrinsic(Intrinsic::sqrt, x));
      case OpKind::Reciprocal: return b.CreateFDiv(fconst(t, 1), x);
      case OpKind::Sin: return call_math("sin", t, {x});
      case OpKind::Cos: return call_math("cos", t, {x});
      case OpKind::Tan: return call_math("tan", t, {x});
      case OpKind::Atan: return call_math("atan", t, {x});
      case OpKind::Tanh: return call_math("tanh", t, {x});
      case OpKind::Erf: return call_math("erf", t, {x});
      case OpKind::Sigmoid:
        return b.CreateFDiv(fconst(t, 1), b.CreateFAdd(fconst(t, 1), call_math("exp", t, {b.CreateFNeg(x)})));
      case OpKind::IsNan: return is_nan(x);
      case OpKind::IsFinite: return b.CreateFCmpOLT(intrinsic(Intrinsic::fabs, x), fconst(t, INFINITY));
      default: break;
    }
    throw Error(std::string("llvm codegen: no lowering for ") + op_name(op));
  }

  Value* binary(OpKind op, DType t, Value* x, Value* y) {
    bool fl = is_floating(t), bl = t == DType::Bool;
    switch (op) {
      case OpKind::Add: return fl ? b.CreateFAdd(x, y) : bl ? b.CreateOr(x, y) : b.CreateAdd(x, y);
      case OpKind::Sub: return fl ? b.CreateFSub(x, y) : b.CreateSub(x, y);
      case OpKind::Mul: return fl ? b.CreateFMul(x, y) : bl ? b.CreateAnd(x, y) : b.CreateMul(x, y);
      case OpKind::Div: return b.CreateFDiv(x, y);
      case OpKind::Pow: return call_math("pow", t, {x, y});
      case OpKind::Atan2: return call_math("atan2", t, {x, y});
      case OpKind::Maximum:
      case OpKind::Minimum: {
        bool mx = op == OpKind::Maximum;
        if (fl) {
          Value* pick = mx ? b.CreateFCmpOGT(x, y) : b.CreateFCmpOLT(x, y);
          Value* nan = b.CreateOr(is_nan(x), is_nan(y));
          return b.CreateSelect(nan, b.CreateFAdd(x, y), b.CreateSelect(pick, x, y));
        }
        Value* pick = bl ? (mx ? b.CreateICmpUGT(x, y) : b.CreateICmpULT(x, y))
                         : (mx ? b.CreateICmpSGT(x, y) : b.CreateICmpSLT(x, y));
        return b.CreateSelect(pick, x, y);
      }
      case OpKind::Remainder: {  // float only (integer forms stay on the checked interpreter)
        Value* r = b.CreateFRem(x, y);
        Value* adjust = b.CreateAnd(b.CreateFCmpUNE(r, fconst(t, 0)),
                                    b.CreateXor(b.CreateFCmpOLT(y, fconst(t, 0)), b.CreateFCmpOLT(r, fconst(t, 0))));
        return b.CreateSelect(adjust, b.CreateFAdd(r, y), r);
      }
      case OpKind::Fmod: return b.CreateFRem(x, y);
      case OpKind::Eq: return fl ? b.CreateFCmpOEQ(x, y) : b.CreateICmpEQ(x, y);
      case OpKind::Ne: return fl ? b.CreateFCmpUNE(x, y) : b.CreateICmpNE(x, y);
      case OpKind::Lt: return fl ? b.CreateFCmpOLT(x, y) : bl ? b.CreateICmpULT(x, y) : b.CreateICmpSLT(x, y);
      case OpKind::Le: return fl ? b.CreateFCmpOLE(x, y) : bl ? b.CreateICmpULE(x, y) : b.CreateICmpSLE(x, y);
      case OpKind::Gt: return fl ? b.CreateFCmpOGT(x, y) : bl ? b.CreateICmpUGT(x, y) : b.CreateICmpSGT(x, y);
      case OpKind::Ge: return fl ? b.CreateFCmpOGE(x, y) : bl ? b.CreateICmpUGE(x, y) : b.CreateICmpSGE(x, y);
      case OpKind::LogicalAnd: return b.CreateAnd(convert(x, t, DType::Bool), convert(y, t, DType::Bool));
      case OpKind::LogicalOr: return b.CreateOr(convert(x, t, DType::Bool), convert(y, t, DType::Bool));
      case OpKind::LogicalXor: return b.CreateXor(convert(x, t, DType::Bool), convert(y, t, DType::Bool));
      case OpKind::BitwiseAnd: return b.CreateAnd(x, y);
      case OpKind::BitwiseOr: return b.CreateOr(x, y);
      case OpKind::BitwiseXor: return b.CreateXor(x, y);
      default: break;
    }
    throw Error(std::string("llvm codegen: no lowering for ") + op_name(op));
  }

  Value* gep(int buffer, Value* index) {
    return b.CreateInBoundsGEP(mem_type(k.buffers[buffer].dtype), bufs[buffer], index);
  }

  // Whether the statements of loop `L`, its written values read back as after hoisting, still
  // evaluate `r` (what lies under a value read back is not evaluated).
  bool main_loop_reads(const Stmt& L, const RowCachePlan::LoopCache& c, ExprId r) const {
    std::vector<char> seen(k.exprs.size(), 0);
    std::vector<ExprId> stack;
    for (const Stmt& s : L.body)
      for (ExprId e : {s.value, s.index})
        if (e >= 0 && (s.kind == Stmt::Kind::AccUpdate || s.kind == Stmt::Kind::Store)) stack.push_back(e);
    while (!stack.empty()) {
      const ExprId x = stack.back();
      stack.pop_back();
      if (x < 0 || seen[static_cast<size_t>(x)]) continue;
      seen[static_cast<size_t>(x)] = 1;
      if (x == r) return true;
      if (c.reads.count(x) || c.writes.count(x)) continue;
      const Expr& e = k.exprs[static_cast<size_t>(x)];
      stack.insert(stack.end(), {e.a, e.b, e.c});
    }
    return false;
  }

  // Whether row loop `L` sums floats in order (no vectorizing) and computes values for later
  // loops that no accumulator of its own feeds: those can be computed in a loop before it.
  bool hoistable(const Stmt& L, const RowCachePlan::LoopCache& c) const {
    if (c.writes.empty()) return false;
    // A slot this loop reads and also writes (the row cache hands a value's slot on to one
    // computed from it): the hoisted loop overwrites it, so the main loop, which then reads the
    // written values back, must not need the value read from it by any other path (softmax's
    // exp loop needs only exp(x - max), read back; one that still needs x is not hoisted).
    for (const auto& [w_id, w_slot] : c.writes)
      for (const auto& [r_id, r_slot] : c.reads)
        if (w_slot == r_slot && main_loop_reads(L, c, r_id)) return false;
    std::vector<bool> updated(k.accs.size(), false);
    bool ordered = false;
    for (const Stmt& s : L.body)
      if (s.kind == Stmt::Kind::AccUpdate) {
        updated[static_cast<size_t>(s.acc)] = true;
        const AccSpec& a = k.accs[static_cast<size_t>(s.acc)];
        ordered = ordered || ((a.op == OpKind::Sum || a.op == OpKind::Prod) && is_floating(a.dtype));
      }
    if (!ordered) return false;
    const std::vector<char> reads_updated = reaches(k, [&](ExprId e) {
      const Expr& x = k.exprs[e];
      return (x.kind == Expr::Kind::Acc || x.kind == Expr::Kind::AccIndex) && updated[static_cast<size_t>(x.i)];
    });
    for (const auto& [id, slot] : c.writes)
      if (reads_updated[static_cast<size_t>(id)]) return false;
    return true;
  }

  // Inside a row loop (variable `var` from `lo`): its cached values and its element `rcx`.
  void enter_row(const RowCachePlan::LoopCache* cache, int var, Value* lo) {
    cur_cache = cache;
    rcx = b.CreateSub(vars[static_cast<size_t>(var)], lo, "", true, true);
  }

  Value* rc_elem(int slot) {
    return b.CreateInBoundsGEP(reg_type(rc.slots[static_cast<size_t>(slot)]), rc_slots[static_cast<size_t>(slot)], rcx);
  }

  Value* expr(ExprId id) {
    const Expr& e = k.exprs[id];
    bool volatile_value = e.kind == Expr::Kind::Acc || e.kind == Expr::Kind::AccIndex;
    if (!volatile_value)
      if (Value* v = lookup(id)) return v;
    if (cur_cache) {  // computed by an earlier loop over this row: read it back
      auto r = cur_cache->reads.find(id);
      if (r != cur_cache->reads.end()) {
        const DType st = rc.slots[static_cast<size_t>(r->second)];
        Value* v = convert(b.CreateLoad(reg_type(st), rc_elem(r->second)), st, e.dtype);
        scopes.back()[id] = v;
        return v;
      }
    }
    Value* v = compute(id);
    if (cur_cache) {  // later loops over this row read it back
      auto w = cur_cache->writes.find(id);
      if (w != cur_cache->writes.end())
        b.CreateStore(convert(v, e.dtype, rc.slots[static_cast<size_t>(w->second)]), rc_elem(w->second));
    }
    return v;
  }

  Value* compute(ExprId id) {
    const Expr& e = k.exprs[id];
    bool volatile_value = e.kind == Expr::Kind::Acc || e.kind == Expr::Kind::AccIndex;
    Value* v = nullptr;
    auto I = [&](ExprId x) { return expr(x); };
    switch (e.kind) {
      case Expr::Kind::IConst: v = b.getInt64(e.i); break;
      case Expr::Kind::FConst: v = fconst(e.dtype, e.f); break;
      case Expr::Kind::Param: v = iparams[e.i]; break;
      case Expr::Kind::FParam: v = fparams[e.i]; break;
      case Expr::Kind::Var: v = vars[e.i]; break;
      case Expr::Kind::IAdd: v = b.CreateAdd(I(e.a), I(e.b), "", false, true); break;
      case Expr::Kind::ISub: v = b.CreateSub(I(e.a), I(e.b), "", false, true); break;
      case Expr::Kind::IMul: v = b.CreateMul(I(e.a), I(e.b), "", false, true); break;
      case Expr::Kind::IDiv: v = b.CreateUDiv(I(e.a), I(e.b)); break;
      case Expr::Kind::IMod: v = b.CreateURem(I(e.a), I(e.b)); break;
      case Expr::Kind::IMin: {
        Value *x = I(e.a), *y = I(e.b);
        v = b.CreateSelect(b.CreateICmpSLT(x, y), x, y);
        break;
      }
      case Expr::Kind::Load: {
        Value* raw = b.CreateLoad(mem_type(e.dtype), gep(static_cast<int>(e.i), I(e.a)));
        v = e.dtype == DType::Bool ? b.CreateICmpNE(raw, b.getInt8(0)) : raw;
        break;
      }
      case Expr::Kind::Unary: v = unary(e.op, k.exprs[e.a].dtype, I(e.a)); break;
      case Expr::Kind::Binary: v = binary(e.op, k.exprs[e.a].dtype, I(e.a), I(e.b)); break;
      case Expr::Kind::Where: v = b.CreateSelect(I(e.a), I(e.b), I(e.c)); break;
      case Expr::Kind::Cast: v = convert(I(e.a), k.exprs[e.a].dtype, e.dtype); break;
      case Expr::Kind::Acc: v = acc_value(e.i); break;
      case Expr::Kind::AccIndex: v = b.CreateLoad(b.getInt64Ty(), acc_idx[e.i]); break;
    }
    if (!volatile_value) scopes.back()[id] = v;
    return v;
  }

  Value* identity(const AccSpec& a) {
    bool fl = is_floating(a.dtype);
    Type* t = reg_type(a.dtype);
    switch (a.op) {
      case OpKind::Sum: return fl ? ConstantFP::get(t, 0.0) : ConstantInt::get(t, 0);
      case OpKind::Prod: return fl ? ConstantFP::get(t, 1.0) : ConstantInt::get(t, 1);
      case OpKind::Amax:
      case OpKind::ArgMax: return fl ? ConstantFP::getInfinity(t, true) : ConstantInt::get(t, INT64_MIN);
      default: return fl ? ConstantFP::getInfinity(t, false) : ConstantInt::get(t, INT64_MAX);
    }
  }

  // The accumulated value of `acc` (NaN for a float max/min that saw one).
  Value* acc_value(int acc) {
    Value* v = b.CreateLoad(reg_type(k.accs[acc].dtype), acc_val[acc]);
    if (!acc_nan[acc]) return v;
    Value* nan = ConstantFP::getNaN(v->getType());
    return b.CreateSelect(b.CreateLoad(b.getInt1Ty(), acc_nan[acc]), nan, v);
  }

  void acc_update(const Stmt& s) {
    const AccSpec& a = k.accs[s.acc];
    bool fl = is_floating(a.dtype);
    Value* x = expr(s.value);
    x = convert(x, k.exprs[s.value].dtype, a.dtype);
    Type* t = reg_type(a.dtype);
    Value* cur = b.CreateLoad(t, acc_val[s.acc]);
    Value* next = nullptr;
    switch (a.op) {
      case OpKind::Sum: {
        if (fl) {
          auto* add = cast<Instruction>(b.CreateFAdd(cur, x));
          FastMathFlags f;
          f.setAllowReassoc();  // reductions may be reordered (vectorized); nothing else is
          add->setFastMathFlags(f);
          next = add;
        } else {
          next = b.CreateAdd(cur, x);
        }
        break;
      }
      case OpKind::Prod: next = fl ? b.CreateFMul(cur, x) : b.CreateMul(cur, x); break;
      case OpKind::Amax:
      case OpKind::Amin: {
        bool mx = a.op == OpKind::Amax;
        if (fl) {
          // maxnum/minnum skip NaNs and reduce in any order (the vectorizer takes them); a NaN
          // seen is kept in a flag that acc_value() turns back into NaN.
          // nnan/nsz let LLVM 16 vectorize the reduction: a NaN makes the value poison, which the
          // flag's select never returns.
          next = b.CreateBinaryIntrinsic(mx ? Intrinsic::maxnum : Intrinsic::minnum, cur, x);
          FastMathFlags f;
          f.setNoNaNs();
          f.setNoSignedZeros();
          cast<Instruction>(next)->setFastMathFlags(f);
          Value* seen = b.CreateLoad(b.getInt1Ty(), acc_nan[s.acc]);
          b.CreateStore(b.CreateOr(seen, is_nan(x)), acc_nan[s.acc]);
        } else {
          next = b.CreateSelect(mx ? b.CreateICmpSGT(x, cur) : b.CreateICmpSLT(x, cur), x, cur);
        }
        break;
      }
      case OpKind::ArgMax:
      case OpKind::ArgMin: {
        bool mx = a.op == OpKind::ArgMax;
        Value* idx = expr(s.index);
        Value* cur_i = b.CreateLoad(b.getInt64Ty(), acc_idx[s.acc]);
        Value* better;
        if (fl) {
          Value* strict = mx ? b.CreateFCmpOGT(x, cur) : b.CreateFCmpOLT(x, cur);
          better = b.CreateAnd(b.CreateNot(is_nan(cur)), b.CreateOr(strict, is_nan(x)));
        } else {
          better = mx ? b.CreateICmpSGT(x, cur) : b.CreateICmpSLT(x, cur);
        }
        Value* first = b.CreateICmpSLT(cur_i, b.getInt64(0));  // nothing seen yet
        better = b.CreateOr(better, first);
        b.CreateStore(b.CreateSelect(better, idx, cur_i), acc_idx[s.acc]);
        next = b.CreateSelect(better, x, cur);
        break;
      }
      default: throw Error("llvm codegen: unknown accumulator");
    }
    b.CreateStore(next, acc_val[s.acc]);
  }

  void loop(int var, Value* lo, Value* hi, const std::function<void()>& body) {
    BasicBlock* pre = b.GetInsertBlock();
    BasicBlock* head = BasicBlock::Create(ctx, "loop", fn);
    BasicBlock* bodyb = BasicBlock::Create(ctx, "body", fn);
    BasicBlock* exit = BasicBlock::Create(ctx, "exit", fn);
    b.CreateCondBr(b.CreateICmpSLT(lo, hi), head, exit);
    b.SetInsertPoint(head);
    PHINode* iv = b.CreatePHI(b.getInt64Ty(), 2);
    iv->addIncoming(lo, pre);
    b.CreateBr(bodyb);
    b.SetInsertPoint(bodyb);
    if (vars.size() <= static_cast<size_t>(var)) vars.resize(var + 1);
    vars[var] = iv;
    scopes.emplace_back();
    body();
    scopes.pop_back();
    Value* next = b.CreateAdd(iv, b.getInt64(1), "", true, true);
    iv->addIncoming(next, b.GetInsertBlock());
    b.CreateCondBr(b.CreateICmpSLT(next, hi), head, exit);
    b.SetInsertPoint(exit);
  }

  void stmts(const std::vector<Stmt>& ss) {
    for (const Stmt& s : ss) {
      switch (s.kind) {
        case Stmt::Kind::Loop: {
          Value* lo = expr(s.lo);
          Value* hi = expr(s.hi);
          const auto lc = rc.loops.find(&s);
          const RowCachePlan::LoopCache* cache = lc != rc.loops.end() ? &lc->second : nullptr;
          // A row loop summing floats in order does not vectorize: the values it keeps for later
          // loops (exp of a softmax) are computed first in a loop of their own, which does.
          RowCachePlan::LoopCache after;
          if (cache && hoistable(s, *cache)) {
            loop(s.var, lo, hi, [&] {
              enter_row(cache, s.var, lo);
              for (const auto& [id, slot] : cache->writes) expr(id);
              cur_cache = nullptr;
            });
            after.reads = cache->reads;
            after.reads.insert(cache->writes.begin(), cache->writes.end());
            cache = &after;
          }
          loop(s.var, lo, hi, [&] {
            if (cache) enter_row(cache, s.var, lo);  // a flat loop over the row
            stmts(s.body);
            cur_cache = nullptr;
          });
          break;
        }
        case Stmt::Kind::Store: {
          DType t = k.buffers[s.buffer].dtype;
          Value* v = convert(expr(s.value), k.exprs[s.value].dtype, t);
          if (t == DType::Bool) v = b.CreateZExt(v, b.getInt8Ty());
          b.CreateStore(v, gep(s.buffer, expr(s.index)));
          break;
        }
        case Stmt::Kind::AccInit:
          b.CreateStore(identity(k.accs[s.acc]), acc_val[s.acc]);
          b.CreateStore(b.getInt64(-1), acc_idx[s.acc]);
          if (acc_nan[s.acc]) b.CreateStore(b.getFalse(), acc_nan[s.acc]);
          break;
        case Stmt::Kind::AccUpdate: acc_update(s); break;
        case Stmt::Kind::AccStore: {
          Value* v = s.value ? static_cast<Value*>(b.CreateLoad(b.getInt64Ty(), acc_idx[s.acc])) : acc_value(s.acc);
          b.CreateStore(v, gep(s.buffer, expr(s.index)));
          break;
        }
      }
    }
  }

  void emit(const std::string& symbol) {
    Type* i64 = b.getInt64Ty();
    Type* ptr = b.getPtrTy();
    auto* fty = FunctionType::get(b.getVoidTy(), {i64, i64, ptr, ptr, ptr}, false);
    // The body takes each buffer as its own noalias argument; the exported entry unpacks the
    // array and calls it (inlined, the noalias facts become alias scopes for the vectorizer).
    std::vector<Type*> inner_args = {i64, i64};
    for (size_t i = 0; i < k.buffers.size(); ++i) inner_args.push_back(ptr);
    inner_args.push_back(ptr);
    inner_args.push_back(ptr);
    auto* ity = FunctionType::get(b.getVoidTy(), inner_args, false);
    Function* inner = Function::Create(ity, Function::InternalLinkage, symbol + "_body", mod);
    inner->addFnAttr(Attribute::AlwaysInline);
    inner->addFnAttr(Attribute::NoUnwind);
    for (size_t i = 0; i < k.buffers.size(); ++i) inner->addParamAttr(2 + i, Attribute::NoAlias);
    fn = inner;
    b.SetInsertPoint(BasicBlock::Create(ctx, "entry", inner));
    auto arg = inner->arg_begin();
    Value* begin = &*arg++;
    Value* end = &*arg++;
    for (size_t i = 0; i < k.buffers.size(); ++i) bufs.push_back(&*arg++);
    Value* ip = &*arg++;
    Value* fp = &*arg++;
    for (int i = 0; i < k.num_params; ++i)
      iparams.push_back(b.CreateLoad(i64, b.CreateConstInBoundsGEP1_64(i64, ip, i)));
    for (int i = 0; i < k.num_fparams; ++i)
      fparams.push_back(b.CreateLoad(b.getDoubleTy(), b.CreateConstInBoundsGEP1_64(b.getDoubleTy(), fp, i)));
    for (const AccSpec& a : k.accs) {
      acc_val.push_back(b.CreateAlloca(reg_type(a.dtype)));
      acc_idx.push_back(b.CreateAlloca(i64));
      bool nan_flag = is_floating(a.dtype) && (a.op == OpKind::Amax || a.op == OpKind::Amin);
      acc_nan.push_back(nan_flag ? b.CreateAlloca(b.getInt1Ty()) : nullptr);
    }
    rc = plan_row_cache(k, kRowCacheBytes, /*cache_loads=*/false);
    for (DType t : rc.slots) {
      AllocaInst* a = b.CreateAlloca(reg_type(t), b.getInt64(k.row_cache));
      a->setAlignment(Align(64));
      rc_slots.push_back(a);
    }
    scopes.emplace_back();
    loop(0, begin, end, [&] { stmts(k.body); });
    b.CreateRetVoid();

    Function* outer = Function::Create(fty, Function::ExternalLinkage, symbol, mod);
    outer->addFnAttr(Attribute::NoUnwind);
    b.SetInsertPoint(BasicBlock::Create(ctx, "entry", outer));
    auto oa = outer->arg_begin();
    Value* ob = &*oa++;
    Value* oe = &*oa++;
    Value* obufs = &*oa++;
    Value* oip = &*oa++;
    Value* ofp = &*oa++;
    std::vector<Value*> call_args = {ob, oe};
    for (size_t i = 0; i < k.buffers.size(); ++i)
      call_args.push_back(b.CreateLoad(ptr, b.CreateConstInBoundsGEP1_64(ptr, obufs, i)));
    call_args.push_back(oip);
    call_args.push_back(ofp);
    b.CreateCall(inner, call_args);
    b.CreateRetVoid();
  }
};

std::unique_ptr<Module> build_module(const Kernel& k, const std::string& symbol, LLVMContext& ctx) {
  auto mod = std::make_unique<Module>(symbol, ctx);
  Emitter e(k, ctx, *mod);
  e.emit(symbol);
  std::string err;
  raw_string_ostream es(err);
  if (verifyModule(*mod, &es)) throw Error("llvm codegen produced invalid IR: " + es.str());
  return mod;
}

// Vectorizers of one compile attempt (a backend failure retries with fewer).
struct Vectorizers {
  bool loops = true, slp = true;
};

void optimize(Module& mod, TargetMachine& tm, Vectorizers vec) {
  mod.setDataLayout(tm.createDataLayout());
  mod.setTargetTriple(tm.getTargetTriple().str());
  LoopAnalysisManager lam;
  FunctionAnalysisManager fam;
  CGSCCAnalysisManager cgam;
  ModuleAnalysisManager mam;
  PipelineTuningOptions pto;
  pto.LoopVectorization = vec.loops;
  pto.SLPVectorization = vec.slp;
  PassBuilder pb(&tm, pto);
  TargetLibraryInfoImpl tlii(tm.getTargetTriple());
  tlii.addVectorizableFunctions(vector_functions(tm));
  fam.registerPass([&] { return TargetLibraryAnalysis(tlii); });
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(OptimizationLevel::O3);
  // The vectorizers' calls of always-inline vector math (inline_vmath.h) are made after O3's
  // inliner ran: inline them last.
  mpm.addPass(AlwaysInlinerPass(/*InsertLifetimeIntrinsics=*/false));
  mpm.run(mod, mam);
}

// ---- IR the x86 backend of LLVM 16 cannot take ----
// A lane read out of a vector of i1 (`extractelement <N x i1> %m, k`): the vectorizers make one
// when a compare they vectorized (the SLP vectorizer packs isnan/compare/logical results of
// neighbouring elements) also has scalar users, e.g. a bool byte (`zext i1 ... to i8`) that the
// loop vectorizer then broadcasts and shuffles with other bools. With AVX-512, the compare
// is a mask register (vXi1) and LLVM 16's DAG combiner folds the byte broadcast into a
// broadcast whose source is the mask itself (a v16i8/v32i8 X86ISD::VBROADCAST of a v8i1
// X86ISD::KSHIFTR), which no instruction selects: "Cannot select", or a segfault in SelectionDAG::Combine
// (peekThroughBitcasts) before any error is reported. The SLP vectorizer's choice is not the
// same in every process of one build (nor across kernel symbol names), so a kernel failed in some
// runs only; and the emitter's own IR (scalar compares, a bool byte as `zext i1`) cannot prevent it:
// any equivalent form of the byte is canonicalized back to `zext i1` before the vectorizers run.
// So after the optimizer, just before code generation, every such lane is read through bytes:
// `icmp ne (extractelement (zext %m to <N x i8>), k), 0`, the same value, which the backend
// computes in vector registers (a masked byte move, vpextrb) and never turns back into a mask
// broadcast. (The optimizer would undo it: InstCombine turns an extract of a zext into a zext of
// an extract.) It applies to every kernel and every producer of bools (compares, isnan/isfinite,
// logical ops, bools loaded from memory), on any target (elsewhere it costs a byte widening).
// Returns the number of lanes rewritten.
int mask_lanes_through_bytes(Module& mod) {
  int rewritten = 0;
  for (Function& f : mod) {
    // One widened copy per mask vector and block (the DAG is built per block).
    std::map<std::pair<Value*, BasicBlock*>, Value*> bytes;
    for (BasicBlock& bb : f) {
      for (Instruction& inst : make_early_inc_range(bb)) {
        auto* ex = dyn_cast<ExtractElementInst>(&inst);
        if (!ex) continue;
        auto* vt = dyn_cast<FixedVectorType>(ex->getVectorOperandType());
        if (!vt || !vt->getElementType()->isIntegerTy(1)) continue;
        IRBuilder<> b(ex);
        Value*& wide = bytes[{ex->getVectorOperand(), &bb}];
        if (!wide) {
          // At the first lane read of this block (dominates the later ones in it).
          wide = b.CreateZExt(ex->getVectorOperand(), FixedVectorType::get(b.getInt8Ty(), vt->getNumElements()),
                              "mask.bytes");
        }
        Value* byte = b.CreateExtractElement(wide, ex->getIndexOperand(), "mask.lane");
        Value* lane = b.CreateICmpNE(byte, b.getInt8(0), ex->getName());
        ex->replaceAllUsesWith(lane);
        ex->eraseFromParent();
        ++rewritten;
      }
    }
  }
  return rewritten;
}

// Code generation of an optimized module (after mask_lanes_through_bytes).
std::string emit_object(Module& mod, TargetMachine& tm) {
  SmallVector<char, 0> obj;
  raw_svector_ostream os(obj);
  legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, os, nullptr, CGFT_ObjectFile)) throw Error("llvm: target cannot emit object files");
  pm.run(mod);
  return std::string(obj.begin(), obj.end());
}

// The JIT's IR compiler: kiln never adds IR to the JIT, only objects.
struct ObjectsOnly final : orc::IRCompileLayer::IRCompiler {
  ObjectsOnly() : IRCompiler(orc::IRSymbolMapper::ManglingOptions()) {}
  Expected<std::unique_ptr<MemoryBuffer>> operator()(Module& m) override {
    return make_error<StringError>("kiln's JIT loads objects only (got IR module " + m.getName().str() + ")",
                                   inconvertibleErrorCode());
  }
};

// Never destroyed: loaded kernels (and background compiles) outlive static destruction.
orc::LLJIT& the_jit() {
  static orc::LLJIT* jit = [] {
    init_llvm();
    sleef_library();  // kernels loaded from the disk cache call SLEEF too
    // Kernels arrive as objects (compile_to_object), so the JIT needs no IR compiler (whose
    // TargetMachine costs time at every process start) and no platform (kernels have no
    // static initializers or atexit handlers): less time before the first disk-cache load.
    orc::LLJITBuilder builder;
    builder.setJITTargetMachineBuilder(host_jtmb());
    // A layout saved by an earlier process spares creating a TargetMachine just for it.
    if (!g_layout_hint.empty()) {
      if (auto dl = DataLayout::parse(g_layout_hint))
        builder.setDataLayout(*dl);
      else
        consumeError(dl.takeError());
    }
    builder.setCompileFunctionCreator(
        [](orc::JITTargetMachineBuilder) -> Expected<std::unique_ptr<orc::IRCompileLayer::IRCompiler>> {
          return std::make_unique<ObjectsOnly>();
        });
    builder.setPlatformSetUp(orc::setUpInactivePlatform);
    auto j = builder.create();
    if (!j) throw Error("llvm: cannot create LLJIT: " + toString(j.takeError()));
    const char prefix = (*j)->getDataLayout().getGlobalPrefix();
    // Vector math entry points that only forward to a library function are bound to it
    // (defined symbols win over the generators below): one call less per vector.
    orc::SymbolMap direct;
    for (int i = 0; i < vmath::kCount; ++i)
      for (int lanes : {8, 16})
        if (const void* f = vmath::direct_entry(static_cast<vmath::Fn>(i), lanes))
          direct[(*j)->mangleAndIntern("kiln_vm" + std::to_string(lanes) + "_" +
                                       vmath::name(static_cast<vmath::Fn>(i)) + "f")] =
              JITEvaluatedSymbol(pointerToJITTargetAddress(f), JITSymbolFlags::Exported | JITSymbolFlags::Callable);
    if (auto err = (*j)->getMainJITDylib().define(orc::absoluteSymbols(std::move(direct))))
      throw Error("llvm: cannot bind the vector math entry points: " + toString(std::move(err)));
    // libmvec is searched first: SLEEF, linked into kiln, would otherwise win every _ZGV* name
    // the two libraries share (process symbols resolve in load order).
    if (auto mvec = orc::DynamicLibrarySearchGenerator::Load("libmvec.so.1", prefix))
      (*j)->getMainJITDylib().addGenerator(std::move(*mvec));
    else
      consumeError(mvec.takeError());
    auto gen = orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(prefix);
    if (!gen) throw Error("llvm: " + toString(gen.takeError()));
    (*j)->getMainJITDylib().addGenerator(std::move(*gen));
    return j->release();
  }();
  return *jit;
}

std::string compile_once(const Kernel& k, const std::string& symbol, std::string* optimized_ir, Vectorizers vec) {
  auto tm = host_machine();
  vector_functions(*tm);
  LLVMContext ctx;
  auto mod = build_module(k, symbol, ctx);
  if (wide_vectors(*tm)) {  // 16 floats a vector (LLVM prefers 256 bits on AVX-512 hosts otherwise)
    for (Function& f : *mod)
      if (!f.isDeclaration()) f.addFnAttr("prefer-vector-width", "512");
    define_inline_vector_math(*mod);
  }
  optimize(*mod, *tm, vec);
  drop_inline_vector_math(*mod);
  const int lanes = mask_lanes_through_bytes(*mod);
  if (lanes > 0 && log_enabled("codegen"))
    log_line("codegen", symbol + ": " + std::to_string(lanes) + " i1-vector lane reads go through bytes (LLVM 16 x86)");
  if (optimized_ir) {
    optimized_ir->clear();
    raw_string_ostream os(*optimized_ir);
    mod->print(os, nullptr);
    os.flush();
    // Written before code generation, so IR that makes LLVM's backend fail is on disk.
    dump_file(symbol + ".opt.ll", *optimized_ir);
  }
  return emit_object(*mod, *tm);
}

}  // namespace

std::string emit_llvm_ir(const Kernel& k, const std::string& symbol) {
  LLVMContext ctx;
  auto mod = build_module(k, symbol, ctx);
  std::string s;
  raw_string_ostream os(s);
  mod->print(os, nullptr);
  return os.str();
}

std::string compile_to_object(const Kernel& k, const std::string& symbol, std::string* optimized_ir) {
  // A backend failure that still reports an error (LLVM's fatal-error handler throws: the known
  // AVX-512 mask-lane pattern never reaches the backend, see mask_lanes_through_bytes) is
  // compiled again without the SLP vectorizer, then without any vectorizer, before the caller
  // falls back to the interpreter. A backend crash (segfault) cannot be caught this way.
  const Vectorizers attempts[] = {{true, true}, {true, false}, {false, false}};
  std::string first_error;
  for (const Vectorizers& vec : attempts) {
    try {
      std::string obj = compile_once(k, symbol, optimized_ir, vec);
      if (!first_error.empty() && log_enabled("codegen"))
        log_line("codegen", symbol + ": compiled with " + (vec.loops ? "the loop vectorizer only" : "no vectorizer") +
                                " after: " + first_error.substr(0, 200));
      return obj;
    } catch (const Error& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  throw Error(first_error);
}

std::string compile_ir_to_object(const std::string& ir, const std::string& cpu, const std::string& features,
                                 int* lanes_rewritten) {
  init_llvm();
  orc::JITTargetMachineBuilder jtmb = host_jtmb();
  if (!cpu.empty()) {
    jtmb = orc::JITTargetMachineBuilder(Triple(host_info().triple));
    jtmb.setCPU(cpu);
    jtmb.setCodeGenOptLevel(CodeGenOpt::Aggressive);
  }
  if (!features.empty()) {
    std::vector<std::string> fs;
    for (size_t pos = 0; pos <= features.size();) {
      size_t comma = std::min(features.find(',', pos), features.size());
      if (comma > pos) fs.push_back(features.substr(pos, comma - pos));
      pos = comma + 1;
    }
    jtmb.addFeatures(fs);
  }
  auto tm = create_machine(std::move(jtmb));
  LLVMContext ctx;
  SMDiagnostic diag;
  std::unique_ptr<Module> mod = parseIR(MemoryBufferRef(ir, "kiln-ir"), diag, ctx);
  if (!mod) {
    std::string msg;
    raw_string_ostream os(msg);
    diag.print("kiln-ir", os);
    throw Error("llvm: cannot parse IR: " + os.str());
  }
  mod->setDataLayout(tm->createDataLayout());
  mod->setTargetTriple(tm->getTargetTriple().str());
  const int lanes = mask_lanes_through_bytes(*mod);
  if (lanes_rewritten) *lanes_rewritten = lanes;
  return emit_object(*mod, *tm);
}

// KILN_PERF_MAP=1: each loaded kernel's address range and name go to /tmp/perf-<pid>.map,
// where `perf report` finds names for JIT code (the size is the symbol's in the object).
static void note_for_perf(const std::string& object, const std::string& symbol, const void* addr) {
  static const bool on = [] {
    const char* e = std::getenv("KILN_PERF_MAP");
    return e && *e && std::string(e) != "0";
  }();
  if (!on) return;
  uint64_t size = 0;
  auto obj = object::ObjectFile::createObjectFile(MemoryBufferRef(object, symbol));
  if (!obj) {
    consumeError(obj.takeError());
    return;
  }
  if (!isa<object::ELFObjectFileBase>(obj->get())) return;  // (symbol sizes: ELF's)
  for (const object::SymbolRef& sym : (*obj)->symbols()) {
    auto name = sym.getName();
    if (!name) {
      consumeError(name.takeError());
      continue;
    }
    if (*name == symbol) size = object::ELFSymbolRef(sym).getSize();
  }
  static FILE* map = std::fopen(("/tmp/perf-" + std::to_string(::getpid()) + ".map").c_str(), "a");
  if (!map || size == 0) return;
  std::fprintf(map, "%lx %lx %s\n", reinterpret_cast<unsigned long>(addr), static_cast<unsigned long>(size),
               symbol.c_str());
  std::fflush(map);
}

KernelFn load_object(const std::string& object, const std::string& symbol) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& jit = the_jit();
  if (auto sym = jit.lookup(symbol))
    return sym->toPtr<KernelFn>();
  else
    consumeError(sym.takeError());
  auto buf = MemoryBuffer::getMemBufferCopy(object, symbol);
  if (auto err = jit.addObjectFile(std::move(buf)))
    throw Error("llvm: cannot load kernel object: " + toString(std::move(err)));
  auto sym = jit.lookup(symbol);
  if (!sym) throw Error("llvm: kernel symbol missing: " + toString(sym.takeError()));
  note_for_perf(object, symbol, sym->toPtr<const void*>());
  return sym->toPtr<KernelFn>();
}

std::string llvm_target_id() {
  const HostInfo& h = host_info();
  std::string id = "llvm" LLVM_VERSION_STRING ";" + h.cpu + ";";
  for (const std::string& f : h.features)
    if (f[0] == '+') id += f.substr(1) + ",";
  // The vector math kernels call or inline (KILN_NO_AVX512 changes it on the same host): a kernel
  // with kiln's exp inlined must not be loaded where the interpreter computes libmvec's.
  id += vmath::have_vector16() ? ";vm16" : ";vm8";
  for (vmath::Fn f : {vmath::Fn::Exp, vmath::Fn::Erf})
    if (vmath::uses_own16(f)) id += std::string(",own-") + vmath::name(f);
  return id;
}

std::string host_data_layout() { return host_machine()->createDataLayout().getStringRepresentation(); }

void set_jit_data_layout(const std::string& layout) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_layout_hint = layout;
}

}  // namespace kiln::jit
