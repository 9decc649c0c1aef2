// Optimizers with PyTorch's update formulas, recorded lazily without gradient tracking.
#include "runtime/optim/optim.h"

#include <cmath>
#include <map>

#include "runtime/autograd/autograd.h"

namespace kiln::optim {

// ---- parameter groups ----
const ParamGroup::Option& ParamGroup::find(const std::string& name) const {
  for (const auto& o : options_)
    if (o.name == name) return o;
  std::string known;
  for (const auto& o : options_) known += (known.empty() ? "" : ", ") + o.name;
  throw Error(who_ + ": parameter groups have no option '" + name + "' (options: " + known + ")");
}
ParamGroup::Option& ParamGroup::find(const std::string& name) {
  return const_cast<Option&>(static_cast<const ParamGroup*>(this)->find(name));
}
bool ParamGroup::has(const std::string& name) const {
  for (const auto& o : options_)
    if (o.name == name) return true;
  return false;
}
double ParamGroup::get(const std::string& name) const { return find(name).value; }
const Tensor& ParamGroup::tensor(const std::string& name) const { return find(name).t; }
std::vector<std::string> ParamGroup::option_names() const {
  std::vector<std::string> out;
  for (const auto& o : options_) out.push_back(o.name);
  return out;
}

namespace {
void check_range(const std::string& who, const std::string& name, double v, double lo, double hi, bool hi_open) {
  bool ok = v >= lo && (hi_open ? v < hi : v <= hi);
  KILN_CHECK(ok, who, ": invalid ", name, " ", v, " (valid: [", lo, ", ", hi, hi_open ? "))" : "])");
}
}  // namespace

void ParamGroup::set(const std::string& name, double value) {
  Option& o = find(name);
  check_range(who_, name, value, o.lo, o.hi, o.hi_open);
  o.value = value;
  NoGradGuard ng;
  o.t.fill_(value);
}

// ---- optimizer ----
Optimizer::Optimizer() { step_ = zeros({}, kFloat64); }

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : Optimizer() {
  KILN_CHECK(lr >= 0, "optimizer: invalid learning rate ", lr);
  add_group("optimizer", std::move(params), {{"lr", lr}}, false);
}

ParamGroup& Optimizer::add_group(const char* who, std::vector<Tensor> params, const std::vector<OptionSpec>& options,
                                 bool strict) {
  size_t g = groups_.size();
  KILN_CHECK(!strict || !params.empty(), who, ": parameter group ", g, " is empty");
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    KILN_CHECK(p.defined() && p.requires_grad() && p.is_leaf(), strict ? who : "optimizer", ": parameter ",
               params_.size() + i, " must be a leaf tensor that requires grad");
    for (size_t j = 0; j < groups_.size(); ++j)
      for (const auto& q : groups_[j].params_)
        KILN_CHECK(q.impl() != p.impl(), who, ": a parameter of group ", g, " is already in group ", j,
                   " (a parameter may be in one group only)");
    if (strict)
      for (size_t j = 0; j < i; ++j)
        KILN_CHECK(params[j].impl() != p.impl(), who, ": parameter group ", g, " holds a parameter twice");
  }
  // The scalars an update reads live where the group's parameters do (all on one device), so
  // an update on a GPU reads no host value: the whole step can be one device graph.
  Device dev = params.empty() ? cpu() : params[0].device();
  for (const auto& p : params)
    if (p.device() != dev) dev = cpu();
  if (groups_.empty() && dev != cpu()) step_ = step_.to(dev).eval();
  ParamGroup group;
  group.who_ = who;
  for (const auto& o : options) {
    check_range(who, o.name, o.value, o.lo, o.hi, o.hi_open);
    group.options_.push_back({o.name, o.value, o.lo, o.hi, o.hi_open, full({}, o.value, kFloat64, dev)});
  }
  for (const auto& p : params) params_.push_back(p);
  group.params_ = std::move(params);
  groups_.push_back(std::move(group));
  return groups_.back();
}

void Optimizer::set_lr(double lr) {
  KILN_CHECK(lr >= 0, "optimizer: invalid learning rate ", lr);
  for (auto& g : groups_) g.set_lr(lr);
}

void Optimizer::set_lr(size_t group, double lr) {
  KILN_CHECK(group < groups_.size(), "optimizer: group index ", group, " out of range (", groups_.size(), " groups)");
  groups_[group].set_lr(lr);
}

void Optimizer::mark_memory(std::initializer_list<const std::vector<Tensor>*> state) const {
  for (const Tensor& p : params_) detail::mark_memory_role(p, MemoryRole::Parameter);
  detail::mark_memory_role(step_, MemoryRole::OptimizerState);
  for (const std::vector<Tensor>* ts : state)
    for (const Tensor& t : *ts) detail::mark_memory_role(t, MemoryRole::OptimizerState);
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.set_grad(Tensor());
}

// ---- SGD ----
SGD::SGD(std::vector<Tensor> params, SGDOptions o) : Optimizer() {
  KILN_CHECK(o.lr >= 0, "optimizer: invalid learning rate ", o.lr);
  add(std::move(params), {}, o, false);  // a plain list: permissive as before
}

SGD::SGD(std::vector<SGDParamGroup> groups, SGDOptions defaults) : Optimizer() {
  KILN_CHECK(!groups.empty(), "SGD: no parameter groups");
  for (auto& g : groups) add(std::move(g.params), g.options, defaults, true);
}

void SGD::add(std::vector<Tensor> params, const SGDGroupOptions& g, const SGDOptions& d, bool strict) {
  double momentum = g.momentum.value_or(d.momentum), dampening = g.dampening.value_or(d.dampening);
  bool nesterov = g.nesterov.value_or(d.nesterov);
  KILN_CHECK(momentum >= 0 && g.weight_decay.value_or(d.weight_decay) >= 0,
             "SGD: momentum and weight_decay must be non-negative");
  KILN_CHECK(!nesterov || (momentum > 0 && dampening == 0),
             "SGD: Nesterov momentum requires a momentum and zero dampening");
  ParamGroup& group = add_group("SGD", std::move(params),
                                {{"lr", g.lr.value_or(d.lr)},
                                 {"momentum", momentum},
                                 {"dampening", dampening, -HUGE_VAL},
                                 {"weight_decay", g.weight_decay.value_or(d.weight_decay)},
                                 {"nesterov", nesterov ? 1.0 : 0.0, 0, 1}},
                                strict);
  NoGradGuard ng;
  for (const auto& p : group.params()) momentum_.push_back(momentum != 0 ? zeros_like(p) : Tensor());
  mark_memory({&momentum_});
}

void SGD::step() {
  NoGradGuard ng;
  // 0 on the first step (the buffer starts as the gradient), then 1.
  Tensor started = gt(step_, 0).to(kFloat64);
  step_.add_(1);
  size_t i = 0;
  for (auto& group : groups_) {
    double momentum = group.get("momentum");
    bool nesterov = group.get("nesterov") != 0;
    KILN_CHECK(!nesterov || (momentum > 0 && group.get("dampening") == 0),
               "SGD: Nesterov momentum requires a momentum and zero dampening");
    bool decay = group.get("weight_decay") != 0;
    const Tensor &lr = group.tensor("lr"), &mom = group.tensor("momentum"), &damp = group.tensor("dampening"),
                 &wd = group.tensor("weight_decay");
    for (Tensor p : group.params()) {
      Tensor& buf = momentum_[i++];
      Tensor g = p.grad();
      if (!g.defined()) continue;
      DType dt = g.dtype();
      if (decay) g = g + wd.to(dt) * p;
      if (momentum != 0) {
        if (!buf.defined()) buf = zeros_like(p);  // momentum switched on after construction
        buf.mul_((started * mom).to(buf.dtype()));
        buf.add_(g * (1 - started * damp).to(dt));
        g = nesterov ? g + mom.to(dt) * buf : buf;
      }
      p.sub_(g * lr.to(dt));
    }
  }
  mark_memory({&momentum_});
}

// ---- Adam / AdamW ----
Adam::Adam(std::vector<Tensor> params, AdamOptions o) : Adam({AdamParamGroup{std::move(params)}}, o, false, false) {}
Adam::Adam(std::vector<AdamParamGroup> groups, AdamOptions defaults) : Adam(std::move(groups), defaults, false, true) {}
Adam::Adam(std::vector<AdamParamGroup> groups, AdamOptions d, bool decoupled, bool strict)
    : Optimizer(), decoupled_(decoupled) {
  const char* who = decoupled ? "AdamW" : "Adam";
  KILN_CHECK(!groups.empty(), who, ": no parameter groups");
  for (auto& grp : groups) {
    const AdamGroupOptions& g = grp.options;
    double lr = g.lr.value_or(d.lr), b1 = g.beta1.value_or(d.beta1), b2 = g.beta2.value_or(d.beta2);
    double eps = g.eps.value_or(d.eps), wd = g.weight_decay.value_or(d.weight_decay.value_or(decoupled ? 1e-2 : 0));
    KILN_CHECK(lr >= 0, "optimizer: invalid learning rate ", lr);
    KILN_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, who, ": betas must be in [0, 1), got (", b1, ", ", b2, ")");
    KILN_CHECK(eps >= 0 && wd >= 0, who, ": eps and weight_decay must be non-negative");
    ParamGroup& group = add_group(
        who, std::move(grp.params),
        {{"lr", lr}, {"beta1", b1, 0, 1, true}, {"beta2", b2, 0, 1, true}, {"eps", eps}, {"weight_decay", wd}}, strict);
    NoGradGuard ng;
    for (const auto& p : group.params()) {
      m_.push_back(zeros_like(p));
      v_.push_back(zeros_like(p));
    }
  }
  mark_memory({&m_, &v_});
}

void Adam::step() {
  NoGradGuard ng;
  step_.add_(1);
  size_t i = 0;
  for (auto& group : groups_) {
    const Tensor &lr = group.tensor("lr"), &b1 = group.tensor("beta1"), &b2 = group.tensor("beta2"),
                 &eps = group.tensor("eps"), &wd = group.tensor("weight_decay");
    bool decay = group.get("weight_decay") != 0;
    // Bias corrections from the step count (float64, like PyTorch's scalar math).
    Tensor bc1 = 1 - pow(b1, step_);
    Tensor bc2 = 1 - pow(b2, step_);
    Tensor step_size = lr / bc1, bc2_sqrt = sqrt(bc2);
    Tensor decay_factor = decoupled_ && decay ? 1 - lr * wd : Tensor();
    // The scalars in each parameter dtype, made once a group (not once a parameter: one
    // node each in the step's graph).
    struct Scalars {
      Tensor decay, b1, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps, step_size;
    };
    std::map<DType, Scalars> in_dtype;
    auto scalars = [&](DType dt) -> const Scalars& {
      auto it = in_dtype.find(dt);
      if (it != in_dtype.end()) return it->second;
      Scalars c{decay_factor.defined() ? decay_factor.to(dt) : Tensor(),
                b1.to(dt),
                (1 - b1).to(dt),
                b2.to(dt),
                (1 - b2).to(dt),
                bc2_sqrt.to(dt),
                eps.to(dt),
                step_size.to(dt)};
      return in_dtype.emplace(dt, std::move(c)).first->second;
    };
    for (Tensor p : group.params()) {
      Tensor &m = m_[i], &v = v_[i];
      ++i;
      Tensor g = p.grad();
      if (!g.defined()) continue;
      const Scalars& c = scalars(p.dtype());
      if (decay) {
        if (decoupled_)
          p.mul_(c.decay);
        else
          g = g + wd.to(p.dtype()) * p;
      }
      m.mul_(c.b1).add_(g * c.one_minus_b1);
      v.mul_(c.b2).add_(g * g * c.one_minus_b2);
      Tensor denom = sqrt(v) / c.bc2_sqrt + c.eps;
      p.sub_(m / denom * c.step_size);
    }
  }
  mark_memory({&m_, &v_});
}

AdamW::AdamW(std::vector<Tensor> params, AdamOptions o) : Adam({AdamParamGroup{std::move(params)}}, o, true, false) {}
AdamW::AdamW(std::vector<AdamParamGroup> groups, AdamOptions defaults)
    : Adam(std::move(groups), defaults, true, true) {}

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

GradScaler::GradScaler(GradScalerOptions o) : o_(o), scale_(o.init_scale) {
  KILN_CHECK(o.init_scale > 0 && std::isfinite(o.init_scale),
             "GradScaler: init_scale must be positive and finite, got ", o.init_scale);
  KILN_CHECK(o.growth_factor > 1, "GradScaler: growth_factor must be > 1, got ", o.growth_factor);
  KILN_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, "GradScaler: backoff_factor must be in (0, 1), got ",
             o.backoff_factor);
  KILN_CHECK(o.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ", o.growth_interval);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  KILN_CHECK(loss.defined(), "GradScaler::scale: got an undefined tensor");
  return o_.enabled ? loss * scale_ : loss;
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!o_.enabled) return;
  KILN_CHECK(!unscaled_, "GradScaler::unscale_: already called since the last update()");
  NoGradGuard ng;
  Tensor bad;
  for (const auto& p : opt.params()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor nonfinite = any(logical_not(isfinite(g)));
    bad = bad.defined() ? logical_or(bad, nonfinite) : nonfinite;
    Tensor handle = p;  // shares the parameter's state
    handle.set_grad(g * (1.0 / scale_));
  }
  found_inf_ = bad.defined() && bad.item<bool>();
  unscaled_ = true;
}

bool GradScaler::step(Optimizer& opt) {
  if (!o_.enabled) {
    opt.step();
    return true;
  }
  if (!unscaled_) unscale_(opt);
  if (found_inf_) {
    ++skipped_;
    return false;
  }
  opt.step();
  return true;
}

void GradScaler::update() {
  if (!o_.enabled) return;
  if (found_inf_) {
    scale_ *= o_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == o_.growth_interval) {
    scale_ *= o_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = found_inf_ = false;
}

namespace {
std::vector<double> group_lrs(const Optimizer& opt) {
  std::vector<double> out;
  for (const auto& g : opt.param_groups()) out.push_back(g.lr());
  return out;
}
}  // namespace

StepLR::StepLR(Optimizer& opt, int64_t step_size, double gamma)
    : opt_(opt), step_size_(step_size), gamma_(gamma), base_lrs_(group_lrs(opt)) {
  KILN_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
}
void StepLR::step() {
  KILN_CHECK(opt_.param_groups().size() == base_lrs_.size(), "StepLR: the optimizer's groups changed");
  ++epoch_;
  double f = std::pow(gamma_, static_cast<double>(epoch_ / step_size_));
  for (size_t i = 0; i < base_lrs_.size(); ++i) opt_.set_lr(i, base_lrs_[i] * f);
}
std::vector<double> StepLR::last_lrs() const { return group_lrs(opt_); }

CosineAnnealingLR::CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min)
    : opt_(opt), t_max_(t_max), eta_min_(eta_min), base_lrs_(group_lrs(opt)) {
  KILN_CHECK(t_max > 0, "CosineAnnealingLR: T_max must be positive, got ", t_max);
}
void CosineAnnealingLR::step() {
  KILN_CHECK(opt_.param_groups().size() == base_lrs_.size(), "CosineAnnealingLR: the optimizer's groups changed");
  ++epoch_;
  double c = std::cos(M_PI * static_cast<double>(epoch_) / static_cast<double>(t_max_));
  for (size_t i = 0; i < base_lrs_.size(); ++i) opt_.set_lr(i, eta_min_ + (base_lrs_[i] - eta_min_) * (1 + c) / 2);
}
std::vector<double> CosineAnnealingLR::last_lrs() const { return group_lrs(opt_); }

}  // namespace kiln::optim
