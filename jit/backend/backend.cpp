#include "jit/backend/backend.h"

#include <mutex>

#include "runtime/core/error.h"

namespace kiln::jit {

// Defined by the build's backend list (jit/exec/builtin_backends.cpp).
std::vector<std::unique_ptr<Backend>> builtin_backends();

void Backend::run_range(const Code&, int64_t, int64_t, const Launch&) const {
  throw Error(std::string("backend ") + name() + " cannot run part of a kernel on the calling thread");
}

const std::vector<Backend*>& backends() {
  // Leaked on purpose: backends hold code that background compiles and exit handlers may use.
  static const std::vector<Backend*>* list = [] {
    auto* v = new std::vector<Backend*>();
    for (auto& b : builtin_backends()) v->push_back(b.release());
    return v;
  }();
  return *list;
}

Backend* find_backend(DeviceType device, Tier tier) {
  for (Backend* b : backends())
    if (b->device() == device && b->tier() == tier) return b;
  return nullptr;
}

}  // namespace kiln::jit
