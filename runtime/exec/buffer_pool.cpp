#include "runtime/exec/buffer_pool.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "runtime/core/error.h"

namespace kiln {
namespace {

constexpr int kClasses = 48;
constexpr size_t kMaxCachedPerClass = 64;          // blocks
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

}  // namespace

void* pool_allocate(size_t nbytes) {
  int c = size_class(nbytes == 0 ? 1 : nbytes);
  KILN_CHECK(c < kClasses, "allocation of ", nbytes, " bytes is too large");
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
  if (poison()) std::memset(b, 0xFF, size_t(1) << c);
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
