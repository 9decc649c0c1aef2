// The code cache: compiled kernels keyed by the structural key of their group. In-process
// (thread-safe; concurrent requests for one key compile once) and on disk under
// $KILN_CACHE_DIR (default ~/.cache/kiln), keyed also by kiln version, LLVM version and CPU.
// Tiers (KILN_JIT): tiered (default) serves a miss from disk, else with asmjit code at once
// and swaps in LLVM code compiled in the background; asmjit: asmjit where it can; llvm: LLVM.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "jit/cpu_llvm/codegen_llvm.h"
#include "jit/loop/lower.h"

namespace kiln::jit {

struct CompiledKernel {
  std::shared_ptr<Lowered> lowered;
  std::atomic<KernelFn> fn{nullptr};  // the code to run now (a background compile may swap it)
  KernelFn asmjit_fn = nullptr;       // the asmjit code, if any (stays loaded)
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
  uint64_t asmjit_compiles = 0;     // kernels compiled by the asmjit tier
  double asmjit_compile_us = 0;     // total asmjit compile time (code generation and loading)
  uint64_t asmjit_fallbacks = 0;    // kernels asmjit could not compile (LLVM took them)
  uint64_t background_swaps = 0;    // asmjit kernels replaced by LLVM code compiled in the background
  uint64_t asmjit_runs = 0;         // kernel launches that ran asmjit code
  uint64_t llvm_runs = 0;           // kernel launches that ran LLVM code
};
CacheStats cache_stats();
void reset_cache_stats();
// Drops the in-process cache (compiled code stays loaded); disk entries are kept.
void clear_memory_cache();
// The on-disk cache directory ("" if disabled with KILN_CACHE_DIR=off).
std::string cache_dir();

// The compiled kernel for `g` (lowering, then disk, asmjit or LLVM on a miss, per KILN_JIT).
std::shared_ptr<CompiledKernel> get_kernel(const std::string& key, const Group& g);
// The code to launch for `ck` now (counts the launch by tier in CacheStats).
KernelFn launch_fn(const CompiledKernel& ck);
// Blocks until every queued background LLVM compile has finished (and swapped its kernel in).
void wait_background_compiles();
// Tests: while held, queued background compiles do not start (wait_background_compiles would block).
void hold_background_compiles(bool hold);

}  // namespace kiln::jit
