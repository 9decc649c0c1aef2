// Advanced indexing hooks (runtime/ops/ops_advindex.cpp) for Tensor::index and index_put_.
#pragma once
#include <vector>

#include "runtime/tensor/tensor.h"

namespace kiln::detail {
// Whether an index list holds an index tensor (advanced indexing).
bool has_index_tensor(const std::vector<TensorIndex>& idx);
// x[idx] with index tensors (PyTorch's advanced indexing).
Tensor advanced_index(const Tensor& x, const std::vector<TensorIndex>& idx);
// x[idx] = v (accumulate: +=) with index tensors, written through to x.
void advanced_index_put(Tensor& x, const std::vector<TensorIndex>& idx, const Tensor& v, bool accumulate);
}  // namespace kiln::detail
