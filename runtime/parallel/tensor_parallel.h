// Module-level parallelism on DTensors (runtime/dtensor): distribute_module as PyTorch's, the
// tensor-parallel styles with parallelize_module, and fully_shard (ZeRO-3 / FSDP2).
//
//   auto mesh = dist::init_device_mesh("cuda", {4});
//   dist::parallelize_module(*model, mesh, {{"h.*.mlp.c_fc", dist::ColwiseParallel()},
//                                           {"h.*.mlp.c_proj", dist::RowwiseParallel()}});
//   // or: dist::fully_shard(*model, mesh);
//   optim::AdamW opt(model->parameters(), ...);   // works on the DTensor parameters unchanged
//
// A parameter laid out here keeps its identity (the module's handle, an optimizer's list): its
// node becomes a DTensor's, it stays a leaf that requires grad, and its gradient arrives with
// its placements (a Shard(0) parameter's gradient reduce-scattered). Activations are DTensors
// and stay DTensors through any op (their placements follow the sharding rules); full_tensor()
// reads one whole.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/dtensor/dtensor.h"
#include "runtime/nn/nn.h"

namespace kiln::dist {

// Lays `param` (a plain parameter or buffer, the same value on every rank) out on the mesh in
// place; its gradient is cleared. A DTensor is redistributed instead.
KILN_API void distribute_parameter(Tensor& param, const DeviceMesh& mesh, std::vector<Placement> placements);

using PartitionFn = std::function<void(const std::string& name, nn::Module& module, const DeviceMesh& mesh)>;
using InputFn = std::function<Tensor(nn::Module& module, const Tensor& input, const DeviceMesh& mesh)>;
using OutputFn = std::function<Tensor(nn::Module& module, const Tensor& output, const DeviceMesh& mesh)>;

// PyTorch's distribute_module. partition_fn(name, submodule, mesh) is called on the module and
// every submodule (dotted names, "" for the root) and lays chosen parameters out with
// distribute_parameter; then every parameter and buffer still plain is replicated on the mesh.
// input_fn and output_fn map the module's input and output when it runs: for kiln's built-in
// layers as forward hooks on the module itself (returned as is); for other modules the result
// is a module wrapping it (as child "module") that applies them around its forward.
KILN_API std::shared_ptr<nn::Module> distribute_module(std::shared_ptr<nn::Module> module, const DeviceMesh& mesh,
                                                       PartitionFn partition_fn = nullptr,
                                                       InputFn input_fn = nullptr, OutputFn output_fn = nullptr);

// How a tensor-parallel style lays out a layer (PyTorch's ParallelStyle); see the makers below.
struct KILN_API ParallelStyle {
  enum class Kind { Colwise, Rowwise, Sequence };
  Kind kind = Kind::Colwise;
  Placement input_layout, output_layout;
  bool use_local_output = false;  // return the output's shard instead of the DTensor
};
// Linear: weight and bias Shard(0) (output features cut); Embedding: weight Shard(1). Input
// brought to `input_layout` (default Replicate), output to `output_layout` (default Shard(-1)).
KILN_API ParallelStyle ColwiseParallel(Placement input_layout = Replicate(), Placement output_layout = Shard(-1),
                                       bool use_local_output = false);
// Linear: weight Shard(1) (input features cut), bias Replicate; Embedding: weight Shard(0)
// (vocabulary cut). Input to `input_layout` (default Shard(-1)), output to `output_layout`
// (default Replicate: the partial sums all-reduced; Shard(1) reduce-scatters them, for
// sequence parallelism).
KILN_API ParallelStyle RowwiseParallel(Placement input_layout = Shard(-1), Placement output_layout = Replicate(),
                                       bool use_local_output = false);
// LayerNorm, Dropout (any layer whose work is per position): parameters replicated, input and
// output cut along the sequence dim.
KILN_API ParallelStyle SequenceParallel(int64_t sequence_dim = 1, bool use_local_output = false);

// Applies styles to the submodules named in `plan` (dotted names; a "*" part matches any child,
// as "h.*.mlp.c_fc") along mesh dim `mesh_dim` (default: the last; other mesh dims keep what the
// parameters and activations have there, Replicate for plain ones, so a 2-d mesh runs tensor
// parallel on one dim and data parallel or fully_shard on the other); kiln::Error for a name
// that matches nothing or a style that does not fit the layer. Other modules are left as they are.
KILN_API void parallelize_module(nn::Module& module, const DeviceMesh& mesh,
                                 const std::vector<std::pair<std::string, ParallelStyle>>& plan,
                                 int64_t mesh_dim = -1);

// ZeRO-3 / FSDP2 along mesh dim `mesh_dim` (default 0): every parameter cut along its dim 0
// there (a 0-d one replicated), nested inside what other mesh dims already cut (fully_shard after
// parallelize_module on a 2-d mesh). A layer's parameters are gathered where they are used (the
// all-gather recorded lazily before the op), gradients come back reduce-scattered, and optimizer
// state built from the parameters is sharded too. Memory per rank: about 1/N of parameters,
// gradients and optimizer state, plus the gathered parameters of the layers in flight. The
// batch is cut over the same mesh dim by the caller (DTensor::from_local(x, mesh, {Shard(0)})).
KILN_API void fully_shard(nn::Module& module, const DeviceMesh& mesh, int64_t mesh_dim = 0);

// State dicts of modules with DTensor parameters (PyTorch's get/set_model_state_dict):
// full: every tensor whole (a collective: every rank calls it; rank 0 may save it alone);
// local: each rank's shards (each rank saves its own file). Loading puts values back in place
// with the parameters' placements; kiln::Error on a missing name or a wrong shape, with nothing
// changed.
KILN_API std::map<std::string, Tensor> full_state_dict(const nn::Module& module);
KILN_API std::map<std::string, Tensor> local_state_dict(const nn::Module& module);
KILN_API void load_full_state_dict(nn::Module& module, const std::map<std::string, Tensor>& sd);
KILN_API void load_local_state_dict(nn::Module& module, const std::map<std::string, Tensor>& sd);

}  // namespace kiln::dist
