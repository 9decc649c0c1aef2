// Data-parallel training: every rank holds a replica of the module, trains on its part of the
// batch, and the gradients are averaged over the ranks during the backward, as PyTorch's
// DistributedDataParallel does.
//
//   auto ddp = std::make_shared<nn::DistributedDataParallel>(model);  // broadcasts rank 0's state
//   loss = cross_entropy((*ddp)(x), y); loss.backward();              // gradients averaged
//   opt.step();
//
// Gradients go in buckets of about bucket_cap_mb, filled in reverse parameter order; a bucket is
// all-reduced (averaged) as soon as the backward has produced its last gradient, so on CUDA its
// NCCL call overlaps the rest of the backward; buckets are launched in one order on every rank.
// Works in lazy eager and with the whole training step inside kiln::compile (the collectives are
// then nodes of the compiled graph).
#pragma once
#include <memory>
#include <vector>

#include "runtime/dist/dist.h"
#include "runtime/nn/nn.h"

namespace kiln::nn {

struct DistributedDataParallelOptions {
  // The ranks to average over (default: the world).
  dist::ProcessGroup process_group;
  // Bucket size, as PyTorch's bucket_cap_mb.
  double bucket_cap_mb = 25;
  // Parameters that may get no gradient in a backward (branches not taken): they contribute
  // zeros, and keep an undefined .grad() where no rank used them. Without it such a backward is
  // a kiln::Error naming them (after the buckets were reduced, so no rank waits).
  bool find_unused_parameters = false;
  // Broadcast rank 0's buffers before every forward (running statistics stay in step).
  bool broadcast_buffers = true;
};

class KILN_API DistributedDataParallel : public Module {
 public:
  explicit DistributedDataParallel(std::shared_ptr<Module> module, DistributedDataParallelOptions options = {});
  ~DistributedDataParallel() override;
  // The wrapped module's forward (buffers broadcast first when asked).
  Tensor forward(const Tensor& x) override;
  Module& module() { return *module_; }

  // While the guard lives, backward passes accumulate gradients locally without averaging
  // them (gradient accumulation); the first backward after it averages the sums.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& d) : d_(d), prev_(d.sync_) { d_.sync_ = false; }
    ~NoSync() { d_.sync_ = prev_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& d_;
    bool prev_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // Buckets as lists of parameter indices (into module().parameters()), in launch order.
  std::vector<std::vector<size_t>> bucket_indices() const;

 private:
  struct Reducer;
  void verify_replicas();
  void broadcast_state();
  std::shared_ptr<Module> module_;
  DistributedDataParallelOptions options_;
  std::shared_ptr<Reducer> reducer_;
  bool sync_ = true;
};

}  // namespace kiln::nn
