// Function transforms over both AD modes, named as torch.func names them: jvp (forward mode),
// vjp (reverse mode), jacfwd, jacrev, hessian (forward-over-reverse) and hvp. They take functions
// of a list of tensors returning a list of tensors, run on any device, compose (jacfwd(jacrev(f))
// is the hessian), and trace into one graph inside kiln::compile like any other ops. Results
// are differentiable where a primal requires grad (the reverse passes then keep their graphs),
// so transforms nest both ways.
#pragma once
#include <concepts>
#include <functional>
#include <type_traits>
#include <vector>

#include "runtime/core/export.h"
#include "runtime/tensor/tensor.h"

namespace kiln {

// A function of a list of tensors (what the transforms take and return): any callable taking
// `const std::vector<Tensor>&` and returning a `std::vector<Tensor>`, or one Tensor (a list of one).
class TensorsFn {
 public:
  TensorsFn() = default;
  template <class F>
    requires std::invocable<F&, const std::vector<Tensor>&> && (!std::same_as<std::decay_t<F>, TensorsFn>)
  TensorsFn(F f) {  // NOLINT: implicit, so a lambda passes where a TensorsFn is taken
    using R = std::invoke_result_t<F&, const std::vector<Tensor>&>;
    if constexpr (std::is_convertible_v<R, std::vector<Tensor>>)
      fn_ = std::move(f);
    else
      fn_ = [f = std::move(f)](const std::vector<Tensor>& a) mutable { return std::vector<Tensor>{Tensor(f(a))}; };
  }
  std::vector<Tensor> operator()(const std::vector<Tensor>& a) const { return fn_(a); }
  explicit operator bool() const { return static_cast<bool>(fn_); }

 private:
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn_;
};

struct JvpResult {
  std::vector<Tensor> outputs;  // fn(primals)
  std::vector<Tensor> tangents;  // J·tangents, one per output (zeros where none reaches it)
};
// Jacobian-vector product (torch.func.jvp): one forward pass carrying `tangents` (one per
// primal, each of its primal's shape, dtype and device; primals floating point).
KILN_API JvpResult jvp(const TensorsFn& fn, const std::vector<Tensor>& primals, const std::vector<Tensor>& tangents);

struct VjpResult {
  std::vector<Tensor> outputs;  // fn(primals)
  // vᵀ·J for cotangents v (one per output, each of its output's shape): one tensor per primal
  // (zeros for a primal the outputs do not depend on). Callable any number of times.
  std::function<std::vector<Tensor>(const std::vector<Tensor>& cotangents)> vjp_fn;
};
// Vector-Jacobian products (torch.func.vjp).
KILN_API VjpResult vjp(const TensorsFn& fn, const std::vector<Tensor>& primals);

// Jacobians (torch.func.jacfwd / jacrev): the returned function gives, for outputs i and primals
// j, the block d out_i / d primal_j of shape out_i.shape ++ primal_j.shape at index
// i * primals.size() + j. jacfwd runs one jvp per primal element, jacrev one vjp per output
// element: choose by which is fewer.
KILN_API TensorsFn jacfwd(TensorsFn fn);
KILN_API TensorsFn jacrev(TensorsFn fn);
// Second derivatives (torch.func.hessian): jacfwd(jacrev(fn)). For a function with one output,
// block (j, k) = d² out / d primal_j d primal_k (shape out.shape ++ primal_j.shape ++
// primal_k.shape) at index j * primals.size() + k.
KILN_API TensorsFn hessian(TensorsFn fn);

struct HvpResult {
  std::vector<Tensor> outputs;  // fn(primals)
  std::vector<Tensor> hvp;  // H·tangents, one per primal
};
// Hessian-vector product of a function with one scalar output (as
// torch.autograd.functional.hvp), computed forward-over-reverse: one forward pass and one backward
// pass carrying tangents, never the Hessian itself.
KILN_API HvpResult hvp(const TensorsFn& fn, const std::vector<Tensor>& primals, const std::vector<Tensor>& tangents);

}  // namespace kiln
