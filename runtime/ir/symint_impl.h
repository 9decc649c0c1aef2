// Internals of SymInt shared by runtime/ir/symint.cpp and runtime/ir/sym_facts.cpp: the normal form
// (polynomials over atoms), integer ranges and the helpers that build and inspect them. Not part
// of the public API.
#pragma once
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/ir/symint.h"

namespace kiln {
namespace sym {

// Python-style division and modulo (b != 0).
template <class T>
inline T py_div(T a, T b) {  // b != 0
  T q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}
template <class T>
inline T py_mod(T a, T b) {  // b != 0
  T r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
// ---- ranges: [lo, hi] with +-kInf meaning unbounded ------------------------------------------
using Big = __int128;
constexpr Big kInf = Big(1) << 100;
struct Range {
  Big lo, hi;
};
inline bool is_inf(Big v) { return v == kInf || v == -kInf; }
inline Big clamp(Big v) { return std::max(-kInf, std::min(kInf, v)); }
inline Big badd(Big a, Big b, bool upper) {
  if (is_inf(a) && is_inf(b) && a != b) return upper ? kInf : -kInf;
  if (is_inf(a)) return a;
  if (is_inf(b)) return b;
  return clamp(a + b);
}
inline Big bmul(Big a, Big b) {
  if (a == 0 || b == 0) return 0;
  Big r;
  if (is_inf(a) || is_inf(b) || __builtin_mul_overflow(a, b, &r)) return ((a < 0) != (b < 0)) ? -kInf : kInf;
  return clamp(r);
}
inline Big bfloor(Big x, Big k) {  // floor(x / k) for k > 0
  if (is_inf(x)) return x;
  if (k == kInf) return x >= 0 ? 0 : -1;
  return py_div(x, k);
}
inline Range radd(Range a, Range b) { return {badd(a.lo, b.lo, false), badd(a.hi, b.hi, true)}; }
inline Range rmul(Range a, Range b) {
  Big c[4] = {bmul(a.lo, b.lo), bmul(a.lo, b.hi), bmul(a.hi, b.lo), bmul(a.hi, b.hi)};
  return {*std::min_element(c, c + 4), *std::max_element(c, c + 4)};
}

// ---- atoms, monomials, polynomials -----------------------------------------------------------
enum class Kind { Symbol, FloorDiv, Mod, Max, Min };
struct Atom {
  Kind kind;
  std::string name;  // symbol name (Kind::Symbol only)
  SymInt a, b;  // operands (other kinds)
  std::string key;  // canonical text
  Range range;
};
using AtomP = std::shared_ptr<const Atom>;
struct Mono {
  std::vector<AtomP> atoms;  // sorted by key; empty for the constant term
  std::string key;  // atom keys joined by '*'
};
struct MonoLess {  // higher degree first, then by key; the constant term sorts last
  bool operator()(const Mono& x, const Mono& y) const {
    if (x.atoms.size() != y.atoms.size()) return x.atoms.size() > y.atoms.size();
    return x.key < y.key;
  }
};
using Poly = std::map<Mono, int64_t, MonoLess>;

// Checked int64 arithmetic (throws kiln::Error on overflow).
int64_t cadd(int64_t a, int64_t b);
int64_t cmul(int64_t a, int64_t b);
// The range of x under the size assumption (every symbol >= 0).
Range range_of(const SymInt& x);
// The normal form of x (empty for 0).
Poly poly_of(const SymInt& x);
// Adds c*m to p (dropping zero terms).
void add_term(Poly& p, const Mono& m, int64_t c);
// The SymInt of a polynomial (a constant when it has no symbolic term).
SymInt from_poly(Poly p);
// Product of two monomials.
Mono mono_mul(const Mono& x, const Mono& y);
// The atom of x when x is exactly one atom with coefficient 1, else null.
const Atom* single_atom(const SymInt& x);
// Range of a floordiv / mod / max / min of operands in ranges ra, rb.
Range op_range(Kind k, Range ra, Range rb);

}  // namespace sym

struct SymExpr {
  sym::Poly poly;  // at least one non-constant term
  std::string text;
  sym::Range range;
};

}  // namespace kiln
