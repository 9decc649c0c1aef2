// kiln on a CUDA device: W1 particles (N = 4M, pointwise + sum) and W3 layer_norm -> gelu ->
// softmax (8192 x 1024) forward and forward+backward, lazy eager and kiln::compile, plus the
// device copy bandwidth through kiln (a dense clone), and NVRTC compile / disk-cache load times.
// One JSON object per line; bench/run.sh --device cuda runs it beside PyTorch (bench/torch_cuda.py).
//
//   bench_cuda [--iters N]            the workloads
//   bench_cuda --compile-times K      K distinct kernels, first call each (run twice over one
//                                     KILN_CACHE_DIR: cold NVRTC, then warm disk-cache loads)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kiln.h"

using kiln::Tensor;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Median microseconds of `step` (the device work waited for), after `warm` untimed runs.
template <class F>
double time_us(F&& step, int iters, int warm = 3) {
  for (int i = 0; i < warm; ++i) step();
  kiln::cuda::synchronize();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    auto a = Clock::now();
    step();
    kiln::cuda::synchronize();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
  }
  return median(t);
}

void row(const char* w, const char* impl, double us, double bytes = 0) {
  std::printf("{\"workload\": \"%s\", \"impl\": \"%s\", \"us\": %.2f", w, impl, us);
  if (bytes > 0) std::printf(", \"gbs\": %.1f", bytes / us / 1e3);
  std::printf("}\n");
  std::fflush(stdout);
}

struct W1 {
  Tensor p, v, g;
  double k = 0.5, c = 0.1, dt = 0.01;
};

std::vector<Tensor> w1_step(const Tensor& p, const Tensor& v, const Tensor& g, double k, double c, double dt) {
  Tensor a = g - p * k - v * c;
  Tensor v2 = v + a * dt;
  Tensor p2 = p + v2 * dt;
  Tensor e = (v2 * v2).sum() * 0.5;
  return {p2, v2, e};
}

void bench_w1(int iters) {
  const int64_t n = int64_t(4) << 20;
  kiln::manual_seed(1);
  W1 s;
  s.p = kiln::randn({n, 3}, kiln::kFloat32, kiln::cuda());
  s.v = kiln::randn({n, 3}, kiln::kFloat32, kiln::cuda());
  s.g = kiln::tensor({0.0, -9.81, 0.0}, kiln::kFloat32, kiln::cuda());
  kiln::eval({s.p, s.v, s.g});
  const double bytes = 4.0 * n * 3 * 4;  // read p, v; write p2, v2
  double eager = time_us([&] { kiln::eval(w1_step(s.p, s.v, s.g, s.k, s.c, s.dt)); }, iters);
  row("W1", "kiln-eager", eager, bytes);
  auto f = kiln::compile([&](const Tensor& p, const Tensor& v, const Tensor& g) { return w1_step(p, v, g, s.k, s.c, s.dt); });
  double comp = time_us([&] { kiln::eval(f(s.p, s.v, s.g)); }, iters);
  row("W1", "kiln-compiled", comp, bytes);
  // The copy of W1's bytes: p and v cloned (read 2 arrays, write 2), through kiln's kernels.
  double copy = time_us([&] { kiln::eval({s.p.clone(), s.v.clone()}); }, iters);
  row("W1", "kiln-copy", copy, bytes);
}

Tensor w3_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  return kiln::softmax(kiln::gelu(kiln::layer_norm(x, {x.size(1)}, w, b, 1e-5)), -1);
}

void bench_w3(int iters) {
  const int64_t rows = 8192, cols = 1024;
  kiln::manual_seed(2);
  Tensor x = kiln::randn({rows, cols}, kiln::kFloat32, kiln::cuda());
  Tensor w = kiln::randn({cols}, kiln::kFloat32, kiln::cuda()) * 0.1 + 1;
  Tensor b = kiln::randn({cols}, kiln::kFloat32, kiln::cuda()) * 0.1;
  Tensor gy = kiln::randn({rows, cols}, kiln::kFloat32, kiln::cuda());
  kiln::eval({x, w, b, gy});
  const double fbytes = 2.0 * rows * cols * 4;  // read x, write y
  row("W3F", "kiln-eager", time_us([&] { w3_forward(x, w, b).eval(); }, iters), fbytes);
  auto f = kiln::compile([](const Tensor& x, const Tensor& w, const Tensor& b) { return w3_forward(x, w, b); });
  row("W3F", "kiln-compiled", time_us([&] { f(x, w, b).eval(); }, iters), fbytes);
  auto fb = [&](const Tensor& x0, const Tensor& w0, const Tensor& b0) {
    Tensor xl = x0.detach().requires_grad_(), wl = w0.detach().requires_grad_(), bl = b0.detach().requires_grad_();
    Tensor loss = (w3_forward(xl, wl, bl) * gy).sum();
    std::vector<Tensor> g = kiln::grad({loss}, {xl, wl, bl});
    return g;
  };
  row("W3B", "kiln-eager", time_us([&] { kiln::eval(fb(x, w, b)); }, iters));
  auto fc = kiln::compile([&](const Tensor& x0, const Tensor& w0, const Tensor& b0) { return fb(x0, w0, b0); });
  row("W3B", "kiln-compiled", time_us([&] { kiln::eval(fc(x, w, b)); }, iters));
}

// K structurally different kernels, each called once: with an empty KILN_CACHE_DIR every first
// call compiles with NVRTC; with a filled one it loads the cubin. Kernel k is a chain of
// 1 + k % 8 ops (tanh * c, + c, sigmoid, exp, * x) chosen by the digits of k / 8: the size of
// the fused pointwise kernels of the workloads (W1: 14 ops, 0 transcendentals; W3: 2-43 ops).
void compile_times(int kernels) {
  Tensor x = kiln::randn({1000}, kiln::kFloat32, kiln::cuda());
  x.eval();
  kiln::cuda::synchronize();
  std::vector<double> t;
  for (int k = 0; k < kernels; ++k) {
    auto a = Clock::now();
    Tensor y = x;
    int code = k / 8;
    for (int i = 0; i <= k % 8; ++i, code /= 5) {
      switch (code % 5) {
        case 0: y = kiln::tanh(y) * 1.5; break;
        case 1: y = y + 0.25; break;
        case 2: y = kiln::sigmoid(y); break;
        case 3: y = kiln::exp(y * -0.5); break;
        default: y = y * x; break;
      }
    }
    y.eval();
    kiln::cuda::synchronize();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
  }
  std::printf("{\"workload\": \"compile\", \"kernels\": %d, \"median_ms\": %.3f, \"max_ms\": %.3f}\n", kernels, median(t),
              *std::max_element(t.begin(), t.end()));
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20, kernels = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--compile-times") && i + 1 < argc) kernels = std::atoi(argv[++i]);
  }
  if (!kiln::cuda::is_available()) {
    std::fprintf(stderr, "bench_cuda: no usable CUDA device\n");
    return 2;
  }
  try {
    if (kernels) {
      compile_times(kernels);
      return 0;
    }
    bench_w1(iters);
    bench_w3(iters);
    kiln::MemoryStats m = kiln::cuda::memory_stats();
    std::printf("{\"workload\": \"memory\", \"peak_allocated_mib\": %.1f, \"peak_reserved_mib\": %.1f}\n",
                m.peak_allocated_bytes / 1048576.0, m.peak_reserved_bytes / 1048576.0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
