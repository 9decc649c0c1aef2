// Which kernels scaled_dot_product_attention may use, as torch.nn.attention.sdpa_kernel.
//   - Auto (the default): kiln's fused attention kernels (which never store the scores) on the
//     CPU, and on CUDA for bfloat16, float16 and float32 inputs where the device has the
//     tensor-core kernels (sm_80 and later; float32 in TF32 under set_float32_matmul_precision
//     "high"/"medium", else 3xTF32, float32-accurate); elsewhere on CUDA the materialized graph —
//     batched GEMMs around one fused softmax, the scores stored for the backward — where the
//     Tq x Tk scores take under 1 GiB and every size is known, the fused kernels beyond that.
//   - Math: always the materialized graph softmax(q·kᵀ·scale + mask)·v.
//   - Fused: kiln's fused kernels wherever they apply (head size up to 256, a mask without
//     gradient); elsewhere the graph, as under Auto.
// The choice holds on this thread while the guard lives, also for the pattern that rewrites
// hand-written attention into scaled_dot_product_attention. Inside kiln::compile it is part of
// the guards: another backend selects another compiled entry. Guards nest.
//
//   { kiln::sdpa_kernel k(kiln::SdpaBackend::Math); y = scaled_dot_product_attention(q, k, v); }
#pragma once
#include <cstdint>

#include "runtime/core/export.h"

namespace kiln {

enum class SdpaBackend : uint8_t { Auto = 0, Math = 1, Fused = 2 };

class KILN_API sdpa_kernel {
 public:
  explicit sdpa_kernel(SdpaBackend backend);
  ~sdpa_kernel();
  sdpa_kernel(const sdpa_kernel&) = delete;
  sdpa_kernel& operator=(const sdpa_kernel&) = delete;

 private:
  SdpaBackend was_;
};

// This thread's backend choice.
KILN_API SdpaBackend current_sdpa_backend();

}  // namespace kiln
