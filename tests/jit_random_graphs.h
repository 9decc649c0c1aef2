// Random graphs for the JIT tests (tests/test_jit.cpp, tests/test_asmjit.cpp): the generator
// with its error bounds, evaluation on an executor, comparison against the interpreter at the
// tolerances described in tests/test_jit.cpp, and failure reports. Test-only; each test
// executable includes it once.
#pragma once
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>
#include "jit/exec/code_cache.h"
#include "jit/cpu_llvm/codegen_llvm.h"
#include "jit/exec/jit_executor.h"
#include "jit/exec/tiering.h"
#include "jit/loop/lower.h"
#include "jit/graph/scheduler.h"
#include "kiln.h"
#include "test_seed.h"

namespace {

using kiln::DType;
using kiln::Tensor;
using Dims = std::vector<int64_t>;

constexpr DType kBool = kiln::kBool, kI32 = kiln::kInt32, kI64 = kiln::kInt64, kF32 = kiln::kFloat32,
                kF64 = kiln::kFloat64;
const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

bool env_interp() { return kiln::testing::interpreted(); }
#define SKIP_UNDER_INTERP_REGISTRATION()                                      \
  if (env_interp())                                                           \
  GTEST_SKIP() << "JIT-only test (it switches executors itself; the default " \
                  "registration runs it)"

// ============================================================== randomness

using kiln::testing::splitmix;
uint64_t test_seed() { return kiln::testing::test_seed(20250611ull); }

int env_int(const char* name, int dflt) {
  const char* s = std::getenv(name);
  return (s && *s) ? std::atoi(s) : dflt;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(splitmix(seed)) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return splitmix(state_);
  }
  int64_t range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool coin(double p = 0.5) { return uniform() < p; }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }
  template <class T>
  const T& pick(const std::vector<T>& xs) {
    return xs[next() % xs.size()];
  }

 private:
  uint64_t state_;
};

int64_t prod(const Dims& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}
std::string dims_str(const Dims& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}
double eps_of(DType t) { return t == kF64 ? 0x1p-52 : 0x1p-23; }

// ============================================================== inputs

struct InputSpec {
  DType dt;
  Dims shape;
  int layout = 0;  // 0 dense, 1 permuted (reversed dims), 2 strided (step-2 slice), 3 broadcast (stride 0)
  int bdim = 0;  // layout 3: the broadcast dim
  bool specials = false;  // some NaN / inf / -0 elements
  bool big = false;  // int64 values up to 2^62 (beyond double's 2^53)
  uint64_t seed = 0;
};

const char* layout_name(int l) {
  static const char* n[] = {"dense", "permuted", "strided", "broadcast"};
  return n[l];
}

Tensor blob(DType dt, const Dims& shape, Rng& r, bool specials, bool big = false) {
  int64_t n = prod(shape);
  size_t isz = kiln::itemsize(dt);
  char* p = new char[static_cast<size_t>(std::max<int64_t>(n, 1)) * isz];
  for (int64_t i = 0; i < n; ++i) {
    double v = 0;
    switch (dt) {
      case DType::Bool: p[i] = static_cast<char>(r.coin()); continue;
      case DType::Int32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(r.range(-5, 5)); continue;
      case DType::Int64:
        reinterpret_cast<int64_t*>(p)[i] =
            big && r.coin(0.9) ? static_cast<int64_t>(r.next() >> 1) - (int64_t{1} << 62) : r.range(-5, 5);
        continue;
      default: break;
    }
    v = r.uniform() * 4 - 2;
    if (r.coin(0.05)) v = static_cast<double>(r.range(-2, 2));  // exact small integers: ties, zeros
    if (specials && r.coin(0.04)) {
      const double sp[] = {kNaN, kInf, -kInf, -0.0, 0.0};
      v = sp[r.range(0, 4)];
    }
    if (dt == kF32)
      reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
    else
      reinterpret_cast<double*>(p)[i] = v;
  }
  return kiln::from_blob(p, shape, dt, [](void* q) { delete[] static_cast<char*>(q); });
}

// A materialized input with the spec's layout (made under the current executor).
Tensor make_input(const InputSpec& s) {
  Rng r(s.seed);
  Tensor t;
  const int64_t rank = static_cast<int64_t>(s.shape.size());
  if (s.layout == 1 && rank >= 2) {
    Dims rev(s.shape.rbegin(), s.shape.rend()), perm;
    for (int64_t d = rank - 1; d >= 0; --d) perm.push_back(d);
    t = blob(s.dt, rev, r, s.specials, s.big).permute(perm);
  } else if (s.layout == 2 && rank >= 1) {
    Dims big = s.shape;
    big.back() *= 2;
    t = blob(s.dt, big, r, s.specials, s.big).slice(rank - 1, 0, std::nullopt, 2);
  } else if (s.layout == 3 && rank >= 1) {
    Dims one = s.shape;
    one[s.bdim] = 1;
    t = blob(s.dt, one, r, s.specials, s.big).expand(s.shape);
  } else {
    t = blob(s.dt, s.shape, r, s.specials, s.big);
  }
  t.eval();
  return t;
}

// ============================================================== graphs

// What the generator knows about a value: its type, and how far the JIT may differ from the
// interpreter on it (see the tolerance notes at the top).
struct Info {
  DType dt = kF32;
  Dims shape;
  bool exact = true;  // reproduced bit for bit by both executors
  bool finite = true;  // cannot hold NaN / inf
  double mag = 2;  // bound on |finite elements|
  double abs_err = 0;  // first-order error bound: abs_err + rel_err * |value|
  double rel_err = 0;
  bool reduced = false;  // depends on a floating reduction
  bool is_input = false;
  double delta() const { return abs_err + (rel_err > 0 ? rel_err * mag : 0); }
};

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;
struct Instr {
  std::string text;
  OpFn fn;
};

struct Program {
  std::vector<InputSpec> inputs;
  std::vector<Instr> instrs;
  std::vector<Info> info;  // per value (inputs first)
  std::vector<int> outputs;  // value indices
  bool eval_together = true;
  std::string header;  // family / variant / sizes
  std::string str() const {
    std::ostringstream os;
    os << header << "\n";
    for (size_t i = 0; i < inputs.size(); ++i) {
      const InputSpec& s = inputs[i];
      os << "  v" << i << " = input " << kiln::dtype_name(s.dt) << dims_str(s.shape) << " " << layout_name(s.layout)
         << (s.layout == 3 ? "(dim " + std::to_string(s.bdim) + ")" : "") << (s.specials ? " with NaN/inf" : "")
         << (s.big ? " big" : "") << "\n";
    }
    for (size_t i = 0; i < instrs.size(); ++i) {
      const Info& f = info[inputs.size() + i];
      os << "  v" << inputs.size() + i << " = " << instrs[i].text << "   -> " << kiln::dtype_name(f.dt)
         << dims_str(f.shape) << (f.exact ? " exact" : "") << (f.reduced ? " reduced" : "");
      if (!f.exact) os << " err<=" << f.abs_err << "+" << f.rel_err << "*|x|";
      os << "\n";
    }
    os << "  outputs:";
    for (int o : outputs) os << " v" << o;
    os << (eval_together ? " (one eval)" : " (evaluated one by one)") << "\n";
    return os.str();
  }
};

// Replays a program on fresh inputs under the current executor; returns every value.
std::vector<Tensor> replay(const Program& p) {
  std::vector<Tensor> v;
  for (const InputSpec& s : p.inputs) v.push_back(make_input(s));
  for (const Instr& in : p.instrs) v.push_back(in.fn(v));
  return v;
}

// Sizes of one variant: the reference shape of the family, instantiated.
struct Variant {
  Dims ref;  // reference shape (inputs are right-aligned sub-shapes of it, with some 1s)
};

constexpr int64_t kMaxNumel = 400000;

class Gen {
 public:
  // pointwise_only: only pointwise ops, casts, where and views (no reductions, composites,
  // library ops or writes through views).
  Gen(uint64_t struct_seed, const Variant& v, bool pointwise_only = false)
      : S(struct_seed), var(v), pointwise_only_(pointwise_only) {}

  Program build() {
    // Inputs: right-aligned slices of the reference shape, some dims replaced by 1.
    const int R = static_cast<int>(var.ref.size());
    int n_in = static_cast<int>(S.range(1, 3));
    for (int i = 0; i < n_in; ++i) {
      InputSpec s;
      int rank = i == 0 ? R : static_cast<int>(S.range(0, R));
      for (int d = R - rank; d < R; ++d) s.shape.push_back(i > 0 && S.coin(0.3) ? 1 : var.ref[d]);
      const std::vector<DType> dts = {kF32, kF32, kF32, kF64, kI32, kI64, kBool};
      s.dt =
          i == 0 ? S.pick(std::vector<DType>{kF32, kF32, kF32, kF32, kF32, kF32, kF64, kF64, kI64, kI32}) : S.pick(dts);
      int layout = static_cast<int>(S.range(0, 5));
      s.layout = layout <= 2 ? 0 : layout - 2;
      if (s.layout == 1 && rank < 2) s.layout = 0;
      if ((s.layout == 2 || s.layout == 3) && rank < 1) s.layout = 0;
      if (s.layout == 3) s.bdim = static_cast<int>(S.range(0, rank - 1));
      s.specials = kiln::is_floating(s.dt) && S.coin(0.1);
      s.big = s.dt == kI64 && S.coin(0.3);
      s.seed = S.next();
      p.inputs.push_back(s);
      vals.push_back(make_input(s));
      Info f;
      f.dt = s.dt;
      f.shape = s.shape;
      f.finite = !s.specials;
      f.mag = kiln::is_floating(s.dt) ? 2 : s.dt == kBool ? 1 : s.big ? 0x1p62 : 5;
      f.is_input = true;
      p.info.push_back(f);
    }
    int steps = static_cast<int>(S.range(2, 9));
    for (int k = 0; k < steps; ++k)
      for (int attempt = 0; attempt < 30 && !step(); ++attempt) {
      }
    // Outputs: the last value and a few others (stored intermediates: "needed" nodes).
    const int nv = static_cast<int>(p.info.size());
    p.outputs.push_back(nv - 1);
    int extra = static_cast<int>(S.range(0, 2));
    for (int e = 0; e < extra && nv > static_cast<int>(p.inputs.size()) + 1; ++e) {
      int o = static_cast<int>(S.range(static_cast<int64_t>(p.inputs.size()), nv - 2));
      if (std::find(p.outputs.begin(), p.outputs.end(), o) == p.outputs.end()) p.outputs.push_back(o);
    }
    p.eval_together = S.coin(0.8);
    return p;
  }

 private:
  Rng S;
  const Variant& var;
  bool pointwise_only_;
  Program p;
  std::vector<Tensor> vals;

  const Info& I(int i) const { return p.info[i]; }
  std::string V(int i) const { return "v" + std::to_string(i); }

  // Records an op on the probe values; keeps it if kiln accepts it and the bounds are sane.
  bool add(const std::string& text, OpFn fn, Info out) {
    Tensor t;
    try {
      t = fn(vals);
    } catch (const kiln::Error&) {
      return false;
    }
    out.dt = t.dtype();
    out.shape = t.sizes();
    out.is_input = false;
    if (prod(out.shape) > kMaxNumel) return false;
    if (out.dt == kI32 && out.mag > 0x1p31) return false;
    if (out.dt == kI64 && out.mag > 0x1p62) return false;  // no overflow (UB in the interpreter)
    if (kiln::is_floating(out.dt) && !out.exact) {
      if (!(out.abs_err <= 1e-2) || !(out.rel_err <= 1e-3) || std::isnan(out.abs_err)) return false;
      out.rel_err = std::max(out.rel_err, eps_of(out.dt));  // its own rounding
    }
    if (!kiln::is_floating(out.dt)) {
      out.exact = true;
      out.abs_err = out.rel_err = 0;
    }
    vals.push_back(t);
    p.info.push_back(out);
    p.instrs.push_back({text, std::move(fn)});
    return true;
  }

  // A random value index satisfying pred (biased to recent values), or -1.
  int pick(const std::function<bool(const Info&)>& pred) {
    const int nv = static_cast<int>(p.info.size());
    if (S.coin(0.5) && pred(p.info[nv - 1])) return nv - 1;
    std::vector<int> c;
    for (int i = 0; i < nv; ++i)
      if (pred(p.info[i])) c.push_back(i);
    if (c.empty()) return -1;
    return c[S.next() % c.size()];
  }
  static bool broadcastable(const Dims& a, const Dims& b) {
    for (size_t k = 0; k < std::min(a.size(), b.size()); ++k) {
      int64_t x = a[a.size() - 1 - k], y = b[b.size() - 1 - k];
      if (x != y && x != 1 && y != 1) return false;
    }
    return true;
  }
  static bool fl(const Info& f) { return kiln::is_floating(f.dt); }
  static bool num(const Info& f) { return f.dt != kBool; }

  // Result info of a pointwise op whose inputs pass their errors through unchanged (L = 1).
  Info passthrough(std::initializer_list<int> ins) const {
    Info o;
    o.mag = 0;
    for (int i : ins) {
      const Info& f = I(i);
      o.exact = o.exact && f.exact;
      o.finite = o.finite && f.finite;
      o.reduced = o.reduced || f.reduced;
      o.mag = std::max(o.mag, f.mag);
      o.abs_err = std::max(o.abs_err, f.abs_err);
      o.rel_err = std::max(o.rel_err, f.rel_err);
    }
    return o;
  }

  bool step() {
    int cat = static_cast<int>(S.range(0, pointwise_only_ ? 71 : 99));
    if (cat < 18) return unary_float();
    if (cat < 24) return unary_other();
    if (cat < 46) return binary();
    if (cat < 50) return where_op();
    if (cat < 55) return cast_op();
    if (cat < 72) return view_op();
    if (cat < 86) return reduction();
    if (cat < 93) return nn_pattern();
    if (cat < 97) return library_op();
    return inplace_view_write();
  }

  // ---- unary floating math ----
  bool unary_float() {
    int a = pick(fl);
    if (a < 0) return false;
    const Info& x = I(a);
    const double e = eps_of(x.dt);
    struct U {
      const char* name;
      Tensor (*f)(const Tensor&);
      int kind;
      double lip;
    };
    // kind 0: bounded output, Lipschitz `lip`, any input; 1: exp-like; 2: passthrough (neg/abs/relu);
    // 3: exact inputs only, exactly rounded result; 4: exact inputs only, transcendental;
    // 5: exact inputs only, discontinuous, exact result; 6: silu/gelu-like (L ~ 1.2, |out| <= |x|)
    static const std::vector<U> ops = {
        {"tanh", kiln::tanh, 0, 1.0},
        {"sigmoid", kiln::sigmoid, 0, 0.25},
        {"atan", kiln::atan, 0, 1.0},
        {"sin", kiln::sin, 0, 1.0},
        {"cos", kiln::cos, 0, 1.0},
        {"erf", kiln::erf, 0, 1.13},
        {"exp", kiln::exp, 1, 1.0},
        {"exp2", kiln::exp2, 1, 0.7},
        {"expm1", kiln::expm1, 1, 1.0},
        {"neg", kiln::neg, 2, 1},
        {"abs", kiln::abs, 2, 1},
        {"relu", kiln::relu, 2, 1},
        {"sqrt", kiln::sqrt, 3, 0},
        {"rsqrt", kiln::rsqrt, 3, 0},
        {"reciprocal", kiln::reciprocal, 3, 0},
        {"log", kiln::log, 4, 0},
        {"log2", kiln::log2, 4, 0},
        {"log1p", kiln::log1p, 4, 0},
        {"tan", kiln::tan, 4, 0},
        {"floor", kiln::floor, 5, 0},
        {"ceil", kiln::ceil, 5, 0},
        {"round", kiln::round, 5, 0},
        {"sign", kiln::sign, 5, 0},
        {"square", kiln::square, 7, 0},
        {"silu", kiln::silu, 6, 1.1},
        {"gelu", [](const Tensor& t) { return kiln::gelu(t); }, 6, 1.13},
        {"gelu_tanh", [](const Tensor& t) { return kiln::gelu(t, "tanh"); }, 6, 1.13},
        {"softplus", [](const Tensor& t) { return kiln::softplus(t); }, 8, 1.0},
    };
    const U& u = S.pick(ops);
    Info o = passthrough({a});
    const double d = x.delta();
    switch (u.kind) {
      case 0:
        if (!std::isfinite(d)) return false;
        if ((std::string(u.name) == "sin" || std::string(u.name) == "cos") && x.mag > 1e4) return false;
        o.exact = false;
        o.mag = std::string(u.name) == "atan" ? 1.6 : 1;
        o.abs_err = u.lip * d;
        o.rel_err = 2 * e;
        break;
      case 1:
        if (!std::isfinite(d) || d > 1e-3 || x.mag > 60) return false;
        o.exact = false;
        o.mag = std::exp(x.mag);
        if (std::string(u.name) == "expm1") {
          o.abs_err = d * o.mag;
          o.rel_err = 2 * e;
        } else {
          o.abs_err = 0;
          o.rel_err = u.lip * d + 2 * e;
        }
        break;
      case 2: break;
      case 3:
        if (!x.exact) return false;
        o.finite = false;
        o.mag = std::string(u.name) == "sqrt" ? std::sqrt(x.mag) : kInf;
        break;
      case 4:
        if (!x.exact || (std::string(u.name) == "tan" && x.mag > 1e4)) return false;
        o.exact = false;
        o.finite = false;
        o.mag = std::string(u.name) == "tan" ? kInf : std::max(25.0, std::log(x.mag) + 1);
        o.abs_err = 0;
        o.rel_err = 2 * e;
        break;
      case 5:
        if (!x.exact) return false;
        if (std::string(u.name) == "sign")
          o.mag = 1;
        else
          o.mag = x.mag + 1;
        break;
      case 6:
        if (!std::isfinite(d) || !std::isfinite(x.mag) || x.mag > 1e4) return false;
        o.exact = false;
        o.abs_err = u.lip * d + 4 * e * x.mag;
        o.rel_err = 4 * e;
        o.mag = x.mag;
        break;
      case 7:  // x * x
        o.mag = x.mag * x.mag;
        if (!x.exact) {
          if (!std::isfinite(o.mag)) return false;
          o.abs_err = 2 * x.abs_err * x.mag;
          o.rel_err = 2 * x.rel_err + e;
        }
        break;
      case 8:  // softplus: where(x > 20, x, log1p(exp(x))): exact inputs only
        if (!x.exact || x.mag > 60) return false;
        o.exact = false;
        o.mag = x.mag + 1;
        o.abs_err = 2 * e * (x.mag + 1);
        o.rel_err = 4 * e;
        break;
    }
    auto f = u.f;
    return add(
        std::string(u.name) + "(" + V(a) + ")", [f, a](const std::vector<Tensor>& v) { return f(v[a]); }, o);
  }

  // ---- unary on ints / bools, and predicates ----
  bool unary_other() {
    int k = static_cast<int>(S.range(0, 7));
    if (k <= 4) {
      int a = pick([](const Info& f) { return !kiln::is_floating(f.dt); });
      if (a < 0) return false;
      Info o = passthrough({a});
      const char* names[] = {"neg", "abs", "sign", "bitwise_not", "relu"};
      Tensor (*fs[])(const Tensor&) = {kiln::neg, kiln::abs, kiln::sign, kiln::bitwise_not, kiln::relu};
      auto f = fs[k];
      if (k == 2) o.mag = 1;
      return add(
          std::string(names[k]) + "(" + V(a) + ")", [f, a](const std::vector<Tensor>& v) { return f(v[a]); }, o);
    }
    // isnan / isfinite / logical_not: need exactly reproduced inputs.
    int a = pick([](const Info& f) { return f.exact; });
    if (a < 0) return false;
    Info o = passthrough({a});
    o.mag = 1;
    o.finite = true;
    const char* names[] = {"isnan", "isfinite", "logical_not"};
    Tensor (*fs[])(const Tensor&) = {kiln::isnan, kiln::isfinite, kiln::logical_not};
    auto f = fs[k - 5];
    return add(
        std::string(names[k - 5]) + "(" + V(a) + ")", [f, a](const std::vector<Tensor>& v) { return f(v[a]); }, o);
  }

  // ---- binary (broadcasting, type promotion, scalars) ----
  bool binary() {
    enum Kind { Add, Sub, Mul, Div, Max, Min, Pow, Atan2, Rem, Fmod, Cmp, Logical, Bitwise };
    static const std::vector<std::pair<Kind, int>> kinds = {{Add, 5}, {Sub, 4},     {Mul, 5},    {Div, 2}, {Max, 2},
                                                            {Min, 2}, {Pow, 1},     {Atan2, 1},  {Rem, 1}, {Fmod, 1},
                                                            {Cmp, 5}, {Logical, 2}, {Bitwise, 2}};
    int total = 0;
    for (auto& k : kinds) total += k.second;
    int r = static_cast<int>(S.range(0, total - 1));
    Kind kind = Add;
    for (auto& k : kinds) {
      if (r < k.second) {
        kind = k.first;
        break;
      }
      r -= k.second;
    }
    const bool needs_exact =
        kind == Div || kind == Pow || kind == Atan2 || kind == Rem || kind == Fmod || kind == Cmp || kind == Logical;
    const bool float_only = kind == Pow || kind == Atan2 || kind == Rem || kind == Fmod;
    auto ok = [&](const Info& f) {
      if (needs_exact && !f.exact) return false;
      if (float_only && !fl(f)) return false;
      if (kind == Bitwise && fl(f)) return false;
      return true;
    };
    int a = pick(ok);
    if (a < 0) return false;
    const bool scalar = S.coin(0.3);
    const bool scalar_left = scalar && S.coin(0.25);
    int b = -1;
    double c = 0;
    if (scalar) {
      if (fl(I(a)))
        c = S.pick(std::vector<double>{2.5, -1.5, 0.5, 3.0, 0.0, -2.0});
      else
        c = static_cast<double>(S.range(-3, 3));
      if (kind == Bitwise && I(a).dt == kBool) c = S.range(0, 1);
    } else {
      const Dims sa = I(a).shape;
      b = pick([&](const Info& f) { return ok(f) && broadcastable(sa, f.shape); });
      if (b < 0) return false;
    }
    // Error bookkeeping (first order).
    const Info& A = I(a);
    Info B;
    if (b >= 0)
      B = I(b);
    else {
      B.dt = A.dt;
      B.mag = std::abs(c);
    }
    Info o = b >= 0 ? passthrough({a, b}) : passthrough({a});
    const bool inexact = !(A.exact && B.exact);
    double e = 0x1p-23;  // own rounding, in the result dtype
    try {
      DType rt = b >= 0 ? kiln::result_type({vals[a], vals[b]})
                        : kiln::result_type(
                              {vals[a]},
                              {fl(A) || c != std::floor(c) ? kiln::Scalar(c) : kiln::Scalar(static_cast<int64_t>(c))});
      e = eps_of(rt);
    } catch (const kiln::Error&) {
      return false;
    }
    switch (kind) {
      case Add:
      case Sub:
        o.mag = A.mag + B.mag;
        if (inexact) {
          o.abs_err = A.delta() + B.delta();
          o.rel_err = e;
        }
        break;
      case Mul:
        o.mag = A.mag * B.mag;
        if (inexact) {
          o.abs_err = A.abs_err * B.mag + B.abs_err * A.mag;
          o.rel_err = A.rel_err + B.rel_err + e;
          if (!std::isfinite(o.abs_err)) return false;
        }
        break;
      case Div:
      case Rem:
      case Fmod:
        o.finite = false;
        o.mag = kind == Div ? kInf : B.mag;
        break;
      case Pow:
      case Atan2:
        o.exact = false;
        o.finite = false;
        o.mag = kind == Pow ? kInf : 3.2;
        o.abs_err = 0;
        o.rel_err = 2 * e;
        break;
      case Max:
      case Min: break;
      case Cmp:
      case Logical:
        o.mag = 1;
        o.finite = true;
        break;
      case Bitwise: o.mag = std::max(A.mag, B.mag) * 2; break;
    }
    using BinT = Tensor (*)(const Tensor&, const Tensor&);
    using BinTS = Tensor (*)(const Tensor&, kiln::Scalar);
    using BinST = Tensor (*)(kiln::Scalar, const Tensor&);
    struct Fns {
      const char* name;
      BinT tt;
      BinTS ts;
      BinST st;
    };
#define KILN_FNS(n) Fns{#n, static_cast<BinT>(kiln::n), static_cast<BinTS>(kiln::n), static_cast<BinST>(kiln::n)}
    std::vector<Fns> choices;
    switch (kind) {
      case Add: choices = { KILN_FNS(add) }; break;
      case Sub: choices = { KILN_FNS(sub) }; break;
      case Mul: choices = { KILN_FNS(mul) }; break;
      case Div: choices = { KILN_FNS(div) }; break;
      case Max: choices = { KILN_FNS(maximum) }; break;
      case Min: choices = { KILN_FNS(minimum) }; break;
      case Pow: choices = { KILN_FNS(pow) }; break;
      case Atan2: choices = { KILN_FNS(atan2) }; break;
      case Rem: choices = { KILN_FNS(remainder) }; break;
      case Fmod: choices = { KILN_FNS(fmod) }; break;
      case Cmp: choices = { KILN_FNS(eq), KILN_FNS(ne), KILN_FNS(lt), KILN_FNS(le), KILN_FNS(gt), KILN_FNS(ge) }; break;
      case Logical: choices = { KILN_FNS(logical_and), KILN_FNS(logical_or), KILN_FNS(logical_xor) }; break;
      case Bitwise: choices = { KILN_FNS(bitwise_and), KILN_FNS(bitwise_or), KILN_FNS(bitwise_xor) }; break;
    }
#undef KILN_FNS
    Fns fn = S.pick(choices);
    std::ostringstream cs;
    cs << c;
    if (b >= 0) {
      BinT f = fn.tt;
      return add(
          std::string(fn.name) + "(" + V(a) + ", " + V(b) + ")",
          [f, a, b](const std::vector<Tensor>& v) { return f(v[a], v[b]); }, o);
    }
    const bool is_f = fl(A) || c != std::floor(c);
    kiln::Scalar sc = is_f ? kiln::Scalar(c) : kiln::Scalar(static_cast<int64_t>(c));
    if (A.dt == kBool && kind == Bitwise) sc = kiln::Scalar(c != 0);
    if (scalar_left) {
      BinST f = fn.st;
      return add(
          std::string(fn.name) + "(" + cs.str() + ", " + V(a) + ")",
          [f, a, sc](const std::vector<Tensor>& v) { return f(sc, v[a]); }, o);
    }
    BinTS f = fn.ts;
    return add(
        std::string(fn.name) + "(" + V(a) + ", " + cs.str() + ")",
        [f, a, sc](const std::vector<Tensor>& v) { return f(v[a], sc); }, o);
  }

  bool where_op() {
    int c = pick([](const Info& f) { return f.dt == kBool; });
    if (c < 0) {
      // make a condition from an exact value
      int a = pick([](const Info& f) { return f.exact && f.dt != kBool; });
      if (a < 0) return false;
      Info o = passthrough({a});
      o.mag = 1;
      o.finite = true;
      return add(
          "gt(" + V(a) + ", 0)", [a](const std::vector<Tensor>& v) { return kiln::gt(v[a], 0); }, o);
    }
    const Dims cs = I(c).shape;
    int a = pick([&](const Info& f) { return broadcastable(cs, f.shape); });
    if (a < 0) return false;
    const Dims as = I(a).shape;
    if (S.coin(0.3)) {
      double s = S.pick(std::vector<double>{0.0, 1.0, -2.0});
      Info o = passthrough({c, a});
      o.mag = std::max(o.mag, std::abs(s));
      kiln::Scalar sc = fl(I(a)) ? kiln::Scalar(s) : kiln::Scalar(static_cast<int64_t>(s));
      return add(
          "where(" + V(c) + ", " + V(a) + ", " + std::to_string(s) + ")",
          [c, a, sc](const std::vector<Tensor>& v) { return kiln::where(v[c], v[a], sc); }, o);
    }
    int b = pick([&](const Info& f) { return broadcastable(cs, f.shape) && broadcastable(as, f.shape); });
    if (b < 0) return false;
    Info o = passthrough({c, a, b});
    return add(
        "where(" + V(c) + ", " + V(a) + ", " + V(b) + ")",
        [c, a, b](const std::vector<Tensor>& v) { return kiln::where(v[c], v[a], v[b]); }, o);
  }

  bool cast_op() {
    int a = pick([](const Info&) { return true; });
    const Info& x = I(a);
    DType to = S.pick(std::vector<DType>{kF32, kF64, kI32, kI64, kBool});
    if (to == x.dt) return false;
    Info o = passthrough({a});
    if (fl(x) && !kiln::is_floating(to)) {
      if (!x.exact) return false;
      if (to != kBool && (!x.finite || x.mag >= 0x1p30)) return false;
    }
    if (to == kBool) o.mag = 1;
    if (to == kI32) o.mag = std::min(o.mag, 0x1p31);  // int64 -> int32 wraps
    if (!x.exact && to == kF32 && x.dt == kF64) o.rel_err += 0x1p-23;
    if (S.coin(0.1)) {  // clamp instead of a cast sometimes (min/max with scalars)
      if (x.dt == kBool) return false;
      double lo = -1, hi = 1.5;
      if (!fl(x)) hi = 2;
      Info c = passthrough({a});
      c.mag = std::min(c.mag, 2.0);
      kiln::Scalar slo = fl(x) ? kiln::Scalar(lo) : kiln::Scalar(int64_t{-1});
      kiln::Scalar shi = fl(x) ? kiln::Scalar(hi) : kiln::Scalar(int64_t{2});
      return add(
          "clamp(" + V(a) + ", -1, " + std::to_string(hi) + ")",
          [a, slo, shi](const std::vector<Tensor>& v) { return kiln::clamp(v[a], slo, shi); }, c);
    }
    return add(
        std::string("to(") + V(a) + ", " + kiln::dtype_name(to) + ")",
        [a, to](const std::vector<Tensor>& v) { return v[a].to(to); }, o);
  }

  // ---- views ----
  bool view_op() {
    int a = pick([](const Info&) { return true; });
    const Info& x = I(a);
    const Dims sh = x.shape;
    const int64_t r = static_cast<int64_t>(sh.size());
    Info o = passthrough({a});
    int k = static_cast<int>(S.range(0, 12));
    switch (k) {
      case 0: {  // permute
        if (r < 2) return false;
        Dims perm(r);
        for (int64_t i = 0; i < r; ++i) perm[i] = i;
        for (int64_t i = r - 1; i > 0; --i) std::swap(perm[i], perm[S.range(0, i)]);
        return add(
            "permute(" + V(a) + ", " + dims_str(perm) + ")",
            [a, perm](const std::vector<Tensor>& v) { return v[a].permute(perm); }, o);
      }
      case 1: {  // transpose
        if (r < 2) return false;
        int64_t d0 = S.range(0, r - 1), d1 = S.range(0, r - 1);
        return add(
            "transpose(" + V(a) + ", " + std::to_string(d0) + ", " + std::to_string(d1) + ")",
            [a, d0, d1](const std::vector<Tensor>& v) { return v[a].transpose(d0, d1); }, o);
      }
      case 2:
      case 3: {  // slice with a step
        if (r < 1) return false;
        int64_t d = S.range(0, r - 1);
        int64_t start = S.range(0, 2), step = S.range(1, 3);
        std::optional<int64_t> stop;
        if (S.coin(0.4)) stop = -1;
        return add(
            "slice(" + V(a) + ", dim " + std::to_string(d) + ", " + std::to_string(start) + ":" +
                (stop ? std::to_string(*stop) : "") + ":" + std::to_string(step) + ")",
            [a, d, start, stop, step](const std::vector<Tensor>& v) {
              int64_t n = v[a].size(d);
              return v[a].slice(d, std::min(start, n), stop, step);
            },
            o);
      }
      case 4: {  // select
        if (r < 1) return false;
        int64_t d = S.range(0, r - 1);
        int which = static_cast<int>(S.range(0, 2));
        return add(
            "select(" + V(a) + ", dim " + std::to_string(d) + ", " +
                (which == 0   ? "0"
                 : which == 1 ? "-1"
                              : "n/2") +
                ")",
            [a, d, which](const std::vector<Tensor>& v) {
              int64_t n = v[a].size(d);
              return v[a].select(d, which == 0 ? 0 : which == 1 ? -1 : n / 2);
            },
            o);
      }
      case 5: {  // expand size-1 dims (or add a leading dim)
        if (var.ref.empty()) return false;
        Dims target = sh;
        bool any = false;
        for (int64_t d = 0; d < r; ++d)
          if (sh[d] == 1 && S.coin(0.7)) {
            target[d] = var.ref[S.next() % var.ref.size()];
            any = true;
          }
        if (!any || S.coin(0.3)) target.insert(target.begin(), var.ref[S.next() % var.ref.size()]);
        return add(
            "expand(" + V(a) + ", " + dims_str(target) + ")",
            [a, target](const std::vector<Tensor>& v) { return v[a].expand(target); }, o);
      }
      case 6: {
        int64_t d = S.range(0, r);
        return add(
            "unsqueeze(" + V(a) + ", " + std::to_string(d) + ")",
            [a, d](const std::vector<Tensor>& v) { return v[a].unsqueeze(d); }, o);
      }
      case 7: {
        if (S.coin(0.5))
          return add(
              "squeeze(" + V(a) + ")", [a](const std::vector<Tensor>& v) { return v[a].squeeze(); }, o);
        if (r < 1) return false;
        int64_t d = S.range(0, r - 1);
        return add(
            "squeeze(" + V(a) + ", " + std::to_string(d) + ")",
            [a, d](const std::vector<Tensor>& v) { return v[a].squeeze(d); }, o);
      }
      case 8: {  // reshapes
        int how = static_cast<int>(S.range(0, 3));
        if (how == 0)
          return add(
              "flatten(" + V(a) + ")", [a](const std::vector<Tensor>& v) { return v[a].flatten(); }, o);
        if (how == 1) {
          if (r < 2) return false;
          int64_t d = S.range(0, r - 2);
          return add(
              "flatten(" + V(a) + ", " + std::to_string(d) + ", " + std::to_string(d + 1) + ")",
              [a, d](const std::vector<Tensor>& v) { return v[a].flatten(d, d + 1); }, o);
        }
        if (r < 1) return false;
        int64_t d = S.range(0, r - 1);
        // split dim d by its smallest factor (or add a 1)
        return add(
            "unflatten(" + V(a) + ", dim " + std::to_string(d) + ")",
            [a, d](const std::vector<Tensor>& v) {
              Dims s = v[a].sizes();
              int64_t n = s[d], f = 1;
              for (int64_t q = 2; q * q <= n; ++q)
                if (n % q == 0) {
                  f = q;
                  break;
                }
              if (f == 1) f = n > 1 ? n : 1;
              Dims t(s.begin(), s.begin() + d);
              t.push_back(f);
              t.push_back(f == 0 ? 0 : n / f);
              t.insert(t.end(), s.begin() + d + 1, s.end());
              return v[a].reshape(t);
            },
            o);
      }
      case 9: {
        if (r < 1) return false;
        Dims ds;
        for (int64_t d = 0; d < r; ++d)
          if (S.coin(0.5)) ds.push_back(d);
        if (ds.empty()) ds.push_back(r - 1);
        return add(
            "flip(" + V(a) + ", " + dims_str(ds) + ")", [a, ds](const std::vector<Tensor>& v) { return v[a].flip(ds); },
            o);
      }
      case 10:
        return add(
            "contiguous(" + V(a) + ")", [a](const std::vector<Tensor>& v) { return v[a].contiguous(); }, o);
      case 11: {  // t[..., 1:, None]
        if (r < 1) return false;
        return add(
            V(a) + "[..., 1:, None]",
            [a](const std::vector<Tensor>& v) {
              return v[a].index({kiln::Ellipsis, kiln::Slice(1, kiln::None), kiln::None});
            },
            o);
      }
      default: {  // chain: transpose then slice
        if (r < 2) return false;
        return add(
            "transpose(" + V(a) + ", 0, -1)[::2]",
            [a](const std::vector<Tensor>& v) { return v[a].transpose(0, -1).slice(0, 0, std::nullopt, 2); }, o);
      }
    }
  }

  // ---- reductions ----
  bool reduction() {
    int a = pick([](const Info&) { return true; });
    const Info& x = I(a);
    const int64_t r = static_cast<int64_t>(x.shape.size());
    Dims dims;  // empty = all
    const bool full = r == 0 || S.coin(prod(x.shape) > 32768 ? 0.6 : 0.3);
    if (!full) {
      for (int64_t d = 0; d < r; ++d)
        if (S.coin(0.4)) dims.push_back(d);
      if (dims.empty()) dims.push_back(S.range(0, r - 1));
      if (S.coin(0.2))
        for (auto& d : dims) d -= r;  // negative dims
    }
    const bool keep = S.coin(0.4);
    int64_t n = 1;
    if (full)
      n = prod(x.shape);
    else
      for (int64_t d : dims) n *= x.shape[(d + r) % r];
    Info o = passthrough({a});
    const double d = x.delta();
    const double e = eps_of(x.dt);
    int k = static_cast<int>(S.range(0, 9));
    std::string dstr = full ? "all" : dims_str(dims);
    std::string args = V(a) + ", " + dstr + (keep ? ", keepdim" : "");
    auto floating_sum = [&](bool mean) {
      if (!std::isfinite(d) || !std::isfinite(x.mag)) return false;
      o.exact = false;
      o.reduced = true;
      double nn = std::max<int64_t>(n, 1);
      o.mag = mean ? x.mag : nn * x.mag;
      o.abs_err = mean ? d + 2 * x.mag * 0x1p-52 * nn : nn * d + nn * nn * x.mag * 0x1p-52;
      o.rel_err = 2 * e;
      return true;
    };
    switch (k) {
      case 0:
      case 1:
      case 2: {  // sum
        if (fl(x)) {
          if (!floating_sum(false)) return false;
        } else {
          o.mag = std::max<int64_t>(n, 1) * x.mag;
        }
        return add(
            "sum(" + args + ")", [a, dims, keep](const std::vector<Tensor>& v) { return kiln::sum(v[a], dims, keep); },
            o);
      }
      case 3: {  // mean
        if (!fl(x) || !floating_sum(true)) return false;
        if (n == 0) o.finite = false;
        return add(
            "mean(" + args + ")",
            [a, dims, keep](const std::vector<Tensor>& v) { return kiln::mean(v[a], dims, keep); }, o);
      }
      case 4:
      case 5: {  // amax / amin
        if (n == 0 || prod(x.shape) == 0) return false;
        bool mx = k == 4;
        // Equal values but not equal bits: which of -0 and +0 a reduction keeps depends on the
        // order it compares them in (the interpreter's loop, a kernel's vector lanes), so the
        // result is exact in value only; ops that turn a zero's sign into a value (1/x) refuse it.
        o.exact = false;
        return add(
            std::string(mx ? "amax(" : "amin(") + args + ")",
            [a, dims, keep, mx](const std::vector<Tensor>& v) {
              return mx ? kiln::amax(v[a], dims, keep) : kiln::amin(v[a], dims, keep);
            },
            o);
      }
      case 6:
      case 7: {  // argmax / argmin: one dim or all
        if (!x.exact || n == 0 || prod(x.shape) == 0) return false;
        bool mx = k == 6;
        std::optional<int64_t> dim;
        if (!full) dim = dims[0];
        o.mag = static_cast<double>(prod(x.shape));
        return add(
            std::string(mx ? "argmax(" : "argmin(") + V(a) + ", " + (dim ? std::to_string(*dim) : "all") +
                (keep ? ", keepdim" : "") + ")",
            [a, dim, keep, mx](const std::vector<Tensor>& v) {
              return mx ? kiln::argmax(v[a], dim, keep) : kiln::argmin(v[a], dim, keep);
            },
            o);
      }
      case 8: {  // prod (exact inputs, few elements)
        if (!x.exact || n > 12 || x.mag > 4) return false;
        o.mag = std::pow(std::max(x.mag, 1.0), static_cast<double>(n));
        if (fl(x)) {
          o.exact = false;
          o.reduced = true;
          o.abs_err = 0;
          o.rel_err = 2 * e + static_cast<double>(n) * 0x1p-52;
        }
        return add(
            "prod(" + args + ")",
            [a, dims, keep](const std::vector<Tensor>& v) { return kiln::prod(v[a], dims, keep); }, o);
      }
      default: {  // any / all (exact inputs)
        if (!x.exact) return false;
        bool any = S.coin();
        o.mag = 1;
        return add(
            std::string(any ? "any(" : "all(") + args + ")",
            [a, dims, keep, any](const std::vector<Tensor>& v) {
              return any ? kiln::any(v[a], dims, keep) : kiln::all(v[a], dims, keep);
            },
            o);
      }
    }
  }

  // ---- reductions consumed by pointwise ops ----
  bool nn_pattern() {
    int a = pick([](const Info& f) { return f.dt != kBool; });
    if (a < 0) return false;
    const Info& x = I(a);
    const int64_t r = static_cast<int64_t>(x.shape.size());
    if (r < 1) return false;
    double d = x.delta();
    if (!std::isfinite(d) || !std::isfinite(x.mag) || x.mag > 1e3 || !x.finite) return false;
    const double e = eps_of(x.dt);
    Info o = passthrough({a});
    o.exact = false;
    o.reduced = true;
    o.finite = true;
    int64_t dim = S.range(-r, r - 1);
    int64_t n = x.shape[(dim + r) % r];
    // Both executors accumulate in double, in different orders (sequential vs vectorized /
    // split): a relative difference up to n * 2^-52 (systematic for constant rows).
    double acc = static_cast<double>(std::max<int64_t>(n, 1)) * 0x1p-52;
    int k = static_cast<int>(S.range(0, 5));
    switch (k) {
      case 0:  // softmax
        o.mag = 1;
        o.abs_err = 0;
        o.rel_err = 2 * d + 8 * e + 2 * acc;
        return add(
            "softmax(" + V(a) + ", " + std::to_string(dim) + ")",
            [a, dim](const std::vector<Tensor>& v) { return kiln::softmax(v[a], dim); }, o);
      case 1:  // log_softmax
        o.mag = 2 * x.mag + std::log(n + 1.0);
        o.abs_err = 2 * d + 8 * e * o.mag + 2 * acc;
        o.rel_err = 2 * e;
        return add(
            "log_softmax(" + V(a) + ", " + std::to_string(dim) + ")",
            [a, dim](const std::vector<Tensor>& v) { return kiln::log_softmax(v[a], dim); }, o);
      case 2:
      case 3: {  // layer_norm over the last 1 or 2 dims
        if (!fl(x)) return false;
        int64_t kk = std::min<int64_t>(r, S.range(1, 2));
        Dims ns(x.shape.end() - kk, x.shape.end());
        double eps = S.coin() ? 1e-5 : 1e-3;
        acc = static_cast<double>(std::max<int64_t>(prod(ns), 1)) * 0x1p-52;
        double dc = 2 * d + 4 * (e + acc) * x.mag;
        o.mag = std::sqrt(static_cast<double>(std::max<int64_t>(prod(ns), 1)));
        o.abs_err = dc / std::sqrt(eps);
        o.rel_err = dc / (2 * std::sqrt(eps)) + 8 * e;
        return add(
            "layer_norm(" + V(a) + ", " + dims_str(ns) + ", eps=" + (eps == 1e-5 ? "1e-5" : "1e-3") + ")",
            [a, ns, eps](const std::vector<Tensor>& v) {
              return kiln::layer_norm(v[a], ns, std::nullopt, std::nullopt, eps);
            },
            o);
      }
      case 4: {  // logsumexp
        if (!fl(x)) return false;
        bool keep = S.coin();
        o.mag = x.mag + std::log(n + 1.0);
        o.abs_err = d + 8 * e * o.mag + 2 * acc;
        o.rel_err = 2 * e;
        o.finite = n > 0;
        return add(
            "logsumexp(" + V(a) + ", [" + std::to_string(dim) + "]" + (keep ? ", keepdim" : "") + ")",
            [a, dim, keep](const std::vector<Tensor>& v) { return kiln::logsumexp(v[a], {dim}, keep); }, o);
      }
      default: {  // var (correction 0 or 1)
        if (!fl(x)) return false;
        double corr = S.coin() ? 1 : 0;
        if (static_cast<double>(n) - corr < 1) return false;
        bool keep = S.coin();
        o.mag = x.mag * x.mag * 4 * static_cast<double>(n) / (static_cast<double>(n) - corr);
        o.abs_err = 8 * x.mag * (d + 2 * (e + acc) * x.mag);
        o.rel_err = 4 * e;
        return add(
            "var(" + V(a) + ", [" + std::to_string(dim) + "], correction=" + std::to_string(static_cast<int>(corr)) +
                (keep ? ", keepdim" : "") + ")",
            [a, dim, corr, keep](const std::vector<Tensor>& v) { return kiln::var(v[a], {dim}, corr, keep); }, o);
      }
    }
  }

  // ---- library / reference ops between fused kernels ----
  bool library_op() {
    int k = static_cast<int>(S.range(0, 3));
    if (k == 0) {  // x @ x^T on a 2-d float value
      int a = pick([](const Info& f) { return kiln::is_floating(f.dt) && f.shape.size() == 2; });
      if (a < 0) return false;
      const Info& x = I(a);
      if (!std::isfinite(x.mag) || !std::isfinite(x.delta())) return false;
      Info o = passthrough({a});
      double K = static_cast<double>(std::max<int64_t>(x.shape[1], 1));
      o.mag = K * x.mag * x.mag;
      // Inexact: the JIT runs tall GEMMs as row blocks of single-threaded BLAS, whose kernels
      // (small-matrix paths, K blocking) may sum each dot product in another order than the
      // interpreter's one call: |diff| <= 2 K eps sum|a b| <= 2 K eps |result bound|.
      o.exact = false;
      o.abs_err = 2 * K * eps_of(x.dt) * o.mag + (x.exact ? 0 : 2 * K * x.mag * x.delta());
      o.rel_err = eps_of(x.dt);
      return add(
          "matmul(" + V(a) + ", " + V(a) + ".T)",
          [a](const std::vector<Tensor>& v) { return kiln::matmul(v[a], v[a].transpose(0, 1)); }, o);
    }
    if (k == 1) {  // cat of a value with a transformed copy of itself
      int a = pick([](const Info& f) { return !f.shape.empty() && f.dt != kBool; });
      if (a < 0) return false;
      const Info& x = I(a);
      int64_t d = S.range(0, static_cast<int64_t>(x.shape.size()) - 1);
      Info o = passthrough({a});
      o.mag = x.mag + 1;
      if (!x.exact) o.abs_err += x.rel_err * x.mag;
      return add(
          "cat([" + V(a) + ", " + V(a) + " + 1], " + std::to_string(d) + ")",
          [a, d](const std::vector<Tensor>& v) {
            return kiln::cat({v[a], kiln::add(v[a], 1)}, d);
          },
          o);
    }
    if (k == 2) {  // cumsum
      int a = pick([](const Info& f) { return !f.shape.empty(); });
      if (a < 0) return false;
      const Info& x = I(a);
      int64_t d = S.range(0, static_cast<int64_t>(x.shape.size()) - 1);
      double n = static_cast<double>(std::max<int64_t>(x.shape[d], 1));
      Info o = passthrough({a});
      o.mag = n * x.mag;
      if (!x.exact) {
        if (!std::isfinite(x.delta())) return false;
        o.abs_err = n * x.delta();
        o.rel_err = eps_of(x.dt);
      }
      return add(
          "cumsum(" + V(a) + ", " + std::to_string(d) + ")",
          [a, d](const std::vector<Tensor>& v) { return kiln::cumsum(v[a], d); }, o);
    }
    // integer remainder by a non-zero scalar (checked reference op)
    int a = pick([](const Info& f) { return kiln::is_integral(f.dt); });
    if (a < 0) return false;
    int64_t m = S.coin() ? 3 : -2;
    Info o = passthrough({a});
    o.mag = 3;
    return add(
        "remainder(" + V(a) + ", " + std::to_string(m) + ")",
        [a, m](const std::vector<Tensor>& v) { return kiln::remainder(v[a], kiln::Scalar(m)); }, o);
  }

  // ---- in-place writes through a view of a fresh copy ----
  bool inplace_view_write() {
    int a = pick([](const Info& f) { return !f.shape.empty() && f.dt != kBool; });
    if (a < 0) return false;
    const Info& x = I(a);
    int64_t d = S.range(0, static_cast<int64_t>(x.shape.size()) - 1);
    bool sel = S.coin() && x.shape[d] > 0;
    Info o = passthrough({a});
    o.mag = 2 * x.mag + 1;
    if (!x.exact) o.abs_err += x.rel_err * x.mag;
    return add(
        "y = clone(" + V(a) + "); y." + (sel ? "select(" : "slice(") + std::to_string(d) + (sel ? ", 0)" : ", ::2)") +
            ".mul_(2).add_(1); y",
        [a, d, sel](const std::vector<Tensor>& v) {
          Tensor y = v[a].clone();
          Tensor w = sel ? y.select(d, 0) : y.slice(d, 0, std::nullopt, 2);
          w.mul_(2);
          w.add_(1);
          return y;
        },
        o);
  }
};

// Builds graph number `g`: family g / 4 (its structural seed), variant g % 4 (sizes).
Program make_program(uint64_t seed, int family, int variant, bool pointwise_only = false) {
  Rng fam(seed * 1000003 + static_cast<uint64_t>(family));
  int R = static_cast<int>(fam.pick(std::vector<int>{0, 1, 1, 2, 2, 2, 3, 3, 4}));
  Rng Z(splitmix(seed) ^ (static_cast<uint64_t>(family) * 977 + static_cast<uint64_t>(variant) * 131071));
  Variant var;
  const bool large = variant == 3 && R >= 1;
  const bool zero = variant == 2 && Z.coin(0.25) && R >= 1;
  for (int d = 0; d < R; ++d) {
    int c = static_cast<int>(Z.range(0, 99));
    int64_t s = c < 10 ? 1 : c < 70 ? Z.range(2, 9) : Z.range(10, 40);
    var.ref.push_back(s);
  }
  if (large) {
    int64_t target = Z.range(33000, 150000);
    int big = static_cast<int>(Z.range(0, R - 1));
    for (int d = 0; d < R; ++d)
      if (d != big) var.ref[d] = std::min<int64_t>(var.ref[d], 12);
    int64_t rest = 1;
    for (int d = 0; d < R; ++d)
      if (d != big) rest *= std::max<int64_t>(var.ref[d], 1);
    var.ref[big] = std::max<int64_t>(2, (target + rest - 1) / rest);
  } else {
    while (prod(var.ref) > 20000) {
      auto it = std::max_element(var.ref.begin(), var.ref.end());
      *it = std::max<int64_t>(1, *it / 2);
    }
  }
  if (zero) var.ref[Z.range(0, R - 1)] = 0;
  Gen gen(seed * 7919 + static_cast<uint64_t>(family), var, pointwise_only);
  Program p = gen.build();
  p.header = "seed " + std::to_string(seed) + ", family " + std::to_string(family) + ", variant " +
             std::to_string(variant) + ", reference shape " + dims_str(var.ref);
  return p;
}

// ============================================================== results

struct Result {
  DType dt;
  Dims shape;
  std::vector<double> f;  // floating values
  std::vector<int64_t> i;  // ints and bools
};

// Reads a materialized tensor through its own strides (runs nothing).
Result read(const Tensor& t) {
  t.eval();
  Result r;
  r.dt = t.dtype();
  r.shape = t.sizes();
  const auto& n = t.node();
  Dims st = t.strides();
  const int64_t count = prod(r.shape);
  const int64_t rank = static_cast<int64_t>(r.shape.size());
  kiln::dispatch_dtype(r.dt, [&](auto tag) {
    using T = decltype(tag);
    if (count == 0) return;
    const T* base = n->template data<T>();
    Dims idx(rank, 0);
    for (int64_t k = 0; k < count; ++k) {
      int64_t off = 0;
      for (int64_t d = 0; d < rank; ++d) off += idx[d] * st[d];
      if constexpr (std::is_floating_point_v<T>)
        r.f.push_back(static_cast<double>(base[off]));
      else if constexpr (std::is_integral_v<T>)
        r.i.push_back(static_cast<int64_t>(base[off]));
      for (int64_t d = rank - 1; d >= 0; --d) {
        if (++idx[d] < r.shape[d]) break;
        idx[d] = 0;
      }
    }
  });
  return r;
}

std::vector<Result> evaluate(const Program& p) {
  std::vector<Tensor> v = replay(p);
  std::vector<Tensor> outs;
  for (int o : p.outputs) outs.push_back(v[o]);
  if (p.eval_together) kiln::eval(outs);
  std::vector<Result> rs;
  for (const Tensor& t : outs) rs.push_back(read(t));
  return rs;
}

// What the comparisons saw (printed by the differential test: how tight the tolerances are).
struct CompareStats {
  int64_t elements = 0, float_elements = 0, exact_float_elements = 0, inexact_differing = 0;
  double worst_vs_stated = 0;  // max |jit - interp| / (rtol |interp| + atol) over inexact elements
  double worst_vs_used = 0;  // max |jit - interp| / tolerance used
  std::string worst;  // the element behind worst_vs_stated
};
std::mutex g_stats_mu;
CompareStats g_cmp;
thread_local std::string g_current;  // the graph being compared (for the worst-element note)

// Compares one output; returns "" or a description of the mismatch.
std::string compare(const Result& ref, const Result& got, const Info& info) {
  CompareStats st;
  struct Merge {
    CompareStats& s;
    ~Merge() {
      std::lock_guard<std::mutex> lock(g_stats_mu);
      g_cmp.elements += s.elements;
      g_cmp.float_elements += s.float_elements;
      g_cmp.exact_float_elements += s.exact_float_elements;
      g_cmp.inexact_differing += s.inexact_differing;
      if (s.worst_vs_stated > g_cmp.worst_vs_stated) g_cmp.worst = s.worst;
      g_cmp.worst_vs_stated = std::max(g_cmp.worst_vs_stated, s.worst_vs_stated);
      g_cmp.worst_vs_used = std::max(g_cmp.worst_vs_used, s.worst_vs_used);
    }
  } merge{st};
  std::ostringstream os;
  if (ref.dt != got.dt) return std::string("dtype ") + kiln::dtype_name(got.dt) + " != " + kiln::dtype_name(ref.dt);
  if (ref.shape != got.shape) return "shape " + dims_str(got.shape) + " != " + dims_str(ref.shape);
  if (!kiln::is_floating(ref.dt)) {
    st.elements += static_cast<int64_t>(ref.i.size());
    for (size_t k = 0; k < ref.i.size(); ++k)
      if (ref.i[k] != got.i[k]) {
        os << "element " << k << ": jit " << got.i[k] << ", interpreter " << ref.i[k];
        size_t bad = 0;
        for (size_t q = 0; q < ref.i.size(); ++q) bad += ref.i[q] != got.i[q];
        os << " (" << bad << " of " << ref.i.size() << " differ)";
        return os.str();
      }
    return "";
  }
  // float64 values computed from inexact float32 ones (casts) carry float32-sized errors.
  const bool f64 = ref.dt == kF64 && info.rel_err < 1e-9;
  double rtol = f64 ? 1e-12 : info.reduced ? 1e-4 : 1e-5;
  double atol = f64 ? 1e-12 : info.reduced ? 1e-5 : 1e-6;
  size_t bad = 0, first = 0;
  double first_tol = 0;
  st.elements += static_cast<int64_t>(ref.f.size());
  st.float_elements += static_cast<int64_t>(ref.f.size());
  if (info.exact) st.exact_float_elements += static_cast<int64_t>(ref.f.size());
  for (size_t k = 0; k < ref.f.size(); ++k) {
    double a = got.f[k], b = ref.f[k];
    bool ok;
    double tol = 0;
    if (std::isnan(a) || std::isnan(b))
      ok = std::isnan(a) && std::isnan(b);
    else if (a == b)
      ok = true;
    else if (info.exact)
      ok = false;
    else {
      const double stated = rtol * std::abs(b) + atol;
      tol = std::max(stated, 4 * (info.abs_err + info.rel_err * std::abs(b)));
      ok = std::abs(a - b) <= tol;
      if (std::isfinite(a) && std::isfinite(b)) {
        st.inexact_differing++;
        if (std::abs(a - b) / stated > st.worst_vs_stated) {
          std::ostringstream w;
          w.precision(10);
          w << kiln::dtype_name(ref.dt) << (info.reduced ? " reduced" : "") << " jit " << a << " interp " << b
            << " bound " << info.abs_err << "+" << info.rel_err << "*|x| (" << g_current << ")";
          st.worst = w.str();
        }
        st.worst_vs_stated = std::max(st.worst_vs_stated, std::abs(a - b) / stated);
        st.worst_vs_used = std::max(st.worst_vs_used, std::abs(a - b) / tol);
      }
    }
    if (!ok && bad++ == 0) {
      first = k;
      first_tol = tol;
    }
  }
  if (!bad) return "";
  os.precision(17);
  os << "element " << first << ": jit " << got.f[first] << ", interpreter " << ref.f[first]
     << (info.exact ? std::string(" (must match exactly)")
                    : " (tolerance " +
                          [&] {
                            std::ostringstream t;
                            t << first_tol;
                            return t.str();
                          }() +
                          ")")
     << "; " << bad << " of " << ref.f.size() << " differ";
  return os.str();
}

// The pending nodes behind `outs` as a Segment (what materialize() hands an executor).
kiln::Segment make_segment(const std::vector<Tensor>& outs) {
  kiln::Segment seg;
  std::unordered_set<kiln::Node*> seen;
  std::vector<std::pair<kiln::Node*, size_t>> stack;
  std::set<kiln::Node*> needed;
  for (const Tensor& t : outs) {
    kiln::Node* n = t.node().get();
    needed.insert(n);
    if (n->materialized() || !seen.insert(n).second) continue;
    seg.keep_alive.push_back(t.node());
    stack.push_back({n, 0});
    while (!stack.empty()) {
      auto& [m, i] = stack.back();
      if (i < m->inputs.size()) {
        kiln::Node* in = m->inputs[i++].get();
        if (!in->materialized() && seen.insert(in).second) {
          seg.keep_alive.push_back(m->inputs[i - 1]);
          stack.push_back({in, 0});
        }
      } else {
        seg.nodes.push_back(m);
        stack.pop_back();
      }
    }
  }
  for (kiln::Node* n : seg.nodes) seg.needed.push_back(needed.count(n) > 0);
  return seg;
}

// The JIT's schedule for a program (for failure reports).
std::string schedule_of(const Program& p) {
  try {
    std::vector<Tensor> v = replay(p);
    std::vector<Tensor> outs;
    for (int o : p.outputs) outs.push_back(v[o]);
    kiln::Segment seg = make_segment(outs);
    std::vector<kiln::jit::Step> steps = kiln::jit::schedule(seg);
    std::string r = kiln::jit::describe(steps);
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i].kind == kiln::jit::Step::Kind::Kernel) try {
          kiln::jit::lower(steps[i].group, kiln::jit::target_for(kiln::DeviceType::CPU));
        } catch (const kiln::jit::LowerError& e) {
          r += "  (step " + std::to_string(i) + " does not lower: " + e.what() +
               "; the executor stores its reductions and reschedules)\n";
        }
    return r;
  } catch (const std::exception& e) {
    return std::string("(schedule failed: ") + e.what() + ")";
  }
}

// Runs a program on both executors; returns "" or a failure report.
std::string check_program(const Program& p) {
  std::vector<Result> ref, got;
  std::string err;
  g_current = p.header;
  kiln::set_executor(kiln::interpreter());
  try {
    ref = evaluate(p);
  } catch (const std::exception& e) {
    err = std::string("interpreter threw: ") + e.what();
  }
  kiln::set_executor(kiln::jit::jit_executor());
  if (err.empty()) {
    // A kernel the JIT cannot compile runs on the interpreter and says so on stderr (once per
    // kernel structure): correct, but a gap in the JIT.
    testing::internal::CaptureStderr();
    try {
      got = evaluate(p);
    } catch (const std::exception& e) {
      err = std::string("jit threw: ") + e.what();
    }
    std::string captured = testing::internal::GetCapturedStderr();
    if (err.empty() && captured.find("[kiln:jit]") != std::string::npos)
      err = "the JIT fell back to the interpreter: " + captured;
  }
  for (size_t o = 0; err.empty() && o < ref.size(); ++o) {
    std::string m = compare(ref[o], got[o], p.info[p.outputs[o]]);
    if (!m.empty()) err = "output v" + std::to_string(p.outputs[o]) + ": " + m;
  }
  if (err.empty()) return "";
  return err + "\ngraph (" + p.header + "):\n" + p.str() + "jit schedule:\n" + schedule_of(p);
}

}  // namespace
