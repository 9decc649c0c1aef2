// CachingAllocator: the allocator of one CUDA device's memory, modelled on PyTorch's
// CUDACachingAllocator. It takes memory from RawMemory (cuMemAlloc) in segments and keeps freed
// blocks to hand out again; segments go back to RawMemory only through empty_cache(), on
// out-of-memory, or when the allocator is destroyed.
//
// Requests round up to 512 bytes. Those up to 1 MiB come from a small pool of 2 MiB segments;
// larger ones from a large pool of 20 MiB segments (requests under 10 MiB) or segments of the
// request's own size rounded up to 2 MiB. A request takes the smallest free block of its pool
// that fits (then the lowest address), split when the rest is worth keeping (>= 512 B in the
// small pool; in the large, > 1 MiB or > 1/7 of the request, so that no block is more than 1/8
// larger than its request rounded to 512); a freed block merges with its free neighbours.
//
// Stream order: kiln runs all of a device's kernels on one stream, in order, so a freed block may
// be handed out again at once: its next user's kernels run after every kernel of the last user.
// No events are recorded; memory used on another stream would need them.
//
// Thread-safe: one mutex serializes every call (RawMemory is called with it held).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "runtime/core/device.h"

namespace kiln::cu {

// The device memory underneath: whole segments, allocated and freed.
struct RawMemory {
  virtual ~RawMemory();
  // A segment of `bytes`, 512-byte aligned; null when the device is out of memory.
  virtual void* alloc(size_t bytes) = 0;
  // Returns a segment from alloc().
  virtual void free(void* p) = 0;
  // The device's capacity in bytes, for messages; 0 = unknown.
  virtual size_t total_bytes() const = 0;
};

// The allocator's counters: kiln::MemoryStats (runtime/core/device.h; byte counts are of
// requests rounded up to 512).
using kiln::MemoryStats;

class CachingAllocator {
 public:
  // An allocator over `raw`; `device_name` ("cuda:0") names the device in messages.
  CachingAllocator(std::unique_ptr<RawMemory> raw, std::string device_name);
  // Returns every segment to RawMemory; pointers still live become invalid.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes`, 512-byte aligned within its segment; null for 0 bytes.
  // Throws kiln::Error when the device is out of memory.
  void* allocate(size_t bytes);
  // Returns a block from allocate(); null is a no-op. Throws kiln::Error for any other pointer.
  void free(void* p);
  // The counters now.
  MemoryStats stats() const;
  // Sets the peaks to the current values.
  void reset_peak_stats();
  // Returns every fully free segment to RawMemory.
  void empty_cache();
  // The size of the live block at `p` (>= the request rounded up to 512).
  size_t block_size(void* p) const;
  // Whether `p` lies inside one of this allocator's segments.
  bool owns(const void* p) const;

 private:
  struct Block;
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BySizeThenAddress>;

  Block* new_segment(size_t size, bool small, size_t requested);
  // Merges block `b` into `a`, its neighbour just before it in one segment (b is deleted).
  static Block* join(Block* a, Block* b);
  void release_free_segments();
  [[noreturn]] void throw_oom(size_t requested);

  std::unique_ptr<RawMemory> raw_;
  std::string device_;
  mutable std::mutex mu_;
  Pool small_, large_;  // free blocks
  std::unordered_map<void*, Block*> live_;  // allocated blocks by address
  std::unordered_set<Block*> segments_;  // the first block of every segment
  MemoryStats stats_;
};

}  // namespace kiln::cu
