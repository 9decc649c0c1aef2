// Element types, their C++ storage types and PyTorch's type-promotion rules.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "runtime/core/export.h"

namespace kiln {

// The element types kiln supports, in promotion order within each category.
enum class DType : uint8_t { Bool, Int32, Int64, Float16, BFloat16, Float32, Float64 };

// Size in bytes of one element.
KILN_API size_t itemsize(DType t);
// PyTorch's short name: "bool", "int32", "float32", ...
KILN_API const char* dtype_name(DType t);
// Parses a name produced by dtype_name; throws kiln::Error otherwise.
KILN_API DType dtype_from_name(const std::string& name);
inline bool is_floating(DType t) { return t >= DType::Float16; }
inline bool is_integral(DType t) { return t == DType::Int32 || t == DType::Int64; }
// float16 or bfloat16.
inline bool is_half(DType t) { return t == DType::Float16 || t == DType::BFloat16; }
// Promotion of two dtypes (torch.promote_types).
KILN_API DType promote_types(DType a, DType b);
// Whether a value of `from` may be written into `to` by an in-place op (torch.can_cast).
KILN_API bool can_cast(DType from, DType to);

// IEEE binary16 storage type; arithmetic goes through float.
struct KILN_API Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f);  // NOLINT: implicit like a builtin float conversion
  operator float() const;  // NOLINT
};
// bfloat16 storage type (upper 16 bits of a float, round to nearest even).
struct KILN_API BFloat16 {  // KILN_API: from_vector<BFloat16>, item<BFloat16> ... are exported
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) {  // NOLINT
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = 0x7fc0;
      return;
    }  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = static_cast<uint16_t>(u >> 16);
  }
  operator float() const {  // NOLINT
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// Calls f(T{}) with the C++ storage type of `t`.
template <class F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Bool: return f(bool{});
    case DType::Int32: return f(int32_t{});
    case DType::Int64: return f(int64_t{});
    case DType::Float16: return f(Half{});
    case DType::BFloat16: return f(BFloat16{});
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
  }
  return f(float{});
}

// The dtype of a C++ storage type.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<bool>() {
  return DType::Bool;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::Int32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::Int64;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::Float16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::BFloat16;
}
template <>
constexpr DType dtype_of<float>() {
  return DType::Float32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::Float64;
}

// The type arithmetic on T is carried out in (float for the 16-bit floats).
template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<Half> {
  using type = float;
};
template <>
struct compute_type<BFloat16> {
  using type = float;
};
template <class T>
using compute_t = typename compute_type<T>::type;

}  // namespace kiln
