// Optimizers with PyTorch's update formulas, recorded lazily without gradient tracking.
#include "runtime/optim.h"

#include <cmath>

#include "runtime/autograd.h"

namespace kiln::optim {

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
  KILN_CHECK(lr >= 0, "optimizer: invalid learning rate ", lr);
  lr_t_ = full({}, lr, kFloat64);
  step_ = zeros({}, kFloat64);
  for (size_t i = 0; i < params_.size(); ++i)
    KILN_CHECK(params_[i].defined() && params_[i].requires_grad() && params_[i].is_leaf(), "optimizer: parameter ", i,
               " must be a leaf tensor that requires grad");
}

void Optimizer::set_lr(double lr) {
  KILN_CHECK(lr >= 0, "optimizer: invalid learning rate ", lr);
  lr_ = lr;
  NoGradGuard ng;
  lr_t_.fill_(lr);
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.set_grad(Tensor());
}

SGD::SGD(std::vector<Tensor> params, SGDOptions o) : Optimizer(std::move(params), o.lr), o_(o) {
  KILN_CHECK(o.momentum >= 0 && o.weight_decay >= 0, "SGD: momentum and weight_decay must be non-negative");
  KILN_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD: Nesterov momentum requires a momentum and zero dampening");
  NoGradGuard ng;
  if (o.momentum != 0)
    for (const auto& p : params_) momentum_.push_back(zeros_like(p));
}

void SGD::step() {
  NoGradGuard ng;
  // 0 on the first step (the buffer starts as the gradient), then 1.
  Tensor started = gt(step_, 0).to(kFloat64);
  step_.add_(1);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (o_.weight_decay != 0) g = g + o_.weight_decay * p;
    if (o_.momentum != 0) {
      Tensor& buf = momentum_[i];
      buf.mul_((started * o_.momentum).to(buf.dtype()));
      buf.add_(g * (1 - started * o_.dampening).to(g.dtype()));
      g = o_.nesterov ? g + o_.momentum * buf : buf;
    }
    p.sub_(g * lr_t_.to(g.dtype()));
  }
}

Adam::Adam(std::vector<Tensor> params, AdamOptions o) : Adam(std::move(params), o, false) {}
Adam::Adam(std::vector<Tensor> params, AdamOptions o, bool decoupled)
    : Optimizer(std::move(params), o.lr), o_(o), weight_decay_(o.weight_decay.value_or(decoupled ? 1e-2 : 0)),
      decoupled_(decoupled) {
  KILN_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "Adam: betas must be in [0, 1), got (",
             o.beta1, ", ", o.beta2, ")");
  KILN_CHECK(o.eps >= 0 && weight_decay_ >= 0, "Adam: eps and weight_decay must be non-negative");
  NoGradGuard ng;
  for (const auto& p : params_) {
    m_.push_back(zeros_like(p));
    v_.push_back(zeros_like(p));
  }
}

void Adam::step() {
  NoGradGuard ng;
  step_.add_(1);
  // Bias corrections from the step count (float64, like PyTorch's scalar math).
  Tensor bc1 = 1 - pow(o_.beta1, step_);
  Tensor bc2 = 1 - pow(o_.beta2, step_);
  Tensor step_size = lr_t_ / bc1, bc2_sqrt = sqrt(bc2);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    DType dt = p.dtype();
    if (weight_decay_ != 0) {
      if (decoupled_) p.mul_((1 - lr_t_ * weight_decay_).to(dt));
      else g = g + weight_decay_ * p;
    }
    m_[i].mul_(o_.beta1).add_(g * (1 - o_.beta1));
    v_[i].mul_(o_.beta2).add_(g * g * (1 - o_.beta2));
    Tensor denom = sqrt(v_[i]) / bc2_sqrt.to(dt) + o_.eps;
    p.sub_(m_[i] / denom * step_size.to(dt));
  }
}

AdamW::AdamW(std::vector<Tensor> params, AdamOptions o) : Adam(std::move(params), o, true) {}

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  NoGradGuard ng;
  std::vector<Tensor> norms;
  for (const auto& p : params)
    if (p.grad().defined()) norms.push_back(norm(p.grad().to(kFloat32), norm_type));
  if (norms.empty()) return zeros({});
  Tensor total = std::isinf(norm_type) ? amax(stack(norms)) : norm(stack(norms), norm_type);
  Tensor coef = clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (const auto& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor handle = p;  // shares the parameter's state
    handle.set_grad(g * coef.to(g.dtype()));
  }
  return total;
}

StepLR::StepLR(Optimizer& opt, int64_t step_size, double gamma)
    : opt_(opt), step_size_(step_size), gamma_(gamma), base_lr_(opt.lr()) {
  KILN_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
}
void StepLR::step() {
  ++epoch_;
  opt_.set_lr(base_lr_ * std::pow(gamma_, static_cast<double>(epoch_ / step_size_)));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min)
    : opt_(opt), t_max_(t_max), eta_min_(eta_min), base_lr_(opt.lr()) {
  KILN_CHECK(t_max > 0, "CosineAnnealingLR: T_max must be positive, got ", t_max);
}
void CosineAnnealingLR::step() {
  ++epoch_;
  double c = std::cos(M_PI * static_cast<double>(epoch_) / static_cast<double>(t_max_));
  opt_.set_lr(eta_min_ + (base_lr_ - eta_min_) * (1 + c) / 2);
}

}  // namespace kiln::optim
