// Host code: what CPU backends produce (a KernelFn) and how it is launched — the CPU's "grid"
// is chunks of the parallel index on TBB, sized so each chunk holds enough work.
#pragma once
#include "jit/backend/backend.h"

namespace kiln::jit {

// A host function of the kernel ABI.
struct HostCode : Code {
  KernelFn fn = nullptr;
};

// Runs every parallel index of `launch` with `fn`: inline when the launch is small, else in
// TBB chunks (kiln's pool, never more threads than its concurrency).
void launch_host(KernelFn fn, const Launch& launch);

// The target of host backends: chunks on TBB, tiles sized for the caches, AVX2 vectors.
const Target& host_target();

// A backend whose code is host code: launch() and run_range() call its KernelFn.
class HostBackend : public Backend {
 public:
  DeviceType device() const override { return DeviceType::CPU; }
  const Target& target() const override { return host_target(); }
  void launch(const Code& code, const Launch& launch) const override;
  void run_range(const Code& code, int64_t begin, int64_t end, const Launch& launch) const override;

 protected:
  // Wraps `fn` as this backend's code.
  std::shared_ptr<Code> wrap(KernelFn fn) const;
};

}  // namespace kiln::jit
