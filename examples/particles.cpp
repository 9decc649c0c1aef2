// Demo: a damped-spring particle system stepped with kiln's lazy eager API.
// Nothing runs until a value is read; each step records a small graph that kiln executes.
#include <chrono>
#include <cstdio>
#include <iostream>

#include "kiln.h"

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (1 << 16);
  const int steps = argc > 2 ? std::atoi(argv[2]) : 200;
  const double dt = 0.01, k = 4.0, c = 0.5;

  kiln::manual_seed(42);
  kiln::Tensor p = kiln::randn({n, 3});  // positions
  kiln::Tensor v = kiln::zeros({n, 3});  // velocities
  kiln::Tensor g = kiln::tensor({0.0, 0.0, -9.81});

  auto energy = [&] { return (0.5 * (v * v).sum() + 0.5 * k * (p * p).sum()).item<double>() / n; };
  std::printf("kiln particles demo: %lld particles, %d steps (executor: %s)\n", static_cast<long long>(n), steps,
              kiln::current_executor().name());
  std::printf("step %4d  energy/particle %.6f\n", 0, energy());

  auto t0 = std::chrono::steady_clock::now();
  for (int s = 1; s <= steps; ++s) {
    kiln::Tensor a = g - k * p - c * v;  // spring to the origin, damping, gravity
    v = v + dt * a;
    p = p + dt * v;
    kiln::eval({p, v});  // one materialization per step
    if (s % 50 == 0) std::printf("step %4d  energy/particle %.6f\n", s, energy());
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  auto [zmax, idx] = kiln::max(p.select(1, 2), 0);
  std::cout << "mean position: " << p.mean({0}) << "\n";
  std::cout << "highest particle: #" << idx.item<int64_t>() << " at z = " << zmax.item<float>() << "\n";
  auto st = kiln::stats();
  std::printf("%.1f steps/s, %.3g particle-steps/s; nodes recorded %llu, executed %llu, materializations %llu\n",
              steps / secs, n * steps / secs, static_cast<unsigned long long>(st.nodes_recorded),
              static_cast<unsigned long long>(st.nodes_executed), static_cast<unsigned long long>(st.materializations));
  return 0;
}
