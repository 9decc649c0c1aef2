// The CUDA backend: loop IR -> CUDA C++ (emit_cuda.h) -> NVRTC -> CUBIN for the device's
// architecture, loaded and launched through the Driver API on device 0's stream
// (runtime/cuda). Generated kernels run on device 0 only for now.
#pragma once
#include <memory>
#include <string>

#include "jit/backend/backend.h"

namespace kiln::jit {

// A new instance, or null when no CUDA device is usable (cuda::available() is false): listed
// in jit/exec/builtin_backends.cpp only then.
std::unique_ptr<Backend> make_cuda_backend();

// What lowering produces for a GPU of compute capability `cc` (the backend's target):
// "cuda-sm<cc>", DeviceGrid (a thread per index; reduction kernels a warp), one element of a
// long last dim per index (tile 1), no column mode, split reductions in up to 4096 chunks,
// schedules that recompute when that moves fewer bytes, float16/bfloat16 rejected.
Target cuda_target(int cc);

}  // namespace kiln::jit
