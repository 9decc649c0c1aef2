// CUDA source of the fused attention kernels (kernels/cuda/attention_kernels.cpp): forward,
// dq and dk/dv, templated on the element type and a head-size bucket, instanced by the device
// kernels' program builder (device_kernels.h).
#pragma once

namespace kiln::kernels {

// What every attention program starts with: the AttnArgs block (mirrored on the host by
// runtime/cuda/device_ops.cpp), the dropout stream (Philox, as kernels/cpu/attention_dropout.h),
// batch offsets.
const char* attention_common_source();
// The templates and the KILN_ATTENTION(name, kernel, type, bucket) instancing macro. Each
// kernel takes one AttnArgs by value (mirrored on the host by runtime/cuda/device_ops.cpp).
const char* attention_kernel_source();

}  // namespace kiln::kernels
