// Tests for SymInt: constant fast path, canonical simplification, floordiv/mod/max/min folding,
// comparisons under the size assumption, evaluation, printing, and a randomized check of the
// simplifier against direct evaluation.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "runtime/core/error.h"
#include "runtime/ir/sym_facts.h"
#include "runtime/ir/symint.h"

using kiln::SymInt;

namespace {

const SymInt s0 = SymInt::symbol("s0");
const SymInt s1 = SymInt::symbol("s1");
const SymInt s2 = SymInt::symbol("s2");

void expect_same(const SymInt& a, const SymInt& b) { EXPECT_TRUE(a.same_as(b)) << a.str() << " vs " << b.str(); }

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
    for (const Env& env : envs)
      ASSERT_EQ(n.sym.evaluate(env), n.eval(env))
          << "s0=" << env.at("s0") << " s1=" << env.at("s1") << " s2=" << env.at("s2");
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

// ---- facts: simplification and decisions under what a trace established ----------------------
namespace {
using kiln::SymFacts;
using kiln::SymRel;

// Symbols standing for sizes >= 2, as in a compile() trace.
SymFacts sizes_facts() {
  SymFacts f;
  for (const auto& s : {s0, s1, s2}) f.add(s - 2, SymRel::Ge);
  return f;
}
}  // namespace

TEST(SymFacts, EqualSymbolsBecomeOneRepresentative) {
  SymFacts f = sizes_facts();
  expect_same(f.simplify(s1 + s0), s1 + s0);  // nothing known yet
  f.add(s0 - s1, SymRel::Eq);
  expect_same(f.simplify(s1), s0);  // the earlier-ranked symbol stays
  expect_same(f.simplify(s1 * s2 + s0), s0 * s2 + s0);
  expect_same(f.simplify(kiln::floordiv(s1, 2)), kiln::floordiv(s0, 2));
  EXPECT_EQ(f.decide(s1 - s0, SymRel::Eq), true);
  EXPECT_EQ(f.decide(s1 - s0, SymRel::Ne), false);
  EXPECT_EQ(f.decide(s2 - s0, SymRel::Eq), std::nullopt);  // s2 is not involved
  // Chains resolve to the first symbol; a constant equality replaces the symbol by it.
  f.add(s2 - s1, SymRel::Eq);
  expect_same(f.simplify(s2), s0);
  f.add(s0 - 6, SymRel::Eq);
  EXPECT_EQ(f.simplify(s2 * s1).maybe_int(), 36);
  EXPECT_NE(f.str().find("s1 -> 6"), std::string::npos) << f.str();
}

TEST(SymFacts, DivisibilityFoldsModAndFloorDiv) {
  SymFacts f = sizes_facts();
  // Without the fact nothing folds.
  expect_same(f.simplify(kiln::mod(s0, 4)), kiln::mod(s0, 4));
  expect_same(f.simplify(kiln::floordiv(s0, 4) * 4), kiln::floordiv(s0, 4) * 4);
  EXPECT_EQ(f.decide(kiln::mod(s0, 4), SymRel::Eq), std::nullopt);
  f.add(kiln::mod(s0, 4), SymRel::Eq);
  EXPECT_EQ(f.simplify(kiln::mod(s0, 4)).maybe_int(), 0);
  EXPECT_EQ(f.simplify(kiln::mod(s0, 2)).maybe_int(), 0);  // 2 divides 4
  EXPECT_EQ(f.simplify(kiln::mod(3 * s0 + 8, 4)).maybe_int(), 0);  // term by term
  expect_same(f.simplify(kiln::mod(s0, 8)), kiln::mod(s0, 8));  // 8 does not divide 4
  expect_same(f.simplify(kiln::floordiv(s0, 4) * 4), s0);
  expect_same(f.simplify(kiln::floordiv(s0, 4) * 8 + s1), 2 * s0 + s1);
  expect_same(f.simplify(kiln::floordiv(s0, 4) * 2), kiln::floordiv(s0, 4) * 2);  // not exact
  EXPECT_EQ(f.decide(kiln::floordiv(s0, 4) * 4 - s0, SymRel::Eq), true);
  // The fact on s0 says nothing about s1.
  expect_same(f.simplify(kiln::mod(s1, 4)), kiln::mod(s1, 4));
  expect_same(f.simplify(kiln::floordiv(s1, 4) * 4), kiln::floordiv(s1, 4) * 4);
  EXPECT_EQ(f.decide(kiln::mod(s1, 4), SymRel::Eq), std::nullopt);
  // Through an equality: s1 == s0 makes s1 divisible too.
  f.add(s1 - s0, SymRel::Eq);
  EXPECT_EQ(f.simplify(kiln::mod(s1, 4)).maybe_int(), 0);
}

TEST(SymFacts, BoundsDecideMaxMinAndComparisons) {
  SymFacts none;
  expect_same(none.simplify(kiln::sym_max(s0, 1)), kiln::sym_max(s0, 1));  // s0 may be 0
  EXPECT_EQ(none.decide(s0 - 1, SymRel::Eq), std::nullopt);
  SymFacts f = sizes_facts();
  expect_same(f.simplify(kiln::sym_max(s0, 1)), s0);
  EXPECT_EQ(f.simplify(kiln::sym_min(s0, 2)).maybe_int(), 2);
  expect_same(f.simplify(kiln::sym_max(s0, 5)), kiln::sym_max(s0, 5));  // s0 may be 2..4
  EXPECT_EQ(f.decide(s0 - 1, SymRel::Eq), false);
  EXPECT_EQ(f.decide(s0 - 1, SymRel::Gt), true);
  EXPECT_EQ(f.simplify(kiln::floordiv(1, s0)).maybe_int(), 0);  // 0 <= 1 < s0
  f.add(s0 - 5, SymRel::Ge);
  expect_same(f.simplify(kiln::sym_max(s0, 5)), s0);
  EXPECT_EQ(f.decide(s0 - 3, SymRel::Lt), false);
  f.add(s1 - 8, SymRel::Le);  // s1 in [2, 8]
  EXPECT_EQ(f.simplify(kiln::floordiv(s1, 9)).maybe_int(), 0);
  expect_same(f.simplify(kiln::mod(s1, 9)), s1);
  EXPECT_EQ(f.decide(s1 - 9, SymRel::Lt), true);
  EXPECT_EQ(f.decide(s2 - 9, SymRel::Lt), std::nullopt);  // s2's bound is only >= 2
  // A relation between symbols decides what it implies.
  f.add(s2 - s1, SymRel::Gt);
  EXPECT_EQ(f.decide(s2 - s1, SymRel::Ge), true);
  EXPECT_EQ(f.decide(s2 - s1 + 3, SymRel::Gt), true);
  EXPECT_EQ(f.decide(s1 - s2, SymRel::Eq), false);
  expect_same(f.simplify(kiln::sym_min(s1, s2)), s1);
}

TEST(SymFacts, ExactDivisionByAPositiveMonomial) {
  SymFacts none;
  expect_same(none.simplify(kiln::floordiv(s0 * s1, s1)), kiln::floordiv(s0 * s1, s1));  // s1 may be 0
  SymFacts f = sizes_facts();
  expect_same(f.simplify(kiln::floordiv(s0 * s1, s1)), s0);
  expect_same(f.simplify(kiln::floordiv(2 * s0 * s1 + 4 * s1, 2 * s1)), s0 + 2);
  EXPECT_EQ(f.simplify(kiln::mod(s0 * s1, s1)).maybe_int(), 0);
  expect_same(f.simplify(kiln::floordiv(s0 * s1 + 1, s1)), kiln::floordiv(s0 * s1 + 1, s1));
}

// Simplification is exact: at every point satisfying the facts, the simplified expression has
// the same value (random expressions, random facts, points filtered by the facts).
TEST(SymFacts, RandomizedSimplificationAgreesWhereFactsHold) {
  std::mt19937 rng(777);
  int checked = 0, changed = 0;
  for (int round = 0; round < 40; ++round) {
    SymFacts f = sizes_facts();
    std::vector<std::pair<SymInt, SymRel>> facts;
    int nf = std::uniform_int_distribution<int>(1, 3)(rng);
    for (int i = 0; i < nf; ++i) {
      const SymInt* syms[] = {&s0, &s1, &s2};
      const SymInt& a = *syms[rng() % 3];
      const SymInt& b = *syms[rng() % 3];
      int64_t k = 2 + static_cast<int64_t>(rng() % 3);
      switch (rng() % 4) {
        case 0: facts.push_back({a - b, SymRel::Eq}); break;
        case 1: facts.push_back({kiln::mod(a, k), SymRel::Eq}); break;
        case 2: facts.push_back({a - static_cast<int64_t>(3 + rng() % 6), SymRel::Ge}); break;
        default: facts.push_back({a - b, SymRel::Gt}); break;
      }
    }
    for (const auto& [e, r] : facts) f.add(e, r);
    std::vector<Env> points;
    for (int64_t a = 2; a <= 13; ++a)
      for (int64_t b = 2; b <= 13; b += 1 + (a % 2))
        for (int64_t c = 2; c <= 13; c += 4) {
          Env env{{"s0", a}, {"s1", b}, {"s2", c}};
          bool ok = true;
          for (const auto& [e, r] : facts) ok = ok && kiln::rel_holds(e.evaluate(env), r);
          if (ok) points.push_back(env);
        }
    for (int i = 0; i < 40; ++i) {
      Node n = random_node(rng, 3);
      SymInt s = f.simplify(n.sym);
      changed += !s.same_as(n.sym);
      SCOPED_TRACE(n.sym.str() + " -> " + s.str() + " under\n" + f.str());
      for (const Env& env : points) {
        int64_t want;
        try {
          want = n.eval(env);
        } catch (...) {
          continue;
        }
        ASSERT_EQ(s.evaluate(env), want) << "s0=" << env.at("s0") << " s1=" << env.at("s1") << " s2=" << env.at("s2");
        ++checked;
        for (SymRel r : {SymRel::Eq, SymRel::Lt, SymRel::Ge}) {
          auto d = f.decide(n.sym - 4, r);
          if (d) ASSERT_EQ(*d, kiln::rel_holds(want - 4, r)) << kiln::rel_str(r);
        }
      }
    }
  }
  EXPECT_GT(checked, 10000);
  EXPECT_GT(changed, 200);
}

// A fake oracle keeping facts: comparisons and as_int() it has decided are not asked again.
TEST(SymFacts, OracleIsNotAskedAgain) {
  struct Oracle : kiln::ShapeOracle {
    SymFacts f = sizes_facts();
    std::map<std::string, int64_t> env{{"s0", 8}, {"s1", 8}, {"s2", 3}};
    int asked = 0;
    int64_t hint(const SymInt& e) override { return ++asked, e.evaluate(env); }
    void assume(const SymInt& e, SymRel r) override { f.add(e, r); }
    const SymFacts* facts() const override { return &f; }
  } o;
  kiln::ShapeOracle* prev = kiln::set_shape_oracle(&o);
  EXPECT_EQ(kiln::sym_eq(s0, 1), false);  // s0 >= 2: no question
  EXPECT_EQ(o.asked, 0);
  EXPECT_EQ(kiln::sym_eq(s0, s1), true);
  EXPECT_EQ(o.asked, 1);
  EXPECT_EQ(kiln::sym_eq(s1, s0), true);
  EXPECT_EQ(kiln::sym_le(s1 * 2, s0 + s1), true);
  EXPECT_EQ(kiln::sym_eq(kiln::mod(s0, 4), 0), true);
  EXPECT_EQ(o.asked, 2);
  EXPECT_EQ((kiln::floordiv(s1, 4) * 4).as_int(), 8);  // == s0 under the facts: still symbolic
  EXPECT_EQ(o.asked, 3);
  EXPECT_EQ(s0.as_int(), 8);  // now s0 -> 8 is a fact
  EXPECT_EQ((s1 * s1).as_int(), 64);
  EXPECT_EQ(o.asked, 3);
  EXPECT_EQ(kiln::sym_lt(s2, s0), true);  // s2 is not known: asked
  EXPECT_EQ(o.asked, 4);
  kiln::set_shape_oracle(prev);
}

TEST(SymFacts, DivisibilityTightensBounds) {
  SymFacts f = sizes_facts();
  EXPECT_EQ(f.decide(kiln::floordiv(s0, 4), SymRel::Gt), std::nullopt);  // s0 may be 2 or 3
  f.add(kiln::mod(s0, 4), SymRel::Eq);
  EXPECT_EQ(f.decide(kiln::floordiv(s0, 4), SymRel::Gt), true);  // s0 >= 4
  EXPECT_EQ(f.decide(kiln::floordiv(s0, 4) - 1, SymRel::Gt), std::nullopt);
  f.add(s0 - 11, SymRel::Le);
  EXPECT_EQ(f.decide(s0 - 8, SymRel::Le), true);  // s0 in {4, 8}
  EXPECT_EQ(f.decide(kiln::floordiv(s1, 4), SymRel::Gt), std::nullopt);
}
