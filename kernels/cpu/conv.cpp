// im2col / col2im for conv2d as GEMM.
#include "kernels/cpu/reference.h"

namespace kiln::kernels {

void im2col(const Operand& out, const Operand& x, const std::vector<int64_t>& p) {
  const int64_t kh = p[0], kw = p[1], sh = p[2], sw = p[3], ph = p[4], pw = p[5], dh = p[6], dw = p[7];
  const int64_t N = x.sizes[0], C = x.sizes[1], H = x.sizes[2], W = x.sizes[3];
  const int64_t L = out.sizes[2];
  const int64_t Wo = (W + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_for(int64_t(0), N * C, [&](int64_t nc) {
      int64_t n = nc / C, c = nc % C;
      const T* xp = x.ptr<T>() + n * x.strides[0] + c * x.strides[1];
      for (int64_t i = 0; i < kh; ++i)
        for (int64_t j = 0; j < kw; ++j) {
          int64_t row = (c * kh + i) * kw + j;
          T* o = out.ptr<T>() + n * out.strides[0] + row * out.strides[1];
          for (int64_t l = 0; l < L; ++l) {
            int64_t oh = l / Wo, ow = l % Wo;
            int64_t ih = oh * sh - ph + i * dh, iw = ow * sw - pw + j * dw;
            bool in = ih >= 0 && ih < H && iw >= 0 && iw < W;
            o[l * out.strides[2]] = in ? xp[ih * x.strides[2] + iw * x.strides[3]] : T(0.0f);
          }
        }
    });
  });
}

void col2im(const Operand& out, const Operand& cols, const std::vector<int64_t>& p) {
  const int64_t kh = p[0], kw = p[1], sh = p[2], sw = p[3], ph = p[4], pw = p[5], dh = p[6], dw = p[7];
  const int64_t N = out.sizes[0], C = out.sizes[1], H = out.sizes[2], W = out.sizes[3];
  const int64_t L = cols.sizes[2];
  const int64_t Wo = (W + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    using Cm = compute_t<T>;
    parallel_for(int64_t(0), N * C, [&](int64_t nc) {
      int64_t n = nc / C, c = nc % C;
      T* op = out.ptr<T>() + n * out.strides[0] + c * out.strides[1];
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w) op[h * out.strides[2] + w * out.strides[3]] = T(0.0f);
      for (int64_t i = 0; i < kh; ++i)
        for (int64_t j = 0; j < kw; ++j) {
          int64_t row = (c * kh + i) * kw + j;
          const T* cp = cols.ptr<T>() + n * cols.strides[0] + row * cols.strides[1];
          for (int64_t l = 0; l < L; ++l) {
            int64_t oh = l / Wo, ow = l % Wo;
            int64_t ih = oh * sh - ph + i * dh, iw = ow * sw - pw + j * dw;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            T& o = op[ih * out.strides[2] + iw * out.strides[3]];
            o = static_cast<T>(static_cast<Cm>(o) + static_cast<Cm>(cp[l * cols.strides[2]]));
          }
        }
    });
  });
}

}  // namespace kiln::kernels
