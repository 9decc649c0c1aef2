#include "jit/loop/row_cache.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>
#include <sstream>
#include <string>

namespace kiln::jit {

DType row_cache_slot_type(DType t) {
  return t == DType::Bool ? DType::Int32 : (t == DType::Float16 || t == DType::BFloat16) ? DType::Float32 : t;
}

namespace {

bool has_loop(const std::vector<Stmt>& ss) {
  for (const Stmt& s : ss)
    if (s.kind == Stmt::Kind::Loop) return true;
  return false;
}

bool worth_caching(const Expr& x, bool cache_loads) {
  switch (x.kind) {
    case Expr::Kind::Load: return cache_loads;
    case Expr::Kind::Unary:
    case Expr::Kind::Binary:
    case Expr::Kind::Where:
    case Expr::Kind::Cast: return true;
    default: return false;  // index arithmetic, constants, accumulators: cheaper than a read back
  }
}

struct Planner {
  const Kernel& k;
  bool cache_loads;
  // The structure of expression `e` with loop variable `var` written as V (equal strings: the
  // same value in every loop over the same range), memoized per (e, var).
  std::map<std::pair<ExprId, int>, std::string> canon_memo;
  const std::string& canon(ExprId e, int var) {
    auto key = std::make_pair(e, var);
    auto it = canon_memo.find(key);
    if (it != canon_memo.end()) return it->second;
    const Expr& x = k.exprs[e];
    std::ostringstream os;
    if (x.kind == Expr::Kind::Var && x.i == var) {
      os << "V";
    } else {
      uint64_t fbits;
      std::memcpy(&fbits, &x.f, 8);
      os << "(" << static_cast<int>(x.kind) << "," << static_cast<int>(x.op) << "," << static_cast<int>(x.dtype) << ","
         << x.i << "," << fbits;
      for (ExprId c : {x.a, x.b, x.c})
        if (c >= 0) os << " " << canon(c, var);
      os << ")";
    }
    return canon_memo[key] = os.str();
  }
  bool varies(ExprId e, int var) { return canon(e, var).find('V') != std::string::npos; }

  RowCachePlan plan(int64_t budget) {
    RowCachePlan p;
    struct Found {
      size_t loop;
      ExprId id;
    };
    std::vector<const Stmt*> loops;
    for (const Stmt& s : k.body)
      if (s.kind == Stmt::Kind::Loop && !has_loop(s.body)) loops.push_back(&s);
    struct Candidate {
      size_t writer;
      ExprId wid;
      std::vector<std::pair<size_t, ExprId>> readers;
    };
    std::vector<Candidate> cands;
    std::unordered_map<std::string, size_t> cand_of;  // canon -> candidate
    std::unordered_map<std::string, Found> seen;  // canon -> first loop computing it
    for (size_t li = 0; li < loops.size(); ++li) {
      const Stmt& L = *loops[li];
      const std::string range = canon(L.lo, L.var) + "|" + canon(L.hi, L.var);
      std::vector<ExprId> computed;
      std::set<ExprId> visited;
      std::function<void(ExprId)> walk = [&](ExprId e) {
        if (e < 0 || !visited.insert(e).second) return;
        const Expr& x = k.exprs[e];
        if (worth_caching(x, cache_loads) && varies(e, L.var)) {
          const std::string key = range + "#" + canon(e, L.var);
          auto f = seen.find(key);
          if (f != seen.end() && f->second.loop < li) {
            auto [it, fresh] = cand_of.emplace(key, cands.size());
            if (fresh) cands.push_back({f->second.loop, f->second.id, {}});
            cands[it->second].readers.push_back({li, e});
            return;  // read back: nothing under it is computed here
          }
          computed.push_back(e);
        }
        walk(x.a);
        walk(x.b);
        walk(x.c);
      };
      for (const Stmt& s : L.body)
        if (s.kind == Stmt::Kind::AccUpdate || s.kind == Stmt::Kind::Store) walk(s.value);
      for (ExprId e : computed) seen.emplace(range + "#" + canon(e, L.var), Found{li, e});
    }
    // Slots by liveness in writer order (a slot is free for a writer once its last reader loop
    // is earlier), within the budget. A slot also serves a value written by the loop that last
    // reads it when that value is computed from the read one (the read, kept in a register,
    // comes first in the iteration): layer_norm -> gelu -> softmax keeps x, x - mean, gelu(.)
    // and exp(.) in one slot in turn. Every read of the slot in that loop must feed the value
    // (a read that does not may come after the write in the iteration, and get the new value).
    std::stable_sort(cands.begin(), cands.end(),
                     [](const Candidate& a, const Candidate& b) { return a.writer < b.writer; });
    std::vector<size_t> free_after;  // per slot: last reader loop
    std::vector<std::vector<ExprId>> last_reads;  // per slot: what that loop reads from it
    // What each loop reads back: the evaluation of an expression stops there.
    std::vector<std::set<ExprId>> reads_in(loops.size());
    for (const Candidate& c : cands)
      for (auto& r : c.readers) reads_in[r.first].insert(r.second);
    // Whether computing `e` in loop `li` evaluates `r` (operands read back from a slot are not
    // evaluated: what lies under them is not read there).
    auto uses = [&](ExprId e, ExprId r, size_t li) {
      std::set<ExprId> seen_here;
      std::vector<ExprId> stack{e};
      while (!stack.empty()) {
        const ExprId x = stack.back();
        stack.pop_back();
        if (x < 0 || !seen_here.insert(x).second) continue;
        if (x == r) return true;
        if (x != e && reads_in[li].count(x)) continue;
        const Expr& ex = k.exprs[x];
        stack.insert(stack.end(), {ex.a, ex.b, ex.c});
      }
      return false;
    };
    for (const Candidate& c : cands) {
      const DType t = row_cache_slot_type(k.exprs[c.wid].dtype);
      size_t last = 0;
      for (auto& r : c.readers) last = std::max(last, r.first);
      std::vector<ExprId> last_ids;
      for (auto& r : c.readers)
        if (r.first == last) last_ids.push_back(r.second);
      auto feeds = [&](size_t sl) {
        return std::all_of(last_reads[sl].begin(), last_reads[sl].end(),
                           [&](ExprId r) { return uses(c.wid, r, c.writer); });
      };
      int slot = -1;
      for (size_t sl = 0; sl < p.slots.size() && slot < 0; ++sl)
        if (p.slots[sl] == t && (free_after[sl] < c.writer || (free_after[sl] == c.writer && feeds(sl))))
          slot = static_cast<int>(sl);
      if (slot < 0) {
        const int64_t bytes = k.row_cache * static_cast<int64_t>(itemsize(t));
        if (p.region + bytes > budget) continue;  // recomputed instead
        slot = static_cast<int>(p.slots.size());
        p.slots.push_back(t);
        p.slot_offset.push_back(p.region);
        p.region += bytes;
        free_after.push_back(0);
        last_reads.emplace_back();
      }
      free_after[static_cast<size_t>(slot)] = last;
      last_reads[static_cast<size_t>(slot)] = last_ids;
      p.loops[loops[c.writer]].writes[c.wid] = slot;
      for (auto& r : c.readers) p.loops[loops[r.first]].reads[r.second] = slot;
    }
    return p;
  }
};

}  // namespace

RowCachePlan plan_row_cache(const Kernel& k, int64_t budget, bool cache_loads) {
  if (k.row_cache <= 0) return {};
  return Planner{k, cache_loads, {}}.plan(budget);
}

}  // namespace kiln::jit
