// kiln::compile: compiled equals eager; guards, recompilation policy, captured state, training
// steps, the min-cut partitioner and its memory budget, graph breaks.
#include <gtest/gtest.h>

#include <cmath>
#include <atomic>
#include <random>
#include <set>
#include <thread>

#include "kiln.h"
#include "tests/expect_close.h"
#include "tests/test_seed.h"

using namespace kiln;

namespace {

struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> l1, l2, l3;
  Mlp(int64_t in, int64_t hidden, int64_t out) {
    l1 = register_module("l1", std::make_shared<nn::Linear>(in, hidden));
    l2 = register_module("l2", std::make_shared<nn::Linear>(hidden, hidden));
    l3 = register_module("l3", std::make_shared<nn::Linear>(hidden, out));
  }
  Tensor forward(const Tensor& x) override { return l3->forward(l2->forward(l1->forward(x).tanh()).tanh()); }
};

// Calls the compiled f and the eager fn on (a, b): both raise kiln::Error (bad input fails the
// same way compiled), or the results are close. True when eager raised.
template <class F, class G>
bool expect_matches_eager(F& f, const G& fn, const Tensor& a, const Tensor& b) {
  Tensor want;
  try {
    want = fn(a, b).eval();
  } catch (const Error&) {
    EXPECT_THROW(f(a, b), Error);
    return true;
  }
  expect_close(f(a, b), want, 1e-4, 1e-5);
  return false;
}

}  // namespace

TEST(Compile, EqualsEagerAndReplaysWithoutRecording) {
  auto fn = [](const Tensor& x, const Tensor& y, double s) { return ((x * y + s).tanh() * 2).sum({1}); };
  auto f = compile(fn);
  Tensor x = randn({8, 16}), y = randn({8, 16});
  expect_close(f(x, y, 0.5), fn(x, y, 0.5));
  reset_stats();
  for (int i = 0; i < 5; ++i) {
    Tensor a = randn({8, 16}).eval(), b = randn({8, 16}).eval();
    uint64_t before = stats().nodes_recorded;
    Tensor r = f(a, b, 0.5);
    EXPECT_LE(stats().nodes_recorded - before, 2u);  // output leaves only: nothing is re-recorded
    expect_close(r, fn(a, b, 0.5));
  }
  auto st = f.stats();
  EXPECT_EQ(st.entries, 1);
  EXPECT_EQ(st.hits, 5);
  // A scalar argument is specialized: a new value recompiles and stays right.
  expect_close(f(x, y, 1.5), fn(x, y, 1.5));
  EXPECT_EQ(f.stats().entries, 2);
}

TEST(Compile, ArgumentAndResultStructures) {
  auto fn = [](const std::vector<Tensor>& xs, std::tuple<Tensor, int64_t> t, bool flag) {
    Tensor acc = std::get<0>(t) * static_cast<double>(std::get<1>(t));
    for (const auto& x : xs) acc = acc + x;
    return std::make_pair(flag ? acc.relu() : acc, std::vector<Tensor>{acc.exp(), acc.neg()});
  };
  auto f = compile(fn);
  for (int n : {2, 3, 2}) {
    std::vector<Tensor> xs;
    for (int i = 0; i < n; ++i) xs.push_back(randn({4}));
    Tensor t = randn({4});
    auto got = f(xs, std::make_tuple(t, int64_t{3}), true);
    auto want = fn(xs, std::make_tuple(t, int64_t{3}), true);
    expect_close(got.first, want.first);
    ASSERT_EQ(got.second.size(), 2u);
    expect_close(got.second[0], want.second[0]);
    expect_close(got.second[1], want.second[1]);
  }
  EXPECT_EQ(f.stats().entries, 2);  // the list length is part of the guards
}

TEST(Compile, SixtyFourBatchSizesCompileTwice) {
  Mlp net(64, 32, 8);
  auto f = compile([&](const Tensor& x) { return net(x); });
  for (int i = 0; i < 64; ++i) {
    int64_t b = 1000 + 61 * i;
    Tensor x = randn({b, 64});
    Tensor got = f(x);
    if (i % 9 == 0) expect_close(got, net(x), 1e-4, 1e-5);
  }
  auto st = f.stats();
  EXPECT_EQ(st.entries, 2);  // static, then dynamic
  EXPECT_EQ(st.hits, 62);
  EXPECT_NE(st.last_miss.find("arg 0 dim 0: expected 1000, got 1061"), std::string::npos) << st.last_miss;
}

// A dim that changed is symbolic at every size, 0 and 1 included: the symbolic entry serves a
// batch of one or an empty batch unless fn's result depends on that size being 0 or 1.
TEST(Compile, SizeZeroAndOneJoinTheSymbolicEntry) {
  auto fn = [](const Tensor& x) { return (x * 2).sum({0}); };
  auto f = compile(fn);
  for (int64_t b : {5, 6, 1, 0, 9, 1}) {
    Tensor x = randn({b, 3});
    expect_close(f(x), fn(x));
  }
  EXPECT_EQ(f.stats().entries, 2);  // 5 static; then s0 >= 0
  EXPECT_EQ(f.stats().eager_calls, 0);
}

// ... and sizes whose value decides the result (squeeze drops a size-1 dim, a size-1 operand
// broadcasts) still get entries of their own, guarded by what the trace asked.
TEST(Compile, SizeOneThatDecidesTheResultIsSpecialized) {
  auto fn = [](const Tensor& x, const Tensor& y) { return (x.squeeze(0) * 2 + y).sum({-1}); };
  auto f = compile(fn);
  Tensor y = randn({4});
  for (int64_t b : {5, 6, 1, 7, 1}) {
    Tensor x = randn({b, 4});
    Tensor got = f(x, y), want = fn(x, y);
    ASSERT_EQ(got.sizes(), want.sizes()) << "batch " << b;
    expect_close(got, want);
  }
  EXPECT_EQ(f.stats().entries, 3);  // 5 static; s0 >= 0 with s0 != 1; s0 == 1
  // Broadcasting against a changing size: y's dim 0 is 1 in one call, 4 in another.
  auto g = compile([](const Tensor& x, const Tensor& y) { return x + y; });
  Tensor x = randn({3, 4});
  for (int64_t n : {4, 5, 1, 4, 1}) {
    Tensor yy = randn({n == 5 ? 5 : 1, n == 5 ? 4 : n});
    Tensor xx = n == 5 ? randn({5, 4}) : x;
    expect_close(g(xx, yy), xx + yy);
  }
}

TEST(Compile, DtypeAndRankChangesRecompile) {
  auto fn = [](const Tensor& x) { return (x * 3).exp(); };
  auto f = compile(fn);
  Tensor a = randn({4, 5}), b = randn({4, 5}, kFloat64), c = randn({20});
  expect_close(f(a), fn(a));
  expect_close(f(b), fn(b), 1e-12, 1e-12);
  expect_close(f(c), fn(c));
  EXPECT_EQ(f.stats().entries, 3);
  expect_close(f(b), fn(b), 1e-12, 1e-12);
  EXPECT_EQ(f.stats().entries, 3);
}

TEST(Compile, RecompileLimitFallsBackToEager) {
  CompileOptions o;
  o.recompile_limit = 2;
  o.dynamic = CompileOptions::Dynamic::Never;
  auto fn = [](const Tensor& x) { return x.square() + 1; };
  auto f = compile(fn, o);
  for (int64_t n = 1; n <= 6; ++n) {
    Tensor x = randn({n});
    expect_close(f(x), fn(x));
  }
  auto st = f.stats();
  EXPECT_EQ(st.entries, 2);
  EXPECT_EQ(st.eager_calls, 4);
}

TEST(Compile, MarkDynamicCompilesOnce) {
  CompileOptions o;
  o.mark_dynamic = {{0, 0}};
  auto fn = [](const Tensor& x) { return x.softmax(1); };
  auto f = compile(fn, o);
  for (int64_t b : {3, 17, 64, 5}) {
    Tensor x = randn({b, 10});
    expect_close(f(x), fn(x));
  }
  EXPECT_EQ(f.stats().entries, 1);
}

TEST(Compile, NonContiguousInputsAreGuarded) {
  auto fn = [](const Tensor& x) { return x * 2 + 1; };
  auto f = compile(fn);
  Tensor base = randn({6, 8});
  Tensor t = base.t();
  expect_close(f(base), fn(base));
  expect_close(f(t), fn(t));
  Tensor s = base.slice(1, 1, 7);
  expect_close(f(s), fn(s));
  EXPECT_EQ(f.stats().entries, 3);
}

TEST(Compile, CapturedParametersAreReadEachCall) {
  Mlp net(5, 7, 3);
  auto f = compile([&](const Tensor& x) { return net(x); });
  Tensor x = randn({4, 5});
  expect_close(f(x), net(x), 1e-5, 1e-6);
  {
    NoGradGuard ng;
    net.l1->weight.mul_(0.5);  // updated outside fn, eagerly
  }
  expect_close(f(x), net(x), 1e-5, 1e-6);
  EXPECT_EQ(f.stats().entries, 1);
}

TEST(Compile, InPlaceOnArgumentsLandsInTheCaller) {
  auto fn = [](Tensor x, const Tensor& y) {
    x.add_(y);
    return x * 2;
  };
  auto f = compile(fn);
  Tensor a = randn({3, 4}), b = randn({3, 4});
  Tensor a2 = a.clone();
  Tensor r = f(a, b);
  Tensor r2 = fn(a2, b);
  expect_close(r, r2);
  expect_close(a, a2);
  Tensor r3 = f(a, b), r4 = fn(a2, b);  // replay
  expect_close(r3, r4);
  expect_close(a, a2);
}

namespace {
template <class MakeOpt>
void check_training_step(MakeOpt make_opt, int steps) {
  manual_seed(7);
  Mlp eager_net(6, 16, 2), comp_net(6, 16, 2);
  {
    auto src = eager_net.named_parameters();
    auto dst = comp_net.named_parameters();
    NoGradGuard ng;
    for (size_t i = 0; i < src.size(); ++i) dst[i].second.copy_(src[i].second);
  }
  auto opt_e = make_opt(eager_net.parameters());
  auto opt_c = make_opt(comp_net.parameters());
  auto step_fn = [](Mlp& net, optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss = mse_loss(net(x), y);
    loss.backward();
    opt.step();
    return loss.detach();
  };
  auto f = compile([&](const Tensor& x, const Tensor& y) { return step_fn(comp_net, *opt_c, x, y); });
  for (int s = 0; s < steps; ++s) {
    Tensor x = randn({32, 6}), y = randn({32, 2});
    Tensor lc = f(x, y);
    Tensor le = step_fn(eager_net, *opt_e, x, y);
    expect_close(lc, le, 1e-4, 1e-6);
  }
  auto pe = eager_net.parameters(), pc = comp_net.parameters();
  for (size_t i = 0; i < pe.size(); ++i) {
    expect_close(pc[i], pe[i], 1e-4, 1e-6);
    expect_close(pc[i].grad(), pe[i].grad(), 1e-4, 1e-6);
  }
  EXPECT_EQ(f.stats().entries, 1);
  EXPECT_EQ(f.stats().hits, steps - 1);
}
}  // namespace

TEST(Compile, TrainingStepAdamMatchesEager) {
  check_training_step([](std::vector<Tensor> p) { return std::make_unique<optim::Adam>(p, optim::AdamOptions{1e-2}); },
                      12);
}

TEST(Compile, TrainingStepSgdMomentumMatchesEager) {
  check_training_step(
      [](std::vector<Tensor> p) {
        optim::SGDOptions o;
        o.lr = 0.05;
        o.momentum = 0.9;
        o.dampening = 0.1;
        return std::make_unique<optim::SGD>(p, o);
      },
      8);
}

TEST(Compile, LearningRateChangesAreSeen) {
  Mlp net(3, 4, 1);
  optim::SGD opt(net.parameters(), optim::SGDOptions{0.1});
  Mlp ref(3, 4, 1);
  {
    NoGradGuard ng;
    auto a = net.parameters(), b = ref.parameters();
    for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  }
  optim::SGD ropt(ref.parameters(), optim::SGDOptions{0.1});
  auto step = [](Mlp& m, optim::SGD& o, const Tensor& x) {
    o.zero_grad();
    m(x).square().mean().backward();
    o.step();
  };
  auto f = compile([&](const Tensor& x) { step(net, opt, x); });
  for (int i = 0; i < 4; ++i) {
    Tensor x = randn({5, 3});
    opt.set_lr(0.1 / (i + 1));
    ropt.set_lr(0.1 / (i + 1));
    f(x);
    step(ref, ropt, x);
  }
  auto a = net.parameters(), b = ref.parameters();
  for (size_t i = 0; i < a.size(); ++i) expect_close(a[i], b[i]);
}

TEST(Compile, ForwardWithBackwardOutsideMatchesEager) {
  Mlp net(8, 16, 4);
  auto f = compile([&](const Tensor& x) { return net(x); });
  for (int it = 0; it < 3; ++it) {
    Tensor x = randn({10, 8}).requires_grad_();
    Tensor xe = x.detach().clone().requires_grad_();
    net.zero_grad();
    Tensor y = f(x);
    ASSERT_TRUE(y.requires_grad());
    (y.square().sum()).backward();
    std::vector<Tensor> gc;
    for (auto& p : net.parameters()) gc.push_back(p.grad().clone());
    Tensor gx = x.grad();
    net.zero_grad();
    net(xe).square().sum().backward();
    auto ps = net.parameters();
    for (size_t i = 0; i < ps.size(); ++i) expect_close(gc[i], ps[i].grad(), 1e-4, 1e-5);
    expect_close(gx, xe.grad(), 1e-4, 1e-5);
  }
  EXPECT_EQ(f.stats().entries, 1);
  EXPECT_LE(f.stats().saved_bytes, f.stats().save_all_bytes);
}

TEST(Partition, PointwiseChainBetweenMatmulsSavesOneTensor) {
  // Weights scaled like an initialized layer keep exp() and the float32 sums well conditioned.
  Tensor w1 = randn({32, 32}) * 0.15, w2 = randn({32, 32}) * 0.15;
  w1.eval();
  w2.eval();
  w1.requires_grad_();
  w2.requires_grad_();
  auto fn = [&](const Tensor& x) {
    Tensor h = x.matmul(w1);
    Tensor a = ((h.tanh() * 2 + 1).sigmoid() * h).exp();
    return a.matmul(w2);
  };
  auto f = compile(fn);
  Tensor x = randn({64, 32});
  Tensor y = f(x);
  y.sum().backward();
  auto st = f.stats();
  // The backward needs x (for dW1), W2 (for da) and h; a and every intermediate are recomputed.
  int64_t expect = (64 * 32 + 32 * 32 + 64 * 32) * 4;
  EXPECT_EQ(st.saved_bytes, expect);
  EXPECT_GT(st.save_all_bytes, st.saved_bytes);
  EXPECT_GE(st.recomputed, 5);
  Tensor g1 = w1.grad().clone(), g2 = w2.grad().clone();
  w1.set_grad(Tensor());
  w2.set_grad(Tensor());
  fn(x).sum().backward();
  expect_close(g1, w1.grad(), 1e-4, 1e-4);
  expect_close(g2, w2.grad(), 1e-4, 1e-4);
}

TEST(Partition, MinCutSavesNoMoreThanSaveAllWithIdenticalResults) {
  for (bool save_all : {false, true}) {
    manual_seed(3);
    Mlp net(16, 32, 4);
    CompileOptions o;
    o.save_all = save_all;
    auto f = compile([&](const Tensor& x) { return net(x).softmax(1); }, o);
    Tensor x = randn({20, 16});
    f(x).log().sum().backward();
    static std::vector<float> first;
    static int64_t min_cut_bytes = 0;
    auto g = net.l1->weight.grad().to_vector<float>();
    if (!save_all) {
      first = g;
      min_cut_bytes = f.stats().saved_bytes;
    } else {
      // The same math whatever is saved; recomputed values fuse differently, so float32
      // rounding may differ in the last bits.
      ASSERT_EQ(g.size(), first.size());
      for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], first[i], 1e-6 + 1e-5 * std::abs(first[i]));
      EXPECT_LE(min_cut_bytes, f.stats().saved_bytes);
      EXPECT_EQ(f.stats().saved_bytes, f.stats().save_all_bytes);
    }
  }
}

TEST(Partition, MemoryBudgetLowersSavedBytesMonotonically) {
  int64_t prev = INT64_MAX;
  std::vector<float> ref;
  for (double budget : {1.0, 0.8, 0.6, 0.4, 0.2, 0.05}) {
    manual_seed(5);
    Mlp net(16, 64, 8);
    CompileOptions o;
    o.memory_budget = budget;
    auto f = compile([&](const Tensor& x) { return (net(x).tanh() - net(x).mean({1}, true)).square(); }, o);
    Tensor x = randn({40, 16});
    f(x).sum().backward();
    int64_t saved = f.stats().saved_bytes;
    EXPECT_LE(saved, prev) << "budget " << budget;
    prev = saved;
    auto g = net.l2->weight.grad().to_vector<float>();
    if (ref.empty()) ref = g;
    for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], ref[i], 1e-4 + 1e-4 * std::abs(ref[i]));
  }
  EXPECT_LT(prev, INT64_MAX);
}

TEST(Compile, LargeValueNeededMidTraceRunsEagerWithRightAnswers) {
  auto fn = [](const Tensor& x) {
    std::vector<float> v = (x * 2).to_vector<float>();  // 100 values: too many for a value guard
    return x / static_cast<double>(1 + v.size());
  };
  auto f = compile(fn);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    Tensor x = randn({100});
    expect_close(f(x), fn(x));
  }
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("a value of 100 elements was needed while tracing"), std::string::npos) << err;
  EXPECT_EQ(f.stats().entries, 0);
  EXPECT_EQ(f.stats().eager_calls, 3);
}

TEST(Compile, RandomOpsDrawFreshNumbersLikeEager) {
  auto fn = [](const Tensor& x) { return dropout(x, 0.5, true); };
  auto f = compile(fn);
  Tensor x = ones({64});
  manual_seed(11);
  std::vector<Tensor> comp;
  for (int i = 0; i < 3; ++i) comp.push_back(f(x));
  manual_seed(11);
  for (int i = 0; i < 3; ++i) expect_close(comp[i], fn(x));
  EXPECT_NE(comp[1].to_vector<float>(), comp[2].to_vector<float>());
}

TEST(Compile, ClearErrors) {
  std::vector<Tensor> state;
  auto leaky = compile([&](const Tensor& x) {
    if (state.empty()) state.push_back(zeros({3}));
    state[0].add_(x);
    return x + 1;
  });
  EXPECT_THROW(leaky(ones({3})), Error);
  Tensor w = randn({3}).requires_grad_();
  auto f = compile([&](const Tensor& x) { return (x * w).sum(); });
  Tensor y = f(randn({3}));
  EXPECT_THROW(kiln::grad({y}, {w}, {}, false, true), Error);  // double backward
  EXPECT_THROW(compile([](const Tensor& x) { return x; }, CompileOptions{"bad", 0}), Error);
}

// Random programs over random shapes: a compiled function called with shapes that change across
// calls must equal eager on every call (guards never admit an input the code is wrong for).
TEST(Compile, RandomProgramsAcrossShapes) {
  uint64_t seed = kiln::testing::test_seed(0xC0FFEE);
  std::mt19937_64 rng(seed);
  int calls = 0;
  for (int prog = 0; prog < 60; ++prog) {
    std::vector<int> ops;
    int len = 2 + static_cast<int>(rng() % 6);
    for (int i = 0; i < len; ++i) ops.push_back(static_cast<int>(rng() % 10));
    auto fn = [ops](const Tensor& a, const Tensor& b) {
      Tensor x = a;
      for (int op : ops) {
        switch (op) {
          case 0: x = x + b; break;
          case 1: x = x * b.tanh(); break;
          case 2: x = x.exp().clamp(std::nullopt, 10.0); break;
          case 3: x = x - x.mean({1}, true); break;
          case 4: x = x.softmax(1); break;
          case 5: x = x.t().contiguous().t(); break;
          case 6: x = x * x.amax({0}, true); break;
          case 7: x = x.relu() + b.sum({0}, true); break;
          case 8: x = x.slice(1, 0, std::nullopt, 1) * 0.5; break;
          default: x = x.sigmoid(); break;
        }
      }
      return x;
    };
    auto f = compile(fn);
    int64_t cols = 1 + static_cast<int64_t>(rng() % 9);
    for (int c = 0; c < 5; ++c) {
      int64_t rows = static_cast<int64_t>(rng() % 12);  // includes 0 and 1
      if (rng() % 3 == 0) cols = 1 + static_cast<int64_t>(rng() % 9);
      Tensor a = randn({rows, cols}), b = randn({rows, cols});
      if (rng() % 4 == 0) b = randn({1, cols});  // broadcast
      SCOPED_TRACE("seed " + std::to_string(seed) + " program " + std::to_string(prog) + " call " + std::to_string(c));
      expect_matches_eager(f, fn, a, b);
      ++calls;
    }
  }
  EXPECT_EQ(calls, 300);
}

// Eight threads call one compiled function with their own shapes: entries are shared, each
// result is right.
TEST(Compile, ThreadsShareOneCompiledFunction) {
  auto fn = [](const Tensor& x, const Tensor& w) { return (x.matmul(w) + 1).tanh().sum({1}); };
  auto f = compile(fn);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        Tensor x = randn({4 + (t + i) % 3, 6}), w = randn({6, 5});
        auto got = f(x, w).to_vector<float>(), want = fn(x, w).to_vector<float>();
        for (size_t k = 0; k < got.size(); ++k)
          if (std::abs(got[k] - want[k]) > 1e-5 + 1e-5 * std::abs(want[k])) bad++;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_LE(f.stats().entries, 3);  // static, then dynamic (racing threads may both trace)
}

// A compiled function called inside another one is traced through (inlined).
TEST(Compile, NestedCompiledFunctionsInline) {
  auto inner = compile([](const Tensor& x) { return x.exp() * 2; });
  auto outer_fn = [&](const Tensor& x) { return inner(x).sum() + x.sum(); };
  auto outer = compile(outer_fn);
  for (int i = 0; i < 3; ++i) {
    Tensor x = randn({5});
    expect_close(outer(x), (x.exp() * 2).sum() + x.sum());
  }
  EXPECT_EQ(outer.stats().entries, 1);
  EXPECT_EQ(inner.stats().entries, 0);  // only ever traced through
}

// Two dims marked dynamic that the trace finds equal: the program uses one symbol (s1 -> s0),
// the only size relation is s0 == s1, other equal sizes replay, unequal sizes fail like eager.
TEST(CompileSymbols, EqualDynamicSizesShareOneSymbol) {
  auto fn = [](const Tensor& x, const Tensor& y) { return y.relu() * 2 + x; };  // y's node before the fact
  CompileOptions o;
  o.mark_dynamic = {{0, 0}, {1, 0}};
  auto f = compile(fn, o);
  for (int64_t n : {7, 9, 12, 7}) {
    Tensor x = randn({n, 3}), y = randn({n, 3});
    expect_close(f(x, y), fn(x, y));
  }
  auto st = f.stats();
  EXPECT_EQ(st.entries, 1);
  EXPECT_EQ(st.hits, 3);
  EXPECT_EQ(st.symbols, std::vector<std::string>{"s0"});
  EXPECT_EQ(st.size_relations, 1);  // s0 - s1 == 0 (s0 != 1 follows from s0 >= 2: not asked)
  // Unequal sizes: the guard rejects them and the re-trace raises eager's error.
  Tensor x = randn({5, 3}), y = randn({6, 3});
  EXPECT_FALSE(f.guards_pass(x, y));
  EXPECT_THROW(fn(x, y), Error);
  EXPECT_THROW(f(x, y), Error);
  // Broadcasting from 1 is another entry, and right.
  Tensor y1 = randn({1, 3});
  expect_close(f(x, y1), fn(x, y1));
}

// view(-1, 4) of a dynamic size stays symbolic: floor(s0/4) with mod(s0, 4) == 0 guarded, and
// 4*floor(s0/4) folds back to s0 (so adding x needs no further relation). Other multiples of 4
// replay; a size that is not one fails like eager.
TEST(CompileSymbols, ViewOfDynamicSizeGuardsDivisibility) {
  auto fn = [](const Tensor& x) {
    Tensor m = x.view({-1, 4});
    return std::make_pair(m.relu().reshape({-1}) + x, m.sum({1}));
  };
  CompileOptions o;
  o.mark_dynamic = {{0, 0}};
  auto f = compile(fn, o);
  for (int64_t n : {8, 12, 4, 20, 400}) {  // 4: one row, served by the same entry
    Tensor x = randn({n});
    auto got = f(x);
    auto want = fn(x);
    expect_close(got.first, want.first);
    expect_close(got.second, want.second);
  }
  auto st = f.stats();
  EXPECT_EQ(st.entries, 1);  // not specialized per size
  EXPECT_EQ(st.symbols, std::vector<std::string>{"s0"});
  // mod(s0, 4) == 0 only: whether there is one row is never asked (broadcasting and layout
  // checks compare sizes with each other before asking whether one is 1), and floor(s0/4) != 0
  // follows from s0 >= 2 and the divisibility (s0 >= 4).
  EXPECT_EQ(st.size_relations, 1);
  Tensor bad = randn({10});
  EXPECT_FALSE(f.guards_pass(bad));
  EXPECT_THROW(fn(bad), Error);
  EXPECT_THROW(f(bad), Error);
  // A view whose inferred size divides statically needs no relation at all.
  auto g = compile([](const Tensor& x) { return x.view({-1, 3}).sum({1}); }, o);
  for (int64_t n : {4, 5, 9}) {
    Tensor x = randn({n, 6});
    expect_close(g(x), x.view({-1, 3}).sum({1}));
  }
  EXPECT_EQ(g.stats().entries, 1);
  EXPECT_EQ(g.stats().size_relations, 0);
}

// flatten of dynamic dims keeps the product symbolic: one compile serves every batch, with no
// size relation (sizes() would have specialized each one).
TEST(CompileSymbols, FlattenOfDynamicDimsStaysSymbolic) {
  auto fn = [](const Tensor& x) { return x.flatten(0, 1).relu() * 2.0 + x.flatten(1).sum({1}).sum(); };
  CompileOptions o;
  o.mark_dynamic = {{0, 0}, {0, 1}};
  auto f = compile(fn, o);
  for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {4, 7}, {9, 2}, {2, 16}}) {
    Tensor x = randn({b, t, 6});
    expect_close(f(x), fn(x));
  }
  auto st = f.stats();
  EXPECT_EQ(st.entries, 1);
  EXPECT_EQ(st.symbols, (std::vector<std::string>{"s0", "s1"}));
  EXPECT_EQ(st.size_relations, 0);
}

// Random programs over two dynamic 1-D inputs whose sizes are equal, unequal or multiples of
// each other across calls: compiled equals eager on every call, and fails where eager fails.
TEST(CompileSymbols, RandomProgramsOverRelatedDynamicSizes) {
  uint64_t seed = kiln::testing::test_seed(0x5F4C7);
  std::mt19937_64 rng(seed);
  int calls = 0, errors = 0;
  int64_t hits = 0, expected_hits = 0;
  for (int prog = 0; prog < 40; ++prog) {
    std::vector<int> ops;
    int len = 2 + static_cast<int>(rng() % 5);
    for (int i = 0; i < len; ++i) ops.push_back(static_cast<int>(rng() % 9));
    auto fn = [ops](const Tensor& a, const Tensor& b) {
      Tensor x = a;
      for (int op : ops) {
        switch (op) {
          case 0: x = x + b; break;  // needs equal sizes (or 1)
          case 1: x = x.view({-1, 2}).sum({1}); break;  // needs an even size
          case 2: x = x.view({-1, 4}).amax({1}) * 0.5; break;  // needs a multiple of 4
          case 3: x = x * b.sum(); break;
          case 4: x = x.view({2, -1}).t().contiguous().view({-1}); break;  // interleaves halves
          case 5: x = x - x.mean(); break;
          case 6: x = x.reshape({-1, 2}).reshape({-1}) * b.view({-1, 2}).sum({1}).sum(); break;
          case 7: x = x.tanh() + b.view({-1, 2}).amin({1}).mean(); break;
          default: x = x.exp().clamp(std::nullopt, 5.0); break;
        }
      }
      return x;
    };
    CompileOptions o;
    o.dynamic = CompileOptions::Dynamic::Always;
    auto f = compile(fn, o);
    // Sizes that an earlier call of this program ran with (not failing) are served by the
    // entry it made or used: each such call must be a hit.
    std::set<std::pair<int64_t, int64_t>> served;
    int64_t repeats = 0;
    for (int c = 0; c < 6; ++c) {
      int64_t base = 1 + static_cast<int64_t>(rng() % 6);
      int64_t n = base * (int64_t{1} << (rng() % 4));
      int64_t m = rng() % 2 ? n : (rng() % 2 ? 2 * n : 1 + static_cast<int64_t>(rng() % 16));
      Tensor a = randn({n}), b = randn({m});
      SCOPED_TRACE("seed " + std::to_string(seed) + " program " + std::to_string(prog) + " call " + std::to_string(c) +
                   " sizes " + std::to_string(n) + ", " + std::to_string(m));
      ++calls;
      repeats += served.count({n, m});
      bool error = expect_matches_eager(f, fn, a, b);
      errors += error;
      if (!error) served.insert({n, m});
    }
    auto st = f.stats();
    SCOPED_TRACE("seed " + std::to_string(seed) + " program " + std::to_string(prog));
    EXPECT_GE(st.hits, repeats);
    EXPECT_EQ(st.hits + st.misses, 6);  // 6 calls stay under the recompile limit: none runs eagerly
    EXPECT_EQ(st.eager_calls, 0);
    EXPECT_LE(st.hits, 5);  // the first call compiles
    expected_hits += repeats;
    hits += st.hits;
  }
  EXPECT_EQ(calls, 240);
  EXPECT_GE(hits, expected_hits);
  EXPECT_GT(errors, 10);
  EXPECT_LT(errors, 200);
}
