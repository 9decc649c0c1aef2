// SymFacts: substitutions, bounds, divisibility and other relations over size symbols, and the
// simplification and decisions they allow. Every rewrite is exact under the facts: simplify(e)
// and e agree on every assignment of the symbols that satisfies them.
#include "runtime/ir/sym_facts.h"

#include <climits>
#include <numeric>
#include <set>
#include <sstream>

#include "runtime/ir/symint_impl.h"

namespace kiln {
namespace {

using sym::Atom;
using sym::Big;
using sym::Kind;
using sym::kInf;
using sym::Range;

// Symbols are ranked by name length, then name: s0 < s1 < ... < s9 < s10.
bool ranked_before(const std::string& a, const std::string& b) {
  return a.size() != b.size() ? a.size() < b.size() : a < b;
}

// The SymInt made of one atom.
SymInt atom_value(const sym::AtomP& at) {
  sym::Poly p;
  p[sym::Mono{{at}, at->key}] = 1;
  return sym::from_poly(std::move(p));
}

// x as c * atom (one term, one atom), if it is.
const Atom* lone_atom(const SymInt& x, int64_t& c) {
  if (x.is_constant() || x.expr()->poly.size() != 1) return nullptr;
  const auto& [m, coef] = *x.expr()->poly.begin();
  if (m.atoms.size() != 1) return nullptr;
  c = coef;
  return m.atoms[0].get();
}

// x / d when the one-term expression d divides every term of x exactly (coefficients and atoms).
std::optional<SymInt> divide_by_term(const SymInt& x, const SymInt& d) {
  if (d.is_constant() || d.expr()->poly.size() != 1) return std::nullopt;
  const auto& [dm, dc] = *d.expr()->poly.begin();
  sym::Poly q;
  for (const auto& [m, c] : sym::poly_of(x)) {
    if (c % dc != 0) return std::nullopt;
    std::vector<sym::AtomP> rest = m.atoms;
    for (const auto& at : dm.atoms) {
      auto it = std::find_if(rest.begin(), rest.end(), [&](const sym::AtomP& r) { return r->key == at->key; });
      if (it == rest.end()) return std::nullopt;
      rest.erase(it);
    }
    sym::Mono rm;
    for (const auto& at : rest) rm = sym::mono_mul(rm, sym::Mono{{at}, at->key});
    sym::add_term(q, rm, c / dc);
  }
  return sym::from_poly(std::move(q));
}

std::string bound_text(int64_t v) { return std::to_string(v); }

}  // namespace

bool rel_holds(int64_t v, SymRel rel) {
  switch (rel) {
    case SymRel::Eq: return v == 0;
    case SymRel::Ne: return v != 0;
    case SymRel::Lt: return v < 0;
    case SymRel::Le: return v <= 0;
    case SymRel::Gt: return v > 0;
    case SymRel::Ge: return v >= 0;
  }
  return false;
}

const char* rel_str(SymRel rel) {
  switch (rel) {
    case SymRel::Eq: return "==";
    case SymRel::Ne: return "!=";
    case SymRel::Lt: return "<";
    case SymRel::Le: return "<=";
    case SymRel::Gt: return ">";
    case SymRel::Ge: return ">=";
  }
  return "?";
}

// ---- ranges under the bounds ------------------------------------------------------------------
namespace {
struct Ranger {
  const std::map<std::string, std::pair<int64_t, int64_t>>& bounds;
  Range of(const SymInt& x) const {
    if (x.is_constant()) return {x.as_int(), x.as_int()};
    Range r{0, 0};
    for (const auto& [m, c] : x.expr()->poly) {
      Range t{c, c};
      for (const auto& at : m.atoms) t = sym::rmul(t, atom(*at));
      r = sym::radd(r, t);
    }
    return r;
  }
  Range atom(const Atom& at) const {
    if (at.kind != Kind::Symbol) return sym::op_range(at.kind, of(at.a), of(at.b));
    auto it = bounds.find(at.name);
    if (it == bounds.end()) return {0, kInf};
    return {it->second.first, it->second.second == INT64_MAX ? kInf : Big(it->second.second)};
  }
};
}  // namespace

bool SymFacts::implied_nonneg(const SymInt& g) const {
  Ranger R{bounds_};
  if (R.of(g).lo >= 0) return true;
  for (const auto& f : nonneg_)
    if (R.of(g - f).lo >= 0) return true;  // g >= f >= 0
  for (const auto& f : zero_)
    if (R.of(g - f).lo >= 0 || R.of(g + f).lo >= 0) return true;
  return false;
}

bool SymFacts::divides(int64_t k, const SymInt& x) const {
  if (k == 1) return true;
  if (x.is_constant()) return x.as_int() % k == 0;
  auto known = [&](const SymInt& v, int64_t g) {
    for (const auto& [y, m] : divisible_)
      if (m % g == 0 && y.same_as(v)) return true;
    return false;
  };
  if (known(x, k)) return true;
  // Term by term: c * atoms is a multiple of k when k / gcd(c, k) divides one of its atoms.
  for (const auto& [m, c] : x.expr()->poly) {
    int64_t g = k / std::gcd(c, k);
    if (g == 1) continue;
    bool ok = false;
    for (const auto& at : m.atoms) ok = ok || known(atom_value(at), g);
    if (!ok) return false;
  }
  return true;
}

// ---- simplification -------------------------------------------------------------------------
SymInt SymFacts::simplify_once(const SymInt& e) const {
  if (e.is_constant()) return e;
  Ranger R{bounds_};
  auto atom = [&](const sym::AtomP& ap) -> SymInt {
    const Atom& at = *ap;
    if (at.kind == Kind::Symbol) {
      auto it = subst_.find(at.name);
      return it == subst_.end() ? atom_value(ap) : simplify_once(it->second);
    }
    SymInt a = simplify_once(at.a), b = simplify_once(at.b);
    if (at.kind == Kind::Max || at.kind == Kind::Min) {
      bool max = at.kind == Kind::Max;
      if (implied_nonneg(a - b)) return max ? a : b;
      if (implied_nonneg(b - a)) return max ? b : a;
      return max ? sym_max(a, b) : sym_min(a, b);
    }
    bool div = at.kind == Kind::FloorDiv;
    if (!b.is_constant() && R.of(b).lo > 0) {
      if (auto q = divide_by_term(a, b)) return div ? *q : SymInt(0);
      if (R.of(a).lo >= 0 && R.of(b - a).lo > 0) return div ? SymInt(0) : a;  // 0 <= a < b
    }
    SymInt r = div ? floordiv(a, b) : mod(a, b);
    int64_t c = 1;
    const Atom* ra = lone_atom(r, c);
    if (!ra || ra->kind != at.kind || !ra->b.is_constant() || ra->b.as_int() <= 0) return r;
    int64_t k = ra->b.as_int();
    Range x = R.of(ra->a);
    if (ra->kind == Kind::Mod) {
      if (divides(k, ra->a)) return 0;
      if (x.lo >= 0 && x.hi < k) return SymInt(c) * ra->a;
    } else if (!sym::is_inf(x.lo) && !sym::is_inf(x.hi) && sym::bfloor(x.lo, k) == sym::bfloor(x.hi, k)) {
      return SymInt(sym::cmul(c, static_cast<int64_t>(sym::bfloor(x.lo, k))));
    }
    return r;
  };
  SymInt out = 0;
  for (const auto& [m, c] : e.expr()->poly) {
    int64_t coef = c;
    SymInt prod = 1;
    for (const auto& ap : m.atoms) {
      SymInt v = atom(ap);
      // k * floor(x/k) == x when k divides x.
      int64_t one = 0;
      const Atom* fa = lone_atom(v, one);
      if (fa && one == 1 && fa->kind == Kind::FloorDiv && fa->b.is_constant()) {
        int64_t k = fa->b.as_int();
        if (k > 0 && coef % k == 0 && divides(k, fa->a)) {
          coef /= k;
          v = fa->a;
        }
      }
      prod = prod * v;
    }
    out = out + prod * SymInt(coef);
  }
  return out;
}

SymInt SymFacts::simplify(const SymInt& e) const {
  if (e.is_constant() || empty()) return e;
  SymInt cur = e;
  for (int i = 0; i < 4; ++i) {  // a rewrite can expose another (new terms meet); stop at a fixed point
    SymInt next = simplify_once(cur);
    if (next.same_as(cur)) break;
    cur = next;
  }
  return cur;
}

Shape SymFacts::simplify(const Shape& s) const {
  Shape out;
  out.reserve(s.size());
  for (const auto& d : s) out.push_back(simplify(d));
  return out;
}

// ---- decisions ------------------------------------------------------------------------------
std::optional<bool> SymFacts::decide(const SymInt& e, SymRel rel) const {
  SymInt s = simplify(e);
  if (auto v = s.maybe_int()) return rel_holds(*v, rel);
  auto pos = [&](const SymInt& g) { return implied_nonneg(g); };
  auto listed = [&](const std::vector<SymInt>& l) {
    for (const auto& f : l)
      if (f.same_as(s) || f.same_as(-s)) return true;
    return false;
  };
  switch (rel) {
    case SymRel::Ge:
      if (pos(s)) return true;
      if (pos(-s - 1)) return false;
      return std::nullopt;
    case SymRel::Gt:
      if (pos(s - 1)) return true;
      if (pos(-s)) return false;
      return std::nullopt;
    case SymRel::Le:
      if (pos(-s)) return true;
      if (pos(s - 1)) return false;
      return std::nullopt;
    case SymRel::Lt:
      if (pos(-s - 1)) return true;
      if (pos(s)) return false;
      return std::nullopt;
    case SymRel::Eq:
    case SymRel::Ne: {
      std::optional<bool> eq;
      if (listed(zero_) || (pos(s) && pos(-s)))
        eq = true;
      else if (listed(nonzero_) || pos(s - 1) || pos(-s - 1))
        eq = false;
      if (!eq) return std::nullopt;
      return rel == SymRel::Eq ? *eq : !*eq;
    }
  }
  return std::nullopt;
}

// ---- recording facts ------------------------------------------------------------------------
void SymFacts::add(const SymInt& e, SymRel rel) {
  SymInt s = simplify(e);
  if (s.is_constant()) return;  // already implied (the oracle answers from real sizes)
  switch (rel) {
    case SymRel::Eq: {
      if (solve(s)) return;
      int64_t c = 1;
      const Atom* at = lone_atom(s, c);
      if (at && at->kind == Kind::Mod && at->b.is_constant() && at->b.as_int() > 0) {
        divisible_.push_back({at->a, at->b.as_int()});
        if (const Atom* v = sym::single_atom(at->a); v && v->kind == Kind::Symbol) tighten(v->name);
        return;
      }
      zero_.push_back(s);
      return;
    }
    case SymRel::Ne: nonzero_.push_back(s); return;
    case SymRel::Ge: add_nonneg(s); return;
    case SymRel::Gt: add_nonneg(s - 1); return;
    case SymRel::Le: add_nonneg(-s); return;
    case SymRel::Lt: add_nonneg(-s - 1); return;
  }
}

void SymFacts::add_nonneg(const SymInt& g) {
  // c*v + k >= 0 for one symbol v: a bound of v.
  const auto poly = sym::poly_of(g);
  const Atom* v = nullptr;
  int64_t c = 0, k = 0;
  bool linear = true;
  for (const auto& [m, coef] : poly) {
    if (m.atoms.empty())
      k = coef;
    else if (m.atoms.size() == 1 && m.atoms[0]->kind == Kind::Symbol && !v)
      v = m.atoms[0].get(), c = coef;
    else
      linear = false;
  }
  if (!linear || !v) {
    nonneg_.push_back(g);
    return;
  }
  auto& b = bounds_.try_emplace(v->name, 0, INT64_MAX).first->second;
  if (c > 0)
    b.first = std::max<int64_t>(b.first, sym::py_div(-k + c - 1, c));  // v >= ceil(-k / c)
  else
    b.second = std::min<int64_t>(b.second, sym::py_div(k, -c));  // v <= floor(k / -c)
  tighten(v->name);
}

void SymFacts::tighten(const std::string& v) {
  // A symbol that is a multiple of k lies between the multiples of k within its bounds.
  auto b = bounds_.find(v);
  if (b == bounds_.end()) return;
  for (const auto& [x, k] : divisible_) {
    const Atom* at = sym::single_atom(x);
    if (!at || at->kind != Kind::Symbol || at->name != v) continue;
    auto& [lo, hi] = b->second;
    lo = sym::py_div(lo + k - 1, k) * k;
    if (hi != INT64_MAX) hi = sym::py_div(hi, k) * k;
  }
}

bool SymFacts::solve(const SymInt& s) {
  // s == 0 with a term +-v (v a symbol found nowhere else in s, every other symbol ranked before
  // v): v -> the rest. Also c*v + k == 0 with c dividing k.
  const auto poly = sym::poly_of(s);
  std::string best;
  int64_t best_c = 0;
  for (const auto& [m, c] : poly) {
    if (m.atoms.size() != 1 || m.atoms[0]->kind != Kind::Symbol) continue;
    const std::string& v = m.atoms[0]->name;
    SymInt rest = s - SymInt(c) * SymInt::symbol(v);
    bool ok = true;
    for (const auto& r : rest.symbols()) ok = ok && ranked_before(r, v);
    if (!ok) continue;
    if (c != 1 && c != -1 && !(rest.is_constant() && rest.as_int() % c == 0)) continue;
    if (best.empty() || ranked_before(best, v)) best = v, best_c = c;
  }
  if (best.empty()) return false;
  SymInt rest = s - SymInt(best_c) * SymInt::symbol(best);
  SymInt value = rest.is_constant() ? SymInt(-rest.as_int() / best_c) : (best_c == 1 ? -rest : rest);
  // The symbol's bounds become facts about its value; every stored fact is restated without it.
  auto b = bounds_.find(best);
  std::vector<SymInt> moved;
  if (b != bounds_.end()) {
    moved.push_back(value - SymInt(b->second.first));
    if (b->second.second != INT64_MAX) moved.push_back(SymInt(b->second.second) - value);
    bounds_.erase(b);
  }
  subst_[best] = value;
  for (auto& [name, v] : subst_) v = simplify(v);
  readd_all();
  for (const auto& g : moved) add(g, SymRel::Ge);
  return true;
}

void SymFacts::readd_all() {
  auto divisible = std::move(divisible_);
  auto zero = std::move(zero_), nonzero = std::move(nonzero_), nonneg = std::move(nonneg_);
  divisible_.clear();
  zero_.clear();
  nonzero_.clear();
  nonneg_.clear();
  for (const auto& [x, k] : divisible) add(mod(x, k), SymRel::Eq);
  for (const auto& f : zero) add(f, SymRel::Eq);
  for (const auto& f : nonzero) add(f, SymRel::Ne);
  for (const auto& f : nonneg) add(f, SymRel::Ge);
}

bool SymFacts::empty() const {
  return subst_.empty() && bounds_.empty() && divisible_.empty() && zero_.empty() && nonzero_.empty() &&
         nonneg_.empty();
}

std::string SymFacts::str() const {
  std::ostringstream os;
  for (const auto& [v, e] : subst_) os << v << " -> " << e.str() << "\n";
  for (const auto& [v, b] : bounds_) {
    if (b.second == INT64_MAX)
      os << v << " >= " << bound_text(b.first) << "\n";
    else
      os << bound_text(b.first) << " <= " << v << " <= " << bound_text(b.second) << "\n";
  }
  for (const auto& [x, k] : divisible_) os << "mod(" << x.str() << ", " << k << ") == 0\n";
  for (const auto& f : zero_) os << f.str() << " == 0\n";
  for (const auto& f : nonzero_) os << f.str() << " != 0\n";
  for (const auto& f : nonneg_) os << f.str() << " >= 0\n";
  return os.str();
}

}  // namespace kiln
