// Advanced indexing: x.index({..., idx, ...}) with int64/int32 index tensors or bool masks
// mixed with ints, slices, None and "...", and index_put_ with them (accumulate or not).
//
// As in PyTorch, ints, slices, None and "..." apply first (a view y of x); bool masks become
// their nonzero() coordinates (a data read); the index tensors broadcast together to a shape B
// and pick elements of y along their dims through a linear index and one index_select (whose
// gradient is index_add). B's dims replace the indexed dims where those were adjacent, else
// they come first. index_put_ writes through y with index_add (accumulate) or scatter.
#include "runtime/ops/advindex.h"

#include <algorithm>

#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln {

IndexTensor::IndexTensor(const Tensor& t) : impl(t.impl()) {}

namespace detail {
namespace {
// The plan of an advanced index: the basic view y, the index tensors and the dims of y they index.
struct AdvPlan {
  Tensor y;
  std::vector<Tensor> idx;  // int64, one per indexed dim of y
  std::vector<int64_t> dims;  // dims of y they index (increasing)
  bool adjacent = true;  // B replaces the dims in place (else B comes first)
  // Set when the only index is a bool mask (for index_put_'s where() path).
  Tensor mask;
  int64_t mask_dim = -1;
};

AdvPlan plan(const Tensor& x, const std::vector<TensorIndex>& entries) {
  KILN_CHECK(x.defined(), "index: got an undefined tensor");
  // Dims of x each entry consumes.
  int64_t consumed = 0, ellipses = 0;
  for (const auto& e : entries) {
    if (std::holds_alternative<int64_t>(e) || std::holds_alternative<Slice>(e))
      ++consumed;
    else if (std::holds_alternative<EllipsisIndex>(e))
      ++ellipses;
    else if (auto* t = std::get_if<IndexTensor>(&e)) {
      Tensor it(t->impl);
      KILN_CHECK(it.defined(), "index: got an undefined index tensor");
      consumed += it.dtype() == kBool ? std::max<int64_t>(it.dim(), 1) : 1;
    }
  }
  KILN_CHECK(ellipses <= 1, "index: an index can only have a single ellipsis");
  KILN_CHECK(consumed <= x.dim(), "index: too many indices for tensor of dimension ", x.dim(), " (got ", consumed, ")");
  std::vector<TensorIndex> basic;
  std::vector<std::pair<int64_t, Tensor>> tensors;  // (dim of y, tensor) in order; masks expanded
  int64_t xd = 0, yd = 0;
  AdvPlan p;
  int n_tensor_entries = 0;
  for (const auto& e : entries) {
    if (auto* t = std::get_if<IndexTensor>(&e)) {
      Tensor it(t->impl);
      ++n_tensor_entries;
      if (it.dtype() == kBool) {
        KILN_CHECK(it.dim() >= 1, "index: a 0-d bool index is not supported (expected a mask with at least 1 dim)");
        for (int64_t k = 0; k < it.dim(); ++k) {
          auto same = sym_eq(it.shape()[k], x.shape()[xd + k]);
          KILN_CHECK(same && *same, "index: the shape of the mask ", str(it.shape()), " at index ", k,
                     " does not match the shape of the indexed tensor ", str(x.shape()), " at index ", xd + k);
        }
        if (p.mask_dim < 0 && !p.mask.defined()) {
          p.mask = it;
          p.mask_dim = yd;
        }
        Tensor nz = nonzero(it);  // [count, k]: a data read
        for (int64_t k = 0; k < it.dim(); ++k) {
          tensors.push_back({yd, nz.select(1, k)});
          basic.push_back(Slice());
          ++xd;
          ++yd;
        }
      } else {
        KILN_CHECK(it.dtype() == kInt64 || it.dtype() == kInt32, "index: tensors used as indices must be long, int or ",
                   "bool tensors, got ", dtype_name(it.dtype()));
        tensors.push_back({yd, to(it, kInt64)});
        basic.push_back(Slice());
        ++xd;
        ++yd;
      }
    } else if (std::holds_alternative<int64_t>(e)) {
      basic.push_back(e);
      ++xd;
    } else if (std::holds_alternative<Slice>(e)) {
      basic.push_back(e);
      ++xd;
      ++yd;
    } else if (std::holds_alternative<NoneIndex>(e)) {
      basic.push_back(e);
      ++yd;
    } else {
      basic.push_back(e);
      xd += x.dim() - consumed;
      yd += x.dim() - consumed;
    }
  }
  if (n_tensor_entries != 1 || tensors.empty() || tensors.front().first != p.mask_dim) p.mask = Tensor();
  p.y = x.index(basic);
  for (size_t i = 0; i < tensors.size(); ++i) {
    p.dims.push_back(tensors[i].first);
    p.idx.push_back(tensors[i].second);
    if (i > 0 && tensors[i].first != tensors[i - 1].first + 1) p.adjacent = false;
  }
  return p;
}

// Linear index into y's indexed dims (flattened), shape B; out-of-range entries map past the end
// so that index_select/index_add/scatter report them.
std::pair<Tensor, Shape> linear_index(const AdvPlan& p) {
  std::vector<Tensor> b = broadcast_tensors(p.idx);
  const Shape& bshape = b[0].shape();
  Tensor lin, bad;
  SymInt total = 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const SymInt& n = p.y.shape()[p.dims[i]];
    Tensor nt = size_value(n, kInt64, b[i].device());
    Tensor t = where(lt(b[i], 0), add(b[i], nt), b[i]);
    Tensor out = logical_or(lt(t, 0), ge(t, nt));
    bad = bad.defined() ? logical_or(bad, out) : out;
    lin = lin.defined() ? add(mul(lin, nt), t) : t;
    total = total * n;
  }
  if (b.size() > 1)
    lin = where(bad, size_value(total, kInt64, lin.device()), lin);
  else
    lin = where(bad, b[0], lin);  // one dim: index_select reports the original index
  return {lin, bshape};
}

// y with the indexed dims moved first and flattened into one: [P, rest...]; also the permutation.
Tensor flatten_indexed(const AdvPlan& p, std::vector<int64_t>& perm) {
  perm = p.dims;
  for (int64_t d = 0; d < p.y.dim(); ++d)
    if (std::find(p.dims.begin(), p.dims.end(), d) == p.dims.end()) perm.push_back(d);
  Tensor yp = permute(p.y, perm);
  Shape s;
  SymInt prod = 1;
  for (size_t i = 0; i < p.dims.size(); ++i) prod = prod * yp.shape()[i];
  s.push_back(prod);
  for (size_t i = p.dims.size(); i < yp.shape().size(); ++i) s.push_back(yp.shape()[i]);
  return reshape_to(yp, s);
}

// [B..., rest...] -> final layout (B moved to the first indexed dim when adjacent).
Tensor place_b(const Tensor& r, size_t nb, const AdvPlan& p) {
  if (!p.adjacent || p.dims.front() == 0 || nb == 0) return r;
  std::vector<int64_t> src, dst;
  for (size_t i = 0; i < nb; ++i) {
    src.push_back(static_cast<int64_t>(i));
    dst.push_back(p.dims.front() + static_cast<int64_t>(i));
  }
  return movedim(r, src, dst);
}
Tensor unplace_b(const Tensor& r, size_t nb, const AdvPlan& p) {
  if (!p.adjacent || p.dims.front() == 0 || nb == 0) return r;
  std::vector<int64_t> src, dst;
  for (size_t i = 0; i < nb; ++i) {
    src.push_back(p.dims.front() + static_cast<int64_t>(i));
    dst.push_back(static_cast<int64_t>(i));
  }
  return movedim(r, src, dst);
}
}  // namespace

bool has_index_tensor(const std::vector<TensorIndex>& idx) {
  return std::any_of(idx.begin(), idx.end(),
                     [](const TensorIndex& e) { return std::holds_alternative<IndexTensor>(e); });
}

Tensor advanced_index(const Tensor& x, const std::vector<TensorIndex>& idx) {
  AdvPlan p = plan(x, idx);
  auto [lin, bshape] = linear_index(p);
  std::vector<int64_t> perm;
  Tensor flat = flatten_indexed(p, perm);
  Tensor picked = index_select(flat, 0, reshape_to(lin, Shape{numel(bshape)}));  // [N, rest...]
  Shape out = bshape;
  for (size_t i = 1; i < picked.shape().size(); ++i) out.push_back(picked.shape()[i]);
  return place_b(reshape_to(picked, out), bshape.size(), p);
}

void advanced_index_put(Tensor& x, const std::vector<TensorIndex>& idx, const Tensor& v, bool accumulate) {
  KILN_CHECK(v.defined(), "index_put_: got an undefined value tensor");
  AdvPlan p = plan(x, idx);
  Tensor vv = cast(v, p.y.dtype());
  Tensor newy;
  if (p.mask.defined() && vv.dim() == 0) {
    // x[mask] = v with a single value: a where() over y (no data read of the mask).
    Shape ms = p.mask.shape();
    for (int64_t d = p.mask_dim + p.mask.dim(); d < p.y.dim(); ++d) ms.push_back(SymInt(1));
    Tensor m = reshape_to(p.mask, ms);
    newy = accumulate ? add(p.y, where(m, vv, Scalar(0))) : where(m, vv, p.y);
    p.y.assign_(newy);
    return;
  }
  auto [lin, bshape] = linear_index(p);
  std::vector<int64_t> perm;
  Tensor flat = flatten_indexed(p, perm);
  // v broadcast to the indexing result's layout, then B-first and flattened to [N, rest...].
  Shape bfirst = bshape;
  for (size_t i = 1; i < flat.shape().size(); ++i) bfirst.push_back(flat.shape()[i]);
  Shape result = bfirst;
  if (p.adjacent && p.dims.front() != 0 && !bshape.empty()) {
    Shape rest(bfirst.begin() + static_cast<std::ptrdiff_t>(bshape.size()), bfirst.end());
    result.assign(rest.begin(), rest.begin() + p.dims.front());
    result.insert(result.end(), bshape.begin(), bshape.end());
    result.insert(result.end(), rest.begin() + p.dims.front(), rest.end());
  }
  check_expandable(vv.shape(), result, "index_put_");
  Tensor vb = unplace_b(expand_to(vv, result), bshape.size(), p);
  Shape vflat{numel(bshape)};
  for (size_t i = 1; i < flat.shape().size(); ++i) vflat.push_back(flat.shape()[i]);
  vb = reshape_to(contiguous(vb), vflat);
  Tensor l = reshape_to(lin, Shape{numel(bshape)});
  Tensor nf;
  if (accumulate) {
    nf = index_add(flat, 0, l, vb);
  } else {
    Shape ls{numel(bshape)};
    for (size_t i = 1; i < flat.shape().size(); ++i) ls.push_back(SymInt(1));
    nf = scatter(flat, 0, contiguous(expand_to(reshape_to(l, ls), vflat)), vb);
  }
  // Back to y's layout: unflatten, inverse permutation.
  Shape ps;
  for (int64_t d : perm) ps.push_back(p.y.shape()[d]);
  Tensor yp = reshape_to(nf, ps);
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  p.y.assign_(permute(yp, inv));
}

}  // namespace detail

Tensor index_put(const Tensor& x, const std::vector<TensorIndex>& indices, const Tensor& values, bool accumulate) {
  KILN_CHECK(x.defined(), "index_put: got an undefined tensor");
  Tensor c = x.clone();
  c.index_put_(indices, values, accumulate);
  return c;
}

Tensor& Tensor::index_put_(const std::vector<TensorIndex>& idx, const Tensor& v, bool accumulate) {
  if (detail::has_index_tensor(idx)) {
    detail::advanced_index_put(*this, idx, v, accumulate);
    return *this;
  }
  Tensor view = index(idx);
  if (accumulate)
    view.assign_(add(view, detail::cast(v, view.dtype())));
  else
    view.copy_(v);
  return *this;
}

}  // namespace kiln
