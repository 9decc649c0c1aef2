// Transcendentals shared by every backend (see vmath.h).
#include "kernels/cpu/vmath.h"

#include <dlfcn.h>
#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "kernels/cpu/vmath16.h"
#include "runtime/core/export.h"

// GCC 12's AVX-512 insert/extract intrinsics fill an operand with _mm256_undefined_pd(), which
// its own -Wuninitialized then reports at every use (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kiln::vmath {
namespace {

using V8f1 = __m256 (*)(__m256);
using V8f2 = __m256 (*)(__m256, __m256);
using V4d1 = __m256d (*)(__m256d);
using V4d2 = __m256d (*)(__m256d, __m256d);
using V16f1 = __m512 (*)(__m512);
using V16f2 = __m512 (*)(__m512, __m512);

const char* const kNames[kCount] = {"exp", "exp2", "expm1", "log",  "log2", "log1p", "sin",
                                    "cos", "tan",  "atan",  "tanh", "erf",  "pow",   "atan2"};

// The AVX2 variants, resolved once: libmvec first, then SLEEF's GNU-ABI build (the same order
// as the LLVM JIT's symbol search used to have; both are link dependencies of libkiln).
// float32 only: float64 is computed with scalar libm (< 1 ulp) in every backend, since float64
// users expect PyTorch's float64 accuracy (libmvec's double variants allow 4 ulp, which grows
// past 1e-9 relative through a tan or an exp); the d4 entries stay null, and vec4 runs libm per lane.
// On an AVX-512 host a float32 function is its AVX-512 variant (`_ZGVeN16v_expf`) where that is
// as accurate as the AVX2 one: twice the lanes per call, and still one implementation for every
// entry point (8-lane calls run it on a zero-extended register, scalar ones on a broadcast).
// Measured over 3.2M random inputs per function against double libm (max ulp, AVX2 / AVX-512):
// exp 2.50 / 2.50 (libmvec's; kiln's own below), log 3.86 / 3.86, log2 2.02 / 2.04, log1p 1.79 /
// 1.79, sin 1.80 / 1.80, cos 1.84 / 1.84, tan 3.21 / 3.05, atan 2.29 / 2.17, pow 0.62 / 0.62,
// atan2 3.12 / 3.12: wide.
// exp and erf are kiln's own on AVX-512 hosts (vmath16.h: exp within 1.02 ulp, erf within 1.03 over
// every float): faster in kernels (docs/BENCHMARKS.md) and more accurate (libmvec's erf reaches
// 3.999992 ulp at 3.6533227);
// AVX2-only hosts keep libmvec's (exp 2.50, erf 1.91 ulp).
// tanh 1.02 / 1.37 is wide with one fix: the AVX-512 variant returns 0.99999994 for about a
// million inputs at and above 9.01091385, the least float whose correctly rounded tanh is 1
// (PyTorch's programs see that through 1 - tanh); lanes at or beyond +-that return +-1
// (exhaustively over every positive float below 100: 1.37 ulp at most, and 1 where it rounds to 1).
// exp2 0.81 / 1.00 and expm1 1.65 / 2.31 stay AVX2; their 16-lane form is two 8-lane calls.
constexpr bool kWide[kCount] = {true, false, false, true, true, true, true, true, true, true, true, true, true, true};
constexpr float kTanhOne = 9.01091385f;  // the least float x with tanh(x) rounding to 1
// Whether f's AVX-512 variant is followed by a fix (call16): its entry points never forward.
constexpr bool fixed16(Fn f) { return f == Fn::Tanh; }
// kiln's own 16-lane variant of f (vmath16.h), or null where the library's is used.
void* own_variant16(Fn f) {
  if (f == Fn::Exp) return reinterpret_cast<void*>(&exp16);
  if (f == Fn::Erf) return reinterpret_cast<void*>(&erf16);
  return nullptr;
}
struct Table {
  void* f8[kCount] = {};
  void* f16[kCount] = {};
  void* d4[kCount] = {};
  bool avx2 = false;
  bool avx512 = false;  // 512-bit vectors are worth it: the wide functions are in f16
  Table() {
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2");
    if (!avx2) return;
    void* libs[] = {dlopen("libmvec.so.1", RTLD_NOW | RTLD_GLOBAL),
                    dlopen("libsleefgnuabi.so.3", RTLD_NOW | RTLD_GLOBAL)};
    auto find = [&](const std::string& name) -> void* {
      for (void* lib : libs)
        if (void* f = lib ? dlsym(lib, name.c_str()) : nullptr) return f;
      return nullptr;
    };
    bool all16 = __builtin_cpu_supports("avx512f") && !std::getenv("KILN_NO_AVX512");
    for (int i = 0; i < kCount; ++i) {
      const std::string abi = is_binary(static_cast<Fn>(i)) ? "vv_" : "v_";
      f8[i] = find("_ZGVdN8" + abi + kNames[i] + "f");
      void* own = own_variant16(static_cast<Fn>(i));
      f16[i] = !kWide[i] ? nullptr : own ? own : find("_ZGVeN16" + abi + kNames[i] + "f");
      all16 = all16 && f8[i] && (f16[i] || !kWide[i]);
    }
    avx512 = all16;
    if (!avx512)
      for (auto& f : f16) f = nullptr;
  }
};
const Table& table() {
  static const Table t;
  return t;
}

template <class T>
T libm(Fn f, T x, T y) {
  switch (f) {
    case Fn::Exp: return std::exp(x);
    case Fn::Exp2: return std::exp2(x);
    case Fn::Expm1: return std::expm1(x);
    case Fn::Log: return std::log(x);
    case Fn::Log2: return std::log2(x);
    case Fn::Log1p: return std::log1p(x);
    case Fn::Sin: return std::sin(x);
    case Fn::Cos: return std::cos(x);
    case Fn::Tan: return std::tan(x);
    case Fn::Atan: return std::atan(x);
    case Fn::Tanh: return std::tanh(x);
    case Fn::Erf: return std::erf(x);
    case Fn::Pow: return std::pow(x, y);
    case Fn::Atan2: return std::atan2(x, y);
    default: return x;
  }
}

// The AVX-512 variant of f on 16 lanes, with tanh's saturation fixed (kTanhOne).
__attribute__((target("avx512f"))) __m512 call16(Fn f, void* fn, __m512 x, __m512 y) {
  if (is_binary(f)) return reinterpret_cast<V16f2>(fn)(x, y);
  const __m512 r = reinterpret_cast<V16f1>(fn)(x);
  if (!fixed16(f)) return r;
  const __mmask16 sat = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(kTanhOne), _CMP_GE_OQ);
  const __m512i sign = _mm512_and_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  const __m512 one = _mm512_castsi512_ps(_mm512_or_epi32(_mm512_castps_si512(_mm512_set1_ps(1.0f)), sign));
  return _mm512_mask_blend_ps(sat, r, one);
}
__attribute__((target("avx512f"))) float lane0_16(Fn f, void* fn, float x, float y) {
  return _mm512_cvtss_f32(call16(f, fn, _mm512_set1_ps(x), _mm512_set1_ps(y)));
}
__attribute__((target("avx2"))) float lane0(void* fn, bool bin, float x, float y) {
  __m256 r = bin ? reinterpret_cast<V8f2>(fn)(_mm256_set1_ps(x), _mm256_set1_ps(y))
                 : reinterpret_cast<V8f1>(fn)(_mm256_set1_ps(x));
  return _mm256_cvtss_f32(r);
}
// Scalar float f: lane 0 of the process's implementation.
float scalar_f32(Fn f, float x, float y) {
  const Table& t = table();
  const int i = static_cast<int>(f);
  if (t.f16[i]) return lane0_16(f, t.f16[i], x, y);
  return t.f8[i] ? lane0(t.f8[i], is_binary(f), x, y) : libm(f, x, y);
}
__attribute__((target("avx2"))) double lane0(void* fn, bool bin, double x, double y) {
  __m256d r = bin ? reinterpret_cast<V4d2>(fn)(_mm256_set1_pd(x), _mm256_set1_pd(y))
                  : reinterpret_cast<V4d1>(fn)(_mm256_set1_pd(x));
  return _mm256_cvtsd_f64(r);
}

__attribute__((target("avx512f"))) __m256 vec8_16(Fn f, void* fn, __m256 x, __m256 y) {
  const __m512 a = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_setzero_pd(), _mm256_castps_pd(x), 0));
  const __m512 b = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_setzero_pd(), _mm256_castps_pd(y), 0));
  return _mm512_castps512_ps256(call16(f, fn, a, b));
}
__attribute__((target("avx2"))) __m256 vec8(Fn f, __m256 x, __m256 y) {
  if (void* f16 = table().f16[static_cast<int>(f)]) return vec8_16(f, f16, x, y);
  void* fn = table().f8[static_cast<int>(f)];
  if (fn) return is_binary(f) ? reinterpret_cast<V8f2>(fn)(x, y) : reinterpret_cast<V8f1>(fn)(x);
  alignas(32) float a[8], b[8];
  _mm256_store_ps(a, x);
  _mm256_store_ps(b, y);
  for (int i = 0; i < 8; ++i) a[i] = libm(f, a[i], b[i]);
  return _mm256_load_ps(a);
}
// 16 floats: the AVX-512 variant, or two 8-lane calls (exp2, expm1).
__attribute__((target("avx512f"))) __m512 vec16(Fn f, __m512 x, __m512 y) {
  if (void* fn = table().f16[static_cast<int>(f)]) return call16(f, fn, x, y);
  const __m256 lo = vec8(f, _mm512_castps512_ps256(x), _mm512_castps512_ps256(y));
  const __m256 hi = vec8(f, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1)));
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_zextpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}
__attribute__((target("avx2"))) __m256d vec4(Fn f, __m256d x, __m256d y) {
  void* fn = table().d4[static_cast<int>(f)];
  if (fn) return is_binary(f) ? reinterpret_cast<V4d2>(fn)(x, y) : reinterpret_cast<V4d1>(fn)(x);
  alignas(32) double a[4], b[4];
  _mm256_store_pd(a, x);
  _mm256_store_pd(b, y);
  for (int i = 0; i < 4; ++i) a[i] = libm(f, a[i], b[i]);
  return _mm256_load_pd(a);
}

__attribute__((target("avx2"))) void apply8f_avx2(Fn f, float* x, const float* y) {
  __m256 a = _mm256_loadu_ps(x), b = y ? _mm256_loadu_ps(y) : a;
  _mm256_storeu_ps(x, vec8(f, a, b));
}
__attribute__((target("avx2"))) void apply4d_avx2(Fn f, double* x, const double* y) {
  __m256d a = _mm256_loadu_pd(x), b = y ? _mm256_loadu_pd(y) : a;
  _mm256_storeu_pd(x, vec4(f, a, b));
}

}  // namespace

const char* name(Fn f) { return kNames[static_cast<int>(f)]; }
const void* direct_entry(Fn f, int lanes) {
  const Table& t = table();
  const int i = static_cast<int>(f);
  if (lanes == 16) return fixed16(f) ? nullptr : t.f16[i];
  if (lanes == 8) return t.f16[i] ? nullptr : t.f8[i];  // else vec8 runs the 16-lane variant
  return nullptr;  // float64 computes with libm per lane (vec4)
}
bool have_vector() { return table().avx2; }
bool uses_own16(Fn f) {
  const void* own = own_variant16(f);
  return own && table().f16[static_cast<int>(f)] == own;
}
bool have_vector16() { return table().avx512; }

float f32(Fn f, float x) { return scalar_f32(f, x, x); }
double f64(Fn f, double x) {
  void* fn = table().d4[static_cast<int>(f)];
  return fn ? lane0(fn, false, x, x) : libm(f, x, x);
}
float f32(Fn f, float x, float y) { return scalar_f32(f, x, y); }
double f64(Fn f, double x, double y) {
  void* fn = table().d4[static_cast<int>(f)];
  return fn ? lane0(fn, true, x, y) : libm(f, x, y);
}

void apply8f(Fn f, float* x, const float* y) {
  if (table().avx2) return apply8f_avx2(f, x, y);
  for (int i = 0; i < 8; ++i) x[i] = libm(f, x[i], y ? y[i] : x[i]);
}
void apply4d(Fn f, double* x, const double* y) {
  if (table().avx2) return apply4d_avx2(f, x, y);
  for (int i = 0; i < 4; ++i) x[i] = libm(f, x[i], y ? y[i] : x[i]);
}

}  // namespace kiln::vmath

// ---- the entry points generated code calls (resolved by name from the process) ----
// The LLVM tier's JIT looks these up in the process (DynamicLibrarySearchGenerator::
// GetForCurrentProcess, jit/cpu_llvm/codegen_llvm.cpp), so they keep default visibility
// (KILN_API) although libkiln hides everything else; kernels from the disk cache name them too.
using kiln::vmath::Fn;
#define KILN_VM_UNARY(NAME, FN)                                                                 \
  extern "C" KILN_API float kiln_vm_##NAME##f(float x) { return kiln::vmath::f32(Fn::FN, x); }  \
  extern "C" KILN_API double kiln_vm_##NAME(double x) { return kiln::vmath::f64(Fn::FN, x); }   \
  extern "C" KILN_API __attribute__((target("avx2"))) __m256 kiln_vm8_##NAME##f(__m256 x) {     \
    return kiln::vmath::vec8(Fn::FN, x, x);                                                     \
  }                                                                                             \
  extern "C" KILN_API __attribute__((target("avx2"))) __m256d kiln_vm4_##NAME(__m256d x) {      \
    return kiln::vmath::vec4(Fn::FN, x, x);                                                     \
  }                                                                                             \
  extern "C" KILN_API __attribute__((target("avx512f"))) __m512 kiln_vm16_##NAME##f(__m512 x) { \
    return kiln::vmath::vec16(Fn::FN, x, x);                                                    \
  }
#define KILN_VM_BINARY(NAME, FN)                                                                           \
  extern "C" KILN_API float kiln_vm_##NAME##f(float x, float y) { return kiln::vmath::f32(Fn::FN, x, y); } \
  extern "C" KILN_API double kiln_vm_##NAME(double x, double y) { return kiln::vmath::f64(Fn::FN, x, y); } \
  extern "C" KILN_API __attribute__((target("avx2"))) __m256 kiln_vm8_##NAME##f(__m256 x, __m256 y) {      \
    return kiln::vmath::vec8(Fn::FN, x, y);                                                                \
  }                                                                                                        \
  extern "C" KILN_API __attribute__((target("avx2"))) __m256d kiln_vm4_##NAME(__m256d x, __m256d y) {      \
    return kiln::vmath::vec4(Fn::FN, x, y);                                                                \
  }                                                                                                        \
  extern "C" KILN_API __attribute__((target("avx512f"))) __m512 kiln_vm16_##NAME##f(__m512 x, __m512 y) {  \
    return kiln::vmath::vec16(Fn::FN, x, y);                                                               \
  }
KILN_VM_UNARY(exp, Exp)
KILN_VM_UNARY(exp2, Exp2)
KILN_VM_UNARY(expm1, Expm1)
KILN_VM_UNARY(log, Log)
KILN_VM_UNARY(log2, Log2)
KILN_VM_UNARY(log1p, Log1p)
KILN_VM_UNARY(sin, Sin)
KILN_VM_UNARY(cos, Cos)
KILN_VM_UNARY(tan, Tan)
KILN_VM_UNARY(atan, Atan)
KILN_VM_UNARY(tanh, Tanh)
KILN_VM_UNARY(erf, Erf)
KILN_VM_BINARY(pow, Pow)
KILN_VM_BINARY(atan2, Atan2)
