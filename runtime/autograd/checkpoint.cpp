// kiln::checkpoint: the forward without a graph, the backward recomputing it (checkpoint.h).
#include "runtime/autograd/checkpoint.h"

#include "runtime/autograd/autograd.h"
#include "runtime/core/error.h"
#include "runtime/ops/autocast_policy.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"
#include "runtime/tensor/trace.h"

namespace kiln {
namespace {

// What the forward saw, for the recomputation: each input's value then (its node: nodes are
// immutable, so an in-place write to the input after the forward rebinds the input and leaves
// this as it was; no copy is made), whether it asked for a gradient and
// the thread's autocast state (the generator positions the forward's random ops got are added by
// the caller).
struct Saved {
  std::vector<Tensor> values;
  std::vector<bool> wants_grad;
  detail::RngRecord::Draws draws;
  uint32_t autocast;
};

Saved save(const std::vector<Tensor>& inputs) {
  Saved s{{}, {}, {}, detail::autocast_key()};
  for (const Tensor& t : inputs) {
    s.values.push_back(t.defined() ? t.detach() : t);
    s.wants_grad.push_back(t.defined() && t.requires_grad() && is_floating(t.dtype()));
  }
  return s;
}

// The recomputation's leaves: the saved values, asking for a gradient where the input did.
std::vector<Tensor> fresh_leaves(const Saved& s) {
  std::vector<Tensor> leaves;
  for (size_t i = 0; i < s.values.size(); ++i) {
    Tensor l = s.values[i].defined() ? s.values[i].detach() : s.values[i];
    if (s.wants_grad[i]) l.requires_grad_(true);
    leaves.push_back(l);
  }
  return leaves;
}

}  // namespace

Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs) {
  KILN_CHECK(fn, "checkpoint: no function given");
  // Inside kiln::compile the traced step's min-cut partition decides what the backward keeps and
  // what it recomputes; tracing the recomputation as well duplicated the block's nodes and raised
  // the compiled GPT-M step's peak (6.7 -> 9.1 GiB on an H100, docs/BENCHMARKS.md). So the block
  // is traced as it is.
  if (detail::trace_observer()) return fn(inputs);
  auto saved = std::make_shared<Saved>(save(inputs));
  Tensor out;
  {
    NoGradGuard no_grad;
    detail::RngRecord record;  // (drawn from the process's generator, as without checkpoint)
    out = fn(inputs);
    saved->draws = record.draws();
  }
  KILN_CHECK(out.defined(), "checkpoint: the function returned an undefined tensor");
  if (!grad_enabled()) return out;
  bool wanted = false;
  for (const Tensor& t : inputs) wanted = wanted || (t.defined() && t.requires_grad());
  // Parameters read inside fn ask for gradients even when no input does: the output then needs
  // a backward as well. Whether fn reads any is known only by running it with grad mode on, so
  // the output is treated as differentiable whenever it is floating (as PyTorch's
  // use_reentrant=False does).
  if (!is_floating(out.dtype())) return out;
  // attach_custom_grad needs an input asking for a gradient: where none does, a stand-in that is
  // never given one, so the parameters inside fn still receive theirs.
  std::vector<Tensor> grad_inputs = inputs;
  if (!wanted) grad_inputs.push_back(zeros({}, out.dtype(), out.device()).requires_grad_(true));
  detail::attach_custom_grad(out, "checkpoint", grad_inputs, [fn, saved, wanted](const Tensor& g, bool create_graph) {
    // The recomputation's gradients are functions of fresh leaves, not of the inputs' history:
    // a second derivative through them would silently miss terms.
    KILN_CHECK(!create_graph, "checkpoint: a backward with create_graph (double backward, hvp) through a ",
               "checkpointed block is not supported; call the block without checkpoint there");
    std::vector<Tensor> leaves = fresh_leaves(*saved);
    Tensor again;
    {
      // The forward's conditions: gradients on, its autocast state, its random numbers at the
      // positions it got (the process's generator, which other threads draw from, is not touched).
      EnableGradGuard on;
      detail::AutocastAs autocast(saved->autocast);
      detail::RngReplay rng(saved->draws);
      again = fn(leaves);
    }
    KILN_CHECK(again.defined() && again.sizes() == g.sizes(), "checkpoint: the recomputation gave a result of shape ",
               again.defined() ? detail::str(again.shape()) : std::string("(undefined)"), ", the forward ",
               detail::str(g.shape()), "; fn must compute the same function both times");
    std::vector<Tensor> grads(leaves.size() + (wanted ? 0 : 1));
    if (again.requires_grad()) {
      kiln::backward({again}, {g});
      for (size_t i = 0; i < leaves.size(); ++i)
        if (leaves[i].defined() && leaves[i].requires_grad() && leaves[i].grad().defined()) grads[i] = leaves[i].grad();
    }
    return grads;
  });
  return out;
}

}  // namespace kiln
