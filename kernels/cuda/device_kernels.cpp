#include "kernels/cuda/device_kernels.h"

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/flash_kernels.h"
#include "runtime/core/error.h"

namespace kiln::kernels {
namespace {

// Conversions and arithmetic follow kernels/cpu exactly: a value is loaded into its compute
// type (float for the 16-bit floats, bool for bool), converted with C++ casts, and stored with
// kiln's round-to-nearest-even Half / BFloat16 (runtime/core/dtype.{h,cpp}).
const char* kSource = R"CUDA(
typedef long long i64;
typedef unsigned long long u64;
typedef int i32;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

// Storage types of bool and the 16-bit floats (1 and 2 bytes, as on the host).
struct kbool { u8 v; };
struct khalf { u16 v; };
struct kbf16 { u16 v; };

template <class A, class B> struct same { static const bool value = false; };
template <class A> struct same<A, A> { static const bool value = true; };

template <class T> struct is_float { static const bool value = same<T, float>::value || same<T, double>::value; };

// (C)x, with bool meaning x != 0 (NaN is true), and float -> integer as the CPU (x86) does it:
// NaN and out-of-range values give the type's minimum, where CUDA's conversion saturates.
template <class C, class X> __device__ C cvt(X x) {
  if constexpr (same<C, bool>::value) {
    return x != X(0);
  } else if constexpr (is_float<X>::value && same<C, i64>::value) {
    const double d = x;
    return (d >= -9223372036854775808.0 && d < 9223372036854775808.0) ? (i64)d : (i64)0x8000000000000000ull;
  } else if constexpr (is_float<X>::value && same<C, i32>::value) {
    const double d = x;
    return (d > -2147483649.0 && d < 2147483648.0) ? (i32)d : (i32)0x80000000u;
  } else {
    return (C)x;
  }
}

__device__ float half_to_float(u16 h) {
  u32 sign = ((u32)h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) return __uint_as_float(__float_as_uint((float)mant * 5.9604644775390625e-8f) | sign);
  if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
  return __uint_as_float(sign | ((exp + 112) << 23) | (mant << 13));
}

__device__ u16 float_to_half(float f) {
  u32 x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (u16)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return (u16)(sign | 0x7c00u);
  if (ax < 0x38800000u) return (u16)(sign | (u32)rintf(__uint_as_float(ax) * 16777216.0f));
  ax += 0xc8000fffu + ((ax >> 13) & 1u);
  return (u16)(sign | (ax >> 13));
}

__device__ u16 float_to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}

// Tr<T>: C, the type arithmetic on T is carried out in; load (T -> C) and store (C -> T).
template <class T> struct Tr {
  typedef T C;
  static __device__ T load(T x) { return x; }
  static __device__ T store(T x) { return x; }
};
template <> struct Tr<kbool> {
  typedef bool C;
  static __device__ bool load(kbool x) { return x.v != 0; }
  static __device__ kbool store(bool b) { kbool r; r.v = b ? 1 : 0; return r; }
};
template <> struct Tr<khalf> {
  typedef float C;
  static __device__ float load(khalf x) { return half_to_float(x.v); }
  static __device__ khalf store(float f) { khalf r; r.v = float_to_half(f); return r; }
};
template <> struct Tr<kbf16> {
  typedef float C;
  static __device__ float load(kbf16 x) { return __uint_as_float((u32)x.v << 16); }
  static __device__ kbf16 store(float f) { kbf16 r; r.v = float_to_bf16(f); return r; }
};

// The CPU's convert<TO, TI>: through TI's compute type into TO's.
template <class TO, class TI> __device__ TO convert(TI x) {
  return Tr<TO>::store(cvt<typename Tr<TO>::C>(Tr<TI>::load(x)));
}

// *p = *p + s as one atomic step (the sum computed as the CPU does: in T's compute type).
__device__ void atomic_add(i32* p, i32 s) { atomicAdd(p, s); }
__device__ void atomic_add(i64* p, i64 s) { atomicAdd((u64*)p, (u64)s); }
__device__ void atomic_add(float* p, float s) { atomicAdd(p, s); }
__device__ void atomic_add(double* p, double s) { atomicAdd(p, s); }
// 1- and 2-byte types: compare-and-swap on the aligned word holding *p (device buffers are
// 512-byte blocks, so the word is always inside the buffer's block).
template <class T> __device__ void atomic_add(T* p, T s) {
  u32* w = (u32*)((u64)p & ~(u64)3);
  const u32 shift = (u32)((u64)p & 3) * 8, mask = (sizeof(T) == 1 ? 0xffu : 0xffffu) << shift;
  u32 old = *w, assumed;
  do {
    assumed = old;
    T cur;
    cur.v = (decltype(cur.v))((assumed & mask) >> shift);
    T sum = Tr<T>::store(cvt<typename Tr<T>::C>(Tr<T>::load(cur) + Tr<T>::load(s)));
    old = atomicCAS(w, assumed, (assumed & ~mask) | ((u32)sum.v << shift));
  } while (old != assumed);
}

// Up to 8 dims of sizes and three operands' element strides (host: runtime/cuda/device_ops.cpp).
struct Geom {
  i64 nd;
  i64 size[8];
  i64 st[3][8];
  i64 narrow;  // 1: the element count (so every index and size) fits in 32 bits
};

// The three operands' element offsets of row-major linear index i. Where the element count fits
// in 32 bits they divide in 32 bits: a 64-bit division is several times the instructions, and a
// strided copy of a few million elements spent most of its time there.
__device__ void offsets(const Geom& g, i64 i, i64* o) {
  o[0] = o[1] = o[2] = 0;
  if (g.narrow) {
    unsigned u = (unsigned)i;
#pragma unroll
    for (int d = 7; d >= 0; --d) {
      if (d >= g.nd) continue;
      const unsigned size = (unsigned)g.size[d], q = u / size, c = u - q * size;
      u = q;
      o[0] += (i64)c * g.st[0][d];
      o[1] += (i64)c * g.st[1][d];
      o[2] += (i64)c * g.st[2][d];
    }
    return;
  }
#pragma unroll
  for (int d = 7; d >= 0; --d) {
    if (d >= g.nd) continue;
    const i64 c = i % g.size[d];
    i /= g.size[d];
    o[0] += c * g.st[0][d];
    o[1] += c * g.st[1][d];
    o[2] += c * g.st[2][d];
  }
}

#define KILN_FOR(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// The error record's kinds (its flag; decoded by cu::sync(), runtime/cuda/cuda_runtime.cpp).
enum { kBadIndex = 1, kDivByZero = 2, kNegativePow = 3 };

// Reports an error into the record {kind, op, index, dim, size}: the first one wins.
__device__ void report(i64* err, i64 kind, i64 op, i64 v, i64 dim, i64 size) {
  if (atomicCAS((u64*)err, 0ull, (u64)kind) == 0ull) {
    err[1] = op;
    err[2] = v;
    err[3] = dim;
    err[4] = size;
  }
}

// Whether index v lies in [0, size); if not, reports it (the element is then skipped).
__device__ bool in_range(i64 v, i64 size, i64* err, i64 op, i64 dim) {
  if (v >= 0 && v < size) return true;
  report(err, kBadIndex, op, v, dim, size);
  return false;
}

// x * y wrapping around (the CPU's integer multiply, without signed overflow).
template <class C> __device__ C wrap_mul(C x, C y) {
  if constexpr (sizeof(C) == 8) return (C)((u64)x * (u64)y);
  else return (C)((u32)x * (u32)y);
}

// Integer remainder (Python's sign: y's), fmod (C's sign: x's) and pow (by squaring, wrapping;
// bool: x || !y), as kernels/cpu/pointwise.cpp; false for a zero divisor / negative exponent.
enum { kRemainder, kFmod, kPow };
template <int F, class C> __device__ bool int_op(C x, C y, C* r) {
  if constexpr (same<C, bool>::value) {
    *r = x || !y;
  } else if constexpr (F == kPow) {
    if (y < 0) {
      *r = x == 1 ? 1 : x == -1 ? (y % 2 == 0 ? 1 : -1) : 0;
      return x == 1 || x == -1;
    }
    C p = 1;
    for (; y; y >>= 1, x = wrap_mul(x, x))
      if (y & 1) p = wrap_mul(p, x);
    *r = p;
  } else {
    if (y == 0) return false;
    C m = y == -1 ? 0 : x % y;  // (x % -1 is 0; the minimum % -1 would overflow)
    if (F == kRemainder && m != 0 && ((y < 0) != (m < 0))) m += y;
    *r = m;
  }
  return true;
}

// Operands: 0 out, 1 a, 2 b (broadcast); F is kRemainder, kFmod or kPow; op the OpKind.
template <int F, class T> __device__ void int_binary_k(T* out, const T* a, const T* b, Geom g, i64 n, i64 op, i64* err) {
  typedef typename Tr<T>::C C;
  KILN_FOR(i, n) {
    i64 o[3];
    offsets(g, i, o);
    C r;
    if (int_op<F, C>(Tr<T>::load(a[o[1]]), Tr<T>::load(b[o[2]]), &r)) out[o[0]] = Tr<T>::store(r);
    else report(err, F == kPow ? kNegativePow : kDivByZero, op, 0, 0, 0);
  }
}

// Operands: 0 out, 1 in.
template <class TO, class TI> __device__ void copy_k(TO* out, const TI* in, Geom g, i64 n) {
  KILN_FOR(i, n) {
    i64 o[3];
    offsets(g, i, o);
    out[o[0]] = convert<TO, TI>(in[o[1]]);
  }
}

// cat of pieces contiguous in memory, up to KILN_CAT_PIECES a launch (blockIdx.y: the piece):
// piece y's `outer` rows of `row` units each go to out's rows of `out_row` units from unit `at`.
// A unit is the widest access (1 to 16 bytes) dividing every size, offset and address, so a
// bfloat16 row of 768 moves as 96 16-byte loads and stores.
#define KILN_CAT_PIECES 128
struct __align__(16) u128 { u64 lo, hi; };
struct CatPiece { const char* src; i64 row, at; };
struct CatArgs { char* out; i64 outer, out_row; CatPiece piece[KILN_CAT_PIECES]; };
template <class U> __device__ void cat_k(const CatArgs& a) {
  const CatPiece p = a.piece[blockIdx.y];
  const U* src = (const U*)p.src;
  U* out = (U*)a.out;
  const i64 n = a.outer * p.row;
  const bool narrow = n < 2147483647;
  KILN_FOR(i, n) {
    const i64 o = narrow ? (i64)((u32)i / (u32)p.row) : i / p.row;
    out[o * a.out_row + p.at + (i - o * p.row)] = src[i];
  }
}

// Operands: 0 out, 1 index, 2 x (indexed dim's stride zeroed; xs is that stride).
template <class T, class I>
__device__ void gather_k(T* out, const T* x, const I* idx, Geom g, i64 n, i64 xs, i64 size, i64 dim, i64 op, i64* err) {
  KILN_FOR(i, n) {
    i64 o[3];
    offsets(g, i, o);
    const i64 v = (i64)idx[o[1]];
    if (!in_range(v, size, err, op, dim)) continue;
    out[o[0]] = x[o[2] + v * xs];
  }
}

// Operands: 0 out (indexed dim's stride zeroed; os is that stride), 1 index, 2 src.
template <class T, class I>
__device__ void scatter_add_k(T* out, const T* src, const I* idx, Geom g, i64 n, i64 os, i64 size, i64 dim, i64 op, i64* err) {
  KILN_FOR(i, n) {
    i64 o[3];
    offsets(g, i, o);
    const i64 v = (i64)idx[o[1]];
    if (!in_range(v, size, err, op, dim)) continue;
    atomic_add(out + o[0] + v * os, src[o[2]]);
  }
}

// scatter, pass 1: each destination's winner is the last i (in the CPU's serial order) writing it.
template <class I>
__device__ void scatter_claim_k(const I* idx, Geom g, i64 n, i64 os, i64 size, i64 dim, i64 op, i64* err, i64* win) {
  KILN_FOR(i, n) {
    i64 o[3];
    offsets(g, i, o);
    const i64 v = (i64)idx[o[1]];
    if (!in_range(v, size, err, op, dim)) continue;
    atomicMax(win + o[0] + v * os, i);
  }
}

// scatter, pass 2: the winners write.
template <class T, class I>
__device__ void scatter_write_k(T* out, const T* src, const I* idx, Geom g, i64 n, i64 os, i64 size, const i64* win) {
  KILN_FOR(i, n) {
    i64 o[3];
    offsets(g, i, o);
    const i64 v = (i64)idx[o[1]];
    if (v < 0 || v >= size) continue;
    const i64 d = o[0] + v * os;
    if (win[d] == i) out[d] = src[o[2]];
  }
}

template <class C> struct Acc { typedef i64 T; };
template <> struct Acc<float> { typedef double T; };
template <> struct Acc<double> { typedef double T; };

// Rows: operands 0 out, 1 in at each row's start; len elements along the dim (strides is, os).
template <class T> __device__ void cumsum_k(T* out, const T* in, Geom g, i64 rows, i64 len, i64 is, i64 os) {
  typedef typename Tr<T>::C C;
  typedef typename Acc<C>::T A;
  KILN_FOR(r, rows) {
    i64 o[3];
    offsets(g, r, o);
    A acc = 0;
    for (i64 k = 0; k < len; ++k) {
      acc += cvt<A>(Tr<T>::load(in[o[1] + k * is]));
      out[o[0] + k * os] = Tr<T>::store(cvt<C>(acc));
    }
  }
}

// ---- float scatter_add / index_add without float atomics ----
// The sources are (key, position) pairs: key the destination (a row of out, or an element
// offset; bad indices get a key past every destination and are skipped), position the
// source's place in the CPU's serial order. A stable sort by key puts each destination's
// sources together, in that order; one thread per destination (and column) then adds them to
// out sequentially, as the CPU does, rounding to T after each add. Every count in the sort is
// an integer: the result, and so each sum's order, is the same on every run.

// Row keys: a 1-d index (stride is) of n entries into a dim of `size`.
template <class I>
__device__ void index_keys_k(const I* idx, i64 is, i64 n, i64 size, i64 dim, i64 op, i64* err, u64* key, i64* pos) {
  KILN_FOR(i, n) {
    const i64 v = (i64)idx[i * is];
    key[i] = in_range(v, size, err, op, dim) ? (u64)v : (u64)size;
    pos[i] = i;
  }
}

// Element keys: operands 0 out (indexed dim's stride zeroed; os is that stride), 1 index; a
// bad index gets `none` (numel(out): past every offset of the dense out).
template <class I>
__device__ void scatter_keys_k(const I* idx, Geom g, i64 n, i64 os, i64 size, i64 dim, i64 op, i64* err, u64 none,
                               u64* key, i64* pos) {
  KILN_FOR(i, n) {
    i64 o[3];
    offsets(g, i, o);
    const i64 v = (i64)idx[o[1]];
    key[i] = in_range(v, size, err, op, dim) ? (u64)(o[0] + v * os) : none;
    pos[i] = i;
  }
}

// The radix sort: 256 threads a block, 8 bits a pass (bits shift..shift+7 of the key); block b
// owns keys [b * tiles * 256, (b + 1) * tiles * 256), taken 256 (a tile) at a time. hist is
// [256 digits][gridDim.x blocks], so its exclusive scan is where each (digit, block) begins.
__device__ void radix_count_k(const u64* key, i64 n, i64 tiles, i32 shift, i64* hist) {
  __shared__ i32 cnt[256];
  const int t = threadIdx.x;
  cnt[t] = 0;
  __syncthreads();
  const i64 begin = (i64)blockIdx.x * tiles * 256;
  for (i64 tile = 0; tile < tiles; ++tile) {
    const i64 i = begin + tile * 256 + t;
    if (i < n) atomicAdd(&cnt[(u32)(key[i] >> shift) & 255u], 1);  // (integer counts: exact in any order)
  }
  __syncthreads();
  hist[(i64)t * gridDim.x + blockIdx.x] = cnt[t];
}

// Exclusive scan of hist[0, m) in place by one block of 1024 threads: each sums a run, the
// runs' totals are scanned in shared memory, then each run is rewritten.
__device__ void radix_scan_k(i64* hist, i64 m) {
  __shared__ i64 part[1024];
  const int t = threadIdx.x;
  const i64 per = (m + 1023) / 1024;
  i64 lo = (i64)t * per, hi = lo + per;
  if (lo > m) lo = m;
  if (hi > m) hi = m;
  i64 s = 0;
  for (i64 i = lo; i < hi; ++i) s += hist[i];
  part[t] = s;
  __syncthreads();
  for (int off = 1; off < 1024; off <<= 1) {
    const i64 v = t >= off ? part[t - off] : 0;
    __syncthreads();
    part[t] += v;
    __syncthreads();
  }
  i64 run = t ? part[t - 1] : 0;
  for (i64 i = lo; i < hi; ++i) {
    const i64 c = hist[i];
    hist[i] = run;
    run += c;
  }
}

// Moves each pair to its place: the (digit, block) start, plus the pairs of that digit in the
// block's earlier tiles, in earlier warps of this tile and in earlier lanes of this warp (the
// lanes sharing a digit found by one ballot per digit bit). Stable: equal digits keep their order.
__device__ void radix_move_k(const u64* key_in, const i64* pos_in, u64* key_out, i64* pos_out, i64 n, i64 tiles,
                             i32 shift, const i64* hist) {
  __shared__ i64 base[256];    // where the block's next pair of each digit goes
  __shared__ i32 wcnt[8][256];  // this tile's pairs per warp and digit
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  base[t] = hist[(i64)t * gridDim.x + blockIdx.x];
  const u32 below = (1u << lane) - 1u;
  const i64 begin = (i64)blockIdx.x * tiles * 256;
  for (i64 tile = 0; tile < tiles; ++tile) {
    for (int w = 0; w < 8; ++w) wcnt[w][t] = 0;  // (column t: only this thread reads it below)
    __syncthreads();
    const i64 i = begin + tile * 256 + t;
    const bool valid = i < n;
    u64 k = 0;
    i64 p = 0;
    u32 d = 0;
    if (valid) {
      k = key_in[i];
      p = pos_in[i];
      d = (u32)(k >> shift) & 255u;
    }
    u32 peers = __ballot_sync(0xffffffffu, valid);
    for (int b = 0; b < 8; ++b) {
      const bool bit = (d >> b) & 1u;
      const u32 m = __ballot_sync(0xffffffffu, bit);
      peers &= bit ? m : ~m;
    }
    const int rank = __popc(peers & below);
    if (valid && rank == 0) wcnt[warp][d] = __popc(peers);
    __syncthreads();
    if (valid) {
      i64 at = base[d] + rank;
      for (int w = 0; w < warp; ++w) at += wcnt[w][d];
      key_out[at] = k;
      pos_out[at] = p;
    }
    __syncthreads();
    i32 all = 0;
    for (int w = 0; w < 8; ++w) all += wcnt[w][t];
    base[t] += all;
  }
}

// The end of the run of key kv that starts before lo (keys sorted): the first k in [lo, hi)
// with key[k] > kv.
__device__ i64 run_end(const u64* key, i64 lo, i64 hi, u64 kv) {
  while (lo < hi) {
    const i64 mid = lo + (hi - lo) / 2;
    if (key[mid] <= kv) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Rows: len sorted (key = row, pos) pairs of a 1-d index; cols columns (all dims but the
// indexed one: operand 0 out, 2 src); os / ss the indexed dim's strides. Thread (j, c): when
// j starts a run of a valid key, out's column c of that row gets the run's sources, in order.
template <class T>
__device__ void segment_add_rows_k(T* out, const T* src, const u64* key, const i64* pos, Geom g, i64 len, i64 cols,
                                   i64 os, i64 ss, i64 size) {
  typedef typename Tr<T>::C C;
  KILN_FOR(t, len * cols) {
    const i64 j = t / cols, c = t - j * cols;
    const u64 kv = key[j];
    if (kv >= (u64)size || (j > 0 && key[j - 1] == kv)) continue;
    const i64 end = run_end(key, j + 1, len, kv);
    i64 o[3];
    offsets(g, c, o);
    T* dst = out + o[0] + (i64)kv * os;
    const T* s = src + o[2];
    C acc = Tr<T>::load(*dst);
#pragma unroll 4
    for (i64 k = j; k < end; ++k) acc = Tr<T>::load(Tr<T>::store(acc + Tr<T>::load(s[pos[k] * ss])));
    *dst = Tr<T>::store(acc);
  }
}

// Elements: n sorted (key = out offset, pos = element) pairs; operand 2 of g is src.
template <class T>
__device__ void segment_add_elements_k(T* out, const T* src, const u64* key, const i64* pos, Geom g, i64 n, u64 none) {
  typedef typename Tr<T>::C C;
  KILN_FOR(j, n) {
    const u64 kv = key[j];
    if (kv >= none || (j > 0 && key[j - 1] == kv)) continue;
    const i64 end = run_end(key, j + 1, n, kv);
    C acc = Tr<T>::load(out[kv]);
    for (i64 k = j; k < end; ++k) {
      i64 o[3];
      offsets(g, pos[k], o);
      acc = Tr<T>::load(Tr<T>::store(acc + Tr<T>::load(src[o[2]])));
    }
    out[kv] = Tr<T>::store(acc);
  }
}

// Operands: 0 c, 1 a, 2 b, strides in bytes over the batch dims: out[i], out[n + i], out[2n + i].
__device__ void batch_pointers_k(u64* out, u64 c, u64 a, u64 b, Geom g, i64 n) {
  KILN_FOR(i, n) {
    i64 o[3];
    offsets(g, i, o);
    out[i] = c + (u64)o[0];
    out[n + i] = a + (u64)o[1];
    out[2 * n + i] = b + (u64)o[2];
  }
}

// One extern "C" kernel per instance (NAME, then the element types).
#define KILN_COPY(NAME, TO, TI) \
  extern "C" __global__ void NAME(TO* out, const TI* in, Geom g, i64 n) { copy_k<TO, TI>(out, in, g, n); }
#define KILN_CAT(NAME, U) \
  extern "C" __global__ void NAME(const CatArgs a) { cat_k<U>(a); }
#define KILN_GATHER(NAME, T, I)                                                                                     \
  extern "C" __global__ void NAME(T* out, const T* x, const I* idx, Geom g, i64 n, i64 xs, i64 size, i64 dim, i64 op, \
                                  i64* err) {                                                                       \
    gather_k<T, I>(out, x, idx, g, n, xs, size, dim, op, err);                                                      \
  }
#define KILN_SCATTER_ADD(NAME, T, I)                                                                                   \
  extern "C" __global__ void NAME(T* out, const T* src, const I* idx, Geom g, i64 n, i64 os, i64 size, i64 dim, i64 op, \
                                  i64* err) {                                                                          \
    scatter_add_k<T, I>(out, src, idx, g, n, os, size, dim, op, err);                                                  \
  }
#define KILN_SCATTER_CLAIM(NAME, T, I)                                                                                  \
  extern "C" __global__ void NAME(const I* idx, Geom g, i64 n, i64 os, i64 size, i64 dim, i64 op, i64* err, i64* win) { \
    scatter_claim_k<I>(idx, g, n, os, size, dim, op, err, win);                                                         \
  }
#define KILN_SCATTER_WRITE(NAME, T, I)                                                                                 \
  extern "C" __global__ void NAME(T* out, const T* src, const I* idx, Geom g, i64 n, i64 os, i64 size, const i64* win) { \
    scatter_write_k<T, I>(out, src, idx, g, n, os, size, win);                                                         \
  }
#define KILN_INT_BINARY(NAME, F, T)                                                                      \
  extern "C" __global__ void NAME(T* out, const T* a, const T* b, Geom g, i64 n, i64 op, i64* err) { \
    int_binary_k<F, T>(out, a, b, g, n, op, err);                                                     \
  }
#define KILN_REMAINDER(NAME, T, I) KILN_INT_BINARY(NAME, kRemainder, T)
#define KILN_FMOD(NAME, T, I) KILN_INT_BINARY(NAME, kFmod, T)
#define KILN_POW(NAME, T, I) KILN_INT_BINARY(NAME, kPow, T)
#define KILN_CUMSUM(NAME, T, I)                                                                            \
  extern "C" __global__ void NAME(T* out, const T* in, Geom g, i64 rows, i64 len, i64 is, i64 os) { \
    cumsum_k<T>(out, in, g, rows, len, is, os);                                                          \
  }
#define KILN_INDEX_KEYS(NAME, T, I)                                                                    \
  extern "C" __global__ void NAME(const I* idx, i64 is, i64 n, i64 size, i64 dim, i64 op, i64* err, u64* key, \
                                  i64* pos) {                                                                 \
    index_keys_k<I>(idx, is, n, size, dim, op, err, key, pos);                                                 \
  }
#define KILN_SCATTER_KEYS(NAME, T, I)                                                                                 \
  extern "C" __global__ void NAME(const I* idx, Geom g, i64 n, i64 os, i64 size, i64 dim, i64 op, i64* err, u64 none, \
                                  u64* key, i64* pos) {                                                               \
    scatter_keys_k<I>(idx, g, n, os, size, dim, op, err, none, key, pos);                                             \
  }
#define KILN_RADIX_COUNT(NAME, T, I)                                                                              \
  extern "C" __global__ void __launch_bounds__(256) NAME(const u64* key, i64 n, i64 tiles, i32 shift, i64* hist) { \
    radix_count_k(key, n, tiles, shift, hist);                                                                    \
  }
#define KILN_BATCH_POINTERS(NAME, T, I) \
  extern "C" __global__ void NAME(u64* out, u64 c, u64 a, u64 b, Geom g, i64 n) { batch_pointers_k(out, c, a, b, g, n); }
#define KILN_RADIX_SCAN(NAME, T, I) \
  extern "C" __global__ void __launch_bounds__(1024) NAME(i64* hist, i64 m) { radix_scan_k(hist, m); }
#define KILN_RADIX_MOVE(NAME, T, I)                                                                             \
  extern "C" __global__ void __launch_bounds__(256) NAME(const u64* key_in, const i64* pos_in, u64* key_out,     \
                                                         i64* pos_out, i64 n, i64 tiles, i32 shift, const i64* hist) { \
    radix_move_k(key_in, pos_in, key_out, pos_out, n, tiles, shift, hist);                                      \
  }
#define KILN_SEGMENT_ADD_ROWS(NAME, T, I)                                                                        \
  extern "C" __global__ void NAME(T* out, const T* src, const u64* key, const i64* pos, Geom g, i64 len, i64 cols, \
                                  i64 os, i64 ss, i64 size) {                                                    \
    segment_add_rows_k<T>(out, src, key, pos, g, len, cols, os, ss, size);                                       \
  }
#define KILN_SEGMENT_ADD_ELEMENTS(NAME, T, I)                                                                      \
  extern "C" __global__ void NAME(T* out, const T* src, const u64* key, const i64* pos, Geom g, i64 n, u64 none) { \
    segment_add_elements_k<T>(out, src, key, pos, g, n, none);                                                     \
  }
)CUDA";

// The device source's storage type of a dtype.
const char* device_type(DType t) {
  switch (t) {
    case DType::Bool: return "kbool";
    case DType::Int32: return "i32";
    case DType::Int64: return "i64";
    case DType::Float16: return "khalf";
    case DType::BFloat16: return "kbf16";
    case DType::Float32: return "float";
    case DType::Float64: return "double";
  }
  return "float";
}

const char* macro(DeviceKernel k) {
  switch (k) {
    case DeviceKernel::Copy: return "KILN_COPY";
    case DeviceKernel::Cat: return "KILN_CAT";
    case DeviceKernel::Gather: return "KILN_GATHER";
    case DeviceKernel::ScatterAdd: return "KILN_SCATTER_ADD";
    case DeviceKernel::ScatterClaim: return "KILN_SCATTER_CLAIM";
    case DeviceKernel::ScatterWrite: return "KILN_SCATTER_WRITE";
    case DeviceKernel::Cumsum: return "KILN_CUMSUM";
    case DeviceKernel::Remainder: return "KILN_REMAINDER";
    case DeviceKernel::Fmod: return "KILN_FMOD";
    case DeviceKernel::Pow: return "KILN_POW";
    case DeviceKernel::IndexKeys: return "KILN_INDEX_KEYS";
    case DeviceKernel::ScatterKeys: return "KILN_SCATTER_KEYS";
    case DeviceKernel::RadixCount: return "KILN_RADIX_COUNT";
    case DeviceKernel::RadixScan: return "KILN_RADIX_SCAN";
    case DeviceKernel::RadixMove: return "KILN_RADIX_MOVE";
    case DeviceKernel::SegmentAddRows: return "KILN_SEGMENT_ADD_ROWS";
    case DeviceKernel::SegmentAddElements: return "KILN_SEGMENT_ADD_ELEMENTS";
    case DeviceKernel::BatchPointers: return "KILN_BATCH_POINTERS";
    case DeviceKernel::AttentionForward:
    case DeviceKernel::AttentionBackwardQ:
    case DeviceKernel::AttentionBackwardKV:
    case DeviceKernel::AttentionForwardTiled:
    case DeviceKernel::AttentionBackwardQTiled:
    case DeviceKernel::AttentionBackwardKVTiled: return "KILN_ATTENTION";
    case DeviceKernel::FlashForward:
    case DeviceKernel::FlashBackwardKV:
    case DeviceKernel::FlashBackwardQ:
    case DeviceKernel::FlashBackwardPrep:
    case DeviceKernel::FlashScan:
    case DeviceKernel::FlashForwardWarpgroup:
    case DeviceKernel::FlashBackwardKVWarpgroup:
    case DeviceKernel::FlashBackwardQWarpgroup: return "KILN_FLASH";
  }
  return "";
}

const char* attention_template(DeviceKernel k) {
  switch (k) {
    case DeviceKernel::AttentionForward: return "attn_fwd";
    case DeviceKernel::AttentionBackwardQ: return "attn_bwd_q";
    case DeviceKernel::AttentionBackwardKV: return "attn_bwd_kv";
    case DeviceKernel::AttentionForwardTiled: return "attn_fwd_tiled";
    case DeviceKernel::AttentionBackwardQTiled: return "attn_bwd_q_tiled";
    case DeviceKernel::FlashForward: return "flash_fwd";
    case DeviceKernel::FlashBackwardKV: return "flash_bwd_kv";
    case DeviceKernel::FlashBackwardQ: return "flash_bwd_q";
    case DeviceKernel::FlashBackwardPrep: return "flash_bwd_prep";
    case DeviceKernel::FlashScan: return "flash_scan";
    case DeviceKernel::FlashForwardWarpgroup: return "flash_fwd_wg";
    case DeviceKernel::FlashBackwardKVWarpgroup: return "flash_bwd_kv_wg";
    case DeviceKernel::FlashBackwardQWarpgroup: return "flash_bwd_q_wg";
    default: return "attn_bwd_kv_tiled";
  }
}

// The unsigned type of a cat unit's bytes.
const char* cat_unit(int bytes) {
  switch (bytes) {
    case 1: return "u8";
    case 2: return "u16";
    case 4: return "u32";
    case 8: return "u64";
    case 16: return "u128";
  }
  throw Error("device kernels: a cat unit of " + std::to_string(bytes) + " bytes");
}

const DType kAll[] = {DType::Bool,     DType::Int32,   DType::Int64,  DType::Float16,
                      DType::BFloat16, DType::Float32, DType::Float64};
const DType kIndex[] = {DType::Int32, DType::Int64};

}  // namespace

std::string device_kernel_name(const DeviceKernelInstance& k) {
  switch (k.kernel) {
    case DeviceKernel::Copy: return std::string("kiln_copy_") + dtype_name(k.a) + "_from_" + dtype_name(k.b);
    case DeviceKernel::Cat: return "kiln_cat_" + std::to_string(k.head) + "b";
    case DeviceKernel::Gather: return std::string("kiln_gather_") + dtype_name(k.a) + "_" + dtype_name(k.b);
    case DeviceKernel::ScatterAdd: return std::string("kiln_scatter_add_") + dtype_name(k.a) + "_" + dtype_name(k.b);
    case DeviceKernel::ScatterClaim: return std::string("kiln_scatter_claim_") + dtype_name(k.b);
    case DeviceKernel::ScatterWrite:
      return std::string("kiln_scatter_write_") + dtype_name(k.a) + "_" + dtype_name(k.b);
    case DeviceKernel::Cumsum: return std::string("kiln_cumsum_") + dtype_name(k.a);
    case DeviceKernel::Remainder: return std::string("kiln_remainder_") + dtype_name(k.a);
    case DeviceKernel::Fmod: return std::string("kiln_fmod_") + dtype_name(k.a);
    case DeviceKernel::Pow: return std::string("kiln_pow_") + dtype_name(k.a);
    case DeviceKernel::IndexKeys: return std::string("kiln_index_keys_") + dtype_name(k.b);
    case DeviceKernel::ScatterKeys: return std::string("kiln_scatter_keys_") + dtype_name(k.b);
    case DeviceKernel::RadixCount: return "kiln_radix_count";
    case DeviceKernel::RadixScan: return "kiln_radix_scan";
    case DeviceKernel::RadixMove: return "kiln_radix_move";
    case DeviceKernel::SegmentAddRows: return std::string("kiln_segment_add_rows_") + dtype_name(k.a);
    case DeviceKernel::SegmentAddElements: return std::string("kiln_segment_add_elements_") + dtype_name(k.a);
    case DeviceKernel::BatchPointers: return "kiln_batch_pointers";
    case DeviceKernel::AttentionForward:
    case DeviceKernel::AttentionBackwardQ:
    case DeviceKernel::AttentionBackwardKV:
    case DeviceKernel::AttentionForwardTiled:
    case DeviceKernel::AttentionBackwardQTiled:
    case DeviceKernel::AttentionBackwardKVTiled:
    case DeviceKernel::FlashForward:
    case DeviceKernel::FlashBackwardKV:
    case DeviceKernel::FlashBackwardQ:
    case DeviceKernel::FlashBackwardPrep:
    case DeviceKernel::FlashScan:
    case DeviceKernel::FlashForwardWarpgroup:
    case DeviceKernel::FlashBackwardKVWarpgroup:
    case DeviceKernel::FlashBackwardQWarpgroup:
      return std::string("kiln_") + attention_template(k.kernel) + "_" + dtype_name(k.a) +
             (k.tf32_passes == 1 ? "_tf32" : k.tf32_passes == 3 ? "_tf32x3" : "") + (k.careful ? "_careful" : "") +
             "_h" + std::to_string(k.head);
  }
  return "";
}

namespace {
// The source a kernel's program is built from: the plain templates, the CUDA-core attention
// kernels or the tensor-core (flash) ones (each after attention_common_source()).
enum class Family { Plain, Attention, Flash };
Family family(DeviceKernel k) {
  switch (k) {
    case DeviceKernel::AttentionForward:
    case DeviceKernel::AttentionBackwardQ:
    case DeviceKernel::AttentionBackwardKV:
    case DeviceKernel::AttentionForwardTiled:
    case DeviceKernel::AttentionBackwardQTiled:
    case DeviceKernel::AttentionBackwardKVTiled: return Family::Attention;
    case DeviceKernel::FlashForward:
    case DeviceKernel::FlashBackwardKV:
    case DeviceKernel::FlashBackwardQ:
    case DeviceKernel::FlashBackwardPrep:
    case DeviceKernel::FlashScan:
    case DeviceKernel::FlashForwardWarpgroup:
    case DeviceKernel::FlashBackwardKVWarpgroup:
    case DeviceKernel::FlashBackwardQWarpgroup: return Family::Flash;
    default: return Family::Plain;
  }
}
}  // namespace

bool is_attention_kernel(DeviceKernel k) { return family(k) == Family::Attention; }

bool needs_sm90a(DeviceKernel k) {
  return k == DeviceKernel::FlashForwardWarpgroup || k == DeviceKernel::FlashBackwardKVWarpgroup ||
         k == DeviceKernel::FlashBackwardQWarpgroup;
}

int attention_head_bucket(int64_t d) { return d <= 32 ? 32 : d <= 64 ? 64 : d <= 128 ? 128 : 256; }

std::string device_kernel_program(const std::vector<DeviceKernelInstance>& ks) {
  // One family per program.
  const Family fam = ks.empty() ? Family::Plain : family(ks[0].kernel);
  std::string s = fam == Family::Plain ? std::string(kSource)
                                       : std::string(attention_common_source()) +
                                             (fam == Family::Attention ? attention_kernel_source() : flash_kernel_source());
  for (const DeviceKernelInstance& k : ks) {
    if (family(k.kernel) != fam) throw Error("device kernels: kernels of two families in one program");
    if (fam == Family::Flash)
      s += std::string(macro(k.kernel)) + "(" + device_kernel_name(k) + ", " + attention_template(k.kernel) + ", " +
           flash_element(k) + ", " + std::to_string(k.head) + ")\n";
    else if (fam == Family::Attention)
      s += std::string(macro(k.kernel)) + "(" + device_kernel_name(k) + ", " + attention_template(k.kernel) + ", " +
           device_type(k.a) + ", " + std::to_string(k.head) + ")\n";
    else if (k.kernel == DeviceKernel::Cat)
      s += std::string(macro(k.kernel)) + "(" + device_kernel_name(k) + ", " + cat_unit(k.head) + ")\n";
    else
      s += std::string(macro(k.kernel)) + "(" + device_kernel_name(k) + ", " + device_type(k.a) + ", " +
           device_type(k.b) + ")\n";
  }
  return s;
}

std::vector<DeviceKernelInstance> all_device_kernels() {
  std::vector<DeviceKernelInstance> v;
  for (DType a : kAll) {
    for (DType b : kAll) v.push_back({DeviceKernel::Copy, a, b});
    for (DType i : kIndex)
      for (DeviceKernel k : {DeviceKernel::Gather, DeviceKernel::ScatterAdd, DeviceKernel::ScatterWrite})
        v.push_back({k, a, i});
    v.push_back({DeviceKernel::Cumsum, a, DType::Int64});
  }
  for (DType i : kIndex) {
    v.push_back({DeviceKernel::ScatterClaim, DType::Float32, i});
    for (DeviceKernel k : {DeviceKernel::IndexKeys, DeviceKernel::ScatterKeys}) v.push_back({k, DType::Float32, i});
    for (DeviceKernel k : {DeviceKernel::Remainder, DeviceKernel::Fmod, DeviceKernel::Pow}) v.push_back({k, i});
  }
  v.push_back({DeviceKernel::Pow, DType::Bool});
  for (int bytes : {1, 2, 4, 8, 16}) v.push_back({DeviceKernel::Cat, DType::Float32, DType::Int64, bytes});
  for (DeviceKernel k :
       {DeviceKernel::RadixCount, DeviceKernel::RadixScan, DeviceKernel::RadixMove, DeviceKernel::BatchPointers})
    v.push_back({k});
  for (DType t : {DType::Float16, DType::BFloat16, DType::Float32, DType::Float64})
    for (DeviceKernel k : {DeviceKernel::SegmentAddRows, DeviceKernel::SegmentAddElements}) v.push_back({k, t});
  for (DeviceKernel k :
       {DeviceKernel::AttentionForward, DeviceKernel::AttentionBackwardQ, DeviceKernel::AttentionBackwardKV})
    for (DType t : {DType::Float32, DType::Float64})
      for (int head : {32, 64, 128, 256}) v.push_back({k, t, DType::Int64, head});
  for (DeviceKernel k : {DeviceKernel::AttentionForwardTiled, DeviceKernel::AttentionBackwardQTiled,
                         DeviceKernel::AttentionBackwardKVTiled})
    for (int head : {32, 64, 128}) v.push_back({k, DType::Float32, DType::Int64, head});
  for (DeviceKernel k : {DeviceKernel::FlashForward, DeviceKernel::FlashBackwardKV, DeviceKernel::FlashBackwardQ,
                         DeviceKernel::FlashBackwardPrep})
    for (int head = 32; head <= 256; head += 32) {
      for (DType t : {DType::BFloat16, DType::Float16}) v.push_back({k, t, DType::Int64, head});
      for (int passes : {1, 3}) v.push_back({k, DType::Float32, DType::Int64, head, passes});
      if (k != DeviceKernel::FlashBackwardPrep) v.push_back({k, DType::Float32, DType::Int64, head, 3, true});
    }
  v.push_back({DeviceKernel::FlashScan, DType::Float32, DType::Int64, 32, 3});
  for (DeviceKernel k : {DeviceKernel::FlashForwardWarpgroup, DeviceKernel::FlashBackwardKVWarpgroup,
                         DeviceKernel::FlashBackwardQWarpgroup})
    for (int head : {64, 128})
      for (DType t : {DType::BFloat16, DType::Float16}) v.push_back({k, t, DType::Int64, head});
  return v;
}

}  // namespace kiln::kernels
