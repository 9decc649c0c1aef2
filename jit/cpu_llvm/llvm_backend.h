// The LLVM backend as a Backend: the optimizing CPU tier.
#pragma once
#include <memory>

#include "jit/backend/backend.h"

namespace kiln::jit {

// A new instance (listed in jit/exec/builtin_backends.cpp).
std::unique_ptr<Backend> make_llvm_backend();

}  // namespace kiln::jit
