// nn modules: parameter registry, train/eval, state dicts, and the standard layers.
#include "runtime/nn/nn.h"

#include <cmath>

#include "runtime/autograd/autograd.h"

namespace kiln::nn {

Tensor Module::forward(const Tensor&) { throw Error("Module::forward: this module does not define forward()"); }

Tensor& Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  KILN_CHECK(t.defined(), "register_parameter: '", name, "' is undefined");
  for (auto& [n, _] : params_) KILN_CHECK(n != name, "register_parameter: '", name, "' already registered");
  t = t.is_leaf() && !t.requires_grad() ? t : t.detach();
  {
    NoGradGuard ng;
    t = contiguous(t).clone();  // own dense storage
  }
  if (requires_grad) t.requires_grad_();
  detail::mark_memory_role(t, MemoryRole::Parameter);
  params_.emplace_back(name, t);
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  KILN_CHECK(t.defined(), "register_buffer: '", name, "' is undefined");
  buffers_.emplace_back(name, t.detach());
  return buffers_.back().second;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& p : params_) out.push_back(p);
  if (recurse)
    for (auto& [n, c] : children_)
      for (auto& [pn, t] : c->named_parameters(true)) out.emplace_back(n + "." + pn, t);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [_, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& b : buffers_) out.push_back(b);
  if (recurse)
    for (auto& [n, c] : children_)
      for (auto& [bn, t] : c->named_buffers(true)) out.emplace_back(n + "." + bn, t);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [_, c] : children_) c->train(on);
}

void Module::zero_grad() {
  for (auto& t : parameters()) t.set_grad(Tensor());
}

Module& Module::to(Device device) {
  NoGradGuard ng;
  for (auto* list : {&params_, &buffers_})
    for (auto& [name, t] : *list)
      if (t.device() != device) t.set_data(t.to(device));
  for (auto& [name, m] : children_) m->to(device);
  return *this;
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> sd;
  for (auto& [n, t] : named_parameters()) sd[n] = t.detach();
  for (auto& [n, t] : named_buffers()) sd[n] = t.detach();
  return sd;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& sd, bool strict) {
  auto targets = named_parameters();
  for (auto& b : named_buffers()) targets.push_back(b);
  // Validate everything before changing anything.
  for (auto& [name, t] : targets) {
    auto it = sd.find(name);
    if (it == sd.end()) {
      KILN_CHECK(!strict, "load_state_dict: missing key '", name, "'");
      continue;
    }
    KILN_CHECK(it->second.sizes() == t.sizes(), "load_state_dict: '", name, "' has shape ",
               shape_str(it->second.shape()), " in the state dict, expected ", shape_str(t.shape()));
    KILN_CHECK(it->second.dtype() == t.dtype(), "load_state_dict: '", name, "' has dtype ",
               dtype_name(it->second.dtype()), ", expected ", dtype_name(t.dtype()));
  }
  if (strict)
    for (auto& [name, _] : sd) {
      bool known = false;
      for (auto& [n, __] : targets) known = known || n == name;
      KILN_CHECK(known, "load_state_dict: unexpected key '", name, "'");
    }
  NoGradGuard ng;
  for (auto& [name, t] : targets) {
    auto it = sd.find(name);
    if (it != sd.end()) t.copy_(it->second.clone());
  }
}

void Module::save(const std::string& path) const { save_state_dict(state_dict(), path); }
void Module::load(const std::string& path) { load_state_dict(load_state_dict_file(path)); }

// ---- layers ----
Linear::Linear(int64_t in, int64_t out, bool has_bias, DType dtype) {
  KILN_CHECK(in > 0 && out > 0, "Linear: expected positive sizes, got in=", in, ", out=", out);
  double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight = register_parameter("weight", (rand({out, in}, dtype) * 2 - 1) * bound);
  if (has_bias) bias = register_parameter("bias", (rand({out}, dtype) * 2 - 1) * bound);
}
Tensor Linear::forward(const Tensor& x) {
  return hooked(x, [&](const Tensor& in) {
    return linear(in, weight, bias.defined() ? std::optional<Tensor>(bias) : std::nullopt);
  });
}

Conv2d::Conv2d(int64_t in, int64_t out, std::vector<int64_t> k, std::vector<int64_t> s, std::vector<int64_t> p,
               std::vector<int64_t> d, int64_t g, bool has_bias)
    : stride(std::move(s)), padding(std::move(p)), dilation(std::move(d)), groups(g) {
  if (k.size() == 1) k.push_back(k[0]);
  KILN_CHECK(k.size() == 2 && g > 0 && in % g == 0 && out % g == 0, "Conv2d: invalid configuration (in=", in,
             ", out=", out, ", groups=", g, ")");
  double bound = 1.0 / std::sqrt(static_cast<double>(in / g * k[0] * k[1]));
  weight = register_parameter("weight", (rand({out, in / g, k[0], k[1]}) * 2 - 1) * bound);
  if (has_bias) bias = register_parameter("bias", (rand({out}) * 2 - 1) * bound);
}
Tensor Conv2d::forward(const Tensor& x) {
  return hooked(x, [&](const Tensor& in) {
    return conv2d(in, weight, bias.defined() ? std::optional<Tensor>(bias) : std::nullopt, stride, padding, dilation,
                  groups);
  });
}

Embedding::Embedding(int64_t n, int64_t dim) { weight = register_parameter("weight", randn({n, dim})); }
Tensor Embedding::forward(const Tensor& idx) {
  return hooked(idx, [&](const Tensor& in) { return embedding(in, weight); });
}

LayerNorm::LayerNorm(std::vector<int64_t> shape, double e, bool affine) : normalized_shape(std::move(shape)), eps(e) {
  if (affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    bias = register_parameter("bias", zeros(normalized_shape));
  }
}
Tensor LayerNorm::forward(const Tensor& x) {
  auto opt = [](const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; };
  return hooked(x, [&](const Tensor& in) { return layer_norm(in, normalized_shape, opt(weight), opt(bias), eps); });
}

Dropout::Dropout(double prob) : p(prob) {
  KILN_CHECK(p >= 0 && p <= 1, "Dropout: probability has to be between 0 and 1, got ", p);
}
Tensor Dropout::forward(const Tensor& x) {
  return hooked(x, [&](const Tensor& in) { return dropout(in, p, is_training()); });
}

void Module::register_forward_pre_hook(std::function<Tensor(Module&, const Tensor&)> hook) {
  KILN_CHECK(hook != nullptr, "register_forward_pre_hook: empty hook");
  pre_hooks_.push_back(std::move(hook));
}
void Module::register_forward_hook(std::function<Tensor(Module&, const Tensor&, const Tensor&)> hook) {
  KILN_CHECK(hook != nullptr, "register_forward_hook: empty hook");
  hooks_.push_back(std::move(hook));
}

Sequential::Sequential(std::vector<std::shared_ptr<Module>> layers) {
  for (auto& l : layers) push_back(std::move(l));
}
Sequential& Sequential::push_back(std::shared_ptr<Module> m) {
  KILN_CHECK(m != nullptr, "Sequential: null module");
  register_module(std::to_string(children_.size()), std::move(m));
  return *this;
}
Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& [_, m] : children_) y = m->forward(y);
  return y;
}

ModuleList::ModuleList(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(std::move(m));
}
ModuleList& ModuleList::push_back(std::shared_ptr<Module> m) {
  KILN_CHECK(m != nullptr, "ModuleList: null module");
  register_module(std::to_string(modules_.size()), m);
  modules_.push_back(std::move(m));
  return *this;
}
const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const {
  KILN_CHECK(i < modules_.size(), "ModuleList: index ", i, " out of range (size ", modules_.size(), ")");
  return modules_[i];
}

ModuleDict::ModuleDict(std::vector<std::pair<std::string, std::shared_ptr<Module>>> items) {
  for (auto& [k, m] : items) insert(k, std::move(m));
}
ModuleDict& ModuleDict::insert(const std::string& key, std::shared_ptr<Module> m) {
  KILN_CHECK(m != nullptr, "ModuleDict: null module for key '", key, "'");
  KILN_CHECK(!key.empty() && key.find('.') == std::string::npos, "ModuleDict: invalid key '", key,
             "' (must be non-empty and contain no '.')");
  for (auto& [k, c] : children_)
    if (k == key) {
      c = std::move(m);
      return *this;
    }
  register_module(key, std::move(m));
  return *this;
}
const std::shared_ptr<Module>& ModuleDict::operator[](const std::string& key) const {
  for (auto& [k, c] : children_)
    if (k == key) return c;
  throw Error("ModuleDict: no module under key '" + key + "'");
}
bool ModuleDict::contains(const std::string& key) const {
  for (auto& [k, _] : children_)
    if (k == key) return true;
  return false;
}
std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (auto& [k, _] : children_) out.push_back(k);
  return out;
}

}  // namespace kiln::nn
