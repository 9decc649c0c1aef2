#include "jit/loop/lower.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <map>
#include <sstream>
#include <unordered_map>

#include "jit/loop/loop_fusion.h"
#include "runtime/core/error.h"

namespace kiln::jit {
namespace {

// Host column chunks (Lowered::column_chunks): rows a chunk takes at least, and chunks at most.
constexpr int64_t kColumnChunkRows = 256;
constexpr int64_t kColumnChunks = 64;

// The last domain dim when it is at most the target's small_inner (a compile-time constant).
std::optional<int64_t> small_inner(const Shape& d, const Target& t) {
  if (d.empty()) return std::nullopt;
  auto v = d.back().maybe_int();
  if (v && *v <= t.small_inner) return v;
  return std::nullopt;
}

// Whether a pointwise group over `d` runs tiles of its last dim (rows x tiles parallel indices,
// a loop over the tile) rather than one element per parallel index.
bool row_tiled(const Shape& d, const Target& t) {
  if (d.empty() || t.tile <= 1 || small_inner(d, t) || is_one(d.back())) return false;
  if (t.tile_min_inner <= 0) return true;
  const auto v = d.back().maybe_int();
  if (!v || *v < t.tile_min_inner || d.size() < 2) return false;
  int64_t tiles = (*v + t.tile - 1) / t.tile;  // times the rows, where they are constants
  for (size_t i = 0; i + 1 < d.size(); ++i) {
    const auto r = d[i].maybe_int();
    if (!r) return true;  // a symbolic batch: rows enough
    tiles *= *r;
  }
  return tiles >= t.tile_min_parallel;
}

char stride_class(const SymInt& size, const SymInt& stride) {
  if (is_one(size)) return 'u';
  auto s = stride.maybe_int();
  if (s && *s == 0) return '0';
  if (s && *s == 1) return '1';
  return 'g';
}

// A general stride up to t.small_inner that a dense suffix implies (the 3 of [N, 3] points,
// an RGB pixel's row): a compile-time constant in the kernel (and its key), so loops over such
// rows vectorize as interleaved loads instead of running scalar for an unknown stride. Only
// strides equal to the product of the later sizes: an input copied densely (a compiled
// program's argument at another offset) keeps them.
std::optional<int64_t> small_stride(const Node& n, size_t d, const Target& t) {
  auto s = n.strides[d].maybe_int();
  if (is_one(n.shape[d]) || !s || *s <= 1 || *s > t.small_inner) return std::nullopt;
  int64_t suffix = 1;
  for (size_t e = d + 1; e < n.shape.size(); ++e) {
    auto v = n.shape[e].maybe_int();
    if (!v) return std::nullopt;
    suffix *= *v;
  }
  if (suffix != *s) return std::nullopt;
  return s;
}

// Whether `g` reduces leading dims (a prefix, the last dim kept) over at least
// t.column_split_rows rows, with no arg reduction and nothing in the group reading a
// reduction's value: such a group runs as per-(row chunk, column) partials.
bool column_split_fits(const Group& g, const Target& t) {
  const size_t n = g.domain.size();
  if (t.column_split_rows <= 0 || g.split || n < 2 || g.reduce_dims.empty()) return false;
  std::vector<bool> red(n, false);
  for (int64_t d : g.reduce_dims) red[static_cast<size_t>(d)] = true;
  int64_t rows = 1;
  for (size_t d = 0; d < n; ++d) {
    if (red[d] != (d < g.reduce_dims.size())) return false;  // not a prefix
    if (red[d]) {
      auto v = g.domain[d].maybe_int();
      if (!v) return false;
      rows *= *v;
    }
  }
  if (rows < t.column_split_rows) return false;
  for (const Node* x : g.nodes) {
    if (classify(*x) == NodeClass::Reduction && is_arg_reduction(x->op)) return false;
    for (const auto& in : x->inputs)
      if (classify(*in) == NodeClass::Reduction && std::find(g.nodes.begin(), g.nodes.end(), in.get()) != g.nodes.end())
        return false;
  }
  return true;
}

// How the index of a reshape `n` of `in` maps to `in`'s (row-major): directly where the shapes
// differ only by size-1 dims; otherwise the leading and trailing dims they share map directly
// and only the dims between go through a flat index. Sizes compare by value, so the mapping is
// part of the kernel's key (group_key).
struct ReshapeMap {
  bool direct = false;
  size_t lead = 0, trail = 0;
};
ReshapeMap reshape_map(const Node& n, const Node& in) {
  ReshapeMap m;
  std::vector<size_t> a, b;
  for (size_t d = 0; d < n.shape.size(); ++d)
    if (!is_one(n.shape[d])) a.push_back(d);
  for (size_t d = 0; d < in.shape.size(); ++d)
    if (!is_one(in.shape[d])) b.push_back(d);
  m.direct = a.size() == b.size();
  for (size_t j = 0; m.direct && j < a.size(); ++j) m.direct = sym_eq(n.shape[a[j]], in.shape[b[j]]).value_or(false);
  if (m.direct) return m;
  const size_t na = n.shape.size(), nb = in.shape.size();
  auto same = [&](size_t i, size_t j) { return sym_eq(n.shape[i], in.shape[j]).value_or(false); };
  while (m.lead < na && m.lead < nb && same(m.lead, m.lead)) ++m.lead;
  while (m.lead + m.trail < na && m.lead + m.trail < nb && same(na - 1 - m.trail, nb - 1 - m.trail)) ++m.trail;
  return m;
}

// The domain dim that dim `d` of `n` (right-aligned) equals by value, or -1. Lowering reads such
// sizes from the domain's parameter (one parameter: a row split into (B, T) and linearized again
// folds back to the row), so the equalities are part of the kernel's key (aligned_key).
int domain_dim(const Node& n, size_t d, const Shape& domain) {
  const size_t r = n.shape.size(), m = domain.size();
  if (is_one(n.shape[d]) || r > m) return -1;
  const size_t k = d + (m - r);
  return sym_eq(n.shape[d], domain[k]).value_or(false) ? static_cast<int>(k) : -1;
}
std::string aligned_key(const Node& n, const Shape& domain) {
  std::string k;
  bool all = true;
  for (size_t d = 0; d < n.shape.size(); ++d) {
    if (is_one(n.shape[d])) continue;
    const bool a = domain_dim(n, d, domain) >= 0;
    all = all && a;
    k += a ? 'a' : 'x';
  }
  return all ? "" : k;
}

// An input laid out exactly like the iteration domain (same sizes, row-major): it is read at
// the flat domain index, so contiguous loops see unit-stride loads.
bool dense_in_domain(const Node* n, const Shape& domain) {
  return !domain.empty() && same_shape(n->shape, domain) && is_contiguous_layout(n->shape, n->strides);
}

}  // namespace

bool row_cache_fits(const Group& g, const Target& t) {
  if (t.row_cache <= 0 || g.reduce_dims.empty() || g.split || g.domain.empty()) return false;
  int64_t reduced = 1;
  for (int64_t d : g.reduce_dims) {
    auto v = g.domain[static_cast<size_t>(d)].maybe_int();
    if (!v) return false;
    reduced *= *v;
  }
  auto last = g.domain.back().maybe_int();
  return last && *last <= t.row_cache && reduced <= t.row_cache;
}

std::vector<Node*> canonical_inputs(const Group& g) {
  std::unordered_map<const Node*, bool> inside;
  for (Node* n : g.nodes) inside[n] = true;
  std::vector<Node*> out;
  for (Node* n : g.nodes)
    for (auto& in : n->inputs)
      if (!inside.count(in.get()) && std::find(out.begin(), out.end(), in.get()) == out.end()) out.push_back(in.get());
  return out;
}

std::string group_key(const Group& g, const Target& t) {
  std::ostringstream k;
  std::unordered_map<const Node*, int> id;
  std::vector<Node*> ins = canonical_inputs(g);
  for (size_t i = 0; i < ins.size(); ++i) id[ins[i]] = -static_cast<int>(i) - 1;
  for (size_t i = 0; i < g.nodes.size(); ++i) id[g.nodes[i]] = static_cast<int>(i);
  k << "D" << g.domain.size() << ":";
  for (const auto& s : g.domain) k << (is_one(s) ? 'u' : 's');
  if (auto si = small_inner(g.domain, t)) k << "c" << *si;
  if (t.tile_min_inner > 0 && g.reduce_dims.empty() && row_tiled(g.domain, t)) k << "T";
  k << "|R";
  for (int64_t d : g.reduce_dims) k << d << ",";
  k << (g.split ? "S" : "") << (row_cache_fits(g, t) ? "C" : "") << (column_split_fits(g, t) ? "K" : "") << "|";
  for (size_t i = 0; i < ins.size(); ++i) {
    const Node* n = ins[i];
    k << "i" << dtype_name(n->dtype)[0] << static_cast<int>(n->dtype) << ":";
    for (size_t d = 0; d < n->shape.size(); ++d) {
      k << stride_class(n->shape[d], n->strides[d]);
      if (auto c = small_stride(*n, d, t)) k << *c;
    }
    if (dense_in_domain(n, g.domain)) k << "D";
    k << aligned_key(*n, g.domain) << ";";
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node* n = g.nodes[i];
    k << static_cast<int>(n->op) << "." << static_cast<int>(n->dtype) << ".";
    for (const auto& s : n->shape) k << (is_one(s) ? 'u' : 's');
    k << "(";
    for (auto& in : n->inputs) k << id.at(in.get()) << ",";
    k << ")";
    if (!n->attrs.ints.empty() && n->op != OpKind::Full && n->op != OpKind::Arange && n->op != OpKind::RandInt) {
      k << "[";
      for (int64_t v : n->attrs.ints) k << v << ",";
      k << "]";
    }
    if (n->op == OpKind::Full || n->op == OpKind::Arange) k << (n->attrs.ints.empty() ? "f" : "i");
    if (inline_sum(*n)) {  // (its unrolled adds are as many as the reduced sizes say)
      k << "{";
      for (int64_t d : n->attrs.ints) k << *n->inputs[0]->shape[static_cast<size_t>(d)].maybe_int() << ",";
      k << "}";
    }
    k << aligned_key(*n, g.domain);
    if (n->op == OpKind::View) {
      const ReshapeMap m = reshape_map(*n, *n->inputs[0]);
      k << "{" << (m.direct ? "d" : "") << m.lead << "," << m.trail << "}";
    }
    if (std::find(g.outputs.begin(), g.outputs.end(), n) != g.outputs.end()) k << "*";
    k << ";";
  }
  return k.str();
}

namespace {

struct Lowerer {
  const Group& g;
  const Target& tgt;
  std::shared_ptr<Lowered> L = std::make_shared<Lowered>();
  Kernel& K = L->kernel;
  std::vector<Node*> ins;
  std::unordered_map<const Node*, int> node_idx, input_idx,
      acc_of;  // acc_of: accumulator (scratch buffer in column mode)
  std::unordered_map<const Node*, std::vector<int>> unrolled_accs;  // per element of an unrolled kept last dim
  ExprId kept_linear = -1;  // column mode: linear index over the kept dims
  std::map<std::tuple<int, int, int>, ExprId> iparam_ids, fparam_ids;
  std::map<std::pair<const Node*, std::vector<ExprId>>, ExprId> memo;
  std::vector<ExprId> dom;  // domain sizes
  std::vector<ExprId> kept_idx;  // reduction groups: index exprs of kept dims (by domain dim)
  std::vector<bool> reduced;  // per domain dim

  Lowerer(const Group& grp, const Target& target) : g(grp), tgt(target) {
    ins = canonical_inputs(g);
    for (size_t i = 0; i < ins.size(); ++i) input_idx[ins[i]] = static_cast<int>(i);
    for (size_t i = 0; i < g.nodes.size(); ++i) node_idx[g.nodes[i]] = static_cast<int>(i);
  }

  ExprId ip(ArgSource::Kind kind, int a = 0, int b = 0) {
    auto key = std::make_tuple(static_cast<int>(kind), a, b);
    auto it = iparam_ids.find(key);
    if (it != iparam_ids.end()) return it->second;
    L->iparams.push_back({kind, a, b});
    ExprId e = K.param(K.num_params++);
    iparam_ids[key] = e;
    return e;
  }
  ExprId fp(ArgSource::Kind kind, int a = 0) {
    auto key = std::make_tuple(static_cast<int>(kind), a, 0);
    auto it = fparam_ids.find(key);
    if (it != fparam_ids.end()) return it->second;
    L->fparams.push_back({kind, a, 0});
    Expr e{Expr::Kind::FParam};
    e.dtype = DType::Float64;
    e.i = K.num_fparams++;
    ExprId id = K.add(e);
    fparam_ids[key] = id;
    return id;
  }
  // Reference to a node for ArgSource: >= 0 group node, < 0 input.
  int ref(const Node* n) const {
    auto it = node_idx.find(n);
    if (it != node_idx.end()) return it->second;
    return -input_idx.at(n) - 1;
  }
  ExprId size_of(const Node* n, size_t d) {
    if (is_one(n->shape[d])) return K.iconst(1);
    const int k = domain_dim(*n, d, g.domain);
    if (k >= 0 && static_cast<size_t>(k) < dom.size()) return dom[static_cast<size_t>(k)];
    return ip(ArgSource::Kind::NodeSize, ref(n), static_cast<int>(d));
  }
  ExprId add(ExprId a, ExprId b) { return K.iop(Expr::Kind::IAdd, a, b); }
  ExprId mul(ExprId a, ExprId b) { return K.iop(Expr::Kind::IMul, a, b); }

  ExprId linearize_dom(const std::vector<ExprId>& idx) {
    ExprId lin = K.iconst(0);
    for (size_t d = 0; d < idx.size(); ++d) lin = add(mul(lin, dom[d]), idx[d]);
    return lin;
  }

  ExprId load(const Node* n, const std::vector<ExprId>& idx) {
    int b = input_idx.at(n);
    if (dense_in_domain(n, g.domain)) {
      Expr e{Expr::Kind::Load};
      e.dtype = n->dtype;
      e.i = b;
      e.a = linearize_dom(idx);
      return K.add(e);
    }
    ExprId off = K.iconst(0);
    for (size_t d = 0; d < idx.size(); ++d) {
      char c = stride_class(n->shape[d], n->strides[d]);
      if (c == 'u' || c == '0') continue;
      if (auto k = small_stride(*n, d, tgt)) {
        off = add(off, mul(idx[d], K.iconst(*k)));
        continue;
      }
      off = add(off, c == '1' ? idx[d] : mul(idx[d], ip(ArgSource::Kind::InputStride, b, static_cast<int>(d))));
    }
    Expr e{Expr::Kind::Load};
    e.dtype = n->dtype;
    e.i = b;
    e.a = off;
    return K.add(e);
  }

  // Index of an input broadcast to `shape` (right-aligned; size-1 dims read index 0).
  std::vector<ExprId> broadcast_idx(const Node* in, const std::vector<ExprId>& idx) {
    std::vector<ExprId> r(in->shape.size());
    size_t lead = idx.size() - in->shape.size();
    for (size_t d = 0; d < in->shape.size(); ++d) r[d] = is_one(in->shape[d]) ? K.iconst(0) : idx[lead + d];
    return r;
  }

  ExprId linearize(const Node* n, const std::vector<ExprId>& idx) {
    ExprId lin = K.iconst(0);
    for (size_t d = 0; d < idx.size(); ++d) lin = add(mul(lin, size_of(n, d)), idx[d]);
    return lin;
  }

  // The index into `in` of element `idx` of its reshape `n`, mapped as `m` says (GPT's
  // [B, T, C] -> [B*T, C] keeps C: no division an element where one divided by C twice).
  std::vector<ExprId> reshape_index(const Node* n, const Node* in, const std::vector<ExprId>& idx,
                                    const ReshapeMap& m) {
    const size_t na = n->shape.size(), nb = in->shape.size(), ta = na - m.trail, tb = nb - m.trail;
    std::vector<ExprId> r(nb, K.iconst(0));
    for (size_t d = 0; d < m.lead; ++d) r[d] = idx[d];
    for (size_t j = 0; j < m.trail; ++j) r[tb + j] = idx[ta + j];
    ExprId lin = K.iconst(0);
    for (size_t d = m.lead; d < ta; ++d) lin = add(mul(lin, size_of(n, d)), idx[d]);
    for (size_t d = tb; d-- > m.lead;) {
      if (is_one(in->shape[d])) continue;
      r[d] = d == m.lead ? lin : K.iop(Expr::Kind::IMod, lin, size_of(in, d));
      if (d > m.lead) lin = K.iop(Expr::Kind::IDiv, lin, size_of(in, d));
    }
    return r;
  }

  ExprId cast(ExprId v, DType t) {
    if (K.exprs[v].dtype == t) return v;
    Expr e{Expr::Kind::Cast};
    e.dtype = t;
    e.a = v;
    return K.add(e);
  }

  ExprId emit(const Node* n, const std::vector<ExprId>& idx) {
    auto key = std::make_pair(n, idx);
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    ExprId r = emit_uncached(n, idx);
    memo[key] = r;
    return r;
  }

  ExprId emit_uncached(const Node* n, const std::vector<ExprId>& idx) {
    if (input_idx.count(n)) return load(n, idx);
    const Attrs& a = n->attrs;
    switch (classify(*n)) {
      case NodeClass::Source: {
        int me = ref(n);
        if (n->op == OpKind::Full) {
          if (!a.ints.empty()) return cast(ip(ArgSource::Kind::FullValue, me), n->dtype);
          return cast(fp(ArgSource::Kind::FullValue, me), n->dtype);
        }
        if (n->op == OpKind::Arange) {
          if (!a.ints.empty() && !is_floating(n->dtype))
            return cast(add(ip(ArgSource::Kind::AttrF0, me), mul(idx[0], ip(ArgSource::Kind::AttrF1, me))), n->dtype);
          Expr m{Expr::Kind::Binary};
          m.op = OpKind::Mul;
          m.dtype = DType::Float64;
          m.a = cast(idx[0], DType::Float64);
          m.b = fp(ArgSource::Kind::AttrF1, me);
          Expr s{Expr::Kind::Binary};
          s.op = OpKind::Add;
          s.dtype = DType::Float64;
          s.a = fp(ArgSource::Kind::AttrF0, me);
          s.b = K.add(m);
          return cast(K.add(s), n->dtype);
        }
        throw LowerError(std::string("cannot fuse ") + op_name(n->op));
      }
      case NodeClass::Pointwise: {
        if (inline_sum(*n)) return inline_sum_value(n, idx);
        std::vector<ExprId> xs;
        for (auto& in : n->inputs) xs.push_back(emit(in.get(), broadcast_idx(in.get(), idx)));
        if (n->op == OpKind::Cast || n->op == OpKind::Contiguous) return cast(xs[0], n->dtype);
        if (is_arg_reduction(n->op)) return K.iconst(0);
        if (is_reduction_op(n->op)) return cast(xs[0], n->dtype);  // reduction over no dims
        Expr e{xs.size() == 1 ? Expr::Kind::Unary : xs.size() == 2 ? Expr::Kind::Binary : Expr::Kind::Where};
        e.op = n->op;
        e.dtype = n->dtype;
        e.a = xs[0];
        if (xs.size() > 1) e.b = xs[1];
        if (xs.size() > 2) e.c = xs[2];
        return K.add(e);
      }
      case NodeClass::View: return emit(n->inputs[0].get(), view_input_idx(n, idx));
      case NodeClass::Reduction: return acc_value(n, idx);
      default: break;
    }
    throw LowerError(std::string("cannot fuse ") + op_name(n->op));
  }

  // A small sum (inline_sum) at `idx` of its result: its input's elements added in order, in
  // float64 (int64 for integers) from 0, as the reduction kernels and the interpreter accumulate.
  ExprId inline_sum_value(const Node* n, const std::vector<ExprId>& idx) {
    const Node* x = n->inputs[0].get();
    const size_t r = x->shape.size();
    const bool keep = n->shape.size() == r;
    std::vector<bool> red(r, false);
    for (int64_t d : n->attrs.ints) red[static_cast<size_t>(d)] = true;
    std::vector<ExprId> xi(r);
    std::vector<int64_t> sizes, dims;  // the reduced dims, innermost last
    for (size_t d = 0, j = 0; d < r; ++d) {
      if (red[d]) {
        sizes.push_back(*x->shape[d].maybe_int());
        dims.push_back(static_cast<int64_t>(d));
        if (keep) ++j;
      } else {
        xi[d] = idx[j++];
      }
    }
    const DType acc = is_floating(x->dtype) ? DType::Float64 : DType::Int64;
    Expr zero{acc == DType::Float64 ? Expr::Kind::FConst : Expr::Kind::IConst};
    zero.dtype = acc;
    ExprId sum = K.add(zero);
    int64_t count = 1;
    for (int64_t s : sizes) count *= s;
    for (int64_t e = 0; e < count; ++e) {
      for (size_t k = dims.size(), rem = static_cast<size_t>(e); k-- > 0;) {
        xi[static_cast<size_t>(dims[k])] = K.iconst(static_cast<int64_t>(rem % static_cast<size_t>(sizes[k])));
        rem /= static_cast<size_t>(sizes[k]);
      }
      Expr add{Expr::Kind::Binary};
      add.op = OpKind::Add;
      add.dtype = acc;
      add.a = sum;
      add.b = cast(emit(x, xi), acc);
      sum = K.add(add);
    }
    return cast(sum, n->dtype);
  }

  std::vector<ExprId> view_input_idx(const Node* n, const std::vector<ExprId>& idx) {
    const Node* in = n->inputs[0].get();
    const auto& v = n->attrs.ints;
    std::vector<ExprId> r;
    switch (n->op) {
      case OpKind::Permute:
        r.resize(v.size());
        for (size_t i = 0; i < v.size(); ++i) r[v[i]] = idx[i];
        return r;
      case OpKind::Expand: return broadcast_idx(in, idx);
      case OpKind::Slice:
        r = idx;
        r[v[0]] = add(K.iconst(v[1]), mul(idx[v[0]], K.iconst(v[3])));
        return r;
      case OpKind::Select:
        r = idx;
        r.insert(r.begin() + v[0], K.iconst(v[1]));
        return r;
      case OpKind::Squeeze:
        r = idx;
        r.insert(r.begin() + v[0], K.iconst(0));
        return r;
      case OpKind::Unsqueeze:
        r = idx;
        r.erase(r.begin() + v[0]);
        return r;
      case OpKind::Flip:
        r = idx;
        for (int64_t d : v)
          r[d] = K.iop(Expr::Kind::ISub, K.iop(Expr::Kind::ISub, size_of(in, d), K.iconst(1)), idx[d]);
        return r;
      case OpKind::View: {
        const ReshapeMap m = reshape_map(*n, *in);
        if (m.direct) {  // (only size-1 dims added or dropped)
          r.assign(in->shape.size(), K.iconst(0));
          for (size_t d = 0, j = 0; d < n->shape.size(); ++d) {
            if (is_one(n->shape[d])) continue;
            while (is_one(in->shape[j])) ++j;
            r[j++] = idx[d];
          }
          return r;
        }
        return reshape_index(n, in, idx, m);
      }
      default: throw LowerError(std::string("cannot fold view ") + op_name(n->op));
    }
  }

  ExprId acc_value(const Node* r, const std::vector<ExprId>& idx) {
    auto it = acc_of.find(r);
    if (it == acc_of.end()) throw LowerError("reduction read outside its kernel stage");
    // The index must name the current outer element.
    size_t n = g.domain.size();
    bool keep = r->shape.size() == n;
    size_t j = 0;
    int acc = it->second;
    for (size_t d = 0; d < n; ++d) {
      if (reduced[d]) {
        if (keep && !(K.exprs[idx[d]].kind == Expr::Kind::IConst && K.exprs[idx[d]].i == 0))
          throw LowerError("reduction read at another index");
        if (keep) ++j;
        continue;
      }
      if (auto u = unrolled_accs.find(r); u != unrolled_accs.end() && d + 1 == n) {  // the copy read
        if (j >= idx.size() || K.exprs[idx[j]].kind != Expr::Kind::IConst)
          throw LowerError("reduction read at another index");
        const int64_t c = K.exprs[idx[j]].i;
        if (c < 0 || c >= static_cast<int64_t>(u->second.size())) throw LowerError("reduction read at another index");
        acc = u->second[static_cast<size_t>(c)];
        ++j;
        continue;
      }
      ExprId want = kept_idx[d];
      if (j >= idx.size() || idx[j] != want) {
        bool both_zero = K.exprs[want].kind == Expr::Kind::IConst && j < idx.size() &&
                         K.exprs[idx[j]].kind == Expr::Kind::IConst && K.exprs[idx[j]].i == K.exprs[want].i;
        if (!both_zero) throw LowerError("reduction read at another index");
      }
      ++j;
    }
    if (L->column) return cast(scratch_load(it->second), r->dtype);
    Expr e{is_arg_reduction(r->op) ? Expr::Kind::AccIndex : Expr::Kind::Acc};
    e.i = acc;
    e.dtype = is_arg_reduction(r->op) ? DType::Int64 : K.accs[acc].dtype;
    ExprId v = K.add(e);
    return cast(v, r->dtype);
  }

  // ---- statements ----
  Stmt loop(int var, ExprId lo, ExprId hi, std::vector<Stmt> body) {
    Stmt s{Stmt::Kind::Loop};
    s.var = var;
    s.lo = lo;
    s.hi = hi;
    s.body = std::move(body);
    return s;
  }
  Stmt store(int buffer, ExprId index, ExprId value) {
    Stmt s{Stmt::Kind::Store};
    s.buffer = buffer;
    s.index = index;
    s.value = value;
    return s;
  }
  int new_var() { return K.num_vars++; }

  int out_buffer(const Node* o) const {
    auto it = std::find(g.outputs.begin(), g.outputs.end(), o);
    return static_cast<int>(ins.size() + (it - g.outputs.begin()));
  }

  // Contiguous linear index of an output of shape `o->shape` at domain index idx.
  ExprId out_offset(const Node* o, const std::vector<ExprId>& idx) {
    if (o->shape.size() == idx.size() && same_shape(o->shape, g.domain)) return linearize_dom(idx);
    std::vector<ExprId> oi;
    if (o->shape.size() == idx.size())
      oi = idx;
    else
      for (size_t d = 0; d < idx.size(); ++d)
        if (!reduced[d]) oi.push_back(idx[d]);
    return linearize(o, oi);
  }

  // Nested loops over the listed domain dims (innermost last) around `make(idx)`.
  std::vector<Stmt> nest(std::vector<ExprId> idx, const std::vector<size_t>& dims,
                         const std::function<std::vector<Stmt>(const std::vector<ExprId>&)>& make) {
    std::vector<int> vars;
    for (size_t d : dims) {
      int v = new_var();
      vars.push_back(v);
      idx[d] = K.var(v);
    }
    std::vector<Stmt> body = make(idx);
    for (size_t k = dims.size(); k-- > 0;) body = {loop(vars[k], K.iconst(0), dom[dims[k]], std::move(body))};
    return body;
  }

  std::shared_ptr<Lowered> run() {
    const size_t n = g.domain.size();
    L->num_inputs = static_cast<int>(ins.size());
    L->num_outputs = static_cast<int>(g.outputs.size());
    for (Node* in : ins) K.buffers.push_back({in->dtype, false});
    for (Node* o : g.outputs) K.buffers.push_back({o->dtype, true});
    auto si = small_inner(g.domain, tgt);
    for (size_t d = 0; d < n; ++d) {
      if (is_one(g.domain[d]))
        dom.push_back(K.iconst(1));
      else if (d + 1 == n && si)
        dom.push_back(K.iconst(*si));
      else
        dom.push_back(ip(ArgSource::Kind::DomainSize, static_cast<int>(d)));
    }
    reduced.assign(n, false);
    for (int64_t d : g.reduce_dims) reduced[d] = true;
    for (const Node* x : g.nodes)
      if (!tgt.supports(x->op, x->dtype))
        throw LowerError(std::string("target ") + tgt.name + " has no " + op_name(x->op) + " on " +
                         dtype_name(x->dtype));
    if (g.split && !tgt.split_reductions) throw LowerError("target " + tgt.name + " has no split reductions");
    ExprId p = K.var(0);
    const bool split_columns = column_split_fits(g, tgt), host = tgt.parallel == Target::Parallel::HostChunks;
    if (g.reduce_dims.empty())
      lower_pointwise(p);
    else if (g.split)
      lower_split(p);
    else if (split_columns && host && lower_column_chunks(p)) {
    } else if (split_columns && !host)
      lower_split_columns(p);
    else if (column_reduction())
      lower_columns(p);
    else
      lower_reduction(p);
    if (!L->split && !L->column && unrolled_accs.empty() && row_cache_fits(g, tgt)) K.row_cache = tgt.row_cache;
    fuse_sibling_loops(K);
    K.name = "kiln_k";
    return L;
  }

  // Decomposes a flat index over the listed dims (row-major) into idx entries.
  void decompose(ExprId flat, const std::vector<size_t>& dims, std::vector<ExprId>& idx) {
    for (size_t k = dims.size(); k-- > 0;) {
      size_t d = dims[k];
      if (k == 0) {
        idx[d] = flat;
        break;
      }
      idx[d] = K.iop(Expr::Kind::IMod, flat, dom[d]);
      flat = K.iop(Expr::Kind::IDiv, flat, dom[d]);
    }
  }

  ExprId product(const std::vector<size_t>& dims) {
    ExprId r = K.iconst(1);
    for (size_t d : dims) r = mul(r, dom[d]);
    return r;
  }

  void lower_pointwise(ExprId p) {
    const size_t n = g.domain.size();
    std::vector<ExprId> idx(n, K.iconst(0));
    auto stores = [&](const std::vector<ExprId>& ix) {
      std::vector<Stmt> b;
      for (Node* o : g.outputs) b.push_back(store(out_buffer(o), out_offset(o, ix), emit(o, ix)));
      return b;
    };
    if (n == 0) {
      K.parallel_extent = K.iconst(1);
      K.body = stores(idx);
      return;
    }
    std::vector<size_t> rows;
    for (size_t d = 0; d + 1 < n; ++d) rows.push_back(d);
    int j = new_var();
    if (!row_tiled(g.domain, tgt)) {
      // A short last dim, or one element per parallel index: iterate the flat index, so the
      // vectorizable loop is the long one (contiguous operands fold back to the flat index;
      // broadcast ones become gathers).
      std::vector<size_t> all;
      for (size_t d = 0; d < n; ++d) all.push_back(d);
      K.parallel_extent = product(all);
      decompose(p, all, idx);
      K.body = stores(idx);
      return;
    }
    ExprId tiles = K.iop(Expr::Kind::IDiv, add(dom[n - 1], K.iconst(tgt.tile - 1)), K.iconst(tgt.tile));
    K.parallel_extent = mul(product(rows), tiles);
    ExprId row = K.iop(Expr::Kind::IDiv, p, tiles), tile = K.iop(Expr::Kind::IMod, p, tiles);
    decompose(row, rows, idx);
    ExprId lo = mul(tile, K.iconst(tgt.tile));
    ExprId hi = K.iop(Expr::Kind::IMin, add(lo, K.iconst(tgt.tile)), dom[n - 1]);
    idx[n - 1] = K.var(j);
    K.body = {loop(j, lo, hi, stores(idx))};
  }

  std::vector<Node*> reductions() const {
    std::vector<Node*> r;
    for (Node* x : g.nodes)
      if (classify(*x) == NodeClass::Reduction) r.push_back(x);
    return r;
  }

  DType acc_dtype(const Node* r) const {
    DType in = r->inputs[0]->dtype;
    if ((r->op == OpKind::Amax || r->op == OpKind::Amin) && is_floating(in))  // exact in its own type (16-bit: float32)
      return in == DType::Float16 || in == DType::BFloat16 ? DType::Float32 : in;
    return is_floating(in) ? DType::Float64 : DType::Int64;
  }

  Stmt acc_init(int acc) {
    Stmt s{Stmt::Kind::AccInit};
    s.acc = acc;
    return s;
  }
  Stmt acc_update(int acc, ExprId v, ExprId index) {
    Stmt s{Stmt::Kind::AccUpdate};
    s.acc = acc;
    s.value = v;
    s.index = index;
    return s;
  }

  ExprId reduced_linear(const std::vector<ExprId>& idx) {
    ExprId lin = K.iconst(0);
    for (size_t d = 0; d < idx.size(); ++d)
      if (reduced[d]) lin = add(mul(lin, dom[d]), idx[d]);
    return lin;
  }

  // The kept last dim of a reduction, unrolled inside the reduction loops rather than spread over
  // the parallel index, when it is short and of constant size (the x, y, z of a force summed over
  // the other particles): every element of it is then accumulated in one pass, and values that do
  // not depend on it (a pair's distance, its pow) are computed once per step, not once per
  // element. Not with outputs over the whole domain (their stores would need the same unrolling).
  std::optional<int64_t> unrolled_kept_inner() const {
    const size_t n = g.domain.size();
    if (n < 2 || reduced[n - 1] || g.reduce_dims.empty()) return std::nullopt;
    const auto s = g.domain[n - 1].maybe_int();
    if (!s || *s < 2 || *s > kUnrollKept) return std::nullopt;
    for (const Node* o : g.outputs)
      if (same_domain_output(o)) return std::nullopt;
    return s;
  }
  static constexpr int64_t kUnrollKept = 4;

  void lower_reduction(ExprId p) {
    const size_t n = g.domain.size();
    std::vector<size_t> kept, red;
    for (size_t d = 0; d < n; ++d) (reduced[d] ? red : kept).push_back(d);
    std::vector<ExprId> idx(n, K.iconst(0));
    const std::optional<int64_t> unroll = unrolled_kept_inner();
    std::vector<size_t> par = kept;
    if (unroll) par.pop_back();
    K.parallel_extent = product(par);
    decompose(p, par, idx);
    kept_idx = idx;
    const int64_t copies = unroll.value_or(1);
    // The domain index of copy c (the unrolled last dim at c).
    auto at = [&](std::vector<ExprId> ix, int64_t c) {
      if (unroll) ix[n - 1] = K.iconst(c);
      return ix;
    };
    std::vector<Stmt> body;
    for (Node* r : reductions()) {
      std::vector<int> accs;
      for (int64_t c = 0; c < copies; ++c) {
        accs.push_back(static_cast<int>(K.accs.size()));
        K.accs.push_back({r->op, acc_dtype(r), r->dtype});
        body.push_back(acc_init(accs.back()));
      }
      const Node* in = r->inputs[0].get();
      auto stage = nest(idx, red, [&](const std::vector<ExprId>& ix) {
        std::vector<Stmt> b;
        for (int64_t c = 0; c < copies; ++c) b.push_back(acc_update(accs[c], emit(in, at(ix, c)), reduced_linear(ix)));
        return b;
      });
      acc_of[r] = accs[0];  // visible to later stages only
      if (unroll) unrolled_accs[r] = accs;
      body.insert(body.end(), stage.begin(), stage.end());
    }
    std::vector<Node*> part = store_domain_outputs(idx, red, body, [](std::vector<Stmt> b) { return b; });
    for (Node* o : part)
      for (int64_t c = 0; c < copies; ++c) {
        std::vector<ExprId> oi = reduced_output_index(o, at(idx, c));
        body.push_back(store(out_buffer(o), linearize(o, oi), emit(o, oi)));
      }
    K.body = std::move(body);
  }

  // Appends the stage storing the outputs that span the whole domain (a nest over the reduced
  // dims around `wrap(stores)`); returns the other outputs (of the reduced shape).
  std::vector<Node*> store_domain_outputs(const std::vector<ExprId>& idx, const std::vector<size_t>& red,
                                          std::vector<Stmt>& body,
                                          const std::function<std::vector<Stmt>(std::vector<Stmt>)>& wrap) {
    std::vector<Node*> full, part;
    for (Node* o : g.outputs) (same_domain_output(o) ? full : part).push_back(o);
    if (!full.empty()) {
      auto stage = nest(idx, red, [&](const std::vector<ExprId>& ix) {
        std::vector<Stmt> b;
        for (Node* o : full) b.push_back(store(out_buffer(o), out_offset(o, ix), emit(o, ix)));
        return wrap(std::move(b));
      });
      body.insert(body.end(), stage.begin(), stage.end());
    }
    return part;
  }

  // Whether output `o` is a non-reduction value over the whole domain.
  bool same_domain_output(const Node* o) const {
    const size_t n = g.domain.size();
    if (o->shape.size() != n || classify(*o) == NodeClass::Reduction) return false;
    for (size_t d = 0; d < n; ++d)
      if (!sym_eq(o->shape[d], g.domain[d]).value_or(false)) return false;
    return true;
  }

  // Index of an output of the reduced shape (keepdim or not) at domain index `idx`.
  std::vector<ExprId> reduced_output_index(const Node* o, const std::vector<ExprId>& idx) {
    std::vector<ExprId> oi;
    bool keep = o->shape.size() == idx.size();
    for (size_t d = 0; d < idx.size(); ++d) {
      if (!reduced[d])
        oi.push_back(idx[d]);
      else if (keep)
        oi.push_back(K.iconst(0));
    }
    return oi;
  }

  // A reduction whose domain keeps its last (long, contiguous) dim: reducing along the strided
  // dims one column at a time would walk memory across rows with a serial accumulator.
  bool column_reduction() const {
    const size_t n = g.domain.size();
    if (!tgt.column_reductions || n < 2 || reduced[n - 1] || small_inner(g.domain, tgt) || is_one(g.domain[n - 1]))
      return false;
    for (const Node* r : reductions())
      if (is_arg_reduction(r->op)) return false;
    return true;
  }

  // The kept dims before the last (the outer index of a column kernel).
  std::vector<size_t> outer_kept() const {
    std::vector<size_t> outer;
    for (size_t d = 0; d + 1 < g.domain.size(); ++d)
      if (!reduced[d]) outer.push_back(d);
    return outer;
  }

  // How many column_tile-wide tiles the last dim has.
  ExprId column_tiles() {
    return K.iop(Expr::Kind::IDiv, add(dom[g.domain.size() - 1], K.iconst(tgt.column_tile - 1)),
                 K.iconst(tgt.column_tile));
  }

  // Index q over (outer kept dims x column tiles): idx takes the outer dims and, for the last,
  // a fresh variable running over the tile's columns; kept_idx and kept_linear follow. Returns
  // the loop over those columns around a body.
  std::function<Stmt(std::vector<Stmt>)> column_tile(ExprId q, ExprId tiles, std::vector<ExprId>& idx) {
    const size_t n = g.domain.size();
    decompose(K.iop(Expr::Kind::IDiv, q, tiles), outer_kept(), idx);
    const ExprId lo = mul(K.iop(Expr::Kind::IMod, q, tiles), K.iconst(tgt.column_tile));
    const ExprId hi = K.iop(Expr::Kind::IMin, add(lo, K.iconst(tgt.column_tile)), dom[n - 1]);
    const int j = new_var();
    idx[n - 1] = K.var(j);
    kept_idx = idx;
    kept_linear = K.iconst(0);
    for (size_t d = 0; d < n; ++d)
      if (!reduced[d]) kept_linear = add(mul(kept_linear, dom[d]), idx[d]);
    return [this, j, lo, hi](std::vector<Stmt> b) { return loop(j, lo, hi, std::move(b)); };
  }

  // Element `at` of buffer `buf`, in the buffer's dtype.
  ExprId buffer_load(int buf, ExprId at) {
    Expr e{Expr::Kind::Load};
    e.dtype = K.buffers[buf].dtype;
    e.i = buf;
    e.a = at;
    return K.add(e);
  }

  // Accumulator of reduction `buf` (a scratch buffer) at the current column.
  ExprId scratch_load(int buf) { return buffer_load(buf, kept_linear); }

  // Buffer `buf`'s accumulator at `at` combined with `value` by reduction `op` (sum, prod, or
  // NaN-propagating max/min), in the buffer's dtype.
  ExprId accumulate(int buf, ExprId at, OpKind op, ExprId value) {
    Expr e{Expr::Kind::Binary};
    e.op = op == OpKind::Sum    ? OpKind::Add
           : op == OpKind::Prod ? OpKind::Mul
           : op == OpKind::Amax ? OpKind::Maximum
                                : OpKind::Minimum;
    e.dtype = K.buffers[buf].dtype;
    e.a = buffer_load(buf, at);
    e.b = cast(value, e.dtype);
    return K.add(e);
  }

  ExprId identity_of(OpKind op, DType t) {
    bool fl = is_floating(t);
    double v = op == OpKind::Sum ? 0.0 : op == OpKind::Prod ? 1.0 : op == OpKind::Amax ? -INFINITY : INFINITY;
    if (!fl) {
      int64_t i = op == OpKind::Sum ? 0 : op == OpKind::Prod ? 1 : op == OpKind::Amax ? INT64_MIN : INT64_MAX;
      return K.iconst(i);
    }
    Expr e{Expr::Kind::FConst};
    e.dtype = t;
    e.f = v;
    return K.add(e);
  }

  // Column reductions: each parallel index owns a tile of columns (of every kept outer index)
  // and accumulates whole rows into a per-column scratch buffer, so the innermost loop runs
  // along the contiguous dim (vectorizable, no carried dependence) and rows are summed in
  // order. Every stage (reductions, then stores) loops over the tile's columns innermost.
  void lower_columns(ExprId p) {
    const size_t n = g.domain.size();
    L->column = true;
    std::vector<size_t> red;
    for (size_t d = 0; d + 1 < n; ++d)
      if (reduced[d]) red.push_back(d);
    std::vector<ExprId> idx(n, K.iconst(0));
    const ExprId tiles = column_tiles();
    K.parallel_extent = mul(product(outer_kept()), tiles);
    const auto columns = column_tile(p, tiles, idx);
    std::vector<Stmt> body;
    for (Node* r : reductions()) {
      const DType t = acc_dtype(r);
      const int sb = static_cast<int>(K.buffers.size());
      K.buffers.push_back({t, true});
      body.push_back(columns({store(sb, kept_linear, identity_of(r->op, t))}));
      const Node* in = r->inputs[0].get();
      auto stage = nest(idx, red, [&](const std::vector<ExprId>& ix) {
        return std::vector<Stmt>{columns({store(sb, kept_linear, accumulate(sb, kept_linear, r->op, emit(in, ix)))})};
      });
      acc_of[r] = sb;  // visible to later stages only
      body.insert(body.end(), stage.begin(), stage.end());
    }
    std::vector<Node*> part = store_domain_outputs(
        idx, red, body, [&](std::vector<Stmt> b) { return std::vector<Stmt>{columns(std::move(b))}; });
    std::vector<Stmt> tail;
    for (Node* o : part) {
      std::vector<ExprId> oi = reduced_output_index(o, idx);
      tail.push_back(store(out_buffer(o), linearize(o, oi), emit(o, oi)));
    }
    if (!tail.empty()) body.push_back(columns(std::move(tail)));
    K.body = std::move(body);
  }

  // ---- split reductions: per-chunk partials, combined after ----
  // Marks the kernel split and returns the group's reductions, each with an accumulator
  // started in `body`.
  std::vector<Node*> start_split(std::vector<Stmt>& body) {
    L->split = true;
    L->split_chunks = tgt.split_chunks;
    L->split_chunk_work = tgt.split_chunk_work;
    for (Node* o : g.outputs)
      if (classify(*o) == NodeClass::Reduction) L->partial_ops.push_back(o->op);
    std::vector<Node*> reds = reductions();
    for (Node* r : reds) {
      int acc = static_cast<int>(K.accs.size());
      K.accs.push_back({r->op, acc_dtype(r), r->dtype});
      body.push_back(acc_init(acc));
      acc_of[r] = acc;
    }
    return reds;
  }

  // One element of a split kernel: the accumulators take it, outputs over the whole domain store it.
  std::vector<Stmt> split_work(const std::vector<Node*>& reds, const std::vector<ExprId>& ix) {
    std::vector<Stmt> b;
    for (Node* r : reds) b.push_back(acc_update(acc_of[r], emit(r->inputs[0].get(), ix), reduced_linear(ix)));
    for (Node* o : g.outputs)
      if (classify(*o) != NodeClass::Reduction) b.push_back(store(out_buffer(o), out_offset(o, ix), emit(o, ix)));
    return b;
  }

  // Stores each reduction's partial (and index for arg reductions) at `p` of its partials buffer.
  void store_partials(ExprId p, std::vector<Stmt>& body) {
    int pb = static_cast<int>(K.buffers.size());
    for (Node* o : g.outputs) {
      if (classify(*o) != NodeClass::Reduction) continue;
      int acc = acc_of[o];
      K.buffers.push_back({K.accs[acc].dtype, true});
      Stmt s{Stmt::Kind::AccStore};
      s.acc = acc;
      s.buffer = pb++;
      s.index = p;
      s.value = 0;  // 0: value
      body.push_back(s);
      if (is_arg_reduction(o->op)) {
        K.buffers.push_back({DType::Int64, true});
        Stmt t = s;
        t.buffer = pb++;
        t.value = 1;  // 1: arg index
        body.push_back(t);
      }
    }
  }

  // Column reductions over many rows on a host (column_split_fits): index p = chunk * (outer *
  // tiles) + outer * tiles + tile; each accumulates its chunk of rows for its tile of columns
  // into partials at (chunk, kept element), the columns innermost (contiguous: vectorized), and
  // stores outputs over the whole domain on the way; the executor combines the partials per kept
  // element in chunk order. All cores take part however few the columns, and each reads whole
  // row segments. False (lower_columns takes the group) when an output is neither a reduction
  // nor over the whole domain, or a reduction is not an output.
  bool lower_column_chunks(ExprId p) {
    const size_t n = g.domain.size();
    for (Node* o : g.outputs)
      if (classify(*o) != NodeClass::Reduction && !same_domain_output(o)) return false;
    for (Node* r : reductions())
      if (std::find(g.outputs.begin(), g.outputs.end(), r) == g.outputs.end()) return false;
    L->split = L->split_columns = L->column_chunks = true;
    std::vector<size_t> red, kept;
    for (size_t d = 0; d < n; ++d) (reduced[d] ? red : kept).push_back(d);
    std::vector<ExprId> idx(n, K.iconst(0));
    const ExprId tiles = column_tiles();
    const ExprId per_chunk = mul(product(outer_kept()), tiles);
    K.parallel_extent = mul(ip(ArgSource::Kind::Chunks), per_chunk);
    const ExprId c = K.iop(Expr::Kind::IDiv, p, per_chunk);
    const auto columns = column_tile(K.iop(Expr::Kind::IMod, p, per_chunk), tiles, idx);
    const ExprId part = add(mul(c, product(kept)), kept_linear);
    std::vector<Stmt> body;
    std::unordered_map<const Node*, int> partial;  // reduction -> its partials buffer
    for (Node* o : g.outputs) {
      if (classify(*o) != NodeClass::Reduction) continue;
      L->partial_ops.push_back(o->op);
      const int sb = static_cast<int>(K.buffers.size());
      K.buffers.push_back({acc_dtype(o), true});
      partial[o] = sb;
      body.push_back(columns({store(sb, part, identity_of(o->op, acc_dtype(o)))}));
    }
    const int v = new_var();
    ExprId rlo = mul(c, ip(ArgSource::Kind::ChunkSize));
    ExprId rhi = K.iop(Expr::Kind::IMin, add(rlo, ip(ArgSource::Kind::ChunkSize)), product(red));
    decompose(K.var(v), red, idx);
    std::vector<Stmt> row;
    for (Node* o : g.outputs) {
      if (classify(*o) != NodeClass::Reduction) {
        row.push_back(store(out_buffer(o), out_offset(o, idx), emit(o, idx)));
        continue;
      }
      const int sb = partial.at(o);
      row.push_back(store(sb, part, accumulate(sb, part, o->op, emit(o->inputs[0].get(), idx))));
    }
    body.push_back(loop(v, rlo, rhi, {columns(std::move(row))}));
    K.body = std::move(body);
    return true;
  }

  // Split column reductions: index p = chunk * columns + column (columns: the flat kept
  // index, so neighbouring indices read neighbouring elements); each accumulates its chunk of
  // rows and stores a partial at p; outputs over the whole domain are stored on the way.
  void lower_split_columns(ExprId p) {
    const size_t n = g.domain.size();
    L->split_columns = true;
    std::vector<size_t> kept, red;
    for (size_t d = 0; d < n; ++d) (reduced[d] ? red : kept).push_back(d);
    ExprId cols = product(kept), chunk = ip(ArgSource::Kind::ChunkSize);
    K.parallel_extent = mul(ip(ArgSource::Kind::Chunks), cols);
    K.columns = true;
    std::vector<ExprId> idx(n, K.iconst(0));
    decompose(K.iop(Expr::Kind::IMod, p, cols), kept, idx);
    ExprId lo = mul(K.iop(Expr::Kind::IDiv, p, cols), chunk);
    ExprId hi = K.iop(Expr::Kind::IMin, add(lo, chunk), product(red));
    std::vector<Stmt> body;
    std::vector<Node*> reds = start_split(body);
    int v = new_var();
    decompose(K.var(v), red, idx);
    body.push_back(loop(v, lo, hi, split_work(reds, idx)));
    store_partials(p, body);
    K.body = std::move(body);
  }

  void lower_split(ExprId p) {
    const size_t n = g.domain.size();
    // Chunks over rows (all dims but the last), or over the flat index of every dim when the
    // last is short and the target asks (consecutive lanes then read consecutive elements).
    const bool flat = tgt.split_flat && n > 1 && (small_inner(g.domain, tgt) || is_one(g.domain.back()));
    L->split_flat = flat;
    std::vector<ExprId> idx(n, K.iconst(0));
    ExprId chunk = ip(ArgSource::Kind::ChunkSize);
    K.parallel_extent = ip(ArgSource::Kind::Chunks);
    ExprId lo = mul(p, chunk);
    int v = new_var();
    std::vector<size_t> rows;
    for (size_t d = 0; d + (flat ? 0 : 1) < n; ++d) rows.push_back(d);
    ExprId total = n == 1 ? dom[0] : product(rows);
    ExprId hi = K.iop(Expr::Kind::IMin, add(lo, chunk), total);
    std::vector<Stmt> body;
    std::vector<Node*> reds = start_split(body);
    auto work = [&](const std::vector<ExprId>& ix) { return split_work(reds, ix); };
    if (n == 1) {
      idx[0] = K.var(v);
      body.push_back(loop(v, lo, hi, work(idx)));
    } else if (flat) {
      decompose(K.var(v), rows, idx);
      body.push_back(loop(v, lo, hi, work(idx)));
    } else {
      decompose(K.var(v), rows, idx);
      auto in = nest(idx, {n - 1}, work);
      body.push_back(loop(v, lo, hi, std::move(in)));
    }
    store_partials(p, body);
    K.body = std::move(body);
  }
};

}  // namespace

std::shared_ptr<Lowered> lower(const Group& g, const Target& t) { return Lowerer(g, t).run(); }

Kernel combine_kernel(OpKind op, DType acc, DType out, bool columns) {
  const bool arg = is_arg_reduction(op);
  KILN_CHECK(!(arg && columns), "jit: no split column arg reductions");
  Kernel K;
  K.name = std::string("combine_") + op_name(op) + (columns ? "_columns" : "");
  K.buffers.push_back({acc, false});
  if (arg) K.buffers.push_back({DType::Int64, false});
  const int ob = static_cast<int>(K.buffers.size());
  K.buffers.push_back({out, true});
  K.accs.push_back({op, acc, out});
  // iparams: the chunks; columns: also the columns (partial of chunk c, column j at c * columns + j).
  K.num_params = columns ? 2 : 1;
  K.num_vars = 2;
  K.parallel_extent = columns ? K.param(1) : K.iconst(1);
  K.long_indices = !columns;  // one output: a block of lanes; per column: a warp each
  const ExprId at =
      columns ? K.iop(Expr::Kind::IAdd, K.iop(Expr::Kind::IMul, K.var(1), K.param(1)), K.var(0)) : K.var(1);
  auto load = [&](int b, DType t) {
    Expr e{Expr::Kind::Load};
    e.dtype = t;
    e.i = b;
    e.a = at;
    return K.add(e);
  };
  Stmt init{Stmt::Kind::AccInit};
  Stmt up{Stmt::Kind::AccUpdate};
  up.value = load(0, acc);
  up.index = arg ? load(1, DType::Int64) : -1;
  Stmt loop{Stmt::Kind::Loop};
  loop.var = 1;
  loop.lo = K.iconst(0);
  loop.hi = K.param(0);
  loop.body = {up};
  Stmt st{Stmt::Kind::Store};
  st.buffer = ob;
  st.index = columns ? K.var(0) : K.iconst(0);
  if (arg) {  // no partial seen (no chunk): index 0, as the host combine
    Expr i{Expr::Kind::AccIndex};
    i.i = 0;
    ExprId idx = K.add(i);
    Expr neg{Expr::Kind::Binary};
    neg.dtype = DType::Bool;
    neg.op = OpKind::Lt;
    neg.a = idx;
    neg.b = K.iconst(0);
    Expr w{Expr::Kind::Where};
    w.dtype = DType::Int64;
    w.a = K.add(neg);
    w.b = K.iconst(0);
    w.c = idx;
    st.value = K.add(w);
  } else {
    Expr a{Expr::Kind::Acc};
    a.dtype = acc;
    a.i = 0;
    Expr c{Expr::Kind::Cast};
    c.dtype = out;
    c.a = K.add(a);
    st.value = K.add(c);
  }
  K.body = {init, loop, st};
  return K;
}

}  // namespace kiln::jit

namespace kiln::jit {

void bind_args(const Lowered& L, const Group& g, const std::vector<Node*>& ins, BoundArgs& out) {
  out.ip.clear();
  out.fp.clear();
  // Split reductions: chunk the rows so each chunk holds enough work.
  int64_t rows = 1, per_row = 1;
  if (L.split) {
    const size_t n = g.domain.size();
    if (n == 1 || L.split_flat) {
      for (const SymInt& d : g.domain) rows *= d.as_int();
    } else {
      for (size_t d = 0; d + 1 < n; ++d) rows *= g.domain[d].as_int();
      per_row = std::max<int64_t>(1, g.domain[n - 1].as_int());
    }
  }
  int64_t chunk = std::max<int64_t>(
      {1, (L.split_chunk_work + per_row - 1) / per_row, (rows + L.split_chunks - 1) / L.split_chunks});
  out.columns = 1;
  if (L.split_columns) {  // about split_chunks * 8 indices in all, at least 32 rows each
    rows = 1;
    for (size_t d = 0; d < g.domain.size(); ++d) {
      const bool red =
          std::find(g.reduce_dims.begin(), g.reduce_dims.end(), static_cast<int64_t>(d)) != g.reduce_dims.end();
      (red ? rows : out.columns) *= g.domain[d].as_int();
    }
    if (L.column_chunks) {  // at most kColumnChunks chunks of at least kColumnChunkRows rows (by size alone: the same
                            // sums on any thread count)
      chunk = std::max<int64_t>(kColumnChunkRows, (rows + kColumnChunks - 1) / kColumnChunks);
    } else {
      const int64_t want = std::max<int64_t>(1, L.split_chunks * 8 / std::max<int64_t>(out.columns, 1));
      chunk = std::max<int64_t>(32, (rows + want - 1) / want);
    }
  }
  out.chunks = std::max<int64_t>(1, (rows + chunk - 1) / chunk);
  auto arg_node = [&](int a) -> const Node* { return a >= 0 ? g.nodes[a] : ins[-a - 1]; };
  for (const ArgSource& s : L.iparams) {
    int64_t v = 0;
    switch (s.kind) {
      case ArgSource::Kind::DomainSize: v = g.domain[s.a].as_int(); break;
      case ArgSource::Kind::NodeSize: v = arg_node(s.a)->shape[s.b].as_int(); break;
      case ArgSource::Kind::InputStride: v = ins[s.a]->strides[s.b].as_int(); break;
      case ArgSource::Kind::FullValue:
      case ArgSource::Kind::AttrF0: v = g.nodes[s.a]->attrs.ints[0]; break;
      case ArgSource::Kind::AttrF1: v = g.nodes[s.a]->attrs.ints[1]; break;
      case ArgSource::Kind::Chunks: v = out.chunks; break;
      case ArgSource::Kind::ChunkSize: v = chunk; break;
    }
    out.ip.push_back(v);
  }
  for (const ArgSource& s : L.fparams) {
    const Node* n = g.nodes[s.a];
    out.fp.push_back(s.kind == ArgSource::Kind::AttrF1 ? n->attrs.f1 : n->attrs.f0);
  }
  // Scratch: per-chunk partials (split), per-kept-element accumulators (column).
  out.scratch = out.chunks * out.columns;
  if (L.column) {
    out.scratch = 1;
    for (size_t d = 0; d < g.domain.size(); ++d)
      if (std::find(g.reduce_dims.begin(), g.reduce_dims.end(), static_cast<int64_t>(d)) == g.reduce_dims.end())
        out.scratch *= g.domain[d].as_int();
  }
}

}  // namespace kiln::jit
