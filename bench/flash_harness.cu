// flash_harness: the bfloat16 tensor-core attention kernels of kernels/cuda/flash_kernels.cpp on
// one GPU, outside kiln (built by bench/flash_harness.sh for sm_90a): the warpgroup kernels beside
// the mma.sync ones on the same inputs, launched as the device runtime launches them (threads,
// rows a block and shared memory from kiln::kernels). For kernel work: a change checked and
// timed in seconds of device time.
//
//   flash_harness check             the warpgroup forward against an exact float32 reference and
//                                   the mma.sync forward (causal, odd lengths, tq != tk, dropout,
//                                   rows without 16-byte loads); the warpgroup backward against
//                                   the mma.sync backward (bit for bit, or within 1 % of the
//                                   largest gradient); exit status 1 on a mismatch
//   flash_harness time              forward and backward (prep + dq + dk/dv) µs and TFLOP/s of
//                                   both over FlashAttention's grid (16k tokens, width 2048)
//   flash_harness prof D CAUSAL T   the warpgroup forward and backward at one point (for ncu)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/flash_kernels.h"  // (before the CUDA source and its one-letter operand macros)

#ifndef __CUDA_ARCH__
#define __CUDA_ARCH_FEAT_SM90_ALL 1  // (the host pass declares the sm_90a kernels too)
#endif
#include "flash_source.cuh"

KILN_FLASH(fwd_64, flash_fwd, Half<true>, 64)
KILN_FLASH(fwd_128, flash_fwd, Half<true>, 128)
KILN_FLASH(prep_64, flash_bwd_prep, Half<true>, 64)
KILN_FLASH(prep_128, flash_bwd_prep, Half<true>, 128)
KILN_FLASH(kv_64, flash_bwd_kv, Half<true>, 64)
KILN_FLASH(kv_128, flash_bwd_kv, Half<true>, 128)
KILN_FLASH(q_64, flash_bwd_q, Half<true>, 64)
KILN_FLASH(q_128, flash_bwd_q, Half<true>, 128)
KILN_FLASH(fwd_wg_64, flash_fwd_wg, Half<true>, 64)
KILN_FLASH(fwd_wg_128, flash_fwd_wg, Half<true>, 128)
KILN_FLASH(kv_wg_64, flash_bwd_kv_wg, Half<true>, 64)
KILN_FLASH(kv_wg_128, flash_bwd_kv_wg, Half<true>, 128)
KILN_FLASH(q_wg_64, flash_bwd_q_wg, Half<true>, 64)
KILN_FLASH(q_wg_128, flash_bwd_q_wg, Half<true>, 128)

// The exact forward (float32 arithmetic on the bfloat16 inputs, no dropout): out [batch][tq][d],
// then the row log-sum-exp [batch][tq]. A thread per query row; heads up to 128.
__global__ void reference_fwd(const AttnArgs a, float* out) {
  const i64 b = blockIdx.x, i = (i64)blockIdx.y * blockDim.x + threadIdx.x;
  if (i >= a.tq) return;
  const u16* q = (const u16*)a.ptr[Q] + b * a.bst[Q][0] + i * a.rs[Q];
  const u16* k = (const u16*)a.ptr[K] + b * a.bst[K][0];
  const u16* v = (const u16*)a.ptr[V] + b * a.bst[V][0];
  const i64 keys = a.causal ? min(a.tk, i + 1) : a.tk;
  auto score = [&](i64 j) {
    float s = 0;
    for (int c = 0; c < a.d; ++c) s += H<true>::to(q[c]) * H<true>::to(k[j * a.rs[K] + c]);
    return s * (float)a.scale;
  };
  float mx = -INFINITY, l = 0, acc[128] = {};
  for (i64 j = 0; j < keys; ++j) mx = fmaxf(mx, score(j));
  for (i64 j = 0; j < keys; ++j) {
    const float p = expf(score(j) - mx);
    l += p;
    for (int c = 0; c < a.d; ++c) acc[c] += p * H<true>::to(v[j * a.rs[V] + c]);
  }
  for (int c = 0; c < a.d; ++c) out[(b * a.tq + i) * a.d + c] = acc[c] / l;
  out[gridDim.x * a.tq * a.d + b * a.tq + i] = mx + logf(l);
}

namespace {

namespace kk = kiln::kernels;
using kk::DeviceKernel;

#define CK(x)                                                                                  \
  do {                                                                                         \
    const cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "flash_harness: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)

typedef void (*KernelFn)(AttnArgs);
struct Kernels {
  KernelFn fwd, prep, kv, q, fwd_wg, kv_wg, q_wg;
};
Kernels kernels_of(int bucket) {
  if (bucket == 64) return {fwd_64, prep_64, kv_64, q_64, fwd_wg_64, kv_wg_64, q_wg_64};
  return {fwd_128, prep_128, kv_128, q_128, fwd_wg_128, kv_wg_128, q_wg_128};
}

// Queues kernel `f` (kiln's `k`) over `rows` rows of each batch element as the device runtime
// does (runtime/cuda/device_ops.cpp, launch_attention).
void launch(KernelFn f, DeviceKernel k, const AttnArgs& a, int64_t batch, int64_t rows, int bucket) {
  const int64_t shared = kk::flash_shared_bytes(k, bucket, 2), per = kk::flash_rows_per_block(k, bucket);
  static std::map<KernelFn, int64_t> opted;
  if (shared > 48 * 1024 && opted[f] < shared) {
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
    opted[f] = shared;
  }
  if (batch == 0 || rows == 0) return;
  f<<<dim3(static_cast<unsigned>(batch), static_cast<unsigned>((rows + per - 1) / per)), kk::flash_threads(k),
      static_cast<size_t>(shared)>>>(a);
  CK(cudaGetLastError());
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class T> T* device_copy(const std::vector<T>& v) {
  T* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(1, v.size()) * sizeof(T)));
  if (!v.empty()) CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <class T> std::vector<T> host_copy(const T* p, size_t n) {
  std::vector<T> v(n);
  if (n) CK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// One attention problem: [batch][t][d] bfloat16 inputs (random, or all one value), the packed
// forward output and its gradient, the backward's work area and the stacked gradients.
struct Problem {
  int64_t batch, tq, tk, d, width;
  bool causal;
  double dropout;
  uint16_t *q, *k, *v, *fwd, *gout, *grads;
  void* work;
  long long* rng;
  Problem(int64_t b, int64_t tq_, int64_t tk_, int64_t d_, bool causal_, double p, unsigned seed, bool random = true)
      : batch(b), tq(tq_), tk(tk_), d(d_), width((d_ + 4 + 7) / 8 * 8), causal(causal_), dropout(p) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    auto values = [&](int64_t n, float scale) {
      std::vector<uint16_t> x(static_cast<size_t>(n), to_bf16(0.25f));
      if (random)
        for (auto& e : x) e = to_bf16(u(gen) * scale);
      return x;
    };
    q = device_copy(values(b * tq * d, 1)), k = device_copy(values(b * tk * d, 1)), v = device_copy(values(b * tk * d, 1));
    gout = device_copy(values(b * tq * width, 0.5f));
    CK(cudaMalloc(&fwd, static_cast<size_t>(b * tq * width) * 2));
    CK(cudaMalloc(&grads, static_cast<size_t>(std::max<int64_t>(1, b * (tq + 2 * tk) * d)) * 2));
    CK(cudaMalloc(&work, static_cast<size_t>(std::max<int64_t>(1, kk::flash_work_bytes(b, tq, bucket(), 2)))));
    rng = device_copy(std::vector<long long>{12345, 678, 91011, 1213});
  }
  ~Problem() {
    for (void* p : {(void*)q, (void*)k, (void*)v, (void*)fwd, (void*)gout, (void*)grads, work, (void*)rng}) cudaFree(p);
  }
  int bucket() const { return kk::flash_head_bucket(d); }
  // The kernels' arguments (rows of d elements; 16-byte loads where d allows them).
  AttnArgs args() const {
    AttnArgs a;
    std::memset(&a, 0, sizeof a);
    a.ptr[Q] = q, a.ptr[K] = k, a.ptr[V] = v, a.ptr[F] = fwd, a.ptr[G] = gout, a.ptr[O] = fwd;
    a.nb = 1, a.bsize[0] = batch;
    for (int x : {Q, K, V}) a.rs[x] = d, a.cs[x] = 1, a.vec[x] = d % 8 == 0;
    a.bst[Q][0] = tq * d, a.bst[K][0] = a.bst[V][0] = tk * d;
    for (int x : {F, G, O}) a.bst[x][0] = tq * width, a.rs[x] = width, a.cs[x] = 1;
    a.tq = tq, a.tk = tk, a.d = d, a.causal = causal, a.scale = 1.0 / std::sqrt(static_cast<double>(d));
    a.rng = rng, a.rng_st = 1, a.dropout = dropout, a.work = work;
    return a;
  }
  void forward(bool wg) const {
    const Kernels ks = kernels_of(bucket());
    if (wg) launch(ks.fwd_wg, DeviceKernel::FlashForwardWarpgroup, args(), batch, tq, bucket());
    else launch(ks.fwd, DeviceKernel::FlashForward, args(), batch, tq, bucket());
  }
  // The backward from the packed output in fwd into grads (dq, then dk, then dv rows).
  void backward(bool wg) const {
    const Kernels ks = kernels_of(bucket());
    AttnArgs a = args();
    a.ptr[O] = grads, a.bst[O][0] = (tq + 2 * tk) * d, a.rs[O] = d;
    launch(ks.prep, DeviceKernel::FlashBackwardPrep, a, batch, tq, bucket());
    if (wg) {
      launch(ks.q_wg, DeviceKernel::FlashBackwardQWarpgroup, a, batch, tq, bucket());
      launch(ks.kv_wg, DeviceKernel::FlashBackwardKVWarpgroup, a, batch, tk, bucket());
    } else {
      launch(ks.q, DeviceKernel::FlashBackwardQ, a, batch, tq, bucket());
      launch(ks.kv, DeviceKernel::FlashBackwardKV, a, batch, tk, bucket());
    }
  }
  std::vector<uint16_t> output() const { return host_copy(fwd, static_cast<size_t>(batch * tq * width)); }
  std::vector<uint16_t> gradients() const { return host_copy(grads, static_cast<size_t>(batch * (tq + 2 * tk) * d)); }
};

// The log-sum-exp of a packed 16-bit row (runtime/ir/attention_lse.h's pieces).
double packed_lse(const uint16_t* p) {
  return std::ldexp(static_cast<double>(from_bf16(p[1])) + from_bf16(p[2]) + from_bf16(p[3]),
                    static_cast<int>(from_bf16(p[0])));
}

// The warpgroup forward against the exact one (without dropout: also the mma.sync forward's
// distance to it, the bar) and against the mma.sync forward's output.
bool check_forward(const Problem& pb) {
  const int64_t rows = pb.batch * pb.tq;
  std::vector<float> ref;
  if (pb.dropout == 0) {
    float* r = nullptr;
    CK(cudaMalloc(&r, static_cast<size_t>(std::max<int64_t>(1, rows * (pb.d + 1))) * 4));
    if (rows) reference_fwd<<<dim3(pb.batch, (pb.tq + 127) / 128), 128>>>(pb.args(), r);
    CK(cudaGetLastError());
    ref = host_copy(r, static_cast<size_t>(rows * (pb.d + 1)));
    cudaFree(r);
  }
  pb.forward(false);
  const std::vector<uint16_t> sync = pb.output();
  pb.forward(true);
  const std::vector<uint16_t> wg = pb.output();
  double to_ref[2] = {0, 0}, lse_err[2] = {0, 0}, between = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int x = 0; x < 2; ++x) {
      const uint16_t* o = (x ? wg : sync).data() + r * pb.width;
      for (int64_t c = 0; c < pb.d; ++c) {
        const double y = from_bf16(o[c]), s = from_bf16(sync[r * pb.width + c]);
        if (!ref.empty()) to_ref[x] = std::max(to_ref[x], std::fabs(y - ref[r * pb.d + c]));
        if (x) between = std::max(between, std::fabs(y - s) / (1 + std::fabs(s)));
        if (std::isnan(from_bf16(o[c]))) to_ref[x] = between = INFINITY;
      }
      if (!ref.empty()) lse_err[x] = std::max(lse_err[x], std::fabs(packed_lse(o + pb.d) - ref[rows * pb.d + r]));
    }
  const bool ok = between <= 2e-2 && (ref.empty() || (to_ref[1] <= 2 * to_ref[0] + 1e-3 && lse_err[1] <= 1e-3));
  std::printf("forward  batch %lld tq %lld tk %lld d %lld%s%s: |wg - mma.sync| %.3g, to exact: mma.sync %.3g wg %.3g, "
              "lse %.3g %.3g  %s\n",
              (long long)pb.batch, (long long)pb.tq, (long long)pb.tk, (long long)pb.d, pb.causal ? " causal" : "",
              pb.dropout ? " dropout" : "", between, to_ref[0], to_ref[1], lse_err[0], lse_err[1], ok ? "ok" : "FAIL");
  return ok;
}

// The warpgroup backward against the mma.sync one, from the same forward output.
bool check_backward(const Problem& pb) {
  pb.forward(false);
  pb.backward(false);
  const std::vector<uint16_t> sync = pb.gradients();
  pb.backward(true);
  const std::vector<uint16_t> wg = pb.gradients();
  double largest = 0, diff = 0;
  bool same = true;
  for (size_t e = 0; e < sync.size(); ++e) {
    const double x = from_bf16(sync[e]), y = from_bf16(wg[e]);
    largest = std::max(largest, std::fabs(x));
    diff = std::isnan(x) != std::isnan(y) ? INFINITY : std::max(diff, std::fabs(x - y));
    same = same && sync[e] == wg[e];
  }
  const bool ok = diff <= 1e-2 * largest;
  std::printf("backward batch %lld tq %lld tk %lld d %lld%s%s: %s, largest |wg - mma.sync| %.3g (largest gradient %.3g)  %s\n",
              (long long)pb.batch, (long long)pb.tq, (long long)pb.tk, (long long)pb.d, pb.causal ? " causal" : "",
              pb.dropout ? " dropout" : "", same ? "bit-identical" : "not bit-identical", diff, largest, ok ? "ok" : "FAIL");
  return ok;
}

int check() {
  struct Case {
    int64_t batch, tq, tk, d;
    bool causal;
    double dropout;
  };
  // (odd lengths; tq != tk both ways; one row; d 113: no 16-byte loads; dropout with causal)
  const Case cases[] = {{2, 300, 300, 64, false, 0},  {2, 300, 300, 64, true, 0},   {3, 257, 257, 128, false, 0},
                        {3, 257, 257, 128, true, 0},  {1, 1, 1, 64, false, 0},      {2, 1000, 700, 128, true, 0},
                        {1, 129, 2100, 64, true, 0},  {2, 700, 130, 128, false, 0}, {3, 26, 260, 113, true, 0.3},
                        {2, 300, 300, 128, false, 0.1}};
  bool ok = true;
  unsigned seed = 1;
  for (const Case& c : cases) {
    const Problem pb(c.batch, c.tq, c.tk, c.d, c.causal, c.dropout, seed++);
    ok = check_forward(pb) && ok;
    ok = check_backward(pb) && ok;
  }
  CK(cudaDeviceSynchronize());
  std::printf("%s\n", ok ? "all checks ok" : "CHECKS FAILED");
  return ok ? 0 : 1;
}

// Median µs of `step` over `iters` runs (after two), by events around each.
template <class Step> double median_us(Step step, int iters = 10) {
  for (int i = 0; i < 2; ++i) step();
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms(static_cast<size_t>(iters));
  for (float& m : ms) {
    CK(cudaEventRecord(e0));
    step();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&m, e0, e1));
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
  return 1e3 * ms[static_cast<size_t>(iters / 2)];
}

int time_grid() {
  std::printf("%-22s %13s %13s %8s %13s %13s %8s\n", "bf16, 16k tokens x 2048", "fwd mma.sync", "fwd wg", "", "bwd mma.sync",
              "bwd wg", "");
  for (int d : {64, 128})
    for (bool causal : {false, true})
      for (int64_t t : {512, 1024, 2048, 8192}) {
        const Problem pb((16384 / t) * (2048 / d), t, t, d, causal, 0, 7, false);
        const double flops = 4.0 * pb.batch * t * t * d / (causal ? 2 : 1);  // (forward; backward 2.5 x)
        double us[4];
        for (int wg = 0; wg < 2; ++wg) {
          us[wg] = median_us([&] { pb.forward(wg); });
          us[2 + wg] = median_us([&] { pb.backward(wg); });
        }
        char name[64];
        std::snprintf(name, sizeof name, "d%d %s T%lld", d, causal ? "causal" : "full", (long long)t);
        std::printf("%-22s %7.0f us %3.0fT %7.0f us %3.0fT %7.2fx %7.0f us %3.0fT %7.0f us %3.0fT %7.2fx\n", name, us[0],
                    flops / us[0] / 1e6, us[1], flops / us[1] / 1e6, us[0] / us[1], us[2], 2.5 * flops / us[2] / 1e6, us[3],
                    2.5 * flops / us[3] / 1e6, us[2] / us[3]);
      }
  return 0;
}

int profile(int d, bool causal, int64_t t) {
  const Problem pb((16384 / t) * (2048 / d), t, t, d, causal, 0, 7, false);
  for (int i = 0; i < 3; ++i) {
    pb.forward(true);
    pb.backward(true);
  }
  CK(cudaDeviceSynchronize());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "check") return check();
  if (mode == "time") return time_grid();
  if (mode == "prof" && argc == 5) return profile(std::atoi(argv[2]), std::atoi(argv[3]) != 0, std::atoll(argv[4]));
  std::fprintf(stderr, "usage: flash_harness check | time | prof D CAUSAL T\n");
  return 2;
}
