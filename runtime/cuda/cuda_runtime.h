// The CUDA device runtime: per device a context, one stream that orders all of kiln's work on
// that device, and a caching allocator. Registered as the DeviceRuntime of DeviceType::CUDA
// (runtime/exec/device_runtime.h); the CUDA backend launches its kernels on the same streams.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <functional>
#include <string>

namespace kiln::cu {

// Makes device `index`'s context current on the calling thread and returns its stream
// (created at first use), after issuing the launches queued on it (every other use of the
// stream comes after them). Throws kiln::Error when CUDA or that device is not usable.
CUstream enter(int index);

// Queues generated kernel `fn` (kiln's signature: begin, end, then `nargs` 8-byte argument
// slots passed by value) on device `index`'s stream. The device's launch thread issues it
// (runtime/cuda/launch_queue.h); while this thread records a graph, or for argument blocks the
// queue does not take, it is launched here. `name` must live until the queue is drained.
void launch_kernel(int index, CUfunction fn, unsigned blocks, unsigned threads, unsigned shared, long long begin,
                   long long end, const uint64_t* args, int nargs, const std::string& name);

// Issues the launches queued on device `index` (a failed one is reported by the next enter() or
// sync()); for code about to be unloaded.
void issue_launches(int index) noexcept;

// Records the name of the kernel just queued on device `index`, so that an error found at the
// next synchronization names it; `reports_index_errors`: the kernel may write the device's
// index-error record, which the next sync() then reads.
void note_launch(int index, const std::string& kernel, bool reports_index_errors = false);

// Device `index`'s error record, 5 int64 {kind, op, index, dim, size} in device memory, zero
// until a kernel meets an out-of-range index (kind 1), an integer division by zero (2) or a
// negative integer exponent (3); kind set by atomicCAS from 0: the first one wins; op is the
// OpKind's value.
CUdeviceptr index_error_record(int index);

// The device generated kernels are loaded into and launched on (kiln::cuda::set_device,
// default 0). lock_jit_device() fixes it (called when the first kernel is loaded).
int jit_device();
void select_jit_device(int index);
void lock_jit_device();

// Called after every CUDA-graph replay is queued on device `index`'s stream (the NCCL backend's
// watchdog follows the collectives a graph holds). Returns an id for removal.
int add_graph_launch_listener(std::function<void(int index, CUstream stream)> fn);
void remove_graph_launch_listener(int id);
void notify_graph_launch(int index, CUstream stream);

// Called by sync(index) once the stream is idle, before the host reads anything: a listener
// throws to refuse the values (the NCCL backend: an aborted collective wrote them). Returns an
// id for removal.
int add_sync_listener(std::function<void(int index)> fn);
void remove_sync_listener(int id);

// Waits for device `index`'s stream; a failed kernel becomes a kiln::Error naming the last
// kernel queued before the failure was seen, and a reported bad index a kiln::Error worded as
// the CPU kernels' ("gather: index 12 is out of bounds for dimension 0 with size 10",
// "remainder: integer division by zero"; the record is reset, so the device keeps working).
void sync(int index);

}  // namespace kiln::cu
