// PyTorch semantics at the edges (empty dims, 0-d tensors, non-finite numbers, huge sizes,
// bad paths and options): PyTorch's result, or a kiln::Error that says what was expected.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>

#include "expect_close.h"
#include "kiln.h"

using namespace kiln;

namespace {
// `f` throws kiln::Error (not another exception) whose message contains every `part`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a kiln::Error: " << e.what();
  }
}
}  // namespace

// torch.cumsum of a 0-d tensor is its value (dim 0 or -1), int promoted to int64.
TEST(Edges, CumsumOfZeroDim) {
  Tensor x = scalar_tensor(3.5);
  Tensor r = cumsum(x, 0);
  EXPECT_EQ(r.dim(), 0);
  EXPECT_EQ(r.item<double>(), 3.5);
  EXPECT_EQ(cumsum(x, -1).item<double>(), 3.5);
  Tensor i = cumsum(scalar_tensor(int64_t{7}, kInt32), 0);
  EXPECT_EQ(i.dtype(), kInt64);
  EXPECT_EQ(i.item<int64_t>(), 7);
  expect_error([&] { cumsum(x, 1); }, {"cumsum", "range"});
  // The gradient is the identity.
  Tensor g = scalar_tensor(2.0).requires_grad_();
  cumsum(g * 3, 0).backward();
  EXPECT_EQ(g.grad().item<double>(), 3.0);
}

// torch.masked_fill(x, mask, v) broadcasts x and mask: x [3], mask [2, 3] gives [2, 3].
// The most negative integer % -1 overflows the hardware division (SIGFPE on x86); PyTorch gives 0.
TEST(Edges, IntegerRemainderOfMinimumByMinusOne) {
  const int64_t lo = std::numeric_limits<int64_t>::min();
  Tensor a = from_vector(std::vector<int64_t>{lo, 7, -7, lo + 1});
  EXPECT_EQ(remainder(a, -1).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(fmod(a, -1).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0, 0}));
  Tensor b = from_vector(std::vector<int32_t>{std::numeric_limits<int32_t>::min(), 5});
  EXPECT_EQ(remainder(b, -1).to_vector<int32_t>(), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(fmod(b, -1).to_vector<int32_t>(), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(remainder(a, 3).to_vector<int64_t>()[1], 1);  // the ordinary path is unchanged
}

TEST(Edges, MaskedFillBroadcastsBothWays) {
  Tensor x = arange(3.0);
  Tensor m = from_vector<float>({1, 0, 1, 0, 0, 1}, std::vector<int64_t>{2, 3}) != 0.0;
  Tensor r = masked_fill(x, m, 7.0);
  expect_close(r, from_vector<float>({7, 1, 7, 0, 1, 7}, std::vector<int64_t>{2, 3}));
  Tensor rt = masked_fill(x, m, scalar_tensor(-1.0, kFloat32));
  expect_close(rt, from_vector<float>({-1, 1, -1, 0, 1, -1}, std::vector<int64_t>{2, 3}));
  expect_error([&] { masked_fill(x, ones({2, 4}, kBool), 1.0); }, {"masked_fill", "broadcast"});
  // The gradient reaches x summed over the broadcast dim.
  Tensor xg = arange(3.0).requires_grad_();
  masked_fill(xg, m, 0.0).sum().backward();
  expect_close(xg.grad(), from_vector<float>({1, 2, 0}));
}

// A non-finite double in a Scalar keeps its integer view defined (saturated, NaN as 0):
// masked_fill with -inf is the common case.
TEST(Edges, ScalarOfNonFiniteDouble) {
  volatile double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  EXPECT_EQ(Scalar(inf).to_int(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Scalar(-inf).to_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(Scalar(nan).to_int(), 0);
  EXPECT_EQ(Scalar(1e300).to_int(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Scalar(-2.5).to_int(), -2);
  Tensor r = masked_fill(arange(3.0), arange(3) > 0, -inf);
  EXPECT_EQ(r.to_vector<double>(), (std::vector<double>{0, -inf, -inf}));
  // Into an integer tensor such a value cannot go (PyTorch: "cannot be converted ... without overflow").
  expect_error([&] { masked_fill(arange(3), arange(3) > 0, -inf).eval(); }, {"masked_fill", "int64", "overflow"});
  expect_error([&] { full({2}, nan, kInt64).eval(); }, {"full", "nan", "int64"});
  expect_error([&] { full({2}, 3e9, kInt32).eval(); }, {"full", "int32", "overflow"});
  EXPECT_EQ(full({2}, -2.5, kInt64).to_vector<int64_t>(), (std::vector<int64_t>{-2, -2}));
  EXPECT_EQ(full({1}, 2147483647.0, kInt32).to_vector<int32_t>(), (std::vector<int32_t>{2147483647}));
}

// softmax/log_softmax over a size-0 dim give an empty result; over another dim of an empty
// tensor too.
TEST(Edges, SoftmaxOverEmptyDim) {
  for (auto shape : {std::vector<int64_t>{3, 0}, std::vector<int64_t>{0}, std::vector<int64_t>{0, 3}}) {
    Tensor x = zeros(shape);
    EXPECT_EQ(softmax(x, -1).sizes(), shape);
    EXPECT_EQ(log_softmax(x, -1).sizes(), shape);
    EXPECT_EQ(softmax(x, 0).sizes(), shape);
  }
  Tensor x = zeros({3, 0}).requires_grad_();
  log_softmax(x, 1).sum().backward();
  EXPECT_EQ(x.grad().sizes(), (std::vector<int64_t>{3, 0}));
}

// norm(p=±inf) over an empty dim is an error naming norm (max/min have no identity); over
// non-empty dims of an empty tensor it is an empty result.
TEST(Edges, InfNormOfEmptyNamesNorm) {
  const double inf = std::numeric_limits<double>::infinity();
  for (double p : {inf, -inf}) {
    try {
      norm(zeros({0}), p);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("norm"), std::string::npos) << m;
      EXPECT_NE(m.find("empty"), std::string::npos) << m;
      EXPECT_EQ(m.find("amax"), std::string::npos) << m;
      EXPECT_EQ(m.find("amin"), std::string::npos) << m;
    }
    expect_error([&] { norm(zeros({0, 3}), p, {0}); }, {"norm", "dim 0"});
    EXPECT_EQ(norm(zeros({0, 3}), p, {1}).sizes(), (std::vector<int64_t>{0}));
  }
}

// chunk(n) of a size-0 dim gives n empty chunks.
TEST(Edges, ChunkOfEmptyDim) {
  auto c = zeros({0}).chunk(3);
  ASSERT_EQ(c.size(), 3u);
  for (auto& t : c) EXPECT_EQ(t.sizes(), (std::vector<int64_t>{0}));
  auto d = chunk(zeros({2, 0}), 4, 1);
  ASSERT_EQ(d.size(), 4u);
  for (auto& t : d) EXPECT_EQ(t.sizes(), (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(zeros({5}).chunk(3).size(), 3u);  // unchanged elsewhere: sizes 2, 2, 1
}

// atan2's gradient at (0, 0) is 0 for both inputs (PyTorch: 0 and -0), not NaN.
TEST(Edges, Atan2GradientAtOrigin) {
  Tensor y = from_vector<float>({0, 1, 0}).requires_grad_(), x = from_vector<float>({0, 0, 2}).requires_grad_();
  atan2(y, x).sum().backward();
  EXPECT_EQ(y.grad().to_vector<float>(), (std::vector<float>{0, 0, 0.5f}));
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{0, -1, 0}));
  EXPECT_TRUE(std::signbit(x.grad().to_vector<float>()[0]));
}

// repeat always returns a fresh tensor: writing into it leaves x alone.
TEST(Edges, RepeatNeverAliases) {
  for (auto reps : {std::vector<int64_t>{1}, std::vector<int64_t>{1, 1}, std::vector<int64_t>{2}}) {
    Tensor x = arange(3.0).eval();
    Tensor r = x.repeat(reps);
    r.add_(10.0);
    EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{0, 1, 2}));
    EXPECT_EQ(r.to_vector<float>()[0], 10.0f);
  }
}

// one_hot with num_classes given never reads the indices: compiled, it is one entry serving
// any values; a bad index is an error when the result is computed (as for gather).
TEST(Edges, OneHotWithClassesReadsNoValues) {
  auto fn = [](const Tensor& t) { return one_hot(t, 5).sum({0}); };
  auto f = compile(fn);
  for (auto v : {std::vector<int64_t>{0, 1, 4}, std::vector<int64_t>{3, 3, 2}, std::vector<int64_t>{4, 0, 0}}) {
    Tensor t = from_vector(v);
    EXPECT_EQ(f(t).to_vector<int64_t>(), fn(t).to_vector<int64_t>());
  }
  auto st = f.stats();
  EXPECT_EQ(st.entries, 1);
  EXPECT_EQ(st.hits, 2);
  EXPECT_EQ(st.eager_calls, 0);
  EXPECT_EQ(one_hot(from_vector<int64_t>({2, 0}), 3).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1, 1, 0, 0}));
  expect_error([&] { f(from_vector<int64_t>({0, 5, 1})).eval(); }, {"index 5", "out of bounds"});
  expect_error([&] { one_hot(from_vector<int64_t>({0, -1}), 3).eval(); }, {"index -1", "out of bounds"});
  expect_error([&] { one_hot(from_vector<int64_t>({3}), 3).eval(); }, {"index 3", "out of bounds"});
}

// AdamW's weight decay defaults to 0.01 however its options are written.
TEST(Edges, AdamWDefaultWeightDecay) {
  Tensor p = full({2}, 2.0).requires_grad_();
  p.set_grad(zeros({2}));  // moments stay 0: the step is the decay alone
  optim::AdamW opt({p}, optim::AdamOptions{.lr = 0.5});
  opt.step();
  expect_close(p.detach(), full({2}, 2.0 * (1 - 0.5 * 0.01)));
  Tensor q = full({2}, 2.0).requires_grad_();
  q.set_grad(zeros({2}));
  optim::AdamW none({q}, optim::AdamOptions{.lr = 0.5, .weight_decay = 0});
  none.step();
  expect_close(q.detach(), full({2}, 2.0));
  Tensor a = full({2}, 2.0).requires_grad_();
  a.set_grad(zeros({2}));
  optim::Adam adam({a}, optim::AdamOptions{.lr = 0.5});  // Adam's default stays 0
  adam.step();
  expect_close(a.detach(), full({2}, 2.0));
}

// Sizes whose byte count does not fit in int64 are errors at record time, not wrapped sizes.
TEST(Edges, HugeSizesAreErrors) {
  expect_error([] { zeros({int64_t{1} << 62}).eval(); }, {"[4611686018427387904]", "overflow"});
  expect_error([] { zeros({int64_t{1} << 31, int64_t{1} << 31}).eval(); }, {"[2147483648, 2147483648]", "overflow"});
  expect_error([] { ones({int64_t{1} << 40, int64_t{1} << 40}, kInt64).eval(); }, {"overflow"});
  expect_error([] { arange(0.0, 4e18).eval(); }, {"overflow"});
}

// arange with a non-finite or too large range says so (PyTorch: "unsupported range").
TEST(Edges, ArangeOfNonFiniteOrHugeRange) {
  const double inf = std::numeric_limits<double>::infinity();
  expect_error([&] { arange(inf); }, {"arange", "unsupported range", "inf"});
  expect_error([&] { arange(0.0, 1.0, std::nan("")); }, {"arange", "step", "nan"});
  expect_error([&] { arange(std::nan("")); }, {"arange", "unsupported range", "nan"});
  expect_error([&] { arange(-inf, 0.0); }, {"arange", "unsupported range"});
  expect_error([&] { arange(0.0, 1e30); }, {"arange", "1e+30", "elements"});
  EXPECT_EQ(arange(0.0, 1.0, 0.25).numel(), 4);
}

// Module::load of a directory or a missing file: a kiln::Error naming the path and why.
TEST(Edges, ModuleLoadOfDirectoryOrMissingFile) {
  char tmpl[] = "/tmp/kiln-edges-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  nn::Linear l(2, 3);
  expect_error([&] { l.load(dir); }, {dir, "directory"});
  expect_error([&] { l.load(dir + "/missing.kiln"); }, {dir + "/missing.kiln", "No such file"});
  l.save(dir + "/ok.kiln");
  EXPECT_NO_THROW(l.load(dir + "/ok.kiln"));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// mark_dynamic / mark_static naming an argument or dim that does not exist is an error.
TEST(Edges, MarkDynamicOutOfRange) {
  auto fn = [](const Tensor& x, double s) { return x * s; };
  auto bad = [&](std::pair<int, int> key, bool dynamic, std::vector<std::string> parts) {
    CompileOptions o;
    (dynamic ? o.mark_dynamic : o.mark_static) = {key};
    auto f = compile(fn, o);
    expect_error([&] { f(zeros({2, 3}), 2.0); }, parts);
  };
  bad({2, 0}, true, {"mark_dynamic", "argument 2", "2 flattened arguments"});
  bad({0, 2}, true, {"mark_dynamic", "dim 2", "rank 2"});
  bad({0, -1}, true, {"mark_dynamic", "dim -1"});
  bad({1, 0}, true, {"mark_dynamic", "argument 1", "not a tensor"});
  bad({0, 5}, false, {"mark_static", "dim 5"});
  CompileOptions ok;
  ok.mark_dynamic = {{0, 1}};
  auto f = compile(fn, ok);
  expect_close(f(ones({2, 3}), 2.0), full({2, 3}, 2.0));
}
