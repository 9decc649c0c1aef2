// Scalar: a C++ number passed to an op (like a Python number in PyTorch).
#pragma once
#include <cstdint>
#include <type_traits>

#include "runtime/core/dtype.h"

namespace kiln {

// A bool, integer or floating number; takes part in type promotion by category only.
class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Int, Float };
  Scalar() = default;
  template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  Scalar(T v) {  // NOLINT: implicit from any C++ number
    if constexpr (std::is_same_v<T, bool>) {
      kind_ = Kind::Bool;
      i_ = v;
      d_ = v;
    } else if constexpr (std::is_integral_v<T>) {
      kind_ = Kind::Int;
      i_ = static_cast<int64_t>(v);
      d_ = static_cast<double>(v);
    } else {
      kind_ = Kind::Float;
      d_ = static_cast<double>(v);
      i_ = saturate(d_);
    }
  }
  Kind kind() const { return kind_; }
  double to_double() const { return d_; }
  int64_t to_int() const { return i_; }
  bool is_floating() const { return kind_ == Kind::Float; }
  // The dtype PyTorch gives a wrapped number of this kind (bool, int64, float32).
  DType default_dtype() const {
    return kind_ == Kind::Bool ? DType::Bool : kind_ == Kind::Int ? DType::Int64 : DType::Float32;
  }

 private:
  // A double as int64 without undefined behavior: truncated, saturated, NaN as 0 (to_int() of
  // a floating Scalar is never used for values; this only keeps the cast defined).
  static int64_t saturate(double v) {
    if (!(v == v)) return 0;
    if (v >= 0x1p63) return INT64_MAX;
    if (v < -0x1p63) return INT64_MIN;
    return static_cast<int64_t>(v);
  }
  Kind kind_ = Kind::Int;
  double d_ = 0;
  int64_t i_ = 0;
};

}  // namespace kiln
