// The memory ledger (KILN_PROFILE=memory, runtime/exec/memory_ledger.h) on the test device
// (KILN_TEST_DEVICE; CPU, fake-cuda and a real GPU): blocks attributed to the op that made them,
// the peak's blocks, the snapshot, the peak against the allocator's, and threads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "kiln.h"
#include "jit/exec/jit_executor.h"
#include "runtime/exec/memory_ledger.h"
#include "temp_dir.h"
#include "test_seed.h"
#include "training_step.h"
#include "examples/gpt_model.h"

using namespace kiln;

namespace {

// The simulated CUDA device (fake-cuda) runs its ops on host memory, some blocks relabelled
// after the host op made them: its blocks are counted on the host and on it, summed here, with
// no allocator counters of its own.
bool simulated() {
  const char* v = std::getenv("KILN_TEST_DEVICE");
  return v && std::string(v) == "fake-cuda";
}

LedgerDevice ledger_of(Device d) {
  LedgerDevice sum{d};
  for (LedgerDevice& x : memory_ledger())
    if (x.device == d || (simulated() && x.device == cpu())) {
      sum.live_bytes += x.live_bytes;
      sum.peak_bytes += x.peak_bytes;
      sum.recorded_peak_bytes += x.recorded_peak_bytes;
      sum.at_peak.insert(sum.at_peak.end(), x.at_peak.begin(), x.at_peak.end());
    }
  return sum;
}

// Bytes equal but for 0-d constants the ops keep (a scalar operand made a host tensor).
void expect_bytes(size_t got, size_t want) { EXPECT_LE(got > want ? got - want : want - got, 64u) << got << " vs " << want; }

size_t bytes_made_by(const LedgerDevice& d, const std::string& op) {
  size_t b = 0;
  for (const LedgerBlock& x : d.at_peak)
    if (op == x.made_by) b += x.bytes;
  return b;
}

MemoryStats allocator_stats(Device d) {
  if (simulated()) d = cpu();
  return d.type == DeviceType::CPU ? host_memory_stats() : cuda::memory_stats(d.index);
}
void reset_allocator_peak(Device d) {
  if (simulated()) d = cpu();
  if (d.type == DeviceType::CPU)
    reset_peak_host_memory_stats();
  else
    cuda::reset_peak_memory_stats(d.index);
}

void snapshot(const std::string& path, Device d) {
  if (simulated()) d = cpu();
  if (d.type == DeviceType::CPU)
    host_memory_snapshot(path);
  else
    cuda::memory_snapshot(path, d.index);
}

// A chain of `layers` tanh(h @ W) layers over [m, k] activations, W [k, k] leaves: each layer's
// backward reads its saved output and input, and makes a weight gradient of k x k.
struct Chain {
  std::vector<Tensor> ws;
  Tensor x;
  Chain(Device dev, int layers, int64_t m, int64_t k) {
    x = randn({m, k}).to(dev).eval();
    for (int i = 0; i < layers; ++i) {
      ws.push_back((randn({k, k}) * 0.2).to(dev).eval());
      ws.back().requires_grad_();
    }
  }
  // The loss, computed (its forward stored); `keep` receives every layer's output.
  Tensor loss(std::vector<Tensor>* keep = nullptr) const {
    Tensor h = x;
    for (const Tensor& w : ws) {
      h = tanh(matmul(h, w));
      if (keep) keep->push_back(h);
    }
    return sum(h).eval();
  }
  // Backward, then every weight gradient computed at once (one lazy segment); the gradients.
  std::vector<Tensor> backward(Tensor loss) {
    for (Tensor& w : ws) w.set_grad(Tensor());
    loss.backward();
    std::vector<Tensor> gs;
    for (const Tensor& w : ws) gs.push_back(w.grad());
    kiln::eval(gs);
    return gs;
  }
};

struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> a, b;
  Mlp() {
    a = register_module("a", std::make_shared<nn::Linear>(64, 256));
    b = register_module("b", std::make_shared<nn::Linear>(256, 64));
  }
  Tensor forward(const Tensor& x) override { return b->forward(gelu(a->forward(x))); }
};

}  // namespace

// Runs first (gtest's order within a file): without KILN_PROFILE=memory the ledger is off and a
// snapshot is a clear error, not an empty file.
TEST(MemoryLedger, OffUnlessAskedAndTheSnapshotSaysSo) {
  if (memory_ledger_on()) GTEST_SKIP() << "KILN_PROFILE names memory in this run";
  kiln::testing::TempDir dir("kiln-ledger");
  try {
    host_memory_snapshot(dir.path() + "/s.json");
    ADD_FAILURE() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_PROFILE=memory"), std::string::npos) << e.what();
  }
}

// Each block is the op's that made it; the peak's blocks are those live at the peak (the product
// freed after it stays in them), the live bytes drop when it is freed; the snapshot lists them.
TEST(MemoryLedger, BlocksByTheOpThatMadeThemAtThePeak) {
  memory_ledger_enable();
  const Device dev = kiln::testing::test_device();
  manual_seed(kiln::testing::test_seed(3));
  Tensor a = randn({512, 512}).to(dev).eval();
  memory_ledger_reset_peaks();
  const size_t before = ledger_of(dev).live_bytes;
  {
    Tensor p = matmul(a, a).eval();
    Tensor q = (p * 2).eval();
    const LedgerDevice at = ledger_of(dev);
    expect_bytes(at.live_bytes, before + 2 * 512 * 512 * 4);
    EXPECT_GE(at.peak_bytes, at.live_bytes);
    EXPECT_EQ(bytes_made_by(at, "matmul"), 512u * 512 * 4) << memory_ledger_report();
    EXPECT_GE(bytes_made_by(at, "mul"), 512u * 512 * 4) << memory_ledger_report();
  }
  const LedgerDevice after = ledger_of(dev);
  expect_bytes(after.live_bytes, before);
  EXPECT_GE(after.peak_bytes + 64, before + 2 * 512 * 512 * 4);
  EXPECT_EQ(bytes_made_by(after, "matmul"), 512u * 512 * 4);
  EXPECT_NE(memory_ledger_report().find("matmul"), std::string::npos);

  kiln::testing::TempDir dir("kiln-ledger");
  const std::string path = dir.path() + "/snapshot.json";
  snapshot(path, dev);
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  EXPECT_NE(text.str().find("\"device\": \"" + (simulated() ? cpu() : dev).str() + "\""), std::string::npos)
      << text.str();
  EXPECT_NE(text.str().find("{\"bytes\": 1048576, \"made_by\": \"matmul\", \"role\": \"activations and temporaries\"}"),
            std::string::npos)
      << text.str();
  EXPECT_THROW(snapshot(dir.path() + "/no/such/dir/s.json", dev), Error);
}

// A compiled training step (MLP, AdamW, batch sizes that change): the ledger's peak rise is the
// allocator's (which rounds sizes up by at most 1/8 and counts the same blocks) within 25 %.
TEST(MemoryLedger, CompiledStepPeakIsTheAllocators) {
  memory_ledger_enable();
  const Device dev = kiln::testing::test_device();
  manual_seed(kiln::testing::test_seed(5));
  Mlp net;
  net.to(dev);
  optim::AdamW opt(net.parameters(), {.lr = 1e-3});
  auto step = compile([&](const Tensor& x, const Tensor& y) { return kiln::testing::mse_step(net, opt, x, y); });
  for (int64_t b : {96, 128, 112}) {
    Tensor x = randn({b, 64}).to(dev).eval(), y = randn({b, 64}).to(dev).eval();
    if (dev.type == DeviceType::CUDA) cuda::synchronize();
    const size_t ledger_live = ledger_of(dev).live_bytes;
    const int64_t pool_live = allocator_stats(dev).allocated_bytes;
    memory_ledger_reset_peaks();
    reset_allocator_peak(dev);
    Tensor loss = step(x, y).eval();
    if (dev.type == DeviceType::CUDA) cuda::synchronize();
    const double ledger_rise = static_cast<double>(ledger_of(dev).peak_bytes - ledger_live);
    const double pool_rise = static_cast<double>(allocator_stats(dev).peak_allocated_bytes - pool_live);
    SCOPED_TRACE("batch " + std::to_string(b) + "\n" + memory_ledger_report());
    EXPECT_GT(ledger_rise, 0);
    EXPECT_LE(ledger_rise, pool_rise);
    EXPECT_GE(ledger_rise, 0.75 * pool_rise);
  }
}

// Threads allocating and freeing at once: every block is removed again, the live bytes return.
TEST(MemoryLedger, ThreadsLeaveNothingBehind) {
  memory_ledger_enable();
  const Device dev = kiln::testing::test_device();
  const size_t before = ledger_of(dev).live_bytes;
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        Tensor x = (full({64 + t, 33}, 1.0f).to(dev) * static_cast<double>(i)).eval();
        EXPECT_EQ(x.sum().item<float>(), static_cast<float>(i * (64 + t) * 33));
      }
    });
  for (std::thread& t : ts) t.join();
  if (dev.type == DeviceType::CUDA) cuda::synchronize();
  expect_bytes(ledger_of(dev).live_bytes, before);
}

// A compiled AdamW step whose state the caller holds alone writes the new parameters and moments
// over the old ones (the caller's tensors then hold them): on the CPU the step's peak rises by the
// gradients and little else, not by a second copy of the state; on a GPU the step's CUDA graph
// keeps no copy of it in its pool. The values are eager's. A tensor sharing a parameter's
// storage keeps that parameter's old values (it is not written over).
TEST(MemoryLedger, CompiledOptimizerStepWritesStateInPlace) {
  if (kiln::testing::interpreted()) GTEST_SKIP() << "the interpreter runs no compiled kernels";
  if (simulated()) GTEST_SKIP() << "the simulated device runs no compiled kernels";
  const Device dev = kiln::testing::test_device();
  const bool cpu_run = dev.type == DeviceType::CPU;
  struct Wide : nn::Module {
    std::shared_ptr<nn::Linear> a, b;
    Wide() {
      // (weights of 16 MiB: each its own segment of the graph's pool, which rounds smaller
      // blocks into segments of 20 MiB)
      a = register_module("a", std::make_shared<nn::Linear>(1024, 4096));
      b = register_module("b", std::make_shared<nn::Linear>(4096, 1024));
    }
    Tensor forward(const Tensor& x) override { return b->forward(relu(a->forward(x))); }
  };
  manual_seed(kiln::testing::test_seed(9));
  Wide net, twin;
  kiln::testing::copy_params(net, twin);
  net.to(dev);
  twin.to(dev);
  optim::AdamW opt(net.parameters(), {.lr = 1e-3}), opt_twin(twin.parameters(), {.lr = 1e-3});
  auto step = compile([&](const Tensor& x, const Tensor& y) { return kiln::testing::mse_step(net, opt, x, y); });
  size_t state = 0;
  for (const Tensor& p : net.parameters()) state += static_cast<size_t>(p.numel()) * 4;
  for (int s = 0; s < 5; ++s) {
    Tensor x = randn({4, 1024}).to(dev).eval(), y = randn({4, 1024}).to(dev).eval();
    Tensor held;  // step 2 on the CPU: a tensor sharing the first layer's weight
    std::vector<float> old;
    if (s == 2 && cpu_run) {
      held = net.a->weight.detach();
      old = held.to_vector<float>();
    }
    const uint64_t over = jit::outputs_written_over_inputs();
    const int64_t live = allocator_stats(dev).allocated_bytes;
    reset_allocator_peak(dev);
    Tensor loss = step(x, y).eval();
    const int64_t rise = allocator_stats(dev).peak_allocated_bytes - live;
    Tensor want = kiln::testing::mse_step(twin, opt_twin, x, y).eval();
    EXPECT_NEAR(loss.item<float>(), want.item<float>(), 1e-5);
    auto a = net.parameters(), b = twin.parameters();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_LE(max(abs(a[i] - b[i])).item<float>(), 1e-5f) << "parameter " << i << " after step " << s;
    if (s == 0) continue;  // (the first call traces and compiles)
    SCOPED_TRACE("step " + std::to_string(s) + ": peak rise " + std::to_string(rise) + " bytes, state " +
                 std::to_string(state) + " bytes a copy, graph pools " + std::to_string(step.stats().graph_bytes));
    if (cpu_run) {
      EXPECT_GE(jit::outputs_written_over_inputs() - over, s == 2 ? 3 * a.size() - 3 : 3 * a.size());
      if (s != 2) EXPECT_LT(static_cast<double>(rise), 2.0 * static_cast<double>(state));
      if (s == 2) EXPECT_EQ(held.to_vector<float>(), old) << "a tensor over the old weight changed";
    } else if (s == 1) {  // (the second call records the graph: its kernels write the state in place)
      EXPECT_GE(jit::outputs_written_over_inputs() - over, 3 * a.size());
    }
  }
  if (!cpu_run) {
    const auto st = step.stats();
    EXPECT_GE(st.graph_replays, 2);
    // The pool holds the gradients (one copy of the state's size) and small activations, not the
    // new parameters and moments (three more).
    EXPECT_LT(static_cast<double>(st.graph_bytes), 2.5 * static_cast<double>(state));
  }
}

// softmax's backward keeps its output alone (PyTorch's SoftmaxBackward): attention's
// probabilities, which the product with v keeps too, are not kept a second time as exp's result.
TEST(MemoryLedger, SoftmaxKeepsOnlyItsOutputForBackward) {
  if (simulated()) GTEST_SKIP() << "the simulated device counts host blocks as its own";
  const Device dev = kiln::testing::test_device();
  manual_seed(kiln::testing::test_seed(13));
  Tensor x = randn({64, 1024}).to(dev).eval(), v = randn({1024, 8}).to(dev).eval();
  x.requires_grad_();
  v.requires_grad_();
  const int64_t one = 64 * 1024 * 4;
  const int64_t live = allocator_stats(dev).allocated_bytes;
  Tensor loss = sum(matmul(softmax(x, 1), v)).eval();
  const int64_t kept = allocator_stats(dev).allocated_bytes - live;
  EXPECT_LT(static_cast<double>(kept), 1.5 * static_cast<double>(one)) << "bytes kept for backward: " << kept;
  loss.backward();
  // Against the gradient of the decomposition, in float64.
  Tensor xd = x.detach().to(kFloat64), vd = v.detach().to(kFloat64);
  xd.requires_grad_();
  Tensor e = exp(xd - amax(xd, {1}, true).detach());
  sum(matmul(e / sum(e, {1}, true), vd)).backward();
  EXPECT_LE(max(abs(x.grad().to(kFloat64) - xd.grad())).item<double>(), 1e-6);
  // log_softmax: g - exp(y) * sum(g), against the decomposition too.
  Tensor xl = x.detach();
  xl.requires_grad_();
  sum(log_softmax(xl, 1) * (arange(1024) / 1024.0).to(dev).to(kFloat32)).backward();
  Tensor xe = x.detach().to(kFloat64);
  xe.requires_grad_();
  Tensor sh = xe - amax(xe, {1}, true).detach();
  sum((sh - log(sum(exp(sh), {1}, true))) * (arange(1024) / 1024.0).to(dev).to(kFloat64)).backward();
  EXPECT_LE(max(abs(xl.grad().to(kFloat64) - xe.grad())).item<double>(), 1e-5);
}

// A lazy backward is one segment, collected depth-first from the first weight gradient: run in
// that order it computed every activation gradient before any weight gradient read them, holding
// all of them (8 blocks over its start here). Its steps run in a memory order instead
// (jit/exec/plan_order.cpp): each layer's weight gradient right after its activation gradient.
TEST(MemoryLedger, LazyBackwardReadsEachActivationGradientWhileItIsLive) {
  const Device dev = kiln::testing::test_device();
  manual_seed(kiln::testing::test_seed(17));
  const int layers = 8;
  const int64_t m = 8192, k = 64;
  Chain c(dev, layers, m, k);
  Tensor loss = c.loss();
  const double block = static_cast<double>(m * k * 4);
  const int64_t live = allocator_stats(dev).allocated_bytes;
  reset_allocator_peak(dev);
  std::vector<Tensor> gs = c.backward(loss);
  const double over = static_cast<double>(allocator_stats(dev).peak_allocated_bytes - live) / block;
  // (the interpreter, and the simulated device, run each kernel op by op: a block per op)
  if (!simulated() && jit::jit_mode() != jit::JitMode::Interp)
    EXPECT_LE(over, 3.0) << "blocks of [" << m << ", " << k << "] held at once by the backward over its start";
  // Against float64, the chain written out with the gradients by hand.
  Tensor h = c.x.to(kFloat64);
  std::vector<Tensor> hs{h};
  for (const Tensor& w : c.ws) hs.push_back(h = tanh(matmul(h, w.detach().to(kFloat64))));
  Tensor g = ones({m, k}).to(dev).to(kFloat64);
  for (int i = layers - 1; i >= 0; --i) {
    Tensor pre = g * (1.0 - hs[i + 1] * hs[i + 1]);
    const double err = max(abs(gs[i].to(kFloat64) - matmul(hs[i].transpose(0, 1), pre))).item<double>();
    EXPECT_LE(err, 1e-3 * std::max(1.0, max(abs(gs[i].to(kFloat64))).item<double>())) << "layer " << i;
    g = matmul(pre, c.ws[i].detach().to(kFloat64).transpose(0, 1));
  }
}

// The activations a lazy backward reads were stored by the forward: they are the segment's
// external inputs, held only by its edges when the user kept no handle. Each is given back after
// its last reader; one the user holds is never touched.
TEST(MemoryLedger, LazyBackwardGivesBackSavedActivationsOnlyItHolds) {
  const Device dev = kiln::testing::test_device();
  manual_seed(kiln::testing::test_seed(19));
  const int layers = 6;
  Chain c(dev, layers, 2048, 32);
  const uint64_t before = jit::inputs_released();
  std::vector<Tensor> free_grads = c.backward(c.loss());
  if (jit::jit_mode() != jit::JitMode::Interp)
    EXPECT_GE(jit::inputs_released() - before, static_cast<uint64_t>(layers - 1));
  // Held by the user: intact after the backward, and the same gradients.
  std::vector<Tensor> held, copies;
  Tensor loss = c.loss(&held);
  for (const Tensor& t : held) copies.push_back(t.clone().eval());
  std::vector<Tensor> held_grads = c.backward(loss);
  for (size_t i = 0; i < held.size(); ++i)
    EXPECT_EQ(max(abs(held[i] - copies[i])).item<double>(), 0.0) << "layer " << i << "'s output, held by the user, changed";
  for (size_t i = 0; i < held_grads.size(); ++i)
    EXPECT_LE(max(abs(held_grads[i] - free_grads[i])).item<double>(),
              1e-5 * std::max(1.0, max(abs(free_grads[i])).item<double>()));
}

// The profile says what the blocks hold: after AdamW steps (lazy eager and compiled), the blocks
// live hold the parameters, their gradients and the two moments, as the optimizer and backward
// marked them; the report has a line per role.
TEST(MemoryLedger, BlocksSayWhatTheyHold) {
  memory_ledger_enable();
  const Device dev = kiln::testing::test_device();
  manual_seed(kiln::testing::test_seed(23));
  for (bool compiled : {false, true}) {
    auto model = std::make_shared<Mlp>();
    model->to(dev);
    optim::AdamW opt(model->parameters(), optim::AdamOptions{});
    double param_bytes = 0;
    for (const Tensor& p : model->parameters()) param_bytes += static_cast<double>(p.numel() * 4);
    Tensor x = randn({8, 64}).to(dev).eval();
    auto step = [&](const Tensor& in) {
      Tensor loss = sum(model->forward(in));
      opt.zero_grad();
      loss.backward();
      opt.step();
      return loss;
    };
    auto run = compiled ? kiln::compile(step) : std::function<Tensor(const Tensor&)>(step);
    for (int i = 0; i < 3; ++i) run(x).item<double>();
    std::vector<Tensor> all;
    for (const Tensor& p : model->parameters()) all.insert(all.end(), {p, p.grad()});
    kiln::eval(all);
    memory_ledger_reset_peaks();  // (the peak's blocks: those live now)
    std::map<std::string, double> held;
    for (const LedgerBlock& b : ledger_of(dev).at_peak) held[b.role] += static_cast<double>(b.bytes);
    std::string roles;
    for (const auto& [r, b] : held) roles += r + " " + std::to_string(b) + "; ";
    const std::string mode = compiled ? "compiled: " : "lazy eager: ";
    EXPECT_GE(held["parameters"], param_bytes) << mode << roles;
    EXPECT_GE(held["optimizer state"], 2 * param_bytes) << mode << roles;
    EXPECT_GE(held["gradients"], param_bytes) << mode << roles;
    const std::string report = memory_ledger_report();
    for (const char* role : {"parameters", "optimizer state", "gradients"})
      EXPECT_NE(report.find(std::string("  ") + role + "\n"), std::string::npos) << role << " in\n" << report;
  }
}

// A compiled GPT training step (AdamW, no CUDA graph: a replay allocates nothing) peaks within
// 1.1x of its plan's lower bound: the most bytes its schedule holds live at once, each value
// from the step that makes it to its last reader (Plan::live_peak_bytes) — the run frees what
// the plan says when it says, and holds nothing the plan does not know of.
TEST(MemoryLedger, CompiledStepPeaksAtItsPlansLowerBound) {
  if (simulated()) GTEST_SKIP() << "the simulated device counts host blocks as its own";
  if (jit::jit_mode() == jit::JitMode::Interp) GTEST_SKIP() << "no plans without the JIT";
  memory_ledger_enable();
  const Device dev = kiln::testing::test_device();
  manual_seed(kiln::testing::test_seed(29));
  gpt::GptConfig c = gpt::config_named("S");
  auto model = std::make_shared<gpt::Gpt>(c, /*manual_attention=*/false, /*tie=*/false);
  model->to(dev);
  optim::AdamW opt(model->parameters(), optim::AdamOptions{});
  Tensor idx = randint(0, c.vocab, {c.batch, c.block_size}).to(dev).eval();
  Tensor tgt = randint(0, c.vocab, {c.batch, c.block_size}).to(dev).eval();
  CompileOptions o;
  o.cuda_graphs = false;
  auto step = kiln::compile(
      [&](const Tensor& x, const Tensor& y) {
        Tensor loss = cross_entropy(model->forward(x).view({-1, c.vocab}), y.view({-1}));
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
      },
      o);
  jit::reset_planned_live_peak();
  step(idx, tgt).item<double>();
  const double bound = jit::planned_live_peak();
  ASSERT_GT(bound, 0.0);
  for (int i = 0; i < 2; ++i) {
    const double live = static_cast<double>(ledger_of(dev).live_bytes);
    memory_ledger_reset_peaks();
    step(idx, tgt).item<double>();
    const double peak = static_cast<double>(ledger_of(dev).peak_bytes) - live;
    EXPECT_LE(peak, 1.1 * bound) << "run " << i << ": " << peak / 1048576 << " MiB over its start, the plan's bound "
                                 << bound / 1048576 << " MiB";
    EXPECT_GE(peak, 0.5 * bound) << "run " << i << ": the plan's model of its live bytes is far off";
  }
}
