// Parameter initializers (PyTorch's torch.nn.init formulas). They write without recording
// gradients, like torch.no_grad().
#include <cmath>

#include "runtime/autograd/autograd.h"
#include "runtime/nn/nn.h"

extern "C" {
// LAPACK (shipped in OpenBLAS): QR factorization and the explicit Q.
void dgeqrf_(const int* m, const int* n, double* a, const int* lda, double* tau, double* work, const int* lwork,
             int* info);
void dorgqr_(const int* m, const int* n, const int* k, double* a, const int* lda, const double* tau, double* work,
             const int* lwork, int* info);
}

namespace kiln::nn {

std::pair<int64_t, int64_t> fan_in_out(const Tensor& t) {
  KILN_CHECK(t.dim() >= 2, "fan_in_out: fan in and fan out can not be computed for a tensor with fewer than 2 ",
             "dimensions (got ", t.dim(), ")");
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

double calculate_gain(const std::string& nl, double param) {
  if (nl == "linear" || nl == "sigmoid" || nl == "conv2d" || nl == "identity") return 1.0;
  if (nl == "tanh") return 5.0 / 3.0;
  if (nl == "relu") return std::sqrt(2.0);
  if (nl == "leaky_relu") return std::sqrt(2.0 / (1 + param * param));
  if (nl == "selu") return 0.75;
  throw Error("calculate_gain: unsupported nonlinearity '" + nl + "'");
}

namespace {
Tensor& write(Tensor& t, const Tensor& v) {
  NoGradGuard ng;
  t.copy_(v);
  return t;
}
double fan(const Tensor& t, const std::string& mode) {
  auto [in, out] = fan_in_out(t);
  KILN_CHECK(mode == "fan_in" || mode == "fan_out", "init: mode must be 'fan_in' or 'fan_out', got '", mode, "'");
  return static_cast<double>(mode == "fan_in" ? in : out);
}
}  // namespace

Tensor& uniform_(Tensor& t, double lo, double hi) {
  KILN_CHECK(is_floating(t.dtype()), "uniform_: expected a floating tensor");
  return write(t, rand(t.sizes(), t.dtype(), t.device()) * (hi - lo) + lo);
}
Tensor& normal_(Tensor& t, double mean, double sd) {
  KILN_CHECK(is_floating(t.dtype()), "normal_: expected a floating tensor");
  return write(t, randn(t.sizes(), t.dtype(), t.device()) * sd + mean);
}
Tensor& constant_(Tensor& t, double v) { return write(t, full_like(t, v)); }

Tensor& kaiming_uniform_(Tensor& t, double a, const std::string& mode, const std::string& nl) {
  double bound = std::sqrt(3.0) * calculate_gain(nl, a) / std::sqrt(fan(t, mode));
  return uniform_(t, -bound, bound);
}
Tensor& kaiming_normal_(Tensor& t, double a, const std::string& mode, const std::string& nl) {
  return normal_(t, 0, calculate_gain(nl, a) / std::sqrt(fan(t, mode)));
}
Tensor& xavier_uniform_(Tensor& t, double gain) {
  auto [in, out] = fan_in_out(t);
  double bound = gain * std::sqrt(6.0 / static_cast<double>(in + out));
  return uniform_(t, -bound, bound);
}
Tensor& xavier_normal_(Tensor& t, double gain) {
  auto [in, out] = fan_in_out(t);
  return normal_(t, 0, gain * std::sqrt(2.0 / static_cast<double>(in + out)));
}

Tensor& orthogonal_(Tensor& t, double gain) {
  KILN_CHECK(t.dim() >= 2, "orthogonal_: only tensors with 2 or more dimensions are supported");
  int rows = static_cast<int>(t.size(0));
  int cols = static_cast<int>(t.numel() / rows);
  // Like PyTorch: QR of a Gaussian matrix (transposed when wide), sign-corrected by diag(R).
  bool wide = rows < cols;
  int m = wide ? cols : rows, n = wide ? rows : cols;
  std::vector<double> g = randn({m, n}, kFloat64).to_vector<double>();
  std::vector<double> a(static_cast<size_t>(m) * n);  // column-major m x n
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) a[j * m + i] = g[i * n + j];
  std::vector<double> tau(n);
  int info = 0, lwork = -1;
  double wq;
  dgeqrf_(&m, &n, a.data(), &m, tau.data(), &wq, &lwork, &info);
  lwork = static_cast<int>(wq);
  std::vector<double> work(std::max(1, lwork));
  dgeqrf_(&m, &n, a.data(), &m, tau.data(), work.data(), &lwork, &info);
  KILN_CHECK(info == 0, "orthogonal_: LAPACK dgeqrf failed (info ", info, ")");
  std::vector<double> diag_sign(n);
  for (int j = 0; j < n; ++j) diag_sign[j] = a[j * m + j] < 0 ? -1.0 : 1.0;
  lwork = -1;
  dorgqr_(&m, &n, &n, a.data(), &m, tau.data(), &wq, &lwork, &info);
  lwork = static_cast<int>(wq);
  work.resize(std::max(1, lwork));
  dorgqr_(&m, &n, &n, a.data(), &m, tau.data(), work.data(), &lwork, &info);
  KILN_CHECK(info == 0, "orthogonal_: LAPACK dorgqr failed (info ", info, ")");
  std::vector<double> q(static_cast<size_t>(rows) * cols);  // row-major rows x cols
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double v = a[j * m + i] * diag_sign[j] * gain;
      if (wide)
        q[j * cols + i] = v;  // transpose back
      else
        q[i * cols + j] = v;
    }
  return write(t, from_vector(q, t.sizes(), t.device()).to(t.dtype()));
}

}  // namespace kiln::nn
