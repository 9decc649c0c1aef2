// CUDA source of the tensor-core attention kernels for bfloat16 and float16 (OpKind::Attention /
// AttentionBackward of 16-bit q, k, v; the forward's packed output holds the output rows in the
// input type and the float32 row log-sum-exp in four exact 16-bit pieces,
// runtime/ir/attention_lse.h). FlashAttention-2's work split on mma.sync m16n8k16 (sm_80 and
// later), compiled by NVRTC per instance (dtype × head-size bucket × kernel); 4 warps a block,
// shapes per bucket in Fwd and Bwd below (mirrored by the host's shape_of):
//
//   forward   a block per 128 query rows (64 above head size 128), two 16-row slices a warp;
//             key/value tiles of 64 or 32 rows stream through shared memory (cp.async, two
//             stages up to head size 128); S = Q·Kᵀ and O += P·V on tensor cores with float32
//             accumulators, an online base-2 softmax in registers (P rounded to the input type
//             for the product, its sum kept in float32), causal tiles past the diagonal skipped.
//   prep      the backward's work area: dO staged densely, lse, delta = dO·O per query row.
//   dk, dv    a block per 64 key rows (4 warps × 16 keys) over the query tiles: Sᵀ = K·Qᵀ and
//             dPᵀ = V·dOᵀ, P recomputed from the saved log-sum-exp, dV += P̃ᵀ·dO, dK += dSᵀ·Q.
//   dq        a block per 128 query rows (64 above head size 64) over the key tiles: S, dP
//             again, dQ += dS·K.
//
// dq is its own kernel (not FlashAttention-2's float atomics) so every run gives the same bits;
// it costs the two recomputed products. Head sizes above 128 split the gradients' columns over
// blockIdx.z (each block recomputes S and dP for its half) to keep the accumulators in
// registers. Operand tiles have a row pitch of DM + 8 elements: the 8 rows an ldmatrix reads
// fall in distinct banks. Results are rounded to the input type once, as they are stored.
#include "kernels/cuda/flash_kernels.h"

namespace kiln::kernels {
namespace {

const char* kFlashSource = R"CUDA(
typedef unsigned short u16;
typedef unsigned int u32;

__device__ u32 smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
// Four 8 x 8 matrices of 16-bit elements; lane l gives the shared-memory address of row l % 8 of
// matrix l / 8 (32-bit shared addresses: tiles are passed as their address, `at` the element).
__device__ void ldsm4(u32* r, u32 tile, int at) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tile + 2 * at));
}
// The same, each matrix transposed.
__device__ void ldsm4t(u32* r, u32 tile, int at) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tile + 2 * at));
}

// The 16-bit type (PTX name TY): the product c += a·b (16 x 16 by 16 x 8, float32 accumulators),
// two floats rounded into one register (the lower column in the low half), conversions.
template <bool BF> struct H;
#define KILN_H16(BF, TY)                                                                                \
  template <> struct H<BF> {                                                                              \
    static __device__ void mma(float* c, const u32* a, u32 b0, u32 b1) {                                  \
      asm("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "  \
          "{%8, %9}, {%0, %1, %2, %3};"                                                                   \
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                                 \
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                                 \
    }                                                                                                     \
    static __device__ u32 pack(float lo, float hi) {                                                      \
      u32 r;                                                                                              \
      asm("cvt.rn." TY "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));                                \
      return r;                                                                                           \
    }                                                                                                     \
    static __device__ u16 from(float x) {                                                                 \
      u16 r;                                                                                              \
      asm("cvt.rn." TY ".f32 %0, %1;" : "=h"(r) : "f"(x));                                                \
      return r;                                                                                           \
    }                                                                                                     \
    static __device__ float to(u16 h);                                                                    \
  };
KILN_H16(true, "bf16")
KILN_H16(false, "f16")
__device__ float H<true>::to(u16 h) { return __uint_as_float((u32)h << 16); }  // (cvt.f32.bf16 is sm_90 only)
__device__ float H<false>::to(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

#define BM 64   // query rows of a tile
#define BN 64   // key rows of a tile
#define NT 128  // threads of a block: 4 warps

// Asynchronous copies to shared memory (sm_80): 16 bytes (`bytes` of them read, the rest zeros)
// or 4; a group is committed after each tile and waited for before its use.
__device__ void cp16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ void cp4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// The tile pipeline of S stages over `tiles` tiles; issue(t) stages tile t's copies and commits
// them. Before tile t: its copies are waited for (tile t + 1's issued first when two stages are in
// flight); after it: every warp is done with its stage before the stage is refilled.
template <class Issue> __device__ void stages_begin(int tiles, Issue& issue) {
  if (tiles > 0) issue(0);
  else cp_commit();
}
template <int S, class Issue> __device__ void stage_wait(int t, int tiles, Issue& issue) {
  if (S == 2 && t + 1 < tiles) {
    issue(t + 1);
    cp_wait<1>();
  } else {
    cp_wait<0>();
  }
  __syncthreads();
}
template <int S, class Issue> __device__ void stage_done(int t, int tiles, Issue& issue) {
  __syncthreads();
  if (S == 1 && t + 1 < tiles) issue(t + 1);
}

// Tiles in flight: two (the next one loads while this one is used) up to head size 128; one
// above (shared memory).
template <int DM> struct Stages {
  static const int n = DM <= 128 ? 2 : 1;
};

// A 16-bit matrix read by rows: its first row, row and column strides, whether 16-byte copies
// apply (unit column stride, 8-element aligned rows and address).
struct Src {
  const u16* p;
  i64 rs, cs;
  int vec;
};
__device__ Src src_of(const AttnArgs& a, const i64* off, int k) {
  Src s = {(const u16*)a.ptr[k] + off[k], a.rs[k], a.cs[k], a.vec[k]};
  return s;
}

// The backward's work area (filled by flash_bwd_prep): dO rounded to 16 bits, [batch][tq][DM]
// (zeros past d), then lse and delta, [batch][tq] float32 each.
template <int DM> __device__ Src work_do(const AttnArgs& a, i64 b) {
  Src s = {(const u16*)a.work + b * a.tq * DM, DM, 1, 1};
  return s;
}
template <int DM> __device__ float* work_lse(const AttnArgs& a) {
  return (float*)((u16*)a.work + (i64)gridDim.x * a.tq * DM);
}

// Rows [r0, r0 + cnt) of `s`, columns [0, DM), into `dst` (pitch DM + 8); zeros past the rows and
// past `cols`. Asynchronous 16-byte copies where `s` allows them, else plain stores.
template <int ROWS, int DM> __device__ void stage(const Src& s, i64 r0, i64 cnt, i64 cols, u16* dst) {
  constexpr int P = DM + 8;
  constexpr int CH = DM / 8;  // 16-byte chunks of a row
  if (s.vec && NT % CH == 0) {  // (each thread keeps one column and steps over rows)
    constexpr int STEP = NT / CH;
    const int c = threadIdx.x % CH * 8, rt = threadIdx.x / CH;
    const u16* src = s.p + (r0 + rt) * s.rs + c;
    u16* d = dst + rt * P + c;
    const bool col = c < cols;
#pragma unroll
    for (int k = 0; k < ROWS / STEP; ++k) {
      const bool in = col && rt + k * STEP < cnt;
      cp16(d + k * STEP * P, in ? src + k * STEP * s.rs : s.p, in ? 16 : 0);
    }
  } else if (s.vec) {
    for (int x = threadIdx.x; x < ROWS * CH; x += NT) {
      const int r = x / CH, c = x % CH * 8;
      const bool in = r < cnt && c < cols;
      cp16(dst + r * P + c, in ? s.p + (r0 + r) * s.rs + c : s.p, in ? 16 : 0);
    }
  } else {
    for (int x = threadIdx.x; x < ROWS * DM; x += NT) {
      const int r = x / DM, c = x % DM;
      dst[r * P + c] = (r < cnt && c < cols) ? s.p[(r0 + r) * s.rs + c * s.cs] : (u16)0;
    }
  }
}

// Tile t of the keys and values (KT rows each, from `sk` and `sv`) into stage t % S of `kvs` (keys,
// then values), committed.
template <int S, int KT, int DM>
__device__ void stage_kv(const AttnArgs& a, const Src& sk, const Src& sv, int t, u16* kvs) {
  constexpr int P = DM + 8;
  u16* ks = kvs + (t % S) * 2 * KT * P;
  const i64 j0 = (i64)t * KT, cnt = min((i64)KT, a.tk - j0);
  stage<KT, DM>(sk, j0, cnt, a.d, ks);
  stage<KT, DM>(sv, j0, cnt, a.d, ks + KT * P);
  cp_commit();
}

// Tiles of KT keys that the query block of `rows` rows at i0 attends to (causal: none past its
// last row).
template <int KT> __device__ int key_tiles(const AttnArgs& a, i64 i0, int rows) {
  const i64 jend = a.causal ? min(a.tk, i0 + rows) : a.tk;
  return (int)((jend + KT - 1) / KT);
}

// lse and delta of the ROWS query rows at i0 from the work area into shared memory (rows past tq:
// lse = +inf, probability 0, and delta = 0).
template <int ROWS, int DM> __device__ void stage_stats(const AttnArgs& a, i64 i0, float* lse, float* delta) {
  for (int x = threadIdx.x; x < 2 * ROWS; x += NT) {
    const int r = x % ROWS;
    const bool is_lse = x < ROWS;
    const i64 i = i0 + r;
    float* dst = is_lse ? lse : delta;
    if (i < a.tq)
      cp4(dst + r, work_lse<DM>(a) + (is_lse ? 0 : (i64)gridDim.x * a.tq) + blockIdx.x * a.tq + i);
    else
      dst[r] = is_lse ? __int_as_float(0x7f800000) : 0.f;
  }
}

// The dropout factor of (i, j), out of line (the Philox rounds would swell every unrolled use).
__device__ __noinline__ float keep_of(const Drop& d, const AttnArgs& a, i64 b, i64 i, i64 j) {
  return kept<float>(d, a, b, i, j);
}

// acc[mt] += A[mt] · rows [k0, k0 + 16) of tile t at columns [c0, c0 + N) for MT slices: each B
// fragment read once serves the MT products.
template <bool BF, int MT, int N, int P>
__device__ void mma_rows_m(float (*acc)[N / 8][4], const u32 (*a)[4], const u16* t, int k0, int c0) {
  const int lane = threadIdx.x & 31;
  const u32 ta = smem_addr(t);
  const int row = (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + c0 + (lane >> 4) * 8;
#pragma unroll
  for (int p = 0; p < N / 16; ++p) {
    u32 b[4];
    ldsm4t(b, ta, row + p * 16);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      H<BF>::mma(acc[mt][2 * p], a[mt], b[0], b[1]);
      H<BF>::mma(acc[mt][2 * p + 1], a[mt], b[2], b[3]);
    }
  }
}

// The A fragments of k-step kk of a 16 x N accumulator (the accumulator's layout is the operand's).
template <bool BF> __device__ void as_a(u32* a, const float (*s)[4], int kk) {
  a[0] = H<BF>::pack(s[2 * kk][0], s[2 * kk][1]);
  a[1] = H<BF>::pack(s[2 * kk][2], s[2 * kk][3]);
  a[2] = H<BF>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = H<BF>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// The additive mask at (i, j) in float32 (0 without one).
template <bool BF> __device__ float mask_at(const AttnArgs& a, const i64* off, i64 i, i64 j) {
  return a.has_mask ? H<BF>::to(((const u16*)a.ptr[M])[off[M] + i * a.rs[M] + j * a.cs[M]]) : 0.f;
}

template <int N> __device__ void zero(float (*x)[4]) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[n][e] = 0.f;
}

// Stores this thread's part of a 16-row accumulator (rows ra and ra + 8, columns
// c0 + 8n + 2(lane % 4) + e), rounded to the input type, into `o` (row stride rs[O]), rows below
// `rows`, columns below d.
template <bool BF, int N>
__device__ void store_rows(const AttnArgs& a, u16* o, const float (*x)[4], i64 ra, i64 rows, int c0) {
  const int t4 = threadIdx.x & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const i64 r = ra + 8 * h;
    if (r >= rows) continue;
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const i64 c = c0 + n * 8 + t4 * 2 + e;
        if (c < a.d) o[r * a.rs[O] + c * a.cs[O]] = H<BF>::from(x[n][2 * h + e]);
      }
  }
}

// The row log-sum-exp in the packed output's pieces (runtime/ir/attention_lse.h: lse =
// (m0 + m1 + m2) 2^e; 0, lse, 0, 0 where it is 0 or not finite), and back.
template <bool BF> __device__ void encode_lse(float lse, u16* p, i64 cs) {
  if (!isfinite(lse) || lse == 0.f) {
    p[0] = H<BF>::from(0.f), p[cs] = H<BF>::from(lse), p[2 * cs] = H<BF>::from(0.f), p[3 * cs] = H<BF>::from(0.f);
    return;
  }
  int e;
  const float f = frexpf(lse, &e);
  const u16 m0 = H<BF>::from(f);
  const float r = f - H<BF>::to(m0);
  const u16 m1 = H<BF>::from(r);
  p[0] = H<BF>::from((float)e), p[cs] = m0, p[2 * cs] = m1, p[3 * cs] = H<BF>::from(r - H<BF>::to(m1));
}
template <bool BF> __device__ float decode_lse(const u16* p, i64 cs) {
  const float m0 = H<BF>::to(p[cs]);
  if (!isfinite(m0) || m0 == 0.f) return m0;
  return ldexpf(m0 + H<BF>::to(p[2 * cs]) + H<BF>::to(p[3 * cs]), (int)H<BF>::to(p[0]));
}
// The packed output's columns (runtime/ir/node.h, attention_packed_width).
__device__ int packed_width(int d) { return (d + 4 + 7) / 8 * 8; }

// The forward's shape for head-size bucket DM: MT 16-row slices per warp (a key fragment read
// from shared memory serves MT products: with one slice the kernel waits on shared memory) and KN
// keys per tile (the score registers); 64 MT query rows per block.
template <int DM> struct Fwd {
  static const int mt = DM <= 128 ? 2 : 1;
  static const int kn = DM <= 64 ? 64 : 32;
};

// log2(e) and ln(2): the softmax runs in base 2 (ex2 without the multiply __expf adds).
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
__device__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// s[mt][n] += (rows x0 + 16 mt of tile x) · (the N rows of tile y)ᵀ over DM columns.
template <bool BF, int MT, int N, int DM>
__device__ void mma_nt_m(float (*s)[N / 8][4], const u16* x, int x0, const u16* y) {
  constexpr int P = DM + 8;
  const int lane = threadIdx.x & 31;
  const u32 xa = smem_addr(x), ya = smem_addr(y);
  const int xrow = (x0 + (lane & 15)) * P + (lane >> 4) * 8;
  const int yrow = ((lane & 7) + (lane >> 4) * 8) * P + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < DM / 16; ++kk) {
    u32 a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldsm4(a[mt], xa, xrow + mt * 16 * P + kk * 16);
#pragma unroll
    for (int p = 0; p < N / 16; ++p) {
      u32 b[4];
      ldsm4(b, ya, yrow + p * 16 * P + kk * 16);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        H<BF>::mma(s[mt][2 * p], a[mt], b[0], b[1]);
        H<BF>::mma(s[mt][2 * p + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Calls f(x, i, j) for every score x (a reference) of this thread in the warp's MT slices of a
// tile: row i (from ra, the thread's first), key j (from the tile's first key j0).
template <int MT, int KN, class Body> __device__ void each_score(float (*s)[KN / 8][4], i64 ra, i64 j0, Body f) {
  const int t4 = threadIdx.x & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < KN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(s[mt][n][e], ra + mt * 16 + (e >> 1) * 8, j0 + n * 8 + t4 * 2 + (e & 1));
}

// Scores in base 2 of the warp's MT slices against a tile of keys at j0: s·scale2, plus the mask,
// -inf where causal hides a key or past tk (PLAIN: none of that applies to the tile).
template <bool PLAIN, bool BF, int MT, int KN>
__device__ void fwd_scores(const AttnArgs& a, const i64* off, float (*s)[KN / 8][4], i64 ra, i64 j0, float scale2) {
  each_score<MT, KN>(s, ra, j0, [&](float& x, i64 i, i64 j) {
    float y = x * scale2;
    if (!PLAIN) {
      if (j >= a.tk || (a.causal && j > i)) y = ninf<float>();
      else if (a.has_mask && i < a.tq) y += mask_at<BF>(a, off, i, j) * LOG2E;
    }
    x = y;
  });
}

// The dropout factors applied to the warp's probabilities of a tile.
template <int MT, int KN>
__device__ void fwd_dropout(const AttnArgs& a, const Drop& drop, float (*s)[KN / 8][4], i64 ra, i64 j0) {
  each_score<MT, KN>(s, ra, j0, [&](float& x, i64 i, i64 j) {
    if (i < a.tq && j < a.tk) x *= keep_of(drop, a, blockIdx.x, i, j);
  });
}

template <bool BF, int DM> __device__ void flash_fwd(const AttnArgs& a) {
  constexpr int P = DM + 8, S = Stages<DM>::n, MT = Fwd<DM>::mt, KN = Fwd<DM>::kn, QM = 64 * MT;
  extern __shared__ __align__(16) unsigned char smem[];
  u16* qs = (u16*)smem;
  u16* kvs = qs + QM * P;  // stage t: k at kvs + t 2 KN P, v after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t4 = lane & 3;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 i0 = (i64)blockIdx.y * QM;
  const i64 rw = i0 + warp * 16 * MT;       // the warp's first row
  const i64 ra = rw + (lane >> 2);          // this thread's rows: ra + 16 mt + 8 h
  const Src sk = src_of(a, off, K), sv = src_of(a, off, V);
  stage<QM, DM>(src_of(a, off, Q), i0, min((i64)QM, a.tq - i0), a.d, qs);
  const int tiles = key_tiles<KN>(a, i0, QM);
  auto issue = [&](int t) { stage_kv<S, KN, DM>(a, sk, sv, t, kvs); };
  stages_begin(tiles, issue);
  float acc[MT][DM / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) zero<DM / 8>(acc[mt]);
  float m[MT][2], l[MT][2];  // running maximum (base 2) and sum of each row
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) m[mt][h] = ninf<float>(), l[mt][h] = 0.f;
  const Drop drop = drop_of(a);
  const float scale2 = (float)a.scale * LOG2E;
  for (int t = 0; t < tiles; ++t) {
    stage_wait<S>(t, tiles, issue);
    const u16* ks = kvs + (t % S) * 2 * KN * P;
    const i64 j0 = (i64)t * KN;
    float s[MT][KN / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) zero<KN / 8>(s[mt]);
    mma_nt_m<BF, MT, KN, DM>(s, qs, warp * 16 * MT, ks);
    // (a tile every row of the warp sees whole, without a mask: no per-element tests; two
    // instances, so that the tests are a branch, not predicated instructions on every tile)
    if (!a.has_mask && j0 + KN <= a.tk && (!a.causal || j0 + KN - 1 <= rw))
      fwd_scores<true, BF, MT, KN>(a, off, s, ra, j0, scale2);
    else
      fwd_scores<false, BF, MT, KN>(a, off, s, ra, j0, scale2);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
      for (int n = 0; n < KN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][n][e]);
      float mu[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        mu[h] = mx[h] == ninf<float>() ? 0.f : mx[h];  // (nothing visible yet: p = 0 everywhere)
        const float alpha = ex2(m[mt][h] - mu[h]);
        l[mt][h] *= alpha;
#pragma unroll
        for (int n = 0; n < DM / 8; ++n) {
          acc[mt][n][2 * h] *= alpha;
          acc[mt][n][2 * h + 1] *= alpha;
        }
        m[mt][h] = mx[h];
      }
#pragma unroll
      for (int n = 0; n < KN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = ex2(s[mt][n][e] - mu[e >> 1]);
          l[mt][e >> 1] += p;  // (the softmax's sum: before dropout)
          s[mt][n][e] = p;
        }
    }
    if (drop.on) fwd_dropout<MT, KN>(a, drop, s, ra, j0);  // (one branch a tile, not one an element)
#pragma unroll
    for (int kk = 0; kk < KN / 16; ++kk) {
      u32 pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) as_a<BF>(pa[mt], s[mt], kk);
      mma_rows_m<BF, MT, DM, P>(acc, pa, ks + KN * P, kk * 16, 0);
    }
    stage_done<S>(t, tiles, issue);
  }
  cp_wait<0>();
  u16* out = (u16*)a.ptr[O] + off[O];
  const int w = packed_width(a.d);
  // (a row that sees no key: 0 / 0, NaN, as the softmax of -inf everywhere; no keys at all: 0)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float lt = l[mt][h];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      const i64 i = ra + mt * 16 + 8 * h;
      if (i >= a.tq) continue;
      const float inv = a.tk == 0 ? 0.f : 1.f / lt;
#pragma unroll
      for (int n = 0; n < DM / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const i64 c = n * 8 + t4 * 2 + e;
          if (c < a.d) out[i * a.rs[O] + c * a.cs[O]] = H<BF>::from(acc[mt][n][2 * h + e] * inv);
        }
      if (t4 == 0) {
        u16* rest = out + i * a.rs[O] + a.d * a.cs[O];
        encode_lse<BF>(m[mt][h] * LN2 + logf(lt), rest, a.cs[O]);
        for (int c = 4; c < w - a.d; ++c) rest[c * a.cs[O]] = 0;
      }
    }
}

// The backward's work area for BM query rows (a warp per row, coalesced): dO (zeros past d), lse
// and delta = dO · O, from the packed 16-bit output and dO (the log-sum-exp gets no gradient).
template <bool BF, int DM> __device__ void flash_bwd_prep(const AttnArgs& a) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 b = blockIdx.x;
  u16* dst = (u16*)a.work + b * a.tq * DM;
  float* lse = work_lse<DM>(a) + b * a.tq;
  float* delta = lse + (i64)gridDim.x * a.tq;
  const u16* fp = (const u16*)a.ptr[F] + off[F];
  const u16* gp = (const u16*)a.ptr[G] + off[G];
  for (int r = warp; r < BM; r += NT / 32) {
    const i64 i = (i64)blockIdx.y * BM + r;
    if (i >= a.tq) break;
    float dot = 0.f;
#pragma unroll
    for (int c0 = 0; c0 < DM; c0 += 32) {
      const i64 c = c0 + lane;
      const u16 g = c < a.d ? gp[i * a.rs[G] + c * a.cs[G]] : (u16)0;
      if (c < a.d) dot += H<BF>::to(g) * H<BF>::to(fp[i * a.rs[F] + c * a.cs[F]]);
      dst[i * DM + c] = g;
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (lane == 0) {
      lse[i] = decode_lse<BF>(fp + i * a.rs[F] + a.d * a.cs[F], a.cs[F]) * LOG2E;  // (base 2: score_grads uses ex2)
      delta[i] = dot;
    }
  }
}

// Probabilities and score gradients of one 16-row slice against one tile: s holds q·kᵀ, dp the
// products dO·vᵀ; on return p̃ (dropout applied) in s and dS = p (dp·keep - delta) scale in dp.
// Rows are queries when BY_KEY is false (row i = r0 + lane/4 + 8h, column j = c0 + 8n +
// 2(lane%4) + e), keys when it is true (the roles swapped); lse (base 2) and delta are indexed by
// the query's place in its tile (stat0 + row, or the column). PLAIN: every entry is live and
// unmasked, without dropout (no per-element tests).
template <bool PLAIN, bool BY_KEY, bool BF, int N>
__device__ void score_grads_as(const AttnArgs& a, const i64* off, const Drop& drop, float (*s)[4], float (*dp)[4],
                               i64 r0, i64 c0, const float* lse, const float* delta, int stat0) {
  const int t4 = threadIdx.x & 3, g = (threadIdx.x & 31) >> 2;
  const float scale = (float)a.scale, scale2 = scale * LOG2E;
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int st = BY_KEY ? n * 8 + t4 * 2 + (e & 1) : stat0 + g + (e >> 1) * 8;
      float p, keep = 1.f;
      if (PLAIN) {
        p = ex2(s[n][e] * scale2 - lse[st]);
      } else {
        const i64 r = r0 + g + (e >> 1) * 8, c = c0 + n * 8 + t4 * 2 + (e & 1);
        const i64 i = BY_KEY ? c : r, j = BY_KEY ? r : c;
        const bool live = i < a.tq && j < a.tk && !(a.causal && j > i);
        p = 0.f, keep = 0.f;
        if (live) {
          p = ex2(s[n][e] * scale2 + (a.has_mask ? mask_at<BF>(a, off, i, j) * LOG2E : 0.f) - lse[st]);
          keep = drop.on ? keep_of(drop, a, blockIdx.x, i, j) : 1.f;
        }
      }
      dp[n][e] = p * (dp[n][e] * keep - delta[st]) * scale;
      s[n][e] = p * keep;
    }
}

template <bool BY_KEY, bool BF, int N>
__device__ void score_grads(const AttnArgs& a, const i64* off, const Drop& drop, float (*s)[4], float (*dp)[4], i64 r0,
                            i64 c0, const float* lse, const float* delta, int stat0) {
  const i64 rlast = r0 + 15, clast = c0 + N - 1;
  const bool plain = !a.has_mask && !drop.on &&
                     (BY_KEY ? rlast < a.tk && clast < a.tq && (!a.causal || rlast <= c0)
                             : rlast < a.tq && clast < a.tk && (!a.causal || clast <= r0));
  if (plain)
    score_grads_as<true, BY_KEY, BF, N>(a, off, drop, s, dp, r0, c0, lse, delta, stat0);
  else
    score_grads_as<false, BY_KEY, BF, N>(a, off, drop, s, dp, r0, c0, lse, delta, stat0);
}

// The backward's shapes for bucket DM: MT 16-row slices per warp (64 MT stationary rows a block)
// and T rows of the streamed side per tile. dq takes two slices up to head size 64; dk/dv one (its
// two accumulators of two slices would not fit in registers), and query tiles of 32 above 64.
template <int DM, bool KV> struct Bwd {
  static const int mt = !KV && DM <= 64 ? 2 : 1;
  static const int t = mt == 2 || (KV && DM > 64) ? 32 : 64;
};

// dk and dv of 64 MT key rows, gradient columns [c0, c0 + DC) (c0 = blockIdx.z DC), over the query
// tiles (Q, dO and their lse / delta in flight while the previous tile is used).
template <bool BF, int DM, int DC> __device__ void flash_bwd_kv(const AttnArgs& a) {
  constexpr int P = DM + 8, S = Stages<DM>::n, MT = Bwd<DM, true>::mt, QT = Bwd<DM, true>::t, KB = 64 * MT;
  extern __shared__ __align__(16) unsigned char smem[];
  u16* ks = (u16*)smem;
  u16* vs = ks + KB * P;
  u16* qgs = vs + KB * P;  // stage t: q at qgs + t 2 QT P, dO after it
  float* stats = (float*)(qgs + S * 2 * QT * P);  // stage t: lse at stats + t 2 QT, delta after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 j0 = (i64)blockIdx.y * KB;
  const int c0 = blockIdx.z * DC;
  stage<KB, DM>(src_of(a, off, K), j0, min((i64)KB, a.tk - j0), a.d, ks);
  stage<KB, DM>(src_of(a, off, V), j0, min((i64)KB, a.tk - j0), a.d, vs);
  const Src sq = src_of(a, off, Q), sg = work_do<DM>(a, blockIdx.x);
  const i64 first = a.causal ? j0 / QT * QT : 0;
  const int tiles = a.tq > first ? (int)((a.tq - first + QT - 1) / QT) : 0;
  auto issue = [&](int t) {
    u16* q = qgs + (t % S) * 2 * QT * P;
    float* st = stats + (t % S) * 2 * QT;
    const i64 i0 = first + (i64)t * QT, cnt = min((i64)QT, a.tq - i0);
    stage<QT, DM>(sq, i0, cnt, a.d, q);
    stage<QT, DM>(sg, i0, cnt, DM, q + QT * P);
    stage_stats<QT, DM>(a, i0, st, st + QT);
    cp_commit();
  };
  stages_begin(tiles, issue);
  float dk[MT][DC / 8][4], dv[MT][DC / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    zero<DC / 8>(dk[mt]);
    zero<DC / 8>(dv[mt]);
  }
  const Drop drop = drop_of(a);
  const i64 jw = j0 + warp * 16 * MT;  // the warp's first key
  for (int t = 0; t < tiles; ++t) {
    stage_wait<S>(t, tiles, issue);
    const u16* qs = qgs + (t % S) * 2 * QT * P;
    const u16* gs = qs + QT * P;
    const float* lse = stats + (t % S) * 2 * QT;
    const i64 i0 = first + (i64)t * QT;
    float st[MT][QT / 8][4], dpt[MT][QT / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      zero<QT / 8>(st[mt]);
      zero<QT / 8>(dpt[mt]);
    }
    mma_nt_m<BF, MT, QT, DM>(st, ks, warp * 16 * MT, qs);
    mma_nt_m<BF, MT, QT, DM>(dpt, vs, warp * 16 * MT, gs);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      score_grads<true, BF, QT>(a, off, drop, st[mt], dpt[mt], jw + mt * 16, i0, lse, lse + QT, 0);
#pragma unroll
    for (int kk = 0; kk < QT / 16; ++kk) {
      u32 pa[MT][4], da[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        as_a<BF>(pa[mt], st[mt], kk);
        as_a<BF>(da[mt], dpt[mt], kk);
      }
      mma_rows_m<BF, MT, DC, P>(dv, pa, gs, kk * 16, c0);
      mma_rows_m<BF, MT, DC, P>(dk, da, qs, kk * 16, c0);
    }
    stage_done<S>(t, tiles, issue);
  }
  cp_wait<0>();
  u16* out = (u16*)a.ptr[O] + off[O];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const i64 ja = jw + mt * 16 + (lane >> 2);
    store_rows<BF, DC / 8>(a, out + a.tq * a.rs[O], dk[mt], ja, a.tk, c0);
    store_rows<BF, DC / 8>(a, out + (a.tq + a.tk) * a.rs[O], dv[mt], ja, a.tk, c0);
  }
}

// dq of 64 MT query rows, gradient columns [c0, c0 + DC), over the key tiles (K, V in flight).
template <bool BF, int DM, int DC> __device__ void flash_bwd_q(const AttnArgs& a) {
  constexpr int P = DM + 8, S = Stages<DM>::n, MT = Bwd<DM, false>::mt, KT = Bwd<DM, false>::t, QB = 64 * MT;
  extern __shared__ __align__(16) unsigned char smem[];
  u16* qs = (u16*)smem;
  u16* gs = qs + QB * P;
  u16* kvs = gs + QB * P;  // stage t: k at kvs + t 2 KT P, v after it
  float* lse = (float*)(kvs + S * 2 * KT * P);
  float* delta = lse + QB;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 i0 = (i64)blockIdx.y * QB;
  const int c0 = blockIdx.z * DC;
  const i64 rows = min((i64)QB, a.tq - i0);
  stage<QB, DM>(src_of(a, off, Q), i0, rows, a.d, qs);
  stage<QB, DM>(work_do<DM>(a, blockIdx.x), i0, rows, DM, gs);
  stage_stats<QB, DM>(a, i0, lse, delta);
  const Src sk = src_of(a, off, K), sv = src_of(a, off, V);
  const int tiles = key_tiles<KT>(a, i0, QB);
  auto issue = [&](int t) { stage_kv<S, KT, DM>(a, sk, sv, t, kvs); };
  stages_begin(tiles, issue);
  float dq[MT][DC / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) zero<DC / 8>(dq[mt]);
  const Drop drop = drop_of(a);
  const int rw = warp * 16 * MT;  // the warp's first row in the block
  for (int t = 0; t < tiles; ++t) {
    stage_wait<S>(t, tiles, issue);
    const u16* ks = kvs + (t % S) * 2 * KT * P;
    float s[MT][KT / 8][4], dp[MT][KT / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      zero<KT / 8>(s[mt]);
      zero<KT / 8>(dp[mt]);
    }
    mma_nt_m<BF, MT, KT, DM>(s, qs, rw, ks);
    mma_nt_m<BF, MT, KT, DM>(dp, gs, rw, ks + KT * P);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      score_grads<false, BF, KT>(a, off, drop, s[mt], dp[mt], i0 + rw + mt * 16, (i64)t * KT, lse, delta,
                                 rw + mt * 16);
#pragma unroll
    for (int kk = 0; kk < KT / 16; ++kk) {
      u32 da[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) as_a<BF>(da[mt], dp[mt], kk);
      mma_rows_m<BF, MT, DC, P>(dq, da, ks, kk * 16, c0);
    }
    stage_done<S>(t, tiles, issue);
  }
  cp_wait<0>();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    store_rows<BF, DC / 8>(a, (u16*)a.ptr[O] + off[O], dq[mt], i0 + rw + mt * 16 + (lane >> 2), a.tq, c0);
}

// Gradient columns per block of head-size bucket DM (mirrored by the host).
template <int DM> struct Cols {
  static const int n = DM <= 128 ? DM : DM / 2;
};

#define KILN_FLASH_flash_fwd(NAME, BF, DM) \
  extern "C" __global__ void __launch_bounds__(NT) NAME(AttnArgs a) { flash_fwd<BF, DM>(a); }
#define KILN_FLASH_flash_bwd_kv(NAME, BF, DM) \
  extern "C" __global__ void __launch_bounds__(NT) NAME(AttnArgs a) { flash_bwd_kv<BF, DM, Cols<DM>::n>(a); }
#define KILN_FLASH_flash_bwd_prep(NAME, BF, DM) \
  extern "C" __global__ void __launch_bounds__(NT) NAME(AttnArgs a) { flash_bwd_prep<BF, DM>(a); }
#define KILN_FLASH_flash_bwd_q(NAME, BF, DM) \
  extern "C" __global__ void __launch_bounds__(NT) NAME(AttnArgs a) { flash_bwd_q<BF, DM, Cols<DM>::n>(a); }
#define KILN_FLASH(NAME, KIND, BF, DM) KILN_FLASH_##KIND(NAME, BF, DM)
)CUDA";

}  // namespace

const char* flash_kernel_source() { return kFlashSource; }

int flash_head_bucket(int64_t d) { return static_cast<int>((d + 31) / 32 * 32); }

int flash_columns(int bucket) { return bucket <= 128 ? bucket : bucket / 2; }

int flash_stages(int bucket) { return bucket <= 128 ? 2 : 1; }

namespace {
// A kernel's shape for a bucket (the source's Fwd and Bwd): stationary rows a block (64 a slice
// per warp) and rows of the streamed side a tile.
struct Shape {
  int64_t rows, streamed;
};
Shape shape_of(DeviceKernel k, int bucket) {
  if (k == DeviceKernel::FlashForward) return {bucket <= 128 ? 128 : 64, bucket <= 64 ? 64 : 32};
  if (k == DeviceKernel::FlashBackwardQ) return bucket <= 64 ? Shape{128, 32} : Shape{64, 64};
  return {64, bucket <= 64 ? 64 : 32};
}
}  // namespace

int64_t flash_shared_bytes(DeviceKernel k, int bucket) {
  const Shape sh = shape_of(k, bucket);
  const int64_t pitch = (bucket + 8) * 2, stages = flash_stages(bucket), streamed = stages * 2 * sh.streamed * pitch;
  switch (k) {
    case DeviceKernel::FlashForward: return sh.rows * pitch + streamed;  // q; k and v a stage
    case DeviceKernel::FlashBackwardKV:  // k, v; q and dO with their lse and delta a stage
      return 2 * sh.rows * pitch + streamed + stages * 2 * sh.streamed * 4;
    case DeviceKernel::FlashBackwardQ:  // q, dO, lse, delta; k and v a stage
      return 2 * sh.rows * pitch + streamed + 2 * sh.rows * 4;
    default: return 0;
  }
}

int flash_rows_per_block(DeviceKernel k, int bucket) {
  return k == DeviceKernel::FlashBackwardPrep ? 64 : static_cast<int>(shape_of(k, bucket).rows);
}

int64_t flash_work_bytes(int64_t batch, int64_t tq, int bucket) { return batch * tq * (2 * bucket + 8); }

}  // namespace kiln::kernels
