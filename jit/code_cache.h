// The code cache: compiled kernels keyed by the structural key of their group. In-process
// (thread-safe; concurrent requests for one key compile once) and on disk under
// $KILN_CACHE_DIR (default ~/.cache/kiln), keyed also by kiln version, LLVM version and CPU.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "jit/codegen_llvm.h"
#include "jit/lower.h"

namespace kiln::jit {

struct CompiledKernel {
  std::shared_ptr<Lowered> lowered;
  KernelFn fn = nullptr;
  std::string symbol;
};

// Counters of the code cache.
struct CacheStats {
  uint64_t hits = 0;          // in-process hits
  uint64_t disk_hits = 0;     // loaded from disk without compiling
  uint64_t compiles = 0;      // LLVM compilations
  uint64_t disk_rebuilds = 0; // corrupted or mismatched disk entries replaced
  double compile_ms = 0;      // total LLVM compile time
  double load_ms = 0;         // total time loading disk entries
};
CacheStats cache_stats();
void reset_cache_stats();
// Drops the in-process cache (compiled code stays loaded); disk entries are kept.
void clear_memory_cache();
// The on-disk cache directory ("" if disabled with KILN_CACHE_DIR=off).
std::string cache_dir();

// The compiled kernel for `g` (lowering, then disk or LLVM on a miss).
std::shared_ptr<CompiledKernel> get_kernel(const std::string& key, const Group& g);

}  // namespace kiln::jit
