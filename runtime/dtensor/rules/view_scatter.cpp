// ViewScatter(base, src): an in-place write through a view, functionalized (the base with src
// written into the window attrs.sizes/strides/offset of its dense layout). A window dim j that
// spans a whole base dim k with step 1 (a slice of another dim, a select, a permute, a
// transpose leave such dims) can stay cut: base Shard(k) with src Shard(j) gives Shard(k), each
// rank writing its piece of the window into its piece of the base (equal sizes: the torch.chunk
// pieces line up). The local window is the global one re-expressed in the shard's own dense
// layout. (In a DTensor training step, the sdpa backward writes its batch-sharded gradients into
// a zero buffer this way; replicating would all-gather them on every rank.)
#include <optional>

#include "runtime/dtensor/rules/rule.h"
#include "runtime/tensor/record.h"

namespace kiln::dist::rules {
namespace {

// The window in the base's dims: per window dim, the base dim it walks and its step (size-1
// dims: none), and the window's first element as a base index; nullopt when a dim does not
// walk one base dim (a reshape merged dims, an expand).
struct Window {
  std::vector<int64_t> base_dim, step;
  std::vector<int64_t> start;  // per base dim
};

std::vector<int64_t> dense_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * std::max<int64_t>(shape[i], 1);
  return s;
}

std::optional<Window> window_of(const Attrs& a, const std::vector<int64_t>& base) {
  if (!a.offset.is_constant()) return std::nullopt;
  const std::vector<int64_t> bs = dense_strides(base);
  Window w;
  int64_t off = a.offset.as_int();
  for (size_t k = 0; k < base.size(); ++k) {
    w.start.push_back(base[k] > 0 ? off / bs[k] : 0);
    off -= w.start.back() * bs[k];
  }
  std::vector<bool> used(base.size(), false);
  for (size_t i = 0; i < a.sizes.size(); ++i) {
    if (!a.sizes[i].is_constant() || !a.strides[i].is_constant()) return std::nullopt;
    const int64_t n = a.sizes[i].as_int(), s = a.strides[i].as_int();
    if (n == 1) {
      w.base_dim.push_back(-1);
      w.step.push_back(0);
      continue;
    }
    int64_t k = -1;  // the base dim with bs[k] <= s < bs[k - 1]
    for (size_t d = 0; d < base.size(); ++d)
      if (base[d] > 1 && s >= bs[d] && (d == 0 || s < bs[d - 1]) && s % bs[d] == 0) k = static_cast<int64_t>(d);
    if (k < 0 || used[static_cast<size_t>(k)]) return std::nullopt;
    used[static_cast<size_t>(k)] = true;
    w.base_dim.push_back(k);
    w.step.push_back(s / bs[static_cast<size_t>(k)]);
  }
  return w;
}

// The shard's write: the window re-expressed over the local base's dense layout.
Tensor local_write(const OpView& v, size_t, const std::vector<Tensor>& shards) {
  const Window w = *window_of(v.attrs, v.in_shapes[0]);
  const Tensor& base = shards[0];
  const Tensor& src = shards[1];
  const std::vector<int64_t> local = base.sizes(), ls = dense_strides(local);
  Attrs a = v.attrs;
  const std::vector<int64_t> src_sizes = src.sizes();
  int64_t offset = 0;
  for (size_t k = 0; k < local.size(); ++k) offset += w.start[k] * ls[k];
  for (size_t i = 0; i < w.base_dim.size(); ++i) {
    a.sizes[i] = SymInt(src_sizes[i]);
    a.strides[i] = SymInt(w.base_dim[i] < 0 ? 1 : w.step[i] * ls[static_cast<size_t>(w.base_dim[i])]);
  }
  a.offset = SymInt(offset);
  return kiln::detail::record(OpKind::ViewScatter, {base, src}, a, v.dtype, base.shape());
}

}  // namespace

Strategies view_scatter(const OpView& v, size_t m) {
  Strategies out;
  const auto w = window_of(v.attrs, v.in_shapes[0]);
  if (!w) return out;
  const std::vector<int64_t>& base = v.in_shapes[0];
  for (size_t j = 0; j < w->base_dim.size(); ++j) {
    const int64_t k = w->base_dim[j];
    if (k < 0 || w->step[j] != 1) continue;
    const auto ku = static_cast<size_t>(k);
    if (v.in_shapes[1][j] != base[ku] || w->start[ku] != 0) continue;  // the whole base dim, from 0
    out.push_back({{Shard(k), Shard(static_cast<int64_t>(j))}, Shard(k), local_write});
  }
  return out;
}

}  // namespace kiln::dist::rules
