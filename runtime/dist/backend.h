// The process-group interface a collective library implements (one folder per library:
// runtime/dist/gloo, runtime/dist/nccl), and the store ranks meet through. Only
// runtime/dist/backends.cpp names the libraries. Buffers are dense and already computed.
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/dist/dist.h"

namespace kiln::dist {

// A key-value store every rank reaches (Gloo's FileStore or RedisStore behind it).
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value of `key`, waiting for it up to `timeout`; throws kiln::Error naming the key.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Whether every key is there, waiting up to `timeout`; false on time out (no throw).
  virtual bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Where it lives ("file:///tmp/x", "redis://host:port"), for messages.
  virtual std::string where() const = 0;
};

// How a backend finishes device work queued on a communication stream: make kiln's stream
// wait for it, or ask whether it is done. Null from a backend means finished on return.
class Completion {
 public:
  virtual ~Completion() = default;
  // Makes later work on kiln's stream wait for the collective (no host wait); raises its error.
  virtual void wait() = 0;
  virtual bool done() = 0;
};
using CompletionPtr = std::shared_ptr<Completion>;

// What every rank of a group agrees on when it makes a backend.
struct GroupSpec {
  std::shared_ptr<Store> store;
  std::string prefix;  // the group's key prefix in the store (unique per group)
  int rank = 0, size = 1;  // this process's rank in the group, the group's size
  std::chrono::milliseconds timeout{600000};
  Device device;  // NCCL: this rank's CUDA device
  // The peers found dead, worded for an error ("rank 1 has exited"; "" while all live): cheap
  // enough for a watchdog to call every tick while a collective is pending.
  std::function<std::string()> peers_gone;
  // Waits for the agreement checks queued off the collectives' path and raises a disagreement
  // they found (a host sync of the device calls it before a value is read).
  std::function<void()> settle_checks;
};

// One library's communicator over a group's ranks. Calls are collective: every rank makes the
// same ones, in the same order. `in` and `out` may be the same buffer where the op allows.
// Counts are elements of `dtype`. Failures throw (the Group turns them into kiln::Error).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual CompletionPtr all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op) = 0;
  virtual CompletionPtr broadcast(const void* in, void* out, size_t count, DType dtype, int root) = 0;
  // out: size() blocks of `count` elements, rank order.
  virtual CompletionPtr all_gather(const void* in, void* out, size_t count, DType dtype) = 0;
  // in: size() blocks of `count` elements; out: this rank's block of the reduction.
  virtual CompletionPtr reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) = 0;
  // in_counts[r] elements go to rank r (in order); out_counts[r] arrive from rank r.
  virtual CompletionPtr all_to_all(const void* in, const std::vector<size_t>& in_counts, void* out,
                                   const std::vector<size_t>& out_counts, DType dtype) = 0;
  virtual CompletionPtr send(const void* data, size_t count, DType dtype, int peer) = 0;
  virtual CompletionPtr recv(void* data, size_t count, DType dtype, int peer) = 0;
  virtual void barrier() = 0;
  // Every rank's 64-bit word, rank order (cheap host exchange for consistency checks); backends
  // without a host path return empty.
  virtual std::vector<int64_t> exchange(const std::vector<int64_t>& words) { return {}; }
  // Stops the communicator; later calls fail with `why`. Never blocks.
  virtual void abort(const std::string& why = "aborted") {}
};

// The libraries (runtime/dist/backends.cpp): a store at `url` (file://, redis://), and a
// backend of a library for a group. Throw kiln::Error naming what is missing.
std::shared_ptr<Store> make_store(const std::string& url);
std::unique_ptr<Backend> make_backend(const std::string& library, const GroupSpec& spec);
// Whether kiln was built with / can load the library, and why not.
bool backend_available(const std::string& library, std::string* why = nullptr);

}  // namespace kiln::dist
