// The transcendental functions every backend computes with (the interpreter, the asmjit tier
// and the LLVM tier), so that a value is the same bits whichever tier or kernel computes it,
// in a vector loop or in its scalar tail.
//
// Each function is defined per element as one lane of one vector implementation: glibc's
// libmvec AVX2 variant (`_ZGVdN8v_expf`, `_ZGVdN4v_exp`; SLEEF's GNU-ABI build where libmvec
// lacks the name), its AVX-512 variant on AVX-512 hosts where as accurate, and kiln's own
// 16-lane exp and erf there (vmath16.h). These compute each lane from that lane's input alone, so
//   - `kiln_vm8_<f>f` / `kiln_vm4_<f>` (8 x float / 4 x double, AVX2 vector ABI) call it,
//   - `kiln_vm_<f>f` / `kiln_vm_<f>` (scalar) broadcast the argument and take lane 0,
// and both give the same bits for every element. Without AVX2 (or without either library's
// variant) every entry point uses the scalar libm function instead, again the same everywhere.
// The LLVM tier calls the scalar names and maps them to the vector ones for its vectorizer
// (VF 16 where have_vector16(), 8 / 4); the asmjit tier calls the vector ones in its AVX2 loops.
#pragma once
#include <cstdint>

namespace kiln::vmath {

enum class Fn : int { Exp, Exp2, Expm1, Log, Log2, Log1p, Sin, Cos, Tan, Atan, Tanh, Erf, Pow, Atan2, Count };
constexpr int kCount = static_cast<int>(Fn::Count);
const char* name(Fn f);  // libm's name of the double function: "exp", ..., "pow", "atan2"
inline bool is_binary(Fn f) { return f == Fn::Pow || f == Fn::Atan2; }

// Whether the vector entry points exist for this process (AVX2 host); when false the JIT must
// not map calls to them.
bool have_vector();
// Whether kernels should use 512-bit vectors (AVX-512F host, KILN_NO_AVX512 unset, the AVX-512
// variants found): then `kiln_vm16_<f>f` (16 x float) is the native form of the functions whose
// AVX-512 variant is as accurate (vmath.cpp lists them; the 8-lane and scalar forms take lanes
// of it) and two 8-lane calls of the others.
bool have_vector16();

// Whether f's 16-lane form is kiln's own (vmath16.h: exp and erf on AVX-512 hosts), whose
// instruction sequence the LLVM tier may inline (jit/cpu_llvm/inline_vmath.h).
bool uses_own16(Fn f);

// The library function that `kiln_vm<lanes>_<f>f` only forwards to (same vector ABI, same bits),
// or null where that entry point does more (splits, widens, loops over libm): the JIT binds
// its kernels' calls to it directly, skipping a call through kiln.
const void* direct_entry(Fn f, int lanes);

// Scalar (the same bits as any lane of the vector forms).
float f32(Fn f, float x);
double f64(Fn f, double x);
float f32(Fn f, float x, float y);
double f64(Fn f, double x, double y);

// In place over 8 floats / 4 doubles (y: the second operand of pow/atan2, else null); the
// same bits as the scalar forms element by element.
void apply8f(Fn f, float* x, const float* y);
void apply4d(Fn f, double* x, const double* y);

// Sigmoid as every backend computes it: 1 / (1 + exp(-x)), exp as above.
inline float sigmoid(float x) { return 1.0f / (1.0f + f32(Fn::Exp, -x)); }
inline double sigmoid(double x) { return 1.0 / (1.0 + f64(Fn::Exp, -x)); }

}  // namespace kiln::vmath
