// User code computing shapes inside kiln::compile: sym_size() and the *_symint ops keep sizes
// symbolic (one compile for every batch size), while size()/sizes() specialize with a guard
// that names the call.
#include <gtest/gtest.h>

#include <string>

#include "kiln.h"
#include "tests/expect_close.h"

using namespace kiln;

TEST(CompileSymInt, ShapesFromSymSizesStaySymbolic) {
  auto fn = [](const Tensor& x) {
    SymInt n = x.sym_size(0);
    Tensor pos = arange_symint(n).to(kFloat32).unsqueeze(1);            // [n, 1]
    Tensor pad = zeros_symint({n, 2});                                   // [n, 2]
    Tensor both = cat({x + pos, pad}, 1);                                // [n, 5]
    Tensor half = both.narrow_symint(0, 0, n - 1);                       // drop the last row
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

TEST(CompileSymInt, BadSymbolicSizesAreErrors) {
  Tensor x = randn({4, 3});
  EXPECT_THROW(x.narrow_symint(0, 2, 3), Error);
  EXPECT_THROW(x.reshape_symint({SymInt(5), SymInt(3)}), Error);
  EXPECT_THROW(zeros_symint({SymInt(-1)}), Error);
  EXPECT_THROW(arange_symint(-2), Error);
}
