#include "runtime/cuda/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "runtime/core/error.h"

namespace kiln::cu {

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kMinBlock = 512;  // every size is a multiple of this
constexpr size_t kSmallRequest = 1 * kMiB;  // the small pool serves requests up to this
constexpr size_t kSmallSegment = 2 * kMiB;  // segment size of the small pool
constexpr size_t kLargeSegment = 20 * kMiB;  // segment size of large requests under kMinLargeAlloc
constexpr size_t kMinLargeAlloc = 10 * kMiB;  // from here a request gets a segment of its own size
constexpr size_t kRoundLarge = 2 * kMiB;  // ... rounded up to this
constexpr size_t kMaxRequest = size_t{1} << 60;  // larger requests fail without trying

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

size_t segment_size(size_t size) {
  if (size <= kSmallRequest) return kSmallSegment;
  if (size < kMinLargeAlloc) return kLargeSegment;
  return round_up(size, kRoundLarge);
}

// "1.50 GiB", "512 bytes".
std::string human(size_t bytes) {
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace

RawMemory::~RawMemory() = default;

// A run of bytes of one segment, free or allocated; prev/next are its neighbours in the segment.
struct CachingAllocator::Block {
  char* ptr;
  size_t size;
  bool small;  // which pool
  size_t requested = 0;  // the rounded request while allocated, 0 while free
  Block* prev = nullptr;
  Block* next = nullptr;
};

bool CachingAllocator::BySizeThenAddress::operator()(const Block* a, const Block* b) const {
  return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
}

CachingAllocator::CachingAllocator(std::unique_ptr<RawMemory> raw, std::string device_name)
    : raw_(std::move(raw)), device_(std::move(device_name)) {}

CachingAllocator::~CachingAllocator() {
  for (Block* head : segments_) {
    raw_->free(head->ptr);
    for (Block* b = head; b;) delete std::exchange(b, b->next);
  }
}

void* CachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > kMaxRequest) throw_oom(bytes);
  const size_t size = round_up(bytes, kMinBlock);
  const bool small = size <= kSmallRequest;
  Pool& pool = small ? small_ : large_;

  Block key{nullptr, size, small};
  Block* b;
  if (auto it = pool.lower_bound(&key); it != pool.end()) {
    b = *it;
    pool.erase(it);
    ++stats_.num_cache_hits;
  } else {
    b = new_segment(segment_size(size), small, bytes);
  }

  // The rest is split off when worth keeping: in the small pool from 512 bytes; in the large
  // pool over 1 MiB, or over a seventh of the request (a block wastes at most 1/8 of itself).
  const size_t rest = b->size - size;
  if (small ? rest >= kMinBlock : rest > kSmallRequest || rest * 7 > size) {
    auto* r = new Block{b->ptr + size, rest, small, 0, b, b->next};
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    pool.insert(r);
    ++stats_.num_splits;
  }
  b->requested = size;
  live_.emplace(b->ptr, b);

  ++stats_.num_allocs;
  stats_.allocated_bytes += static_cast<int64_t>(size);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return b->ptr;
}

// A new segment of `size` for `small`'s pool, as one free block in no pool. On out-of-memory,
// releases the cache and tries once more, then throws for `requested` bytes.
CachingAllocator::Block* CachingAllocator::new_segment(size_t size, bool small, size_t requested) {
  void* p = raw_->alloc(size);
  if (!p) {
    release_free_segments();
    p = raw_->alloc(size);
  }
  if (!p) throw_oom(requested);
  auto* b = new Block{static_cast<char*>(p), size, small};
  segments_.insert(b);
  ++stats_.num_segments;
  stats_.reserved_bytes += static_cast<int64_t>(size);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  return b;
}

void CachingAllocator::free(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  KILN_CHECK(it != live_.end(), "kiln::cuda: free of ", p, " on ", device_,
             ", which is not a live allocation of this allocator (never allocated, freed already, or "
             "inside a block)");
  Block* b = it->second;
  live_.erase(it);
  ++stats_.num_frees;
  stats_.allocated_bytes -= static_cast<int64_t>(b->requested);
  b->requested = 0;

  Pool& pool = b->small ? small_ : large_;
  if (Block* n = b->next; n && !n->requested) {  // absorb the free next block
    pool.erase(n);
    join(b, n);
  }
  if (Block* q = b->prev; q && !q->requested) {  // join the free previous block
    pool.erase(q);
    b = join(q, b);
  }
  pool.insert(b);
}

CachingAllocator::Block* CachingAllocator::join(Block* a, Block* b) {
  a->size += b->size;
  a->next = b->next;
  if (a->next) a->next->prev = a;
  delete b;
  return a;
}

// Returns every free block that is a whole segment to RawMemory.
void CachingAllocator::release_free_segments() {
  for (Pool* pool : {&small_, &large_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev || b->next) {
        ++it;
        continue;
      }
      it = pool->erase(it);
      segments_.erase(b);
      raw_->free(b->ptr);
      --stats_.num_segments;
      stats_.reserved_bytes -= static_cast<int64_t>(b->size);
      delete b;
    }
  }
}

void CachingAllocator::throw_oom(size_t requested) {
  ++stats_.num_ooms;
  const int64_t cached = stats_.reserved_bytes - stats_.allocated_bytes;
  std::string msg = "kiln::cuda: out of memory on " + device_ + ": tried to allocate " + human(requested) + " (";
  if (size_t total = raw_->total_bytes()) msg += human(total) + " total capacity; ";
  msg += human(static_cast<size_t>(stats_.allocated_bytes)) + " allocated by kiln, " +
         human(static_cast<size_t>(stats_.reserved_bytes)) + " reserved by kiln in total, " +
         human(static_cast<size_t>(cached)) +
         " of it cached and unused). Free tensors that are no longer needed, "
         "or use smaller sizes.";
  throw Error(msg);
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  MemoryStats s = stats_;
  s.cached_bytes = s.reserved_bytes - s.allocated_bytes;
  return s;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_free_segments();
}

size_t CachingAllocator::block_size(void* p) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  KILN_CHECK(it != live_.end(), "kiln::cuda: block_size of ", p, " on ", device_,
             ", which is not a live allocation of this allocator");
  return it->second->size;
}

bool CachingAllocator::owns(const void* p) const {
  std::lock_guard<std::mutex> lock(mu_);
  const char* c = static_cast<const char*>(p);
  for (const Block* first : segments_) {
    const Block* last = first;
    while (last->next) last = last->next;
    if (c >= first->ptr && c < last->ptr + last->size) return true;
  }
  return false;
}

}  // namespace kiln::cu
