// Interpreter baseline figures, side by side in one process:
//  - a pointwise chain (y = tanh(x*1.5 + 0.5) * x - 0.25) in elements/s, beside a hand-written
//    loop and a measured copy bandwidth (the memory limit);
//  - matmul in GFLOP/s through kiln, beside OpenBLAS sgemm called directly.
// Prints a table and writes JSON to stdout's last line (or to the file given as argv[1]).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "jit/exec/jit_executor.h"
#include "kiln.h"

namespace {
double median_seconds(const std::function<void()>& f, int reps) {
  f();  // warm up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  std::string json = "{";
  auto add_json = [&](const std::string& k, double v) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s\"%s\": %.6g", json.size() > 1 ? ", " : "", k.c_str(), v);
    json += buf;
  };

  // ---- pointwise chain ----
  const int64_t n = 1 << 22;
  std::vector<float> xs(n), ys(n);
  for (int64_t i = 0; i < n; ++i) xs[i] = std::sin(0.001f * static_cast<float>(i));
  kiln::Tensor x = kiln::from_blob(xs.data(), {n}, kiln::kFloat32);
  auto chain = [&] { (kiln::tanh(x * 1.5f + 0.5f) * x - 0.25f).eval(); };
  kiln::set_executor(kiln::jit::jit_executor());
  double t_jit = median_seconds(chain, 9);
  kiln::set_executor(kiln::interpreter());  // the rest of this program measures the interpreter
  double t_kiln = median_seconds(chain, 9);
  double t_loop = median_seconds(
      [&] {
        for (int64_t i = 0; i < n; ++i) ys[i] = std::tanh(xs[i] * 1.5f + 0.5f) * xs[i] - 0.25f;
      },
      9);
  const int64_t big = 1 << 26;  // 256 MiB per buffer: well past the caches
  std::vector<float> src(big, 1.0f), dst(big, 0.0f);
  double t_copy = median_seconds([&] { std::memcpy(dst.data(), src.data(), big * sizeof(float)); }, 5);
  double copy_gbs = 2.0 * big * sizeof(float) / t_copy / 1e9;
  std::printf("%-40s %12s %12s\n", "pointwise chain (2^22 float32)", "time [ms]", "Gelem/s");
  std::printf("%-40s %12.3f %12.3f\n", "kiln interpreter (5 ops)", t_kiln * 1e3, n / t_kiln / 1e9);
  std::printf("%-40s %12.3f %12.3f\n", "kiln JIT (1 fused kernel, for reference)", t_jit * 1e3, n / t_jit / 1e9);
  std::printf("%-40s %12.3f %12.3f\n", "hand-written single loop (1 thread)", t_loop * 1e3, n / t_loop / 1e9);
  std::printf("%-40s %12.3f %12.3f   (%.2f GB/s read+write, 256 MiB)\n", "memcpy bound for the chain",
              n * 8.0 / (copy_gbs * 1e9) * 1e3, copy_gbs * 1e9 / 8.0 / 1e9, copy_gbs);
  std::printf("  interpreter / hand-written loop: %.2fx time\n\n", t_kiln / t_loop);
  add_json("pointwise_interp_gelem_s", n / t_kiln / 1e9);
  add_json("pointwise_jit_gelem_s", n / t_jit / 1e9);
  add_json("pointwise_loop_gelem_s", n / t_loop / 1e9);
  add_json("copy_gb_s", copy_gbs);

  // ---- matmul ----
  // The BLAS column is OpenBLAS called directly at one thread: kiln sets OpenBLAS to one thread
  // in its process and gets its GEMM parallelism from TBB tiles (kernels/cpu/blas.cpp).
  std::printf("%-40s %12s %12s %12s\n", "matmul float32", "kiln GF/s", "BLAS-1T GF/s", "kiln/BLAS");
  for (int64_t s : {128, 512, 1024}) {
    kiln::manual_seed(1);
    kiln::Tensor a = kiln::randn({s, s}).eval(), b = kiln::randn({s, s}).eval();
    int reps = s <= 128 ? 50 : s <= 512 ? 10 : 5;
    double tk = median_seconds([&] { kiln::matmul(a, b).eval(); }, reps);
    std::vector<float> c(s * s);
    const float* ap = a.data<float>();
    const float* bp = b.data<float>();
    double tb = median_seconds(
        [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, s, s, 1.f, ap, s, bp, s, 0.f, c.data(), s); },
        reps);
    double flops = 2.0 * s * s * s;
    std::printf("%-40s %12.2f %12.2f %12.3f\n", (std::to_string(s) + "^3").c_str(), flops / tk / 1e9, flops / tb / 1e9,
                tb / tk);
    add_json("matmul_" + std::to_string(s) + "_kiln_gflops", flops / tk / 1e9);
    add_json("matmul_" + std::to_string(s) + "_blas_gflops", flops / tb / 1e9);
  }
  json += "}";
  if (argc > 1) std::ofstream(argv[1]) << json << "\n";
  std::printf("\n%s\n", json.c_str());
  return 0;
}
