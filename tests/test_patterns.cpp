// kiln::patterns: rewrites registered as kiln functions, matched in compile()'s joint graph
// (forward and backward) and replaced by the replacement traced on the matched inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

#include "kiln.h"
#include "tests/expect_close.h"
#include "tests/test_seed.h"
#include "tests/unrewritten.h"

using namespace kiln;
using kiln::testing::interpreted;
using kiln::testing::unrewritten;
using patterns::register_replacement;

namespace {

using Ts = std::vector<Tensor>;
using Ss = std::vector<double>;

// exp(x) - 1 -> expm1(x): in float64 the rewrite is visible in the last digits for tiny x.
void register_expm1() {
  register_replacement(
      "test_expm1", [](const Ts& t, const Ss&) { return exp(t[0]) - 1.0; },
      [](const Ts& t, const Ss&) { return expm1(t[0]); }, {empty({3, 3}, kFloat64)});
}

int64_t count(const std::string& name) {
  auto c = patterns::match_counts();
  auto it = c.find(name);
  return it == c.end() ? 0 : it->second;
}

// Instances replaced so far by the rewrites whose names start with `prefix`.
int64_t count_prefix(const std::string& prefix) {
  int64_t n = 0;
  for (const auto& [name, k] : patterns::match_counts())
    if (name.rfind(prefix, 0) == 0) n += k;
  return n;
}

// Every test starts with patterns on and leaves no user pattern behind.
class Patterns : public ::testing::Test {
 protected:
  void SetUp() override { patterns::set_enabled(true); }
  void TearDown() override {
    patterns::set_enabled(true);
    for (const auto& n : patterns::registered())
      if (n.rfind("test_", 0) == 0) patterns::unregister_replacement(n);
  }
};

}  // namespace

TEST_F(Patterns, UserPatternThroughThePublicApi) {
  register_expm1();
  auto names = patterns::registered();
  EXPECT_NE(std::find(names.begin(), names.end(), "test_expm1"), names.end());
  auto f = compile([](const Tensor& x) { return (exp(x * 3) - 1.0).sum({1}); });
  Tensor x = full({4, 5}, 1e-10, kFloat64);
  Tensor got = f(x);
  EXPECT_EQ(f.stats().pattern_matches, 1);
  // expm1(3e-10) summed over 5: exact to the last bits; exp(3e-10) - 1 is off by ~1e-7 relative.
  const double want = 5 * std::expm1(3e-10);
  EXPECT_NEAR(got.to_vector<double>()[0], want, 1e-15 * want);
  EXPECT_GT(std::abs((exp(x * 3) - 1.0).sum({1}).to_vector<double>()[0] - want), 1e-12 * want)
      << "eager (no rewrite) should show exp(x)-1's cancellation";
}

TEST_F(Patterns, RewritesTheBackwardToo) {
  register_expm1();
  manual_seed(kiln::testing::test_seed(21));
  auto body = [](const Tensor& x) { return ((exp(x) - 1.0) * x).sum(); };
  auto f = compile(body);
  for (int64_t n : {3, 6, 9}) {
    Tensor x = randn({n, 4}, kFloat64).requires_grad_();
    Tensor xe = x.detach().requires_grad_();
    Tensor y = f(x);
    y.backward();
    Tensor ye = body(xe);
    ye.backward();
    expect_close(y, ye, 1e-13, 1e-13);
    expect_close(x.grad(), xe.grad(), 1e-13, 1e-13);
  }
  EXPECT_GE(f.stats().pattern_matches, 1);
}

TEST_F(Patterns, ScalarWildcardsBindAnyScaleConsistently) {
  register_replacement(
      "test_twice", [](const Ts& t, const Ss& s) { return t[0] * s[0] + t[0] * s[0]; },
      [](const Ts& t, const Ss& s) { return t[0] * (2 * s[0]); }, {empty({2, 2})}, {0.123});
  manual_seed(kiln::testing::test_seed(22));
  Tensor x = randn({6, 3});
  for (double s : {0.37, 5.0}) {
    auto f = compile([s](const Tensor& a) { return a * s + a * s; });
    Tensor got = f(x);
    EXPECT_EQ(f.stats().pattern_matches, 1) << "scale " << s;
    // (2(x*s) and x*(2s) are the same float: doubling is exact)
    EXPECT_EQ(got.to_vector<float>(), (x * s + x * s).to_vector<float>());
  }
  auto g = compile([](const Tensor& a) { return a * 0.37 + a * 0.5; });  // two different scales
  expect_close(g(x), x * 0.37 + x * 0.5, 1e-6, 1e-6);
  EXPECT_EQ(g.stats().pattern_matches, 0);
}

TEST_F(Patterns, ExtraCheckAndAThrowingReplacementRefuseTheMatch) {
  register_replacement(
      "test_big_scale", [](const Ts& t, const Ss& s) { return tanh(t[0] * s[0]); },
      [](const Ts& t, const Ss& s) { return tanh(t[0] * s[0]); }, {empty({2, 2})}, {0.123},
      [](const Ts&, const Ss& s) { return s[0] > 1; });
  register_replacement(
      "test_throws", [](const Ts& t, const Ss&) { return sigmoid(t[0]) * 3.0; },
      [](const Ts&, const Ss&) -> Tensor { throw Error("no replacement today"); }, {empty({2})});
  Tensor x = full({3, 2}, 0.25f);
  auto small = compile([](const Tensor& a) { return tanh(a * 0.5); });
  auto big = compile([](const Tensor& a) { return tanh(a * 4.0); });
  auto throwing = compile([](const Tensor& a) { return sigmoid(a) * 3.0; });
  expect_close(small(x), tanh(x * 0.5), 0, 0);
  expect_close(big(x), tanh(x * 4.0), 0, 0);
  expect_close(throwing(x), sigmoid(x) * 3.0, 0, 0);
  EXPECT_EQ(small.stats().pattern_matches, 0);
  EXPECT_EQ(big.stats().pattern_matches, 1);
  EXPECT_EQ(throwing.stats().pattern_matches, 0);
}

TEST_F(Patterns, CommutativeOperandsMatchInEitherOrder) {
  register_replacement(
      "test_muladd", [](const Ts& t, const Ss&) { return t[0] * t[1] + t[2]; },
      [](const Ts& t, const Ss&) { return t[2] + t[1] * t[0]; }, {empty({2, 2}), empty({2, 2}), empty({2, 2})});
  manual_seed(kiln::testing::test_seed(23));
  Tensor a = randn({3, 4}), b = randn({3, 4}), c = randn({3, 4});
  auto f = compile([](const Tensor& x, const Tensor& y, const Tensor& z) {
    return std::vector<Tensor>{x * y + z, z + x * y, z + y * x, (y * x + z) * 2};
  });
  auto out = f(a, b, c);
  EXPECT_EQ(f.stats().pattern_matches, 4);
  for (const Tensor& o : std::vector<Tensor>{out[0], out[1], out[2]}) expect_close(o, a * b + c, 1e-6, 1e-6);
  expect_close(out[3], (a * b + c) * 2, 1e-6, 1e-6);
}

TEST_F(Patterns, ARepeatedInputMatchesOneNodeOnly) {
  register_replacement(
      "test_square", [](const Ts& t, const Ss&) { return t[0] * t[0]; },
      [](const Ts& t, const Ss&) { return square(t[0]); }, {empty({2, 2})});
  Tensor x = full({3}, 1.5f), y = full({3}, 2.0f);
  auto same = compile([](const Tensor& a) { return a * a + 1; });
  auto different = compile([](const Tensor& a, const Tensor& b) { return a * b + 1; });
  expect_close(same(x), x * x + 1, 0, 0);
  expect_close(different(x, y), x * y + 1, 0, 0);
  EXPECT_EQ(same.stats().pattern_matches, 1);
  EXPECT_EQ(different.stats().pattern_matches, 0);
}

TEST_F(Patterns, AnIntermediateUsedElsewhereRefusesTheMatch) {
  register_expm1();
  Tensor x = full({4}, 0.25, kFloat64);
  // exp(x) is also returned: replacing exp(x) - 1 would not remove it (and must not change it).
  auto f = compile([](const Tensor& a) {
    Tensor e = exp(a);
    return std::vector<Tensor>{e - 1.0, e};
  });
  auto out = f(x);
  EXPECT_EQ(f.stats().pattern_matches, 0);
  expect_close(out[0], exp(x) - 1.0, 0, 0);
  expect_close(out[1], exp(x), 0, 0);
}

TEST_F(Patterns, LogOfSoftmaxBecomesLogSoftmaxForwardAndBackward) {
  manual_seed(kiln::testing::test_seed(24));
  auto body = [](const Tensor& x, const Tensor& w) { return (log(softmax(x, -1)) * w).sum(); };
  auto f = compile(body);
  for (int64_t n : {5, 8, 13}) {
    Tensor x = randn({n, 7}, kFloat64).requires_grad_(), w = randn({n, 7}, kFloat64);
    Tensor xe = x.detach().requires_grad_();
    Tensor y = f(x, w);
    y.backward();
    Tensor ye = (log_softmax(xe, -1) * w).sum();
    ye.backward();
    expect_close(y, ye, 1e-12, 1e-12);
    expect_close(x.grad(), xe.grad(), 1e-12, 1e-12);
  }
  EXPECT_EQ(f.stats().pattern_matches, 1);
  EXPECT_GE(count("log_softmax_of_softmax_rank2"), 1);
  // Where softmax underflows to 0, log(softmax) is -inf; the rewrite gives log_softmax's finite value.
  auto g = compile([](const Tensor& x) { return log(softmax(x, -1)); });
  Tensor big = tensor({{0, 200, 400}});
  auto v = g(big).to_vector<float>();
  EXPECT_FLOAT_EQ(v[0], -400);
  EXPECT_FLOAT_EQ(v[2], 0);
}

TEST_F(Patterns, NearMissesDoNotMatch) {
  manual_seed(kiln::testing::test_seed(25));
  Tensor x = randn({4, 6});
  // softmax over the other dim: the rank-2 pattern reduces over dim 1 only.
  auto dim0 = compile([](const Tensor& a) { return log(softmax(a, 0)); });
  expect_close(dim0(x), log(softmax(x, 0)), 1e-6, 1e-6);
  EXPECT_EQ(dim0.stats().pattern_matches, 0);
  // The probabilities are also returned: the softmax stays, so does its log.
  auto shared = compile([](const Tensor& a) {
    Tensor p = softmax(a, -1);
    return std::vector<Tensor>{log(p), p};
  });
  auto out = shared(x);
  EXPECT_EQ(shared.stats().pattern_matches, 0);
  expect_close(out[1], softmax(x, -1), 1e-6, 1e-6);
}

TEST_F(Patterns, OffLeavesTheGraphAsTraced) {
  register_expm1();
  patterns::set_enabled(false);
  Tensor x = full({2, 2}, 1e-10, kFloat64);
  auto f = compile([](const Tensor& a) { return exp(a) - 1.0; });
  expect_close(f(x), exp(x) - 1.0, 0, 0);
  EXPECT_EQ(f.stats().pattern_matches, 0);
}

TEST_F(Patterns, RegistrationErrorsAreClear) {
  EXPECT_THROW(register_replacement(
                   "test_identity", [](const Ts& t, const Ss&) { return t[0]; },
                   [](const Ts& t, const Ss&) { return t[0]; }, {empty({2})}),
               Error);
  EXPECT_THROW(register_replacement(
                   "test_unused_scalar", [](const Ts& t, const Ss&) { return t[0] * 2.0; },
                   [](const Ts& t, const Ss&) { return t[0] * 2.0; }, {empty({2})}, {0.77}),
               Error);
  EXPECT_THROW(register_replacement("test_none", nullptr, nullptr, {empty({2})}), Error);
}

// Random graphs with k injected instances of exp(v) - 1 on random intermediate values: every
// instance is replaced, and the results stay those of the eager run (no rewrite) to rounding.
// The bound holds by construction: inputs are uniform in [-0.5, 0.5] and instances follow only
// the steps that bound |v| by 0.5 (tanh(v) * 0.5, sin(v) * y), so every step is Lipschitz with a
// constant <= e^0.5 and each rewrite moves its value by <= 7e-16 (exp(v) - 1 and expm1(v) each
// within 2 ulp of a value < 1.65): at most 9 steps give <= 9 * 7e-16 * e^4.5 < 6e-13 < 1e-12.
// (Instances on unbounded values grow as exp(exp(.)): seed 21040 reached sin(6e4) and 3e-12.)
TEST_F(Patterns, RandomGraphsWithInjectedInstancesMatchEveryOne) {
  register_expm1();
  const uint64_t seed = kiln::testing::test_seed(26);
  for (int trial = 0; trial < 12; ++trial) {
    std::mt19937 rng(static_cast<uint32_t>(seed + static_cast<uint64_t>(trial)));
    const int steps = 4 + static_cast<int>(rng() % 6);
    std::vector<int> kinds(static_cast<size_t>(steps));
    std::vector<bool> inject(static_cast<size_t>(steps));
    int k = 0;
    for (int i = 0; i < steps; ++i) {
      kinds[i] = static_cast<int>(rng() % 4);
      inject[i] = rng() % 2 == 0 && (kinds[i] == 0 || kinds[i] == 2);
      k += inject[i];
    }
    auto body = [kinds, inject](const Tensor& x, const Tensor& y) {
      Tensor v = x;
      for (size_t i = 0; i < kinds.size(); ++i) {
        switch (kinds[i]) {
          case 0: v = tanh(v) * 0.5; break;
          case 1: v = v + y; break;
          case 2: v = sin(v) * y; break;
          default: v = v * 0.75 - 0.1; break;
        }
        if (inject[i]) v = exp(v) - 1.0;
      }
      return v;
    };
    manual_seed(seed + static_cast<uint64_t>(trial));
    Tensor x = rand({5, 4}, kFloat64) - 0.5, y = rand({5, 4}, kFloat64) - 0.5;
    auto f = compile(body);
    expect_close(f(x, y), body(x, y), 1e-12, 1e-12);
    EXPECT_EQ(f.stats().pattern_matches, k) << "trial " << trial;
  }
}

// Cross-entropy with a one-hot target (as written by hand) becomes the gather form, forward and
// backward, with log(softmax(x)) first turned into log_softmax; a one-hot with other class
// counts than x's last dim (broadcast) is left alone.
TEST_F(Patterns, OneHotCrossEntropyBecomesTheGatherForm) {
  manual_seed(kiln::testing::test_seed(51));
  std::mt19937_64 rng(kiln::testing::test_seed(51));
  for (int it = 0; it < 8; ++it) {
    const int64_t n = 2 + static_cast<int64_t>(rng() % 9), c = 2 + static_cast<int64_t>(rng() % 7);
    const DType dt = it % 2 ? kFloat64 : kFloat32;
    const bool rank3 = it % 4 >= 2;
    std::vector<int64_t> xs = rank3 ? std::vector<int64_t>{2, n, c} : std::vector<int64_t>{n, c};
    std::vector<int64_t> ts(xs.begin(), xs.end() - 1);
    Tensor x = (randn(xs, dt) * 3).requires_grad_();
    Tensor t = randint(0, c, ts);
    auto loss = [&](const Tensor& xi, const Tensor& ti) {
      Tensor lp = it % 3 == 0 ? log(softmax(xi, -1)) : log_softmax(xi, -1);
      return -(one_hot(ti, c).to(dt) * lp).sum({-1}).mean();
    };
    auto f = compile([&](const Tensor& xi, const Tensor& ti) {
      Tensor l = loss(xi, ti);
      return std::vector<Tensor>{l, grad({l}, {xi})[0]};
    });
    auto got = f(x, t);
    EXPECT_GE(f.stats().pattern_matches, 1) << "it " << it;
    Tensor l = loss(x, t);
    Tensor g = grad({l}, {x})[0];
    const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
    expect_close(got[0], l, tol, tol);
    expect_close(got[1], g, tol, tol);
  }
  // One class in the one-hot (broadcast over x's classes): not the cross-entropy, not rewritten.
  Tensor x = randn({4, 3}), t = zeros({4}, kInt64);
  auto f = compile(
      [](const Tensor& xi, const Tensor& ti) { return (one_hot(ti, 1).to(kFloat32) * log_softmax(xi, -1)).sum({-1}); });
  expect_close(f(x, t), (one_hot(t, 1).to(kFloat32) * log_softmax(x, -1)).sum({-1}), 1e-6, 1e-6);
  auto c = patterns::match_counts();
  EXPECT_EQ(f.stats().pattern_matches, 0);
}

// Layer norm written by hand (every variance and normalization form, ranks 2 and 3, with and
// without weight and bias) in a compiled training step becomes layer_norm with its compact
// backward: the same loss and gradients as the hand-written eager step (float64 within 1e-10,
// float32 within 1e-4 relative: a different but equivalent gradient formula). Inference alone is
// not rewritten; near misses (another dim, eps outside the root, a mean over a different count)
// are not either.
TEST_F(Patterns, HandWrittenLayerNormGetsTheCompactBackward) {
  std::mt19937_64 rng(kiln::testing::test_seed(71));
  manual_seed(rng());
  auto count = [] { return count_prefix("layer_norm_"); };
  for (int it = 0; it < 16; ++it) {
    const int form = it % 4;
    const bool rs = it / 4 % 2, affine = it / 8 % 2, rank3 = it % 3 == 0;
    const DType dt = it % 2 ? kFloat64 : kFloat32;
    const int64_t n = 2 + static_cast<int64_t>(rng() % 7), d = 2 + static_cast<int64_t>(rng() % 9);
    SCOPED_TRACE("it " + std::to_string(it));
    std::vector<int64_t> xs = rank3 ? std::vector<int64_t>{2, n, d} : std::vector<int64_t>{n, d};
    Tensor x = (randn(xs, dt) * 2 + 1).requires_grad_(), w = randn({d}, dt).requires_grad_(),
           b = randn({d}, dt).requires_grad_(), g = randn(xs, dt);
    const double eps = it % 2 ? 1e-5 : 1e-6;
    auto ln = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi) {
      Tensor c = xi - xi.mean({-1}, true);
      Tensor v = form == 0   ? (c * c).mean({-1}, true)
                 : form == 1 ? square(c).mean({-1}, true)
                 : form == 2 ? pow(c, 2.0).mean({-1}, true)
                             : var(xi, {-1}, 0, true);
      Tensor y = rs ? c * rsqrt(v + eps) : c / sqrt(v + eps);
      return affine ? y * wi + bi : y;
    };
    auto step = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi, const Tensor& gi) {
      Tensor l = (ln(xi, wi, bi) * gi).sum();
      std::vector<Tensor> out = {l};
      for (const Tensor& gr : grad({l}, affine ? std::vector<Tensor>{xi, wi, bi} : std::vector<Tensor>{xi}))
        out.push_back(gr);
      return out;
    };
    const int64_t before = count();
    auto f = compile(step);
    auto got = f(x, w, b, g);
    EXPECT_EQ(count(), before + 1);
    auto want = step(x, w, b, g);
    const double tol = dt == kFloat64 ? 1e-10 : 1e-4;
    for (size_t i = 0; i < want.size(); ++i) expect_close(got[i], want[i], tol, tol);
  }
  // Inference: the forward alone is not rewritten (layer_norm's forward is the same ops).
  const int64_t before = count();
  Tensor x = randn({4, 5});
  auto fwd = compile([](const Tensor& xi) {
    Tensor c = xi - xi.mean({-1}, true);
    return c * rsqrt((c * c).mean({-1}, true) + 1e-5);
  });
  fwd(x);
  EXPECT_EQ(count(), before);
  // Near misses in training: the mean over another dim, eps added after the root.
  Tensor xr = randn({4, 5}).requires_grad_();
  auto other_dim = compile([](const Tensor& xi) {
    Tensor c = xi - xi.mean({0}, true);
    Tensor l = (c * rsqrt((c * c).mean({0}, true) + 1e-5)).square().sum();
    return grad({l}, {xi})[0];
  });
  other_dim(xr);
  auto eps_outside = compile([](const Tensor& xi) {
    Tensor c = xi - xi.mean({-1}, true);
    Tensor l = (c / (sqrt((c * c).mean({-1}, true)) + 1e-5)).square().sum();
    return grad({l}, {xi})[0];
  });
  eps_outside(xr);
  EXPECT_EQ(count(), before);
}

// Cross-entropy written by hand as log_softmax + gather (mean, sum or no reduction after it) in
// a compiled training step becomes cross_entropy with its compact backward, at every batch size
// of a dynamic batch: the hand-written eager step's loss and gradient (float64 within 1e-12,
// float32 within 1e-5 relative).
TEST_F(Patterns, HandWrittenCrossEntropyGetsTheCompactBackward) {
  std::mt19937_64 rng(kiln::testing::test_seed(73));
  manual_seed(rng());
  auto count = [] { return count_prefix("cross_entropy_log_softmax_gather"); };
  for (int it = 0; it < 6; ++it) {
    const bool rank3 = it % 2, f64 = it % 3 == 0;
    const std::string red = it % 3 == 0 ? "mean" : it % 3 == 1 ? "sum" : "none";
    const DType dt = f64 ? kFloat64 : kFloat32;
    const int64_t classes = 2 + static_cast<int64_t>(rng() % 9);
    SCOPED_TRACE("it " + std::to_string(it));
    auto loss = [&](const Tensor& x, const Tensor& t) {
      Tensor l = -gather(log_softmax(x, 1), 1, t.unsqueeze(1)).squeeze(1);
      return red == "mean" ? l.mean() : red == "sum" ? l.sum() : (l * l).sum();
    };
    auto f = compile([&](const Tensor& x, const Tensor& t) {
      Tensor l = loss(x, t);
      return std::vector<Tensor>{l, grad({l}, {x})[0]};
    });
    const int64_t before = count();
    for (int64_t n : {5, 9, 13}) {  // (the second size makes the batch dim symbolic)
      std::vector<int64_t> xs = rank3 ? std::vector<int64_t>{n, classes, 3} : std::vector<int64_t>{n, classes};
      std::vector<int64_t> ts = rank3 ? std::vector<int64_t>{n, 3} : std::vector<int64_t>{n};
      Tensor x = (randn(xs, dt) * 2).requires_grad_(), t = randint(0, classes, ts);
      auto got = f(x, t);
      Tensor l = loss(x, t);
      Tensor g = grad({l}, {x})[0];
      const double tol = f64 ? 1e-12 : 1e-5;
      expect_close(got[0], l, tol, tol);
      expect_close(got[1], g, tol, tol);
    }
    EXPECT_GE(count(), before + 1);
  }
}

// Registered rewrites keep no pending eager work alive (examples made with empty() are pending
// lazy leaves; only their dtypes and shapes are kept).
TEST_F(Patterns, RegistrationLeavesNoPendingWork) {
  patterns::registered();  // (kiln's own are registered on first use)
  const uint64_t before = stats().pending;
  register_replacement(
      "test_pending", [](const Ts& t, const Ss&) { return t[0] * 2.0 + t[1]; },
      [](const Ts& t, const Ss&) { return t[1] + t[0] * 2.0; }, {empty({3, 3}), empty({3, 3})});
  EXPECT_EQ(stats().pending, before);
}

// GEMM padding (pad_mm): large unaligned float16 GEMMs on CUDA run padded to multiples of 8,
// forward and backward, with the eager results; on the CPU, or small, or aligned, nothing changes.
TEST_F(Patterns, PadMmOnlyWhereMeasuredFaster) {
  auto count = [](const Tensor& a, const Tensor& b) {
    auto f = compile([](const Tensor& x, const Tensor& y) { return matmul(x, y); });
    f(a, b);
    return f.stats().pattern_matches;
  };
  EXPECT_EQ(count(randn({64, 33}), randn({33, 64})), 0);  // the CPU: never
  if (!cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  const Device g = cuda();
  EXPECT_EQ(count(randn({64, 33}).to(g).to(kFloat16), randn({33, 64}).to(g).to(kFloat16)), 0);  // small
  EXPECT_EQ(count(randn({2048, 1024}).to(g).to(kFloat16), randn({1024, 2048}).to(g).to(kFloat16)), 0);  // aligned
  EXPECT_EQ(count(randn({2048, 1001}).to(g), randn({1001, 2048}).to(g)), 0);  // float32 without TF32
  manual_seed(kiln::testing::test_seed(61));
  Tensor a = (randn({2048, 1001}) * 0.1).to(g).to(kFloat16).requires_grad_();
  Tensor b = (randn({1001, 2047}) * 0.1).to(g).to(kFloat16).requires_grad_();
  auto fn = [](const Tensor& x, const Tensor& y) {
    Tensor c = matmul(x, y);
    auto gr = grad({c.to(kFloat32).square().sum()}, {x, y});
    return std::vector<Tensor>{c, gr[0], gr[1]};
  };
  auto f = compile(fn);
  auto got = f(a, b);
  EXPECT_GE(f.stats().pattern_matches, 1);
  auto want = fn(a, b);
  for (int i = 0; i < 3; ++i) {
    Tensor w = want[i].to(kFloat32).cpu();
    expect_close(got[i].to(kFloat32).cpu(), w, 2e-2, 2e-2 * std::max(1.0, w.abs().amax().item<double>()));
  }
}

// ---- lazy eager: the rewrites run on a segment when its plan is made ----

namespace {

Tensor stored(Tensor t) {
  t.eval();
  return t;
}

}  // namespace

TEST_F(Patterns, EagerSegmentsAreRewrittenWhenTheirPlanIsMade) {
  if (interpreted()) GTEST_SKIP() << "the interpreter runs segments as recorded";
  register_expm1();
  auto fn = [](const Tensor& x) { return (exp(x * 3) - 1.0).sum({1}); };  // (its temporaries die in it)
  const double want = 5 * std::expm1(3e-10);
  const int64_t before = count("test_expm1");
  for (int call = 0; call < 3; ++call) {
    Tensor y = fn(stored(full({4, 5}, 1e-10, kFloat64)));
    EXPECT_NEAR(y.to_vector<double>()[0], want, 1e-15 * want) << "call " << call;
  }
  // Matched when the plan was made; the later calls replay the rewrite from the plan.
  EXPECT_EQ(count("test_expm1"), before + 1);
  Tensor x = stored(full({4, 5}, 1e-10, kFloat64));
  EXPECT_GT(std::abs(unrewritten([&] { return fn(x); }).to_vector<double>()[0] - want), 1e-12 * want)
      << "with the rewrites off, exp(x)-1's cancellation shows";
  // A pattern registered after a plan was made applies to the segments that plan served.
  patterns::unregister_replacement("test_expm1");
  EXPECT_GT(std::abs(fn(x).to_vector<double>()[0] - want), 1e-12 * want);
  register_expm1();
  EXPECT_NEAR(fn(x).to_vector<double>()[0], want, 1e-15 * want);
}

// A scale bound by a wildcard is a constant of the segment, not part of its structure: a
// segment of the same structure with another scale must not reuse the rewrite made for the first.
TEST_F(Patterns, EagerRewritesGuardTheConstantsTheyBound) {
  if (interpreted()) GTEST_SKIP() << "the interpreter runs segments as recorded";
  register_replacement(
      "test_twice", [](const Ts& t, const Ss& s) { return t[0] * s[0] + t[0] * s[0]; },
      [](const Ts& t, const Ss& s) { return t[0] * (2 * s[0]); }, {empty({2, 2})}, {0.123});
  manual_seed(kiln::testing::test_seed(27));
  Tensor x = stored(randn({6, 3}));
  const int64_t before = count("test_twice");
  const std::vector<double> scales = {0.37, 5.0, 0.37, -2.0};
  std::vector<Tensor> got;
  auto twice = [&](double s) { return x * s + x * s; };  // (its temporaries die in it)
  for (double s : scales) got.push_back(stored(twice(s)));
  EXPECT_EQ(count("test_twice"), before + 3) << "one plan per scale; 0.37's reused";
  for (size_t i = 0; i < scales.size(); ++i)  // (2(x*s) and x*(2s) are the same float: doubling is exact)
    EXPECT_EQ(got[i].to_vector<float>(), unrewritten([&] { return twice(scales[i]); }).to_vector<float>())
        << "scale " << scales[i];
}

// An intermediate the user still holds is computed as written; the match is refused.
TEST_F(Patterns, EagerIntermediatesTheUserHoldsAreNotReplaced) {
  if (interpreted()) GTEST_SKIP() << "the interpreter runs segments as recorded";
  register_expm1();
  Tensor x = stored(full({4}, 1e-10, kFloat64));
  const double want = std::expm1(3e-10);
  const int64_t before = count("test_expm1");
  Tensor e = exp(x * 3);
  Tensor y = e - 1.0;
  y.eval();
  EXPECT_EQ(count("test_expm1"), before);
  EXPECT_GT(std::abs(y.to_vector<double>()[0] - want), 1e-12 * want);
  EXPECT_EQ(e.to_vector<double>(), unrewritten([&] { return exp(x * 3); }).to_vector<double>());
  e = Tensor();
  Tensor z = exp(x * 3) - 1.0;  // nothing else holds exp(x * 3) now
  EXPECT_NEAR(z.to_vector<double>()[0], want, 1e-15 * want);
  EXPECT_EQ(count("test_expm1"), before + 1);
}

// Tracing a pattern graph (a search function that draws random numbers) leaves the user's
// generator where it is: the numbers a program draws after it are those it draws without it.
TEST_F(Patterns, TracingPatternsLeavesTheGeneratorAlone) {
  manual_seed(kiln::testing::test_seed(28));
  const std::vector<float> want = randn({6}).to_vector<float>();
  manual_seed(kiln::testing::test_seed(28));
  register_replacement(
      "test_noisy", [](const Ts& t, const Ss&) { return t[0] * rand_like(t[0]) * 3.0; },
      [](const Ts& t, const Ss&) { return t[0] * rand_like(t[0]) * 3.0; }, {empty({2, 2})});
  patterns::registered();  // (kiln's own, among them the dropout forms, are registered on first use)
  EXPECT_EQ(randn({6}).to_vector<float>(), want);
}
