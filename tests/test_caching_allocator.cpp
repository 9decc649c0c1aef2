// The CUDA caching allocator (runtime/cuda/caching_allocator.*) on the CPU, over a fake device:
// RawMemory on aligned_alloc with a byte limit, recording every live segment. Random alloc/free
// sequences are checked against a model kept here; the rest checks segment sizes, reuse,
// splitting and merging, out-of-memory, bad frees and threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/exec/buffer_pool.h"
#include "tests/test_seed.h"

using namespace kiln::cu;

namespace {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kNoLimit = SIZE_MAX;

size_t round512(size_t n) { return (n + 511) / 512 * 512; }

// Device memory on the host heap: at most `limit` bytes live at once; records every live
// segment and counts calls.
struct FakeMemory : RawMemory {
  explicit FakeMemory(size_t limit) : limit(limit) {}
  ~FakeMemory() override {
    for (auto& [p, n] : segments) std::free(p);
  }
  void* alloc(size_t bytes) override {
    void* p = bytes <= limit - used ? std::aligned_alloc(512, round512(bytes)) : nullptr;
    if (!p) {
      ++failures;
      return nullptr;
    }
    segments[static_cast<char*>(p)] = bytes;
    used += bytes;
    peak = std::max(peak, used);
    ++allocs;
    return p;
  }
  void free(void* p) override {
    auto it = segments.find(static_cast<char*>(p));
    if (it == segments.end()) {
      ++bad_frees;
      return;
    }
    used -= it->second;
    segments.erase(it);
    std::free(p);
  }
  size_t total_bytes() const override { return limit == kNoLimit ? 0 : limit; }

  size_t limit;
  std::map<char*, size_t> segments;  // live segments: base -> bytes
  size_t used = 0, peak = 0;  // bytes live now, and the most since the last reset
  int64_t allocs = 0, failures = 0, bad_frees = 0;
};

// An allocator over a fake device named "cuda:0"; `fake` stays readable (the allocator owns it).
struct Device {
  explicit Device(size_t limit = kNoLimit) : Device(std::make_unique<FakeMemory>(limit)) {}
  FakeMemory* fake;
  CachingAllocator alloc;

 private:
  explicit Device(std::unique_ptr<FakeMemory> f) : fake(f.get()), alloc(std::move(f), "cuda:0") {}
};

// Every field, for comparing and printing.
std::vector<int64_t> fields(const MemoryStats& s) {
  return {s.allocated_bytes, s.peak_allocated_bytes, s.reserved_bytes, s.peak_reserved_bytes,
          s.cached_bytes,    s.num_allocs,           s.num_frees,      s.num_segments,
          s.num_ooms,        s.num_cache_hits,       s.num_splits};
}

// The live blocks of a test, by address: the request's size.
using LiveMap = std::map<char*, size_t>;

// Live blocks never overlap, each lies inside one live segment of the fake, 512-aligned from its
// base, and is at least its request rounded to 512; no bad free reached the fake.
void expect_blocks_sound(const Device& d, const LiveMap& live) {
  char* end_of_previous = nullptr;
  for (auto& [p, requested] : live) {
    const size_t size = d.alloc.block_size(p);
    EXPECT_GE(size, round512(requested));
    EXPECT_EQ(size % 512, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 512, 0u);
    EXPECT_LE(end_of_previous, p) << "blocks overlap";
    end_of_previous = p + size;
    auto seg = d.fake->segments.upper_bound(p);
    ASSERT_NE(seg, d.fake->segments.begin()) << "block outside every segment";
    --seg;
    EXPECT_LE(p + size, seg->first + seg->second) << "block outside its segment";
    EXPECT_EQ((p - seg->first) % 512, 0);
  }
  EXPECT_EQ(d.fake->bad_frees, 0);
}

// Every segment of the fake holds a live block (so none was left fully free).
void expect_no_free_segment(const Device& d, const LiveMap& live) {
  for (auto& [base, bytes] : d.fake->segments) {
    auto it = live.lower_bound(base);
    EXPECT_TRUE(it != live.end() && it->first < base + bytes) << "a fully free segment is still held";
  }
}

// What the allocator's counters must say, kept independently of it.
struct Model {
  LiveMap live;
  int64_t allocated = 0, peak_allocated = 0, allocs = 0, frees = 0, ooms = 0;

  void allocated_block(char* p, size_t bytes) {
    live[p] = bytes;
    allocated += static_cast<int64_t>(round512(bytes));
    peak_allocated = std::max(peak_allocated, allocated);
    ++allocs;
  }
  void freed_block(char* p) {
    allocated -= static_cast<int64_t>(round512(live.at(p)));
    live.erase(p);
    ++frees;
  }
};

void expect_stats_match(const Device& d, const Model& m) {
  const MemoryStats s = d.alloc.stats();
  EXPECT_EQ(s.allocated_bytes, m.allocated);
  EXPECT_EQ(s.peak_allocated_bytes, m.peak_allocated);
  EXPECT_EQ(s.num_allocs, m.allocs);
  EXPECT_EQ(s.num_frees, m.frees);
  EXPECT_EQ(s.num_ooms, m.ooms);
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(d.fake->used));
  EXPECT_EQ(s.peak_reserved_bytes, static_cast<int64_t>(d.fake->peak));
  EXPECT_EQ(s.num_segments, static_cast<int64_t>(d.fake->segments.size()));
  EXPECT_EQ(s.cached_bytes, s.reserved_bytes - s.allocated_bytes);
  // Each allocation either reused a cached block or took exactly one new segment.
  EXPECT_EQ(s.num_cache_hits + d.fake->allocs, s.num_allocs);
  EXPECT_LE(s.num_splits, s.num_allocs);  // at most one split per allocation
}

// A request size from 1 B to 30 MiB, log-uniform, with the pools' boundaries often.
size_t random_size(std::mt19937_64& rng) {
  static const size_t edges[] = {1,        511,           512,       513,           kMiB - 512, kMiB,
                                 kMiB + 1, 10 * kMiB - 1, 10 * kMiB, 10 * kMiB + 1, 20 * kMiB,  30 * kMiB};
  if (rng() % 8 == 0) return edges[rng() % std::size(edges)];
  const double e = std::uniform_real_distribution<double>(0, std::log2(30.0 * kMiB))(rng);
  return std::clamp<size_t>(static_cast<size_t>(std::exp2(e)), 1, 30 * kMiB);
}

// `ops` random allocations, frees, empty_cache()s and peak resets on a device of `limit` bytes,
// checked after every step; then everything freed and the cache emptied.
void run_random(uint64_t seed, size_t limit, int ops) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ", limit " + std::to_string(limit));
  Device d(limit);
  Model m;
  std::mt19937_64 rng(seed);
  constexpr size_t kMaxLive = 48;
  for (int i = 0; i < ops && !::testing::Test::HasFailure(); ++i) {
    SCOPED_TRACE("op " + std::to_string(i));
    const int r = static_cast<int>(rng() % 100);
    if (r == 0) {
      d.alloc.empty_cache();
      expect_no_free_segment(d, m.live);
    } else if (r == 1) {
      d.alloc.reset_peak_stats();
      m.peak_allocated = m.allocated;
      d.fake->peak = d.fake->used;
    } else if (!m.live.empty() && (r < 50 || m.live.size() >= kMaxLive)) {
      auto it = std::next(m.live.begin(), static_cast<long>(rng() % m.live.size()));
      char* p = it->first;
      d.alloc.free(p);
      m.freed_block(p);
    } else {
      const size_t bytes = random_size(rng);
      const int64_t failures = d.fake->failures;
      try {
        auto* p = static_cast<char*>(d.alloc.allocate(bytes));
        ASSERT_NE(p, nullptr);
        ASSERT_FALSE(m.live.count(p)) << "a live block handed out twice";
        m.allocated_block(p, bytes);
      } catch (const kiln::Error& e) {
        ASSERT_NE(limit, kNoLimit) << e.what();
        ++m.ooms;
        EXPECT_EQ(d.fake->failures, failures + 2) << "tried, freed the cache, tried once more";
        EXPECT_NE(std::string(e.what()).find("tried to allocate"), std::string::npos) << e.what();
        expect_no_free_segment(d, m.live);
      }
    }
    expect_blocks_sound(d, m.live);
    expect_stats_match(d, m);
  }
  const MemoryStats s = d.alloc.stats();
  std::printf("[ alloc ] seed %llu: %lld allocs, %lld cache hits, %lld splits, %lld ooms, %lld retries\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(s.num_allocs),
              static_cast<long long>(s.num_cache_hits), static_cast<long long>(s.num_splits),
              static_cast<long long>(s.num_ooms), static_cast<long long>(d.fake->failures - 2 * s.num_ooms));
  while (!m.live.empty()) {
    char* p = m.live.begin()->first;
    d.alloc.free(p);
    m.freed_block(p);
  }
  expect_stats_match(d, m);
  EXPECT_EQ(d.alloc.stats().allocated_bytes, 0);
  d.alloc.empty_cache();
  EXPECT_EQ(d.alloc.stats().reserved_bytes, 0);
  EXPECT_EQ(d.alloc.stats().num_segments, 0);
  EXPECT_TRUE(d.fake->segments.empty());
}

uint64_t seed() { return kiln::testing::test_seed(20240917); }

}  // namespace

// Random sequences on an unlimited device: the model's counters, sound blocks, nothing held at
// the end.
TEST(CachingAllocator, RandomSequencesMatchTheModel) {
  std::printf("[ alloc ] KILN_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed()));
  for (uint64_t k = 0; k < 4; ++k)
    run_random(kiln::testing::splitmix(kiln::testing::splitmix(seed()) + k), kNoLimit, 5000);
}

// The same on a 96 MiB device, where many requests need the cache freed and some fail.
TEST(CachingAllocator, RandomSequencesWithOutOfMemory) {
  for (uint64_t k = 0; k < 4; ++k)
    run_random(kiln::testing::splitmix(kiln::testing::splitmix(seed()) + 100 + k), 96 * kMiB, 5000);
}

TEST(CachingAllocator, ZeroBytesAndNull) {
  Device d;
  EXPECT_EQ(d.alloc.allocate(0), nullptr);
  d.alloc.free(nullptr);
  EXPECT_EQ(fields(d.alloc.stats()), fields(MemoryStats{}));
  EXPECT_TRUE(d.fake->segments.empty());
  void* p = d.alloc.allocate(1);
  void* q = d.alloc.allocate(513);
  EXPECT_EQ(d.alloc.block_size(p), 512u);
  EXPECT_EQ(d.alloc.block_size(q), 1024u);
  EXPECT_EQ(d.alloc.stats().allocated_bytes, 1536);
}

// Small requests (<= 1 MiB) get 2 MiB segments, requests under 10 MiB 20 MiB ones, larger ones
// their size rounded up to 2 MiB (the request rounded to 512 decides).
TEST(CachingAllocator, SegmentSizes) {
  const std::pair<size_t, size_t> cases[] = {{1, 2 * kMiB},
                                             {kMiB, 2 * kMiB},
                                             {kMiB + 1, 20 * kMiB},
                                             {10 * kMiB - 512, 20 * kMiB},
                                             {10 * kMiB - 1, 10 * kMiB},
                                             {10 * kMiB, 10 * kMiB},
                                             {10 * kMiB + 1, 12 * kMiB},
                                             {30 * kMiB, 30 * kMiB},
                                             {31 * kMiB, 32 * kMiB}};
  for (auto [request, segment] : cases) {
    Device d;
    d.alloc.allocate(request);
    ASSERT_EQ(d.fake->segments.size(), 1u);
    EXPECT_EQ(d.fake->segments.begin()->second, segment) << "request " << request;
  }
}

// A freed block is handed out again for the same size: a cache hit, no new segment.
TEST(CachingAllocator, FreedBlockIsReused) {
  for (size_t bytes : {size_t{1000}, 3 * kMiB, 12 * kMiB}) {
    Device d;
    void* p = d.alloc.allocate(bytes);
    const MemoryStats before = d.alloc.stats();
    d.alloc.free(p);
    EXPECT_EQ(d.alloc.stats().cached_bytes, before.reserved_bytes) << "freed, still reserved";
    EXPECT_EQ(d.alloc.allocate(bytes), p);
    const MemoryStats after = d.alloc.stats();
    EXPECT_EQ(after.num_cache_hits, before.num_cache_hits + 1);
    EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
    EXPECT_EQ(d.fake->allocs, 1);
  }
}

// The pools do not share blocks: a cached small block does not serve a large request, nor the
// other way round.
TEST(CachingAllocator, PoolsAreSeparate) {
  Device d;
  d.alloc.free(d.alloc.allocate(4 * kKiB));
  d.alloc.allocate(2 * kMiB);
  EXPECT_EQ(d.fake->allocs, 2);
  Device e;
  e.alloc.free(e.alloc.allocate(3 * kMiB));
  e.alloc.allocate(4 * kKiB);
  EXPECT_EQ(e.fake->allocs, 2);
}

// Small pool: blocks split off one segment side by side; freed, they merge back into one block
// (a request for half the segment then starts at its base).
TEST(CachingAllocator, SmallBlocksSplitAndMerge) {
  Device d;
  auto* p = static_cast<char*>(d.alloc.allocate(4 * kKiB));
  auto* q = static_cast<char*>(d.alloc.allocate(4 * kKiB));
  EXPECT_EQ(q, p + 4 * kKiB);
  EXPECT_EQ(d.alloc.stats().num_splits, 2);
  EXPECT_EQ(d.alloc.block_size(p), 4 * kKiB);
  d.alloc.free(p);
  d.alloc.free(q);
  EXPECT_EQ(d.alloc.allocate(kMiB), p);
  EXPECT_EQ(d.alloc.allocate(kMiB), p + kMiB);  // the exact rest: no split
  EXPECT_EQ(d.alloc.stats().num_splits, 3);
  EXPECT_EQ(d.fake->allocs, 1);
  // A rest of exactly 512 bytes is split off in the small pool.
  Device e;
  auto* a = static_cast<char*>(e.alloc.allocate(kMiB));
  auto* b = static_cast<char*>(e.alloc.allocate(kMiB - 512));
  EXPECT_EQ(e.alloc.block_size(b), kMiB - 512);
  EXPECT_EQ(e.alloc.allocate(512), b + kMiB - 512);
  EXPECT_EQ(e.alloc.stats().num_splits, 2);
  EXPECT_EQ(a + kMiB, b);
}

// Large pool: two halves of a 20 MiB segment, freed in either order, give back one block usable
// whole; so does a middle block freed between two free neighbours.
TEST(CachingAllocator, LargeHalvesMergeIntoOneBlock) {
  for (bool first_half_first : {true, false}) {
    Device d;
    auto* x = static_cast<char*>(d.alloc.allocate(5 * kMiB));
    auto* y = static_cast<char*>(d.alloc.allocate(15 * kMiB));
    EXPECT_EQ(y, x + 5 * kMiB);
    EXPECT_EQ(d.alloc.block_size(y), 15 * kMiB);
    d.alloc.free(first_half_first ? x : y);
    d.alloc.free(first_half_first ? y : x);
    EXPECT_EQ(d.alloc.allocate(20 * kMiB), x);
    EXPECT_EQ(d.alloc.block_size(x), 20 * kMiB);
    EXPECT_EQ(d.fake->allocs, 1);
  }
  Device d;
  auto* a = static_cast<char*>(d.alloc.allocate(5 * kMiB));
  auto* b = static_cast<char*>(d.alloc.allocate(5 * kMiB));
  auto* c = static_cast<char*>(d.alloc.allocate(10 * kMiB));
  EXPECT_EQ(b, a + 5 * kMiB);
  EXPECT_EQ(c, b + 5 * kMiB);
  d.alloc.free(a);
  d.alloc.free(c);
  d.alloc.free(b);
  EXPECT_EQ(d.alloc.allocate(20 * kMiB), a);
  EXPECT_EQ(d.fake->allocs, 1);
}

// Large pool: a rest of at most 1 MiB stays with the block (counted as cached).
TEST(CachingAllocator, LargeRestUpTo1MiBIsNotSplit) {
  Device d;
  void* p = d.alloc.allocate(19 * kMiB);  // a 20 MiB segment, 1 MiB over
  EXPECT_EQ(d.alloc.block_size(p), 20 * kMiB);
  EXPECT_EQ(d.alloc.stats().num_splits, 0);
  EXPECT_EQ(d.alloc.stats().allocated_bytes, static_cast<int64_t>(19 * kMiB));
  EXPECT_EQ(d.alloc.stats().cached_bytes, static_cast<int64_t>(kMiB));
  d.alloc.free(p);
  auto* x = static_cast<char*>(d.alloc.allocate(5 * kMiB));  // split: 5 + 15
  auto* y = static_cast<char*>(d.alloc.allocate(14 * kMiB + 512));
  EXPECT_EQ(y, x + 5 * kMiB);
  EXPECT_EQ(d.alloc.block_size(y), 15 * kMiB);
  EXPECT_EQ(d.alloc.stats().num_splits, 1);
}

// Large pool: a block is at most 1/8 larger than its request (rounded to 512), whatever free
// block serves it: a rest over 1/7 of the request is split off even under 1 MiB (a 1.1 MiB
// request from a free 2 MiB block held 0.9 MiB more than it asked).
TEST(CachingAllocator, LargeBlocksWasteAtMostAnEighth) {
  std::mt19937_64 rng(kiln::testing::test_seed(61));
  Device d;
  for (int i = 0; i < 2000; ++i) {
    // A free block of a random size, then a random request it can serve.
    const size_t free_size = round512(std::uniform_int_distribution<size_t>(kMiB + 512, 40 * kMiB)(rng));
    void* f = d.alloc.allocate(free_size);
    void* keep = d.alloc.allocate(kMiB + 512);  // (holds the segment's rest apart)
    d.alloc.free(f);
    const size_t want = std::uniform_int_distribution<size_t>(kMiB + 1, free_size)(rng);
    void* p = d.alloc.allocate(want);
    const size_t b = d.alloc.block_size(p);
    ASSERT_GE(b, round512(want));
    ASSERT_LE(8 * (b - round512(want)), b) << want << " bytes in a block of " << b;
    d.alloc.free(p);
    d.alloc.free(keep);
  }
  void* x = d.alloc.allocate(2 * kMiB);
  void* y = d.alloc.allocate(2 * kMiB);  // (keeps x's block from merging with the rest)
  d.alloc.free(x);
  void* z = d.alloc.allocate(kMiB + 100 * kKiB);
  EXPECT_EQ(z, x);
  EXPECT_EQ(d.alloc.block_size(z), round512(kMiB + 100 * kKiB));
  d.alloc.free(z);
  d.alloc.free(y);
}

// A request that fits only once the cache is freed succeeds: fully free segments go back to the
// device and the allocation is retried.
TEST(CachingAllocator, OutOfMemoryFreesTheCacheAndRetries) {
  {
    Device d(21 * kMiB);
    d.alloc.free(d.alloc.allocate(kMiB + 512 * kKiB));  // a 20 MiB segment, cached
    EXPECT_NE(d.alloc.allocate(4 * kKiB), nullptr);  // needs 2 MiB more
    EXPECT_EQ(d.fake->failures, 1);
    const MemoryStats s = d.alloc.stats();
    EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(2 * kMiB));
    EXPECT_EQ(s.peak_reserved_bytes, static_cast<int64_t>(20 * kMiB));
    EXPECT_EQ(s.num_segments, 1);
    EXPECT_EQ(s.num_ooms, 0);
  }
  {
    Device d(20 * kMiB);
    d.alloc.free(d.alloc.allocate(12 * kMiB));  // a 12 MiB segment, too small for 16 MiB
    EXPECT_NE(d.alloc.allocate(16 * kMiB), nullptr);
    EXPECT_EQ(d.fake->failures, 1);
    EXPECT_EQ(d.alloc.stats().reserved_bytes, static_cast<int64_t>(16 * kMiB));
  }
}

// A request that never fits throws kiln::Error naming the device, the size and the memory held;
// the failed call changes nothing but the cache (freed) and the oom counter, and the allocator
// goes on working.
TEST(CachingAllocator, OutOfMemoryThrowsAndLeavesTheAllocatorUsable) {
  Device d(64 * kMiB);
  void* x = d.alloc.allocate(8 * kMiB);  // a 20 MiB segment
  void* y = d.alloc.allocate(1000);  // a 2 MiB segment
  d.alloc.free(d.alloc.allocate(30 * kMiB));  // a 30 MiB segment, cached
  MemoryStats before = d.alloc.stats();
  ASSERT_EQ(before.reserved_bytes, static_cast<int64_t>(52 * kMiB));
  try {
    d.alloc.allocate(kGiB + kGiB / 2);
    FAIL() << "no error";
  } catch (const kiln::Error& e) {
    const std::string msg = e.what();
    for (const char* part : {"out of memory", "cuda:0", "tried to allocate 1.50 GiB", "64.00 MiB total capacity",
                             "8.00 MiB allocated", "22.00 MiB reserved", "14.00 MiB of it cached"})
      EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
  }
  MemoryStats after = d.alloc.stats();
  before.reserved_bytes -= 30 * kMiB;
  before.cached_bytes -= 30 * kMiB;
  before.num_segments -= 1;
  before.num_ooms += 1;
  EXPECT_EQ(fields(after), fields(before));
  EXPECT_EQ(d.fake->segments.size(), 2u);
  EXPECT_EQ(d.fake->failures, 2);

  EXPECT_THROW(d.alloc.allocate(42 * kMiB + 1), kiln::Error);  // a 44 MiB segment: 42 MiB are left
  EXPECT_THROW(d.alloc.allocate(SIZE_MAX), kiln::Error);  // no overflow on absurd sizes
  before.num_ooms += 2;
  EXPECT_EQ(fields(d.alloc.stats()), fields(before));

  void* z = d.alloc.allocate(40 * kMiB);
  EXPECT_EQ(d.alloc.block_size(z), 40 * kMiB);
  for (void* p : {x, y, z}) d.alloc.free(p);
  EXPECT_EQ(d.alloc.stats().allocated_bytes, 0);
  d.alloc.empty_cache();
  EXPECT_EQ(d.alloc.stats().reserved_bytes, 0);
  EXPECT_TRUE(d.fake->segments.empty());
}

// Without a known capacity the message leaves it out.
TEST(CachingAllocator, OutOfMemoryMessageWithoutCapacity) {
  Device d;
  try {
    d.alloc.allocate(SIZE_MAX);
    FAIL() << "no error";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tried to allocate"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("capacity"), std::string::npos) << e.what();
  }
  EXPECT_EQ(d.alloc.stats().num_ooms, 1);
}

// Freeing a pointer that is not a live block (inside one, foreign, freed already) throws and
// changes nothing; block_size of one throws too.
TEST(CachingAllocator, BadFreeThrowsAndChangesNothing) {
  Device d;
  auto* p = static_cast<char*>(d.alloc.allocate(4 * kKiB));
  auto* q = static_cast<char*>(d.alloc.allocate(4 * kKiB));
  int local = 0;
  const MemoryStats before = d.alloc.stats();
  for (void* bad : {static_cast<void*>(p + 512), static_cast<void*>(q + 4 * kKiB), static_cast<void*>(&local)}) {
    EXPECT_THROW(d.alloc.free(bad), kiln::Error);
    EXPECT_THROW(d.alloc.block_size(bad), kiln::Error);
  }
  EXPECT_EQ(fields(d.alloc.stats()), fields(before));
  d.alloc.free(p);
  const MemoryStats freed = d.alloc.stats();
  EXPECT_THROW(d.alloc.free(p), kiln::Error);
  EXPECT_EQ(fields(d.alloc.stats()), fields(freed));
  EXPECT_EQ(d.alloc.allocate(4 * kKiB), p);  // the cache is intact
  EXPECT_EQ(d.alloc.block_size(q), 4 * kKiB);
  EXPECT_EQ(d.fake->bad_frees, 0);
}

// 4 threads allocate and free at once; each marks its blocks and finds its marks intact. Then the
// blocks still live do not overlap and the counters add up.
TEST(CachingAllocator, Threads) {
  constexpr int kThreads = 4, kOps = 2000;
  Device d;
  std::vector<LiveMap> kept(kThreads);
  std::vector<int64_t> allocs(kThreads), frees(kThreads), corrupt(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(kiln::testing::splitmix(kiln::testing::splitmix(seed()) + 1000 + t));
      const auto mark = static_cast<unsigned char>(t + 1);
      LiveMap& live = kept[t];
      auto marked = [](size_t n) { return std::min<size_t>(n, 64); };
      for (int i = 0; i < kOps; ++i) {
        if (!live.empty() && (rng() % 2 || live.size() >= 16)) {
          auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
          const size_t n = marked(it->second);
          for (size_t k = 0; k < n; ++k) corrupt[t] += it->first[k] != mark || it->first[it->second - 1 - k] != mark;
          d.alloc.free(it->first);
          live.erase(it);
          ++frees[t];
        } else {
          const size_t bytes = std::min(random_size(rng), 4 * kMiB);
          auto* p = static_cast<char*>(d.alloc.allocate(bytes));
          std::memset(p, mark, marked(bytes));
          std::memset(p + bytes - marked(bytes), mark, marked(bytes));
          live[p] = bytes;
          ++allocs[t];
        }
      }
    });
  for (auto& th : threads) th.join();

  LiveMap all;
  int64_t allocated = 0, total_allocs = 0, total_frees = 0;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(corrupt[t], 0) << "thread " << t << " found another's marks";
    for (auto& [p, n] : kept[t]) {
      EXPECT_TRUE(all.emplace(p, n).second);
      allocated += static_cast<int64_t>(round512(n));
    }
    total_allocs += allocs[t];
    total_frees += frees[t];
  }
  expect_blocks_sound(d, all);
  const MemoryStats s = d.alloc.stats();
  EXPECT_EQ(s.allocated_bytes, allocated);
  EXPECT_EQ(s.num_allocs, total_allocs);
  EXPECT_EQ(s.num_frees, total_frees);
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(d.fake->used));
  EXPECT_EQ(s.num_segments, static_cast<int64_t>(d.fake->segments.size()));
  EXPECT_EQ(s.num_cache_hits + d.fake->allocs, s.num_allocs);
  for (auto& [p, n] : all) d.alloc.free(p);
  d.alloc.empty_cache();
  EXPECT_EQ(d.alloc.stats().allocated_bytes, 0);
  EXPECT_EQ(d.alloc.stats().reserved_bytes, 0);
  EXPECT_TRUE(d.fake->segments.empty());
}

// The CPU buffer pool (runtime/exec/buffer_pool.*): blocks are multiples of the 64-byte
// alignment, never smaller than asked, from 512 bytes on at most 1/8 larger (eight size classes a
// doubling, not powers of two); a freed block serves the next request of its class; the host
// counters count blocks as handed out.
TEST(CpuBufferPool, BlocksWasteAtMostAnEighth) {
  std::mt19937_64 rng(kiln::testing::test_seed(60));
  std::vector<size_t> sizes = {0, 1, 63, 64, 65, 511, 512, 513, 1000, 1024, 1025, 4096, 4097, size_t{1} << 30,
                               (size_t{1} << 30) + 1, size_t{1} << 47};
  for (int i = 0; i < 20000; ++i) sizes.push_back(std::uniform_int_distribution<size_t>(1, size_t{1} << 40)(rng));
  for (int i = 0; i < 20000; ++i) sizes.push_back(std::uniform_int_distribution<size_t>(1, 1 << 16)(rng));
  for (size_t n : sizes) {
    const size_t b = kiln::pool_block_bytes(n);
    ASSERT_EQ(b % 64, 0u) << n;
    ASSERT_GE(b, std::max<size_t>(n, 1)) << n;
    if (n >= 512) ASSERT_LE(8 * (b - n), b) << n << " -> " << b;
    else ASSERT_LT(b - std::max<size_t>(n, 1), 64u) << n;
  }
  EXPECT_EQ(kiln::pool_block_bytes(3000000), 3145728u);  // (3 MiB; powers of two gave 4 MiB)
  const int64_t before = kiln::host_memory_stats().allocated_bytes;
  void* p = kiln::pool_allocate(3000000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_EQ(kiln::host_memory_stats().allocated_bytes - before, 3145728);
  std::memset(p, 1, 3000000);
  kiln::pool_free(p, 3000000);
  EXPECT_EQ(kiln::host_memory_stats().allocated_bytes, before);
  void* q = kiln::pool_allocate(3100000);  // (the same class: the block just freed)
  EXPECT_EQ(q, p);
  kiln::pool_free(q, 3100000);
}
