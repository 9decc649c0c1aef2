// The asmjit backend as a Backend: the quick CPU tier (its code is not stored on disk).
#pragma once
#include <memory>

#include "jit/backend/backend.h"

namespace kiln::jit {

// A new instance (listed in jit/exec/builtin_backends.cpp).
std::unique_ptr<Backend> make_asmjit_backend();

}  // namespace kiln::jit
