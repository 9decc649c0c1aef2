// The dropout mask of fused attention (OpKind::Attention with a dropout probability), shared by
// the CPU kernels and mirrored by the CUDA source (kernels/cuda/attention_kernels.cpp): element
// idx of the probabilities (row-major over [batch..., Tq, Tk]) is kept when word idx % 4 of
// Philox4x32(key, base + idx / 4) is below (1 - p) · 2^32. key and base come from the op's four
// generator words w (each below 2^31): key = w0 | w1 << 31, base = w2 | w3 << 31. Kept entries
// are scaled by 1 / (1 - p). Forward and backward rebuild the same mask from the same words.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/strided.h"
#include "runtime/core/philox.h"

namespace kiln::kernels {

// The dropout of one fused attention op: its generator words (null: no dropout) and probability.
struct AttentionDropout {
  const Operand* rng = nullptr;
  double p = 0;
};

// The keep mask and scale of one op's dropout.
class DropoutMask {
 public:
  DropoutMask(uint64_t key, uint64_t base, double p)
      : key_(key), base_(base), threshold_(static_cast<uint64_t>(std::ldexp(1.0 - p, 32))), scale_(1.0 / (1.0 - p)) {}
  // The mask of `d` (its generator words read from host memory).
  static DropoutMask of(const AttentionDropout& d) {
    const int64_t* w = d.rng->ptr<int64_t>();
    const int64_t s = d.rng->strides[0];
    auto word = [&](int i) { return static_cast<uint64_t>(w[i * s]); };
    return DropoutMask(word(0) | word(1) << 31, word(2) | word(3) << 31, d.p);
  }
  bool keep(uint64_t idx) const { return philox4x32(key_, base_ + idx / 4)[idx % 4] < threshold_; }
  // row[c] *= keep(idx0 + c) / (1 - p) for c < n (one Philox call per 4 elements).
  template <class T>
  void apply(T* row, int64_t n, uint64_t idx0) const {
    const T s = static_cast<T>(scale_);
    uint64_t group = ~uint64_t{0};
    std::array<uint32_t, 4> r{};
    for (int64_t c = 0; c < n; ++c) {
      const uint64_t idx = idx0 + static_cast<uint64_t>(c);
      if (idx / 4 != group) {
        group = idx / 4;
        r = philox4x32(key_, base_ + group);
      }
      row[c] = r[idx % 4] < threshold_ ? row[c] * s : T(0);
    }
  }

 private:
  uint64_t key_, base_, threshold_;
  double scale_;
};

}  // namespace kiln::kernels
