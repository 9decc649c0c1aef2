// A program using kiln the way a user does: kiln.h only, linked against libkiln.so (which exports
// only KILN_API declarations). It reaches across the library boundary in the ways that break
// when something is hidden that must not be: kiln::Error caught here (typeinfo), a Module
// subclassed here (vtable) and found again by dynamic_pointer_cast, kiln::compile's templates
// calling into the library, an optimizer step, and transcendental kernels the JIT compiles
// (they call kiln_vm_* entry points that the JIT resolves from the process by name).
#include <kiln.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::cerr << "consumer: FAILED: " << what << "\n";
    ++failures;
  }
}

// A user-defined module: its vtable is here, its base's in libkiln.
struct Mlp : kiln::nn::Module {
  std::shared_ptr<kiln::nn::Linear> l1, l2;
  Mlp() {
    l1 = register_module("l1", std::make_shared<kiln::nn::Linear>(4, 16));
    l2 = register_module("l2", std::make_shared<kiln::nn::Linear>(16, 1));
  }
  kiln::Tensor forward(const kiln::Tensor& x) override { return l2->forward(kiln::tanh(l1->forward(x))); }
};

}  // namespace

int main() {
  using namespace kiln;

  // Eager ops (materialized by item()).
  Tensor x = arange(4).to(kFloat32);
  float s = ((x * 2 + 1).relu()).sum().item<float>();  // 1 + 3 + 5 + 7
  check(s == 16.0f, "sum of (2x + 1).relu()");

  // Transcendentals: kernels calling kiln_vm_expf / kiln_vm_tanhf / kiln_vm_logf.
  Tensor y = linspace(-3, 3, 1000);
  std::vector<float> got = (y.exp() + y.tanh() + (y * y + 1).log()).to_vector<float>();
  std::vector<float> in = y.to_vector<float>();
  double worst = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    double v = in[i], want = std::exp(v) + std::tanh(v) + std::log(v * v + 1);
    worst = std::max(worst, std::abs(got[i] - want) / std::max(1.0, std::abs(want)));
  }
  check(worst < 1e-5, "exp + tanh + log against libm");

  // kiln::Error thrown in libkiln, caught here.
  bool caught = false;
  try {
    matmul(zeros({2, 3}), zeros({2, 3}));
  } catch (const Error&) {
    caught = true;
  }
  check(caught, "kiln::Error from a bad matmul caught as kiln::Error");

  // A user module trained with Adam; found again through ModuleList::at<M> (dynamic_pointer_cast).
  manual_seed(0);
  auto net = std::make_shared<Mlp>();
  optim::Adam opt(net->parameters(), {.lr = 1e-2});
  Tensor inputs = randn({64, 4}), target = inputs.sum(1, true).tanh();
  float first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    Tensor loss = mse_loss((*net)(inputs), target);
    loss.backward();
    opt.step();
    last = loss.item<float>();
    if (step == 0) first = last;
  }
  check(last < 0.5f * first, "training lowers the loss");
  nn::ModuleList list;
  list.push_back(net);
  list.push_back(std::make_shared<nn::ReLU>());
  check(list.at<Mlp>(0) == net, "ModuleList::at<Mlp>");
  bool wrong_type = false;
  try {
    list.at<Mlp>(1);
  } catch (const Error&) {
    wrong_type = true;
  }
  check(wrong_type, "ModuleList::at<Mlp> of a ReLU throws kiln::Error");

  // kiln::compile: guards, trace, replay.
  auto f = compile([](const Tensor& a, const Tensor& b) { return (a * b).exp().sum(); });
  Tensor a = randn({32}), b = randn({32});
  float eager = (a * b).exp().sum().item<float>();
  float c1 = f(a, b).item<float>(), c2 = f(a, b).item<float>();
  check(std::abs(c1 - eager) <= 1e-5f * std::abs(eager) && c1 == c2, "compiled result matches eager");
  check(f.stats().hits == 1 && f.stats().misses == 1, "second compiled call replays");

  std::cout << "consumer: executor " << current_executor().name() << ", sum = " << s << ", "
            << (failures ? "FAILED" : "ok") << "\n";
  return failures ? 1 : 0;
}
