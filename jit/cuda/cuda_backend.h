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

// NVRTC's output for CUDA C++ `src` (kernel `symbol`) on a GPU of compute capability `cc`
// (90 = sm_90): a CUBIN, or PTX for the newest virtual architecture below when NVRTC does not
// know sm_<cc> (*ptx set). Needs NVRTC only, not a GPU. Throws kiln::Error quoting NVRTC's log.
std::string nvrtc_compile(const std::string& src, const std::string& symbol, int cc, bool* ptx = nullptr);
// The NVRTC options every kernel is compiled with (part of the backend's cache id).
std::string nvrtc_options_key();

}  // namespace kiln::jit
