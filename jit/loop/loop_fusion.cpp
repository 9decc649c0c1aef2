#include "jit/loop/loop_fusion.h"

#include <algorithm>
#include <set>
#include <unordered_map>

namespace kiln::jit {
namespace {

// Buffers a statement reads and writes; `other`: it reads or updates accumulators (never moved).
struct Effects {
  std::set<int> reads, writes;
  bool other = false;
  void add(const Effects& e) {
    reads.insert(e.reads.begin(), e.reads.end());
    writes.insert(e.writes.begin(), e.writes.end());
    other = other || e.other;
  }
};

bool disjoint(const std::set<int>& a, const std::set<int>& b) {
  for (int x : a)
    if (b.count(x)) return false;
  return true;
}

// Two statements may swap (or share a loop) when neither writes what the other touches.
bool independent(const Effects& a, const Effects& b) {
  return !a.other && !b.other && disjoint(a.writes, b.reads) && disjoint(a.writes, b.writes) &&
         disjoint(b.writes, a.reads);
}

struct Fuser {
  Kernel& k;
  int merged = 0;

  void expr_effects(ExprId root, Effects& ef) const {
    std::vector<ExprId> stack{root};
    std::set<ExprId> seen;
    while (!stack.empty()) {
      const ExprId e = stack.back();
      stack.pop_back();
      if (e < 0 || !seen.insert(e).second) continue;
      const Expr& x = k.exprs[static_cast<size_t>(e)];
      if (x.kind == Expr::Kind::Load) ef.reads.insert(static_cast<int>(x.i));
      if (x.kind == Expr::Kind::Acc || x.kind == Expr::Kind::AccIndex) ef.other = true;
      stack.push_back(x.a);
      stack.push_back(x.b);
      stack.push_back(x.c);
    }
  }

  void effects(const Stmt& s, Effects& ef) const {
    switch (s.kind) {
      case Stmt::Kind::Loop:
        expr_effects(s.lo, ef);
        expr_effects(s.hi, ef);
        for (const Stmt& c : s.body) effects(c, ef);
        break;
      case Stmt::Kind::Store:
        ef.writes.insert(s.buffer);
        expr_effects(s.index, ef);
        expr_effects(s.value, ef);
        break;
      default: ef.other = true; break;
    }
  }

  // A loop whose body (at any depth) only loops and stores.
  static bool store_only(const Stmt& s) {
    if (s.kind == Stmt::Kind::Store) return true;
    if (s.kind != Stmt::Kind::Loop) return false;
    return std::all_of(s.body.begin(), s.body.end(), store_only);
  }

  // `e` with loop variable `from` read as variable `to`.
  ExprId rename(ExprId e, int from, int to, std::unordered_map<ExprId, ExprId>& memo) {
    if (e < 0) return e;
    if (auto it = memo.find(e); it != memo.end()) return it->second;
    Expr x = k.exprs[static_cast<size_t>(e)];  // a copy: add() may grow the arena
    ExprId out = e;
    if (x.kind == Expr::Kind::Var) {
      if (x.i == from) out = k.var(to);
    } else {
      const ExprId a = rename(x.a, from, to, memo), b = rename(x.b, from, to, memo), c = rename(x.c, from, to, memo);
      if (a != x.a || b != x.b || c != x.c) {
        x.a = a;
        x.b = b;
        x.c = c;
        out = k.add(x);
      }
    }
    return memo[e] = out;
  }

  void rename(Stmt& s, int from, int to, std::unordered_map<ExprId, ExprId>& memo) {
    for (ExprId* e : {&s.lo, &s.hi, &s.index, &s.value}) *e = rename(*e, from, to, memo);
    for (Stmt& c : s.body) rename(c, from, to, memo);
  }

  void fuse(std::vector<Stmt>& body) {
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i].kind != Stmt::Kind::Loop || !store_only(body[i])) continue;
      Effects ei;
      effects(body[i], ei);
      std::vector<size_t> merge, hoist;
      size_t end = i + 1;
      for (; end < body.size(); ++end) {
        Effects ej;
        effects(body[end], ej);
        if (!independent(ei, ej)) break;
        const Stmt& s = body[end];
        if (s.kind == Stmt::Kind::Loop && s.lo == body[i].lo && s.hi == body[i].hi && store_only(s)) {
          merge.push_back(end);
          ei.add(ej);
        } else {
          hoist.push_back(end);
        }
      }
      if (merge.empty()) continue;
      Stmt L = std::move(body[i]);
      for (size_t j : merge) {
        Stmt& M = body[j];
        std::unordered_map<ExprId, ExprId> memo;
        if (M.var != L.var)
          for (Stmt& c : M.body) rename(c, M.var, L.var, memo);
        for (Stmt& c : M.body) L.body.push_back(std::move(c));
        ++merged;
      }
      std::vector<Stmt> out;
      out.reserve(body.size());
      for (size_t j = 0; j < i; ++j) out.push_back(std::move(body[j]));
      for (size_t j : hoist) out.push_back(std::move(body[j]));
      const size_t at = out.size();
      out.push_back(std::move(L));
      for (size_t j = end; j < body.size(); ++j) out.push_back(std::move(body[j]));
      body = std::move(out);
      i = at;
    }
    for (Stmt& s : body)
      if (s.kind == Stmt::Kind::Loop) fuse(s.body);
  }
};

}  // namespace

int fuse_sibling_loops(Kernel& k) {
  Fuser f{k};
  for (int before = -1; f.merged != before;) {  // a merge can make other loops neighbours
    before = f.merged;
    f.fuse(k.body);
  }
  return f.merged;
}

}  // namespace kiln::jit
