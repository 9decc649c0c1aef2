// Shared by the training-step tests: copying a module's parameters into a twin, and the plain
// mse training step (zero_grad, loss, backward, step) they run eagerly and compiled.
#pragma once
#include <gtest/gtest.h>

#include "kiln.h"

namespace kiln::testing {

// Copies every parameter of `src` into `dst` (same architecture), without autograd.
inline void copy_params(const nn::Module& src, nn::Module& dst) {
  auto a = src.parameters(), b = dst.parameters();
  ASSERT_EQ(a.size(), b.size());
  NoGradGuard ng;
  for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
}

// One optimizer step on mse_loss(net(x), y); returns the loss (detached).
inline Tensor mse_step(nn::Module& net, optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
  opt.zero_grad();
  Tensor loss = mse_loss(net(x), y);
  loss.backward();
  opt.step();
  return loss.detach();
}

}  // namespace kiln::testing
