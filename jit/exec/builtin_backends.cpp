// The backends of this build per device, quick tiers first. Adding a backend: one line here.
#include "jit/cpu_asmjit/asmjit_backend.h"
#include "jit/cpu_llvm/llvm_backend.h"
#ifdef KILN_CUDA
#include "jit/cuda/cuda_backend.h"
#include "jit/diag/diagnostics.h"
#endif

namespace kiln::jit {

std::vector<std::unique_ptr<Backend>> builtin_backends(DeviceType device) {
  std::vector<std::unique_ptr<Backend>> v;
  if (device == DeviceType::CPU) {
    v.push_back(make_asmjit_backend());
    v.push_back(make_llvm_backend());
  }
#ifdef KILN_CUDA
  if (device == DeviceType::CUDA) {  // only where a driver and a device are found
    try {
      if (auto cuda = make_cuda_backend()) v.push_back(std::move(cuda));
    } catch (const std::exception& e) {
      log_line("jit", std::string("CUDA backend disabled: ") + e.what());
    }
  }
#endif
  return v;
}

}  // namespace kiln::jit
