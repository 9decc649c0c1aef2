// The row log-sum-exp of a 16-bit Attention node's packed output (runtime/ir/node.h): a float32
// value kept exactly in four 16-bit numbers, so that the node has one dtype, its output rows are
// rounded once and the log-sum-exp the backward reads is the float32 one the forward had.
//
//   lse finite, nonzero:  e, m0, m1, m2 with lse = (m0 + m1 + m2) · 2^e, where lse = f · 2^e
//                         (frexp, f in [0.5, 1)), m0 = f rounded to the 16-bit type, m1 the
//                         remainder rounded, m2 what is left. Exact in bfloat16 (8 significant
//                         bits a piece, float32's exponent range) and in float16 (the remainders
//                         are multiples of 2^-24, float16's smallest step).
//   0, ±inf, NaN:         0, lse, 0, 0.
//
// Values, not bits: the pieces survive any value-preserving copy or cast (bit patterns would not:
// conversions canonicalize NaNs), and code written with tensor ops (DTensor's ring attention)
// reads and writes them with exp2, floor and casts. The CUDA kernels hold the same two functions
// in their source (kernels/cuda: attention_common.cpp).
#pragma once

#include <cmath>

namespace kiln {

// The pieces of `lse` into p[0..3]; H is the 16-bit storage type (Half or BFloat16).
template <class H>
void encode_lse(float lse, H* p) {
  if (!std::isfinite(lse) || lse == 0.f) {
    p[0] = H(0.f), p[1] = H(lse), p[2] = H(0.f), p[3] = H(0.f);
    return;
  }
  int e = 0;
  const float f = std::frexp(lse, &e);
  const H m0(f);
  const float r = f - static_cast<float>(m0);
  const H m1(r);
  p[0] = H(static_cast<float>(e)), p[1] = m0, p[2] = m1, p[3] = H(r - static_cast<float>(m1));
}

// The float32 log-sum-exp of pieces p[0..3] (element stride `step`).
template <class H>
float decode_lse(const H* p, long step = 1) {
  const float m0 = static_cast<float>(p[step]);
  if (!std::isfinite(m0) || m0 == 0.f) return m0;
  const float f = m0 + static_cast<float>(p[2 * step]) + static_cast<float>(p[3 * step]);
  return std::ldexp(f, static_cast<int>(static_cast<float>(p[0])));
}

}  // namespace kiln
