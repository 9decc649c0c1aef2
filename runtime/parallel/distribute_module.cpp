// distribute_module, distribute_parameter and fully_shard (tensor_parallel.h).
#include "runtime/autograd/autograd.h"
#include "runtime/parallel/tensor_parallel.h"

namespace kiln::dist {
namespace {

// Calls f(name, module) on `m` and every submodule, parents first.
void visit(const std::string& name, nn::Module& m, const std::function<void(const std::string&, nn::Module&)>& f) {
  f(name, m);
  for (const auto& [child, sub] : m.children()) visit(name.empty() ? child : name + "." + child, *sub, f);
}

// Runs input_fn / output_fn around a module that has no hooks of its own.
class DistributedModule final : public nn::Module {
 public:
  DistributedModule(std::shared_ptr<nn::Module> inner, DeviceMesh mesh, InputFn in, OutputFn out)
      : inner_(register_module("module", std::move(inner))), mesh_(std::move(mesh)), in_(std::move(in)),
        out_(std::move(out)) {}
  Tensor forward(const Tensor& x) override {
    Tensor in = in_ ? in_(*inner_, x, mesh_) : x;
    Tensor out = inner_->forward(in);
    return out_ ? out_(*inner_, out, mesh_) : out;
  }

 private:
  std::shared_ptr<nn::Module> inner_;
  DeviceMesh mesh_;
  InputFn in_;
  OutputFn out_;
};

bool built_in(const nn::Module& m) {
  return dynamic_cast<const nn::Linear*>(&m) || dynamic_cast<const nn::Conv2d*>(&m) ||
         dynamic_cast<const nn::Embedding*>(&m) || dynamic_cast<const nn::LayerNorm*>(&m) ||
         dynamic_cast<const nn::Dropout*>(&m);
}

}  // namespace

void distribute_parameter(Tensor& param, const DeviceMesh& mesh, std::vector<Placement> placements) {
  KILN_CHECK(param.defined(), "distribute_parameter: undefined tensor");
  NoGradGuard no_grad;
  Tensor value = is_dtensor(param) ? Tensor(DTensor(param.detach()).redistribute(mesh, std::move(placements)))
                                   : Tensor(distribute_tensor(param.detach(), mesh, std::move(placements)));
  param.set_grad(Tensor());
  param.set_data(value);
}

std::shared_ptr<nn::Module> distribute_module(std::shared_ptr<nn::Module> module, const DeviceMesh& mesh,
                                              PartitionFn partition_fn, InputFn input_fn, OutputFn output_fn) {
  KILN_CHECK(module != nullptr, "distribute_module: null module");
  if (partition_fn) visit("", *module, [&](const std::string& name, nn::Module& m) { partition_fn(name, m, mesh); });
  // What partition_fn left plain is replicated (PyTorch's replicate_module_params_buffers).
  const std::vector<Placement> whole(static_cast<size_t>(mesh.ndim()), Replicate());
  for (auto& [name, p] : module->named_parameters())
    if (!is_dtensor(p)) distribute_parameter(p, mesh, whole);
  for (auto& [name, b] : module->named_buffers())
    if (!is_dtensor(b)) distribute_parameter(b, mesh, whole);
  if (!input_fn && !output_fn) return module;
  if (!built_in(*module)) return std::make_shared<DistributedModule>(std::move(module), mesh, input_fn, output_fn);
  if (input_fn)
    module->register_forward_pre_hook([input_fn, mesh](nn::Module& m, const Tensor& x) { return input_fn(m, x, mesh); });
  if (output_fn)
    module->register_forward_hook(
        [output_fn, mesh](nn::Module& m, const Tensor&, const Tensor& y) { return output_fn(m, y, mesh); });
  return module;
}

void fully_shard(nn::Module& module, const DeviceMesh& mesh) {
  KILN_CHECK(mesh.ndim() == 1, "fully_shard: expected a 1-d mesh, got ", mesh.ndim(), " dims");
  for (auto& [name, p] : module.named_parameters())
    distribute_parameter(p, mesh, {p.dim() == 0 ? Replicate() : Shard(0)});
  for (auto& [name, b] : module.named_buffers())
    if (!is_dtensor(b)) distribute_parameter(b, mesh, {Replicate()});
}

}  // namespace kiln::dist
