#include "jit/loop/compose.h"

#include <algorithm>

#include "runtime/core/error.h"

namespace kiln::jit {
namespace {

// Copies a pointwise kernel `src` into `K`: its buffers, params and float params after K's, its
// loop variables renumbered by `var`, its buffer b read and written as `buffer(b)`.
template <class BufferMap, class VarMap>
struct Splice {
  Kernel& K;
  const Kernel& src;
  BufferMap buffer;
  VarMap var;
  int np = K.num_params, nf = K.num_fparams;
  std::vector<ExprId> map = std::vector<ExprId>(src.exprs.size(), -1);

  Splice(Kernel& k, const Kernel& s, BufferMap b, VarMap v) : K(k), src(s), buffer(b), var(v) {
    KILN_CHECK(s.accs.empty(), "jit: only kernels without accumulators are spliced into others");
    for (size_t i = 0; i < src.exprs.size(); ++i) {
      Expr e = src.exprs[i];
      for (ExprId* x : {&e.a, &e.b, &e.c})
        if (*x >= 0) *x = map[static_cast<size_t>(*x)];
      switch (e.kind) {
        case Expr::Kind::Load: e.i = buffer(e.i); break;
        case Expr::Kind::Param: e.i += np; break;
        case Expr::Kind::FParam: e.i += nf; break;
        case Expr::Kind::Var: e.i = var(e.i); break;
        default: break;
      }
      map[i] = K.add(e);
    }
    K.num_params += src.num_params;
    K.num_fparams += src.num_fparams;
  }
  Stmt copy(const Stmt& s) const {
    KILN_CHECK(s.kind == Stmt::Kind::Loop || s.kind == Stmt::Kind::Store, "jit: a spliced kernel with accumulators");
    Stmt t = s;
    for (ExprId* x : {&t.lo, &t.hi, &t.index, &t.value})
      if (*x >= 0) *x = map[static_cast<size_t>(*x)];
    if (t.kind == Stmt::Kind::Loop) t.var = static_cast<int>(var(t.var));
    if (t.kind == Stmt::Kind::Store) t.buffer = static_cast<int>(buffer(t.buffer));
    t.body.clear();
    for (const Stmt& b : s.body) t.body.push_back(copy(b));
    return t;
  }
  std::vector<Stmt> body() const {
    std::vector<Stmt> out;
    for (const Stmt& s : src.body) out.push_back(copy(s));
    return out;
  }
};
template <class B, class V>
Splice(Kernel&, const Kernel&, B, V) -> Splice<B, V>;

}  // namespace

Kernel combine_with_epilogue(const Kernel& c, const Kernel& epi, int epi_in) {
  KILN_CHECK(c.buffers.size() == 2 && epi.accs.empty() && epi_in >= 0 && epi_in < static_cast<int>(epi.buffers.size()),
             "jit: combine_with_epilogue takes a value combine and an epilogue without reductions");
  Kernel K = c;
  const int nb = static_cast<int>(c.buffers.size()), out = nb - 1, nv = c.num_vars;
  // Epilogue buffers follow the combine's; its input `epi_in` reads the combine's output itself
  // (one pointer: the store and the load stay in order).
  Splice sp(
      K, epi, [&](int64_t b) { return b == epi_in ? out : b + nb; },
      [&](int64_t v) { return v == 0 ? 0 : v + nv - 1; });  // one parallel index (extent 1)
  for (const BufferSpec& b : epi.buffers) K.buffers.push_back(b);
  K.num_vars = nv + std::max(epi.num_vars - 1, 0);
  for (Stmt& s : sp.body()) K.body.push_back(std::move(s));
  K.name = c.name + "_then_" + epi.name;
  return K;
}

bool horizontal_member(const Lowered& L) {
  const Kernel& k = L.kernel;
  return !L.split && !L.column && !L.split_columns && k.accs.empty() && !k.long_indices && !k.columns &&
         k.row_cache == 0 && k.parallel_extent >= 0;
}

Kernel horizontal_kernel(const std::vector<const Kernel*>& members) {
  KILN_CHECK(!members.empty(), "jit: a horizontal kernel of no kernels");
  Kernel K;
  K.name = "horizontal";
  ExprId off = K.iconst(0);
  for (const Kernel* m : members) {
    // Member var 0 (its parallel index) becomes a loop of at most one iteration at p - off;
    // its other loops follow the variables taken so far.
    const int w = K.num_vars, base = w + 1;
    const int64_t nb = static_cast<int64_t>(K.buffers.size());
    Splice sp(
        K, *m, [nb](int64_t b) { return b + nb; }, [w, base](int64_t v) { return v == 0 ? w : base + v - 1; });
    K.num_vars = base + m->num_vars - 1;
    for (const BufferSpec& b : m->buffers) K.buffers.push_back(b);
    const ExprId extent = sp.map[static_cast<size_t>(m->parallel_extent)];
    const ExprId q = K.iop(Expr::Kind::ISub, K.var(0), off);
    // [max(q, 0), min(q + 1, extent)): one iteration exactly when 0 <= q < extent.
    const ExprId lo = K.iop(Expr::Kind::ISub, q, K.iop(Expr::Kind::IMin, q, K.iconst(0)));
    const ExprId hi = K.iop(Expr::Kind::IMin, K.iop(Expr::Kind::IAdd, q, K.iconst(1)), extent);
    Stmt loop{Stmt::Kind::Loop};
    loop.var = w;
    loop.lo = lo;
    loop.hi = hi;
    loop.body = sp.body();
    K.body.push_back(std::move(loop));
    off = K.iop(Expr::Kind::IAdd, off, extent);
    K.member_ends.push_back(off);
  }
  K.parallel_extent = off;
  return K;
}

}  // namespace kiln::jit
