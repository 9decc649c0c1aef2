// Optimizer parameter groups (PyTorch's formulas per group, options read/modified through
// param_groups(), per-group lr seen by a compiled step, schedulers per group) and
// nn::ModuleList / nn::ModuleDict.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "expect_close.h"
#include "kiln.h"
#include "training_step.h"

using namespace kiln;

namespace {

// Loss with an elementwise gradient: sum(a*w + b*w^2/2 + c*w^3/3), grad = a + b*w + c*w^2.
const std::vector<double> kA = {0.3, -0.7, 1.1, 0.25, -0.4, 0.9}, kB = {1.2, 0.8, 0.5, 1.5, 0.9, 0.6};
const double kC = 0.2;

Tensor loss_of(const Tensor& w, size_t off) {
  std::vector<double> a(kA.begin() + off, kA.begin() + off + w.numel()),
      b(kB.begin() + off, kB.begin() + off + w.numel());
  Tensor ta = from_vector(a, w.sizes()), tb = from_vector(b, w.sizes());
  return (ta * w + tb * w.square() / 2 + kC * w.pow(3) / 3).sum();
}
std::vector<double> grad_of(const std::vector<double>& w, size_t off) {
  std::vector<double> g(w.size());
  for (size_t i = 0; i < w.size(); ++i) g[i] = kA[off + i] + kB[off + i] * w[i] + kC * w[i] * w[i];
  return g;
}

// A weight [2, 2] (offset 0) and a bias [2] (offset 4), float64 trainable leaves.
struct TwoParams {
  Tensor w = from_vector(std::vector<double>{0.5, -0.3, 0.8, 0.1}, std::vector<int64_t>{2, 2}).requires_grad_();
  Tensor b = from_vector(std::vector<double>{-0.2, 0.4}).requires_grad_();
  std::vector<double> rw = w.to_vector<double>(), rb = b.to_vector<double>();
  void backward() { (loss_of(w, 0) + loss_of(b, 4)).backward(); }
  void expect_matches(int step) {
    auto gw = w.to_vector<double>(), gb = b.to_vector<double>();
    for (size_t i = 0; i < gw.size(); ++i)
      ASSERT_NEAR(gw[i], rw[i], 1e-13 + 1e-12 * std::abs(rw[i])) << "step " << step;
    for (size_t i = 0; i < gb.size(); ++i)
      ASSERT_NEAR(gb[i], rb[i], 1e-13 + 1e-12 * std::abs(rb[i])) << "step " << step;
  }
};

// PyTorch's Adam/AdamW for one parameter (torch.optim.Adam/AdamW, foreach=False, amsgrad=False).
struct RefAdam {
  double lr, b1, b2, eps, wd;
  bool decoupled;
  std::vector<double> m, v;
  void step(std::vector<double>& w, std::vector<double> g, int t) {
    m.resize(w.size());
    v.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      if (wd != 0) {
        if (decoupled)
          w[i] *= 1 - lr * wd;
        else
          g[i] += wd * w[i];
      }
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      w[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
    }
  }
};

// PyTorch's SGD for one parameter.
struct RefSGD {
  double lr, momentum, dampening, wd;
  bool nesterov;
  std::vector<double> buf;
  void step(std::vector<double>& w, std::vector<double> g) {
    for (size_t i = 0; i < w.size(); ++i) {
      if (wd != 0) g[i] += wd * w[i];
      if (momentum != 0) {
        if (buf.size() < w.size())
          buf.push_back(g[i]);
        else
          buf[i] = momentum * buf[i] + (1 - dampening) * g[i];
        g[i] = nesterov ? g[i] + momentum * buf[i] : buf[i];
      }
      w[i] -= lr * g[i];
    }
  }
};

}  // namespace

TEST(ParamGroups, AdamAndAdamWTwoGroupsMatchPyTorchFormulas) {
  for (bool decoupled : {false, true}) {
    TwoParams p;
    optim::AdamOptions defaults{.lr = 0.02, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8};
    std::vector<optim::AdamParamGroup> groups = {{{p.w}, {.weight_decay = 0.1}},
                                                 {{p.b}, {.lr = 0.05, .beta1 = 0.8, .weight_decay = 0.0}}};
    std::unique_ptr<optim::Optimizer> opt;
    if (decoupled)
      opt = std::make_unique<optim::AdamW>(groups, defaults);
    else
      opt = std::make_unique<optim::Adam>(groups, defaults);
    RefAdam rw{0.02, 0.9, 0.99, 1e-8, 0.1, decoupled}, rb{0.05, 0.8, 0.99, 1e-8, 0.0, decoupled};
    ASSERT_EQ(opt->param_groups().size(), 2u);
    EXPECT_DOUBLE_EQ(opt->param_groups()[1].get("beta1"), 0.8);
    EXPECT_DOUBLE_EQ(opt->param_groups()[1].get("beta2"), 0.99);
    for (int t = 1; t <= 12; ++t) {
      if (t == 7) {  // options modified mid-training through param_groups()
        opt->param_groups()[0].set("beta2", 0.95);
        opt->param_groups()[1].set("weight_decay", 0.3);
        opt->set_lr(1, 0.01);
        rw.b2 = 0.95;
        rb.wd = 0.3;
        rb.lr = 0.01;
      }
      opt->zero_grad();
      p.backward();
      opt->step();
      rw.step(p.rw, grad_of(p.rw, 0), t);
      rb.step(p.rb, grad_of(p.rb, 4), t);
      p.expect_matches(t);
    }
  }
}

TEST(ParamGroups, AdamWDefaultWeightDecayPerGroup) {
  TwoParams p;
  // Unset in the group and the defaults: AdamW's 1e-2; Adam's 0.
  optim::AdamW opt({{{p.w}}, {{p.b}, {.weight_decay = 0.0}}}, {.lr = 3e-4});
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].get("weight_decay"), 1e-2);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].get("weight_decay"), 0.0);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].lr(), 3e-4);
  TwoParams q;
  optim::Adam adam(std::vector<optim::AdamParamGroup>{{{q.w}}, {{q.b}}});
  EXPECT_DOUBLE_EQ(adam.param_groups()[0].get("weight_decay"), 0.0);
  EXPECT_DOUBLE_EQ(adam.lr(), 1e-3);
}

TEST(ParamGroups, SGDTwoGroupsMatchPyTorchFormulas) {
  for (bool nesterov : {false, true}) {
    TwoParams p;
    optim::SGD opt({{{p.w}, {.momentum = 0.9, .weight_decay = 0.01, .nesterov = nesterov}},
                    {{p.b}, {.lr = 0.1, .dampening = 0.3}}},
                   {.lr = 0.05, .momentum = 0.5});
    RefSGD rw{0.05, 0.9, 0, 0.01, nesterov}, rb{0.1, 0.5, 0.3, 0, false};
    EXPECT_DOUBLE_EQ(opt.param_groups()[0].get("nesterov"), nesterov ? 1 : 0);
    for (int t = 1; t <= 10; ++t) {
      if (t == 6) {
        opt.param_groups()[1].set("momentum", 0.7);
        rb.momentum = 0.7;
        opt.set_lr(0.02);
        rw.lr = rb.lr = 0.02;
      }
      opt.zero_grad();
      p.backward();
      opt.step();
      rw.step(p.rw, grad_of(p.rw, 0));
      rb.step(p.rb, grad_of(p.rb, 4));
      p.expect_matches(t);
    }
  }
}

TEST(ParamGroups, SGDMomentumSwitchedOnLaterStartsFromTheGradient) {
  TwoParams p;
  optim::SGD opt(std::vector<optim::SGDParamGroup>{{{p.w}}, {{p.b}}}, {.lr = 0.05});
  RefSGD rw{0.05, 0, 0, 0, false}, rb{0.05, 0, 0, 0, false};
  for (int t = 1; t <= 6; ++t) {
    if (t == 3) {
      opt.param_groups()[0].set("momentum", 0.9);
      rw.momentum = 0.9;
    }
    opt.zero_grad();
    p.backward();
    opt.step();
    rw.step(p.rw, grad_of(p.rw, 0));
    rb.step(p.rb, grad_of(p.rb, 4));
    // PyTorch's buffer starts as the gradient on the first step with momentum; kiln's buffer is
    // created zero when momentum is switched on and scaled by momentum from then on, so it
    // holds momentum*0 + g: the same.
    p.expect_matches(t);
  }
}

TEST(ParamGroups, OptionsAreTensorsReadAndModified) {
  TwoParams p;
  optim::AdamW opt({{{p.w}, {.weight_decay = 0.1}}, {{p.b}, {.weight_decay = 0.0}}}, {.lr = 3e-4});
  auto& g = opt.param_groups();
  EXPECT_EQ(g[0].option_names(), (std::vector<std::string>{"lr", "beta1", "beta2", "eps", "weight_decay"}));
  EXPECT_EQ(g[0].params().size(), 1u);
  EXPECT_EQ(opt.params().size(), 2u);
  EXPECT_TRUE(g[1].has("eps"));
  EXPECT_FALSE(g[1].has("momentum"));
  opt.set_lr(1, 1e-3);
  EXPECT_DOUBLE_EQ(g[0].lr(), 3e-4);
  EXPECT_DOUBLE_EQ(g[1].lr(), 1e-3);
  EXPECT_DOUBLE_EQ(g[1].tensor("lr").item<double>(), 1e-3);
  EXPECT_EQ(g[1].tensor("lr").dtype(), kFloat64);
  EXPECT_EQ(g[1].tensor("lr").dim(), 0);
  opt.set_lr(5e-4);
  EXPECT_DOUBLE_EQ(g[0].tensor("lr").item<double>(), 5e-4);
  EXPECT_DOUBLE_EQ(g[1].lr(), 5e-4);
  g[0].set("eps", 1e-6);
  EXPECT_DOUBLE_EQ(g[0].tensor("eps").item<double>(), 1e-6);
  EXPECT_THROW(g[0].set("beta1", 1.0), Error);
  EXPECT_THROW(g[0].set("lr", -1.0), Error);
  EXPECT_THROW(g[0].set("momentum", 0.9), Error);
  EXPECT_THROW(g[0].get("nope"), Error);
  EXPECT_DOUBLE_EQ(g[0].get("beta1"), 0.9);  // unchanged by the rejected set
  EXPECT_THROW(opt.set_lr(2, 1e-3), Error);
  EXPECT_THROW(opt.set_lr(-1.0), Error);
}

TEST(ParamGroups, BadGroupsThrow) {
  TwoParams p;
  using G = std::vector<optim::AdamParamGroup>;
  EXPECT_THROW(optim::AdamW(G{{{p.w, p.b}}, {{p.b}}}), Error);  // in two groups
  EXPECT_THROW(optim::AdamW(G{{{p.w}}, {{}}}), Error);  // empty group
  EXPECT_THROW(optim::AdamW(G{{{p.w, p.w}}}), Error);  // twice in one group
  EXPECT_THROW(optim::AdamW(G{}), Error);  // no groups
  EXPECT_THROW(optim::Adam(G{{{p.w}, {.beta2 = 1.5}}}), Error);
  EXPECT_THROW(optim::Adam(G{{{p.w}, {.lr = -1}}}), Error);
  EXPECT_THROW(optim::AdamW(G{{{p.w}, {.eps = -1}}}), Error);
  EXPECT_THROW(optim::AdamW(G{{{ones({2})}}}), Error);  // not a trainable leaf
  using S = std::vector<optim::SGDParamGroup>;
  EXPECT_THROW(optim::SGD(S{{{p.w}}, {{p.w}}}), Error);
  EXPECT_THROW(optim::SGD(S{{{p.w}}, {{}}}), Error);
  EXPECT_THROW(optim::SGD(S{{{p.w}, {.nesterov = true}}}), Error);  // nesterov without momentum
  EXPECT_THROW(optim::SGD(S{{{p.w}, {.momentum = -0.5}}}), Error);
  EXPECT_THROW(optim::SGD(S{}), Error);
  // A plain list keeps its old behavior (one group; an empty list is allowed).
  optim::SGD plain(std::vector<Tensor>{}, {.lr = 0.1});
  EXPECT_EQ(plain.param_groups().size(), 1u);
  optim::Adam one({p.w, p.b}, {.lr = 0.1});
  EXPECT_EQ(one.param_groups().size(), 1u);
  EXPECT_EQ(one.param_groups()[0].params().size(), 2u);
}

TEST(ParamGroups, SchedulersActOnEveryGroupFromItsOwnBaseLr) {
  TwoParams p;
  optim::SGD opt({{{p.w}}, {{p.b}, {.lr = 0.1}}}, {.lr = 1.0});
  optim::StepLR step(opt, 2, 0.5);
  step.step();
  EXPECT_EQ(step.last_lrs(), (std::vector<double>{1.0, 0.1}));
  step.step();
  EXPECT_EQ(step.last_lrs(), (std::vector<double>{0.5, 0.05}));
  EXPECT_DOUBLE_EQ(step.last_lr(), 0.5);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].tensor("lr").item<double>(), 0.05);
  for (int i = 0; i < 4; ++i) step.step();
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].lr(), 0.125);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].lr(), 0.0125);

  TwoParams q;
  optim::AdamW adam({{{q.w}, {.lr = 1.0}}, {{q.b}, {.lr = 0.2}}});
  optim::CosineAnnealingLR cos(adam, 4, 0.1);
  for (int e = 1; e <= 4; ++e) {
    cos.step();
    double c = (1 + std::cos(M_PI * e / 4)) / 2;
    auto lrs = cos.last_lrs();
    ASSERT_EQ(lrs.size(), 2u);
    EXPECT_NEAR(lrs[0], 0.1 + (1.0 - 0.1) * c, 1e-12) << e;
    EXPECT_NEAR(lrs[1], 0.1 + (0.2 - 0.1) * c, 1e-12) << e;
    EXPECT_NEAR(adam.param_groups()[1].tensor("lr").item<double>(), lrs[1], 1e-15);
  }
}

namespace {
// An MLP over a ModuleList.
struct ListMlp : nn::Module {
  std::shared_ptr<nn::ModuleList> layers;
  std::shared_ptr<nn::LayerNorm> norm;
  ListMlp() {
    layers = register_module("layers", std::make_shared<nn::ModuleList>());
    layers->push_back(std::make_shared<nn::Linear>(5, 12)).push_back(std::make_shared<nn::Linear>(12, 3));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{12}));
  }
  Tensor forward(const Tensor& x) override {
    return (*layers)[1]->forward(norm->forward((*layers)[0]->forward(x)).tanh());
  }
};

// nanoGPT's split: decay for 2-D weights, none for biases and LayerNorm.
std::pair<std::vector<Tensor>, std::vector<Tensor>> split_decay(const nn::Module& m) {
  std::vector<Tensor> decay, no_decay;
  for (auto& [n, t] : m.named_parameters()) (t.dim() >= 2 ? decay : no_decay).push_back(t);
  return {decay, no_decay};
}

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(const nn::Module&)>;

// Trains two copies, one step compiled, one eager, changing each group's lr (and an option)
// between steps; the compiled step must follow without recompiling.
void check_compiled_group_changes(const MakeOpt& make, const char* option, double value) {
  manual_seed(21);
  ListMlp eager_net, comp_net;
  kiln::testing::copy_params(eager_net, comp_net);
  auto opt_e = make(eager_net), opt_c = make(comp_net);
  ASSERT_EQ(opt_c->param_groups().size(), 2u);
  auto f = compile([&](const Tensor& x, const Tensor& y) { return kiln::testing::mse_step(comp_net, *opt_c, x, y); });
  optim::CosineAnnealingLR sched_e(*opt_e, 10, 1e-4), sched_c(*opt_c, 10, 1e-4);
  const int steps = 8;
  for (int s = 0; s < steps; ++s) {
    Tensor x = randn({16, 5}), y = randn({16, 3});
    if (s == 3)
      for (auto* o : {opt_e.get(), opt_c.get()}) o->set_lr(1, 0.2 * o->param_groups()[1].lr());
    if (s == 5)
      for (auto* o : {opt_e.get(), opt_c.get()}) o->param_groups()[0].set(option, value);
    Tensor lc = f(x, y);
    Tensor le = kiln::testing::mse_step(eager_net, *opt_e, x, y);
    expect_close(lc, le, 1e-4, 1e-6);
    auto pe = eager_net.parameters(), pc = comp_net.parameters();
    for (size_t i = 0; i < pe.size(); ++i) expect_close(pc[i], pe[i], 1e-4, 1e-6);
    sched_e.step();
    sched_c.step();
  }
  EXPECT_EQ(f.stats().entries, 1) << f.stats().last_miss;
  EXPECT_EQ(f.stats().hits, steps - 1);
  // The groups did train at different rates: group 1's lr differs from group 0's.
  EXPECT_NE(opt_c->param_groups()[0].lr(), opt_c->param_groups()[1].lr());
}
}  // namespace

TEST(ParamGroups, CompiledAdamWStepSeesPerGroupChanges) {
  check_compiled_group_changes(
      [](const nn::Module& m) -> std::unique_ptr<optim::Optimizer> {
        auto [decay, no_decay] = split_decay(m);
        return std::make_unique<optim::AdamW>(
            std::vector<optim::AdamParamGroup>{{decay, {.weight_decay = 0.1}},
                                               {no_decay, {.lr = 3e-2, .weight_decay = 0.0}}},
            optim::AdamOptions{.lr = 1e-2});
      },
      "beta1", 0.5);
}

TEST(ParamGroups, CompiledSGDStepSeesPerGroupChanges) {
  check_compiled_group_changes(
      [](const nn::Module& m) -> std::unique_ptr<optim::Optimizer> {
        auto [decay, no_decay] = split_decay(m);
        return std::make_unique<optim::SGD>(
            std::vector<optim::SGDParamGroup>{{decay, {.momentum = 0.9, .weight_decay = 0.01}},
                                              {no_decay, {.lr = 0.2}}},
            optim::SGDOptions{.lr = 0.1});
      },
      "weight_decay", 0.05);
}

TEST(ModuleContainers, ModuleListNamesIterationAndStateDict) {
  manual_seed(3);
  ListMlp net;
  auto names = [](const nn::Module& m) {
    std::vector<std::string> out;
    for (auto& [n, _] : m.named_parameters()) out.push_back(n);
    return out;
  };
  EXPECT_EQ(names(net), (std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.1.weight",
                                                  "layers.1.bias", "norm.weight", "norm.bias"}));
  EXPECT_EQ(net.layers->size(), 2u);
  EXPECT_FALSE(net.layers->empty());
  size_t count = 0;
  for (const auto& m : *net.layers) count += m->parameters().size();
  EXPECT_EQ(count, 4u);
  EXPECT_EQ(net.layers->at<nn::Linear>(1)->weight.sizes(), (std::vector<int64_t>{3, 12}));
  EXPECT_THROW((*net.layers)[2], Error);
  EXPECT_THROW(net.layers->at<nn::LayerNorm>(0), Error);
  EXPECT_THROW(net.layers->push_back(nullptr), Error);
  net.layers->append(std::make_shared<nn::ReLU>());  // no parameters
  EXPECT_EQ(net.layers->size(), 3u);
  EXPECT_EQ(net.layers->children().back().first, "2");

  // State dict round trip through a file into a fresh model.
  ListMlp other;
  other.layers->append(std::make_shared<nn::ReLU>());
  std::string path = ::testing::TempDir() + "kiln_modulelist.sd";
  net.save(path);
  other.load(path);
  std::remove(path.c_str());
  auto a = net.state_dict(), b = other.state_dict();
  ASSERT_EQ(a.size(), 6u);
  for (auto& [n, t] : a) {
    ASSERT_TRUE(b.count(n)) << n;
    expect_close(b[n], t, 0, 0);
  }
  Tensor x = randn({4, 5});
  expect_close(other(x), net(x), 0, 0);
  // The plain constructor and parameters() through nested lists.
  nn::ModuleList outer({std::make_shared<nn::Linear>(2, 2),
                        std::make_shared<nn::ModuleList>(
                            std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::Linear>(2, 1, false)})});
  EXPECT_EQ(names(outer), (std::vector<std::string>{"0.weight", "0.bias", "1.0.weight"}));
  EXPECT_THROW(outer(x), Error);  // no forward
}

TEST(ModuleContainers, ModuleDictKeysOrderAndStateDict) {
  manual_seed(4);
  nn::ModuleDict heads({{"policy", std::make_shared<nn::Linear>(4, 2)}, {"value", std::make_shared<nn::Linear>(4, 1)}});
  heads.insert("aux", std::make_shared<nn::Linear>(4, 3, false));
  EXPECT_EQ(heads.keys(), (std::vector<std::string>{"policy", "value", "aux"}));
  EXPECT_TRUE(heads.contains("value"));
  EXPECT_FALSE(heads.contains("critic"));
  EXPECT_EQ(heads.size(), 3u);
  EXPECT_EQ(heads.at<nn::Linear>("aux")->weight.sizes(), (std::vector<int64_t>{3, 4}));
  std::vector<std::string> names;
  for (auto& [n, _] : heads.named_parameters()) names.push_back(n);
  EXPECT_EQ(names,
            (std::vector<std::string>{"policy.weight", "policy.bias", "value.weight", "value.bias", "aux.weight"}));
  std::vector<std::string> iterated;
  for (const auto& [k, m] : heads) iterated.push_back(k + ":" + std::to_string(m->parameters().size()));
  EXPECT_EQ(iterated, (std::vector<std::string>{"policy:2", "value:2", "aux:1"}));
  // Replacing a key keeps its position.
  auto replacement = std::make_shared<nn::Linear>(4, 1, false);
  heads.insert("value", replacement);
  EXPECT_EQ(heads.keys(), (std::vector<std::string>{"policy", "value", "aux"}));
  EXPECT_EQ(heads["value"], replacement);
  EXPECT_EQ(heads.state_dict().count("value.bias"), 0u);
  EXPECT_THROW(heads["critic"], Error);
  EXPECT_THROW(heads.insert("a.b", std::make_shared<nn::ReLU>()), Error);
  EXPECT_THROW(heads.insert("", std::make_shared<nn::ReLU>()), Error);
  EXPECT_THROW(heads.insert("x", nullptr), Error);
  EXPECT_THROW(heads.at<nn::ReLU>("policy"), Error);

  // State dict round trip (in memory) into a model built in another order of keys' values.
  nn::ModuleDict copy({{"policy", std::make_shared<nn::Linear>(4, 2)},
                       {"value", std::make_shared<nn::Linear>(4, 1, false)},
                       {"aux", std::make_shared<nn::Linear>(4, 3, false)}});
  copy.load_state_dict(heads.state_dict());
  Tensor x = randn({5, 4});
  for (const auto& k : heads.keys()) expect_close(copy[k]->forward(x), heads[k]->forward(x), 0, 0);
  // Strict loading rejects a dict whose keys differ.
  nn::ModuleDict wrong({{"policy", std::make_shared<nn::Linear>(4, 2)}});
  EXPECT_THROW(wrong.load_state_dict(heads.state_dict()), Error);
  // Optimizer groups from a dict: one group per head.
  optim::SGD opt(
      {{heads["policy"]->parameters(), {.lr = 0.1}}, {heads["value"]->parameters()}, {heads["aux"]->parameters()}},
      {.lr = 0.01});
  EXPECT_EQ(opt.param_groups().size(), 3u);
  EXPECT_EQ(opt.params().size(), 4u);
}
