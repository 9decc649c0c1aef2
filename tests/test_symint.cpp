// Tests for SymInt: constant fast path, canonical simplification, floordiv/mod/max/min folding,
// comparisons under the size assumption, evaluation, printing, and a randomized check of the
// simplifier against direct evaluation.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "runtime/error.h"
#include "runtime/symint.h"

using kiln::SymInt;

namespace {

const SymInt s0 = SymInt::symbol("s0");
const SymInt s1 = SymInt::symbol("s1");
const SymInt s2 = SymInt::symbol("s2");

void expect_same(const SymInt& a, const SymInt& b) {
  EXPECT_TRUE(a.same_as(b)) << a.str() << " vs " << b.str();
}

// Runs f and returns the kiln::Error message (fails if nothing is thrown).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected kiln::Error";
  return "";
}

TEST(SymInt, ConstantFastPath) {
  SymInt a = 6, b = 4;
  EXPECT_TRUE(a.is_constant());
  EXPECT_EQ(a.expr(), nullptr);
  EXPECT_EQ((a + b).as_int(), 10);
  EXPECT_EQ((a - b).as_int(), 2);
  EXPECT_EQ((a * b).as_int(), 24);
  EXPECT_EQ((-a).as_int(), -6);
  EXPECT_EQ(SymInt().as_int(), 0);
  EXPECT_EQ(a.maybe_int(), 6);
  EXPECT_EQ(s0.maybe_int(), std::nullopt);
  EXPECT_EQ((a * b).expr(), nullptr);
  EXPECT_EQ(a.str(), "6");
  EXPECT_EQ(SymInt(-3).str(), "-3");
  EXPECT_TRUE(a.symbols().empty());
  EXPECT_EQ(a.evaluate({}), 6);
}

TEST(SymInt, LikeTermsCombine) {
  SymInt e = s0 + s1 + s0 + 3 + s0;
  EXPECT_EQ(e.str(), "3*s0 + s1 + 3");
  expect_same(s0 + s1, s1 + s0);
  expect_same(s0 * s1, s1 * s0);
  expect_same(2 * s0 + s1, s1 + s0 + s0);
  EXPECT_EQ((s0 * 2 - s0 * 3).str(), "-s0");
  EXPECT_EQ((-s0 + 4).str(), "-s0 + 4");
  EXPECT_EQ((s0 * s1).str(), "s0*s1");
  EXPECT_EQ((2 * s0 + s1 + 3).str(), "2*s0 + s1 + 3");
  EXPECT_EQ((s1 * s0 * s0).str(), "s0*s0*s1");
  EXPECT_FALSE(s0.same_as(s1));
  EXPECT_FALSE(s0.same_as(SymInt(0)));
}

TEST(SymInt, Expansion) {
  expect_same(2 * (s0 + 1), 2 * s0 + 2);
  EXPECT_EQ(((s0 + 1) * (s0 - 1)).str(), "s0*s0 - 1");
  expect_same((s0 + s1) * (s0 + s1), s0 * s0 + 2 * s0 * s1 + s1 * s1);
  EXPECT_EQ(((s0 + s1) * (s0 - s1)).str(), "s0*s0 - s1*s1");
  SymInt e = s0;
  e += 2;
  e *= 3;
  EXPECT_EQ(e.str(), "3*s0 + 6");
}

TEST(SymInt, SubtractionToZeroIsConstant) {
  SymInt z = (s0 + s1) - (s1 + s0);
  EXPECT_TRUE(z.is_constant());
  EXPECT_EQ(z.expr(), nullptr);
  EXPECT_EQ(z.as_int(), 0);
  SymInt c = (s0 + 1) * (s0 + 1) - s0 * s0 - 2 * s0;
  ASSERT_TRUE(c.is_constant());
  EXPECT_EQ(c.as_int(), 1);
  EXPECT_EQ((kiln::sym_max(s0, s1) - kiln::sym_max(s1, s0)).maybe_int(), 0);
}

TEST(SymInt, FloorDivModConstants) {
  using kiln::floordiv;
  using kiln::mod;
  EXPECT_EQ(floordiv(7, 2).as_int(), 3);
  EXPECT_EQ(floordiv(-7, 2).as_int(), -4);
  EXPECT_EQ(floordiv(7, -2).as_int(), -4);
  EXPECT_EQ(floordiv(-7, -2).as_int(), 3);
  EXPECT_EQ(floordiv(-8, 2).as_int(), -4);
  EXPECT_EQ(mod(7, 2).as_int(), 1);
  EXPECT_EQ(mod(-7, 2).as_int(), 1);
  EXPECT_EQ(mod(7, -2).as_int(), -1);
  EXPECT_EQ(mod(-7, -2).as_int(), -1);
  EXPECT_EQ(mod(-8, 4).as_int(), 0);
  EXPECT_THROW(floordiv(s0, 0), kiln::Error);
  EXPECT_THROW(floordiv(3, 0), kiln::Error);
  EXPECT_THROW(mod(s0, 0), kiln::Error);
  EXPECT_THROW(mod(3, 0), kiln::Error);
}

TEST(SymInt, FloorDivModSimplify) {
  using kiln::floordiv;
  using kiln::mod;
  expect_same(floordiv(s0, 1), s0);
  expect_same(floordiv(0, s0), 0);
  expect_same(floordiv(s0 + s1, s1 + s0), 1);
  expect_same(floordiv(4 * s0 + 8, 4), s0 + 2);
  expect_same(floordiv(4 * s0 + 9, 4), s0 + 2);
  expect_same(floordiv(4 * s0 + s1, 4), s0 + floordiv(s1, 4));
  expect_same(floordiv(2 * s0, 4), floordiv(s0, 2));
  expect_same(floordiv(floordiv(s0, 2), 3), floordiv(s0, 6));
  expect_same(floordiv(mod(s0, 4), 4), 0);
  expect_same(floordiv(s0, s0 + 1), 0);
  EXPECT_EQ(floordiv(s0, 4).str(), "floor(s0/4)");
  EXPECT_EQ(floordiv(s0 + 1, 4).str(), "floor((s0 + 1)/4)");
  EXPECT_EQ(floordiv(s0, s1 + 1).str(), "floor(s0/(s1 + 1))");
  EXPECT_EQ((2 * floordiv(s0, 4) + 1).str(), "2*floor(s0/4) + 1");

  expect_same(mod(s0, 1), 0);
  expect_same(mod(4 * s0 + 8, 4), 0);
  expect_same(mod(4 * s0 + 5, 4), 1);
  expect_same(mod(4 * s0 * s1 - 1, 4), 3);
  expect_same(mod(s0 * s1, s1 * s0), 0);
  expect_same(mod(4 * s0 + s1, 4), mod(s1, 4));
  expect_same(mod(mod(s0, 8), 4), mod(s0, 4));
  expect_same(mod(mod(s0, 4), 4), mod(s0, 4));
  expect_same(mod(2 * s0, 4), 2 * mod(s0, 2));
  expect_same(mod(s0, s0 + 1), s0);
  expect_same(mod(5 * s0 - s1, 4), mod(s0 + 3 * s1, 4));  // coefficients reduced modulo 4
  expect_same(mod(-s0, -4), -mod(s0, 4));
  expect_same(floordiv(s0, -4), floordiv(-s0, 4));
  EXPECT_EQ(mod(s0, 4).str(), "mod(s0, 4)");
  EXPECT_EQ(mod(s0, s1).str(), "mod(s0, s1)");
  EXPECT_FALSE(mod(s0, s1).is_constant());
}

TEST(SymInt, MaxMin) {
  using kiln::sym_max;
  using kiln::sym_min;
  EXPECT_EQ(sym_max(3, 5).as_int(), 5);
  EXPECT_EQ(sym_min(3, 5).as_int(), 3);
  EXPECT_EQ(sym_max(-3, -5).as_int(), -3);
  expect_same(sym_max(s0, s0), s0);
  expect_same(sym_max(s0 + 1, 1), s0 + 1);
  expect_same(sym_max(s0, 0), s0);
  expect_same(sym_min(s0, 0), 0);
  expect_same(sym_min(s0 + 1, s0 + 3), s0 + 1);
  expect_same(sym_max(s0 + 1, s0 + 3), s0 + 3);
  expect_same(sym_max(s0 * s1 + s0, s0), s0 * s1 + s0);
  expect_same(sym_max(kiln::mod(s0, 4), 3), 3);
  EXPECT_EQ(sym_max(s0, 3).str(), "max(3, s0)");
  expect_same(sym_max(s0, 3), sym_max(3, s0));
  expect_same(sym_min(s1, s0), sym_min(s0, s1));
  EXPECT_EQ(sym_min(s0, s1).str(), "min(s0, s1)");
  EXPECT_FALSE(sym_max(s0, s1).same_as(sym_min(s0, s1)));
}

TEST(SymInt, Comparisons) {
  using namespace kiln;
  EXPECT_EQ(sym_eq(3, 3), true);
  EXPECT_EQ(sym_lt(2, 3), true);
  EXPECT_EQ(sym_ge(2, 3), false);
  EXPECT_EQ(sym_eq(s0 + 1, 1 + s0), true);
  EXPECT_EQ(sym_ne(s0 + 1, s0), true);
  EXPECT_EQ(sym_lt(s0, s0 + 1), true);
  EXPECT_EQ(sym_le(s0, s0 + 1), true);
  EXPECT_EQ(sym_gt(s0, s0 + 1), false);
  EXPECT_EQ(sym_ge(s0, 0), true);
  EXPECT_EQ(sym_gt(s0 + 1, 0), true);
  EXPECT_EQ(sym_eq(s0 + 1, 0), false);
  EXPECT_EQ(sym_le(2 * s0 + s1, s0), std::nullopt);  // equal when both sizes are 0
  EXPECT_EQ(sym_ge(2 * s0 + s1, s0), true);
  EXPECT_EQ(sym_lt(mod(s0, 4), 4), true);
  EXPECT_EQ(sym_ge(floordiv(s0, 4), 0), true);
  EXPECT_EQ(sym_le(floordiv(s0, 4), s0), std::nullopt);  // not derivable from intervals alone
  // Undecidable without more information.
  EXPECT_EQ(sym_eq(s0, s1), std::nullopt);
  EXPECT_EQ(sym_ne(s0, 4), std::nullopt);
  EXPECT_EQ(sym_lt(s0, s1), std::nullopt);
  EXPECT_EQ(sym_gt(s0, 1), std::nullopt);
  EXPECT_EQ(sym_le(s0 - s1, 0), std::nullopt);
  EXPECT_EQ(sym_ge(s0, 1), std::nullopt);  // a size may be 0
}

TEST(SymInt, Evaluate) {
  using namespace kiln;
  std::map<std::string, int64_t> env{{"s0", 10}, {"s1", 3}};
  EXPECT_EQ((2 * s0 + s1 + 3).evaluate(env), 26);
  EXPECT_EQ(floordiv(s0, s1).evaluate(env), 3);
  EXPECT_EQ(mod(s0, s1).evaluate(env), 1);
  EXPECT_EQ(floordiv(s1 - s0, 4).evaluate(env), -2);
  EXPECT_EQ(mod(s1 - s0, 4).evaluate(env), 1);
  EXPECT_EQ(sym_max(s0, s1 * 4).evaluate(env), 12);
  EXPECT_EQ(sym_min(s0, s1 * 4).evaluate(env), 10);
  std::string msg = error_of([&] { (s0 + s2).evaluate(env); });
  EXPECT_NE(msg.find("s2"), std::string::npos) << msg;
  EXPECT_THROW(floordiv(s0, s1).evaluate({{"s0", 1}, {"s1", 0}}), kiln::Error);
  EXPECT_THROW(mod(s0, s1).evaluate({{"s0", 1}, {"s1", 0}}), kiln::Error);
}

TEST(SymInt, SymbolsAndErrors) {
  using namespace kiln;
  EXPECT_EQ((s1 + floordiv(s0, s2) + s1).symbols(), (std::vector<std::string>{"s0", "s1", "s2"}));
  std::string msg = error_of([&] { (s0 + 1).as_int(); });
  EXPECT_NE(msg.find("expected a constant size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("s0 + 1"), std::string::npos) << msg;
  EXPECT_THROW(SymInt::symbol(""), kiln::Error);
  EXPECT_THROW(SymInt::symbol("a+b"), kiln::Error);
  EXPECT_THROW(SymInt(INT64_MAX) + SymInt(1), kiln::Error);
  EXPECT_THROW(SymInt(INT64_MAX) * s0 * 2, kiln::Error);
}

TEST(SymInt, Shapes) {
  using namespace kiln;
  Shape s = make_shape({2, 3, 4});
  EXPECT_EQ(concrete(s), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(numel(s).as_int(), 24);
  EXPECT_EQ(numel(Shape{}).as_int(), 1);
  EXPECT_EQ(shape_str(s), "[2, 3, 4]");
  EXPECT_EQ(shape_str(Shape{}), "[]");
  Shape t{2, s0, 3};
  EXPECT_EQ(shape_str(t), "[2, s0, 3]");
  EXPECT_EQ(numel(t).str(), "6*s0");
  std::string msg = error_of([&] { concrete(t); });
  EXPECT_NE(msg.find("dimension 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("s0"), std::string::npos) << msg;
}

// ---- randomized: simplified SymInt vs direct evaluation ---------------------------------------
using Env = std::map<std::string, int64_t>;
struct Node {
  SymInt sym;
  std::function<int64_t(const Env&)> eval;
};

int64_t py_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
int64_t py_mod(int64_t a, int64_t b) { return a - b * py_div(a, b); }

Node random_node(std::mt19937& rng, int depth) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const char* names[] = {"s0", "s1", "s2"};
  auto leaf = [&]() -> Node {
    if (pick(0, 2) > 0) {
      std::string n = names[pick(0, 2)];
      return {SymInt::symbol(n), [n](const Env& e) { return e.at(n); }};
    }
    int64_t c = pick(-3, 6);
    return {SymInt(c), [c](const Env&) { return c; }};
  };
  if (depth == 0 || pick(0, 4) == 0) return leaf();
  Node a = random_node(rng, depth - 1);
  auto fa = a.eval;
  int op = pick(0, 8);
  if (op == 3 || op == 4) {  // by a nonzero constant
    int64_t k = pick(1, 6) * (pick(0, 4) == 0 ? -1 : 1);
    if (op == 3) return {kiln::floordiv(a.sym, k), [fa, k](const Env& e) { return py_div(fa(e), k); }};
    return {kiln::mod(a.sym, k), [fa, k](const Env& e) { return py_mod(fa(e), k); }};
  }
  if (op == 7 || op == 8) {  // by a symbolic, always-positive divisor
    Node d = leaf();
    int64_t c = pick(1, 3);
    SymInt ds = d.sym * d.sym + c;  // >= 1 even for a negative constant leaf
    auto fd = [g = d.eval, c](const Env& e) { return g(e) * g(e) + c; };
    if (op == 7) return {kiln::floordiv(a.sym, ds), [fa, fd](const Env& e) { return py_div(fa(e), fd(e)); }};
    return {kiln::mod(a.sym, ds), [fa, fd](const Env& e) { return py_mod(fa(e), fd(e)); }};
  }
  Node b = random_node(rng, depth - 1);
  auto fb = b.eval;
  switch (op) {
    case 0: return {a.sym + b.sym, [fa, fb](const Env& e) { return fa(e) + fb(e); }};
    case 1: return {a.sym - b.sym, [fa, fb](const Env& e) { return fa(e) - fb(e); }};
    case 2: return {a.sym * b.sym, [fa, fb](const Env& e) { return fa(e) * fb(e); }};
    case 5: return {kiln::sym_max(a.sym, b.sym), [fa, fb](const Env& e) { return std::max(fa(e), fb(e)); }};
    default: return {kiln::sym_min(a.sym, b.sym), [fa, fb](const Env& e) { return std::min(fa(e), fb(e)); }};
  }
}

TEST(SymInt, RandomizedAgainstDirectEvaluation) {
  std::mt19937 rng(12345);
  std::vector<Env> envs;
  for (int i = 0; i < 12; ++i) {
    auto v = [&] { return std::uniform_int_distribution<int64_t>(0, i < 4 ? 3 : 20)(rng); };
    envs.push_back({{"s0", v()}, {"s1", v()}, {"s2", v()}});
  }
  envs.push_back({{"s0", 0}, {"s1", 0}, {"s2", 0}});
  Node prev{SymInt(0), [](const Env&) { return int64_t{0}; }};
  int decided = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::mt19937 saved = rng;
    Node n = random_node(rng, 4);
    SCOPED_TRACE("expression #" + std::to_string(iter) + ": " + n.sym.str());
    // Canonical and deterministic: rebuilding gives the same form; e - e folds to 0.
    Node again = random_node(saved, 4);
    EXPECT_TRUE(n.sym.same_as(again.sym)) << again.sym.str();
    EXPECT_EQ((n.sym - n.sym).maybe_int(), 0);
    expect_same(n.sym + prev.sym, prev.sym + n.sym);
    expect_same(n.sym * prev.sym, prev.sym * n.sym);
    expect_same(kiln::sym_max(n.sym, prev.sym), kiln::sym_max(prev.sym, n.sym));
    for (const Env& env : envs) ASSERT_EQ(n.sym.evaluate(env), n.eval(env)) << "s0=" << env.at("s0") << " s1=" << env.at("s1") << " s2=" << env.at("s2");
    // Comparisons, when decided, must hold at every point.
    auto check = [&](std::optional<bool> r, auto truth) {
      if (!r) return;
      ++decided;
      for (const Env& env : envs) ASSERT_EQ(*r, truth(n.eval(env), prev.eval(env))) << "vs " << prev.sym.str();
    };
    check(kiln::sym_eq(n.sym, prev.sym), [](int64_t x, int64_t y) { return x == y; });
    check(kiln::sym_ne(n.sym, prev.sym), [](int64_t x, int64_t y) { return x != y; });
    check(kiln::sym_lt(n.sym, prev.sym), [](int64_t x, int64_t y) { return x < y; });
    check(kiln::sym_le(n.sym, prev.sym), [](int64_t x, int64_t y) { return x <= y; });
    check(kiln::sym_gt(n.sym, prev.sym), [](int64_t x, int64_t y) { return x > y; });
    check(kiln::sym_ge(n.sym, prev.sym), [](int64_t x, int64_t y) { return x >= y; });
    prev = n;
  }
  EXPECT_GT(decided, 100);
}

}  // namespace
