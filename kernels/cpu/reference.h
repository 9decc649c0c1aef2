// Reference CPU kernels used by the interpreter. Each writes a fresh output operand.
#pragma once
#include <functional>
#include <vector>

#include "kernels/cpu/attention_dropout.h"
#include "kernels/cpu/strided.h"
#include "runtime/ir/node.h"

namespace kiln::kernels {

// out[...] = value (ints holds an exact integer value when non-empty).
void fill(const Operand& out, double value, const std::vector<int64_t>& ints);
// out[i] = start + i * step.
void arange(const Operand& out, const Attrs& attrs);
// Philox-based random fill for RandUniform / RandNormal / RandInt.
void random(OpKind op, const Operand& out, const Attrs& attrs);
// Pointwise unary op (Cast and Contiguous included: convert/copy `in` broadcast to out).
void unary(OpKind op, const Operand& out, const Operand& in);
// Pointwise binary op over broadcast inputs of one dtype.
void binary(OpKind op, const Operand& out, const Operand& a, const Operand& b);
// out = cond ? a : b.
void where(const Operand& out, const Operand& cond, const Operand& a, const Operand& b);
// Reduction of `in` over sorted dims into out (keepdim or not).
void reduce(OpKind op, const Operand& out, const Operand& in, const std::vector<int64_t>& dims);
// Inclusive prefix sum along dim.
void cumsum(const Operand& out, const Operand& in, int64_t dim);
// Indexing kernels; index values are checked and a kiln::Error names a bad one.
void gather(const Operand& out, const Operand& x, const Operand& index, int64_t dim);
void scatter(OpKind op, const Operand& out, const Operand& index, const Operand& src, int64_t dim);
void index_select(const Operand& out, const Operand& x, const Operand& index, int64_t dim);
void index_add(const Operand& out, const Operand& index, const Operand& src, int64_t dim);
// Batched GEMM via OpenBLAS: out[..., M, N] = a[..., M, K] @ b[..., K, N]. OpenBLAS runs at one
// thread; the products are cut into tiles (batch × row blocks × column blocks) over TBB, within
// the current arena's concurrency and a tbb::global_control limit.
void matmul(const Operand& out, const Operand& a, const Operand& b);
// out = a·b for one 2-D float32/float64 GEMM, the same way, by row blocks (each cut into column
// tiles where that helps); after all of a block's rows are computed, `epilogue(r0, r1)` runs on
// them while they are in cache. Returns false (doing nothing) for shapes or dtypes it does not handle.
bool matmul_row_blocks(const Operand& out, const Operand& a, const Operand& b,
                       const std::function<void(int64_t, int64_t)>& epilogue);
// Fused attention (OpKind::Attention): out [..., Tq, D + 1] holds dropout(softmax(q·kᵀ·scale +
// mask))·v and each row's log-sum-exp (of the softmax, before dropout), computed by query blocks
// with an online softmax over key blocks (no Tq × Tk matrix). `mask` (may be null) is additive,
// broadcast to [..., Tq, Tk]; causal keeps key j <= query i. float32 / float64.
void attention(const Operand& out, const Operand& q, const Operand& k, const Operand& v, const Operand* mask,
               bool causal, double scale, const AttentionDropout& drop);
// Its gradient (OpKind::AttentionBackward): out [..., Tq + 2 Tk, D] = dq, dk, dv, from the packed
// forward result `fwd` and its gradient `gout` (both [..., Tq, D + 1]), by key blocks; `drop`
// rebuilds the forward's dropout mask.
void attention_backward(const Operand& out, const Operand& q, const Operand& k, const Operand& v, const Operand& fwd,
                        const Operand& gout, const Operand* mask, bool causal, double scale,
                        const AttentionDropout& drop);
// im2col / col2im for conv2d (ints = kh, kw, sh, sw, ph, pw, dh, dw).
void im2col(const Operand& out, const Operand& x, const std::vector<int64_t>& p);
void col2im(const Operand& out, const Operand& cols, const std::vector<int64_t>& p);

}  // namespace kiln::kernels
