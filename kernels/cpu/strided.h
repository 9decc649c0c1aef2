// Strided operands and the N-d loop every reference kernel is built on.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "runtime/core/dtype.h"

namespace kiln::kernels {

// A strided window of memory: pointer to element 0, sizes and element strides.
struct Operand {
  char* data = nullptr;
  DType dtype = DType::Float32;
  std::vector<int64_t> sizes, strides;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    return n;
  }
  template <class T>
  T* ptr() const {
    return reinterpret_cast<T*>(data);
  }
  // This operand's strides right-aligned to `out_sizes`, with 0 for broadcast dims.
  std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& out_sizes) const {
    std::vector<int64_t> st(out_sizes.size(), 0);
    size_t lead = out_sizes.size() - sizes.size();
    for (size_t i = 0; i < sizes.size(); ++i) st[lead + i] = sizes[i] == 1 ? 0 : strides[i];
    return st;
  }
};

// Elements below which a loop runs inline on the calling thread.
inline constexpr int64_t kParallelThreshold = 32768;

// Calls body(offsets, n, inner_strides) over runs of the N-d index space of `sizes`, where
// offsets[k] is operand k's element offset at the run start and the run advances by
// inner_strides[k] per element. Parallel over TBB when large (unless `serial`).
template <size_t N, class Body>
void nd_for(const std::vector<int64_t>& sizes_in, const std::array<std::vector<int64_t>, N>& strides_in, Body&& body,
            bool serial = false) {
  // Drop size-1 dims and coalesce dims contiguous for every operand.
  std::vector<int64_t> sizes;
  std::array<std::vector<int64_t>, N> st;
  int64_t total = 1;
  for (size_t d = 0; d < sizes_in.size(); ++d) {
    total *= sizes_in[d];
    if (sizes_in[d] == 1) continue;
    bool merge = !sizes.empty();
    for (size_t k = 0; k < N && merge; ++k) merge = st[k].back() == strides_in[k][d] * sizes_in[d];
    if (merge) {
      sizes.back() *= sizes_in[d];
      for (size_t k = 0; k < N; ++k) st[k].back() = strides_in[k][d];
    } else {
      sizes.push_back(sizes_in[d]);
      for (size_t k = 0; k < N; ++k) st[k].push_back(strides_in[k][d]);
    }
  }
  if (total == 0) return;
  if (sizes.empty()) {
    sizes.push_back(1);
    for (size_t k = 0; k < N; ++k) st[k].push_back(0);
  }
  const int64_t nd = static_cast<int64_t>(sizes.size());
  const int64_t inner = sizes.back();
  std::array<int64_t, N> inner_st;
  for (size_t k = 0; k < N; ++k) inner_st[k] = st[k].back();
  auto run = [&](int64_t begin, int64_t end) {
    std::vector<int64_t> idx(nd);
    int64_t rem = begin;
    for (int64_t d = nd - 1; d >= 0; --d) {
      idx[d] = rem % sizes[d];
      rem /= sizes[d];
    }
    while (begin < end) {
      std::array<int64_t, N> offs{};
      for (size_t k = 0; k < N; ++k)
        for (int64_t d = 0; d < nd; ++d) offs[k] += idx[d] * st[k][d];
      int64_t n = std::min(inner - idx[nd - 1], end - begin);
      body(offs, n, inner_st);
      begin += n;
      idx[nd - 1] += n;
      for (int64_t d = nd - 1; d > 0 && idx[d] >= sizes[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
  };
  if (serial || total < kParallelThreshold) {
    run(0, total);
  } else {
    parallel_for(tbb::blocked_range<int64_t>(0, total, 16384),
                 [&](const tbb::blocked_range<int64_t>& r) { run(r.begin(), r.end()); });
  }
}

}  // namespace kiln::kernels
