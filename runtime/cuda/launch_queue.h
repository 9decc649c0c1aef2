// Kernel launches handed to a thread of their own. cuLaunchKernel costs the host more than
// recording, planning and binding a small eager call together (docs/BENCHMARKS.md); a
// device's launch thread issues queued launches in order while the calling thread goes on
// recording the next call. Whoever uses the device's stream otherwise (copies, library calls,
// graph launches, waits) drains the queue first, so the stream sees one order.
#pragma once
#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln::cu {

// A generated kernel's launch: kiln's signature (begin, end, the argument block by value).
struct QueuedLaunch {
  static constexpr int kMaxArgs = 64;  // larger argument blocks are launched at once
  CUfunction fn = nullptr;
  unsigned blocks = 1, threads = 1, shared = 0;
  long long begin = 0, end = 0;
  const std::string* name = nullptr;  // the kernel's symbol (its code drains the queue before it goes)
  int nargs = 0;
  uint64_t args[kMaxArgs];
};

class LaunchQueue {
 public:
  // Launches on `stream` of device `device` (whose context the launch thread makes current).
  LaunchQueue(int device, CUstream stream);
  ~LaunchQueue();
  LaunchQueue(const LaunchQueue&) = delete;
  LaunchQueue& operator=(const LaunchQueue&) = delete;

  // Queues a launch (fn, grid, block, shared bytes, begin, end, `nargs` argument slots, copied);
  // false when it cannot be queued (more than kMaxArgs slots): the caller drains and launches.
  bool push(CUfunction fn, unsigned blocks, unsigned threads, unsigned shared, long long begin, long long end,
            const uint64_t* args, int nargs, const std::string& name);
  // Issues everything queued, on this thread, after the launch thread's batch in flight; with
  // `report`, a launch that failed since the last report becomes a kiln::Error naming its kernel
  // (without, it waits for the next drain that reports).
  void drain(bool report = true);

  // Whether launches go through launch threads (KILN_CUDA_LAUNCH_THREAD=0 turns them off).
  static bool enabled();

 private:
  void run();
  void issue(const QueuedLaunch& l);
  void issue_all(std::vector<QueuedLaunch>& batch);

  int device_;
  CUstream stream_;
  std::atomic<int64_t> queued_{0};  // pushed, not yet issued
  std::atomic<bool> failed_any_{false};

  std::mutex mu_;  // pending_, sleeping_, stop_
  std::condition_variable wake_;
  std::vector<QueuedLaunch> pending_;
  bool sleeping_ = false, stop_ = false;

  std::mutex issue_mu_;  // held while issuing: drain() waits for the batch in flight
  std::vector<QueuedLaunch> batch_;  // the batch being issued (under issue_mu_)
  CUresult failed_ = CUDA_SUCCESS;  // first failed launch since the last drain (under issue_mu_)
  std::string failed_name_;
  std::thread thread_;
};

}  // namespace kiln::cu
