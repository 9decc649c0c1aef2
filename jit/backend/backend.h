// The backend contract: what a code generator provides so the code cache, the tiering policy
// and the executor can use it without knowing it. A backend is one folder under jit/ that
// implements Backend and is listed once in jit/exec/builtin_backends.cpp; nothing else names it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "jit/backend/kernel_abi.h"
#include "jit/backend/target.h"
#include "jit/loop/lower.h"
#include "runtime/core/device.h"

namespace kiln::jit {

class Backend;

// The bytes of arguments a launch of `k` passes: begin and end, then its buffers, int and double
// parameters (8 bytes each, at least one slot per array). Checked against Target::max_arg_bytes:
// by a device emitter, and by the plan, which splits kernels that exceed it (split_wide.cpp).
size_t launch_arg_bytes(const Kernel& k);

// Code a backend produced for one kernel; only that backend launches it.
struct Code {
  virtual ~Code() = default;
  const Backend* backend = nullptr;  // the backend that made it (and launches it)
};

// The bound arguments of one launch (the kernel ABI's arrays) and its size.
struct Launch {
  int64_t extent = 0;  // parallel indices to run: [0, extent)
  int64_t work = 0;  // elements of the kernel's domain (how much work the launch is)
  char* const* buffers = nullptr;
  const int64_t* iparams = nullptr;
  const double* fparams = nullptr;
};

// Small named blobs kept across processes beside the kernels (e.g. a JIT's data layout).
class BlobStore {
 public:
  virtual ~BlobStore() = default;
  // The blob stored under `key`, if any.
  virtual bool read(const std::string& key, std::string& value) = 0;
  // Stores `value` under `key` (best effort).
  virtual void write(const std::string& key, const std::string& value) = 0;
};

// How a backend serves a kernel that is not compiled yet.
enum class Tier : uint8_t {
  Quick,  // compiles in microseconds; serves a miss at once
  Optimizing,  // the best code; compiled in the background when a quick tier served first
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Short name used in logs and KILN_LOG lines ("cpu_llvm").
  virtual const char* name() const = 0;
  // The device type its code runs on.
  virtual DeviceType device() const = 0;
  // Its place in tiering.
  virtual Tier tier() const = 0;
  // What lowering must produce for it.
  virtual const Target& target() const = 0;
  // Identifies the code it generates (compiler version, CPU or GPU model, features): part of
  // the disk key. Empty: its code cannot be stored.
  virtual std::string cache_id() const = 0;
  // Whether it can compile `lowered`'s kernel (lowered for target()).
  virtual bool supports(const Lowered& lowered) const = 0;
  // Compiles `kernel` under the name `symbol`; when `image` is non-null and the backend can
  // store code, fills it with a loadable image (for the disk cache).
  virtual std::shared_ptr<Code> compile(const Kernel& kernel, const std::string& symbol, std::string* image) = 0;
  // Loads an image from compile() of an earlier run (throws kiln::Error when it cannot).
  virtual std::shared_ptr<Code> load(const std::string& image, const std::string& symbol, BlobStore& store) = 0;
  // Runs every parallel index of `launch` (returns when done).
  virtual void launch(const Code& code, const Launch& launch) const = 0;
  // Runs parallel indices [begin, end) on the calling thread (host backends; GEMM epilogues).
  virtual void run_range(const Code& code, int64_t begin, int64_t end, const Launch& launch) const;
  // Writes the backend's source for `kernel` (LLVM IR, CUDA C++) to the KILN_DUMP directory.
  virtual void dump(const Kernel& kernel, const std::string& symbol) const {}
};

// The backends of this build for `device`, quick tiers first (built on first use for that
// device from the list in jit/exec/builtin_backends.cpp: adding a backend is one line there;
// a CPU-only program never probes for a GPU driver).
const std::vector<Backend*>& backends(DeviceType device);
// The backend of `device` with `tier`, or null.
Backend* find_backend(DeviceType device, Tier tier);

}  // namespace kiln::jit
