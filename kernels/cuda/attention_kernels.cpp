// CUDA source of the fused attention kernels (OpKind::Attention / AttentionBackward), compiled by
// NVRTC per instance (dtype × head-size bucket × kernel) like the other device kernels.
//
// Every kernel gives a block 64 rows (query rows forward and for dq, key rows for dk/dv) and each
// row DM/32 consecutive threads, each holding 32 of the row's head elements in registers (thread p
// of a row: elements p, p + DM/32, ..., so a warp's shared-memory reads hit distinct banks); the
// row's dot products are reduced with warp shuffles. The other side's rows stream through shared
// memory in tiles of `bt` rows. Forward keeps an online softmax (running maximum and sum) and
// writes the output row and its log-sum-exp; backward recomputes each probability from the saved
// log-sum-exp: dq per query row over the keys, dk and dv per key row over the queries (no atomics,
// no Tq × Tk matrix). Causal attention skips the tiles it hides.
#include "kernels/cuda/attention_kernels.h"

namespace kiln::kernels {
namespace {

const char* kAttentionSource = R"CUDA(
typedef long long i64;

// Operands, by index into AttnArgs' arrays.
#define Q 0
#define K 1
#define V 2
#define M 3
#define F 4
#define G 5
#define O 6

struct AttnArgs {
  const void* ptr[7];        // q, k, v, mask, fwd (packed output), gout (its gradient), out
  i64 nb;                    // batch dims (<= 6)
  i64 bsize[6];
  i64 bst[7][6];             // per operand: batch strides (elements)
  i64 rs[7], cs[7];          // per operand: row and column strides (mask: query and key strides)
  i64 tq, tk, d, bt;         // sequence lengths, head size, tile rows
  int causal, has_mask;
  double scale;
};

template <class T> __device__ T ninf();
template <> __device__ float ninf<float>() { return __int_as_float(0xff800000); }
template <> __device__ double ninf<double>() { return __longlong_as_double(0xfff0000000000000ll); }
__device__ float kexp(float x) { return expf(x); }
__device__ double kexp(double x) { return exp(x); }
__device__ float klog(float x) { return logf(x); }
__device__ double klog(double x) { return log(x); }

// Element offsets of batch element `b` in every operand.
__device__ void batch_offsets(const AttnArgs& a, i64 b, i64* off) {
  for (int k = 0; k < 7; ++k) off[k] = 0;
  for (int d = (int)a.nb - 1; d >= 0; --d) {
    const i64 i = b % a.bsize[d];
    b /= a.bsize[d];
    for (int k = 0; k < 7; ++k) off[k] += i * a.bst[k][d];
  }
}

template <class T> __device__ const T* in(const AttnArgs& a, int k) { return (const T*)a.ptr[k]; }

// The sum of v over the row's SPLIT consecutive lanes.
template <int SPLIT, class T> __device__ T row_sum(T v) {
  for (int o = SPLIT / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// scale * dot + mask, -inf where causal hides key j from query i.
template <class T> __device__ T score(const AttnArgs& a, const i64* off, T dot, i64 i, i64 j) {
  T s = dot * (T)a.scale;
  if (a.has_mask && i < a.tq) s += in<T>(a, M)[off[M] + i * a.rs[M] + j * a.cs[M]];
  if (a.causal && j > i) s = ninf<T>();
  return s;
}

// Rows [r0, r0 + cnt) of operand k (columns < d, zeros up to DM) into shared `dst` (row stride DM).
template <class T, int DM> __device__ void load_tile(const AttnArgs& a, const i64* off, int k, i64 r0, i64 cnt, T* dst) {
  const T* src = in<T>(a, k) + off[k];
  for (i64 x = threadIdx.x; x < cnt * DM; x += blockDim.x) {
    const i64 r = x / DM, c = x % DM;
    dst[x] = c < a.d ? src[(r0 + r) * a.rs[k] + c * a.cs[k]] : (T)0;
  }
}

// This thread's 32 head elements of row i of operand k (zeros past d or past the rows).
template <class T, int DM> __device__ void load_row(const AttnArgs& a, const i64* off, int k, i64 i, i64 rows, int part, T* r) {
  const T* src = in<T>(a, k) + off[k];
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    const i64 c = e * (DM / 32) + part;
    r[e] = (i < rows && c < a.d) ? src[i * a.rs[k] + c * a.cs[k]] : (T)0;
  }
}

template <class T, int DM> __device__ void attn_fwd(const AttnArgs& a) {
  constexpr int SPLIT = DM / 32;
  extern __shared__ __align__(16) unsigned char smem[];
  T* ks = (T*)smem;
  T* vs = ks + a.bt * DM;
  const int row = threadIdx.x / SPLIT, part = threadIdx.x % SPLIT;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 i0 = (i64)blockIdx.y * 64, i = i0 + row;
  T q[32], acc[32];
  load_row<T, DM>(a, off, Q, i, a.tq, part, q);
#pragma unroll
  for (int e = 0; e < 32; ++e) acc[e] = 0;
  T m = ninf<T>(), l = 0;
  const i64 jend = a.causal ? min(a.tk, i0 + 64) : a.tk;
  for (i64 j0 = 0; j0 < jend; j0 += a.bt) {
    const i64 cnt = min(a.bt, jend - j0);
    __syncthreads();
    load_tile<T, DM>(a, off, K, j0, cnt, ks);
    load_tile<T, DM>(a, off, V, j0, cnt, vs);
    __syncthreads();
    for (i64 jj = 0; jj < cnt; ++jj) {
      const T* kr = ks + jj * DM + part;
      T dot = 0;
#pragma unroll
      for (int e = 0; e < 32; ++e) dot += q[e] * kr[e * SPLIT];
      const T s = score<T>(a, off, row_sum<SPLIT>(dot), i, j0 + jj);
      if (s == ninf<T>()) continue;
      if (s > m) {
        const T alpha = kexp(m - s);
        l *= alpha;
#pragma unroll
        for (int e = 0; e < 32; ++e) acc[e] *= alpha;
        m = s;
      }
      const T p = kexp(s - m);
      l += p;
      const T* vr = vs + jj * DM + part;
#pragma unroll
      for (int e = 0; e < 32; ++e) acc[e] += p * vr[e * SPLIT];
    }
  }
  if (i >= a.tq) return;
  T* out = (T*)a.ptr[O] + off[O] + i * a.rs[O];
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    const i64 c = e * (DM / 32) + part;
    if (c < a.d) out[c * a.cs[O]] = a.tk == 0 ? (T)0 : acc[e] / l;
  }
  if (part == 0) out[a.d * a.cs[O]] = m + klog(l);
}

// dq for 64 query rows: dq_i = scale * sum_j p_ij (dp_ij - delta_i) k_j.
template <class T, int DM> __device__ void attn_bwd_q(const AttnArgs& a) {
  constexpr int SPLIT = DM / 32;
  extern __shared__ __align__(16) unsigned char smem[];
  T* ks = (T*)smem;
  T* vs = ks + a.bt * DM;
  const int row = threadIdx.x / SPLIT, part = threadIdx.x % SPLIT;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 i0 = (i64)blockIdx.y * 64, i = i0 + row;
  T q[32], go[32], dq[32];
  load_row<T, DM>(a, off, Q, i, a.tq, part, q);
  load_row<T, DM>(a, off, G, i, a.tq, part, go);
  // delta_i = dO_i . O_i - dLSE_i and the row's log-sum-exp (rows past tq: never written).
  T delta = 0, lse = 0;
  {
    T o[32];
    load_row<T, DM>(a, off, F, i, a.tq, part, o);
    T dot = 0;
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      dot += go[e] * o[e];
      dq[e] = 0;
    }
    dot = row_sum<SPLIT>(dot);
    if (i < a.tq) {
      delta = dot - in<T>(a, G)[off[G] + i * a.rs[G] + a.d * a.cs[G]];
      lse = in<T>(a, F)[off[F] + i * a.rs[F] + a.d * a.cs[F]];
    }
  }
  {
    const i64 jend = a.causal ? min(a.tk, i0 + 64) : a.tk;
    for (i64 j0 = 0; j0 < jend; j0 += a.bt) {
      const i64 cnt = min(a.bt, jend - j0);
      __syncthreads();
      load_tile<T, DM>(a, off, K, j0, cnt, ks);
      load_tile<T, DM>(a, off, V, j0, cnt, vs);
      __syncthreads();
      for (i64 jj = 0; jj < cnt; ++jj) {
        const T* kr = ks + jj * DM + part;
        const T* vr = vs + jj * DM + part;
        T sd = 0, pd = 0;
#pragma unroll
        for (int e = 0; e < 32; ++e) {
          sd += q[e] * kr[e * SPLIT];
          pd += go[e] * vr[e * SPLIT];
        }
        sd = row_sum<SPLIT>(sd);
        pd = row_sum<SPLIT>(pd);
        const T s = score<T>(a, off, sd, i, j0 + jj);
        const T p = (a.causal && j0 + jj > i) ? (T)0 : kexp(s - lse);
        const T ds = p * (pd - delta) * (T)a.scale;
#pragma unroll
        for (int e = 0; e < 32; ++e) dq[e] += ds * kr[e * SPLIT];
      }
    }
  }
  if (i >= a.tq) return;
  T* out = (T*)a.ptr[O] + off[O] + i * a.rs[O];
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    const i64 c = e * (DM / 32) + part;
    if (c < a.d) out[c * a.cs[O]] = dq[e];
  }
}

// dk, dv for 64 key rows: dv_j = sum_i p_ij dO_i, dk_j = scale * sum_i p_ij (dp_ij - delta_i) q_i.
template <class T, int DM> __device__ void attn_bwd_kv(const AttnArgs& a) {
  constexpr int SPLIT = DM / 32;
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = (T*)smem;
  T* gs = qs + a.bt * DM;
  T* lse = gs + a.bt * DM;
  T* delta = lse + a.bt;
  const int row = threadIdx.x / SPLIT, part = threadIdx.x % SPLIT;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 j0 = (i64)blockIdx.y * 64, j = j0 + row;
  T k[32], v[32], dk[32], dv[32];
  load_row<T, DM>(a, off, K, j, a.tk, part, k);
  load_row<T, DM>(a, off, V, j, a.tk, part, v);
#pragma unroll
  for (int e = 0; e < 32; ++e) dk[e] = dv[e] = 0;
  const T* fp = in<T>(a, F) + off[F];
  const T* gp = in<T>(a, G) + off[G];
  for (i64 i0 = a.causal ? j0 : 0; i0 < a.tq; i0 += a.bt) {
    const i64 cnt = min(a.bt, a.tq - i0);
    __syncthreads();
    load_tile<T, DM>(a, off, Q, i0, cnt, qs);
    load_tile<T, DM>(a, off, G, i0, cnt, gs);
    for (i64 r = threadIdx.x; r < cnt; r += blockDim.x) {
      const i64 i = i0 + r;
      T dot = 0;
      for (i64 c = 0; c < a.d; ++c) dot += gp[i * a.rs[G] + c * a.cs[G]] * fp[i * a.rs[F] + c * a.cs[F]];
      delta[r] = dot - gp[i * a.rs[G] + a.d * a.cs[G]];
      lse[r] = fp[i * a.rs[F] + a.d * a.cs[F]];
    }
    __syncthreads();
    for (i64 ii = 0; ii < cnt; ++ii) {
      const i64 i = i0 + ii;
      const T* qr = qs + ii * DM + part;
      const T* gr = gs + ii * DM + part;
      T sd = 0, pd = 0;
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        sd += qr[e * SPLIT] * k[e];
        pd += gr[e * SPLIT] * v[e];
      }
      sd = row_sum<SPLIT>(sd);
      pd = row_sum<SPLIT>(pd);
      const T s = score<T>(a, off, sd, i, j < a.tk ? j : 0);
      const T p = (a.causal && j > i) ? (T)0 : kexp(s - lse[ii]);
      const T ds = p * (pd - delta[ii]) * (T)a.scale;
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        dv[e] += p * gr[e * SPLIT];
        dk[e] += ds * qr[e * SPLIT];
      }
    }
  }
  if (j >= a.tk) return;
  T* out = (T*)a.ptr[O] + off[O];
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    const i64 c = e * (DM / 32) + part;
    if (c < a.d) {
      out[(a.tq + j) * a.rs[O] + c * a.cs[O]] = dk[e];
      out[(a.tq + a.tk + j) * a.rs[O] + c * a.cs[O]] = dv[e];
    }
  }
}

#define KILN_ATTENTION(NAME, KIND, T, DM) \
  extern "C" __global__ void NAME(AttnArgs a) { KIND<T, DM>(a); }
)CUDA";

}  // namespace

const char* attention_kernel_source() { return kAttentionSource; }

}  // namespace kiln::kernels
