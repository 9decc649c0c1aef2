#include "jit/cpu_asmjit/codegen_asmjit.h"

#include "jit/diag/diagnostics.h"
#include "kernels/cpu/vmath.h"

#include <asmjit/x86.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <type_traits>
#include <unordered_map>

// asmjit's debug output writes here (the build renames its reference to libc's `stderr`,
// which a shared library cannot take from a non-PIC archive member).
extern "C" __attribute__((visibility("hidden"))) FILE* kiln_asmjit_stderr;
FILE* kiln_asmjit_stderr = stderr;

namespace kiln::jit {
namespace {

using namespace asmjit;

// The code of every kernel stays mapped for the life of the process: plans on other threads
// may be running it when a faster tier replaces it.
JitRuntime& runtime() {
  static JitRuntime* rt = new JitRuntime();
  return *rt;
}

struct Throwing : ErrorHandler {
  void handleError(Error, const char* message, BaseEmitter*) override {
    throw AsmjitError(std::string("asmjit: ") + message);
  }
};

constexpr size_t kMaxExprs = 256;  // larger kernels go to LLVM (asmjit's compiles grow slow)

[[noreturn]] void unsupported(const std::string& what) { throw AsmjitError("asmjit codegen: " + what); }

// ---- math the generated code calls ----
// Transcendentals are kiln's shared functions (kernels/cpu/vmath.h): the same bits as the LLVM
// tier and the interpreter, lane by lane or scalar. Vector loops call the 8 x f32 / 4 x f64
// form once per vector (through a stack slot), scalar code the scalar form.
int vm_fn(OpKind op) {  // vmath::Fn of op, or -1
  switch (op) {
    case OpKind::Exp: return static_cast<int>(vmath::Fn::Exp);
    case OpKind::Exp2: return static_cast<int>(vmath::Fn::Exp2);
    case OpKind::Expm1: return static_cast<int>(vmath::Fn::Expm1);
    case OpKind::Log: return static_cast<int>(vmath::Fn::Log);
    case OpKind::Log2: return static_cast<int>(vmath::Fn::Log2);
    case OpKind::Log1p: return static_cast<int>(vmath::Fn::Log1p);
    case OpKind::Sin: return static_cast<int>(vmath::Fn::Sin);
    case OpKind::Cos: return static_cast<int>(vmath::Fn::Cos);
    case OpKind::Tan: return static_cast<int>(vmath::Fn::Tan);
    case OpKind::Atan: return static_cast<int>(vmath::Fn::Atan);
    case OpKind::Tanh: return static_cast<int>(vmath::Fn::Tanh);
    case OpKind::Erf: return static_cast<int>(vmath::Fn::Erf);
    case OpKind::Pow: return static_cast<int>(vmath::Fn::Pow);
    case OpKind::Atan2: return static_cast<int>(vmath::Fn::Atan2);
    default: return -1;
  }
}
template <class T>
T vm1(T x, int f) {
  if constexpr (std::is_same_v<T, float>)
    return vmath::f32(static_cast<vmath::Fn>(f), x);
  else
    return vmath::f64(static_cast<vmath::Fn>(f), x);
}
template <class T>
T vm2(T x, T y, int f) {
  if constexpr (std::is_same_v<T, float>)
    return vmath::f32(static_cast<vmath::Fn>(f), x, y);
  else
    return vmath::f64(static_cast<vmath::Fn>(f), x, y);
}
template <class T>
T sigmoid(T x) {
  return vmath::sigmoid(x);
}
template <class T>
T remainder_py(T x, T y) {
  T r = std::fmod(x, y);
  if (r != 0 && ((y < 0) != (r < 0))) r += y;
  return r;
}

template <class T>
using Fn1 = T (*)(T);
template <class T>
using Fn2 = T (*)(T, T);

#define KILN_VM1(F) [](T x) -> T { return vm1<T>(x, static_cast<int>(vmath::Fn::F)); }
template <class T>
Fn1<T> unary_fn(OpKind op) {
  switch (op) {
    case OpKind::Exp: return KILN_VM1(Exp);
    case OpKind::Exp2: return KILN_VM1(Exp2);
    case OpKind::Expm1: return KILN_VM1(Expm1);
    case OpKind::Log: return KILN_VM1(Log);
    case OpKind::Log2: return KILN_VM1(Log2);
    case OpKind::Log1p: return KILN_VM1(Log1p);
    case OpKind::Sin: return KILN_VM1(Sin);
    case OpKind::Cos: return KILN_VM1(Cos);
    case OpKind::Tan: return KILN_VM1(Tan);
    case OpKind::Atan: return KILN_VM1(Atan);
    case OpKind::Tanh: return KILN_VM1(Tanh);
    case OpKind::Erf: return KILN_VM1(Erf);
    case OpKind::Sigmoid: return &sigmoid<T>;
    default: return nullptr;
  }
}
#undef KILN_VM1
template <class T>
Fn2<T> binary_fn(OpKind op) {
  switch (op) {
    case OpKind::Pow: return [](T x, T y) -> T { return vm2<T>(x, y, static_cast<int>(vmath::Fn::Pow)); };
    case OpKind::Atan2: return [](T x, T y) -> T { return vm2<T>(x, y, static_cast<int>(vmath::Fn::Atan2)); };
    case OpKind::Fmod: return [](T x, T y) -> T { return std::fmod(x, y); };
    case OpKind::Remainder: return &remainder_py<T>;
    default: return nullptr;
  }
}
template <class T>
void lanes1(T* p, int64_t n, Fn1<T> f) {
  for (int64_t i = 0; i < n; ++i) p[i] = f(p[i]);
}
template <class T>
void lanes2(T* p, const T* q, int64_t n, Fn2<T> f) {
  for (int64_t i = 0; i < n; ++i) p[i] = f(p[i], q[i]);
}
// One vector of a vmath function in place (q: second operand or null): 8 floats / 4 doubles.
void vm_vec_f32(float* p, const float* q, int64_t f) { vmath::apply8f(static_cast<vmath::Fn>(f), p, q); }
void vm_vec_f64(double* p, const double* q, int64_t f) { vmath::apply4d(static_cast<vmath::Fn>(f), p, q); }
void sigmoid_vec_f32(float* p) {
  for (int i = 0; i < 8; ++i) p[i] = -p[i];
  vmath::apply8f(vmath::Fn::Exp, p, nullptr);
  for (int i = 0; i < 8; ++i) p[i] = 1.0f / (1.0f + p[i]);
}
void sigmoid_vec_f64(double* p) {
  for (int i = 0; i < 4; ++i) p[i] = -p[i];
  vmath::apply4d(vmath::Fn::Exp, p, nullptr);
  for (int i = 0; i < 4; ++i) p[i] = 1.0 / (1.0 + p[i]);
}

// AVX compare predicates.
constexpr uint32_t kEqOQ = 0x00, kUnord = 0x03, kNleUQ = 0x06, kNeqUQ = 0x04, kTrueUQ = 0x0F, kLtOQ = 0x11,
                   kLeOQ = 0x12, kGeOQ = 0x1D, kGtOQ = 0x1E;

bool is_index_kind(Expr::Kind k) {
  return k == Expr::Kind::IConst || k == Expr::Kind::Param || k == Expr::Kind::Var || k == Expr::Kind::IAdd ||
         k == Expr::Kind::ISub || k == Expr::Kind::IMul || k == Expr::Kind::IDiv || k == Expr::Kind::IMod ||
         k == Expr::Kind::IMin;
}

uint32_t shift_of(DType t) {
  switch (t) {
    case DType::Bool: return 0;
    case DType::Int32:
    case DType::Float32: return 2;
    default: return 3;
  }
}

// A scalar value: ints and bools (0/1) in a 64-bit register (int32 sign-extended), floats in xmm.
struct SVal {
  x86::Gp g;
  x86::Xmm x;
};

struct Emitter {
  const Kernel& k;
  x86::Compiler& cc;
  bool avx2;

  x86::Gp begin, end, bufs_arg, ip_arg, fp_arg;
  std::vector<x86::Gp> bufs;
  std::vector<bool> buf_loaded;
  std::vector<x86::Gp> vars;
  std::vector<int> var_level;
  std::vector<int> level_memo;

  // Code regions by loop depth: 0 = function entry, d = the body of the loop at depth d. Values
  // are emitted in the outermost region where all their operands exist (loop-invariant code
  // motion): `pre[d]` is region d's insertion point before its nested loop.
  struct Region {
    BaseNode* pre = nullptr;
    std::unordered_map<ExprId, SVal> cache;
  };
  std::vector<Region> regions;
  int at = 0;  // region the cursor is in

  // Vector loop state.
  bool vec = false;
  int vloop_level = 0;
  int vvar = -1;
  bool vf32 = true;
  std::unordered_map<ExprId, x86::Ymm> vcache;
  std::unordered_map<ExprId, bool> vok_memo;
  std::map<std::pair<uint64_t, bool>, x86::Xmm> sconsts;  // (bits of the double, f32)
  std::unordered_map<uint64_t, x86::Ymm> vconsts;

  Emitter(const Kernel& kk, x86::Compiler& c, bool has_avx2) : k(kk), cc(c), avx2(has_avx2) {}

  // ---- analysis ----
  void assign_levels(const std::vector<Stmt>& ss, int depth) {
    for (const Stmt& s : ss) {
      if (s.kind == Stmt::Kind::Loop) {
        if (var_level.size() <= static_cast<size_t>(s.var)) var_level.resize(s.var + 1, 0);
        var_level[s.var] = depth + 1;
        assign_levels(s.body, depth + 1);
      } else if (s.kind != Stmt::Kind::Store) {
        unsupported("accumulators (reductions) are not handled by the asmjit tier");
      }
    }
  }
  int level(ExprId id) {
    int& m = level_memo[id];
    if (m >= 0) return m;
    const Expr& e = k.exprs[id];
    int l = 0;
    if (e.kind == Expr::Kind::Var) l = static_cast<size_t>(e.i) < var_level.size() ? var_level[e.i] : 0;
    if (e.kind == Expr::Kind::Acc || e.kind == Expr::Kind::AccIndex) unsupported("accumulator read");
    for (ExprId c : {e.a, e.b, e.c})
      if (c >= 0) l = std::max(l, level(c));
    return m = l;
  }

  // ---- helpers ----
  // Runs `f` with the cursor in region `l` (at its insertion point unless it is the current one).
  template <class F>
  auto in_region(int l, F&& f) {
    if (l >= at) return f();
    BaseNode* saved = cc.setCursor(regions[l].pre);
    int saved_at = at;
    at = l;
    auto r = f();
    regions[l].pre = cc.cursor();
    cc.setCursor(saved);
    at = saved_at;
    return r;
  }

  x86::Gp buf(int i) {
    if (!buf_loaded[i]) {
      in_region(0, [&] {
        bufs[i] = cc.newGpq();
        cc.mov(bufs[i], x86::qword_ptr(bufs_arg, i * 8));
        return 0;
      });
      buf_loaded[i] = true;
    }
    return bufs[i];
  }
  x86::Mem elem(int buffer, const x86::Gp& index, uint32_t size) {
    return x86::ptr(buf(buffer), index, shift_of(k.buffers[buffer].dtype), 0, size);
  }

  x86::Xmm sconst(bool f32, double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    auto key = std::make_pair(bits, f32);
    auto it = sconsts.find(key);
    if (it != sconsts.end()) return it->second;
    x86::Xmm r = in_region(0, [&] {
      x86::Xmm x = cc.newXmm();
      if (f32)
        cc.vmovss(x, cc.newFloatConst(ConstPoolScope::kLocal, static_cast<float>(v)));
      else
        cc.vmovsd(x, cc.newDoubleConst(ConstPoolScope::kLocal, v));
      return x;
    });
    sconsts[key] = r;
    return r;
  }
  x86::Ymm vconst(double v) {
    uint64_t key;
    std::memcpy(&key, &v, 8);
    auto it = vconsts.find(key);
    if (it != vconsts.end()) return it->second;
    x86::Ymm r = in_region(vloop_level - 1, [&] {
      x86::Ymm y = cc.newYmm();
      if (vf32)
        cc.vbroadcastss(y, cc.newFloatConst(ConstPoolScope::kLocal, static_cast<float>(v)));
      else
        cc.vbroadcastsd(y, cc.newDoubleConst(ConstPoolScope::kLocal, v));
      return y;
    });
    vconsts[key] = r;
    return r;
  }
  x86::Ymm vones() {  // all bits set (the "true" mask)
    auto it = vconsts.find(1);  // key 1 is the bit pattern of a denormal no kernel uses as a constant
    if (it != vconsts.end()) return it->second;
    x86::Ymm r = in_region(vloop_level - 1, [&] {
      x86::Ymm y = cc.newYmm();
      cc.vxorps(y, y, y);
      cc.vcmpps(y, y, y, kTrueUQ);
      return y;
    });
    vconsts[1] = r;
    return r;
  }

  x86::Gp bool_of_flag(x86::CondCode cond) {
    x86::Gp r = cc.newGpq();
    cc.set(cond, r.r8());
    cc.movzx(r.r32(), r.r8());
    return r;
  }
  x86::Gp wrap(DType t, x86::Gp g) {  // re-canonicalize an int32 result
    if (t == DType::Int32) cc.movsxd(g, g.r32());
    return g;
  }
  x86::Gp fcmp_scalar(bool f32, x86::Xmm a, x86::Xmm b, uint32_t pred) {
    x86::Xmm t = cc.newXmm();
    if (f32)
      cc.vcmpss(t, a, b, pred);
    else
      cc.vcmpsd(t, a, b, pred);
    x86::Gp r = cc.newGpq();
    cc.vmovd(r.r32(), t);
    cc.and_(r.r32(), 1);
    return r;
  }
  x86::Gp to_bool(DType t, const SVal& v) {
    if (t == DType::Bool) return v.g;
    if (is_floating(t)) return fcmp_scalar(t == DType::Float32, v.x, sconst(t == DType::Float32, 0.0), kNeqUQ);
    cc.test(v.g, v.g);
    return bool_of_flag(x86::CondCode::kNZ);
  }

  // ---- scalar code ----
  SVal sexpr(ExprId id) {
    int l = level(id);
    auto it = regions[l].cache.find(id);
    if (it != regions[l].cache.end()) return it->second;
    SVal v = in_region(l, [&] { return semit(id); });
    regions[l].cache[id] = v;
    return v;
  }

  SVal convert(SVal v, DType from, DType to) {
    if (from == to) return v;
    bool ff = is_floating(from), ft = is_floating(to);
    SVal r;
    if (to == DType::Bool) {
      r.g = to_bool(from, v);
      return r;
    }
    if (ff && ft) {
      r.x = cc.newXmm();
      if (to == DType::Float64)
        cc.vcvtss2sd(r.x, v.x, v.x);
      else
        cc.vcvtsd2ss(r.x, v.x, v.x);
      return r;
    }
    if (ff) {
      r.g = cc.newGpq();
      x86::Gp d = to == DType::Int32 ? r.g.r32() : r.g;  // int32: the 32-bit conversion, as C++ casts
      if (from == DType::Float32)
        cc.vcvttss2si(d, v.x);
      else
        cc.vcvttsd2si(d, v.x);
      r.g = wrap(to, r.g);
      return r;
    }
    if (ft) {
      r.x = cc.newXmm();
      cc.vxorps(r.x, r.x, r.x);
      if (to == DType::Float32)
        cc.vcvtsi2ss(r.x, r.x, v.g);
      else
        cc.vcvtsi2sd(r.x, r.x, v.g);
      return r;
    }
    r.g = cc.newGpq();
    cc.mov(r.g, v.g);
    return SVal{wrap(to, r.g), {}};  // int64 -> int32 wraps; bool/int32 -> wider are already canonical
  }

  SVal call1(bool f32, OpKind op, x86::Xmm x) {
    SVal r;
    r.x = cc.newXmm();
    InvokeNode* inv;
    if (f32)
      cc.invoke(&inv, reinterpret_cast<uint64_t>(unary_fn<float>(op)), FuncSignatureT<float, float>(CallConvId::kHost));
    else
      cc.invoke(&inv, reinterpret_cast<uint64_t>(unary_fn<double>(op)),
                FuncSignatureT<double, double>(CallConvId::kHost));
    inv->setArg(0, x);
    inv->setRet(0, r.x);
    return r;
  }
  SVal call2(bool f32, OpKind op, x86::Xmm x, x86::Xmm y) {
    SVal r;
    r.x = cc.newXmm();
    InvokeNode* inv;
    if (f32)
      cc.invoke(&inv, reinterpret_cast<uint64_t>(binary_fn<float>(op)),
                FuncSignatureT<float, float, float>(CallConvId::kHost));
    else
      cc.invoke(&inv, reinterpret_cast<uint64_t>(binary_fn<double>(op)),
                FuncSignatureT<double, double, double>(CallConvId::kHost));
    inv->setArg(0, x);
    inv->setArg(1, y);
    inv->setRet(0, r.x);
    return r;
  }

  SVal sunary(OpKind op, DType t, SVal a) {
    SVal r;
    if (!is_floating(t)) {
      bool bl = t == DType::Bool;
      switch (op) {
        case OpKind::Neg:
          if (bl) break;
          r.g = cc.newGpq();
          cc.mov(r.g, a.g);
          cc.neg(r.g);
          r.g = wrap(t, r.g);
          return r;
        case OpKind::Abs:
          if (bl) return a;
          r.g = cc.newGpq();
          cc.mov(r.g, a.g);
          cc.neg(r.g);
          cc.cmovl(r.g, a.g);
          r.g = wrap(t, r.g);
          return r;
        case OpKind::Sign: {
          if (bl) return a;
          cc.cmp(a.g, 0);
          x86::Gp gt = bool_of_flag(x86::CondCode::kG);
          cc.cmp(a.g, 0);
          x86::Gp lt = bool_of_flag(x86::CondCode::kL);
          cc.sub(gt, lt);
          r.g = gt;
          return r;
        }
        case OpKind::Relu: {
          if (bl) return a;
          x86::Gp z = cc.newGpq();
          cc.xor_(z.r32(), z.r32());
          r.g = cc.newGpq();
          cc.mov(r.g, a.g);
          cc.cmp(a.g, 0);
          cc.cmovl(r.g, z);
          return r;
        }
        case OpKind::Floor:
        case OpKind::Ceil:
        case OpKind::Round: return a;
        case OpKind::LogicalNot:
          cc.test(a.g, a.g);
          r.g = bool_of_flag(x86::CondCode::kZ);
          return r;
        case OpKind::BitwiseNot:
          r.g = cc.newGpq();
          cc.mov(r.g, a.g);
          if (bl)
            cc.xor_(r.g, 1);
          else
            cc.not_(r.g);
          return r;
        case OpKind::IsNan:
        case OpKind::IsFinite:
          r.g = cc.newGpq();
          cc.mov(r.g, op == OpKind::IsFinite ? 1 : 0);
          return r;
        default: break;
      }
      unsupported(std::string(op_name(op)) + " on " + dtype_name(t));
    }
    bool f32 = t == DType::Float32;
    auto X = [&] { return cc.newXmm(); };
    switch (op) {
      case OpKind::Neg:
        r.x = X();
        cc.vxorps(r.x, a.x, sconst(f32, -0.0));
        return r;
      case OpKind::Abs:
        r.x = X();
        cc.vandnps(r.x, sconst(f32, -0.0), a.x);
        return r;
      case OpKind::Sqrt:
        r.x = X();
        if (f32)
          cc.vsqrtss(r.x, a.x, a.x);
        else
          cc.vsqrtsd(r.x, a.x, a.x);
        return r;
      case OpKind::Rsqrt:
      case OpKind::Reciprocal: {
        x86::Xmm d = a.x;
        if (op == OpKind::Rsqrt) {
          d = X();
          if (f32)
            cc.vsqrtss(d, a.x, a.x);
          else
            cc.vsqrtsd(d, a.x, a.x);
        }
        r.x = X();
        if (f32)
          cc.vdivss(r.x, sconst(f32, 1.0), d);
        else
          cc.vdivsd(r.x, sconst(f32, 1.0), d);
        return r;
      }
      case OpKind::Relu: {  // x if x > 0 or NaN, else +0 (not vmaxss: relu(-0) would be -0)
        x86::Xmm m = X();
        if (f32)
          cc.vcmpss(m, a.x, sconst(f32, 0.0), kNleUQ);
        else
          cc.vcmpsd(m, a.x, sconst(f32, 0.0), kNleUQ);
        r.x = X();
        cc.vandps(r.x, m, a.x);
        return r;
      }
      case OpKind::Floor:
      case OpKind::Ceil:
      case OpKind::Round: {
        uint32_t mode = op == OpKind::Floor ? 9 : op == OpKind::Ceil ? 10 : 8;
        r.x = X();
        if (f32)
          cc.vroundss(r.x, a.x, a.x, mode);
        else
          cc.vroundsd(r.x, a.x, a.x, mode);
        return r;
      }
      case OpKind::Sign: {
        x86::Xmm z = sconst(f32, 0.0), one = sconst(f32, 1.0);
        x86::Xmm p = X(), n = X();
        if (f32) {
          cc.vcmpss(p, a.x, z, kGtOQ);
          cc.vcmpss(n, a.x, z, kLtOQ);
        } else {
          cc.vcmpsd(p, a.x, z, kGtOQ);
          cc.vcmpsd(n, a.x, z, kLtOQ);
        }
        cc.vandps(p, p, one);
        cc.vandps(n, n, one);
        r.x = X();
        if (f32)
          cc.vsubss(r.x, p, n);
        else
          cc.vsubsd(r.x, p, n);
        return r;
      }
      case OpKind::IsNan: r.g = fcmp_scalar(f32, a.x, a.x, kUnord); return r;
      case OpKind::IsFinite: {
        x86::Xmm ab = X();
        cc.vandnps(ab, sconst(f32, -0.0), a.x);
        r.g = fcmp_scalar(f32, ab, sconst(f32, INFINITY), kLtOQ);
        return r;
      }
      case OpKind::LogicalNot: r.g = fcmp_scalar(f32, a.x, sconst(f32, 0.0), kEqOQ); return r;
      default: break;
    }
    if (unary_fn<float>(op)) return call1(f32, op, a.x);
    unsupported(std::string("no lowering for ") + op_name(op));
  }

  SVal sbinary(OpKind op, DType t, SVal a, SVal b) {
    SVal r;
    if (op == OpKind::LogicalAnd || op == OpKind::LogicalOr || op == OpKind::LogicalXor) {
      x86::Gp x = to_bool(t, a), y = to_bool(t, b);
      r.g = cc.newGpq();
      cc.mov(r.g, x);
      if (op == OpKind::LogicalAnd)
        cc.and_(r.g, y);
      else if (op == OpKind::LogicalOr)
        cc.or_(r.g, y);
      else
        cc.xor_(r.g, y);
      return r;
    }
    if (!is_floating(t)) {
      bool bl = t == DType::Bool;
      auto arith = [&](auto emit_op) {
        r.g = cc.newGpq();
        cc.mov(r.g, a.g);
        emit_op(r.g, b.g);
        r.g = wrap(t, r.g);
        return r;
      };
      auto cmp = [&](x86::CondCode set) {
        cc.cmp(a.g, b.g);
        r.g = bool_of_flag(set);
        return r;
      };
      switch (op) {
        case OpKind::Add:
          return arith([&](x86::Gp d, x86::Gp s) {
            if (bl)
              cc.or_(d, s);
            else
              cc.add(d, s);
          });
        case OpKind::Sub:
          if (bl) break;
          return arith([&](x86::Gp d, x86::Gp s) { cc.sub(d, s); });
        case OpKind::Mul:
          return arith([&](x86::Gp d, x86::Gp s) {
            if (bl)
              cc.and_(d, s);
            else
              cc.imul(d, s);
          });
        case OpKind::Maximum:
        case OpKind::Minimum:
          r.g = cc.newGpq();
          cc.mov(r.g, a.g);
          cc.cmp(a.g, b.g);
          if (op == OpKind::Maximum)
            cc.cmovl(r.g, b.g);
          else
            cc.cmovg(r.g, b.g);
          return r;
        case OpKind::Eq: return cmp(x86::CondCode::kE);
        case OpKind::Ne: return cmp(x86::CondCode::kNE);
        case OpKind::Lt: return cmp(x86::CondCode::kL);
        case OpKind::Le: return cmp(x86::CondCode::kLE);
        case OpKind::Gt: return cmp(x86::CondCode::kG);
        case OpKind::Ge: return cmp(x86::CondCode::kGE);
        case OpKind::BitwiseAnd: return arith([&](x86::Gp d, x86::Gp s) { cc.and_(d, s); });
        case OpKind::BitwiseOr: return arith([&](x86::Gp d, x86::Gp s) { cc.or_(d, s); });
        case OpKind::BitwiseXor: return arith([&](x86::Gp d, x86::Gp s) { cc.xor_(d, s); });
        default: break;
      }
      unsupported(std::string(op_name(op)) + " on " + dtype_name(t));
    }
    bool f32 = t == DType::Float32;
    auto X = [&] { return cc.newXmm(); };
    switch (op) {
      case OpKind::Add:
        r.x = X();
        if (f32)
          cc.vaddss(r.x, a.x, b.x);
        else
          cc.vaddsd(r.x, a.x, b.x);
        return r;
      case OpKind::Sub:
        r.x = X();
        if (f32)
          cc.vsubss(r.x, a.x, b.x);
        else
          cc.vsubsd(r.x, a.x, b.x);
        return r;
      case OpKind::Mul:
        r.x = X();
        if (f32)
          cc.vmulss(r.x, a.x, b.x);
        else
          cc.vmulsd(r.x, a.x, b.x);
        return r;
      case OpKind::Div:
        r.x = X();
        if (f32)
          cc.vdivss(r.x, a.x, b.x);
        else
          cc.vdivsd(r.x, a.x, b.x);
        return r;
      case OpKind::Maximum:
      case OpKind::Minimum: {
        // NaN in either -> x + y (NaN); else the larger (smaller) one, y on ties, as LLVM's select.
        x86::Xmm m = X(), s = X(), u = X();
        bool mx = op == OpKind::Maximum;
        if (f32) {
          if (mx)
            cc.vmaxss(m, a.x, b.x);
          else
            cc.vminss(m, a.x, b.x);
          cc.vaddss(s, a.x, b.x);
          cc.vcmpss(u, a.x, b.x, kUnord);
        } else {
          if (mx)
            cc.vmaxsd(m, a.x, b.x);
          else
            cc.vminsd(m, a.x, b.x);
          cc.vaddsd(s, a.x, b.x);
          cc.vcmpsd(u, a.x, b.x, kUnord);
        }
        r.x = X();
        cc.vblendvps(r.x, m, s, u);
        return r;
      }
      case OpKind::Eq: r.g = fcmp_scalar(f32, a.x, b.x, kEqOQ); return r;
      case OpKind::Ne: r.g = fcmp_scalar(f32, a.x, b.x, kNeqUQ); return r;
      case OpKind::Lt: r.g = fcmp_scalar(f32, a.x, b.x, kLtOQ); return r;
      case OpKind::Le: r.g = fcmp_scalar(f32, a.x, b.x, kLeOQ); return r;
      case OpKind::Gt: r.g = fcmp_scalar(f32, a.x, b.x, kGtOQ); return r;
      case OpKind::Ge: r.g = fcmp_scalar(f32, a.x, b.x, kGeOQ); return r;
      default: break;
    }
    if (binary_fn<float>(op)) return call2(f32, op, a.x, b.x);
    unsupported(std::string("no lowering for ") + op_name(op) + " on " + dtype_name(t));
  }

  SVal semit(ExprId id) {
    const Expr& e = k.exprs[id];
    SVal r;
    auto G = [&](ExprId x) { return sexpr(x).g; };
    auto idx = [&](auto emit_op) {
      r.g = cc.newGpq();
      cc.mov(r.g, G(e.a));
      emit_op(r.g, G(e.b));
      return r;
    };
    switch (e.kind) {
      case Expr::Kind::IConst:
        r.g = cc.newGpq();
        cc.mov(r.g, e.i);
        return r;
      case Expr::Kind::FConst:
        if (!is_floating(e.dtype)) unsupported("integer FConst");
        r.x = sconst(e.dtype == DType::Float32, e.f);  // shared constant register (never written)
        return r;
      case Expr::Kind::Param:
        r.g = cc.newGpq();
        cc.mov(r.g, x86::qword_ptr(ip_arg, static_cast<int32_t>(e.i * 8)));
        return r;
      case Expr::Kind::FParam:
        r.x = cc.newXmm();
        cc.vmovsd(r.x, x86::qword_ptr(fp_arg, static_cast<int32_t>(e.i * 8)));
        return r;
      case Expr::Kind::Var: r.g = vars.at(e.i); return r;
      case Expr::Kind::IAdd: return idx([&](x86::Gp d, x86::Gp s) { cc.add(d, s); });
      case Expr::Kind::ISub: return idx([&](x86::Gp d, x86::Gp s) { cc.sub(d, s); });
      case Expr::Kind::IMul: return idx([&](x86::Gp d, x86::Gp s) { cc.imul(d, s); });
      case Expr::Kind::IMin:
        return idx([&](x86::Gp d, x86::Gp s) {
          cc.cmp(d, s);
          cc.cmovg(d, s);
        });
      case Expr::Kind::IDiv:
      case Expr::Kind::IMod: {
        bool div = e.kind == Expr::Kind::IDiv;
        const Expr& d = k.exprs[e.b];
        if (d.kind == Expr::Kind::IConst && d.i > 0 && (d.i & (d.i - 1)) == 0) {
          int sh = 0;
          while ((int64_t{1} << sh) != d.i) ++sh;
          r.g = cc.newGpq();
          cc.mov(r.g, G(e.a));
          if (div)
            cc.shr(r.g, sh);
          else {
            x86::Gp m = cc.newGpq();
            cc.mov(m, d.i - 1);
            cc.and_(r.g, m);
          }
          return r;
        }
        x86::Gp hi = cc.newGpq(), lo = cc.newGpq();
        cc.xor_(hi.r32(), hi.r32());
        cc.mov(lo, G(e.a));
        cc.div(hi, lo, G(e.b));
        r.g = div ? lo : hi;
        return r;
      }
      case Expr::Kind::Load: {
        int b = static_cast<int>(e.i);
        x86::Gp ix = G(e.a);
        switch (e.dtype) {
          case DType::Bool:
            r.g = cc.newGpq();
            cc.movzx(r.g.r32(), elem(b, ix, 1));
            return r;
          case DType::Int32:
            r.g = cc.newGpq();
            cc.movsxd(r.g, elem(b, ix, 4));
            return r;
          case DType::Int64:
            r.g = cc.newGpq();
            cc.mov(r.g, elem(b, ix, 8));
            return r;
          case DType::Float32:
            r.x = cc.newXmm();
            cc.vmovss(r.x, elem(b, ix, 4));
            return r;
          case DType::Float64:
            r.x = cc.newXmm();
            cc.vmovsd(r.x, elem(b, ix, 8));
            return r;
          default: unsupported(std::string("load of ") + dtype_name(e.dtype));
        }
      }
      case Expr::Kind::Unary: {
        DType t = k.exprs[e.a].dtype;
        check_dtype(t);
        return sunary(e.op, t, sexpr(e.a));
      }
      case Expr::Kind::Binary: {
        DType t = k.exprs[e.a].dtype;
        check_dtype(t);
        return sbinary(e.op, t, sexpr(e.a), sexpr(e.b));
      }
      case Expr::Kind::Where: {
        check_dtype(e.dtype);
        x86::Gp c = sexpr(e.a).g;
        SVal x = sexpr(e.b), y = sexpr(e.c);
        if (is_floating(e.dtype)) {
          x86::Gp m = cc.newGpq();
          cc.mov(m, c);
          cc.neg(m);
          x86::Xmm mx = cc.newXmm();
          cc.vmovq(mx, m);
          r.x = cc.newXmm();
          cc.vblendvpd(r.x, y.x, x.x, mx);
          return r;
        }
        r.g = cc.newGpq();
        cc.mov(r.g, y.g);
        cc.test(c, c);
        cc.cmovnz(r.g, x.g);
        return r;
      }
      case Expr::Kind::Cast:
        check_dtype(e.dtype);
        check_dtype(k.exprs[e.a].dtype);
        return convert(sexpr(e.a), k.exprs[e.a].dtype, e.dtype);
      case Expr::Kind::Acc:
      case Expr::Kind::AccIndex: break;
    }
    unsupported("accumulator read");
  }
  static void check_dtype(DType t) {
    if (t == DType::Float16 || t == DType::BFloat16) unsupported(std::string("dtype ") + dtype_name(t));
  }

  void store_scalar(const Stmt& s) {
    DType t = k.buffers[s.buffer].dtype;
    check_dtype(t);
    SVal v = convert(sexpr(s.value), k.exprs[s.value].dtype, t);
    x86::Gp ix = sexpr(s.index).g;
    switch (t) {
      case DType::Bool: cc.mov(elem(s.buffer, ix, 1), v.g.r8()); break;
      case DType::Int32: cc.mov(elem(s.buffer, ix, 4), v.g.r32()); break;
      case DType::Int64: cc.mov(elem(s.buffer, ix, 8), v.g); break;
      case DType::Float32: cc.vmovss(elem(s.buffer, ix, 4), v.x); break;
      case DType::Float64: cc.vmovsd(elem(s.buffer, ix, 8), v.x); break;
      default: unsupported("store dtype");
    }
  }

  // ---- vector code (one float type F per loop: 8 x f32 or 4 x f64 in ymm; bools are lane masks) ----
  DType vtype() const { return vf32 ? DType::Float32 : DType::Float64; }
  bool uniform(ExprId id) { return level(id) < vloop_level; }
  bool unit_affine(ExprId id) {
    if (uniform(id)) return false;
    const Expr& e = k.exprs[id];
    if (e.kind == Expr::Kind::Var) return e.i == vvar;
    if (e.kind == Expr::Kind::IAdd) return (unit_affine(e.a) && uniform(e.b)) || (uniform(e.a) && unit_affine(e.b));
    if (e.kind == Expr::Kind::ISub) return unit_affine(e.a) && uniform(e.b);
    return false;
  }
  bool vok(ExprId id) {
    auto it = vok_memo.find(id);
    if (it != vok_memo.end()) return it->second;
    bool ok = vok_uncached(id);
    vok_memo[id] = ok;
    return ok;
  }
  bool vok_uncached(ExprId id) {
    const Expr& e = k.exprs[id];
    const DType F = vtype();
    if (uniform(id)) return e.dtype == F || e.dtype == DType::Bool;
    if (is_index_kind(e.kind)) return false;
    switch (e.kind) {
      case Expr::Kind::Load: return e.dtype == F && unit_affine(e.a);
      case Expr::Kind::Unary: {
        DType t = k.exprs[e.a].dtype;
        if (!vok(e.a)) return false;
        if (t == DType::Bool) return e.op == OpKind::LogicalNot || e.op == OpKind::BitwiseNot;
        if (t != F) return false;
        switch (e.op) {
          case OpKind::Neg:
          case OpKind::Abs:
          case OpKind::Sqrt:
          case OpKind::Rsqrt:
          case OpKind::Reciprocal:
          case OpKind::Relu:
          case OpKind::Floor:
          case OpKind::Ceil:
          case OpKind::Round:
          case OpKind::Sign:
          case OpKind::IsNan:
          case OpKind::IsFinite:
          case OpKind::LogicalNot: return true;
          default: return unary_fn<float>(e.op) != nullptr;
        }
      }
      case Expr::Kind::Binary: {
        DType t = k.exprs[e.a].dtype;
        if (!vok(e.a) || !vok(e.b)) return false;
        if (t == DType::Bool) {
          switch (e.op) {
            case OpKind::LogicalAnd:
            case OpKind::LogicalOr:
            case OpKind::LogicalXor:
            case OpKind::BitwiseAnd:
            case OpKind::BitwiseOr:
            case OpKind::BitwiseXor:
            case OpKind::Add:
            case OpKind::Mul:
            case OpKind::Eq:
            case OpKind::Ne:
            case OpKind::Maximum:
            case OpKind::Minimum: return true;
            default: return false;
          }
        }
        if (t != F) return false;
        switch (e.op) {
          case OpKind::Add:
          case OpKind::Sub:
          case OpKind::Mul:
          case OpKind::Div:
          case OpKind::Maximum:
          case OpKind::Minimum:
          case OpKind::Eq:
          case OpKind::Ne:
          case OpKind::Lt:
          case OpKind::Le:
          case OpKind::Gt:
          case OpKind::Ge:
          case OpKind::LogicalAnd:
          case OpKind::LogicalOr:
          case OpKind::LogicalXor: return true;
          default: return binary_fn<float>(e.op) != nullptr;
        }
      }
      case Expr::Kind::Where:
        return k.exprs[e.a].dtype == DType::Bool && (e.dtype == F || e.dtype == DType::Bool) && vok(e.a) && vok(e.b) &&
               vok(e.c);
      case Expr::Kind::Cast: {
        DType from = k.exprs[e.a].dtype;
        return vok(e.a) && ((from == F && e.dtype == DType::Bool) || (from == DType::Bool && e.dtype == F));
      }
      default: return false;
    }
  }
  bool vectorizable(const std::vector<Stmt>& body) {
    if (!avx2) return false;
    DType F = DType::Bool;
    for (const Stmt& s : body) {
      if (s.kind != Stmt::Kind::Store) return false;
      DType t = k.buffers[s.buffer].dtype;
      if (!(t == DType::Float32 || t == DType::Float64) || (F != DType::Bool && t != F)) return false;
      F = t;
    }
    if (F == DType::Bool) return false;
    vf32 = F == DType::Float32;
    vok_memo.clear();
    for (const Stmt& s : body)
      if (k.exprs[s.value].dtype != F || !unit_affine(s.index) || !vok(s.value)) return false;
    return true;
  }

  x86::Ymm vexpr(ExprId id) {
    auto it = vcache.find(id);
    if (it != vcache.end()) return it->second;
    x86::Ymm v;
    if (uniform(id)) {
      v = in_region(vloop_level - 1, [&] { return vbroadcast(id); });
    } else {
      v = vemit(id);
    }
    vcache[id] = v;
    return v;
  }
  x86::Ymm vbroadcast(ExprId id) {
    const Expr& e = k.exprs[id];
    SVal s = sexpr(id);
    x86::Ymm y = cc.newYmm();
    if (e.dtype == DType::Bool) {
      x86::Gp m = cc.newGpq();
      cc.mov(m, s.g);
      cc.neg(m);
      x86::Xmm t = cc.newXmm();
      cc.vmovq(t, m);
      cc.vpbroadcastq(y, t);
    } else if (vf32) {
      cc.vbroadcastss(y, s.x);
    } else {
      cc.vbroadcastsd(y, s.x);
    }
    return y;
  }

  // Applies a math function to a vector through a stack slot: vmath's vector form (the same
  // bits as the scalar form and the LLVM tier), sigmoid through it, fmod/remainder lane by lane.
  x86::Ymm vcall(OpKind op, x86::Ymm a, const x86::Ymm* b) {
    x86::Mem sa = cc.newStack(32, 32), sb;
    cc.vmovups(sa, a);
    x86::Gp pa = cc.newIntPtr(), pb = cc.newIntPtr(), n = cc.newGpq(), f = cc.newIntPtr();
    cc.lea(pa, sa);
    if (b) {
      sb = cc.newStack(32, 32);
      cc.vmovups(sb, *b);
      cc.lea(pb, sb);
    } else {
      cc.xor_(pb, pb);
    }
    InvokeNode* inv;
    const int vf = vm_fn(op);
    if (vf >= 0) {
      cc.mov(n, vf);
      uint64_t target = vf32 ? reinterpret_cast<uint64_t>(&vm_vec_f32) : reinterpret_cast<uint64_t>(&vm_vec_f64);
      cc.invoke(&inv, target, FuncSignatureT<void, void*, void*, int64_t>(CallConvId::kHost));
      inv->setArg(0, pa);
      inv->setArg(1, pb);
      inv->setArg(2, n);
    } else if (op == OpKind::Sigmoid) {
      uint64_t target =
          vf32 ? reinterpret_cast<uint64_t>(&sigmoid_vec_f32) : reinterpret_cast<uint64_t>(&sigmoid_vec_f64);
      cc.invoke(&inv, target, FuncSignatureT<void, void*>(CallConvId::kHost));
      inv->setArg(0, pa);
    } else if (!b) {
      cc.mov(n, vf32 ? 8 : 4);
      cc.mov(f,
             vf32 ? reinterpret_cast<uint64_t>(unary_fn<float>(op)) : reinterpret_cast<uint64_t>(unary_fn<double>(op)));
      uint64_t target = vf32 ? reinterpret_cast<uint64_t>(&lanes1<float>) : reinterpret_cast<uint64_t>(&lanes1<double>);
      cc.invoke(&inv, target, FuncSignatureT<void, void*, int64_t, void*>(CallConvId::kHost));
      inv->setArg(0, pa);
      inv->setArg(1, n);
      inv->setArg(2, f);
    } else {
      cc.mov(n, vf32 ? 8 : 4);
      cc.mov(f, vf32 ? reinterpret_cast<uint64_t>(binary_fn<float>(op))
                     : reinterpret_cast<uint64_t>(binary_fn<double>(op)));
      uint64_t target = vf32 ? reinterpret_cast<uint64_t>(&lanes2<float>) : reinterpret_cast<uint64_t>(&lanes2<double>);
      cc.invoke(&inv, target, FuncSignatureT<void, void*, void*, int64_t, void*>(CallConvId::kHost));
      inv->setArg(0, pa);
      inv->setArg(1, pb);
      inv->setArg(2, n);
      inv->setArg(3, f);
    }
    x86::Ymm r = cc.newYmm();
    cc.vmovups(r, sa);
    return r;
  }

  x86::Ymm vcmp(x86::Ymm a, x86::Ymm b, uint32_t pred) {
    x86::Ymm r = cc.newYmm();
    if (vf32)
      cc.vcmpps(r, a, b, pred);
    else
      cc.vcmppd(r, a, b, pred);
    return r;
  }
  x86::Ymm vmask(DType t, x86::Ymm v) { return t == DType::Bool ? v : vcmp(v, vconst(0.0), kNeqUQ); }

  x86::Ymm vemit(ExprId id) {
    const Expr& e = k.exprs[id];
    const bool f = vf32;
    auto Y = [&] { return cc.newYmm(); };
    x86::Ymm r;
    switch (e.kind) {
      case Expr::Kind::Load: {
        x86::Gp ix = sexpr(e.a).g;  // lane 0's index
        r = Y();
        cc.vmovups(r, elem(static_cast<int>(e.i), ix, 32));
        return r;
      }
      case Expr::Kind::Cast: {
        x86::Ymm a = vexpr(e.a);
        if (e.dtype == DType::Bool) return vcmp(a, vconst(0.0), kNeqUQ);
        r = Y();
        cc.vandps(r, a, vconst(1.0));
        return r;
      }
      case Expr::Kind::Where: {
        x86::Ymm c = vexpr(e.a), x = vexpr(e.b), y = vexpr(e.c);
        r = Y();
        if (f)
          cc.vblendvps(r, y, x, c);
        else
          cc.vblendvpd(r, y, x, c);
        return r;
      }
      case Expr::Kind::Unary: {
        DType t = k.exprs[e.a].dtype;
        x86::Ymm a = vexpr(e.a);
        if (t == DType::Bool || e.op == OpKind::LogicalNot) {
          if (t != DType::Bool) return vcmp(a, vconst(0.0), kEqOQ);
          r = Y();
          cc.vxorps(r, a, vones());
          return r;
        }
        switch (e.op) {
          case OpKind::Neg:
            r = Y();
            cc.vxorps(r, a, vconst(-0.0));
            return r;
          case OpKind::Abs:
            r = Y();
            cc.vandnps(r, vconst(-0.0), a);
            return r;
          case OpKind::Sqrt:
            r = Y();
            if (f)
              cc.vsqrtps(r, a);
            else
              cc.vsqrtpd(r, a);
            return r;
          case OpKind::Rsqrt:
          case OpKind::Reciprocal: {
            x86::Ymm d = a;
            if (e.op == OpKind::Rsqrt) {
              d = Y();
              if (f)
                cc.vsqrtps(d, a);
              else
                cc.vsqrtpd(d, a);
            }
            r = Y();
            if (f)
              cc.vdivps(r, vconst(1.0), d);
            else
              cc.vdivpd(r, vconst(1.0), d);
            return r;
          }
          case OpKind::Relu: {  // as the scalar form: x if x > 0 or NaN, else +0
            x86::Ymm m = vcmp(a, vconst(0.0), kNleUQ);
            r = Y();
            cc.vandps(r, m, a);
            return r;
          }
          case OpKind::Floor:
          case OpKind::Ceil:
          case OpKind::Round: {
            uint32_t mode = e.op == OpKind::Floor ? 9 : e.op == OpKind::Ceil ? 10 : 8;
            r = Y();
            if (f)
              cc.vroundps(r, a, mode);
            else
              cc.vroundpd(r, a, mode);
            return r;
          }
          case OpKind::Sign: {
            x86::Ymm p = vcmp(a, vconst(0.0), kGtOQ), n = vcmp(a, vconst(0.0), kLtOQ);
            cc.vandps(p, p, vconst(1.0));
            cc.vandps(n, n, vconst(1.0));
            r = Y();
            if (f)
              cc.vsubps(r, p, n);
            else
              cc.vsubpd(r, p, n);
            return r;
          }
          case OpKind::IsNan: return vcmp(a, a, kUnord);
          case OpKind::IsFinite: {
            x86::Ymm ab = Y();
            cc.vandnps(ab, vconst(-0.0), a);
            return vcmp(ab, vconst(INFINITY), kLtOQ);
          }
          default: return vcall(e.op, a, nullptr);
        }
      }
      case Expr::Kind::Binary: {
        DType t = k.exprs[e.a].dtype;
        x86::Ymm a = vexpr(e.a), b = vexpr(e.b);
        r = Y();
        if (t == DType::Bool) {
          switch (e.op) {
            case OpKind::LogicalAnd:
            case OpKind::BitwiseAnd:
            case OpKind::Mul:
            case OpKind::Minimum: cc.vandps(r, a, b); return r;
            case OpKind::LogicalOr:
            case OpKind::BitwiseOr:
            case OpKind::Add:
            case OpKind::Maximum: cc.vorps(r, a, b); return r;
            case OpKind::LogicalXor:
            case OpKind::BitwiseXor:
            case OpKind::Ne: cc.vxorps(r, a, b); return r;
            case OpKind::Eq:
              cc.vxorps(r, a, b);
              cc.vxorps(r, r, vones());
              return r;
            default: unsupported("vector bool op");
          }
        }
        switch (e.op) {
          case OpKind::Add:
            if (f)
              cc.vaddps(r, a, b);
            else
              cc.vaddpd(r, a, b);
            return r;
          case OpKind::Sub:
            if (f)
              cc.vsubps(r, a, b);
            else
              cc.vsubpd(r, a, b);
            return r;
          case OpKind::Mul:
            if (f)
              cc.vmulps(r, a, b);
            else
              cc.vmulpd(r, a, b);
            return r;
          case OpKind::Div:
            if (f)
              cc.vdivps(r, a, b);
            else
              cc.vdivpd(r, a, b);
            return r;
          case OpKind::Maximum:
          case OpKind::Minimum: {
            bool mx = e.op == OpKind::Maximum;
            x86::Ymm s = Y();
            if (f) {
              if (mx)
                cc.vmaxps(r, a, b);
              else
                cc.vminps(r, a, b);
              cc.vaddps(s, a, b);
            } else {
              if (mx)
                cc.vmaxpd(r, a, b);
              else
                cc.vminpd(r, a, b);
              cc.vaddpd(s, a, b);
            }
            x86::Ymm u = vcmp(a, b, kUnord), out = Y();
            if (f)
              cc.vblendvps(out, r, s, u);
            else
              cc.vblendvpd(out, r, s, u);
            return out;
          }
          case OpKind::Eq: return vcmp(a, b, kEqOQ);
          case OpKind::Ne: return vcmp(a, b, kNeqUQ);
          case OpKind::Lt: return vcmp(a, b, kLtOQ);
          case OpKind::Le: return vcmp(a, b, kLeOQ);
          case OpKind::Gt: return vcmp(a, b, kGtOQ);
          case OpKind::Ge: return vcmp(a, b, kGeOQ);
          case OpKind::LogicalAnd: cc.vandps(r, vmask(t, a), vmask(t, b)); return r;
          case OpKind::LogicalOr: cc.vorps(r, vmask(t, a), vmask(t, b)); return r;
          case OpKind::LogicalXor: cc.vxorps(r, vmask(t, a), vmask(t, b)); return r;
          default: return vcall(e.op, a, &b);
        }
      }
      default: break;
    }
    unsupported("vector expression");
  }

  // ---- statements ----
  void body_scalar(const std::vector<Stmt>& ss, int depth) {
    for (const Stmt& s : ss) {
      if (s.kind == Stmt::Kind::Loop) {
        x86::Gp lo = sexpr(s.lo).g, hi = sexpr(s.hi).g;
        loop(s.var, lo, hi, s.body, depth);
      } else {
        store_scalar(s);
      }
    }
  }

  // for var in [lo, hi): body — the region at depth + 1. An innermost body that vectorizes
  // gets a vector loop over whole vectors and this scalar loop for the tail.
  void loop(int var, x86::Gp lo, x86::Gp hi, const std::vector<Stmt>& body, int depth) {
    if (vars.size() <= static_cast<size_t>(var)) vars.resize(var + 1);
    x86::Gp iv = cc.newGpq();
    cc.mov(iv, lo);
    vars[var] = iv;
    regions.resize(depth + 2);
    regions[depth].pre = cc.cursor();
    bool innermost = std::none_of(body.begin(), body.end(), [](const Stmt& s) { return s.kind == Stmt::Kind::Loop; });
    if (innermost) {
      vloop_level = depth + 1;
      vvar = var;
      if (vectorizable(body)) {
        const int W = vf32 ? 8 : 4;
        x86::Gp last = cc.newGpq();
        cc.mov(last, hi);
        cc.sub(last, W);
        Label head = cc.newLabel(), done = cc.newLabel();
        cc.bind(head);
        cc.cmp(iv, last);
        cc.jg(done);
        regions[depth + 1] = Region{};
        at = depth + 1;
        vec = true;
        vcache.clear();
        vconsts.clear();
        for (const Stmt& s : body) {
          x86::Ymm v = vexpr(s.value);
          x86::Gp ix = sexpr(s.index).g;
          cc.vmovups(elem(s.buffer, ix, 32), v);
        }
        vec = false;
        at = depth;
        cc.add(iv, W);
        cc.jmp(head);
        cc.bind(done);
      }
    }
    Label head = cc.newLabel(), done = cc.newLabel();
    cc.bind(head);
    cc.cmp(iv, hi);
    cc.jge(done);
    regions[depth + 1] = Region{};
    at = depth + 1;
    body_scalar(body, depth + 1);
    at = depth;
    cc.inc(iv);
    cc.jmp(head);
    cc.bind(done);
    regions.resize(depth + 1);
  }

  void emit() {
    level_memo.assign(k.exprs.size(), -1);
    var_level.assign(static_cast<size_t>(std::max(k.num_vars, 1)), 0);
    var_level[0] = 1;
    assign_levels(k.body, 1);
    bufs.resize(k.buffers.size());
    buf_loaded.assign(k.buffers.size(), false);
    for (const BufferSpec& b : k.buffers) check_dtype(b.dtype);
    FuncNode* fn = cc.addFunc(
        FuncSignatureT<void, int64_t, int64_t, char* const*, const int64_t*, const double*>(CallConvId::kHost));
    fn->frame().setAvxEnabled();  // VEX moves for spills (legacy SSE moves would drop ymm upper halves)
    fn->frame().setAvxCleanup();  // vzeroupper before returning to SSE code
    begin = cc.newGpq();
    end = cc.newGpq();
    bufs_arg = cc.newIntPtr();
    ip_arg = cc.newIntPtr();
    fp_arg = cc.newIntPtr();
    fn->setArg(0, begin);
    fn->setArg(1, end);
    fn->setArg(2, bufs_arg);
    fn->setArg(3, ip_arg);
    fn->setArg(4, fp_arg);
    regions.assign(1, Region{});
    at = 0;
    loop(0, begin, end, k.body, 0);
    cc.ret();
    cc.endFunc();
    cc.finalize();
  }
};

}  // namespace

bool asmjit_supports(const Kernel& k) {
  if (!k.accs.empty()) return false;
  std::function<bool(const std::vector<Stmt>&)> ok = [&](const std::vector<Stmt>& ss) {
    for (const Stmt& s : ss) {
      if (s.kind == Stmt::Kind::Loop && !ok(s.body)) return false;
      if (s.kind != Stmt::Kind::Loop && s.kind != Stmt::Kind::Store) return false;
    }
    return true;
  };
  return ok(k.body);
}

KernelFn compile_asmjit(const Kernel& k) {
  if (!asmjit_supports(k)) unsupported("kernel has reductions");
  // Register allocation time grows faster than linearly with kernel size, and long kernels are
  // where LLVM's code is most worth waiting for: those go to LLVM directly.
  if (k.exprs.size() > kMaxExprs) unsupported("kernel too large (" + std::to_string(k.exprs.size()) + " expressions)");
  JitRuntime& rt = runtime();
  CodeHolder code;
  code.init(rt.environment());
  Throwing handler;
  code.setErrorHandler(&handler);
  StringLogger logger;
  const bool listing = !dump_dir().empty();
  if (listing) code.setLogger(&logger);
  x86::Compiler cc(&code);
  bool avx2 = CpuInfo::host().hasFeature(CpuFeatures::X86::kAVX2) && CpuInfo::host().hasFeature(CpuFeatures::X86::kAVX);
  Emitter(k, cc, avx2).emit();
  KernelFn fn = nullptr;
  Error err = rt.add(&fn, &code);
  if (listing) dump_file(k.name + ".asmjit.s", k.str() + "\n" + logger.data());
  if (err) throw AsmjitError(std::string("asmjit: cannot add code: ") + DebugUtils::errorAsString(err));
  return fn;
}

}  // namespace kiln::jit
