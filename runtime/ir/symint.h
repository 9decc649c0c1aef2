// SymInt: a size that is either a constant or an expression over size symbols.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/pool_allocator.h"

#include "runtime/core/export.h"

namespace kiln {

struct SymExpr;  // immutable expression node (defined in symint.cpp)

// A size: a constant (fast path, no allocation) or a simplified expression over symbols.
class KILN_API SymInt {
 public:
  SymInt(int64_t v = 0) : value_(v) {}  // NOLINT: implicit from integer constants
  SymInt(int v) : value_(v) {}  // NOLINT
  // A fresh size symbol named `name` (e.g. "s0"); symbols are compared by name.
  static SymInt symbol(const std::string& name);

  // True when the value is a known constant.
  bool is_constant() const { return expr_ == nullptr; }
  // The constant value; throws kiln::Error when symbolic (inside a compile() trace: the traced
  // value, recorded as a guard).
  int64_t as_int() const { return is_constant() ? value_ : symbolic_as_int(); }
  // The constant value if known.
  std::optional<int64_t> maybe_int() const;
  // Value with every symbol replaced from `env` (symbol name -> value); throws if one is missing.
  int64_t evaluate(const std::map<std::string, int64_t>& env) const;
  // Names of the symbols this expression uses, sorted.
  std::vector<std::string> symbols() const;
  // Human-readable canonical form, e.g. "2*s0 + s1", "floor(s0/4)", "max(s0, 3)".
  std::string str() const;
  // Structural identity of the canonical forms (equal strings <=> equal expressions).
  bool same_as(const SymInt& o) const;

  friend KILN_API SymInt operator+(const SymInt& a, const SymInt& b);
  friend KILN_API SymInt operator-(const SymInt& a, const SymInt& b);
  friend KILN_API SymInt operator*(const SymInt& a, const SymInt& b);
  friend KILN_API SymInt operator-(const SymInt& a);
  SymInt& operator+=(const SymInt& o) { return *this = *this + o; }
  SymInt& operator*=(const SymInt& o) { return *this = *this * o; }

  // Internal: expression node (null for constants).
  const std::shared_ptr<const SymExpr>& expr() const { return expr_; }
  explicit SymInt(std::shared_ptr<const SymExpr> e);

 private:
  int64_t symbolic_as_int() const;
  int64_t value_ = 0;
  std::shared_ptr<const SymExpr> expr_;
};

// Floor division (rounds toward -inf, like Python's //). Division by constant 0 throws.
KILN_API SymInt floordiv(const SymInt& a, const SymInt& b);
// Python-style modulo (result has the sign of b).
KILN_API SymInt mod(const SymInt& a, const SymInt& b);
KILN_API SymInt sym_max(const SymInt& a, const SymInt& b);
KILN_API SymInt sym_min(const SymInt& a, const SymInt& b);

// Comparisons decide statically when they can (assuming every symbol is a size, i.e. >= 0)
// and return nullopt otherwise.
KILN_API std::optional<bool> sym_eq(const SymInt& a, const SymInt& b);
KILN_API std::optional<bool> sym_ne(const SymInt& a, const SymInt& b);
KILN_API std::optional<bool> sym_lt(const SymInt& a, const SymInt& b);
KILN_API std::optional<bool> sym_le(const SymInt& a, const SymInt& b);
KILN_API std::optional<bool> sym_gt(const SymInt& a, const SymInt& b);
KILN_API std::optional<bool> sym_ge(const SymInt& a, const SymInt& b);
// Whether a == b is known for every value of the symbols (records no guard).
inline bool provably_equal(const SymInt& a, const SymInt& b) {
  auto e = sym_eq(a, b);
  return e && *e;
}

// How a traced size expression compares with zero (see ShapeOracle).
enum class SymRel { Eq, Ne, Lt, Le, Gt, Ge };
class SymFacts;  // runtime/ir/sym_facts.h
// Decides what static analysis cannot while kiln::compile traces: a comparison or a size that
// must be concrete gets its value under the sizes being traced, and the oracle records the
// fact as a guard for later calls. An internal hook of kiln::compile: ShapeOracle,
// shape_oracle() and set_shape_oracle() are not exported from libkiln.
class ShapeOracle {
 public:
  virtual ~ShapeOracle() = default;
  // The value of `e` for the sizes being traced.
  virtual int64_t hint(const SymInt& e) = 0;
  // Records that the traced code relied on `e rel 0`.
  virtual void assume(const SymInt& e, SymRel rel) = 0;
  // The facts recorded so far (comparisons they decide are not asked again; as_int() and the
  // comparisons simplify with them first); null when the oracle keeps none.
  virtual const SymFacts* facts() const { return nullptr; }
};
// The oracle of this thread (null outside traces).
ShapeOracle* shape_oracle();
// Installs `o` for this thread; returns the previous one.
ShapeOracle* set_shape_oracle(ShapeOracle* o);

// A shape: one SymInt per dimension.
using Shape = std::vector<SymInt, detail::PoolAllocator<SymInt>>;

// Shape from constants.
KILN_API Shape make_shape(const std::vector<int64_t>& sizes);
// Constant sizes of a shape; throws kiln::Error if any is symbolic.
KILN_API std::vector<int64_t> concrete(const Shape& s);
// Product of all sizes (1 for a 0-d shape).
KILN_API SymInt numel(const Shape& s);
// Whether two shapes are equal dim by dim (in a compile() trace: decided by the traced sizes,
// with a guard, where the expressions differ).
KILN_API bool same_shape(const Shape& a, const Shape& b);
// Whether `s` is the constant 1 (static: a symbol is not, whatever it stands for; asks nothing).
inline bool is_one(const SymInt& s) { return s.is_constant() && s.as_int() == 1; }
// Whether two shapes are the same expressions dim by dim (static: asks nothing in a trace).
KILN_API bool identical_shape(const Shape& a, const Shape& b);
// "[2, s0, 3]".
KILN_API std::string shape_str(const Shape& s);

}  // namespace kiln
