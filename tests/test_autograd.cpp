// Autograd: finite-difference gradchecks (float64) for every differentiable op, double
// backward, accumulation, laziness, in-place and views, and error cases.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>

#include <algorithm>
#include <random>
#include <set>
#include <thread>
#include <atomic>

#include "gradcheck.h"
#include "tests/expect_close.h"
#include "tests/test_seed.h"

using namespace kiln;
using kiln::testing::gradcheck;
using kiln::testing::index_input;
using kiln::testing::Input;
using kiln::testing::random_input;
using V = std::vector<Tensor>;

namespace {
std::mt19937 rng(42);
Input R(std::vector<int64_t> s) { return random_input(std::move(s), rng); }
Input Pos(std::vector<int64_t> s) { return random_input(std::move(s), rng, 0.3, 2.0); }
}  // namespace

TEST(Gradcheck, Unary) {
  struct U {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    bool positive;
  };
  std::vector<U> ops = {
      {"neg", [](const Tensor& x) { return -x; }, false},
      {"abs", [](const Tensor& x) { return x.abs(); }, false},
      {"exp", [](const Tensor& x) { return x.exp(); }, false},
      {"exp2", [](const Tensor& x) { return x.exp2(); }, false},
      {"expm1", [](const Tensor& x) { return x.expm1(); }, false},
      {"log", [](const Tensor& x) { return x.log(); }, true},
      {"log2", [](const Tensor& x) { return x.log2(); }, true},
      {"log1p", [](const Tensor& x) { return x.log1p(); }, true},
      {"sqrt", [](const Tensor& x) { return x.sqrt(); }, true},
      {"rsqrt", [](const Tensor& x) { return x.rsqrt(); }, true},
      {"reciprocal", [](const Tensor& x) { return x.reciprocal(); }, true},
      {"square", [](const Tensor& x) { return x.square(); }, false},
      {"sin", [](const Tensor& x) { return x.sin(); }, false},
      {"cos", [](const Tensor& x) { return x.cos(); }, false},
      {"tan", [](const Tensor& x) { return x.tan(); }, false},
      {"atan", [](const Tensor& x) { return x.atan(); }, false},
      {"tanh", [](const Tensor& x) { return x.tanh(); }, false},
      {"sigmoid", [](const Tensor& x) { return x.sigmoid(); }, false},
      {"relu", [](const Tensor& x) { return x.relu(); }, false},
      {"silu", [](const Tensor& x) { return x.silu(); }, false},
      {"softplus", [](const Tensor& x) { return x.softplus(); }, false},
      {"gelu", [](const Tensor& x) { return x.gelu(); }, false},
      {"gelu_tanh", [](const Tensor& x) { return x.gelu("tanh"); }, false},
      {"erf", [](const Tensor& x) { return x.erf(); }, false},
      {"clamp", [](const Tensor& x) { return x.clamp(-0.5, 0.7); }, false},
      {"pow_scalar", [](const Tensor& x) { return x.pow(3); }, false},
      {"to_f32_f64", [](const Tensor& x) { return x.to(kFloat32).to(kFloat64) * 2; }, false},
  };
  for (auto& u : ops) {
    // 2-D input, and a non-contiguous (transposed) view of it.
    Input in = u.positive ? Pos({3, 4}) : R({3, 4});
    // Through float32 the finite differences need a larger step (the function is linear there).
    bool f32 = u.name == std::string("to_f32_f64");
    double atol = f32 ? 1e-4 : 1e-6, eps = f32 ? 1e-2 : 1e-6;
    gradcheck(
        u.name, [&](const V& v) { return u.f(v[0]); }, {in}, atol, 1e-5, eps);
    gradcheck(
        std::string(u.name) + "_t", [&](const V& v) { return u.f(v[0].t()); }, {in}, atol, 1e-5, eps);
  }
}

TEST(Gradcheck, BinaryWithBroadcasting) {
  struct B {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> f;
    bool pos_a;
    bool pos_b;
  };
  std::vector<B> ops = {
      {"add", [](auto& a, auto& b) { return a + b; }, false, false},
      {"sub", [](auto& a, auto& b) { return a - b; }, false, false},
      {"mul", [](auto& a, auto& b) { return a * b; }, false, false},
      {"div", [](auto& a, auto& b) { return a / b; }, false, true},
      {"pow", [](auto& a, auto& b) { return pow(a, b); }, true, false},
      {"maximum", [](auto& a, auto& b) { return maximum(a, b); }, false, false},
      {"minimum", [](auto& a, auto& b) { return minimum(a, b); }, false, false},
      {"atan2", [](auto& a, auto& b) { return atan2(a, b); }, false, true},
      {"remainder", [](auto& a, auto& b) { return remainder(a, b); }, false, true},
      {"fmod", [](auto& a, auto& b) { return fmod(a, b); }, false, true},
      {"lerp", [](auto& a, auto& b) { return lerp(a, b, 0.3); }, false, false},
      {"add_alpha", [](auto& a, auto& b) { return add(a, b, 2.5); }, false, false},
  };
  for (auto& o : ops) {
    auto mk = [&](std::vector<int64_t> s, bool pos) { return pos ? Pos(s) : R(s); };
    gradcheck(o.name, [&](const V& v) { return o.f(v[0], v[1]); }, {mk({3, 4}, o.pos_a), mk({3, 4}, o.pos_b)});
    gradcheck(std::string(o.name) + "_bcast", [&](const V& v) { return o.f(v[0], v[1]); },
              {mk({2, 3, 1}, o.pos_a), mk({4}, o.pos_b)});
  }
  gradcheck("where", [](const V& v) { return where(v[0] > 0, v[1], v[2]); }, {R({3, 4}), R({3, 4}), R({4})});
  gradcheck("scalar_ops", [](const V& v) { return 2.0 / (v[0] * 3 + 5) - 1.5; }, {Pos({5})});
}

TEST(Gradcheck, Reductions) {
  std::vector<std::pair<std::vector<int64_t>, bool>> dimsets = {
      {{}, false}, {{1}, true}, {{-1}, false}, {{0, 2}, false}};
  for (auto& [dims, keep] : dimsets) {
    auto d = dims;
    bool k = keep;
    gradcheck("sum", [=](const V& v) { return v[0].sum(d, k); }, {R({2, 3, 4})});
    gradcheck("mean", [=](const V& v) { return v[0].mean(d, k); }, {R({2, 3, 4})});
    gradcheck("prod", [=](const V& v) { return v[0].prod(d, k); }, {R({2, 3, 4})});
    gradcheck("amax", [=](const V& v) { return v[0].amax(d, k); }, {R({2, 3, 4})});
    gradcheck("amin", [=](const V& v) { return v[0].amin(d, k); }, {R({2, 3, 4})});
    gradcheck("var", [=](const V& v) { return v[0].var(d, 1, k); }, {R({2, 3, 4})});
    gradcheck("std", [=](const V& v) { return v[0].std(d, 0, k); }, {R({2, 3, 4})});
    gradcheck("logsumexp", [=](const V& v) { return v[0].logsumexp(d, k); }, {R({2, 3, 4})});
    gradcheck("norm", [=](const V& v) { return v[0].norm(2, d, k); }, {R({2, 3, 4})});
  }
  gradcheck("prod_with_zero", [](const V& v) { return (v[0] * from_vector<double>({1, 0, 1, 1})).prod(); }, {R({4})});
  gradcheck("cumsum", [](const V& v) { return v[0].cumsum(1); }, {R({3, 4})});
  gradcheck("max_dim", [](const V& v) { return max(v[0], 1).first; }, {R({3, 4})});
}

TEST(Gradcheck, ViewsAndMovement) {
  gradcheck("reshape", [](const V& v) { return v[0].reshape({4, 6}) * 2; }, {R({2, 3, 4})});
  gradcheck("reshape_noncontig", [](const V& v) { return v[0].transpose(0, 2).reshape({-1}); }, {R({2, 3, 4})});
  gradcheck("permute", [](const V& v) { return v[0].permute({2, 0, 1}); }, {R({2, 3, 4})});
  gradcheck("expand", [](const V& v) { return v[0].expand({3, 4, 5}); }, {R({4, 1})});
  gradcheck("slice_step",
            [](const V& v) {
              return v[0].index({Slice(), Slice(1, None), Slice(None, None, 2)});
            },
            {R({3, 5, 6})});
  gradcheck("select", [](const V& v) { return v[0].select(1, 2); }, {R({3, 5, 2})});
  gradcheck("narrow", [](const V& v) { return v[0].narrow(1, 1, 2); }, {R({3, 5})});
  gradcheck("squeeze_unsqueeze", [](const V& v) { return v[0].squeeze(1).unsqueeze(0); }, {R({3, 1, 4})});
  gradcheck("flip", [](const V& v) { return v[0].flip({0, 1}); }, {R({3, 4})});
  gradcheck("repeat", [](const V& v) { return v[0].repeat({2, 3}); }, {R({2, 3})});
  gradcheck("cat", [](const V& v) { return cat({v[0], v[1] * 2, v[0]}, 1); }, {R({2, 3}), R({2, 5})});
  gradcheck("stack", [](const V& v) { return stack({v[0], v[1]}, 1); }, {R({3, 4}), R({3, 4})});
  gradcheck("split",
            [](const V& v) {
              auto p = v[0].split(std::vector<int64_t>{2, 5}, 1);
              return p[0].sum() * p[1];
            },
            {R({2, 7})});
  gradcheck("chunk",
            [](const V& v) {
              auto p = v[0].chunk(3, 0);
              return p[2] - p[0];
            },
            {R({6, 2})});
  gradcheck("pad", [](const V& v) { return pad(v[0], {1, 2, 0, 1}, 0.5); }, {R({3, 4})});
  gradcheck("tril", [](const V& v) { return v[0].tril(); }, {R({4, 4})});
  gradcheck("contiguous_chain", [](const V& v) { return (v[0].t() + v[1]).exp().sum({0}); }, {R({4, 3}), R({4})});
}

TEST(Gradcheck, Indexing) {
  gradcheck("gather", [](const V& v) { return v[0].gather(1, v[1]); },
            {R({4, 5}), index_input({4, 3}, {0, 4, 4, 1, 1, 2, 3, 0, 0, 2, 2, 2})});
  gradcheck("scatter", [](const V& v) { return scatter(v[0], 1, v[1], v[2]); },
            {R({3, 5}), index_input({3, 2}, {4, 0, 1, 2, 3, 4}), R({3, 2})});
  gradcheck("scatter_add", [](const V& v) { return scatter_add(v[0], 1, v[1], v[2]); },
            {R({3, 5}), index_input({3, 4}, {0, 0, 1, 4, 2, 2, 2, 3, 4, 3, 0, 1}), R({3, 4})});
  gradcheck("index_select", [](const V& v) { return v[0].index_select(0, v[1]); },
            {R({4, 5}), index_input({4}, {3, 0, 3, 1})});
  gradcheck("index_add", [](const V& v) { return index_add(v[0], 0, v[1], v[2]); },
            {R({5, 3}), index_input({4}, {0, 4, 0, 2}), R({4, 3})});
  gradcheck("embedding", [](const V& v) { return embedding(v[0], v[1]); },
            {index_input({2, 3}, {1, 9, 1, 0, 5, 5}), R({10, 4})});
  gradcheck("masked_fill", [](const V& v) { return v[0].masked_fill(v[0] > 0.2, 3.0); }, {R({3, 4})});
}

TEST(Gradcheck, LinearAlgebraAndNN) {
  gradcheck("matmul_2d", [](const V& v) { return matmul(v[0], v[1]); }, {R({3, 4}), R({4, 5})});
  gradcheck("matmul_batched_bcast", [](const V& v) { return matmul(v[0], v[1]); }, {R({2, 3, 4}), R({4, 5})});
  gradcheck("matmul_vec", [](const V& v) { return matmul(v[0], v[1]); }, {R({4}), R({4, 3})});
  gradcheck("matmul_dot", [](const V& v) { return matmul(v[0], v[1]); }, {R({4}), R({4})});
  gradcheck("matmul_noncontig", [](const V& v) { return matmul(v[0].t(), v[1]); }, {R({4, 3}), R({4, 2})});
  gradcheck("bmm", [](const V& v) { return bmm(v[0], v[1]); }, {R({2, 3, 4}), R({2, 4, 2})});
  gradcheck("linear", [](const V& v) { return linear(v[0], v[1], v[2]); }, {R({5, 4}), R({3, 4}), R({3})});
  gradcheck("matmul_rhs_transposed", [](const V& v) { return matmul(v[0], v[1].t()); }, {R({5, 4}), R({3, 4})});
  gradcheck("outer", [](const V& v) { return outer(v[0], v[1]); }, {R({3}), R({4})});
  gradcheck("softmax", [](const V& v) { return softmax(v[0], -1); }, {R({4, 6})});
  gradcheck("softmax_dim1", [](const V& v) { return softmax(v[0], 1); }, {R({2, 3, 5})});
  gradcheck("log_softmax", [](const V& v) { return log_softmax(v[0], -1); }, {R({4, 6})});
  gradcheck("layer_norm", [](const V& v) { return layer_norm(v[0], {6}, v[1], v[2]); }, {R({4, 6}), R({6}), R({6})});
  gradcheck("layer_norm_2d", [](const V& v) { return layer_norm(v[0], {3, 4}); }, {R({2, 3, 4})});
  gradcheck("cross_entropy", [](const V& v) { return cross_entropy(v[0], v[1]); },
            {R({5, 4}), index_input({5}, {0, 3, 1, 1, 2})});
  gradcheck("cross_entropy_sum", [](const V& v) { return cross_entropy(v[0], v[1], "sum"); },
            {R({5, 4}), index_input({5}, {0, 3, 1, 1, 2})});
  gradcheck("mse_loss", [](const V& v) { return mse_loss(v[0], v[1]); }, {R({4, 3}), R({4, 3})});
  gradcheck("smooth_l1", [](const V& v) { return smooth_l1_loss(v[0], v[1]); }, {R({4, 3}), R({4, 3})});
  gradcheck("sdpa", [](const V& v) { return scaled_dot_product_attention(v[0], v[1], v[2]); },
            {R({2, 3, 5, 8}), R({2, 3, 7, 8}), R({2, 3, 7, 8})});
  gradcheck("sdpa_causal",
            [](const V& v) { return scaled_dot_product_attention(v[0], v[1], v[2], std::nullopt, true); },
            {R({1, 2, 6, 4}), R({1, 2, 6, 4}), R({1, 2, 6, 4})});
  gradcheck("conv2d",
            [](const V& v) {
              return conv2d(v[0], v[1], v[2], {2, 1}, {1, 1}, {1, 2}, 2);
            },
            {R({2, 4, 6, 7}), R({6, 2, 3, 2}), R({6})});
}

TEST(Gradcheck, InPlaceAndViews) {
  gradcheck("add_on_result",
            [](const V& v) {
              Tensor y = v[0] * 2;
              y.add_(v[1]);
              y.mul_(v[0]);
              return y;
            },
            {R({3, 4}), R({4})});
  gradcheck("write_through_view",
            [](const V& v) {
              Tensor y = v[0] * 1.0;
              Tensor row = y.select(0, 1);
              row.mul_(v[1]);  // y[1] *= w
              Tensor col = y.select(1, 2);  // another view of y sees the write
              return y.sum() + col.sum() * 3;
            },
            {R({3, 4}), R({4})});
  gradcheck("index_put",
            [](const V& v) {
              Tensor y = zeros({4, 5}, kFloat64);
              y.index_put_({Slice(1, 3), Slice(None, None, 2)}, v[0]);
              return y * v[1];
            },
            {R({2, 3}), R({4, 5})});
  gradcheck("copy_into_view",
            [](const V& v) {
              Tensor y = v[0].clone();
              y.narrow(1, 1, 2).copy_(v[1]);
              return y.exp();
            },
            {R({3, 4}), R({3, 2})});
}

TEST(DoubleBackward, SecondDerivatives) {
  // d/dx of (dy/dx . w) by finite differences on the first derivative.
  auto second = [](const std::string& name, std::function<Tensor(const V&)> f, std::vector<Input> in) {
    gradcheck(
        name + "_grad",
        [f](const V& v) {
          // On the finite-difference path the inputs are plain tensors: make them leaves.
          EnableGradGuard eg;
          std::vector<Tensor> xs;
          for (const auto& t : v) xs.push_back(t.requires_grad() ? t : t.detach().requires_grad_());
          Tensor y = f(xs);
          auto gs = grad({y.sum()}, xs, {}, true, true);
          Tensor s = gs[0].sum() * 0;
          for (auto& g : gs) s = s + (g * g).sum();
          return s;
        },
        in);
  };
  second("tanh", [](const V& v) { return v[0].tanh(); }, {R({3, 4})});
  second("sigmoid", [](const V& v) { return v[0].sigmoid(); }, {R({3, 4})});
  second("mul", [](const V& v) { return v[0] * v[1] * v[0]; }, {R({3, 4}), R({4})});
  second("div", [](const V& v) { return v[0] / v[1]; }, {R({3, 4}), Pos({3, 4})});
  second("matmul", [](const V& v) { return matmul(v[0], v[1]).square(); }, {R({3, 4}), R({4, 2})});
  second("softmax", [](const V& v) { return softmax(v[0], -1) * v[1]; }, {R({3, 5}), R({3, 5})});
  // layer_norm's own backward (the compact form) is differentiable again in x, w and b.
  second("layer_norm", [](const V& v) { return layer_norm(v[0], {4}, v[1], v[2]) * v[3]; },
         {R({3, 4}), R({4}), R({4}), R({3, 4})});
  second("layer_norm_2d", [](const V& v) { return layer_norm(v[0], {2, 3}) * v[1]; }, {R({2, 2, 3}), R({2, 2, 3})});
  // Exact: d2/dx2 tanh = -2 tanh (1 - tanh^2).
  Tensor x = from_vector<double>({0.3, -1.2}).requires_grad_();
  Tensor g1 = grad({x.tanh().sum()}, {x}, {}, false, true)[0];
  Tensor g2 = grad({g1.sum()}, {x})[0];
  auto got = g2.to_vector<double>();
  for (int i = 0; i < 2; ++i) {
    double t = std::tanh(i == 0 ? 0.3 : -1.2);
    EXPECT_NEAR(got[i], -2 * t * (1 - t * t), 1e-12);
  }
}

// layer_norm's backward is its compact form (PyTorch's), not the chain rule through its
// decomposition: the same gradients (float64: within 1e-12 relative), for any normalized dims,
// without or with weight and bias, with a float32 input and float64 parameters; a weight
// updated in place after the forward does not change the gradient; a second backward errs.
TEST(Autograd, LayerNormBackwardIsCompact) {
  auto decomposed = [](const Tensor& x, const std::vector<int64_t>& dims, const Tensor& w, const Tensor& b) {
    Tensor c = x - x.mean(dims, true);
    Tensor y = c * rsqrt((c * c).mean(dims, true) + 1e-5);
    if (w.defined()) y = y * w;
    if (b.defined()) y = y + b;
    return y;
  };
  std::mt19937 rng(kiln::testing::test_seed(17));
  for (int c = 0; c < 12; ++c) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 5), d1 = 1 + static_cast<int64_t>(rng() % 7),
                  d2 = 1 + static_cast<int64_t>(rng() % 3);
    const bool two = c % 2, affine = c % 3 != 0;
    const DType xt = c % 4 == 3 ? kFloat32 : kFloat64;
    const std::vector<int64_t> ns = two ? std::vector<int64_t>{d1, d2} : std::vector<int64_t>{d2};
    const std::vector<int64_t> dims = two ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2};
    SCOPED_TRACE("case " + std::to_string(c));
    manual_seed(rng());
    Tensor x0 = randn({n, d1, d2}, xt), w0 = randn(ns, kFloat64), b0 = randn(ns, kFloat64),
           g = randn({n, d1, d2}, kFloat64);
    auto grads = [&](bool compact) {
      Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
      Tensor y = compact ? layer_norm(x, ns, affine ? std::optional<Tensor>(w) : std::nullopt,
                                      affine ? std::optional<Tensor>(b) : std::nullopt)
                         : decomposed(x, dims, affine ? w : Tensor(), affine ? b : Tensor());
      std::vector<Tensor> in = {x};
      if (affine) in.insert(in.end(), {w, b});
      return grad({y}, in, {g.to(y.dtype())});
    };
    auto a = grads(true), e = grads(false);
    ASSERT_EQ(a.size(), e.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].dtype(), e[i].dtype());
      expect_close(a[i], e[i], xt == kFloat32 && i == 0 ? 1e-4 : 1e-10, xt == kFloat32 && i == 0 ? 1e-5 : 1e-12);
    }
  }
  // The forward's weight, whatever happens to it before backward.
  Tensor x = randn({3, 5}, kFloat64).requires_grad_(), w = randn({5}, kFloat64).requires_grad_();
  Tensor w_then = w.detach().clone();
  Tensor y = layer_norm(x, {5}, w, std::nullopt);
  {
    NoGradGuard ng;
    w.mul_(3.0);
  }
  y.backward(ones_like(y), true);
  Tensor x2 = x.detach().requires_grad_();
  Tensor y2 = layer_norm(x2, {5}, w_then, std::nullopt);
  y2.backward(ones_like(y2));
  expect_close(x.grad(), x2.grad(), 1e-12, 1e-14);
  y.backward(ones_like(y));  // retained above: a second pass works once
  EXPECT_THROW(y.backward(ones_like(y)), Error);
}

// cross_entropy's backward is its compact form, (softmax(x) - onehot(t)) * g: the gradients of
// the log_softmax/gather composite (float64 within 1e-12 relative) for logits of rank 1 to 3
// (class dim 0 or 1), each reduction, and again through a second derivative (create_graph).
TEST(Autograd, CrossEntropyBackwardIsCompact) {
  auto composite = [](const Tensor& x, const Tensor& t, const std::string& red) {
    const int64_t c = x.dim() == 1 ? 0 : 1;
    Tensor l = -gather(log_softmax(x, c), c, t.unsqueeze(c)).squeeze(c);
    return red == "mean" ? l.mean() : red == "sum" ? l.sum() : l;
  };
  std::mt19937 rng(kiln::testing::test_seed(23));
  for (int it = 0; it < 12; ++it) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 6), classes = 1 + static_cast<int64_t>(rng() % 7),
                  s = 1 + static_cast<int64_t>(rng() % 3);
    const int rank = 1 + it % 3;
    const std::string red = it % 4 == 0 ? "none" : it % 4 == 1 ? "sum" : "mean";
    SCOPED_TRACE("it " + std::to_string(it) + " rank " + std::to_string(rank) + " " + red);
    std::vector<int64_t> xs = rank == 1   ? std::vector<int64_t>{classes}
                              : rank == 2 ? std::vector<int64_t>{n, classes}
                                          : std::vector<int64_t>{n, classes, s};
    std::vector<int64_t> ts = rank == 1   ? std::vector<int64_t>{}
                              : rank == 2 ? std::vector<int64_t>{n}
                                          : std::vector<int64_t>{n, s};
    manual_seed(rng());
    Tensor x0 = randn(xs, kFloat64) * 2, t = randint(0, classes, ts);
    auto grads = [&](bool compact, bool second) {
      Tensor x = x0.detach().requires_grad_();
      Tensor l = compact ? cross_entropy(x, t, red) : composite(x, t, red);
      Tensor gl = randn_like(l.detach()).abs() + 0.5;
      if (!second) return grad({l}, {x}, {gl})[0];
      Tensor gx = grad({l}, {x}, {gl}, false, true)[0];
      return grad({(gx * gx).sum()}, {x})[0];
    };
    manual_seed(5);
    Tensor a = grads(true, false);
    manual_seed(5);
    Tensor e = grads(false, false);
    expect_close(a, e, 1e-12, 1e-14);
    manual_seed(6);
    a = grads(true, true);
    manual_seed(6);
    e = grads(false, true);
    expect_close(a, e, 1e-10, 1e-12);
  }
}

// What cross_entropy keeps for its backward between forward and backward: two row statistics
// (the max and the log of the sum of exponentials), not log_softmax's [N, C] (float32 under
// autocast, 1.6 GiB for GPT-2's 8192 x 50304 logits). Float32 logits and bfloat16 logits under
// autocast (whose float32 copy must not be kept either); the gradient equals (softmax(x) -
// onehot(t)) / N computed apart (float32 to 1e-6, bfloat16's float32 math to 1e-6 of its values).
TEST(Autograd, CrossEntropyKeepsRowStatisticsNotLogSoftmax) {
  manual_seed(kiln::testing::test_seed(71));
  const int64_t n = 256, c = 4096;
  for (DType dt : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = (randn({n, c}) * 3).to(dt).requires_grad_(), t = randint(0, c, {n});
    eval({x, t});
    const int64_t before = host_memory_stats().allocated_bytes;
    std::optional<kiln::autocast> ac;
    if (dt == kBFloat16) ac.emplace(DeviceType::CPU, kBFloat16);
    Tensor l = cross_entropy(x, t);
    ac.reset();
    l.eval();
    const int64_t kept = host_memory_stats().allocated_bytes - before;
    EXPECT_LT(kept, n * c * 4 / 8) << kept << " bytes kept; log_softmax's [N, C] in float32 is " << n * c * 4;
    Tensor g = grad({l}, {x})[0];
    Tensor xf = x.detach().to(kFloat32);
    Tensor want = (softmax(xf, 1) - one_hot(t, c).to(kFloat32)) / static_cast<double>(n);
    expect_close(g.to(kFloat32), want.to(dt).to(kFloat32), 1e-6, 1e-6);
  }
}

// layer_norm keeps for its backward what PyTorch's native_layer_norm keeps: its input, the mean
// and the reciprocal standard deviation ([N, 1] each), not x^ ([N, C]). Float32 and float64
// inputs, with and without an affine: the gradients the same bits as the decomposition's compact
// form computed before (x^ recomputed by the same ops), checked against finite differences by
// the gradcheck cases above.
TEST(Autograd, LayerNormKeepsMeanAndRstdNotXhat) {
  manual_seed(kiln::testing::test_seed(72));
  const int64_t n = 64, c = 4096;
  for (DType dt : {kFloat32, kFloat64}) {
    for (bool affine : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (affine ? " affine" : ""));
      Tensor x = randn({n, c}, dt).requires_grad_(), w = randn({c}, dt).requires_grad_(),
             b = randn({c}, dt).requires_grad_(), gy = randn({n, c}, dt);
      eval({x, w, b, gy});
      const int64_t before = host_memory_stats().allocated_bytes;
      Tensor y = affine ? layer_norm(x, {c}, w, b) : layer_norm(x, {c});
      y.eval();
      const int64_t item = static_cast<int64_t>(itemsize(dt));
      const int64_t kept = host_memory_stats().allocated_bytes - before - n * c * item;  // (y itself)
      EXPECT_LT(kept, n * c * item / 8) << kept << " bytes kept besides y; x^ is " << n * c * item;
      std::vector<Tensor> g = grad({y}, affine ? std::vector<Tensor>{x, w, b} : std::vector<Tensor>{x}, {gy});
      // against the same formula computed here
      Tensor m = x.detach().mean({1}, true), xc = x.detach() - m;
      Tensor r = rsqrt((xc * xc).mean({1}, true) + 1e-5), xh = xc * r;
      Tensor gw = affine ? gy * w.detach() : gy;
      Tensor dx = r * (gw - gw.mean({1}, true) - xh * (gw * xh).mean({1}, true));
      const double tol = dt == kFloat32 ? 1e-5 : 1e-12;
      expect_close(g[0], dx, tol, tol);
      if (affine) {
        expect_close(g[1], (gy * xh).sum({0}), tol * 10, tol * 10);
        expect_close(g[2], gy.sum({0}), tol * 10, tol * 10);
      }
    }
  }
}

// gelu of 16-bit inputs computes in float32 and rounds once, value and gradient, as PyTorch's
// kernels (opmath): the same bits as the float32 gelu of the same values rounded to the input's
// dtype, both forms ("none", "tanh"); before, each op of the formula rounded to 16 bits.
TEST(Autograd, HalfGeluRoundsOnce) {
  manual_seed(kiln::testing::test_seed(73));
  for (DType dt : {kBFloat16, kFloat16})
    for (const char* form : {"none", "tanh"}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + form);
      Tensor x = (randn({4096}) * 3).to(dt).requires_grad_(), g = randn({4096}).to(dt);
      Tensor y = gelu(x, form), gx = grad({y}, {x}, {g})[0];
      Tensor xf = x.detach().to(kFloat32).requires_grad_();
      Tensor yf = gelu(xf, form), gf = grad({yf}, {xf}, {g.to(kFloat32)})[0];
      EXPECT_EQ(y.to(kFloat32).to_vector<float>(), yf.to(dt).to(kFloat32).to_vector<float>());
      EXPECT_EQ(gx.to(kFloat32).to_vector<float>(), gf.to(dt).to(kFloat32).to_vector<float>());
    }
}

TEST(Autograd, BackwardIsLazyAndAccumulates) {
  Tensor w = from_vector<float>({1, 2, 3}).requires_grad_();
  Tensor loss = (w * w).sum();
  loss.eval();
  reset_stats();
  loss.backward();
  EXPECT_EQ(stats().nodes_executed, 0u);  // gradients are pending nodes
  EXPECT_FALSE(w.grad().is_materialized());
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 4, 6}));
  (w * 3).sum().backward();  // accumulates
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{5, 7, 9}));
  w.set_grad(Tensor());
  EXPECT_FALSE(w.grad().defined());
}

// The gradients of a split's pieces reach their input as one concatenation (PyTorch's
// SplitBackward), not a zero-filled tensor of the whole per piece added up: split, chunk and
// unbind, all pieces used; some unused (one zero tensor under the used windows); windows that
// overlap (added). Values exact in float64.
TEST(Autograd, SplitChunkUnbindGradientsAreOneCat) {
  manual_seed(kiln::testing::test_seed(70));
  auto grad_node = [](const Tensor& g) {
    const Node* n = g.node().get();
    while (n->op == OpKind::Contiguous && !n->inputs.empty()) n = n->inputs[0].get();
    return n->op;
  };
  const Tensor w = randn({4, 6, 9}, kFloat64);
  auto weighted = [&](const std::vector<Tensor>& pieces, const std::vector<Tensor>& ws) {
    Tensor loss = zeros({}, kFloat64);
    for (size_t i = 0; i < pieces.size(); ++i)
      if (ws[i].defined()) loss = loss + (pieces[i] * ws[i]).sum();
    return loss;
  };
  {  // split along the last dim, every piece used: dx = w
    Tensor x = randn({4, 6, 9}, kFloat64).requires_grad_();
    weighted(x.split(3, 2), w.split(3, 2)).backward();
    EXPECT_EQ(grad_node(x.grad()), OpKind::Cat);
    expect_close(x.grad(), w, 0, 0);
  }
  {  // chunk of dim 1, uneven sizes (6 in 4 chunks: 2, 2, 2), every piece
    Tensor x = randn({4, 6, 9}, kFloat64).requires_grad_();
    weighted(x.chunk(4, 1), w.chunk(4, 1)).backward();
    EXPECT_EQ(grad_node(x.grad()), OpKind::Cat);
    expect_close(x.grad(), w, 0, 0);
  }
  {  // unbind of dim 0 (select windows)
    Tensor x = randn({4, 6, 9}, kFloat64).requires_grad_();
    weighted(x.unbind(0), w.unbind(0)).backward();
    EXPECT_EQ(grad_node(x.grad()), OpKind::Cat);
    expect_close(x.grad(), w, 0, 0);
  }
  {  // pieces 0 and 2 of three: zeros between
    Tensor x = randn({4, 6, 9}, kFloat64).requires_grad_();
    std::vector<Tensor> ws = w.split(3, 2);
    ws[1] = Tensor();
    weighted(x.split(3, 2), ws).backward();
    EXPECT_EQ(grad_node(x.grad()), OpKind::ViewScatter);
    Tensor want = w.clone();
    want.narrow(2, 3, 3).fill_(0.0);
    expect_close(x.grad(), want, 0, 0);
  }
  {  // overlapping windows add
    Tensor x = randn({4, 6, 9}, kFloat64).requires_grad_();
    ((x.narrow(2, 0, 5) * w.narrow(2, 0, 5)).sum() + (x.narrow(2, 3, 6) * w.narrow(2, 3, 6)).sum()).backward();
    Tensor want = w.clone();
    want.narrow(2, 3, 2).mul_(2.0);
    expect_close(x.grad(), want, 0, 0);
  }
}

// silu and dropout are one backward node each that keeps what PyTorch's keeps (x; the boolean
// mask), not their formulas' intermediates: the node's name, and gradients equal to the formula's
// (silu: within rounding, float64; dropout: exactly g / (1 - p) where kept, 0 elsewhere).
TEST(Autograd, SiluAndDropoutKeepWhatPyTorchKeeps) {
  manual_seed(kiln::testing::test_seed(71));
  Tensor x = randn({5, 7}, kFloat64).requires_grad_(), g = randn({5, 7}, kFloat64);
  Tensor y = silu(x);
  EXPECT_STREQ(y.impl()->grad_fn->name(), "silu");
  Tensor x2 = x.detach().requires_grad_();
  expect_close(grad({y}, {x}, {g})[0], grad({x2 * sigmoid(x2)}, {x2}, {g})[0], 1e-12, 1e-14);
  for (double p : {0.25, 0.6}) {
    Tensor d = dropout(x, p, true);
    EXPECT_STREQ(d.impl()->grad_fn->name(), "dropout");
    Tensor kept = ne(d, 0.0).to(kFloat64);  // (x is never exactly 0 here)
    expect_close(d, x.detach() * kept / (1 - p), 0, 0);
    expect_close(grad({d}, {x}, {g})[0], g * kept / (1 - p), 0, 0);
  }
}

// A Linear layer's weight gradient is dense in the weight's own layout, as PyTorch's is (an
// optimizer's update then reads it contiguously), and equals gᵀ·x (float64, 1e-12 relative); a
// batched (3-D) input keeps the general rule and gives the same values.
TEST(Autograd, TransposedRightOperandGradientIsDense) {
  Tensor w = randn({3, 4}, kFloat64).requires_grad_();
  for (int64_t rank : {2, 3}) {
    std::vector<int64_t> xs = rank == 2 ? std::vector<int64_t>{6, 4} : std::vector<int64_t>{2, 6, 4};
    std::vector<int64_t> gs = xs;
    gs.back() = 3;
    Tensor x = randn(xs, kFloat64), g = randn(gs, kFloat64);
    w.set_grad(Tensor());
    (matmul(x, w.t()) * g).sum().backward();
    Tensor gw = w.grad();
    EXPECT_TRUE(gw.is_contiguous()) << "rank " << rank << ": strides " << gw.strides()[0] << ", " << gw.strides()[1];
    Tensor want = matmul(g.reshape({-1, 3}).t(), x.reshape({-1, 4}));
    expect_close(gw, want, 1e-12, 1e-12);
  }
}

// [..., M, K] x [K, N] with a dense left operand is one [rows, K] x [K, N] product (PyTorch's
// matmul folds the batch so): the recorded product is 2-D, and the values and gradients equal
// the batched form's. A left operand that is not dense (transposed) keeps the batched product;
// size-0 and size-1 batches fold too.
TEST(Autograd, MatmulFoldsTheBatchOfADenseLeftOperand) {
  auto product_rank = [](const Tensor& y) {
    const Node* n = y.node().get();
    while (n->op != OpKind::Matmul && !n->inputs.empty()) n = n->inputs[0].get();
    return n->op == OpKind::Matmul ? static_cast<int64_t>(n->shape.size()) : int64_t{-1};
  };
  for (const std::vector<int64_t>& xs :
       std::vector<std::vector<int64_t>>{{2, 5, 4}, {3, 2, 5, 4}, {0, 5, 4}, {1, 1, 4}, {2, 0, 4}}) {
    SCOPED_TRACE(::testing::PrintToString(xs));
    Tensor x = randn(xs, kFloat64).requires_grad_(), w = randn({4, 3}, kFloat64).requires_grad_();
    Tensor y = matmul(x, w);
    EXPECT_EQ(product_rank(y), 2);
    std::vector<int64_t> ys = xs;
    ys.back() = 3;
    EXPECT_EQ(y.sizes(), ys);
    Tensor g = randn(ys, kFloat64);
    auto got = grad({(y * g).sum()}, {x, w});
    // The batched form: x against w expanded over the batch.
    Tensor xb = x.detach().requires_grad_(), wb = w.detach().requires_grad_();
    std::vector<int64_t> ws = xs;
    ws[ws.size() - 2] = 4;
    ws.back() = 3;
    int64_t nb = 1;
    for (size_t d = 0; d + 2 < xs.size(); ++d) nb *= xs[d];
    Tensor yb = bmm(xb.reshape({nb, xs[xs.size() - 2], 4}), wb.expand(ws).reshape({nb, 4, 3})).reshape(ys);
    auto want = grad({(yb * g).sum()}, {xb, wb});
    expect_close(y, yb, 1e-12, 1e-12);
    expect_close(got[0], want[0], 1e-12, 1e-12);
    expect_close(got[1], want[1], 1e-12, 1e-12);
    // A vector on the right folds as well.
    Tensor v = randn({4}, kFloat64);
    expect_close(matmul(x, v), matmul(x, v.unsqueeze(1)).squeeze(-1), 1e-12, 1e-12);
  }
  Tensor xt = randn({2, 4, 5}, kFloat64).transpose(1, 2), w = randn({4, 3}, kFloat64);
  EXPECT_EQ(product_rank(matmul(xt, w)), 3);
  expect_close(matmul(xt, w), matmul(xt.contiguous(), w), 1e-12, 1e-12);
}

TEST(Autograd, RetainGraphAndErrors) {
  Tensor x = from_vector<float>({1, 2}).requires_grad_();
  Tensor y = (x.exp() * x).sum();
  y.backward(std::nullopt, true);
  y.backward();  // allowed: first call retained the graph
  EXPECT_THROW(y.backward(), Error);  // freed
  EXPECT_THROW((x * 2).backward(), Error);  // non-scalar needs a gradient
  EXPECT_THROW(ones({2}).sum().backward(), Error);  // nothing requires grad
  EXPECT_THROW(x.add_(1), Error);  // in-place on a leaf that requires grad
  {
    NoGradGuard ng;
    x.add_(1);  // allowed without tracking (optimizer updates)
    EXPECT_FALSE((x * 2).requires_grad());
  }
  EXPECT_TRUE(x.requires_grad() && x.is_leaf());
  EXPECT_THROW(ones({2}, kInt64).requires_grad_(), Error);
  Tensor a = from_vector<float>({1}).requires_grad_(), b = from_vector<float>({2}).requires_grad_();
  EXPECT_THROW(grad({(a * 2).sum()}, {b}), Error);  // unused input
  auto gs = grad({(a * 2).sum()}, {a, b}, {}, false, false, true);
  EXPECT_FALSE(gs[1].defined());
  EXPECT_FLOAT_EQ(gs[0].item<float>(), 2.f);
  EXPECT_FALSE(a.grad().defined());  // grad() does not accumulate
}

TEST(Autograd, DetachAndGradOutputs) {
  Tensor x = from_vector<double>({1, 2, 3}).requires_grad_();
  Tensor y = x * x.detach();  // d/dx = x (detached factor is a constant)
  y.backward(from_vector<double>({1, 10, 100}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 20, 300}));
}

// PyTorch's gradients where a function has a kink, a tie or a 0 (values from PyTorch's rules).
TEST(Autograd, PyTorchConventionsAtKinks) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  using D = std::vector<double>;
  auto leaf = [](D v, std::vector<int64_t> s) {
    return from_vector<double>(v, std::optional<std::vector<int64_t>>(s)).requires_grad_();
  };
  auto g1 = [](const Tensor& out, const Tensor& x) {
    return grad({sum(out)}, {x})[0].contiguous().to_vector<double>();
  };
  using Opt = std::optional<Tensor>;
  {  // clamp: the whole gradient at the boundaries (mask min <= x <= max)
    Tensor x = leaf({-1, -0.5, 0, 0.7, 1}, {5});
    EXPECT_EQ(g1(clamp(x, Scalar(-0.5), Scalar(0.7)), x), (D{0, 1, 1, 1, 0}));
    EXPECT_EQ(g1(clamp(x, Scalar(-0.5), std::nullopt), x), (D{0, 1, 1, 1, 1}));
  }
  {  // clamp with tensor bounds: min gets x < min < max, max gets x > max or max < min
    Tensor x = leaf({-1, 2, 3, 0.5, 5, -5, 1}, {7});
    Tensor mn = leaf({0, 0, 0, 1, 1, 1, 1}, {7}), mx = leaf({1, 2, 1, 1, 1, 1, 1}, {7});
    auto g = grad({sum(clamp(x, Opt(mn), Opt(mx)))}, {x, mn, mx});
    EXPECT_EQ(g[0].to_vector<double>(), (D{0, 1, 0, 0, 0, 0, 1}));
    EXPECT_EQ(g[1].to_vector<double>(), (D{1, 0, 0, 0, 0, 0, 0}));
    EXPECT_EQ(g[2].to_vector<double>(), (D{0, 0, 1, 0, 1, 0, 0}));
    Tensor y = leaf({0.5, 5, nan}, {3}), lo = leaf({2, 2, 2}, {3}), hi = leaf({1, 1, 1}, {3});
    Tensor out = clamp(y, Opt(lo), Opt(hi));
    D v = out.to_vector<double>();
    EXPECT_EQ(v[0], 1);
    EXPECT_EQ(v[1], 1);
    EXPECT_TRUE(std::isnan(v[2]));
    auto h = grad({sum(out)}, {y, lo, hi});
    EXPECT_EQ(h[0].to_vector<double>(), (D{0, 0, 0}));
    EXPECT_EQ(h[1].to_vector<double>(), (D{0, 0, 0}));
    EXPECT_EQ(h[2].to_vector<double>(), (D{1, 1, 1}));
  }
  {  // maximum/minimum: ties split in half, NaN gives both the whole gradient
    Tensor x = leaf({nan, 1, 2, 0}, {4}), y = leaf({1, nan, 2, 1}, {4});
    auto g = grad({sum(maximum(x, y))}, {x, y});
    EXPECT_EQ(g[0].to_vector<double>(), (D{1, 1, 0.5, 0}));
    EXPECT_EQ(g[1].to_vector<double>(), (D{1, 1, 0.5, 1}));
    auto h = grad({sum(minimum(x, y))}, {x, y});
    EXPECT_EQ(h[0].to_vector<double>(), (D{1, 1, 0.5, 1}));
    EXPECT_EQ(h[1].to_vector<double>(), (D{1, 1, 0.5, 0}));
  }
  {  // max/min along a dim: only the returned index; amax/amin and max(): spread over ties
    Tensor x = leaf({1, 3, 3, 2, 2, 1}, {2, 3});
    EXPECT_EQ(g1(kiln::max(x, 1).first, x), (D{0, 1, 0, 1, 0, 0}));
    EXPECT_EQ(g1(kiln::max(x, 1, true).first, x), (D{0, 1, 0, 1, 0, 0}));
    EXPECT_EQ(g1(kiln::min(x, 0).first, x), (D{1, 0, 0, 0, 1, 1}));
    EXPECT_EQ(g1(amax(x, {1}), x), (D{0, 0.5, 0.5, 0.5, 0.5, 0}));
    EXPECT_EQ(g1(kiln::max(x), x), (D{0, 0.5, 0.5, 0, 0, 0}));
    EXPECT_EQ(kiln::max(x, 1).first.to_vector<double>(), (D{3, 2}));
  }
  {  // norms and std: 0 where the result is 0; p < 1: 0 at zero elements
    Tensor z = leaf({0, 0, 0}, {3});
    EXPECT_EQ(g1(norm(z, 2), z), (D{0, 0, 0}));
    EXPECT_EQ(g1(norm(z, 3), z), (D{0, 0, 0}));
    EXPECT_EQ(g1(norm(z, 0.5), z), (D{0, 0, 0}));
    Tensor x = leaf({0, 1, 4}, {3});
    D g = g1(norm(x, 0.5), x);  // |x|^(p-1) sign(x) norm^(1-p), norm = 9
    EXPECT_EQ(g[0], 0);
    EXPECT_NEAR(g[1], 3, 1e-12);
    EXPECT_NEAR(g[2], 1.5, 1e-12);
    EXPECT_NEAR(norm(x, 0.5).item<double>(), 9, 1e-12);
    Tensor c = leaf({2, 2, 2}, {3});
    EXPECT_EQ(g1(kiln::std(c), c), (D{0, 0, 0}));
  }
  {  // softplus at 0 is sigmoid(0); abs, relu, sign at 0 are 0
    Tensor x = leaf({0, 1, -1}, {3});
    D g = g1(softplus(x), x);
    EXPECT_EQ(g[0], 0.5);
    EXPECT_NEAR(g[1], 1 / (1 + std::exp(-1.0)), 1e-12);
    EXPECT_EQ(g1(abs(x), x), (D{0, 1, -1}));
    EXPECT_EQ(g1(relu(x), x), (D{0, 1, 0}));
    EXPECT_EQ(g1(sign(x), x), (D{0, 0, 0}));
  }
  {  // prod with one zero: the product of the others; with two: 0
    Tensor x = leaf({0, 2, 3}, {3}), y = leaf({0, 2, 0}, {3});
    EXPECT_EQ(g1(prod(x), x), (D{6, 0, 0}));
    EXPECT_EQ(g1(prod(y), y), (D{0, 0, 0}));
  }
}

TEST(Gradcheck, RandomShapesBroadcastingAndNonContiguous) {
  // Each op on random shapes (rank 1-3, sizes 1-4), with broadcasting partners and inputs
  // viewed non-contiguously (transposed) before use. Seed: KILN_TEST_SEED.
  const char* env = std::getenv("KILN_TEST_SEED");
  std::mt19937 g(env ? static_cast<unsigned>(std::stoul(env)) : 7u);
  auto rnd = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); };
  auto shape = [&] {
    std::vector<int64_t> s(rnd(1, 3));
    for (auto& d : s) d = rnd(1, 4);
    return s;
  };
  auto partner = [&](std::vector<int64_t> s) {  // a shape broadcastable against s
    for (auto& d : s)
      if (rnd(0, 2) == 0) d = 1;
    if (s.size() > 1 && rnd(0, 2) == 0) s.erase(s.begin());
    return s;
  };
  auto maybe_t = [](const Tensor& t) { return t.dim() >= 2 ? t.transpose(0, t.dim() - 1) : t; };
  auto rev = [](std::vector<int64_t> s) {
    std::reverse(s.begin(), s.end());
    return s;
  };
  for (int trial = 0; trial < 12; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    auto s = shape();
    auto p = partner(s);
    // Inputs are stored reversed so that maybe_t (a transposition) yields shape s, strided.
    std::vector<int64_t> sr = s.size() >= 2 ? rev(s) : s;
    gradcheck("unary_chain", [&](const V& v) { return maybe_t(v[0]).tanh().exp().sigmoid() * maybe_t(v[0]).sin(); },
              {R(sr)});
    gradcheck("log_sqrt", [&](const V& v) { return maybe_t(v[0]).log() + maybe_t(v[0]).sqrt(); }, {Pos(sr)});
    gradcheck("bcast_mul_div", [&](const V& v) { return maybe_t(v[0]) * v[1] / (v[1] * v[1] + 1); }, {R(sr), R(p)});
    gradcheck("bcast_max_pow", [&](const V& v) { return maximum(maybe_t(v[0]), v[1]) + pow(maybe_t(v[2]), v[1]); },
              {R(sr), R(p), Pos(sr)});
    int64_t d = rnd(0, static_cast<int>(s.size()) - 1);
    bool keep = rnd(0, 1) == 1;
    gradcheck("reductions",
              [&](const V& v) {
                Tensor x = maybe_t(v[0]);
                return x.sum({d}, keep) + x.mean({d}, keep) * 2 + x.amax({d}, keep) + x.logsumexp({d}, keep) +
                       x.prod({d}, keep);
              },
              {R(sr)});
    if (s[d] > 1) gradcheck("var", [&](const V& v) { return maybe_t(v[0]).var({d}, 1, keep); }, {R(sr)});
    gradcheck("softmax", [&](const V& v) { return softmax(maybe_t(v[0]), d) * v[1]; }, {R(sr), R(p)});
    int64_t k = rnd(1, 4), b = rnd(1, 3);
    gradcheck("batched_matmul", [&](const V& v) { return matmul(v[0], v[1].transpose(-2, -1)); },
              {R({b, s.back(), k}), R({s.back() + 1, k})});
  }
}

// kiln::checkpoint (torch.utils.checkpoint): the same gradients as the plain backward, for the
// inputs and for the parameters the function reads, with nothing of the block kept from the
// forward; dropout draws the same mask in the recomputation; nested; compiled; create_graph refused.
namespace {
struct Block {
  Tensor w1 = randn({4, 8}, kFloat64).requires_grad_(true), b1 = randn({8}, kFloat64).requires_grad_(true),
         w2 = randn({8, 3}, kFloat64).requires_grad_(true);
  double p = 0;  // dropout probability
  Tensor operator()(const Tensor& x) const {
    Tensor h = tanh(matmul(x, w1) + b1);
    if (p > 0) h = dropout(h, p, true);
    return matmul(h, w2);
  }
  V params() const { return {w1, b1, w2}; }
  void zero() {
    for (Tensor* t : {&w1, &b1, &w2}) t->set_grad(Tensor());
  }
};

// The gradients of x and the block's parameters of sum(f(x)^2), through `f`.
V grads_of(Block& blk, const Tensor& x, const std::function<Tensor(const Tensor&)>& f) {
  blk.zero();
  Tensor xl = x.detach().requires_grad_(true);
  sum(square(f(xl))).backward();
  V out = {xl.grad()};
  for (const Tensor& p : blk.params()) out.push_back(p.grad());
  return out;
}
}  // namespace

TEST(Checkpoint, GradientsEqualThePlainBackward) {
  manual_seed(kiln::testing::test_seed(31));
  Block blk;
  Tensor x = randn({5, 4}, kFloat64);
  V plain = grads_of(blk, x, [&](const Tensor& a) { return blk(a); });
  V ck = grads_of(blk, x, [&](const Tensor& a) {
    return checkpoint([&](const V& in) { return blk(in[0]); }, {a});
  });
  ASSERT_EQ(plain.size(), ck.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(ck[i].defined());
    expect_close(ck[i], plain[i], 1e-12, 1e-12);
  }
  // Nested: a checkpoint inside a checkpoint.
  V nested = grads_of(blk, x, [&](const Tensor& a) {
    return checkpoint([&](const V& in) { return checkpoint([&](const V& i2) { return blk(i2[0]); }, {in[0]}); }, {a});
  });
  for (size_t i = 0; i < plain.size(); ++i) expect_close(nested[i], plain[i], 1e-12, 1e-12);
}

TEST(Checkpoint, ParametersGetGradientsWhenTheInputNeedsNone) {
  manual_seed(kiln::testing::test_seed(32));
  Block blk;
  Tensor x = randn({5, 4}, kFloat64);  // no gradient wanted
  blk.zero();
  sum(square(blk(x))).backward();
  V plain;
  for (const Tensor& p : blk.params()) plain.push_back(p.grad());
  blk.zero();
  sum(square(checkpoint([&](const V& in) { return blk(in[0]); }, {x}))).backward();
  for (size_t i = 0; i < plain.size(); ++i) expect_close(blk.params()[i].grad(), plain[i], 1e-12, 1e-12);
}

TEST(Checkpoint, DropoutDrawsTheSameMaskWhenRecomputed) {
  Block blk;
  blk.p = 0.5;
  Tensor x = randn({6, 4}, kFloat64);
  manual_seed(7);
  V plain = grads_of(blk, x, [&](const Tensor& a) { return blk(a); });
  manual_seed(7);
  V ck = grads_of(blk, x, [&](const Tensor& a) { return checkpoint([&](const V& in) { return blk(in[0]); }, {a}); });
  for (size_t i = 0; i < plain.size(); ++i) expect_close(ck[i], plain[i], 1e-12, 1e-12);
  // (and the generator goes on from where the forward left it)
  manual_seed(7);
  grads_of(blk, x, [&](const Tensor& a) { return blk(a); });
  const double after_plain = randn({1}, kFloat64).item<double>();
  manual_seed(7);
  grads_of(blk, x, [&](const Tensor& a) { return checkpoint([&](const V& in) { return blk(in[0]); }, {a}); });
  EXPECT_EQ(randn({1}, kFloat64).item<double>(), after_plain);
}

// An input written in place after the forward: the recomputation uses the value the forward saw
// (PyTorch's version check would refuse; kiln's nodes are immutable, so the forward's value is
// kept without a copy). The live handle gave the gradient at the written value.
TEST(Checkpoint, AnInputWrittenInPlaceAfterTheForwardIsNotSeen) {
  manual_seed(kiln::testing::test_seed(34));
  Tensor x = randn({6, 5}, kFloat64).requires_grad_(true);
  Tensor h = x * 1.0;
  Tensor y = checkpoint([](const V& in) { return sin(in[0]) * in[0]; }, {h});
  h.mul_(3.0);  // after the forward, before the backward
  sum(y).backward();
  Tensor want = cos(x.detach()) * x.detach() + sin(x.detach());  // d/dx (x sin x) at the forward's x
  expect_close(x.grad(), want, 1e-12, 1e-12);
}

// The backward called outside the autocast scope of the forward recomputes under that autocast
// (bfloat16 products), as the plain backward's saved values were made: the gradients equal the
// plain ones. Recomputed in float32 they differed by bfloat16's rounding (~1e-2).
TEST(Checkpoint, RecomputesUnderTheForwardsAutocast) {
  manual_seed(kiln::testing::test_seed(35));
  const Tensor w = randn({16, 16}), x0 = randn({8, 16});
  auto run = [&](bool ck) {
    Tensor x = x0.detach().requires_grad_(true), wl = w.detach().requires_grad_(true);
    auto blk = [&](const V& in) { return tanh(matmul(in[0], in[1])); };
    Tensor y;
    {
      autocast ac(DeviceType::CPU, kBFloat16);
      y = ck ? checkpoint(blk, {x, wl}) : blk({x, wl});
    }
    sum(y.to(kFloat32) * y.to(kFloat32)).backward();  // outside the autocast scope
    return std::make_pair(x.grad(), wl.grad());
  };
  auto [px, pw] = run(false);
  auto [cx, cw] = run(true);
  expect_close(cx, px, 1e-6, 1e-6);
  expect_close(cw, pw, 1e-6, 1e-6);
}

// The recomputation's dropout gets the generator positions its forward got: another thread drawing
// numbers meanwhile (between the forward's draws, or during the recomputation) neither shifts the
// recomputed mask (the gradient is the forward's mask, scaled) nor gets numbers the process's
// generator gave out before (the old checkpoint set it back and forth).
TEST(Checkpoint, RecomputationDoesNotRaceOtherThreadsDrawingNumbers) {
  manual_seed(kiln::testing::test_seed(36));
  std::atomic<bool> stop{false};
  std::vector<std::vector<double>> drawn;
  std::thread other([&] {
    while (!stop.load()) drawn.push_back(rand({64}, kFloat64).to_vector<double>());
  });
  int wrong = 0;
  for (int it = 0; it < 200; ++it) {
    Tensor x = (rand({256}, kFloat64) + 1.0).requires_grad_(true);
    Tensor y = checkpoint([](const V& in) { return dropout(in[0], 0.5, true); }, {x});
    sum(y).backward();
    // y = x * mask / 0.5 and dy/dx = mask / 0.5: their product with x is y itself.
    if ((x.grad() * x.detach()).to_vector<double>() != y.detach().to_vector<double>()) ++wrong;
  }
  stop = true;
  other.join();
  EXPECT_EQ(wrong, 0) << "recomputed masks differed from the forward's";
  std::set<std::vector<double>> seen;
  for (const auto& d : drawn) EXPECT_TRUE(seen.insert(d).second) << "another thread drew the same numbers twice";
}

TEST(Checkpoint, CompiledEqualsEagerAndDoubleBackwardIsRefused) {
  manual_seed(kiln::testing::test_seed(33));
  Block blk;
  Tensor x = randn({5, 4}, kFloat64).requires_grad_(true);
  // Double backward through the block is refused, not silently missing terms.
  Tensor y = checkpoint([&](const V& in) { return blk(in[0]); }, {x});
  try {
    grad({sum(square(y))}, {x}, {}, true, true);
    ADD_FAILURE() << "create_graph through a checkpoint was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("create_graph"), std::string::npos) << e.what();
  }
  // Compiled: the recomputation is traced into the backward; equal to eager.
  auto step = [&](const Tensor& a) {
    blk.zero();
    Tensor loss = sum(square(checkpoint([&](const V& in) { return blk(in[0]); }, {a})));
    loss.backward();
    return blk.w1.grad().detach();
  };
  auto compiled = kiln::compile(step);
  for (int64_t batch : {5, 7, 5}) {
    Tensor a = randn({batch, 4}, kFloat64);
    Tensor e = step(a), c = compiled(a);
    expect_close(c, e, 1e-12, 1e-12);
  }
}
