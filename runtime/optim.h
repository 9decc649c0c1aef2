// optim: optimizers with PyTorch's update formulas, gradient clipping and LR schedulers.
// Updates are recorded lazily like any other op (under NoGradGuard) and rebind parameters.
#pragma once
#include <optional>
#include <utility>
#include <vector>

#include "runtime/ops.h"

namespace kiln::optim {

// Base class: holds the parameters and the learning rate. The state an update reads (lr, step
// count, moments) lives in tensors updated in place, so a compiled training step
// (kiln::compile) sees every change, exactly as eager mode does.
class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  // Applies one update from the parameters' current gradients (parameters without one are skipped).
  virtual void step() = 0;
  // Clears gradients (sets them undefined).
  void zero_grad();
  double lr() const { return lr_; }
  void set_lr(double lr);
  const std::vector<Tensor>& params() const { return params_; }
  // Steps taken so far (a float64 0-d tensor).
  const Tensor& step_count() const { return step_; }

 protected:
  std::vector<Tensor> params_;
  double lr_;
  Tensor lr_t_;   // lr as a float64 0-d tensor (what updates read)
  Tensor step_;   // number of step() calls, float64 0-d
};

struct SGDOptions {
  double lr = 1e-2, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};
// Stochastic gradient descent with optional momentum, Nesterov momentum and weight decay.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions o);
  void step() override;

 private:
  SGDOptions o_;
  std::vector<Tensor> momentum_;  // zeros until the first step sets them to the gradient
};

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::optional<double> weight_decay;  // unset: the optimizer's default (Adam 0, AdamW 1e-2, as PyTorch)
};
// Adam (weight decay as L2 added to the gradient).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions o = {});
  void step() override;

 protected:
  Adam(std::vector<Tensor> params, AdamOptions o, bool decoupled);
  AdamOptions o_;
  double weight_decay_;  // o_.weight_decay or the default
  bool decoupled_;
  std::vector<Tensor> m_, v_;  // first and second moments (zeros at construction)
};

// AdamW: Adam with decoupled weight decay (default 1e-2).
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions o = {});
};

// Scales gradients so their global p-norm is at most max_norm; returns the norm before
// clipping (lazy: no synchronization).
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2);

// Multiplies the learning rate by gamma every step_size calls of step().
class StepLR {
 public:
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1);
  void step();
  double last_lr() const { return opt_.lr(); }

 private:
  Optimizer& opt_;
  int64_t step_size_, epoch_ = 0;
  double gamma_, base_lr_;
};

// Cosine annealing from the initial lr to eta_min over t_max calls of step().
class CosineAnnealingLR {
 public:
  CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min = 0);
  void step();
  double last_lr() const { return opt_.lr(); }

 private:
  Optimizer& opt_;
  int64_t t_max_, epoch_ = 0;
  double eta_min_, base_lr_;
};

}  // namespace kiln::optim
