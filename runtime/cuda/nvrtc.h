// NVRTC, the in-process CUDA C++ compiler (loaded at run time, driver.h): generated kernels
// (jit/cuda) and the device runtime's library kernels compile through here.
#pragma once
#include <string>

namespace kiln::cu {

// NVRTC's output for CUDA C++ `src` (kernel `symbol`) on a GPU of compute capability `cc`
// (90 = sm_90): a CUBIN, or PTX for the newest virtual architecture below when NVRTC does not
// know sm_<cc> (*ptx set). Needs NVRTC only, not a GPU. Throws kiln::Error quoting NVRTC's log.
// KILN_LOG=codegen prints each compile's time. `arch_specific`: for sm_<cc>a (the architecture's
// own instructions, e.g. sm_90a's wgmma; a CUBIN that runs on compute capability cc alone), an
// error where NVRTC does not know sm_<cc>.
std::string nvrtc_compile(const std::string& src, const std::string& symbol, int cc, bool* ptx = nullptr,
                          bool arch_specific = false);
// The NVRTC options every kernel is compiled with (part of the backends' cache ids).
std::string nvrtc_options_key();

}  // namespace kiln::cu
