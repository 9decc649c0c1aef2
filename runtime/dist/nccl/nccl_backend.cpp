// NCCL: collectives over CUDA tensors, one GPU per process. libnccl.so.2 is loaded at run time
// (one kiln binary with or without it). Each collective runs on the group's communication
// stream after an event recorded on kiln's stream; kiln's stream waits for its end event when
// the collective is waited (at once unless async). A watchdog aborts a communicator whose
// collective outlives the timeout (a rank died) or that reports an asynchronous error; the
// error surfaces at the next wait or collective of that group, and at every host sync of the
// device (the group registers it: a value an aborted collective wrote is never read as one).
// A peer process that has exited is seen within a watchdog tick (GroupSpec::peers_gone), not
// at the timeout. The communicator is never aborted while another thread is inside an NCCL
// call on it: that call finishes first (or the timeout passes, for a call hung in NCCL).
#include "runtime/dist/nccl/nccl_backend.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "runtime/core/error.h"
#include "runtime/cuda/cuda_runtime.h"
#include "runtime/cuda/driver.h"

namespace kiln::dist::nccl_impl {
namespace {

struct Nccl {
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclCommAbort) comm_abort = nullptr;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&::ncclGetErrorString) get_error_string = nullptr;
  decltype(&::ncclGetLastError) get_last_error = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&::ncclSend) send = nullptr;
  decltype(&::ncclRecv) recv = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  std::string reason;
};

const Nccl& nccl() {
  static const Nccl n = [] {
    Nccl a;
    if (!cu::available()) {
      a.reason = "no CUDA device (" + cu::unavailable_reason() + ")";
      return a;
    }
    cu::RuntimeLibrary lib({"libnccl.so.2", "libnccl.so"}, "NCCL (libnccl.so.2)");
    lib.symbol("ncclGetUniqueId", a.get_unique_id);
    lib.symbol("ncclCommInitRank", a.comm_init_rank);
    lib.symbol("ncclCommDestroy", a.comm_destroy);
    lib.symbol("ncclCommAbort", a.comm_abort);
    lib.symbol("ncclCommGetAsyncError", a.comm_get_async_error);
    lib.symbol("ncclGetErrorString", a.get_error_string);
    lib.symbol("ncclGetLastError", a.get_last_error);
    lib.symbol("ncclAllReduce", a.all_reduce);
    lib.symbol("ncclBroadcast", a.broadcast);
    lib.symbol("ncclAllGather", a.all_gather);
    lib.symbol("ncclReduceScatter", a.reduce_scatter);
    lib.symbol("ncclSend", a.send);
    lib.symbol("ncclRecv", a.recv);
    lib.symbol("ncclGroupStart", a.group_start);
    lib.symbol("ncclGroupEnd", a.group_end);
    if (!lib.ok()) a.reason = lib.reason();
    return a;
  }();
  return n;
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Bool: return ncclUint8;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
  }
  return ncclFloat32;
}

// Bool: sum and max are "or", product and min "and" (0/1 bytes).
ncclRedOp_t nccl_op(ReduceOp op, DType t) {
  if (t == DType::Bool) return op == ReduceOp::Sum || op == ReduceOp::Max ? ncclMax : ncclMin;
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Product: return ncclProd;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

class NcclBackend;

// Collectives issued from several threads. kiln's work on a device is one stream: a collective
// waits for that stream's work so far (its inputs), and the stream waits for each collective's
// end. With one thread issuing, every rank queues the same collectives in the same order and
// these waits meet. With several, two ranks may queue two groups' collectives in opposite orders:
// then one group's collective may wait, through the stream, for the other group's, whose peer
// waits the same way for this one's peer, and no rank moves. So once a second thread issues a
// CUDA collective in this process, each collective's end is waited for by its own thread on the
// host before kiln's stream is told to wait for it: the stream then never waits for a collective
// that has not finished, and each group's collectives meet in their own thread's order (at the
// cost of that thread's overlap of communication with its later work).
std::mutex& g_threads_mu = *new std::mutex;
std::thread::id g_first_thread;
std::atomic<bool> g_many_threads{false};

void note_issuing_thread() {
  if (g_many_threads.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_threads_mu);
  const auto me = std::this_thread::get_id();
  if (g_first_thread == std::thread::id()) g_first_thread = me;
  else if (g_first_thread != me) g_many_threads.store(true);
}

// A collective's end on the communication stream.
class NcclCompletion final : public Completion {
 public:
  NcclCompletion(NcclBackend* b, CUevent ev) : b_(b), ev_(ev) {}
  ~NcclCompletion() override;
  void wait() override;
  bool done() override { return cu::api().event_query(ev_) == CUDA_SUCCESS; }

 private:
  NcclBackend* b_;
  CUevent ev_;
};

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(const GroupSpec& s)
      : device_(s.device.index), timeout_(s.timeout), size_(s.size), peers_gone_(s.peers_gone) {
    const Nccl& n = nccl();
    ncclUniqueId id;
    if (s.rank == 0) {
      check(n.get_unique_id(&id), "ncclGetUniqueId");
      s.store->set(s.prefix + "/unique_id", std::string(reinterpret_cast<const char*>(&id), sizeof id));
    } else {
      const std::string v = s.store->get(s.prefix + "/unique_id", s.timeout);
      KILN_CHECK(v.size() == sizeof id, "NCCL's unique id in the store has ", v.size(), " bytes");
      std::memcpy(&id, v.data(), sizeof id);
    }
    KILN_CHECK(!capturing(cu::enter(device_)), "NCCL's communicator is not made while a CUDA graph is recorded");
    check(n.comm_init_rank(&comm_, s.size, id, s.rank), "ncclCommInitRank");
    cu::check(cu::api().stream_create(&comm_stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    watchdog_ = std::thread([this] { watch(); });
    // A replayed graph may hold this group's collectives: the watchdog follows each replay.
    listener_ = cu::add_graph_launch_listener([this](int index, CUstream stream) {
      if (index == device_) watch_stream(stream, "a CUDA graph's collectives");
    });
    // Before the host reads this device: the pending agreement checks, then this communicator's
    // failure (kept in a verdict of its own: the listener may outlive a call racing the dtor).
    verdict_->settle = s.settle_checks;
    sync_listener_ = cu::add_sync_listener([v = verdict_, dev = device_](int index) {
      if (index != dev) return;
      if (v->settle) v->settle();
      std::lock_guard<std::mutex> lock(v->mu);
      if (!v->failure.empty()) throw Error(v->failure);
    });
  }
  ~NcclBackend() override {
    cu::remove_graph_launch_listener(listener_);
    cu::remove_sync_listener(sync_listener_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    if (comm_ && !aborted_) nccl().comm_destroy(comm_);
    if (comm_ && aborted_ && !comm_aborted_) nccl().comm_abort(comm_);
  }
  const char* name() const override { return "nccl"; }

  CompletionPtr all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    return enqueue("all_reduce", [&](CUstream s) {
      return nccl().all_reduce(in, out, count, nccl_type(dtype), nccl_op(op, dtype), comm_, s);
    });
  }
  CompletionPtr broadcast(const void* in, void* out, size_t count, DType dtype, int root) override {
    return enqueue("broadcast", [&](CUstream s) {
      return nccl().broadcast(in, out, count, nccl_type(dtype), root, comm_, s);
    });
  }
  CompletionPtr all_gather(const void* in, void* out, size_t count, DType dtype) override {
    return enqueue("all_gather", [&](CUstream s) { return nccl().all_gather(in, out, count, nccl_type(dtype), comm_, s); });
  }
  CompletionPtr reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    return enqueue("reduce_scatter", [&](CUstream s) {
      return nccl().reduce_scatter(in, out, count, nccl_type(dtype), nccl_op(op, dtype), comm_, s);
    });
  }
  CompletionPtr all_to_all(const void* in, const std::vector<size_t>& in_counts, void* out,
                           const std::vector<size_t>& out_counts, DType dtype) override {
    const size_t isz = itemsize(dtype);
    return enqueue("all_to_all", [&](CUstream s) {
      const Nccl& n = nccl();
      ncclResult_t r = n.group_start();
      size_t in_off = 0, out_off = 0;
      for (int p = 0; p < size_ && r == ncclSuccess; ++p) {
        const size_t ib = in_counts[static_cast<size_t>(p)] * isz, ob = out_counts[static_cast<size_t>(p)] * isz;
        if (ib) r = n.send(static_cast<const char*>(in) + in_off, ib, ncclInt8, p, comm_, s);
        if (ob && r == ncclSuccess) r = n.recv(static_cast<char*>(out) + out_off, ob, ncclInt8, p, comm_, s);
        in_off += ib;
        out_off += ob;
      }
      const ncclResult_t e = n.group_end();
      return r != ncclSuccess ? r : e;
    });
  }
  CompletionPtr send(const void* data, size_t count, DType dtype, int peer) override {
    return enqueue("send", [&](CUstream s) { return nccl().send(data, count, nccl_type(dtype), peer, comm_, s); });
  }
  CompletionPtr recv(void* data, size_t count, DType dtype, int peer) override {
    return enqueue("recv", [&](CUstream s) { return nccl().recv(data, count, nccl_type(dtype), peer, comm_, s); });
  }
  // NCCL has no barrier: a one-element all-reduce, waited for on the host.
  void barrier() override {
    std::vector<int64_t> one = {0};
    exchange(one);
  }
  // Every rank's words through a device all-gather, waited for on the host (barrier and the
  // KILN_DIST_DEBUG agreement check).
  std::vector<int64_t> exchange(const std::vector<int64_t>& words) override {
    const auto& api = cu::api();
    CUstream s = cu::enter(device_);
    const size_t n = std::max<size_t>(words.size(), 1), bytes = n * sizeof(int64_t);
    std::vector<int64_t> in(n, 0), all(n * static_cast<size_t>(size_));
    std::copy(words.begin(), words.end(), in.begin());
    CUdeviceptr buf = 0;
    cu::check(api.mem_alloc(&buf, bytes * (static_cast<size_t>(size_) + 1)), "cuMemAlloc");
    struct Free {
      CUdeviceptr p;
      ~Free() { cu::api().mem_free(p); }
    } free_buf{buf};
    cu::check(api.memcpy_htod_async(buf, in.data(), bytes, s), "cuMemcpyHtoDAsync");
    CompletionPtr c = all_gather(reinterpret_cast<void*>(buf), reinterpret_cast<void*>(buf + bytes), n, DType::Int64);
    c->wait();
    cu::check(api.memcpy_dtoh_async(all.data(), buf + bytes, bytes * static_cast<size_t>(size_), s),
              "cuMemcpyDtoHAsync");
    const CUresult r = api.stream_synchronize(s);
    raise_if_failed();  // (an aborted communicator explains a failed wait)
    cu::check(r, "cuStreamSynchronize");
    if (words.empty()) return {};
    return all;
  }
  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    abort_locked(why);
  }

  // Raises the communicator's recorded failure (a timeout, an asynchronous error).
  void raise_if_failed() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.empty()) throw Error(failure_);
  }
  void make_stream_wait(CUevent ev) {
    raise_if_failed();
    if (g_many_threads.load() && !capturing(cu::enter(device_))) {
      // (see note_issuing_thread; an aborted communicator's kernels exit, so this returns)
      const CUresult r = cu::api().event_synchronize(ev);
      raise_if_failed();
      cu::check(r, "cuEventSynchronize (a collective's end)");
    }
    cu::check(cu::api().stream_wait_event(cu::enter(device_), ev, 0), "cuStreamWaitEvent");
  }
  int device() const { return device_; }

 private:
  static void check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess && r != ncclInProgress)
      throw Error(std::string("NCCL ") + what + ": " + nccl().get_error_string(r));
  }

  static bool capturing(CUstream s) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cu::check(cu::api().stream_is_capturing(s, &st), "cuStreamIsCapturing");
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
  }

  // Whether collectives may be recorded into CUDA graphs (KILN_NCCL_GRAPHS=1). Off by default:
  // the compiled GPT data-parallel step replays as one graph with its NCCL calls, but a compiled
  // function returning the collectives' results directly hung on 2 and 4 H100s (not understood
  // yet); without it a graph being recorded refuses the collective and the program runs step by
  // step.
  static bool graphs_allowed() {
    static const bool on = [] {
      const char* v = std::getenv("KILN_NCCL_GRAPHS");
      return v && std::string(v) == "1";
    }();
    return on;
  }

  // Queues `call` on the communication stream, ordered after the work queued on kiln's stream.
  // While kiln's stream records a CUDA graph (KILN_NCCL_GRAPHS=1) the fork and the join below are
  // recorded too: the graph holds the collective on a branch of its own (every rank replays its
  // graph at the same call of the compiled function, so the collectives still meet in one order).
  template <class F>
  CompletionPtr enqueue(const char* what, F&& call) {
    CUstream compute = cu::enter(device_);
    const bool recording = capturing(compute);
    KILN_CHECK(!recording || graphs_allowed(), "NCCL ", what,
               " is not recorded into a CUDA graph (KILN_NCCL_GRAPHS=1 allows it)");
    if (!recording) note_issuing_thread();
    const auto& api = cu::api();
    CUevent ready = nullptr, end = nullptr;
    cu::check(api.event_create(&ready, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    cu::check(api.event_record(ready, compute), "cuEventRecord");
    cu::check(api.stream_wait_event(comm_stream_, ready, 0), "cuStreamWaitEvent");
    api.event_destroy(ready);
    const ncclResult_t r = call_on_comm(call);
    if (r != ncclSuccess) {
      const char* last = nccl().get_last_error(comm_);
      throw Error(std::string("NCCL ") + what + ": " + nccl().get_error_string(r) +
                  (last && *last ? std::string(" (") + last + ")" : ""));
    }
    cu::check(api.event_create(&end, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    cu::check(api.event_record(end, comm_stream_), "cuEventRecord");
    if (!recording) watch_stream(comm_stream_, what);
    return std::make_shared<NcclCompletion>(this, end);
  }

  // Runs `call` on the communicator unless it failed (then throws the failure): an abort asked
  // for meanwhile waits until the call returns (abort_locked defers it; the last call out does it).
  template <class F>
  ncclResult_t call_on_comm(F& call) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_.empty()) throw Error(failure_);
      ++in_call_;
    }
    ncclResult_t r = ncclInternalError;
    try {
      r = call(comm_stream_);
    } catch (...) {
      leave_call();
      throw;
    }
    leave_call();
    return r;
  }
  void leave_call() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--in_call_ == 0 && aborted_ && !comm_aborted_) abort_comm();
  }

  // The watchdog follows the work queued on `stream` so far.
  void watch_stream(CUstream stream, const char* what) {
    CUevent watched = nullptr;
    cu::check(cu::api().event_create(&watched, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    cu::check(cu::api().event_record(watched, stream), "cuEventRecord");
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back({watched, std::chrono::steady_clock::now(), what});
    }
    cv_.notify_all();
  }

  // The watchdog: aborts the communicator when a collective outlives the timeout or NCCL
  // reports an asynchronous error, so that no rank hangs on a peer that is gone.
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (stop_) continue;
      if (aborted_) {  // deferred while a thread is inside an NCCL call: one hung past the timeout is cut
        if (!comm_aborted_ && std::chrono::steady_clock::now() - aborted_at_ > timeout_) abort_comm();
        continue;
      }
      try {
        cu::make_current(device_);  // (this thread only queries events and the communicator)
      } catch (...) {
        continue;
      }
      while (!pending_.empty() && cu::api().event_query(pending_.front().ev) == CUDA_SUCCESS) {
        cu::api().event_destroy(pending_.front().ev);
        pending_.pop_front();
      }
      ncclResult_t async = ncclSuccess;
      if (in_call_ == 0) nccl().comm_get_async_error(comm_, &async);
      const auto now = std::chrono::steady_clock::now();
      std::string gone;
      if (!pending_.empty() && peers_gone_) {
        lock.unlock();  // (reads /proc and the store: not under the lock the callers take)
        gone = peers_gone_();
        lock.lock();
        if (stop_ || aborted_) continue;
      }
      if (async != ncclSuccess && async != ncclInProgress) {
        abort_locked(std::string("asynchronous NCCL error: ") + nccl().get_error_string(async) +
                     (gone.empty() ? "" : " (" + gone + ")"));
      } else if (!gone.empty()) {
        abort_locked(std::string(pending_.front().what) + " cannot finish: " + gone +
                     "; the communicator was aborted");
      } else if (!pending_.empty() && now - pending_.front().start > timeout_) {
        abort_locked(std::string(pending_.front().what) + " did not finish within " + std::to_string(timeout_.count()) +
                     " ms (a rank stopped taking part); the communicator was aborted");
      }
    }
  }

  // Records the failure; the communicator is aborted now, or when the thread inside an NCCL
  // call on it returns (the watchdog aborts under a call hung past the timeout).
  void abort_locked(const std::string& why) {
    if (aborted_) return;
    failure_ = "dist: NCCL on cuda:" + std::to_string(device_) + ": " + why;
    aborted_ = true;
    aborted_at_ = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(verdict_->mu);
      verdict_->failure = failure_;
    }
    if (in_call_ == 0) abort_comm();
  }
  void abort_comm() {
    comm_aborted_ = true;
    nccl().comm_abort(comm_);  // in-flight kernels exit; the device stays usable (comm_ is not used again)
  }

  struct Pending {
    CUevent ev;
    std::chrono::steady_clock::time_point start;
    const char* what;
  };
  int device_;
  std::chrono::milliseconds timeout_;
  int size_;
  ncclComm_t comm_ = nullptr;
  CUstream comm_stream_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::function<std::string()> peers_gone_;
  struct Verdict {
    std::mutex mu;
    std::string failure;
    std::function<void()> settle;
  };
  std::shared_ptr<Verdict> verdict_ = std::make_shared<Verdict>();
  int sync_listener_ = 0;
  std::string failure_;
  bool aborted_ = false, comm_aborted_ = false, stop_ = false;
  int in_call_ = 0;  // threads inside an NCCL call on comm_
  std::chrono::steady_clock::time_point aborted_at_;
  std::thread watchdog_;
  int listener_ = 0;
};

NcclCompletion::~NcclCompletion() { cu::api().event_destroy(ev_); }
void NcclCompletion::wait() { b_->make_stream_wait(ev_); }

}  // namespace

std::string unavailable_reason() { return nccl().reason; }

std::unique_ptr<Backend> make_backend(const GroupSpec& spec) {
  KILN_CHECK(nccl().reason.empty(), "NCCL is unavailable: ", nccl().reason);
  return std::make_unique<NcclBackend>(spec);
}

}  // namespace kiln::dist::nccl_impl
