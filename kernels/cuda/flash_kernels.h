// CUDA source of the tensor-core attention kernels for bfloat16 / float16 inputs
// (kernels/cuda/flash_kernels.cpp): forward, dk/dv and dq on mma.sync (sm_80 and later), templated
// on the 16-bit type and a head-size bucket, instanced by the device kernels' program builder
// (device_kernels.h) after attention_common_source().
#pragma once
#include <cstdint>

#include "kernels/cuda/device_kernels.h"

namespace kiln::kernels {

// The templates and the KILN_FLASH(name, kernel, is_bfloat16, bucket) instancing macro; each
// kernel takes one AttnArgs by value and runs 128 threads per block.
const char* flash_kernel_source();
// The head-size bucket of head size d (1..256): d rounded up to a multiple of 32.
int flash_head_bucket(int64_t d);
// Gradient columns per block of a bucket (the backward's blockIdx.z covers bucket / this).
int flash_columns(int bucket);
// Tiles in flight in the kernels' pipelines (2 up to bucket 128, else 1).
int flash_stages(int bucket);
// Dynamic shared memory of flash kernel `k` for a bucket.
int64_t flash_shared_bytes(DeviceKernel k, int bucket);
// Rows (query rows; keys for dk/dv) a block of flash kernel `k` takes (its grid's y covers them).
int flash_rows_per_block(DeviceKernel k, int bucket);
// Bytes of the backward's work area (dO, lse and delta per query row) for `batch`
// batch elements of `tq` query rows.
int64_t flash_work_bytes(int64_t batch, int64_t tq, int bucket);

}  // namespace kiln::kernels
