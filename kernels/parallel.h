// kiln's one way into tbb::parallel_for: kernels (reference and JIT) run their bodies through
// these wrappers.
//
// Under ThreadSanitizer they also tell TSan about the synchronization TBB does: TBB is not
// instrumented, so TSan sees neither the fork (the caller's writes before the loop are
// visible to every body) nor the join (every body's writes are visible to the caller after
// the loop), and reports the caller's accesses against the bodies' as races. The wrappers
// add exactly those edges: a release on `fork` before spawning, an acquire at the start of
// each body; a release on `join` at the end of each body, an acquire after the loop. Bodies
// get no edges among themselves, so races between two bodies of one loop are still reported.
#pragma once
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cstdint>

#if defined(__SANITIZE_THREAD__)
#define KILN_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KILN_TSAN 1
#endif
#endif

#if defined(KILN_TSAN)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace kiln::kernels {

#if defined(KILN_TSAN)
struct TsanForkJoin {  // two sync addresses: fork (caller -> bodies), join (bodies -> caller)
  char fork = 0, join = 0;
  TsanForkJoin() { __tsan_release(&fork); }
  void after_join() { __tsan_acquire(&join); }
  struct Body {  // acquire fork on entry, release join on exit (also when the body throws)
    TsanForkJoin& fj;
    explicit Body(TsanForkJoin& f) : fj(f) { __tsan_acquire(&fj.fork); }
    ~Body() { __tsan_release(&fj.join); }
  };
};
#endif

// tbb::parallel_for(range, body), body(const tbb::blocked_range<int64_t>&).
template <class F>
void parallel_for(const tbb::blocked_range<int64_t>& range, const F& body) {
#if defined(KILN_TSAN)
  TsanForkJoin fj;
  tbb::parallel_for(range, [&](const tbb::blocked_range<int64_t>& r) {
    TsanForkJoin::Body scope(fj);
    body(r);
  });
  fj.after_join();
#else
  tbb::parallel_for(range, body);
#endif
}

// tbb::parallel_for(first, last, body), body(int64_t) for each index.
template <class F>
void parallel_for(int64_t first, int64_t last, const F& body) {
#if defined(KILN_TSAN)
  TsanForkJoin fj;
  tbb::parallel_for(first, last, [&](int64_t i) {
    TsanForkJoin::Body scope(fj);
    body(i);
  });
  fj.after_join();
#else
  tbb::parallel_for(first, last, body);
#endif
}

}  // namespace kiln::kernels
