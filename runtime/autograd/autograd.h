// Reverse-mode autograd as a graph transform: backward() walks the recorded backward graph and
// records gradient nodes through per-op VJP rules, so gradients are lazy tensors like any other
// and forward + backward form one joint graph.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/core/export.h"
#include "runtime/tensor/tensor.h"

namespace kiln {

// Whether ops record backward nodes on this thread (default true).
KILN_API bool grad_enabled();
KILN_API void set_grad_enabled(bool enabled);

// RAII: disables gradient recording in its scope (like torch.no_grad()).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// RAII: enables gradient recording in its scope.
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(prev_); }

 private:
  bool prev_;
};

// Gradients of sum(outputs[i] * grad_outputs[i]) with respect to `inputs`, returned instead of
// accumulated into .grad(). With create_graph the results are themselves differentiable.
// allow_unused: an input the outputs do not depend on gives an undefined tensor (else Error).
KILN_API std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                                  bool create_graph = false, bool allow_unused = false);

// Backpropagates from several outputs at once (see Tensor::backward).
KILN_API void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs = {},
                       bool retain_graph = false, bool create_graph = false);

// Calls `hook(param)` each time a backward accumulates a gradient into leaf `param`'s .grad(),
// right after the accumulation (as torch's register_post_accumulate_grad_hook; not under
// kiln::grad, which accumulates nothing). Returns an id for remove_post_accumulate_grad_hook.
KILN_API int64_t register_post_accumulate_grad_hook(const Tensor& param, std::function<void(const Tensor&)> hook);
KILN_API void remove_post_accumulate_grad_hook(const Tensor& param, int64_t id);
// Runs `fn` once the backward now running on this thread has finished (as PyTorch's
// queue_callback of the autograd engine); kiln::Error outside a backward.
KILN_API void queue_backward_callback(std::function<void()> fn);

// An edge of the backward graph: which node, and which of its outputs.
struct Edge {
  std::shared_ptr<GradNode> fn;
  explicit operator bool() const { return fn != nullptr; }
};

// A node of the backward graph: maps the gradient of its output to gradients of its inputs.
struct KILN_API GradNode {
  std::vector<Edge> next;  // one per differentiable input (may be empty edges)
  virtual ~GradNode() = default;
  // Gradients for each entry of `next` given the output gradient `g`.
  virtual std::vector<Tensor> apply(const Tensor& g, bool create_graph) = 0;
  // Drops saved tensors (after a backward without retain_graph).
  virtual void release() {}
  // Whether release() ran (a backward without retain_graph went through this node).
  virtual bool released() const { return false; }
  virtual const char* name() const = 0;
};

// Internal to the library (not exported).
namespace detail {
// Attaches a backward node for `op` to `out` if grad mode is on and an input requires grad.
void attach_grad(Tensor& out, OpKind op, const Attrs& attrs, const std::vector<Tensor>& inputs,
                 const Shape& view_shape = {});
// The edge gradients flowing into `t` should follow (its grad_fn, or its leaf accumulator).
Edge grad_edge(const Tensor& t);
// A handle naming t's current node and autograd identity, immune to later in-place rebinding.
Tensor snapshot(const Tensor& t);
// Copies t's autograd identity (requires_grad, grad_fn) onto `dst`.
void copy_autograd(TensorImpl& dst, const Tensor& src);
// A composite's own gradient: given the output gradient (and whether the gradient graph is
// itself to be differentiated), one gradient per input (undefined: none).
using CustomVjp = std::function<std::vector<Tensor>(const Tensor& grad, bool create_graph)>;
// Makes `vjp` the backward of `out` (computed from `inputs` without recording gradients) if
// grad mode is on and an input requires grad. `vjp` is dropped after a backward without
// retain_graph (with the tensors it holds).
void attach_custom_grad(Tensor& out, const char* name, const std::vector<Tensor>& inputs, CustomVjp vjp);
// The same for a backward that reads the composite's output (softmax, log_softmax: what
// PyTorch keeps): the node keeps `out`'s value and hands `vjp` a handle to it whose gradient
// flows back into this node (a double backward differentiates through it).
using CustomVjpOfOutput = std::function<std::vector<Tensor>(const Tensor& grad, const Tensor& out, bool create_graph)>;
void attach_custom_grad(Tensor& out, const char* name, const std::vector<Tensor>& inputs, CustomVjpOfOutput vjp);
// A composite with its own backward: value() recorded as it is where no gradient is wanted; else
// computed without recording gradients, with `vjp` (and only what it captures) as its backward.
Tensor with_custom_grad(const char* name, const std::vector<Tensor>& inputs, const std::function<Tensor()>& value,
                        CustomVjp vjp);
// Marks what `t`'s memory holds, for the memory profile (KILN_PROFILE=memory; a no-op while it
// is off): the optimizer marks parameters and their state, backward the gradients, recording the
// values a backward node keeps.
void mark_memory_role(const Tensor& t, MemoryRole role);
}  // namespace detail

}  // namespace kiln
