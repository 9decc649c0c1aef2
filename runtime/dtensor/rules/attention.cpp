// Fused attention (scaled_dot_product_attention's Attention / AttentionBackward nodes).
//   Batch dims (batch, heads) cut alike in q, k, v (and the backward's out and its gradient),
//   the mask cut where it has that dim.
//   The sequence cut (context parallelism, 1-d meshes, no mask): ring attention. Each rank keeps
//   its queries; the key/value blocks go around the ring (an all_to_all sending this rank's
//   block to the next rank), each rank attends to every block it is passed and merges the
//   partial outputs by their log-sum-exps. Causal: a block after this rank's queries is skipped,
//   its own block is attended causally, earlier blocks fully (torch.chunk pieces in order; no
//   load-balancing reorder). The backward gathers keys and values, computes this rank's queries'
//   gradients and their contributions to every key's and value's gradient, and leaves those as
//   Partial sums (reduce-scattered where the inputs' gradients are cut).
//   Not with dropout: its mask is drawn per batch index of the whole tensor.
#include <limits>

#include "runtime/dist/dist.h"
#include "runtime/dtensor/rules/rule.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln::dist::rules {
namespace {

int64_t seq_dim(const OpView& v) { return v.rank(0) - 2; }

// The key/value block this rank holds passed to the next rank of the ring (its piece of a dim of
// `size`: the block of rank `src`, arriving from the previous rank).
Tensor pass_on(const Tensor& block, int64_t d, int64_t size, int64_t src, const ProcessGroup& g) {
  const int64_t n = g.size(), me = g.rank();
  const int64_t from = (src - 1 + n) % n;  // the block that arrives: the previous rank's
  std::vector<int64_t> out_splits(static_cast<size_t>(n), 0), in_splits(static_cast<size_t>(n), 0);
  in_splits[static_cast<size_t>((me + 1) % n)] = chunk_range(size, n, src).length;
  out_splits[static_cast<size_t>((me - 1 + n) % n)] = chunk_range(size, n, from).length;
  Tensor rows = block.movedim(d, 0).contiguous();  // the all_to_all splits dim 0
  return functional::all_to_all(rows, out_splits, in_splits, g).movedim(0, d);
}

// Attention of `q` over one key/value block: its packed output [..., Tq, W] (runtime/ir/node.h).
Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  Shape os = q.shape();
  os.back() = attention_packed_width(q.shape().back(), q.dtype());
  return kiln::detail::record(OpKind::Attention, {q, k, v}, attention_attrs(causal, scale), q.dtype(), os);
}

// The float32 (float64: float64) row log-sum-exp [..., Tq, 1] of a packed output of head size D
// (16-bit: decoded from its pieces, runtime/ir/attention_lse.h).
Tensor packed_lse(const Tensor& packed, int64_t D) {
  if (!is_half(packed.dtype())) return packed.narrow(-1, D, 1);
  auto piece = [&](int64_t i) { return packed.narrow(-1, D + i, 1).to(kFloat32); };
  const Tensor m0 = piece(1);
  return where(isfinite(m0), (m0 + piece(2) + piece(3)) * exp2(piece(0)), m0);
}

// The packed output of dtype dt from the output rows and the row log-sum-exp (wider types:
// rounded once here).
Tensor pack(const Tensor& out, const Tensor& lse, DType dt) {
  if (!is_half(dt)) return cat({out.to(dt), lse.to(dt)}, -1);
  const int64_t D = out.size(-1);
  const Tensor ok = logical_and(isfinite(lse), ne(lse, 0.0));
  const Tensor e = where(ok, floor(log2(abs(lse))) + 1, 0.0);
  const Tensor f = where(ok, lse * exp2(-e), lse);  // lse = f 2^e (0 and non-finite: e = 0)
  const Tensor m0 = f.to(dt);
  const Tensor r = where(ok, f - m0.to(kFloat32), 0.0);
  const Tensor m1 = r.to(dt), m2 = (r - m1.to(kFloat32)).to(dt);
  std::vector<int64_t> pad = out.sizes();
  pad.back() = attention_packed_width(D, dt) - D - kAttentionLsePieces;
  return cat({out.to(dt), e.to(dt), m0, m1, m2, zeros(pad, dt, out.device())}, -1);
}

Tensor ring_forward(const OpView& v, size_t m, const std::vector<Tensor>& shards) {
  const int64_t d = seq_dim(v), D = v.in_shapes[0].back(), T = v.in_shapes[1][static_cast<size_t>(d)];
  const ProcessGroup g = v.mesh.get_group(static_cast<int64_t>(m));
  const int64_t n = g.size(), me = g.rank();
  const bool causal = attention_causal(v.attrs);
  const double scale = attention_scale(v.attrs);
  const Tensor& q = shards[0];
  const DType dt = q.dtype(), wide = is_half(dt) ? kFloat32 : dt;
  Tensor k = shards[1], val = shards[2], out, lse;
  for (int64_t step = 0, src = me; step < n; ++step, src = (src - 1 + n) % n) {
    if (!(causal && src > me) && k.size(d) > 0 && q.size(d) > 0) {
      Tensor packed = attend(q, k, val, causal && src == me, scale);
      Tensor o = packed.narrow(-1, 0, D).to(wide), l = packed_lse(packed, D);
      if (!out.defined()) {
        out = o, lse = l;
      } else {  // merged by log-sum-exp: out = sum_i exp(lse_i - lse) out_i
        Tensor top = maximum(lse, l);
        Tensor merged = top + log(exp(lse - top) + exp(l - top));
        out = out * exp(lse - merged) + o * exp(l - merged);
        lse = merged;
      }
    }
    if (step + 1 < n) {
      k = pass_on(k, d, T, src, g);
      val = pass_on(val, d, T, src, g);
    }
  }
  if (!out.defined()) {  // no query rows here
    std::vector<int64_t> s = q.sizes();
    s.back() = attention_packed_width(D, dt);
    return zeros(s, dt, q.device());
  }
  return pack(out, lse, dt);
}

Tensor ring_backward(const OpView& v, size_t m, const std::vector<Tensor>& shards) {
  const int64_t d = seq_dim(v), Tq = v.in_shapes[0][static_cast<size_t>(d)];
  const int64_t Tk = v.in_shapes[1][static_cast<size_t>(d)];
  const ChunkRange mine = chunk_range(Tq, v.mesh.shape()[m], v.mesh.coordinate()[m]);
  const Tensor &q = shards[0], &k = shards[1], &val = shards[2], &out = shards[3], &g = shards[4];
  std::vector<int64_t> full = v.out_shape;  // [..., Tq + 2 Tk, D]
  Attrs a = attention_attrs(false, attention_scale(v.attrs));
  std::vector<Tensor> ins = {q, k, val, out, g};
  if (attention_causal(v.attrs) && mine.length > 0) {  // key j attends query i when j <= start + i
    Tensor qi = arange(0, mine.length, 1, kInt64, q.device()).reshape({mine.length, 1}) + mine.start;
    Tensor kj = arange(0, Tk, 1, kInt64, q.device()).reshape({1, Tk});
    std::vector<int64_t> ms = q.sizes();
    ms[static_cast<size_t>(d)] = mine.length;
    ms.back() = Tk;
    ins.push_back(where(kj.gt(qi), -std::numeric_limits<double>::infinity(), 0.0).to(q.dtype()).expand(ms));
  }
  std::vector<Tensor> parts;  // this rank's rows of dq at their place, zeros for the others' rows
  auto zero_rows = [&](int64_t rows) {
    std::vector<int64_t> s = full;
    s[static_cast<size_t>(d)] = rows;
    return zeros(s, q.dtype(), q.device());
  };
  if (mine.length == 0) return zero_rows(Tq + 2 * Tk);
  std::vector<int64_t> bs = full;
  bs[static_cast<size_t>(d)] = mine.length + 2 * Tk;
  Tensor packed = kiln::detail::record(OpKind::AttentionBackward, ins, a, q.dtype(), make_shape(bs));
  return cat({zero_rows(mine.start), packed.narrow(d, 0, mine.length), zero_rows(Tq - mine.start - mine.length),
              packed.narrow(d, mine.length, 2 * Tk)},
             d);
}

}  // namespace

Strategies attention(const OpView& v, size_t m) {
  Strategies out;
  if (attention_dropout(v.attrs) > 0) return out;
  const int64_t r = v.rank(0);
  // q, k, v (forward) or q, k, v, out, grad_out (backward) have the batch dims; then the mask.
  const size_t batched = v.op == OpKind::Attention ? 3 : 5;
  const size_t mask = batched;  // (no dropout words here)
  for (int64_t k = 0; k < r - 2; ++k) {
    Strategy s{{}, Shard(k)};
    for (size_t i = 0; i < v.in_shapes.size(); ++i) {
      if (i < batched) {
        s.inputs.push_back(Shard(k));
      } else if (i == mask) {
        const int64_t mk = k - (r - v.rank(i));
        const bool has = mk >= 0 && v.in_shapes[i][static_cast<size_t>(mk)] == v.in_shapes[0][static_cast<size_t>(k)];
        s.inputs.push_back(has ? Shard(mk) : Replicate());
      } else {
        s.inputs.push_back(Replicate());
      }
    }
    out.push_back(std::move(s));
  }
  // Ring attention: the sequence cut, 1-d meshes, no mask; causal only where queries and keys
  // are the same positions.
  const bool no_mask = v.in_shapes.size() == batched;
  const int64_t Tq = v.in_shapes[0][static_cast<size_t>(r - 2)], Tk = v.in_shapes[1][static_cast<size_t>(r - 2)];
  if (v.mesh.ndim() == 1 && no_mask && (!attention_causal(v.attrs) || Tq == Tk)) {
    const Placement S = Shard(r - 2), R = Replicate();
    if (v.op == OpKind::Attention)
      out.push_back({{S, S, S}, S, ring_forward});
    else
      out.push_back({{S, R, R, S, S}, Partial(), ring_backward});
  }
  return out;
}

}  // namespace kiln::dist::rules
