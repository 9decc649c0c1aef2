// The registry of device runtimes, and kiln::cuda's static members on top of it.
#include "runtime/exec/device_runtime.h"

#include <array>
#include <atomic>

#include "runtime/core/error.h"
#include "runtime/exec/memory_ledger.h"
#include "runtime/ops/ops.h"

namespace kiln {
namespace {
std::array<std::atomic<DeviceRuntime*>, 2> g_runtimes{};

DeviceRuntime* usable_cuda() {
  DeviceRuntime* rt = find_device_runtime(DeviceType::CUDA);
  return rt && rt->available() ? rt : nullptr;
}
}  // namespace

void register_device_runtime(DeviceType type, DeviceRuntime* rt) {
  g_runtimes[static_cast<size_t>(type)].store(rt, std::memory_order_release);
}

DeviceRuntime* find_device_runtime(DeviceType type) {
  return g_runtimes[static_cast<size_t>(type)].load(std::memory_order_acquire);
}

DeviceRuntime& device_runtime(Device device) {
  DeviceRuntime* rt = find_device_runtime(device.type);
  KILN_CHECK(rt, "cannot use ", device.str(), ": this kiln was built without CUDA (KILN_CUDA=OFF)");
  KILN_CHECK(rt->available(), "cannot use ", device.str(), ": CUDA is not available (", rt->unavailable_reason(), ")");
  KILN_CHECK(device.index >= 0 && device.index < rt->device_count(), "cannot use ", device.str(),
             ": invalid device ordinal (", rt->device_count(), " CUDA device", rt->device_count() == 1 ? "" : "s",
             " found)");
  return *rt;
}

namespace {
std::atomic<int> g_matmul_precision{0};  // 0 highest, 1 high, 2 medium
const char* const kPrecisions[] = {"highest", "high", "medium"};
}  // namespace

void set_float32_matmul_precision(const std::string& precision) {
  for (int i = 0; i < 3; ++i)
    if (precision == kPrecisions[i]) {
      g_matmul_precision.store(i);
      return;
    }
  throw Error("set_float32_matmul_precision: expected \"highest\", \"high\" or \"medium\", got \"" + precision + "\"");
}

std::string get_float32_matmul_precision() { return kPrecisions[g_matmul_precision.load()]; }

bool float32_matmul_allows_tf32() { return g_matmul_precision.load() > 0; }

bool cuda::is_available() { return usable_cuda() != nullptr; }

int cuda::device_count() {
  DeviceRuntime* rt = usable_cuda();
  return rt ? rt->device_count() : 0;
}

void cuda::synchronize() {
  if (DeviceRuntime* rt = usable_cuda())
    for (int i = 0; i < rt->device_count(); ++i) rt->synchronize(i);
}

MemoryStats cuda::memory_stats(int index) { return device_runtime(cuda(index)).memory_stats(index); }
void cuda::memory_snapshot(const std::string& path, int index) { memory_ledger_snapshot(path, cuda(index)); }
void host_memory_snapshot(const std::string& path) { memory_ledger_snapshot(path, cpu()); }

void cuda::reset_peak_memory_stats(int index) {
  device_runtime(cuda(index)).reset_peak_memory_stats(index);
  if (memory_ledger_on()) memory_ledger_reset_peak(cuda(index));
}

void cuda::set_device(int index) {
  DeviceRuntime& rt = device_runtime(cuda(index));  // (checks the index)
  rt.select_device(index);
}

int cuda::current_device() {
  DeviceRuntime* rt = usable_cuda();
  return rt ? rt->selected_device() : 0;
}

void cuda::empty_cache() {
  if (DeviceRuntime* rt = usable_cuda()) rt->empty_cache();
}

namespace {
std::atomic<KernelImageStore*> g_image_store{nullptr};
}  // namespace

void set_kernel_image_store(KernelImageStore* store) { g_image_store.store(store, std::memory_order_release); }
KernelImageStore* kernel_image_store() { return g_image_store.load(std::memory_order_acquire); }

}  // namespace kiln
