// Whole-workload benchmarks of kiln, side by side in one process with their baselines: the
// reference interpreter, hand-written loops (-O3 -march=native), xtensor and LibTorch (when
// built with them). Prints one JSON object per line and row; bench/run.sh turns them into a table.
//
//   bench_workloads [--quick] [--only W1,W2,W3,W5,W7,BW] [--impls kiln-jit,kiln-interp,hand-1T,...] [--threads N]
//   bench_workloads --first-call W1|W2|W3F|W3B|W5 [--label cold|warm]
//       (W6: wall time of the first call in this process, with the code cache's counters; run
//        it in a fresh process with KILN_CACHE_DIR set, see run.sh)
//   bench_workloads --profile W1|W2|W3F|W3B|W5 [--impl kiln-jit|kiln-interp] [--iters N]
//       (one kiln workload in a loop, for `perf record -g`)
//
// Workloads: W1 particles step (N = 2^20), W2 MLP train step (64-256-256-8, tanh, MSE, Adam,
// batch 4096), W3 softmax(gelu(layer_norm(x) w + b)) on 1024x1024 forward and forward+backward,
// W5 relu(2x+1) on 16 elements (latency per warm call), BW copy/triad memory bandwidth.
// The implementations of a workload are checked against kiln-jit's outputs once (max abs diff),
// then timed in interleaved rounds (median per call); every one gets --threads threads except
// the single-threaded hand-written loops and xtensor.
#include <tbb/global_control.h>
#include <tbb/info.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "baselines.h"
#include "jit/diag/profile.h"
#include "jit/exec/code_cache.h"
#include "jit/exec/jit_executor.h"
#include "kiln.h"

using namespace bench;
using kiln::Tensor;

namespace {

struct Opts {
  bool quick = false;
  std::set<std::string> only, impls;
  std::string first_call, label = "cold";
  int threads = 2;
  bool profile = false;
  std::string impl = "kiln-jit";
  int iters = 100;
  bool want(const std::string& w) const { return only.empty() || only.count(w); }
};

std::shared_ptr<kiln::Executor> g_jit, g_interp;

// ---------------- kiln runners ----------------
Tensor from(const std::vector<float>& v, const std::vector<int64_t>& shape) {
  return kiln::from_vector(v, shape).eval();
}

Runner<W1Result> kiln_w1(const W1Data& d, bool keep_a = false) {
  struct S {
    Tensor p, v, g, p2, v2, e;
  };
  auto s = std::make_shared<S>();
  s->p = from(d.p, {d.n, 3});
  s->v = from(d.v, {d.n, 3});
  s->g = from(std::vector<float>(d.g, d.g + 3), {3});
  const double k = d.k, c = d.c, dt = d.dt;
  Runner<W1Result> r;
  r.step = [s, k, c, dt, keep_a] {
    Tensor a = s->g - k * s->p - c * s->v;
    s->v2 = s->v + dt * a;
    if (!keep_a) a = Tensor();  // only p', v', e are materialized (a live handle would be too)
    s->p2 = s->p + dt * s->v2;
    s->e = 0.5 * (s->v2 * s->v2).sum();
    kiln::eval({s->p2, s->v2, s->e});
  };
  r.result = [s] { return W1Result{s->p2.to_vector<float>(), s->v2.to_vector<float>(), s->e.item<double>()}; };
  return r;
}

Runner<W7Result> kiln_w7(const W7Data& d) {
  struct S {
    Tensor p, v, p2, v2;
  };
  auto s = std::make_shared<S>();
  s->p = from(d.p, {d.n, 3});
  s->v = from(d.v, {d.n, 3});
  const double soft = d.soft, cut2 = d.cut2, dt = d.dt;
  Runner<W7Result> r;
  r.step = [s, soft, cut2, dt] {
    Tensor dlt = s->p.unsqueeze(0) - s->p.unsqueeze(1);  // [N, N, 3]: p_j - p_i
    Tensor r2 = (dlt * dlt).sum({-1}) + soft;  // [N, N]
    Tensor w = where(r2 < cut2, 1.0 / (r2 * sqrt(r2)), 0.0);
    Tensor f = (dlt * w.unsqueeze(-1)).sum({1});  // [N, 3]
    dlt = r2 = w = Tensor();
    s->v2 = s->v + f * dt;
    s->p2 = s->p + s->v2 * dt;
    kiln::eval({s->p2, s->v2});
  };
  r.result = [s] { return W7Result{s->p2.to_vector<float>(), s->v2.to_vector<float>()}; };
  return r;
}

Runner<W2Result> kiln_w2(const W2Data& d) {
  namespace nn = kiln::nn;
  struct S {
    std::shared_ptr<nn::Sequential> net;
    std::unique_ptr<kiln::optim::Adam> opt;
    std::vector<Tensor> params;
    Tensor x, y, loss;
  };
  auto s = std::make_shared<S>();
  const auto& dims = d.dims;
  s->net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(dims[0], dims[1]), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(dims[1], dims[2]), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(dims[2], dims[3])});
  std::map<std::string, Tensor> sd;
  for (size_t l = 0; l + 1 < dims.size(); ++l) {
    sd[std::to_string(2 * l) + ".weight"] = from(d.weights[l], {dims[l + 1], dims[l]});
    sd[std::to_string(2 * l) + ".bias"] = from(d.biases[l], {dims[l + 1]});
  }
  s->net->load_state_dict(sd);
  s->params = s->net->parameters();
  kiln::eval(s->params);
  s->opt = std::make_unique<kiln::optim::Adam>(s->params, kiln::optim::AdamOptions{.lr = d.lr});
  s->x = from(d.x, {d.batch, dims.front()});
  s->y = from(d.y, {d.batch, dims.back()});
  Runner<W2Result> r;
  r.step = [s] {
    s->opt->zero_grad();
    Tensor out = (*s->net)(s->x);
    s->loss = kiln::mse_loss(out, s->y);
    s->loss.backward();
    s->opt->step();
    std::vector<Tensor> all = s->params;
    all.push_back(s->loss);
    kiln::eval(all);
  };
  r.result = [s] {
    W2Result res;
    for (auto& p : s->params) {  // Linear registers weight then bias, layers in order
      auto v = p.to_vector<float>();
      res.params.insert(res.params.end(), v.begin(), v.end());
    }
    res.loss = s->loss.item<double>();
    return res;
  };
  return r;
}

struct KW3 {
  Tensor x, w, b, gy, y, gx, gw, gb;
  int64_t cols;
  double eps;
};
std::shared_ptr<KW3> kiln_w3_state(const W3Data& d, bool grad) {
  auto s = std::make_shared<KW3>();
  s->x = from(d.x, {d.rows, d.cols});
  s->w = from(d.w, {d.cols});
  s->b = from(d.b, {d.cols});
  s->gy = from(d.gy, {d.rows, d.cols});
  if (grad) {
    s->x.requires_grad_();
    s->w.requires_grad_();
    s->b.requires_grad_();
  }
  s->cols = d.cols;
  s->eps = d.eps;
  return s;
}
Tensor kiln_w3_forward(const KW3& s) {
  return kiln::softmax(kiln::gelu(kiln::layer_norm(s.x, {s.cols}, s.w, s.b, s.eps)), -1);
}

Runner<W3Result> kiln_w3_fwd(const W3Data& d) {
  auto s = kiln_w3_state(d, false);
  Runner<W3Result> r;
  r.step = [s] { s->y = kiln_w3_forward(*s).eval(); };
  r.result = [s] {
    W3Result res;
    res.y = s->y.to_vector<float>();
    return res;
  };
  return r;
}

Runner<W3Result> kiln_w3_fwdbwd(const W3Data& d) {
  auto s = kiln_w3_state(d, true);
  Runner<W3Result> r;
  r.step = [s] {
    s->y = kiln_w3_forward(*s);
    auto g = kiln::grad({s->y}, {s->x, s->w, s->b}, {s->gy});
    s->gx = g[0];
    s->gw = g[1];
    s->gb = g[2];
    kiln::eval({s->y, s->gx, s->gw, s->gb});
  };
  r.result = [s] {
    return W3Result{s->y.to_vector<float>(), s->gx.to_vector<float>(), s->gw.to_vector<float>(),
                    s->gb.to_vector<float>()};
  };
  return r;
}

Runner<W3Result> kiln_w5(const std::vector<float>& xv) {
  struct S {
    Tensor x, y;
  };
  auto s = std::make_shared<S>();
  s->x = from(xv, {static_cast<int64_t>(xv.size())});
  Runner<W3Result> r;
  r.step = [s] { s->y = kiln::relu(2 * s->x + 1).eval(); };
  r.result = [s] {
    W3Result res;
    res.y = s->y.to_vector<float>();
    return res;
  };
  return r;
}

// ---------------- helpers ----------------
struct Impl {
  std::string name;
  int threads;
  std::shared_ptr<kiln::Executor> executor;  // set for kiln implementations
};

// Times several implementations of one workload in interleaved rounds (A B C A B C ...), so that
// a transient disturbance hits all of them alike. Each block re-warms with one untimed call.
// Returns per-call timings (median/min over all timed repetitions of each implementation).
template <class E>
std::vector<Timing> time_interleaved(std::vector<E>& es, int reps, int inner = 1, int warmup = 3) {
  const int rounds = std::max(1, std::min(reps / 3, 5));
  const int per = (reps + rounds - 1) / rounds;
  std::vector<std::vector<double>> samples(es.size());
  for (auto& e : es) {
    if (e.impl.executor) kiln::set_executor(e.impl.executor);
    for (int i = 0; i < warmup; ++i) e.r.step();
  }
  // KILN_JIT=tiered: time the final (LLVM) code, swapped in once its background compile is done.
  kiln::jit::wait_background_compiles();
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < es.size(); ++k) {
      auto& e = es[k];
      if (e.impl.executor) kiln::set_executor(e.impl.executor);
      settle();
      e.r.step();
      for (int i = 0; i < per; ++i) {
        auto a = Clock::now();
        for (int j = 0; j < inner; ++j) e.r.step();
        samples[k].push_back(ms_since(a) / inner);
      }
    }
  }
  kiln::set_executor(g_jit);
  std::vector<Timing> out;
  for (auto& s : samples) {
    std::sort(s.begin(), s.end());
    Timing t;
    t.median_ms = s[s.size() / 2];
    t.min_ms = s.front();
    t.reps = static_cast<int>(s.size());
    t.inner = inner;
    out.push_back(t);
  }
  return out;
}

template <class R>
R first_result(Runner<R>& r, const Impl& impl) {
  if (impl.executor) kiln::set_executor(impl.executor);
  r.step();
  R res = r.result();
  kiln::set_executor(g_jit);
  return res;
}

double w3_diff(const W3Result& a, const W3Result& b) {
  double m = max_abs_diff(a.y, b.y);
  if (!a.gx.empty() || !b.gx.empty()) {
    m = std::max({m, max_abs_diff(a.gx, b.gx), max_abs_diff(a.gw, b.gw), max_abs_diff(a.gb, b.gb)});
  }
  return m;
}

// Keeps only the implementations named by --impls (all when it is empty).
template <class E>
void filter_impls(std::vector<E>& es, const Opts& o) {
  if (o.impls.empty()) return;
  std::vector<E> kept;
  for (auto& e : es)
    if (o.impls.count(e.impl.name)) kept.push_back(e);
  es = std::move(kept);
}

// ---------------- workloads ----------------
struct BW {
  double copy1 = 0, triad1 = 0, copyn = 0, triadn = 0;
};

BW run_bw(const Opts& o) {
  int64_t n = o.quick ? (int64_t{1} << 24) : (int64_t{1} << 26);  // 64 MiB / 256 MiB per buffer
  int reps = o.quick ? 5 : 10;
  BW bw;
  bw.copy1 = hand::copy_gbs(n, 1, reps);
  bw.triad1 = hand::triad_gbs(n, 1, reps);
  bw.copyn = hand::copy_gbs(n, o.threads, reps);
  bw.triadn = hand::triad_gbs(n, o.threads, reps);
  double mib = n * 4.0 / (1 << 20);
  // The same at W1's array size (3 x 2^20 floats = 12 MiB per array): what W1's traffic can
  // reach on this machine, caches included.
  const int64_t n1 = int64_t{3} << 20;
  double t1 = hand::triad_gbs(n1, 1, 20), tn = hand::triad_gbs(n1, o.threads, 20);
  Row("BW", "copy-1T").num("gbs", bw.copy1).num("threads", 1).num("buffer_mib", mib).print();
  Row("BW", "triad-1T").num("gbs", bw.triad1).num("threads", 1).num("buffer_mib", mib).print();
  Row("BW", "copy-" + std::to_string(o.threads) + "T")
      .num("gbs", bw.copyn)
      .num("threads", o.threads)
      .num("buffer_mib", mib)
      .print();
  Row("BW", "triad-" + std::to_string(o.threads) + "T")
      .num("gbs", bw.triadn)
      .num("threads", o.threads)
      .num("buffer_mib", mib)
      .print();
  Row("BW", "triad-1T@W1").num("gbs", t1).num("threads", 1).num("buffer_mib", 12).print();
  Row("BW", "triad-" + std::to_string(o.threads) + "T@W1")
      .num("gbs", tn)
      .num("threads", o.threads)
      .num("buffer_mib", 12)
      .print();
  return bw;
}

void run_w1(const Opts& o) {
  W1Data d;
  d.init(int64_t{1} << 20);
  const int reps = o.quick ? 15 : 40;
  const double bytes = 4.0 * 3 * 4 * d.n;  // read p, v; write p', v'
  struct Entry {
    Impl impl;
    Runner<W1Result> r;
  };
  std::vector<Entry> es;
  es.push_back({{"kiln-jit", o.threads, g_jit}, kiln_w1(d)});
  es.push_back({{"kiln-interp", o.threads, g_interp}, kiln_w1(d)});
  es.push_back({{"hand-1T", 1, nullptr}, hand::w1(d, 1)});
  if (o.threads > 1)
    es.push_back({{"hand-" + std::to_string(o.threads) + "T", o.threads, nullptr}, hand::w1(d, o.threads)});
#ifdef KILN_BENCH_XTENSOR
  es.push_back({{"xtensor", 1, nullptr}, xt::w1(d)});
#endif
#ifdef KILN_BENCH_TORCH
  es.push_back({{"torch", o.threads, nullptr}, torchb::w1(d)});
#endif
  filter_impls(es, o);
  if (es.empty()) return;
  W1Result ref = first_result(es[0].r, es[0].impl);
  std::vector<W1Result> results;
  for (auto& e : es) results.push_back(&e == &es[0] ? ref : first_result(e.r, e.impl));
  std::vector<Timing> ts = time_interleaved(es, reps);
  for (size_t i = 0; i < es.size(); ++i) {
    auto& e = es[i];
    const W1Result& res = results[i];
    double diff = std::max(max_abs_diff(res.p2, ref.p2), max_abs_diff(res.v2, ref.v2));
    double erel = std::fabs(res.e - ref.e) / std::max(1e-30, std::fabs(ref.e));
    const Timing& t = ts[i];
    Row("W1", e.impl.name)
        .timing(t)
        .num("threads", e.impl.threads)
        .num("gbs", bytes / (t.median_ms * 1e-3) / 1e9)
        .num("max_abs_diff", &e == &es[0] ? NAN : diff)
        .num("e_rel_diff", &e == &es[0] ? NAN : erel)
        .num("e", res.e)
        .print();
  }
}

void run_w7(const Opts& o) {
  W7Data d;
  d.init(2048);
  const int reps = o.quick ? 9 : 25;
  struct Entry {
    Impl impl;
    Runner<W7Result> r;
  };
  std::vector<Entry> es;
  es.push_back({{"kiln-jit", o.threads, g_jit}, kiln_w7(d)});
  es.push_back({{"hand-1T", 1, nullptr}, hand::w7(d, 1)});
  if (o.threads > 1)
    es.push_back({{"hand-" + std::to_string(o.threads) + "T", o.threads, nullptr}, hand::w7(d, o.threads)});
  filter_impls(es, o);
  if (es.empty()) return;
  W7Result ref = first_result(es[0].r, es[0].impl);
  std::vector<W7Result> results;
  for (auto& e : es) results.push_back(&e == &es[0] ? ref : first_result(e.r, e.impl));
  std::vector<Timing> ts = time_interleaved(es, reps);
  const double pairs = static_cast<double>(d.n) * static_cast<double>(d.n);
  for (size_t i = 0; i < es.size(); ++i) {
    const double diff = std::max(max_abs_diff(results[i].p2, ref.p2), max_abs_diff(results[i].v2, ref.v2));
    Row("W7", es[i].impl.name)
        .timing(ts[i])
        .num("threads", es[i].impl.threads)
        .num("gpairs_per_s", pairs / (ts[i].median_ms * 1e-3) / 1e9)
        .num("max_abs_diff", &es[i] == &es[0] ? NAN : diff)
        .print();
  }
}

void run_w2(const Opts& o) {
  W2Data d;
  d.init(4096);
  const int reps = o.quick ? 8 : 25;
  const int check_steps = 3;
  struct Entry {
    Impl impl;
    Runner<W2Result> r;
  };
  std::vector<Entry> es;
  es.push_back({{"kiln-jit", o.threads, g_jit}, kiln_w2(d)});
  es.push_back({{"kiln-interp", o.threads, g_interp}, kiln_w2(d)});
#ifdef KILN_BENCH_TORCH
  es.push_back({{"torch", o.threads, nullptr}, torchb::w2(d)});
#endif
  filter_impls(es, o);
  if (es.empty()) return;
  // Agreement: the same initial weights and data, `check_steps` steps each.
  std::vector<W2Result> res;
  for (auto& e : es) {
    if (e.impl.executor) kiln::set_executor(e.impl.executor);
    for (int i = 0; i < check_steps; ++i) e.r.step();
    res.push_back(e.r.result());
    kiln::set_executor(g_jit);
  }
  std::vector<Timing> ts = time_interleaved(es, reps, 1, 2);
  for (size_t i = 0; i < es.size(); ++i) {
    const Timing& t = ts[i];
    Row("W2", es[i].impl.name)
        .timing(t)
        .num("threads", es[i].impl.threads)
        .num("max_abs_diff", i == 0 ? NAN : max_abs_diff(res[i].params, res[0].params))
        .num("loss_diff", i == 0 ? NAN : std::fabs(res[i].loss - res[0].loss))
        .num("loss_after_3", res[i].loss)
        .print();
  }
}

void run_w3(const Opts& o) {
  W3Data d;
  d.init(1024, 1024);
  const int reps = o.quick ? 10 : 30;
  struct Entry {
    std::string workload;
    Impl impl;
    Runner<W3Result> r;
  };
  std::vector<Entry> es;
  const std::string nT = std::to_string(o.threads) + "T";
  es.push_back({"W3F", {"kiln-jit", o.threads, g_jit}, kiln_w3_fwd(d)});
  es.push_back({"W3F", {"kiln-interp", o.threads, g_interp}, kiln_w3_fwd(d)});
  es.push_back({"W3F", {"hand-1T", 1, nullptr}, hand::w3_fwd(d, 1)});
  if (o.threads > 1) es.push_back({"W3F", {"hand-" + nT, o.threads, nullptr}, hand::w3_fwd(d, o.threads)});
  if (hand::have_mvec() && d.cols % 16 == 0) {
    es.push_back({"W3F", {"hand-1T-mvec", 1, nullptr}, hand::w3_fwd_mvec(d, 1)});
    if (o.threads > 1)
      es.push_back({"W3F", {"hand-" + nT + "-mvec", o.threads, nullptr}, hand::w3_fwd_mvec(d, o.threads)});
  }
#ifdef KILN_BENCH_XTENSOR
  es.push_back({"W3F", {"xtensor", 1, nullptr}, xt::w3_fwd(d)});
#endif
#ifdef KILN_BENCH_TORCH
  es.push_back({"W3F", {"torch", o.threads, nullptr}, torchb::w3_fwd(d)});
#endif
  es.push_back({"W3B", {"kiln-jit", o.threads, g_jit}, kiln_w3_fwdbwd(d)});
  es.push_back({"W3B", {"kiln-interp", o.threads, g_interp}, kiln_w3_fwdbwd(d)});
#ifdef KILN_BENCH_TORCH
  es.push_back({"W3B", {"torch", o.threads, nullptr}, torchb::w3_fwdbwd(d)});
#endif
  filter_impls(es, o);
  if (es.empty()) return;
  for (const std::string w : {"W3F", "W3B"}) {
    std::vector<Entry> part;
    for (auto& e : es)
      if (e.workload == w) part.push_back(e);
    std::vector<W3Result> results;
    for (auto& e : part) results.push_back(first_result(e.r, e.impl));
    std::vector<Timing> ts = time_interleaved(part, reps);
    for (size_t i = 0; i < part.size(); ++i)
      Row(w, part[i].impl.name)
          .timing(ts[i])
          .num("threads", part[i].impl.threads)
          .num("max_abs_diff", i == 0 ? NAN : w3_diff(results[i], results[0]))
          .print();
  }
}

void run_w5(const Opts& o) {
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[i] = 0.25f * static_cast<float>(i - 8);
  std::vector<float> expect(16);
  for (int i = 0; i < 16; ++i) expect[i] = std::max(0.f, 2 * x[i] + 1);
  const int reps = o.quick ? 15 : 41, inner = o.quick ? 2000 : 5000;
  struct Entry {
    Impl impl;
    Runner<W3Result> r;
  };
  std::vector<Entry> es;
  es.push_back({{"kiln-jit", o.threads, g_jit}, kiln_w5(x)});
  es.push_back({{"kiln-interp", o.threads, g_interp}, kiln_w5(x)});
#ifdef KILN_BENCH_TORCH
  es.push_back({{"torch", o.threads, nullptr}, torchb::w5(x)});
#endif
  filter_impls(es, o);
  if (es.empty()) return;
  W3Result ref;
  ref.y = expect;
  std::vector<W3Result> results;
  for (auto& e : es) results.push_back(first_result(e.r, e.impl));
  std::vector<Timing> ts = time_interleaved(es, reps, inner, 200);
  for (size_t i = 0; i < es.size(); ++i)
    Row("W5", es[i].impl.name)
        .timing(ts[i])
        .num("us", ts[i].median_ms * 1e3)
        .num("threads", es[i].impl.threads)
        .num("max_abs_diff", max_abs_diff(results[i].y, ref.y))
        .print();
}

// ---------------- W6: first call in a fresh process ----------------
int first_call(const Opts& o) {
  // Inputs are built on the interpreter so that nothing is compiled before the timed call.
  kiln::set_executor(g_interp);
  std::function<void()> step;
  std::shared_ptr<void> keep;
  const std::string& w = o.first_call;
  static W1Data d1;
  static W2Data d2;
  static W3Data d3;
  static std::vector<float> x5(16, 0.5f);
  if (w == "W1") {
    d1.init(int64_t{1} << 20);
    auto r = std::make_shared<Runner<W1Result>>(kiln_w1(d1));
    step = r->step;
    keep = r;
  } else if (w == "W2") {
    d2.init(4096);
    auto r = std::make_shared<Runner<W2Result>>(kiln_w2(d2));
    step = r->step;
    keep = r;
  } else if (w == "W3F" || w == "W3B") {
    d3.init(1024, 1024);
    auto r = std::make_shared<Runner<W3Result>>(w == "W3F" ? kiln_w3_fwd(d3) : kiln_w3_fwdbwd(d3));
    step = r->step;
    keep = r;
  } else if (w == "W5") {
    auto r = std::make_shared<Runner<W3Result>>(kiln_w5(x5));
    step = r->step;
    keep = r;
  } else {
    std::fprintf(stderr, "unknown --first-call workload '%s'\n", w.c_str());
    return 2;
  }
  kiln::set_executor(g_jit);
  kiln::jit::reset_cache_stats();
  auto t0 = Clock::now();
  step();
  double first_ms = ms_since(t0);
  kiln::jit::CacheStats cs = kiln::jit::cache_stats();
  t0 = Clock::now();
  step();
  double second_ms = ms_since(t0);
  Timing steady = time_calls(step, 5, 0);
  // Tiered: the first calls ran asmjit code for pointwise kernels; then LLVM swaps in (the
  // disk entries of the warm run are written by those background compiles).
  kiln::jit::wait_background_compiles();
  kiln::jit::CacheStats after = kiln::jit::cache_stats();
  Timing swapped = time_calls(step, 5, 1);
  const char* modes[] = {"interp", "llvm", "asmjit", "tiered"};
  Row("W6", o.label)
      .str("case", w)
      .str("cache_dir", kiln::jit::cache_dir())
      .num("first_ms", first_ms)
      .num("second_ms", second_ms)
      .num("steady_ms", steady.median_ms)
      .num("compiles", static_cast<double>(cs.compiles))
      .num("compile_ms", cs.compile_ms)
      .num("disk_hits", static_cast<double>(cs.disk_hits))
      .num("load_ms", cs.load_ms)
      .num("mem_hits", static_cast<double>(cs.hits))
      .str("mode", modes[static_cast<int>(kiln::jit::jit_mode())])
      .num("quick_compiles", static_cast<double>(cs.quick_compiles))
      .num("quick_compile_us", cs.quick_compile_us)
      .num("background_swaps", static_cast<double>(after.background_swaps))
      .num("swapped_steady_ms", swapped.median_ms)
      .print();
  return 0;
}

// ---------------- --profile: one kiln workload in a loop (for perf record) ----------------
int profile(const Opts& o, const std::string& impl, int iters) {
  kiln::set_executor(impl == "kiln-interp" ? g_interp : g_jit);
  static W1Data d1;
  static W2Data d2;
  static W3Data d3;
  static std::vector<float> x5(16, 0.5f);
  std::function<void()> step;
  std::shared_ptr<void> keep;
  const std::string& w = o.first_call;
  auto hold = [&](auto r) {
    auto p = std::make_shared<decltype(r)>(std::move(r));
    step = p->step;
    keep = p;
  };
  if (w == "W1")
    d1.init(int64_t{1} << 20), hold(kiln_w1(d1));
  else if (w == "W1A")
    d1.init(int64_t{1} << 20), hold(kiln_w1(d1, true));  // README-style: `a` alive
  else if (w == "W2")
    d2.init(4096), hold(kiln_w2(d2));
  else if (w == "W3F")
    d3.init(1024, 1024), hold(kiln_w3_fwd(d3));
  else if (w == "W3B")
    d3.init(1024, 1024), hold(kiln_w3_fwdbwd(d3));
  else if (w == "W5")
    hold(kiln_w5(x5));
  else {
    std::fprintf(stderr, "unknown --profile workload '%s'\n", w.c_str());
    return 2;
  }
  for (int i = 0; i < 3; ++i) step();
  kiln::jit::wait_background_compiles();
  kiln::jit::profile_reset();  // KILN_PROFILE=1: the timed iterations only (no compiles, no first GEMM's JIT)
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) step();
  double ms = ms_since(t0);
  std::printf("%s %s: %d iterations, %.4f ms per call\n", w.c_str(), impl.c_str(), iters, ms / iters);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--quick")
      o.quick = true;
    else if (a == "--only") {
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ',')) o.only.insert(item);
    } else if (a == "--first-call")
      o.first_call = next();
    else if (a == "--label")
      o.label = next();
    else if (a == "--impls") {
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ',')) o.impls.insert(item);
    } else if (a == "--profile")
      o.first_call = next(), o.profile = true;
    else if (a == "--impl")
      o.impl = next();
    else if (a == "--iters")
      o.iters = std::atoi(next().c_str());
    else if (a == "--threads")
      o.threads = std::atoi(next().c_str());
    else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--only W1,W2,W3,W5,W7,BW] [--impls kiln-jit,torch,...] [--threads N]\n"
                   "       %s --first-call W1|W2|W3F|W3B|W5 [--label cold|warm]\n"
                   "       %s --profile W1|W2|W3F|W3B|W5 [--impl kiln-jit|kiln-interp] [--iters N]\n",
                   argv[0], argv[0], argv[0]);
      return 2;
    }
  }
  // Every implementation gets the same number of threads (TBB for kiln and the 2-thread loops,
  // OpenMP for LibTorch).
  tbb::global_control gc(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(o.threads));
  g_jit = kiln::jit::jit_executor();
  g_interp = kiln::interpreter();
  kiln::set_executor(g_jit);
  if (o.profile) return profile(o, o.impl, o.iters);
  if (!o.first_call.empty()) return first_call(o);

#ifdef KILN_BENCH_TORCH
  torchb::set_threads(o.threads);
#endif
  {
    Row r("INFO", "env");
    r.num("threads", o.threads).num("hw_threads", tbb::info::default_concurrency()).num("quick", o.quick);
#ifdef KILN_BENCH_XTENSOR
    r.str("xtensor", xt::info());
#endif
#ifdef KILN_BENCH_TORCH
    r.str("torch", torchb::info());
#endif
    r.str("cache_dir", kiln::jit::cache_dir());
    r.print();
  }
  if (o.want("BW")) run_bw(o);
  if (o.want("W1")) run_w1(o);
  if (o.want("W3")) run_w3(o);
  if (o.want("W2")) run_w2(o);
  if (o.want("W7")) run_w7(o);
  if (o.want("W5")) run_w5(o);
  return 0;
}
