// The constants of kiln's own 16-lane exp and erf (vmath16.h): the C++ functions and the LLVM
// tier's inline copies of them (jit/cpu_llvm/inline_vmath.cpp) compute with these, op for op.
#pragma once

namespace kiln::vmath::tables {

// ---- erf (vmath_erf.cpp) ----
// The least float whose correctly rounded erf is 1: from there on the result is exactly +-1.
inline constexpr float kErfOne = 3.91920590f;

// Interval i covers [i/4, (i+1)/4); s = |x| - centre (exact: Sterbenz), interval 0 centred at
// 0 so that small |x| keep their relative accuracy.
alignas(64) inline constexpr float kCentre[16] = {0.0f,   0.375f, 0.625f, 0.875f, 1.125f, 1.375f, 1.625f, 1.875f,
                                                  2.125f, 2.375f, 2.625f, 2.875f, 3.125f, 3.375f, 3.625f, 3.875f};

// erf(centre + s) = c0 + c1 s + ... + c6 s^6 per interval, c0 and c1 as float pairs hi + lo.
// Printed by kernels/cpu/vmath_erf_fit.py (relative fits, max error 2.6e-9).
alignas(64) inline constexpr float kCoef[9][16] = {
    // c0 hi
    {0.000000000e+00f, 4.041168988e-01f, 6.232408881e-01f, 7.840750813e-01f, 8.883882165e-01f, 9.481700659e-01f,
     9.784437418e-01f, 9.919900298e-01f, 9.973459840e-01f, 9.992170334e-01f, 9.997946024e-01f, 9.999521375e-01f,
     9.999901056e-01f, 9.999982119e-01f, 9.999997020e-01f, 9.999999404e-01f},
    // c0 lo
    {0.000000000e+00f, 1.063654320e-08f, -5.920629320e-09f, -2.027521440e-08f, 1.521501325e-08f, 6.905845673e-09f,
     -8.558344256e-09f, 2.785678355e-08f, -1.334287347e-08f, 2.839537849e-08f, 2.186972026e-08f, 7.690136528e-09f,
     -2.363488516e-09f, -2.714203262e-08f, 2.883050243e-09f, 1.709069863e-08f},
    // c1 hi
    {1.128379226e+00f, 9.803528190e-01f, 7.634995580e-01f, 5.247450471e-01f, 3.182739615e-01f, 1.703597754e-01f,
     8.047225326e-02f, 3.354582563e-02f, 1.234081946e-02f, 4.006478004e-03f, 1.147875446e-03f, 2.902284905e-04f,
     6.475879491e-05f, 1.275178329e-05f, 2.215933591e-06f, 3.398219519e-07f},
    // c1 lo
    {-5.565802397e-08f, -1.157779739e-08f, -1.644255576e-08f, 5.923201485e-09f, 9.577000304e-10f, -2.295553747e-09f,
     3.197013765e-09f, 7.426548265e-10f, 3.685460548e-10f, -9.839657561e-11f, -3.806680318e-11f, 1.260963816e-11f,
     -2.036200527e-13f, 4.028868710e-13f, -3.267718263e-14f, 1.384720780e-15f},
    // c2
    {-8.547268635e-07f, -3.676322699e-01f, -4.771872163e-01f, -4.591519237e-01f, -3.580582142e-01f, -2.342446893e-01f,
     -1.307674199e-01f, -6.289842725e-02f, -2.622424252e-02f, -9.515384212e-03f, -3.013172187e-03f, -8.344065282e-04f,
     -2.023710549e-04f, -4.303720561e-05f, -8.032740880e-06f, -1.316804742e-06f},
    // c3
    {-3.760863245e-01f, -2.348750532e-01f, -5.567479506e-02f, 9.291964769e-02f, 1.624502838e-01f, 1.579380035e-01f,
     1.148419306e-01f, 6.744214147e-02f, 3.303780407e-02f, 1.373051014e-02f, 4.890281707e-03f, 1.502423198e-03f,
     3.999627079e-04f, 9.256100020e-05f, 1.866695493e-05f, 3.289155529e-06f},
    // c4
    {-6.887016934e-04f, 1.665763855e-01f, 1.764603257e-01f, 1.123995706e-01f, 2.797631361e-02f, -3.049898706e-02f,
     -4.971872270e-02f, -4.226047546e-02f, -2.636137977e-02f, -1.313344296e-02f, -5.414308514e-03f, -1.881706645e-03f,
     -5.575297982e-04f, -1.418661559e-04f, -3.116053995e-05f, -5.931183296e-06f},
    // c5
    {1.182092577e-01f, 4.532771558e-02f, -2.703491040e-02f, -6.670908630e-02f, -6.106123328e-02f, -3.064373694e-02f,
     -2.303250832e-03f, 1.132803038e-02f, 1.244422328e-02f, 8.360534906e-03f, 4.236411303e-03f, 1.727705938e-03f,
     5.842616083e-04f, 1.665796590e-04f, 4.045959940e-05f, 7.984676813e-06f},
    // c6
    {-1.944730803e-02f, -4.960321262e-02f, -4.124354199e-02f, -1.052964199e-02f, 1.529853512e-02f, 2.201432921e-02f,
     1.439822931e-02f, 4.156477749e-03f, -1.772699994e-03f, -3.093410982e-03f, -2.245562151e-03f, -1.144815120e-03f,
     -4.562255344e-04f, -1.483434899e-04f, -4.024032023e-05f, -1.170216092e-05f},
};
enum ErfRow { C0Hi, C0Lo, C1Hi, C1Lo, C2, C3, C4, C5, C6 };

// ---- exp (vmath_exp.cpp) ----
// exp(r) = 1 + r + r^2 (q0 + q1 r + ... + q4 r^4): printed by kernels/cpu/vmath_exp_fit.py.
inline constexpr float kQ[5] = {4.999999404e-01f, 1.666652113e-01f, 4.166838899e-02f, 8.368710987e-03f,
                                1.381455804e-03f};
inline constexpr float kLog2e = 1.44269504f;
inline constexpr float kLn2Hi = 0.693145752f;  // 16 significant bits: n * kLn2Hi is exact for |n| < 256
inline constexpr float kLn2Lo = 1.42860677e-06f;  // ln 2 - kLn2Hi
// Inputs are clamped to [kLow, kHigh] first: exp(kHigh) overflows and exp(kLow) rounds to 0, so
// +-inf come out as inf and 0 without an inf - inf in the reduction.
inline constexpr float kHigh = 89.0f, kLow = -104.0f;

}  // namespace kiln::vmath::tables
