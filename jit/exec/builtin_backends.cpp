// The backends of this build, quick tiers first. Adding a backend: one line here.
#include "jit/cpu_asmjit/asmjit_backend.h"
#include "jit/cpu_llvm/llvm_backend.h"

namespace kiln::jit {

std::vector<std::unique_ptr<Backend>> builtin_backends() {
  std::vector<std::unique_ptr<Backend>> v;
  v.push_back(make_asmjit_backend());
  v.push_back(make_llvm_backend());
  return v;
}

}  // namespace kiln::jit
