// kiln's own float32 erf (kernels/cpu/vmath_erf.cpp): the 16-lane function behind every
// float32 erf on AVX-512 hosts (vmath.cpp makes it the one implementation of Fn::Erf there).
#pragma once
#include <immintrin.h>

namespace kiln::vmath {

// erf of 16 floats, within 1.03 ulp of the correctly rounded value for every float; +-1
// exactly from the least float whose erf rounds to 1 on, NaN for NaN. Vector function ABI
// (argument and result in zmm0), so kernels call it as they would `_ZGVeN16v_erff`.
__attribute__((target("avx512f"))) __m512 erf16(__m512 x);

}  // namespace kiln::vmath
