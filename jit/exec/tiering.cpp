#include "jit/exec/tiering.h"

#include "jit/exec/jit_executor.h"
#include "runtime/core/error.h"

namespace kiln::jit {

Tiering tiering_for(DeviceType device) {
  Tiering t;
  t.optimizing = find_backend(device, Tier::Optimizing);
  Backend* quick = find_backend(device, Tier::Quick);
  if (!t.optimizing && !quick)
    throw Error(std::string("no JIT backend for device type ") + (device == DeviceType::CPU ? "cpu" : "cuda"));
  switch (jit_mode()) {
    case JitMode::Llvm:  // the optimizing tier only
      if (!t.optimizing) t.optimizing = quick;
      break;
    case JitMode::Asmjit:  // the quick tier where it can; no disk, no upgrade (tests that tier)
      t.quick = quick;
      t.disk_first = false;
      break;
    case JitMode::Tiered:
    case JitMode::Interp:
      t.quick = quick;
      t.upgrade = quick && t.optimizing;
      break;
  }
  if (!t.optimizing) t.optimizing = t.quick;
  return t;
}

const Target& target_for(DeviceType device) {
  Tiering t = tiering_for(device);
  return t.optimizing->target();
}

}  // namespace kiln::jit
