// kiln::compile with graph breaks kept compiled: values fn reads mid-trace (item(), a count
// that sets a size, a mask) become value guards; entries run in segments; a new value traces a
// new continuation; nothing lands before every value guard passed; random numbers match eager.
#include <gtest/gtest.h>

#include <cmath>
#include <atomic>
#include <bit>
#include <optional>
#include <set>
#include <random>
#include <thread>

#include "kiln.h"
#include "tests/expect_close.h"
#include "tests/test_seed.h"

using namespace kiln;

namespace {

void expect_equal(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>());
}

}  // namespace

TEST(CompileBreaks, ItemFeedsLaterMathAndSameValueReplays) {
  auto fn = [](const Tensor& x, const Tensor& y) {
    double s = x.sum().item<double>();
    return (y * s + x.exp()).tanh();
  };
  auto f = compile(fn);
  Tensor y = randn({4, 3});
  for (int i = 0; i < 5; ++i) {
    Tensor x = full({4, 3}, 0.25);  // sum 3 every call: the same value
    expect_close(f(x, y), fn(x, y));
  }
  auto st = f.stats();
  EXPECT_EQ(st.entries, 1);
  EXPECT_EQ(st.hits, 4);
  EXPECT_EQ(st.eager_calls, 0);
  reset_stats();
  Tensor x3 = full({4, 3}, 0.25);
  uint64_t before = stats().nodes_recorded;
  Tensor r = f(x3, y);
  EXPECT_LE(stats().nodes_recorded - before, 4u);  // output leaves only: nothing is re-recorded
  expect_close(r, fn(x3, y));
  // Another value: one more compile, then it replays too; the first value still hits.
  Tensor x5 = full({4, 3}, 0.5);
  expect_close(f(x5, y), fn(x5, y));
  expect_close(f(x5, y), fn(x5, y));
  expect_close(f(x3, y), fn(x3, y));
  st = f.stats();
  EXPECT_EQ(st.entries, 2);
  EXPECT_EQ(st.value_misses, 1);
  EXPECT_EQ(st.hits, 7);
  EXPECT_NE(st.last_miss.find("break 0 (item() of sum): expected 3, got 6"), std::string::npos) << st.last_miss;
}

TEST(CompileBreaks, ItemOfAnArgumentViewReadsTheRightElement) {
  auto fn = [](const Tensor& x, const Tensor& y) { return y * x.item<double>(); };
  auto f = compile(fn);
  Tensor base = arange(0, 6, 1, kFloat32), y = randn({3});
  for (int64_t k : {2, 2, 4}) {
    Tensor x = base.slice(0, k, k + 1);  // one element at offset k of base's storage
    expect_close(f(x, y), fn(x, y));
  }
  EXPECT_EQ(f.stats().entries, 2);
  EXPECT_NE(f.stats().last_miss.find("(item() of an argument): expected 2, got 4"), std::string::npos)
      << f.stats().last_miss;
}

TEST(CompileBreaks, BranchOnItemBoolCompilesEachBranchOnce) {
  auto fn = [](const Tensor& x) {
    if ((x > 0).all().item<bool>()) return x.log() * 2;
    return x.abs() + 1;
  };
  auto f = compile(fn);
  for (int i = 0; i < 8; ++i) {
    Tensor x = randn({6}).abs() + 0.1;
    if (i % 2) x = x - 5;
    expect_close(f(x), fn(x));
  }
  auto st = f.stats();
  EXPECT_EQ(st.entries, 2);
  EXPECT_EQ(st.value_misses, 1);
  EXPECT_EQ(st.hits, 6);
}

TEST(CompileBreaks, DataDependentSizesThenMoreMath) {
  // masked_select: its output size depends on the mask's values.
  auto sel = [](const Tensor& x, const Tensor& y) {
    Tensor picked = masked_select(y, x > 0);
    return (picked * 2 + 1).sum() * static_cast<double>(picked.numel()) + y.mean();
  };
  auto f = compile(sel);
  std::mt19937_64 rng(kiln::testing::test_seed(17));
  Tensor fixed = randn({3, 4});
  for (int i = 0; i < 6; ++i) {
    Tensor x = i % 2 ? fixed : randn({3, 4});
    Tensor y = randn({3, 4});
    expect_close(f(x, y), sel(x, y), 1e-5, 1e-5);
  }
  EXPECT_EQ(f.stats().eager_calls, 0);
  EXPECT_EQ(f.stats().entries, 4);  // three random masks and the fixed one
  // A count read with item() sets a slice's size.
  auto head = [](const Tensor& x, const Tensor& y) {
    int64_t k = (x > 0).sum().item<int64_t>();
    return y.slice(0, 0, k).square().sum({0});
  };
  auto g = compile(head);
  for (int i = 0; i < 6; ++i) {
    Tensor x = i < 4 ? arange(0, 8, 1, kFloat32) - 2.5 : arange(0, 8, 1, kFloat32) - 4.5;  // 5, then 3 positives
    Tensor y = randn({8, 3});
    expect_close(g(x, y), head(x, y));
  }
  EXPECT_EQ(g.stats().entries, 2);
  EXPECT_EQ(g.stats().hits, 4);
}

TEST(CompileBreaks, InPlaceUpdatesLandOnceEvenOnAValueMiss) {
  Tensor state = zeros({3});
  Tensor state_ref = zeros({3});
  auto make = [](Tensor& st) {
    return [&st](Tensor a, const Tensor& x) {
      st.add_(x);  // before the break
      double s = x.sum().item<double>();
      a.add_(s);  // after it
      return a * 2 + st;
    };
  };
  auto fn = make(state_ref);
  auto f = compile(make(state));
  Tensor a = randn({3}), a_ref = a.clone();
  for (int i = 0; i < 6; ++i) {
    Tensor x = full({3}, static_cast<double>(i % 3));  // values 0, 1, 2, 0, 1, 2: three misses
    Tensor r = f(a, x), want = fn(a_ref, x);
    expect_close(r, want);
    expect_close(a, a_ref);
    expect_close(state, state_ref);
  }
  EXPECT_EQ(f.stats().entries, 3);
  EXPECT_EQ(f.stats().value_misses, 2);
  EXPECT_EQ(f.stats().hits, 3);
}

TEST(CompileBreaks, RandomNumbersMatchEagerAcrossValueMisses) {
  // ra is drawn first but used only after the break; rb feeds the break: each must get the
  // numbers eager mode gives it, on hits and on misses alike.
  auto fn = [](const Tensor& x) {
    Tensor ra = rand({3});
    Tensor rb = randn({5});
    bool up = ((rb * 0 + x.sum()) > 0).all().item<bool>();
    Tensor rc = rand({2});
    return up ? cat({ra * 2, rb, rc}) : cat({ra, rb - 1, rc});
  };
  auto f = compile(fn);
  std::vector<Tensor> xs;
  for (int i = 0; i < 7; ++i) xs.push_back(full({2}, i % 3 == 1 ? -1.0 : 1.0));
  manual_seed(5);
  std::vector<Tensor> got;
  for (const auto& x : xs) got.push_back(f(x));
  Tensor after_c = rand({4});
  manual_seed(5);
  for (size_t i = 0; i < xs.size(); ++i) expect_equal(got[i], fn(xs[i]));
  Tensor after_e = rand({4});
  expect_equal(after_c, after_e);  // the generator advanced exactly as in eager mode
  EXPECT_EQ(f.stats().entries, 2);
  EXPECT_EQ(f.stats().value_misses, 1);
}

TEST(CompileBreaks, RecompileLimitThroughBreakValuesFallsBackToEager) {
  CompileOptions o;
  o.recompile_limit = 3;
  auto fn = [](const Tensor& x) { return x * x.amax().item<double>(); };
  auto f = compile(fn, o);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 7; ++i) {
    Tensor x = randn({5});
    expect_close(f(x), fn(x));
  }
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("reached its recompile limit"), std::string::npos) << err;
  auto st = f.stats();
  EXPECT_EQ(st.entries, 3);
  EXPECT_EQ(st.value_misses, 3);  // two recompiles, then the miss that hit the limit
  EXPECT_EQ(st.eager_calls, 4);
}

TEST(CompileBreaks, TrainingStepSkipsNonFiniteLoss) {
  struct Net : nn::Module {
    std::shared_ptr<nn::Linear> l1, l2;
    Net() {
      l1 = register_module("l1", std::make_shared<nn::Linear>(4, 8));
      l2 = register_module("l2", std::make_shared<nn::Linear>(8, 1));
    }
    Tensor forward(const Tensor& x) override { return l2->forward(l1->forward(x).tanh()); }
  };
  manual_seed(3);
  Net ne, nc;
  {
    NoGradGuard ng;
    auto a = ne.parameters(), b = nc.parameters();
    for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  }
  optim::Adam oe(ne.parameters(), optim::AdamOptions{1e-2}), oc(nc.parameters(), optim::AdamOptions{1e-2});
  auto step = [](Net& net, optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss = mse_loss(net(x), y);
    loss.backward();
    if (loss.isfinite().all().item<bool>()) opt.step();
    return loss.detach();
  };
  auto f = compile([&](const Tensor& x, const Tensor& y) { return step(nc, oc, x, y); });
  for (int s = 0; s < 8; ++s) {
    Tensor x = randn({16, 4}), y = randn({16, 1});
    if (s == 5) x = full({16, 4}, NAN);
    expect_close(f(x, y), step(ne, oe, x, y), 1e-4, 1e-6);
    auto pe = ne.parameters(), pc = nc.parameters();
    for (size_t i = 0; i < pe.size(); ++i) expect_close(pc[i], pe[i], 1e-4, 1e-6);
  }
  auto st = f.stats();
  EXPECT_EQ(st.entries, 2);  // finite, then the skipped step
  EXPECT_EQ(st.hits, 6);
  EXPECT_EQ(st.eager_calls, 0);
}

TEST(CompileBreaks, BackwardLeftToTheCallerThroughABreak) {
  // The scale is read mid-trace; the result needs grad, its backward runs later (partitioned).
  Tensor w = randn({3}).requires_grad_();
  auto fn = [&](const Tensor& x) {
    Tensor h = dropout((x * w).tanh(), 0.3, true);  // carried past the break, saved for backward
    double s = ((h.sum() + x.sum()) > 0).item<bool>() ? 2.0 : -1.0;
    return (h * h.exp()).sum() * s;
  };
  auto f = compile(fn);
  for (int i = 0; i < 6; ++i) {
    Tensor x = (randn({3}).abs() + 5) * (i % 3 == 2 ? -1.0 : 1.0);  // the sign of x decides
    Tensor xc = x.clone().requires_grad_(), xe = x.clone().requires_grad_();
    w.set_grad(Tensor());
    manual_seed(100 + i);
    Tensor yc = f(xc);
    ASSERT_TRUE(yc.requires_grad());
    yc.backward();
    Tensor gw = w.grad().clone();
    w.set_grad(Tensor());
    manual_seed(100 + i);
    Tensor ye = fn(xe);
    ye.backward();
    expect_close(yc, ye);
    expect_close(gw, w.grad());
    expect_close(xc.grad(), xe.grad());
  }
  auto st = f.stats();
  EXPECT_EQ(st.entries, 2);
  EXPECT_EQ(st.hits, 4);
  EXPECT_EQ(st.eager_calls, 0);
}

TEST(CompileBreaks, TwoBreaksAndValuesCarriedBetweenSegments) {
  auto fn = [](const Tensor& x, const Tensor& y) {
    Tensor h = (x * 3).sin();  // carried: used before and after break 0
    int64_t n = (h > 0).sum().item<int64_t>();  // break 0
    Tensor z = h.slice(0, 0, std::max<int64_t>(n, 1)) * y.slice(0, 0, std::max<int64_t>(n, 1));
    bool big = (z.sum() > 0).item<bool>();  // break 1
    return big ? (z + h.sum()).exp() : z - h.mean();
  };
  auto f = compile(fn);
  Tensor x = randn({6}), y = randn({6});
  for (int i = 0; i < 4; ++i) {
    expect_close(f(x, y), fn(x, y));
    Tensor yn = y.neg();
    expect_close(f(x, yn), fn(x, yn));  // same first value, the other branch at break 1
  }
  EXPECT_EQ(f.stats().entries, 2);
  EXPECT_EQ(f.stats().hits, 6);
}

// Random small programs with a value read in the middle, over random inputs: compiled equals
// eager on every call, through hits, misses and the recompile limit.
TEST(CompileBreaks, RandomProgramsWithAValueInTheMiddle) {
  uint64_t seed = kiln::testing::test_seed(0xB4EA);
  std::mt19937_64 rng(seed);
  for (int prog = 0; prog < 30; ++prog) {
    std::vector<int> pre, post;
    for (int i = 0, n = 1 + static_cast<int>(rng() % 4); i < n; ++i) pre.push_back(static_cast<int>(rng() % 5));
    for (int i = 0, n = 1 + static_cast<int>(rng() % 4); i < n; ++i) post.push_back(static_cast<int>(rng() % 5));
    int read = static_cast<int>(rng() % 3);
    auto apply = [](Tensor x, const Tensor& b, int op) {
      switch (op) {
        case 0: return x + b;
        case 1: return x * b.tanh();
        case 2: return (x - x.mean({1}, true)).relu();
        case 3: return x.softmax(1);
        default: return x.sigmoid() * 2;
      }
    };
    // The eager run reports the bits of the value it read (the trace's reads are not reported).
    std::optional<uint64_t> read_bits;
    bool report = false;
    auto fn = [=, &read_bits, &report](const Tensor& a, const Tensor& b) {
      Tensor x = a;
      for (int op : pre) x = apply(x, b, op);
      Tensor out;
      uint64_t bits = 0;
      if (read == 0) {  // a rounded scalar: few distinct values, so hits and misses both happen
        float v = (x.sum() * 2).round().item<float>();
        bits = std::bit_cast<uint32_t>(v);
        out = x * static_cast<double>(v);
      } else if (read == 1) {  // a branch
        bool up = (x.amax() > 0.5).item<bool>();
        bits = up;
        out = up ? x.exp() : x.neg();
      } else {  // a size
        int64_t k = (x > 0.5).sum().item<int64_t>();
        bits = static_cast<uint64_t>(k);
        out = x.reshape({-1}).slice(0, 0, k).sum({0}, true) + x.sum();
      }
      if (report) read_bits = bits;
      for (int op : post) out = apply(out, b.sum(), op % 2);
      return out;
    };
    CompileOptions o;
    o.recompile_limit = 4;
    auto f = compile(fn, o);
    // What the calls must do, from the values they read (all inputs have one shape: one entry,
    // a continuation per distinct value): a value seen before is a hit; a new one is a miss
    // that compiles while fewer than recompile_limit compiles were made; the miss at the limit
    // turns the function eager, after which a new value runs eagerly (not a miss) and a value
    // seen before is still served by the entry.
    std::set<uint64_t> seen;
    int64_t want_hits = 0, want_misses = 0, want_eager = 0;
    bool eager = false;
    for (int c = 0; c < 6; ++c) {
      Tensor a = (randn({2, 3}) * 2).round() * 0.5, b = randn({2, 3});
      SCOPED_TRACE("seed " + std::to_string(seed) + " program " + std::to_string(prog) + " call " + std::to_string(c));
      report = true;
      Tensor want = fn(a, b).eval();
      report = false;
      ASSERT_TRUE(read_bits.has_value());
      if (seen.count(*read_bits)) {
        ++want_hits;
      } else if (eager) {
        ++want_eager;
      } else if (static_cast<int>(seen.size()) < o.recompile_limit) {
        ++want_misses;
        seen.insert(*read_bits);
      } else {
        ++want_misses;
        ++want_eager;
        eager = true;
      }
      expect_close(f(a, b), want, 1e-4, 1e-5);
    }
    auto st = f.stats();
    SCOPED_TRACE("seed " + std::to_string(seed) + " program " + std::to_string(prog));
    EXPECT_EQ(st.hits, want_hits);
    EXPECT_EQ(st.misses, want_misses);
    EXPECT_EQ(st.eager_calls, want_eager);
    EXPECT_EQ(st.hits + st.misses + st.eager_calls - (eager ? 1 : 0), 6);  // every call counted once
    EXPECT_EQ(st.entries, static_cast<int>(seen.size()));
    EXPECT_LE(st.entries, o.recompile_limit);
  }
}

// Threads share one function with breaks: continuations are added while others replay.
TEST(CompileBreaks, ThreadsShareContinuations) {
  auto fn = [](const Tensor& x) {
    int64_t n = (x > 0).sum().item<int64_t>();
    return x.slice(0, 0, n).exp().sum() + static_cast<double>(n);
  };
  CompileOptions o;
  o.recompile_limit = 64;
  auto f = compile(fn, o);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        int64_t k = (t + i) % 4;  // 4 distinct counts
        Tensor x = cat({full({k}, 0.5), full({4 - k}, -0.5)});
        double got = f(x).item<double>(), want = fn(x).item<double>();
        if (std::abs(got - want) > 1e-5 * (1 + std::abs(want))) bad++;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(f.stats().eager_calls, 0);
  EXPECT_GE(f.stats().entries, 4);
}

// Size facts across a break: s0 == s1 is established before it (the break segment is simplified
// with it), mod(s0, 2) == 0 only in the continuation that views y in pairs. Equal even sizes
// replay; odd sizes fail in that branch like eager and run in the other; unequal sizes are
// rejected before anything runs.
TEST(CompileBreaks, SizeFactsBeforeAndAfterABreak) {
  auto fn = [](const Tensor& x, const Tensor& y) {
    Tensor s = x + y;
    if ((s.sum() > 0).item<bool>()) return s * y.view({-1, 2}).sum({1}, true).expand({-1, 2}).reshape({-1});
    return s.relu();
  };
  CompileOptions o;
  o.mark_dynamic = {{0, 0}, {1, 0}};
  auto f = compile(fn, o);
  for (int64_t n : {8, 12, 6, 7, 10, 9, 8}) {
    for (double sign : {1.0, -1.0}) {
      Tensor x = (rand({n}) + 1) * sign, y = rand({n}) * sign;
      SCOPED_TRACE("n " + std::to_string(n) + " sign " + std::to_string(sign));
      Tensor want;
      try {
        want = fn(x, y).eval();
      } catch (const Error&) {
        EXPECT_THROW(f(x, y), Error);
        continue;
      }
      expect_close(f(x, y), want);
    }
  }
  EXPECT_EQ(f.stats().symbols, std::vector<std::string>{"s0"});
  Tensor x = rand({6}), y = rand({4});
  EXPECT_FALSE(f.guards_pass(x, y));
  EXPECT_THROW(f(x, y), Error);
}
