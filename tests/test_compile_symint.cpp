// User code computing shapes inside kiln::compile: sym_size() and the *_symint ops keep sizes
// symbolic (one compile for every batch size), while size()/sizes() specialize with a guard
// that names the call.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kiln.h"
#include "tests/expect_close.h"
#include "tests/test_seed.h"

using namespace kiln;

TEST(CompileSymInt, ShapesFromSymSizesStaySymbolic) {
  auto fn = [](const Tensor& x) {
    SymInt n = x.sym_size(0);
    Tensor pos = arange_symint(n).to(kFloat32).unsqueeze(1);  // [n, 1]
    Tensor pad = zeros_symint({n, 2});  // [n, 2]
    Tensor both = cat({x + pos, pad}, 1);  // [n, 5]
    Tensor half = both.narrow_symint(0, 0, n - 1);  // drop the last row
    Tensor flat = half.reshape_symint({(n - 1) * 5});
    Tensor ones = ones_symint({SymInt(2), (n - 1) * 5});
    return (flat.expand_symint({SymInt(2), (n - 1) * 5}) * ones).sum({0});
  };
  auto f = compile(fn);
  for (int64_t n : {4, 6, 9, 5, 13}) {
    Tensor x = randn({n, 3});
    expect_close(f(x), fn(x), 1e-6, 1e-6);
  }
  EXPECT_EQ(f.stats().entries, 2);  // the first size, then one symbolic entry
  EXPECT_EQ(f.stats().eager_calls, 0);
}

TEST(CompileSymInt, SizeSpecializesAndSaysWhere) {
  auto fn = [](const Tensor& x) { return x * static_cast<double>(x.size(0)); };
  auto f = compile(fn);
  for (int64_t n : {4, 6, 9}) {
    Tensor x = randn({n, 3});
    expect_close(f(x), fn(x), 1e-6, 1e-6);
  }
  // Each new size is a new compile: the traced size(0) was specialized, and the miss says by what.
  EXPECT_EQ(f.stats().entries, 3);
  EXPECT_NE(f.stats().last_miss.find("arg 0 dim 0: expected 6, got 9, specialized by"), std::string::npos)
      << f.stats().last_miss;
  EXPECT_NE(f.stats().last_miss.find("size()"), std::string::npos) << f.stats().last_miss;
}

// A size that had become symbolic, specialized again by size(): the recompile it causes is said
// once on stderr without KILN_LOG, naming the call and the fix; sym_size() says nothing.
TEST(CompileSymInt, SizeSpecializationRecompileWarnsOnce) {
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  auto fn = [](const Tensor& x) { return x.reshape({x.size(0), -1}) * 2.0; };
  CompileOptions opts;
  opts.name = "size_reader";
  auto f = compile(fn, opts);
  ::testing::internal::CaptureStderr();
  for (int64_t n : {4, 6, 9, 12, 15}) {
    Tensor x = randn({n, 3, 2});
    expect_close(f(x), fn(x), 1e-6, 1e-6);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "[kiln] warning: compile(size_reader) recompiles for a new size"), 1u) << err;
  EXPECT_NE(err.find("specialized by"), std::string::npos) << err;
  EXPECT_NE(err.find("Tensor.size()"), std::string::npos) << err;
  EXPECT_NE(err.find("sym_size(d)"), std::string::npos) << err;

  auto sym_fn = [](const Tensor& x) { return x.reshape_symint({x.sym_size(0), SymInt(6)}) * 2.0; };
  auto g = compile(sym_fn);
  ::testing::internal::CaptureStderr();
  for (int64_t n : {4, 6, 9, 12}) {
    Tensor x = randn({n, 3, 2});
    expect_close(g(x), sym_fn(x), 1e-6, 1e-6);
  }
  const std::string quiet = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(quiet.find("[kiln] warning"), std::string::npos) << quiet;
  EXPECT_EQ(g.stats().entries, 2);
}

TEST(CompileSymInt, BadSymbolicSizesAreErrors) {
  Tensor x = randn({4, 3});
  EXPECT_THROW(x.narrow_symint(0, 2, 3), Error);
  EXPECT_THROW(x.reshape_symint({SymInt(5), SymInt(3)}), Error);
  EXPECT_THROW(zeros_symint({SymInt(-1)}), Error);
  EXPECT_THROW(arange_symint(-2), Error);
}

namespace {
// Calls `f` and `fn` on inputs built by `make(size)` for each size; results must agree (float32:
// rtol 1e-5, atol 1e-6), shapes included, and an error in one must be an error in the other.
template <class F, class Fn, class Make>
void same_as_eager(F& f, const Fn& fn, const Make& make, const std::vector<int64_t>& sizes) {
  for (int64_t n : sizes) {
    std::vector<Tensor> xs = make(n);
    Tensor want = fn(xs), got = f(xs);
    ASSERT_EQ(got.sizes(), want.sizes()) << "size " << n;
    expect_close(got, want, 1e-5, 1e-6);
  }
}
// `k` random sizes in [lo, hi] from the test seed, after `first` (sizes that change from the first call).
std::vector<int64_t> random_sizes(std::vector<int64_t> first, int k, int64_t lo, int64_t hi, uint64_t salt) {
  std::mt19937_64 rng(kiln::testing::splitmix(kiln::testing::test_seed(7) ^ salt));
  for (int i = 0; i < k; ++i) first.push_back(lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1)));
  return first;
}
}  // namespace

// A dim that changed is symbolic at 0 and 1 too, and ops that only need a size's value when it
// is 0 or 1 ask nothing: softmax-like shifts over an empty dim, conv2d over batch and image
// sizes, in-place writes through views, reshapes of views with symbolic strides. Each function
// compiles twice (the first sizes, then one symbolic entry) whatever sizes follow.
TEST(CompileSymInt, ZeroOneAndOtherSizesShareOneSymbolicEntry) {
  auto rows = [](int64_t n) { return std::vector<Tensor>{randn({n, 5})}; };
  // softmax / log_softmax / logsumexp over the changing dim, 0 included (an empty result, -inf).
  auto soft = [](const std::vector<Tensor>& x) {
    return cat({softmax(x[0], 0).sum({0}), log_softmax(x[0], 0).exp().sum({0}), logsumexp(x[0], {0}).exp()}, 0);
  };
  auto f1 = compile(soft);
  same_as_eager(f1, soft, rows, random_sizes({6, 0, 1}, 5, 0, 9, 1));
  EXPECT_EQ(f1.stats().entries, 2);
  // In-place write through a view of a tensor fn made, at every size of the changing dim.
  auto inplace = [](const std::vector<Tensor>& x) {
    Tensor y = x[0] * 2;
    Tensor v = y.narrow(1, 1, 3);
    v.mul_(x[0].narrow(1, 0, 3) + 1);
    return y;
  };
  auto f2 = compile(inplace);
  same_as_eager(f2, inplace, rows, random_sizes({4, 1, 0}, 5, 0, 9, 2));
  EXPECT_EQ(f2.stats().entries, 2);
  // reshape of a transposed slice: constant shape, strides symbolic in the changing dim.
  auto reshaped = [](const std::vector<Tensor>& x) { return x[0].t().narrow(1, 0, 2).reshape({-1}) * 3; };
  auto f3 = compile(reshaped);
  auto wide = [](int64_t n) { return std::vector<Tensor>{randn({4, n})}; };
  same_as_eager(f3, reshaped, wide, random_sizes({5, 7}, 5, 2, 12, 3));
  EXPECT_EQ(f3.stats().entries, 2);
  // conv2d over batch and image sizes (channels fixed by the weight), with its gradient.
  Tensor w = randn({4, 3, 3, 3}), b = randn({4});
  auto conv = [&](const std::vector<Tensor>& x) { return relu(conv2d(x[0], w, b, {2}, {1})); };
  auto f4 = compile(conv);
  auto image = [](int64_t n) { return std::vector<Tensor>{randn({1 + n % 3, 3, 3 + n, 5 + n / 2})}; };
  same_as_eager(f4, conv, image, random_sizes({2, 6}, 5, 0, 12, 4));
  EXPECT_EQ(f4.stats().entries, 2);
  auto loss = [&](const Tensor& t) {
    Tensor y = conv({t});
    Tensor l = (y * y).sum();
    l.backward();
    return l;
  };
  auto step = compile(loss);
  for (int64_t n : random_sizes({2, 6}, 3, 0, 12, 5)) {
    Tensor x = image(n)[0], xc = x.detach().requires_grad_(true), xe = x.detach().requires_grad_(true);
    expect_close(step(xc), loss(xe), 1e-4, 1e-5);
    expect_close(xc.grad(), xe.grad(), 1e-4, 1e-5);
  }
  EXPECT_EQ(step.stats().entries, 2);
  // A symbolic size that is 0 where the op needs elements: the eager error, in the user's sizes.
  auto maxes = [](const std::vector<Tensor>& x) { return amax(x[0], {0}); };
  auto f5 = compile(maxes);
  same_as_eager(f5, maxes, rows, {3, 4});
  try {
    f5(rows(0));
    ADD_FAILURE() << "amax over an empty dim did not throw";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("input shape [0, 5]"), std::string::npos) << e.what();
  }
}
