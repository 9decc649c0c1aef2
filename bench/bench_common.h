// Shared pieces of the workload benchmarks (bench_workloads and its baselines): workload
// data as plain arrays, timing, JSON rows. Includes neither kiln nor any baseline library, so
// each baseline lives in its own translation unit with its own compile flags.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace bench {

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Timing of a repeated call: median (and min) over repetitions, after `warmup` calls.
// Each repetition runs `inner` calls; the figure is per call.
struct Timing {
  double median_ms = 0, min_ms = 0;
  int reps = 0, inner = 1;
};
inline Timing time_calls(const std::function<void()>& f, int reps, int warmup = 2, int inner = 1,
                         double max_total_s = 30) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  auto start = Clock::now();
  for (int r = 0; r < reps; ++r) {
    auto a = Clock::now();
    for (int i = 0; i < inner; ++i) f();
    t.push_back(ms_since(a) / inner);
    if (std::chrono::duration<double>(Clock::now() - start).count() > max_total_s && t.size() >= 3) break;
  }
  std::sort(t.begin(), t.end());
  Timing res;
  res.median_ms = t[t.size() / 2];
  res.min_ms = t.front();
  res.reps = static_cast<int>(t.size());
  res.inner = inner;
  return res;
}

// Lets spinning worker threads of the previous library (OpenMP, OpenBLAS, TBB) go to sleep
// before the next library is timed.
inline void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }

inline double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (!(d <= m)) m = d;  // NaN propagates as the max
  }
  return m;
}
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  return max_abs_diff(a.data(), b.data(), a.size());
}

// One JSON object per line: {"workload": ..., "impl": ..., numbers...}.
class Row {
 public:
  Row(const std::string& workload, const std::string& impl) {
    s_ = "{\"workload\": \"" + workload + "\", \"impl\": \"" + impl + "\"";
  }
  Row& num(const std::string& k, double v) {
    char buf[64];
    if (std::isfinite(v))
      std::snprintf(buf, sizeof buf, "%.6g", v);
    else
      std::snprintf(buf, sizeof buf, "null");
    s_ += ", \"" + k + "\": " + buf;
    return *this;
  }
  Row& str(const std::string& k, const std::string& v) {
    s_ += ", \"" + k + "\": \"" + v + "\"";
    return *this;
  }
  Row& timing(const Timing& t) {
    return num("ms", t.median_ms).num("min_ms", t.min_ms).num("reps", t.reps).num("inner", t.inner);
  }
  void print() {
    std::printf("%s}\n", s_.c_str());
    std::fflush(stdout);
  }

 private:
  std::string s_;
};

// ---------------- workload data ----------------
inline void fill_normal(std::vector<float>& v, uint64_t seed, float mean = 0, float stddev = 1) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(mean, stddev);
  for (float& x : v) x = d(rng);
}

// W1: p, v [n, 3]; a = g - k p - c v; v' = v + dt a; p' = p + dt v'; e = 0.5 sum(v' v').
struct W1Data {
  int64_t n = 1 << 20;
  std::vector<float> p, v;
  float g[3] = {0.f, 0.f, -9.81f};
  float k = 4.f, c = 0.5f, dt = 0.01f;
  void init(int64_t n_) {
    n = n_;
    p.resize(n * 3);
    v.resize(n * 3);
    fill_normal(p, 1);
    fill_normal(v, 2, 0, 0.5f);
  }
};
struct W1Result {
  std::vector<float> p2, v2;
  double e = 0;
};

// W7: a dense pairwise particle step as a simulation engine writes it: d = p_j - p_i over all
// pairs (an [N, N, 3] broadcast), r² = |d|² + soft, w = 1 / (r² r) within the cutoff (where),
// f_i = sum_j d w; then v' = v + f dt, p' = p + v' dt.
struct W7Data {
  int64_t n = 2048;
  std::vector<float> p, v;
  float soft = 1e-3f, cut2 = 0.25f, dt = 1e-3f;
  void init(int64_t n_) {
    n = n_;
    p.resize(n * 3);
    v.resize(n * 3);
    fill_normal(p, 7, 0, 0.5f);
    fill_normal(v, 8, 0, 0.1f);
  }
};
struct W7Result {
  std::vector<float> p2, v2;
};

// W3: x [rows, cols]; y = softmax(gelu(layer_norm(x) * w + b), -1); gy for the backward pass.
struct W3Data {
  int64_t rows = 1024, cols = 1024;
  float eps = 1e-5f;
  std::vector<float> x, w, b, gy;
  void init(int64_t r, int64_t c) {
    rows = r;
    cols = c;
    x.resize(r * c);
    gy.resize(r * c);
    w.resize(c);
    b.resize(c);
    fill_normal(x, 3);
    fill_normal(gy, 4);
    fill_normal(w, 5, 1.f, 0.1f);
    fill_normal(b, 6, 0.f, 0.1f);
  }
};
struct W3Result {
  std::vector<float> y, gx, gw, gb;  // gradients only for forward+backward
};

// W2: MLP 64 -> 256 -> 256 -> 8 with tanh, MSE loss, Adam (lr 1e-3), batch 4096.
struct W2Data {
  int64_t batch = 4096;
  std::vector<int64_t> dims = {64, 256, 256, 8};
  std::vector<std::vector<float>> weights, biases;  // weights[l]: [dims[l+1], dims[l]]
  std::vector<float> x, y;
  double lr = 1e-3;
  void init(int64_t b) {
    batch = b;
    std::mt19937_64 rng(7);
    weights.clear();
    biases.clear();
    for (size_t l = 0; l + 1 < dims.size(); ++l) {
      float bound = 1.f / std::sqrt(static_cast<float>(dims[l]));
      std::uniform_real_distribution<float> u(-bound, bound);
      std::vector<float> w(dims[l + 1] * dims[l]), bb(dims[l + 1]);
      for (float& e : w) e = u(rng);
      for (float& e : bb) e = u(rng);
      weights.push_back(std::move(w));
      biases.push_back(std::move(bb));
    }
    x.resize(batch * dims.front());
    y.resize(batch * dims.back());
    fill_normal(x, 8);
    fill_normal(y, 9, 0, 0.5f);
  }
};
struct W2Result {
  std::vector<float> params;  // all weights and biases, flattened in layer order (w, b)
  double loss = 0;  // loss of the last step
};

// A baseline prepared for one workload: call step() repeatedly; result() reads the outputs.
template <class R>
struct Runner {
  std::function<void()> step;
  std::function<R()> result;
};

}  // namespace bench
