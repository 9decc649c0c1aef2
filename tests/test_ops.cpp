// Op families not covered by the torch-parity corpus, checked against naive loops written here.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cmath>
#include <random>

#include "kiln.h"

using namespace kiln;

namespace {
std::vector<float> randvec(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
}  // namespace

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups;
};

class Conv2d : public ::testing::TestWithParam<ConvCase> {};

TEST_P(Conv2d, MatchesNaiveLoops) {
  ConvCase p = GetParam();
  int64_t cg = p.c / p.groups, og = p.o / p.groups;
  auto xv = randvec(p.n * p.c * p.h * p.w, 1), wv = randvec(p.o * cg * p.kh * p.kw, 2), bv = randvec(p.o, 3);
  Tensor x = from_vector(xv, std::vector<int64_t>{p.n, p.c, p.h, p.w});
  Tensor w = from_vector(wv, std::vector<int64_t>{p.o, cg, p.kh, p.kw});
  Tensor b = from_vector(bv);
  Tensor y = conv2d(x, w, b, {p.sh, p.sw}, {p.ph, p.pw}, {p.dh, p.dw}, p.groups);
  int64_t ho = (p.h + 2 * p.ph - p.dh * (p.kh - 1) - 1) / p.sh + 1;
  int64_t wo = (p.w + 2 * p.pw - p.dw * (p.kw - 1) - 1) / p.sw + 1;
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{p.n, p.o, ho, wo}));
  std::vector<float> got = y.to_vector<float>();
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t o = 0; o < p.o; ++o)
      for (int64_t i = 0; i < ho; ++i)
        for (int64_t j = 0; j < wo; ++j) {
          double acc = bv[o];
          int64_t g = o / og;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t a = 0; a < p.kh; ++a)
              for (int64_t e = 0; e < p.kw; ++e) {
                int64_t ih = i * p.sh - p.ph + a * p.dh, iw = j * p.sw - p.pw + e * p.dw;
                if (ih < 0 || ih >= p.h || iw < 0 || iw >= p.w) continue;
                acc += double(xv[((n * p.c + g * cg + c) * p.h + ih) * p.w + iw]) *
                       wv[((o * cg + c) * p.kh + a) * p.kw + e];
              }
          float v = got[((n * p.o + o) * ho + i) * wo + j];
          ASSERT_NEAR(v, acc, 1e-4 * (1 + std::fabs(acc))) << n << " " << o << " " << i << " " << j;
        }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Conv2d,
                         ::testing::Values(ConvCase{2, 3, 7, 6, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1},
                                           ConvCase{1, 4, 9, 9, 6, 3, 2, 2, 1, 1, 2, 1, 1, 2},
                                           ConvCase{2, 2, 8, 7, 2, 3, 3, 1, 2, 2, 1, 2, 1, 2},
                                           ConvCase{1, 6, 5, 5, 3, 1, 1, 1, 1, 0, 0, 1, 1, 3}));

TEST(Conv2d, BadArgumentsThrow) {
  EXPECT_THROW(conv2d(ones({1, 3, 5, 5}), ones({4, 2, 3, 3})), Error);  // channels
  EXPECT_THROW(conv2d(ones({1, 3, 2, 2}), ones({4, 3, 3, 3})), Error);  // kernel too big
  EXPECT_THROW(conv2d(ones({1, 4, 5, 5}), ones({3, 2, 3, 3}), std::nullopt, {1}, {0}, {1}, 2), Error);
}

TEST(Random, SameNumbersWhateverTheThreadCount) {
  std::vector<float> one, many;
  {
    tbb::global_control c(tbb::global_control::max_allowed_parallelism, 1);
    manual_seed(7);
    one = randn({100000}).to_vector<float>();
  }
  manual_seed(7);
  Tensor r = randn({100000});
  many = r.to_vector<float>();
  EXPECT_EQ(one, many);
  double m = r.mean().item<double>(), s = r.std().item<double>();
  EXPECT_NEAR(m, 0, 0.02);
  EXPECT_NEAR(s, 1, 0.02);
}

TEST(Random, RangesAndDistributions) {
  manual_seed(3);
  Tensor u = rand({200000});
  EXPECT_GE(u.amin().item<float>(), 0.f);
  EXPECT_LT(u.amax().item<float>(), 1.f);
  EXPECT_NEAR(u.mean().item<double>(), 0.5, 0.01);
  Tensor i = randint(-3, 5, {100000});
  EXPECT_EQ(i.dtype(), kInt64);
  EXPECT_EQ(i.amin().item<int64_t>(), -3);
  EXPECT_EQ(i.amax().item<int64_t>(), 4);
  Tensor b = bernoulli({100000}, 0.25);
  EXPECT_NEAR(b.mean().item<double>(), 0.25, 0.01);
  Tensor bp = bernoulli(full({100000}, 0.75));
  EXPECT_NEAR(bp.mean().item<double>(), 0.75, 0.01);
  // Consecutive draws differ; reseeding repeats.
  manual_seed(11);
  auto a1 = rand({8}).to_vector<float>();
  auto a2 = rand({8}).to_vector<float>();
  manual_seed(11);
  EXPECT_EQ(rand({8}).to_vector<float>(), a1);
  EXPECT_NE(a1, a2);
}

TEST(Creation, FromBlobDeleterAndRanges) {
  bool freed = false;
  {
    auto* buf = new float[4]{1, 2, 3, 4};
    Tensor t = from_blob(buf, {2, 2}, kFloat32, [&freed](void* p) {
      delete[] static_cast<float*>(p);
      freed = true;
    });
    EXPECT_FLOAT_EQ(t.sum().item<float>(), 10.f);
    EXPECT_FALSE(freed);
  }
  EXPECT_TRUE(freed);
  EXPECT_EQ(linspace(0, 1, 5).to_vector<float>(), (std::vector<float>{0, 0.25f, 0.5f, 0.75f, 1}));
  EXPECT_EQ(eye(2, 3).to_vector<float>(), (std::vector<float>{1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(arange(2, 11, 3).to_vector<int64_t>(), (std::vector<int64_t>{2, 5, 8}));
  EXPECT_EQ(full({2}, 7).dtype(), kInt64);
  EXPECT_EQ(zeros_like(ones({2, 3}, kInt32)).dtype(), kInt32);
  EXPECT_THROW(zeros({-1}), Error);
  EXPECT_THROW(from_vector<float>({1, 2, 3}, std::vector<int64_t>{2, 2}), Error);
}

TEST(Reductions, CumsumMaxMinAnyAll) {
  Tensor x = tensor({{1, 5, 2}, {7, 0, 3}});
  EXPECT_EQ(x.cumsum(1).to_vector<float>(), (std::vector<float>{1, 6, 8, 7, 7, 10}));
  EXPECT_EQ(ones({3}, kBool).cumsum(0).to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3}));
  auto [v, i] = max(x, 1);
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{5, 7}));
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  auto [mv, mi] = min(x, 0, true);
  EXPECT_EQ(mv.sizes(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(mi.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0}));
  EXPECT_TRUE(all(zeros({0})).item<bool>());
  EXPECT_FALSE(any(zeros({0})).item<bool>());
  EXPECT_TRUE(isnan(mean(zeros({0}))).item<bool>());
  EXPECT_FLOAT_EQ(prod(zeros({0})).item<float>(), 1.f);
  EXPECT_THROW(max(zeros({0})), Error);
  Tensor n = tensor({1.0, NAN, 3.0});
  EXPECT_TRUE(std::isnan(n.amax().item<float>()));
  EXPECT_EQ(n.argmax().item<int64_t>(), 1);
}

TEST(Indexing, ScatterIndexAddNonzeroMaskedSelect) {
  Tensor x = zeros({2, 4});
  Tensor idx = from_vector<int64_t>({3, 0, 1, 1}, std::vector<int64_t>{2, 2});
  Tensor src = tensor({{1, 2}, {3, 4}});
  EXPECT_EQ(scatter(x, 1, idx, src).to_vector<float>(), (std::vector<float>{2, 0, 0, 1, 0, 4, 0, 0}));
  EXPECT_EQ(scatter_add(x, 1, idx, src).to_vector<float>(), (std::vector<float>{2, 0, 0, 1, 0, 7, 0, 0}));
  Tensor ia = index_add(zeros({3, 2}), 0, from_vector<int64_t>({2, 0, 2}), ones({3, 2}), 2.0);
  EXPECT_EQ(ia.to_vector<float>(), (std::vector<float>{2, 2, 0, 0, 4, 4}));
  Tensor m = tensor({{0, 1.5}, {-2, 0}});
  reset_stats();
  Tensor nz = nonzero(m);  // data-dependent: materializes its input now
  EXPECT_GE(stats().materializations, 1u);
  EXPECT_EQ(nz.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 1, 0}));
  EXPECT_EQ(masked_select(m, m > 0).to_vector<float>(), (std::vector<float>{1.5f}));
  EXPECT_THROW(gather(ones({2, 2}), 1, from_vector<int64_t>({0, 2, 1, 0}, std::vector<int64_t>{2, 2})).eval(), Error);
  EXPECT_THROW(one_hot(from_vector<int64_t>({0, 4}), 3).eval(), Error);  // when computed, as for gather
  EXPECT_EQ(one_hot(from_vector<int64_t>({2, 0})).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1, 1, 0, 0}));
}

TEST(Movement, CatStackSplitChunkPadRepeat) {
  Tensor a = arange(6).reshape({2, 3}).to(kFloat32);
  EXPECT_EQ(cat({a, a * 10}, 0).sizes(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(cat({a, ones({2, 1}, kInt64)}, 1).dtype(), kFloat32);
  EXPECT_EQ(stack({a, a}, 2).sizes(), (std::vector<int64_t>{2, 3, 2}));
  auto parts = a.chunk(2, 1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].to_vector<float>(), (std::vector<float>{2, 5}));
  EXPECT_TRUE(parts[0].is_view());
  EXPECT_EQ(pad(a, {1, 0, 0, 1}, -1).to_vector<float>(),
            (std::vector<float>{-1, 0, 1, 2, -1, 3, 4, 5, -1, -1, -1, -1}));
  EXPECT_EQ(pad(a, {-1, 0}).to_vector<float>(), (std::vector<float>{1, 2, 4, 5}));
  EXPECT_EQ(a.repeat({1, 2}).sizes(), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(a.flip({0, 1}).to_vector<float>(), (std::vector<float>{5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(a.triu(1).to_vector<float>(), (std::vector<float>{0, 1, 2, 0, 0, 5}));
  EXPECT_THROW(cat({a, ones({3, 2})}, 0), Error);
  EXPECT_THROW(a.split(std::vector<int64_t>{1, 1}, 1), Error);
  EXPECT_THROW(a.view({3, 2}).t().view({6}), Error);  // not viewable: use reshape
  EXPECT_EQ(a.t().reshape({6}).to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(NN, SdpaCausalMatchesManualMask) {
  manual_seed(5);
  Tensor q = randn({2, 4, 8}), k = randn({2, 4, 8}), v = randn({2, 4, 8});
  Tensor y = scaled_dot_product_attention(q, k, v, std::nullopt, true);
  Tensor s = matmul(q, k.transpose(-2, -1)) / std::sqrt(8.0);
  Tensor mask = ones({4, 4}, kBool).tril();
  Tensor ref = matmul(softmax(where(mask, s, -1e30), -1), v);
  EXPECT_LT((y - ref).abs().amax().item<float>(), 1e-5f);
  Tensor d = dropout(ones({10000}), 0.3);
  EXPECT_NEAR(d.mean().item<double>(), 1.0, 0.05);
  EXPECT_EQ(dropout(ones({4}), 0.3, false).to_vector<float>(), (std::vector<float>(4, 1.f)));
  EXPECT_THROW(cross_entropy(ones({3, 4}), zeros({2}, kInt64)), Error);
}
