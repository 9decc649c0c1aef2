// Graph passes of the JIT (jit/graph/passes.h): each pass fires on a graph built to need it (counters
// and values against the reference interpreter), constant-value guards keep a cached rewrite
// from being reused with other constants, and random graphs full of duplicates and no-ops agree
// with the interpreter. Float32 results are compared with rtol 1e-5 (transcendentals may differ
// in the last bits between the JIT's vector math and the interpreter's libm).
#include <gtest/gtest.h>

#include <bit>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "jit/exec/jit_executor.h"
#include "jit/graph/passes.h"
#include "kiln.h"
#include "test_seed.h"

namespace {

using kiln::Tensor;
using kiln::jit::PassCounts;

bool jit_active() { return std::string(kiln::current_executor().name()) != "interp"; }

#define SKIP_WITHOUT_JIT() \
  if (!jit_active()) GTEST_SKIP() << "passes run in the JIT executor (the default registration runs this)"

PassCounts delta(const PassCounts& before) {
  PassCounts now = kiln::jit::pass_totals();
  return {now.cse - before.cse, now.noop - before.noop, now.folded - before.folded, now.dead - before.dead};
}

Tensor input(const std::vector<int64_t>& shape, uint64_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (auto& x : v) x = u(rng);
  return kiln::from_vector(v, shape).eval();
}

// Values of build() on the JIT and on the interpreter (fresh graphs each time).
void expect_matches_interpreter(const std::function<std::vector<Tensor>()>& build, const std::string& what) {
  std::vector<Tensor> got = build();
  kiln::eval(got);
  auto jit = kiln::jit::jit_executor();
  kiln::set_executor(kiln::interpreter());
  std::vector<Tensor> ref = build();
  kiln::eval(ref);
  kiln::set_executor(jit);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), ref[i].sizes()) << what << " output " << i;
    std::vector<double> a = got[i].to_vector<double>(), b = ref[i].to_vector<double>();
    for (size_t j = 0; j < a.size(); ++j) {
      if (std::isnan(b[j])) {
        EXPECT_TRUE(std::isnan(a[j])) << what << " output " << i << " element " << j;
        continue;
      }
      EXPECT_NEAR(a[j], b[j], 1e-5 * (1 + std::abs(b[j]))) << what << " output " << i << " element " << j;
    }
  }
}

TEST(Passes, CseMergesDuplicates) {
  SKIP_WITHOUT_JIT();
  Tensor x = input({3, 7}, 1);
  PassCounts before = kiln::jit::pass_totals();
  auto build = [&] { return std::vector<Tensor>{kiln::exp(x) * kiln::tanh(x) + kiln::exp(x) * kiln::tanh(x)}; };
  expect_matches_interpreter(build, "exp(x)*tanh(x) twice");
  EXPECT_GE(delta(before).cse, 3) << "exp, tanh and their product recorded twice";
}

TEST(Passes, NeededDuplicateSharesStorage) {
  SKIP_WITHOUT_JIT();
  Tensor x = input({3, 8}, 2);
  PassCounts before = kiln::jit::pass_totals();
  Tensor a = kiln::sigmoid(x), b = kiln::sigmoid(x);
  kiln::eval({a, b});
  EXPECT_EQ(delta(before).cse, 1);
  EXPECT_EQ(a.data<float>(), b.data<float>()) << "the duplicate takes the canonical node's storage";
  std::vector<float> xv = x.to_vector<float>(), bv = b.to_vector<float>();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(bv[i], 1 / (1 + std::exp(-xv[i])), 1e-6);
}

TEST(Passes, NoOpsAreRemovedAndGuardedByValue) {
  SKIP_WITHOUT_JIT();
  Tensor x = input({5, 3}, 3);
  PassCounts before = kiln::jit::pass_totals();
  auto build = [&](double one, double zero) {
    Tensor y = ((x * one + zero) / one - zero).reshape({5, 3}).expand({5, 3}).contiguous();
    return std::vector<Tensor>{kiln::relu(y)};
  };
  expect_matches_interpreter([&] { return build(1, 0); }, "x*1+0/1-0");
  PassCounts d = delta(before);
  // (x is the segment's first external input: the multiplication by 1 goes too. The 1s of mul
  // and div are one node in lazy eager, as are the 0s. Adding +0 stays: it is not x at -0.)
  EXPECT_GE(d.noop, 5) << "mul, div, sub by identity constants, the reshape and the expand";
  EXPECT_GE(d.dead, 1) << "the constant 1 is left without consumers";
  // The same structure with other constants: the cached rewrite's guards must refuse it.
  expect_matches_interpreter([&] { return build(2, 0.5); }, "x*2+0.5/2-0.5");
  expect_matches_interpreter([&] { return build(1, 0); }, "x*1+0/1-0 again");
}

// x + 0 is +0 at x = -0 (IEEE), so only adding -0 and subtracting +0 are identities; a plan
// whose rewrite relied on one zero's sign does not serve the other.
TEST(Passes, SignedZerosDecideWhichAdditionsAreNoOps) {
  SKIP_WITHOUT_JIT();
  Tensor x = kiln::from_vector(std::vector<float>{-0.f, 0.f, -1.5f, 2.f}, std::vector<int64_t>{4}).eval();
  auto bits = [](const Tensor& t) {
    std::vector<uint32_t> out;
    for (float f : t.to_vector<float>()) out.push_back(std::bit_cast<uint32_t>(f));
    return out;
  };
  const uint32_t neg0 = 0x80000000u, pos0 = 0;
  for (int pass = 0; pass < 2; ++pass) {  // the second reuses the plans
    PassCounts before = kiln::jit::pass_totals();
    EXPECT_EQ(bits(kiln::relu(x) + 0.0)[0], pos0) << "relu(-0) + 0 is +0";
    EXPECT_EQ(bits(x * 1 + 0.0)[0], pos0) << "-0 + 0 is +0";
    EXPECT_EQ(bits(x * 1 + -0.0)[0], neg0) << "-0 + -0 is -0";
    EXPECT_EQ(bits(x * 1 - 0.0)[0], neg0) << "-0 - 0 is -0";
    EXPECT_EQ(bits(x * 1 - -0.0)[0], pos0) << "-0 - -0 is +0";
    if (pass == 0) EXPECT_GE(delta(before).noop, 2) << "adding -0 and subtracting +0 are removed";
  }
  expect_matches_interpreter(
      [&] {
        return std::vector<Tensor>{x * 1 + 0.0, x * 1 - 0.0, x * 1 + -0.0};
      },
      "signed zeros");
}

TEST(Passes, ConstantsFoldWithFreshValuesEveryCall) {
  SKIP_WITHOUT_JIT();
  Tensor x = input({4, 6}, 4);
  PassCounts before = kiln::jit::pass_totals();
  for (double a : {2.0, 3.5, -1.0}) {
    auto build = [&] {
      Tensor c = kiln::full({}, a, kiln::kFloat32) * kiln::full({}, 3.0, kiln::kFloat32);
      Tensor k = kiln::sqrt(kiln::abs(c) + kiln::full({}, 7, kiln::kInt32).to(kiln::kFloat32));
      return std::vector<Tensor>{x * k + c, c};  // c is also needed outside
    };
    expect_matches_interpreter(build, "folded constants, a = " + std::to_string(a));
  }
  EXPECT_GE(delta(before).folded, 5) << "mul, abs, cast, add, sqrt";
}

TEST(Passes, NothingToRewriteKeepsTheSegment) {
  SKIP_WITHOUT_JIT();
  Tensor x = input({16}, 5);
  PassCounts before = kiln::jit::pass_totals();
  expect_matches_interpreter([&] { return std::vector<Tensor>{kiln::relu(2 * x + 1)}; }, "relu(2x+1)");
  PassCounts d = delta(before);
  EXPECT_EQ(d.cse + d.noop + d.folded + d.dead, 0);
}

// Random graphs over a few inputs with repeated subexpressions, identities and constant
// subtrees; every value agrees with the interpreter.
TEST(Passes, RandomGraphsWithDuplicatesMatchInterpreter) {
  SKIP_WITHOUT_JIT();
  const uint64_t seed = kiln::testing::test_seed(77);
  Tensor x0 = input({4, 5}, seed), x1 = input({4, 5}, seed + 1), x2 = input({5}, seed + 2);
  PassCounts before = kiln::jit::pass_totals();
  for (int g = 0; g < 60; ++g) {
    auto build = [&] {
      std::mt19937_64 rng(kiln::testing::splitmix(seed * 1000 + g));
      auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
      std::vector<Tensor> pool{x0, x1, x2};
      std::vector<std::function<Tensor()>> history;
      for (int step = 0; step < 14; ++step) {
        Tensor a = pool[pick(static_cast<int>(pool.size()))], b = pool[pick(static_cast<int>(pool.size()))];
        Tensor r;
        switch (pick(12)) {
          case 0: r = kiln::tanh(a); break;
          case 1: r = kiln::exp(kiln::neg(kiln::abs(a))); break;
          case 2: r = a + b; break;
          case 3: r = a * b; break;
          case 4: r = a - b; break;
          case 5: r = a * 1; break;
          case 6: r = (a + 0) / 1; break;
          case 7: r = a.reshape(a.sizes()).contiguous(); break;
          case 8: r = a + kiln::full({}, 0.5, kiln::kFloat32) * kiln::full({}, 4.0, kiln::kFloat32); break;
          case 9: r = kiln::relu(a) + kiln::relu(a); break;  // a duplicate
          case 10: r = kiln::maximum(a, b) * kiln::maximum(a, b); break;
          default: r = a.expand(a.sizes()) - 0; break;
        }
        pool.push_back(r);
      }
      std::vector<Tensor> outs{pool.back(), pool[pool.size() - 3]};
      if (pick(2)) outs.push_back(pool[3 + pick(static_cast<int>(pool.size()) - 3)]);
      return outs;
    };
    expect_matches_interpreter(build, "graph " + std::to_string(g) + " (KILN_TEST_SEED=" + std::to_string(seed) + ")");
    if (HasFailure()) return;
  }
  PassCounts d = delta(before);
  EXPECT_GT(d.cse, 0);
  EXPECT_GT(d.noop, 0);
  EXPECT_GT(d.folded, 0);
  EXPECT_GT(d.dead, 0);
}

}  // namespace
