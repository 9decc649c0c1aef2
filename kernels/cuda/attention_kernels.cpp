// CUDA source of the fused attention kernels (OpKind::Attention / AttentionBackward), compiled by
// NVRTC per instance (dtype × head-size bucket × kernel) like the other device kernels.
//
// Every kernel gives a block ROWS rows (query rows forward and for dq, key rows for dk/dv; 64 for
// head sizes up to 64, fewer above) and each row DM/16 consecutive threads, each holding 16 of the
// row's head elements in registers (thread p of a row: elements p, p + DM/16, ..., so a warp's
// shared-memory reads hit distinct banks); the row's dot products are reduced with warp shuffles.
// The other side's rows stream through shared memory in tiles of `bt` rows (a multiple of 4),
// taken 4 at a time (4 independent dot products in flight). Forward keeps an online softmax
// (running maximum and sum) and writes the output row and its log-sum-exp; backward recomputes
// each probability from the saved log-sum-exp: dq per query row over the keys, dk and dv per key
// row over the queries (no atomics, no Tq × Tk matrix). Causal attention skips the tiles it hides.
#include "kernels/cuda/attention_kernels.h"

namespace kiln::kernels {
namespace {

// What both kernel families share (this file's row and tiled kernels, flash_kernels.cpp's
// tensor-core kernels): the argument block, the dropout stream, batch offsets.
const char* kAttentionCommon = R"CUDA(
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
  const i64* rng;            // dropout: the generator words (kernels/cpu/attention_dropout.h)
  i64 rng_st;
  double dropout;            // its probability (0: none)
  int vec[7];                // per operand: 16-byte loads of 8 16-bit elements apply (flash kernels)
  void* work;                // flash backward: per query row dO, lse, delta
  int glse;                  // backward: gout carries the log-sum-exp's gradient in column d
  int* nonfinite;            // 3xTF32 flash kernels: set by flash_scan when an input holds an infinity or NaN
};

// Word w of Philox4x32-10 at (key, counter): runtime/core/philox.h, bit for bit.
__device__ unsigned philox_word(unsigned long long key, unsigned long long ctr, int w) {
  unsigned c0 = (unsigned)ctr, c1 = (unsigned)(ctr >> 32), c2 = 0, c3 = 0;
  unsigned k0 = (unsigned)key, k1 = (unsigned)(key >> 32);
  for (int r = 0; r < 10; ++r) {
    const unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c1 = lo1;
    c3 = lo0;
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return w == 0 ? c0 : w == 1 ? c1 : w == 2 ? c2 : c3;
}

// The dropout mask (kernels/cpu/attention_dropout.h): element (b, i, j) of the probabilities is
// kept when word idx % 4 of Philox(key, base + idx / 4) is below (1 - p) 2^32, idx = (b tq + i) tk + j.
struct Drop {
  unsigned long long key, base, threshold;
  double scale;
  bool on;
};
__device__ Drop drop_of(const AttnArgs& a) {
  Drop d;
  d.on = a.dropout > 0;
  if (!d.on) return d;
  const unsigned long long w0 = a.rng[0], w1 = a.rng[a.rng_st], w2 = a.rng[2 * a.rng_st], w3 = a.rng[3 * a.rng_st];
  d.key = w0 | w1 << 31;
  d.base = w2 | w3 << 31;
  d.threshold = (unsigned long long)ldexp(1.0 - a.dropout, 32);
  d.scale = 1.0 / (1.0 - a.dropout);
  return d;
}
// The factor of probability (b, i, j): 1 without dropout, else 0 or 1 / (1 - p).
template <class T> __device__ T kept(const Drop& d, const AttnArgs& a, i64 b, i64 i, i64 j) {
  if (!d.on) return (T)1;
  const unsigned long long idx = (unsigned long long)((b * a.tq + i) * a.tk + j);
  return philox_word(d.key, d.base + idx / 4, (int)(idx % 4)) < d.threshold ? (T)d.scale : (T)0;
}

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
)CUDA";

const char* kAttentionSource = R"CUDA(
// Threads per row and rows per block of the head-size bucket DM (mirrored by the host).
template <int DM> struct Shape {
  static const int split = DM / 16;
  static const int rows = 4096 / (DM < 64 ? 64 : DM);
};

// The sum of v over the row's SPLIT consecutive lanes.
template <int SPLIT, class T> __device__ T row_sum(T v) {
  for (int o = SPLIT / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// scale * dot + mask, -inf where causal hides key j from query i.
template <class T> __device__ T score(const AttnArgs& a, const i64* off, T dot, i64 i, i64 j) {
  T s = dot * (T)a.scale;
  if (a.has_mask && i < a.tq && j < a.tk) s += in<T>(a, M)[off[M] + i * a.rs[M] + j * a.cs[M]];
  if (a.causal && j > i) s = ninf<T>();
  return s;
}

// Rows [r0, r0 + cnt) of operand k (columns < d) into shared `dst` (row stride DM), zeros in the
// other columns and in the rows up to the next multiple of 4.
template <class T, int DM> __device__ void load_tile(const AttnArgs& a, const i64* off, int k, i64 r0, i64 cnt, T* dst) {
  const T* src = in<T>(a, k) + off[k];
  const i64 padded = (cnt + 3) / 4 * 4;
  for (i64 x = threadIdx.x; x < padded * DM; x += blockDim.x) {
    const i64 r = x / DM, c = x % DM;
    dst[x] = (r < cnt && c < a.d) ? src[(r0 + r) * a.rs[k] + c * a.cs[k]] : (T)0;
  }
}

// This thread's 16 head elements of row i of operand k (zeros past d or past the rows).
template <class T, int DM> __device__ void load_row(const AttnArgs& a, const i64* off, int k, i64 i, i64 rows, int part, T* r) {
  const T* src = in<T>(a, k) + off[k];
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const i64 c = e * (DM / 16) + part;
    r[e] = (i < rows && c < a.d) ? src[i * a.rs[k] + c * a.cs[k]] : (T)0;
  }
}

// x[u] = row . tile row (jj + u), u < 4, reduced over the row's lanes.
template <class T, int DM> __device__ void dot4(const T* x, const T* tile, i64 jj, int part, T* out) {
  constexpr int SPLIT = DM / 16;
#pragma unroll
  for (int u = 0; u < 4; ++u) out[u] = 0;
#pragma unroll
  for (int e = 0; e < 16; ++e)
#pragma unroll
    for (int u = 0; u < 4; ++u) out[u] += x[e] * tile[(jj + u) * DM + e * SPLIT + part];
#pragma unroll
  for (int u = 0; u < 4; ++u) out[u] = row_sum<SPLIT>(out[u]);
}

// acc[e] += sum_u w[u] * tile row (jj + u).
template <class T, int DM> __device__ void axpy4(T* acc, const T* w, const T* tile, i64 jj, int part) {
  constexpr int SPLIT = DM / 16;
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const T* t = tile + jj * DM + e * SPLIT + part;
    acc[e] += w[0] * t[0] + w[1] * t[DM] + w[2] * t[2 * DM] + w[3] * t[3 * DM];
  }
}

template <class T, int DM> __device__ void attn_fwd(const AttnArgs& a) {
  constexpr int SPLIT = Shape<DM>::split, ROWS = Shape<DM>::rows;
  extern __shared__ __align__(16) unsigned char smem[];
  T* ks = (T*)smem;
  T* vs = ks + a.bt * DM;
  const int row = threadIdx.x / SPLIT, part = threadIdx.x % SPLIT;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 i0 = (i64)blockIdx.y * ROWS, i = i0 + row;
  T q[16], acc[16];
  load_row<T, DM>(a, off, Q, i, a.tq, part, q);
#pragma unroll
  for (int e = 0; e < 16; ++e) acc[e] = 0;
  T m = ninf<T>(), l = 0;
  const Drop drop = drop_of(a);
  const i64 jend = a.causal ? min(a.tk, i0 + ROWS) : a.tk;
  for (i64 j0 = 0; j0 < jend; j0 += a.bt) {
    const i64 cnt = min(a.bt, jend - j0);
    __syncthreads();
    load_tile<T, DM>(a, off, K, j0, cnt, ks);
    load_tile<T, DM>(a, off, V, j0, cnt, vs);
    __syncthreads();
    for (i64 jj = 0; jj < cnt; jj += 4) {
      T s[4];
      dot4<T, DM>(q, ks, jj, part, s);
      T mx = m;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        s[u] = jj + u < cnt ? score<T>(a, off, s[u], i, j0 + jj + u) : ninf<T>();
        mx = max(mx, s[u]);
      }
      if (mx == ninf<T>()) continue;  // nothing visible yet
      if (mx > m) {
        const T alpha = kexp(m - mx);
        l *= alpha;
#pragma unroll
        for (int e = 0; e < 16; ++e) acc[e] *= alpha;
        m = mx;
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        s[u] = s[u] == ninf<T>() ? (T)0 : kexp(s[u] - m);
        l += s[u];  // (the softmax's sum: before dropout)
        if (drop.on) s[u] *= kept<T>(drop, a, blockIdx.x, i, j0 + jj + u);
      }
      axpy4<T, DM>(acc, s, vs, jj, part);
    }
  }
  if (i >= a.tq) return;
  T* out = (T*)a.ptr[O] + off[O] + i * a.rs[O];
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const i64 c = e * SPLIT + part;
    if (c < a.d) out[c * a.cs[O]] = a.tk == 0 ? (T)0 : acc[e] / l;
  }
  if (part == 0) out[a.d * a.cs[O]] = m + klog(l);
}

// dq for ROWS query rows: dq_i = scale * sum_j p_ij (dp_ij - delta_i) k_j.
template <class T, int DM> __device__ void attn_bwd_q(const AttnArgs& a) {
  constexpr int SPLIT = Shape<DM>::split, ROWS = Shape<DM>::rows;
  extern __shared__ __align__(16) unsigned char smem[];
  T* ks = (T*)smem;
  T* vs = ks + a.bt * DM;
  const int row = threadIdx.x / SPLIT, part = threadIdx.x % SPLIT;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 i0 = (i64)blockIdx.y * ROWS, i = i0 + row;
  T q[16], go[16], dq[16];
  load_row<T, DM>(a, off, Q, i, a.tq, part, q);
  load_row<T, DM>(a, off, G, i, a.tq, part, go);
  // delta_i = dO_i . O_i - dLSE_i (dLSE: 0 without glse) and the row's log-sum-exp (rows past tq: never written).
  T delta = 0, lse = 0;
  {
    T o[16];
    load_row<T, DM>(a, off, F, i, a.tq, part, o);
    T dot = 0;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      dot += go[e] * o[e];
      dq[e] = 0;
    }
    dot = row_sum<SPLIT>(dot);
    if (i < a.tq) {
      delta = a.glse ? dot - in<T>(a, G)[off[G] + i * a.rs[G] + a.d * a.cs[G]] : dot;
      lse = in<T>(a, F)[off[F] + i * a.rs[F] + a.d * a.cs[F]];
    }
  }
  const Drop drop = drop_of(a);
  const i64 jend = a.causal ? min(a.tk, i0 + ROWS) : a.tk;
  for (i64 j0 = 0; j0 < jend; j0 += a.bt) {
    const i64 cnt = min(a.bt, jend - j0);
    __syncthreads();
    load_tile<T, DM>(a, off, K, j0, cnt, ks);
    load_tile<T, DM>(a, off, V, j0, cnt, vs);
    __syncthreads();
    for (i64 jj = 0; jj < cnt; jj += 4) {
      T sd[4], pd[4];
      dot4<T, DM>(q, ks, jj, part, sd);
      dot4<T, DM>(go, vs, jj, part, pd);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const i64 j = j0 + jj + u;
        const T p = (jj + u >= cnt || (a.causal && j > i)) ? (T)0 : kexp(score<T>(a, off, sd[u], i, j) - lse);
        sd[u] = p * (pd[u] * kept<T>(drop, a, blockIdx.x, i, j) - delta) * (T)a.scale;
      }
      axpy4<T, DM>(dq, sd, ks, jj, part);
    }
  }
  if (i >= a.tq) return;
  T* out = (T*)a.ptr[O] + off[O] + i * a.rs[O];
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const i64 c = e * SPLIT + part;
    if (c < a.d) out[c * a.cs[O]] = dq[e];
  }
}

// dk, dv for ROWS key rows: dv_j = sum_i p_ij dO_i, dk_j = scale * sum_i p_ij (dp_ij - delta_i) q_i.
template <class T, int DM> __device__ void attn_bwd_kv(const AttnArgs& a) {
  constexpr int SPLIT = Shape<DM>::split, ROWS = Shape<DM>::rows;
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = (T*)smem;
  T* gs = qs + a.bt * DM;
  T* lse = gs + a.bt * DM;
  T* delta = lse + a.bt;
  const int row = threadIdx.x / SPLIT, part = threadIdx.x % SPLIT;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 j0 = (i64)blockIdx.y * ROWS, j = j0 + row;
  T k[16], v[16], dk[16], dv[16];
  load_row<T, DM>(a, off, K, j, a.tk, part, k);
  load_row<T, DM>(a, off, V, j, a.tk, part, v);
#pragma unroll
  for (int e = 0; e < 16; ++e) dk[e] = dv[e] = 0;
  const T* fp = in<T>(a, F) + off[F];
  const T* gp = in<T>(a, G) + off[G];
  const Drop drop = drop_of(a);
  for (i64 i0 = a.causal ? j0 : 0; i0 < a.tq; i0 += a.bt) {
    const i64 cnt = min(a.bt, a.tq - i0);
    __syncthreads();
    load_tile<T, DM>(a, off, Q, i0, cnt, qs);
    load_tile<T, DM>(a, off, G, i0, cnt, gs);
    for (i64 r = threadIdx.x; r < cnt; r += blockDim.x) {
      const i64 i = i0 + r;
      T dot = 0;
      for (i64 c = 0; c < a.d; ++c) dot += gp[i * a.rs[G] + c * a.cs[G]] * fp[i * a.rs[F] + c * a.cs[F]];
      delta[r] = a.glse ? dot - gp[i * a.rs[G] + a.d * a.cs[G]] : dot;
      lse[r] = fp[i * a.rs[F] + a.d * a.cs[F]];
    }
    __syncthreads();
    for (i64 ii = 0; ii < cnt; ii += 4) {
      T sd[4], pd[4];
      dot4<T, DM>(k, qs, ii, part, sd);
      dot4<T, DM>(v, gs, ii, part, pd);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const i64 i = i0 + ii + u;
        const bool live = ii + u < cnt && j < a.tk && !(a.causal && j > i);
        const T p = live ? kexp(score<T>(a, off, sd[u], i, j) - lse[ii + u]) : (T)0;
        const T keep = live ? kept<T>(drop, a, blockIdx.x, i, j) : (T)0;
        sd[u] = p * (pd[u] * keep - (live ? delta[ii + u] : (T)0)) * (T)a.scale;
        pd[u] = p * keep;
      }
      axpy4<T, DM>(dv, pd, gs, ii, part);
      axpy4<T, DM>(dk, sd, qs, ii, part);
    }
  }
  if (j >= a.tk) return;
  T* out = (T*)a.ptr[O] + off[O];
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const i64 c = e * SPLIT + part;
    if (c < a.d) {
      out[(a.tq + j) * a.rs[O] + c * a.cs[O]] = dk[e];
      out[(a.tq + a.tk + j) * a.rs[O] + c * a.cs[O]] = dv[e];
    }
  }
}

// ---- tiled kernels: float32, head sizes up to 128 (where their shared memory fits) ----
// A block takes 64 rows and 256 threads; a 64 x 64 product tile is computed as 4 x 4 micro-tiles
// per thread (rows ty + 16a, columns tx + 16b) from operands in shared memory, read as float4
// along the reduced dim (row pitch DM + 4 and score pitch 68: 16-byte aligned rows whose
// quarter-warp reads fall in distinct banks). The row softmax of a tile runs on 4 threads per
// row. Shared memory beyond 48 KiB is opted into by the host.

template <int DM> struct Tiled {
  static const int P = DM + 4;   // row pitch of the operand tiles
  static const int NB = DM / 16; // output columns per thread
};
#define SP 68  // row pitch of the score tiles

// Rows [r0, r0 + cnt) of operand k into dst (pitch P), zeros elsewhere in the 64-row tile.
template <int DM> __device__ void tile64(const AttnArgs& a, const i64* off, int k, i64 r0, i64 cnt, float* dst) {
  const float* src = in<float>(a, k) + off[k];
  for (int x = threadIdx.x; x < 64 * DM; x += 256) {
    const int r = x / DM, c = x % DM;
    dst[r * Tiled<DM>::P + c] = (r < cnt && c < a.d) ? src[(r0 + r) * a.rs[k] + c * a.cs[k]] : 0.f;
  }
}

// delta_i = dO_i . O_i - dLSE_i and lse_i for the 64 query rows at i0 (4 threads per row);
// rows past tq get lse = +inf (probability 0) and delta = 0.
template <int DM> __device__ void row_stats(const AttnArgs& a, const i64* off, i64 i0, const float* gs, float* lse, float* delta) {
  const int row = threadIdx.x >> 2, part = threadIdx.x & 3;
  const i64 i = i0 + row;
  float dot = 0.f;
  if (i < a.tq) {
    const float* f = in<float>(a, F) + off[F] + i * a.rs[F];
    for (int c = part; c < a.d; c += 4) dot += gs[row * Tiled<DM>::P + c] * f[c * a.cs[F]];
  }
  dot += __shfl_xor_sync(0xffffffffu, dot, 1);
  dot += __shfl_xor_sync(0xffffffffu, dot, 2);
  if (part == 0) {
    if (i < a.tq) {
      delta[row] = a.glse ? dot - in<float>(a, G)[off[G] + i * a.rs[G] + a.d * a.cs[G]] : dot;
      lse[row] = in<float>(a, F)[off[F] + i * a.rs[F] + a.d * a.cs[F]];
    } else {
      delta[row] = 0.f;
      lse[row] = __int_as_float(0x7f800000);
    }
  }
}

// s[a][b] = sum_d x[(ty + 16a)][d] * y[(tx + 16b)][d] over two pitch-P tiles.
template <int DM> __device__ void mm_nt(const float* x, const float* y, int ty, int tx, float s[4][4]) {
  constexpr int P = Tiled<DM>::P;
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int w = 0; w < 4; ++w) s[u][w] = 0.f;
#pragma unroll 2
  for (int d = 0; d < DM; d += 4) {
    float4 xa[4], yb[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      xa[u] = *reinterpret_cast<const float4*>(x + (ty + 16 * u) * P + d);
      yb[u] = *reinterpret_cast<const float4*>(y + (tx + 16 * u) * P + d);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int w = 0; w < 4; ++w)
        s[u][w] += xa[u].x * yb[w].x + xa[u].y * yb[w].y + xa[u].z * yb[w].z + xa[u].w * yb[w].w;
  }
}

// acc[a][b] += sum_{k < n} w[(ty + 16a) * SP + k] * t[k * P + tx + 16b]; w is zero for k >= n up
// to the next multiple of 4 and t's rows there are zero.
template <int DM> __device__ void mm_acc(const float* w, const float* t, int n, int ty, int tx, float acc[4][DM / 16]) {
  constexpr int P = Tiled<DM>::P, NB = Tiled<DM>::NB;
  for (int k = 0; k < n; k += 4) {
    float4 wa[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) wa[u] = *reinterpret_cast<const float4*>(w + (ty + 16 * u) * SP + k);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      float tb[NB];
#pragma unroll
      for (int v = 0; v < NB; ++v) tb[v] = t[(k + kk) * P + tx + 16 * v];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float wv = kk == 0 ? wa[u].x : kk == 1 ? wa[u].y : kk == 2 ? wa[u].z : wa[u].w;
#pragma unroll
        for (int v = 0; v < NB; ++v) acc[u][v] += wv * tb[v];
      }
    }
  }
}

// Zeroes a thread's 4 x NB accumulator.
template <int NB> __device__ void zero_acc(float acc[4][NB]) {
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int v = 0; v < NB; ++v) acc[u][v] = 0.f;
}

// Writes a thread's accumulator rows r0 + ty + 16a (those below `limit`) to out's rows
// `at` + that, columns tx + 16b below d.
template <int DM> __device__ void store_acc(const AttnArgs& a, float* out, i64 r0, i64 limit, i64 at, int ty, int tx,
                                            const float acc[4][DM / 16]) {
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const i64 r = r0 + ty + 16 * u;
    if (r >= limit) continue;
#pragma unroll
    for (int v = 0; v < DM / 16; ++v) {
      const int c = tx + 16 * v;
      if (c < a.d) out[(at + r) * a.rs[O] + c * a.cs[O]] = acc[u][v];
    }
  }
}

template <int DM> __device__ void attn_fwd_tiled(const AttnArgs& a) {
  constexpr int P = Tiled<DM>::P, NB = Tiled<DM>::NB;
  extern __shared__ __align__(16) unsigned char smem[];
  float* qs = (float*)smem;
  float* ks = qs + 64 * P;
  float* vs = ks + 64 * P;
  float* ss = vs + 64 * P;
  float* rm = ss + 64 * SP;
  float* rl = rm + 64;
  float* ra = rl + 64;
  const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 i0 = (i64)blockIdx.y * 64;
  tile64<DM>(a, off, Q, i0, min((i64)64, a.tq - i0), qs);
  if (tid < 64) {
    rm[tid] = ninf<float>();
    rl[tid] = 0.f;
  }
  float acc[4][NB];
  zero_acc<NB>(acc);
  const i64 jend = a.causal ? min(a.tk, i0 + 64) : a.tk;
  for (i64 j0 = 0; j0 < jend; j0 += 64) {
    const i64 cnt = min((i64)64, jend - j0);
    __syncthreads();
    tile64<DM>(a, off, K, j0, cnt, ks);
    tile64<DM>(a, off, V, j0, cnt, vs);
    __syncthreads();
    float s[4][4];
    mm_nt<DM>(qs, ks, ty, tx, s);
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int c = tx + 16 * w;
        ss[(ty + 16 * u) * SP + c] = c < cnt ? score<float>(a, off, s[u][w], i0 + ty + 16 * u, j0 + c) : ninf<float>();
      }
    __syncthreads();
    {  // online softmax of the tile, 4 threads per row
      const int row = tid >> 2, part = tid & 3;
      float* sr = ss + row * SP + part * 16;
      float mx = ninf<float>();
      for (int c = 0; c < 16; ++c) mx = fmaxf(mx, sr[c]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_old = rm[row], m_new = fmaxf(m_old, mx);
      float sum = 0.f;
      for (int c = 0; c < 16; ++c) {
        const float p = sr[c] == ninf<float>() ? 0.f : expf(sr[c] - m_new);
        sr[c] = p;
        sum += p;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      __syncwarp();
      if (part == 0) {
        const float alpha = m_old == ninf<float>() ? 0.f : expf(m_old - m_new);
        rl[row] = rl[row] * alpha + sum;
        rm[row] = m_new;
        ra[row] = alpha;
      }
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float al = ra[ty + 16 * u];
#pragma unroll
      for (int v = 0; v < NB; ++v) acc[u][v] *= al;
    }
    mm_acc<DM>(ss, vs, (int)cnt, ty, tx, acc);
  }
  __syncthreads();
  float* out = (float*)a.ptr[O] + off[O];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int row = ty + 16 * u;
    const i64 i = i0 + row;
    if (i >= a.tq) continue;
#pragma unroll
    for (int v = 0; v < NB; ++v) {
      const int c = tx + 16 * v;
      if (c < a.d) out[i * a.rs[O] + c * a.cs[O]] = a.tk == 0 ? 0.f : acc[u][v] / rl[row];
    }
  }
  if (tid < 64 && i0 + tid < a.tq) out[(i0 + tid) * a.rs[O] + a.d * a.cs[O]] = rm[tid] + logf(rl[tid]);
}

// dq for 64 query rows, over 64-key tiles.
template <int DM> __device__ void attn_bwd_q_tiled(const AttnArgs& a) {
  constexpr int P = Tiled<DM>::P, NB = Tiled<DM>::NB;
  extern __shared__ __align__(16) unsigned char smem[];
  float* qs = (float*)smem;
  float* gs = qs + 64 * P;
  float* ks = gs + 64 * P;
  float* vs = ks + 64 * P;
  float* ds = vs + 64 * P;
  float* lse = ds + 64 * SP;
  float* delta = lse + 64;
  const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 i0 = (i64)blockIdx.y * 64;
  const i64 rows = min((i64)64, a.tq - i0);
  tile64<DM>(a, off, Q, i0, rows, qs);
  tile64<DM>(a, off, G, i0, rows, gs);
  __syncthreads();
  row_stats<DM>(a, off, i0, gs, lse, delta);
  float acc[4][NB];
  zero_acc<NB>(acc);
  const i64 jend = a.causal ? min(a.tk, i0 + 64) : a.tk;
  for (i64 j0 = 0; j0 < jend; j0 += 64) {
    const i64 cnt = min((i64)64, jend - j0);
    __syncthreads();
    tile64<DM>(a, off, K, j0, cnt, ks);
    tile64<DM>(a, off, V, j0, cnt, vs);
    __syncthreads();
    float s[4][4], dp[4][4];
    mm_nt<DM>(qs, ks, ty, tx, s);
    mm_nt<DM>(gs, vs, ty, tx, dp);
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int r = ty + 16 * u, c = tx + 16 * w;
        const i64 i = i0 + r, j = j0 + c;
        const bool live = c < cnt && i < a.tq && !(a.causal && j > i);
        const float p = live ? expf(score<float>(a, off, s[u][w], i, j) - lse[r]) : 0.f;
        ds[r * SP + c] = p * (dp[u][w] - delta[r]) * (float)a.scale;
      }
    __syncthreads();
    mm_acc<DM>(ds, ks, (int)cnt, ty, tx, acc);
  }
  store_acc<DM>(a, (float*)a.ptr[O] + off[O], i0, a.tq, 0, ty, tx, acc);
}

// dk, dv for 64 key rows, over 64-query tiles.
template <int DM> __device__ void attn_bwd_kv_tiled(const AttnArgs& a) {
  constexpr int P = Tiled<DM>::P, NB = Tiled<DM>::NB;
  extern __shared__ __align__(16) unsigned char smem[];
  float* ks = (float*)smem;
  float* vs = ks + 64 * P;
  float* qs = vs + 64 * P;
  float* gs = qs + 64 * P;
  float* ps = gs + 64 * P;
  float* ds = ps + 64 * SP;
  float* lse = ds + 64 * SP;
  float* delta = lse + 64;
  const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 j0 = (i64)blockIdx.y * 64;
  const i64 keys = min((i64)64, a.tk - j0);
  tile64<DM>(a, off, K, j0, keys, ks);
  tile64<DM>(a, off, V, j0, keys, vs);
  float dk[4][NB], dv[4][NB];
  zero_acc<NB>(dk);
  zero_acc<NB>(dv);
  for (i64 i0 = a.causal ? j0 : 0; i0 < a.tq; i0 += 64) {
    const i64 cnt = min((i64)64, a.tq - i0);
    __syncthreads();
    tile64<DM>(a, off, Q, i0, cnt, qs);
    tile64<DM>(a, off, G, i0, cnt, gs);
    __syncthreads();
    row_stats<DM>(a, off, i0, gs, lse, delta);
    __syncthreads();
    float s[4][4], dp[4][4];
    mm_nt<DM>(ks, qs, ty, tx, s);   // [key][query]
    mm_nt<DM>(vs, gs, ty, tx, dp);
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int r = ty + 16 * u, c = tx + 16 * w;  // key r, query c
        const i64 j = j0 + r, i = i0 + c;
        const bool live = c < cnt && r < keys && !(a.causal && j > i);
        const float p = live ? expf(score<float>(a, off, s[u][w], i, j) - lse[c]) : 0.f;
        ps[r * SP + c] = p;
        ds[r * SP + c] = p * (dp[u][w] - delta[c]) * (float)a.scale;
      }
    __syncthreads();
    mm_acc<DM>(ps, gs, (int)cnt, ty, tx, dv);
    mm_acc<DM>(ds, qs, (int)cnt, ty, tx, dk);
  }
  float* out = (float*)a.ptr[O] + off[O];
  store_acc<DM>(a, out, j0, a.tk, a.tq, ty, tx, dk);
  store_acc<DM>(a, out, j0, a.tk, a.tq + a.tk, ty, tx, dv);
}

#define KILN_ATTENTION_attn_fwd_tiled(NAME, T, DM) \
  extern "C" __global__ void __launch_bounds__(256) NAME(AttnArgs a) { attn_fwd_tiled<DM>(a); }
#define KILN_ATTENTION_attn_bwd_q_tiled(NAME, T, DM) \
  extern "C" __global__ void __launch_bounds__(256) NAME(AttnArgs a) { attn_bwd_q_tiled<DM>(a); }
#define KILN_ATTENTION_attn_bwd_kv_tiled(NAME, T, DM) \
  extern "C" __global__ void __launch_bounds__(256) NAME(AttnArgs a) { attn_bwd_kv_tiled<DM>(a); }

// Forward uses few registers (two blocks per SM); the backward kernels keep four rows of values
// per thread and get the registers they need (no spills).
#define KILN_ATTENTION_attn_fwd(NAME, T, DM) \
  extern "C" __global__ void __launch_bounds__(256, 2) NAME(AttnArgs a) { attn_fwd<T, DM>(a); }
#define KILN_ATTENTION_attn_bwd_q(NAME, T, DM) \
  extern "C" __global__ void __launch_bounds__(256) NAME(AttnArgs a) { attn_bwd_q<T, DM>(a); }
#define KILN_ATTENTION_attn_bwd_kv(NAME, T, DM) \
  extern "C" __global__ void __launch_bounds__(256) NAME(AttnArgs a) { attn_bwd_kv<T, DM>(a); }
#define KILN_ATTENTION(NAME, KIND, T, DM) KILN_ATTENTION_##KIND(NAME, T, DM)
)CUDA";

}  // namespace

const char* attention_common_source() { return kAttentionCommon; }
const char* attention_kernel_source() { return kAttentionSource; }

}  // namespace kiln::kernels
