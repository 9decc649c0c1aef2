// kiln::compile regressions found by programs users wrote (issue "Correct on real programs").
#include <gtest/gtest.h>

#include "kiln.h"
#include "tests/expect_close.h"

using namespace kiln;

// A compiled backward called at a second size returned uninitialized rows.
TEST(CompileRegressions, CatOfSlicesBackwardAtASecondSize) {
  auto fn = [](const Tensor& x) {
    Tensor a = x.index({Slice(), Slice(2, None)}).t();
    return cat({a, x.reshape({3, -1}), a});  // [1 + 3 + 1, n]
  };
  auto f = compile(fn);
  for (int64_t n : {3, 6, 9, 3}) {
    Tensor x = randn({n, 3}, kFloat64).requires_grad_(), xe = x.detach().requires_grad_();
    Tensor out = f(x), want = fn(xe);
    expect_close(out, want, 0, 0);
    Tensor g = randn(want.sizes(), kFloat64);
    out.backward(g);
    want.backward(g);
    expect_close(x.grad(), xe.grad(), 1e-12, 1e-12);
  }
  EXPECT_EQ(f.stats().eager_calls, 0);
}

// fn writes in place into a tensor it created and returns a view of it: stays compiled.
TEST(CompileRegressions, ViewOfATensorCreatedAndWrittenInPlace) {
  auto fn = [](const Tensor& x) {
    Tensor buf = zeros({4, 3});
    buf.add_(x);
    buf.mul_(2.0);
    return buf.narrow(0, 1, 2);
  };
  auto f = compile(fn);
  for (int i = 0; i < 3; ++i) {
    Tensor x = randn({4, 3});
    expect_close(f(x), fn(x), 0, 0);
  }
  EXPECT_EQ(f.stats().entries, 1);
  EXPECT_EQ(f.stats().eager_calls, 0);
}

// Traced graphs held by compiled entries are not pending eager work: after two big entries,
// unrelated eager code still records lazily instead of materializing op by op.
TEST(CompileRegressions, TracedGraphsAreNotPendingEagerWork) {
  uint64_t old = pending_limit();
  set_pending_limit(300);
  auto eager_work = [] {  // 201 pending nodes, under the limit of 300: materializes once, at eval
    reset_stats();
    Tensor z = randn({4});
    for (int i = 0; i < 200; ++i) z = z + 1.0;
    z.eval();
    return stats().materializations;
  };
  uint64_t alone = eager_work();
  auto fn = [](const Tensor& x) {
    Tensor y = x;
    for (int i = 0; i < 200; ++i) y = (y * 1.0001 + 0.5).tanh();
    return y;
  };
  auto f = compile(fn, {.dynamic = CompileOptions::Dynamic::Never});
  f(randn({8})).eval();
  f(randn({9})).eval();  // a second entry
  EXPECT_EQ(f.stats().entries, 2);
  EXPECT_LT(stats().pending, 50u);
  EXPECT_EQ(eager_work(), alone);
  set_pending_limit(old);
}

// A write through a whole-tensor slice, differentiated through compile: the backward's
// as_strided view of the incoming gradient was read by a kernel scheduled before the view's
// own step (segfault in bind_kernel).
TEST(CompileRegressions, BackwardReadsAnAsStridedViewAfterItsStep) {
  Tensor mask = gt(randn({3, 4}), 0.0);
  auto fn = [&](const Tensor& x) {
    Tensor y = x.clone();
    Tensor p = y.slice(0, 0, 3).slice(1, 0, 4);
    p.assign_(where(mask, Scalar(0.5), p));
    return y * 2.0;
  };
  auto f = compile(fn);
  Tensor x = randn({3, 4}).requires_grad_(), xe = x.detach().requires_grad_();
  Tensor g = randn({3, 4});
  f(x).backward(g);
  fn(xe).backward(g);
  expect_close(x.grad(), xe.grad(), 0, 0);
}

// The min cut pinned a view operand of amax's backward comparison to the forward; with views'
// infinite weight the cut had no finite solution and the backward read an unsaved input
// ("leaf node without storage"), or wrong gradients.
TEST(CompileRegressions, ComparisonOperandThatIsAViewKeepsTheCutFinite) {
  auto fn = [](const Tensor& x) {
    Tensor r = x.relu();
    Tensor s = stack({eq(Scalar(int64_t{1}), clamp(r, Scalar(-0.5), Scalar(1.0))).to(kFloat64), r}, 0);
    Tensor flat = flatten(s, -1, -1);
    Tensor top = flat.slice(0, 0, 1);
    return std::vector<Tensor>{max(flat), matmul(top, top)};
  };
  auto f = compile(fn);
  for (double v : {0.7, 1.0, -0.3}) {
    Tensor x = scalar_tensor(v, kFloat64).requires_grad_(), xe = x.detach().requires_grad_();
    backward(f(x), {scalar_tensor(1.5, kFloat64), scalar_tensor(-2.0, kFloat64)});
    backward(fn(xe), {scalar_tensor(1.5, kFloat64), scalar_tensor(-2.0, kFloat64)});
    expect_close(x.grad(), xe.grad(), 1e-12, 1e-12);
  }
}
