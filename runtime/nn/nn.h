// nn: modules with named parameters and buffers, common layers, initializers and a
// versioned binary state-dict format.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/export.h"
#include "runtime/ops/ops.h"

namespace kiln::nn {

// Base class of every layer: owns named parameters, buffers and child modules.
class KILN_API Module {
 public:
  virtual ~Module() = default;
  // The layer's computation; the default throws (container modules override).
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Registers a parameter (a leaf that requires grad unless `requires_grad` is false).
  Tensor& register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  // Registers a buffer (state saved in the state dict, not trained).
  Tensor& register_buffer(const std::string& name, Tensor t);
  // Registers a child module; its parameters appear as "name.param".
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

  // Parameters of this module and (recursively) its children, in registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

  // Training mode switch (affects Dropout); applies to children too.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Clears every parameter's gradient.
  void zero_grad();
  // Moves every parameter and buffer (children's too) to `device`, in place: tensors held
  // elsewhere (an optimizer's parameter list) follow. Build optimizers after moving.
  Module& to(Device device);

  // Forward hooks, as PyTorch's register_forward_pre_hook / register_forward_hook: a pre-hook
  // maps the input before the layer computes, a hook maps the output (given the input). They run
  // in the forward of kiln's built-in layers (Linear, Conv2d, Embedding, LayerNorm, Dropout),
  // in registration order; the parallel styles (runtime/parallel) lay activations out with them.
  void register_forward_pre_hook(std::function<Tensor(Module&, const Tensor&)> hook);
  void register_forward_hook(std::function<Tensor(Module&, const Tensor& input, const Tensor& output)> hook);

  // Parameters and buffers by dotted name.
  std::map<std::string, Tensor> state_dict() const;
  // Copies values in; with `strict`, names must match exactly. Validates everything first:
  // on any mismatch throws kiln::Error and leaves the module unchanged.
  void load_state_dict(const std::map<std::string, Tensor>& sd, bool strict = true);
  // Writes/reads the state dict in kiln's versioned binary format (see save_state_dict).
  void save(const std::string& path) const;
  void load(const std::string& path);

 protected:
  std::vector<std::pair<std::string, Tensor>> params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  // Runs a built-in layer's forward `f` on `x` between the hooks.
  template <class F>
  Tensor hooked(const Tensor& x, F&& f) {
    if (pre_hooks_.empty() && hooks_.empty()) return f(x);
    Tensor in = x;
    for (auto& h : pre_hooks_) in = h(*this, in);
    Tensor out = f(in);
    for (auto& h : hooks_) out = h(*this, in, out);
    return out;
  }

 private:
  std::vector<std::function<Tensor(Module&, const Tensor&)>> pre_hooks_;
  std::vector<std::function<Tensor(Module&, const Tensor&, const Tensor&)>> hooks_;
};

// y = x W^T + b, W [out, in], initialized like PyTorch (uniform in +-1/sqrt(in)).
class KILN_API Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, DType dtype = kFloat32);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
};

// 2-D convolution over [N, C, H, W].
class KILN_API Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, std::vector<int64_t> kernel_size,
         std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0},
         std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1, bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
};

// Lookup table [num_embeddings, dim] indexed by int64 tensors; N(0, 1) init.
class KILN_API Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& indices) override;
  Tensor weight;
};

// Layer normalization over the trailing `normalized_shape` dims, with affine weight and bias.
class KILN_API LayerNorm : public Module {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  std::vector<int64_t> normalized_shape;
  double eps;
};

// Zeroes elements with probability p in training mode (scaling the rest by 1/(1-p)).
class KILN_API Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  double p;
};

// Applies child modules in order.
class KILN_API Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> layers);
  // Appends a layer (named by its index).
  Sequential& push_back(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return children_.size(); }
  std::shared_ptr<Module> operator[](size_t i) const { return children_.at(i).second; }
};

// Holds modules in a list, registered as children named "0", "1", ... (no forward).
class KILN_API ModuleList : public Module {
 public:
  ModuleList() = default;
  // A list of `modules`, in order.
  explicit ModuleList(std::vector<std::shared_ptr<Module>> modules);
  // Appends a module (named by its index).
  ModuleList& push_back(std::shared_ptr<Module> m);
  // Same as push_back (PyTorch's name).
  ModuleList& append(std::shared_ptr<Module> m) { return push_back(std::move(m)); }
  // Number of modules.
  size_t size() const { return modules_.size(); }
  // Whether the list holds no module.
  bool empty() const { return modules_.empty(); }
  // The i-th module (throws kiln::Error out of range).
  const std::shared_ptr<Module>& operator[](size_t i) const;
  // The i-th module as an M (throws kiln::Error out of range or when it is not an M).
  template <class M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    KILN_CHECK(m != nullptr, "ModuleList: module ", i, " has another type");
    return m;
  }
  // Iteration over the modules, in order.
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

// Holds modules by string key in insertion order, registered as children named by key (no forward).
class KILN_API ModuleDict : public Module {
 public:
  ModuleDict() = default;
  // A dict of (key, module) pairs, in order.
  explicit ModuleDict(std::vector<std::pair<std::string, std::shared_ptr<Module>>> items);
  // Adds a module under `key` (non-empty, no '.'); an existing key keeps its position and gets
  // the new module.
  ModuleDict& insert(const std::string& key, std::shared_ptr<Module> m);
  // The module under `key` (throws kiln::Error when absent).
  const std::shared_ptr<Module>& operator[](const std::string& key) const;
  // The module under `key` as an M (throws kiln::Error when absent or not an M).
  template <class M>
  std::shared_ptr<M> at(const std::string& key) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[key]);
    KILN_CHECK(m != nullptr, "ModuleDict: module '", key, "' has another type");
    return m;
  }
  // Whether a module is stored under `key`.
  bool contains(const std::string& key) const;
  // Keys in insertion order.
  std::vector<std::string> keys() const;
  // Number of modules.
  size_t size() const { return children_.size(); }
  // Whether the dict holds no module.
  bool empty() const { return children_.empty(); }
  // Iteration over (key, module) pairs in insertion order.
  auto begin() const { return children_.cbegin(); }
  auto end() const { return children_.cend(); }
};

// Activation modules.
class KILN_API ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }
};
class KILN_API Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override { return tanh(x); }
};
class KILN_API SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return silu(x); }
};
class KILN_API GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none") : approximate(std::move(approximate)) {}
  Tensor forward(const Tensor& x) override { return gelu(x, approximate); }
  std::string approximate;
};

// ---- initializers (in place, without recording gradients; return the tensor) ----
// fan_in/fan_out of a weight tensor, as PyTorch computes them.
KILN_API std::pair<int64_t, int64_t> fan_in_out(const Tensor& t);
// Gain for a nonlinearity: "linear", "relu", "tanh", "leaky_relu" (with param), "sigmoid".
KILN_API double calculate_gain(const std::string& nonlinearity, double param = 0.01);
KILN_API Tensor& uniform_(Tensor& t, double low, double high);
KILN_API Tensor& normal_(Tensor& t, double mean = 0, double std = 1);
KILN_API Tensor& constant_(Tensor& t, double value);
// mode: "fan_in" or "fan_out".
KILN_API Tensor& kaiming_uniform_(Tensor& t, double a = 0, const std::string& mode = "fan_in",
                                  const std::string& nonlinearity = "leaky_relu");
KILN_API Tensor& kaiming_normal_(Tensor& t, double a = 0, const std::string& mode = "fan_in",
                                 const std::string& nonlinearity = "leaky_relu");
KILN_API Tensor& xavier_uniform_(Tensor& t, double gain = 1);
KILN_API Tensor& xavier_normal_(Tensor& t, double gain = 1);
// (Semi-)orthogonal matrix from the QR decomposition (LAPACK) of a Gaussian matrix.
KILN_API Tensor& orthogonal_(Tensor& t, double gain = 1);

// ---- state dict files ----
// Format v1 (little endian): "KILNSD01" | u32 version=1 | u32 count | per tensor:
// u32 name_len, name, u8 dtype, u32 ndim, i64 sizes[ndim], u64 nbytes, raw data |
// u64 FNV-1a hash of everything before it.
KILN_API void save_state_dict(const std::map<std::string, Tensor>& sd, const std::string& path);
// Reads and verifies a file written by save_state_dict (throws kiln::Error if truncated,
// corrupted or of another version).
KILN_API std::map<std::string, Tensor> load_state_dict_file(const std::string& path);

}  // namespace kiln::nn
