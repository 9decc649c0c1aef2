// Cross-entropy written by hand -> its compact forms, as kiln::patterns rewrites. With a one-hot target:
// sum(one_hot(t, C) * log_softmax(x, -1), -1) -> log_softmax(x, -1).gather(-1, t) (no float
// one-hot matrix forward, a scatter of the incoming gradient backward), for x of rank 2 and 3.
// (log(softmax(x)) is rewritten to log_softmax first: builtin_patterns.cpp.)
#include "jit/patterns/pattern_matcher.h"
#include "jit/compile/patterns.h"
#include "runtime/ops/ops.h"

namespace kiln::jit {
namespace {

using Ts = std::vector<Tensor>;
using Ss = std::vector<double>;

// The scatter inside kiln's one_hot(t, C) when `oh` is one_hot(t, C) cast to a float type and
// shaped like x (C classes, the last dim): scatter(zeros, -1, t.unsqueeze(-1), ones). Else null.
const Node* one_hot_scatter(const Tensor& oh, const Tensor& x) {
  const Node* c = oh.node().get();
  if (c->op != OpKind::Cast) return nullptr;
  const Node* s = c->inputs[0].get();
  const int64_t last = static_cast<int64_t>(x.dim()) - 1;
  if (s->op != OpKind::Scatter || s->attrs.ints.empty() || s->attrs.ints[0] != last ||
      s->shape.size() != x.shape().size())
    return nullptr;
  const Node* zeros = s->inputs[0].get();
  const Node* ones = s->inputs[2].get();
  if (zeros->op != OpKind::Full || zeros->attrs.f0 != 0 || ones->op != OpKind::Full || ones->attrs.f0 != 1)
    return nullptr;
  if (s->inputs[1]->op != OpKind::Unsqueeze) return nullptr;
  for (size_t d = 0; d < s->shape.size(); ++d)
    if (!provably_equal(s->shape[d], x.shape()[d])) return nullptr;
  return s;
}

}  // namespace

void register_loss_patterns() {
  using patterns::register_replacement;
  // Cross-entropy written by hand, -log_softmax(x, 1).gather(1, t.unsqueeze(1)).squeeze(1) (the
  // per-sample loss, any reduction after it), -> cross_entropy(x, t, "none"), whose backward is
  // the compact (softmax(x) - onehot(t)) * g: in training graphs only (the forward is the same).
  for (int rank = 1; rank <= 2; ++rank) {
    const std::string name = "cross_entropy_log_softmax_gather_rank" + std::to_string(rank + 1);
    std::vector<int64_t> xs = {3, 5}, ts = {3};
    if (rank == 2) xs.push_back(4), ts.push_back(4);
    register_replacement(
        name,
        [](const Ts& t, const Ss&) { return neg(squeeze(gather(log_softmax(t[0], 1), 1, unsqueeze(t[1], 1)), 1)); },
        [](const Ts& t, const Ss&) { return cross_entropy(t[0], t[1], "none"); }, {empty(xs), empty(ts, kInt64)});
    set_gradient_forms_only(name);
  }
  for (int rank = 2; rank <= 3; ++rank) {
    std::vector<int64_t> shape(static_cast<size_t>(rank - 1), 2);
    shape.push_back(5);
    register_replacement(
        std::string("cross_entropy_one_hot_rank") + std::to_string(rank),
        [](const Ts& t, const Ss&) { return sum(mul(t[0], log_softmax(t[1], -1)), {-1}); },
        [](const Ts& t, const Ss&) {
          const Node* s = one_hot_scatter(t[0], t[1]);
          Tensor idx = Tensor::from_node(s->inputs[1]);  // t.unsqueeze(-1)
          return squeeze(gather(log_softmax(t[1], -1), -1, idx), -1);
        },
        {empty(shape), empty(shape)}, {},
        [](const Ts& t, const Ss&) { return one_hot_scatter(t[0], t[1]) != nullptr; });
  }
}

}  // namespace kiln::jit
