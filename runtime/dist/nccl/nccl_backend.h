// NCCL behind kiln's process-group interface (CUDA tensors).
#pragma once
#include <memory>
#include <string>

#include "runtime/dist/backend.h"

namespace kiln::dist::nccl_impl {
// "" when libnccl.so.2 loads and a CUDA device is usable; else why not.
std::string unavailable_reason();
std::unique_ptr<Backend> make_backend(const GroupSpec& spec);
}  // namespace kiln::dist::nccl_impl
