// SymFacts: what a compile() trace established about its size symbols (the size relations its
// guards check), and the simplification of size expressions those facts allow.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/ir/symint.h"

namespace kiln {

class SymFacts {
 public:
  // Records that `e rel 0` holds. An equality that solves for a symbol becomes a substitution
  // of the later-ranked symbol ("s1 -> s0", "s0 -> 8"); `mod(x, k) == 0` a divisibility fact;
  // `c*s + k >= 0` (and <, <=, >) a bound of s; anything else is kept as a relation.
  void add(const SymInt& e, SymRel rel);
  // Decides `e rel 0` from the facts alone; nullopt when they do not decide it.
  std::optional<bool> decide(const SymInt& e, SymRel rel) const;
  // `e` rewritten with the facts: substituted symbols replaced, mod/floordiv folded where
  // divisibility or bounds decide them (k*floor(x/k) -> x when k divides x), max/min picked
  // where bounds order the operands, division by a positive monomial that divides exactly.
  // Equal to `e` for every assignment of the symbols that satisfies the facts.
  SymInt simplify(const SymInt& e) const;
  // simplify() of every dimension.
  Shape simplify(const Shape& s) const;
  // Whether nothing is known.
  bool empty() const;
  // The facts in words, one per line ("s1 -> s0", "mod(s0, 4) == 0", "s0 >= 2").
  std::string str() const;

 private:
  bool solve(const SymInt& s);
  void add_nonneg(const SymInt& g);
  void tighten(const std::string& v);
  void readd_all();
  SymInt simplify_once(const SymInt& e) const;
  bool implied_nonneg(const SymInt& g) const;
  bool divides(int64_t k, const SymInt& x) const;

  std::map<std::string, SymInt> subst_;  // symbol -> replacement (earlier symbols or a constant)
  std::map<std::string, std::pair<int64_t, int64_t>> bounds_;  // symbol -> [lo, hi] (hi INT64_MAX: none)
  std::vector<std::pair<SymInt, int64_t>> divisible_;  // (x, k): mod(x, k) == 0
  std::vector<SymInt> zero_, nonzero_, nonneg_;  // other facts: == 0, != 0, >= 0
};

// Whether `v rel 0` holds.
bool rel_holds(int64_t v, SymRel rel);
// The relation as an operator: "==", "!=", "<", "<=", ">", ">=".
const char* rel_str(SymRel rel);

}  // namespace kiln
