// Threads sharing tensors and modules: concurrent materializations of overlapping pending
// graphs give the single-thread results, bit for bit, on the device KILN_TEST_DEVICE names
// (tests/gpu_machine.sh runs them on cuda).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "jit/exec/code_cache.h"
#include "kiln.h"
#include "tests/test_seed.h"

using namespace kiln;
using kiln::testing::test_device;

namespace {
constexpr int kThreads = 8;
constexpr int kRuns = 50;

// Runs body(t) on kThreads threads released together.
template <class F>
void run_threads(F&& body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      body(t);
    });
  for (auto& th : ts) th.join();
}

// Input of thread t: distinct per thread, the same in every run.
Tensor input(int t) { return (arange(0.0, 12.0).reshape({3, 4}) * (0.1 * (t + 1)) - 0.5).to(test_device()); }

std::shared_ptr<nn::Sequential> fresh_net(uint64_t seed) {
  manual_seed(seed);
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 16), std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(16, 16),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 2)});
  net->to(test_device());
  return net;
}

// Single-thread results of a fresh net (seed) on every thread's input, two ways: with the
// weights' initialization computed in the same segment as the forward (the thread that gets
// there first), and with the weights stored beforehand (the others). The JIT may round these
// two differently in the last bit (fusing the initializer into the forward's kernels), so a
// threaded result must equal one of them exactly. Computed once to compile every kernel, then
// again once the tiered JIT's background compiles (which swap kernels whose last bits may
// differ) are done.
struct Reference {
  std::vector<std::vector<float>> fused, stored;
  bool matches(int t, const std::vector<float>& got) const { return got == fused[t] || got == stored[t]; }
};
Reference reference_once(uint64_t seed) {
  Reference r;
  for (int t = 0; t < kThreads; ++t) r.fused.push_back(fresh_net(seed)->forward(input(t)).to_vector<float>());
  auto net = fresh_net(seed);
  eval(net->parameters());
  for (int t = 0; t < kThreads; ++t) r.stored.push_back(net->forward(input(t)).to_vector<float>());
  return r;
}
Reference reference(uint64_t seed) {
  reference_once(seed);
  jit::wait_background_compiles();
  return reference_once(seed);
}
}  // namespace

// One thread evaluates x while another evaluates a graph over x: both read the pending graph
// behind x (the original report: a use-after-free in the JIT's classification).
TEST(Threads, OverlappingPendingGraphs) {
  std::vector<float> want_x, want_y;
  for (int pass = 0; pass < 2; ++pass) {  // the second once background compiles are done
    Tensor base = arange(0.0, 24.0).reshape({4, 6}).to(test_device()) * 0.05;
    Tensor x = (base * 2 + 1).tanh();
    want_y = (x * 3).sum({1}).to_vector<float>();
    want_x = x.to_vector<float>();
    jit::wait_background_compiles();
  }
  for (int run = 0; run < kRuns; ++run) {
    Tensor base = arange(0.0, 24.0).reshape({4, 6}).to(test_device()) * 0.05;
    Tensor x = (base * 2 + 1).tanh();
    std::vector<std::vector<float>> got(kThreads);
    run_threads([&](int t) {
      if (t % 2)
        got[t] = (x * 3).sum({1}).to_vector<float>();
      else
        got[t] = x.eval().to_vector<float>();
    });
    for (int t = 0; t < kThreads; ++t) ASSERT_EQ(got[t], t % 2 ? want_y : want_x) << "run " << run << " thread " << t;
    EXPECT_EQ(x.to_vector<float>(), want_x);
  }
}

// A freshly built module (its initialized weights still pending) shared by 8 threads for
// eager inference, each thread with its own input.
TEST(Threads, SharedModuleInference) {
  Reference want = reference(7);
  for (int run = 0; run < kRuns; ++run) {
    auto net = fresh_net(7);
    std::vector<std::vector<float>> got(kThreads);
    run_threads([&](int t) { got[t] = net->forward(input(t)).eval().to_vector<float>(); });
    for (int t = 0; t < kThreads; ++t) ASSERT_TRUE(want.matches(t, got[t])) << "run " << run << " thread " << t;
  }
}

// The same without gradients, each thread also keeping an intermediate it evaluates later
// (stored by whichever thread computed it).
TEST(Threads, SharedModuleNoGradKeepsIntermediates) {
  Reference want;
  {
    NoGradGuard ng;
    want = reference(11);
  }
  for (int run = 0; run < kRuns; ++run) {
    auto net = fresh_net(11);
    std::vector<std::vector<float>> got(kThreads), got_w(kThreads);
    run_threads([&](int t) {
      NoGradGuard ng;
      Tensor w = net->parameters()[0] * 1;  // pending, over the shared pending weight
      got[t] = net->forward(input(t)).to_vector<float>();
      got_w[t] = w.to_vector<float>();
    });
    for (int t = 0; t < kThreads; ++t) {
      ASSERT_TRUE(want.matches(t, got[t])) << "run " << run << " thread " << t;
      ASSERT_EQ(got_w[t], got_w[0]) << "run " << run << " thread " << t;
    }
    EXPECT_EQ(got_w[0], net->parameters()[0].to_vector<float>());
  }
}

// Threads running GEMMs side by side: a plain product of a split-K shape (cuBLAS on a device)
// and, without gradients, a layer's product + bias + ReLU (cuBLASLt's epilogue on a device),
// which share one workspace there. Each result must be its single-thread value, bit for bit.
TEST(Threads, GemmsOfManyThreadsKeepTheirBits) {
  const Device dev = test_device();
  manual_seed(3);
  const Tensor a = randn({8, 8192}).to(dev), b = randn({8192, 64}).to(dev);
  const Tensor x = randn({16, 512}).to(dev), w = randn({256, 512}).to(dev), bias = randn({256}).to(dev);
  eval({a, b, x, w, bias});
  auto plain = [&] { return matmul(a, b).to_vector<float>(); };
  auto layer = [&] {
    NoGradGuard ng;
    return relu(matmul(x, w.t()) + bias).to_vector<float>();
  };
  const std::vector<float> want_plain = plain(), want_layer = layer();
  for (int run = 0; run < kRuns; ++run) {
    std::vector<std::vector<float>> got(kThreads);
    run_threads([&](int t) { got[t] = t % 2 ? layer() : plain(); });
    for (int t = 0; t < kThreads; ++t)
      ASSERT_TRUE(got[t] == (t % 2 ? want_layer : want_plain)) << "run " << run << " thread " << t;
  }
}

// Nodes, tensor handles and shapes come from per-thread pools (runtime/core/pool_allocator.h):
// blocks made on one thread are freed on another, and threads exit while others still hold
// what they made. Every value must survive and be right; nothing may crash at thread exit.
TEST(Threads, PooledBlocksCrossThreadsAndOutliveTheirThread) {
  constexpr int kProducers = 4, kPerThread = 300;
  std::vector<std::vector<kiln::Tensor>> made(kProducers);
  std::vector<std::thread> producers;
  for (int t = 0; t < kProducers; ++t)
    producers.emplace_back([&made, t] {
      for (int i = 0; i < kPerThread; ++i) {
        kiln::Tensor x = kiln::full({3, static_cast<int64_t>(1 + i % 5)}, static_cast<double>(t * 1000 + i));
        made[t].push_back(kiln::relu(2 * x + 1) - 1);  // pending: materialized by another thread
      }
    });
  for (auto& p : producers) p.join();  // the producers' pools are gone; their blocks are not
  std::atomic<int> wrong{0};
  std::vector<std::thread> consumers;
  for (int t = 0; t < kProducers; ++t)
    consumers.emplace_back([&made, &wrong, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const double expect = 2.0 * (t * 1000 + i);
        for (float v : made[t][i].to_vector<float>())
          if (v != static_cast<float>(expect)) wrong++;
      }
      made[t].clear();  // freed on this thread, made on another
    });
  for (auto& c : consumers) c.join();
  EXPECT_EQ(wrong.load(), 0);
}
