#include "jit/exec/background.h"

#include <tbb/task_arena.h>

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>

namespace kiln::jit {
namespace {

// Jobs wait in `queue`; one drain task at a time on a one-thread arena runs them in order.
//
// Exit: a running compile uses LLVM's function-local statics (constructed on first use, by any
// thread, and destroyed by exit in reverse order of construction) and kiln's. No static
// destructor may run while a compile runs, so shutdown_background() (drop the queued jobs,
// wait for the running compile, refuse new ones) must run before the first of them. The only
// point that precedes every static destructor is the destruction of the exiting thread's
// thread_local objects ([basic.start.term]: they are destroyed before any static object), so
// the main thread holds a thread_local ExitGuard (armed when the library is loaded) that calls
// it. An std::atexit handler, registered when the first job is queued and again after compiles
// 1, 2, 4, 8..., covers exit() called from another thread as far as exit handler order allows
// (statics constructed after its last registration are destroyed before it runs).
using Job = std::function<void()>;
// Leaked on purpose: the drain task and exit handlers touch it in any order.
struct Background {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue;  // not yet started
  bool draining = false;  // a drain task is enqueued or running
  int running = 0;  // a job is compiling (0 or 1)
  bool held = false;
  bool exiting = false;  // shut down: nothing is queued or started any more
};
std::atomic<Background*> g_bg{nullptr};
Background& bg() {
  static const bool made = [] {
    g_bg.store(new Background());
    // A child of fork() has only the forking thread: no compile runs there, and the state
    // (its mutex included) may be mid-update. The child starts from a fresh state, shut down
    // (its kernels keep their asmjit code; its exit waits for nothing).
    pthread_atfork(nullptr, nullptr, [] {
      auto* fresh = new Background();
      fresh->exiting = true;
      g_bg.store(fresh);
    });
    return true;
  }();
  (void)made;
  return *g_bg.load();
}
tbb::task_arena& bg_arena() {
  static tbb::task_arena* a = new tbb::task_arena(1, 0);  // one thread, never the callers'
  return *a;
}

// Drops the queued jobs, waits for the running compile and refuses any later one.
void shutdown_background() {
  Background& b = bg();
  std::deque<Job> dropped;
  {
    std::unique_lock<std::mutex> lock(b.mu);
    b.exiting = true;
    dropped.swap(b.queue);
    b.cv.notify_all();
    b.cv.wait(lock, [&] { return b.running == 0; });
  }
  // `dropped` is destroyed here, on the exiting thread, before static destructors run.
}
void at_exit() { shutdown_background(); }

// The main thread's guard: its destructor runs when main returns or the main thread calls
// exit(), before any static destructor (or when the main thread calls pthread_exit: later
// background compiles are then not started and kernels keep their asmjit code).
struct ExitGuard {
  bool armed = false;
  ~ExitGuard() {
    if (armed) shutdown_background();
  }
};
thread_local ExitGuard t_exit_guard;
const bool g_exit_guard_armed = [] {
  if (::gettid() == ::getpid()) t_exit_guard.armed = true;  // loaded on the main thread
  return true;
}();

// Runs queued jobs until the queue is empty (one drain task at a time).
void drain() {
  Background& b = bg();
  for (;;) {
    std::optional<Job> job;
    {
      std::unique_lock<std::mutex> lock(b.mu);
      b.cv.wait(lock, [&] { return !b.held || b.exiting || b.queue.empty(); });
      if (b.exiting || b.queue.empty()) {
        b.draining = false;
        b.cv.notify_all();
        return;
      }
      job.emplace(std::move(b.queue.front()));
      b.queue.pop_front();
      b.running++;
    }
    (*job)();  // jobs handle their own errors
    job.reset();  // before `running` drops: nothing of the job outlives shutdown_background()
    // The fallback handler again after compiles 1, 2, 4, 8...: statics constructed so far are
    // destroyed after it (one drain task runs at a time, ordered by `b.mu`).
    static uint64_t compiled = 0;
    ++compiled;
    if ((compiled & (compiled - 1)) == 0) std::atexit(at_exit);
    std::lock_guard<std::mutex> lock(b.mu);
    b.running--;
    b.cv.notify_all();
  }
}

}  // namespace

void run_in_background(std::function<void()> job) {
  Background& b = bg();
  static std::once_flag first;
  std::call_once(first, [] { std::atexit(at_exit); });
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.exiting) return;  // shut down: the job is dropped
  b.queue.push_back(std::move(job));
  if (!b.draining) {
    b.draining = true;
    bg_arena().enqueue(drain);
  }
}

void wait_background_compiles() {
  Background& b = bg();
  std::unique_lock<std::mutex> lock(b.mu);
  b.cv.wait(lock, [&] { return (b.queue.empty() || b.exiting) && b.running == 0; });
}

void hold_background_compiles(bool hold) {
  Background& b = bg();
  std::lock_guard<std::mutex> lock(b.mu);
  b.held = hold;
  b.cv.notify_all();
}

}  // namespace kiln::jit
