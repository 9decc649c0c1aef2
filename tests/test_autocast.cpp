// kiln::autocast and optim::GradScaler: result dtypes against PyTorch's autocast (the corpus
// tests/parity/autocast_parity.jsonl, generated with torch 2.11 by make_autocast_parity.py on the
// GPU machine), values against float32, the backward outside autocast, compile()'s guards, and
// dynamic loss scaling. Device rows run on KILN_TEST_DEVICE when it is CUDA (the GPU machine,
// or fake-cuda here); CPU rows always.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "kiln.h"
#include "tests/expect_close.h"
#include "tests/test_seed.h"
#include "tests/source_dir.h"

using namespace kiln;
using kiln::testing::test_device;
using kiln::testing::test_seed;

namespace {

std::filesystem::path corpus() {
  return kiln::testing::source_path("tests/parity/autocast_parity.jsonl");
}

DType dtype_of(const std::string& name) {
  static const std::map<std::string, DType> m = {
      {"float32", kFloat32}, {"bfloat16", kBFloat16}, {"float16", kFloat16}, {"float64", kFloat64}};
  return m.at(name);
}

// The kiln call for each op of the corpus (its float tensor inputs in order, as the generator
// passes them: [8, 8] values in [0.5, 1.5)).
using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;
const std::map<std::string, OpFn>& ops() {
  static const std::map<std::string, OpFn> m = {
      {"matmul", [](auto& t) { return matmul(t[0], t[1]); }},
      {"mm", [](auto& t) { return mm(t[0], t[1]); }},
      {"bmm", [](auto& t) { return bmm(t[0].unsqueeze(0), t[1].unsqueeze(0)); }},
      {"linear", [](auto& t) { return linear(t[0], t[1], t[2][0]); }},
      {"scaled_dot_product_attention",
       [](auto& t) {
         return scaled_dot_product_attention(t[0].unsqueeze(0).unsqueeze(0), t[1].unsqueeze(0).unsqueeze(0),
                                             t[2].unsqueeze(0).unsqueeze(0));
       }},
      {"conv2d",
       [](auto& t) {
         return conv2d(t[0].unsqueeze(0).unsqueeze(0), t[1].unsqueeze(0).unsqueeze(0).narrow(2, 0, 3).narrow(3, 0, 3));
       }},
      {"softmax", [](auto& t) { return softmax(t[0], -1); }},
      {"log_softmax", [](auto& t) { return log_softmax(t[0], -1); }},
      {"layer_norm", [](auto& t) { return layer_norm(t[0], {8}, t[1][0], t[2][0]); }},
      {"exp", [](auto& t) { return exp(t[0]); }},
      {"log", [](auto& t) { return log(t[0]); }},
      {"pow", [](auto& t) { return pow(t[0], 2.5); }},
      {"rsqrt", [](auto& t) { return rsqrt(t[0]); }},
      {"sum", [](auto& t) { return sum(t[0]); }},
      {"prod", [](auto& t) { return prod(t[0], {0}); }},
      {"cumsum", [](auto& t) { return cumsum(t[0], 0); }},
      {"mse_loss", [](auto& t) { return mse_loss(t[0], t[1]); }},
      {"cross_entropy", [](auto& t) { return cross_entropy(t[0], arange(int64_t{0}, int64_t{8}).to(t[0].device())); }},
      {"norm", [](auto& t) { return norm(t[0]); }},
      {"add", [](auto& t) { return t[0] + t[1]; }},
      {"mul", [](auto& t) { return t[0] * t[1]; }},
      {"relu", [](auto& t) { return relu(t[0]); }},
      {"gelu", [](auto& t) { return gelu(t[0]); }},
      {"tanh", [](auto& t) { return tanh(t[0]); }},
      {"mean", [](auto& t) { return t[0].mean(); }},
      {"cat",
       [](auto& t) {
         return cat({t[0], t[1]});
       }},
      {"stack",
       [](auto& t) {
         return stack({t[0], t[1]});
       }},
      {"where", [](auto& t) { return where(t[0] > 1.0, t[0], t[1]); }},
      {"embedding", [](auto& t) { return embedding(arange(int64_t{0}, int64_t{8}).to(t[0].device()), t[0]); }},
  };
  return m;
}
// Ops of the corpus kiln has no function for (each named, so a new op in the corpus fails).
const std::set<std::string> kNotInKiln = {"baddbmm", "addmm", "nll_loss"};

}  // namespace

TEST(Autocast, ResultDtypesMatchPyTorch) {
  std::ifstream in(corpus());
  ASSERT_TRUE(in) << "missing " << corpus();
  const Device dev = test_device();
  int checked = 0, rows = 0;
  std::string line;
  while (std::getline(in, line)) {
    const auto r = nlohmann::json::parse(line);
    ++rows;
    const std::string device = r["device"], op = r["op"];
    if (kNotInKiln.count(op)) continue;
    ASSERT_TRUE(ops().count(op)) << "no kiln call for corpus op " << op;
    Device on = cpu();
    if (device == "cuda") {
      if (dev.type != DeviceType::CUDA) continue;
      on = dev;
    }
    std::vector<Tensor> xs;
    for (const auto& d : r["inputs"]) xs.push_back((rand({8, 8}) + 0.5).to(dtype_of(d)).to(on));
    const DType ac = dtype_of(r["autocast"]);
    Tensor out;
    {
      kiln::autocast guard(on.type, ac);
      out = ops().at(op)(xs);
    }
    EXPECT_EQ(dtype_name(out.dtype()), std::string(r["out"]))
        << op << " on " << device << " under autocast(" << r["autocast"] << ") with inputs " << r["inputs"].dump();
    ++checked;
  }
  EXPECT_GT(rows, 300);
  EXPECT_GE(checked, dev.type == DeviceType::CUDA ? 250 : 120);
}

// GEMMs in bfloat16 agree with float32 to bfloat16's precision; the result is bfloat16 and the
// float32 parameters' gradients come back in float32.
TEST(Autocast, LinearMatchesFloat32AndGradientsKeepTheirDtype) {
  const Device dev = test_device();
  manual_seed(test_seed(5));
  Tensor x = randn({16, 64}).to(dev), w = (randn({32, 64}) * 0.1).to(dev), b = randn({32}).to(dev);
  w.requires_grad_(true);
  b.requires_grad_(true);
  Tensor want = tanh(linear(x, w, b)).sum();
  want.backward();
  const Tensor gw = w.grad().detach(), gb = b.grad().detach();
  w.set_grad(Tensor());
  b.set_grad(Tensor());
  Tensor y;
  {
    kiln::autocast guard(dev.type, kBFloat16);
    y = linear(x, w, b);
    EXPECT_EQ(y.dtype(), kBFloat16);
    y = tanh(y).sum();
  }
  y.backward();  // outside the guard, as PyTorch recommends
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  EXPECT_EQ(b.grad().dtype(), kFloat32);
  expect_close(y.to(kFloat32), want, 0.05, 0.05);
  expect_close(w.grad(), gw, 0.05, 0.05);
  expect_close(b.grad(), gb, 0.05, 0.05);
}

// A backward called inside the guard runs without autocast: the same gradients as outside.
TEST(Autocast, BackwardInsideTheGuardIsNotAutocast) {
  const Device dev = test_device();
  manual_seed(test_seed(6));
  Tensor x = randn({8, 16}).to(dev), w = randn({16, 16}).to(dev);
  w.requires_grad_(true);
  std::vector<float> outside, inside;
  {
    Tensor loss;
    {
      kiln::autocast guard(dev.type, kBFloat16);
      loss = softmax(matmul(x, w), -1).sum();
    }
    loss.backward();
    outside = w.grad().to_vector<float>();
  }
  w.set_grad(Tensor());
  {
    kiln::autocast guard(dev.type, kBFloat16);
    Tensor loss = softmax(matmul(x, w), -1).sum();
    loss.backward();
    EXPECT_EQ(w.grad().dtype(), kFloat32);
    inside = w.grad().to_vector<float>();
  }
  EXPECT_EQ(inside, outside);
}

TEST(Autocast, GuardsNestAndRestore) {
  EXPECT_FALSE(is_autocast_enabled(DeviceType::CPU));
  {
    kiln::autocast a(DeviceType::CPU, kBFloat16);
    EXPECT_TRUE(is_autocast_enabled(DeviceType::CPU));
    EXPECT_FALSE(is_autocast_enabled(DeviceType::CUDA));
    {
      kiln::autocast b(DeviceType::CPU, kFloat16, false);
      EXPECT_FALSE(is_autocast_enabled(DeviceType::CPU));
      EXPECT_EQ(matmul(ones({2, 2}), ones({2, 2})).dtype(), kFloat32);
    }
    EXPECT_TRUE(is_autocast_enabled(DeviceType::CPU));
    EXPECT_EQ(get_autocast_dtype(DeviceType::CPU), kBFloat16);
    // float64 and integer inputs are never cast.
    EXPECT_EQ(matmul(ones({2, 2}, kFloat64), ones({2, 2}, kFloat64)).dtype(), kFloat64);
    EXPECT_EQ(matmul(ones({2, 2}, kInt64), ones({2, 2}, kInt64)).dtype(), kInt64);
  }
  EXPECT_FALSE(is_autocast_enabled(DeviceType::CPU));
  EXPECT_EQ(get_autocast_dtype(DeviceType::CUDA), kFloat16);
  EXPECT_THROW(kiln::autocast(DeviceType::CPU, kFloat32), Error);
  EXPECT_THROW(kiln::autocast(DeviceType::CUDA, kInt32), Error);
}

// compile(): the autocast state is guarded; each state gets its entry, giving eager's values.
TEST(Autocast, CompileGuardsTheAutocastState) {
  const Device dev = test_device();
  manual_seed(test_seed(7));
  Tensor x = randn({8, 32}).to(dev), w = randn({32, 32}).to(dev);
  auto fn = [](const Tensor& a, const Tensor& b) { return log_softmax(matmul(a, b), -1); };
  auto f = compile(fn);
  Tensor plain = f(x, w);
  EXPECT_EQ(plain.dtype(), kFloat32);
  Tensor lowered, eager;
  {
    kiln::autocast guard(dev.type, kBFloat16);
    lowered = f(x, w);
    eager = fn(x, w);
    f(x, w);
  }
  EXPECT_EQ(lowered.dtype(), eager.dtype());
  expect_close(lowered, eager, 1e-5, 1e-5);
  EXPECT_EQ(f.stats().entries, 2);
  EXPECT_NE(f.stats().last_miss.find("autocast"), std::string::npos) << f.stats().last_miss;
  expect_close(f(x, w), plain, 0, 0);
}

// A small MLP trained with its forward under autocast (bfloat16) ends near the float32 run.
TEST(Autocast, Bfloat16TrainingReachesTheFloat32Loss) {
  const Device dev = test_device();
  auto train = [&](bool mixed) {
    manual_seed(11);
    auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(16, 64), std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(64, 4)});
    net->to(dev);
    optim::AdamW opt(net->parameters(), {.lr = 1e-2});
    Tensor x = randn({128, 16}).to(dev);
    Tensor y = (x.narrow(1, 0, 4) * 0.5).tanh();
    double loss_v = 0;
    for (int step = 0; step < 60; ++step) {
      opt.zero_grad();
      Tensor loss;
      {
        kiln::autocast guard(dev.type, kBFloat16, mixed);
        loss = mse_loss(net->forward(x), y);
      }
      EXPECT_EQ(loss.dtype(), kFloat32);
      loss.backward();
      opt.step();
      loss_v = loss.item<double>();
    }
    return loss_v;
  };
  const double fp32 = train(false), bf16 = train(true);
  EXPECT_LT(fp32, 0.02);
  EXPECT_NEAR(bf16, fp32, 0.1 * fp32 + 2e-3);
}

// GradScaler: a scaled float16 step that overflows is skipped and halves the scale; clean steps
// update like the unscaled optimizer and grow the scale after growth_interval of them.
TEST(GradScaler, SkipsOverflowsAndAdjustsTheScale) {
  Tensor w = ones({4});
  w.requires_grad_(true);
  optim::SGD opt({w}, {.lr = 0.1});
  optim::GradScaler scaler({.init_scale = 1024, .growth_interval = 2});
  auto step = [&](double v) {
    opt.zero_grad();
    Tensor loss = (w * v).sum();
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();
    return stepped;
  };
  EXPECT_TRUE(step(1.0));
  expect_close(w, full({4}, 0.9), 1e-6, 1e-6);  // the true gradient (1), not 1024
  EXPECT_EQ(scaler.get_scale(), 1024);
  EXPECT_TRUE(step(1.0));
  EXPECT_EQ(scaler.get_scale(), 2048);  // two clean steps: grown
  EXPECT_FALSE(step(std::numeric_limits<double>::infinity()));
  expect_close(w, full({4}, 0.8), 1e-6, 1e-6);  // unchanged by the skipped step
  EXPECT_EQ(scaler.get_scale(), 1024);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_FALSE(step(std::nan("")));
  EXPECT_EQ(scaler.get_scale(), 512);
  // unscale_ before step (to clip the true gradients) is not repeated by step.
  opt.zero_grad();
  scaler.scale((w * 2.0).sum()).backward();
  scaler.unscale_(opt);
  expect_close(w.grad(), full({4}, 2.0), 1e-6, 1e-6);
  EXPECT_THROW(scaler.unscale_(opt), Error);
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  expect_close(w, full({4}, 0.6), 1e-6, 1e-6);
  EXPECT_THROW(optim::GradScaler({.init_scale = -1}), Error);
  optim::GradScaler off({.enabled = false});
  EXPECT_EQ(off.scale(full({}, 3.0)).item<double>(), 3.0);
}
