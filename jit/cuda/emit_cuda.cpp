#include "jit/cuda/emit_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "jit/backend/backend.h"
#include "jit/loop/row_cache.h"
#include "runtime/core/error.h"

namespace kiln::jit {
namespace {

// The preamble every kernel starts with: fixed-width types, float-to-int conversion as the
// CPU tiers do it (x86: NaN and out-of-range values give the type's minimum; CUDA's own
// conversion saturates) and bit-exact constants. Math comes from CUDA's device builtins
// (expf, tanhf, erff, log1pf, ...), compiled with IEEE division and square root, no FMA
// contraction and no flush-to-zero.
const char* kPreamble = R"(typedef long long i64;
typedef unsigned long long u64;
typedef int i32;
typedef unsigned int u32;
typedef unsigned char u8;
typedef unsigned short u16;
static __device__ __forceinline__ i64 kiln_f2i64(double x) {
  return (x >= -9223372036854775808.0 && x < 9223372036854775808.0) ? (i64)x : (i64)0x8000000000000000ull;
}
static __device__ __forceinline__ i32 kiln_f2i32(double x) {
  return (x > -2147483649.0 && x < 2147483648.0) ? (i32)x : (i32)0x80000000u;
}
)";

// float16/bfloat16 in memory and float32 in registers, rounded to 16 bits after each op
// (kiln_rh / kiln_rbf), as the CPU reference kernels compute them: round to nearest even,
// through the hardware's conversions (bfloat16 before sm_80: bit arithmetic).
const char* kHalfPreamble =
    R"(static __device__ __forceinline__ float kiln_h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
static __device__ __forceinline__ u16 kiln_f2h(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
static __device__ __forceinline__ float kiln_rh(float f) { return kiln_h2f(kiln_f2h(f)); }
static __device__ __forceinline__ float kiln_bf2f(u16 h) { return __uint_as_float((u32)h << 16); }
static __device__ __forceinline__ u16 kiln_f2bf(float f) {
#if __CUDA_ARCH__ >= 800  // the hardware's conversion (round to nearest even), NaN as the CPU writes it
  u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return f != f ? (u16)0x7fc0 : h;
#endif
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}
static __device__ __forceinline__ float kiln_rbf(float f) { return kiln_bf2f(kiln_f2bf(f)); }
)";

const char* ctype(DType t) {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::Int32: return "i32";
    case DType::Int64: return "i64";
    case DType::Float16:
    case DType::BFloat16:
    case DType::Float32: return "float";
    case DType::Float64: return "double";
    default: throw Error(std::string("cuda codegen: unsupported dtype ") + dtype_name(t));
  }
}
// Element type in memory (bool is a byte).
const char* mtype(DType t) { return t == DType::Bool ? "u8" : is_half(t) ? "u16" : ctype(t); }
// A float32 register value rounded to `t`'s precision (16-bit floats), else as it is.
std::string rounded(DType t, const std::string& v) {
  return t == DType::Float16 ? "kiln_rh(" + v + ")" : t == DType::BFloat16 ? "kiln_rbf(" + v + ")" : v;
}
// Unsigned type of the same width (wrapping integer arithmetic, as LLVM's add/sub/mul).
const char* utype(DType t) { return t == DType::Int32 ? "u32" : "u64"; }

std::string fconst(DType t, double v) {
  std::ostringstream os;
  if (t != DType::Float64) {
    float f = t == DType::Float16    ? static_cast<float>(Half(static_cast<float>(v)))
              : t == DType::BFloat16 ? static_cast<float>(BFloat16(static_cast<float>(v)))
                                     : static_cast<float>(v);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    os << "__int_as_float(" << static_cast<int32_t>(bits) << ")";
  } else {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    os << "__longlong_as_double(" << static_cast<int64_t>(bits) << "ll)";
  }
  return os.str();
}

std::string iconst(int64_t v) {
  if (v == INT64_MIN) return "((i64)0x8000000000000000ull)";
  return "((i64)" + std::to_string(v) + "ll)";
}

// The math builtin of `f` for `t` ("expf" / "exp").
std::string fn(const char* name, DType t) { return std::string(name) + (t == DType::Float64 ? "" : "f"); }

bool float_only(OpKind op) {
  switch (op) {
    case OpKind::Exp:
    case OpKind::Exp2:
    case OpKind::Expm1:
    case OpKind::Log:
    case OpKind::Log2:
    case OpKind::Log1p:
    case OpKind::Sqrt:
    case OpKind::Rsqrt:
    case OpKind::Reciprocal:
    case OpKind::Sin:
    case OpKind::Cos:
    case OpKind::Tan:
    case OpKind::Atan:
    case OpKind::Tanh:
    case OpKind::Erf:
    case OpKind::Sigmoid:
    case OpKind::Div:
    case OpKind::Pow:
    case OpKind::Atan2:
    case OpKind::Remainder:
    case OpKind::Fmod: return true;
    default: return false;
  }
}

struct Emitter {
  const Kernel& k;
  std::ostringstream out;
  int indent = 1;
  int temps = 0;
  bool warp = false;  // a group of lanes per parallel index (see warp_stmts)
  int lanes = 1;  // threads per parallel index: 1, a warp (32) or a block (kCudaWideBlock)
  std::vector<std::unordered_map<ExprId, std::string>> scopes;

  // Row cache (k.row_cache > 0, a warp per row; jit/loop/row_cache.h): a region of shared
  // memory per warp, `rc.region` bytes.
  RowCachePlan rc;
  const RowCachePlan::LoopCache* cur_cache = nullptr;

  explicit Emitter(const Kernel& kk) : k(kk) {}

  void line(const std::string& s) { out << std::string(static_cast<size_t>(indent) * 2, ' ') << s << "\n"; }

  std::string lookup(ExprId id) {
    for (size_t s = scopes.size(); s-- > 0;) {
      auto it = scopes[s].find(id);
      if (it != scopes[s].end()) return it->second;
    }
    return "";
  }

  // Declares a temporary of type `t` holding `value`; returns its name.
  std::string let(DType t, const std::string& value) {
    std::string n = "t" + std::to_string(temps++);
    line("const " + std::string(ctype(t)) + " " + n + " = " + rounded(t, value) + ";");
    return n;
  }

  static std::string isnan_(const std::string& x) { return "(" + x + " != " + x + ")"; }

  std::string convert(const std::string& v, DType from, DType to) {
    if (from == to) return v;
    bool ff = is_floating(from), ft = is_floating(to);
    ctype(from);
    std::string tt = ctype(to);
    if (to == DType::Bool) return "(" + v + " != 0)";  // floats: NaN -> true, as LLVM's une
    if (from == DType::Bool) return "((" + tt + ")(" + v + " ? 1 : 0))";
    if (ff && ft) return "((" + tt + ")" + v + ")";
    if (ff) return std::string(to == DType::Int32 ? "kiln_f2i32" : "kiln_f2i64") + "((double)" + v + ")";
    return "((" + tt + ")" + v + ")";  // int -> float, int -> int (truncation / sign extension)
  }

  std::string unary(OpKind op, DType t, const std::string& x) {
    bool fl = is_floating(t);
    std::string T = ctype(t);
    if (!fl && float_only(op)) throw Error(std::string("cuda codegen: ") + op_name(op) + " on integers");
    auto zero = "((" + T + ")0)";
    switch (op) {
      case OpKind::Neg:
        if (fl) return "(-" + x + ")";
        if (t == DType::Bool) return x;
        return "((" + T + ")(0 - (" + utype(t) + ")" + x + "))";
      case OpKind::Abs:
        if (fl) return fn("fabs", t) + "(" + x + ")";
        if (t == DType::Bool) return x;
        return "(" + x + " < 0 ? (" + T + ")(0 - (" + utype(t) + ")" + x + ") : " + x + ")";
      case OpKind::Sign:
        if (t == DType::Bool) return x;
        return "((" + T + ")((" + x + " > " + zero + ") - (" + x + " < " + zero + ")))";  // NaN -> 0
      case OpKind::Relu:
        if (fl) return "(!(" + x + " <= " + zero + ") ? " + x + " : " + zero + ")";  // NaN stays NaN
        return "(" + x + " > " + zero + " ? " + x + " : " + zero + ")";
      case OpKind::Floor: return fl ? fn("floor", t) + "(" + x + ")" : x;
      case OpKind::Ceil: return fl ? fn("ceil", t) + "(" + x + ")" : x;
      case OpKind::Round: return fl ? fn("rint", t) + "(" + x + ")" : x;  // half to even
      case OpKind::LogicalNot: return "(" + x + " == " + zero + ")";
      case OpKind::BitwiseNot: return t == DType::Bool ? "(!" + x + ")" : "((" + T + ")~" + x + ")";
      case OpKind::IsNan: return fl ? isnan_(x) : "false";
      case OpKind::IsFinite: return fl ? "(" + fn("fabs", t) + "(" + x + ") < " + fconst(t, INFINITY) + ")" : "true";
      case OpKind::Exp: return fn("exp", t) + "(" + x + ")";
      case OpKind::Exp2: return fn("exp2", t) + "(" + x + ")";
      case OpKind::Expm1: return fn("expm1", t) + "(" + x + ")";
      case OpKind::Log: return fn("log", t) + "(" + x + ")";
      case OpKind::Log2: return fn("log2", t) + "(" + x + ")";
      case OpKind::Log1p: return fn("log1p", t) + "(" + x + ")";
      case OpKind::Sqrt: return fn("sqrt", t) + "(" + x + ")";
      case OpKind::Rsqrt: return "(" + fconst(t, 1) + " / " + fn("sqrt", t) + "(" + x + "))";
      case OpKind::Reciprocal: return "(" + fconst(t, 1) + " / " + x + ")";
      case OpKind::Sin: return fn("sin", t) + "(" + x + ")";
      case OpKind::Cos: return fn("cos", t) + "(" + x + ")";
      case OpKind::Tan: return fn("tan", t) + "(" + x + ")";
      case OpKind::Atan: return fn("atan", t) + "(" + x + ")";
      case OpKind::Tanh: return fn("tanh", t) + "(" + x + ")";
      case OpKind::Erf: return fn("erf", t) + "(" + x + ")";
      case OpKind::Sigmoid: return "(" + fconst(t, 1) + " / (" + fconst(t, 1) + " + " + fn("exp", t) + "(-" + x + ")))";
      default: break;
    }
    throw Error(std::string("cuda codegen: no lowering for ") + op_name(op));
  }

  std::string binary(OpKind op, DType t, const std::string& x, const std::string& y) {
    bool fl = is_floating(t), bl = t == DType::Bool;
    std::string T = ctype(t);
    if (!fl && float_only(op)) throw Error(std::string("cuda codegen: ") + op_name(op) + " on integers");
    auto wrap = [&](const char* o) {  // integer arithmetic that wraps (LLVM's add/sub/mul)
      std::string U = utype(t);
      return "((" + T + ")((" + U + ")" + x + " " + o + " (" + U + ")" + y + "))";
    };
    auto b2 = [&](const std::string& v) { return convert(v, t, DType::Bool); };
    switch (op) {
      case OpKind::Add: return fl ? "(" + x + " + " + y + ")" : bl ? "(" + x + " || " + y + ")" : wrap("+");
      case OpKind::Sub: return fl ? "(" + x + " - " + y + ")" : bl ? "(" + x + " != " + y + ")" : wrap("-");
      case OpKind::Mul: return fl ? "(" + x + " * " + y + ")" : bl ? "(" + x + " && " + y + ")" : wrap("*");
      case OpKind::Div: return "(" + x + " / " + y + ")";
      case OpKind::Pow: return fn("pow", t) + "(" + x + ", " + y + ")";
      case OpKind::Atan2: return fn("atan2", t) + "(" + x + ", " + y + ")";
      case OpKind::Maximum:
      case OpKind::Minimum: {
        const char* c = op == OpKind::Maximum ? " > " : " < ";
        std::string pick = "(" + x + c + y + " ? " + x + " : " + y + ")";
        if (!fl) return pick;
        // A NaN operand gives NaN (x + y), as the CPU tiers and PyTorch.
        return "((" + isnan_(x) + " || " + isnan_(y) + ") ? (" + x + " + " + y + ") : " + pick + ")";
      }
      case OpKind::Remainder: {  // Python's sign convention: the result takes y's sign
        std::string r = let(t, fn("fmod", t) + "(" + x + ", " + y + ")");
        std::string zero = fconst(t, 0);
        return "((" + r + " != " + zero + " && ((" + y + " < " + zero + ") != (" + r + " < " + zero + "))) ? (" + r +
               " + " + y + ") : " + r + ")";
      }
      case OpKind::Fmod: return fn("fmod", t) + "(" + x + ", " + y + ")";
      case OpKind::Eq: return "(" + x + " == " + y + ")";
      case OpKind::Ne: return "(" + x + " != " + y + ")";
      case OpKind::Lt: return "(" + x + " < " + y + ")";
      case OpKind::Le: return "(" + x + " <= " + y + ")";
      case OpKind::Gt: return "(" + x + " > " + y + ")";
      case OpKind::Ge: return "(" + x + " >= " + y + ")";
      case OpKind::LogicalAnd: return "(" + b2(x) + " && " + b2(y) + ")";
      case OpKind::LogicalOr: return "(" + b2(x) + " || " + b2(y) + ")";
      case OpKind::LogicalXor: return "(" + b2(x) + " != " + b2(y) + ")";
      case OpKind::BitwiseAnd: return bl ? "(" + x + " && " + y + ")" : "((" + T + ")(" + x + " & " + y + "))";
      case OpKind::BitwiseOr: return bl ? "(" + x + " || " + y + ")" : "((" + T + ")(" + x + " | " + y + "))";
      case OpKind::BitwiseXor: return bl ? "(" + x + " != " + y + ")" : "((" + T + ")(" + x + " ^ " + y + "))";
      default: break;
    }
    throw Error(std::string("cuda codegen: no lowering for ") + op_name(op));
  }

  // Address of element `index` of buffer `b` (typed by the buffer's element type).
  std::string elem(int b, const std::string& index) { return "b" + std::to_string(b) + "[" + index + "]"; }

  std::string expr(ExprId id) {
    const Expr& e = k.exprs[id];
    bool volatile_value = e.kind == Expr::Kind::Acc || e.kind == Expr::Kind::AccIndex;
    if (!volatile_value) {
      std::string v = lookup(id);
      if (!v.empty()) return v;
    }
    if (cur_cache) {
      auto r = cur_cache->reads.find(id);
      if (r != cur_cache->reads.end()) {
        std::string v = let(e.dtype, "rc" + std::to_string(r->second) + "[rcx]");
        scopes.back()[id] = v;
        return v;
      }
    }
    std::string v = compute(id);
    if (cur_cache) {
      auto w = cur_cache->writes.find(id);
      if (w != cur_cache->writes.end()) line("rc" + std::to_string(w->second) + "[rcx] = " + v + ";");
    }
    if (!volatile_value) scopes.back()[id] = v;
    return v;
  }

  std::string compute(ExprId id) {
    const Expr& e = k.exprs[id];
    std::string v;
    auto I = [&](ExprId x) { return expr(x); };
    switch (e.kind) {
      case Expr::Kind::IConst: v = iconst(e.i); break;
      case Expr::Kind::FConst: v = fconst(e.dtype, e.f); break;
      case Expr::Kind::Param: v = "ip" + std::to_string(e.i); break;
      case Expr::Kind::FParam: v = "fp" + std::to_string(e.i); break;
      case Expr::Kind::Var: v = "i" + std::to_string(e.i); break;
      case Expr::Kind::IAdd: v = let(DType::Int64, I(e.a) + " + " + I(e.b)); break;
      case Expr::Kind::ISub: v = let(DType::Int64, I(e.a) + " - " + I(e.b)); break;
      case Expr::Kind::IMul: v = let(DType::Int64, I(e.a) + " * " + I(e.b)); break;
      // (64-bit: NVCC's division takes its own 32-bit path where both operands fit; an explicit
      // one measured slower, 41 -> 54 us on GPT-2 small's head-split copies)
      case Expr::Kind::IDiv: v = let(DType::Int64, "(i64)((u64)" + I(e.a) + " / (u64)" + I(e.b) + ")"); break;
      case Expr::Kind::IMod: v = let(DType::Int64, "(i64)((u64)" + I(e.a) + " % (u64)" + I(e.b) + ")"); break;
      case Expr::Kind::IMin: {
        std::string a = I(e.a), b = I(e.b);
        v = let(DType::Int64, a + " < " + b + " ? " + a + " : " + b);
        break;
      }
      case Expr::Kind::Load: {
        // As the LLVM tier: the address from the buffer's element type, the value of e.dtype.
        std::string raw = elem(static_cast<int>(e.i), I(e.a));
        if (k.buffers[e.i].dtype != e.dtype) raw = "*(const " + std::string(mtype(e.dtype)) + "*)&" + raw;
        if (e.dtype == DType::Bool) raw = "(" + raw + " != 0)";
        if (is_half(e.dtype)) {  // a 16-bit value widened: exact, no rounding
          v = "t" + std::to_string(temps++);
          line("const float " + v + " = " + (e.dtype == DType::Float16 ? "kiln_h2f(" : "kiln_bf2f(") + raw + ");");
          break;
        }
        v = let(e.dtype, raw);
        break;
      }
      case Expr::Kind::Unary: {
        std::string a = I(e.a);
        v = let(e.dtype, unary(e.op, k.exprs[e.a].dtype, a));
        break;
      }
      case Expr::Kind::Binary: {
        std::string a = I(e.a), b = I(e.b);
        v = let(e.dtype, binary(e.op, k.exprs[e.a].dtype, a, b));
        break;
      }
      case Expr::Kind::Where: {
        std::string a = I(e.a), b = I(e.b), c = I(e.c);
        v = let(e.dtype, a + " ? " + b + " : " + c);
        break;
      }
      case Expr::Kind::Cast: {
        std::string a = I(e.a);
        v = let(e.dtype, convert(a, k.exprs[e.a].dtype, e.dtype));
        break;
      }
      case Expr::Kind::Acc: v = let(k.accs[e.i].dtype, acc_value(static_cast<int>(e.i))); break;
      case Expr::Kind::AccIndex: v = let(DType::Int64, "acci" + std::to_string(e.i)); break;
    }
    return v;
  }

  static bool nan_flag(const AccSpec& a) {
    return is_floating(a.dtype) && (a.op == OpKind::Amax || a.op == OpKind::Amin);
  }

  std::string acc_value(int acc) {
    std::string v = "acc" + std::to_string(acc);
    if (!nan_flag(k.accs[acc])) return v;
    return "(accnan" + std::to_string(acc) + " ? " + fconst(k.accs[acc].dtype, NAN) + " : " + v + ")";
  }

  std::string identity(const AccSpec& a) {
    bool fl = is_floating(a.dtype);
    switch (a.op) {
      case OpKind::Sum: return fl ? fconst(a.dtype, 0) : iconst(0);
      case OpKind::Prod: return fl ? fconst(a.dtype, 1) : iconst(1);
      case OpKind::Amax:
      case OpKind::ArgMax: return fl ? fconst(a.dtype, -INFINITY) : iconst(INT64_MIN);
      default: return fl ? fconst(a.dtype, INFINITY) : iconst(INT64_MAX);
    }
  }

  void acc_update(const Stmt& s) {
    const AccSpec& a = k.accs[s.acc];
    bool fl = is_floating(a.dtype);
    const std::string A = "acc" + std::to_string(s.acc);
    const std::string T = ctype(a.dtype);
    std::string x = expr(s.value);
    x = let(a.dtype, convert(x, k.exprs[s.value].dtype, a.dtype));
    switch (a.op) {
      case OpKind::Sum:
        line(A + " = " + (fl ? A + " + " + x : "(" + T + ")((u64)" + A + " + (u64)" + x + ")") + ";");
        break;
      case OpKind::Prod:
        line(A + " = " + (fl ? A + " * " + x : "(" + T + ")((u64)" + A + " * (u64)" + x + ")") + ";");
        break;
      case OpKind::Amax:
      case OpKind::Amin: {
        bool mx = a.op == OpKind::Amax;
        if (fl) {
          // fmax/fmin skip NaNs; a NaN seen is kept in a flag that acc_value() turns into NaN.
          line(A + " = " + fn(mx ? "fmax" : "fmin", a.dtype) + "(" + A + ", " + x + ");");
          line("accnan" + std::to_string(s.acc) + " |= " + isnan_(x) + ";");
        } else {
          line(A + " = " + x + (mx ? " > " : " < ") + A + " ? " + x + " : " + A + ";");
        }
        break;
      }
      case OpKind::ArgMax:
      case OpKind::ArgMin: {
        bool mx = a.op == OpKind::ArgMax;
        std::string idx = expr(s.index);
        std::string I = "acci" + std::to_string(s.acc);
        std::string strict = "(" + x + (mx ? " > " : " < ") + A + ")";
        std::string better = fl ? "(!" + isnan_(A) + " && (" + strict + " || " + isnan_(x) + "))" : strict;
        std::string b = "t" + std::to_string(temps++);
        line("const bool " + b + " = " + better + " || " + I + " < 0;");  // or nothing seen yet
        line(I + " = " + b + " ? " + idx + " : " + I + ";");
        line(A + " = " + b + " ? " + x + " : " + A + ";");
        break;
      }
      default: throw Error("cuda codegen: unknown accumulator");
    }
  }

  // `header {` and a fresh scope (values computed inside stay inside), ended by close(), or by
  // otherwise() and then close() for an if with an else.
  void open(const std::string& header) {
    line(header + " {");
    ++indent;
    scopes.emplace_back();
  }
  void close() {
    scopes.pop_back();
    --indent;
    line("}");
  }
  void otherwise() {
    scopes.pop_back();
    --indent;
    open("} else");
  }

  // `header {`, then `first` (a line, if any) and `body` in a fresh scope, then `}`.
  void block(const std::string& header, const std::vector<Stmt>& body, const std::string& first = "") {
    open(header);
    if (!first.empty()) line(first);
    stmts(body);
    close();
  }

  void stmts(const std::vector<Stmt>& ss) {
    for (const Stmt& s : ss) {
      switch (s.kind) {
        case Stmt::Kind::Loop: {
          std::string lo = expr(s.lo), hi = expr(s.hi);
          std::string v = "i" + std::to_string(s.var);
          const bool guarded = hoist_invariants(s, lo, hi);
          if (k.columns && !has_loop(s.body)) line("#pragma unroll 4");  // rows of a column: loads in flight
          block("for (i64 " + v + " = " + lo + "; " + v + " < " + hi + "; ++" + v + ")", s.body);
          if (guarded) close();
          break;
        }
        case Stmt::Kind::Store: {
          DType t = k.buffers[s.buffer].dtype;
          ExprId value = s.value;
          // A float32 value cast to the 16-bit type it is stored as: converted once by the store
          // (rounding it in registers first gives the same bits, a conversion later).
          const Expr& ve = k.exprs[value];
          if (is_half(t) && ve.kind == Expr::Kind::Cast && ve.dtype == t && k.exprs[ve.a].dtype == DType::Float32)
            value = ve.a;
          std::string v = convert(expr(value), k.exprs[value].dtype, t);
          std::string idx = expr(s.index);
          if (t == DType::Bool) v = "(u8)(" + v + " ? 1 : 0)";
          if (is_half(t)) v = (t == DType::Float16 ? "kiln_f2h(" : "kiln_f2bf(") + v + ")";
          line(elem(s.buffer, idx) + " = " + v + ";");
          break;
        }
        case Stmt::Kind::AccInit:
          line("acc" + std::to_string(s.acc) + " = " + identity(k.accs[s.acc]) + ";");
          line("acci" + std::to_string(s.acc) + " = -1;");
          if (nan_flag(k.accs[s.acc])) line("accnan" + std::to_string(s.acc) + " = false;");
          break;
        case Stmt::Kind::AccUpdate: acc_update(s); break;
        case Stmt::Kind::AccStore: {
          // As the LLVM tier: the accumulator's value (or its arg index) at the buffer's address.
          const AccSpec& a = k.accs[s.acc];
          std::string idx = expr(s.index);
          std::string addr = "&" + elem(s.buffer, idx);
          if (s.value)
            line("*(i64*)(" + addr + ") = acci" + std::to_string(s.acc) + ";");
          else
            line("*(" + std::string(ctype(a.dtype)) + "*)(" + addr + ") = " + acc_value(s.acc) + ";");
          break;
        }
      }
    }
  }

  // ---- one warp per parallel index (reduction kernels) ----
  // The lanes of a warp share the top-level loops of one parallel index (lane l runs
  // iterations l, l + 32, ...), each lane accumulating a partial; after such a loop the
  // partials are combined across the warp with shuffles (every lane then holds the result)
  // and with what the accumulator held before the loop. Stores outside loops run on lane 0.

  static void updated(const std::vector<Stmt>& ss, std::set<int>& out) {
    for (const Stmt& s : ss) {
      if (s.kind == Stmt::Kind::AccUpdate) out.insert(s.acc);
      if (s.kind == Stmt::Kind::Loop) updated(s.body, out);
    }
  }
  void acc_reads(ExprId e, std::set<int>& out) const {
    if (e < 0) return;
    const Expr& x = k.exprs[e];
    if (x.kind == Expr::Kind::Acc || x.kind == Expr::Kind::AccIndex) out.insert(static_cast<int>(x.i));
    acc_reads(x.a, out);
    acc_reads(x.b, out);
    acc_reads(x.c, out);
  }
  void reads(const std::vector<Stmt>& ss, std::set<int>& accs, std::set<int>& stored) const {
    for (const Stmt& s : ss) {
      for (ExprId e : {s.lo, s.hi, s.index, s.value}) acc_reads(e, accs);
      if (s.kind == Stmt::Kind::Store || s.kind == Stmt::Kind::AccStore) stored.insert(s.buffer);
      if (s.kind == Stmt::Kind::Loop) reads(s.body, accs, stored);
    }
  }
  void loads_of(ExprId e, std::set<int>& out) const {
    if (e < 0) return;
    const Expr& x = k.exprs[e];
    if (x.kind == Expr::Kind::Load) out.insert(static_cast<int>(x.i));
    loads_of(x.a, out);
    loads_of(x.b, out);
    loads_of(x.c, out);
  }
  void loads_in(const std::vector<Stmt>& ss, std::set<int>& out) const {
    for (const Stmt& s : ss) {
      for (ExprId e : {s.lo, s.hi, s.index}) loads_of(e, out);
      if (s.kind != Stmt::Kind::AccStore) loads_of(s.value, out);
      loads_in(s.body, out);
    }
  }
  // A pointwise kernel over row tiles (lower.cpp's row_tiled): its body one loop over the tile,
  // every store inside it; a warp's lanes run the tile.
  bool row_tiles() const {
    if (!k.accs.empty() || !k.member_ends.empty() || k.columns || k.row_cache > 0 || k.body.size() != 1) return false;
    const Stmt& s = k.body[0];
    return s.kind == Stmt::Kind::Loop && !has_loop(s.body);
  }

  // Whether the kernel can run a warp per parallel index: it reduces in a top-level loop, no
  // loop reads an accumulator it updates, and no buffer written is read inside a loop (column
  // scratch), so lanes never depend on each other inside a loop. (A value stored by lane 0 and
  // read back outside loops, as a combine's output by its epilogue, stays on lane 0.)
  bool warp_eligible() const {
    if (k.accs.empty()) return false;
    std::set<int> loaded, stored, none;
    for (const Stmt& s : k.body)  // top-level stores run on lane 0 only: their reads are exempt
      if (s.kind != Stmt::Kind::Store) loads_in({s}, loaded);
    bool reducing_loop = false;
    for (const Stmt& s : k.body) {
      if (s.kind != Stmt::Kind::Loop) continue;
      std::set<int> up, rd;
      updated(s.body, up);
      reads(s.body, rd, stored);
      for (ExprId e : {s.lo, s.hi}) acc_reads(e, rd);
      for (int a : up)
        if (rd.count(a)) return false;
      reducing_loop = reducing_loop || !up.empty();
    }
    std::set<int> rd;
    reads(k.body, rd, stored);
    for (int b : stored)
      if (loaded.count(b)) return false;
    return reducing_loop;
  }

  std::string shfl(const std::string& v, const std::string& o) {
    return "__shfl_xor_sync(0xffffffffu, " + v + ", " + o + ")";
  }

  // Replaces accumulator `a` (value A, index I) by the other state (ov, oi) when that one comes
  // first in the reduction's order: larger (smaller) value, a NaN before numbers, then the
  // smaller index. Arg reductions only.
  void arg_take(int a, const std::string& ov, const std::string& oi) {
    const AccSpec& s = k.accs[a];
    const bool mx = s.op == OpKind::ArgMax, fl = is_floating(s.dtype);
    const std::string A = "acc" + std::to_string(a), I = "acci" + std::to_string(a);
    std::string better = "(" + ov + (mx ? " > " : " < ") + A + ")", same = "(" + ov + " == " + A + ")";
    if (fl) {
      better = "((" + isnan_(ov) + " && !" + isnan_(A) + ") || (!" + isnan_(ov) + " && !" + isnan_(A) + " && " +
               better + "))";
      same = "(" + same + " || (" + isnan_(ov) + " && " + isnan_(A) + "))";
    }
    line("if (" + oi + " >= 0 && (" + I + " < 0 || " + better + " || (" + same + " && " + oi + " < " + I + "))) { " +
         A + " = " + ov + "; " + I + " = " + oi + "; }");
  }

  // acc a = combine(acc a, other), for sums, products and max/min (not arg reductions).
  void combine_with(int a, const std::string& ov, const std::string& onan) {
    const AccSpec& s = k.accs[a];
    const bool fl = is_floating(s.dtype);
    const std::string A = "acc" + std::to_string(a), T = ctype(s.dtype);
    switch (s.op) {
      case OpKind::Sum:
        line(A + " = " + (fl ? A + " + " + ov : "(" + T + ")((u64)" + A + " + (u64)" + ov + ")") + ";");
        break;
      case OpKind::Prod:
        line(A + " = " + (fl ? A + " * " + ov : "(" + T + ")((u64)" + A + " * (u64)" + ov + ")") + ";");
        break;
      default: {
        const bool mx = s.op == OpKind::Amax;
        if (fl) {
          line(A + " = " + fn(mx ? "fmax" : "fmin", s.dtype) + "(" + A + ", " + ov + ");");
          line("accnan" + std::to_string(a) + " = accnan" + std::to_string(a) + " || " + onan + ";");
        } else {
          line(A + " = " + ov + (mx ? " > " : " < ") + A + " ? " + ov + " : " + A + ";");
        }
      }
    }
  }

  void warp_reduce(int a) {
    const AccSpec& s = k.accs[a];
    const std::string A = "acc" + std::to_string(a), I = "acci" + std::to_string(a), T = ctype(s.dtype);
    line("for (int o = 16; o > 0; o >>= 1) {");
    ++indent;
    if (s.op == OpKind::ArgMax || s.op == OpKind::ArgMin) {
      line("const " + T + " ov = " + shfl(A, "o") + ";");
      line("const i64 oi = " + shfl(I, "o") + ";");
      arg_take(a, "ov", "oi");
    } else {
      line("const " + T + " ov = " + shfl(A, "o") + ";");
      const bool flag = nan_flag(s);
      if (flag) line("const bool on = " + shfl("(int)accnan" + std::to_string(a), "o") + " != 0;");
      combine_with(a, "ov", flag ? "on" : "false");
    }
    --indent;
    line("}");
  }

  // After warp_reduce in a block: the warps' results through shared memory, combined in warp
  // order by every thread (the same value everywhere, the same bits on every run).
  void block_reduce(int a) {
    const AccSpec& s = k.accs[a];
    const bool arg = s.op == OpKind::ArgMax || s.op == OpKind::ArgMin, flag = nan_flag(s);
    const std::string A = std::to_string(a), T = ctype(s.dtype), W = std::to_string(lanes / 32);
    line("{");
    ++indent;
    line("__shared__ " + T + " bs[" + W + "]; __shared__ i64 bsi[" + W + "]; __shared__ bool bsn[" + W + "];");
    line("__syncthreads();  // earlier readers of bs are done");
    line("if (lane % 32 == 0) { bs[lane / 32] = acc" + A + "; bsi[lane / 32] = acci" + A +
         "; bsn[lane / 32] = " + (flag ? "accnan" + A : std::string("false")) + "; }");
    line("__syncthreads();");
    line("acc" + A + " = bs[0]; acci" + A + " = bsi[0];" + (flag ? " accnan" + A + " = bsn[0];" : ""));
    line("for (int w = 1; w < " + W + "; ++w) {");
    ++indent;
    if (arg)
      arg_take(a, "bs[w]", "bsi[w]");
    else
      combine_with(a, "bs[w]", flag ? "bsn[w]" : "false");
    --indent;
    line("}");
    --indent;
    line("}");
  }

  static bool has_loop(const std::vector<Stmt>& ss) {
    for (const Stmt& s : ss)
      if (s.kind == Stmt::Kind::Loop) return true;
    return false;
  }

  // The values loop `s`'s body reads that stay the same over its iterations: no variable of
  // the loop or of loops inside it, no accumulator the loop updates (one it does not holds the
  // same value in every lane: a finished row sum, a row's max), no load of a buffer the kernel
  // writes and no value the row cache keeps per element reach them. Outermost such expressions
  // only, leaves (constants, parameters) left out.
  std::vector<ExprId> invariants(const Stmt& s) const {
    std::set<int64_t> vars;
    std::set<int> accs;
    std::function<void(const Stmt&)> collect = [&](const Stmt& l) {
      if (l.kind == Stmt::Kind::AccUpdate || l.kind == Stmt::Kind::AccInit) accs.insert(l.acc);
      if (l.kind != Stmt::Kind::Loop) return;
      vars.insert(l.var);
      for (const Stmt& b : l.body) collect(b);
    };
    collect(s);
    const auto cached = rc.loops.find(&s);
    const std::vector<char> varying = reaches(k, [&](ExprId id) {
      const Expr& e = k.exprs[static_cast<size_t>(id)];
      if (cached != rc.loops.end() && (cached->second.reads.count(id) || cached->second.writes.count(id))) return true;
      return (e.kind == Expr::Kind::Var && vars.count(e.i)) ||
             ((e.kind == Expr::Kind::Acc || e.kind == Expr::Kind::AccIndex) && accs.count(static_cast<int>(e.i))) ||
             (e.kind == Expr::Kind::Load && k.buffers[static_cast<size_t>(e.i)].output);
    });
    std::vector<ExprId> out;
    std::set<ExprId> seen;
    std::function<void(ExprId)> visit = [&](ExprId id) {
      if (id < 0 || !seen.insert(id).second) return;
      const Expr& e = k.exprs[static_cast<size_t>(id)];
      switch (e.kind) {
        case Expr::Kind::IConst:
        case Expr::Kind::FConst:
        case Expr::Kind::Param:
        case Expr::Kind::FParam:
        case Expr::Kind::Var: return;
        default: break;
      }
      if (!varying[static_cast<size_t>(id)]) {
        out.push_back(id);
        return;
      }
      for (ExprId x : {e.a, e.b, e.c}) visit(x);
    };
    std::function<void(const std::vector<Stmt>&)> walk = [&](const std::vector<Stmt>& ss) {
      for (const Stmt& b : ss) {
        for (ExprId x : {b.lo, b.hi, b.index, b.value}) visit(x);
        walk(b.body);
      }
    };
    walk(s.body);
    return out;
  }

  // The loop `s` with the warp's (block's) lanes over its iterations, the body serial per lane.
  // What the body reads that stays the same over the iterations is computed first, when the
  // loop runs at all (a row's scale, log-sum-exp or index; not once per element).
  void lanes_over(const Stmt& s) {
    std::string lo = expr(s.lo), hi = expr(s.hi);
    const bool guarded = hoist_invariants(s, lo, hi);
    lanes_loop(s, lo, hi);
    if (guarded) close();
  }

  // What loop `s` (bounds lo, hi) shares over its iterations, computed once before it when it
  // runs at all: opens `if (lo < hi)` for it and returns true (the caller closes it after the
  // loop), or false where there is nothing to hoist. Not left to NVCC's loop-invariant motion,
  // which a branch in the body can stop.
  bool hoist_invariants(const Stmt& s, const std::string& lo, const std::string& hi) {
    const std::vector<ExprId> hoisted = invariants(s);
    if (hoisted.empty()) return false;
    open("if (" + lo + " < " + hi + ")");
    for (ExprId e : hoisted) expr(e);
    return true;
  }

  void lanes_loop(const Stmt& s, const std::string& lo, const std::string& hi) {
    std::string v = "i" + std::to_string(s.var);
    // A flat loop: unrolled, so each lane keeps several loads in flight. Rows kept in shared
    // memory: 8 (faster row kernels); otherwise 4 (the W1 split kernel loses occupancy at 8).
    if (!has_loop(s.body)) line(rc.empty() ? "#pragma unroll 4" : "#pragma unroll 8");
    const auto lc = rc.loops.find(&s);
    if (lc != rc.loops.end()) cur_cache = &lc->second;  // the loop's element in the row cache: rcx
    block("for (i64 " + v + " = " + lo + " + lane; " + v + " < " + hi + "; " + v + " += " + std::to_string(lanes) + ")",
          s.body, cur_cache ? "const int rcx = (int)(" + v + " - " + lo + ");" : "");
    cur_cache = nullptr;
  }

  // A perfect nest from `s` down (each body the next loop alone) whose innermost loop's bounds
  // do not depend on the loops around it and that keeps no rows in shared memory: the loops,
  // outermost first; empty otherwise (one loop is not a nest).
  std::vector<const Stmt*> lanes_inside(const Stmt& s) const {
    std::vector<const Stmt*> nest{&s};
    while (nest.back()->body.size() == 1 && nest.back()->body[0].kind == Stmt::Kind::Loop)
      nest.push_back(&nest.back()->body[0]);
    const Stmt& in = *nest.back();
    if (nest.size() < 2 || has_loop(in.body)) return {};
    std::set<int64_t> outer;
    for (const Stmt* l : nest) {
      if (rc.loops.count(l)) return {};
      if (l != &in) outer.insert(l->var);
    }
    const std::vector<char> dep = reaches(k, [&](ExprId id) {
      const Expr& e = k.exprs[static_cast<size_t>(id)];
      return e.kind == Expr::Kind::Var && outer.count(e.i) > 0;
    });
    if (dep[static_cast<size_t>(in.lo)] || dep[static_cast<size_t>(in.hi)]) return {};
    return nest;
  }

  void warp_stmts(const std::vector<Stmt>& ss) {
    for (const Stmt& s : ss) {
      if (s.kind == Stmt::Kind::Store || s.kind == Stmt::Kind::AccStore) {
        block("if (lane == 0)", {s});
        continue;
      }
      if (s.kind != Stmt::Kind::Loop) {
        stmts({s});  // every lane the same: accumulator starts and updates on synchronized state
        continue;
      }
      std::set<int> up;
      updated(s.body, up);
      std::vector<std::string> saved;
      for (int a : up) {  // the state before the loop, combined back after it
        const AccSpec& as = k.accs[a];
        const std::string n = "sv" + std::to_string(temps++), A = std::to_string(a);
        line("const " + std::string(ctype(as.dtype)) + " " + n + " = acc" + A + "; const i64 " + n + "i = acci" + A +
             ";" + (nan_flag(as) ? " const bool " + n + "n = accnan" + A + ";" : ""));
        line("acc" + A + " = " + identity(as) + "; acci" + A + " = -1;" +
             (nan_flag(as) ? " accnan" + A + " = false;" : ""));
        saved.push_back(n);
      }
      const std::vector<const Stmt*> nest = lanes_inside(s);
      if (nest.empty()) {
        lanes_over(s);
      } else {
        // The lanes over the innermost loop where it is long (neighbouring lanes read
        // neighbouring elements: a chunk of one 3072-wide row was one lane's serial loop),
        // over the outer loop where it is short.
        const Stmt& in = *nest.back();
        open("if (" + expr(in.hi) + " - " + expr(in.lo) + " >= 32)");
        for (size_t d = 0; d + 1 < nest.size(); ++d) {
          const std::string v = "i" + std::to_string(nest[d]->var);
          open("for (i64 " + v + " = " + expr(nest[d]->lo) + "; " + v + " < " + expr(nest[d]->hi) + "; ++" + v + ")");
        }
        lanes_over(in);
        for (size_t d = 0; d + 1 < nest.size(); ++d) close();
        otherwise();
        lanes_over(s);
        close();
      }
      size_t si = 0;
      for (int a : up) {
        warp_reduce(a);
        if (lanes > 32) block_reduce(a);
        const AccSpec& as = k.accs[a];
        const std::string& n = saved[si++];
        if (as.op == OpKind::ArgMax || as.op == OpKind::ArgMin)
          arg_take(a, n, n + "i");
        else
          combine_with(a, n, nan_flag(as) ? n + "n" : "false");
      }
    }
  }

  std::string emit(const std::string& symbol, size_t param_bytes) {
    for (const BufferSpec& b : k.buffers) mtype(b.dtype);  // rejects unsupported dtypes first
    KILN_CHECK(launch_arg_bytes(k) <= param_bytes, "cuda: kernel ", symbol, " needs ", launch_arg_bytes(k),
               " bytes of arguments (at most ", param_bytes, " here)");
    bool halves = false;
    for (const BufferSpec& b : k.buffers) halves = halves || is_half(b.dtype);
    for (const Expr& e : k.exprs) halves = halves || is_half(e.dtype);
    out << "// kiln kernel " << symbol << " (" << k.name << ")\n" << kPreamble << (halves ? kHalfPreamble : "") << "\n";
    // Arguments by value (copied by the launch, so launches queue without a host wait).
    out << "struct Args_" << symbol << " { char* buffers[" << std::max<size_t>(k.buffers.size(), 1) << "]; i64 iparams["
        << std::max(k.num_params, 1) << "]; double fparams[" << std::max(k.num_fparams, 1) << "]; };\n";
    out << "extern \"C\" __global__ void __launch_bounds__(" << std::max(kCudaBlock, lanes) << ") " << symbol
        << "(i64 begin, i64 end, const Args_" << symbol << " args) {\n";
    line(
        "char* const* buffers = args.buffers; const i64* iparams = args.iparams; const double* fparams = "
        "args.fparams;");
    for (size_t i = 0; i < k.buffers.size(); ++i) {
      std::string T = mtype(k.buffers[i].dtype);
      line(T + "* __restrict__ b" + std::to_string(i) + " = (" + T + "*)buffers[" + std::to_string(i) + "];");
    }
    for (int i = 0; i < k.num_params; ++i)
      line("const i64 ip" + std::to_string(i) + " = iparams[" + std::to_string(i) + "];");
    for (int i = 0; i < k.num_fparams; ++i)
      line("const double fp" + std::to_string(i) + " = fparams[" + std::to_string(i) + "];");
    for (size_t a = 0; a < k.accs.size(); ++a) {
      line(std::string(ctype(k.accs[a].dtype)) + " acc" + std::to_string(a) + " = 0;");
      line("i64 acci" + std::to_string(a) + " = -1;");
      if (nan_flag(k.accs[a])) line("bool accnan" + std::to_string(a) + " = false;");
      line("(void)acc" + std::to_string(a) + "; (void)acci" + std::to_string(a) + ";");
    }
    if (!rc.empty()) {  // the row cache: this warp's region of the dynamic shared memory
      line("extern __shared__ __align__(16) unsigned char kiln_smem[];");
      for (size_t sl = 0; sl < rc.slots.size(); ++sl) {
        const std::string T = mtype(rc.slots[sl]);
        line(T + "* const rc" + std::to_string(sl) + " = (" + T + "*)(kiln_smem + (threadIdx.x >> 5) * " +
             std::to_string(rc.region) + " + " + std::to_string(rc.slot_offset[sl]) + ");");
      }
    }
    // Values of the launch's parameters alone that every index would compute again: once a
    // thread, before its loop (a horizontal kernel's member ends).
    scopes.emplace_back();
    if (horizontal())
      for (ExprId e : k.member_ends) expr(e);
    // The grid-stride loop is not unrolled: a thread runs it a few times at most (grids go up to
    // 32 blocks an SM), and NVVM's unrolled and versioned copies of the body only made NVRTC
    // slower, with no faster kernels.
    if (lanes > 32) {  // a block per parallel index
      line("const int lane = threadIdx.x;");
      line("#pragma unroll 1");
      open("for (i64 i0 = begin + (i64)blockIdx.x; i0 < end; i0 += gridDim.x)");
    } else if (warp) {
      line("const int lane = threadIdx.x & 31;");
      line("const i64 wstride = ((i64)gridDim.x * blockDim.x) >> 5;");
      line("#pragma unroll 1");
      open("for (i64 i0 = begin + (((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5); i0 < end; i0 += wstride)");
    } else {
      line("const i64 stride = (i64)gridDim.x * blockDim.x;");
      line("#pragma unroll 1");
      open("for (i64 i0 = begin + (i64)blockIdx.x * blockDim.x + threadIdx.x; i0 < end; i0 += stride)");
    }
    if (warp)
      warp_stmts(k.body);
    else if (horizontal())
      members(0, k.body.size());
    else
      stmts(k.body);
    close();
    scopes.pop_back();
    out << "}\n";
    return out.str();
  }

  bool horizontal() const { return !k.member_ends.empty() && k.member_ends.size() == k.body.size(); }

  // Members [a, b) of a horizontal kernel: a binary search over their ends picks the one that
  // runs index i0 (neighbouring threads take the same branch), rather than every thread
  // testing every member (an optimizer step's update: up to 32 of them).
  void members(size_t a, size_t b) {
    if (b - a == 1) {
      stmts({k.body[a]});
      return;
    }
    const size_t mid = (a + b) / 2;
    open("if (i0 < " + expr(k.member_ends[mid - 1]) + ")");
    members(a, mid);
    otherwise();
    members(mid, b);
    close();
  }
};

}  // namespace

std::string emit_cuda(const Kernel& k, const std::string& symbol, int* lanes, int* shared_bytes, size_t param_bytes) {
  Emitter e(k);
  e.warp = (e.warp_eligible() || e.row_tiles()) && !k.columns;
  e.lanes = !e.warp ? 1 : k.long_indices ? kCudaWideBlock : 32;
  // Rows kept in shared memory: 48 KiB a block, split between its warps (four blocks an SM
  // on sm_90; 96 KiB left two, too few warps for the row kernels).
  constexpr int64_t kRowCacheBytes = 48 * 1024;
  if (e.lanes == 32 && k.row_cache > 0)
    e.rc = plan_row_cache(k, kRowCacheBytes / (kCudaBlock / 32), /*cache_loads=*/true);
  if (lanes) *lanes = e.lanes;
  if (shared_bytes) *shared_bytes = static_cast<int>(e.rc.region * (kCudaBlock / 32));
  return e.emit(symbol, param_bytes);
}

bool cuda_supports(OpKind, DType dtype) {
  // Float-only ops on integers never reach a kernel (type promotion makes them float first);
  // emit_cuda still rejects them. 16-bit floats compute in float32, rounded after each op.
  switch (dtype) {
    case DType::Bool:
    case DType::Int32:
    case DType::Int64:
    case DType::Float16:
    case DType::BFloat16:
    case DType::Float32:
    case DType::Float64: return true;
  }
  return false;
}

}  // namespace kiln::jit
