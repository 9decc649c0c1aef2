// CUDA source of the tensor-core attention kernels for bfloat16, float16 and float32 inputs
// (kernels/cuda/flash_kernels.cpp): forward, dk/dv and dq on mma.sync (sm_80 and later), templated
// on the element type (float32: TF32 or 3xTF32 products) and a head-size bucket, instanced by the
// device kernels' program builder (device_kernels.h) after attention_common_source().
#pragma once
#include <cstdint>
#include <string>

#include "kernels/cuda/device_kernels.h"

namespace kiln::kernels {

// The templates and the KILN_FLASH(name, kernel, element, bucket) instancing macro (element:
// Half<is_bfloat16> or Tf32<passes>, flash_element); each kernel takes one AttnArgs by value and
// runs flash_threads threads per block. The *_wg instances compile for sm_90a alone.
const char* flash_kernel_source();
// The source's element type of an instance: Half<true>, Half<false>, Tf32<1>, Tf32<3> or
// Tf32Careful (3xTF32 with each tile checked for infinities and NaN).
std::string flash_element(const DeviceKernelInstance& k);
// The head-size bucket of head size d (1..256): d rounded up to a multiple of 32.
int flash_head_bucket(int64_t d);
// Gradient columns per block of a bucket (the backward's blockIdx.z covers bucket / this).
int flash_columns(int bucket);
// Tiles in flight in the kernels' pipelines (2 up to bucket 128, else 1).
int flash_stages(int bucket);
// Dynamic shared memory of flash kernel `k` for a bucket and element size (2: bfloat16/float16,
// 4: float32), and the most of the forward and backward kernels.
int64_t flash_shared_bytes(DeviceKernel k, int bucket, int64_t item);
int64_t flash_most_shared_bytes(int bucket, int64_t item);
// Threads a block of flash kernel `k` runs (128; the warpgroup kernels 256).
int flash_threads(DeviceKernel k);
// Rows (query rows; keys for dk/dv) a block of flash kernel `k` takes (its grid's y covers them).
int flash_rows_per_block(DeviceKernel k, int bucket);
// Bytes of the backward's work area (dO, lse and delta per query row) for `batch`
// batch elements of `tq` query rows of `item`-byte elements.
int64_t flash_work_bytes(int64_t batch, int64_t tq, int bucket, int64_t item);

}  // namespace kiln::kernels
