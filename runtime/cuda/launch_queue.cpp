#include "runtime/cuda/launch_queue.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "runtime/cuda/driver.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KILN_PAUSE() _mm_pause()
#else
#define KILN_PAUSE() ((void)0)
#endif

namespace kiln::cu {
namespace {
constexpr int64_t kMaxQueued = 1024;  // a producer this far ahead issues the backlog itself
// The launch thread polls this long before sleeping: launches of a loop of calls arrive a few
// microseconds apart, and waking a sleeping thread costs about as much as a launch.
constexpr auto kSpin = std::chrono::microseconds(50);
}  // namespace

bool LaunchQueue::enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_CUDA_LAUNCH_THREAD");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

LaunchQueue::LaunchQueue(int device, CUstream stream) : device_(device), stream_(stream) {
  pending_.reserve(256);
  batch_.reserve(256);
  thread_ = std::thread([this] { run(); });
}

LaunchQueue::~LaunchQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

bool LaunchQueue::push(CUfunction fn, unsigned blocks, unsigned threads, unsigned shared, long long begin,
                       long long end, const uint64_t* args, int nargs, const std::string& name) {
  if (nargs > QueuedLaunch::kMaxArgs) return false;
  if (queued_.load(std::memory_order_relaxed) >= kMaxQueued) drain();
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return false;
    QueuedLaunch& l = pending_.emplace_back();
    l.fn = fn;
    l.blocks = blocks;
    l.threads = threads;
    l.shared = shared;
    l.begin = begin;
    l.end = end;
    l.name = &name;
    l.nargs = nargs;
    std::memcpy(l.args, args, static_cast<size_t>(nargs) * sizeof(uint64_t));
    queued_.fetch_add(1, std::memory_order_relaxed);
    wake = sleeping_;
  }
  if (wake) wake_.notify_one();
  return true;
}

void LaunchQueue::issue(const QueuedLaunch& l) {
  void* params[] = {const_cast<long long*>(&l.begin), const_cast<long long*>(&l.end), const_cast<uint64_t*>(l.args)};
  const CUresult r = api().launch_kernel(l.fn, l.blocks, 1, 1, l.threads, 1, 1, l.shared, stream_, params, nullptr);
  if (r != CUDA_SUCCESS && failed_ == CUDA_SUCCESS) {
    failed_ = r;
    failed_name_ = *l.name;
    failed_any_.store(true, std::memory_order_release);
  }
}

// Issues `batch` (under issue_mu_) and empties it.
void LaunchQueue::issue_all(std::vector<QueuedLaunch>& batch) {
  for (const QueuedLaunch& l : batch) issue(l);
  // Released after the launches: a drain() that reads zero orders its own work after them.
  queued_.fetch_sub(static_cast<int64_t>(batch.size()), std::memory_order_release);
  batch.clear();
}

void LaunchQueue::drain(bool report) {
  if (queued_.load(std::memory_order_acquire) == 0 && (!report || !failed_any_.load(std::memory_order_acquire))) return;
  std::lock_guard<std::mutex> issuing(issue_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch_.swap(pending_);
  }
  issue_all(batch_);
  if (report && failed_ != CUDA_SUCCESS) {
    const CUresult r = std::exchange(failed_, CUDA_SUCCESS);
    const std::string name = std::move(failed_name_);
    failed_any_.store(false, std::memory_order_release);
    check(r, ("cuLaunchKernel (" + name + ", queued)").c_str());
  }
}

void LaunchQueue::run() {
  try {
    make_current(device_);
  } catch (...) {
    return;  // (the queue's device came from a thread that made it current: cannot fail here)
  }
  std::vector<QueuedLaunch> mine;
  mine.reserve(256);
  for (;;) {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    while (queued_.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < until)
      for (int i = 0; i < 64; ++i) KILN_PAUSE();
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (pending_.empty() && !stop_) {
        sleeping_ = true;
        wake_.wait(lock);
        sleeping_ = false;
      }
      if (stop_) return;
    }
    std::lock_guard<std::mutex> issuing(issue_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      mine.swap(pending_);  // (empty when a drain() took them first)
    }
    issue_all(mine);
  }
}

}  // namespace kiln::cu
