// kiln's float32 exp on 16 lanes: exp(x) = 2^n exp(r) with n = round(x / ln 2), r = x - n ln 2
// (ln 2 in two parts, fused multiply-adds), exp(r) = 1 + (r + r^2 q(r)) with q of degree 4, and
// 2^n applied by vscalefps (which also rounds subnormal results once and overflows to inf).
// Over every float it is within 1.014 ulp of the correctly rounded exp (libmvec's AVX-512 variant:
// 2.5 ulp), and a softmax runs faster on it (docs/BENCHMARKS.md). See the test
// VectorMath.ExpWithinOneUlpEverywhere.
#include "kernels/cpu/vmath16.h"
#include "kernels/cpu/vmath16_tables.h"

namespace kiln::vmath {

using namespace tables;

__attribute__((target("avx512f"))) __m512 exp16(__m512 x) {
  // min/max return their second operand for a NaN lane: NaN stays NaN through everything below.
  const __m512 xc = _mm512_max_ps(_mm512_set1_ps(kLow), _mm512_min_ps(_mm512_set1_ps(kHigh), x));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 q = _mm512_set1_ps(kQ[4]);
  for (int k = 3; k >= 0; --k) q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(kQ[k]));
  // r + r^2 q first, then + 1 rounded once: the small part keeps its bits.
  const __m512 p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(r, r), q, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace kiln::vmath
