// The function-transform benchmark of the forward-mode AD issue: an MLP (4 layers of tanh, batch
// B, width W, float32) and its mean-squared loss, timed per call as
//   forward   f(x) alone                       jvp      f and J·t (kiln::jvp)
//   grad      the loss's gradient in x (vjp)   hvp      H·v of the loss in x (forward-over-reverse)
// in lazy eager mode and inside kiln::compile, each call's results materialized. The same rows come
// from PyTorch (bench/torch_transforms.py: torch.func.jvp / vjp / jvp-of-grad, eager and
// torch.compile) in the same call of bench/run.sh --transforms. One JSON object per line.
//
//   bench_transforms [--device cpu|cuda] [--batch B] [--width W] [--iters N]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_common.h"
#include "kiln.h"

using kiln::Tensor;
using V = std::vector<Tensor>;

int main(int argc, char** argv) {
  std::string device = "cpu";
  int64_t B = 256, W = 256;
  int iters = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--device")) device = argv[i + 1];
    if (!std::strcmp(argv[i], "--batch")) B = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--width")) W = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
  }
  const kiln::Device dev = device == "cuda" ? kiln::Device(kiln::cuda(0)) : kiln::cpu();
  kiln::manual_seed(5);
  V params;
  for (int l = 0; l < 4; ++l) {
    params.push_back((kiln::randn({W, W}) * (1 / std::sqrt(double(W)))).to(dev));
    params.push_back((kiln::randn({W}) * 0.1).to(dev));
  }
  Tensor x = kiln::randn({B, W}).to(dev), t = kiln::randn({B, W}).to(dev), y = kiln::randn({B, W}).to(dev);
  kiln::eval(params);
  kiln::eval({x, t, y});
  auto mlp = [params](const V& a) {
    Tensor h = a[0];
    for (int l = 0; l < 4; ++l) h = kiln::tanh(kiln::add(kiln::matmul(h, params[2 * l]), params[2 * l + 1]));
    return V{h};
  };
  auto loss = [mlp, y](const V& a) { return V{kiln::mean(kiln::square(kiln::sub(mlp(a)[0], y)))}; };
  std::vector<std::pair<std::string, std::function<V(const V&)>>> rows = {
      {"forward", [mlp](const V& a) { return mlp({a[0]}); }},
      {"jvp", [mlp](const V& a) { return kiln::jvp(mlp, {a[0]}, {a[1]}).tangents; }},
      {"grad", [loss](const V& a) { return kiln::vjp(loss, {a[0]}).vjp_fn({kiln::ones({}, a[0].dtype(), a[0].device())}); }},
      {"hvp", [loss](const V& a) { return kiln::hvp(loss, {a[0]}, {a[1]}).hvp; }},
  };
  auto sync = [&] {
    if (dev.type == kiln::DeviceType::CUDA) kiln::cuda::synchronize();
  };
  for (const auto& [name, fn] : rows) {
    for (const char* mode : {"eager", "compiled"}) {
      std::function<V(const V&)> f = fn;
      if (!std::strcmp(mode, "compiled")) f = kiln::compile(fn, kiln::CompileOptions{name});
      auto call = [&] {
        kiln::eval(f({x, t}));
        sync();
      };
      bench::Timing tm = bench::time_calls(call, iters, 3);
      std::printf("{\"impl\": \"kiln\", \"row\": \"%s\", \"mode\": \"%s\", \"device\": \"%s\", \"batch\": %lld, "
                  "\"width\": %lld, \"median_us\": %.1f, \"min_us\": %.1f}\n",
                  name.c_str(), mode, device.c_str(), static_cast<long long>(B), static_cast<long long>(W),
                  tm.median_ms * 1e3, tm.min_ms * 1e3);
      std::fflush(stdout);
    }
  }
  // The answers agree with the reference: jvp against central differences of the forward.
  {
    const double h = 1e-2;
    Tensor jv = kiln::jvp(mlp, {x}, {t}).tangents[0];
    Tensor fd = kiln::div(kiln::sub(mlp({kiln::add(x, kiln::mul(t, h))})[0], mlp({kiln::sub(x, kiln::mul(t, h))})[0]), 2 * h);
    const double err = kiln::amax(kiln::abs(kiln::sub(jv, fd))).item<double>();
    std::printf("{\"impl\": \"kiln\", \"row\": \"check\", \"jvp_vs_central_difference\": %.3g}\n", err);
  }
  return 0;
}
