// Mixed precision, as torch.autocast. While a kiln::autocast guard lives on a thread, ops on
// tensors of its device type run in a lower precision where PyTorch's autocast lists say that is
// safe, and in float32 where range or accuracy needs it:
//   - in `dtype` (bfloat16 or float16), both devices: matmul, mm, bmm, linear, conv2d,
//     scaled_dot_product_attention;
//   - in float32 on CUDA: softmax, log_softmax, layer_norm, exp, expm1, log, log2, log1p, rsqrt,
//     reciprocal, tan, pow, softplus, sum, prod, cumsum, cumprod, logsumexp, norm, and the losses
//     (cross_entropy, mse_loss, smooth_l1_loss);
//   - in float32 on the CPU: prod and the losses;
//   - every other op runs in the dtype of its inputs, mixed inputs promoted as usual (add of a
//     float32 and a bfloat16 tensor gives float32).
// Only float32, float16 and bfloat16 inputs are cast (float64 and integers never are). Casts are
// ordinary differentiable ops: a parameter's gradient comes back in its own dtype. The backward
// pass runs without autocast (its ops take the dtypes their forward ops had), as in PyTorch.
// Inside kiln::compile the autocast state is part of the guards: entering or leaving a guard
// selects another compiled entry. Guards nest; each restores the state it found.
//
//   {
//     kiln::autocast ac(kiln::DeviceType::CUDA, kiln::DType::BFloat16);
//     Tensor loss = cross_entropy(model(x), y);   // GEMMs in bfloat16, the loss in float32
//   }
//   loss.backward();
#pragma once
#include <cstdint>

#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/export.h"

#define KILN_HAS_AUTOCAST 1

namespace kiln {

class KILN_API autocast {
 public:
  // Autocast for `device_type` in `dtype` (BFloat16 or Float16; else kiln::Error), or, with
  // enabled = false, autocast turned off for it inside the guard.
  autocast(DeviceType device_type, DType dtype, bool enabled = true);
  // PyTorch's default dtype: float16 on CUDA, bfloat16 on the CPU.
  explicit autocast(DeviceType device_type);
  ~autocast();
  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;

 private:
  DeviceType type_;
  bool was_enabled_;
  DType was_dtype_;
};

// Whether autocast is on for `device_type` on this thread, and the dtype it lowers to.
KILN_API bool is_autocast_enabled(DeviceType device_type);
KILN_API DType get_autocast_dtype(DeviceType device_type);

}  // namespace kiln
