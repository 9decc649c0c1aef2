// All-reduce bandwidth of kiln's process groups (NCCL on CUDA, Gloo on the CPU), as nccl-tests
// and bench/torch_allreduce.py report it: for each size, the mean time of `iters` in-place
// float32 sum all-reduces queued back to back (kiln's stream waits for each; the host does not),
// algorithm bandwidth = bytes / time, bus bandwidth = algbw * 2 (n - 1) / n. Start it with
// kiln-run: `kiln-run --nproc 4 bench_allreduce [--device cuda|cpu] [--min-mib 1] [--max-mib 1024]`.
// Rank 0 prints one JSON object per size.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln.h"

int main(int argc, char** argv) {
  std::string device = "cuda";
  double min_mib = 1, max_mib = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--device") device = argv[i + 1];
    else if (k == "--min-mib") min_mib = std::atof(argv[i + 1]);
    else if (k == "--max-mib") max_mib = std::atof(argv[i + 1]);
  }
  namespace dist = kiln::dist;
  dist::init_process_group();
  const int rank = dist::get_rank(), n = dist::get_world_size();
  const kiln::Device dev = device == "cuda" ? kiln::Device(kiln::cuda(dist::local_rank())) : kiln::cpu();
  auto sync = [&] {
    if (dev.type == kiln::DeviceType::CUDA) kiln::cuda::synchronize();
  };
  for (double mib = min_mib; mib <= max_mib * 1.0001; mib *= 4) {
    const int64_t count = static_cast<int64_t>(mib * 1024 * 1024 / 4);
    kiln::Tensor t = kiln::ones({count}, kiln::kFloat32, dev);
    t.eval();
    const int iters = mib <= 16 ? 50 : mib <= 256 ? 20 : 10;
    for (int w = 0; w < 5; ++w) dist::all_reduce(t);
    sync();
    dist::barrier();
    const auto a = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; ++it) dist::all_reduce(t);
    sync();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() / iters;
    const double bytes = static_cast<double>(count) * 4;
    const double algbw = bytes / s / 1e9, busbw = algbw * 2.0 * (n - 1) / n;
    // The values stay finite: every rank holds ones, so a sum grows by a factor n per call.
    t = kiln::ones({count}, kiln::kFloat32, dev);
    if (rank == 0)
      std::printf("{\"impl\": \"kiln\", \"device\": \"%s\", \"world_size\": %d, \"mib\": %g, \"iters\": %d, "
                  "\"us\": %.2f, \"algbw_gbs\": %.2f, \"busbw_gbs\": %.2f}\n",
                  dev.str().c_str(), n, mib, iters, s * 1e6, algbw, busbw);
    std::fflush(stdout);
  }
  dist::destroy_process_group();
  return 0;
}
