// The API a PyTorch user reaches for (issue 10, deliverable 6): eager values, compiled
// (kiln::compile) against eager, gradients against finite differences, and bad input errors.
// PyTorch's own results for the same ops are in tests/parity/api_parity.jsonl (test_torch_parity).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "expect_close.h"
#include "gradcheck.h"
#include "kiln.h"

using namespace kiln;
using kiln::testing::gradcheck;
using kiln::testing::Input;
using kiln::testing::random_input;

namespace {
std::mt19937 rng(7);

Tensor f64(std::vector<double> v, std::vector<int64_t> shape) { return from_vector(v, shape); }
Tensor i64(std::vector<int64_t> v, std::vector<int64_t> shape) { return from_vector(v, shape); }
// Random float64 values in [-1.5, 1.5).
Tensor rnd(std::vector<int64_t> shape) { return from_vector(random_input(shape, rng).values, shape); }

// fn compiled equals fn eager on `args`, at a first and a second (replayed) call.
void expect_compiled_equal(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& args,
                           double rtol = 1e-6) {
  Tensor eager = fn(args);
  auto c = compile([fn](const std::vector<Tensor>& a) { return fn(a); });
  Tensor first = c(args);
  Tensor second = c(args);
  expect_close(first, eager, rtol, 1e-9);
  expect_close(second, eager, rtol, 1e-9);
}

template <class F>
void expect_error(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected kiln::Error containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(Api, IntDimReductions) {
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(x.sum(1).to_vector<double>(), (std::vector<double>{6, 15}));
  EXPECT_EQ(x.sum(-1, true).sizes(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(x.mean(0).to_vector<double>(), (std::vector<double>{2.5, 3.5, 4.5}));
  EXPECT_EQ(x.prod(1).to_vector<double>(), (std::vector<double>{6, 120}));
  EXPECT_EQ(x.amax(0).to_vector<double>(), (std::vector<double>{4, 5, 6}));
  EXPECT_EQ(x.amin(1).to_vector<double>(), (std::vector<double>{1, 4}));
  EXPECT_EQ(x.gt(2).any(1).to_vector<bool>(), (std::vector<bool>{true, true}));
  EXPECT_EQ(x.gt(2).all(1).to_vector<bool>(), (std::vector<bool>{false, true}));
  expect_close(x.var(1), f64({1, 1}, {2}));
  expect_close(x.std(0, 0), f64({1.5, 1.5, 1.5}, {3}));
  expect_close(x.logsumexp(1), x.exp().sum(1).log());
  expect_close(sum(x, 0), x.sum({0}));
  expect_close(mean(x, int64_t{-1}, true), x.mean({-1}, true));
  EXPECT_EQ(sum(x.to_int(), 1, false, kFloat64).dtype(), kFloat64);
  EXPECT_EQ(x.sum({0, 1}).item<double>(), 21);  // braced lists keep the dims overloads
  EXPECT_EQ(x.sum({1}).sizes(), (std::vector<int64_t>{2}));
  EXPECT_EQ(x.sum().item<double>(), 21);
  EXPECT_EQ(x.max().item<double>(), 6);
  EXPECT_EQ(x.min().item<double>(), 1);
  auto [v, i] = x.max(1);
  EXPECT_EQ(v.to_vector<double>(), (std::vector<double>{3, 6}));
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(x.min(0, true).second.sizes(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(x.sum({1}, false, kInt64).dtype(), kInt64);
  expect_error([&] { x.sum(2); }, "dim");
  expect_compiled_equal([](const std::vector<Tensor>& a) { return a[0].sum(1) + a[0].mean(-1) + a[0].amax(1); },
                        {rnd({5, 4})});
  gradcheck("sum(1)+var(0)", [](const std::vector<Tensor>& a) { return a[0].sum(1).sum() + a[0].var(0).sum(); },
            {random_input({3, 4}, rng)});
}

TEST(Api, ClampAndAs) {
  Tensor x = f64({-2, -0.5, 0.5, 2}, {4});
  EXPECT_EQ(x.clamp_min(0).to_vector<double>(), (std::vector<double>{0, 0, 0.5, 2}));
  EXPECT_EQ(x.clamp_max(0).to_vector<double>(), (std::vector<double>{-2, -0.5, 0, 0}));
  EXPECT_EQ(clamp_min(x, f64({0, 0, 1, 1}, {4})).to_vector<double>(), (std::vector<double>{0, 0, 1, 2}));
  Tensor y = zeros({2, 4}, kFloat64);
  EXPECT_EQ(x.expand_as(y).sizes(), y.sizes());
  EXPECT_EQ(x.view_as(zeros({2, 2})).sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(x.reshape_as(zeros({4, 1})).sizes(), (std::vector<int64_t>{4, 1}));
  expect_error([&] { x.expand_as(zeros({3})); }, "expand");
  gradcheck("clamp_min", [](const std::vector<Tensor>& a) { return a[0].clamp_min(0.1); }, {random_input({6}, rng)});
  gradcheck("clamp_max", [](const std::vector<Tensor>& a) { return clamp_max(a[0], a[1]); },
            {random_input({6}, rng), random_input({6}, rng)});
  expect_compiled_equal([](const std::vector<Tensor>& a) { return a[0].clamp_min(0).expand_as(a[1]) + a[1]; }, {x, y});
}

TEST(Api, SqueezeUnbindMovedim) {
  Tensor x = zeros({1, 3, 1, 2});
  EXPECT_EQ(x.squeeze({0, 2}).sizes(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(x.squeeze({0, 1}).sizes(), (std::vector<int64_t>{3, 1, 2}));  // size-3 dim kept
  EXPECT_EQ(squeeze(x, std::vector<int64_t>{-2}).sizes(), (std::vector<int64_t>{1, 3, 2}));
  expect_error([&] { x.squeeze({0, 0}); }, "multiple times");
  expect_error([&] { x.squeeze({4}); }, "dim");
  Tensor a = arange(6, kFloat64).reshape({2, 3});
  auto parts = a.unbind(1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2].to_vector<double>(), (std::vector<double>{2, 5}));
  expect_error([&] { scalar_tensor(1.0).unbind(); }, "no dimensions");
  Tensor b = zeros({2, 3, 4, 5});
  EXPECT_EQ(b.movedim(1, -1).sizes(), (std::vector<int64_t>{2, 4, 5, 3}));
  EXPECT_EQ(b.movedim({0, 1}, {3, 0}).sizes(), (std::vector<int64_t>{3, 4, 5, 2}));
  expect_error([&] { b.movedim({0, 0}, {1, 2}); }, "repeated dim");
  expect_error([&] { b.movedim({0}, {1, 2}); }, "same number");
  gradcheck("unbind+movedim",
            [](const std::vector<Tensor>& t) {
              auto u = t[0].movedim(0, 2).unbind(1);
              return u[0] * u[2];
            },
            {random_input({2, 3, 4}, rng)});
  expect_compiled_equal([](const std::vector<Tensor>& t) { return t[0].movedim(0, -1).squeeze({0}); },
                        {rnd({4, 1, 3})});
}

TEST(Api, DiagonalRollCumprod) {
  Tensor a = arange(12, kFloat64).reshape({3, 4});
  EXPECT_EQ(a.diagonal().to_vector<double>(), (std::vector<double>{0, 5, 10}));
  EXPECT_EQ(a.diagonal(1).to_vector<double>(), (std::vector<double>{1, 6, 11}));
  EXPECT_EQ(a.diagonal(-1).to_vector<double>(), (std::vector<double>{4, 9}));
  EXPECT_EQ(a.diagonal(5).numel(), 0);
  EXPECT_EQ(a.t().diagonal(0).to_vector<double>(), (std::vector<double>{0, 5, 10}));
  Tensor b = arange(24, kFloat64).reshape({2, 3, 4});
  EXPECT_EQ(b.diagonal(0, 1, 2).sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.diagonal(0, -1, 0).to_vector<double>(), (std::vector<double>{0, 13, 4, 17, 8, 21}));
  expect_error([&] { a.diagonal(0, 1, 1); }, "cannot be identical");
  {  // a view: writes go through to the base
    Tensor m = zeros({3, 3}, kFloat64);
    Tensor d = m.diagonal();
    d.fill_(1);
    expect_close(m, eye(3, std::nullopt, kFloat64));
  }
  EXPECT_EQ(arange(5, kFloat64).roll(2).to_vector<double>(), (std::vector<double>{3, 4, 0, 1, 2}));
  EXPECT_EQ(arange(5, kFloat64).roll(-1, 0).to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 0}));
  EXPECT_EQ(a.roll(1).to_vector<double>()[0], 11);
  EXPECT_EQ(a.roll({1, -1}, {0, 1}).to_vector<double>()[0], 9);
  expect_error([&] { a.roll({1, 2}, {0}); }, "align");
  Tensor c = f64({1, 2, 0, 3, -1}, {5});
  EXPECT_EQ(c.cumprod(0).to_vector<double>(), (std::vector<double>{1, 2, 0, 0, 0}));
  EXPECT_EQ(i64({1, 2, 3}, {3}).cumprod(0).dtype(), kInt64);
  EXPECT_EQ(i64({1, 2, 3}, {3}).cumsum(0, kFloat32).dtype(), kFloat32);
  EXPECT_EQ(cumsum(i64({1, 2, 3}, {3}), 0, kFloat64).to_vector<double>(), (std::vector<double>{1, 3, 6}));
  gradcheck("diagonal", [](const std::vector<Tensor>& t) { return t[0].diagonal(1, 0, 2); },
            {random_input({3, 2, 4}, rng)});
  gradcheck("roll",
            [](const std::vector<Tensor>& t) {
              return t[0].roll({2, 1}, {1, 0});
            },
            {random_input({3, 4}, rng)});
  gradcheck("cumprod", [](const std::vector<Tensor>& t) { return t[0].cumprod(1); }, {random_input({2, 5}, rng)});
  {  // cumprod's gradient with a zero (PyTorch: defined, from prod's rule)
    Tensor z = f64({2, 0, 3, 4}, {4}).requires_grad_();
    z.cumprod(0).sum().backward();
    EXPECT_EQ(z.grad().to_vector<double>(), (std::vector<double>{1, 2 + 6 + 24, 0, 0}));
  }
  expect_compiled_equal(
      [](const std::vector<Tensor>& t) { return t[0].diagonal() + t[0].roll(1, 1).cumprod(0).sum(1); }, {rnd({4, 4})});
}

TEST(Api, SortArgsortTopk) {
  double nan = std::nan("");
  Tensor x = f64({3, nan, 1, 2, 1, -5}, {6});
  auto [v, i] = x.sort();
  std::vector<double> vv = v.to_vector<double>();
  EXPECT_EQ(std::vector<double>(vv.begin(), vv.end() - 1), (std::vector<double>{-5, 1, 1, 2, 3}));
  EXPECT_TRUE(std::isnan(vv.back()));  // NaN is the greatest
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{5, 2, 4, 3, 0, 1}));  // stable: 2 before 4
  EXPECT_EQ(i.dtype(), kInt64);
  auto [dv, di] = x.sort(0, true);
  EXPECT_EQ(di.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 3, 2, 4, 5}));  // descending, stable
  EXPECT_EQ(i64({3, 1, 2}, {3}).argsort().to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 0}));
  Tensor m = f64({1, 9, 3, 7, 2, 8}, {2, 3});
  EXPECT_EQ(m.argsort(0, true).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1, 0, 1, 0}));
  auto [tv, ti] = m.topk(2);
  EXPECT_EQ(tv.to_vector<double>(), (std::vector<double>{9, 3, 8, 7}));
  EXPECT_EQ(ti.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 2, 0}));
  EXPECT_EQ(m.topk(1, 1, false).first.to_vector<double>(), (std::vector<double>{1, 2}));
  expect_error([&] { m.topk(4); }, "out of range");
  expect_error([&] { m.sort(2); }, "dim");
  {  // keys computed by a transcendental in the same graph: each element compared with one value
    Tensor p = f64({1, 3}, {1, 2}).expand({4000, 2}).contiguous();
    Tensor idx = sort(div(log(rand_like(p)), p), -1, true).second;
    EXPECT_EQ(idx.sum().item<int64_t>(), 4000);
  }
  // Large rows take the host path: same results as the pairwise graph.
  Tensor big = rnd({5000});
  auto [bv, bi] = big.sort();
  std::vector<double> bvv = bv.to_vector<double>();
  EXPECT_TRUE(std::is_sorted(bvv.begin(), bvv.end()));
  expect_close(gather(big, 0, bi), bv);
  gradcheck("sort values", [](const std::vector<Tensor>& t) { return t[0].sort(1, true).first; },
            {random_input({3, 5}, rng)});
  gradcheck("topk values", [](const std::vector<Tensor>& t) { return t[0].topk(2, 0).first; },
            {random_input({5, 3}, rng)});
  expect_compiled_equal(
      [](const std::vector<Tensor>& t) { return t[0].sort(-1).first + t[0].topk(3).second.sum(1, true).to(kFloat64); },
      {rnd({4, 6})});
}

TEST(Api, MultinomialRandperm) {
  manual_seed(3);
  Tensor p = f64({0.1, 0.0, 0.6, 0.3}, {4});
  Tensor s = multinomial(p, 20000, true);
  EXPECT_EQ(s.dtype(), kInt64);
  EXPECT_EQ(s.sizes(), (std::vector<int64_t>{20000}));
  std::map<int64_t, int> counts;
  for (int64_t v : s.to_vector<int64_t>()) counts[v]++;
  EXPECT_EQ(counts.count(1), 0u);  // zero weight never drawn
  EXPECT_NEAR(counts[2] / 20000.0, 0.6, 0.02);
  EXPECT_NEAR(counts[0] / 20000.0, 0.1, 0.02);
  // Without replacement: distinct, zero weights last.
  Tensor rows = f64({1, 1, 1, 0, 5, 1, 1, 1}, {2, 4});
  Tensor w = multinomial(rows, 3);
  EXPECT_EQ(w.sizes(), (std::vector<int64_t>{2, 3}));
  for (int r = 0; r < 2; ++r) {
    auto v = w[r].to_vector<int64_t>();
    EXPECT_EQ(std::set<int64_t>(v.begin(), v.end()).size(), 3u);
    if (r == 0) EXPECT_EQ(std::count(v.begin(), v.end(), 3), 0);
  }
  // First draw without replacement follows the weights.
  Tensor firsts = multinomial(f64({1, 3}, {1, 2}).expand({4000, 2}).contiguous(), 1).sum();
  EXPECT_NEAR(firsts.item<double>() / 4000.0, 0.75, 0.03);
  expect_error([&] { multinomial(p, 5); }, "without replacement");
  expect_error([&] { multinomial(zeros({2, 2, 2}), 1); }, "1 or 2 dim");
  expect_error([&] { multinomial(p, 0); }, "n_sample <= 0");
  expect_error([&] { multinomial(i64({1, 2}, {2}), 1); }, "floating");
  manual_seed(5);
  Tensor a = multinomial(p, 10, true);
  manual_seed(5);
  EXPECT_EQ(a.to_vector<int64_t>(), multinomial(p, 10, true).to_vector<int64_t>());
  Tensor perm = randperm(50);
  auto pv = perm.to_vector<int64_t>();
  std::sort(pv.begin(), pv.end());
  for (int64_t k = 0; k < 50; ++k) EXPECT_EQ(pv[k], k);
  EXPECT_EQ(randperm(5, kInt32).dtype(), kInt32);
  EXPECT_EQ(randperm(0).numel(), 0);
  expect_error([&] { randperm(-1); }, "non-negative");
  // Compiled: same draws as eager from the same generator state.
  auto fn = [](const std::vector<Tensor>& t) { return multinomial(t[0], 6, true).to(kFloat64); };
  auto c = compile(fn);
  manual_seed(9);
  Tensor e1 = fn({p});
  manual_seed(9);
  Tensor c1 = c(std::vector<Tensor>{p});
  expect_close(c1, e1);
}

TEST(Api, Einsum) {
  Tensor a = rnd({2, 3, 4});
  Tensor b = rnd({2, 4, 5});
  Tensor m = rnd({4, 4});
  Tensor v = rnd({4});
  expect_close(einsum("bij,bjk->bik", {a, b}), matmul(a, b));
  expect_close(einsum("bij,bjk", {a, b}), matmul(a, b).sum(0));  // implicit output: b is summed
  expect_close(einsum("ii", {m}), m.diagonal().sum());
  expect_close(einsum("ii->i", {m}), m.diagonal());
  expect_close(einsum("ij->ji", {m}), m.t());
  expect_close(einsum("i,i->", {v, v}), (v * v).sum());
  expect_close(einsum("i,j->ij", {v, v}), outer(v, v));
  expect_close(einsum("...ij,...jk->...ik", {a, b}), matmul(a, b));
  expect_close(einsum("b...,b...->b", {a, a}), (a * a).sum({1, 2}));
  expect_close(einsum("bij->j", {a}), a.sum({0, 1}));
  expect_close(einsum("ij,jk,kl->il", {m, m, m}), matmul(matmul(m, m), m));
  Tensor sq = rnd({2, 3, 3});
  expect_close(einsum("bii->bi", {sq}), sq.diagonal(0, 1, 2));
  expect_error([&] { einsum("ij,jk->ik", {m}); }, "fewer operands");
  expect_error([&] { einsum("ijk->i", {m}); }, "number of subscripts");
  expect_error([&] { einsum("ij->ix", {m}); }, "does not appear");
  expect_error([&] { einsum("i1->i", {v}); }, "invalid subscript");
  gradcheck("einsum bij,bjk",
            [](const std::vector<Tensor>& t) {
              return einsum("bij,bjk->bik", {t[0], t[1]});
            },
            {random_input({2, 3, 4}, rng), random_input({2, 4, 2}, rng)});
  gradcheck("einsum ii,i",
            [](const std::vector<Tensor>& t) {
              return einsum("ii,i->i", {t[0], t[1]});
            },
            {random_input({3, 3}, rng), random_input({3}, rng)});
  expect_compiled_equal([](const std::vector<Tensor>& t) { return einsum("bij,bjk->bki", {t[0], t[1]}); }, {a, b});
}

TEST(Api, Cdist) {
  Tensor x = f64({0, 0, 3, 4}, {2, 2});
  Tensor y = f64({0, 0, 1, 1, 3, 4}, {3, 2});
  Tensor d = cdist(x, y);
  expect_close(d, f64({0, std::sqrt(2.0), 5, 5, std::sqrt(13.0), 0}, {2, 3}));
  expect_close(cdist(x, y, 1), f64({0, 2, 7, 7, 5, 0}, {2, 3}));
  expect_close(cdist(x, y, INFINITY), f64({0, 1, 4, 4, 3, 0}, {2, 3}));
  expect_close(cdist(x, y, 0), f64({0, 2, 2, 2, 2, 0}, {2, 3}));
  expect_close(cdist(x, y, 3), pow(pow(abs(x.unsqueeze(1) - y.unsqueeze(0)), 3).sum(-1), 1.0 / 3));
  expect_error([&] { cdist(x, zeros({2, 3}, kFloat64)); }, "same number of columns");
  expect_error([&] { cdist(zeros({2}), zeros({2, 2})); }, "at least 2D");
  expect_error([&] { cdist(x, y, -1); }, "non-negative");
  {  // zero distance: zero gradient (PyTorch), not NaN
    Tensor a = x.clone().requires_grad_();
    cdist(a, y).sum().backward();
    for (double g : a.grad().to_vector<double>()) EXPECT_TRUE(std::isfinite(g));
  }
  gradcheck("cdist p2", [](const std::vector<Tensor>& t) { return cdist(t[0], t[1]); },
            {random_input({2, 3, 4}, rng), random_input({2, 5, 4}, rng)});
  gradcheck("cdist p1.5", [](const std::vector<Tensor>& t) { return cdist(t[0], t[1], 1.5); },
            {random_input({3, 2}, rng), random_input({4, 2}, rng)});
  expect_compiled_equal([](const std::vector<Tensor>& t) { return cdist(t[0], t[1]); }, {rnd({5, 3}), rnd({4, 3})});
}

TEST(Api, InPlaceAndMethods) {
  Tensor x = f64({-1, 0, 4}, {3});
  Tensor y = x.clone();
  y.relu_();
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{0, 0, 4}));
  y.sqrt_().neg_().abs_();
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{0, 0, 2}));
  y.exp_().log_();
  expect_close(y, f64({0, 0, 2}, {3}));
  y.sigmoid_();
  expect_close(y, sigmoid(f64({0, 0, 2}, {3})));
  y.tanh_().clamp_min_(0.5).clamp_max_(0.6);
  expect_close(y, f64({0.5, 0.5, 0.6}, {3}));
  Tensor z = x.clone();
  z.masked_fill_(z.lt(0), 7.0);
  EXPECT_EQ(z.to_vector<double>(), (std::vector<double>{7, 0, 4}));
  {  // through a view: the base sees it
    Tensor base = zeros({2, 3}, kFloat64);
    Tensor row = base[1];
    row.add_(-2).abs_();
    EXPECT_EQ(base.sum().item<double>(), 6);
  }
  {  // autograd through in-place ops on a non-leaf
    Tensor a = f64({0.5, -1, 2}, {3}).requires_grad_();
    Tensor b = a * 2;
    b.exp_();
    b.sum().backward();
    expect_close(a.grad(), 2 * exp(2 * f64({0.5, -1, 2}, {3})));
    Tensor leaf = f64({1}, {1}).requires_grad_();
    expect_error([&] { leaf.exp_(); }, "leaf");
  }
  EXPECT_EQ(x.eq(0).to_vector<bool>(), (std::vector<bool>{false, true, false}));
  EXPECT_EQ(x.ne(0).to_vector<bool>(), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(x.lt(f64({0, 0, 5}, {3})).to_vector<bool>(), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(x.le(0).to_vector<bool>(), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(x.gt(0).to_vector<bool>(), (std::vector<bool>{false, false, true}));
  EXPECT_EQ(x.ge(0).to_vector<bool>(), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(x.to_float().dtype(), kFloat32);
  EXPECT_EQ(x.to_double().dtype(), kFloat64);
  EXPECT_EQ(x.to_long().to_vector<int64_t>(), (std::vector<int64_t>{-1, 0, 4}));
  EXPECT_EQ(x.to_int().dtype(), kInt32);
  EXPECT_EQ(x.to_bool().to_vector<bool>(), (std::vector<bool>{true, false, true}));
  Tensor b3 = zeros({2, 3, 4});
  EXPECT_EQ(b3.mT().sizes(), (std::vector<int64_t>{2, 4, 3}));
  expect_error([&] { x.mT(); }, "matrices");
  std::vector<bool> bits{true, false, true, true};
  Tensor bt = from_vector(bits, std::vector<int64_t>{2, 2});
  EXPECT_EQ(bt.dtype(), kBool);
  EXPECT_EQ(bt.to_vector<bool>(), bits);
  expect_error([&] { from_vector(bits, std::vector<int64_t>{3}); }, "holds 3 elements");
  expect_compiled_equal(
      [](const std::vector<Tensor>& t) {
        Tensor w = t[0] * 1;
        w.relu_();
        w.masked_fill_(w.gt(0.5), 0.25);
        return w.mT() + t[0].ge(0).to_double().mT();
      },
      {rnd({3, 4})});
}

TEST(Api, AdvancedIndexing) {
  Tensor x = arange(24, kFloat64).reshape({2, 3, 4});
  Tensor idx = i64({2, 0, -1}, {3});
  // One index tensor in any position.
  Tensor r0 = x.index({i64({1, 0}, {2})});
  EXPECT_EQ(r0.sizes(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(r0.to_vector<double>()[0], 12);
  Tensor r1 = x.index({Slice(), idx});
  EXPECT_EQ(r1.sizes(), (std::vector<int64_t>{2, 3, 4}));
  expect_close(r1.select(1, 0), x.select(1, 2));
  expect_close(r1.select(1, 2), x.select(1, 2));  // -1 wraps
  Tensor r2 = x.index({Ellipsis, i64({3, 1}, {2})});
  EXPECT_EQ(r2.sizes(), (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(r2.to_vector<double>()[0], 3);
  Tensor r3 = x.index({1, Slice(0, 2), i64({0, 0, 3}, {3})});  // int applies first
  EXPECT_EQ(r3.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r3.to_vector<double>(), (std::vector<double>{12, 12, 15, 16, 16, 19}));
  // Two index tensors: broadcast together; adjacent -> in place, separated -> first.
  Tensor a = i64({0, 1}, {2}), b = i64({2, 1}, {2});
  EXPECT_EQ(x.index({a, b}).to_vector<double>(), (std::vector<double>{8, 9, 10, 11, 16, 17, 18, 19}));
  EXPECT_EQ(x.index({a, b}).sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(x.index({a, b, 0}).to_vector<double>(), (std::vector<double>{8, 16}));
  EXPECT_EQ(x.index({a, Slice(), i64({1, 2}, {2})}).sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(x.index({a, Slice(), i64({1, 2}, {2})}).to_vector<double>(), (std::vector<double>{1, 5, 9, 14, 18, 22}));
  EXPECT_EQ(x.index({Slice(), i64({0, 2}, {2, 1}), i64({1, 3}, {1, 2})}).sizes(), (std::vector<int64_t>{2, 2, 2}));
  // Bool masks over leading dims.
  Tensor mask = from_vector(std::vector<bool>{true, false, true, false, false, true}, std::vector<int64_t>{2, 3});
  Tensor rm = x.index({mask});
  EXPECT_EQ(rm.sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(rm.select(1, 0).to_vector<double>(), (std::vector<double>{0, 8, 20}));
  EXPECT_EQ(x.index({Slice(), x.select(0, 0).select(1, 0).gt(3)}).sizes(), (std::vector<int64_t>{2, 2, 4}));
  expect_error([&] { x.index({i64({5}, {1})}).eval(); }, "out of bounds");
  expect_error([&] { x.index({f64({0}, {1})}); }, "long, int or bool");
  expect_error([&] { x.index({from_vector(std::vector<bool>{true, false}, std::vector<int64_t>{2, 1})}); }, "mask");
  expect_error([&] { x.index({a, a, a, a}); }, "too many indices");
  // index_put_: assignment and accumulation (duplicates add up).
  Tensor y = zeros({3, 4}, kFloat64);
  y.index_put_({i64({0, 2}, {2})}, f64({1, 2, 3, 4}, {4}));
  EXPECT_EQ(y.sum(1).to_vector<double>(), (std::vector<double>{10, 0, 10}));
  y.index_put_({Slice(), i64({1, 1}, {2})}, f64({5}, {1}), true);
  EXPECT_EQ(y.select(1, 1).to_vector<double>(), (std::vector<double>{12, 10, 12}));
  y.index_put_({y.gt(11)}, 0.0);
  EXPECT_EQ(y.select(1, 1).to_vector<double>(), (std::vector<double>{0, 10, 0}));
  y.index_put_({y.eq(10)}, f64({-1}, {1}));
  EXPECT_EQ(y.select(1, 1).to_vector<double>(), (std::vector<double>{0, -1, 0}));
  Tensor z = zeros({2, 3}, kFloat64);
  z.index_put_({i64({1, 0}, {2}), i64({2, 2}, {2})}, f64({7, 8}, {2}));
  EXPECT_EQ(z.to_vector<double>(), (std::vector<double>{0, 0, 8, 0, 0, 7}));
  Tensor acc = index_put(zeros({3}, kFloat64), {i64({0, 0, 2}, {3})}, f64({1, 2, 3}, {3}), true);
  EXPECT_EQ(acc.to_vector<double>(), (std::vector<double>{3, 0, 3}));
  expect_error([&] { zeros({3}).index_put_({i64({0, 1}, {2})}, zeros({3})); }, "index_put_");
  {  // through a view of the base
    Tensor base = zeros({2, 3}, kFloat64);
    Tensor row = base[1];
    row.index_put_({i64({0, 2}, {2})}, 1.0);
    EXPECT_EQ(base.to_vector<double>(), (std::vector<double>{0, 0, 0, 1, 0, 1}));
  }
  gradcheck("x[:, idx]",
            [](const std::vector<Tensor>& t) {
              return t[0].index({Slice(), t[1]});
            },
            {random_input({3, 4}, rng), kiln::testing::index_input({3}, {3, 0, 3})});
  gradcheck("index_put accumulate",
            [](const std::vector<Tensor>& t) {
              return index_put(t[0], {t[2], Slice()}, t[1], true);
            },
            {random_input({3, 2}, rng), random_input({4, 2}, rng), kiln::testing::index_input({4}, {0, 2, 0, 1})});
  expect_compiled_equal(
      [](const std::vector<Tensor>& t) {
        Tensor w = t[0] * 1;
        w.index_put_({t[1]}, 0.0);
        return w.index({Slice(), t[2]}) + w.index({t[1] == false}).sum();
      },
      {rnd({4, 3}), from_vector(std::vector<bool>{true, false, false, true}, std::vector<int64_t>{4}),
       i64({2, 0}, {2})});
}
