#include "jit/loop/loop_ir.h"

#include <sstream>

namespace kiln::jit {

ExprId Kernel::add(const Expr& e) {
  // Share identical pure expressions (loads included: kernels never read what they write).
  for (size_t i = exprs.size(); i-- > 0 && exprs.size() - i < 64;) {
    const Expr& x = exprs[i];
    if (x.kind == e.kind && x.dtype == e.dtype && x.op == e.op && x.a == e.a && x.b == e.b && x.c == e.c &&
        x.i == e.i && x.f == e.f)
      return static_cast<ExprId>(i);
  }
  exprs.push_back(e);
  return static_cast<ExprId>(exprs.size() - 1);
}

ExprId Kernel::iconst(int64_t v) {
  // One expression per constant in the whole kernel (add() only looks at recent ones): index
  // vectors built from the same constants are then equal, so lowering's (node, index) memo
  // shares a value read at a constant index instead of emitting it again (nested small sums
  // otherwise multiply).
  auto it = iconsts.find(v);
  if (it != iconsts.end() && static_cast<size_t>(it->second) < exprs.size() &&
      exprs[static_cast<size_t>(it->second)].kind == Expr::Kind::IConst &&
      exprs[static_cast<size_t>(it->second)].i == v)
    return it->second;
  Expr e{Expr::Kind::IConst};
  e.i = v;
  return iconsts[v] = add(e);
}
ExprId Kernel::param(int k) {
  Expr e{Expr::Kind::Param};
  e.i = k;
  return add(e);
}
ExprId Kernel::var(int k) {
  Expr e{Expr::Kind::Var};
  e.i = k;
  return add(e);
}
ExprId Kernel::iop(Expr::Kind k, ExprId a, ExprId b) {
  const Expr& x = exprs[a];
  const Expr& y = exprs[b];
  // Fold the index arithmetic that lowering produces all the time.
  if (x.kind == Expr::Kind::IConst && y.kind == Expr::Kind::IConst) {
    int64_t u = x.i, v = y.i;
    switch (k) {
      case Expr::Kind::IAdd: return iconst(u + v);
      case Expr::Kind::ISub: return iconst(u - v);
      case Expr::Kind::IMul: return iconst(u * v);
      case Expr::Kind::IDiv:
        if (v > 0 && u >= 0) return iconst(u / v);
        break;
      case Expr::Kind::IMod:
        if (v > 0 && u >= 0) return iconst(u % v);
        break;
      case Expr::Kind::IMin: return iconst(u < v ? u : v);
      default: break;
    }
  }
  auto is = [&](const Expr& z, int64_t v) { return z.kind == Expr::Kind::IConst && z.i == v; };
  if (k == Expr::Kind::IAdd && is(x, 0)) return b;
  if ((k == Expr::Kind::IAdd || k == Expr::Kind::ISub) && is(y, 0)) return a;
  if (k == Expr::Kind::IMul && (is(x, 0) || is(y, 0))) return iconst(0);
  if (k == Expr::Kind::IMul && is(x, 1)) return b;
  if ((k == Expr::Kind::IMul || k == Expr::Kind::IDiv) && is(y, 1)) return a;
  if (k == Expr::Kind::IMod && is(y, 1)) return iconst(0);
  // (x / c) * c + x % c == x: a flat index split into (row, col) and linearized again.
  if (k == Expr::Kind::IAdd && x.kind == Expr::Kind::IMul && y.kind == Expr::Kind::IMod) {
    const Expr& q = exprs[x.a];
    if (q.kind == Expr::Kind::IDiv && q.b == x.b && y.b == x.b && q.a == y.a) return y.a;
  }
  Expr e{k};
  e.a = a;
  e.b = b;
  return add(e);
}

namespace {
const char* kind_name(Expr::Kind k) {
  switch (k) {
    case Expr::Kind::IConst: return "const";
    case Expr::Kind::FConst: return "fconst";
    case Expr::Kind::Param: return "param";
    case Expr::Kind::FParam: return "fparam";
    case Expr::Kind::Var: return "var";
    case Expr::Kind::IAdd: return "add";
    case Expr::Kind::ISub: return "sub";
    case Expr::Kind::IMul: return "mul";
    case Expr::Kind::IDiv: return "div";
    case Expr::Kind::IMod: return "mod";
    case Expr::Kind::IMin: return "min";
    case Expr::Kind::Load: return "load";
    case Expr::Kind::Unary: return "unary";
    case Expr::Kind::Binary: return "binary";
    case Expr::Kind::Where: return "where";
    case Expr::Kind::Cast: return "cast";
    case Expr::Kind::Acc: return "acc";
    case Expr::Kind::AccIndex: return "acc_index";
  }
  return "?";
}

void print_stmts(std::ostringstream& os, const std::vector<Stmt>& ss, int depth) {
  std::string pad(2 * depth, ' ');
  for (const Stmt& s : ss) {
    switch (s.kind) {
      case Stmt::Kind::Loop:
        os << pad << "for v" << s.var << " in [e" << s.lo << ", e" << s.hi << "):\n";
        print_stmts(os, s.body, depth + 1);
        break;
      case Stmt::Kind::Store: os << pad << "buf" << s.buffer << "[e" << s.index << "] = e" << s.value << "\n"; break;
      case Stmt::Kind::AccInit: os << pad << "acc" << s.acc << " = identity\n"; break;
      case Stmt::Kind::AccUpdate:
        os << pad << "acc" << s.acc << " <- e" << s.value << " (at e" << s.index << ")\n";
        break;
      case Stmt::Kind::AccStore:
        os << pad << "buf" << s.buffer << "[e" << s.index << "] = acc" << s.acc << (s.value ? ".index" : "") << "\n";
        break;
    }
  }
}
}  // namespace

std::string Kernel::str() const {
  std::ostringstream os;
  os << "kernel " << name << " (" << buffers.size() << " buffers, " << num_params << " int params, " << num_fparams
     << " float params, " << accs.size() << " accumulators)\n";
  for (size_t i = 0; i < exprs.size(); ++i) {
    const Expr& e = exprs[i];
    os << "  e" << i << " = " << kind_name(e.kind);
    if (e.kind == Expr::Kind::Unary || e.kind == Expr::Kind::Binary || e.kind == Expr::Kind::Where)
      os << "." << op_name(e.op);
    os << ":" << dtype_name(e.dtype);
    if (e.a >= 0) os << " e" << e.a;
    if (e.b >= 0) os << " e" << e.b;
    if (e.c >= 0) os << " e" << e.c;
    if (e.kind == Expr::Kind::IConst || e.kind == Expr::Kind::Param || e.kind == Expr::Kind::FParam ||
        e.kind == Expr::Kind::Var || e.kind == Expr::Kind::Load || e.kind == Expr::Kind::Acc)
      os << " #" << e.i;
    os << "\n";
  }
  os << "parallel v0 in [0, e" << parallel_extent << "):\n";
  print_stmts(os, body, 1);
  return os.str();
}

std::vector<char> reaches(const Kernel& k, const std::function<bool(ExprId)>& leaf) {
  // Operands precede their users in the arena (add() takes existing ids), so one pass in id
  // order sees every operand's answer first.
  std::vector<char> r(k.exprs.size(), 0);
  for (size_t i = 0; i < k.exprs.size(); ++i) {
    const Expr& e = k.exprs[i];
    bool hit = leaf(static_cast<ExprId>(i));
    for (ExprId x : {e.a, e.b, e.c}) hit = hit || (x >= 0 && r[static_cast<size_t>(x)]);
    r[i] = hit;
  }
  return r;
}

}  // namespace kiln::jit
