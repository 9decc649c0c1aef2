// kiln on a CUDA device: W1 particles (N = 4M, pointwise + sum) and W3 layer_norm -> gelu ->
// softmax (8192 x 1024) forward and forward+backward, lazy eager and kiln::compile, plus the
// device copy bandwidth through kiln (a dense clone), and NVRTC compile / disk-cache load times.
// One JSON object per line; bench/run.sh --device cuda runs it beside PyTorch (bench/torch_cuda.py).
//
//   bench_cuda [--iters N]            the workloads
//   bench_cuda --w2-start             a process's first three W2 train steps (run cold, then warm)
//   bench_cuda --w2-steps BATCH       six compiled W2 steps (for a profiler)
//   bench_cuda --w1 | --w3 | --w5     W1, W3 or W5 alone (for a profiler)
//   bench_cuda --compile-times K      K distinct kernels, first call each (run twice over one
//                                     KILN_CACHE_DIR: cold NVRTC, then warm disk-cache loads)
#include <algorithm>
#include <functional>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
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
  auto f = kiln::compile(
      [&](const Tensor& p, const Tensor& v, const Tensor& g) { return w1_step(p, v, g, s.k, s.c, s.dt); });
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
  // The forward's saved values across the backward (min-cut partition): peak device memory of
  // one step with outputs that need grad, saving every value backward reads (-1 below), and at
  // memory budgets 1 and 0.5.
  for (double budget : {-1.0, 1.0, 0.5}) {
    kiln::CompileOptions o{"w3m"};
    o.memory_budget = budget < 0 ? 1.0 : budget;
    o.save_all = budget < 0;
    // Launched kernel by kernel: a CUDA graph keeps its values in a private pool borrowed once
    // from the allocator, so the allocator's peak over the step would not see them.
    o.cuda_graphs = false;
    auto fm =
        kiln::compile([&](const Tensor& x0, const Tensor& w0, const Tensor& b0) { return w3_forward(x0, w0, b0); }, o);
    Tensor xl = x.detach().requires_grad_(), wl = w.detach().requires_grad_(), bl = b.detach().requires_grad_();
    auto once = [&] {
      Tensor loss = (fm(xl, wl, bl) * gy).sum();
      kiln::eval(kiln::grad({loss}, {xl, wl, bl}));
    };
    once();
    once();
    kiln::cuda::synchronize();
    kiln::cuda::reset_peak_memory_stats();
    const auto before = kiln::cuda::memory_stats().allocated_bytes;
    const double us = time_us(once, iters, 0);
    const auto s = fm.stats();
    const std::string impl =
        budget < 0 ? std::string("save-all") : "kiln-compiled-" + std::to_string(budget).substr(0, 3);
    std::printf(
        "{\"workload\": \"W3B-budget\", \"impl\": \"%s\", \"us\": %.2f, \"saved_mib\": %.1f, "
        "\"peak_over_start_mib\": %.1f, \"recomputed\": %d}\n",
        impl.c_str(), us, s.saved_bytes / 1048576.0,
        (kiln::cuda::memory_stats().peak_allocated_bytes - before) / 1048576.0, s.recomputed);
  }
}

// Mean microseconds per step of `step` run `n` times back to back (no wait between steps, as a
// training loop runs), the median of `loops` such loops; with `issue_only`, the time the host
// spends issuing them (the wait comes after the timing; keep n below the driver's launch queue
// depth, so the GPU's pace does not show).
template <class F>
double loop_us(F&& step, int n = 20, bool issue_only = false, int loops = 5) {
  for (int i = 0; i < 3; ++i) step();
  kiln::cuda::synchronize();
  std::vector<double> t;
  for (int r = 0; r < loops; ++r) {
    auto a = Clock::now();
    for (int i = 0; i < n; ++i) step();
    if (!issue_only) kiln::cuda::synchronize();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count() / n);
    kiln::cuda::synchronize();
  }
  return median(t);
}

// Median microseconds the host spends issuing `step`, 200 calls at a time.
template <class F>
double issue_us(F&& step) {
  return loop_us(step, 200, true, 15);
}

// The driver's own cost of one launch: an empty kernel (kiln's three-argument signature, one
// block of 128 threads) launched by cuLaunchKernel in a loop on the current context. The floor
// under any per-call launch of a generated kernel.
struct LaunchFloor {
  using Load = int (*)(void**, const void*);
  using Get = int (*)(void**, void*, const char*);
  using Run = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                      void**);
  Run run = nullptr;
  void* fn = nullptr;
  LaunchFloor() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto load = reinterpret_cast<Load>(dlsym(lib, "cuModuleLoadData"));
    auto get = reinterpret_cast<Get>(dlsym(lib, "cuModuleGetFunction"));
    run = reinterpret_cast<Run>(dlsym(lib, "cuLaunchKernel"));
    static const char ptx[] =
        ".version 7.0\n.target sm_70\n.address_size 64\n"
        ".visible .entry kiln_floor(.param .u64 a, .param .u64 b, .param .u64 c) { ret; }\n";
    void* mod = nullptr;
    if (!load || !get || !run || load(&mod, ptx) != 0 || get(&fn, mod, "kiln_floor") != 0) run = nullptr;
  }
  void operator()() const {
    long long begin = 0, end = 16, args = 0;
    void* params[] = {&begin, &end, &args};
    run(fn, 1, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr);
  }
};

std::shared_ptr<kiln::nn::Sequential> w2_net() {
  kiln::manual_seed(7);
  auto net = std::make_shared<kiln::nn::Sequential>(std::vector<std::shared_ptr<kiln::nn::Module>>{
      std::make_shared<kiln::nn::Linear>(64, 256), std::make_shared<kiln::nn::Tanh>(),
      std::make_shared<kiln::nn::Linear>(256, 256), std::make_shared<kiln::nn::Tanh>(),
      std::make_shared<kiln::nn::Linear>(256, 8)});
  net->to(kiln::cuda());
  kiln::eval(net->parameters());
  return net;
}

// W2: MLP 64-256-256-8 (tanh) + MSE + Adam (lr 1e-3) train step at `batch`: lazy eager, compiled
// without and with CUDA graphs; loss after 3 steps against lazy eager's.
void bench_w2(int64_t batch, int only_steps = 0) {
  struct Model {
    std::shared_ptr<kiln::nn::Sequential> net = w2_net();
    kiln::optim::Adam opt{net->parameters(), kiln::optim::AdamOptions{.lr = 1e-3}};
    Tensor step(const Tensor& x, const Tensor& y) {
      opt.zero_grad();
      Tensor loss = kiln::mse_loss(net->forward(x), y);
      loss.backward();
      opt.step();
      return loss.detach();
    }
  };
  kiln::manual_seed(8);
  Tensor x = kiln::randn({batch, 64}, kiln::kFloat32, kiln::cuda()),
         y = kiln::randn({batch, 8}, kiln::kFloat32, kiln::cuda()) * 0.5;
  kiln::eval({x, y});
  Model e, c, g;
  kiln::CompileOptions plain{"w2"};
  plain.cuda_graphs = false;
  auto fc = kiln::compile([&](const Tensor& a, const Tensor& b) { return c.step(a, b); }, plain);
  auto fg = kiln::compile([&](const Tensor& a, const Tensor& b) { return g.step(a, b); }, kiln::CompileOptions{"w2g"});
  float le = 0, lc = 0, lg = 0;
  if (only_steps) {
    for (int i = 0; i < only_steps; ++i) fg(x, y);
    kiln::cuda::synchronize();
    return;
  }
  auto first = Clock::now();
  fg(x, y).eval();
  kiln::cuda::synchronize();
  const double first_ms = std::chrono::duration<double, std::milli>(Clock::now() - first).count();
  le = e.step(x, y).item<float>();
  fc(x, y);
  for (int i = 0; i < 2; ++i) {
    le = e.step(x, y).item<float>();
    lc = fc(x, y).item<float>();
    lg = fg(x, y).item<float>();
  }
  const std::string w = "W2-" + std::to_string(batch);
  auto eager = [&] {
    Tensor l = e.step(x, y);
    std::vector<Tensor> all = e.net->parameters();
    all.push_back(l);
    kiln::eval(all);
  };
  row(w.c_str(), "kiln-eager", loop_us(eager));
  row(w.c_str(), "kiln-compiled-nographs", loop_us([&] { fc(x, y); }));
  const double us = loop_us([&] { fg(x, y); });
  const auto s = fg.stats();
  std::printf(
      "{\"workload\": \"%s\", \"impl\": \"kiln-compiled\", \"us\": %.2f, \"first_call_ms\": %.1f, "
      "\"loss_step3_eager\": %.7g, \"loss_step3_compiled\": %.7g, \"loss_step3_graphs\": %.7g, \"graphs\": %lld, "
      "\"replays\": %lld, \"ungraphed\": %lld, \"graph_mib\": %.1f}\n",
      w.c_str(), us, first_ms, le, lc, lg, static_cast<long long>(s.graphs), static_cast<long long>(s.graph_replays),
      static_cast<long long>(s.ungraphed_runs), s.graph_bytes / 1048576.0);
  std::fflush(stdout);
}

// A process's first compiled W2 steps (batch 4096): the first call (trace, partition, compile or
// disk load, run), the second (records the CUDA graph) and the third (the first replay), each
// waited for. The process's own start (CUDA context, cuBLAS handle and the GEMM kernels it loads
// lazily) is taken by the step's GEMMs run alone first, and reported apart. Run twice over one
// KILN_CACHE_DIR: cold (NVRTC), then warm (disk cache).
void w2_start() {
  auto t0 = Clock::now();
  Tensor warm = kiln::ones({1}, kiln::kFloat32, kiln::cuda()).eval();
  kiln::cuda::synchronize();
  const double context_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  auto net = w2_net();
  kiln::optim::Adam opt{net->parameters(), kiln::optim::AdamOptions{.lr = 1e-3}};
  kiln::manual_seed(8);
  Tensor x = kiln::randn({4096, 64}, kiln::kFloat32, kiln::cuda()),
         y = kiln::randn({4096, 8}, kiln::kFloat32, kiln::cuda());
  kiln::eval({x, y});
  kiln::cuda::synchronize();
  double libraries_ms;
  {
    // The GEMMs of a W2 step (forward x W^T, weight gradient G^T A, input gradient G W) on
    // their own: cuBLAS's handle and kernels loaded, no fused kernel of kiln's compiled.
    auto a = Clock::now();
    std::vector<Tensor> out;
    const int64_t dims[] = {64, 256, 256, 8};
    for (int l = 0; l < 3; ++l) {
      Tensor A = kiln::randn({4096, dims[l]}, kiln::kFloat32, kiln::cuda()),
             W = kiln::randn({dims[l + 1], dims[l]}, kiln::kFloat32, kiln::cuda());
      Tensor G = kiln::randn({4096, dims[l + 1]}, kiln::kFloat32, kiln::cuda());
      out.push_back(kiln::matmul(A, W.t()));
      out.push_back(kiln::matmul(G.t(), A));
      out.push_back(kiln::matmul(G, W));
    }
    kiln::eval(out);
    kiln::cuda::synchronize();
    libraries_ms = std::chrono::duration<double, std::milli>(Clock::now() - a).count();
  }
  auto f = kiln::compile(
      [&](const Tensor& a, const Tensor& b) {
        opt.zero_grad();
        Tensor loss = kiln::mse_loss(net->forward(a), b);
        loss.backward();
        opt.step();
        return loss.detach();
      },
      kiln::CompileOptions{"w2start"});
  double ms[3];
  for (double& m : ms) {
    auto a = Clock::now();
    f(x, y);
    kiln::cuda::synchronize();
    m = std::chrono::duration<double, std::milli>(Clock::now() - a).count();
  }
  std::printf(
      "{\"workload\": \"w2-start\", \"first_call_ms\": %.2f, \"record_ms\": %.2f, \"first_replay_ms\": %.3f, "
      "\"to_first_replay_ms\": %.2f, \"graphs\": %lld, \"context_ms\": %.1f, \"gemms_with_library_init_ms\": %.1f}\n",
      ms[0], ms[1], ms[2], ms[0] + ms[1] + ms[2], static_cast<long long>(f.stats().graphs), context_ms, libraries_ms);
}

// W4: the W2 MLP forward over 64 batch sizes 1000, 1061, ..., 4843: the first pass (compiles
// included) and a steady pass, compiled (sizes become symbolic: one kernel set).
void bench_w4() {
  auto net = w2_net();
  std::vector<Tensor> xs;
  kiln::manual_seed(9);
  for (int i = 0; i < 64; ++i) xs.push_back(kiln::randn({1000 + 61 * i, 64}, kiln::kFloat32, kiln::cuda()).eval());
  auto f = kiln::compile([&](const Tensor& x) { return net->forward(x); }, kiln::CompileOptions{"w4"});
  kiln::NoGradGuard ng;
  kiln::cuda::synchronize();
  auto a = Clock::now();
  for (auto& x : xs) f(x);
  kiln::cuda::synchronize();
  const double first_ms = std::chrono::duration<double, std::milli>(Clock::now() - a).count();
  const double steady = loop_us(
      [&] {
        for (auto& x : xs) f(x);
      },
      3);
  const double eager = loop_us(
      [&] {
        for (auto& x : xs) net->forward(x).eval();
      },
      3);
  const auto s = f.stats();
  std::printf(
      "{\"workload\": \"W4\", \"impl\": \"kiln-compiled\", \"us\": %.2f, \"first_pass_ms\": %.1f, \"compiles\": %d, "
      "\"graphs\": %lld, \"replays\": %lld}\n",
      steady, first_ms, s.entries, static_cast<long long>(s.graphs), static_cast<long long>(s.graph_replays));
  row("W4", "kiln-eager", eager);
}

// GEMM + bias + ReLU (a Linear layer's inference, [16384, 256] x [256, 1024]): compiled, with
// the bias and ReLU in the GEMM's epilogue (cuBLASLt), and the same with one more pointwise op
// after the ReLU (no epilogue match: GEMM, then one fused pointwise kernel).
void bench_linear_relu() {
  kiln::manual_seed(3);
  Tensor x = kiln::randn({16384, 256}, kiln::kFloat32, kiln::cuda()),
         w = kiln::randn({1024, 256}, kiln::kFloat32, kiln::cuda());
  Tensor b = kiln::randn({1024}, kiln::kFloat32, kiln::cuda());
  kiln::eval({x, w, b});
  kiln::NoGradGuard ng;
  auto fused = kiln::compile(
      [](const Tensor& x0, const Tensor& w0, const Tensor& b0) { return kiln::relu(kiln::linear(x0, w0, b0)); });
  auto apart = kiln::compile(
      [](const Tensor& x0, const Tensor& w0, const Tensor& b0) { return kiln::relu(kiln::linear(x0, w0, b0)) * 1.5; });
  row("LINRELU", "kiln-compiled-epilogue", loop_us([&] { fused(x, w, b); }));
  row("LINRELU", "kiln-compiled-apart", loop_us([&] { apart(x, w, b); }));
}

// W5: relu(2x + 1) on 16 elements, per call in a loop without waiting: compiled, lazy eager.
void bench_w5() {
  Tensor x = kiln::linspace(-2, 2, 16, kiln::kFloat32).cuda().eval();
  auto body = [](const Tensor& t) { return kiln::relu(t * 2 + 1); };
  auto f = kiln::compile(body, kiln::CompileOptions{"w5"});
  kiln::CompileOptions plain{"w5p"};
  plain.cuda_graphs = false;
  auto fp = kiln::compile(body, plain);
  row("W5", "kiln-compiled", loop_us([&] { f(x); }, 2000));
  row("W5", "kiln-compiled-nographs", loop_us([&] { fp(x); }, 2000));
  row("W5", "kiln-eager", loop_us([&] { body(x).eval(); }, 2000));
  // (where eager's time goes: recording the three ops alone, without running them)
  row("W5", "kiln-eager-record-only", loop_us([&] { body(x); }, 2000));
  // The host's share alone (calls issued, not waited for) and the driver's floor beside it.
  row("W5", "kiln-compiled-issue", issue_us([&] { f(x); }));
  row("W5", "kiln-compiled-nographs-issue", issue_us([&] { fp(x); }));
  row("W5", "kiln-eager-issue", issue_us([&] { body(x).eval(); }));
  if (LaunchFloor floor; floor.run) {
    row("W5", "driver-launch-floor", loop_us(floor, 2000));
    row("W5", "driver-launch-floor-issue", issue_us(floor));
  }
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
  std::printf("{\"workload\": \"compile\", \"kernels\": %d, \"median_ms\": %.3f, \"max_ms\": %.3f}\n", kernels,
              median(t), *std::max_element(t.begin(), t.end()));
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  std::function<void()> alone;  // one part only (--w1, --w3, --w5, --w2-start, --w2-steps, --compile-times)
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--compile-times") && i + 1 < argc)
      alone = [k = std::atoi(argv[++i])] { compile_times(k); };
    else if (!std::strcmp(argv[i], "--w2-start"))
      alone = w2_start;
    else if (!std::strcmp(argv[i], "--w5"))
      alone = bench_w5;
    else if (!std::strcmp(argv[i], "--w1"))
      alone = [&iters] { bench_w1(iters); };
    else if (!std::strcmp(argv[i], "--w3"))
      alone = [&iters] { bench_w3(iters); };
    else if (!std::strcmp(argv[i], "--w2-steps") && i + 1 < argc)
      alone = [b = std::atoi(argv[++i])] { bench_w2(b, 6); };
  }
  if (!kiln::cuda::is_available()) {
    std::fprintf(stderr, "bench_cuda: no usable CUDA device\n");
    return 2;
  }
  try {
    if (alone) {
      alone();
      return 0;
    }
    bench_w1(iters);
    bench_w3(iters);
    bench_linear_relu();
    bench_w5();
    bench_w2(4096);
    bench_w2(65536);
    bench_w4();
    kiln::MemoryStats m = kiln::cuda::memory_stats();
    std::printf("{\"workload\": \"memory\", \"peak_allocated_mib\": %.1f, \"peak_reserved_mib\": %.1f}\n",
                m.peak_allocated_bytes / 1048576.0, m.peak_reserved_bytes / 1048576.0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
