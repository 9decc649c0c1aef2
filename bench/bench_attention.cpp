// The transformer-block benchmark of the pattern-matcher issue: one pre-norm block (layer_norm,
// qkv projection, causal attention written by hand, output projection, layer_norm, GELU MLP),
// batch 16, 4 heads of 64, forward + backward of every parameter, compiled by kiln::compile
// with the registered rewrites on (hand-written attention -> the fused Attention kernels) and
// off (KILN_PATTERNS=off: the T x T matrices as written), in one process, same inputs.
// One JSON object per line.
//
//   bench_attention [--device cpu|cuda] [--seq T] [--iters N]    both modes, median us per step
//   bench_attention --memory on|off [--device D] [--seq T]         one mode, one step: peak bytes
//   bench_attention --sdpa [--device D] [--seq T]                  attention alone (fused, fwd+bwd; and
//                                                                   hand-written in lazy eager, forward)
//   bench_attention --pad-mm --device cuda                         compiled unaligned float16 GEMMs,
//                                                                  GEMM padding (pad_mm) on and off
//   bench_attention --sweep [--device D] [--dtype bfloat16|float16|float32] [--seq T]
//                   [--precision highest|high]                     sdpa alone over T (256..8192, or T),
//                                                                  head dims 64 and 128, causal and
//                                                                  not: forward and forward+backward,
//                                                                  TFLOP/s, peak bytes over the call
//                                                                  (bench/torch_sdpa_sweep.py: PyTorch);
//                                                                  float32 in TF32 under --precision high
//
// Peak memory: on CUDA the caching allocator's peak allocated bytes over a step; on the CPU the
// process's peak resident set over the first step, compile included (/proc/self/clear_refs
// resets it), so --memory runs one mode per process.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "kiln.h"

using kiln::Tensor;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kBatch = 16, kHeads = 4, kHead = 64, kModel = kHeads * kHead;

struct Block {
  std::vector<Tensor> params;  // ln1 w/b, w_qkv, b_qkv, w_o, b_o, ln2 w/b, w1, b1, w2, b2
  explicit Block(kiln::Device dev) {
    kiln::manual_seed(3);
    auto p = [&](std::vector<int64_t> shape, double scale, double shift = 0) {
      Tensor t = (kiln::randn(shape) * scale + shift).to(dev).requires_grad_();
      params.push_back(t);
    };
    p({kModel}, 0.02, 1);
    p({kModel}, 0.02);
    p({kModel, 3 * kModel}, 1 / std::sqrt(double(kModel)));
    p({3 * kModel}, 0.02);
    p({kModel, kModel}, 1 / std::sqrt(double(kModel)));
    p({kModel}, 0.02);
    p({kModel}, 0.02, 1);
    p({kModel}, 0.02);
    p({kModel, 4 * kModel}, 1 / std::sqrt(double(kModel)));
    p({4 * kModel}, 0.02);
    p({4 * kModel, kModel}, 1 / std::sqrt(4.0 * kModel));
    p({kModel}, 0.02);
    kiln::eval(params);
  }

  // Attention as people write it: scores, a causal mask from tril, softmax, weighted sum.
  static Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t t) {
    Tensor s = kiln::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(kHead)));
    Tensor causal = kiln::ones({t, t}, q.dtype(), q.device()).tril();
    s = s.masked_fill(causal == 0, -std::numeric_limits<double>::infinity());
    return kiln::matmul(kiln::softmax(s, -1), v);
  }

  Tensor loss(const Tensor& x) const {
    const auto& P = params;
    const int64_t t = x.size(1);
    Tensor h = kiln::layer_norm(x, {kModel}, P[0], P[1]);
    auto qkv = kiln::chunk(kiln::matmul(h, P[2]) + P[3], 3, -1);
    auto heads = [&](const Tensor& z) { return z.reshape({kBatch, t, kHeads, kHead}).transpose(1, 2); };
    Tensor a = attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), t).transpose(1, 2).reshape({kBatch, t, kModel});
    Tensor x1 = x + kiln::matmul(a, P[4]) + P[5];
    Tensor h2 = kiln::layer_norm(x1, {kModel}, P[6], P[7]);
    Tensor out = x1 + kiln::matmul(kiln::gelu(kiln::matmul(h2, P[8]) + P[9]), P[10]) + P[11];
    return out.square().mean();
  }
};

void sync(kiln::Device dev) {
  if (dev.type == kiln::DeviceType::CUDA) kiln::cuda::synchronize();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Peak resident bytes since the last reset (CPU), or the device's peak allocated bytes.
struct Peak {
  kiln::Device dev;
  int64_t start = 0;
  static int64_t status_kib(const char* key) {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::strlen(key));
    return 0;
  }
  void reset() {
    if (dev.type == kiln::DeviceType::CUDA) {
      kiln::cuda::reset_peak_memory_stats();
      start = kiln::cuda::memory_stats().allocated_bytes;
    } else {
      std::ofstream("/proc/self/clear_refs") << "5";
      start = status_kib("VmRSS:") * 1024;
    }
  }
  int64_t bytes() const {
    if (dev.type == kiln::DeviceType::CUDA) return kiln::cuda::memory_stats().peak_allocated_bytes - start;
    return status_kib("VmHWM:") * 1024 - start;
  }
};

kiln::Device parse_device(const std::string& s) {
  if (s == "cuda") return kiln::Device{kiln::DeviceType::CUDA, 0};
  return kiln::cpu();
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu", memory;
  int64_t seq = 256;
  int iters = 10;
  bool sdpa = false, pad_mm = false, sweep = false;
  std::string dtype = "bfloat16";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--device") && i + 1 < argc)
      device = argv[++i];
    else if (!std::strcmp(argv[i], "--seq") && i + 1 < argc)
      seq = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--memory") && i + 1 < argc)
      memory = argv[++i];
    else if (!std::strcmp(argv[i], "--sdpa"))
      sdpa = true;
    else if (!std::strcmp(argv[i], "--pad-mm"))
      pad_mm = true;
    else if (!std::strcmp(argv[i], "--sweep"))
      sweep = true, seq = 0;
    else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc)
      dtype = argv[++i];
    else if (!std::strcmp(argv[i], "--precision") && i + 1 < argc)
      kiln::set_float32_matmul_precision(argv[++i]);  // (float32: TF32 under "high")
    else {
      std::fprintf(stderr, "bench_attention: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  const kiln::Device dev = parse_device(device);
  if (dev.type == kiln::DeviceType::CUDA && !kiln::cuda::is_available()) {
    std::fprintf(stderr, "bench_attention: no CUDA device\n");
    return 1;
  }
  const std::string w = (sdpa ? "SDPA-T" : "TBLOCK-T") + std::to_string(seq);

  auto timed = [&](auto&& step) {
    for (int i = 0; i < 2; ++i) step();
    sync(dev);
    std::vector<double> ts;
    for (int i = 0; i < iters; ++i) {
      auto a = Clock::now();
      step();
      sync(dev);
      ts.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
    }
    return median(ts);
  };

  if (pad_mm) {  // unaligned half-precision GEMMs compiled with the rewrites on and off
    const int64_t shapes[][3] = {{4096, 4095, 4096}, {4096, 1001, 4096}, {8192, 2047, 8192}, {1024, 1023, 1024}};
    for (const auto& s : shapes) {
      Tensor a = kiln::randn({s[0], s[1]}).to(dev).to(kiln::kFloat16),
             b = kiln::randn({s[1], s[2]}).to(dev).to(kiln::kFloat16);
      double us[2];
      int matches = 0;
      for (int on = 0; on < 2; ++on) {
        kiln::patterns::set_enabled(on == 1);
        auto f = kiln::compile([](const Tensor& x, const Tensor& y) { return kiln::matmul(x, y); },
                               kiln::CompileOptions{on ? "pad_mm_on" : "pad_mm_off"});
        kiln::eval({f(a, b)});
        kiln::patterns::set_enabled(true);
        us[on] = timed([&] { kiln::eval({f(a, b)}); });
        if (on) matches = f.stats().pattern_matches;
      }
      std::printf(
          "{\"workload\": \"PADMM-%lldx%lldx%lld\", \"impl\": \"kiln-float16\", \"device\": \"%s\", \"us\": %.1f, "
          "\"us_unpadded\": %.1f, \"speedup\": %.2f, \"pattern_matches\": %d}\n",
          static_cast<long long>(s[0]), static_cast<long long>(s[1]), static_cast<long long>(s[2]), device.c_str(),
          us[1], us[0], us[0] / us[1], matches);
    }
    return 0;
  }

  if (sweep) {  // sdpa alone: FlashAttention's benchmark grid (16k tokens, model width 2048)
    const kiln::DType dt = dtype == "float32" ? kiln::kFloat32 : dtype == "float16" ? kiln::kFloat16 : kiln::kBFloat16;
    std::vector<int64_t> seqs = {256, 512, 1024, 2048, 4096, 8192};
    if (seq > 0) seqs = {seq};
    for (int64_t d : {64, 128})
      for (int causal = 0; causal < 2; ++causal)
        for (int64_t t : seqs) {
          const int64_t b = std::max<int64_t>(1, 16384 / t), h = 2048 / d;
          kiln::manual_seed(5);
          auto mk = [&] { return kiln::randn({b, h, t, d}, kiln::kFloat32, dev).to(dt).requires_grad_(); };
          Tensor q = mk(), k = mk(), v = mk(), go = kiln::randn({b, h, t, d}, kiln::kFloat32, dev).to(dt);
          kiln::eval({q, k, v, go});
          const double fwd = timed([&] {
            kiln::NoGradGuard ng;
            kiln::scaled_dot_product_attention(q, k, v, std::nullopt, causal == 1).eval();
          });
          Peak peak{dev};
          sync(dev);
          peak.reset();
          const double both = timed([&] {
            Tensor y = kiln::scaled_dot_product_attention(q, k, v, std::nullopt, causal == 1);
            kiln::eval(kiln::grad({(y * go).sum()}, {q, k, v}));
          });
          // FlashAttention's count: 4 b h t^2 d forward (half causal), 2.5 times that backward.
          const double flops = 4.0 * double(b * h) * double(t) * double(t) * double(d) / (causal ? 2 : 1);
          std::printf(
              "{\"workload\": \"SDPA-%s-d%lld-%s-T%lld\", \"impl\": \"%s\", \"device\": \"%s\", \"fwd_us\": %.1f, "
              "\"fwd_bwd_us\": %.1f, \"fwd_tflops\": %.1f, \"fwd_bwd_tflops\": %.1f, \"peak_bytes\": %lld}\n",
              dtype.c_str(), static_cast<long long>(d), causal ? "causal" : "full", static_cast<long long>(t),
              dt == kiln::kFloat32 && kiln::get_float32_matmul_precision() != "highest" ? "kiln-tf32" : "kiln",
              device.c_str(), fwd, both, flops / fwd / 1e6, 3.5 * flops / both / 1e6,
              static_cast<long long>(peak.bytes()));
          std::fflush(stdout);
        }
    return 0;
  }

  if (sdpa) {  // attention alone, forward + backward, causal: fused, and hand-written compiled
    kiln::manual_seed(5);
    auto mk = [&] { return kiln::randn({kBatch, kHeads, seq, kHead}).to(dev).requires_grad_(); };
    Tensor q = mk(), k = mk(), v = mk(), go = kiln::randn({kBatch, kHeads, seq, kHead}).to(dev);
    auto fused_with = [&](double p) {
      return timed([&] {
        Tensor y = kiln::scaled_dot_product_attention(q, k, v, std::nullopt, true, std::nullopt, p);
        kiln::eval(kiln::grad({(y * go).sum()}, {q, k, v}));
      });
    };
    const double fused = fused_with(0), fused_dropout = fused_with(0.1);
    auto hand = [&](bool on) {
      kiln::patterns::set_enabled(on);
      auto f = kiln::compile(
          [&](const Tensor& a, const Tensor& b, const Tensor& c) {
            Tensor y = Block::attention(a, b, c, seq);
            return kiln::grad({(y * go).sum()}, {a, b, c});
          },
          kiln::CompileOptions{on ? "sdpa_hand" : "sdpa_hand_nopatterns"});
      kiln::eval(f(q, k, v));
      kiln::patterns::set_enabled(true);
      return timed([&] { kiln::eval(f(q, k, v)); });
    };
    const double off = hand(false), on = hand(true);
    // Unchanged eager code (no compile), inference: the rewrite runs on the lazy segment's plan.
    auto eager = [&](bool on) {
      kiln::patterns::set_enabled(on);
      const Tensor a = q.detach(), b = k.detach(), c = v.detach();
      const double us = timed([&] { Block::attention(a, b, c, seq).eval(); });
      kiln::patterns::set_enabled(true);
      return us;
    };
    const double eager_off = eager(false), eager_on = eager(true);
    std::printf(
        "{\"workload\": \"%s-forward\", \"impl\": \"kiln-eager-hand-patterns-on\", \"device\": \"%s\", \"us\": %.1f}\n",
        w.c_str(), device.c_str(), eager_on);
    std::printf(
        "{\"workload\": \"%s-forward\", \"impl\": \"kiln-eager-hand-patterns-off\", \"device\": \"%s\", \"us\": "
        "%.1f}\n",
        w.c_str(), device.c_str(), eager_off);
    std::printf("{\"workload\": \"%s\", \"impl\": \"kiln-sdpa\", \"device\": \"%s\", \"us\": %.1f}\n", w.c_str(),
                device.c_str(), fused);
    std::printf("{\"workload\": \"%s-dropout0.1\", \"impl\": \"kiln-sdpa\", \"device\": \"%s\", \"us\": %.1f}\n",
                w.c_str(), device.c_str(), fused_dropout);
    std::printf("{\"workload\": \"%s\", \"impl\": \"kiln-hand-patterns-on\", \"device\": \"%s\", \"us\": %.1f}\n",
                w.c_str(), device.c_str(), on);
    std::printf("{\"workload\": \"%s\", \"impl\": \"kiln-hand-patterns-off\", \"device\": \"%s\", \"us\": %.1f}\n",
                w.c_str(), device.c_str(), off);
    return 0;
  }

  Block blk(dev);
  kiln::manual_seed(9);
  Tensor x = kiln::randn({kBatch, seq, kModel}).to(dev);
  kiln::eval({x});
  auto make = [&](bool patterns_on) {
    kiln::patterns::set_enabled(patterns_on);
    return kiln::compile(
        [&blk](const Tensor& xi) {
          Tensor l = blk.loss(xi);
          std::vector<Tensor> out = kiln::grad({l}, blk.params);
          out.insert(out.begin(), l);
          return out;
        },
        kiln::CompileOptions{patterns_on ? "tblock" : "tblock_nopatterns"});
  };

  if (!memory.empty()) {  // one mode, one step: its peak bytes
    // On CUDA after a warm-up step (the allocator counts bytes in use exactly). On the CPU the
    // first step, tracing and compiling included: CPU buffers freed by a warm-up stay cached in
    // kiln's pool and a later step's resident peak would not show them.
    Peak peak{dev};
    const bool cuda = dev.type == kiln::DeviceType::CUDA;
    if (!cuda) peak.reset();
    auto f = make(memory == "on");
    if (cuda) {
      kiln::eval(f(x));  // (traces under the setting)
      sync(dev);
      peak.reset();
    }
    auto r = f(x);
    kiln::eval(r);
    sync(dev);
    std::printf(
        "{\"workload\": \"%s\", \"impl\": \"kiln-patterns-%s\", \"device\": \"%s\", \"peak_bytes\": %lld, "
        "\"pattern_matches\": %d}\n",
        w.c_str(), memory.c_str(), device.c_str(), static_cast<long long>(peak.bytes()), f.stats().pattern_matches);
    return 0;
  }

  // (the setting applies when a call traces: each function traces under its own)
  auto on = make(true);
  std::vector<Tensor> ra = on(x);
  auto off = make(false);
  std::vector<Tensor> rb = off(x);
  kiln::patterns::set_enabled(true);
  kiln::eval(ra);
  kiln::eval(rb);
  // The two modes compute the same step (float32 rounding apart).
  double worst = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    Tensor a = ra[i].to(kiln::cpu()).to(kiln::kFloat64), b = rb[i].to(kiln::cpu()).to(kiln::kFloat64);
    const double scale = std::max(1e-12, b.abs().amax().item<double>());
    worst = std::max(worst, (a - b).abs().amax().item<double>() / scale);
    if (std::getenv("KILN_BENCH_VERBOSE"))
      std::fprintf(stderr, "output %zu: max |on - off| / max|off| = %.3e\n", i,
                   (a - b).abs().amax().item<double>() / scale);
  }
  auto time = [&](auto& f) { return timed([&] { kiln::eval(f(x)); }); };
  const double t_off = time(off), t_on = time(on);
  std::printf(
      "{\"workload\": \"%s\", \"impl\": \"kiln-patterns-on\", \"device\": \"%s\", \"us\": %.1f, "
      "\"pattern_matches\": %d, \"max_rel_diff_vs_off\": %.2e}\n",
      w.c_str(), device.c_str(), t_on, on.stats().pattern_matches, worst);
  std::printf("{\"workload\": \"%s\", \"impl\": \"kiln-patterns-off\", \"device\": \"%s\", \"us\": %.1f}\n", w.c_str(),
              device.c_str(), t_off);
  return 0;
}
