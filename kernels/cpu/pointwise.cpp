// Reference pointwise kernels: fills, ranges, random numbers, unary, binary and where.
#include <cmath>
#include <type_traits>

#include "kernels/cpu/reference.h"
#include "kernels/cpu/vmath.h"
#include "runtime/core/error.h"
#include "runtime/core/philox.h"

namespace kiln::kernels {
namespace {

// Transcendentals: kiln's shared functions (kernels/cpu/vmath.h), the same bits as the JIT's tiers.
inline float vm(vmath::Fn f, float x) { return vmath::f32(f, x); }
inline double vm(vmath::Fn f, double x) { return vmath::f64(f, x); }
inline float vm(vmath::Fn f, float x, float y) { return vmath::f32(f, x, y); }
inline double vm(vmath::Fn f, double x, double y) { return vmath::f64(f, x, y); }

template <class T, class F>
void generate(const Operand& out, F&& f) {  // out[i] = f(i) over the contiguous output
  T* o = out.ptr<T>();
  int64_t n = out.numel();
  auto run = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) o[i] = f(i);
  };
  if (n < kParallelThreshold)
    run(0, n);
  else
    parallel_for(tbb::blocked_range<int64_t>(0, n, 16384),
                 [&](const tbb::blocked_range<int64_t>& r) { run(r.begin(), r.end()); });
}

template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bool>)
    return v != 0;
  else
    return static_cast<T>(static_cast<compute_t<T>>(v));
}

}  // namespace

void fill(const Operand& out, double value, const std::vector<int64_t>& ints) {
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    T v = from_double<T>(value);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
      if (!ints.empty()) v = static_cast<T>(ints[0]);
    generate<T>(out, [v](int64_t) { return v; });
  });
}

void arange(const Operand& out, const Attrs& a) {
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (!a.ints.empty() && !is_floating(out.dtype)) {
      int64_t s = a.ints[0], st = a.ints[1];
      generate<T>(out, [=](int64_t i) { return static_cast<T>(s + st * i); });
    } else {
      double s = a.f0, st = a.f1;
      generate<T>(out, [=](int64_t i) { return from_double<T>(s + st * static_cast<double>(i)); });
    }
  });
}

void random(OpKind op, const Operand& out, const Attrs& a) {
  const uint64_t key = a.seed, ctr = a.counter;
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (op == OpKind::RandInt) {
      int64_t low = a.ints[0];
      uint64_t range = static_cast<uint64_t>(a.ints[1] - a.ints[0]);
      generate<T>(out, [=](int64_t i) {
        return static_cast<T>(static_cast<double>(low + static_cast<int64_t>(philox_u64(key, ctr + i) % range)));
      });
    } else if (op == OpKind::RandNormal) {
      double mean = a.f0, sd = a.f1;
      generate<T>(out, [=](int64_t i) { return from_double<T>(mean + sd * philox_normal(key, ctr + i)); });
    } else {
      // Uniform with as many random bits as the dtype's mantissa holds, so rounding never
      // reaches the upper bound.
      int bits = out.dtype == DType::Float64   ? 53
                 : out.dtype == DType::Float32 ? 24
                 : out.dtype == DType::Float16 ? 11
                                               : 8;
      double low = a.f0, span = a.f1 - a.f0, scale = std::ldexp(1.0, -bits);
      generate<T>(out, [=](int64_t i) {
        double u = static_cast<double>(philox_u64(key, ctr + i) >> (64 - bits)) * scale;
        return from_double<T>(low + span * u);
      });
    }
  });
}

namespace {

template <class TO, class TI, class F>
void map1(const Operand& out, const Operand& in, F f) {
  nd_for<2>(out.sizes, {out.strides, in.broadcast_strides(out.sizes)},
            [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
              TO* o = out.ptr<TO>() + off[0];
              const TI* x = in.ptr<TI>() + off[1];
              if (st[0] == 1 && st[1] == 1) {
                for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
              } else {
                for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(x[i * st[1]]);
              }
            });
}

template <class T>
void unary_typed(OpKind op, const Operand& out, const Operand& in) {
  using C = compute_t<T>;
  auto m = [&](auto f) { map1<T, T>(out, in, [f](T x) { return static_cast<T>(f(static_cast<C>(x))); }); };
  auto mb = [&](auto f) { map1<bool, T>(out, in, [f](T x) { return static_cast<bool>(f(static_cast<C>(x))); }); };
  constexpr bool fl = std::is_floating_point_v<C>;
  switch (op) {
    case OpKind::Neg: m([](C x) { return static_cast<C>(-x); }); return;
    case OpKind::Abs:
      if constexpr (fl)
        m([](C x) { return std::abs(x); });
      else
        m([](C x) { return static_cast<C>(x < 0 ? -x : x); });
      return;
    case OpKind::Sign:
      if constexpr (std::is_same_v<C, bool>)
        m([](C x) { return x; });
      else if constexpr (fl)
        m([](C x) { return static_cast<C>((C(0) < x) - (x < C(0))); });  // NaN -> 0, as PyTorch
      else
        m([](C x) { return static_cast<C>((C(0) < x) - (x < C(0))); });
      return;
    case OpKind::Relu:
      if constexpr (fl)
        m([](C x) { return (std::isnan(x) || x > 0) ? x : C(0); });
      else
        m([](C x) { return x > 0 ? x : C(0); });
      return;
    case OpKind::Floor:
    case OpKind::Ceil:
    case OpKind::Round:
      if constexpr (fl) {
        if (op == OpKind::Floor)
          m([](C x) { return std::floor(x); });
        else if (op == OpKind::Ceil)
          m([](C x) { return std::ceil(x); });
        else
          m([](C x) { return std::nearbyint(x); });
      } else {
        m([](C x) { return x; });
      }
      return;
    case OpKind::IsNan:
      if constexpr (fl)
        mb([](C x) { return std::isnan(x); });
      else
        mb([](C) { return false; });
      return;
    case OpKind::IsFinite:
      if constexpr (fl)
        mb([](C x) { return std::isfinite(x); });
      else
        mb([](C) { return true; });
      return;
    case OpKind::LogicalNot: mb([](C x) { return x == C(0); }); return;
    case OpKind::BitwiseNot:
      if constexpr (std::is_same_v<C, bool>)
        m([](C x) { return !x; });
      else if constexpr (std::is_integral_v<C>)
        m([](C x) { return static_cast<C>(~x); });
      else
        throw Error("bitwise_not: floating point input");
      return;
    default: break;
  }
  if constexpr (fl) {
    switch (op) {
      case OpKind::Exp: m([](C x) { return vm(vmath::Fn::Exp, x); }); return;
      case OpKind::Exp2: m([](C x) { return vm(vmath::Fn::Exp2, x); }); return;
      case OpKind::Expm1: m([](C x) { return vm(vmath::Fn::Expm1, x); }); return;
      case OpKind::Log: m([](C x) { return vm(vmath::Fn::Log, x); }); return;
      case OpKind::Log2: m([](C x) { return vm(vmath::Fn::Log2, x); }); return;
      case OpKind::Log1p: m([](C x) { return vm(vmath::Fn::Log1p, x); }); return;
      case OpKind::Sqrt: m([](C x) { return std::sqrt(x); }); return;
      case OpKind::Rsqrt: m([](C x) { return C(1) / std::sqrt(x); }); return;
      case OpKind::Reciprocal: m([](C x) { return C(1) / x; }); return;
      case OpKind::Sin: m([](C x) { return vm(vmath::Fn::Sin, x); }); return;
      case OpKind::Cos: m([](C x) { return vm(vmath::Fn::Cos, x); }); return;
      case OpKind::Tan: m([](C x) { return vm(vmath::Fn::Tan, x); }); return;
      case OpKind::Atan: m([](C x) { return vm(vmath::Fn::Atan, x); }); return;
      case OpKind::Tanh: m([](C x) { return vm(vmath::Fn::Tanh, x); }); return;
      case OpKind::Sigmoid: m([](C x) { return vmath::sigmoid(x); }); return;
      case OpKind::Erf: m([](C x) { return vm(vmath::Fn::Erf, x); }); return;
      default: break;
    }
  }
  throw Error(detail::cat("interpreter: unary op ", op_name(op), " not supported for ", dtype_name(out.dtype)));
}

template <class TO, class TI>
TO convert(TI x) {
  if constexpr (std::is_same_v<TO, bool>)
    return static_cast<compute_t<TI>>(x) != 0;
  else if constexpr (std::is_same_v<TI, bool>)
    return static_cast<TO>(static_cast<compute_t<TO>>(x ? 1 : 0));
  else
    return static_cast<TO>(static_cast<compute_t<TO>>(static_cast<compute_t<TI>>(x)));
}

}  // namespace

void unary(OpKind op, const Operand& out, const Operand& in) {
  if (op == OpKind::Cast || op == OpKind::Contiguous) {
    dispatch_dtype(out.dtype, [&](auto to) {
      dispatch_dtype(in.dtype, [&](auto ti) {
        using TO = decltype(to);
        using TI = decltype(ti);
        map1<TO, TI>(out, in, [](TI x) { return convert<TO, TI>(x); });
      });
    });
    return;
  }
  dispatch_dtype(in.dtype, [&](auto tag) { unary_typed<decltype(tag)>(op, out, in); });
}

namespace {

template <class TO, class T, class F>
void map2(const Operand& out, const Operand& a, const Operand& b, F f) {
  nd_for<3>(out.sizes, {out.strides, a.broadcast_strides(out.sizes), b.broadcast_strides(out.sizes)},
            [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
              TO* o = out.ptr<TO>() + off[0];
              const T* x = a.ptr<T>() + off[1];
              const T* y = b.ptr<T>() + off[2];
              if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
                for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
              } else {
                for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(x[i * st[1]], y[i * st[2]]);
              }
            });
}

template <class C>
C int_pow(C base, C e) {
  if (e < 0) {
    if (base == 1) return 1;
    if (base == -1) return (e % 2 == 0) ? 1 : -1;
    throw Error("pow: integers to negative integer powers are not allowed");
  }
  // Products wrap around, as PyTorch's integer pow does: computed unsigned (signed overflow is
  // undefined behaviour, and the last squaring overflows even when its value is not used).
  using W = std::make_unsigned_t<std::common_type_t<C, int>>;
  W r = 1, b = static_cast<W>(base);
  while (e) {
    if (e & 1) r = static_cast<W>(r * b);
    b = static_cast<W>(b * b);
    e >>= 1;
  }
  return static_cast<C>(r);
}

template <class T>
void binary_typed(OpKind op, const Operand& out, const Operand& a, const Operand& b) {
  using C = compute_t<T>;
  constexpr bool fl = std::is_floating_point_v<C>;
  constexpr bool is_bool = std::is_same_v<C, bool>;
  auto m = [&](auto f) {
    map2<T, T>(out, a, b, [f](T x, T y) { return static_cast<T>(f(static_cast<C>(x), static_cast<C>(y))); });
  };
  auto mb = [&](auto f) {
    map2<bool, T>(out, a, b, [f](T x, T y) { return static_cast<bool>(f(static_cast<C>(x), static_cast<C>(y))); });
  };
  switch (op) {
    case OpKind::Add:
      if constexpr (is_bool)
        m([](C x, C y) { return x || y; });
      else
        m([](C x, C y) { return static_cast<C>(x + y); });
      return;
    case OpKind::Sub: m([](C x, C y) { return static_cast<C>(x - y); }); return;
    case OpKind::Mul:
      if constexpr (is_bool)
        m([](C x, C y) { return x && y; });
      else
        m([](C x, C y) { return static_cast<C>(x * y); });
      return;
    case OpKind::Div:
      if constexpr (fl)
        m([](C x, C y) { return x / y; });
      else
        break;
      return;
    case OpKind::Maximum:
      if constexpr (fl)
        m([](C x, C y) { return (std::isnan(x) || std::isnan(y)) ? x + y : (x > y ? x : y); });
      else
        m([](C x, C y) { return x > y ? x : y; });
      return;
    case OpKind::Minimum:
      if constexpr (fl)
        m([](C x, C y) { return (std::isnan(x) || std::isnan(y)) ? x + y : (x < y ? x : y); });
      else
        m([](C x, C y) { return x < y ? x : y; });
      return;
    case OpKind::Pow:
      if constexpr (fl)
        m([](C x, C y) { return vm(vmath::Fn::Pow, x, y); });
      else if constexpr (is_bool)
        m([](C x, C y) { return x || !y; });
      else
        m([](C x, C y) { return int_pow<C>(x, y); });
      return;
    case OpKind::Atan2:
      if constexpr (fl)
        m([](C x, C y) { return vm(vmath::Fn::Atan2, x, y); });
      else
        break;
      return;
    case OpKind::Remainder:
      if constexpr (fl) {
        m([](C x, C y) {
          C r = std::fmod(x, y);
          if (r != 0 && ((y < 0) != (r < 0))) r += y;
          return r;
        });
      } else if constexpr (!is_bool) {
        m([](C x, C y) {
          if (y == 0) throw Error("remainder: integer division by zero");
          if (y == -1) return C(0);  // (the minimum % -1 traps on x86; PyTorch gives 0)
          C r = static_cast<C>(x % y);
          if (r != 0 && ((y < 0) != (r < 0))) r = static_cast<C>(r + y);
          return r;
        });
      } else
        break;
      return;
    case OpKind::Fmod:
      if constexpr (fl)
        m([](C x, C y) { return std::fmod(x, y); });
      else if constexpr (!is_bool) {
        m([](C x, C y) {
          if (y == 0) throw Error("fmod: integer division by zero");
          if (y == -1) return C(0);  // (the minimum % -1 traps on x86; PyTorch gives 0)
          return static_cast<C>(x % y);
        });
      } else
        break;
      return;
    case OpKind::Eq: mb([](C x, C y) { return x == y; }); return;
    case OpKind::Ne: mb([](C x, C y) { return x != y; }); return;
    case OpKind::Lt: mb([](C x, C y) { return x < y; }); return;
    case OpKind::Le: mb([](C x, C y) { return x <= y; }); return;
    case OpKind::Gt: mb([](C x, C y) { return x > y; }); return;
    case OpKind::Ge: mb([](C x, C y) { return x >= y; }); return;
    case OpKind::LogicalAnd: mb([](C x, C y) { return x != C(0) && y != C(0); }); return;
    case OpKind::LogicalOr: mb([](C x, C y) { return x != C(0) || y != C(0); }); return;
    case OpKind::LogicalXor: mb([](C x, C y) { return (x != C(0)) != (y != C(0)); }); return;
    case OpKind::BitwiseAnd:
      if constexpr (!fl)
        m([](C x, C y) { return static_cast<C>(x & y); });
      else
        break;
      return;
    case OpKind::BitwiseOr:
      if constexpr (!fl)
        m([](C x, C y) { return static_cast<C>(x | y); });
      else
        break;
      return;
    case OpKind::BitwiseXor:
      if constexpr (!fl)
        m([](C x, C y) { return static_cast<C>(x ^ y); });
      else
        break;
      return;
    default: break;
  }
  throw Error(detail::cat("interpreter: binary op ", op_name(op), " not supported for ", dtype_name(a.dtype)));
}

}  // namespace

void binary(OpKind op, const Operand& out, const Operand& a, const Operand& b) {
  dispatch_dtype(a.dtype, [&](auto tag) { binary_typed<decltype(tag)>(op, out, a, b); });
}

void where(const Operand& out, const Operand& cond, const Operand& a, const Operand& b) {
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    nd_for<4>(out.sizes,
              {out.strides, cond.broadcast_strides(out.sizes), a.broadcast_strides(out.sizes),
               b.broadcast_strides(out.sizes)},
              [&](const std::array<int64_t, 4>& off, int64_t n, const std::array<int64_t, 4>& st) {
                T* o = out.ptr<T>() + off[0];
                const bool* c = cond.ptr<bool>() + off[1];
                const T* x = a.ptr<T>() + off[2];
                const T* y = b.ptr<T>() + off[3];
                for (int64_t i = 0; i < n; ++i) o[i * st[0]] = c[i * st[1]] ? x[i * st[2]] : y[i * st[3]];
              });
  });
}

}  // namespace kiln::kernels
