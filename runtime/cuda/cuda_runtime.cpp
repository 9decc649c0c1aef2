#include "runtime/cuda/cuda_runtime.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/pool_allocator.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/cublas.h"
#include "runtime/cuda/cublaslt.h"
#include "runtime/cuda/device_ops.h"
#include "runtime/cuda/driver.h"
#include "runtime/cuda/launch_queue.h"
#include "runtime/exec/device_runtime.h"
#include "runtime/exec/executor.h"

namespace kiln::cu {
namespace {

void wait(int index);
void wait_stream(int index);

// The graph this thread is recording, if any: device `index`'s work goes to `stream` (captured,
// not run) and its allocations come from `pool`, the graph's private memory.
struct Capture {
  int index = -1;
  CUstream stream = nullptr;
  std::shared_ptr<CachingAllocator> pool;
  bool reports_index_errors = false;  // a recorded kernel may write the index-error record
};
thread_local Capture* t_capture = nullptr;

bool capturing(int index) { return t_capture && t_capture->index == index; }

// Device memory straight from the driver (the caching allocator's source).
class DriverMemory final : public RawMemory {
 public:
  explicit DriverMemory(int index) : index_(index) {}
  void* alloc(size_t bytes) override {
    enter(index_);
    CUdeviceptr p = 0;
    CUresult r = api().mem_alloc(&p, bytes);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
    check(r, "cuMemAlloc");
    return reinterpret_cast<void*>(p);
  }
  void free(void* p) override {
    // Kernels queued on the stream may still use the block: wait for them first (a pending
    // index error stays for the next sync()). Legal while this thread records a graph: the
    // device's stream is not the one recorded.
    wait_stream(index_);
    check(api().mem_free(reinterpret_cast<CUdeviceptr>(p)), "cuMemFree");
  }
  size_t total_bytes() const override {
    size_t total = 0;
    check(api().device_total_mem(&total, device(index_)), "cuDeviceTotalMem");
    return total;
  }

 private:
  int index_;
};

// A graph's private memory, borrowed from the device's caching allocator in whole segments: a
// graph recorded after a normal run reuses the blocks that run freed instead of asking the
// driver (cuMemAlloc takes milliseconds). Returned blocks go back to that allocator, whose next
// users queue after every replay on the same stream.
class BorrowedMemory final : public RawMemory {
 public:
  explicit BorrowedMemory(CachingAllocator& from) : from_(from) {}
  void* alloc(size_t bytes) override {
    try {
      return from_.allocate(bytes);
    } catch (const Error&) {
      return nullptr;  // out of memory: the pool reports it
    }
  }
  void free(void* p) override { from_.free(p); }
  size_t total_bytes() const override { return 0; }

 private:
  CachingAllocator& from_;
};

constexpr size_t kErrorBytes = 5 * sizeof(int64_t);  // the index-error record

struct DeviceState {
  std::once_flag once;
  CUstream stream = nullptr;
  std::unique_ptr<CachingAllocator> allocator;
  std::mutex mu;  // last_kernel
  char last_kernel[128] = {};  // the last kernel queued, cut to 127 chars (named by errors found at a sync;
                               // a fixed buffer: noting a launch allocates nothing)
  CUdeviceptr errors = 0;  // the index-error record (index_error_record)
  std::atomic<int64_t> unchecked{0};  // kernels queued that may have written it since it was read
  std::mutex errors_mu;  // reading and resetting the record
  std::mutex capture_mu;  // capture_streams
  std::vector<CUstream> capture_streams;  // streams free for recording graphs (kept: cuBLAS keys state by stream)
  std::unique_ptr<LaunchQueue> queue;  // generated kernels' launches (null: launched by the caller)
};

// Per device; created on first use and never destroyed (storages freed at exit still reach it).
// Every launch reaches its device's state: after the first use that takes no lock.
constexpr int kMaxDevices = 64;
DeviceState& state(int index) {
  static std::array<std::atomic<DeviceState*>, kMaxDevices> states{};
  KILN_CHECK(index >= 0 && index < std::min(device_count(), kMaxDevices), "cuda: no device ", index, " (",
             device_count(), " found)");
  if (DeviceState* s = states[index].load(std::memory_order_acquire)) return *s;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!states[index].load(std::memory_order_relaxed)) states[index].store(new DeviceState, std::memory_order_release);
  return *states[index].load(std::memory_order_relaxed);
}

// The device whose context this thread made current last (-1: none yet). Kernels of another
// context would fail to launch with an error, so a library switching contexts is not silent.
thread_local int t_current = -1;

DeviceState& ready(int index) {
  DeviceState& s = state(index);
  if (t_current != index) {
    make_current(index);
    t_current = index;
  }
  std::call_once(s.once, [&] {
    check(api().stream_create(&s.stream, CU_STREAM_DEFAULT), "cuStreamCreate");
    check(api().mem_alloc(&s.errors, kErrorBytes), "cuMemAlloc");
    check(api().memset_d8_async(s.errors, 0, kErrorBytes, s.stream), "cuMemsetD8Async");
    s.allocator =
        std::make_unique<CachingAllocator>(std::make_unique<DriverMemory>(index), "cuda:" + std::to_string(index));
    if (LaunchQueue::enabled()) s.queue = std::make_unique<LaunchQueue>(index, s.stream);
  });
  return s;
}

// Waits for device `index`'s stream; a failed kernel becomes a kiln::Error naming the last
// kernel queued.
void wait(int index) {
  KILN_CHECK(!capturing(index), "cuda: the host waits for cuda:", index,
             " while a CUDA graph is recorded (the work reads a device value on the host)");
  wait_stream(index);
}

void wait_stream(int index) {
  DeviceState& s = ready(index);
  if (s.queue) s.queue->drain();
  CUresult r = api().stream_synchronize(s.stream);
  if (r == CUDA_SUCCESS) return;
  std::string last;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    last = s.last_kernel;  // (a copy, taken on the error path only)
  }
  check(r,
        ("a kernel on cuda:" + std::to_string(index) + " failed (last queued: " + (last.empty() ? "none" : last) + ")")
            .c_str());
}

// Runs node `n` with the reference kernels on the host: inputs copied to host memory, the
// result copied back. The path of ops that have no device kernel yet (logged once per op).
void run_on_host(Node& n) {
  static std::mutex mu;
  static std::set<OpKind> told;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (told.insert(n.op).second && std::getenv("KILN_LOG") && std::strstr(std::getenv("KILN_LOG"), "fallback"))
      std::fprintf(stderr, "[kiln fallback] %s on %s runs on the host (no device kernel yet)\n", op_name(n.op),
                   n.device.str().c_str());
  }
  NodePtr host = new_node();
  host->op = n.op;
  host->attrs = n.attrs;
  host->dtype = n.dtype;
  host->shape = n.shape;
  host->strides = n.strides;
  host->offset = n.offset;
  for (const NodePtr& in : n.inputs) {
    NodePtr h = new_node();
    h->dtype = in->dtype;
    h->shape = in->shape;
    h->strides = in->strides;
    h->offset = in->offset;
    auto s = Storage::allocate(in->storage->nbytes, cpu(), "host fallback input");
    if (in->storage->nbytes)
      device_runtime(in->device).copy(s->data, cpu(), in->storage->data, in->device, in->storage->nbytes);
    h->set_storage(std::move(s));
    host->inputs.push_back(std::move(h));
  }
  interpret_node(*host);
  auto out = Storage::allocate(host->storage->nbytes, n.device, op_name(n.op));
  if (out->nbytes) device_runtime(n.device).copy(out->data, n.device, host->storage->data, cpu(), out->nbytes);
  n.set_storage(std::move(out), false);
}

std::atomic<int> g_jit_device{0};
std::atomic<bool> g_jit_device_locked{false};

class CudaRuntime final : public DeviceRuntime {
 public:
  void select_device(int index) override { cu::select_jit_device(index); }
  int selected_device() const override { return cu::jit_device(); }
  bool available() const override { return cu::available(); }
  std::string unavailable_reason() const override { return cu::unavailable_reason(); }
  int device_count() const override { return cu::device_count(); }

  bool tensor_core_attention(int index) override {  // (the flash kernels: mma.sync, sm_80 and later)
    return cu::compute_capability(index) >= 80 && cu::have_nvrtc();
  }

  std::shared_ptr<Storage> allocate(size_t nbytes, int index) override {
    CachingAllocator* a = ready(index).allocator.get();
    auto s = std::allocate_shared<Storage>(detail::PoolAllocator<Storage>());  // (pooled: no malloc per launch)
    s->nbytes = nbytes;
    s->device = Device{DeviceType::CUDA, index};
    if (capturing(index)) {  // the graph's own memory, kept while anything from it lives
      std::shared_ptr<CachingAllocator> pool = t_capture->pool;
      s->data = pool->allocate(nbytes);
      s->deleter = [pool](void* p) { pool->free(p); };
      return s;
    }
    s->data = a->allocate(nbytes);
    s->deleter = [a](void* p) { a->free(p); };
    return s;
  }

  void copy(void* dst, Device to, const void* src, Device from, size_t nbytes) override {
    KILN_CHECK(from.type == to.type || !t_capture, "cuda: a copy between ", from.str(), " and ", to.str(),
               " while a CUDA graph is recorded (a graph replays device work only)");
    const auto d = reinterpret_cast<CUdeviceptr>(dst);
    const auto s = reinterpret_cast<CUdeviceptr>(src);
    if (to.type == DeviceType::CPU) {  // device -> host: the host reads it next, so wait
      CUstream st = enter(from.index);
      check(api().memcpy_dtoh_async(dst, s, nbytes, st), "cuMemcpyDtoHAsync");
      sync(from.index);
    } else if (from.type == DeviceType::CPU) {  // host -> device: pageable memory is staged before this returns
      check(api().memcpy_htod_async(d, src, nbytes, enter(to.index)), "cuMemcpyHtoDAsync");
    } else if (from.index == to.index) {
      check(api().memcpy_dtod_async(d, s, nbytes, enter(to.index)), "cuMemcpyDtoDAsync");
    } else {  // between two GPUs: through the host (ordered after both streams' work)
      std::vector<char> tmp(nbytes);
      copy(tmp.data(), cpu(), src, from, nbytes);
      copy(dst, to, tmp.data(), cpu(), nbytes);
      sync(to.index);
    }
  }

  void run_node(Node& n) override {
    enter(n.device.index);
    if (n.op == OpKind::Matmul && gemm(n)) return;
    if (run_device_op(n)) return;
    run_on_host(n);
  }

  void synchronize(int index) override { sync(index); }

  std::shared_ptr<void> timing_mark(int index) override {
    if (capturing(index) || !api().event_create) return nullptr;
    CUstream stream = enter(index);
    CUevent ev = nullptr;
    check(api().event_create(&ev, CU_EVENT_DEFAULT), "cuEventCreate");
    std::shared_ptr<void> mark(ev, [](void* e) { api().event_destroy(static_cast<CUevent>(e)); });
    check(api().event_record(ev, stream), "cuEventRecord");
    return mark;
  }
  double elapsed_us(const std::shared_ptr<void>& from, const std::shared_ptr<void>& to) override {
    check(api().event_synchronize(static_cast<CUevent>(to.get())), "cuEventSynchronize");
    float ms = 0;
    check(api().event_elapsed_time(&ms, static_cast<CUevent>(from.get()), static_cast<CUevent>(to.get())),
          "cuEventElapsedTime");
    return static_cast<double>(ms) * 1e3;
  }

  bool gemm_bias(Node& out, const Node& a, const Node& b, const Node& bias, bool relu) override {
    return cu::gemm_bias(out, a, b, bias, relu);
  }

  std::unique_ptr<DeviceGraph> capture(int index, const std::function<void()>& work, std::string& why,
                                       std::unique_ptr<DeviceGraph> reuse) override;

  MemoryStats memory_stats(int index) override { return ready(index).allocator->stats(); }
  void reset_peak_memory_stats(int index) override { ready(index).allocator->reset_peak_stats(); }
  void empty_cache() override {
    for (int i = 0; i < cu::device_count(); ++i) ready(i).allocator->empty_cache();
  }
};

// A recorded graph, instantiated, with the private pool its work allocated from.
class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(int index, CUgraph graph, CUgraphExec exec, std::shared_ptr<CachingAllocator> pool, bool reports,
            size_t size, bool updated)
      : index_(index),
        graph_(graph),
        exec_(exec),
        pool_(std::move(pool)),
        reports_(reports),
        size_(size),
        updated_(updated),
        name_("a CUDA graph of " + std::to_string(size) + " operations") {}
  ~CudaGraph() override {
    // (replays still queued finish first: the driver defers the release)
    if (exec_) api().graph_exec_destroy(exec_);
    api().graph_destroy(graph_);
  }
  void launch() override {
    std::lock_guard<std::mutex> lock(blas_mutex());  // (its captured GEMMs use the BLAS workspace)
    CUstream stream = enter(index_);
    check(api().graph_launch(exec_, stream), "cuGraphLaunch");
    note_launch(index_, name_, reports_);
    notify_graph_launch(index_, stream);
  }
  size_t size() const override { return size_; }
  bool owns(const void* p) const override { return pool_->owns(p); }
  size_t pool_bytes() const override { return static_cast<size_t>(pool_->stats().reserved_bytes); }
  bool updated() const override { return updated_; }

  // Updates this graph's executable to `graph`'s operations and hands it over (null when the
  // two differ in shape: the executable stays as it was, and is destroyed with this graph).
  CUgraphExec take_updated(int index, CUgraph graph) {
    if (index != index_ || !exec_ || !api().graph_exec_update) return nullptr;
    CUgraphExecUpdateResultInfo info{};
    if (api().graph_exec_update(exec_, graph, &info) != CUDA_SUCCESS) return nullptr;
    return std::exchange(exec_, nullptr);
  }

 private:
  int index_;
  CUgraph graph_;
  CUgraphExec exec_;
  std::shared_ptr<CachingAllocator> pool_;
  bool reports_;
  size_t size_;
  bool updated_;
  std::string name_;  // for errors found at a later sync
};

std::unique_ptr<DeviceGraph> CudaRuntime::capture(int index, const std::function<void()>& work, std::string& why,
                                                  std::unique_ptr<DeviceGraph> reuse) {
  KILN_CHECK(!t_capture, "cuda: CUDA graph recordings do not nest");
  DeviceState& ds = ready(index);
  Capture c;
  c.index = index;
  c.pool = std::make_shared<CachingAllocator>(std::make_unique<BorrowedMemory>(*ds.allocator),
                                              "cuda:" + std::to_string(index) + " (graph memory)");
  // Recorded on a stream of its own (other threads keep queueing on the device's stream), kept
  // for later recordings: libraries keep per-stream state (cuBLAS its workspace) made once.
  {
    std::lock_guard<std::mutex> lock(ds.capture_mu);
    if (!ds.capture_streams.empty()) {
      c.stream = ds.capture_streams.back();
      ds.capture_streams.pop_back();
    }
  }
  if (!c.stream) check(api().stream_create(&c.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  struct GiveBack {
    DeviceState& ds;
    CUstream s;
    ~GiveBack() {
      std::lock_guard<std::mutex> lock(ds.capture_mu);
      ds.capture_streams.push_back(s);
    }
  } give_back{ds, c.stream};
  // Relaxed: the private pool may take segments from cuMemAlloc while recording.
  check(api().stream_begin_capture(c.stream, CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture");
  t_capture = &c;
  std::string failed;
  try {
    work();
  } catch (const std::exception& e) {
    failed = e.what();
  }
  t_capture = nullptr;
  CUgraph graph = nullptr;
  CUresult r = api().stream_end_capture(c.stream, &graph);
  if (failed.empty() && r != CUDA_SUCCESS) {
    const char* name = nullptr;
    api().get_error_name(r, &name);
    failed = std::string("cuStreamEndCapture: ") + (name ? name : "error");
  }
  if (!failed.empty()) {
    if (graph) api().graph_destroy(graph);
    why = failed;
    return nullptr;
  }
  size_t size = 0;
  check(api().graph_get_nodes(graph, nullptr, &size), "cuGraphGetNodes");
  // An executable no longer wanted is updated in place when the operations line up (far cheaper
  // than instantiating); else a fresh one.
  CUgraphExec exec = nullptr;
  if (auto* old = dynamic_cast<CudaGraph*>(reuse.get())) exec = old->take_updated(index, graph);
  reuse.reset();
  const bool updated = exec != nullptr;
  if (!exec) {
    r = api().graph_instantiate(&exec, graph, 0);
    if (r != CUDA_SUCCESS) {
      api().graph_destroy(graph);
      check(r, "cuGraphInstantiate");
    }
  }
  return std::make_unique<CudaGraph>(index, graph, exec, std::move(c.pool), c.reports_index_errors, size, updated);
}

const bool g_registered = [] {
  static CudaRuntime rt;
  register_device_runtime(DeviceType::CUDA, &rt);
  return true;
}();

}  // namespace

namespace {
std::mutex& g_listeners_mu = *new std::mutex;
auto& g_listeners = *new std::map<int, std::function<void(int, CUstream)>>;
int g_next_listener = 1;
}  // namespace

int add_graph_launch_listener(std::function<void(int, CUstream)> fn) {
  std::lock_guard<std::mutex> lock(g_listeners_mu);
  g_listeners[g_next_listener] = std::move(fn);
  return g_next_listener++;
}

void remove_graph_launch_listener(int id) {
  std::lock_guard<std::mutex> lock(g_listeners_mu);
  g_listeners.erase(id);
}

void notify_graph_launch(int index, CUstream stream) {
  std::lock_guard<std::mutex> lock(g_listeners_mu);
  for (auto& [id, fn] : g_listeners) fn(index, stream);
}

namespace {
std::mutex& g_sync_mu = *new std::mutex;
auto& g_sync_listeners = *new std::map<int, std::shared_ptr<std::function<void(int)>>>;
std::atomic<int> g_sync_count{0};  // listeners registered (sync() skips the lock when none)
int g_next_sync = 1;
}  // namespace

int add_sync_listener(std::function<void(int)> fn) {
  std::lock_guard<std::mutex> lock(g_sync_mu);
  g_sync_listeners[g_next_sync] = std::make_shared<std::function<void(int)>>(std::move(fn));
  g_sync_count.store(static_cast<int>(g_sync_listeners.size()));
  return g_next_sync++;
}

void remove_sync_listener(int id) {
  std::lock_guard<std::mutex> lock(g_sync_mu);
  g_sync_listeners.erase(id);
  g_sync_count.store(static_cast<int>(g_sync_listeners.size()));
}

namespace {
// Runs the sync listeners (not under the lock: one may wait for peers).
void notify_sync(int index) {
  if (g_sync_count.load() == 0) return;
  std::vector<std::shared_ptr<std::function<void(int)>>> fns;
  {
    std::lock_guard<std::mutex> lock(g_sync_mu);
    for (auto& [id, fn] : g_sync_listeners) fns.push_back(fn);
  }
  for (auto& fn : fns) (*fn)(index);
}
}  // namespace

int jit_device() { return g_jit_device.load(std::memory_order_relaxed); }

void select_jit_device(int index) {
  if (index == g_jit_device.load()) return;
  KILN_CHECK(!g_jit_device_locked.load(), "cuda::set_device(", index, "): kiln's kernels already run on cuda:",
             g_jit_device.load(), "; set the device before the first CUDA operation");
  g_jit_device.store(index);
}

void lock_jit_device() { g_jit_device_locked.store(true); }

CUstream enter(int index) {
  DeviceState& s = ready(index);
  if (capturing(index)) return t_capture->stream;
  if (s.queue) s.queue->drain();
  return s.stream;
}

void issue_launches(int index) noexcept {
  try {
    DeviceState& s = ready(index);
    if (s.queue) s.queue->drain(false);
  } catch (...) {  // (a launch failing inside is recorded, not thrown)
  }
}

void launch_kernel(int index, CUfunction fn, unsigned blocks, unsigned threads, unsigned shared, long long begin,
                   long long end, const uint64_t* args, int nargs, const std::string& name) {
  DeviceState& s = ready(index);
  if (s.queue && !capturing(index) && s.queue->push(fn, blocks, threads, shared, begin, end, args, nargs, name)) return;
  CUstream stream = enter(index);
  void* params[] = {&begin, &end, const_cast<uint64_t*>(args)};
  const CUresult r = api().launch_kernel(fn, blocks, 1, 1, threads, 1, 1, shared, stream, params, nullptr);
  if (r != CUDA_SUCCESS) check(r, ("cuLaunchKernel (" + name + ")").c_str());  // (message built on failure only)
}

void note_launch(int index, const std::string& kernel, bool reports_index_errors) {
  if (capturing(index)) {  // recorded, not run: the graph's launches note it
    t_capture->reports_index_errors |= reports_index_errors;
    return;
  }
  DeviceState& s = state(index);
  // Counted after the launch: a sync() that sees the count reads the record after the kernel.
  if (reports_index_errors) s.unchecked.fetch_add(1);
  std::lock_guard<std::mutex> lock(s.mu);
  const size_t n = std::min(kernel.size(), sizeof s.last_kernel - 1);
  std::memcpy(s.last_kernel, kernel.data(), n);
  s.last_kernel[n] = 0;
}

CUdeviceptr index_error_record(int index) { return ready(index).errors; }

void sync(int index) {
  wait(index);
  notify_sync(index);
  DeviceState& s = ready(index);
  if (s.unchecked.load() == 0) return;
  std::lock_guard<std::mutex> lock(s.errors_mu);
  if (s.unchecked.exchange(0) == 0) return;
  int64_t rec[5] = {};
  check(api().memcpy_dtoh_async(rec, s.errors, sizeof(rec), s.stream), "cuMemcpyDtoHAsync");
  wait(index);
  if (!rec[0]) return;
  check(api().memset_d8_async(s.errors, 0, kErrorBytes, s.stream), "cuMemsetD8Async");
  const auto op = static_cast<OpKind>(rec[1]);
  const char* name = rec[1] >= 0 && rec[1] < static_cast<int64_t>(OpKind::NumOps) ? op_name(op) : "index";
  // The kinds of kernels/cuda/device_kernels.cpp, worded as kernels/cpu/pointwise.cpp's errors.
  if (rec[0] == 2) throw Error(detail::cat(name, ": integer division by zero"));
  if (rec[0] == 3) throw Error(detail::cat(name, ": integers to negative integer powers are not allowed"));
  throw Error(detail::cat(name, ": index ", rec[2], " is out of bounds for dimension ", rec[3], " with size ", rec[4]));
}

}  // namespace kiln::cu
