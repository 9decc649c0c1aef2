#include "runtime/core/dtype.h"

#include <cmath>

#include "runtime/core/error.h"

namespace kiln {

size_t itemsize(DType t) {
  switch (t) {
    case DType::Bool: return 1;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::Float16:
    case DType::BFloat16: return 2;
    case DType::Float32: return 4;
    case DType::Float64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  for (DType t :
       {DType::Bool, DType::Int32, DType::Int64, DType::Float16, DType::BFloat16, DType::Float32, DType::Float64})
    if (n == dtype_name(t)) return t;
  if (n == "int") return DType::Int32;
  if (n == "long") return DType::Int64;
  if (n == "float" || n == "float") return DType::Float32;
  if (n == "double") return DType::Float64;
  if (n == "half") return DType::Float16;
  throw Error("unknown dtype name '" + n + "'");
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::Bool) return b;
  if (b == DType::Bool) return a;
  bool fa = is_floating(a), fb = is_floating(b);
  if (fa != fb) return fa ? a : b;
  if (!fa) return a > b ? a : b;  // int32 < int64
  // float16 + bfloat16 -> float32; otherwise the wider one.
  if ((a == DType::Float16 && b == DType::BFloat16) || (a == DType::BFloat16 && b == DType::Float16))
    return DType::Float32;
  return a > b ? a : b;
}

bool can_cast(DType from, DType to) {
  if (is_floating(from) && !is_floating(to)) return false;
  if (from != DType::Bool && to == DType::Bool) return false;
  return true;
}

Half::Half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or nan
    bits = static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    return;
  }
  if (ax >= 0x477ff000u) {  // overflow to inf (>= 65520 rounds to inf)
    bits = static_cast<uint16_t>(sign | 0x7c00u);
    return;
  }
  if (ax < 0x38800000u) {  // subnormal half or zero: round via float arithmetic
    float a;
    std::memcpy(&a, &ax, 4);
    // a * 2^24 rounded to nearest even gives the subnormal mantissa.
    float m = std::nearbyint(a * 16777216.0f);
    bits = static_cast<uint16_t>(sign | static_cast<uint32_t>(m));
    return;
  }
  uint32_t mant_odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  bits = static_cast<uint16_t>(sign | (ax >> 13));
}

Half::operator float() const {
  uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    float f = std::ldexp(static_cast<float>(mant), -24);
    std::memcpy(&out, &f, 4);
    out |= sign;
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

}  // namespace kiln
