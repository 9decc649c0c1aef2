// Hand-written attention -> scaled_dot_product_attention (the fused Attention primitive), as
// kiln::patterns rewrites: softmax(q·kᵀ ∘ s [masked]) · v for q/k/v of rank 3 and 4, with the scale
// as a multiplication, a division or absent, and a mask added, filled in with masked_fill(m, -inf)
// or kept with where(keep, scores, -inf), and with or without dropout on the probabilities (the
// fused kernels draw their own mask: another sample of the same distribution). A boolean mask
// built by tril (or its negation) over the scores' own sizes becomes is_causal, so the kernels skip
// the hidden blocks. Autocast on CUDA computes the softmax of 16-bit scores in float32 and casts the
// probabilities back for the product with v: those forms (16-bit q, k, v; no additive mask) are
// rewritten too.
#include <limits>
#include <optional>

#include "jit/compile/patterns.h"
#include "runtime/ops/attention_policy.h"
#include "runtime/ops/ops.h"

namespace kiln::jit {
namespace {

using Ts = std::vector<Tensor>;
using Ss = std::vector<double>;

bool is_full(const Node* n, double v) { return n->op == OpKind::Full && n->attrs.sizes.empty() && n->attrs.f0 == v; }
bool is_full_nonzero(const Node* n) { return n->op == OpKind::Full && n->attrs.sizes.empty() && n->attrs.f0 != 0; }

// 0, 1, ..., n-1 unsqueezed at `dim` (kiln's tril/triu record their index grids so).
const Node* arange_at(const Node* n, int64_t dim) {
  if (n->op != OpKind::Unsqueeze || n->attrs.ints.empty() || n->attrs.ints[0] != dim) return nullptr;
  const Node* a = n->inputs[0].get();
  return a->op == OpKind::Arange && a->attrs.f0 == 0 && a->attrs.f1 == 1 ? a : nullptr;
}

// Whether `n` is tril's (k = 0: keep col - row <= 0) or triu's (k = 1: keep col - row >= 1)
// test over a [tq, tk] grid: true for tril's keep, false for triu(1)'s (its negation).
std::optional<bool> triangle_test(const Node* n, const SymInt& tq, const SymInt& tk) {
  bool keep;
  if (n->op == OpKind::Le && is_full(n->inputs[1].get(), 0))
    keep = true;
  else if (n->op == OpKind::Ge && is_full(n->inputs[1].get(), 1))
    keep = false;
  else
    return std::nullopt;
  const Node* diff = n->inputs[0].get();
  if (diff->op != OpKind::Sub) return std::nullopt;
  const Node* cols = arange_at(diff->inputs[0].get(), 0);
  const Node* rows = arange_at(diff->inputs[1].get(), 1);
  if (!cols || !rows || !provably_equal(cols->shape[0], tk) || !provably_equal(rows->shape[0], tq)) return std::nullopt;
  return keep;
}

// Whether boolean/numeric `n` equals the causal keep-mask over [tq, tk] (true: it keeps key
// j <= query i; false: it is that mask's negation), built as tril/triu of ones by kiln's ops.
std::optional<bool> causal(const Node* n, const SymInt& tq, const SymInt& tk) {
  switch (n->op) {
    case OpKind::LogicalNot:
      if (auto c = causal(n->inputs[0].get(), tq, tk)) return !*c;
      return std::nullopt;
    case OpKind::Cast:
      if (n->dtype != DType::Bool) return std::nullopt;
      return causal(n->inputs[0].get(), tq, tk);
    case OpKind::Eq:
    case OpKind::Ne: {
      const Node* x = n->inputs[0].get();
      if (!is_full(n->inputs[1].get(), 0)) return std::nullopt;
      auto c = causal(x, tq, tk);
      if (!c) return std::nullopt;
      return n->op == OpKind::Ne ? *c : !*c;
    }
    case OpKind::Where: {  // tril/triu of ones: where(test, ones, 0)
      const Node* ones = n->inputs[1].get();
      if (!is_full(n->inputs[2].get(), 0) || ones->op != OpKind::Full || ones->attrs.f0 == 0) return std::nullopt;
      return triangle_test(n->inputs[0].get(), tq, tk);
    }
    default: return std::nullopt;
  }
}

enum class Scale { Mul, Div, None };
enum class Mask { None, Add, Fill, Keep };

Tensor scores(const Ts& t, const Ss& s, Scale sc) {
  Tensor x = matmul(t[0], transpose(t[1], -2, -1));
  if (sc == Scale::Mul) return mul(x, s[0]);
  if (sc == Scale::Div) return div(x, s[0]);
  return x;
}

double scale_of(const Ss& s, Scale sc) {
  if (sc == Scale::Mul) return s[0];
  if (sc == Scale::Div) return 1.0 / s[0];
  return 1.0;
}

// The keep probability (1 - dropout p) among the scalars: the last one, when there is dropout.
double keep_of(const Ss& s) { return s.back(); }

// `upcast`: the softmax (and dropout) in float32 between casts, as autocast records on CUDA.
Tensor search(const Ts& t, const Ss& s, Scale sc, Mask m, bool drop, bool upcast) {
  const double ninf = -std::numeric_limits<double>::infinity();
  Tensor x = scores(t, s, sc);
  switch (m) {
    case Mask::Add: x = add(x, t[3]); break;
    case Mask::Fill: x = masked_fill(x, t[3], ninf); break;
    case Mask::Keep: x = where(t[3], x, ninf); break;
    case Mask::None: break;
  }
  Tensor p = softmax(upcast ? x.to(kFloat32) : x, -1);
  // (dropout(x, p) records 1 - p: the search passes p = 1 - keep, exact for the example keep)
  if (drop) p = dropout(p, 1 - keep_of(s));
  return matmul(upcast ? p.to(t[2].dtype()) : p, t[2]);
}

Tensor replace(const Ts& t, const Ss& s, Scale sc, Mask m, bool drop) {
  const double scale = scale_of(s, sc), p = drop ? 1 - keep_of(s) : 0.0;
  if (m == Mask::None) return scaled_dot_product_attention(t[0], t[1], t[2], std::nullopt, false, scale, p);
  if (m == Mask::Add) return scaled_dot_product_attention(t[0], t[1], t[2], t[3], false, scale, p);
  const Shape& qs = t[0].shape();
  const Shape& ks = t[1].shape();
  auto c = causal(t[3].node().get(), qs[qs.size() - 2], ks[ks.size() - 2]);
  const bool keep_form = m == Mask::Keep;
  if (c && *c == keep_form) return scaled_dot_product_attention(t[0], t[1], t[2], std::nullopt, true, scale, p);
  return scaled_dot_product_attention(t[0], t[1], t[2], keep_form ? t[3] : logical_not(t[3]), false, scale, p);
}

// On the GPU the rewrite applies only where sdpa itself would take its tiled kernels
// (runtime/ops/attention_policy.h): elsewhere the graph as written is what sdpa would run.
bool worth_fusing(const Ts& t) { return !detail::attention_materializes(t[0], t[1]); }

// The mask broadcasts to the scores without growing them, and an additive one has the scores'
// dtype (sdpa's own rules; anything else stays as written).
bool mask_ok(const Ts& t, Mask m) {
  if (m == Mask::None) return true;
  if (t[3].dim() > t[0].dim()) return false;
  if (m == Mask::Add) return t[3].dtype() == t[0].dtype();
  return t[3].dtype() == DType::Bool;
}

}  // namespace

void register_attention_patterns() {
  using patterns::register_replacement;
  const std::pair<Scale, const char*> scales[] = {{Scale::Mul, "mul"}, {Scale::Div, "div"}, {Scale::None, "unscaled"}};
  const std::pair<Mask, const char*> masks[] = {
      {Mask::None, ""}, {Mask::Add, "_add_mask"}, {Mask::Fill, "_masked_fill"}, {Mask::Keep, "_where_mask"}};
  for (bool upcast : {false, true})
    for (int rank = 3; rank <= 4; ++rank)
      for (auto [sc, sname] : scales)
        for (auto [m, mname] : masks)
          for (bool drop : {false, true}) {
            if (upcast && m == Mask::Add) continue;  // (a float32 mask would promote the scores: no cast)
            auto shape = [&](int64_t rows, int64_t cols) {
              std::vector<int64_t> s(static_cast<size_t>(rank - 2), 2);
              s.push_back(rows);
              s.push_back(cols);
              return s;
            };
            // (the upcast forms are traced in bfloat16: their casts to float32 are then real, and
            // the casts back match any 16-bit dtype of the matched inputs)
            const DType dt = upcast ? kBFloat16 : kFloat32;
            Ts ex = {empty(shape(3, 4), dt), empty(shape(5, 4), dt), empty(shape(5, 4), dt)};
            if (m == Mask::Add) ex.push_back(empty({3, 5}));
            if (m == Mask::Fill || m == Mask::Keep) ex.push_back(empty({3, 5}, kBool));
            // 0.37 and 0.75: a scale and a keep probability no other constant of the graph has (they
            // are wildcards).
            Ss scalars = sc == Scale::None ? Ss{} : Ss{0.37};
            if (drop) scalars.push_back(0.75);
            register_replacement(
                std::string("sdpa_") + sname + mname + (drop ? "_dropout" : "") + (upcast ? "_upcast" : "") + "_rank" +
                    std::to_string(rank),
                [sc, m, drop, upcast](const Ts& t, const Ss& s) { return search(t, s, sc, m, drop, upcast); },
                [sc, m, drop](const Ts& t, const Ss& s) { return replace(t, s, sc, m, drop); }, std::move(ex),
                std::move(scalars),
                [m, drop](const Ts& t, const Ss& s) {
                  return mask_ok(t, m) && worth_fusing(t) && (!drop || (keep_of(s) > 0 && keep_of(s) < 1));
                });
          }
}

}  // namespace kiln::jit
