// Finite-difference gradient checking in float64 (a test helper).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kiln.h"

namespace kiln::testing {

struct Input {
  std::vector<int64_t> shape;
  std::vector<double> values;
  bool differentiable = true;
  DType dtype = kFloat64;  // non-float inputs (indices) are passed through unchanged
};

inline Input random_input(std::vector<int64_t> shape, std::mt19937& rng, double lo = -1.5, double hi = 1.5) {
  Input in;
  in.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t s : in.shape) n *= s;
  std::uniform_real_distribution<double> d(lo, hi);
  for (int64_t i = 0; i < n; ++i) in.values.push_back(d(rng));
  return in;
}

inline Input index_input(std::vector<int64_t> shape, std::vector<int64_t> values) {
  Input in;
  in.shape = std::move(shape);
  for (int64_t v : values) in.values.push_back(static_cast<double>(v));
  in.differentiable = false;
  in.dtype = kInt64;
  return in;
}

inline Tensor make(const Input& in, bool requires_grad) {
  Tensor t = from_vector(in.values, in.shape);
  if (in.dtype != kFloat64) return t.to(in.dtype);
  if (requires_grad && in.differentiable) t.requires_grad_();
  return t;
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Compares kiln::grad of sum(f(x) * w) (w fixed random) against central differences.
// With KILN_TEST_COMPILE=1 every evaluation of f goes through kiln::compile (the analytic
// gradient then comes from the compiled, min-cut partitioned backward).
inline void gradcheck(const std::string& name, const Fn& f_eager, std::vector<Input> inputs, double atol = 1e-6,
                      double rtol = 1e-5, double eps = 1e-6) {
  SCOPED_TRACE(name);
  Fn f = f_eager;
  if (const char* c = std::getenv("KILN_TEST_COMPILE"); c && std::string(c) == "1")
    f = kiln::compile([f_eager](const std::vector<Tensor>& a) { return f_eager(a); }, CompileOptions{name});
  if (std::getenv("KILN_TEST_VERBOSE")) std::fprintf(stderr, "gradcheck %s\n", name.c_str());
  std::mt19937 rng(1234);
  std::vector<Tensor> xs;
  for (const auto& in : inputs) xs.push_back(make(in, true));
  Tensor y = f(xs);
  Tensor w = from_vector(random_input(y.sizes(), rng).values, y.sizes());
  auto objective = [&](const std::vector<Tensor>& args) { return (f(args).to(kFloat64) * w).sum(); };
  std::vector<Tensor> diff;
  for (size_t i = 0; i < xs.size(); ++i)
    if (inputs[i].differentiable) diff.push_back(xs[i]);
  std::vector<Tensor> analytic = grad({objective(xs)}, diff, {}, false, false, true);
  size_t k = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].differentiable) continue;
    std::vector<double> ga =
        analytic[k].defined() ? analytic[k].to_vector<double>() : std::vector<double>(inputs[i].values.size(), 0.0);
    ++k;
    ASSERT_EQ(ga.size(), inputs[i].values.size());
    for (size_t j = 0; j < inputs[i].values.size(); ++j) {
      auto eval_at = [&](double delta) {
        std::vector<Input> moved = inputs;
        moved[i].values[j] += delta;
        std::vector<Tensor> args;
        for (const auto& in : moved) args.push_back(make(in, false));
        NoGradGuard ng;
        return objective(args).item<double>();
      };
      double num = (eval_at(eps) - eval_at(-eps)) / (2 * eps);
      ASSERT_NEAR(ga[j], num, atol + rtol * std::fabs(num)) << "input " << i << " element " << j;
    }
  }
}

}  // namespace kiln::testing
