// nn modules, initializers, state-dict files, optimizers (parity with PyTorch's formulas) and schedulers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "kiln.h"

using namespace kiln;

namespace {
struct Net : nn::Module {
  std::shared_ptr<nn::Linear> l1, l2;
  std::shared_ptr<nn::Dropout> drop;
  Net() {
    l1 = register_module("l1", std::make_shared<nn::Linear>(4, 8));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.5));
    l2 = register_module("l2", std::make_shared<nn::Linear>(8, 2));
    register_buffer("steps", zeros({1}, kInt64));
  }
  Tensor forward(const Tensor& x) override { return l2->forward(drop->forward(l1->forward(x).tanh())); }
};

std::string tmpfile(const char* name) { return ::testing::TempDir() + name; }

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }
}  // namespace

TEST(Module, ParametersBuffersModes) {
  Net net;
  auto names = net.named_parameters();
  ASSERT_EQ(names.size(), 4u);
  EXPECT_EQ(names[0].first, "l1.weight");
  EXPECT_EQ(names[3].first, "l2.bias");
  EXPECT_EQ(net.named_buffers()[0].first, "steps");
  EXPECT_TRUE(net.l1->weight.requires_grad());
  EXPECT_EQ(net.l1->weight.sizes(), (std::vector<int64_t>{8, 4}));
  net.eval();
  EXPECT_FALSE(net.drop->is_training());
  Tensor x = randn({3, 4});
  EXPECT_EQ(values(net(x)), values(net(x)));  // deterministic in eval mode
  net.train();
  Tensor loss = net(x).square().sum();
  loss.backward();
  EXPECT_TRUE(net.l1->weight.grad().defined());
  net.zero_grad();
  EXPECT_FALSE(net.l1->weight.grad().defined());
  auto seq = nn::Sequential({std::make_shared<nn::Linear>(3, 5), std::make_shared<nn::ReLU>(),
                             std::make_shared<nn::Linear>(5, 1), std::make_shared<nn::Tanh>()});
  EXPECT_EQ(seq(randn({7, 3})).sizes(), (std::vector<int64_t>{7, 1}));
  EXPECT_EQ(seq.named_parameters()[2].first, "2.weight");
  nn::Conv2d conv(3, 6, {3}, {1, 1}, {1, 1});
  EXPECT_EQ(conv(randn({2, 3, 8, 8})).sizes(), (std::vector<int64_t>{2, 6, 8, 8}));
  nn::Embedding emb(10, 4);
  EXPECT_EQ(emb(from_vector<int64_t>({1, 2, 3})).sizes(), (std::vector<int64_t>{3, 4}));
  nn::LayerNorm ln({4});
  Tensor y = ln(randn({5, 4}));
  EXPECT_LT(y.mean({1}).abs().amax().item<float>(), 1e-5f);
  EXPECT_THROW(nn::Module().forward(x), Error);
}

TEST(StateDict, RoundTripThroughFile) {
  manual_seed(1);
  Net a;
  manual_seed(2);
  Net b;
  std::string path = tmpfile("kiln_sd_roundtrip.bin");
  a.save(path);
  EXPECT_NE(values(a.l1->weight), values(b.l1->weight));
  b.load(path);
  EXPECT_EQ(values(a.l1->weight), values(b.l1->weight));
  EXPECT_EQ(values(a.l2->bias), values(b.l2->bias));
  EXPECT_TRUE(b.l1->weight.requires_grad() && b.l1->weight.is_leaf());
  std::remove(path.c_str());
}

TEST(StateDict, BadFilesThrowAndLeaveModuleUnchanged) {
  Net a, b;
  std::string path = tmpfile("kiln_sd_bad.bin");
  a.save(path);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto write = [&](const std::string& s) { std::ofstream(path, std::ios::binary | std::ios::trunc) << s; };
  const auto before = values(b.l1->weight);
  // Truncated.
  write(bytes.substr(0, bytes.size() / 2));
  EXPECT_THROW(b.load(path), Error);
  // Corrupted: one byte of tensor data flipped.
  std::string bad = bytes;
  bad[bad.size() / 2] ^= 0x5a;
  write(bad);
  EXPECT_THROW(b.load(path), Error);
  // Not a state dict.
  write("hello");
  EXPECT_THROW(b.load(path), Error);
  // Valid file but a different architecture.
  nn::Linear other(4, 3);
  other.save(path);
  EXPECT_THROW(b.load(path), Error);
  // Mismatched shape for a known name.
  auto sd = a.state_dict();
  sd["l1.weight"] = zeros({2, 2});
  EXPECT_THROW(b.load_state_dict(sd), Error);
  EXPECT_EQ(values(b.l1->weight), before);  // untouched by every failure
  EXPECT_THROW(nn::load_state_dict_file(tmpfile("does_not_exist.bin")), Error);
  std::remove(path.c_str());
}

TEST(Init, Distributions) {
  manual_seed(4);
  Tensor w = zeros({256, 128});
  nn::kaiming_uniform_(w, 0, "fan_in", "relu");
  double bound = std::sqrt(6.0 / 128);
  EXPECT_LE(w.abs().amax().item<float>(), bound + 1e-6);
  EXPECT_NEAR(w.std().item<double>(), bound / std::sqrt(3.0), 0.01);
  nn::xavier_normal_(w);
  EXPECT_NEAR(w.std().item<double>(), std::sqrt(2.0 / 384), 0.003);
  nn::kaiming_normal_(w, 0, "fan_out", "relu");
  EXPECT_NEAR(w.std().item<double>(), std::sqrt(2.0 / 256), 0.003);
  for (auto shape : {std::vector<int64_t>{6, 4}, std::vector<int64_t>{4, 6}}) {
    Tensor q = zeros(shape);
    nn::orthogonal_(q, 2.0);
    Tensor gram = shape[0] < shape[1] ? matmul(q, q.t()) : matmul(q.t(), q);
    int64_t k = std::min(shape[0], shape[1]);
    EXPECT_LT((gram - eye(k) * 4).abs().amax().item<float>(), 1e-5f);
  }
  EXPECT_NEAR(nn::calculate_gain("tanh"), 5.0 / 3, 1e-12);
}

namespace {
// A fixed problem: loss = sum((W x - y)^2) + 0.1 * sum(W^3) with W [2, 3].
const std::vector<double> kW0 = {0.5, -0.3, 0.8, 0.1, 0.9, -0.6};
const std::vector<double> kX = {1.0, -2.0, 0.5};
const std::vector<double> kY = {0.3, -0.7};

std::vector<double> ref_grad(const std::vector<double>& w) {
  std::vector<double> g(6);
  for (int i = 0; i < 2; ++i) {
    double r = -kY[i];
    for (int j = 0; j < 3; ++j) r += w[i * 3 + j] * kX[j];
    for (int j = 0; j < 3; ++j) g[i * 3 + j] = 2 * r * kX[j] + 0.3 * w[i * 3 + j] * w[i * 3 + j];
  }
  return g;
}

Tensor kiln_loss(const Tensor& w) {
  Tensor x = from_vector(kX), y = from_vector(kY);
  return (matmul(w, x) - y).square().sum() + 0.1 * w.pow(3).sum();
}

template <class MakeOpt, class RefStep>
void run_parity(MakeOpt make, RefStep ref_step) {
  Tensor w = from_vector(kW0, std::vector<int64_t>{2, 3}).requires_grad_();
  std::unique_ptr<optim::Optimizer> opt = make(std::vector<Tensor>{w});
  std::vector<double> rw = kW0;
  for (int step = 1; step <= 10; ++step) {
    opt->zero_grad();
    kiln_loss(w).backward();
    opt->step();
    ref_step(rw, ref_grad(rw), step);
    auto got = w.to_vector<double>();
    for (int i = 0; i < 6; ++i) ASSERT_NEAR(got[i], rw[i], 1e-6) << "step " << step << " element " << i;
  }
}
}  // namespace

TEST(Optim, SGDMomentumMatchesPyTorchFormulas) {
  for (bool nesterov : {false, true}) {
    std::vector<double> buf(6);
    run_parity(
        [&](std::vector<Tensor> p) -> std::unique_ptr<optim::Optimizer> {
          return std::make_unique<optim::SGD>(
              p, optim::SGDOptions{
                     .lr = 0.05, .momentum = 0.9, .dampening = 0, .weight_decay = 0.01, .nesterov = nesterov});
        },
        [&](std::vector<double>& w, std::vector<double> g, int step) {
          for (int i = 0; i < 6; ++i) {
            g[i] += 0.01 * w[i];
            buf[i] = step == 1 ? g[i] : 0.9 * buf[i] + g[i];
            double d = nesterov ? g[i] + 0.9 * buf[i] : buf[i];
            w[i] -= 0.05 * d;
          }
        });
  }
}

TEST(Optim, AdamAndAdamWMatchPyTorchFormulas) {
  for (bool decoupled : {false, true}) {
    std::vector<double> m(6), v(6);
    const double lr = 0.02, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.05;
    run_parity(
        [&](std::vector<Tensor> p) -> std::unique_ptr<optim::Optimizer> {
          optim::AdamOptions o{lr, b1, b2, eps, wd};
          if (decoupled) return std::make_unique<optim::AdamW>(p, o);
          return std::make_unique<optim::Adam>(p, o);
        },
        [&](std::vector<double>& w, std::vector<double> g, int t) {
          for (int i = 0; i < 6; ++i) {
            if (decoupled)
              w[i] *= 1 - lr * wd;
            else
              g[i] += wd * w[i];
            m[i] = b1 * m[i] + (1 - b1) * g[i];
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
            double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
            w[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
          }
        });
  }
}

TEST(Optim, ClipGradNormAndSchedulers) {
  Tensor a = from_vector<float>({3, 0}).requires_grad_(), b = from_vector<float>({0, 4}).requires_grad_();
  (a * from_vector<float>({1, 1})).sum().backward();  // grad a = [1, 1]
  a.set_grad(from_vector<float>({3, 0}));
  b.set_grad(from_vector<float>({0, 4}));
  Tensor total = optim::clip_grad_norm_({a, b}, 1.0);
  EXPECT_NEAR(total.item<float>(), 5.f, 1e-6);
  EXPECT_NEAR(a.grad()[0].item<float>(), 0.6f, 1e-5);
  EXPECT_NEAR(b.grad()[1].item<float>(), 0.8f, 1e-5);
  optim::SGD opt({a}, {.lr = 1.0});
  optim::StepLR step(opt, 2, 0.5);
  step.step();
  EXPECT_DOUBLE_EQ(opt.lr(), 1.0);
  step.step();
  EXPECT_DOUBLE_EQ(opt.lr(), 0.5);
  optim::SGD opt2({b}, {.lr = 1.0});
  optim::CosineAnnealingLR cos(opt2, 4, 0.1);
  cos.step();
  cos.step();
  EXPECT_NEAR(opt2.lr(), 0.55, 1e-12);
  cos.step();
  cos.step();
  EXPECT_NEAR(opt2.lr(), 0.1, 1e-12);
  EXPECT_THROW(optim::SGD({ones({2})}, {}), Error);  // not a trainable leaf
}

TEST(Optim, TrainingReducesLoss) {
  manual_seed(9);
  nn::Sequential net(
      {std::make_shared<nn::Linear>(2, 16), std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(16, 1)});
  optim::Adam opt(net.parameters(), {.lr = 0.01});
  Tensor x = randn({64, 2});
  Tensor y = (x.select(1, 0) * x.select(1, 1)).unsqueeze(1);
  double first = 0, last = 0;
  for (int i = 0; i < 300; ++i) {
    opt.zero_grad();
    Tensor loss = mse_loss(net(x), y);
    loss.backward();
    opt.step();
    if (i == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  EXPECT_LT(last, first * 0.2);
}
