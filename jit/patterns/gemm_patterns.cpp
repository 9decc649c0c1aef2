// GEMM padding (PyTorch's pad_mm), as a kiln::patterns rewrite: a large matmul on CUDA whose M, K
// or N is not a multiple of 8 runs on zero-padded operands and the result is sliced back, where
// the tensor cores only take aligned sizes. Padding pays for large 16-bit products and for
// float32 with TF32, not for float32 without TF32 nor for small products (bench/pad_mm_probe.py
// on the H100, padding copies included; figures in docs/BENCHMARKS.md). So: CUDA,
// float16 / bfloat16 (float32 only when set_float32_matmul_precision allows TF32), constant
// sizes, M·K·N >= 4e9, some of M, K, N unaligned. The padded zeros add exact zeros to every sum.
#include "jit/compile/patterns.h"
#include "runtime/exec/device_runtime.h"
#include "runtime/ops/ops.h"

namespace kiln::jit {
namespace {

using Ts = std::vector<Tensor>;
using Ss = std::vector<double>;

constexpr double kMinWork = 4e9;  // M·K·N below which padding was measured slower
constexpr int64_t kAlign = 8;

int64_t aligned(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool worth_padding(const Tensor& a, const Tensor& b) {
  if (a.device().type != DeviceType::CUDA || a.dtype() != b.dtype()) return false;
  const DType t = a.dtype();
  if (!(t == DType::Float16 || t == DType::BFloat16 || (t == DType::Float32 && float32_matmul_allows_tf32())))
    return false;
  const Shape &as = a.shape(), &bs = b.shape();
  if (as.size() != bs.size()) return false;
  const size_t r = as.size();
  for (size_t d = 0; d + 2 < r; ++d)
    if (!as[d].is_constant() || !bs[d].is_constant() || as[d].as_int() != bs[d].as_int()) return false;
  for (const SymInt* s : {&as[r - 2], &as[r - 1], &bs[r - 1]})
    if (!s->is_constant()) return false;
  const int64_t m = as[r - 2].as_int(), k = as[r - 1].as_int(), n = bs[r - 1].as_int();
  if (static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n) < kMinWork) return false;
  return m % kAlign || k % kAlign || n % kAlign;
}

// a [.., M, K] @ b [.., K, N] on operands padded to multiples of 8, sliced back to [.., M, N].
Tensor padded_matmul(const Tensor& a, const Tensor& b) {
  const size_t r = a.shape().size();
  const int64_t m = a.shape()[r - 2].as_int(), k = a.shape()[r - 1].as_int(), n = b.shape()[r - 1].as_int();
  Tensor ap = pad(a, {0, aligned(k) - k, 0, aligned(m) - m});
  Tensor bp = pad(b, {0, aligned(n) - n, 0, aligned(k) - k});
  Tensor c = matmul(ap, bp);
  const int64_t rr = static_cast<int64_t>(r);
  if (aligned(m) != m) c = c.narrow(rr - 2, 0, m);
  if (aligned(n) != n) c = c.narrow(rr - 1, 0, n);
  return c;
}

}  // namespace

void register_gemm_patterns() {
  using patterns::register_replacement;
  for (int rank = 2; rank <= 3; ++rank) {
    std::vector<int64_t> a(static_cast<size_t>(rank - 2), 2), b = a;
    a.insert(a.end(), {3, 4});
    b.insert(b.end(), {4, 5});
    register_replacement(
        "pad_mm_rank" + std::to_string(rank), [](const Ts& t, const Ss&) { return matmul(t[0], t[1]); },
        [](const Ts& t, const Ss&) { return padded_matmul(t[0], t[1]); }, {empty(a), empty(b)}, {},
        [](const Ts& t, const Ss&) { return worth_padding(t[0], t[1]); });
  }
}

}  // namespace kiln::jit
