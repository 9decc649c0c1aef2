// The tiering policy (KILN_JIT): which backends of a device serve a kernel the first time and
// which replace that code later. It sees backends only through the contract.
#pragma once
#include "jit/backend/backend.h"

namespace kiln::jit {

struct Tiering {
  Backend* quick = nullptr;  // serves a miss at once where it supports the kernel
  Backend* optimizing = nullptr;  // compiles what the quick tier cannot (and upgrades if set)
  bool upgrade = false;  // after the quick tier served: optimizing code in the background
  bool disk_first = true;  // a stored optimizing image beats the quick tier
};

// The policy for `device` under the current KILN_JIT mode (throws kiln::Error when the
// device has no backend).
Tiering tiering_for(DeviceType device);

// The target kernels for `device` are lowered for (the optimizing backend's).
const Target& target_for(DeviceType device);

}  // namespace kiln::jit
