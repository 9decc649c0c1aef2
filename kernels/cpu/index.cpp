// Reference indexing kernels. Index values are range-checked; a bad one raises kiln::Error.
#include "kernels/cpu/reference.h"
#include "runtime/core/error.h"

namespace kiln::kernels {
namespace {

int64_t load_index(const Operand& idx, int64_t off) {
  return idx.dtype == DType::Int64 ? idx.ptr<int64_t>()[off] : idx.ptr<int32_t>()[off];
}

[[noreturn]] void bad_index(const char* op, int64_t v, int64_t dim, int64_t size) {
  throw Error(detail::cat(op, ": index ", v, " is out of bounds for dimension ", dim, " with size ", size));
}

// Strides with dim `dim` zeroed (the indexed dim is addressed through the index value).
std::vector<int64_t> without(const std::vector<int64_t>& st, int64_t dim) {
  std::vector<int64_t> r = st;
  r[dim] = 0;
  return r;
}

}  // namespace

void gather(const Operand& out, const Operand& x, const Operand& index, int64_t dim) {
  const int64_t size = x.sizes.empty() ? 1 : x.sizes[dim];
  const int64_t xs = x.strides.empty() ? 0 : x.strides[dim];
  std::vector<int64_t> xst = x.strides.empty() ? std::vector<int64_t>(out.sizes.size(), 0) : without(x.strides, dim);
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    nd_for<3>(out.sizes, {out.strides, index.strides, xst},
              [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
                for (int64_t i = 0; i < n; ++i) {
                  int64_t v = load_index(index, off[1] + i * st[1]);
                  if (v < 0 || v >= size) bad_index("gather", v, dim, size);
                  out.ptr<T>()[off[0] + i * st[0]] = x.ptr<T>()[off[2] + i * st[2] + v * xs];
                }
              });
  });
}

void scatter(OpKind op, const Operand& out, const Operand& index, const Operand& src, int64_t dim) {
  // out already holds a copy of self; write src at the indexed positions (serially, so
  // duplicate indices resolve deterministically: last write wins, adds accumulate).
  const int64_t size = out.sizes.empty() ? 1 : out.sizes[dim];
  const int64_t os = out.strides.empty() ? 0 : out.strides[dim];
  std::vector<int64_t> ost =
      out.strides.empty() ? std::vector<int64_t>(index.sizes.size(), 0) : without(out.strides, dim);
  const bool add = op == OpKind::ScatterAdd;
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    nd_for<3>(
        index.sizes, {ost, index.strides, src.strides},
        [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
          for (int64_t i = 0; i < n; ++i) {
            int64_t v = load_index(index, off[1] + i * st[1]);
            if (v < 0 || v >= size) bad_index(add ? "scatter_add" : "scatter", v, dim, size);
            T& o = out.ptr<T>()[off[0] + i * st[0] + v * os];
            T s = src.ptr<T>()[off[2] + i * st[2]];
            o = add ? static_cast<T>(static_cast<C>(o) + static_cast<C>(s)) : s;
          }
        },
        /*serial=*/true);
  });
}

void index_select(const Operand& out, const Operand& x, const Operand& index, int64_t dim) {
  const int64_t size = x.sizes.empty() ? 1 : x.sizes[dim];
  const int64_t xs = x.strides.empty() ? 0 : x.strides[dim];
  std::vector<int64_t> xst = x.strides.empty() ? std::vector<int64_t>(out.sizes.size(), 0) : without(x.strides, dim);
  std::vector<int64_t> ist(out.sizes.size(), 0);
  ist[x.sizes.empty() ? 0 : dim] = index.strides[0];
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    nd_for<3>(out.sizes, {out.strides, ist, xst},
              [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
                for (int64_t i = 0; i < n; ++i) {
                  int64_t v = load_index(index, off[1] + i * st[1]);
                  if (v < 0 || v >= size) bad_index("index_select", v, dim, size);
                  out.ptr<T>()[off[0] + i * st[0]] = x.ptr<T>()[off[2] + i * st[2] + v * xs];
                }
              });
  });
}

void index_add(const Operand& out, const Operand& index, const Operand& src, int64_t dim) {
  const int64_t size = out.sizes[dim];
  const int64_t os = out.strides[dim];
  std::vector<int64_t> ost = without(out.strides, dim);
  std::vector<int64_t> ist(src.sizes.size(), 0);
  ist[dim] = index.strides[0];
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    nd_for<3>(
        src.sizes, {ost, ist, src.strides},
        [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
          for (int64_t i = 0; i < n; ++i) {
            int64_t v = load_index(index, off[1] + i * st[1]);
            if (v < 0 || v >= size) bad_index("index_add", v, dim, size);
            T& o = out.ptr<T>()[off[0] + i * st[0] + v * os];
            o = static_cast<T>(static_cast<C>(o) + static_cast<C>(src.ptr<T>()[off[2] + i * st[2]]));
          }
        },
        /*serial=*/true);
  });
}

}  // namespace kiln::kernels
