// kiln::compile benchmarks, each beside lazy eager mode in the same process (JSON rows):
//   W4  MLP 64-256-256-8 (tanh) forward over 64 batch sizes 1000, 1061, ..., 4843: the first
//       pass (compiles included) and steady passes, compiled vs lazy eager; compile count.
//   W2C the W2 training step (MLP 64-256-256-8, MSE, Adam, batch 4096) compiled vs lazy eager.
//   W5C relu(2x+1) on 16 elements: compiled vs lazy eager latency per warm call.
//   GUARD the cost of a guard hit for a 4-input function.
// Usage: bench_compile [--quick]
#include <algorithm>
#include <cstring>

#include "bench_common.h"
#include "jit/exec/code_cache.h"
#include "kiln.h"

using namespace bench;
using kiln::Tensor;

namespace {

std::shared_ptr<kiln::nn::Sequential> mlp(const std::vector<int64_t>& d) {
  namespace nn = kiln::nn;
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(d[0], d[1]), std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(d[1], d[2]),
      std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(d[2], d[3])});
}

void run_w4(bool quick) {
  kiln::NoGradGuard ng;  // inference
  kiln::manual_seed(1);
  auto net = mlp({64, 256, 256, 8});
  std::vector<Tensor> xs;
  for (int i = 0; i < 64; ++i) xs.push_back(kiln::randn({1000 + 61 * i, 64}).eval());
  auto eager_pass = [&] {
    for (const auto& x : xs) (*net)(x).eval();
  };
  // First passes from an empty in-process code cache (the disk cache is a fresh directory).
  kiln::jit::clear_memory_cache();
  auto t0 = Clock::now();
  eager_pass();
  double eager_first = ms_since(t0);
  kiln::jit::clear_memory_cache();
  auto f = kiln::compile([&](const Tensor& x) { return (*net)(x); }, kiln::CompileOptions{"w4"});
  auto compiled_pass = [&] {
    for (const auto& x : xs) f(x);
  };
  t0 = Clock::now();
  compiled_pass();
  double compiled_first = ms_since(t0);
  const int entries = f.stats().entries;
  // Agreement on a few sizes.
  double diff = 0;
  for (int i : {0, 31, 63})
    diff = std::max(diff, max_abs_diff(f(xs[i]).to_vector<float>(), (*net)(xs[i]).to_vector<float>()));
  const int reps = quick ? 5 : 11;
  Timing te = time_calls(eager_pass, reps, 1);
  settle();
  Timing tc = time_calls(compiled_pass, reps, 1);
  Row("W4", "first-pass")
      .num("eager_ms", eager_first)
      .num("compiled_ms", compiled_first)
      .num("ratio", compiled_first / eager_first)
      .num("compiles", entries)
      .num("max_abs_diff", diff)
      .print();
  Row("W4", "steady-pass")
      .num("eager_ms", te.median_ms)
      .num("compiled_ms", tc.median_ms)
      .num("speedup", te.median_ms / tc.median_ms)
      .num("reps", te.reps)
      .print();
}

void run_w2c(bool quick) {
  W2Data d;
  d.init(4096);
  struct Setup {
    std::shared_ptr<kiln::nn::Sequential> net;
    std::unique_ptr<kiln::optim::Adam> opt;
    Tensor x, y;
  };
  auto make = [&] {
    Setup s;
    s.net = mlp(d.dims);
    std::map<std::string, Tensor> sd;
    for (size_t l = 0; l + 1 < d.dims.size(); ++l) {
      sd[std::to_string(2 * l) + ".weight"] =
          kiln::from_vector(d.weights[l], std::vector<int64_t>{d.dims[l + 1], d.dims[l]});
      sd[std::to_string(2 * l) + ".bias"] = kiln::from_vector(d.biases[l], std::vector<int64_t>{d.dims[l + 1]});
    }
    s.net->load_state_dict(sd);
    kiln::eval(s.net->parameters());
    s.opt = std::make_unique<kiln::optim::Adam>(s.net->parameters(), kiln::optim::AdamOptions{.lr = d.lr});
    s.x = kiln::from_vector(d.x, std::vector<int64_t>{d.batch, d.dims.front()}).eval();
    s.y = kiln::from_vector(d.y, std::vector<int64_t>{d.batch, d.dims.back()}).eval();
    return s;
  };
  auto step = [](Setup& s) {
    s.opt->zero_grad();
    Tensor loss = kiln::mse_loss((*s.net)(s.x), s.y);
    loss.backward();
    s.opt->step();
    return loss.detach();
  };
  Setup e = make(), c = make();
  auto eager_step = [&] {
    Tensor l = step(e);
    std::vector<Tensor> all = e.net->parameters();
    all.push_back(l);
    kiln::eval(all);
  };
  auto f = kiln::compile(
      [&](const Tensor& x, const Tensor& y) {
        c.x = x;
        c.y = y;
        return step(c);
      },
      kiln::CompileOptions{"w2"});
  Tensor cx = c.x, cy = c.y;
  auto compiled_step = [&] { f(cx, cy); };
  double first_ms;
  {
    auto t0 = Clock::now();
    compiled_step();
    first_ms = ms_since(t0);
  }
  for (int i = 0; i < 2; ++i) eager_step(), compiled_step();
  eager_step();  // both have now taken 4 steps
  std::vector<float> pe, pc;
  for (auto& p : e.net->parameters())
    for (float v : p.to_vector<float>()) pe.push_back(v);
  for (auto& p : c.net->parameters())
    for (float v : p.to_vector<float>()) pc.push_back(v);
  const int reps = quick ? 8 : 25;
  Timing te = time_calls(eager_step, reps, 1);
  settle();
  Timing tc = time_calls(compiled_step, reps, 1);
  Row("W2C", "lazy-eager").timing(te).print();
  Row("W2C", "compiled")
      .timing(tc)
      .num("speedup", te.median_ms / tc.median_ms)
      .num("first_call_ms", first_ms)
      .num("max_abs_diff", max_abs_diff(pc, pe))
      .num("entries", f.stats().entries)
      .print();
}

void run_w5c(bool quick) {
  std::vector<float> xv(16);
  for (int i = 0; i < 16; ++i) xv[i] = 0.25f * static_cast<float>(i - 8);
  Tensor x = kiln::from_vector(xv, std::vector<int64_t>{16}).eval();
  auto fn = [](const Tensor& t) { return (2 * t + 1).relu(); };
  auto f = kiln::compile(fn, kiln::CompileOptions{"w5"});
  const int reps = quick ? 15 : 41, inner = quick ? 5000 : 20000;
  Timing te = time_calls([&] { fn(x).eval(); }, reps, 200, inner);
  settle();
  Timing tc = time_calls([&] { f(x); }, reps, 200, inner);
  double diff = max_abs_diff(f(x).to_vector<float>(), fn(x).to_vector<float>());
  Row("W5C", "lazy-eager").timing(te).num("us", te.median_ms * 1e3).print();
  Row("W5C", "compiled").timing(tc).num("us", tc.median_ms * 1e3).num("max_abs_diff", diff).print();
}

void run_guard(bool quick) {
  std::vector<Tensor> in;
  for (int i = 0; i < 4; ++i) in.push_back(kiln::randn({64, 32}).eval());
  auto f =
      kiln::compile([](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d) { return a * b + c * d; });
  f(in[0], in[1], in[2], in[3]);
  bool ok = f.guards_pass(in[0], in[1], in[2], in[3]);
  const int reps = quick ? 15 : 41, inner = quick ? 20000 : 100000;
  Timing t = time_calls([&] { f.guards_pass(in[0], in[1], in[2], in[3]); }, reps, 1000, inner);
  Row("GUARD", "4-input").timing(t).num("ns", t.median_ms * 1e6).num("hit", ok ? 1 : 0).print();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--only W4|W2C|W5C|GUARD]\n", argv[0]);
      return 2;
    }
  }
  auto want = [&](const char* w) { return only.empty() || only == w; };
  if (want("GUARD")) run_guard(quick);
  if (want("W5C")) run_w5c(quick);
  if (want("W4")) run_w4(quick);
  if (want("W2C")) run_w2c(quick);
  return 0;
}
