#include "runtime/exec/buffer_pool.h"

#include <atomic>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/error.h"

namespace kiln {
namespace {

constexpr int kClasses = 48;
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
  int c = 6;  // 64 bytes
  while ((size_t(1) << c) < nbytes) ++c;
  return c;
}

// Blocks of up to 4 KiB also wait in a small per-thread cache, so the small tensors of eager
// code pass no lock. A thread's cache goes back to the pool when the thread exits.
constexpr int kLocalClasses = 13;  // classes 6..12 (64 B .. 4 KiB)
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
    if (p.free[c].size() < kMaxCachedPerClass && p.cached + (size_t(1) << c) <= kMaxCachedBytes) {
      p.free[c].push_back(b);
      p.cached += size_t(1) << c;
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

void reset_peak_host_memory_stats() { g_peak.store(g_allocated.load()); }

void* pool_allocate(size_t nbytes) {
  int c = size_class(nbytes == 0 ? 1 : nbytes);
  KILN_CHECK(c < kClasses, "allocation of ", nbytes, " bytes is too large");
  count_allocation(int64_t{1} << c);
  if (c < kLocalClasses) {
    LocalCache& l = t_local;
    if (l.count[c] > 0) {
      void* b = l.blocks[c][--l.count[c]];
      if (poison()) std::memset(b, 0xFF, size_t(1) << c);
      return b;
    }
  }
  {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mu);
    if (!p.free[c].empty()) {
      void* b = p.free[c].back();
      p.free[c].pop_back();
      p.cached -= size_t(1) << c;
      if (poison()) std::memset(b, 0xFF, size_t(1) << c);
      return b;
    }
  }
  void* b = std::aligned_alloc(64, size_t(1) << c);
  KILN_CHECK(b != nullptr, "out of memory allocating ", nbytes, " bytes");
  if (poison()) std::memset(b, 0xFF, size_t(1) << c);
  return b;
}

void pool_free(void* b, size_t nbytes) {
  int c = size_class(nbytes == 0 ? 1 : nbytes);
  g_allocated.fetch_sub(int64_t{1} << c, std::memory_order_relaxed);
  g_frees.fetch_add(1, std::memory_order_relaxed);
  if (poison()) std::memset(b, 0xFF, size_t(1) << c);
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
