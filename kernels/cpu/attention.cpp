// Fused scaled dot-product attention on the CPU, forward and backward, FlashAttention-style:
// q·kᵀ is formed one block of queries × one block of keys at a time with single-threaded BLAS
// products, the softmax is computed online (running row maximum and sum), and the Tq × Tk matrix
// never exists. The backward recomputes each block's probabilities from the saved row
// log-sum-exp. Work is spread over TBB by (batch, query block) forward and by batch backward
// (the dq of one batch element gathers from every key block).
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "kernels/cpu/attention_dropout.h"
#include "kernels/cpu/gemm_block.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/vmath.h"
#include "runtime/core/error.h"
#include "runtime/ir/attention_lse.h"

namespace kiln::kernels {
namespace {

constexpr int64_t kBlockQ = 64, kBlockK = 128;

// Element offsets of each batch element (the dims before the last two) in an operand whose
// batch dims are `batch` (right-aligned, broadcast dims stride 0).
std::vector<int64_t> batch_offsets(const std::vector<int64_t>& batch, const std::vector<int64_t>& strides) {
  int64_t count = 1;
  for (int64_t s : batch) count *= s;
  std::vector<int64_t> offs(static_cast<size_t>(count), 0);
  const size_t nb = batch.size();
  for (int64_t b = 0; b < count; ++b) {
    int64_t rem = b, off = 0;
    for (size_t d = nb; d-- > 0;) {
      off += (rem % batch[d]) * strides[d];
      rem /= batch[d];
    }
    offs[static_cast<size_t>(b)] = off;
  }
  return offs;
}

// The geometry shared by forward and backward: batch offsets of every operand, the mask's
// strides over [batch..., Tq, Tk] (0 where it broadcasts).
struct Geometry {
  int64_t tq = 0, tk = 0, d = 0;
  std::vector<int64_t> batch;
  std::vector<int64_t> mask_off;  // per batch element (empty without a mask)
  int64_t mask_si = 0, mask_sj = 0;
  int64_t count() const {
    int64_t c = 1;
    for (int64_t s : batch) c *= s;
    return c;
  }
  std::vector<int64_t> offsets(const Operand& o) const {
    return batch_offsets(batch, std::vector<int64_t>(o.strides.begin(), o.strides.end() - 2));
  }
};

Geometry geometry(const Operand& q, const Operand& k, const Operand* mask) {
  Geometry g;
  const size_t r = q.sizes.size();
  g.tq = q.sizes[r - 2];
  g.d = q.sizes[r - 1];
  g.tk = k.sizes[r - 2];
  g.batch.assign(q.sizes.begin(), q.sizes.end() - 2);
  if (mask) {
    std::vector<int64_t> full = g.batch;
    full.push_back(g.tq);
    full.push_back(g.tk);
    const std::vector<int64_t> st = mask->broadcast_strides(full);
    g.mask_off = batch_offsets(g.batch, std::vector<int64_t>(st.begin(), st.end() - 2));
    g.mask_si = st[r - 2];
    g.mask_sj = st[r - 1];
  }
  return g;
}

// rows × cols of a strided matrix copied densely into `dst` (row stride cols).
template <class T>
void gather_rows(T* dst, const T* src, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = src[i * rs + j * cs];
}

// x[i] = exp(x[i]) over n elements with kiln's exp (the same bits as every other kernel).
template <class T>
void exp_inplace(T* x, int64_t n) {
  constexpr int64_t lanes = std::is_same_v<T, float> ? 8 : 4;
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    if constexpr (std::is_same_v<T, float>)
      vmath::apply8f(vmath::Fn::Exp, x + i, nullptr);
    else
      vmath::apply4d(vmath::Fn::Exp, x + i, nullptr);
  }
  for (; i < n; ++i) {
    if constexpr (std::is_same_v<T, float>)
      x[i] = vmath::f32(vmath::Fn::Exp, x[i]);
    else
      x[i] = vmath::f64(vmath::Fn::Exp, x[i]);
  }
}

// A [rows, d] matrix of one batch element for BLAS: in place when its rows are unit-stride,
// else a dense copy.
template <class T>
struct Rows {
  const T* p = nullptr;
  int64_t ld = 1;
  std::vector<T> buf;
  Rows(const Operand& o, int64_t off, int64_t rows, int64_t d) {
    const size_t r = o.sizes.size();
    const int64_t rs = o.strides[r - 2], cs = o.strides[r - 1];
    if (cs == 1 && (rows <= 1 || rs >= d)) {
      p = o.ptr<T>() + off;
      ld = std::max<int64_t>({rs, d, 1});
      return;
    }
    buf.resize(static_cast<size_t>(rows * d));
    gather_rows(buf.data(), o.ptr<T>() + off, rows, d, rs, cs);
    p = buf.data();
    ld = std::max<int64_t>(d, 1);
  }
  const T* row(int64_t i) const { return p + i * ld; }
};

// Keys of row i visible in the key block [j0, j0 + cols): all, or under causal those <= i.
inline int64_t visible(bool causal, int64_t i, int64_t j0, int64_t cols) {
  return causal ? std::clamp<int64_t>(i + 1 - j0, 0, cols) : cols;
}

// The row loops below are compiled twice, for AVX2 and for the baseline, and the CPU picks one
// when the library loads (GCC's target_clones). Not under ThreadSanitizer: the clones' ifunc
// resolvers run during relocation, before its runtime starts, and crash the program.
#if defined(__SANITIZE_THREAD__)
#define KILN_ROW_CLONES
#else
#define KILN_ROW_CLONES __attribute__((target_clones("avx2", "default")))
#endif

// Online softmax step of one query row over a block of scaled scores `row` (valid entries first,
// the rest zeroed): adds the mask row, updates the running maximum m and sum l, rescales the
// row's accumulator and leaves the block's unnormalized probabilities in `row`.
template <class T>
inline void forward_row_impl(T* row, int64_t valid, int64_t cols, const T* mrow, int64_t msj, T& m, T& l, T* acc,
                             int64_t d) {
  const T ninf = -std::numeric_limits<T>::infinity();
  if (mrow)
    for (int64_t c = 0; c < valid; ++c) row[c] += mrow[c * msj];
  for (int64_t c = valid; c < cols; ++c) row[c] = T(0);
  T mx = m;
  for (int64_t c = 0; c < valid; ++c) mx = std::max(mx, row[c]);
  if (mx == ninf) {  // nothing visible yet: the block adds nothing
    for (int64_t c = 0; c < valid; ++c) row[c] = T(0);
    return;
  }
  for (int64_t c = 0; c < valid; ++c) row[c] -= mx;
  exp_inplace(row, valid);
  T sum = 0;
  for (int64_t c = 0; c < valid; ++c) sum += row[c];
  T alpha = 0;
  if (m != ninf) {
    alpha = m - mx;
    exp_inplace(&alpha, 1);
  }
  l = l * alpha + sum;
  m = mx;
  for (int64_t c = 0; c < d; ++c) acc[c] *= alpha;
}
KILN_ROW_CLONES void forward_row(float* row, int64_t valid, int64_t cols, const float* mrow, int64_t msj, float& m,
                                 float& l, float* acc, int64_t d) {
  forward_row_impl(row, valid, cols, mrow, msj, m, l, acc, d);
}
KILN_ROW_CLONES void forward_row(double* row, int64_t valid, int64_t cols, const double* mrow, int64_t msj, double& m,
                                 double& l, double* acc, int64_t d) {
  forward_row_impl(row, valid, cols, mrow, msj, m, l, acc, d);
}

// Backward, one query row of a block: probabilities p = exp(score + mask - lse) from the scaled
// scores in `row` (valid entries; the rest zeroed).
template <class T>
inline void probabilities_row_impl(T* row, int64_t valid, int64_t cols, const T* mrow, int64_t msj, T lse) {
  if (mrow)
    for (int64_t c = 0; c < valid; ++c) row[c] += mrow[c * msj];
  for (int64_t c = 0; c < valid; ++c) row[c] -= lse;
  exp_inplace(row, valid);
  for (int64_t c = valid; c < cols; ++c) row[c] = T(0);
}
// ds = p · (dp - delta) · scale, in place of dp.
template <class T>
inline void score_grad_row_impl(T* dp, const T* p, int64_t cols, T delta, T scale) {
  for (int64_t c = 0; c < cols; ++c) dp[c] = p[c] * (dp[c] - delta) * scale;
}
KILN_ROW_CLONES void probabilities_row(float* row, int64_t valid, int64_t cols, const float* mrow, int64_t msj,
                                       float lse) {
  probabilities_row_impl(row, valid, cols, mrow, msj, lse);
}
KILN_ROW_CLONES void probabilities_row(double* row, int64_t valid, int64_t cols, const double* mrow, int64_t msj,
                                       double lse) {
  probabilities_row_impl(row, valid, cols, mrow, msj, lse);
}
KILN_ROW_CLONES void score_grad_row(float* dp, const float* p, int64_t cols, float delta, float scale) {
  score_grad_row_impl(dp, p, cols, delta, scale);
}
KILN_ROW_CLONES void score_grad_row(double* dp, const double* p, int64_t cols, double delta, double scale) {
  score_grad_row_impl(dp, p, cols, delta, scale);
}

template <class T>
void forward(const Operand& out, const Operand& qo, const Operand& ko, const Operand& vo, const Operand* mask,
             bool causal, T scale, const std::optional<DropoutMask>& drop) {
  const Geometry g = geometry(qo, ko, mask);
  const int64_t count = g.count(), d = g.d, tq = g.tq, tk = g.tk;
  const std::vector<int64_t> oq = g.offsets(qo), ok = g.offsets(ko), ov = g.offsets(vo), oo = g.offsets(out);
  const size_t r = out.sizes.size();
  const int64_t ors = out.strides[r - 2];
  const int64_t qblocks = (tq + kBlockQ - 1) / kBlockQ;
  const T ninf = -std::numeric_limits<T>::infinity();
  auto run = [&](int64_t b, int64_t qb) {
    const Rows<T> q(qo, oq[b], tq, d), k(ko, ok[b], tk, d), v(vo, ov[b], tk, d);
    std::vector<T> s(static_cast<size_t>(kBlockQ * kBlockK)), acc(static_cast<size_t>(kBlockQ * d));
    std::vector<T> m(kBlockQ), l(kBlockQ);
    const T* mb = mask ? mask->ptr<T>() + g.mask_off[b] : nullptr;
    {
      const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, tq - i0);
      std::fill(m.begin(), m.end(), ninf);
      std::fill(l.begin(), l.end(), T(0));
      std::fill(acc.begin(), acc.end(), T(0));
      const int64_t jend = causal ? std::min(tk, i0 + rows) : tk;
      for (int64_t j0 = 0; j0 < jend; j0 += kBlockK) {
        const int64_t cols = std::min(kBlockK, jend - j0);
        gemm_block<T>(false, true, rows, cols, d, scale, q.row(i0), q.ld, k.row(j0), k.ld, T(0), s.data(), cols);
        for (int64_t rr = 0; rr < rows; ++rr) {
          const int64_t i = i0 + rr;
          const int64_t valid = visible(causal, i, j0, cols);
          forward_row(s.data() + rr * cols, valid, cols, mb ? mb + i * g.mask_si + j0 * g.mask_sj : nullptr, g.mask_sj,
                      m[rr], l[rr], acc.data() + rr * d, d);
          // (the row sum l is the softmax's, before dropout; dropped entries add nothing to acc)
          if (drop) drop->apply(s.data() + rr * cols, valid, static_cast<uint64_t>((b * tq + i) * tk + j0));
        }
        gemm_block<T>(false, false, rows, d, cols, T(1), s.data(), cols, v.row(j0), v.ld, T(1), acc.data(), d);
      }
      for (int64_t rr = 0; rr < rows; ++rr) {
        T* o = out.ptr<T>() + oo[b] + (i0 + rr) * ors;
        const T* a = acc.data() + rr * d;
        // No keys at all: zeros (an empty softmax·v), as the unfused graph gives.
        for (int64_t c = 0; c < d; ++c) o[c] = tk == 0 ? T(0) : a[c] / l[rr];
        o[d] = m[rr] + std::log(l[rr]);
      }
    }
  };
  const int64_t items = count * qblocks;
  if (items == 0) return;
  parallel_for(int64_t{0}, items, [&](int64_t it) { run(it / qblocks, it % qblocks); });
}

template <class T>
void backward(const Operand& out, const Operand& qo, const Operand& ko, const Operand& vo, const Operand& fwd,
              const Operand& gout, const Operand* mask, bool causal, T scale, const std::optional<DropoutMask>& drop) {
  const Geometry g = geometry(qo, ko, mask);
  const int64_t count = g.count(), d = g.d, tq = g.tq, tk = g.tk;
  const std::vector<int64_t> oq = g.offsets(qo), ok = g.offsets(ko), ov = g.offsets(vo), of = g.offsets(fwd),
                             og = g.offsets(gout), oo = g.offsets(out);
  const size_t r = out.sizes.size();
  const int64_t ors = out.strides[r - 2], frs = fwd.strides[r - 2], fcs = fwd.strides[r - 1], grs = gout.strides[r - 2],
                gcs = gout.strides[r - 1];
  const bool glse = gout.sizes[r - 1] > d;  // (dO alone: the log-sum-exp gets no gradient)
  auto run = [&](int64_t b) {
    const Rows<T> q(qo, oq[b], tq, d), k(ko, ok[b], tk, d), v(vo, ov[b], tk, d);
    // dO, the row log-sum-exp and delta_i = dO_i·O_i - dLSE_i (0 without its gradient).
    std::vector<T> go(static_cast<size_t>(tq * d)), lse(static_cast<size_t>(tq)), delta(static_cast<size_t>(tq));
    const T* fp = fwd.ptr<T>() + of[b];
    const T* gp = gout.ptr<T>() + og[b];
    gather_rows(go.data(), gp, tq, d, grs, gcs);
    for (int64_t i = 0; i < tq; ++i) {
      T dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += go[i * d + c] * fp[i * frs + c * fcs];
      lse[i] = fp[i * frs + d * fcs];
      delta[i] = glse ? dot - gp[i * grs + d * gcs] : dot;
    }
    std::vector<T> dq(static_cast<size_t>(tq * d), T(0)), dk(static_cast<size_t>(kBlockK * d)),
        dv(static_cast<size_t>(kBlockK * d));
    std::vector<T> p(static_cast<size_t>(kBlockQ * kBlockK)), dp(static_cast<size_t>(kBlockQ * kBlockK));
    std::vector<T> pkept(drop ? p.size() : 0);  // with dropout: p with the mask applied
    const T* mb = mask ? mask->ptr<T>() + g.mask_off[b] : nullptr;
    T* ob = out.ptr<T>() + oo[b];
    for (int64_t j0 = 0; j0 < tk; j0 += kBlockK) {
      const int64_t cols = std::min(kBlockK, tk - j0);
      std::fill(dk.begin(), dk.end(), T(0));
      std::fill(dv.begin(), dv.end(), T(0));
      for (int64_t i0 = causal ? (j0 / kBlockQ) * kBlockQ : 0; i0 < tq; i0 += kBlockQ) {
        const int64_t rows = std::min(kBlockQ, tq - i0);
        gemm_block<T>(false, true, rows, cols, d, scale, q.row(i0), q.ld, k.row(j0), k.ld, T(0), p.data(), cols);
        for (int64_t rr = 0; rr < rows; ++rr) {
          const int64_t i = i0 + rr;
          probabilities_row(p.data() + rr * cols, visible(causal, i, j0, cols), cols,
                            mb ? mb + i * g.mask_si + j0 * g.mask_sj : nullptr, g.mask_sj, lse[i]);
        }
        // dv += p'ᵀ·dO; dp = (dO·vᵀ)' ; ds = p·(dp - delta)·scale; dq += ds·k; dk += dsᵀ·q, where x' is x
        // with the dropout mask applied (none: x' = x).
        gemm_block<T>(false, true, rows, cols, d, T(1), go.data() + i0 * d, d, v.row(j0), v.ld, T(0), dp.data(), cols);
        const T* pv = p.data();
        if (drop) {
          std::copy(p.begin(), p.begin() + rows * cols, pkept.begin());
          for (int64_t rr = 0; rr < rows; ++rr) {
            const uint64_t idx0 = static_cast<uint64_t>((b * tq + i0 + rr) * tk + j0);
            drop->apply(pkept.data() + rr * cols, cols, idx0);
            drop->apply(dp.data() + rr * cols, cols, idx0);
          }
          pv = pkept.data();
        }
        gemm_block<T>(true, false, cols, d, rows, T(1), pv, cols, go.data() + i0 * d, d, T(1), dv.data(), d);
        for (int64_t rr = 0; rr < rows; ++rr)
          score_grad_row(dp.data() + rr * cols, p.data() + rr * cols, cols, delta[i0 + rr], scale);
        gemm_block<T>(false, false, rows, d, cols, T(1), dp.data(), cols, k.row(j0), k.ld, T(1), dq.data() + i0 * d, d);
        gemm_block<T>(true, false, cols, d, rows, T(1), dp.data(), cols, q.row(i0), q.ld, T(1), dk.data(), d);
      }
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t e = 0; e < d; ++e) {
          ob[(tq + j0 + c) * ors + e] = dk[c * d + e];
          ob[(tq + tk + j0 + c) * ors + e] = dv[c * d + e];
        }
    }
    for (int64_t i = 0; i < tq; ++i)
      for (int64_t e = 0; e < d; ++e) ob[i * ors + e] = dq[i * d + e];
  };
  if (count == 0) return;
  parallel_for(int64_t{0}, count, run);
}

void check_float(DType t, const char* op) {
  KILN_CHECK(t == DType::Float32 || t == DType::Float64, op, ": expected float32 or float64, got ", dtype_name(t));
}
void check_inputs(DType t, const Operand& q, const char* op) {
  KILN_CHECK(q.dtype == t, op, ": expected inputs of the output's dtype ", dtype_name(t), ", got ", dtype_name(q.dtype));
}

// A dense float32 copy of a 16-bit operand (16-bit attention computes in float32); other
// operands pass through.
struct Widened {
  std::vector<float> buf;
  Operand op;
  Widened(const Widened&) = delete;  // (op.data points into buf)
  explicit Widened(const Operand& o) : op(o) {
    if (!is_half(o.dtype)) return;
    dense(o.sizes);
    unary(OpKind::Contiguous, op, o);
  }
  // A dense float32 buffer of `sizes`.
  explicit Widened(const std::vector<int64_t>& sizes) { dense(sizes); }

 private:
  void dense(const std::vector<int64_t>& sizes) {
    op.dtype = DType::Float32;
    op.sizes = sizes;
    op.strides.resize(sizes.size());
    int64_t st = 1;
    for (size_t d = sizes.size(); d-- > 0;) {
      op.strides[d] = st;
      st *= sizes[d];
    }
    buf.resize(static_cast<size_t>(std::max<int64_t>(1, st)));
    op.data = reinterpret_cast<char*>(buf.data());
  }
};

// Calls f(row of a, row of b) for every row (all dims but the last) of two operands of the same
// leading sizes, with each one's element stride along the row.
template <class A, class B, class F>
void each_row(const Operand& a, const Operand& b, F f) {
  const size_t r = a.sizes.size();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < r; ++i) rows *= a.sizes[i];
  for (int64_t x = 0; x < rows; ++x) {
    int64_t rem = x, oa = 0, ob = 0;
    for (size_t i = r - 1; i-- > 0;) {
      const int64_t at = rem % a.sizes[i];
      rem /= a.sizes[i];
      oa += at * a.strides[i];
      ob += at * b.strides[i];
    }
    f(a.ptr<A>() + oa, b.ptr<B>() + ob);
  }
}

// A 16-bit packed forward output [..., Tq, W] from its float32 form [..., Tq, d + 1]: the rows
// rounded, the log-sum-exp in pieces (runtime/ir/attention_lse.h), zeros past them.
template <class H>
void pack_half(const Operand& out, const Operand& wide, int64_t d) {
  const size_t r = out.sizes.size();
  const int64_t cs = out.strides[r - 1], ws = wide.strides[r - 1], w = out.sizes[r - 1];
  each_row<H, float>(out, wide, [&](H* o, const float* f) {
    H lse[kAttentionLsePieces];
    encode_lse(f[d * ws], lse);
    for (int64_t c = 0; c < w; ++c)
      o[c * cs] = c < d ? H(f[c * ws]) : c < d + kAttentionLsePieces ? lse[c - d] : H(0.f);
  });
}

// The float32 form [..., Tq, d + 1] of a 16-bit packed forward output.
template <class H>
void unpack_half(const Operand& wide, const Operand& packed, int64_t d) {
  const size_t r = packed.sizes.size();
  const int64_t cs = packed.strides[r - 1], ws = wide.strides[r - 1];
  each_row<float, H>(wide, packed, [&](float* f, const H* p) {
    for (int64_t c = 0; c < d; ++c) f[c * ws] = static_cast<float>(p[c * cs]);
    f[d * ws] = decode_lse(p + d * cs, static_cast<long>(cs));
  });
}

template <class F>
void dispatch_half(DType t, F&& f) {
  if (t == DType::BFloat16)
    f(BFloat16{});
  else
    f(Half{});
}

std::vector<int64_t> with_last(std::vector<int64_t> sizes, int64_t last) {
  sizes.back() = last;
  return sizes;
}

}  // namespace

std::optional<DropoutMask> mask_of(const AttentionDropout& d) {
  if (!d.rng || d.p <= 0) return std::nullopt;
  return DropoutMask::of(d);
}

void attention(const Operand& out, const Operand& q, const Operand& k, const Operand& v, const Operand* mask,
               bool causal, double scale, const AttentionDropout& drop) {
  if (is_half(out.dtype)) {  // computed in float32, then rounded once into the packed 16-bit form
    const int64_t d = q.sizes.back();
    const Widened wide(with_last(out.sizes, d + 1));
    const Widened wm = mask ? Widened(*mask) : Widened(Operand{});
    attention(wide.op, Widened(q).op, Widened(k).op, Widened(v).op, mask ? &wm.op : nullptr, causal, scale, drop);
    dispatch_half(out.dtype, [&](auto h) { pack_half<decltype(h)>(out, wide.op, d); });
    return;
  }
  check_float(out.dtype, "attention");
  check_inputs(out.dtype, q, "attention");
  if (out.dtype == DType::Float32)
    forward<float>(out, q, k, v, mask, causal, static_cast<float>(scale), mask_of(drop));
  else
    forward<double>(out, q, k, v, mask, causal, scale, mask_of(drop));
}

void attention_backward(const Operand& out, const Operand& q, const Operand& k, const Operand& v, const Operand& fwd,
                        const Operand& gout, const Operand* mask, bool causal, double scale,
                        const AttentionDropout& drop) {
  if (is_half(out.dtype)) {  // in float32 from the unpacked forward output and dO, rounded once
    const int64_t d = q.sizes.back();
    const Widened wfwd(with_last(fwd.sizes, d + 1)), wout(out.sizes);
    dispatch_half(fwd.dtype, [&](auto h) { unpack_half<decltype(h)>(wfwd.op, fwd, d); });
    Operand dout = gout;
    dout.sizes.back() = d;  // (the pieces' columns carry no gradient)
    const Widened wm = mask ? Widened(*mask) : Widened(Operand{});
    attention_backward(wout.op, Widened(q).op, Widened(k).op, Widened(v).op, wfwd.op, Widened(dout).op,
                       mask ? &wm.op : nullptr, causal, scale, drop);
    unary(OpKind::Contiguous, out, wout.op);
    return;
  }
  check_float(out.dtype, "attention_backward");
  check_inputs(out.dtype, q, "attention_backward");
  if (out.dtype == DType::Float32)
    backward<float>(out, q, k, v, fwd, gout, mask, causal, static_cast<float>(scale), mask_of(drop));
  else
    backward<double>(out, q, k, v, fwd, gout, mask, causal, scale, mask_of(drop));
}

}  // namespace kiln::kernels
