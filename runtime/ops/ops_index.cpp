// Indexing ops: gather/scatter, index_select/index_add, embedding, one_hot, and the
// data-dependent nonzero / masked_select (which materialize their inputs).
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln {
using detail::record;
using detail::str;
using detail::wrap_dim;

namespace {
void check_index_dtype(const Tensor& idx, const char* op) {
  KILN_CHECK(idx.defined() && (idx.dtype() == kInt64 || idx.dtype() == kInt32), op,
             ": expected an int64 or int32 index tensor, got ", idx.defined() ? dtype_name(idx.dtype()) : "undefined");
}

// gather/scatter shape rule: index.size(d) <= other.size(d) for every d (except `skip`).
void check_index_fits(const Tensor& idx, const Tensor& other, int64_t skip, const char* op, const char* what) {
  KILN_CHECK(idx.dim() == other.dim() || (idx.dim() <= 1 && other.dim() <= 1), op, ": index tensor must have the ",
             "same number of dimensions as ", what, " (", other.dim(), "), got ", idx.dim());
  for (int64_t d = 0; d < idx.dim(); ++d) {
    if (d == skip) continue;
    KILN_CHECK(sym_le(idx.shape()[d], other.shape()[d]).value_or(false), op, ": size of index ", str(idx.shape()),
               " at dim ", d, " must not exceed the size of ", what, " ", str(other.shape()));
  }
}

Tensor indexed(OpKind op, const std::vector<Tensor>& ins, int64_t dim, DType t, Shape shape) {
  Attrs a;
  a.ints = {dim};
  return record(op, ins, a, t, std::move(shape));
}
}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  check_index_dtype(index, "gather");
  int64_t d = wrap_dim(dim, x.dim(), "gather");
  check_index_fits(index, x, d, "gather", "input");
  return indexed(OpKind::Gather, {x, index}, d, x.dtype(), index.shape());
}

Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  check_index_dtype(index, "scatter");
  int64_t d = wrap_dim(dim, x.dim(), "scatter");
  check_index_fits(index, x, d, "scatter", "self");
  check_index_fits(index, src, -1, "scatter", "src");
  return indexed(OpKind::Scatter, {x, index, detail::cast(src, x.dtype())}, d, x.dtype(), x.shape());
}
Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, Scalar value) {
  return scatter(x, dim, index, full_shape(index.shape(), value, x.dtype(), x.device()).contiguous());
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  check_index_dtype(index, "scatter_add");
  int64_t d = wrap_dim(dim, x.dim(), "scatter_add");
  check_index_fits(index, x, d, "scatter_add", "self");
  check_index_fits(index, src, -1, "scatter_add", "src");
  return indexed(OpKind::ScatterAdd, {x, index, detail::cast(src, x.dtype())}, d, x.dtype(), x.shape());
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_index_dtype(index, "index_select");
  KILN_CHECK(index.dim() <= 1, "index_select: index must be 0-d or 1-d, got shape ", str(index.shape()));
  int64_t d = wrap_dim(dim, x.dim(), "index_select");
  Tensor idx = index.dim() == 0 ? reshape(index, {1}) : index;
  Shape out = x.shape();
  if (x.dim() == 0)
    out = {idx.shape()[0]};
  else
    out[d] = idx.shape()[0];
  return indexed(OpKind::IndexSelect, {x, idx}, d, x.dtype(), out);
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha) {
  check_index_dtype(index, "index_add");
  KILN_CHECK(index.dim() <= 1, "index_add: index must be 0-d or 1-d, got shape ", str(index.shape()));
  int64_t d = wrap_dim(dim, x.dim(), "index_add");
  Tensor idx = index.dim() == 0 ? reshape(index, {1}) : index;
  KILN_CHECK(src.dim() == x.dim(), "index_add: source and destination must have the same number of dimensions (",
             x.dim(), "), got ", src.dim());
  for (int64_t i = 0; i < x.dim(); ++i) {
    const SymInt& want = i == d ? idx.shape()[0] : x.shape()[i];
    KILN_CHECK(detail::same_size(src.shape()[i], want), "index_add: source shape ", str(src.shape()),
               " does not match: expected size ", want.str(), " at dim ", i);
  }
  Tensor s = detail::cast(alpha.to_double() == 1 ? src : mul(src, alpha), x.dtype());
  return indexed(OpKind::IndexAdd, {x, idx, s}, d, x.dtype(), x.shape());
}

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  KILN_CHECK(weight.dim() == 2, "embedding: weight must be 2-D, got shape ", str(weight.shape()));
  check_index_dtype(indices, "embedding");
  Shape shape = indices.shape();
  shape.push_back(weight.shape()[1]);
  return detail::reshape_to(index_select(weight, 0, detail::reshape_to(indices, {numel(indices.shape())})), shape);
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  KILN_CHECK(indices.defined() && indices.dtype() == kInt64, "one_hot: expected an int64 index tensor, got ",
             indices.defined() ? dtype_name(indices.dtype()) : "undefined");
  if (num_classes < 0) {  // inferred from the values: the one case that reads them
    KILN_CHECK(indices.numel() > 0, "one_hot: can not infer total number of classes from an empty tensor");
    int64_t lo = amin(indices).item<int64_t>();
    KILN_CHECK(lo >= 0, "one_hot: class values must be non-negative, got ", lo);
    num_classes = amax(indices).item<int64_t>() + 1;
  }
  // A scatter of ones: the values are never read here (an index outside [0, num_classes) is
  // an error of the scatter kernel when the result is computed, as for gather).
  Shape shape = indices.shape();
  shape.push_back(SymInt(num_classes));
  Tensor idx = unsqueeze(indices, -1);
  return scatter(full_shape(shape, 0, kInt64, indices.device()), -1, idx,
                 full_shape(idx.shape(), 1, kInt64, indices.device()));
}

Tensor nonzero(const Tensor& x) {
  Tensor c = contiguous(ne(x, 0));
  std::vector<uint8_t> flags = c.to_vector<uint8_t>();
  std::vector<int64_t> sizes = x.sizes(), out;
  int64_t n = static_cast<int64_t>(sizes.size()), count = 0;
  std::vector<int64_t> idx(n, 0);
  for (size_t i = 0; i < flags.size(); ++i) {
    if (flags[i]) {
      out.insert(out.end(), idx.begin(), idx.end());
      ++count;
    }
    for (int64_t d = n - 1; d >= 0; --d) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
  return from_vector(out, std::vector<int64_t>{count, n}, x.device());
}

Tensor masked_select(const Tensor& x, const Tensor& mask) {
  KILN_CHECK(mask.defined() && mask.dtype() == kBool, "masked_select: expected a bool mask");
  auto b = broadcast_tensors({x, mask});
  Tensor flat_mask = reshape(b[1], {-1});
  Tensor idx = reshape(nonzero(flat_mask), {-1});
  return index_select(reshape(b[0], {-1}), 0, idx);
}

}  // namespace kiln
