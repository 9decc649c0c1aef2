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

#include <cmath>
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
      EXPECT_LE(std::abs(g[i] - w[i]), rtol * std::abs(w[i]) + atol) << what << " [" << i << "]: got " << g[i] << ", want " << w[i];
    }
    if (::testing::Test::HasFailure()) return;
  }
}

double rtol_of(kiln::DType d, bool reduced) {
  if (d == kiln::kFloat64) return 1e-10;
  if (d == kiln::kFloat32) return reduced ? 1e-4 : 2e-5;
  return 0;
}
double atol_of(kiln::DType d) { return d == kiln::kFloat64 ? 1e-12 : d == kiln::kFloat32 ? 1e-6 : 0; }

}  // namespace

TEST(CudaDevice, WithoutGpuEveryRequestIsAClearError) {
  if (gpu()) GTEST_SKIP() << "a GPU is available (covered by the tests below)";
  EXPECT_EQ(kiln::cuda::device_count(), 0);
  kiln::cuda::synchronize();  // nothing to wait for: no error
  Tensor x = kiln::ones({3});
  for (auto make : std::vector<std::function<Tensor()>>{[] { return kiln::zeros({2}, kiln::kFloat32, kiln::cuda()); },
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
    kiln::DType dt = (rng() % 3 == 0) ? kiln::kFloat64 : kiln::kFloat32;
    int64_t rows = 1 + rng() % 33, cols = 1 + rng() % 300;
    kiln::manual_seed(seed * 1000 + p);
    Tensor x = kiln::randn({rows, cols}, dt);
    Tensor y = kiln::randn({1, cols}, dt);
    Tensor xd = x.cuda(), yd = y.cuda();
    bool reduced = false;
    std::string desc;
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
      apply(x, y);
      apply(xd, yd);
      reduced = reduced || k == 6 || k == 9;
      desc += std::to_string(k) + " ";
    }
    bool full = rng() % 2;
    Tensor want = full ? x.sum() : x.sum({0});
    Tensor got = full ? xd.sum() : xd.sum({0});
    expect_close(xd, x, rtol_of(dt, reduced), atol_of(dt), "program " + std::to_string(p) + " (" + desc + ")");
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
  EXPECT_EQ(kiln::remainder(ad * bd - 3, bd).cpu().to_vector<int64_t>(), kiln::remainder(a * b - 3, b).to_vector<int64_t>());
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
  Tensor withnan = kiln::where(kiln::rand({700, 300}) > 0.999, std::numeric_limits<double>::quiet_NaN(), f.narrow(0, 0, 700).narrow(1, 0, 300));
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
                 "matmul " + std::to_string(c) + " B=" + std::to_string(B) + " M=" + std::to_string(M) + " K=" +
                     std::to_string(K) + " N=" + std::to_string(N) + (ta ? " A^T" : "") + (tb ? " B^T" : ""));
    if (HasFailure()) return;
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

TEST(CudaDevice, BadIndicesAreErrorsAndTheDeviceKeepsWorking) {
  NEED_GPU();
  Tensor x = kiln::arange(0, 10, 1, kiln::kFloat32).cuda();
  Tensor bad = kiln::from_vector(std::vector<int64_t>{1, 12}).cuda();
  EXPECT_THROW(kiln::index_select(x, 0, bad).to_vector<float>(), kiln::Error);
  EXPECT_THROW(kiln::gather(x, 0, bad).to_vector<float>(), kiln::Error);
  Tensor good = kiln::from_vector(std::vector<int64_t>{9, 0, 3}).cuda();
  EXPECT_EQ(kiln::index_select(x, 0, good).cpu().to_vector<float>(), (std::vector<float>{9, 0, 3}));
  EXPECT_EQ((x * 2).sum().item<float>(), 90.0f);
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
