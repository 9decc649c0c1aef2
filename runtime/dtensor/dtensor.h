// DTensor: a tensor laid out over a DeviceMesh. Each mesh dim has a placement: Shard(d) (the
// tensor's dim d cut in torch.chunk pieces along the mesh dim: the last pieces may be smaller or
// empty), Replicate() (every rank holds it all) or Partial(op) (every rank holds a part; the
// value is their reduction). The global shape is carried, never inferred from a shard.
//
//   auto mesh = dist::init_device_mesh("cuda", {4});
//   DTensor w = dist::distribute_tensor(weight, mesh, {dist::Shard(0)});   // rows over 4 ranks
//   Tensor mine = w.to_local();                                            // this rank's rows
//   Tensor all = w.full_tensor();                                          // all_gather
//   DTensor r = w.redistribute(mesh, {dist::Replicate()});
//
// Every transition (Shard->Replicate all_gather, Partial->Replicate all_reduce, Partial->Shard
// reduce_scatter, Replicate->Shard local chunk, Replicate->Partial local division,
// Shard(i)->Shard(j)) works on n-d meshes with uneven sizes and is differentiable with DTensor's
// semantics: the gradient is redistributed back to the input's placements (a Partial input's
// gradient arriving Replicate), as PyTorch's Redistribute does.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "runtime/dist/dist.h"
#include "runtime/tensor/tensor.h"

namespace kiln::dist {

struct KILN_API Placement {
  enum class Kind { Shard, Replicate, Partial };
  Kind kind = Kind::Replicate;
  int64_t dim = 0;  // Shard
  ReduceOp op = ReduceOp::Sum;  // Partial
  bool is_shard() const { return kind == Kind::Shard; }
  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_partial() const { return kind == Kind::Partial; }
  bool operator==(const Placement& o) const {
    return kind == o.kind && (kind != Kind::Shard || dim == o.dim) && (kind != Kind::Partial || op == o.op);
  }
  bool operator!=(const Placement& o) const { return !(*this == o); }
  // "S(0)", "R", "P(sum)".
  std::string str() const;
};
inline Placement Shard(int64_t dim) { return {Placement::Kind::Shard, dim, ReduceOp::Sum}; }
inline Placement Replicate() { return {Placement::Kind::Replicate, 0, ReduceOp::Sum}; }
inline Placement Partial(ReduceOp op = ReduceOp::Sum) { return {Placement::Kind::Partial, 0, op}; }

// Where piece `index` of `n` of a dim of `size` lies (torch.chunk): its start and length.
struct ChunkRange {
  int64_t start = 0, length = 0;
};
KILN_API ChunkRange chunk_range(int64_t size, int64_t n, int64_t index);

// A DTensor is a Tensor: every kiln op, autograd, printing and the optimizers accept it. Its
// sizes() are the global ones; its node stands on this rank's shard. An op with a DTensor input
// runs on the shards by its op family's sharding rule (runtime/dtensor/rules): the rule offers
// ways to lay the inputs out, the cheapest by bytes moved is taken, the inputs are redistributed
// to it and the op is recorded on the shards; the result is a DTensor with the rule's
// placements. A plain tensor mixed in is read as Replicate (the same value on every rank). An op
// without a rule runs on replicated inputs (said once per op on stderr). Reading values
// (item(), to_vector(), printing) reads the whole tensor (a collective: every rank must read).
// The gradient of a DTensor leaf has the leaf's placements. Not traced by kiln::compile yet:
// a compiled function that meets a DTensor runs in lazy eager mode (said once).
class KILN_API DTensor : public Tensor {
 public:
  DTensor() = default;
  // `t` seen as the DTensor it is; kiln::Error when it is a plain tensor.
  explicit DTensor(const Tensor& t);
  // Wraps this rank's shard. `shape`: the global shape; without it the shards are taken to be
  // even (each Shard(d) multiplies dim d by the mesh dim's size), as PyTorch's from_local.
  // Differentiable with respect to `local`. kiln::Error when `local` does not have the shape this
  // rank's shard of `shape` has.
  static DTensor from_local(const Tensor& local, const DeviceMesh& mesh, std::vector<Placement> placements,
                            std::optional<std::vector<int64_t>> shape = std::nullopt);
  // This rank's shard (differentiable: its gradient comes back with this DTensor's placements).
  Tensor to_local() const;
  // The whole tensor on every rank (redistributed to Replicate everywhere), as a plain tensor.
  Tensor full_tensor() const;
  // The same tensor with other placements (differentiable).
  DTensor redistribute(const DeviceMesh& mesh, std::vector<Placement> placements) const;
  DTensor redistribute(std::vector<Placement> placements) const {
    return redistribute(device_mesh(), std::move(placements));
  }

  const DeviceMesh& device_mesh() const;
  const std::vector<Placement>& placements() const;
  // "DTensor(shape [5, 7], placements [S(0), R], local [3, 7])".
  std::string str() const;

  // The shape of the shard a rank at `coordinate` holds.
  static std::vector<int64_t> local_shape(const std::vector<int64_t>& shape, const std::vector<Placement>& placements,
                                          const DeviceMesh& mesh, const std::vector<int64_t>& coordinate);
};

// Whether `t` is a DTensor.
KILN_API bool is_dtensor(const Tensor& t);

// The free forms, for the result of an op on DTensors (ops return Tensor):
//   Tensor s = dist::full_tensor(a + b);
// full_tensor: the whole value on every rank (a plain tensor is returned as it is); to_local:
// this rank's shard (a plain tensor is its own shard); redistribute: `t` (a DTensor) with other
// placements on its mesh.
KILN_API Tensor full_tensor(const Tensor& t);
KILN_API Tensor to_local(const Tensor& t);
KILN_API DTensor redistribute(const Tensor& t, std::vector<Placement> placements);

// Places `tensor` (the same full value on every rank) on the mesh: each rank keeps its pieces.
// No communication; a Partial placement is not allowed (use from_local). Differentiable.
KILN_API DTensor distribute_tensor(const Tensor& tensor, const DeviceMesh& mesh, std::vector<Placement> placements);

}  // namespace kiln::dist
