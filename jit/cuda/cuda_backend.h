// The CUDA backend: loop IR -> CUDA C++ (emit_cuda.h) -> NVRTC -> CUBIN for the device's
// architecture, loaded and launched through the Driver API (driver.h). Device 0 only for now.
#pragma once
#include <memory>
#include <string>

#include "jit/backend/backend.h"

namespace kiln::jit {

// A new instance, or null when no CUDA device is usable (cuda::available() is false): listed
// in jit/exec/builtin_backends.cpp only then.
std::unique_ptr<Backend> make_cuda_backend();

// What lowering produces for a GPU of compute capability `cc` (the backend's target):
// "cuda-sm<cc>", one thread per parallel index (DeviceGrid), one element of a long last dim
// (tile 1) and one column of a column reduction per index, float16/bfloat16 rejected.
Target cuda_target(int cc);


}  // namespace kiln::jit
