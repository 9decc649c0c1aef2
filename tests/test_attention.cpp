// The fused attention primitive (OpKind::Attention / AttentionBackward): scaled_dot_product_attention
// records it, and its outputs and gradients equal the unfused graph softmax(q·kᵀ·s + mask)·v on
// random shapes (batch broadcasting, Tq != Tk, sizes across the kernels' block edges, size 0 and
// 1), causal / additive / boolean masks, float32 and float64, eager and compiled.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <thread>
#include <type_traits>

#include "kiln.h"
#include "runtime/exec/device_runtime.h"
#include "runtime/ir/attention_lse.h"
#include "tests/expect_close.h"
#include "tests/gradcheck.h"
#include "tests/test_seed.h"
#include "tests/unrewritten.h"

using namespace kiln;

namespace {

// What sdpa computes, written out as users write it (never fused).
Tensor unfused(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask, bool causal,
               double scale) {
  Tensor s = matmul(q, k.transpose(-2, -1)) * scale;
  const double ninf = -std::numeric_limits<double>::infinity();
  if (causal) s = where(ones({q.size(-2), k.size(-2)}, kBool).tril(), s, ninf);
  if (mask) s = mask->dtype() == kBool ? where(*mask, s, ninf) : s + *mask;
  return matmul(softmax(s, -1), v);
}

using kiln::testing::interpreted;
using kiln::testing::unrewritten;

bool fused(const Tensor& y) {
  const Node* n = y.node().get();
  return n->op == OpKind::Slice && n->inputs.size() == 1 && n->inputs[0]->op == OpKind::Attention;
}

struct Case {
  std::vector<int64_t> q, k, v;  // shapes
  int mask = 0;  // 0 none, 1 additive [Tq, Tk], 2 boolean [1, Tq, Tk] (rank >= 3)
  bool causal = false;
};

// Tolerances against the unfused graph evaluated in float64 on the same values: float64 results
// differ by rounding only (sums reordered): 1e-10 relative + 1e-11. Float32: each value is a sum
// of up to ~300 products rounded to float32, so 1e-4 relative plus 2e-5 of the largest magnitude
// in the result (cancellation leaves small entries with the absolute error of the large ones).
// 16-bit inputs (a float32 node: products on tensor cores with float32 sums on the GPU, float32
// on the CPU): the output is rounded to the input type (bfloat16 2^-8, float16 2^-11 relative)
// and on the GPU the probabilities are rounded to it before their product with v, each term off
// by up to that relative amount: 2^-6 (bfloat16) and 2^-9 (float16) relative, and the same of the
// largest magnitude absolute.
// Float32 under set_float32_matmul_precision("high") on the GPU: TF32 products, each operand
// rounded to 2^-11 relative, as float16's.
bool tf32() { return get_float32_matmul_precision() != "highest"; }
double rel_tolerance(DType dt) {
  return dt == kBFloat16 ? 1.0 / 64 : dt == kFloat16 || (dt == kFloat32 && tf32()) ? 1.0 / 512 : 1e-4;
}
double abs_tolerance(DType dt) {
  return dt == kBFloat16 ? 1.0 / 64 : dt == kFloat16 || (dt == kFloat32 && tf32()) ? 1.0 / 512 : 2e-5;
}

// Whether SdpaBackend::Auto fuses small attention of dtype dt on dev: always on the CPU; on CUDA
// 16-bit and float32 inputs where the device has the tensor-core kernels (float64's small scores
// run materialized).
bool auto_fuses_small(Device dev, DType dt) {
  if (dev.type == DeviceType::CPU) return true;
  return dt != kFloat64 && find_device_runtime(DeviceType::CUDA)->tensor_core_attention(dev.index);
}

void expect_match(const Tensor& got, const Tensor& want64) {
  if (got.dtype() == kFloat64) return expect_close(got, want64, 1e-10, 1e-11);
  const double scale = std::max(1.0, want64.numel() ? want64.abs().amax().item<double>() : 0.0);
  expect_close(got.to(kFloat64), want64, rel_tolerance(got.dtype()), abs_tolerance(got.dtype()) * scale);
}

// dq, dk, dv against their float64 references, as expect_match; in float32 the absolute term
// takes the largest magnitude of the three: they are sums of the same dS (and P) terms, and where
// one cancels entirely (a single key: dS = P (dP - delta) is exactly 0; d = 200 terms a row) its
// rounding is that of the terms, which the largest gradient measures (dropout's 1/(1 - p)
// amplifies both).
void expect_grads_match(const std::vector<Tensor>& g, const std::vector<Tensor>& want64) {
  double largest = 1;
  for (const Tensor& w : want64) largest = std::max(largest, w.numel() ? w.abs().amax().item<double>() : 0.0);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    if (g[i].dtype() == kFloat64)
      expect_match(g[i].to(cpu()), want64[i]);
    else
      expect_close(g[i].to(cpu()).to(kFloat64), want64[i], 2 * rel_tolerance(g[i].dtype()),
                   2 * abs_tolerance(g[i].dtype()) * largest);
  }
}

// x (float32) rounded to TF32 as cvt.rna does: 10 mantissa bits, to nearest, ties away from zero.
Tensor tf32_rounded(const Tensor& x) {
  std::vector<float> v = x.to_vector<float>();
  for (float& f : v) f = std::bit_cast<float>((std::bit_cast<uint32_t>(f) + 0x1000u) & 0xffffe000u);
  return from_vector(v, x.sizes());
}

// tf32_inputs: q, k, v and the output's weights w rounded to TF32 (the kernels' TF32 products
// then see the reference's values, as 16-bit inputs do: what remains is float32 sums and the
// probabilities and score gradients rounded to TF32 before their products, float16's tolerance).
void run_case(const Case& c, DType dt, std::mt19937_64& rng, double scale, Device dev = cpu(),
              bool tf32_inputs = false) {
  SCOPED_TRACE(::testing::Message() << "q " << ::testing::PrintToString(c.q) << " k " << ::testing::PrintToString(c.k)
                                    << " v " << ::testing::PrintToString(c.v) << " mask " << c.mask << " causal "
                                    << c.causal << " " << dtype_name(dt) << " on " << dev.str());
  manual_seed(rng());
  auto input = [&](const std::vector<int64_t>& shape) {
    return tf32_inputs ? tf32_rounded(randn(shape)) : randn(shape, dt);
  };
  Tensor q = input(c.q), k = input(c.k), v = input(c.v);
  const int64_t tq = c.q[c.q.size() - 2], tk = c.k[c.k.size() - 2];
  std::optional<Tensor> mask;
  if (c.mask == 1) mask = randn({tq, tk}, dt);
  // Keep column 0 visible so that no row is fully masked (those give NaN both ways, tested apart).
  if (c.mask == 2) mask = logical_or(rand({1, tq, tk}) < 0.7, arange(tk).reshape({1, 1, tk}) == 0);
  Tensor w = input(c.q);
  auto on = [&](const Tensor& t) { return t.to(dev).requires_grad_(); };
  Tensor qd = on(q), kd = on(k), vd = on(v);
  std::optional<Tensor> md;
  if (mask) md = mask->to(dev);
  // (on CUDA these small scores would run materialized under SdpaBackend::Auto)
  sdpa_kernel kernels(SdpaBackend::Fused);
  Tensor y = scaled_dot_product_attention(qd, kd, vd, md, c.causal, scale);
  EXPECT_TRUE(fused(y));
  // The reference: the unfused graph in float64 on the same values, on the CPU.
  Tensor q64 = q.to(kFloat64).requires_grad_(), k64 = k.to(kFloat64).requires_grad_(),
         v64 = v.to(kFloat64).requires_grad_();
  std::optional<Tensor> m64;
  if (mask) m64 = mask->dtype() == kBool ? *mask : mask->to(kFloat64);
  Tensor ref;
  auto gr = unrewritten([&] {
    ref = unfused(q64, k64, v64, m64, c.causal, scale);
    ref.eval();
    return grad({(ref * w.to(kFloat64)).sum()}, {q64, k64, v64});
  });
  expect_match(y.to(cpu()), ref);
  expect_grads_match(grad({(y * w.to(dev)).sum()}, {qd, kd, vd}), gr);
}

// Random cases: 2-D with an additive mask, causal 4-D, broadcast k/v with a boolean mask, 3-D.
void random_cases(Device dev, int count, int64_t max_seq, std::vector<DType> dtypes = {kFloat64, kFloat32},
                  bool tf32_inputs = false) {
  std::mt19937_64 rng(kiln::testing::test_seed(11));
  std::uniform_int_distribution<int64_t> seq(1, max_seq), head(1, 80), small(1, 3);
  for (int it = 0; it < count; ++it) {
    const int64_t b = small(rng), h = small(rng), tq = seq(rng), tk = seq(rng), d = it % 6 == 5 ? 200 : head(rng);
    Case c;
    switch (it % 4) {
      case 0: c = {{tq, d}, {tk, d}, {tk, d}, 1, false}; break;
      case 1: c = {{b, h, tq, d}, {b, h, tk, d}, {b, h, tk, d}, 0, true}; break;
      case 2: c = {{b, h, tq, d}, {b, 1, tk, d}, {1, h, tk, d}, 2, false}; break;
      default: c = {{b, tq, d}, {b, tk, d}, {b, tk, d}, 0, false}; break;
    }
    const double scale = it % 3 == 0 ? 1.0 / std::sqrt(static_cast<double>(d)) : 0.05 + 0.5 * (it % 5);
    run_case(c, dtypes[static_cast<size_t>(it) % dtypes.size()], rng, scale, dev, tf32_inputs);
  }
}

}  // namespace

TEST(Attention, FusedEqualsUnfusedOnRandomShapes) { random_cases(cpu(), 24, 300); }

// Attention's memory in a training step is its output and log-sum-exp: forward and backward of a
// causal [2, 2, 2048, 16] attention peak far below its 2048 x 2048 scores (64 MiB in float32,
// 32 MiB in bfloat16), within a few copies of q (lazy eager on the CPU; host pool counters).
TEST(Attention, TrainingStepKeepsNoScores) {
  manual_seed(kiln::testing::test_seed(33));
  for (DType dt : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t b = 2, h = 2, t = 2048, d = 16;
    Tensor q = randn({b, h, t, d}, dt).requires_grad_(), k = randn({b, h, t, d}, dt).requires_grad_(),
           v = randn({b, h, t, d}, dt).requires_grad_(), w = randn({b, h, t, d}, dt);
    eval({q, k, v, w});
    const int64_t item = static_cast<int64_t>(itemsize(dt)), one = b * h * t * d * item, scores = b * h * t * t * item;
    const int64_t before = host_memory_stats().allocated_bytes;
    reset_peak_host_memory_stats();
    Tensor y = scaled_dot_product_attention(q, k, v, std::nullopt, true);
    ASSERT_TRUE(fused(y));
    eval(grad({(y * w).sum()}, {q, k, v}));
    const int64_t peak = host_memory_stats().peak_allocated_bytes - before;
    EXPECT_LT(peak, 12 * one) << peak << " bytes at the peak; one q is " << one << ", the scores " << scores;
    EXPECT_LT(peak, scores / 4);
  }
}

// bfloat16 / float16 inputs: one node of their dtype (computed in float32, output and gradients
// rounded once), within the rounding of that dtype of the float64 graph on the same values.
TEST(Attention, HalfInputsFuseIntoOneHalfNode) {
  random_cases(cpu(), 12, 200, {kBFloat16, kFloat16});
  Tensor q = randn({2, 5, 8}, kBFloat16);
  Tensor y = scaled_dot_product_attention(q, q, q);
  EXPECT_EQ(y.dtype(), kBFloat16);
  const NodePtr& packed = y.node()->inputs[0];
  EXPECT_EQ(packed->dtype, kBFloat16);
  EXPECT_EQ(packed->shape.back().as_int(), 16) << "8 output columns, 4 log-sum-exp pieces, zeros to 16";
}

// The log-sum-exp pieces of a 16-bit packed output (runtime/ir/attention_lse.h) give back every
// float32 exactly: random magnitudes over float32's range, both signs, powers of two, the edges.
template <class H>
void expect_lse_round_trip(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> mant(0.5f, 1.f);
  std::uniform_int_distribution<int> expo(-125, 127);
  std::vector<float> xs = {0.f, -0.f, 1.f, -1.f, 0.5f, std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::min(), std::nextafter(1.f, 2.f), 10.397207708f,
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 20000; ++i) xs.push_back((i % 2 ? -1.f : 1.f) * std::ldexp(mant(rng), expo(rng)));
  for (float x : xs) {
    H p[kAttentionLsePieces];
    encode_lse(x, p);
    const float back = decode_lse(p);
    ASSERT_EQ(std::bit_cast<uint32_t>(back), std::bit_cast<uint32_t>(x)) << x;
  }
  H p[kAttentionLsePieces];
  encode_lse(std::numeric_limits<float>::quiet_NaN(), p);
  EXPECT_TRUE(std::isnan(decode_lse(p)));
}
TEST(Attention, HalfLogSumExpPiecesAreExact) {
  std::mt19937_64 rng(kiln::testing::test_seed(31));
  expect_lse_round_trip<BFloat16>(rng);
  expect_lse_round_trip<Half>(rng);
}

// A 16-bit node's log-sum-exp is the float32 one, bit for bit (the CPU computes both in float32
// on the same values), and its gradient is taken from dO directly: no scatter of dO into the
// packed output's width is made, in float32 either.
TEST(Attention, HalfNodeKeepsTheFloat32LogSumExpAndTakesDOut) {
  manual_seed(kiln::testing::test_seed(32));
  for (DType dt : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor q = randn({2, 3, 37, 40}, dt), k = randn({2, 3, 29, 40}, dt), v = randn({2, 3, 29, 40}, dt);
    Tensor y = scaled_dot_product_attention(q, k, v, std::nullopt, true);
    Tensor y32 = scaled_dot_product_attention(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32), std::nullopt, true);
    ASSERT_TRUE(fused(y) && fused(y32));
    const Tensor packed = Tensor::from_node(y.node()->inputs[0]);
    const std::vector<float> want = Tensor::from_node(y32.node()->inputs[0]).narrow(-1, 40, 1).to_vector<float>();
    const std::vector<float> p = packed.to_vector<float>();  // (the pieces' values, exactly)
    const int64_t w = packed.size(-1);
    for (size_t row = 0; row < want.size(); ++row)
      ASSERT_EQ(std::bit_cast<uint32_t>(decode_lse(p.data() + static_cast<int64_t>(row) * w + 40)),
                std::bit_cast<uint32_t>(want[row]))
          << row;
    expect_close(y.to(kFloat32), y32.to(dt).to(kFloat32), 0, 0);  // (the float32 rows, rounded once)
  }
  for (DType dt : {kBFloat16, kFloat32}) {
    Tensor q = randn({2, 5, 16}, dt).requires_grad_();
    Tensor y = scaled_dot_product_attention(q, q, q);
    Tensor gq = grad({(y * y).sum()}, {q})[0];
    const Node* n = gq.node().get();
    while (n->op != OpKind::AttentionBackward && !n->inputs.empty()) n = n->inputs[0].get();
    ASSERT_EQ(n->op, OpKind::AttentionBackward);
    EXPECT_NE(n->inputs[4]->op, OpKind::ViewScatter) << dtype_name(dt);
    EXPECT_EQ(n->inputs[4]->shape.back().as_int(), 16) << dtype_name(dt);
  }
}

// The tensor-core kernels (sm_80 and later) against the same float64 reference: random shapes
// with odd sequence lengths, head sizes across every bucket (1..256, not powers of two).
TEST(Attention, CudaTensorCoreKernelsEqualTheUnfusedGraph) {
  if (!cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  const Device g{DeviceType::CUDA, 0};
  random_cases(g, 48, 300, {kBFloat16, kFloat16});
  // Long odd sequences across many tiles, head sizes off the buckets, batch and heads of 1.
  std::mt19937_64 rng(kiln::testing::test_seed(12));
  run_case({{1, 2, 2049, 80}, {1, 2, 2049, 80}, {1, 2, 2049, 80}, 0, true}, kBFloat16, rng, 0.11, g);
  run_case({{1, 1, 4097, 128}, {1, 1, 1031, 128}, {1, 1, 1031, 128}, 1, false}, kFloat16, rng, 0.088, g);
  run_case({{3, 1000, 40}, {3, 8192, 40}, {3, 8192, 40}, 0, false}, kBFloat16, rng, 0.15, g);
}

// Float32 on tensor cores in TF32 under set_float32_matmul_precision("high"), on inputs rounded to
// TF32 (3xTF32 under "highest": CudaKernelsEqualTheUnfusedGraph), and 3xTF32 again when the
// precision changes back.
TEST(Attention, CudaTf32KernelsEqualTheUnfusedGraph) {
  if (!cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  const Device g{DeviceType::CUDA, 0};
  struct Precision {
    Precision() { set_float32_matmul_precision("high"); }
    ~Precision() { set_float32_matmul_precision("highest"); }
  };
  {
    Precision high;
    random_cases(g, 24, 300, {kFloat32}, true);
    std::mt19937_64 rng(kiln::testing::test_seed(13));
    run_case({{1, 3, 1100, 128}, {1, 3, 1100, 128}, {1, 3, 1100, 128}, 0, true}, kFloat32, rng, 0.088, g, true);
  }
  std::mt19937_64 rng(kiln::testing::test_seed(14));
  run_case({{2, 2, 300, 72}, {2, 2, 301, 72}, {2, 2, 301, 72}, 1, false}, kFloat32, rng, 0.12, g);
}

// The CUDA kernels against the same float64 reference (skipped without a GPU).
TEST(Attention, CudaKernelsEqualTheUnfusedGraph) {
  if (!cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  random_cases(Device{DeviceType::CUDA, 0}, 48, 300);
  // Edge sizes: no keys, no queries, one of each.
  const Device g{DeviceType::CUDA, 0};
  Tensor q = randn({2, 3, 4}).to(g), k = randn({2, 0, 4}).to(g);
  expect_close(scaled_dot_product_attention(q, k, k).to(cpu()), zeros({2, 3, 4}));
  expect_close(scaled_dot_product_attention(randn({2, 0, 4}).to(g), q, q).to(cpu()), zeros({2, 0, 4}));
  Tensor one = randn({1, 1, 1});
  sdpa_kernel kernels(SdpaBackend::Fused);
  expect_close(scaled_dot_product_attention(one.to(g), one.to(g), one.to(g)).to(cpu()), one);
}

// kiln::sdpa_kernel: Auto runs small scores materialized on the GPU and fused on the CPU, Math
// never fuses, Fused fuses wherever the kernels apply; all three give the same values.
TEST(Attention, BackendChoiceFollowsSdpaKernel) {
  std::vector<Device> devices = {cpu()};
  if (cuda::is_available()) devices.push_back(Device{DeviceType::CUDA, 0});
  for (const Device& dev : devices) {
    SCOPED_TRACE(dev.str());
    manual_seed(kiln::testing::test_seed(70));
    Tensor q = randn({2, 4, 33, 16}, kFloat32, dev), k = randn({2, 4, 40, 16}, kFloat32, dev),
           v = randn({2, 4, 40, 16}, kFloat32, dev);
    EXPECT_EQ(current_sdpa_backend(), SdpaBackend::Auto);
    Tensor a = scaled_dot_product_attention(q, k, v, std::nullopt, true);
    // (Auto on CUDA: float32 on the tensor-core kernels where the device has them, sm_80 and
    // later; float64's small scores materialized)
    EXPECT_EQ(fused(a), auto_fuses_small(dev, kFloat32));
    EXPECT_EQ(fused(scaled_dot_product_attention(q.to(kFloat64), k.to(kFloat64), v.to(kFloat64))),
              dev.type == DeviceType::CPU);
    Tensor m, f;
    {
      sdpa_kernel math(SdpaBackend::Math);
      m = scaled_dot_product_attention(q, k, v, std::nullopt, true);
      EXPECT_FALSE(fused(m));
      {
        sdpa_kernel inner(SdpaBackend::Fused);
        f = scaled_dot_product_attention(q, k, v, std::nullopt, true);
        EXPECT_TRUE(fused(f));
      }
      EXPECT_EQ(current_sdpa_backend(), SdpaBackend::Math);
    }
    EXPECT_EQ(current_sdpa_backend(), SdpaBackend::Auto);
    expect_close(a.to(cpu()), m.to(cpu()), 1e-5, 1e-5);
    expect_close(f.to(cpu()), m.to(cpu()), 1e-5, 1e-5);
  }
  EXPECT_THROW(sdpa_kernel(static_cast<SdpaBackend>(7)), Error);
}

// The backend is part of a compiled entry's guards: switching it retraces (a fused entry is not
// replayed under Math), and switching back hits the first entry again.
TEST(Attention, CompiledEntriesAreGuardedOnTheBackend) {
  manual_seed(kiln::testing::test_seed(71));
  Tensor q = randn({2, 3, 12, 8}), k = randn({2, 3, 12, 8}), v = randn({2, 3, 12, 8});
  int traces = 0;
  bool was_fused = false;
  auto f = compile([&](const Tensor& a, const Tensor& b, const Tensor& c) {
    ++traces;
    Tensor y = scaled_dot_product_attention(a, b, c, std::nullopt, true);
    was_fused = fused(y);
    return y;
  });
  Tensor y0 = f(q, k, v);
  EXPECT_TRUE(was_fused);
  Tensor y1;
  {
    sdpa_kernel math(SdpaBackend::Math);
    y1 = f(q, k, v);
    EXPECT_FALSE(was_fused);
  }
  Tensor y2 = f(q, k, v);
  EXPECT_EQ(traces, 2);
  expect_close(y0, y1, 1e-5, 1e-5);
  expect_close(y0, y2, 0, 0);
}

TEST(Attention, EdgeSizes) {
  // No keys: zeros (softmax over nothing, times nothing), gradients zero.
  Tensor q = randn({2, 3, 4}).requires_grad_(), k = randn({2, 0, 4}), v = randn({2, 0, 4});
  Tensor y = scaled_dot_product_attention(q, k, v);
  EXPECT_TRUE(fused(y));
  expect_close(y, zeros({2, 3, 4}));
  expect_close(grad({y.sum()}, {q})[0], zeros({2, 3, 4}));
  // No queries, one key, head size 1.
  expect_close(scaled_dot_product_attention(randn({2, 0, 4}), randn({2, 5, 4}), randn({2, 5, 4})), zeros({2, 0, 4}));
  Tensor q1 = randn({1, 1, 1}), k1 = randn({1, 1, 1}), v1 = randn({1, 1, 1});
  expect_close(scaled_dot_product_attention(q1, k1, v1), v1);
}

TEST(Attention, FullyMaskedRowIsNaNLikeTheUnfusedGraph) {
  Tensor q = randn({3, 4}), k = randn({5, 4}), v = randn({5, 4});
  Tensor keep = (arange(3).reshape({3, 1}) != 1).expand({3, 5});  // row 1 sees no key
  Tensor y = scaled_dot_product_attention(q, k, v, keep);
  EXPECT_TRUE(fused(y));
  expect_close(y, unrewritten([&] { return unfused(q, k, v, keep, false, 0.5); }));
  auto yv = y.to_vector<float>();
  for (int c = 0; c < 4; ++c) {
    EXPECT_TRUE(std::isnan(yv[4 + c]));
    EXPECT_FALSE(std::isnan(yv[c]));
  }
}

TEST(Attention, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(kiln::testing::test_seed(3));
  using kiln::testing::random_input;
  kiln::testing::gradcheck(
      "attention", [](const std::vector<Tensor>& a) { return scaled_dot_product_attention(a[0], a[1], a[2], a[3]); },
      {random_input({2, 3, 4}, rng), random_input({2, 5, 4}, rng), random_input({2, 5, 4}, rng), [&] {
         auto m = random_input({3, 5}, rng);
         m.differentiable = false;
         return m;
       }()});
  kiln::testing::gradcheck("attention_causal",
                           [](const std::vector<Tensor>& a) {
                             return scaled_dot_product_attention(a[0], a[1], a[2], std::nullopt, true, 0.7);
                           },
                           {random_input({2, 6, 3}, rng), random_input({2, 6, 3}, rng), random_input({2, 6, 3}, rng)});
}

TEST(Attention, NotFusedWhereTheKernelsDoNotApply) {
  // A mask that needs a gradient, different key and value head sizes, a head size above 256.
  Tensor q = randn({2, 3, 4}), k = randn({2, 5, 4}), v = randn({2, 5, 6});
  Tensor m = randn({3, 5}).requires_grad_();
  EXPECT_FALSE(fused(scaled_dot_product_attention(q, k, randn({2, 5, 4}), m)));
  Tensor y = scaled_dot_product_attention(q, k, v);
  EXPECT_FALSE(y.node()->op == OpKind::Slice && y.node()->inputs[0]->op == OpKind::Attention);
  expect_close(y, unfused(q, k, v, std::nullopt, false, 0.5));
  EXPECT_FALSE(fused(scaled_dot_product_attention(randn({2, 3, 257}, kFloat16), randn({2, 5, 257}, kFloat16),
                                                  randn({2, 5, 257}, kFloat16))));
  // Gradient of the mask flows through the unfused graph.
  Tensor y2 = scaled_dot_product_attention(q, k, randn({2, 5, 4}), m);
  EXPECT_TRUE(grad({y2.sum()}, {m})[0].defined());
}

TEST(Attention, DoubleBackwardIsAClearError) {
  Tensor q = randn({3, 4}).requires_grad_(), k = randn({5, 4}), v = randn({5, 4});
  Tensor gq = grad({scaled_dot_product_attention(q, k, v).sum()}, {q}, {}, true, true)[0];
  try {
    grad({gq.sum()}, {q});
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("double backward"), std::string::npos) << e.what();
  }
}

TEST(Attention, CompiledTrainingStepAtChangingSequenceLengths) {
  // A step as users write it: projections, attention, loss, backward; T changes every call.
  manual_seed(kiln::testing::test_seed(7));
  Tensor wq = (randn({16, 16}) * 0.2).requires_grad_(), wo = (randn({16, 16}) * 0.2).requires_grad_();
  auto step = [&](const Tensor& x) {
    Tensor h = matmul(x, wq).reshape({2, -1, 2, 8}).transpose(1, 2);
    Tensor a = scaled_dot_product_attention(h, h, h, std::nullopt, true).transpose(1, 2).reshape({2, -1, 16});
    return matmul(a, wo).square().mean();
  };
  auto f = compile([&](const Tensor& x) {
    Tensor loss = step(x);
    auto g = grad({loss}, {wq, wo});
    return std::vector<Tensor>{loss, g[0], g[1]};
  });
  for (int64_t t : {5, 9, 70, 130}) {
    SCOPED_TRACE(t);
    Tensor x = randn({2, t, 16});
    auto got = f(x);
    Tensor loss = step(x);
    auto want = grad({loss}, {wq, wo});
    expect_close(got[0], loss, 2e-4, 2e-6);
    expect_close(got[1], want[0], 2e-4, 2e-6);
    expect_close(got[2], want[1], 2e-4, 2e-6);
  }
  EXPECT_LE(f.stats().entries, 2);
}

// ---- dropout inside the fused kernels ----

namespace {

// The dropout mask a fused sdpa call with generator seed `seed` draws for probabilities of shape
// [batch..., tq, tk] (true: kept), read back through the kernel itself: with q = k = 0 every
// probability is 1 / tk, and v = the identity puts probability (i, j) in output column j.
Tensor drawn_mask(uint64_t seed, const std::vector<int64_t>& batch, int64_t tq, int64_t tk, double p, Device dev) {
  std::vector<int64_t> qs = batch, vs = batch;
  qs.insert(qs.end(), {tq, tk});
  vs.insert(vs.end(), {tk, tk});
  manual_seed(seed);
  sdpa_kernel kernels(SdpaBackend::Fused);  // (the fused kernels' own mask)
  Tensor y =
      scaled_dot_product_attention(zeros(qs, kFloat64, dev), zeros(vs, kFloat64, dev),
                                   eye(tk, std::nullopt, kFloat64).expand(vs).to(dev), std::nullopt, false, 1.0, p);
  return y.to(cpu()) > 0;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.to_vector<double>() == b.to_vector<double>();
}

// Fused dropout equals the unfused graph dropout(softmax(.))·v with the same mask, forward and
// backward (float64: 1e-10; float32: expect_match), on random shapes with masks, causal and
// broadcast batch dims; the same seed draws the same mask, another seed another one. Head sizes
// in `heads`, sequence lengths up to max_seq (at most 256: drawn_mask reads the mask through the
// float64 kernels, whose heads stop there).
void dropout_cases(Device dev, std::vector<DType> dtypes = {kFloat64, kFloat32},
                   std::pair<int64_t, int64_t> heads = {1, 40}, int64_t max_seq = 100) {
  KILN_CHECK(max_seq <= 256, "dropout_cases: drawn_mask reads at most 256 keys");
  std::mt19937_64 rng(kiln::testing::test_seed(61));
  std::uniform_int_distribution<int64_t> seq(1, max_seq), head(heads.first, heads.second), small(1, 3);
  for (int it = 0; it < 12; ++it) {
    const DType dt = dtypes[static_cast<size_t>(it) % dtypes.size()];
    const int64_t b = small(rng), h = small(rng), tq = seq(rng), tk = seq(rng), d = head(rng);
    const bool causal = it % 3 == 1, masked = it % 3 == 2;
    const double p = it % 4 == 3 ? 0.9 : 0.1 + 0.1 * (it % 4), scale = 0.3;
    SCOPED_TRACE(::testing::Message() << "b " << b << " h " << h << " tq " << tq << " tk " << tk << " d " << d << " p "
                                      << p << (causal ? " causal" : "") << (masked ? " masked" : "") << " "
                                      << dtype_name(dt) << " on " << dev.str());
    const uint64_t seed = rng();
    manual_seed(rng());
    Tensor q = randn({b, h, tq, d}, dt), k = randn({b, h, tk, d}, dt), v = randn({b, h, tk, d}, dt),
           w = randn({b, h, tq, d}, dt), am = randn({tq, tk}, dt);
    std::optional<Tensor> mask;
    if (masked) mask = am.to(dev);
    Tensor qd = q.to(dev).requires_grad_(), kd = k.to(dev).requires_grad_(), vd = v.to(dev).requires_grad_();
    manual_seed(seed);
    sdpa_kernel kernels(SdpaBackend::Fused);
    Tensor y = scaled_dot_product_attention(qd, kd, vd, mask, causal, scale, p);
    EXPECT_TRUE(fused(y));
    auto g = grad({(y * w.to(dev)).sum()}, {qd, kd, vd});
    const Tensor keep = drawn_mask(seed, {b, h}, tq, tk, p, dev);
    // The reference: the unfused graph in float64 with that mask.
    Tensor q64 = q.to(kFloat64).requires_grad_(), k64 = k.to(kFloat64).requires_grad_(),
           v64 = v.to(kFloat64).requires_grad_(), ref;
    auto gr = unrewritten([&] {
      Tensor s = matmul(q64, k64.transpose(-2, -1)) * scale;
      if (causal) s = where(ones({tq, tk}, kBool).tril(), s, -INFINITY);
      if (masked) s = s + am.to(kFloat64);
      ref = matmul(softmax(s, -1) * keep.to(kFloat64) / (1 - p), v64);
      ref.eval();
      return grad({(ref * w.to(kFloat64)).sum()}, {q64, k64, v64});
    });
    expect_match(y.to(cpu()), ref);
    expect_grads_match(g, gr);
    EXPECT_TRUE(same(drawn_mask(seed, {b, h}, tq, tk, p, dev), keep)) << "the same seed draws the same mask";
    if (tq * tk >= 64)
      EXPECT_FALSE(same(drawn_mask(seed + 1, {b, h}, tq, tk, p, dev), keep)) << "another seed, another mask";
  }
}

}  // namespace

TEST(Attention, DropoutEqualsTheUnfusedGraphWithTheSameMask) {
  dropout_cases(cpu());
  dropout_cases(cpu(), {kBFloat16, kFloat16});
}

TEST(Attention, CudaDropoutEqualsTheUnfusedGraphAndTheCpuMask) {
  if (!cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  const Device g{DeviceType::CUDA, 0};
  dropout_cases(g);
  dropout_cases(g, {kBFloat16, kFloat16});  // (the tensor-core kernels)
  // The GPU draws the CPU's mask for the same seed (one definition, kernels/cpu/attention_dropout.h).
  EXPECT_TRUE(same(drawn_mask(77, {2, 3}, 45, 70, 0.3, g), drawn_mask(77, {2, 3}, 45, 70, 0.3, cpu())));
}

// The kernels on Hopper's warpgroup MMA (16-bit inputs at head buckets 64 and 128, the forward at
// 64 from 2048 keys, on compute capability 9.0; the mma.sync kernels elsewhere, which these cases
// then test), forward and backward:
// causal and not, additive and boolean masks, a negative scale (every tile takes the scaled path),
// odd lengths and tq != tk, heads off the bucket (d 100: rows without 16-byte loads; d 48), batch
// and heads of 1, 3-D inputs; and dropout, drawing the other kernels' mask.
TEST(Attention, CudaWarpgroupKernelsEqualTheUnfusedGraph) {
  if (!cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  const Device g{DeviceType::CUDA, 0};
  std::mt19937_64 rng(kiln::testing::test_seed(15));
  run_case({{2, 3, 257, 128}, {2, 3, 257, 128}, {2, 3, 257, 128}, 0, true}, kBFloat16, rng, 0.088, g);
  run_case({{1, 2, 1000, 100}, {1, 2, 700, 100}, {1, 2, 700, 100}, 1, false}, kFloat16, rng, 0.1, g);
  run_case({{2, 130, 128}, {2, 300, 128}, {2, 300, 128}, 2, false}, kBFloat16, rng, -0.09, g);
  run_case({{1, 1, 2100, 64}, {1, 1, 2100, 64}, {1, 1, 2100, 64}, 0, true}, kBFloat16, rng, 0.125, g);
  run_case({{1, 3, 90, 48}, {1, 3, 2500, 48}, {1, 3, 2500, 48}, 1, false}, kFloat16, rng, 0.14, g);
  dropout_cases(g, {kBFloat16, kFloat16}, {97, 128}, 256);
}

// The share of kept probabilities is 1 - p within 6 standard deviations (n = 2·3·200·250 draws:
// the bound holds by construction for any seed but a 1e-9 fraction).
TEST(Attention, DropoutKeepsTheRightShare) {
  for (double p : {0.1, 0.5, 0.85}) {
    const Tensor keep = drawn_mask(kiln::testing::test_seed(62), {2, 3}, 200, 250, p, cpu());
    const double n = static_cast<double>(keep.numel());
    const double kept = keep.to(kFloat64).sum().item<double>() / n;
    EXPECT_NEAR(kept, 1 - p, 6 * std::sqrt(p * (1 - p) / n)) << "p " << p;
  }
}

TEST(Attention, DropoutEdgesAndErrors) {
  Tensor q = randn({2, 5, 4}), k = randn({2, 6, 4}), v = randn({2, 6, 4});
  // p = 0: no dropout (the same node as without it); p = 1: everything dropped (zeros, as dropout gives).
  expect_close(scaled_dot_product_attention(q, k, v, std::nullopt, false, 0.5, 0.0),
               scaled_dot_product_attention(q, k, v, std::nullopt, false, 0.5), 0, 0);
  expect_close(scaled_dot_product_attention(q, k, v, std::nullopt, false, 0.5, 1.0), zeros({2, 5, 4}), 0, 0);
  for (double bad : {-0.1, 1.5, std::nan("")})
    EXPECT_THROW(scaled_dot_product_attention(q, k, v, std::nullopt, false, 0.5, bad), Error) << bad;
  // Fresh numbers per call.
  Tensor a = scaled_dot_product_attention(q, k, v, std::nullopt, false, 0.5, 0.5),
         b = scaled_dot_product_attention(q, k, v, std::nullopt, false, 0.5, 0.5);
  EXPECT_FALSE(same(a, b));
}

// A compiled training step with dropout: the same numbers as eager for the same seed, fresh ones
// on the next call, and gradients that match eager's.
TEST(Attention, CompiledDropoutDrawsLikeEager) {
  manual_seed(kiln::testing::test_seed(63));
  Tensor q = randn({2, 2, 24, 8}).requires_grad_(), k = randn({2, 2, 24, 8}), v = randn({2, 2, 24, 8});
  auto fn = [](const Tensor& a, const Tensor& b, const Tensor& c) {
    Tensor y = scaled_dot_product_attention(a, b, c, std::nullopt, true, std::nullopt, 0.25);
    return std::vector<Tensor>{y, grad({y.square().sum()}, {a})[0]};
  };
  auto f = compile(fn);
  manual_seed(5);
  auto got = f(q, k, v);
  manual_seed(5);
  auto want = fn(q, k, v);
  for (int i = 0; i < 2; ++i) expect_close(got[i], want[i], 1e-5, 1e-5);
  auto again = f(q, k, v);
  EXPECT_FALSE(same(again[0], got[0]));
}

// ---- hand-written attention rewritten to the fused primitive (kiln::patterns) ----

namespace {

int64_t sdpa_matches() {
  int64_t n = 0;
  for (const auto& [name, c] : patterns::match_counts())
    if (name.rfind("sdpa_", 0) == 0) n += c;
  return n;
}

// One hand-written form: scale written as `form` (0: *s, 1: /s, 2: none), mask as `mask`
// (0 none, 1 added float, 2 masked_fill(m, -inf), 3 where(keep, ., -inf), 4 causal tril keep,
// 5 causal masked_fill(tril(ones) == 0)); `upcast`: the softmax in float32 between casts, as
// autocast records it on CUDA.
Tensor hand_written(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& m, int form, int mask, double s,
                    bool upcast = false) {
  const double ninf = -std::numeric_limits<double>::infinity();
  Tensor x = matmul(q, k.transpose(-2, -1));
  x = form == 0 ? x * s : form == 1 ? x / s : x;
  const int64_t tq = q.size(-2), tk = k.size(-2);
  switch (mask) {
    case 1: x = x + m; break;
    case 2: x = x.masked_fill(m, ninf); break;
    case 3: x = where(m, x, ninf); break;
    case 4: x = where(ones({tq, tk}, kBool, q.device()).tril(), x, ninf); break;
    case 5: x = x.masked_fill(ones({tq, tk}, q.dtype(), q.device()).tril() == 0, ninf); break;
    default: break;
  }
  return matmul(upcast ? softmax(x.to(kFloat32), -1).to(q.dtype()) : softmax(x, -1), v);
}

}  // namespace

TEST(AttentionPatterns, HandWrittenFormsBecomeTheFusedKernelForwardAndBackward) {
  std::mt19937_64 rng(kiln::testing::test_seed(21));
  // (sequences of at least 2: with one key the softmax reduces over a size-1 dim, which kiln
  // records as no reduction at all, so the hand-written graph has another shape and stays as
  // written; AttentionPatterns.SizeOneSequencesStayCorrect checks those)
  std::uniform_int_distribution<int64_t> seq(2, 150), head(1, 40);
  for (int it = 0; it < 36; ++it) {
    const int form = it % 3, mask = (it / 3) % 6;
    const DType dt = it % 2 ? kFloat32 : kFloat64;
    const bool rank4 = (it / 18) % 2;
    const int64_t tq = seq(rng), tk = mask >= 4 ? tq : seq(rng), d = head(rng);
    SCOPED_TRACE(::testing::Message() << "form " << form << " mask " << mask << " tq " << tq << " tk " << tk << " d "
                                      << d << " " << dtype_name(dt) << (rank4 ? " rank 4" : " rank 3"));
    manual_seed(rng());
    auto sh = [&](int64_t t) { return rank4 ? std::vector<int64_t>{2, 3, t, d} : std::vector<int64_t>{2, t, d}; };
    Tensor q = randn(sh(tq), dt).requires_grad_(), k = randn(sh(tk), dt).requires_grad_(),
           v = randn(sh(tk), dt).requires_grad_();
    Tensor m = mask == 1 ? randn({tq, tk}, dt)
                         : logical_or(rand({tq, tk}) < 0.6, arange(tk).reshape({1, tk}) == 0) ^ (mask == 2);
    if (mask == 2) m = logical_and(m, arange(tk).reshape({1, tk}) != 0);  // masked_fill: column 0 never hidden
    const double s = 0.1 + 0.3 * (it % 4);
    Tensor w = randn(rank4 ? std::vector<int64_t>{2, 3, tq, d} : std::vector<int64_t>{2, tq, d}, dt);
    auto step = [&](const Tensor& qa, const Tensor& ka, const Tensor& va) {
      Tensor y = hand_written(qa, ka, va, m, form, mask, s);
      Tensor loss = (y * w).sum();
      auto g = grad({loss}, {qa, ka, va});
      return std::vector<Tensor>{y, g[0], g[1], g[2]};
    };
    patterns::set_enabled(true);
    const int64_t before = sdpa_matches();
    auto f = compile([&](const Tensor& qa, const Tensor& ka, const Tensor& va) { return step(qa, ka, va); });
    auto got = f(q, k, v);
    EXPECT_GE(f.stats().pattern_matches, 1);
    EXPECT_GT(sdpa_matches(), before);
    auto want = unrewritten([&] { return step(q, k, v); });
    for (int i = 0; i < 4; ++i) {
      SCOPED_TRACE(i);
      if (dt == kFloat64)
        expect_close(got[i], want[i], 1e-9, 1e-10);
      else
        expect_close(got[i], want[i], 2e-4, 2e-5 * std::max(1.0, want[i].abs().amax().item<double>()));
    }
  }
}

// Attention as autocast records it on CUDA — 16-bit scores, the softmax in float32 between casts —
// becomes the fused kernel too, forward and backward (every mask form but an additive one). The
// graph as written rounds the scores to 16 bits before the softmax (large logits lose whole
// units), the fused kernel keeps them in float32: both are checked against the float64 graph on
// the same values, the rewrite within the rounding of its result (expect_match's 16-bit terms).
TEST(AttentionPatterns, UpcastSoftmaxFormsBecomeTheFusedKernel) {
  std::mt19937_64 rng(kiln::testing::test_seed(23));
  std::uniform_int_distribution<int64_t> seq(2, 100), head(1, 40);
  const int masks[] = {0, 2, 3, 4, 5};
  for (int it = 0; it < 10; ++it) {
    const int form = it % 3, mask = masks[it % 5];
    const DType dt = it % 2 ? kBFloat16 : kFloat16;
    const int64_t tq = seq(rng), tk = mask >= 4 ? tq : seq(rng), d = head(rng);
    SCOPED_TRACE(::testing::Message() << "form " << form << " mask " << mask << " tq " << tq << " tk " << tk << " d "
                                      << d << " " << dtype_name(dt));
    manual_seed(rng());
    auto sh = [&](int64_t t) { return std::vector<int64_t>{2, 3, t, d}; };
    Tensor q = randn(sh(tq), dt).requires_grad_(), k = randn(sh(tk), dt).requires_grad_(),
           v = randn(sh(tk), dt).requires_grad_(), w = randn(sh(tq), dt);
    Tensor m = logical_or(rand({tq, tk}) < 0.6, arange(tk).reshape({1, tk}) == 0) ^ (mask == 2);
    if (mask == 2) m = logical_and(m, arange(tk).reshape({1, tk}) != 0);  // masked_fill: column 0 never hidden
    const double s = 0.1 + 0.1 * (it % 4);
    auto step = [&](const Tensor& qa, const Tensor& ka, const Tensor& va) {
      Tensor y = hand_written(qa, ka, va, m, form, mask, s, true);
      auto g = grad({(y * w).sum()}, {qa, ka, va});
      return std::vector<Tensor>{y, g[0], g[1], g[2]};
    };
    const int64_t before = sdpa_matches();
    auto f = compile([&](const Tensor& qa, const Tensor& ka, const Tensor& va) { return step(qa, ka, va); });
    auto got = f(q, k, v);
    EXPECT_GT(sdpa_matches(), before);
    Tensor q64 = q.detach().to(kFloat64).requires_grad_(), k64 = k.detach().to(kFloat64).requires_grad_(),
           v64 = v.detach().to(kFloat64).requires_grad_();
    std::vector<Tensor> want = unrewritten([&] {
      Tensor y = hand_written(q64, k64, v64, m, form, mask, s);
      auto g = grad({(y * w.to(kFloat64)).sum()}, {q64, k64, v64});
      return std::vector<Tensor>{y, g[0], g[1], g[2]};
    });
    double top = 1;
    for (const Tensor& x : want) top = std::max(top, x.abs().amax().item<double>());
    for (int i = 0; i < 4; ++i) {
      SCOPED_TRACE(i);
      EXPECT_EQ(got[i].dtype(), dt);
      expect_close(got[i].to(kFloat64), want[i], 2 * rel_tolerance(dt), 2 * abs_tolerance(dt) * top);
    }
    // Lazy eager, forward: rewritten when the value is asked for (the interpreter runs segments as recorded).
    if (interpreted()) continue;
    const int64_t eager_before = sdpa_matches();
    Tensor y = hand_written(q.detach(), k.detach(), v.detach(), m, form, mask, s, true);
    y.eval();
    EXPECT_GT(sdpa_matches(), eager_before);
    expect_match(y, want[0]);
  }
}

TEST(AttentionPatterns, NearMissesAreNotRewritten) {
  Tensor q = randn({2, 5, 4}), k = randn({2, 6, 4}), v = randn({2, 6, 4});
  auto matches = [&](auto fn) {
    auto f = compile([&](const Tensor& a, const Tensor& b, const Tensor& c) { return fn(a, b, c); });
    Tensor y = f(q, k, v);
    expect_close(y, fn(q, k, v), 1e-5, 1e-6);
    return f.stats().pattern_matches;
  };
  // Softmax over another dim.
  EXPECT_EQ(matches([](const Tensor& a, const Tensor& b, const Tensor& c) {
              return matmul(softmax(matmul(a, b.transpose(-2, -1)) * 0.5, -2).transpose(-2, -1), a);
            }),
            0);
  // The probabilities also used elsewhere.
  EXPECT_EQ(matches([](const Tensor& a, const Tensor& b, const Tensor& c) {
              Tensor p = softmax(matmul(a, b.transpose(-2, -1)) * 0.5, -1);
              return matmul(p, c) + p.sum({-1}, true);
            }),
            0);
  // A mask that would grow the scores (rank 4 over rank-3 attention) is left as written.
  Tensor big = randn({3, 1, 5, 6});
  EXPECT_EQ(matches([&](const Tensor& a, const Tensor& b, const Tensor& c) {
              return matmul(softmax(matmul(a, b.transpose(-2, -1)) * 0.5 + big, -1), c);
            }),
            0);
  // A tril over other sizes than the scores' is a mask, not is_causal (still rewritten, still equal).
  Tensor tri = ones({1, 6}, kBool).tril();
  EXPECT_EQ(matches([&](const Tensor& a, const Tensor& b, const Tensor& c) {
              return matmul(softmax(where(tri, matmul(a, b.transpose(-2, -1)) * 0.5, -INFINITY), -1), c);
            }),
            1);
}

TEST(AttentionPatterns, OffLeavesTheGraphAsWritten) {
  patterns::set_enabled(false);
  auto f = compile([](const Tensor& a, const Tensor& b, const Tensor& c) {
    return matmul(softmax(matmul(a, b.transpose(-2, -1)) * 0.5, -1), c);
  });
  Tensor q = randn({2, 5, 4});
  f(q, q, q);
  EXPECT_EQ(f.stats().pattern_matches, 0);
  patterns::set_enabled(true);
}

// Heads laid out as models lay them out: q, k, v chunks of one projection, reshaped to heads and
// transposed (the gradients of transposed inputs reach views laid out for the unfused graph's
// layout; the rewrite must hand them that layout).
TEST(AttentionPatterns, TransposedHeadLayoutsKeepTheirGradients) {
  manual_seed(kiln::testing::test_seed(31));
  const int64_t t = 37, h = 3, d = 16;
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE(variant);
    auto heads = [&](const Tensor& z, bool transposed) {
      return transposed ? z.reshape({2, t, h, d}).transpose(1, 2) : z.reshape({2, h, t, d});
    };
    auto loss = [&](const Tensor& x) {
      auto c = chunk(x, 3, -1);
      Tensor q = heads(c[0], variant != 1), k = heads(c[1], variant != 2), v = heads(c[2], variant != 3);
      Tensor y = matmul(softmax(matmul(q, k.transpose(-2, -1)) / 4.0, -1), v);
      return (y.transpose(1, 2).reshape({2, t, h * d}) * arange(h * d).to(kFloat32)).sum();
    };
    Tensor x = randn({2, t, 3 * h * d}).requires_grad_();
    auto f = compile([&](const Tensor& xi) {
      Tensor l = loss(xi);
      return std::vector<Tensor>{l, grad({l}, {xi})[0]};
    });
    auto got = f(x);
    EXPECT_EQ(f.stats().pattern_matches, 1);
    Tensor l = loss(x);
    Tensor g = grad({l}, {x})[0];
    expect_close(got[0], l, 1e-5, 1e-3);
    expect_close(got[1], g, 1e-4, 1e-4 * std::max(1.0, g.abs().amax().item<double>()));
  }
}

// A loss whose gradient does not need attention's value (sum(y * w)): nothing reads the forward
// result in the joint graph; the gradient-only form of the pattern still rewrites it.
TEST(AttentionPatterns, GradientsOnlyWhenNothingReadsTheResult) {
  manual_seed(kiln::testing::test_seed(41));
  Tensor q = randn({2, 3, 20, 8}).requires_grad_(), k = randn({2, 3, 20, 8}).requires_grad_(),
         v = randn({2, 3, 20, 8}).requires_grad_(), w = randn({2, 3, 20, 8});
  auto loss = [&](const Tensor& a, const Tensor& b, const Tensor& c) {
    return (matmul(softmax(matmul(a, b.transpose(-2, -1)) * 0.3, -1), c) * w).sum();
  };
  auto f = compile([&](const Tensor& a, const Tensor& b, const Tensor& c) { return grad({loss(a, b, c)}, {a, b, c}); });
  auto got = f(q, k, v);
  EXPECT_EQ(f.stats().pattern_matches, 1);
  auto want = grad({loss(q, k, v)}, {q, k, v});
  for (int i = 0; i < 3; ++i) expect_close(got[i], want[i], 1e-4, 1e-5);
}

// Hand-written attention in plain eager code (no compile()): the rewrite runs on the lazy segment
// when its plan is made, forward-only for inference, with the gradients for a training step whose
// gradients are read together; a second call of the same structure reuses the plan (no new
// match) and gives the same bits. Keys stored before the call (their transpose is stored data, not
// a recorded op) match too.
// Random hand-written forms on `dev`, fused where auto_fuses_small says.
void lazy_eager_cases(Device dev) {
  std::mt19937_64 rng(kiln::testing::test_seed(51));
  std::uniform_int_distribution<int64_t> seq(2, 90), head(1, 24);
  for (int it = 0; it < 12; ++it) {
    const int form = it % 3, mask = (it / 2) % 6;
    const DType dt = it % 2 ? kFloat32 : kFloat64;
    const bool fused = auto_fuses_small(dev, dt);
    const int64_t tq = seq(rng), tk = mask >= 4 ? tq : seq(rng), d = head(rng);
    SCOPED_TRACE(::testing::Message() << "form " << form << " mask " << mask << " tq " << tq << " tk " << tk << " d "
                                      << d << " " << dtype_name(dt) << " on " << dev.str());
    manual_seed(rng());
    Tensor q = randn({2, 3, tq, d}, dt).to(dev), k = randn({2, 3, tk, d}, dt).to(dev),
           v = randn({2, 3, tk, d}, dt).to(dev);
    Tensor m = mask == 1 ? randn({tq, tk}, dt)
                         : logical_or(rand({tq, tk}) < 0.6, arange(tk).reshape({1, tk}) == 0) ^ (mask == 2);
    if (mask == 2) m = logical_and(m, arange(tk).reshape({1, tk}) != 0);
    m = m.to(dev);
    Tensor w = randn({2, 3, tq, d}, dt).to(dev);
    eval({q, k, v, m, w});
    const double s = 0.1 + 0.3 * (it % 4);
    auto close = [&](const Tensor& got_on, const Tensor& want_on) {
      const Tensor got = got_on.to(cpu()), want = want_on.to(cpu());
      if (dt == kFloat64)
        expect_close(got, want, 1e-9, 1e-10);
      else
        expect_close(got, want, 2e-4, 2e-5 * std::max(1.0, want.abs().amax().item<double>()));
    };
    // Inference.
    auto infer = [&] { return hand_written(q, k, v, m, form, mask, s); };
    int64_t before = sdpa_matches();
    Tensor y = infer();
    y.eval();
    const int64_t after = sdpa_matches();
    EXPECT_EQ(after > before, fused);
    Tensor y2 = infer();
    y2.eval();
    EXPECT_EQ(sdpa_matches(), after) << "the second call reuses the plan";
    EXPECT_EQ(y2.to_vector<double>(), y.to_vector<double>());
    close(y, unrewritten(infer));
    // A training step: backward, then every gradient read at once.
    auto train = [&] {
      Tensor qg = q.detach().requires_grad_(), kg = k.detach().requires_grad_(), vg = v.detach().requires_grad_();
      (hand_written(qg, kg, vg, m, form, mask, s) * w).sum().backward();
      std::vector<Tensor> g = {qg.grad(), kg.grad(), vg.grad()};
      eval(g);
      return g;
    };
    before = sdpa_matches();
    auto g = train();
    EXPECT_EQ(sdpa_matches() > before, fused) << "the gradients' segment";
    auto gw = unrewritten(train);
    for (int i = 0; i < 3; ++i) {
      SCOPED_TRACE(i);
      close(g[i], gw[i]);
    }
  }
}

TEST(AttentionPatterns, LazyEagerHandWrittenAttentionIsFused) {
  if (interpreted()) GTEST_SKIP() << "the interpreter runs segments as recorded";
  lazy_eager_cases(cpu());
}

// nanoGPT's hand-written attention as a C++ user writes it in lazy eager (B 4, H 4, T 128, D 32,
// scores scaled by 1/sqrt(D), a causal mask by masked_fill(ones.tril() == 0, -inf)): rewritten to
// the fused kernel once the probabilities' handle is gone when the value is asked for; while the
// program still holds them (it may read them later) the graph runs as written, with the same
// values, and KILN_LOG=patterns says why.
static void nanogpt_form(Device dev, DType dt, double rtol, double atol) {
  manual_seed(kiln::testing::test_seed(53));
  const int64_t B = 4, H = 4, T = 128, D = 32;
  Tensor q = randn({B, H, T, D}, dt, dev), k = randn({B, H, T, D}, dt, dev), v = randn({B, H, T, D}, dt, dev);
  eval({q, k, v});
  auto attend = [&](bool hold) {
    Tensor att = matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(D)));
    att = att.masked_fill(ones({T, T}, dt, dev).tril() == 0, -std::numeric_limits<double>::infinity());
    att = softmax(att, -1);
    Tensor y = matmul(att, v);
    if (!hold) att = Tensor();
    y.eval();
    return y;
  };
  const Tensor want = unrewritten([&] { return attend(false); });
  for (bool hold : {false, true}) {
    SCOPED_TRACE(hold ? "probabilities held" : "probabilities released");
    const int64_t before = sdpa_matches();
    const Tensor y = attend(hold);
    EXPECT_EQ(sdpa_matches() > before, !hold);
    expect_close(y.to(cpu()).to(kFloat64), want.to(cpu()).to(kFloat64), rtol, atol);
  }
}

TEST(AttentionPatterns, NanoGptFormInLazyEager) {
  if (interpreted()) GTEST_SKIP() << "the interpreter runs segments as recorded";
  nanogpt_form(cpu(), kFloat32, 2e-5, 2e-6);
}

// The same in bfloat16 on the GPU: rewritten to the tensor-core kernels at this small size (the
// materialized graph rounds the scores and probabilities to bfloat16, the kernels keep float32:
// within bfloat16's rounding of each other).
TEST(AttentionPatterns, CudaNanoGptFormInLazyEagerBFloat16) {
  if (interpreted()) GTEST_SKIP() << "the interpreter runs segments as recorded";
  if (!cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  nanogpt_form(Device{DeviceType::CUDA, 0}, kBFloat16, 2.0 / 64, 2.0 / 64);
}

TEST(AttentionPatterns, CudaLazyEagerHandWrittenAttentionIsFused) {
  if (interpreted()) GTEST_SKIP() << "the interpreter runs segments as recorded";
  if (!cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  const Device g{DeviceType::CUDA, 0};
  // Small scores: float32 rewritten to the tensor-core kernels (sm_80 and later), float64 stays as
  // written (the unfused graph is faster than its CUDA-core kernels).
  lazy_eager_cases(g);
  // 1 GiB of scores (16 x 4 x 2048 x 2048 float32): rewritten, and equal to the unfused graph.
  manual_seed(kiln::testing::test_seed(52));
  Tensor q = randn({16, 4, 2048, 64}, kFloat32, g), k = randn({16, 4, 2048, 64}, kFloat32, g),
         v = randn({16, 4, 2048, 64}, kFloat32, g);
  eval({q, k, v});
  auto infer = [&] { return matmul(softmax(matmul(q, k.transpose(-2, -1)) * 0.125, -1), v); };
  const int64_t before = sdpa_matches();
  Tensor y = infer();
  y.eval();
  EXPECT_GT(sdpa_matches(), before);
  const Tensor want = unrewritten(infer);
  EXPECT_LT((y - want).abs().amax().item<double>(), 2e-5 * std::max(1.0, want.abs().amax().item<double>()));
}

// Hand-written attention with dropout on the probabilities becomes the fused kernel with dropout,
// compiled and in lazy eager. The kernel draws its own mask (another sample of the same
// distribution), so the check is statistical: over K calls, the mean of the output and of the
// gradients equals the expectation, softmax(q·kᵀ·s)·v without dropout and its gradients (dropout
// is unbiased and the loss is linear in the output), within 6 standard errors of the K samples.
TEST(AttentionPatterns, HandWrittenDropoutBecomesTheFusedKernelWithDropout) {
  manual_seed(kiln::testing::test_seed(71));
  Tensor q = randn({2, 6, 4}, kFloat64), k = randn({2, 7, 4}, kFloat64), v = randn({2, 7, 4}, kFloat64),
         w = randn({2, 6, 4}, kFloat64);
  eval({q, k, v, w});
  const double p = 0.3;
  auto step = [&](const Tensor& a, const Tensor& b, const Tensor& c, double drop) {
    Tensor pr = softmax(matmul(a, b.transpose(-2, -1)) * 0.5, -1);
    if (drop > 0) pr = dropout(pr, drop);
    Tensor x = matmul(pr, c);
    auto g = grad({(x * w).sum()}, {a, b, c});
    return std::vector<Tensor>{x, g[0], g[1], g[2]};
  };
  auto leaves = [&] {
    return std::vector<Tensor>{q.detach().requires_grad_(), k.detach().requires_grad_(), v.detach().requires_grad_()};
  };
  auto want = unrewritten([&] {
    auto l = leaves();
    return step(l[0], l[1], l[2], 0);
  });
  auto expect_mean = [&](const std::function<std::vector<Tensor>()>& draw, const char* how) {
    SCOPED_TRACE(how);
    constexpr int K = 300;
    std::vector<Tensor> sum(4), sq(4);
    for (int n = 0; n < K; ++n) {
      auto r = draw();
      for (int i = 0; i < 4; ++i) {
        sum[i] = n ? sum[i] + r[i] : r[i];
        sq[i] = n ? sq[i] + r[i] * r[i] : r[i] * r[i];
      }
      eval(sum);
      eval(sq);
    }
    for (int i = 0; i < 4; ++i) {
      SCOPED_TRACE(i);
      Tensor mean = sum[i] / K, var = (sq[i] / K - mean * mean).clamp_min(0) * (K / (K - 1.0));
      auto m = mean.to_vector<double>(), sd = var.sqrt().to_vector<double>(), ref = want[i].to_vector<double>();
      for (size_t e = 0; e < m.size(); ++e)
        EXPECT_NEAR(m[e], ref[e], 6 * sd[e] / std::sqrt(double(K)) + 1e-12) << "element " << e;
    }
  };
  int64_t before = patterns::match_counts()["sdpa_mul_dropout_rank3"];
  auto f = compile([&](const Tensor& a, const Tensor& b, const Tensor& c) { return step(a, b, c, p); });
  expect_mean(
      [&] {
        auto l = leaves();
        return f(l[0], l[1], l[2]);
      },
      "compiled");
  EXPECT_EQ(f.stats().pattern_matches, 1);
  EXPECT_GT(patterns::match_counts()["sdpa_mul_dropout_rank3"], before);
  if (interpreted()) return;  // (the interpreter runs lazy segments as recorded)
  before = patterns::match_counts()["sdpa_mul_dropout_rank3"];
  // Lazy eager, as a training loop writes it: backward() accumulates into .grad, then the output
  // and the gradients are read together (the forward and backward are one segment).
  expect_mean(
      [&] {
        auto l = leaves();
        Tensor y;
        {
          Tensor pr = dropout(softmax(matmul(l[0], l[1].transpose(-2, -1)) * 0.5, -1), p);
          y = matmul(pr, l[2]);
        }
        (y * w).sum().backward();
        std::vector<Tensor> r = {y, l[0].grad(), l[1].grad(), l[2].grad()};
        eval(r);
        return r;
      },
      "lazy eager");
  EXPECT_GT(patterns::match_counts()["sdpa_mul_dropout_rank3"], before);
}

TEST(AttentionPatterns, SizeOneSequencesStayCorrect) {
  for (int64_t tq : {1, 4})
    for (int64_t tk : {1, 3}) {
      Tensor q = randn({2, tq, 5}).requires_grad_(), k = randn({2, tk, 5}).requires_grad_(), v = randn({2, tk, 5});
      auto fn = [](const Tensor& a, const Tensor& b, const Tensor& c) {
        Tensor y = matmul(softmax(matmul(a, b.transpose(-2, -1)) * 0.4, -1), c);
        auto g = grad({y.square().sum()}, {a, b});
        return std::vector<Tensor>{y, g[0], g[1]};
      };
      auto got = compile(fn)(q, k, v);
      auto want = fn(q, k, v);
      for (int i = 0; i < 3; ++i) expect_close(got[i], want[i], 1e-5, 1e-5);
    }
}

// Threads compiling hand-written attention at once: the first match of a process traces the
// rewrite's joint forms (once, on first need) while the others wait for it; every result equals
// the unfused eager graph.
TEST(AttentionPatterns, ThreadsCompilingAtOnceShareTheRewrites) {
  constexpr int kThreads = 4;
  std::vector<std::thread> ts;
  std::vector<double> worst(kThreads, 0);
  std::vector<int> matches(kThreads, 0);
  std::vector<std::string> errors(kThreads);
  for (int k = 0; k < kThreads; ++k)
    ts.emplace_back([&, k] {
      try {
        Tensor q = randn({2, 3, 9 + k, 8}).requires_grad_(), kk = randn({2, 3, 9 + k, 8}), v = randn({2, 3, 9 + k, 8});
        auto fn = [](const Tensor& a, const Tensor& b, const Tensor& c) {
          Tensor y = matmul(softmax(matmul(a, b.transpose(-2, -1)) / 2.5, -1), c);
          return std::vector<Tensor>{y, grad({y.square().sum()}, {a})[0]};
        };
        auto f = compile(fn);
        auto got = f(q, kk, v);
        auto want = fn(q, kk, v);
        matches[k] = f.stats().pattern_matches;
        for (int i = 0; i < 2; ++i)
          worst[k] = std::max(worst[k], (got[i] - want[i]).abs().amax().item<double>() /
                                            std::max(1.0, want[i].abs().amax().item<double>()));
      } catch (const std::exception& e) {
        errors[k] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int k = 0; k < kThreads; ++k) {
    EXPECT_EQ(errors[k], "") << "thread " << k;
    EXPECT_EQ(matches[k], 1) << "thread " << k;
    EXPECT_LT(worst[k], 1e-5) << "thread " << k;
  }
}

// Non-finite inputs give what the unfused graph gives, element for element (NaN where it has NaN),
// on the CPU and (when there is one) the GPU, in float64 and float32.
// Gradients through non-finite values on the GPU's float32 kernels (3xTF32: the scan of q, k, v
// and dO sends them to the careful form) equal the CPU's fused kernel's, which computes them the
// same way (dS = P (dP - dO·O)): the same NaN elements, the same infinities, the finite ones
// close. An infinity or NaN in dO only (the forward on the plain form), or in a key.
TEST(Attention, CudaNonFiniteGradientsMatchTheCpuKernel) {
  if (!cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  const Device g{DeviceType::CUDA, 0};
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  manual_seed(kiln::testing::test_seed(16));
  for (double bad : {inf, -inf, nan})
    for (bool in_key : {false, true}) {
      SCOPED_TRACE(::testing::Message() << bad << (in_key ? " in k" : " in dO"));
      Tensor q = randn({2, 37, 24}), k = randn({2, 41, 24}), v = randn({2, 41, 24}), w = randn({2, 37, 24});
      (in_key ? k : w).index_put_({1, 5, 3}, bad);
      auto grads = [&](Device dev) {
        sdpa_kernel kernels(SdpaBackend::Fused);
        Tensor qd = q.to(dev).requires_grad_(), kd = k.to(dev).requires_grad_(), vd = v.to(dev).requires_grad_();
        Tensor y = scaled_dot_product_attention(qd, kd, vd, std::nullopt, true);
        EXPECT_TRUE(fused(y));
        std::vector<Tensor> gs = grad({(y * w.to(dev)).sum()}, {qd, kd, vd});
        for (Tensor& t : gs) t = t.to(cpu());
        return gs;
      };
      const std::vector<Tensor> want = grads(cpu()), got = grads(g);
      for (size_t i = 0; i < 3; ++i) {
        const auto a = got[i].to_vector<float>(), b = want[i].to_vector<float>();
        ASSERT_EQ(a.size(), b.size());
        size_t nans = 0;
        for (size_t e = 0; e < a.size(); ++e) {
          nans += std::isnan(b[e]);
          EXPECT_EQ(std::isnan(a[e]), std::isnan(b[e])) << "gradient " << i << " element " << e << ": " << a[e] << " vs " << b[e];
          if (std::isnan(a[e]) || std::isnan(b[e]) || a[e] == b[e]) continue;  // (infinities: equal)
          EXPECT_NEAR(a[e], b[e], 1e-4 * (1 + std::abs(b[e]))) << "gradient " << i << " element " << e;
        }
        if (i == 0) EXPECT_GT(nans, 0u) << "the bad value reaches dq";
      }
    }
}

TEST(Attention, NonFiniteInputsMatchTheUnfusedGraph) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<Device> devices = {cpu()};
  if (cuda::is_available()) devices.push_back(Device{DeviceType::CUDA, 0});
  for (double bad : {inf, -inf, nan}) {
    Tensor q = randn({2, 5, 4}, kFloat64), k = randn({2, 6, 4}, kFloat64), v = randn({2, 6, 4}, kFloat64);
    // one bad value in a query row, one in a key row, one in a value row
    q.index_put_({0, 1, 2}, bad);
    k.index_put_({1, 3, 0}, bad);
    v.index_put_({1, 4, 1}, bad);
    Tensor want = unrewritten([&] { return unfused(q, k, v, std::nullopt, false, 0.5); });
    for (const Device& dev : devices)
      for (DType dt : {kFloat64, kFloat32}) {
        SCOPED_TRACE(::testing::Message() << bad << " " << dev.str() << " " << dtype_name(dt));
        sdpa_kernel kernels(SdpaBackend::Fused);
        Tensor y = scaled_dot_product_attention(q.to(dt).to(dev), k.to(dt).to(dev), v.to(dt).to(dev));
        EXPECT_TRUE(fused(y));
        auto a = y.to(cpu()).to_vector<double>(), b = want.to(dt).to_vector<double>();
        const double tol = dt == kFloat64 ? 1e-10 : 1e-4;
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_EQ(std::isnan(a[i]), std::isnan(b[i])) << "element " << i << ": " << a[i] << " vs " << b[i];
          if (std::isnan(a[i]) || std::isnan(b[i]) || a[i] == b[i]) continue;  // (infinities: equal)
          EXPECT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << "element " << i;
        }
      }
  }
}
