// The kernel ABI: the one calling convention every host (CPU) backend compiles to and the
// executor binds arguments for. A device backend (CUDA) keeps the same argument order and
// passes the same three arrays to its kernels.
#pragma once
#include <cstdint>

namespace kiln::jit {

// A compiled host kernel: runs parallel indices [begin, end) of its parallel range.
//   buffers: the Lowered buffer order (inputs, outputs, then scratch), element 0 of each;
//   iparams: int64 runtime parameters (sizes, strides, chunking), per Lowered::iparams;
//   fparams: double runtime parameters (scalars), per Lowered::fparams.
using KernelFn = void (*)(int64_t begin, int64_t end, char* const* buffers, const int64_t* iparams,
                          const double* fparams);

}  // namespace kiln::jit
