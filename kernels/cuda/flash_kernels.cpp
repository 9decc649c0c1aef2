// CUDA source of the tensor-core attention kernels for bfloat16, float16 and float32
// (OpKind::Attention / AttentionBackward; the forward's packed output holds the output rows in the
// input type and the float32 row log-sum-exp: in four exact 16-bit pieces for 16-bit inputs,
// runtime/ir/attention_lse.h). FlashAttention-2's work split on mma.sync (sm_80 and later):
// m16n8k16 for 16-bit inputs, m16n8k8 TF32 for float32 (one pass, or 3xTF32: the element types
// Half and Tf32 below), compiled by NVRTC per instance (element type × head-size bucket ×
// kernel); 4 warps a block, shapes per bucket in Fwd and Bwd below (mirrored by the host's
// shape_of); on Hopper the 16-bit kernels at head sizes 64 and 128 have warpgroup-MMA forms
// (flash_fwd_wg, flash_bwd_kv_wg, flash_bwd_q_wg, below; 3xTF32's scan: flash_scan):
//
//   forward   a block per 128 query rows (64 above head size 128), two 16-row slices a warp;
//             key/value tiles of 64 or 32 rows stream through shared memory (cp.async, two
//             stages up to head size 128); S = Q·Kᵀ and O += P·V on tensor cores with float32
//             accumulators, an online base-2 softmax in registers (P rounded to the operand type
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
// registers. Operand tiles have a row pitch of DM elements and 16 bytes: the 8 rows an ldmatrix
// reads fall in distinct banks. Results are rounded to the input type once, as they are stored.
#include "kernels/cuda/flash_kernels.h"

#include <algorithm>

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
// Four 8 x 8 matrices of 16-bit elements (8 rows of 16 bytes); lane l gives the shared-memory
// address (32-bit) of row l % 8 of matrix l / 8 and gets word l % 4 of row l / 4 of each.
__device__ void ldsm4(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// The same, each matrix transposed.
__device__ void ldsm4t(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
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

// The row log-sum-exp in a 16-bit packed output's pieces (runtime/ir/attention_lse.h: lse =
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

// The element type of an instance (Half<is_bfloat16> or Tf32<passes>): its storage T; the depth KD
// of one tensor-core product; the A fragment (16 x KD) and B fragment (KD x 8) of a product and
// c += a·b; a fragment from ldmatrix words (a_raw, b_raw), from a 16-row float32 accumulator
// (a_acc: k-step kk of it, whose layout is the operand's) and B fragments read by rows of a tile
// (b_rows); COL(t4, e), the key of element e (0, 1) of a score accumulator's 8-column block (the
// streamed side's rows are read in the order that makes a_acc a plain regrouping); the packed
// output's width and its log-sum-exp.
template <bool BF> struct Half {
  typedef u16 T;
  static const bool bf = BF;
  static const int KD = 16;
  static const bool PERM = false;  // (the accumulator's columns 2 t4, 2 t4 + 1 are the A fragment's)
  struct A {
    u32 r[4];
  };
  struct B {
    u32 r[2];
  };
  template <bool FINITE> static __device__ void mma(float* c, const A& a, const B& b) {
    H<BF>::mma(c, a.r, b.r[0], b.r[1]);
  }
  static const bool CHECKS = false;  // (products of 16-bit operands keep IEEE's infinities)
  static const bool GATED = false, CAREFUL = false;
  static __device__ A a_raw(const u32* r) {
    A a = {{r[0], r[1], r[2], r[3]}};
    return a;
  }
  static __device__ B b_raw(u32 r0, u32 r1) {
    B b = {{r0, r1}};
    return b;
  }
  static __device__ A a_acc(const float (*s)[4], int kk) {
    A a = {{H<BF>::pack(s[2 * kk][0], s[2 * kk][1]), H<BF>::pack(s[2 * kk][2], s[2 * kk][3]),
            H<BF>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), H<BF>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])}};
    return a;
  }
  // Rows [k0, k0 + 16) at columns [c, c + 8) and [c + 8, c + 16) of tile t (pitch P): ldmatrix, transposed.
  static __device__ void b_rows(B& b0, B& b1, const T* t, int P, int k0, int c) {
    const int lane = threadIdx.x & 31;
    u32 r[4];
    ldsm4t(r, smem_addr(t + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + c + (lane >> 4) * 8));
    b0 = b_raw(r[0], r[1]);
    b1 = b_raw(r[2], r[3]);
  }
  static __device__ int col(int t4, int e) { return 2 * t4 + e; }
  static __device__ float to(T h) { return H<BF>::to(h); }
  static __device__ T from(float x) { return H<BF>::from(x); }
  static __device__ int packed_width(int d) { return (d + 4 + 7) / 8 * 8; }  // (runtime/ir/node.h)
  static __device__ void put_lse(float lse, T* p, i64 cs, int w) {
    encode_lse<BF>(lse, p, cs);
    for (int c = 4; c < w; ++c) p[c * cs] = 0;
  }
  static __device__ float get_lse(const T* p, i64 cs) { return decode_lse<BF>(p, cs); }
};

// float32 on tensor cores: m16n8k8 products of TF32 operands (rounded to nearest from float32);
// with three passes each operand is split into a TF32 head and the TF32 rounding of its rest, and
// the product adds rest·head, head·rest and head·head (3xTF32: float32-accurate, as PyTorch's
// float32 attention on sm_80+; mma says how infinities keep IEEE's answers). The streamed side's
// rows are read in the order 0 4 1 5 2 6 3 7 of each 8 (ldmatrix's row addresses), so that a
// score accumulator's elements e of column block n hold keys 8n + t4 and 8n + t4 + 4: the A
// fragment of the next product.
//
// 3xTF32 runs as two kernels after a scan of the inputs (flash_scan): the fast one (Tf32<3>:
// plain three passes, the code of a kernel with no checks) when every input is finite, the
// careful one (Tf32Careful: each tile checked, see mma) otherwise; the other returns at once.
template <int S, bool CAREFUL_ = false> struct Tf32 {
  typedef float T;
  static const int KD = 8;
  static const bool PERM = true;
  struct A {
    u32 hi[4], lo[4];  // (lo: three passes only)
  };
  struct B {
    u32 hi[2], lo[2];
  };
  static __device__ u32 rna(float x) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
  }
  static __device__ void split(float x, u32& hi, u32& lo) {
    hi = rna(x);
    if (S == 3) lo = rna(x - __uint_as_float(hi));  // (NaN for an infinity: see mma)
  }
  static __device__ void mma1(float* c, const u32* a, const u32* b) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  // c += a·b. Three passes on finite operands (FINITE): the rest terms, then head·head. Else an
  // infinite operand's rest is NaN and a finite one's may be 0 or of the other sign (NaN or
  // inf - inf where IEEE's x·y is ±inf): head·head as is, the rest terms with every infinite or
  // NaN head and rest taken as 0, so that those reach c through head·head alone, as IEEE's.
  static __device__ u32 fin(u32 x) { return (x & 0x7f800000u) == 0x7f800000u ? 0u : x; }
  template <bool FINITE> static __device__ void mma(float* c, const A& a, const B& b) {
    if (S == 3 && FINITE) {
      mma1(c, a.lo, b.hi);
      mma1(c, a.hi, b.lo);
    }
    mma1(c, a.hi, b.hi);
    if (S == 3 && !FINITE) {
      const u32 ah[4] = {fin(a.hi[0]), fin(a.hi[1]), fin(a.hi[2]), fin(a.hi[3])};
      const u32 al[4] = {fin(a.lo[0]), fin(a.lo[1]), fin(a.lo[2]), fin(a.lo[3])};
      const u32 bh[2] = {fin(b.hi[0]), fin(b.hi[1])}, bl[2] = {fin(b.lo[0]), fin(b.lo[1])};
      mma1(c, al, bh);
      mma1(c, ah, bl);
    }
  }
  // Whether the kernels check their tiles for infinities and NaN (the careful three-pass form);
  // whether they run by the scan's answer (GATED), and which answer they take.
  static const bool CHECKS = S == 3 && CAREFUL_;
  static const bool GATED = S == 3, CAREFUL = CAREFUL_;
  static __device__ A a_of(float x0, float x1, float x2, float x3) {
    A a;
    split(x0, a.hi[0], a.lo[0]);
    split(x1, a.hi[1], a.lo[1]);
    split(x2, a.hi[2], a.lo[2]);
    split(x3, a.hi[3], a.lo[3]);
    return a;
  }
  static __device__ B b_of(float x0, float x1) {
    B b;
    split(x0, b.hi[0], b.lo[0]);
    split(x1, b.hi[1], b.lo[1]);
    return b;
  }
  static __device__ A a_raw(const u32* r) {
    return a_of(__uint_as_float(r[0]), __uint_as_float(r[1]), __uint_as_float(r[2]), __uint_as_float(r[3]));
  }
  static __device__ B b_raw(u32 r0, u32 r1) { return b_of(__uint_as_float(r0), __uint_as_float(r1)); }
  static __device__ A a_acc(const float (*s)[4], int kk) { return a_of(s[kk][0], s[kk][2], s[kk][1], s[kk][3]); }
  // Rows [k0, k0 + 8) at columns [c, c + 8) and [c + 8, c + 16) of tile t (pitch P): b0 = (k0 + t4,
  // c + g), b1 = (k0 + t4 + 4, c + g), plain 32-bit loads (ldmatrix cannot transpose 32-bit words).
  static __device__ void b_rows(B& b0, B& b1, const T* t, int P, int k0, int c) {
    const int lane = threadIdx.x & 31;
    const T* p = t + (k0 + (lane & 3)) * P + c + (lane >> 2);
    b0 = b_of(p[0], p[4 * P]);
    b1 = b_of(p[8], p[4 * P + 8]);
  }
  static __device__ int col(int t4, int e) { return t4 + 4 * e; }
  static __device__ float to(T x) { return x; }
  static __device__ T from(float x) { return x; }
  static __device__ int packed_width(int d) { return d + 1; }
  static __device__ void put_lse(float lse, T* p, i64, int) { p[0] = lse; }
  static __device__ float get_lse(const T* p, i64) { return p[0]; }
};
typedef Tf32<3, true> Tf32Careful;  // (a name without a comma, for the instancing macro)

// Whether a gated kernel (3xTF32) leaves this call to its other form: the scan's answer is not
// the one it takes.
template <class E> __device__ bool gated_out(const AttnArgs& a) { return E::GATED && ((*a.nonfinite != 0) != E::CAREFUL); }

#define BM 64   // query rows of a prep block
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

// A shared tile's row pitch: DM and 16 bytes (the 8 rows an ldmatrix reads fall in distinct banks).
template <class T, int DM> struct Pitch {
  static const int p = DM + 16 / (int)sizeof(T);
};

// A matrix read by rows: its first row, row and column strides, whether 16-byte copies apply
// (unit column stride, rows and address aligned to 16 bytes).
template <class T> struct Src {
  const T* p;
  i64 rs, cs;
  int vec;
};
template <class T> __device__ Src<T> src_of(const AttnArgs& a, const i64* off, int k) {
  Src<T> s = {(const T*)a.ptr[k] + off[k], a.rs[k], a.cs[k], a.vec[k]};
  return s;
}

// The backward's work area (filled by flash_bwd_prep): dO in the input type, [batch][tq][DM]
// (zeros past d), then lse and delta, [batch][tq] float32 each.
template <class T, int DM> __device__ Src<T> work_do(const AttnArgs& a, i64 b) {
  Src<T> s = {(const T*)a.work + b * a.tq * DM, DM, 1, 1};
  return s;
}
template <class T, int DM> __device__ float* work_lse(const AttnArgs& a) {
  return (float*)((T*)a.work + (i64)gridDim.x * a.tq * DM);
}

// Rows [r0, r0 + cnt) of `s`, columns [0, DM), into `dst` (pitch Pitch); zeros past the rows and
// past `cols`. Asynchronous 16-byte copies where `s` allows them, else plain stores.
template <int ROWS, int DM, class T> __device__ void stage(const Src<T>& s, i64 r0, i64 cnt, i64 cols, T* dst) {
  constexpr int P = Pitch<T, DM>::p;
  constexpr int EC = 16 / (int)sizeof(T);  // elements of a 16-byte chunk
  constexpr int CH = DM / EC;              // chunks of a row
  if (s.vec && NT % CH == 0) {  // (each thread keeps one column and steps over rows)
    constexpr int STEP = NT / CH;
    const int c = threadIdx.x % CH * EC, rt = threadIdx.x / CH;
    const T* src = s.p + (r0 + rt) * s.rs + c;
    T* d = dst + rt * P + c;
    const bool col = c < cols;
#pragma unroll
    for (int k = 0; k < ROWS / STEP; ++k) {
      const bool in = col && rt + k * STEP < cnt;
      cp16(d + k * STEP * P, in ? src + k * STEP * s.rs : s.p, in ? 16 : 0);
    }
  } else if (s.vec) {
    for (int x = threadIdx.x; x < ROWS * CH; x += NT) {
      const int r = x / CH, c = x % CH * EC;
      const bool in = r < cnt && c < cols;
      cp16(dst + r * P + c, in ? s.p + (r0 + r) * s.rs + c : s.p, in ? 16 : 0);
    }
  } else {
    for (int x = threadIdx.x; x < ROWS * DM; x += NT) {
      const int r = x / DM, c = x % DM;
      dst[r * P + c] = (r < cnt && c < cols) ? s.p[(r0 + r) * s.rs + c * s.cs] : (T)0;
    }
  }
}

// Tile t of the keys and values (KT rows each, from `sk` and `sv`) into stage t % S of `kvs` (keys,
// then values), committed.
template <int S, int KT, int DM, class T>
__device__ void stage_kv(const AttnArgs& a, const Src<T>& sk, const Src<T>& sv, int t, T* kvs) {
  constexpr int P = Pitch<T, DM>::p;
  T* ks = kvs + (t % S) * 2 * KT * P;
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
template <int ROWS, int DM, class T> __device__ void stage_stats(const AttnArgs& a, i64 i0, float* lse, float* delta) {
  for (int x = threadIdx.x; x < 2 * ROWS; x += NT) {
    const int r = x % ROWS;
    const bool is_lse = x < ROWS;
    const i64 i = i0 + r;
    float* dst = is_lse ? lse : delta;
    if (i < a.tq)
      cp4(dst + r, work_lse<T, DM>(a) + (is_lse ? 0 : (i64)gridDim.x * a.tq) + blockIdx.x * a.tq + i);
    else
      dst[r] = is_lse ? __int_as_float(0x7f800000) : 0.f;
  }
}

// The dropout factor of (i, j), out of line (the Philox rounds would swell every unrolled use).
__device__ __noinline__ float keep_of(const Drop& d, const AttnArgs& a, i64 b, i64 i, i64 j) {
  return kept<float>(d, a, b, i, j);
}

// acc[mt] += a[mt] · rows [k0, k0 + KD) of tile t at columns [c0, c0 + N) for MT slices: each B
// fragment read once serves the MT products (FINITE: E::mma's, the operands all finite).
template <class E, bool FINITE, int MT, int N, int P>
__device__ void mma_rows_as(float (*acc)[N / 8][4], const typename E::A* a, const typename E::T* t, int k0, int c0) {
#pragma unroll
  for (int p = 0; p < N / 16; ++p) {
    typename E::B b0, b1;
    E::b_rows(b0, b1, t, P, k0, c0 + p * 16);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      E::template mma<FINITE>(acc[mt][2 * p], a[mt], b0);
      E::template mma<FINITE>(acc[mt][2 * p + 1], a[mt], b1);
    }
  }
}
template <class E, int MT, int N, int P>
__device__ void mma_rows_m(bool finite, float (*acc)[N / 8][4], const typename E::A* a, const typename E::T* t, int k0,
                           int c0) {
  if (finite) mma_rows_as<E, true, MT, N, P>(acc, a, t, k0, c0);
  else mma_rows_as<E, false, MT, N, P>(acc, a, t, k0, c0);
}

// Whether rows [0, ROWS) x columns [0, DM) of a float32 shared tile hold an infinity or NaN: this
// thread's share (the block's answer: __syncthreads_or of every thread's).
template <int ROWS, int DM, class T> __device__ bool nonfinite_part(const T* tile) {
  constexpr int P = Pitch<T, DM>::p, EC = 16 / (int)sizeof(T), CH = DM / EC;
  u32 bad = 0;
  for (int x = threadIdx.x; x < ROWS * CH; x += NT) {
    const uint4 w = *(const uint4*)(tile + x / CH * P + x % CH * EC);
    const u32 e = 0x7f800000u;  // (the exponent all ones)
    bad |= ((w.x & e) == e) | ((w.y & e) == e) | ((w.z & e) == e) | ((w.w & e) == e);
  }
  return bad != 0;
}

// Whether the products of a tile may take E::mma's FINITE form: always for 16-bit and one-pass
// TF32; for 3xTF32 when the block's stationary rows (`stationary_bad`, the block's answer) and
// the tile's ROWS rows at `tile` hold no infinity or NaN.
template <class E, int ROWS, int DM>
__device__ bool tile_finite(bool stationary_bad, const typename E::T* tile) {
  if (!E::CHECKS) return true;
  return !__syncthreads_or(stationary_bad || nonfinite_part<ROWS, DM>(tile));
}
// The block's answer for its stationary rows (3xTF32; false elsewhere).
template <class E, int ROWS, int DM> __device__ bool stationary_nonfinite(const typename E::T* rows) {
  return E::CHECKS && __syncthreads_or(nonfinite_part<ROWS, DM>(rows));
}

// The additive mask at (i, j) in float32 (0 without one).
template <class E> __device__ float mask_at(const AttnArgs& a, const i64* off, i64 i, i64 j) {
  return a.has_mask ? E::to(((const typename E::T*)a.ptr[M])[off[M] + i * a.rs[M] + j * a.cs[M]]) : 0.f;
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
template <class E, int N>
__device__ void store_rows(const AttnArgs& a, typename E::T* o, const float (*x)[4], i64 ra, i64 rows, int c0) {
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
        if (c < a.d) o[r * a.rs[O] + c * a.cs[O]] = E::from(x[n][2 * h + e]);
      }
  }
}

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

// s[mt][n] += (rows x0 + 16 mt of tile x) · (the N rows of tile y)ᵀ over DM columns (tile y's rows
// in E's order within each 8; FINITE: E::mma's).
template <class E, bool FINITE, int MT, int N, int DM>
__device__ void mma_nt_as(float (*s)[N / 8][4], const typename E::T* x, int x0, const typename E::T* y) {
  constexpr int RB = Pitch<typename E::T, DM>::p * (int)sizeof(typename E::T);  // bytes a row
  const int lane = threadIdx.x & 31;
  const int yr = E::PERM ? ((lane & 7) >> 1) | ((lane & 1) << 2) : lane & 7;
  const u32 xa = smem_addr(x) + (x0 + (lane & 15)) * RB + (lane >> 4) * 16;
  const u32 ya = smem_addr(y) + (yr + (lane >> 4) * 8) * RB + ((lane >> 3) & 1) * 16;
#pragma unroll
  for (int kk = 0; kk < DM * (int)sizeof(typename E::T) / 32; ++kk) {  // (32 bytes: KD columns)
    typename E::A a[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      u32 r[4];
      ldsm4(r, xa + mt * 16 * RB + kk * 32);
      a[mt] = E::a_raw(r);
    }
#pragma unroll
    for (int p = 0; p < N / 16; ++p) {
      u32 r[4];
      ldsm4(r, ya + p * 16 * RB + kk * 32);
      const typename E::B b0 = E::b_raw(r[0], r[1]), b1 = E::b_raw(r[2], r[3]);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        E::template mma<FINITE>(s[mt][2 * p], a[mt], b0);
        E::template mma<FINITE>(s[mt][2 * p + 1], a[mt], b1);
      }
    }
  }
}
template <class E, int MT, int N, int DM>
__device__ void mma_nt_m(bool finite, float (*s)[N / 8][4], const typename E::T* x, int x0, const typename E::T* y) {
  if (finite) mma_nt_as<E, true, MT, N, DM>(s, x, x0, y);
  else mma_nt_as<E, false, MT, N, DM>(s, x, x0, y);
}

// Calls f(x, i, j) for every score x (a reference) of this thread in the warp's MT slices of a
// tile: row i (from ra, the thread's first), key j (from the tile's first key j0).
template <class E, int MT, int KN, class Body>
__device__ void each_score(float (*s)[KN / 8][4], i64 ra, i64 j0, Body f) {
  const int t4 = threadIdx.x & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < KN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(s[mt][n][e], ra + mt * 16 + (e >> 1) * 8, j0 + n * 8 + E::col(t4, e & 1));
}

// Scores in base 2 of the warp's MT slices against a tile of keys at j0: s·scale2, plus the mask,
// -inf where causal hides a key or past tk (PLAIN: none of that applies to the tile).
template <bool PLAIN, class E, int MT, int KN>
__device__ void fwd_scores(const AttnArgs& a, const i64* off, float (*s)[KN / 8][4], i64 ra, i64 j0, float scale2) {
  each_score<E, MT, KN>(s, ra, j0, [&](float& x, i64 i, i64 j) {
    float y = x * scale2;
    if (!PLAIN) {
      if (j >= a.tk || (a.causal && j > i)) y = ninf<float>();
      else if (a.has_mask && i < a.tq) y += mask_at<E>(a, off, i, j) * LOG2E;
    }
    x = y;
  });
}

// The dropout factors applied to the warp's probabilities of a tile.
template <class E, int MT, int KN>
__device__ void fwd_dropout(const AttnArgs& a, const Drop& drop, float (*s)[KN / 8][4], i64 ra, i64 j0) {
  each_score<E, MT, KN>(s, ra, j0, [&](float& x, i64 i, i64 j) {
    if (i < a.tq && j < a.tk) x *= keep_of(drop, a, blockIdx.x, i, j);
  });
}

// Stores a forward's 16 rows (this thread's: ra and ra + 8) from their accumulator (DM / 8
// column blocks), running maximum m (base 2) and sum l (this thread's part of each row's): the
// output rows, rounded to the input type, and their log-sum-exp, into the packed output `out` of
// width w; t4 = lane % 4 (a row that sees no key: 0 / 0, NaN, as the softmax of -inf everywhere;
// no keys at all: 0).
template <class E, int DM>
__device__ __forceinline__ void store_fwd_rows(const AttnArgs& a, typename E::T* out, int w, int t4,
                                               const float (*acc)[4], const float* m, const float* l, i64 ra) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float lt = l[h];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const i64 i = ra + 8 * h;
    if (i >= a.tq) continue;
    const float inv = a.tk == 0 ? 0.f : 1.f / lt;
#pragma unroll
    for (int n = 0; n < DM / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const i64 c = n * 8 + t4 * 2 + e;
        if (c < a.d) out[i * a.rs[O] + c * a.cs[O]] = E::from(acc[n][2 * h + e] * inv);
      }
    if (t4 == 0) E::put_lse(m[h] * LN2 + logf(lt), out + i * a.rs[O] + a.d * a.cs[O], a.cs[O], w - (int)a.d);
  }
}

template <class E, int DM> __device__ void flash_fwd(const AttnArgs& a) {
  if (gated_out<E>(a)) return;
  typedef typename E::T T;
  constexpr int P = Pitch<T, DM>::p, S = Stages<DM>::n, MT = Fwd<DM>::mt, KN = Fwd<DM>::kn, QM = 64 * MT;
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = (T*)smem;
  T* kvs = qs + QM * P;  // stage t: k at kvs + t 2 KN P, v after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t4 = lane & 3;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 i0 = (i64)blockIdx.y * QM;
  const i64 rw = i0 + warp * 16 * MT;       // the warp's first row
  const i64 ra = rw + (lane >> 2);          // this thread's rows: ra + 16 mt + 8 h
  const Src<T> sk = src_of<T>(a, off, K), sv = src_of<T>(a, off, V);
  stage<QM, DM>(src_of<T>(a, off, Q), i0, min((i64)QM, a.tq - i0), a.d, qs);
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
  bool q_bad = false;  // (3xTF32: an infinity or NaN among the block's query rows)
  for (int t = 0; t < tiles; ++t) {
    stage_wait<S>(t, tiles, issue);
    const T* ks = kvs + (t % S) * 2 * KN * P;
    const i64 j0 = (i64)t * KN;
    if (t == 0) q_bad = stationary_nonfinite<E, QM, DM>(qs);
    const bool finite = tile_finite<E, 2 * KN, DM>(q_bad, ks);
    float s[MT][KN / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) zero<KN / 8>(s[mt]);
    mma_nt_m<E, MT, KN, DM>(finite, s, qs, warp * 16 * MT, ks);
    // (a tile every row of the warp sees whole, without a mask: no per-element tests; two
    // instances, so that the tests are a branch, not predicated instructions on every tile)
    if (!a.has_mask && j0 + KN <= a.tk && (!a.causal || j0 + KN - 1 <= rw))
      fwd_scores<true, E, MT, KN>(a, off, s, ra, j0, scale2);
    else
      fwd_scores<false, E, MT, KN>(a, off, s, ra, j0, scale2);
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
    if (drop.on) fwd_dropout<E, MT, KN>(a, drop, s, ra, j0);  // (one branch a tile, not one an element)
#pragma unroll
    for (int kk = 0; kk < KN / E::KD; ++kk) {
      typename E::A pa[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) pa[mt] = E::a_acc(s[mt], kk);
      mma_rows_m<E, MT, DM, P>(finite, acc, pa, ks + KN * P, kk * E::KD, 0);
    }
    stage_done<S>(t, tiles, issue);
  }
  cp_wait<0>();
  T* out = (T*)a.ptr[O] + off[O];
  const int w = E::packed_width(a.d);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) store_fwd_rows<E, DM>(a, out, w, t4, acc[mt], m[mt], l[mt], ra + mt * 16);
}

// The backward's work area for BM query rows (a warp per row, coalesced): dO (zeros past d), lse
// and delta = dO · O - dLSE (dLSE: the log-sum-exp's gradient, column d of a float32 gout; 16-bit
// nodes take dO alone), from the packed output and its gradient.
template <class E, int DM> __device__ void flash_bwd_prep(const AttnArgs& a) {
  typedef typename E::T T;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 b = blockIdx.x;
  T* dst = (T*)a.work + b * a.tq * DM;
  float* lse = work_lse<T, DM>(a) + b * a.tq;
  float* delta = lse + (i64)gridDim.x * a.tq;
  const T* fp = (const T*)a.ptr[F] + off[F];
  const T* gp = (const T*)a.ptr[G] + off[G];
  for (int r = warp; r < BM; r += NT / 32) {
    const i64 i = (i64)blockIdx.y * BM + r;
    if (i >= a.tq) break;
    float dot = 0.f;
#pragma unroll
    for (int c0 = 0; c0 < DM; c0 += 32) {
      const i64 c = c0 + lane;
      const T g = c < a.d ? gp[i * a.rs[G] + c * a.cs[G]] : (T)0;
      if (c < a.d) dot += E::to(g) * E::to(fp[i * a.rs[F] + c * a.cs[F]]);
      dst[i * DM + c] = g;
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (lane == 0) {
      lse[i] = E::get_lse(fp + i * a.rs[F] + a.d * a.cs[F], a.cs[F]) * LOG2E;  // (base 2: score_grads uses ex2)
      delta[i] = a.glse ? dot - E::to(gp[i * a.rs[G] + a.d * a.cs[G]]) : dot;
    }
  }
}

// Probabilities and score gradients of one 16-row slice against one tile: s holds q·kᵀ, dp the
// products dO·vᵀ; on return p̃ (dropout applied) in s and dS = p (dp·keep - delta) scale in dp.
// Rows are queries when BY_KEY is false (row i = r0 + lane/4 + 8h, column j = c0 + 8n +
// E::col(lane%4, e)), keys when it is true (the roles swapped); lse (base 2) and delta are indexed
// by the query's place in its tile (stat0 + row, or the column); b: the batch element. PLAIN: every
// entry is live and unmasked, without dropout (no per-element tests).
template <bool PLAIN, bool BY_KEY, class E, int N>
__device__ void score_grads_as(const AttnArgs& a, const i64* off, const Drop& drop, float (*s)[4], float (*dp)[4],
                               i64 r0, i64 c0, const float* lse, const float* delta, int stat0, i64 b) {
  const int t4 = threadIdx.x & 3, g = (threadIdx.x & 31) >> 2;
  const float scale = (float)a.scale, scale2 = scale * LOG2E;
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int cn = n * 8 + E::col(t4, e & 1);
      const int st = BY_KEY ? cn : stat0 + g + (e >> 1) * 8;
      float p, keep = 1.f;
      if (PLAIN) {
        p = ex2(s[n][e] * scale2 - lse[st]);
      } else {
        const i64 r = r0 + g + (e >> 1) * 8, c = c0 + cn;
        const i64 i = BY_KEY ? c : r, j = BY_KEY ? r : c;
        const bool live = i < a.tq && j < a.tk && !(a.causal && j > i);
        p = 0.f, keep = 0.f;
        if (live) {
          p = ex2(s[n][e] * scale2 + (a.has_mask ? mask_at<E>(a, off, i, j) * LOG2E : 0.f) - lse[st]);
          keep = drop.on ? keep_of(drop, a, b, i, j) : 1.f;
        }
      }
      dp[n][e] = p * (dp[n][e] * keep - delta[st]) * scale;
      s[n][e] = p * keep;
    }
}

template <bool BY_KEY, class E, int N>
__device__ void score_grads(const AttnArgs& a, const i64* off, const Drop& drop, float (*s)[4], float (*dp)[4], i64 r0,
                            i64 c0, const float* lse, const float* delta, int stat0, i64 b) {
  const i64 rlast = r0 + 15, clast = c0 + N - 1;
  const bool plain = !a.has_mask && !drop.on &&
                     (BY_KEY ? rlast < a.tk && clast < a.tq && (!a.causal || rlast <= c0)
                             : rlast < a.tq && clast < a.tk && (!a.causal || clast <= r0));
  if (plain)
    score_grads_as<true, BY_KEY, E, N>(a, off, drop, s, dp, r0, c0, lse, delta, stat0, b);
  else
    score_grads_as<false, BY_KEY, E, N>(a, off, drop, s, dp, r0, c0, lse, delta, stat0, b);
}

// The backward's shapes for bucket DM and element size SZ: MT 16-row slices per warp (64 MT
// stationary rows a block) and T rows of the streamed side per tile. dq takes two slices up to
// head size 64; dk/dv one (its two accumulators of two slices would not fit in registers), and
// 32-row tiles above 64 (dq too in float32: shared memory).
template <int DM, bool KV, int SZ> struct Bwd {
  static const int mt = !KV && DM <= 64 ? 2 : 1;
  static const int t = mt == 2 || (DM > 64 && (KV || SZ == 4)) ? 32 : 64;
};

// dk and dv of 64 MT key rows, gradient columns [c0, c0 + DC) (c0 = blockIdx.z DC), over the query
// tiles (Q, dO and their lse / delta in flight while the previous tile is used).
template <class E, int DM, int DC> __device__ void flash_bwd_kv(const AttnArgs& a) {
  if (gated_out<E>(a)) return;
  typedef typename E::T T;
  typedef Bwd<DM, true, sizeof(T)> Sh;
  constexpr int P = Pitch<T, DM>::p, S = Stages<DM>::n, MT = Sh::mt, QT = Sh::t, KB = 64 * MT;
  extern __shared__ __align__(16) unsigned char smem[];
  T* ks = (T*)smem;
  T* vs = ks + KB * P;
  T* qgs = vs + KB * P;  // stage t: q at qgs + t 2 QT P, dO after it
  float* stats = (float*)(qgs + S * 2 * QT * P);  // stage t: lse at stats + t 2 QT, delta after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 j0 = (i64)blockIdx.y * KB;
  const int c0 = blockIdx.z * DC;
  stage<KB, DM>(src_of<T>(a, off, K), j0, min((i64)KB, a.tk - j0), a.d, ks);
  stage<KB, DM>(src_of<T>(a, off, V), j0, min((i64)KB, a.tk - j0), a.d, vs);
  const Src<T> sq = src_of<T>(a, off, Q), sg = work_do<T, DM>(a, blockIdx.x);
  const i64 first = a.causal ? j0 / QT * QT : 0;
  const int tiles = a.tq > first ? (int)((a.tq - first + QT - 1) / QT) : 0;
  auto issue = [&](int t) {
    T* q = qgs + (t % S) * 2 * QT * P;
    float* st = stats + (t % S) * 2 * QT;
    const i64 i0 = first + (i64)t * QT, cnt = min((i64)QT, a.tq - i0);
    stage<QT, DM>(sq, i0, cnt, a.d, q);
    stage<QT, DM>(sg, i0, cnt, DM, q + QT * P);
    stage_stats<QT, DM, T>(a, i0, st, st + QT);
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
  bool kv_bad = false;  // (3xTF32: an infinity or NaN among the block's keys and values)
  for (int t = 0; t < tiles; ++t) {
    stage_wait<S>(t, tiles, issue);
    const T* qs = qgs + (t % S) * 2 * QT * P;
    const T* gs = qs + QT * P;
    const float* lse = stats + (t % S) * 2 * QT;
    const i64 i0 = first + (i64)t * QT;
    if (t == 0) kv_bad = stationary_nonfinite<E, 2 * KB, DM>(ks);
    const bool finite = tile_finite<E, 2 * QT, DM>(kv_bad, qs);
    float st[MT][QT / 8][4], dpt[MT][QT / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      zero<QT / 8>(st[mt]);
      zero<QT / 8>(dpt[mt]);
    }
    mma_nt_m<E, MT, QT, DM>(finite, st, ks, warp * 16 * MT, qs);
    mma_nt_m<E, MT, QT, DM>(finite, dpt, vs, warp * 16 * MT, gs);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      score_grads<true, E, QT>(a, off, drop, st[mt], dpt[mt], jw + mt * 16, i0, lse, lse + QT, 0, blockIdx.x);
#pragma unroll
    for (int kk = 0; kk < QT / E::KD; ++kk) {
      typename E::A pa[MT], da[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt] = E::a_acc(st[mt], kk);
        da[mt] = E::a_acc(dpt[mt], kk);
      }
      mma_rows_m<E, MT, DC, P>(finite, dv, pa, gs, kk * E::KD, c0);
      mma_rows_m<E, MT, DC, P>(finite, dk, da, qs, kk * E::KD, c0);
    }
    stage_done<S>(t, tiles, issue);
  }
  cp_wait<0>();
  T* out = (T*)a.ptr[O] + off[O];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const i64 ja = jw + mt * 16 + (lane >> 2);
    store_rows<E, DC / 8>(a, out + a.tq * a.rs[O], dk[mt], ja, a.tk, c0);
    store_rows<E, DC / 8>(a, out + (a.tq + a.tk) * a.rs[O], dv[mt], ja, a.tk, c0);
  }
}

// dq of 64 MT query rows, gradient columns [c0, c0 + DC), over the key tiles (K, V in flight).
template <class E, int DM, int DC> __device__ void flash_bwd_q(const AttnArgs& a) {
  if (gated_out<E>(a)) return;
  typedef typename E::T T;
  typedef Bwd<DM, false, sizeof(T)> Sh;
  constexpr int P = Pitch<T, DM>::p, S = Stages<DM>::n, MT = Sh::mt, KT = Sh::t, QB = 64 * MT;
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = (T*)smem;
  T* gs = qs + QB * P;
  T* kvs = gs + QB * P;  // stage t: k at kvs + t 2 KT P, v after it
  float* lse = (float*)(kvs + S * 2 * KT * P);
  float* delta = lse + QB;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const i64 i0 = (i64)blockIdx.y * QB;
  const int c0 = blockIdx.z * DC;
  const i64 rows = min((i64)QB, a.tq - i0);
  stage<QB, DM>(src_of<T>(a, off, Q), i0, rows, a.d, qs);
  stage<QB, DM>(work_do<T, DM>(a, blockIdx.x), i0, rows, DM, gs);
  stage_stats<QB, DM, T>(a, i0, lse, delta);
  const Src<T> sk = src_of<T>(a, off, K), sv = src_of<T>(a, off, V);
  const int tiles = key_tiles<KT>(a, i0, QB);
  auto issue = [&](int t) { stage_kv<S, KT, DM>(a, sk, sv, t, kvs); };
  stages_begin(tiles, issue);
  float dq[MT][DC / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) zero<DC / 8>(dq[mt]);
  const Drop drop = drop_of(a);
  const int rw = warp * 16 * MT;  // the warp's first row in the block
  bool qg_bad = false;  // (3xTF32: an infinity or NaN among the block's q and dO rows)
  for (int t = 0; t < tiles; ++t) {
    stage_wait<S>(t, tiles, issue);
    const T* ks = kvs + (t % S) * 2 * KT * P;
    if (t == 0) qg_bad = stationary_nonfinite<E, 2 * QB, DM>(qs);
    const bool finite = tile_finite<E, 2 * KT, DM>(qg_bad, ks);
    float s[MT][KT / 8][4], dp[MT][KT / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      zero<KT / 8>(s[mt]);
      zero<KT / 8>(dp[mt]);
    }
    mma_nt_m<E, MT, KT, DM>(finite, s, qs, rw, ks);
    mma_nt_m<E, MT, KT, DM>(finite, dp, gs, rw, ks + KT * P);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      score_grads<false, E, KT>(a, off, drop, s[mt], dp[mt], i0 + rw + mt * 16, (i64)t * KT, lse, delta,
                                rw + mt * 16, blockIdx.x);
#pragma unroll
    for (int kk = 0; kk < KT / E::KD; ++kk) {
      typename E::A da[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) da[mt] = E::a_acc(dp[mt], kk);
      mma_rows_m<E, MT, DC, P>(finite, dq, da, ks, kk * E::KD, c0);
    }
    stage_done<S>(t, tiles, issue);
  }
  cp_wait<0>();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    store_rows<E, DC / 8>(a, (T*)a.ptr[O] + off[O], dq[mt], i0 + rw + mt * 16 + (lane >> 2), a.tq, c0);
}

// Hopper (sm_90a, compiled for that architecture alone): the 16-bit kernels on warpgroup MMA.
// The forward: a block of two warpgroups (64 query rows each) streams key and value tiles of 128
// rows through swizzled shared memory; S = Q·Kᵀ takes both operands from shared memory, O += P·V
// takes P from the registers the softmax left it in. The backward below.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
typedef unsigned long long u64;

__device__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// Writes to shared memory by this thread (stores, cp.async) made visible to wgmma's reads.
__device__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Registers an asynchronous MMA writes, pinned: not read before the wait above them.
template <int N> __device__ void pin(float* x) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(x[i]));
}
// A shared-memory operand in the 128-byte swizzle: start address, leading and stride byte offsets.
__device__ u64 wg_desc(u32 addr, u32 lbo, u32 sbo) {
  return (u64)((addr & 0x3ffff) >> 4) | (u64)(lbo >> 4) << 16 | (u64)(sbo >> 4) << 32 | 1ull << 62;
}

// wgmma.mma_async m64nNk16, float32 accumulators d (N / 2 a thread), N 64 or 128: ss takes A and B
// from shared-memory descriptors (d = A·B when scale_d is 0, else d += A·B), rs takes A from
// registers (d += A·B); TB: B is MN-major (transposed). The register lists are spelled out.
#define KILN_WG_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define KILN_WG_C64 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define KILN_WG_D128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define KILN_WG_C128 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
template <bool BF, int N, int TB> struct Wg;
#define KILN_WG_N(BF, TY, N, N0, N1, N2, N3, N4, N5, N6)                                                     \
  template <int TB> struct Wg<BF, N, TB> {                                                                   \
    static __device__ void ss(float* d, u64 da, u64 db, int scale_d) {                                       \
      asm volatile("{ .reg .pred p; setp.ne.b32 p, %" N2 ", 0; wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." \
                   TY "." TY " " KILN_WG_D##N ", %" N0 ", %" N1 ", p, 1, 1, 0, %" N3 "; }"                    \
                   : KILN_WG_C##N                                                                            \
                   : "l"(da), "l"(db), "r"(scale_d), "n"(TB));                                               \
    }                                                                                                        \
    static __device__ void rs(float* d, const u32* a, u64 db) {                                              \
      asm volatile("{ .reg .pred p; setp.ne.b32 p, %" N5 ", 0; wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." \
                   TY "." TY " " KILN_WG_D##N ", {%" N0 ", %" N1 ", %" N2 ", %" N3 "}, %" N4 ", p, 1, 1, %" N6 "; }" \
                   : KILN_WG_C##N                                                                            \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(TB));                  \
    }                                                                                                        \
  };
KILN_WG_N(true, "bf16", 64, "32", "33", "34", "35", "36", "37", "38")
KILN_WG_N(false, "f16", 64, "32", "33", "34", "35", "36", "37", "38")
KILN_WG_N(true, "bf16", 128, "64", "65", "66", "67", "68", "69", "70")
KILN_WG_N(false, "f16", 128, "64", "65", "66", "67", "68", "69", "70")

// A tile of R rows x DM 16-bit columns in wgmma's 128-byte swizzle: DM / 64 blocks of 64 columns
// (R rows of 128 bytes), piece p (16 bytes) of a row at byte (p % 8 ^ r % 8) 16 of it. The byte
// offset of piece p of row r:
template <int R> __device__ u32 swz(int r, int p) {
  return (u32)((p >> 3) * R * 128 + r * 128 + (((p & 7) ^ (r & 7)) << 4));
}
// Such a tile as an operand: K-major (the k index runs along a row; 8-row groups 1024 bytes
// apart; k-step kk of 16 columns at byte kstep<R>(kk)), or MN-major (rows are k, the 64-column
// blocks R 128 bytes apart; k-step kk at byte 2048 kk).
__device__ u64 desc_k(u32 addr) { return wg_desc(addr, 16, 1024); }
template <int R> __device__ u64 desc_mn(u32 addr) { return wg_desc(addr, R * 128, 1024); }
template <int R> __device__ u32 kstep(int kk) { return (kk >> 2) * R * 128 + (kk & 3) * 32; }

// Two warpgroups taking turns to issue their products (FlashAttention-3's ping-pong: one's
// element-wise work runs while the other's products are on the tensor cores). Named barrier
// 1 + w: the other warpgroup has issued, warpgroup w may. Warpgroup 1 passes once before the
// first turn, warpgroup 0 waits once after the last.
__device__ void turn_wait(int wg) { asm volatile("bar.sync %0, 256;" ::"r"(1 + wg)); }
__device__ void turn_pass(int wg) { asm volatile("bar.arrive %0, 256;" ::"r"(2 - wg)); }

// Issued, not committed: x = (rows [64 wg, 64 wg + 64) of the tile of RA rows at a) times (the N
// rows of the tile at b)ᵀ over DM columns, N / 2 floats a thread.
template <bool BF, int N, int RA, int DM> __device__ void wg_scores(float* x, u32 a, u32 b, int wg) {
#pragma unroll
  for (int kk = 0; kk < DM / 16; ++kk)
    Wg<BF, N, 0>::ss(x, desc_k(a + wg * 64 * 128 + kstep<RA>(kk)), desc_k(b + kstep<N>(kk)), kk > 0);
}
// Two such products (x from a1, b1 and y from a2, b2; their steps interleaved), issued in the
// warpgroup's turn (turn_wait, above) and waited for.
template <bool BF, int N, int RA, int DM>
__device__ void wg_score_pair(float* x, u32 a1, u32 b1, float* y, u32 a2, u32 b2, int wg) {
  turn_wait(wg);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < DM / 16; ++kk) {
    const u32 at = wg * 64 * 128 + kstep<RA>(kk), bt = kstep<N>(kk);
    Wg<BF, N, 0>::ss(x, desc_k(a1 + at), desc_k(b1 + bt), kk > 0);
    Wg<BF, N, 0>::ss(y, desc_k(a2 + at), desc_k(b2 + bt), kk > 0);
  }
  wg_commit();
  turn_pass(wg);
  wg_wait<0>();
  pin<N / 2>(x);
  pin<N / 2>(y);
}
// Issued, not committed: acc += f (a warp's 16-bit A fragments of KR columns, a_frags) times the
// first KR rows of the tile of R rows at b (MN-major), DM / 2 floats a thread.
template <bool BF, int DM, int R, int KR> __device__ void wg_accumulate(float* acc, const u32 (*f)[4], u32 b) {
#pragma unroll
  for (int kk = 0; kk < KR / 16; ++kk) Wg<BF, DM, 1>::rs(acc, f[kk], desc_mn<R>(b + kk * 16 * 128));
}
// The A fragments of a warp's float32 16 x N accumulator (rounded to 16 bits), one a k-step.
template <class E, int N> __device__ void a_frags(u32 (*f)[4], const float (*s)[4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    const typename E::A x = E::a_acc(s, kk);
#pragma unroll
    for (int r = 0; r < 4; ++r) f[kk][r] = x.r[r];
  }
}
// A block's batch element b and its index y along gridDim.y, numbered so that the blocks of one
// batch element run side by side (the operands they share stay in L2); last_first: y from the
// last (the longest under causal attention for query blocks).
struct BlockPlace {
  i64 b, y;
};
__device__ BlockPlace block_place(bool last_first) {
  const i64 lin = (i64)blockIdx.y * gridDim.x + blockIdx.x, y = lin % gridDim.y;
  BlockPlace p = {lin / gridDim.y, last_first ? gridDim.y - 1 - y : y};
  return p;
}
// The tiles this thread copied waited for and made visible to wgmma, and every thread's (the
// block's barrier: every warpgroup is also done with the step before).
__device__ void wg_tiles_in() {
  cp_wait<0>();
  fence_async_shared();
  __syncthreads();
}
__device__ void cp16s(u32 dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}
// Rows [r0, r0 + cnt) of `s`, columns [0, DM), into the swizzled tile of R rows at shared address
// dst, element by element (operands without 16-byte rows; smem: the block's shared memory, at
// address s0); zeros past the rows and past `cols`.
template <int R, int DM, int NTH, class T>
__device__ void wg_stage_plain(const Src<T>& s, i64 r0, i64 cnt, i64 cols, u32 dst, unsigned char* smem, u32 s0) {
  for (int x = threadIdx.x; x < R * DM; x += NTH) {
    const int r = x / DM, c = x % DM;
    T* d = (T*)(smem + (dst - s0 + swz<R>(r, c / 8))) + c % 8;
    *d = (r < cnt && c < cols) ? s.p[(r0 + r) * s.rs + c * s.cs] : (T)0;
  }
}

// This thread's share of staging swizzled tiles of R rows x DM columns with NTH threads (16-byte
// copies): piece p of rows r + k STEP, k < R / STEP (STEP a multiple of 8: the rows' swizzle is the same).
template <int R, int DM, int NTH> struct TileCopy {
  static const int PC = DM / 8, STEP = NTH / PC;
  int r, p;
  u32 dst;
  __device__ TileCopy() : r(threadIdx.x / PC), p(threadIdx.x % PC), dst(swz<R>(threadIdx.x / PC, threadIdx.x % PC)) {}
  // Rows [r0, r0 + cnt) of s, zeros past them and past cols, into the tile at shared address `at`
  // (smem: the block's shared memory at address s0, for operands without 16-byte rows).
  template <class T>
  __device__ void run(const Src<T>& s, i64 r0, i64 cnt, i64 cols, u32 at, unsigned char* smem, u32 s0) const {
    if (!s.vec) return wg_stage_plain<R, DM, NTH>(s, r0, cnt, cols, at, smem, s0);
    const T* src = s.p + (r0 + r) * s.rs + p * 8;
    const i64 step = (i64)STEP * s.rs;
    if (cnt >= R && p * 8 < cols) {
#pragma unroll
      for (int k = 0; k < R / STEP; ++k) cp16s(at + dst + k * STEP * 128, src + k * step, 16);
    } else {
#pragma unroll
      for (int k = 0; k < R / STEP; ++k) {
        const bool in = p * 8 < cols && r + k * STEP < cnt;
        cp16s(at + dst + k * STEP * 128, in ? src + k * step : s.p, in ? 16 : 0);
      }
    }
  }
};

// The forward's keys a tile on wgmma (a block: two warpgroups of 64 query rows).
template <int DM> struct FwdWg {
  static const int kn = 128;
};

template <int N> __device__ void pin_u(u32* x) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(x[i]));
}

// A block of the warpgroup forward. Each warpgroup runs FlashAttention-3's loop: the scores of
// tile t are computed while the probabilities of tile t - 1 multiply its values, and the softmax
// of tile t runs while that product is still on the tensor cores. The keys of tile t + 1 and the
// values of tile t load meanwhile (two stages each: step t reads K_t and V_{t-1}). The two
// warpgroups take turns to issue their products.
template <bool BF, int DM> struct FwdWgBlock {
  typedef Half<BF> E;
  typedef u16 T;
  static const int KN = FwdWg<DM>::kn, QM = 128, NTH = 256;
  static const u32 TILE = KN * DM * 2;  // bytes of a key or value tile
  unsigned char* smem;
  u32 s0, qs, k_st, v_st;  // shared addresses: the block's memory, the query rows, the key and value stages
  int wg, tiles;
  i64 b, i0, rw, ra;  // batch element, first query row, the warp's first row, this thread's (ra, ra + 8)
  i64 off[7];
  Src<T> sk, sv;
  TileCopy<KN, DM, NTH> kv_copy;
  Drop drop;
  float scale2;
  float o[DM / 8][4];
  float m[2], l[2];   // running maximum (base 2) and sum of the thread's rows
  u32 p[KN / 16][4];  // the probabilities of the tile before, as the A operand

  // (the arguments are passed to each member, not kept: a reference member would copy them out
  // of the parameter space)
  __device__ __forceinline__ FwdWgBlock(const AttnArgs& a, unsigned char* sm) : smem(sm) {
    s0 = smem_addr(smem);
    qs = (s0 + 1023) & ~1023u;
    k_st = qs + QM * DM * 2;
    v_st = k_st + 2 * TILE;
    wg = threadIdx.x >> 7;
    const BlockPlace place = block_place(true);
    b = place.b;
    i0 = place.y * QM;
    rw = i0 + wg * 64 + ((threadIdx.x >> 5) & 3) * 16;
    ra = rw + ((threadIdx.x & 31) >> 2);
    batch_offsets(a, b, off);
    sk = src_of<T>(a, off, K);
    sv = src_of<T>(a, off, V);
    tiles = key_tiles<KN>(a, i0, QM);
    drop = drop_of(a);
    scale2 = (float)a.scale * LOG2E;
    zero<DM / 8>(o);
    m[0] = m[1] = ninf<float>();
    l[0] = l[1] = 0.f;
  }
  __device__ __forceinline__ void load(const AttnArgs& a, const Src<T>& s, int t, u32 dst) const {
    const i64 j0 = (i64)t * KN;
    kv_copy.run(s, j0, min((i64)KN, a.tk - j0), a.d, dst, smem, s0);
  }
  // O += P·V of the tile before (values at shared address vp).
  __device__ __forceinline__ void issue_pv(u32 vp) {
    wg_accumulate<BF, DM, KN, KN>(&o[0][0], p, vp);
    wg_commit();
  }
  // Step t (FIRST: t = 0, no product of the tile before to overlap).
  template <bool FIRST> __device__ __forceinline__ void step(const AttnArgs& a, int t) {
    wg_tiles_in();  // K_t and V_{t-1}
    if (t + 1 < tiles) load(a, sk, t + 1, k_st + ((t + 1) & 1) * TILE);
    load(a, sv, t, v_st + (t & 1) * TILE);
    cp_commit();
    const u32 ks = k_st + (t & 1) * TILE;
    const i64 j0 = (i64)t * KN;
    float s[1][KN / 8][4];
    turn_wait(wg);
    wg_fence();
    wg_scores<BF, KN, QM, DM>(&s[0][0][0], qs, ks, wg);
    wg_commit();
    if (!FIRST) issue_pv(v_st + ((t + 1) & 1) * TILE);
    turn_pass(wg);
    if (!FIRST) wg_wait<1>();
    else wg_wait<0>();
    pin<KN / 2>(&s[0][0][0]);
    // Base-2 scores: on a plain tile (no mask, every key visible to every row of the warp) the
    // scale goes into the exponent's multiply-add; else the scores are scaled and masked first.
    const bool plain = !a.has_mask && j0 + KN <= a.tk && (!a.causal || j0 + KN - 1 <= rw) && scale2 > 0.f;
    float sc = scale2;
    if (!plain) {
      fwd_scores<false, E, 1, KN>(a, off, s, ra, j0, scale2);
      sc = 1.f;
    }
    float mx[2] = {ninf<float>(), ninf<float>()};
#pragma unroll
    for (int n = 0; n < KN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[0][n][e]);
    float mu[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2)) * sc, m[h]);
      mu[h] = mx[h] == ninf<float>() ? 0.f : mx[h];  // (nothing visible yet: p = 0 everywhere)
      alpha[h] = ex2(m[h] - mu[h]);
      l[h] *= alpha[h];
      m[h] = mx[h];
    }
#pragma unroll
    for (int n = 0; n < KN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = ex2(fmaf(s[0][n][e], sc, -mu[e >> 1]));
        l[e >> 1] += x;  // (the softmax's sum: before dropout)
        s[0][n][e] = x;
      }
    if (drop.on) {
      const Drop d = drop;  // (keep_of takes its address: a copy, so that the block's state stays in registers)
      const i64 bb = b;
      each_score<E, 1, KN>(s, ra, j0, [&](float& x, i64 i, i64 j) {
        if (i < a.tq && j < a.tk) x *= keep_of(d, a, bb, i, j);
      });
    }
    if (!FIRST) {
      wg_wait<0>();
      pin<DM / 2>(&o[0][0]);
      pin_u<KN / 4>(&p[0][0]);
    }
#pragma unroll
    for (int n = 0; n < DM / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e >> 1];
    a_frags<E, KN>(p, s[0]);
  }
  __device__ __forceinline__ void run(const AttnArgs& a) {
    TileCopy<QM, DM, NTH>().run(src_of<T>(a, off, Q), i0, min((i64)QM, a.tq - i0), a.d, qs, smem, s0);
    if (tiles > 0) load(a, sk, 0, k_st);
    cp_commit();
    if (wg == 1) turn_pass(wg);  // (warpgroup 0 first)
    if (tiles > 0) step<true>(a, 0);
    for (int t = 1; t < tiles; ++t) step<false>(a, t);
    if (wg == 0) turn_wait(wg);  // (warpgroup 1's last pass)
    if (tiles > 0) {  // the last tile's values
      wg_tiles_in();
      wg_fence();
      issue_pv(v_st + ((tiles + 1) & 1) * TILE);
      wg_wait<0>();
      pin<DM / 2>(&o[0][0]);
      pin_u<KN / 4>(&p[0][0]);
    } else {
      cp_wait<0>();
    }
    store(a);
  }
  // The output rows and their log-sum-exp.
  __device__ __forceinline__ void store(const AttnArgs& a) {
    store_fwd_rows<E, DM>(a, (T*)a.ptr[O] + off[O], E::packed_width(a.d), threadIdx.x & 3, o, m, l, ra);
  }
};

template <bool BF, int DM> __device__ void flash_fwd_wg(const AttnArgs& a) {
  extern __shared__ __align__(16) unsigned char smem[];
  FwdWgBlock<BF, DM>(a, smem).run(a);
}

// The backward on wgmma: two warpgroups of 64 stationary rows a block (keys for dk/dv, queries for
// dq), the streamed side in 64-row tiles (two stages). The products that make scores and their
// gradients take both operands from shared memory; the ones that add them into the gradients
// take P̃ or dS from registers (rows of the stationary side: P̃ᵀ·dO, dSᵀ·Q and dS·K) and the
// streamed tile, MN-major, from shared memory.
#define WG_BT 64

// lse and delta (the work area's, base-2 lse) of query rows [r0, r0 + R) of batch element b into
// shared memory at `st` (lse, then delta); rows past tq: lse = +inf (probability 0), delta = 0.
template <int R, class T, int DM> __device__ void wg_stage_stats(const AttnArgs& a, i64 b, i64 r0, float* st) {
  for (int x = threadIdx.x; x < 2 * R; x += 256) {
    const bool is_lse = x < R;
    const i64 i = r0 + x % R;
    if (i < a.tq)
      cp4(st + x, work_lse<T, DM>(a) + (is_lse ? 0 : (i64)gridDim.x * a.tq) + b * a.tq + i);
    else
      st[x] = is_lse ? __int_as_float(0x7f800000) : 0.f;
  }
}

// A block of dk and dv: 128 key rows (K and V stationary), over the query tiles from the first
// one causal attention lets see them.
template <bool BF, int DM> struct BwdKvWgBlock {
  typedef Half<BF> E;
  typedef u16 T;
  static const int KB = 128, QT = WG_BT, NTH = 256;
  static const u32 TILE = QT * DM * 2;  // bytes of a query or dO tile
  unsigned char* smem;
  u32 s0, ks, vs, qg;  // shared addresses: the block's memory, keys, values; stage t: q at qg + 2 t TILE, dO after
  float* stats;        // stage t: lse at stats + 2 t QT, delta after
  int wg, tiles;
  i64 b, j0, jw, first;  // batch element, first key of the block and of the warp, first query row
  i64 off[7];
  Src<T> sq, sg;
  TileCopy<QT, DM, NTH> copy;
  float dk[DM / 8][4], dv[DM / 8][4];

  __device__ __forceinline__ BwdKvWgBlock(const AttnArgs& a, unsigned char* sm) : smem(sm) {
    s0 = smem_addr(smem);
    ks = (s0 + 1023) & ~1023u;
    vs = ks + KB * DM * 2;
    qg = vs + KB * DM * 2;
    stats = (float*)(smem + (qg + 4 * TILE - s0));
    wg = threadIdx.x >> 7;
    const BlockPlace place = block_place(false);  // (the first key block is the longest under causal)
    b = place.b;
    j0 = place.y * KB;
    jw = j0 + wg * 64 + ((threadIdx.x >> 5) & 3) * 16;
    batch_offsets(a, b, off);
    sq = src_of<T>(a, off, Q);
    sg = work_do<T, DM>(a, b);
    first = a.causal ? j0 / QT * QT : 0;
    tiles = a.tq > first ? (int)((a.tq - first + QT - 1) / QT) : 0;
    zero<DM / 8>(dk);
    zero<DM / 8>(dv);
  }
  // Query tile t (q, dO, lse, delta) into stage t % 2, committed.
  __device__ __forceinline__ void load(const AttnArgs& a, int t) const {
    const u32 q = qg + (t & 1) * 2 * TILE;
    const i64 i0 = first + (i64)t * QT, cnt = min((i64)QT, a.tq - i0);
    copy.run(sq, i0, cnt, a.d, q, smem, s0);
    copy.run(sg, i0, cnt, DM, q + TILE, smem, s0);
    wg_stage_stats<QT, T, DM>(a, b, i0, stats + (t & 1) * 2 * QT);
    cp_commit();
  }
  __device__ __forceinline__ void step(const AttnArgs& a, int t) {
    wg_tiles_in();  // tile t
    if (t + 1 < tiles) load(a, t + 1);
    const u32 qa = qg + (t & 1) * 2 * TILE, ga = qa + TILE;
    const float* lse = stats + (t & 1) * 2 * QT;
    const i64 i0 = first + (i64)t * QT;
    float st[QT / 8][4], dpt[QT / 8][4];  // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ (rows: the warp's keys)
    wg_score_pair<BF, QT, KB, DM>(&st[0][0], ks, qa, &dpt[0][0], vs, ga, wg);
    {
      const Drop d = drop_of(a);  // (a local: score_grads takes its address)
      score_grads<true, E, QT>(a, off, d, st, dpt, jw, i0, lse, lse + QT, 0, b);
    }
    u32 pa[QT / 16][4], da[QT / 16][4];
    a_frags<E, QT>(pa, st);
    a_frags<E, QT>(da, dpt);
    wg_fence();
    wg_accumulate<BF, DM, QT, QT>(&dv[0][0], pa, ga);
    wg_accumulate<BF, DM, QT, QT>(&dk[0][0], da, qa);
    wg_commit();
    wg_wait<0>();
    pin<DM / 2>(&dv[0][0]);
    pin<DM / 2>(&dk[0][0]);
    pin_u<QT / 4>(&pa[0][0]);
    pin_u<QT / 4>(&da[0][0]);
  }
  __device__ __forceinline__ void run(const AttnArgs& a) {
    const i64 kn = min((i64)KB, a.tk - j0);
    TileCopy<KB, DM, NTH>().run(src_of<T>(a, off, K), j0, kn, a.d, ks, smem, s0);
    TileCopy<KB, DM, NTH>().run(src_of<T>(a, off, V), j0, kn, a.d, vs, smem, s0);
    if (tiles > 0) load(a, 0);
    else cp_commit();
    if (wg == 1) turn_pass(wg);
    for (int t = 0; t < tiles; ++t) step(a, t);
    if (wg == 0) turn_wait(wg);
    cp_wait<0>();
    T* out = (T*)a.ptr[O] + off[O];
    const i64 ja = jw + ((threadIdx.x & 31) >> 2);
    store_rows<E, DM / 8>(a, out + a.tq * a.rs[O], dk, ja, a.tk, 0);
    store_rows<E, DM / 8>(a, out + (a.tq + a.tk) * a.rs[O], dv, ja, a.tk, 0);
  }
};

// A block of dq: 128 query rows (q and dO stationary, their lse and delta in shared memory), over
// the key tiles it sees.
template <bool BF, int DM> struct BwdQWgBlock {
  typedef Half<BF> E;
  typedef u16 T;
  static const int QB = 128, KT = WG_BT, NTH = 256;
  static const u32 TILE = KT * DM * 2;  // bytes of a key or value tile
  unsigned char* smem;
  u32 s0, qs, gs, kv;  // shared addresses: the block's memory, q, dO; stage t: k at kv + 2 t TILE, v after
  float* stats;        // lse of the block's rows, then delta
  int wg, tiles;
  i64 b, i0, rw;  // batch element, first query row of the block and of the warp
  i64 off[7];
  Src<T> sk, sv;
  TileCopy<KT, DM, NTH> copy;
  float dq[DM / 8][4];

  __device__ __forceinline__ BwdQWgBlock(const AttnArgs& a, unsigned char* sm) : smem(sm) {
    s0 = smem_addr(smem);
    qs = (s0 + 1023) & ~1023u;
    gs = qs + QB * DM * 2;
    kv = gs + QB * DM * 2;
    stats = (float*)(smem + (kv + 4 * TILE - s0));
    wg = threadIdx.x >> 7;
    const BlockPlace place = block_place(true);
    b = place.b;
    i0 = place.y * QB;
    rw = i0 + wg * 64 + ((threadIdx.x >> 5) & 3) * 16;
    batch_offsets(a, b, off);
    sk = src_of<T>(a, off, K);
    sv = src_of<T>(a, off, V);
    tiles = key_tiles<KT>(a, i0, QB);
    zero<DM / 8>(dq);
  }
  // Key tile t (k, v) into stage t % 2, committed.
  __device__ __forceinline__ void load(const AttnArgs& a, int t) const {
    const u32 k = kv + (t & 1) * 2 * TILE;
    const i64 j0 = (i64)t * KT, cnt = min((i64)KT, a.tk - j0);
    copy.run(sk, j0, cnt, a.d, k, smem, s0);
    copy.run(sv, j0, cnt, a.d, k + TILE, smem, s0);
    cp_commit();
  }
  __device__ __forceinline__ void step(const AttnArgs& a, int t) {
    wg_tiles_in();  // tile t
    if (t + 1 < tiles) load(a, t + 1);
    const u32 ka = kv + (t & 1) * 2 * TILE, va = ka + TILE;
    float s[KT / 8][4], dp[KT / 8][4];  // S = Q·Kᵀ, dP = dO·Vᵀ (rows: the warp's queries)
    wg_score_pair<BF, KT, QB, DM>(&s[0][0], qs, ka, &dp[0][0], gs, va, wg);
    {
      const Drop d = drop_of(a);  // (a local: score_grads takes its address)
      score_grads<false, E, KT>(a, off, d, s, dp, rw, (i64)t * KT, stats, stats + QB, (int)(rw - i0), b);
    }
    u32 da[KT / 16][4];
    a_frags<E, KT>(da, dp);
    wg_fence();
    wg_accumulate<BF, DM, KT, KT>(&dq[0][0], da, ka);
    wg_commit();
    wg_wait<0>();
    pin<DM / 2>(&dq[0][0]);
    pin_u<KT / 4>(&da[0][0]);
  }
  __device__ __forceinline__ void run(const AttnArgs& a) {
    const i64 rows = min((i64)QB, a.tq - i0);
    TileCopy<QB, DM, NTH>().run(src_of<T>(a, off, Q), i0, rows, a.d, qs, smem, s0);
    TileCopy<QB, DM, NTH>().run(work_do<T, DM>(a, b), i0, rows, DM, gs, smem, s0);
    wg_stage_stats<QB, T, DM>(a, b, i0, stats);
    if (tiles > 0) load(a, 0);
    else cp_commit();
    if (wg == 1) turn_pass(wg);
    for (int t = 0; t < tiles; ++t) step(a, t);
    if (wg == 0) turn_wait(wg);
    cp_wait<0>();
    store_rows<E, DM / 8>(a, (T*)a.ptr[O] + off[O], dq, rw + ((threadIdx.x & 31) >> 2), a.tq, 0);
  }
};

template <bool BF, int DM> __device__ void flash_bwd_kv_wg(const AttnArgs& a) {
  extern __shared__ __align__(16) unsigned char smem[];
  BwdKvWgBlock<BF, DM>(a, smem).run(a);
}
template <bool BF, int DM> __device__ void flash_bwd_q_wg(const AttnArgs& a) {
  extern __shared__ __align__(16) unsigned char smem[];
  BwdQWgBlock<BF, DM>(a, smem).run(a);
}

#define KILN_FLASH_flash_bwd_kv_wg(NAME, E, DM) \
  extern "C" __global__ void __launch_bounds__(256) NAME(AttnArgs a) { flash_bwd_kv_wg<E::bf, DM>(a); }
#define KILN_FLASH_flash_bwd_q_wg(NAME, E, DM) \
  extern "C" __global__ void __launch_bounds__(256) NAME(AttnArgs a) { flash_bwd_q_wg<E::bf, DM>(a); }
#define KILN_FLASH_flash_fwd_wg(NAME, E, DM)                                                        \
  extern "C" __global__ void __launch_bounds__(256) NAME(AttnArgs a) { flash_fwd_wg<E::bf, DM>(a); }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Whether q, k, v and (backward) dO, gout's first d columns, hold an infinity or NaN: blockIdx.x
// the batch element, the blocks of y its elements in turn; a block that finds one sets
// *a.nonfinite (zeroed before). The 3xTF32 kernels take their fast or careful form by it.
__device__ void flash_scan(const AttnArgs& a) {
  i64 off[7];
  batch_offsets(a, blockIdx.x, off);
  const int ops[4] = {Q, K, V, G};
  bool bad = false;
  for (int o = 0; o < (a.ptr[G] ? 4 : 3); ++o) {
    const int k = ops[o];
    const u32 n = (u32)((k == K || k == V ? a.tk : a.tq) * a.d), d = (u32)a.d;
    const float* p = (const float*)a.ptr[k] + off[k];
    for (u32 x = blockIdx.y * NT + threadIdx.x; x < n; x += gridDim.y * NT) {
      const float v = p[(i64)(x / d) * a.rs[k] + (i64)(x % d) * a.cs[k]];
      bad |= (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
    }
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *a.nonfinite = 1;
}

// Gradient columns per block of head-size bucket DM (mirrored by the host).
template <int DM> struct Cols {
  static const int n = DM <= 128 ? DM : DM / 2;
};

#define KILN_FLASH_flash_fwd(NAME, E, DM) \
  extern "C" __global__ void __launch_bounds__(NT) NAME(AttnArgs a) { flash_fwd<E, DM>(a); }
#define KILN_FLASH_flash_bwd_kv(NAME, E, DM) \
  extern "C" __global__ void __launch_bounds__(NT) NAME(AttnArgs a) { flash_bwd_kv<E, DM, Cols<DM>::n>(a); }
#define KILN_FLASH_flash_bwd_prep(NAME, E, DM) \
  extern "C" __global__ void __launch_bounds__(NT) NAME(AttnArgs a) { flash_bwd_prep<E, DM>(a); }
#define KILN_FLASH_flash_bwd_q(NAME, E, DM) \
  extern "C" __global__ void __launch_bounds__(NT) NAME(AttnArgs a) { flash_bwd_q<E, DM, Cols<DM>::n>(a); }
#define KILN_FLASH_flash_scan(NAME, E, DM) \
  extern "C" __global__ void __launch_bounds__(NT) NAME(AttnArgs a) { flash_scan(a); }
#define KILN_FLASH(NAME, KIND, E, DM) KILN_FLASH_##KIND(NAME, E, DM)
)CUDA";

}  // namespace

const char* flash_kernel_source() { return kFlashSource; }

std::string flash_element(const DeviceKernelInstance& k) {
  if (k.a == DType::Float32) return k.tf32_passes == 1 ? "Tf32<1>" : k.careful ? "Tf32Careful" : "Tf32<3>";
  return k.a == DType::BFloat16 ? "Half<true>" : "Half<false>";
}

int flash_head_bucket(int64_t d) { return static_cast<int>((d + 31) / 32 * 32); }

int flash_columns(int bucket) { return bucket <= 128 ? bucket : bucket / 2; }

int flash_stages(int bucket) { return bucket <= 128 ? 2 : 1; }

namespace {
// A kernel's shape for a bucket and element size (the source's Fwd and Bwd): stationary rows a
// block (64 a slice per warp) and rows of the streamed side a tile.
struct Shape {
  int64_t rows, streamed;
};
Shape shape_of(DeviceKernel k, int bucket, int64_t item) {
  if (k == DeviceKernel::FlashForward) return {bucket <= 128 ? 128 : 64, bucket <= 64 ? 64 : 32};
  if (k == DeviceKernel::FlashForwardWarpgroup) return {128, 128};  // (two warpgroups; FwdWg)
  if (needs_sm90a(k)) return {128, 64};                               // (two warpgroups; WG_BT)
  if (k == DeviceKernel::FlashBackwardQ) return bucket <= 64 ? Shape{128, 32} : Shape{64, item == 4 ? 32 : 64};
  return {64, bucket <= 64 ? 64 : 32};
}
}  // namespace

int64_t flash_shared_bytes(DeviceKernel k, int bucket, int64_t item) {
  const Shape sh = shape_of(k, bucket, item);
  const int64_t pitch = bucket * item + 16, stages = flash_stages(bucket), streamed = stages * 2 * sh.streamed * pitch;
  switch (k) {
    case DeviceKernel::FlashForward: return sh.rows * pitch + streamed;  // q; k and v a stage
    case DeviceKernel::FlashForwardWarpgroup:  // q; two stages of k and of v (unpadded); 1024-byte alignment
      return (sh.rows + 4 * sh.streamed) * bucket * item + 1024;
    case DeviceKernel::FlashBackwardKVWarpgroup:  // k, v; two stages of q and dO, and of their lse and delta
      return (2 * sh.rows + 4 * sh.streamed) * bucket * item + 4 * sh.streamed * 4 + 1024;
    case DeviceKernel::FlashBackwardQWarpgroup:  // q, dO, their lse and delta; two stages of k and v
      return (2 * sh.rows + 4 * sh.streamed) * bucket * item + 2 * sh.rows * 4 + 1024;
    case DeviceKernel::FlashBackwardKV:  // k, v; q and dO with their lse and delta a stage
      return 2 * sh.rows * pitch + streamed + stages * 2 * sh.streamed * 4;
    case DeviceKernel::FlashBackwardQ:  // q, dO, lse, delta; k and v a stage
      return 2 * sh.rows * pitch + streamed + 2 * sh.rows * 4;
    default: return 0;
  }
}

int64_t flash_most_shared_bytes(int bucket, int64_t item) {
  return std::max({flash_shared_bytes(DeviceKernel::FlashForward, bucket, item),
                   flash_shared_bytes(DeviceKernel::FlashBackwardKV, bucket, item),
                   flash_shared_bytes(DeviceKernel::FlashBackwardQ, bucket, item)});
}

int flash_threads(DeviceKernel k) { return needs_sm90a(k) ? 256 : 128; }

int flash_rows_per_block(DeviceKernel k, int bucket) {
  return k == DeviceKernel::FlashBackwardPrep ? 64 : static_cast<int>(shape_of(k, bucket, 2).rows);
}

int64_t flash_work_bytes(int64_t batch, int64_t tq, int bucket, int64_t item) {
  return batch * tq * (item * bucket + 8);
}

}  // namespace kiln::kernels
