// A size-class pool for CPU buffers: freed blocks are kept per size class and reused,
// so steady-state workloads stop calling malloc for tensor data (blocks up to 4 KiB first in a
// small per-thread cache, passing no lock). KILN_POISON=1 fills every
// block with 0xFF bytes (NaN floats) when handed out and when given back (a debug mode).
#pragma once
#include <cstddef>
#include <cstdint>

namespace kiln {

// 64-byte-aligned block of at least `nbytes` (from the pool when one is free).
void* pool_allocate(size_t nbytes);
// The bytes of the block a request of `nbytes` gets: a multiple of 64, from 512 bytes on at most
// 1/8 more than asked (eight classes a doubling).
size_t pool_block_bytes(size_t nbytes);
// Returns a block from pool_allocate(nbytes) to its class.
void pool_free(void* p, size_t nbytes);
// Bytes currently cached in the pool (free blocks), and a way to release them all.
size_t pool_cached_bytes();
void pool_release();
// (host_memory_stats, runtime/core/device.h, reads this pool's counters)

}  // namespace kiln
