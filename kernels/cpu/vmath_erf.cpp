// kiln's float32 erf on 16 lanes: a degree-6 polynomial per interval of width 1/4, its
// coefficients picked per lane from 16-entry tables with one permute each (the tables stay in
// registers). Over every float it is within 1.03 ulp of the correctly rounded erf (libmvec's
// AVX-512 variant: 4.0 ulp), and faster than libmvec's (docs/BENCHMARKS.md); see the test
// VectorMath.ErfWithinOneUlpEverywhere.
#include "kernels/cpu/vmath16.h"
#include "kernels/cpu/vmath16_tables.h"

#include <cstdint>

// GCC 12's _mm512_permutexvar_ps fills an operand with an undefined vector, which its own
// -Wuninitialized then reports at every use (GCC bug 105593; vmath.cpp says the same).
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kiln::vmath {
namespace {

using namespace tables;

// Entry idx[lane] (mod 16) of a 16-float table, per lane.
__attribute__((target("avx512f"))) inline __m512 pick(__m512i idx, const float* table) {
  return _mm512_permutexvar_ps(idx, _mm512_load_ps(table));
}

}  // namespace

__attribute__((target("avx512f"))) __m512 erf16(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  // The interval of each lane; lanes past the table (|x| >= 4, inf) or NaN read some entry and
  // are overwritten (saturated) or stay NaN below.
  const __m512i idx = _mm512_cvttps_epi32(_mm512_mul_ps(ax, _mm512_set1_ps(4.0f)));
  const __m512 s = _mm512_sub_ps(ax, pick(idx, kCentre));
  __m512 q = pick(idx, kCoef[C6]);
  for (int k = C5; k >= C2; --k) q = _mm512_fmadd_ps(q, s, pick(idx, kCoef[k]));
  // The small terms first, then c1hi s + c0hi rounded once: c0lo + c1lo s + s^2 q carries the
  // bits c0 and c1 lose to float.
  __m512 lo = _mm512_fmadd_ps(_mm512_mul_ps(s, s), q, pick(idx, kCoef[C0Lo]));
  lo = _mm512_fmadd_ps(s, pick(idx, kCoef[C1Lo]), lo);
  __m512 r = _mm512_fmadd_ps(s, pick(idx, kCoef[C1Hi]), _mm512_add_ps(pick(idx, kCoef[C0Hi]), lo));
  const __mmask16 one = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(kErfOne), _CMP_GE_OQ);
  r = _mm512_mask_mov_ps(r, one, _mm512_set1_ps(1.0f));
  // erf is odd: x's sign bit on |erf(|x|)| (bitwise select, imm 0xd8 = sign ? x : r).
  return _mm512_castsi512_ps(
      _mm512_ternarylogic_epi32(_mm512_castps_si512(r), _mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN), 0xd8));
}

}  // namespace kiln::vmath
