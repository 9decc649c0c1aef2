// The code cache: compiled kernels keyed by their target and the structural key of their group.
// In-process (thread-safe; concurrent requests for one key compile once) and on disk
// (jit/exec/disk_cache.h), keyed also by kiln version, the backend's cache id and the loop IR.
// It serves a miss through the tiering policy (jit/exec/tiering.h) and sees backends only
// through the contract (jit/backend/backend.h).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "jit/backend/backend.h"
#include "jit/exec/background.h"
#include "jit/exec/disk_cache.h"
#include "jit/loop/lower.h"

namespace kiln::jit {

struct CompiledKernel {
  std::shared_ptr<Lowered> lowered;
  std::atomic<const Code*> code{nullptr};  // the code to launch now (a background compile may swap it)
  std::shared_ptr<Code> quick;  // quick-tier code, if any (stays loaded)
  std::shared_ptr<Code> optimized;  // optimizing-tier code, once there (stays loaded)
  std::string symbol;  // the kernel's name (unique per full key)
  std::string full_key;  // the disk key
};

// Counters of the code cache.
struct CacheStats {
  uint64_t hits = 0;  // in-process hits
  uint64_t disk_hits = 0;  // loaded from disk without compiling
  uint64_t compiles = 0;  // optimizing-tier (LLVM) compilations
  uint64_t disk_rebuilds = 0;  // corrupted or mismatched disk entries replaced
  double compile_ms = 0;  // total optimizing-tier compile time
  double load_ms = 0;  // total time loading disk entries
  uint64_t quick_compiles = 0;  // kernels compiled by the quick (asmjit) tier
  double quick_compile_us = 0;  // total quick-tier compile time (code generation and loading)
  uint64_t quick_fallbacks = 0;  // kernels the quick tier could not compile (the optimizing tier took them)
  uint64_t background_swaps = 0;  // quick code replaced by optimizing code compiled in the background
  uint64_t quick_runs = 0;  // kernel launches that ran quick-tier code
  uint64_t optimized_runs = 0;  // kernel launches that ran optimizing-tier code
};
CacheStats cache_stats();
void reset_cache_stats();
// Drops the in-process cache (compiled code stays loaded); disk entries are kept.
void clear_memory_cache();

// The compiled kernel for `g` on `device` (lowering for the device's target, then the tiering
// policy on a miss).
std::shared_ptr<CompiledKernel> get_kernel(const std::string& key, const Group& g, DeviceType device = DeviceType::CPU);
// The compiled kernel for a kernel built from others' loop IR (a split reduction's combine with
// its epilogue, a horizontal kernel) by the tiering policy: kept in process and on disk, keyed
// by its IR.
std::shared_ptr<CompiledKernel> get_built_kernel(const Kernel& k, DeviceType device);
// The code to launch for `ck` now (counts the launch by tier in CacheStats).
const Code& launch_code(const CompiledKernel& ck);

}  // namespace kiln::jit
