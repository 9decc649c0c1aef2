// xtensor baselines (expressions; XTENSOR_USE_XSIMD when xsimd is found), single-threaded.
#include <memory>
#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>

#include "baselines.h"

namespace bench::xt {

bool available() { return true; }

std::string info() {
  std::string s = "xtensor " + std::to_string(XTENSOR_VERSION_MAJOR) + "." + std::to_string(XTENSOR_VERSION_MINOR) +
                  "." + std::to_string(XTENSOR_VERSION_PATCH);
#ifdef XTENSOR_USE_XSIMD
  s += " + xsimd";
#else
  s += " (no xsimd)";
#endif
  return s;
}

namespace {
template <size_t N>
::xt::xtensor<float, N> make(const std::vector<float>& v, std::array<size_t, N> shape) {
  ::xt::xtensor<float, N> t = ::xt::adapt(v, shape);
  return t;
}
}  // namespace

Runner<W1Result> w1(const W1Data& d) {
  struct S {
    ::xt::xtensor<float, 2> p, v, p2, v2;
    ::xt::xtensor<float, 1> g;
    float e = 0;
  };
  auto s = std::make_shared<S>();
  size_t n = static_cast<size_t>(d.n);
  s->p = make<2>(d.p, {n, 3});
  s->v = make<2>(d.v, {n, 3});
  s->g = ::xt::xtensor<float, 1>({d.g[0], d.g[1], d.g[2]});
  s->p2 = ::xt::xtensor<float, 2>::from_shape({n, 3});
  s->v2 = ::xt::xtensor<float, 2>::from_shape({n, 3});
  const float k = d.k, c = d.c, dt = d.dt;
  Runner<W1Result> r;
  r.step = [s, k, c, dt] {
    auto a = s->g - k * s->p - c * s->v;  // lazy expression, g broadcast over rows
    ::xt::noalias(s->v2) = s->v + dt * a;
    ::xt::noalias(s->p2) = s->p + dt * s->v2;
    s->e = 0.5f * ::xt::sum(s->v2 * s->v2)();
  };
  r.result = [s] {
    W1Result res;
    res.p2.assign(s->p2.begin(), s->p2.end());
    res.v2.assign(s->v2.begin(), s->v2.end());
    res.e = s->e;
    return res;
  };
  return r;
}

Runner<W3Result> w3_fwd(const W3Data& d) {
  struct S {
    ::xt::xtensor<float, 2> x, y;
    ::xt::xtensor<float, 1> w, b;
    float eps;
  };
  auto s = std::make_shared<S>();
  size_t rows = static_cast<size_t>(d.rows), cols = static_cast<size_t>(d.cols);
  s->x = make<2>(d.x, {rows, cols});
  s->w = make<1>(d.w, {cols});
  s->b = make<1>(d.b, {cols});
  s->y = ::xt::xtensor<float, 2>::from_shape({rows, cols});
  s->eps = d.eps;
  Runner<W3Result> r;
  r.step = [s] {
    using namespace ::xt;
    const auto& x = s->x;
    auto kd = keep_dims | evaluation_strategy::immediate;
    xtensor<float, 2> mu = mean(x, {1}, kd);
    xtensor<float, 2> xc = x - mu;
    xtensor<float, 2> var = mean(xc * xc, {1}, kd);
    xtensor<float, 2> t = xc / sqrt(var + s->eps) * s->w + s->b;
    xtensor<float, 2> gl = 0.5f * t * (1.f + erf(t * 0.70710678118654752f));
    xtensor<float, 2> mx = amax(gl, {1}, kd);
    xtensor<float, 2> ex = exp(gl - mx);
    xtensor<float, 2> z = sum(ex, {1}, kd);
    noalias(s->y) = ex / z;
  };
  r.result = [s] {
    W3Result res;
    res.y.assign(s->y.begin(), s->y.end());
    return res;
  };
  return r;
}

}  // namespace bench::xt
