// PoolAllocator: the allocator of objects made and dropped at the rate of recorded ops (graph
// nodes, tensor handles, shapes). Each thread keeps short free lists of small blocks (size
// classes of 64 bytes up to 1 KiB), so steady-state recording calls no malloc; a block freed on
// another thread joins that thread's lists. The lists go back to the heap when their thread exits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <new>

#include "runtime/core/export.h"

namespace kiln::detail {

// A block of at least `bytes` (bytes > 0).
KILN_API void* pool_block(size_t bytes);
// Returns a block from pool_block(bytes).
KILN_API void pool_unblock(void* p, size_t bytes) noexcept;

template <class T>
struct PoolAllocator {
  using value_type = T;
  static_assert(alignof(T) <= alignof(std::max_align_t), "over-aligned types are not pooled");

  PoolAllocator() noexcept = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) noexcept {}  // NOLINT: rebinding

  T* allocate(size_t n) { return static_cast<T*>(pool_block(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { pool_unblock(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const PoolAllocator<U>&) const noexcept {
    return false;
  }
};

}  // namespace kiln::detail
