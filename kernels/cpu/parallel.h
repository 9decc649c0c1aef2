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

#include <cstddef>
#include <cstdint>

#if defined(__SANITIZE_THREAD__)
#define KILN_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KILN_TSAN 1
#endif
#endif

#if defined(KILN_TSAN)
#define KILN_PARALLEL_NOINLINE __attribute__((noinline))  // see TsanForkJoin::after_join
#else
#define KILN_PARALLEL_NOINLINE
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
  // After the loop: the bodies' releases, and TBB's own join. TBB's root task node (its
  // wait_context) lives in the stack frame of the (noinline) wrapper that called
  // tbb::parallel_for, or below it; the last worker decrements it with an (instrumented) atomic
  // after the bodies' release, then the caller waits inside libtbb, unseen. Acquiring every
  // word from the wrapper's frame down over the dead callee frames picks up that atomic's
  // release, so the caller's later use of its stack does not race with the worker's last touch
  // of TBB's node.
  __attribute__((noinline)) void after_join(const void* wrapper_frame) {
    __tsan_acquire(&join);
    const char* top = static_cast<const char*>(wrapper_frame);
    char* p = static_cast<char*>(__builtin_frame_address(0)) - 4096;
    for (p -= reinterpret_cast<uintptr_t>(p) % 8; p < top; p += 8) __tsan_acquire(p);
  }
};

// The loop body TBB copies into its tasks. A task is built by one thread and run (stolen) by
// another, and its memory is reused for later tasks, all through uninstrumented TBB; reading the
// two pointers kept in the task is synchronized by TBB, so that read is not instrumented. The
// body proper then acquires `fork` and releases `join`.
template <class F>
struct TsanBody {
  TsanForkJoin* fj;
  const F* body;
  struct Ptrs {
    TsanForkJoin* fj;
    const F* body;
  };
  __attribute__((no_sanitize_thread, noinline)) static Ptrs load(const TsanBody* self) {
    return {self->fj, self->body};
  }
  template <class Arg>
  void operator()(const Arg& arg) const {
    Ptrs p = load(this);
    __tsan_acquire(&p.fj->fork);
    struct Release {
      TsanForkJoin* fj;
      ~Release() { __tsan_release(&fj->join); }
    } release{p.fj};
    (*p.body)(arg);
  }
};
#endif

// tbb::parallel_for(range, body), body(const tbb::blocked_range<int64_t>&).
template <class F>
KILN_PARALLEL_NOINLINE void parallel_for(const tbb::blocked_range<int64_t>& range, const F& body) {
#if defined(KILN_TSAN)
  TsanForkJoin fj;
  tbb::parallel_for(range, TsanBody<F>{&fj, &body});
  fj.after_join(__builtin_frame_address(0));
#else
  tbb::parallel_for(range, body);
#endif
}

// tbb::parallel_for(first, last, body), body(int64_t) for each index: the range form with
// grainsize 1, which is what TBB's index form runs. (TBB's index form wraps the body in a
// struct built on the caller's stack after the fork edge, whose fields the bodies read:
// TSan would report those reads.)
template <class F>
void parallel_for(int64_t first, int64_t last, const F& body) {
  if (first >= last) return;
  parallel_for(tbb::blocked_range<int64_t>(first, last, 1), [&body](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) body(i);
  });
}

}  // namespace kiln::kernels
