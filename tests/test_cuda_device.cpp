// CUDA tensors through the public API: devices, copies, eager ops, GEMM, autograd, compile,
// nn/optim, the caching allocator and errors, each checked against the same program on the CPU.
//
//   CudaDevice.WithoutGpu*  run everywhere; on a machine without a usable GPU they check that
//                           every CUDA request fails with a clear kiln::Error.
//   CudaDevice.*            need a GPU (skip otherwise).
//
// Tolerances, GPU against CPU on the same program: integers and bools exactly; float64 within
// 1e-10 relative (plus 1e-12 absolute); float32 within 2e-5 relative (plus 1e-6 absolute) for
// pointwise chains (CUDA's math functions are within 2-4 ulp of correctly rounded, the CPU
// tiers' within 1-4 ulp) and 1e-4 for reductions, GEMMs and gradients (summation order differs:
// one float32 ulp per halving step of a tree against a sequential/blocked sum).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "kiln.h"
#include "test_seed.h"

using kiln::Tensor;

namespace {

// KILN_TEST_DEVICE=fake-cuda runs these tests on the simulated device (tests/fake_device.h).
bool fake() {
  const char* v = std::getenv("KILN_TEST_DEVICE");
  return v && std::string(v) == "fake-cuda";
}
bool gpu() {
  if (fake()) kiln::testing::install_fake_cuda();
  return kiln::cuda::is_available();
}

#define NEED_GPU() \
  if (!gpu()) GTEST_SKIP() << "no usable CUDA device"

// |a - b| <= rtol * |b| + atol elementwise (NaN matches NaN, infinities match exactly).
void expect_close(const Tensor& got, const Tensor& want, double rtol, double atol, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i])) {
      EXPECT_TRUE(std::isnan(g[i])) << what << " [" << i << "]: got " << g[i] << ", want nan";
    } else if (std::isinf(w[i])) {
      EXPECT_EQ(g[i], w[i]) << what << " [" << i << "]";
    } else {
      EXPECT_LE(std::abs(g[i] - w[i]), rtol * std::abs(w[i]) + atol)
          << what << " [" << i << "]: got " << g[i] << ", want " << w[i];
    }
    if (::testing::Test::HasFailure()) return;
  }
}

// 16-bit floats: a transcendental's last float bit may round the other way (1 ulp of the
// 16-bit type), then carried through up to 6 ops.
// The largest |v| over t's finite elements (0 if none).
double finite_max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>())
    if (std::isfinite(v)) m = std::max(m, std::abs(v));
  return m;
}

double rtol_of(kiln::DType d, bool reduced) {
  if (d == kiln::kFloat16) return 1e-2;
  if (d == kiln::kBFloat16) return 6e-2;
  if (d == kiln::kFloat64) return 1e-10;
  if (d == kiln::kFloat32) return reduced ? 1e-4 : 2e-5;
  return 0;
}
double atol_of(kiln::DType d) {
  return d == kiln::kFloat64    ? 1e-12
         : d == kiln::kFloat32  ? 1e-6
         : d == kiln::kFloat16  ? 1e-2
         : d == kiln::kBFloat16 ? 6e-2
                                : 0;
}

}  // namespace

TEST(CudaDevice, WithoutGpuEveryRequestIsAClearError) {
  if (gpu()) GTEST_SKIP() << "a GPU is available (covered by the tests below)";
  EXPECT_EQ(kiln::cuda::device_count(), 0);
  kiln::cuda::synchronize();  // nothing to wait for: no error
  Tensor x = kiln::ones({3});
  for (auto make :
       std::vector<std::function<Tensor()>>{[] { return kiln::zeros({2}, kiln::kFloat32, kiln::cuda()); },
                                            [&] { return x.cuda(); }, [&] { return x.to(kiln::cuda(1)); }}) {
    try {
      make();
      ADD_FAILURE() << "expected kiln::Error";
    } catch (const kiln::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("cuda:"), std::string::npos) << m;
      EXPECT_TRUE(m.find("not available") != std::string::npos || m.find("without CUDA") != std::string::npos) << m;
    }
  }
  EXPECT_THROW(kiln::cuda::memory_stats(), kiln::Error);
  EXPECT_EQ(x.sum().item<float>(), 3.0f);  // the CPU is untouched
}

TEST(CudaDevice, DevicesCopiesAndPrinting) {
  NEED_GPU();
  Tensor h = kiln::arange(0, 12, 1, kiln::kFloat32).reshape({3, 4});
  Tensor d = h.cuda();
  EXPECT_EQ(d.device(), kiln::Device(kiln::cuda(0)));
  EXPECT_EQ(d.device().str(), "cuda:0");
  EXPECT_EQ(d.to(kiln::cpu()).device(), kiln::cpu());
  EXPECT_EQ(d.cpu().to_vector<float>(), h.to_vector<float>());
  EXPECT_EQ(d.t().cpu().to_vector<float>(), h.t().to_vector<float>());  // a strided view copies densely
  EXPECT_EQ(d.sum().item<float>(), 66.0f);
  std::ostringstream os;
  os << d;
  EXPECT_NE(os.str().find("device='cuda:0'"), std::string::npos) << os.str();
  for (kiln::DType dt : {kiln::kFloat64, kiln::kInt32, kiln::kInt64, kiln::kBool, kiln::kFloat16, kiln::kBFloat16}) {
    Tensor z = kiln::full({5}, 3, dt, kiln::cuda());
    EXPECT_EQ(z.device().str(), "cuda:0");
    EXPECT_EQ(z.cpu().to_vector<double>(), kiln::full({5}, 3, dt).to_vector<double>()) << kiln::dtype_name(dt);
  }
  Tensor e = kiln::zeros({0, 3}, kiln::kFloat32, kiln::cuda());
  EXPECT_EQ(e.cpu().numel(), 0);
}

TEST(CudaDevice, MixingDevicesNamesBoth) {
  NEED_GPU();
  Tensor a = kiln::ones({4}, kiln::kFloat32, kiln::cuda());
  Tensor b = kiln::ones({4});
  try {
    (void)(a + b);
    ADD_FAILURE() << "expected kiln::Error";
  } catch (const kiln::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find("cpu"), std::string::npos) << m;
  }
  // 0-d CPU tensors and numbers mix freely, as in PyTorch.
  Tensor s = kiln::full({}, 2.0, kiln::kFloat32);
  Tensor r = (a * s + 1.5).cpu();
  EXPECT_EQ(r.to_vector<float>(), std::vector<float>(4, 3.5f));
  EXPECT_EQ((s * a).device().str(), "cuda:0");
  // The process keeps working.
  EXPECT_EQ((a + a).sum().item<float>(), 8.0f);
}

// Random chains of pointwise ops and reductions, eager on the GPU against the CPU.
TEST(CudaDevice, RandomEagerProgramsMatchTheCpu) {
  NEED_GPU();
  const uint64_t seed = kiln::testing::test_seed(7);
  std::mt19937_64 rng(seed);
  int programs = 0;
  for (int p = 0; p < 200; ++p) {
    // float16/bfloat16 programs too: fused on the GPU (float32 math, rounded after each op).
    const kiln::DType dts[] = {kiln::kFloat32, kiln::kFloat32, kiln::kFloat64, kiln::kFloat16, kiln::kBFloat16};
    kiln::DType dt = dts[rng() % 5];
    int64_t rows = 1 + rng() % 33, cols = 1 + rng() % 300;
    kiln::manual_seed(seed * 1000 + p);
    Tensor x = kiln::randn({rows, cols}, dt);
    Tensor y = kiln::randn({1, cols}, dt);
    Tensor xd = x.cuda(), yd = y.cuda();
    bool reduced = false;
    std::string desc;
    // The largest finite magnitude the program's float32/float64 values reach: a later difference
    // (t * u + 0.5 near 0) or a sine of such a value keeps that value's absolute error, which
    // the element's own relative tolerance does not cover (seed 30550, float64: 7e-12 off on
    // 0.0077 after three row-mean products).
    double mag = finite_max_abs(y);
    for (int s = 0; s < 6; ++s) {
      int k = static_cast<int>(rng() % 10);
      auto apply = [&](Tensor& t, const Tensor& u) {
        switch (k) {
          case 0: t = t.tanh(); break;
          case 1: t = t * u + 0.5; break;
          case 2: t = kiln::exp(t * 0.1) - u; break;
          case 3: t = kiln::maximum(t, u); break;
          case 4: t = t.sigmoid() * 2; break;
          case 5: t = kiln::where(t > 0, t, u * 3); break;
          case 6: t = t - t.amax({1}, true); break;
          case 7: t = t / (kiln::abs(u) + 1); break;
          case 8: t = kiln::sin(t) + kiln::cos(u); break;
          default: t = t * t.mean({1}, true); break;
        }
      };
      mag = std::max(mag, finite_max_abs(x));
      apply(x, y);
      apply(xd, yd);
      reduced = reduced || k == 6 || k == 9;
      desc += std::to_string(k) + " ";
    }
    bool full = rng() % 2;
    Tensor want = full ? x.sum() : x.sum({0});
    Tensor got = full ? xd.sum() : xd.sum({0});
    mag = std::max(mag, finite_max_abs(x));
    const double carried = dt == kiln::kFloat64 || dt == kiln::kFloat32 ? rtol_of(dt, reduced) * mag : 0;
    expect_close(xd, x, rtol_of(dt, reduced), atol_of(dt) + carried,
                 "program " + std::to_string(p) + " (" + desc + ")");
    expect_close(got, want, rtol_of(dt, true) * 10, atol_of(dt) * cols * rows, "sum of program " + std::to_string(p));
    if (HasFailure()) return;
    ++programs;
  }
  EXPECT_EQ(programs, 200);
}

TEST(CudaDevice, IntegerAndBoolOpsAreExact) {
  NEED_GPU();
  Tensor a = kiln::randint(-50, 50, {7, 9});
  Tensor b = kiln::randint(1, 9, {7, 9});
  Tensor ad = a.cuda(), bd = b.cuda();
  EXPECT_EQ(kiln::remainder(ad * bd - 3, bd).cpu().to_vector<int64_t>(),
            kiln::remainder(a * b - 3, b).to_vector<int64_t>());
  EXPECT_EQ((ad > bd).cpu().to_vector<uint8_t>(), (a > b).to_vector<uint8_t>());
  EXPECT_EQ(ad.sum({1}).cpu().to_vector<int64_t>(), a.sum({1}).to_vector<int64_t>());
  EXPECT_EQ(ad.argmax(1).cpu().to_vector<int64_t>(), a.argmax(1).to_vector<int64_t>());
  // Full reductions (split in two stages on the GPU) of a larger tensor.
  Tensor big = kiln::randint(-1000, 1000, {300, 517});
  Tensor bigd = big.cuda();
  EXPECT_EQ(bigd.sum().item<int64_t>(), big.sum().item<int64_t>());
  EXPECT_EQ(bigd.amax().item<int64_t>(), big.amax().item<int64_t>());
  EXPECT_EQ(bigd.amin().item<int64_t>(), big.amin().item<int64_t>());
  EXPECT_EQ(bigd.argmax().item<int64_t>(), big.argmax().item<int64_t>());
  EXPECT_EQ(bigd.argmin().item<int64_t>(), big.argmin().item<int64_t>());
  Tensor f = kiln::randn({1000, 999}, kiln::kFloat64);
  Tensor fd = f.cuda();
  EXPECT_NEAR(fd.sum().item<double>(), f.sum().item<double>(), 1e-9 * f.abs().sum().item<double>());
  EXPECT_EQ(fd.argmax().item<int64_t>(), f.argmax().item<int64_t>());
  Tensor withnan = kiln::where(kiln::rand({700, 300}) > 0.999, std::numeric_limits<double>::quiet_NaN(),
                               f.narrow(0, 0, 700).narrow(1, 0, 300));
  EXPECT_TRUE(std::isnan(withnan.cuda().amax().item<double>()) == std::isnan(withnan.amax().item<double>()));
  EXPECT_EQ(withnan.cuda().argmax().item<int64_t>(), withnan.argmax().item<int64_t>());
}

TEST(CudaDevice, MatmulOnCublasMatchesTheCpu) {
  NEED_GPU();
  std::mt19937_64 rng(kiln::testing::test_seed(11));
  for (int c = 0; c < 40; ++c) {
    kiln::DType dt = c % 2 ? kiln::kFloat64 : kiln::kFloat32;
    int64_t M = 1 + rng() % 70, K = rng() % 90, N = 1 + rng() % 70, B = 1 + rng() % 3;
    Tensor a = kiln::randn({B, M, K}, dt), b = kiln::randn({B, K, N}, dt);
    bool ta = rng() % 2, tb = rng() % 2;
    if (ta) a = kiln::randn({B, K, M}, dt).transpose(1, 2);
    if (tb) b = kiln::randn({B, N, K}, dt).transpose(1, 2);
    Tensor want = kiln::matmul(a, b);
    Tensor got = kiln::matmul(a.cuda(), b.cuda());
    expect_close(got, want, rtol_of(dt, true), atol_of(dt) * (K + 1) * 10,
                 "matmul " + std::to_string(c) + " B=" + std::to_string(B) + " M=" + std::to_string(M) +
                     " K=" + std::to_string(K) + " N=" + std::to_string(N) + (ta ? " A^T" : "") + (tb ? " B^T" : ""));
    if (HasFailure()) return;
  }
  // Heads transposed out of a projection ([B, T, H, D] -> [B, H, T, D]: batch dims that do not
  // collapse to one stride: cuBLAS's pointer-array batch) and matrices without a unit stride
  // (copied densely first), still on the GPU.
  for (int c = 0; c < 6; ++c) {
    kiln::DType dt = c % 2 ? kiln::kFloat64 : kiln::kFloat32;
    Tensor x = kiln::randn({2, 7, 3, 5}, dt).transpose(1, 2), y = kiln::randn({2, 9, 3, 5}, dt).transpose(1, 2);
    Tensor yt = c < 4 ? y.transpose(-2, -1) : kiln::randn({2, 3, 5, 9}, dt).flip({3});
    expect_close(kiln::matmul(x.cuda(), c < 4 ? y.cuda().transpose(-2, -1) : yt.cuda()), kiln::matmul(x, yt),
                 rtol_of(dt, true), atol_of(dt) * 60, "transposed heads " + std::to_string(c));
  }
  // The same split heads from one [B, T, 3·H·D] projection in a compiled function, replayed as a
  // CUDA graph (the addresses are computed on the device, inside the graph), and in bfloat16.
  for (kiln::DType dt : {kiln::kFloat32, kiln::kBFloat16}) {
    auto heads = [](const Tensor& qkv, int64_t part) {
      return qkv.slice(2, part * 12, (part + 1) * 12).reshape({2, 5, 3, 4}).transpose(1, 2);
    };
    auto scores = [&](const Tensor& qkv) { return kiln::matmul(heads(qkv, 0), heads(qkv, 1).transpose(-2, -1)); };
    auto f = kiln::compile([&](const Tensor& qkv) { return scores(qkv); });
    for (int call = 0; call < 3; ++call) {
      Tensor qkv = kiln::randn({2, 5, 36}).to(dt);
      Tensor want = scores(qkv.to(kiln::kFloat32));
      expect_close(f(qkv.cuda()).cpu().to(kiln::kFloat32), want, dt == kiln::kBFloat16 ? 2e-2 : 1e-5,
                   dt == kiln::kBFloat16 ? 5e-2 : 1e-5, "compiled split heads, call " + std::to_string(call));
    }
  }
  Tensor i = kiln::randint(-5, 5, {4, 6}), j = kiln::randint(-5, 5, {6, 3});  // integers: exact
  EXPECT_EQ(kiln::matmul(i.cuda(), j.cuda()).cpu().to_vector<int64_t>(), kiln::matmul(i, j).to_vector<int64_t>());
}

TEST(CudaDevice, AutogradMatchesTheCpu) {
  NEED_GPU();
  kiln::manual_seed(kiln::testing::test_seed(3));
  Tensor w = kiln::randn({16, 8}), x = kiln::randn({32, 16}), t = kiln::randn({32, 8});
  auto loss_and_grad = [&](kiln::Device dev) {
    Tensor wd = w.to(dev).detach().requires_grad_();
    Tensor xd = x.to(dev).detach().requires_grad_();
    Tensor out = kiln::tanh(kiln::matmul(xd, wd)).softmax(1);
    Tensor loss = kiln::mse_loss(out, t.to(dev));
    loss.backward();
    return std::vector<Tensor>{loss.cpu(), wd.grad().cpu(), xd.grad().cpu()};
  };
  auto c = loss_and_grad(kiln::cpu()), g = loss_and_grad(kiln::cuda());
  for (size_t i = 0; i < c.size(); ++i) expect_close(g[i], c[i], 1e-4, 1e-6, "autograd output " + std::to_string(i));
  // Gradients flow back through the copy to a CPU leaf.
  Tensor leaf = kiln::randn({5}).requires_grad_();
  (leaf.cuda() * 3).sum().backward();
  EXPECT_EQ(leaf.grad().device(), kiln::cpu());
  EXPECT_EQ(leaf.grad().to_vector<float>(), std::vector<float>(5, 3.0f));
}

TEST(CudaDevice, CompileAndTrainingStepMatchTheCpu) {
  NEED_GPU();
  kiln::manual_seed(kiln::testing::test_seed(5));
  auto fn = kiln::compile([](const Tensor& a, const Tensor& b) { return kiln::gelu(a * 2 + b).sum({1}); });
  for (int64_t n : {8, 13, 21}) {
    Tensor a = kiln::randn({n, 40}), b = kiln::randn({40});
    Tensor want = fn(a, b);
    Tensor got = fn(a.cuda(), b.cuda());
    EXPECT_EQ(got.device().str(), "cuda:0");
    expect_close(got, want, 1e-4, 1e-5, "compiled at n=" + std::to_string(n));
  }
  // A small MLP trained a few steps with Adam, on each device from the same start.
  auto train = [](kiln::Device dev) {
    kiln::manual_seed(1);
    kiln::nn::Sequential net({std::make_shared<kiln::nn::Linear>(6, 16), std::make_shared<kiln::nn::Tanh>(),
                              std::make_shared<kiln::nn::Linear>(16, 1)});
    net.to(dev);
    kiln::optim::AdamOptions o;
    o.lr = 1e-2;
    kiln::optim::Adam opt(net.parameters(), o);
    Tensor x = kiln::randn({64, 6}).to(dev), y = kiln::randn({64, 1}).to(dev);
    std::vector<float> losses;
    for (int s = 0; s < 5; ++s) {
      opt.zero_grad();
      Tensor loss = kiln::mse_loss(net.forward(x), y);
      loss.backward();
      opt.step();
      losses.push_back(loss.item<float>());
    }
    return losses;
  };
  auto lc = train(kiln::cpu()), lg = train(kiln::cuda());
  for (size_t i = 0; i < lc.size(); ++i) EXPECT_NEAR(lg[i], lc[i], 1e-4 * std::abs(lc[i]) + 1e-6) << "step " << i;
}

// A compiled update of GPU state that reads a CPU scalar (a learning rate kept on the host):
// the program's nodes live on two devices and run as prepared single-device parts, call after
// call, equal to eager (the same ops: bit for bit up to the reduction order, 1e-6 relative).
TEST(CudaDevice, CompiledStepMixingDevicesMatchesEager) {
  NEED_GPU();
  kiln::manual_seed(kiln::testing::test_seed(6));
  Tensor w0 = kiln::randn({64, 8}).cuda().eval();
  Tensor lr = kiln::full({}, 0.1, kiln::kFloat64);  // on the CPU
  Tensor wc = w0.clone().eval(), we = w0.clone().eval();
  auto update = [&](Tensor& w, const Tensor& g) {
    w.sub_(g * lr.to(kiln::kFloat32) + w * 0.01);
    return (w * w).sum();
  };
  auto f = kiln::compile([&](const Tensor& g) { return update(wc, g); });
  for (int i = 0; i < 6; ++i) {
    Tensor g = kiln::randn({64, 8}).cuda().eval();
    Tensor got = f(g), want = update(we, g);
    expect_close(got, want, 1e-6, 1e-6, "loss at call " + std::to_string(i));
    expect_close(wc, we, 1e-6, 1e-7, "state at call " + std::to_string(i));
  }
}

// Row kernels (layer_norm -> gelu -> softmax and its backward, whose row stages join one row
// kernel on the GPU: several passes over each row). Rows up to the CUDA target's row cache
// (1024) keep values between passes in shared memory; longer rows recompute them. Both, at
// random widths around the limit, match the CPU (float32: rtol 1e-4, atol 1e-6, times the rows
// for the weight and bias gradients), and a second run gives the same bits.
TEST(CudaDevice, RowKernelsAroundTheRowCacheMatchTheCpu) {
  NEED_GPU();
  std::mt19937_64 rng(kiln::testing::test_seed(17));
  std::vector<int64_t> widths = {1, 1023, 1024, 1025};
  for (int i = 0; i < 3; ++i) widths.push_back(std::uniform_int_distribution<int64_t>(2, 1400)(rng));
  for (int64_t cols : widths) {
    // Rows past the column split (256) too: the weight and bias gradients then run as chunks.
    const int64_t rows = rng() % 3 ? std::uniform_int_distribution<int64_t>(1, 70)(rng) : 300;
    kiln::manual_seed(rng());
    Tensor x = kiln::randn({rows, cols}), w = kiln::randn({cols}) * 0.1 + 1, b = kiln::randn({cols}) * 0.1,
           gy = kiln::randn({rows, cols});
    auto run = [&](kiln::Device dev) {
      Tensor xd = x.to(dev).detach().requires_grad_(), wd = w.to(dev).detach().requires_grad_(),
             bd = b.to(dev).detach().requires_grad_();
      Tensor y = kiln::softmax(kiln::gelu(kiln::layer_norm(xd, {cols}, wd, bd, 1e-5)), -1);
      std::vector<Tensor> g = kiln::grad({y}, {xd, wd, bd}, {gy.to(dev)});
      return std::vector<Tensor>{y.cpu(), g[0].cpu(), g[1].cpu(), g[2].cpu(), (y * 2).amax({1}).cpu()};
    };
    auto c = run(kiln::cpu()), g = run(kiln::cuda()), g2 = run(kiln::cuda());
    const std::string what = "rows " + std::to_string(rows) + " x cols " + std::to_string(cols);
    for (size_t k = 0; k < c.size(); ++k) {
      // The weight and bias gradients sum up to 300 rows: atol scaled by the rows.
      expect_close(g[k], c[k], 1e-4, k == 2 || k == 3 ? 1e-6 * static_cast<double>(rows) : 1e-6,
                   what + ", output " + std::to_string(k));
      EXPECT_EQ(g[k].to_vector<float>(), g2[k].to_vector<float>()) << what << ": a second run differs, output " << k;
    }
  }
}

// Reductions over leading dims of many rows (the gradients of a layer's weight and bias) run
// as per-(row chunk, column) partials combined per column. Sum/mean/amax/amin/prod in float32
// and float64 and int64, with a pointwise output of the whole domain from the same kernel, at
// random sizes around the chunking, match the CPU (float32 rtol 1e-4 atol 1e-5; float64 rtol 1e-10 atol 1e-9; ints
// exactly); a second run gives the same bits.
TEST(CudaDevice, ColumnReductionsOverManyRowsMatchTheCpu) {
  NEED_GPU();
  std::mt19937_64 rng(kiln::testing::test_seed(19));
  auto pick = [&](std::vector<int64_t> v) { return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)]; };
  for (int round = 0; round < 12; ++round) {
    const int64_t rows = pick({256, 257, 300, 1000, 4096, 9001}), cols = pick({1, 2, 3, 31, 64, 1000});
    const bool three = round % 3 == 2;  // [a, b, cols] reduced over {0, 1}
    const kiln::DType dt = round % 4 == 3 ? kiln::kFloat64 : kiln::kFloat32;
    kiln::manual_seed(rng());
    std::vector<int64_t> shape =
        three ? std::vector<int64_t>{rows / 16 + 1, 16, cols} : std::vector<int64_t>{rows, cols};
    std::vector<int64_t> dims = three ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0};
    Tensor x = kiln::randn(shape, dt), y = kiln::randn({cols}, dt);
    Tensor xi = kiln::randint(-50, 50, shape, kiln::kInt64);
    auto run = [&](kiln::Device dev) {
      Tensor a = x.to(dev), b = y.to(dev), ai = xi.to(dev);
      Tensor z = kiln::tanh(a * b + 0.5);
      std::vector<Tensor> outs = {
          z.sum(dims), (a * a).mean(dims, true), z.amax(dims), (z - b).amin(dims), (z * 0.01 + 1).prod(0),
          z * 3,       (ai * 3).sum(dims),       ai.amax(dims)};
      kiln::eval(outs);
      std::vector<Tensor> r;
      for (Tensor& t : outs) r.push_back(t.cpu());
      return r;
    };
    auto c = run(kiln::cpu()), g = run(kiln::cuda()), g2 = run(kiln::cuda());
    std::string what = "shape [";
    for (int64_t d : shape) what += std::to_string(d) + ",";
    what += "] " + std::string(kiln::dtype_name(dt));
    for (size_t k = 0; k < c.size(); ++k) {
      const bool ints = c[k].dtype() == kiln::kInt64;
      const double rtol = ints                   ? 0
                          : dt == kiln::kFloat64 ? 1e-10
                                                 : 1e-4,
                   atol = ints                   ? 0
                          : dt == kiln::kFloat64 ? 1e-9
                                                 : 1e-5;
      expect_close(g[k], c[k], rtol, atol, what + ", output " + std::to_string(k));
      EXPECT_EQ(g[k].to_vector<double>(), g2[k].to_vector<double>()) << what << ": a second run differs, output " << k;
    }
  }
}

// A second GPU: tensors on cuda:1 compute there (generated kernels run on cuda:0 only, so its
// ops run one by one through the device runtime) and match the CPU; copies between the GPUs.
TEST(CudaDevice, SecondGpuMatchesTheCpu) {
  NEED_GPU();
  if (kiln::cuda::device_count() < 2) GTEST_SKIP() << "one GPU";
  kiln::manual_seed(kiln::testing::test_seed(23));
  Tensor x = kiln::randn({300, 70}), y = kiln::randn({70});
  auto f = [](const Tensor& a, const Tensor& b) {
    return std::vector<Tensor>{kiln::tanh(a * b + 1).sum({1}), kiln::softmax(a, 1)};
  };
  auto want = f(x, y);
  Tensor x1 = x.to(kiln::cuda(1)), y1 = y.to(kiln::cuda(1));
  auto got = f(x1, y1);
  EXPECT_EQ(got[0].device().str(), "cuda:1");
  expect_close(got[0].cpu(), want[0], 1e-4, 1e-5, "cuda:1 tanh-sum");
  expect_close(got[1].cpu(), want[1], 1e-4, 1e-6, "cuda:1 softmax");
  Tensor back = x1.to(kiln::cuda(0)) * 2;  // cuda:1 -> cuda:0, then a generated kernel
  expect_close(back.cpu(), x * 2, 0, 0, "cuda:1 -> cuda:0");
}

// Full reductions with a 0-d tail (`(v * v).sum() * 0.5`, mean, amax - amin): the tail runs
// in the combine kernel of the split partials. Random sizes on both sides of the split, float32
// and float64, against the CPU (rtol 1e-5 / 1e-12 of the values' magnitude); a second run gives
// the same bits.
TEST(CudaDevice, FullReductionTailsMatchTheCpu) {
  NEED_GPU();
  std::mt19937_64 rng(kiln::testing::test_seed(29));
  for (int round = 0; round < 10; ++round) {
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 3000000)(rng);
    const kiln::DType dt = round % 3 == 2 ? kiln::kFloat64 : kiln::kFloat32;
    kiln::manual_seed(rng());
    Tensor v = kiln::randn({n, 3}, dt);
    auto run = [&](kiln::Device d) {
      Tensor a = v.to(d);
      std::vector<Tensor> outs = {(a * a).sum() * 0.5, a.mean() + 1, a.amax() - 2, kiln::exp(a.amin())};
      kiln::eval(outs);
      std::vector<double> r;
      for (Tensor& t : outs) r.push_back(t.cpu().item<double>());
      return r;
    };
    auto c = run(kiln::cpu()), g = run(kiln::cuda()), g2 = run(kiln::cuda());
    const double tol = dt == kiln::kFloat64 ? 1e-12 : 1e-5;
    for (size_t k = 0; k < c.size(); ++k) {
      EXPECT_NEAR(g[k], c[k], tol * (std::abs(c[k]) + 1)) << "n " << n << ", output " << k;
      EXPECT_EQ(g[k], g2[k]) << "n " << n << ": a second run differs, output " << k;
    }
  }
}

// A compiled function that moves data across devices inside: its program's segments span two
// devices and are run part by part on every call.
TEST(CudaDevice, CompiledFunctionCrossingDevices) {
  NEED_GPU();
  auto f = kiln::compile([](const Tensor& x) {
    Tensor d = (x.cuda() * 2 + 0) * 1;  // no-ops the graph passes remove
    return std::vector<Tensor>{(d.tanh() * x.cuda()).sum({1}).cpu(), d.amax().cpu()};
  });
  for (int64_t n : {5, 9, 5, 17}) {
    Tensor x = kiln::randn({n, 33});
    std::vector<Tensor> got = f(x);
    EXPECT_EQ(got[0].device(), kiln::cpu());
    expect_close(got[0], ((x * 2).tanh() * x).sum({1}), 1e-5, 1e-6, "row sums at n=" + std::to_string(n));
    expect_close(got[1], (x * 2).amax(), 0, 0, "max at n=" + std::to_string(n));
  }
}

TEST(CudaDevice, AllocatorStatsCacheAndOutOfMemory) {
  NEED_GPU();
  if (fake()) GTEST_SKIP() << "the simulated device has no caching allocator";
  kiln::cuda::synchronize();
  kiln::MemoryStats before = kiln::cuda::memory_stats();
  {
    Tensor big = kiln::ones({1 << 22}, kiln::kFloat32, kiln::cuda());  // 16 MiB
    big.eval();
    kiln::MemoryStats during = kiln::cuda::memory_stats();
    EXPECT_GE(during.allocated_bytes - before.allocated_bytes, int64_t(16) << 20);
    EXPECT_GE(during.peak_allocated_bytes, during.allocated_bytes);
  }
  kiln::MemoryStats after = kiln::cuda::memory_stats();
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_GT(after.cached_bytes, 0);
  kiln::cuda::empty_cache();
  EXPECT_LE(kiln::cuda::memory_stats().reserved_bytes, after.reserved_bytes);
  // Larger than the GPU: a clear error, and the device still works afterwards.
  try {
    kiln::zeros({int64_t(1) << 40}, kiln::kFloat32, kiln::cuda()).eval();
    ADD_FAILURE() << "expected an out-of-memory kiln::Error";
  } catch (const kiln::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("out of memory"), std::string::npos) << m;
    EXPECT_NE(m.find("cuda:0"), std::string::npos) << m;
  }
  EXPECT_GE(kiln::cuda::memory_stats().num_ooms, 1);
  EXPECT_EQ(kiln::ones({10}, kiln::kFloat32, kiln::cuda()).sum().item<float>(), 10.0f);
}

// Each bad index is a kiln::Error worded as the CPU's (the device kernels report the first one
// at the next synchronization); afterwards the device computes correctly again.
TEST(CudaDevice, BadIndicesAreErrorsAndTheDeviceKeepsWorking) {
  NEED_GPU();
  Tensor x = kiln::arange(0, 10, 1, kiln::kFloat32).cuda();
  Tensor bad = kiln::from_vector(std::vector<int64_t>{1, 12}).cuda();
  Tensor neg = kiln::from_vector(std::vector<int32_t>{-1, 2}).cuda();
  Tensor src = kiln::ones({2}, kiln::kFloat32, kiln::cuda());
  auto expect_error = [](const std::function<Tensor()>& f, const std::string& want) {
    try {
      f().to_vector<float>();
      ADD_FAILURE() << "expected kiln::Error: " << want;
    } catch (const kiln::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error([&] { return kiln::index_select(x, 0, bad); },
               "index_select: index 12 is out of bounds for dimension 0 with size 10");
  expect_error([&] { return kiln::gather(x, 0, bad); },
               "gather: index 12 is out of bounds for dimension 0 with size 10");
  expect_error([&] { return kiln::scatter(x, 0, bad, src); },
               "scatter: index 12 is out of bounds for dimension 0 with size 10");
  expect_error([&] { return kiln::scatter_add(x, 0, neg, src); },
               "scatter_add: index -1 is out of bounds for dimension 0 with size 10");
  expect_error([&] { return kiln::index_add(x, 0, bad, src); },
               "index_add: index 12 is out of bounds for dimension 0 with size 10");
  Tensor m = kiln::zeros({3, 4}, kiln::kInt64, kiln::cuda());
  expect_error(
      [&] {
        return kiln::index_add(m, 1, neg, kiln::ones({3, 2}, kiln::kInt64, kiln::cuda())).to(kiln::kFloat32);
      },
      "index_add: index -1 is out of bounds for dimension 1 with size 4");
  Tensor good = kiln::from_vector(std::vector<int64_t>{9, 0, 3}).cuda();
  EXPECT_EQ(kiln::index_select(x, 0, good).cpu().to_vector<float>(), (std::vector<float>{9, 0, 3}));
  EXPECT_EQ(kiln::scatter_add(x, 0, good, kiln::ones({3}, kiln::kFloat32, kiln::cuda())).sum().item<float>(), 48.0f);
  EXPECT_EQ((x * 2).sum().item<float>(), 90.0f);
  kiln::cuda::synchronize();  // nothing left over
}

namespace {

// The same tensor on the CPU and on the GPU (the same view of the same values).
struct Pair {
  Tensor cpu, dev;
};

// Random values of dtype `dt`: integers in [-300, 300], floats ~ N(0, 100^2) rounded to the
// dtype, bools; `small`: integers in [-8, 8] (sums of them are exact in every dtype here).
Tensor random_of(kiln::DType dt, const std::vector<int64_t>& shape, bool small = false) {
  Tensor r =
      small ? kiln::randint(-8, 9, shape, kiln::kInt64).to(kiln::kFloat64) : kiln::randn(shape, kiln::kFloat64) * 100;
  return dt == kiln::kBool ? (r > 0) : r.to(dt);
}

// A tensor of `shape` on both devices: dense, a strided slice (every other element of the last
// dim) or a transposed view, chosen at random; the view is taken on each device.
Pair make(kiln::DType dt, const std::vector<int64_t>& shape, std::mt19937_64& rng, bool small = false) {
  const int64_t r = static_cast<int64_t>(shape.size());
  const int kind = r == 0 ? 0 : static_cast<int>(rng() % 3);
  std::vector<int64_t> base = shape;
  if (kind == 1) base.back() *= 2;
  if (kind == 2) std::reverse(base.begin(), base.end());
  Tensor b = random_of(dt, base, small);
  auto view = [&](const Tensor& t) {
    if (kind == 1) return t.slice(r - 1, 0, std::nullopt, 2);
    if (kind == 2) {
      std::vector<int64_t> perm(static_cast<size_t>(r));
      for (int64_t i = 0; i < r; ++i) perm[i] = r - 1 - i;
      return t.permute(perm);
    }
    return t;
  };
  return {view(b), view(b.cuda())};
}

// Index values in [0, bound) of `shape` and dtype int64 or int32, on both devices (maybe strided).
Pair make_index(const std::vector<int64_t>& shape, int64_t bound, std::mt19937_64& rng) {
  const kiln::DType dt = rng() % 2 ? kiln::kInt64 : kiln::kInt32;
  std::vector<int64_t> base = shape;
  const bool strided = !shape.empty() && rng() % 2;
  if (strided) base.back() *= 2;
  Tensor b = kiln::randint(0, bound, base, dt);
  if (strided) return {b.slice(-1, 0, std::nullopt, 2), b.cuda().slice(-1, 0, std::nullopt, 2)};
  return {b, b.cuda()};
}

// Equal values, shapes and dtypes (NaN matches NaN): for integer, bool and copying results.
void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  std::vector<double> g = got.cpu().to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i)
    if (!(g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i])))) {
      ADD_FAILURE() << what << " [" << i << "]: got " << g[i] << ", want " << w[i];
      return;
    }
}

std::string str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

// The device kernels of the opaque ops (runtime/cuda/device_ops) against the CPU's reference
// kernels on random shapes, dims, dtypes, index dtypes (int64/int32) and strided views:
// gather, scatter (duplicate indices: the last write wins, as on the CPU), scatter_add,
// index_select, index_add, cat, cumsum, contiguous copies of strided / expanded / flipped
// views, and casts to and from float16 / bfloat16 (special values included).
// Tolerances: everything exact (integers, bools, copies, casts, and the adds, whose values
// here are small integers: exact in any summation order), except scatter_add / index_add of
// N(0,1) float32 / float64 values (summed in the CPU's order, so expected identical; checked
// within float32 1e-5 absolute, float64 1e-12), and cumsum of floats, summed sequentially per row in float64
// like the CPU (so expected identical; checked within float32 1e-6 / float64 1e-12 relative,
// float16 / bfloat16 within one ulp: 1e-3 / 8e-3 relative).
TEST(CudaDevice, IndexOpsCatCumsumMatchTheCpu) {
  NEED_GPU();
  const uint64_t seed = kiln::testing::test_seed(13);
  std::mt19937_64 rng(seed);
  kiln::manual_seed(seed);
  const std::vector<kiln::DType> dtypes = {kiln::kBool,     kiln::kInt32,   kiln::kInt64,  kiln::kFloat16,
                                           kiln::kBFloat16, kiln::kFloat32, kiln::kFloat64};
  for (int c = 0; c < 60; ++c) {
    const kiln::DType dt = dtypes[c % dtypes.size()];
    const int64_t rank = 1 + static_cast<int64_t>(rng() % 4);
    std::vector<int64_t> shape;
    for (int64_t i = 0; i < rank; ++i) shape.push_back(1 + static_cast<int64_t>(rng() % 6));
    const int64_t d = static_cast<int64_t>(rng() % rank);
    const std::string what =
        "case " + std::to_string(c) + " " + kiln::dtype_name(dt) + " " + str(shape) + " dim " + std::to_string(d);
    Pair x = make(dt, shape, rng);
    // gather / scatter / scatter_add: index sizes within x's (dim d: up to 2 more) and src's.
    std::vector<int64_t> is = shape;
    for (int64_t i = 0; i < rank; ++i) is[i] = 1 + static_cast<int64_t>(rng() % (shape[i] + (i == d ? 2 : 0)));
    Pair idx = make_index(is, shape[d], rng);
    expect_same(kiln::gather(x.dev, d, idx.dev), kiln::gather(x.cpu, d, idx.cpu), what + " gather");
    if (is[d] <= shape[d]) {
      Pair src = make(dt, is, rng);
      expect_same(kiln::scatter(x.dev, d, idx.dev, src.dev), kiln::scatter(x.cpu, d, idx.cpu, src.cpu),
                  what + " scatter");
    }
    Pair xs = make(dt, shape, rng, true), srcs = make(dt, is, rng, true);
    expect_same(kiln::scatter_add(xs.dev, d, idx.dev, srcs.dev), kiln::scatter_add(xs.cpu, d, idx.cpu, srcs.cpu),
                what + " scatter_add");
    // index_select / index_add: a 1-d index of any length (duplicates included).
    const int64_t len = static_cast<int64_t>(rng() % 8);
    Pair idx1 = make_index({len}, shape[d], rng);
    expect_same(kiln::index_select(x.dev, d, idx1.dev), kiln::index_select(x.cpu, d, idx1.cpu), what + " index_select");
    std::vector<int64_t> ss = shape;
    ss[d] = len;
    Pair srci = make(dt, ss, rng, true);
    expect_same(kiln::index_add(xs.dev, d, idx1.dev, srci.dev), kiln::index_add(xs.cpu, d, idx1.cpu, srci.cpu),
                what + " index_add");
    // cat of 1-3 pieces, each its own size along d (0 included) and layout.
    std::vector<Tensor> pc, pd;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k) {
      std::vector<int64_t> ps = shape;
      ps[d] = static_cast<int64_t>(rng() % 4);
      Pair p = make(dt, ps, rng);
      pc.push_back(p.cpu);
      pd.push_back(p.dev);
    }
    expect_same(kiln::cat(pd, d), kiln::cat(pc, d), what + " cat");
    // Copies of views: strided/transposed (x), expanded, flipped, and a write into a view.
    expect_same(x.dev.contiguous(), x.cpu.contiguous(), what + " contiguous");
    std::vector<int64_t> wide = shape;
    wide.insert(wide.begin(), 3);
    expect_same(x.dev.expand(wide).contiguous(), x.cpu.expand(wide).contiguous(), what + " expand");
    expect_same(x.dev.flip({d}).contiguous(), x.cpu.flip({d}).contiguous(), what + " flip");
    {
      Tensor bc = x.cpu.clone(), bd = x.dev.clone();
      const int64_t at = static_cast<int64_t>(rng() % shape[d]);
      Tensor wc = bc.narrow(d, at, 1), wd = bd.narrow(d, at, 1);
      wc.copy_(x.cpu.narrow(d, 0, 1).flip({d}));
      wd.copy_(x.dev.narrow(d, 0, 1).flip({d}));
      expect_same(bd, bc, what + " write into a view");
    }
    // cumsum (bool and integers sum in int64).
    Tensor cw = kiln::cumsum(x.cpu, d), cg = kiln::cumsum(x.dev, d);
    if (!kiln::is_floating(cw.dtype())) {
      expect_same(cg, cw, what + " cumsum");
    } else {
      const double rtol = dt == kiln::kFloat64   ? 1e-12
                          : dt == kiln::kFloat32 ? 1e-6
                          : dt == kiln::kFloat16 ? 1e-3
                                                 : 8e-3;
      expect_close(cg.cpu(), cw, rtol, 0, what + " cumsum");
    }
    if (HasFailure()) return;
  }
  // scatter_add / index_add of non-integer floats (summed in the CPU's order: no atomics).
  for (kiln::DType dt : {kiln::kFloat32, kiln::kFloat64}) {
    Tensor x = kiln::randn({6, 5}, dt), src = kiln::randn({40, 5}, dt);
    Tensor idx = kiln::randint(0, 6, {40, 5}), idx1 = kiln::randint(0, 6, {40});
    const double atol = dt == kiln::kFloat32 ? 1e-5 : 1e-12;
    expect_close(kiln::scatter_add(x.cuda(), 0, idx.cuda(), src.cuda()).cpu(), kiln::scatter_add(x, 0, idx, src), 0,
                 atol, std::string("scatter_add ") + kiln::dtype_name(dt));
    expect_close(kiln::index_add(x.cuda(), 0, idx1.cuda(), src.cuda()).cpu(), kiln::index_add(x, 0, idx1, src), 0, atol,
                 std::string("index_add ") + kiln::dtype_name(dt));
  }
  // Casts to and from the 16-bit floats: rounding to nearest even, overflow, subnormals, NaN.
  const float inf = INFINITY, nan = NAN;
  std::vector<float> special = {
      0.0f,      -0.0f,          1.0f,          -1.5f,         3.14159265f,  65504.0f, 65519.0f, 65520.0f,
      -70000.0f, 1e-8f,          2.9802322e-8f, 5.9604645e-8f, 8.940697e-8f, 6.1e-5f,  1e-30f,   1e30f,
      -3.4e38f,  1.00048828125f, 1.0009765625f, 257.0f,        259.0f,       0.1f,     inf,      -inf,
      nan};
  Tensor f = kiln::cat({kiln::from_vector(special), kiln::randn({500}) * 1000, kiln::randn({500}) * 1e-5f});
  for (kiln::DType to : {kiln::kFloat16, kiln::kBFloat16}) {
    Tensor fd = f.cuda();
    expect_same(fd.to(to), f.to(to), std::string("float32 to ") + kiln::dtype_name(to));
    expect_same(fd.to(kiln::kFloat64).to(to), f.to(kiln::kFloat64).to(to),
                std::string("float64 to ") + kiln::dtype_name(to));
    expect_same(fd.to(to).to(kiln::kFloat32), f.to(to).to(kiln::kFloat32),
                std::string("back from ") + kiln::dtype_name(to));
    Tensor h = f.to(to), hd = h.cuda();
    for (kiln::DType other : dtypes) {
      if (other == to) continue;
      Tensor src = other == kiln::kBool || kiln::is_integral(other) ? kiln::randint(-70000, 70000, {300}).to(other)
                                                                    : random_of(other, {300});
      expect_same(src.cuda().to(to), src.to(to), std::string(kiln::dtype_name(other)) + " to " + kiln::dtype_name(to));
      if (other != kiln::kInt32 && other != kiln::kInt64)  // (float to int of inf/NaN is undefined)
        expect_same(hd.to(other), h.to(other), std::string(kiln::dtype_name(to)) + " to " + kiln::dtype_name(other));
    }
    Tensor fin = (kiln::randn({300}) * 1000).to(to);  // finite: to integers is defined
    expect_same(fin.cuda().to(kiln::kInt32), fin.to(kiln::kInt32), std::string(kiln::dtype_name(to)) + " to int32");
    expect_same(fin.cuda().to(kiln::kInt64), fin.to(kiln::kInt64), std::string(kiln::dtype_name(to)) + " to int64");
  }
}

// cat of many pieces (up to 330: launches of 128 dense pieces), every dtype, along each dim;
// pieces dense, dense at odd offsets into a larger tensor (a unit below 16 bytes), strided or
// transposed (a copy each) and empty; and a stack of 149 0-d values (clip_grad_norm_'s): the
// same elements as the CPU's.
TEST(CudaDevice, CatOfManyPiecesMatchesTheCpu) {
  NEED_GPU();
  const uint64_t seed = kiln::testing::test_seed(17);
  std::mt19937_64 rng(seed);
  kiln::manual_seed(seed);
  const std::vector<kiln::DType> dtypes = {kiln::kBool,     kiln::kInt32,   kiln::kInt64,  kiln::kFloat16,
                                           kiln::kBFloat16, kiln::kFloat32, kiln::kFloat64};
  for (int c = 0; c < 28; ++c) {
    const kiln::DType dt = dtypes[c % dtypes.size()];
    const int64_t rank = 1 + static_cast<int64_t>(rng() % 3);
    std::vector<int64_t> shape;
    for (int64_t i = 0; i < rank; ++i) shape.push_back(1 + static_cast<int64_t>(rng() % 5));
    const int64_t d = static_cast<int64_t>(rng() % rank);
    const int n = c % 4 == 0 ? 129 + static_cast<int>(rng() % 200) : 1 + static_cast<int>(rng() % 20);
    std::vector<Tensor> pc, pd;
    for (int k = 0; k < n; ++k) {
      std::vector<int64_t> ps = shape;
      ps[d] = static_cast<int64_t>(rng() % 4);
      if (rng() % 3 == 0) {
        int64_t count = 1;
        for (int64_t s : ps) count *= s;
        const int64_t off = static_cast<int64_t>(rng() % 4);
        Tensor big = random_of(dt, {count + 3});
        pc.push_back(big.narrow(0, off, count).reshape(ps));
        pd.push_back(big.cuda().narrow(0, off, count).reshape(ps));
      } else {
        Pair p = make(dt, ps, rng);
        pc.push_back(p.cpu);
        pd.push_back(p.dev);
      }
    }
    expect_same(kiln::cat(pd, d), kiln::cat(pc, d),
                "case " + std::to_string(c) + " " + kiln::dtype_name(dt) + " " + std::to_string(n) + " pieces of " +
                    str(shape) + " along " + std::to_string(d) + " (seed " + std::to_string(seed) + ")");
  }
  std::vector<Tensor> nc, nd;
  for (int k = 0; k < 149; ++k) {
    nc.push_back(kiln::randn({}));
    nd.push_back(nc.back().cuda());
  }
  expect_same(kiln::stack(nd), kiln::stack(nc), "a stack of 149 0-d values");
}

// Integer remainder (the divisor's sign), fmod (the dividend's sign) and pow (by squaring,
// wrapping on overflow; negative exponents only of 1 and -1) on the device kernels against the
// CPU, exactly: int32 / int64 (and bool pow), negative values, broadcasting and strided
// views, the dtypes' extremes. Division by zero and other negative exponents are the CPU's errors, with its
// wording, and the device keeps working afterwards.
TEST(CudaDevice, IntegerRemainderFmodPowMatchTheCpu) {
  NEED_GPU();
  const uint64_t seed = kiln::testing::test_seed(17);
  std::mt19937_64 rng(seed);
  kiln::manual_seed(seed);
  for (int c = 0; c < 40; ++c) {
    const kiln::DType dt = c % 2 ? kiln::kInt32 : kiln::kInt64;
    const int64_t rank = 1 + static_cast<int64_t>(rng() % 4);
    std::vector<int64_t> sa, sb;  // broadcast against each other (b maybe with fewer dims)
    for (int64_t i = 0; i < rank; ++i) {
      const int64_t n = 1 + static_cast<int64_t>(rng() % 6);
      sa.push_back(rng() % 4 ? n : 1);
      sb.push_back(rng() % 4 ? n : 1);
    }
    if (rng() % 3 == 0) sb.erase(sb.begin());
    const std::string what = "case " + std::to_string(c) + " " + kiln::dtype_name(dt) + " " + str(sa) + " " + str(sb);
    Pair a = make(dt, sa, rng), b = make(dt, sb, rng);
    Pair d = {kiln::where(b.cpu == 0, 7, b.cpu), kiln::where(b.dev == 0, 7, b.dev)};  // nonzero divisors
    ASSERT_EQ(d.cpu.dtype(), dt) << what;
    expect_same(kiln::remainder(a.dev, d.dev), kiln::remainder(a.cpu, d.cpu), what + " remainder");
    expect_same(kiln::fmod(a.dev, d.dev), kiln::fmod(a.cpu, d.cpu), what + " fmod");
    expect_same(kiln::remainder(d.dev, a.dev.abs() + 1), kiln::remainder(d.cpu, a.cpu.abs() + 1),
                what + " remainder by positive");
    Tensor e = kiln::randint(0, 70, sb, dt);  // large enough to overflow and wrap
    expect_same(kiln::pow(a.dev, e.cuda()), kiln::pow(a.cpu, e), what + " pow");
    Tensor one = kiln::randint(0, 2, sa, dt) * 2 - 1, en = kiln::randint(-9, 10, sb, dt);
    expect_same(kiln::pow(one.cuda(), en.cuda()), kiln::pow(one, en), what + " pow of +-1");
    Pair pa = make(kiln::kBool, sa, rng), pb = make(kiln::kBool, sb, rng);
    expect_same(kiln::pow(pa.dev, pb.dev), kiln::pow(pa.cpu, pb.cpu), what + " pow of bools");
    if (HasFailure()) return;
  }
  for (kiln::DType dt : {kiln::kInt32, kiln::kInt64}) {
    const int64_t lo = dt == kiln::kInt32 ? INT32_MIN : INT64_MIN, hi = dt == kiln::kInt32 ? INT32_MAX : INT64_MAX;
    Tensor x = kiln::from_vector(std::vector<int64_t>{lo, hi, lo + 1, -7, 7, 0, lo, hi}).to(dt);
    Tensor y = kiln::from_vector(std::vector<int64_t>{3, -3, hi, -2, -5, lo, 2, 2}).to(dt);
    const std::string what = std::string("extremes ") + kiln::dtype_name(dt);
    expect_same(kiln::remainder(x.cuda(), y.cuda()), kiln::remainder(x, y), what + " remainder");
    expect_same(kiln::fmod(x.cuda(), y.cuda()), kiln::fmod(x, y), what + " fmod");
    Tensor e = kiln::remainder(y, 64);  // (non-negative)
    expect_same(kiln::pow(x.cuda(), e.cuda()), kiln::pow(x, e), what + " pow");
  }
  // Errors: the CPU's, worded alike; then the device computes correctly again.
  auto expect_error = [](const std::function<Tensor()>& f, const std::string& want, const std::string& where) {
    try {
      f().cpu().to_vector<int64_t>();
      ADD_FAILURE() << where << ": expected kiln::Error: " << want;
    } catch (const kiln::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << where << ": " << e.what();
    }
  };
  for (kiln::DType dt : {kiln::kInt32, kiln::kInt64}) {
    Tensor x = kiln::from_vector(std::vector<int64_t>{5, -3, 4}).to(dt),
           z = kiln::from_vector(std::vector<int64_t>{1, 0, 2}).to(dt);
    Tensor n = kiln::from_vector(std::vector<int64_t>{2, -1, 3}).to(dt);
    for (bool dev : {false, true}) {
      auto on = [&](const Tensor& t) { return dev ? t.cuda() : t; };
      const std::string where = std::string(kiln::dtype_name(dt)) + (dev ? " cuda" : " cpu");
      expect_error([&] { return kiln::remainder(on(x), on(z)); }, "remainder: integer division by zero", where);
      expect_error([&] { return kiln::fmod(on(x), on(z)); }, "fmod: integer division by zero", where);
      expect_error([&] { return kiln::pow(on(x), on(n)); }, "pow: integers to negative integer powers are not allowed",
                   where);
    }
    expect_same(kiln::remainder(x.cuda(), n.cuda()), kiln::remainder(x, n), "after the errors");
    expect_same(kiln::pow(x.cuda(), n.abs().cuda()), kiln::pow(x, n.abs()), "after the errors");
  }
  kiln::cuda::synchronize();  // nothing left over
}

TEST(CudaDevice, ThreadsShareADevice) {
  NEED_GPU();
  Tensor w = kiln::randn({64, 64}).cuda();
  std::vector<std::thread> ts;
  std::vector<float> got(4), want(4);
  for (int t = 0; t < 4; ++t) {
    Tensor x = kiln::full({8, 64}, 0.01 * (t + 1));
    want[t] = kiln::tanh(kiln::matmul(x, w.cpu())).sum().item<float>();
    ts.emplace_back([&, t, x] {
      for (int r = 0; r < 20; ++r) got[t] = kiln::tanh(kiln::matmul(x.cuda(), w)).sum().item<float>();
    });
  }
  for (auto& th : ts) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_NEAR(got[t], want[t], 1e-3 * std::abs(want[t]) + 1e-4) << "thread " << t;
}

// Generated kernels' launches go through the device's launch thread: thousands of dependent
// calls queued without a wait, interleaved with the stream's other users (cuBLAS products,
// copies, host reads) and from several threads at once, each see the previous call's result.
TEST(CudaDevice, PipelinedLaunchesKeepTheirOrder) {
  NEED_GPU();
  auto chain = [](int calls, float start) {
    Tensor x = kiln::full({16}, start).cuda();
    Tensor eye = kiln::eye(16).cuda();
    for (int i = 0; i < calls; ++i) {
      x = (x + 1).eval();  // reads the previous call's output
      if (i % 500 == 250) x = kiln::matmul(x.reshape({1, 16}), eye).reshape({16}).eval();  // cuBLAS on the stream
      if (i % 700 == 350) x = x.cpu().cuda();  // copies both ways
      if (i % 1000 == 999) EXPECT_EQ(x[3].item<float>(), start + static_cast<float>(i + 1)) << "after call " << i;
    }
    Tensor y = kiln::full({16}, start).cuda();
    for (int i = 0; i < calls; ++i) y.add_(1);  // in place: the same buffer each launch
    return std::make_pair(x.cpu().to_vector<float>(), y.cpu().to_vector<float>());
  };
  auto [x, y] = chain(3000, 0.f);
  for (float v : x) EXPECT_EQ(v, 3000.f);
  for (float v : y) EXPECT_EQ(v, 3000.f);
  std::vector<std::thread> ts;
  std::vector<std::pair<std::vector<float>, std::vector<float>>> got(4);
  for (int t = 0; t < 4; ++t) ts.emplace_back([&, t] { got[t] = chain(1000, 10.f * t); });
  for (auto& th : ts) th.join();
  for (int t = 0; t < 4; ++t) {
    for (float v : got[t].first) EXPECT_EQ(v, 10.f * t + 1000.f) << "thread " << t;
    for (float v : got[t].second) EXPECT_EQ(v, 10.f * t + 1000.f) << "thread " << t;
  }
}

namespace {

// Whether a and b hold the same float bits (b: the earlier run on the same device).
void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const std::vector<float> va = a.cpu().to(kiln::kFloat32).contiguous().to_vector<float>();
  const std::vector<float> vb = b.cpu().to(kiln::kFloat32).contiguous().to_vector<float>();
  for (size_t i = 0; i < va.size(); ++i)
    if (std::memcmp(&va[i], &vb[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << " [" << i << "]: " << va[i] << " in one run, " << vb[i] << " in the other";
      return;
    }
}

}  // namespace

// Float index_add / scatter_add on CUDA (so the gradients of embedding, index_select and gather)
// use no float atomics: the sources are sorted stably by destination and each destination adds
// its own in the CPU's serial order. So two runs give the same bits, and the CPU's sums (the
// same order: expected identical, checked within float32 1e-5 relative, bfloat16 one ulp).
// 100000 indices into 50 rows (about 2000 sources a row): index_add along dims 0 and 1 (a sort
// of the 1-d index), scatter_add with an index per element (a sort of the elements) and with an
// expanded 1-d index, bfloat16, an embedding gradient, a compiled call and SGD steps on a table.
TEST(CudaDevice, IndexAddsGiveTheSameBitsEveryRun) {
  NEED_GPU();
  kiln::manual_seed(kiln::testing::test_seed(31));
  const int64_t n = 100000, rows = 50, d = 24;
  Tensor idx = kiln::randint(0, rows, {n}), idx2 = kiln::randint(0, rows, {n, d});
  Tensor src = kiln::randn({n, d}), self = kiln::randn({rows, d});
  Tensor srct = src.t().contiguous(), selft = self.t().contiguous();
  Tensor idxd = idx.cuda(), idx2d = idx2.cuda(), srcd = src.cuda(), selfd = self.cuda();
  Tensor srctd = srct.cuda(), selftd = selft.cuda();
  const std::vector<std::pair<std::string, std::function<Tensor(bool)>>> cases = {
      {"index_add dim 0",
       [&](bool dev) { return dev ? kiln::index_add(selfd, 0, idxd, srcd) : kiln::index_add(self, 0, idx, src); }},
      {"index_add dim 1",
       [&](bool dev) { return dev ? kiln::index_add(selftd, 1, idxd, srctd) : kiln::index_add(selft, 1, idx, srct); }},
      {"scatter_add, an index per element",
       [&](bool dev) {
         return dev ? kiln::scatter_add(selfd, 0, idx2d, srcd) : kiln::scatter_add(self, 0, idx2, src);
       }},
      {"scatter_add, an expanded index",
       [&](bool dev) {
         return dev ? kiln::scatter_add(selfd, 0, idxd.unsqueeze(1).expand({n, d}), srcd)
                    : kiln::scatter_add(self, 0, idx.unsqueeze(1).expand({n, d}), src);
       }},
      {"index_add bfloat16",
       [&](bool dev) {
         return dev ? kiln::index_add(selfd.to(kiln::kBFloat16), 0, idxd, srcd.to(kiln::kBFloat16))
                    : kiln::index_add(self.to(kiln::kBFloat16), 0, idx, src.to(kiln::kBFloat16));
       }},
      {"embedding gradient",
       [&](bool dev) {
         Tensor w = (dev ? selfd : self).detach().requires_grad_();
         Tensor out = kiln::embedding((dev ? idxd : idx).reshape({1000, 100}), w);
         (out * (dev ? srcd : src).reshape({1000, 100, d})).sum().backward();
         return w.grad();
       }},
  };
  for (const auto& [what, run] : cases) {
    Tensor first = run(true).cpu(), second = run(true).cpu(), want = run(false);
    expect_same_bits(second, first, what + ": two runs");
    const bool bf16 = want.dtype() == kiln::kBFloat16;
    expect_close(first.to(kiln::kFloat32), want.to(kiln::kFloat32), bf16 ? 8e-3 : 1e-5, bf16 ? 1e-2 : 1e-5,
                 what + ": the CPU");
    if (HasFailure()) return;
  }
  // Compiled: the same bits call after call, and eager's (x * 2 and s * 1 are exact).
  auto f = kiln::compile(
      [](const Tensor& s, const Tensor& i, const Tensor& x) { return kiln::index_add(s * 1, 0, i, x * 2); });
  Tensor c1 = f(selfd, idxd, srcd).cpu(), c2 = f(selfd, idxd, srcd).cpu();
  expect_same_bits(c2, c1, "compiled index_add: two calls");
  expect_same_bits(c1, kiln::index_add(selfd, 0, idxd, srcd * 2), "compiled index_add against eager");
  // A few SGD steps on an embedding table through tanh: the same table bits in two runs.
  auto train = [&](kiln::Device dev) {
    Tensor w = self.to(dev).detach().requires_grad_();
    Tensor tok = idx.reshape({500, 200}).to(dev), tgt = src.narrow(0, 0, 500 * 200).reshape({500, 200, d}).to(dev);
    for (int s = 0; s < 3; ++s) {
      (kiln::tanh(kiln::embedding(tok, w)) * tgt).sum().backward();
      w = (w - w.grad() * 1e-3).detach().requires_grad_();
    }
    return w.detach().cpu();
  };
  Tensor t1 = train(kiln::cuda()), t2 = train(kiln::cuda());
  expect_same_bits(t2, t1, "embedding table after 3 SGD steps: two runs");
  expect_close(t1, train(kiln::cpu()), 1e-4, 1e-5, "embedding table after 3 SGD steps: the CPU");
}
