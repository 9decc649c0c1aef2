// kiln's own float32 transcendentals on 16 lanes (AVX-512F): on AVX-512 hosts these are the one
// implementation of their function (vmath.cpp), in every tier and in the scalar forms. Vector
// function ABI (argument and result in zmm0), so kernels call them as they would libmvec's
// `_ZGVeN16v_<f>f`.
#pragma once
#include <immintrin.h>

namespace kiln::vmath {

// erf of 16 floats, within 1.03 ulp of the correctly rounded value for every float; +-1
// exactly from the least float whose erf rounds to 1 on, NaN for NaN (vmath_erf.cpp).
__attribute__((target("avx512f"))) __m512 erf16(__m512 x);

// exp of 16 floats, within 1.02 ulp of the correctly rounded value for every float, subnormal
// results included; inf above 88.72283, 0 below -103.97208, NaN for NaN (vmath_exp.cpp).
__attribute__((target("avx512f"))) __m512 exp16(__m512 x);

}  // namespace kiln::vmath
