// Transcendentals shared by every backend (see vmath.h).
#include "kernels/cpu/vmath.h"

#include <dlfcn.h>
#include <immintrin.h>

#include <cmath>
#include <string>

#include "runtime/core/export.h"

namespace kiln::vmath {
namespace {

using V8f1 = __m256 (*)(__m256);
using V8f2 = __m256 (*)(__m256, __m256);
using V4d1 = __m256d (*)(__m256d);
using V4d2 = __m256d (*)(__m256d, __m256d);

const char* const kNames[kCount] = {"exp",  "exp2", "expm1", "log",  "log2", "log1p", "sin",
                                    "cos",  "tan",  "atan",  "tanh", "erf",  "pow",   "atan2"};

// The AVX2 variants, resolved once: libmvec first, then SLEEF's GNU-ABI build (the same order
// as the LLVM JIT's symbol search used to have; both are link dependencies of libkiln).
// float32 only: float64 is computed with scalar libm (< 1 ulp) in every backend, since float64
// users expect PyTorch's float64 accuracy (libmvec's double variants allow 4 ulp, which grows
// past 1e-9 relative through a tan or an exp); the d4 entries stay null, and vec4 runs libm per lane.
struct Table {
  void* f8[kCount] = {};
  void* d4[kCount] = {};
  bool avx2 = false;
  Table() {
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2");
    if (!avx2) return;
    void* libs[] = {dlopen("libmvec.so.1", RTLD_NOW | RTLD_GLOBAL), dlopen("libsleefgnuabi.so.3", RTLD_NOW | RTLD_GLOBAL)};
    for (int i = 0; i < kCount; ++i) {
      const std::string abi = is_binary(static_cast<Fn>(i)) ? "vv_" : "v_";
      const std::string nf = "_ZGVdN8" + abi + kNames[i] + "f";
      for (void* lib : libs)
        if (lib && !f8[i]) f8[i] = dlsym(lib, nf.c_str());
    }
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

__attribute__((target("avx2"))) float lane0(void* fn, bool bin, float x, float y) {
  __m256 r = bin ? reinterpret_cast<V8f2>(fn)(_mm256_set1_ps(x), _mm256_set1_ps(y))
                 : reinterpret_cast<V8f1>(fn)(_mm256_set1_ps(x));
  return _mm256_cvtss_f32(r);
}
__attribute__((target("avx2"))) double lane0(void* fn, bool bin, double x, double y) {
  __m256d r = bin ? reinterpret_cast<V4d2>(fn)(_mm256_set1_pd(x), _mm256_set1_pd(y))
                  : reinterpret_cast<V4d1>(fn)(_mm256_set1_pd(x));
  return _mm256_cvtsd_f64(r);
}

__attribute__((target("avx2"))) __m256 vec8(Fn f, __m256 x, __m256 y) {
  void* fn = table().f8[static_cast<int>(f)];
  if (fn) return is_binary(f) ? reinterpret_cast<V8f2>(fn)(x, y) : reinterpret_cast<V8f1>(fn)(x);
  alignas(32) float a[8], b[8];
  _mm256_store_ps(a, x);
  _mm256_store_ps(b, y);
  for (int i = 0; i < 8; ++i) a[i] = libm(f, a[i], b[i]);
  return _mm256_load_ps(a);
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
bool have_vector() { return table().avx2; }

float f32(Fn f, float x) {
  void* fn = table().f8[static_cast<int>(f)];
  return fn ? lane0(fn, false, x, x) : libm(f, x, x);
}
double f64(Fn f, double x) {
  void* fn = table().d4[static_cast<int>(f)];
  return fn ? lane0(fn, false, x, x) : libm(f, x, x);
}
float f32(Fn f, float x, float y) {
  void* fn = table().f8[static_cast<int>(f)];
  return fn ? lane0(fn, true, x, y) : libm(f, x, y);
}
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
#define KILN_VM_UNARY(NAME, FN)                                                                            \
  extern "C" KILN_API float kiln_vm_##NAME##f(float x) { return kiln::vmath::f32(Fn::FN, x); }             \
  extern "C" KILN_API double kiln_vm_##NAME(double x) { return kiln::vmath::f64(Fn::FN, x); }              \
  extern "C" KILN_API __attribute__((target("avx2"))) __m256 kiln_vm8_##NAME##f(__m256 x) {                \
    return kiln::vmath::vec8(Fn::FN, x, x);                                                                \
  }                                                                                                        \
  extern "C" KILN_API __attribute__((target("avx2"))) __m256d kiln_vm4_##NAME(__m256d x) {                 \
    return kiln::vmath::vec4(Fn::FN, x, x);                                                                \
  }
#define KILN_VM_BINARY(NAME, FN)                                                                           \
  extern "C" KILN_API float kiln_vm_##NAME##f(float x, float y) { return kiln::vmath::f32(Fn::FN, x, y); } \
  extern "C" KILN_API double kiln_vm_##NAME(double x, double y) { return kiln::vmath::f64(Fn::FN, x, y); } \
  extern "C" KILN_API __attribute__((target("avx2"))) __m256 kiln_vm8_##NAME##f(__m256 x, __m256 y) {      \
    return kiln::vmath::vec8(Fn::FN, x, y);                                                                \
  }                                                                                                        \
  extern "C" KILN_API __attribute__((target("avx2"))) __m256d kiln_vm4_##NAME(__m256d x, __m256d y) {      \
    return kiln::vmath::vec4(Fn::FN, x, y);                                                                \
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
