// kiln::dist: processes that compute together. A process group is a fixed set of ranks (one
// process each) running the same collectives in the same order, on NCCL for CUDA tensors and
// Gloo for CPU tensors, started like PyTorch jobs (torchrun's environment, mpirun, or explicit).
//
//   dist::init_process_group();                 // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   dist::all_reduce(grad, dist::ReduceOp::Avg);  // grad now holds the mean over the ranks
//   auto mesh = dist::init_device_mesh("cuda", {2, 4}, {"tp", "dp"});
//
// Every collective is a node of kiln's lazy graph: pending producers of its input are computed
// first, and inside kiln::compile it is traced into the graph like any op. On CUDA it runs on a
// communication stream ordered with kiln's stream by events (no host synchronization). Errors
// (a rank that died or never joined, mismatched shapes, timeouts) are kiln::Error naming the
// collective and the rank; a failed collective leaves its tensors unchanged.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/export.h"
#include "runtime/tensor/tensor.h"

namespace kiln::dist {

// How a collective combines the ranks' values (Avg: the sum divided by the group size).
enum class ReduceOp { Sum, Avg, Product, Min, Max };
KILN_API const char* reduce_op_name(ReduceOp op);

struct ProcessGroupOptions {
  // "gloo" (CPU tensors), "nccl" (CUDA tensors) or "auto" (Gloo for CPU tensors, NCCL for CUDA
  // tensors, made at the first CUDA collective).
  std::string backend = "auto";
  // Where the ranks meet: "env://" (MASTER_ADDR, MASTER_PORT: a file store on this host when the
  // address is local, else a Redis server there), "file:///path" (a directory every rank sees),
  // "redis://host:port". Empty: "env://", or under mpirun a directory named by rank 0.
  std::string init_method;
  // -1: from RANK / WORLD_SIZE, else OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE.
  int rank = -1;
  int world_size = -1;
  // How long a collective (or the rendezvous) waits for the other ranks before it fails with a
  // kiln::Error naming the ranks that did not answer. PyTorch's default: 10 minutes.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

class Group;  // a backend's communicator (internal)

// A handle on a set of ranks. The default handle names the world group.
class KILN_API ProcessGroup {
 public:
  ProcessGroup() = default;
  explicit ProcessGroup(std::shared_ptr<Group> g) : g_(std::move(g)) {}
  // This process's rank in the group (-1 when it is not a member) and the group's size.
  int rank() const;
  int size() const;
  // The world ranks of the members, in group-rank order.
  const std::vector<int>& ranks() const;
  // Whether this process belongs to the group.
  bool is_member() const { return rank() >= 0; }
  // "gloo", "nccl" or "gloo+nccl".
  std::string backend() const;
  // The group's internals (the world's when this handle is the default).
  Group& impl() const;

 private:
  std::shared_ptr<Group> g_;
};

// Completion of a collective started with async_op. wait() makes later work on the tensors wait
// for it (on CUDA: kiln's stream waits, the host does not) and raises the collective's error.
class KILN_API Work {
 public:
  struct State;
  Work() = default;
  explicit Work(std::shared_ptr<State> s) : s_(std::move(s)) {}
  // Waits (see above); a failed collective raises its kiln::Error here and leaves its tensors
  // unchanged. Calling it again is a no-op.
  void wait();
  // Whether the collective has finished (never blocks).
  bool is_completed() const;
  // The collective's output as a fresh tensor (as torch's Work.result()), valid after wait():
  // the value written into the caller's tensor, without aliasing it.
  Tensor result() const;

 private:
  std::shared_ptr<State> s_;
};

// Joins the default (world) group: every rank calls it once. Throws kiln::Error when the
// environment is incomplete, the backend is unavailable or the ranks do not all arrive in time.
KILN_API void init_process_group(const ProcessGroupOptions& options = {});
// Leaves it: every group is released (pending collectives finished first).
KILN_API void destroy_process_group();
KILN_API bool is_initialized();
// The world group (throws kiln::Error before init_process_group).
KILN_API ProcessGroup world();
KILN_API int get_rank(const ProcessGroup& group = {});
KILN_API int get_world_size(const ProcessGroup& group = {});
// A group of the given world ranks; every rank of `parent` calls it, members or not (as
// torch.distributed.new_group). Non-members get a handle with rank() == -1.
KILN_API ProcessGroup new_group(std::vector<int> ranks, const ProcessGroup& parent = {});
// Splits `parent` by color: ranks giving the same color form one group, ordered by (key, rank).
// A negative color joins no group.
KILN_API ProcessGroup split_group(int color, int key, const ProcessGroup& parent = {});

// --- Collectives (in place, as torch.distributed). Every member of the group calls each one, in
// the same order, with matching dtypes and sizes. async_op: returns at once; the tensor holds the
// result after Work::wait(). Otherwise the result is there on return (already waited). ---

KILN_API Work all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::Sum, const ProcessGroup& group = {},
                         bool async_op = false);
// `tensor` takes the value of group rank `src`'s.
KILN_API Work broadcast(Tensor& tensor, int src, const ProcessGroup& group = {}, bool async_op = false);
// `output` (group size x the input's numel elements, any shape of that size) holds every rank's
// input, in rank order.
KILN_API Work all_gather_into_tensor(Tensor& output, const Tensor& input, const ProcessGroup& group = {},
                                     bool async_op = false);
// `outputs` is filled with one tensor per rank (resized to that many).
KILN_API Work all_gather(std::vector<Tensor>& outputs, const Tensor& input, const ProcessGroup& group = {},
                         bool async_op = false);
// `output` holds this rank's block (input's numel / group size elements) of the reduction.
KILN_API Work reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum,
                                    const ProcessGroup& group = {}, bool async_op = false);
// Rows (dim 0) of `input` go to the ranks in blocks: input_splits[r] rows to rank r (empty:
// equal blocks); `output` receives output_splits[r] rows from rank r (empty: equal blocks).
KILN_API Work all_to_all_single(Tensor& output, const Tensor& input, std::vector<int64_t> output_splits = {},
                                std::vector<int64_t> input_splits = {}, const ProcessGroup& group = {},
                                bool async_op = false);
// Point to point: `tensor` to group rank `dst`; recv fills `tensor` (its shape and dtype say
// what is expected) from group rank `src`.
KILN_API Work send(const Tensor& tensor, int dst, const ProcessGroup& group = {});
KILN_API Work recv(Tensor& tensor, int src, const ProcessGroup& group = {});
// Returns once every member has called it.
KILN_API void barrier(const ProcessGroup& group = {});

// --- Functional collectives: out of place, lazy and differentiable (the backward of an
// all_reduce is an all_reduce, of an all_gather a reduce_scatter, ...). What kiln::compile
// traces and DTensor builds on. ---
namespace functional {
KILN_API Tensor all_reduce(const Tensor& input, ReduceOp op, const ProcessGroup& group = {});
// Concatenation of every rank's input along `dim`.
KILN_API Tensor all_gather(const Tensor& input, int64_t dim = 0, const ProcessGroup& group = {});
// This rank's block along `dim` of the reduction (`dim`'s size divisible by the group size).
KILN_API Tensor reduce_scatter(const Tensor& input, ReduceOp op, int64_t dim = 0, const ProcessGroup& group = {});
KILN_API Tensor broadcast(const Tensor& input, int src, const ProcessGroup& group = {});
KILN_API Tensor all_to_all(const Tensor& input, std::vector<int64_t> output_splits = {},
                           std::vector<int64_t> input_splits = {}, const ProcessGroup& group = {});
}  // namespace functional

// --- DeviceMesh: an n-d array of ranks, one group per mesh dimension. ---
class KILN_API DeviceMesh {
 public:
  DeviceMesh() = default;
  // The world's ranks laid out row-major in `shape` (its product must be the world size), one
  // group per dim (every rank joins them all); names are optional but unique.
  DeviceMesh(std::string device_type, std::vector<int64_t> shape, std::vector<std::string> dim_names = {});
  const std::string& device_type() const { return device_type_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size() const;
  const std::vector<std::string>& dim_names() const { return names_; }
  // The mesh's ranks, row-major.
  const std::vector<int>& mesh() const { return mesh_; }
  // This rank's coordinate per dim.
  const std::vector<int64_t>& coordinate() const { return coord_; }
  // The group along a dim (by index or name), and this rank's place in it.
  ProcessGroup get_group(int64_t dim = 0) const;
  ProcessGroup get_group(const std::string& name) const;
  int get_local_rank(int64_t dim = 0) const;
  int get_local_rank(const std::string& name) const;
  // The device of this rank for tensors on the mesh (cuda: LOCAL_RANK's device).
  Device device() const;

 private:
  int64_t dim_index(const std::string& name) const;
  std::string device_type_;
  std::vector<int64_t> shape_, coord_;
  std::vector<std::string> names_;
  std::vector<int> mesh_;
  std::vector<ProcessGroup> groups_;
};
KILN_API DeviceMesh init_device_mesh(const std::string& device_type, std::vector<int64_t> shape,
                                     std::vector<std::string> dim_names = {});

// The process's place on its node, from LOCAL_RANK (or OMPI_COMM_WORLD_LOCAL_RANK); 0 if unset.
KILN_API int local_rank();

}  // namespace kiln::dist
