// Sorting and sampling: sort / argsort / topk, multinomial and randperm.
//
// A sort is a permutation computed from ranks: the rank of element i along the sorted dim is
// the number of elements that come before it (smaller, or equal with a lower index: stable;
// NaN compares as the greatest value). The permutation scatters indices to their ranks, and the
// values are a gather of x by it, so gradients flow through gather's rule. Up to
// kPairwiseLimit pairwise comparisons the ranks are a lazy comparison-and-count graph (fused by
// the JIT, traceable by compile() with symbolic sizes); above it the indices come from a host
// std::stable_sort of the materialized values (a data read: a graph break inside compile()).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln {
using detail::str;
using detail::wrap_dim;

namespace {
constexpr int64_t kPairwiseLimit = int64_t{1} << 24;

// Permutation (int64, [..., n]) that sorts the last dim of v, by pairwise ranks.
Tensor sort_perm_pairwise(const Tensor& v, bool descending) {
  Tensor x = v.dtype() == kBool ? to(v, kInt32) : v;
  const SymInt& n = x.shape().back();
  Tensor ar = detail::arange_of(n, x.device());
  // Every comparison must see the same bits of each element: a value fused into the comparison
  // kernel would be recomputed per use (vector and scalar code paths of a transcendental may
  // round differently, making x[i] < x[i] true). An index_select (an opaque op) stores x once.
  x = index_select(x, -1, ar);
  Tensor a = unsqueeze(x, -1);  // element i: [..., n, 1]
  Tensor b = unsqueeze(x, -2);  // element j: [..., 1, n]
  Tensor before, same;
  if (is_floating(x.dtype())) {
    Tensor an = isnan(a), bn = isnan(b);
    before = descending ? logical_or(gt(b, a), logical_and(bn, logical_not(an)))
                        : logical_or(lt(b, a), logical_and(an, logical_not(bn)));
    same = logical_or(eq(b, a), logical_and(an, bn));
  } else {
    before = descending ? gt(b, a) : lt(b, a);
    same = eq(b, a);
  }
  Tensor lower_index = lt(unsqueeze(ar, 0), unsqueeze(ar, 1));  // [n(i), n(j)]: j < i
  Tensor rank = sum(logical_or(before, logical_and(same, lower_index)), std::vector<int64_t>{-1}, false, kInt64);
  Tensor idx = detail::expand_to(ar, x.shape());
  return scatter(zeros_like(rank), -1, rank, contiguous(idx));
}

// The same permutation from a host stable sort of the materialized values.
Tensor sort_perm_host(const Tensor& v, bool descending) {
  std::vector<int64_t> shape = v.sizes();
  int64_t n = shape.back(), rows = n == 0 ? 0 : v.numel() / n;
  std::vector<int64_t> perm(static_cast<size_t>(rows * n));
  auto run = [&](const auto& vals) {
    for (int64_t r = 0; r < rows; ++r) {
      auto* p = perm.data() + r * n;
      std::iota(p, p + n, int64_t{0});
      const auto* row = vals.data() + r * n;
      std::stable_sort(p, p + n, [&](int64_t i, int64_t j) {
        auto a = row[i], b = row[j];
        if constexpr (std::is_floating_point_v<std::decay_t<decltype(a)>>) {
          bool an = std::isnan(a), bn = std::isnan(b);
          if (an || bn) return descending ? (an && !bn) : (bn && !an);
        }
        return descending ? a > b : a < b;
      });
    }
  };
  if (is_floating(v.dtype()))
    run(v.to_vector<double>());
  else
    run(v.to_vector<int64_t>());
  return from_vector(perm, shape, v.device());
}

Tensor sort_perm(const Tensor& v, bool descending) {
  // The strategy only depends on the traced sizes (both give the same result): no guard.
  int64_t n = detail::size_hint(v.shape().back());
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < v.shape().size(); ++i) rows *= detail::size_hint(v.shape()[i]);
  if (n <= 1 || rows * n <= kPairwiseLimit / std::max<int64_t>(n, 1)) return sort_perm_pairwise(v, descending);
  return sort_perm_host(v, descending);
}
}  // namespace

std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t dim, bool descending, bool /*stable: always*/) {
  KILN_CHECK(x.defined(), "sort: got an undefined tensor");
  if (x.dim() == 0) {
    wrap_dim(dim, 1, "sort");
    return {x.clone(), zeros({}, kInt64, x.device())};
  }
  int64_t d = wrap_dim(dim, x.dim(), "sort");
  Tensor m = movedim(x, d, -1);
  Tensor perm = sort_perm(m.detach(), descending);
  Tensor values = gather(m, -1, perm);
  return {movedim(values, -1, d), movedim(perm, -1, d)};
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending, bool stable) {
  return sort(x, dim, descending, stable).second;
}

std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool /*sorted*/) {
  KILN_CHECK(x.defined(), "topk: got an undefined tensor");
  int64_t d = x.dim() == 0 ? wrap_dim(dim, 1, "topk") : wrap_dim(dim, x.dim(), "topk");
  SymInt n = x.dim() == 0 ? SymInt(1) : x.shape()[d];
  // Undecided (symbolic n): the traced size decides; narrow() below guards the relation.
  bool fits = sym_le(SymInt(k), n).value_or(k <= detail::size_hint(n));
  KILN_CHECK(k >= 0 && fits, "topk: selected index k out of range (expected 0 <= k <= ", n.str(), ", got ", k, ")");
  auto [v, i] = sort(x, dim, largest);
  if (x.dim() == 0) return {v, i};
  return {v.narrow(d, 0, k), i.narrow(d, 0, k)};
}

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement) {
  KILN_CHECK(probs.defined(), "multinomial: got an undefined tensor");
  KILN_CHECK(probs.dim() == 1 || probs.dim() == 2, "multinomial: prob_dist must be 1 or 2 dim, got ", probs.dim(),
             "-D with shape ", str(probs.shape()));
  KILN_CHECK(is_floating(probs.dtype()),
             "multinomial only supports floating-point dtypes for input, got: ", dtype_name(probs.dtype()));
  KILN_CHECK(num_samples > 0, "multinomial: cannot sample n_sample <= 0 samples (got ", num_samples, ")");
  const SymInt& n = probs.shape().back();
  auto no_categories = sym_eq(n, 0);
  KILN_CHECK(!(no_categories && *no_categories), "multinomial: number of categories cannot be zero (shape ",
             str(probs.shape()), ")");
  if (!replacement) {
    auto ok = sym_le(SymInt(num_samples), n);
    KILN_CHECK(!ok || *ok, "multinomial: cannot sample n_sample > prob_dist.size(-1) samples without replacement ",
               "(expected num_samples <= ", n.str(), ", got ", num_samples, ")");
  }
  Tensor p = probs.dim() == 1 ? unsqueeze(probs, 0) : probs;  // [rows, n]
  p = to(p.detach(), kFloat64);
  Shape sshape{p.shape()[0], SymInt(num_samples)};
  Tensor out;
  if (replacement) {
    // Inverse CDF: the number of categories whose normalized cumulative weight is <= u.
    Tensor cdf = cumsum(p, -1);
    cdf = div(cdf, detail::slice_window(cdf, 1, n - SymInt(1), n, 1));  // last entry exactly 1
    Tensor u = rand_like(full_shape(sshape, 0, kFloat64, probs.device()));  // [rows, s]
    Tensor cnt = sum(le(unsqueeze(cdf, 1), unsqueeze(u, -1)), std::vector<int64_t>{-1}, false, kInt64);
    out = clamp_max(cnt, detail::size_value(n - SymInt(1), kInt64, probs.device()));
  } else {
    // Exponential race (Efraimidis-Spirakis): the num_samples largest log(u)/p, in order, are
    // sequential draws without replacement; zero weights give -inf and come last.
    Tensor u = rand_like(full_shape(p.shape(), 0, kFloat64, probs.device()));
    Tensor keys = div(log(u), p);
    out = topk(keys, num_samples, -1, true).second;
  }
  return probs.dim() == 1 ? squeeze(out, std::optional<int64_t>(0)) : out;
}

Tensor randperm(int64_t n, DType dtype) {
  KILN_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  KILN_CHECK(dtype != kBool && dtype != kFloat16 && dtype != kBFloat16,
             "randperm: expected an int32, int64, float32 or float64 dtype, got ", dtype_name(dtype));
  if (n == 0) return zeros({0}, dtype);
  return to(argsort(rand({n}, kFloat64)), dtype);
}

// ---- method forms ----
std::pair<Tensor, Tensor> Tensor::sort(int64_t d, bool desc, bool st) const { return kiln::sort(*this, d, desc, st); }
Tensor Tensor::argsort(int64_t d, bool desc, bool st) const { return kiln::argsort(*this, d, desc, st); }
std::pair<Tensor, Tensor> Tensor::topk(int64_t k, int64_t d, bool l, bool s) const {
  return kiln::topk(*this, k, d, l, s);
}

}  // namespace kiln
