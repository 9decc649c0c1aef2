// Hand-written baselines: the practical limit for W1 and W3-forward. Built with
// -O3 -march=native -fopenmp-simd; transcendentals vectorize through the GNU vector ABI
// (resolved to SLEEF's libsleefgnuabi, which this program links before libkiln's libmvec).
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <dlfcn.h>

#include <cmath>
#include <cstring>
#include <memory>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "baselines.h"

extern "C" {
#pragma omp declare simd notinbranch
float expf(float) noexcept;
#pragma omp declare simd notinbranch
float erff(float) noexcept;
}

namespace bench::hand {
namespace {

// Runs f(begin, end) over [0, n) in `threads` equal static chunks (multiples of `align`).
template <class F>
void split(int64_t n, int threads, int64_t align, F&& f) {
  if (threads <= 1) {
    f(int64_t{0}, n);
    return;
  }
  int64_t per = ((n + threads - 1) / threads + align - 1) / align * align;
  tbb::parallel_for(
      tbb::blocked_range<int>(0, threads, 1),
      [&](const tbb::blocked_range<int>& r) {
        for (int t = r.begin(); t < r.end(); ++t) {
          int64_t b = std::min<int64_t>(n, t * per), e = std::min<int64_t>(n, b + per);
          if (b < e) f(b, e);
        }
      },
      tbb::static_partitioner());
}

// Particles [b, e): flat floats 3b .. 3e, in blocks of 48 floats (16 particles: g repeats).
double w1_range(const W1Data& d, float* p2, float* v2, int64_t b, int64_t e) {
  const float* p = d.p.data();
  const float* v = d.v.data();
  const float k = d.k, c = d.c, dt = d.dt;
  alignas(64) float gp[48];
  for (int j = 0; j < 48; ++j) gp[j] = d.g[j % 3];
  alignas(64) double acc[48] = {};
  int64_t i = 3 * b, end = 3 * e;
  for (; i + 48 <= end; i += 48) {
#pragma omp simd aligned(gp, acc : 64)
    for (int j = 0; j < 48; ++j) {
      float a = gp[j] - k * p[i + j] - c * v[i + j];
      float vn = v[i + j] + dt * a;
      v2[i + j] = vn;
      p2[i + j] = p[i + j] + dt * vn;
      acc[j] += static_cast<double>(vn) * vn;
    }
  }
  double s = 0;
  for (; i < end; ++i) {
    float a = d.g[i % 3] - k * p[i] - c * v[i];
    float vn = v[i] + dt * a;
    v2[i] = vn;
    p2[i] = p[i] + dt * vn;
    s += static_cast<double>(vn) * vn;
  }
  for (double x : acc) s += x;
  return s;
}

void w3_row(const float* __restrict x, const float* __restrict w, const float* __restrict b, float* __restrict y,
            int64_t n, float eps) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += x[j];
  const float mean = s / n;
  float q = 0;
#pragma omp simd reduction(+ : q)
  for (int64_t j = 0; j < n; ++j) q += (x[j] - mean) * (x[j] - mean);
  const float rstd = 1.f / std::sqrt(q / n + eps);
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; ++j) {
    float t = (x[j] - mean) * rstd * w[j] + b[j];
    float gl = 0.5f * t * (1.f + erff(t * 0.70710678118654752f));
    y[j] = gl;
    mx = mx > gl ? mx : gl;
  }
  float z = 0;
#pragma omp simd reduction(+ : z)
  for (int64_t j = 0; j < n; ++j) {
    float ex = expf(y[j] - mx);
    y[j] = ex;
    z += ex;
  }
  const float inv = 1.f / z;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] *= inv;
}

#if defined(__AVX512F__)
// The same row with explicit AVX-512 and glibc's libmvec for erf/exp (faster than SLEEF's erff;
// kiln's JIT calls libmvec too), called through pointers from a local
// handle, independent of which library the process's _ZGV* names resolve to.
using VF = __m512 (*)(__m512);
struct Mvec {
  VF erf = nullptr, exp = nullptr;
};
const Mvec& mvec() {
  static const Mvec m = [] {
    Mvec r;
    if (void* h = dlopen("libmvec.so.1", RTLD_NOW | RTLD_LOCAL)) {
      r.erf = reinterpret_cast<VF>(dlsym(h, "_ZGVeN16v_erff"));
      r.exp = reinterpret_cast<VF>(dlsym(h, "_ZGVeN16v_expf"));
    }
    return r;
  }();
  return m;
}
void w3_row_mvec(const float* x, const float* w, const float* b, float* y, int64_t n, float eps) {
  const Mvec& m = mvec();
  __m512 s = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + j));
  const float mean = _mm512_reduce_add_ps(s) / n;
  const __m512 vm = _mm512_set1_ps(mean);
  __m512 q = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + j), vm);
    q = _mm512_fmadd_ps(d, d, q);
  }
  const __m512 rstd = _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(q) / n + eps));
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.f), isq2 = _mm512_set1_ps(0.70710678118654752f);
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16) {
    __m512 t = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm), rstd);
    t = _mm512_fmadd_ps(t, _mm512_loadu_ps(w + j), _mm512_loadu_ps(b + j));
    __m512 gl = _mm512_mul_ps(_mm512_mul_ps(half, t), _mm512_add_ps(one, m.erf(_mm512_mul_ps(t, isq2))));
    _mm512_storeu_ps(y + j, gl);
    mx = _mm512_max_ps(mx, gl);
  }
  const __m512 vmx = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 z = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    __m512 e = m.exp(_mm512_sub_ps(_mm512_loadu_ps(y + j), vmx));
    _mm512_storeu_ps(y + j, e);
    z = _mm512_add_ps(z, e);
  }
  const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(z));
  for (int64_t j = 0; j < n; j += 16) _mm512_storeu_ps(y + j, _mm512_mul_ps(_mm512_loadu_ps(y + j), inv));
}
#endif

}  // namespace

bool have_mvec() {
#if defined(__AVX512F__)
  return mvec().erf && mvec().exp;
#else
  return false;
#endif
}

Runner<W3Result> w3_fwd_mvec(const W3Data& d, int threads) {
  auto y = std::make_shared<std::vector<float>>(d.x.size());
  const W3Data* dp = &d;
  Runner<W3Result> r;
  r.step = [y, dp, threads] {
#if defined(__AVX512F__)
    split(dp->rows, threads, 1, [&](int64_t rb, int64_t re) {
      for (int64_t i = rb; i < re; ++i)
        w3_row_mvec(dp->x.data() + i * dp->cols, dp->w.data(), dp->b.data(), y->data() + i * dp->cols, dp->cols,
                    dp->eps);
    });
#endif
  };
  r.result = [y] {
    W3Result res;
    res.y = *y;
    return res;
  };
  return r;
}

Runner<W1Result> w1(const W1Data& d, int threads) {
  struct S {
    std::vector<float> p2, v2;
    double e = 0;
  };
  auto s = std::make_shared<S>();
  s->p2.resize(d.p.size());
  s->v2.resize(d.v.size());
  const W1Data* dp = &d;
  Runner<W1Result> r;
  r.step = [s, dp, threads] {
    double part[8] = {};
    int nt = std::min(threads, 8);
    if (nt <= 1) {
      part[0] = w1_range(*dp, s->p2.data(), s->v2.data(), 0, dp->n);
    } else {
      int64_t per = (dp->n + nt - 1) / nt;
      per = (per + 15) / 16 * 16;
      split(nt, nt, 1, [&](int64_t tb, int64_t te) {
        for (int64_t t = tb; t < te; ++t) {
          int64_t b = std::min<int64_t>(dp->n, t * per), e = std::min<int64_t>(dp->n, b + per);
          part[t] = w1_range(*dp, s->p2.data(), s->v2.data(), b, e);
        }
      });
    }
    double sum = 0;
    for (int t = 0; t < nt; ++t) sum += part[t];
    s->e = 0.5 * sum;
  };
  r.result = [s] { return W1Result{s->p2, s->v2, s->e}; };
  return r;
}

Runner<W7Result> w7(const W7Data& d, int threads) {
  auto s = std::make_shared<W7Result>();
  s->p2.resize(d.p.size());
  s->v2.resize(d.v.size());
  const W7Data* dp = &d;
  Runner<W7Result> r;
  r.step = [s, dp, threads] {
    const W7Data& w = *dp;
    const float* p = w.p.data();
    split(w.n, threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float xi = p[3 * i], yi = p[3 * i + 1], zi = p[3 * i + 2];
        float fx = 0, fy = 0, fz = 0;
        for (int64_t j = 0; j < w.n; ++j) {
          const float dx = p[3 * j] - xi, dy = p[3 * j + 1] - yi, dz = p[3 * j + 2] - zi;
          const float r2 = dx * dx + dy * dy + dz * dz + w.soft;
          const float k = r2 < w.cut2 ? 1.0f / (r2 * std::sqrt(r2)) : 0.0f;
          fx += dx * k;
          fy += dy * k;
          fz += dz * k;
        }
        const float f[3] = {fx, fy, fz};
        for (int c = 0; c < 3; ++c) {
          s->v2[3 * i + c] = w.v[3 * i + c] + f[c] * w.dt;
          s->p2[3 * i + c] = p[3 * i + c] + s->v2[3 * i + c] * w.dt;
        }
      }
    });
  };
  r.result = [s] { return *s; };
  return r;
}

Runner<W3Result> w3_fwd(const W3Data& d, int threads) {
  auto y = std::make_shared<std::vector<float>>(d.x.size());
  const W3Data* dp = &d;
  Runner<W3Result> r;
  r.step = [y, dp, threads] {
    split(dp->rows, threads, 1, [&](int64_t rb, int64_t re) {
      for (int64_t i = rb; i < re; ++i)
        w3_row(dp->x.data() + i * dp->cols, dp->w.data(), dp->b.data(), y->data() + i * dp->cols, dp->cols, dp->eps);
    });
  };
  r.result = [y] {
    W3Result res;
    res.y = *y;
    return res;
  };
  return r;
}

double copy_gbs(int64_t n, int threads, int reps) {
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]);
  split(n, threads, 16, [&](int64_t lo, int64_t hi) {  // first touch by the thread that uses it
    for (int64_t i = lo; i < hi; ++i) a[i] = 1.f, b[i] = 0.f;
  });
  float* pa = a.get();
  float* pb = b.get();
  Timing t = time_calls(
      [&] {
        split(n, threads, 16, [&](int64_t lo, int64_t hi) {
#pragma omp simd
          for (int64_t i = lo; i < hi; ++i) pb[i] = pa[i];
        });
      },
      reps, 1);
  return 2.0 * 4.0 * n / (t.median_ms * 1e-3) / 1e9;
}

double triad_gbs(int64_t n, int threads, int reps) {
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  split(n, threads, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) a[i] = 0.f, b[i] = 1.f, c[i] = 2.f;
  });
  float* pa = a.get();
  float* pb = b.get();
  float* pc = c.get();
  Timing t = time_calls(
      [&] {
        split(n, threads, 16, [&](int64_t lo, int64_t hi) {
#pragma omp simd
          for (int64_t i = lo; i < hi; ++i) pa[i] = pb[i] + 3.f * pc[i];
        });
      },
      reps, 1);
  return 3.0 * 4.0 * n / (t.median_ms * 1e-3) / 1e9;
}

}  // namespace bench::hand
