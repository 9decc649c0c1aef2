// Zero-copy interop with xtensor (header-only; include it where xtensor is available).
#pragma once
#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include <memory>
#include <vector>

#include "runtime/ops/ops.h"

namespace kiln {

// A tensor over the memory of a row-major xtensor container, without copying. The
// container must outlive the tensor (and every view of it); in-place kiln ops rebind the
// tensor rather than writing into the container.
template <class E>
Tensor from_xtensor(E& a) {
  using T = typename E::value_type;
  KILN_CHECK(a.layout() == xt::layout_type::row_major, "from_xtensor: expected a row-major container");
  std::vector<int64_t> shape(a.shape().begin(), a.shape().end());
  return from_blob(const_cast<T*>(a.data()), shape, dtype_of<T>());
}

// Same, taking ownership of an rvalue container (moved into the tensor's storage).
template <class E, class = std::enable_if_t<!std::is_lvalue_reference_v<E>>>
Tensor from_xtensor(E&& a) {
  using T = typename std::decay_t<E>::value_type;
  auto* owned = new std::decay_t<E>(std::move(a));
  std::vector<int64_t> shape(owned->shape().begin(), owned->shape().end());
  return from_blob(owned->data(), shape, dtype_of<T>(), [owned](void*) { delete owned; });
}

// An xtensor view of t's values: zero-copy over kiln's storage when t is contiguous (the
// adaptor keeps that storage alive), else over a contiguous copy. T must match t's dtype.
template <class T>
auto to_xtensor(const Tensor& t) {
  KILN_CHECK(t.dtype() == dtype_of<T>(), "to_xtensor: tensor has dtype ", dtype_name(t.dtype()), ", requested ",
             dtype_name(dtype_of<T>()));
  Tensor c = t.is_contiguous() ? t : t.contiguous();
  c.eval();
  std::vector<size_t> shape;
  for (int64_t s : c.sizes()) shape.push_back(static_cast<size_t>(s));
  std::shared_ptr<Storage> keep = c.node()->storage;
  T* data = const_cast<T*>(c.template data<T>());
  return xt::adapt_smart_ptr(data, shape, std::move(keep));
}

}  // namespace kiln
