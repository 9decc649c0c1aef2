// kiln::compile on a GPU replays entries as CUDA graphs (jit/compile/graph_replay.h). Each test
// runs the same function compiled twice, with and without graphs (CompileOptions::cuda_graphs):
// a graph replays the very kernels of a run without it, so results must be equal bit for bit;
// against lazy eager on the same device, float32 within 1e-5 relative (fusion differs).
// Need a GPU (skip cleanly without one, and on the simulated device, which records no graphs).
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "expect_close.h"
#include "kiln.h"
#include "test_seed.h"

using kiln::Tensor;

namespace {

bool gpu() {
  const char* v = std::getenv("KILN_TEST_DEVICE");
  return !(v && std::string(v) == "fake-cuda") && kiln::cuda::is_available();
}
#define NEED_GPU() \
  if (!gpu()) GTEST_SKIP() << "no usable CUDA device"

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  auto x = a.to_vector<float>(), y = b.to_vector<float>();
  for (size_t i = 0; i < x.size(); ++i)
    if (!(std::isnan(x[i]) && std::isnan(y[i]))) ASSERT_EQ(x[i], y[i]) << what << " element " << i;
}

kiln::CompileOptions options(const std::string& name, bool graphs) {
  kiln::CompileOptions o;
  o.name = name;
  o.cuda_graphs = graphs;
  return o;
}

const void* address(const Tensor& t) { return t.node()->storage->data; }

}  // namespace

// Fresh inputs every call (new tensors: their addresses move, so they are copied into the
// graph's buffers) and one input rewritten in place at a fixed address (guarded by address).
TEST(CudaGraphs, ReplayEqualsRunsWithoutGraphs) {
  NEED_GPU();
  kiln::manual_seed(kiln::testing::test_seed(11));
  auto body = [](const Tensor& a, const Tensor& b) { return (kiln::gelu(a * 2 + b).sum({1}) / 3).exp(); };
  auto with = kiln::compile(body, options("with", true));
  auto without = kiln::compile(body, options("without", false));
  Tensor b = kiln::randn({40}).cuda().eval();
  for (int i = 0; i < 12; ++i) {
    Tensor a = kiln::randn({33, 40}).cuda().eval();
    if (i % 3 == 0) b = kiln::randn({40}).cuda().eval();
    Tensor got = with(a, b), want = without(a, b);
    expect_same_bits(got, want, "call " + std::to_string(i));
    expect_close(got, (kiln::gelu(a * 2 + b).sum({1}) / 3).exp(), 1e-5, 1e-6);
  }
  const auto s = with.stats();
  EXPECT_GE(s.graphs, 1);
  EXPECT_GE(s.graph_replays, 6);
  EXPECT_EQ(without.stats().graphs, 0);
}

// A caller that keeps outputs: a replay never writes memory handed out. Outputs above
// kCopyOutBytes stay in graph memory: first every output is kept (graphs whose outputs are held do
// not replay; runs go without one), then outputs are dropped at once while the first ones are
// still held (stale held graphs are replaced and the new ones replay). Small outputs are handed
// out as copies: every call after the recording replays one graph. All kept outputs keep their
// values to the end.
TEST(CudaGraphs, OutputsKeptAcrossReplaysStayIntact) {
  NEED_GPU();
  auto want = [](int i) { return std::tanh(static_cast<float>(0.01 * i * 2 + 1)); };
  const int64_t large = 300000, small = 1000;  // (1.2 MB and 4 KB of float32)
  for (int64_t n : {large, small}) {
    SCOPED_TRACE(n == large ? "large outputs" : "small outputs");
    auto f = kiln::compile([](const Tensor& x) { return (x * 2 + 1).tanh(); }, options("keep", true));
    std::vector<Tensor> kept;
    for (int i = 0; i < 50; ++i) kept.push_back(f(kiln::full({n}, 0.01 * i).cuda()));
    const auto held = f.stats();
    if (n == large) {
      EXPECT_GE(held.ungraphed_runs, 40);
    } else {
      EXPECT_EQ(held.graphs, 1);
      EXPECT_GE(held.graph_replays, 48);
    }
    for (int i = 50; i < 150; ++i) {
      Tensor y = f(kiln::full({n}, 0.01 * i).cuda());
      ASSERT_NEAR(y.to_vector<float>()[static_cast<size_t>(n - 1)], want(i), 1e-6) << "call " << i;
    }
    EXPECT_GE(f.stats().graph_replays - held.graph_replays, 60);
    for (int i = 0; i < 50; ++i)
      for (float e : kept[i].to_vector<float>()) ASSERT_NEAR(e, want(i), 1e-6) << "output " << i;
  }
}

// A training step (forward, backward, Adam) compiled whole: parameters and optimizer state are
// written back in place by the graph (their addresses never change), one graph replays every step
// (the last step's gradients are let go before the step sets new ones), and every step equals the
// step without graphs bit for bit.
TEST(CudaGraphs, TrainingStepReplayEqualsRunsWithoutGraphs) {
  NEED_GPU();
  struct Setup {
    std::shared_ptr<kiln::nn::Sequential> net;
    std::unique_ptr<kiln::optim::Adam> opt;
  };
  auto make = [] {
    kiln::manual_seed(3);
    Setup s;
    s.net = std::make_shared<kiln::nn::Sequential>(std::vector<std::shared_ptr<kiln::nn::Module>>{
        std::make_shared<kiln::nn::Linear>(16, 64), std::make_shared<kiln::nn::Tanh>(),
        std::make_shared<kiln::nn::Linear>(64, 4)});
    s.net->to(kiln::cuda());
    kiln::optim::AdamOptions o;
    o.lr = 1e-2;
    s.opt = std::make_unique<kiln::optim::Adam>(s.net->parameters(), o);
    return s;
  };
  auto step = [](Setup& s, const Tensor& x, const Tensor& y) {
    s.opt->zero_grad();
    Tensor loss = kiln::mse_loss(s.net->forward(x), y);
    loss.backward();
    s.opt->step();
    return loss.detach();
  };
  Setup g = make(), n = make(), e = make();
  auto fg = kiln::compile([&](const Tensor& x, const Tensor& y) { return step(g, x, y); }, options("step", true));
  auto fn =
      kiln::compile([&](const Tensor& x, const Tensor& y) { return step(n, x, y); }, options("step_plain", false));
  kiln::manual_seed(kiln::testing::test_seed(12));
  Tensor x = kiln::randn({128, 16}).cuda().eval(), y = kiln::randn({128, 4}).cuda().eval();
  std::vector<const void*> where;
  for (int i = 0; i < 8; ++i) {
    Tensor lg = fg(x, y), ln = fn(x, y), le = step(e, x, y);
    expect_same_bits(lg, ln, "loss at step " + std::to_string(i));
    EXPECT_NEAR(lg.item<float>(), le.item<float>(), 1e-5 * std::abs(le.item<float>()) + 1e-6) << "step " << i;
    if (i == 3)
      for (auto& p : g.net->parameters()) where.push_back(address(p));
  }
  auto pg = g.net->parameters(), pn = n.net->parameters(), pe = e.net->parameters();
  for (size_t k = 0; k < pg.size(); ++k) {
    expect_same_bits(pg[k], pn[k], "parameter " + std::to_string(k));
    expect_same_bits(pg[k].grad(), pn[k].grad(), "gradient " + std::to_string(k));
    expect_close(pg[k], pe[k], 1e-4, 1e-5);
    EXPECT_EQ(address(pg[k]), where[k]) << "parameter " << k << " moved: not updated in place";
  }
  const auto s = fg.stats();
  // (the step sets the gradients without reading them: last step's are let go before it runs, and
  // the loss is handed out as a copy, so one graph and one memory pool serve every step)
  EXPECT_EQ(s.graphs, 1) << "the gradients or the loss held from the last step kept its graph from replaying";
  EXPECT_GE(s.graph_replays, 5);
  EXPECT_EQ(s.ungraphed_runs, 0);
  EXPECT_GT(s.graph_bytes, 0);
}

// Simulation state, both ways a tick is written: arguments updated in place inside fn (written
// back by the graph: their addresses never change) and state returned and passed back in
// (each call's input sits in the other graph's output: two graphs alternate, the input copied
// into the graph's buffer). Every tick equals the same function without graphs, bit for bit.
TEST(CudaGraphs, SimulationTicksInPlaceAndFedBack) {
  NEED_GPU();
  auto in_place = [](Tensor p, Tensor v) {  // (handles share the caller's tensors)
    v.add_((p * -0.5 - v * 0.1) * 0.01);
    p.add_(v * 0.01);
    return (v * v).sum();
  };
  auto fed_back = [](const Tensor& p, const Tensor& v) {
    Tensor v2 = v + (p * -0.5 - v * 0.1) * 0.01;
    return std::vector<Tensor>{p + v2 * 0.01, v2};
  };
  kiln::manual_seed(kiln::testing::test_seed(14));
  Tensor p0 = kiln::randn({4096, 3}).cuda().eval(), v0 = kiln::randn({4096, 3}).cuda().eval();
  {
    auto fg = kiln::compile(in_place, options("tick", true));
    auto fn = kiln::compile(in_place, options("tick_plain", false));
    Tensor pg = p0.clone().eval(), vg = v0.clone().eval(), pn = p0.clone().eval(), vn = v0.clone().eval();
    const void* at = nullptr;
    for (int i = 0; i < 10; ++i) {
      expect_same_bits(fg(pg, vg), fn(pn, vn), "energy at tick " + std::to_string(i));
      if (i == 3) at = address(pg);
    }
    expect_same_bits(pg, pn, "positions");
    EXPECT_EQ(address(pg), at) << "positions moved: not updated in place";
    EXPECT_GE(fg.stats().graph_replays, 7);
    EXPECT_EQ(fg.stats().ungraphed_runs, 0);
  }
  {
    auto fg = kiln::compile(fed_back, options("feed", true));
    auto fn = kiln::compile(fed_back, options("feed_plain", false));
    Tensor pg = p0, vg = v0, pn = p0, vn = v0;
    for (int i = 0; i < 10; ++i) {
      auto g = fg(pg, vg), n = fn(pn, vn);
      pg = g[0], vg = g[1], pn = n[0], vn = n[1];
    }
    expect_same_bits(pg, pn, "positions fed back");
    expect_same_bits(vg, vn, "velocities fed back");
    EXPECT_GE(fg.stats().graph_replays, 6);
    EXPECT_LE(fg.stats().graphs, 3);
  }
}

// A parameter whose node is shared (a detached handle taken by the caller) must keep its old
// value in that handle: the step then runs without a graph and the state moves to new memory.
TEST(CudaGraphs, StateSharedWithTheCallerIsNotOverwritten) {
  NEED_GPU();
  Tensor w = kiln::ones({256}).cuda().eval();
  auto f = kiln::compile(
      [&](const Tensor& g) {
        w.sub_(g * 0.5);
        return w.sum();
      },
      options("sgd", true));
  Tensor g = kiln::ones({256}).cuda().eval();
  for (int i = 0; i < 4; ++i) f(g);  // recorded at the second call, replayed from the third
  EXPECT_GE(f.stats().graph_replays, 1);
  Tensor snapshot = w.detach();
  const float before = snapshot.to_vector<float>()[0];
  Tensor total = f(g);
  EXPECT_EQ(snapshot.to_vector<float>()[0], before) << "the caller's handle saw an in-place write";
  EXPECT_EQ(w.to_vector<float>()[0], before - 0.5f);
  EXPECT_EQ(total.item<float>(), 256 * (before - 0.5f));
  EXPECT_EQ(before, 1 - 4 * 0.5f);
  EXPECT_GE(f.stats().ungraphed_runs, 1);
}

// Sizes that change: one graph per size met, kernels shared (one compiled entry), and each size
// replays its own graph afterwards.
TEST(CudaGraphs, OneGraphPerSizeKernelsShared) {
  NEED_GPU();
  kiln::CompileOptions o = options("sizes", true);
  o.dynamic = kiln::CompileOptions::Dynamic::Always;
  auto f = kiln::compile([](const Tensor& x) { return kiln::softmax(x * 3, 1); }, o);
  kiln::manual_seed(kiln::testing::test_seed(13));
  for (int r = 0; r < 4; ++r)
    for (int64_t n : {8, 24, 40}) {
      Tensor x = kiln::randn({n, 50}).cuda().eval();
      expect_close(f(x), kiln::softmax(x * 3, 1), 1e-5, 1e-6);
    }
  const auto s = f.stats();
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.graphs, 3);
  EXPECT_EQ(s.graph_replays, 6);
}

// A limit on graphs kept (CompileOptions::cuda_graph_limit): ten sizes met in turn keep at most
// four graphs, the least recently used dropped and recorded again when their size comes back.
TEST(CudaGraphs, GraphLimitDropsTheLeastRecentlyUsed) {
  NEED_GPU();
  kiln::CompileOptions o = options("limit", true);
  o.dynamic = kiln::CompileOptions::Dynamic::Always;
  o.cuda_graph_limit = 4;
  auto f = kiln::compile([](const Tensor& x) { return (x * 2).tanh(); }, o);
  for (int r = 0; r < 4; ++r)
    for (int64_t n = 10; n < 20; ++n) {
      Tensor x = kiln::full({n}, 0.1 * r).cuda().eval();
      ASSERT_NEAR(f(x).to_vector<float>()[0], std::tanh(static_cast<float>(0.2 * r)), 1e-6) << "size " << n;
      ASSERT_LE(f.stats().graphs_kept, 4);
    }
  EXPECT_GT(f.stats().graphs, 4);
  EXPECT_EQ(f.stats().graphs_kept, 4);
}

// At the function's graph limit a new size's graph takes the least recently used one's place by
// updating its executable in place (cuGraphExecUpdate; instantiating stays the fallback when the
// recorded operations do not line up): counted, and every result equals a run without graphs.
TEST(CudaGraphs, NewSizesAtTheLimitUpdateGraphsInPlace) {
  NEED_GPU();
  auto body = [](const Tensor& x, const Tensor& w) { return (kiln::matmul(x, w) * 2 + 1).tanh().sum({1}); };
  kiln::CompileOptions o = options("update", true), p = options("update_plain", false);
  o.dynamic = p.dynamic = kiln::CompileOptions::Dynamic::Always;
  o.cuda_graph_limit = 2;
  auto f = kiln::compile(body, o);
  auto plain = kiln::compile(body, p);
  kiln::manual_seed(kiln::testing::test_seed(14));
  Tensor w = kiln::randn({16, 8}).cuda().eval();
  for (int r = 0; r < 3; ++r)
    for (int64_t n : {5, 7, 9, 11}) {
      Tensor x = kiln::randn({n, 16}).cuda().eval();
      for (int k = 0; k < 2; ++k)
        expect_same_bits(f(x, w), plain(x, w), "size " + std::to_string(n) + " round " + std::to_string(r));
      ASSERT_LE(f.stats().graphs_kept, 2);
    }
  const auto s = f.stats();
  EXPECT_GE(s.graphs, 8);
  EXPECT_GT(s.graph_updates, 0) << s.graphs << " graphs recorded, none by an update";
  EXPECT_GT(s.graph_replays, 0);
}

// A graph break (a value read on the host) splits fn: the continuation after it replays its own
// graph, one per break value met (the segment before the break ends with the copy to the host
// and runs without one).
TEST(CudaGraphs, BreakSegmentsReplayTheirOwnGraphs) {
  NEED_GPU();
  auto body = [](const Tensor& x) {
    Tensor y = x * 2 + 1;
    int k = static_cast<int>(y.amax().item<float>() > 1.0f);
    return y.tanh() * (k + 1);
  };
  auto f = kiln::compile(body, options("break", true));
  auto plain = kiln::compile(body, options("break_plain", false));
  for (int i = 0; i < 8; ++i) {
    Tensor x = kiln::full({300}, 0.5 * (i % 2)).cuda().eval();  // break values 1 and 2
    expect_same_bits(f(x), plain(x), "call " + std::to_string(i));
  }
  EXPECT_GE(f.stats().graph_replays, 4);
}

// Random numbers are drawn afresh per call: such programs run without graphs, still correct.
TEST(CudaGraphs, RandomOpsRunWithoutAGraph) {
  NEED_GPU();
  auto f = kiln::compile([](const Tensor& x) { return kiln::dropout(x, 0.5, true); }, options("dropout", true));
  Tensor x = kiln::ones({4096}).cuda().eval();
  Tensor a = f(x), b = f(x), c = f(x);
  auto va = a.to_vector<float>(), vc = c.to_vector<float>();
  EXPECT_NE(va, vc) << "the same mask twice";
  EXPECT_EQ(f.stats().graph_replays, 0);
}

// Threads sharing one compiled function on one GPU: every result is its own input's.
TEST(CudaGraphs, ThreadsShareACompiledFunction) {
  NEED_GPU();
  auto f = kiln::compile([](const Tensor& x) { return (x * x + 1).sqrt(); }, options("threads", true));
  std::vector<std::thread> ts;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        const double v = t * 100 + i;
        Tensor y = f(kiln::full({512}, v).cuda());
        const float want = static_cast<float>(std::sqrt(v * v + 1));
        for (float e : y.to_vector<float>())
          if (std::abs(e - want) > 1e-6 * want) bad++;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GE(f.stats().graph_replays, 1);
}
