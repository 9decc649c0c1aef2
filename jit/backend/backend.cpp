#include "jit/backend/backend.h"

#include <algorithm>
#include <mutex>

#include "runtime/core/error.h"

namespace kiln::jit {

size_t launch_arg_bytes(const Kernel& k) {
  return 16 + 8 * (std::max<size_t>(k.buffers.size(), 1) + static_cast<size_t>(std::max(k.num_params, 1)) +
                   static_cast<size_t>(std::max(k.num_fparams, 1)));
}

// Defined by the build's backend list (jit/exec/builtin_backends.cpp).
std::vector<std::unique_ptr<Backend>> builtin_backends(DeviceType device);

void Backend::run_range(const Code&, int64_t, int64_t, const Launch&) const {
  throw Error(std::string("backend ") + name() + " cannot run part of a kernel on the calling thread");
}

const std::vector<Backend*>& backends(DeviceType device) {
  // Leaked on purpose: backends hold code that background compiles and exit handlers may use.
  static std::vector<Backend*>* lists[2] = {nullptr, nullptr};
  static std::once_flag once[2];
  const int d = device == DeviceType::CPU ? 0 : 1;
  std::call_once(once[d], [&] {
    auto* v = new std::vector<Backend*>();
    for (auto& b : builtin_backends(device)) v->push_back(b.release());
    lists[d] = v;
  });
  return *lists[d];
}

Backend* find_backend(DeviceType device, Tier tier) {
  for (Backend* b : backends(device))
    if (b->tier() == tier) return b;
  return nullptr;
}

}  // namespace kiln::jit
