// Data-parallel training of a small GPT (examples/gpt_model.h) on every GPU of a host, or on
// CPU processes: each rank trains on its own batches, DistributedDataParallel averages the
// gradients, and the whole step runs inside kiln::compile.
//
//   kiln-run --nproc 4 build/examples/ddp_gpt            (GPUs: NCCL; CPU: Gloo)
//   kiln-run --nproc 2 build/examples/ddp_gpt --cpu --steps 20
#include <cstdio>
#include <cstring>
#include <string>

#include "examples/gpt_model.h"
#include "kiln.h"

using namespace kiln;

int main(int argc, char** argv) {
  bool use_cpu = !cuda::is_available();
  int steps = 50;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--cpu")) use_cpu = true;
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
  }
  dist::init_process_group();  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from kiln-run
  const int rank = dist::get_rank(), world = dist::get_world_size();
  const Device dev = use_cpu ? cpu() : Device(cuda(dist::local_rank()));

  gpt::GptConfig c = gpt::config_named("S");
  manual_seed(1337);
  auto model = std::make_shared<gpt::Gpt>(c, /*manual_attention=*/false, /*tie=*/false);
  model->to(dev);
  auto ddp = std::make_shared<nn::DistributedDataParallel>(model);  // rank 0's weights everywhere
  optim::AdamOptions o;
  o.lr = 1e-3;
  optim::AdamW opt(model->parameters(), o);

  auto step = kiln::compile([&](const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss = cross_entropy(ddp->forward(x).reshape({-1, c.vocab}), y.reshape({-1}));
    loss.backward();  // gradients averaged over the ranks, bucket by bucket
    optim::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    return loss.detach();
  });

  // Each rank's batches: a token walk that the model can learn (next = this + 1..3 mod vocab).
  manual_seed(1000 + static_cast<uint64_t>(rank));
  for (int s = 0; s < steps; ++s) {
    Tensor start = randint(0, c.vocab, {c.batch, 1}, kInt64, dev);
    Tensor jumps = randint(1, 4, {c.batch, c.block_size}, kInt64, dev);
    Tensor walk = remainder(cat({start, start + jumps.cumsum(1)}, 1), c.vocab);
    Tensor x = walk.narrow(1, 0, c.block_size), y = walk.narrow(1, 1, c.block_size);
    const double loss = step(x, y).item<double>();
    if (rank == 0 && (s % 10 == 0 || s + 1 == steps))
      std::printf("step %3d  loss %.4f  (%d ranks on %s)\n", s, loss, world, dev.str().c_str());
  }
  dist::destroy_process_group();
  return 0;
}
