#include "runtime/exec/buffer_pool.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/exec/memory_ledger.h"

namespace kiln {
namespace {

// Size classes: multiples of 64 bytes up to 512, then eight a doubling, (2^k, 2^(k+1)] in
// steps of 2^(k-3) (jemalloc's spacing): a block of 512 bytes or more wastes at most 1/8 of
// itself to rounding (powers of two wasted up to half), and every block stays a multiple of
// the 64-byte alignment. Up to 2^47 bytes.
constexpr int kClasses = 8 + 8 * (47 - 9);
constexpr size_t kMaxCachedPerClass = 64;  // blocks
constexpr size_t kMaxCachedBytes = size_t(1) << 30;  // total

struct Pool {
  std::mutex mu;
  std::vector<void*> free[kClasses];
  size_t cached = 0;
};
Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: buffers may be freed during static teardown
  return *p;
}

// KILN_POISON=1: every block handed out and every block given back is filled with 0xFF
// bytes (NaN as floats, -1 as ints), so a read of memory nothing wrote, or of a buffer
// after its release, shows in results.
bool poison() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_POISON");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

int size_class(size_t nbytes) {
  if (nbytes <= 512) return static_cast<int>((std::max<size_t>(nbytes, 1) + 63) / 64) - 1;
  const int k = std::bit_width(nbytes - 1) - 1;  // 2^k < nbytes <= 2^(k+1), k >= 9
  const size_t step = size_t{1} << (k - 3);
  const size_t j = (nbytes - (size_t{1} << k) + step - 1) / step;  // 1..8
  return 8 + 8 * (k - 9) + static_cast<int>(j) - 1;
}
size_t class_bytes(int c) {
  if (c < 8) return 64 * static_cast<size_t>(c + 1);
  const int k = 9 + (c - 8) / 8;
  return (size_t{1} << k) + static_cast<size_t>((c - 8) % 8 + 1) * (size_t{1} << (k - 3));
}

// Blocks of up to 4 KiB also wait in a small per-thread cache, so the small tensors of eager
// code pass no lock. A thread's cache goes back to the pool when the thread exits.
constexpr int kLocalClasses = 32;  // classes 0..31 (64 B .. 4 KiB)
constexpr int kLocalBlocks = 4;
void give_back(int c, void* b);
struct LocalCache {  // trivially destructible: usable until the thread is gone
  void* blocks[kLocalClasses][kLocalBlocks];
  int count[kLocalClasses];
  bool armed;  // the flusher below is registered for this thread
  bool dead;  // the thread is exiting: blocks bypass the cache
};
thread_local LocalCache t_local = {};
// Destroyed at thread exit: returns the cached blocks to the pool.
struct Flusher {
  ~Flusher() {
    LocalCache& l = t_local;
    l.dead = true;
    for (int c = 0; c < kLocalClasses; ++c)
      while (l.count[c] > 0) give_back(c, l.blocks[c][--l.count[c]]);
  }
};
thread_local Flusher t_flusher;

// Returns a block of class c to the shared pool (or the heap when the pool is full).
void give_back(int c, void* b) {
  Pool& p = pool();
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.free[c].size() < kMaxCachedPerClass && p.cached + class_bytes(c) <= kMaxCachedBytes) {
      p.free[c].push_back(b);
      p.cached += class_bytes(c);
      return;
    }
  }
  std::free(b);
}

}  // namespace

namespace {
// Host memory counters (kiln::host_memory_stats): bytes of tensor data handed out now and at
// the peak, in the pool's size classes (a block's whole class counts, as the CUDA allocator
// counts rounded sizes).
std::atomic<int64_t> g_allocated{0}, g_peak{0}, g_allocs{0}, g_frees{0};

void count_allocation(int64_t bytes) {
  const int64_t now = g_allocated.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
}  // namespace

MemoryStats host_memory_stats() {
  MemoryStats s;
  s.allocated_bytes = g_allocated.load();
  s.peak_allocated_bytes = g_peak.load();
  s.cached_bytes = static_cast<int64_t>(pool_cached_bytes());
  s.reserved_bytes = s.allocated_bytes + s.cached_bytes;
  s.num_allocs = g_allocs.load();
  s.num_frees = g_frees.load();
  return s;
}

void reset_peak_host_memory_stats() {
  g_peak.store(g_allocated.load());
  if (memory_ledger_on()) memory_ledger_reset_peak(cpu());
}

void* pool_allocate(size_t nbytes) {
  KILN_CHECK(nbytes <= (size_t{1} << 47), "allocation of ", nbytes, " bytes is too large");
  const int c = size_class(nbytes);
  const size_t bytes = class_bytes(c);
  count_allocation(static_cast<int64_t>(bytes));
  if (c < kLocalClasses) {
    LocalCache& l = t_local;
    if (l.count[c] > 0) {
      void* b = l.blocks[c][--l.count[c]];
      if (poison()) std::memset(b, 0xFF, bytes);
      return b;
    }
  }
  {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mu);
    if (!p.free[c].empty()) {
      void* b = p.free[c].back();
      p.free[c].pop_back();
      p.cached -= bytes;
      if (poison()) std::memset(b, 0xFF, bytes);
      return b;
    }
  }
  void* b = std::aligned_alloc(64, bytes);
  KILN_CHECK(b != nullptr, "out of memory allocating ", nbytes, " bytes");
  if (poison()) std::memset(b, 0xFF, bytes);
  return b;
}

void pool_free(void* b, size_t nbytes) {
  const int c = size_class(nbytes);
  g_allocated.fetch_sub(static_cast<int64_t>(class_bytes(c)), std::memory_order_relaxed);
  g_frees.fetch_add(1, std::memory_order_relaxed);
  if (poison()) std::memset(b, 0xFF, class_bytes(c));
  if (c < kLocalClasses) {
    LocalCache& l = t_local;
    if (!l.armed) {
      l.armed = true;
      (void)&t_flusher;  // constructs it: its destructor flushes this thread's cache
    }
    if (!l.dead && l.count[c] < kLocalBlocks) {
      l.blocks[c][l.count[c]++] = b;
      return;
    }
  }
  give_back(c, b);
}

size_t pool_block_bytes(size_t nbytes) { return class_bytes(size_class(nbytes)); }

size_t pool_cached_bytes() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  return p.cached;
}

void pool_release() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  for (auto& v : p.free) {
    for (void* b : v) std::free(b);
    v.clear();
  }
  p.cached = 0;
}

}  // namespace kiln
