// How ops apply kiln::autocast (runtime/ops/autocast.h): each op with a place in PyTorch's lists
// opens an AutocastOp over its tensor inputs at its entry, which casts them by its policy and
// turns autocast off for the op's body, so the ops it is composed of (softmax's exp and sum,
// mean's sum) cast nothing more. Internal to runtime/.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "runtime/tensor/tensor.h"

namespace kiln::detail {

enum class AutocastPolicy {
  Body,  // no cast: only the body runs without autocast (a composite op not in the lists)
  Lower,  // floating inputs to the autocast dtype (GEMMs, convolution, attention)
  Float32,  // 16-bit floating inputs to float32, on every device type
  Float32OnCuda,  // the same on CUDA only (the CPU lists keep these ops in the input dtype)
};

// Applies `policy` to `inputs` (at most kMaxInputs; null: an absent optional input) under this
// thread's autocast state for their device type, for the lifetime of the object; operator[]
// gives input i as the op must use it. Without autocast it allocates nothing.
class AutocastOp {
 public:
  static constexpr size_t kMaxInputs = 4;
  AutocastOp(AutocastPolicy policy, std::initializer_list<const Tensor*> inputs);
  ~AutocastOp();
  const Tensor& operator[](size_t i) const { return cast_ && (*cast_)[i].defined() ? (*cast_)[i] : *in_[i]; }
  // Input i of an optional argument, as the op must use it (nullopt when it was absent).
  std::optional<Tensor> optional(size_t i) const { return in_[i] ? std::optional<Tensor>((*this)[i]) : std::nullopt; }
  // An optional argument as an input pointer (null when absent).
  static const Tensor* input(const std::optional<Tensor>& t) { return t ? &*t : nullptr; }
  AutocastOp(const AutocastOp&) = delete;
  AutocastOp& operator=(const AutocastOp&) = delete;

 private:
  std::array<const Tensor*, kMaxInputs> in_{};
  std::unique_ptr<std::array<Tensor, kMaxInputs>> cast_;  // only while autocast is on
  bool excluded_ = false;
};

// Autocast off while alive (the autograd engine runs backward under one).
class AutocastOff {
 public:
  AutocastOff();
  ~AutocastOff();
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;

 private:
  bool was_excluded_ = false;
};

// This thread's autocast state set to `key` (an autocast_key()) while alive, exclusion lifted,
// then put back: a recomputation (kiln::checkpoint's backward) runs under the autocast its
// forward ran under, wherever the backward is called from.
class AutocastAs {
 public:
  explicit AutocastAs(uint32_t key);
  ~AutocastAs();
  AutocastAs(const AutocastAs&) = delete;
  AutocastAs& operator=(const AutocastAs&) = delete;

 private:
  uint32_t was_key_;  // (the enabled device types and their dtypes)
  bool was_excluded_;
  uint8_t was_dtype_[2];  // per device type, also where it was not enabled
};

// This thread's autocast state as one number (0: off everywhere), for compile()'s guards.
KILN_API uint32_t autocast_key();
// The same in words ("off", "cuda bfloat16", ...).
KILN_API std::string autocast_key_str(uint32_t key);

}  // namespace kiln::detail
