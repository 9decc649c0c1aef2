// Gloo: collectives over CPU tensors (TCP between the ranks). Reductions of every kiln dtype
// go through one reduce function per (dtype, op); reduce_scatter, which this Gloo offers only in
// a legacy form, is an all-reduce keeping this rank's block.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "runtime/core/error.h"
#include "runtime/dist/gloo/gloo_parts.h"

namespace kiln::dist::gloo_impl {
namespace {

using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

template <class T, class F>
ReduceFn elementwise(F f) {
  return [f](void* c, const void* a, const void* b, size_t n) {
    auto* C = static_cast<T*>(c);
    const auto* A = static_cast<const T*>(a);
    const auto* B = static_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) C[i] = static_cast<T>(f(A[i], B[i]));
  };
}

// Half and bfloat16 reduce in float, rounding once per step (as Gloo's own float16 sum).
template <class T>
ReduceFn reduce_fn_of(ReduceOp op) {
  using C = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;
  if constexpr (std::is_same_v<T, bool>) {
    if (op == ReduceOp::Sum || op == ReduceOp::Max) return elementwise<T>([](bool a, bool b) { return a || b; });
    return elementwise<T>([](bool a, bool b) { return a && b; });
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return elementwise<T>([](T a, T b) { return static_cast<C>(a) + static_cast<C>(b); });
      case ReduceOp::Product: return elementwise<T>([](T a, T b) { return static_cast<C>(a) * static_cast<C>(b); });
      case ReduceOp::Min:
        return elementwise<T>([](T a, T b) {
          const C x = static_cast<C>(a), y = static_cast<C>(b);
          return x != x ? x : (y != y ? y : std::min(x, y));  // NaN propagates, as in PyTorch
        });
      case ReduceOp::Max:
        return elementwise<T>([](T a, T b) {
          const C x = static_cast<C>(a), y = static_cast<C>(b);
          return x != x ? x : (y != y ? y : std::max(x, y));
        });
    }
  }
  return nullptr;
}

// Divides `n` elements by `by` in place (Avg after the sum), in the dtype's compute type.
void divide(void* p, size_t n, DType dtype, int by) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;
    if constexpr (!std::is_same_v<T, bool>) {
      auto* x = static_cast<T*>(p);
      for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(static_cast<C>(x[i]) / static_cast<C>(by));
    }
  });
}

// The TCP device of this process: GLOO_SOCKET_IFNAME's interface, else loopback when the ranks
// meet on this host, else this host's name.
std::shared_ptr<gloo::transport::Device> tcp_device() {
  static std::mutex mu;
  static std::shared_ptr<gloo::transport::Device> dev;
  std::lock_guard<std::mutex> lock(mu);
  if (dev) return dev;
  gloo::transport::tcp::attr attr;
  const char* iface = std::getenv("GLOO_SOCKET_IFNAME");
  const char* addr = std::getenv("MASTER_ADDR");
  if (iface && *iface) {
    attr.iface = iface;
  } else if (!addr || !*addr || std::string(addr) == "localhost" || std::string(addr).rfind("127.", 0) == 0) {
    attr.hostname = "127.0.0.1";
  } else {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    attr.hostname = host;
  }
  dev = gloo::transport::tcp::CreateDevice(attr);
  return dev;
}

// A Gloo operation queued on the context's worker: done once the worker ran it.
class GlooCompletion final : public Completion {
 public:
  void finish(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = e;
    done_ = true;
    cv_.notify_all();
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool done() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// Every operation of a context runs on one worker thread, in the order queued (Gloo's context
// is not for concurrent use): a collective queued async runs while the caller goes on.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  std::shared_ptr<GlooCompletion> submit(std::function<void()> task) {
    auto c = std::make_shared<GlooCompletion>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.emplace_back(std::move(task), c);
    }
    cv_.notify_all();
    return c;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // (stop, with everything queued done)
      auto [task, c] = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr e;
      try {
        task();
      } catch (...) {
        e = std::current_exception();
      }
      c->finish(e);
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<GlooCompletion>>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

class GlooBackend final : public Backend {
 public:
  explicit GlooBackend(const GroupSpec& s) : timeout_(s.timeout), size_(s.size), rank_(s.rank) {
    ctx_ = std::make_shared<gloo::rendezvous::Context>(s.rank, s.size);
    ctx_->setTimeout(s.timeout);
    StoreAdapter store(s.store, s.prefix + "/gloo/", s.timeout);
    auto dev = tcp_device();
    ctx_->connectFullMesh(store, dev);
  }
  const char* name() const override { return "gloo"; }

  CompletionPtr all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    return worker_.submit([=] {
      if (out != in) std::memcpy(out, in, count * itemsize(dtype));
      reduce_in_place(out, count, dtype, op);
    });
  }

  CompletionPtr broadcast(const void* in, void* out, size_t count, DType dtype, int root) override {
    return worker_.submit([=] {
      if (out != in) std::memcpy(out, in, count * itemsize(dtype));
      gloo::BroadcastOptions o(ctx_);
      o.setOutput(static_cast<char*>(out), count * itemsize(dtype));
      o.setRoot(root);
      o.setTimeout(timeout_);
      gloo::broadcast(o);
    });
  }

  CompletionPtr all_gather(const void* in, void* out, size_t count, DType dtype) override {
    return worker_.submit([=] { gather_now(in, out, count * itemsize(dtype)); });
  }

  CompletionPtr reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    return worker_.submit([=] {
      const size_t bytes = count * itemsize(dtype);
      std::vector<char> all(static_cast<const char*>(in),
                            static_cast<const char*>(in) + bytes * static_cast<size_t>(size_));
      reduce_in_place(all.data(), count * static_cast<size_t>(size_), dtype, op);
      std::memcpy(out, all.data() + bytes * static_cast<size_t>(rank_), bytes);
    });
  }

  CompletionPtr all_to_all(const void* in, const std::vector<size_t>& in_counts, void* out,
                           const std::vector<size_t>& out_counts, DType dtype) override {
    return worker_.submit([=] { all_to_all_now(in, in_counts, out, out_counts, dtype); });
  }

  CompletionPtr send(const void* data, size_t count, DType dtype, int peer) override {
    const uint64_t sl = slot(sends_, peer);
    return worker_.submit([=] {
      auto buf = ctx_->createUnboundBuffer(const_cast<void*>(data), count * itemsize(dtype));
      buf->send(peer, sl);
      KILN_CHECK(buf->waitSend(timeout_), "send to group rank ", peer, " timed out");
    });
  }

  CompletionPtr recv(void* data, size_t count, DType dtype, int peer) override {
    const uint64_t sl = slot(recvs_, peer);
    return worker_.submit([=] {
      auto buf = ctx_->createUnboundBuffer(data, count * itemsize(dtype));
      buf->recv(peer, sl);
      KILN_CHECK(buf->waitRecv(timeout_), "recv from group rank ", peer, " timed out");
    });
  }

  void barrier() override {
    worker_
        .submit([=] {
          gloo::BarrierOptions o(ctx_);
          o.setTimeout(timeout_);
          gloo::barrier(o);
        })
        ->wait();
  }

  std::vector<int64_t> exchange(const std::vector<int64_t>& words) override {
    std::vector<int64_t> all(words.size() * static_cast<size_t>(size_));
    if (!words.empty())
      worker_.submit([&] { gather_now(words.data(), all.data(), words.size() * sizeof(int64_t)); })->wait();
    return all;
  }

 private:
  void gather_now(const void* in, void* out, size_t bytes) {
    gloo::AllgatherOptions o(ctx_);
    o.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes);
    o.setOutput(static_cast<char*>(out), bytes * static_cast<size_t>(size_));
    o.setTimeout(timeout_);
    gloo::allgather(o);
  }

  void all_to_all_now(const void* in, const std::vector<size_t>& in_counts, void* out,
                      const std::vector<size_t>& out_counts, DType dtype) {
    gloo::AlltoallvOptions o(ctx_);
    // As bytes: Gloo's typed form takes the element size from the pointer type.
    auto bytes = [&](const std::vector<size_t>& counts) {
      std::vector<int64_t> b;
      for (size_t c : counts) b.push_back(static_cast<int64_t>(c * itemsize(dtype)));
      return b;
    };
    o.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes(in_counts));
    o.setOutput(static_cast<char*>(out), bytes(out_counts));
    o.setTimeout(timeout_);
    gloo::alltoallv(o);
  }

  void reduce_in_place(void* buf, size_t count, DType dtype, ReduceOp op) {
    gloo::AllreduceOptions o(ctx_);
    dispatch_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      o.setOutput(static_cast<T*>(buf), count);
      o.setReduceFunction(reduce_fn_of<T>(op));
    });
    o.setTimeout(timeout_);
    gloo::allreduce(o);
    if (op == ReduceOp::Avg) divide(buf, count, dtype, size_);
  }

  // Point-to-point messages between two ranks match in order: the k-th send to a peer meets
  // that peer's k-th receive from this rank.
  static uint64_t slot(std::map<int, uint64_t>& counters, int peer) { return (uint64_t{1} << 40) + counters[peer]++; }

  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  std::chrono::milliseconds timeout_;
  int size_, rank_;
  std::map<int, uint64_t> sends_, recvs_;
  Worker worker_;  // (last: joined before the context goes)
};

}  // namespace

std::unique_ptr<Backend> make_backend(const GroupSpec& spec) { return std::make_unique<GlooBackend>(spec); }

}  // namespace kiln::dist::gloo_impl
