// optim: optimizers with PyTorch's update formulas, gradient clipping and LR schedulers.
// Updates are recorded lazily like any other op (under NoGradGuard) and rebind parameters.
#pragma once
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/export.h"
#include "runtime/ops/ops.h"

namespace kiln::optim {

// One parameter group: its parameters and its options ("lr", "weight_decay", "beta1", ...),
// each kept as a float64 0-d tensor that updates read and set() fills in place, so a compiled
// training step sees every change. Options that switch a term on or off (a weight decay or
// momentum changed from or to 0, nesterov) change the update's structure: eager steps see it
// at once, a compiled step (whose C++ decisions are trace constants) needs a new compile.
class KILN_API ParamGroup {
 public:
  // The group's parameters.
  const std::vector<Tensor>& params() const { return params_; }
  // Whether the group has an option of this name.
  bool has(const std::string& name) const;
  // An option's current value (throws kiln::Error for an unknown name).
  double get(const std::string& name) const;
  // Sets an option (checked against its valid range), filling its tensor in place.
  void set(const std::string& name, double value);
  // The float64 0-d tensor an update reads for an option (on the device of the group's
  // parameters when they share one, else on the CPU).
  const Tensor& tensor(const std::string& name) const;
  // Names of the group's options, in declaration order.
  std::vector<std::string> option_names() const;
  // The group's learning rate.
  double lr() const { return get("lr"); }
  // Sets the group's learning rate.
  void set_lr(double lr) { set("lr", lr); }

 private:
  friend class Optimizer;
  struct Option {
    std::string name;
    double value, lo, hi;  // valid range [lo, hi], or [lo, hi) with hi_open
    bool hi_open;
    Tensor t;
  };
  Option& find(const std::string& name);
  const Option& find(const std::string& name) const;
  std::string who_;  // the optimizer's name, for errors
  std::vector<Tensor> params_;
  std::vector<Option> options_;
};

// Base class: holds the parameter groups. The state an update reads (each group's options,
// step count, moments) lives in tensors updated in place, so a compiled training step
// (kiln::compile) sees every change, exactly as eager mode does.
class KILN_API Optimizer {
 public:
  // One group of `params` with learning rate `lr`.
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  // Applies one update from the parameters' current gradients (parameters without one are skipped).
  virtual void step() = 0;
  // Clears gradients (sets them undefined).
  void zero_grad();
  // The first group's learning rate.
  double lr() const { return groups_.at(0).lr(); }
  // Sets the learning rate of every group.
  void set_lr(double lr);
  // Sets the learning rate of one group (throws kiln::Error for an index out of range).
  void set_lr(size_t group, double lr);
  // The parameter groups (options readable and settable through ParamGroup).
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Every group's parameters, in group order.
  const std::vector<Tensor>& params() const { return params_; }
  // Steps taken so far (a float64 0-d tensor).
  const Tensor& step_count() const { return step_; }

 protected:
  // An optimizer without groups (the subclass adds them with add_group).
  Optimizer();
  // Option of a new group: name, value and valid range.
  struct OptionSpec {
    std::string name;
    double value, lo = 0, hi = HUGE_VAL;
    bool hi_open = false;
  };
  // Adds a group with its options (`who` names the optimizer in errors). Every parameter must
  // be a trainable leaf in no other group; with `strict`, the group must also be non-empty and
  // free of duplicates.
  ParamGroup& add_group(const char* who, std::vector<Tensor> params, const std::vector<OptionSpec>& options,
                        bool strict);
  // Marks, for the memory profile, the parameters and `state` (the update's own tensors, lazy:
  // each marked before it is computed) with what they hold.
  void mark_memory(std::initializer_list<const std::vector<Tensor>*> state) const;
  std::vector<ParamGroup> groups_;
  std::vector<Tensor> params_;  // every group's parameters, flattened
  Tensor step_;  // number of step() calls, float64 0-d (on the first group's device)
};

struct SGDOptions {
  double lr = 1e-2, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};
// Per-group overrides of SGDOptions (unset: the optimizer's default).
struct SGDGroupOptions {
  std::optional<double> lr, momentum, dampening, weight_decay;
  std::optional<bool> nesterov;
};
// A parameter group for SGD: parameters and their overrides.
struct SGDParamGroup {
  std::vector<Tensor> params;
  SGDGroupOptions options = {};
};
// Stochastic gradient descent with optional momentum, Nesterov momentum and weight decay.
// Group options: lr, momentum, dampening, weight_decay, nesterov (0 or 1).
class KILN_API SGD : public Optimizer {
 public:
  // One group of `params`.
  SGD(std::vector<Tensor> params, SGDOptions o);
  // Several groups, each overriding `defaults` where it sets an option.
  SGD(std::vector<SGDParamGroup> groups, SGDOptions defaults = {});
  void step() override;

 private:
  // Adds a group (strict: from a group list, see Optimizer::add_group).
  void add(std::vector<Tensor> params, const SGDGroupOptions& g, const SGDOptions& d, bool strict);
  std::vector<Tensor> momentum_;  // per parameter; zeros until the first step sets them to the gradient
};

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::optional<double> weight_decay;  // unset: the optimizer's default (Adam 0, AdamW 1e-2, as PyTorch)
};
// Per-group overrides of AdamOptions (unset: the optimizer's default).
struct AdamGroupOptions {
  std::optional<double> lr, beta1, beta2, eps, weight_decay;
};
// A parameter group for Adam/AdamW: parameters and their overrides.
struct AdamParamGroup {
  std::vector<Tensor> params;
  AdamGroupOptions options = {};
};
// Adam (weight decay as L2 added to the gradient). Group options: lr, beta1, beta2, eps,
// weight_decay.
class KILN_API Adam : public Optimizer {
 public:
  // One group of `params`.
  Adam(std::vector<Tensor> params, AdamOptions o = {});
  // Several groups, each overriding `defaults` where it sets an option.
  Adam(std::vector<AdamParamGroup> groups, AdamOptions defaults = {});
  void step() override;

 protected:
  // Groups with decoupled (AdamW) or L2 weight decay; strict: from a group list.
  Adam(std::vector<AdamParamGroup> groups, AdamOptions defaults, bool decoupled, bool strict);
  bool decoupled_;
  std::vector<Tensor> m_, v_;  // first and second moments per parameter (zeros at construction)
};

// AdamW: Adam with decoupled weight decay (default 1e-2).
class KILN_API AdamW : public Adam {
 public:
  // One group of `params`.
  AdamW(std::vector<Tensor> params, AdamOptions o = {});
  // Several groups, each overriding `defaults` where it sets an option.
  AdamW(std::vector<AdamParamGroup> groups, AdamOptions defaults = {});
};

// Dynamic loss scaling for float16 mixed precision, as torch.amp.GradScaler:
//   scaler.scale(loss).backward();   // gradients of loss * scale (small ones stay representable)
//   scaler.step(opt);                // unscales opt's gradients; skips the update on inf/NaN
//   scaler.update();                 // scale * backoff after a skipped step, * growth after
//                                    // growth_interval clean steps
// unscale_(opt) may be called before step (to clip the true gradients); step then does not
// unscale again. Reading whether a gradient was finite waits for the values (one item()).
// Disabled, scale() returns the loss and step() just steps.
struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};
class KILN_API GradScaler {
 public:
  explicit GradScaler(GradScalerOptions o = {});
  // loss * scale (in loss's dtype).
  Tensor scale(const Tensor& loss) const;
  // Divides the gradients of opt's parameters by the scale (once between updates; a second
  // call is a kiln::Error) and notes whether any is inf or NaN.
  void unscale_(Optimizer& opt);
  // Steps `opt` unless a gradient was inf or NaN (unscaling first if unscale_ was not called);
  // returns whether it stepped.
  bool step(Optimizer& opt);
  // Adjusts the scale for the next iteration (after step).
  void update();
  // The current scale, and how many steps were skipped so far.
  double get_scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_; }

 private:
  GradScalerOptions o_;
  double scale_;
  int64_t growth_tracker_ = 0, skipped_ = 0;
  bool unscaled_ = false, found_inf_ = false;
};

// Scales gradients so their global p-norm is at most max_norm; returns the norm before
// clipping (lazy: no synchronization).
KILN_API Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2);

// Multiplies every group's learning rate by gamma every step_size calls of step() (each group
// from its own lr at construction, as PyTorch).
class KILN_API StepLR {
 public:
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1);
  // Advances one epoch and sets every group's lr.
  void step();
  // The first group's current lr.
  double last_lr() const { return opt_.lr(); }
  // Every group's current lr.
  std::vector<double> last_lrs() const;

 private:
  Optimizer& opt_;
  int64_t step_size_, epoch_ = 0;
  double gamma_;
  std::vector<double> base_lrs_;
};

// Cosine annealing of every group's lr from its lr at construction to eta_min over t_max
// calls of step().
class KILN_API CosineAnnealingLR {
 public:
  CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min = 0);
  // Advances one epoch and sets every group's lr.
  void step();
  // The first group's current lr.
  double last_lr() const { return opt_.lr(); }
  // Every group's current lr.
  std::vector<double> last_lrs() const;

 private:
  Optimizer& opt_;
  int64_t t_max_, epoch_ = 0;
  double eta_min_;
  std::vector<double> base_lrs_;
};

}  // namespace kiln::optim
