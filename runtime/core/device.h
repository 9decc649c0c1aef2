// Device: where a tensor's data lives. Every node carries one.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/core/export.h"

namespace kiln {

enum class DeviceType : uint8_t { CPU, CUDA };

// A device: type and index (index is 0 for the CPU).
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  // "cpu" or "cuda:0".
  std::string str() const { return type == DeviceType::CPU ? "cpu" : "cuda:" + std::to_string(index); }
};

// The host CPU.
inline Device cpu() { return Device{}; }

// A device allocator's counters (bytes and events since the process started).
struct MemoryStats {
  int64_t allocated_bytes = 0;  // bytes in blocks handed out now (rounded sizes)
  int64_t peak_allocated_bytes = 0;  // the most allocated_bytes reached (since the last reset)
  int64_t reserved_bytes = 0;  // bytes obtained from the driver now (blocks + cache)
  int64_t peak_reserved_bytes = 0;  // the most reserved_bytes reached (since the last reset)
  int64_t cached_bytes = 0;  // reserved but not handed out (reserved - allocated)
  int64_t num_allocs = 0;  // allocations served
  int64_t num_frees = 0;  // blocks given back
  int64_t num_segments = 0;  // driver allocations held now
  int64_t num_ooms = 0;  // allocations that failed after freeing the cache
  int64_t num_cache_hits = 0;  // allocations served from cached blocks
  int64_t num_splits = 0;  // cached blocks split to serve a smaller request
};

// Host memory held by tensor data (CPU storages from kiln's buffer pool): allocated now and at
// the peak since the last reset, cached (freed blocks kept for reuse), allocations and frees.
// The CPU counterpart of cuda::memory_stats (the bench's peak_alloc_mib on the CPU).
KILN_API MemoryStats host_memory_stats();
KILN_API void reset_peak_host_memory_stats();
// With KILN_PROFILE=memory: writes the host blocks live at the peak (bytes and the op that made
// each, largest first) as JSON to `path`, as PyTorch's memory snapshot. kiln::Error when the
// ledger is off or `path` cannot be written.
KILN_API void host_memory_snapshot(const std::string& path);

// CUDA device `index`: converts to Device{CUDA, index} (`x.to(kiln::cuda())`). The static
// members ask about and control the CUDA devices (`kiln::cuda::is_available()`).
struct KILN_API cuda {
  int index = 0;
  cuda(int i = 0) : index(i) {}
  operator Device() const { return Device{DeviceType::CUDA, index}; }
  // Whether kiln can use a CUDA device here (built with CUDA, driver found, >= 1 device).
  static bool is_available();
  // Number of CUDA devices (0 when unavailable).
  static int device_count();
  // Waits for all work queued on every CUDA device, raising any error it hit.
  static void synchronize();
  // Device `index`'s caching-allocator counters.
  static MemoryStats memory_stats(int index = 0);
  // Resets the peak counters of device `index` to the current values (with KILN_PROFILE=memory,
  // the profile's too: a snapshot then lists what is live now).
  static void reset_peak_memory_stats(int index = 0);
  // With KILN_PROFILE=memory: writes what was live on device `index` at its peak (each block's
  // bytes and the op that made it, largest first) as JSON to `path`, as PyTorch's
  // torch.cuda.memory._snapshot. kiln::Error when the ledger is off or `path` cannot be written.
  static void memory_snapshot(const std::string& path, int index = 0);
  // Gives every cached, unused block of every device back to the driver.
  static void empty_cache();
  // The device kiln's generated kernels run on in this process (default 0; other devices run
  // their ops one by one). Set it before the first kernel runs, as torch.cuda.set_device: one
  // process per GPU sets its LOCAL_RANK's device (init_process_group does it for NCCL groups).
  // kiln::Error for an index out of range, or once kernels were loaded on another device.
  static void set_device(int index);
  static int current_device();
};

}  // namespace kiln
