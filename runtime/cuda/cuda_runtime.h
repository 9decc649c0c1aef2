// The CUDA device runtime: per device a context, one stream that orders all of kiln's work on
// that device, and a caching allocator. Registered as the DeviceRuntime of DeviceType::CUDA
// (runtime/exec/device_runtime.h); the CUDA backend launches its kernels on the same streams.
#pragma once
#include <cuda.h>

#include <string>

namespace kiln::cu {

// Makes device `index`'s context current on the calling thread and returns its stream
// (created at first use). Throws kiln::Error when CUDA or that device is not usable.
CUstream enter(int index);

// Records the name of the kernel just queued on device `index`, so that an error found at the
// next synchronization names it.
void note_launch(int index, const std::string& kernel);

// Waits for device `index`'s stream; a failed kernel becomes a kiln::Error naming the last
// kernel queued before the failure was seen.
void sync(int index);

}  // namespace kiln::cu
