// Layer norm written by hand -> kiln::layer_norm, whose backward is the compact form (one stage of
// row reductions: dx = r * (g - mean(g) - x^ * mean(g * x^))) instead of the chain rule through
// the mean and the variance (two stages). Matched in training graphs only: the forward alone is
// layer_norm's own.
//
// Forms, over the last dim of x of rank 2 or 3: c = x - mean(x, -1, keepdim), the variance as
// mean(c * c) (square(c) records the same), mean(pow(c, 2)) or var(x, -1, correction 0, keepdim), normalized
// as c / sqrt(v + eps) or c * rsqrt(v + eps), then * w + b (w, b of shape [D]) or nothing.
#include "jit/patterns/pattern_matcher.h"
#include "jit/compile/patterns.h"
#include "runtime/ops/ops.h"

namespace kiln::jit {
namespace {

using Ts = std::vector<Tensor>;
using Ss = std::vector<double>;

// Example sizes and scalars: the last dim (its count is the means' divisor, a wildcard checked to
// be the matched x's last dim) and eps, values no other constant of the forms has.
constexpr int64_t kDim = 6;
constexpr double kEps = 1.25e-5;

enum class Variance { Mul, Pow, Var };
const char* name_of(Variance v) {
  switch (v) {
    case Variance::Mul: return "mul";
    case Variance::Pow: return "pow";
    case Variance::Var: return "var";
  }
  return "?";
}

Tensor hand_written(const Tensor& x, Variance form, bool rsqrt_form, double eps) {
  Tensor c = x - x.mean({-1}, true);
  Tensor v;
  switch (form) {
    case Variance::Mul: v = (c * c).mean({-1}, true); break;
    case Variance::Pow: v = pow(c, 2.0).mean({-1}, true); break;
    case Variance::Var: v = var(x, {-1}, 0, true); break;
  }
  return rsqrt_form ? c * rsqrt(v + eps) : c / sqrt(v + eps);
}

}  // namespace

void register_norm_patterns() {
  using patterns::register_replacement;
  for (int rank = 2; rank <= 3; ++rank)
    for (Variance form : {Variance::Mul, Variance::Pow, Variance::Var})
      for (bool rs : {false, true})
        for (bool affine : {true, false}) {
          std::vector<int64_t> shape(static_cast<size_t>(rank - 1), 3);
          shape.push_back(kDim);
          const std::string name = std::string("layer_norm_") + name_of(form) + (rs ? "_rsqrt" : "_sqrt") +
                                   (affine ? "_affine" : "") + "_rank" + std::to_string(rank);
          Ts examples = {empty(shape)};
          if (affine) examples.insert(examples.end(), {empty({kDim}), empty({kDim})});
          register_replacement(
              name,
              [form, rs, affine](const Ts& t, const Ss& s) {
                Tensor y = hand_written(t[0], form, rs, s[0]);
                return affine ? y * t[1] + t[2] : y;
              },
              [affine](const Ts& t, const Ss& s) {
                const int64_t d = t[0].shape().back().as_int();
                return affine ? layer_norm(t[0], {d}, t[1], t[2], s[0])
                              : layer_norm(t[0], {d}, std::nullopt, std::nullopt, s[0]);
              },
              examples, {kEps, static_cast<double>(kDim)},
              // The means divide by the last dim of x (a constant size), eps is not negative.
              [affine](const Ts& t, const Ss& s) {
                const auto d = t[0].shape().back().maybe_int();
                if (!d || static_cast<double>(*d) != s[1] || s[0] < 0) return false;
                if (!affine) return true;
                for (const Tensor& p : {t[1], t[2]})
                  if (p.dim() != 1 || p.shape()[0].maybe_int() != d) return false;
                return true;
              });
          set_gradient_forms_only(name);
        }
}

}  // namespace kiln::jit
