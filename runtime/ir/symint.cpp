// SymInt implementation.
//
// Normal form: a SymExpr is a polynomial (monomial -> nonzero int64 coefficient). A monomial is a
// sorted multiset of atoms; an atom is a symbol or an opaque floordiv / mod / max / min of two
// canonical SymInts. Every atom and monomial has a canonical string key, and the text of a whole
// expression (str()) is its key, so same_as() is a string comparison. A polynomial that reduces to
// a constant is returned as a constant SymInt (no allocation).
//
// Each expression also carries an integer range (interval) computed under the size assumption
// (every symbol >= 0); the range drives comparisons, max/min folding and floordiv/mod folding.
#include "runtime/ir/symint.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <numeric>
#include <set>

#include "runtime/core/error.h"
#include "runtime/ir/sym_facts.h"
#include "runtime/ir/symint_impl.h"

namespace kiln {
namespace sym {

// ---- checked int64 arithmetic and Python-style division -------------------------------------
int64_t cadd(int64_t a, int64_t b) {
  int64_t r;
  KILN_CHECK(!__builtin_add_overflow(a, b, &r), "integer overflow in size arithmetic: ", a, " + ", b);
  return r;
}
int64_t cmul(int64_t a, int64_t b) {
  int64_t r;
  KILN_CHECK(!__builtin_mul_overflow(a, b, &r), "integer overflow in size arithmetic: ", a, " * ", b);
  return r;
}
int64_t checked_div(int64_t a, int64_t b) {
  KILN_CHECK(b != 0, "floordiv: division by zero (", a, " // 0)");
  KILN_CHECK(!(a == INT64_MIN && b == -1), "integer overflow in size arithmetic: ", a, " // -1");
  return py_div(a, b);
}
int64_t checked_mod(int64_t a, int64_t b) {
  KILN_CHECK(b != 0, "mod: modulo by zero (", a, " % 0)");
  return b == -1 ? 0 : py_mod(a, b);
}

Range range_of(const SymInt& x) {
  if (auto v = x.maybe_int()) return {*v, *v};
  return x.expr()->range;
}
Poly poly_of(const SymInt& x) {
  if (x.is_constant()) {
    Poly p;
    if (x.as_int() != 0) p[Mono{}] = x.as_int();
    return p;
  }
  return x.expr()->poly;
}
void add_term(Poly& p, const Mono& m, int64_t c) {
  auto [it, fresh] = p.emplace(m, c);
  if (!fresh) it->second = cadd(it->second, c);
  if (it->second == 0) p.erase(it);
}
std::string term_text(int64_t c, const Mono& m) {
  if (m.atoms.empty()) return std::to_string(c);
  if (c == 1) return m.key;
  if (c == -1) return "-" + m.key;
  return std::to_string(c) + "*" + m.key;
}
SymInt from_poly(Poly p) {
  if (p.empty()) return SymInt(0);
  if (p.size() == 1 && p.begin()->first.atoms.empty()) return SymInt(p.begin()->second);
  auto e = std::make_shared<SymExpr>();
  e->range = {0, 0};
  for (const auto& [m, c] : p) {
    if (e->text.empty())
      e->text = term_text(c, m);
    else if (c < 0 && c != INT64_MIN)
      e->text += " - " + term_text(-c, m);
    else
      e->text += " + " + term_text(c, m);
    Range t{c, c};
    for (const auto& at : m.atoms) t = rmul(t, at->range);
    e->range = radd(e->range, t);
  }
  e->poly = std::move(p);
  return SymInt(std::shared_ptr<const SymExpr>(std::move(e)));
}
Mono mono_mul(const Mono& x, const Mono& y) {
  Mono m;
  m.atoms = x.atoms;
  m.atoms.insert(m.atoms.end(), y.atoms.begin(), y.atoms.end());
  std::stable_sort(m.atoms.begin(), m.atoms.end(), [](const AtomP& p, const AtomP& q) { return p->key < q->key; });
  for (const auto& at : m.atoms) m.key += (m.key.empty() ? "" : "*") + at->key;
  return m;
}
const Atom* single_atom(const SymInt& x) {
  if (x.is_constant() || x.expr()->poly.size() != 1) return nullptr;
  const auto& [m, c] = *x.expr()->poly.begin();
  return (c == 1 && m.atoms.size() == 1) ? m.atoms[0].get() : nullptr;
}

Range op_range(Kind k, Range ra, Range rb) {
  switch (k) {
    case Kind::Max: return {std::max(ra.lo, rb.lo), std::max(ra.hi, rb.hi)};
    case Kind::Min: return {std::min(ra.lo, rb.lo), std::min(ra.hi, rb.hi)};
    case Kind::FloorDiv:
      if (rb.lo > 0) return {bfloor(ra.lo, ra.lo >= 0 ? rb.hi : rb.lo), bfloor(ra.hi, ra.hi >= 0 ? rb.lo : rb.hi)};
      if (rb.lo >= 0 && ra.lo >= 0) return {0, ra.hi};  // a divisor of 0 fails at evaluation
      return {-kInf, kInf};
    default:  // Mod: the result has the sign of the divisor and |result| < |divisor|
      if (rb.lo >= 0) return {0, std::max<Big>(0, std::min(badd(rb.hi, -1, true), ra.lo >= 0 ? ra.hi : kInf))};
      if (rb.hi <= 0) return {std::min<Big>(0, badd(rb.lo, 1, false)), 0};
      return {-kInf, kInf};
  }
}
Range atom_range(Kind k, const SymInt& a, const SymInt& b) {
  if (k == Kind::Symbol) return {0, kInf};
  return op_range(k, range_of(a), range_of(b));
}

std::string operand_text(const SymInt& x, bool divisor) {
  std::string s = x.str();
  if (x.is_constant()) return s;
  bool compound = x.expr()->poly.size() > 1 || (divisor && single_atom(x) == nullptr);
  return compound ? "(" + s + ")" : s;
}

SymInt make_atom(Kind k, const std::string& name, const SymInt& a = 0, const SymInt& b = 0) {
  auto at = std::make_shared<Atom>();
  at->kind = k;
  at->name = name;
  at->a = a;
  at->b = b;
  at->range = atom_range(k, a, b);
  if (at->range.lo == at->range.hi && !is_inf(at->range.lo)) return SymInt(static_cast<int64_t>(at->range.lo));
  switch (k) {
    case Kind::Symbol: at->key = name; break;
    case Kind::FloorDiv: at->key = "floor(" + operand_text(a, false) + "/" + operand_text(b, true) + ")"; break;
    case Kind::Mod: at->key = "mod(" + a.str() + ", " + b.str() + ")"; break;
    case Kind::Max: at->key = "max(" + a.str() + ", " + b.str() + ")"; break;
    case Kind::Min: at->key = "min(" + a.str() + ", " + b.str() + ")"; break;
  }
  Mono m{{at}, at->key};
  Poly p;
  p[m] = 1;
  return from_poly(std::move(p));
}

// Splits a = k*q + r (k > 0): terms whose coefficient k divides go to q, the constant (or, with
// `all`, every coefficient) is split into k*floor(c/k) + c%k, everything else stays in r.
std::pair<SymInt, SymInt> split(const SymInt& a, int64_t k, bool all = false) {
  Poly q, r;
  for (const auto& [m, c] : poly_of(a)) {
    if (m.atoms.empty() || all) {
      add_term(q, m, py_div(c, k));
      add_term(r, m, py_mod(c, k));
    } else if (c % k == 0) {
      add_term(q, m, c / k);
    } else {
      add_term(r, m, c);
    }
  }
  return {from_poly(std::move(q)), from_poly(std::move(r))};
}
// gcd of k and every coefficient of x.
int64_t content_gcd(const SymInt& x, int64_t k) {
  int64_t g = k;
  for (const auto& [m, c] : poly_of(x)) g = std::gcd(g, c);
  return g;
}
SymInt divide_exact(const SymInt& x, int64_t g) {
  Poly p = poly_of(x);
  for (auto& [m, c] : p) c /= g;
  return from_poly(std::move(p));
}
// If floor(r/k) is the same for every value in r's range, that quotient.
std::optional<int64_t> fixed_quotient(const SymInt& r, int64_t k) {
  Range rr = range_of(r);
  if (is_inf(rr.lo) || is_inf(rr.hi) || bfloor(rr.lo, k) != bfloor(rr.hi, k)) return std::nullopt;
  return static_cast<int64_t>(bfloor(rr.lo, k));
}

SymInt min_max(Kind kind, const SymInt& a, const SymInt& b) {
  if (a.same_as(b)) return a;
  Range d = range_of(a - b);
  bool a_ge = d.lo >= 0, a_le = d.hi <= 0;
  bool ordered = a.str() < b.str();
  if (a_ge && a_le) return ordered ? a : b;  // equal values, different forms: pick deterministically
  if (a_ge || a_le) return (a_ge == (kind == Kind::Max)) ? a : b;
  return make_atom(kind, "", ordered ? a : b, ordered ? b : a);
}

int64_t eval_atom(const Atom& at, const std::map<std::string, int64_t>& env) {
  if (at.kind == Kind::Symbol) {
    auto it = env.find(at.name);
    KILN_CHECK(it != env.end(), "evaluate: symbol '", at.name, "' has no value in the environment");
    return it->second;
  }
  int64_t a = at.a.evaluate(env), b = at.b.evaluate(env);
  switch (at.kind) {
    case Kind::FloorDiv: return checked_div(a, b);
    case Kind::Mod: return checked_mod(a, b);
    case Kind::Max: return std::max(a, b);
    default: return std::min(a, b);
  }
}

void collect_symbols(const SymInt& x, std::set<std::string>& out) {
  if (x.is_constant()) return;
  for (const auto& [m, c] : x.expr()->poly)
    for (const auto& at : m.atoms) {
      if (at->kind == Kind::Symbol) {
        out.insert(at->name);
      } else {
        collect_symbols(at->a, out);
        collect_symbols(at->b, out);
      }
    }
}

bool valid_symbol_name(const std::string& n) {
  if (n.empty() || std::isdigit(static_cast<unsigned char>(n[0]))) return false;
  return std::all_of(n.begin(), n.end(),
                     [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.'; });
}

}  // namespace sym

// ---- SymInt ----------------------------------------------------------------------------------
SymInt::SymInt(std::shared_ptr<const SymExpr> e) : value_(0), expr_(std::move(e)) {}

SymInt SymInt::symbol(const std::string& name) {
  KILN_CHECK(sym::valid_symbol_name(name), "symbol name must be an identifier (letters, digits, '_', '.'), got '", name,
             "'");
  return sym::make_atom(sym::Kind::Symbol, name);
}

namespace {
thread_local ShapeOracle* t_oracle __attribute__((tls_model("initial-exec"))) = nullptr;

// The traced value of `e` relied upon exactly (a size that must be concrete).
int64_t specialize(const SymInt& e) {
  int64_t v = t_oracle->hint(e);
  t_oracle->assume(e - SymInt(v), SymRel::Eq);
  return v;
}
// Decides `d rel 0` from the facts the oracle keeps, else from the hint, recording the outcome
// (or its negation). `d` is first simplified with the facts.
bool decide(SymInt d, SymRel rel, SymRel negation) {
  if (const SymFacts* f = t_oracle->facts()) {
    if (auto known = f->decide(d, rel)) return *known;
    d = f->simplify(d);
  }
  bool r = rel_holds(t_oracle->hint(d), rel);
  t_oracle->assume(d, r ? rel : negation);
  return r;
}
}  // namespace

ShapeOracle* shape_oracle() { return t_oracle; }
ShapeOracle* set_shape_oracle(ShapeOracle* o) {
  ShapeOracle* prev = t_oracle;
  t_oracle = o;
  return prev;
}

int64_t SymInt::symbolic_as_int() const {
  if (t_oracle) {
    const SymFacts* f = t_oracle->facts();
    SymInt e = f ? f->simplify(*this) : *this;
    return e.is_constant() ? e.as_int() : specialize(e);
  }
  throw Error("expected a constant size, got symbolic " + str());
}
std::optional<int64_t> SymInt::maybe_int() const {
  if (is_constant()) return value_;
  return std::nullopt;
}

int64_t SymInt::evaluate(const std::map<std::string, int64_t>& env) const {
  if (is_constant()) return value_;
  int64_t sum = 0;
  for (const auto& [m, c] : expr_->poly) {
    int64_t t = c;
    for (const auto& at : m.atoms) t = sym::cmul(t, sym::eval_atom(*at, env));
    sum = sym::cadd(sum, t);
  }
  return sum;
}

std::vector<std::string> SymInt::symbols() const {
  std::set<std::string> s;
  sym::collect_symbols(*this, s);
  return {s.begin(), s.end()};
}

std::string SymInt::str() const { return is_constant() ? std::to_string(value_) : expr_->text; }

bool SymInt::same_as(const SymInt& o) const {
  if (is_constant() || o.is_constant()) return is_constant() && o.is_constant() && value_ == o.value_;
  return expr_ == o.expr_ || expr_->text == o.expr_->text;
}

SymInt operator+(const SymInt& a, const SymInt& b) {
  if (a.is_constant() && b.is_constant()) return sym::cadd(a.value_, b.value_);
  sym::Poly p = sym::poly_of(a);
  for (const auto& [m, c] : sym::poly_of(b)) sym::add_term(p, m, c);
  return sym::from_poly(std::move(p));
}
SymInt operator-(const SymInt& a) { return a * SymInt(-1); }
SymInt operator-(const SymInt& a, const SymInt& b) {
  if (a.is_constant() && b.is_constant()) {
    int64_t r;
    KILN_CHECK(!__builtin_sub_overflow(a.value_, b.value_, &r), "integer overflow in size arithmetic: ", a.value_,
               " - ", b.value_);
    return r;
  }
  return a + (-b);
}
SymInt operator*(const SymInt& a, const SymInt& b) {
  if (a.is_constant() && b.is_constant()) return sym::cmul(a.value_, b.value_);
  sym::Poly p;
  for (const auto& [ma, ca] : sym::poly_of(a))
    for (const auto& [mb, cb] : sym::poly_of(b)) sym::add_term(p, sym::mono_mul(ma, mb), sym::cmul(ca, cb));
  return sym::from_poly(std::move(p));
}

SymInt floordiv(const SymInt& a, const SymInt& b) {
  using namespace sym;
  if (auto k = b.maybe_int()) {
    KILN_CHECK(*k != 0, "floordiv: division by zero (", a.str(), " // 0)");
    if (a.is_constant()) return checked_div(a.as_int(), *k);
    if (*k < 0) return floordiv(-a, -b);  // floor(a / -k) == floor(-a / k)
    if (*k == 1) return a;
    auto [q, r] = split(a, *k);  // a//k == q + r//k
    if (int64_t g = content_gcd(r, *k); g > 1) return q + floordiv(divide_exact(r, g), *k / g);
    if (auto f = fixed_quotient(r, *k)) return q + *f;
    const Atom* at = single_atom(r);
    if (at && at->kind == Kind::FloorDiv && at->b.is_constant())  // floor(floor(x/j)/k) == floor(x/(j*k))
      return q + floordiv(at->a, cmul(at->b.as_int(), *k));
    return q + make_atom(Kind::FloorDiv, "", r, *k);
  }
  if (a.maybe_int() == 0) return 0;
  if (a.same_as(b)) return 1;
  if (range_of(a).lo >= 0 && range_of(b - a).lo > 0) return 0;  // 0 <= a < b
  return make_atom(Kind::FloorDiv, "", a, b);
}

SymInt mod(const SymInt& a, const SymInt& b) {
  using namespace sym;
  if (auto k = b.maybe_int()) {
    KILN_CHECK(*k != 0, "mod: modulo by zero (", a.str(), " % 0)");
    if (a.is_constant()) return checked_mod(a.as_int(), *k);
    if (*k < 0) return -mod(-a, -b);  // a % -k == -((-a) % k)
    if (*k == 1) return 0;
    SymInt r = split(a, *k, true).second;  // a % k == r % k, r's coefficients in [1, k)
    if (int64_t g = content_gcd(r, *k); g > 1) return SymInt(g) * mod(divide_exact(r, g), *k / g);
    if (auto f = fixed_quotient(r, *k)) return r - SymInt(cmul(*f, *k));
    const Atom* at = single_atom(r);
    if (at && at->kind == Kind::Mod && at->b.is_constant() && at->b.as_int() % *k == 0)
      return mod(at->a, *k);  // (x % j) % k == x % k when k divides j
    return make_atom(Kind::Mod, "", r, *k);
  }
  if (a.maybe_int() == 0 || a.same_as(b)) return 0;
  if (range_of(a).lo >= 0 && range_of(b - a).lo > 0) return a;  // 0 <= a < b
  return make_atom(Kind::Mod, "", a, b);
}

SymInt sym_max(const SymInt& a, const SymInt& b) { return sym::min_max(sym::Kind::Max, a, b); }
SymInt sym_min(const SymInt& a, const SymInt& b) { return sym::min_max(sym::Kind::Min, a, b); }

std::optional<bool> sym_eq(const SymInt& a, const SymInt& b) {
  SymInt e = a - b;
  sym::Range d = sym::range_of(e);
  if (d.lo == 0 && d.hi == 0) return true;
  if (d.lo > 0 || d.hi < 0) return false;
  if (t_oracle) return decide(e, SymRel::Eq, SymRel::Ne);
  return std::nullopt;
}
std::optional<bool> sym_ne(const SymInt& a, const SymInt& b) {
  auto r = sym_eq(a, b);
  return r ? std::optional<bool>(!*r) : std::nullopt;
}
std::optional<bool> sym_lt(const SymInt& a, const SymInt& b) {
  SymInt e = a - b;
  sym::Range d = sym::range_of(e);
  if (d.hi < 0) return true;
  if (d.lo >= 0) return false;
  if (t_oracle) return decide(e, SymRel::Lt, SymRel::Ge);
  return std::nullopt;
}
std::optional<bool> sym_le(const SymInt& a, const SymInt& b) {
  SymInt e = a - b;
  sym::Range d = sym::range_of(e);
  if (d.hi <= 0) return true;
  if (d.lo > 0) return false;
  if (t_oracle) return decide(e, SymRel::Le, SymRel::Gt);
  return std::nullopt;
}
std::optional<bool> sym_gt(const SymInt& a, const SymInt& b) { return sym_lt(b, a); }
std::optional<bool> sym_ge(const SymInt& a, const SymInt& b) { return sym_le(b, a); }

// ---- shapes ----------------------------------------------------------------------------------
Shape make_shape(const std::vector<int64_t>& sizes) { return Shape(sizes.begin(), sizes.end()); }

std::vector<int64_t> concrete(const Shape& s) {
  std::vector<int64_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    KILN_CHECK(s[i].is_constant() || t_oracle, "expected a concrete shape, but dimension ", i, " of ", shape_str(s),
               " is symbolic (", s[i].str(), ")");
    out.push_back(s[i].as_int());
  }
  return out;
}

SymInt numel(const Shape& s) {
  SymInt n = 1;
  for (const auto& d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + s[i].str();
  return out + "]";
}

bool identical_shape(const Shape& a, const Shape& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!a[i].same_as(b[i])) return false;
  return true;
}

bool same_shape(const Shape& a, const Shape& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!sym_eq(a[i], b[i]).value_or(false)) return false;
  return true;
}

}  // namespace kiln
