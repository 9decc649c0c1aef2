// The device-runtime seam: how runtime/ reaches memory, copies and library kernels of a device
// other than the host CPU without knowing its driver. runtime/cuda registers the CUDA one when
// kiln is built with KILN_CUDA; without it every CUDA request throws a clear kiln::Error.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "runtime/core/device.h"
#include "runtime/ir/node.h"

namespace kiln {

// Device work recorded once and replayed with one launch (a CUDA graph). The memory the work
// allocated while it was recorded belongs to the graph: replays write the same addresses.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  // Queues one replay on the device's stream.
  virtual void launch() = 0;
  // Number of operations recorded (kernels, GEMMs, copies, memsets).
  virtual size_t size() const = 0;
  // Whether `p` lies in the graph's private memory.
  virtual bool owns(const void* p) const = 0;
  // Bytes of device memory the graph's private pool holds.
  virtual size_t pool_bytes() const = 0;
  // Whether it was made by updating another graph's executable in place (no instantiation).
  virtual bool updated() const { return false; }
};

// One device type's runtime (CUDA). Work is ordered on one stream per device: calls return
// once the work is queued, except where a host address is written or read.
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  // Whether a device of this type can be used, and why not ("" when it can).
  virtual bool available() const = 0;
  virtual std::string unavailable_reason() const = 0;
  // Number of devices (0 when unavailable).
  virtual int device_count() const = 0;
  // Fresh memory of `nbytes` on device `index`, freed (stream-ordered) with the storage.
  virtual std::shared_ptr<Storage> allocate(size_t nbytes, int index) = 0;
  // Copies `nbytes` from `src` on `from` to `dst` on `to` (one of them this device type).
  // Returns after the copy when `to` is the host; otherwise once it is queued.
  virtual void copy(void* dst, Device to, const void* src, Device from, size_t nbytes) = 0;
  // Computes node `n` on its device (inputs materialized on that device): the ops that are not
  // generated kernels (GEMM, indexing, scans, random numbers, conversions ...).
  virtual void run_node(Node& n) = 0;
  // Computes `out` = a b + bias, then ReLU when `relu`, as one GEMM with its epilogue (cuBLASLt
  // on CUDA): `a` [M, K], `b` [K, N], `bias` [N] (or broadcast over rows) materialized on out's
  // device. False, computing nothing, when the device cannot (then GEMM and epilogue run apart).
  virtual bool gemm_bias(Node& out, const Node& a, const Node& b, const Node& bias, bool relu) { return false; }
  // The device generated kernels load into (cuda::set_device); see there.
  virtual void select_device(int index) {}
  virtual int selected_device() const { return 0; }
  // Waits until all work queued on device `index` has finished (raising its errors).
  virtual void synchronize(int index) = 0;
  // Device-side timing (KILN_PROFILE): a mark queued on device `index`'s stream after the work
  // queued so far, or null when the device cannot time now (recording a graph, no events);
  // elapsed_us waits for `to` and gives the device time between the two marks.
  virtual std::shared_ptr<void> timing_mark(int index) { return nullptr; }
  virtual double elapsed_us(const std::shared_ptr<void>& from, const std::shared_ptr<void>& to) { return 0; }
  // The allocator of device `index`: counters, peak reset, and releasing cached blocks.
  virtual MemoryStats memory_stats(int index) = 0;
  virtual void reset_peak_memory_stats(int index) = 0;
  virtual void empty_cache() = 0;
  // Whether device `index` runs fused attention over 16-bit and float32 inputs on its own
  // tensor-core kernels; where it does not, scaled_dot_product_attention under Auto materializes
  // the scores of 16-bit inputs there (float32: by size).
  virtual bool tensor_core_attention(int index) { return false; }
  // Records the device work `work` queues on device `index` from this thread into a graph,
  // without running it. Memory `work` allocates on that device comes from a pool private to the
  // graph (kept while the graph or a storage from it lives). Returns null and says why in `why`
  // when the work cannot be recorded (it waits for the device or copies to or from the host).
  // `reuse`, a graph of the same device no longer wanted (same work at other sizes, say), is
  // taken: its executable is updated in place to the new recording when the two have the same
  // shape of operations, else dropped.
  virtual std::unique_ptr<DeviceGraph> capture(int index, const std::function<void()>& work, std::string& why,
                                               std::unique_ptr<DeviceGraph> reuse = nullptr) {
    why = "this device type records no graphs";
    return nullptr;
  }
};

// Where device runtimes keep compiled library kernels across processes. The JIT's disk cache
// registers one at load (under KILN_CACHE_DIR); without it nothing is kept.
class KernelImageStore {
 public:
  virtual ~KernelImageStore() = default;
  // The image stored under `key` (compared in full); false when there is none.
  virtual bool read(const std::string& key, std::string& image) = 0;
  // Stores `image` under `key`.
  virtual void write(const std::string& key, const std::string& image) = 0;
};
// Sets the store (null: none); the store must live as long as the process.
KILN_API void set_kernel_image_store(KernelImageStore* store);
// The store, or null.
KernelImageStore* kernel_image_store();

// Registers the runtime of a device type (called once, at load, by that runtime's library part).
KILN_API void register_device_runtime(DeviceType type, DeviceRuntime* rt);
// The runtime of a device type, or null when this build has none.
KILN_API DeviceRuntime* find_device_runtime(DeviceType type);
// The runtime of `device`'s type, checked usable for `device` (throws kiln::Error naming the
// device and the reason otherwise: not built with CUDA, no driver, index out of range).
KILN_API DeviceRuntime& device_runtime(Device device);

// Whether set_float32_matmul_precision allows TF32 for float32 GEMMs.
bool float32_matmul_allows_tf32();

}  // namespace kiln
