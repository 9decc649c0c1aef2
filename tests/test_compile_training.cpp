// Training steps under kiln::compile whose batch size changes every call: the batch becomes a
// symbol after the first change and one more compile serves every later size; each step
// equals eager mode (loss, parameters, gradients).
#include <gtest/gtest.h>

#include <cmath>

#include "kiln.h"
#include "tests/expect_close.h"
#include "tests/training_step.h"

using namespace kiln;
using kiln::testing::copy_params;
using kiln::testing::mse_step;

namespace {

void expect_same_params(nn::Module& a, nn::Module& b, double rtol, double atol) {
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    expect_close(pa[i], pb[i], rtol, atol);
    if (pb[i].grad().defined()) expect_close(pa[i].grad(), pb[i].grad(), rtol, atol);
  }
}

struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> l1, l2, l3;
  Mlp() {
    l1 = register_module("l1", std::make_shared<nn::Linear>(6, 32));
    l2 = register_module("l2", std::make_shared<nn::Linear>(32, 32));
    l3 = register_module("l3", std::make_shared<nn::Linear>(32, 3));
  }
  Tensor forward(const Tensor& x) override { return l3->forward(l2->forward(l1->forward(x).relu()).tanh()); }
};

// One pre-norm transformer block: causal self-attention and a GELU MLP.
struct Block : nn::Module {
  int64_t d, heads;
  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  std::shared_ptr<nn::Linear> qkv, proj, fc, out;
  Block(int64_t d_model, int64_t n_heads) : d(d_model), heads(n_heads) {
    ln1 = register_module("ln1", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{d}));
    ln2 = register_module("ln2", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{d}));
    qkv = register_module("qkv", std::make_shared<nn::Linear>(d, 3 * d));
    proj = register_module("proj", std::make_shared<nn::Linear>(d, d));
    fc = register_module("fc", std::make_shared<nn::Linear>(d, 4 * d));
    out = register_module("out", std::make_shared<nn::Linear>(4 * d, d));
  }
  Tensor forward(const Tensor& x) override {
    // x [B, T, d]; heads split with views whose batch size stays symbolic (-1).
    const Shape& s = x.shape();
    std::vector<Tensor> qkvs = qkv->forward(ln1->forward(x)).chunk(3, -1);
    auto split_heads = [&](const Tensor& t) {
      return t.reshape({-1, s[1].as_int(), heads, d / heads}).transpose(1, 2);
    };
    Tensor att = scaled_dot_product_attention(split_heads(qkvs[0]), split_heads(qkvs[1]), split_heads(qkvs[2]),
                                              std::nullopt, true);
    Tensor y = x + proj->forward(att.transpose(1, 2).reshape({-1, s[1].as_int(), d}));
    return y + out->forward(gelu(fc->forward(ln2->forward(y))));
  }
};

struct TinyGpt : nn::Module {
  std::shared_ptr<nn::Embedding> tok;
  std::shared_ptr<Block> b1, b2;
  std::shared_ptr<nn::LayerNorm> lnf;
  std::shared_ptr<nn::Linear> head;
  TinyGpt(int64_t vocab, int64_t d) {
    tok = register_module("tok", std::make_shared<nn::Embedding>(vocab, d));
    b1 = register_module("b1", std::make_shared<Block>(d, 2));
    b2 = register_module("b2", std::make_shared<Block>(d, 2));
    lnf = register_module("lnf", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{d}));
    head = register_module("head", std::make_shared<nn::Linear>(d, vocab));
  }
  Tensor forward(const Tensor& idx) override {
    return head->forward(lnf->forward(b2->forward(b1->forward(tok->forward(idx)))));
  }
};

}  // namespace

TEST(CompileTraining, MlpMseAdamOverTwelveBatchSizesCompilesTwice) {
  manual_seed(11);
  Mlp eager_net, comp_net;
  copy_params(eager_net, comp_net);
  optim::Adam opt_e(eager_net.parameters(), {.lr = 1e-2}), opt_c(comp_net.parameters(), {.lr = 1e-2});
  auto f = compile([&](const Tensor& x, const Tensor& y) { return mse_step(comp_net, opt_c, x, y); });
  for (int64_t b = 10; b <= 21; ++b) {
    Tensor x = randn({b, 6}), y = randn({b, 3});
    Tensor lc = f(x, y);
    Tensor le = mse_step(eager_net, opt_e, x, y);
    expect_close(lc, le, 1e-4, 1e-6);
    expect_same_params(comp_net, eager_net, 1e-4, 1e-6);
  }
  EXPECT_LE(f.stats().entries, 2) << f.stats().last_miss;
  EXPECT_EQ(f.stats().eager_calls, 0);
}

TEST(CompileTraining, TwoLayerTransformerOverFourBatchSizesCompilesTwice) {
  manual_seed(12);
  const int64_t vocab = 17, d = 16, T = 8;
  TinyGpt eager_net(vocab, d), comp_net(vocab, d);
  copy_params(eager_net, comp_net);
  optim::AdamW opt_e(eager_net.parameters(), {.lr = 3e-3}), opt_c(comp_net.parameters(), {.lr = 3e-3});
  auto step = [&](TinyGpt& net, optim::Optimizer& opt, const Tensor& idx, const Tensor& tgt) {
    opt.zero_grad();
    Tensor logits = net(idx);
    Tensor loss = cross_entropy(logits.reshape({-1, vocab}), tgt.reshape({-1}));
    loss.backward();
    optim::clip_grad_norm_(net.parameters(), 1.0);
    opt.step();
    return loss.detach();
  };
  auto f = compile([&](const Tensor& idx, const Tensor& tgt) { return step(comp_net, opt_c, idx, tgt); });
  for (int64_t b : {3, 5, 4, 7, 6}) {
    Tensor idx = randint(0, vocab, {b, T}), tgt = randint(0, vocab, {b, T});
    Tensor lc = f(idx, tgt);
    Tensor le = step(eager_net, opt_e, idx, tgt);
    expect_close(lc, le, 1e-4, 1e-5);
    expect_same_params(comp_net, eager_net, 1e-3, 1e-5);
  }
  EXPECT_LE(f.stats().entries, 2) << f.stats().last_miss;
  EXPECT_EQ(f.stats().eager_calls, 0);
}
