// einsum and cdist, composed from diagonal / sum / permute / reshape / matmul.
//
// einsum: each operand's labels are parsed ("..." becomes labels of its own, aligned from the
// right across operands); a label repeated within one operand takes the diagonal; labels that
// no later operand nor the output needs are summed out; operands are then contracted left to
// right, each pair as one batched matmul ([batch, left, contracted] x [batch, contracted,
// right]); the result is permuted to the output's order. Sizes stay symbolic (SymInt).
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln {
using detail::str;

namespace {
// Labels: 0-25 'A'-'Z', 26-51 'a'-'z' (PyTorch's implicit output order), 52+ ellipsis dims.
constexpr int kEll = 52;

std::string letter(int l) { return std::string(1, static_cast<char>(l < 26 ? 'A' + l : 'a' + (l - 26))); }

int label_of(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return 26 + (c - 'a');
  throw Error(
      detail::cat("einsum(): invalid subscript given in the equation string, subscripts must be in [a-zA-Z], got '",
                  std::string(1, c), "'"));
}

struct Term {
  std::vector<int> labels;  // letters, with -1 for the ellipsis position
  bool ellipsis = false;
};

Term parse_term(const std::string& s, const char* where) {
  Term t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '.') {
      KILN_CHECK(!t.ellipsis && s.compare(i, 3, "...") == 0, "einsum(): found '.' for ", where,
                 " that is not part of any ellipsis (expected at most one \"...\")");
      t.ellipsis = true;
      t.labels.push_back(-1);
      i += 2;
    } else {
      t.labels.push_back(label_of(s[i]));
    }
  }
  return t;
}

// An operand with one label per dim.
struct Op {
  Tensor t;
  std::vector<int> labels;
};

// Sums out the dims whose label is not in `keep`.
Op sum_unneeded(Op o, const std::set<int>& keep) {
  std::vector<int64_t> dims;
  std::vector<int> rest;
  for (size_t i = 0; i < o.labels.size(); ++i) {
    if (keep.count(o.labels[i]))
      rest.push_back(o.labels[i]);
    else
      dims.push_back(static_cast<int64_t>(i));
  }
  if (!dims.empty()) o.t = sum(o.t, dims);
  o.labels = rest;
  return o;
}

// Product of sizes (1 for none).
SymInt prod_of(const Shape& s) {
  SymInt p = 1;
  for (const auto& v : s) p = p * v;
  return p;
}

// Contracts a and b over the labels they share that `keep` does not hold.
Op contract(Op a, Op b, const std::set<int>& keep) {
  std::set<int> la(a.labels.begin(), a.labels.end()), lb(b.labels.begin(), b.labels.end());
  std::vector<int> batch, left, right, con;
  for (int l : a.labels) {
    if (!lb.count(l))
      left.push_back(l);
    else if (keep.count(l))
      batch.push_back(l);
    else
      con.push_back(l);
  }
  for (int l : b.labels)
    if (!la.count(l)) right.push_back(l);
  auto pos = [](const Op& o, int l) {
    return static_cast<int64_t>(std::find(o.labels.begin(), o.labels.end(), l) - o.labels.begin());
  };
  // A contracted label of size 1 on one side broadcasts: sum the other side over it first.
  for (int l : con) {
    const SymInt& sa = a.t.shape()[pos(a, l)];
    const SymInt& sb = b.t.shape()[pos(b, l)];
    if (detail::same_size(sa, sb)) continue;
    auto a1 = sym_eq(sa, 1), b1 = sym_eq(sb, 1);
    KILN_CHECK((a1 && *a1) || (b1 && *b1), "einsum(): operands do not broadcast with remapped shapes (original->",
               "remapped): subscript of size ", sa.str(), " and ", sb.str());
    if (a1 && *a1)
      b.t = sum(b.t, std::vector<int64_t>{pos(b, l)}, true);
    else
      a.t = sum(a.t, std::vector<int64_t>{pos(a, l)}, true);
  }
  std::vector<int64_t> pa, pb;
  for (int l : batch) pa.push_back(pos(a, l));
  for (int l : left) pa.push_back(pos(a, l));
  for (int l : con) pa.push_back(pos(a, l));
  for (int l : batch) pb.push_back(pos(b, l));
  for (int l : con) pb.push_back(pos(b, l));
  for (int l : right) pb.push_back(pos(b, l));
  Tensor A = permute(a.t, pa), B = permute(b.t, pb);
  size_t nb = batch.size(), nl = left.size(), nc = con.size(), nr = right.size();
  const Shape& sa = A.shape();
  const Shape& sb = B.shape();
  Shape bat_a(sa.begin(), sa.begin() + nb), bat_b(sb.begin(), sb.begin() + nb);
  Shape lsz(sa.begin() + nb, sa.begin() + nb + nl), csz(sa.begin() + nb + nl, sa.end());
  Shape rsz(sb.begin() + nb + nc, sb.end());
  Shape ra = bat_a, rb = bat_b;
  ra.push_back(prod_of(lsz));
  ra.push_back(prod_of(csz));
  rb.push_back(prod_of(Shape(sb.begin() + nb, sb.begin() + nb + nc)));
  rb.push_back(prod_of(rsz));
  Tensor R = matmul(detail::reshape_to(A, ra), detail::reshape_to(B, rb));
  Shape out(R.shape().begin(), R.shape().begin() + nb);  // broadcast batch sizes
  out.insert(out.end(), lsz.begin(), lsz.end());
  out.insert(out.end(), rsz.begin(), rsz.end());
  Op r;
  r.t = detail::reshape_to(R, out);
  r.labels = batch;
  r.labels.insert(r.labels.end(), left.begin(), left.end());
  r.labels.insert(r.labels.end(), right.begin(), right.end());
  (void)nr;
  return r;
}
}  // namespace

Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands) {
  KILN_CHECK(!operands.empty(), "einsum(): must provide at least one operand");
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq += c;
  size_t arrow = eq.find("->");
  std::string lhs = arrow == std::string::npos ? eq : eq.substr(0, arrow);
  std::vector<Term> terms;
  size_t start = 0;
  while (true) {
    size_t comma = lhs.find(',', start);
    terms.push_back(
        parse_term(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start), "an operand"));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  KILN_CHECK(terms.size() == operands.size(), "einsum(): ",
             terms.size() < operands.size() ? "more operands were provided than specified in the equation"
                                            : "fewer operands were provided than specified in the equation",
             " (expected ", terms.size(), ", got ", operands.size(), ")");
  // Labels per dim; ellipsis dims get kEll + k, k counted so that they align from the right.
  int64_t ell_dims = 0;
  std::vector<Op> ops;
  for (size_t k = 0; k < terms.size(); ++k) {
    const Tensor& t = operands[k];
    KILN_CHECK(t.defined(), "einsum(): operand ", k, " is undefined");
    int64_t letters = static_cast<int64_t>(terms[k].labels.size()) - (terms[k].ellipsis ? 1 : 0);
    if (terms[k].ellipsis) {
      KILN_CHECK(t.dim() >= letters, "einsum(): the number of subscripts in the equation (", letters,
                 ") is more than the number of dimensions (", t.dim(), ") for operand ", k);
      ell_dims = std::max(ell_dims, t.dim() - letters);
    } else {
      KILN_CHECK(t.dim() == letters, "einsum(): the number of subscripts in the equation (", letters,
                 ") does not match the number of dimensions (", t.dim(), ") for operand ", k,
                 " and no ellipsis was given");
    }
  }
  std::map<int, int> count;  // label -> number of operand dims carrying it
  for (size_t k = 0; k < terms.size(); ++k) {
    Op o;
    o.t = operands[k];
    int64_t letters = static_cast<int64_t>(terms[k].labels.size()) - (terms[k].ellipsis ? 1 : 0);
    int64_t e = o.t.dim() - letters;
    for (int l : terms[k].labels) {
      if (l >= 0) {
        o.labels.push_back(l);
        continue;
      }
      for (int64_t i = 0; i < e; ++i) o.labels.push_back(kEll + static_cast<int>(ell_dims - e + i));
    }
    for (int l : o.labels) ++count[l];
    ops.push_back(std::move(o));
  }
  // Output labels.
  std::vector<int> out;
  if (arrow != std::string::npos) {
    Term t = parse_term(eq.substr(arrow + 2), "the output");
    std::set<int> seen;
    for (int l : t.labels) {
      if (l < 0) {
        for (int64_t i = 0; i < ell_dims; ++i) out.push_back(kEll + static_cast<int>(i));
        continue;
      }
      KILN_CHECK(seen.insert(l).second, "einsum(): output subscript ", letter(l),
                 " appears more than once in the output");
      KILN_CHECK(count.count(l), "einsum(): output subscript ", letter(l),
                 " does not appear in the equation for any input operand");
      out.push_back(l);
    }
  } else {
    for (int64_t i = 0; i < ell_dims; ++i) out.push_back(kEll + static_cast<int>(i));
    for (const auto& [l, c] : count)
      if (l < kEll && c == 1) out.push_back(l);
  }
  // Repeated labels within an operand: diagonals.
  for (auto& o : ops) {
    for (bool again = true; again;) {
      again = false;
      for (size_t i = 0; i < o.labels.size() && !again; ++i) {
        for (size_t j = i + 1; j < o.labels.size() && !again; ++j) {
          if (o.labels[i] != o.labels[j]) continue;
          auto same = sym_eq(o.t.shape()[i], o.t.shape()[j]);
          KILN_CHECK(!same || *same, "einsum(): subscript ", letter(o.labels[i]),
                     " is repeated for operand but the sizes don't match, ", o.t.shape()[i].str(),
                     " != ", o.t.shape()[j].str());
          int l = o.labels[i];
          o.t = diagonal(o.t, 0, static_cast<int64_t>(i), static_cast<int64_t>(j));
          o.labels.erase(o.labels.begin() + static_cast<std::ptrdiff_t>(j));
          o.labels.erase(o.labels.begin() + static_cast<std::ptrdiff_t>(i));
          o.labels.push_back(l);
          again = true;
        }
      }
    }
  }
  std::set<int> out_set(out.begin(), out.end());
  auto needed_after = [&](size_t k) {  // labels the output or operands after k need
    std::set<int> s = out_set;
    for (size_t m = k + 1; m < ops.size(); ++m) s.insert(ops[m].labels.begin(), ops[m].labels.end());
    return s;
  };
  Op acc = ops[0];
  {
    std::set<int> keep = needed_after(0);
    acc = sum_unneeded(acc, keep);
  }
  for (size_t k = 1; k < ops.size(); ++k) {
    std::set<int> keep = needed_after(k);
    std::set<int> keep_b = keep;
    keep_b.insert(acc.labels.begin(), acc.labels.end());
    Op b = sum_unneeded(ops[k], keep_b);
    std::set<int> keep_a = keep;
    keep_a.insert(b.labels.begin(), b.labels.end());
    acc = sum_unneeded(acc, keep_a);
    acc = contract(acc, b, keep);
  }
  acc = sum_unneeded(acc, out_set);
  std::vector<int64_t> perm;
  for (int l : out) {
    auto it = std::find(acc.labels.begin(), acc.labels.end(), l);
    if (it == acc.labels.end()) {  // an ellipsis dim no operand had (all had fewer): size 1
      acc.t = unsqueeze(acc.t, -1);
      acc.labels.push_back(l);
      it = acc.labels.end() - 1;
    }
    perm.push_back(static_cast<int64_t>(it - acc.labels.begin()));
  }
  return perm.empty() ? acc.t : permute(acc.t, perm);
}

Tensor cdist(const Tensor& x1, const Tensor& x2, double p) {
  KILN_CHECK(x1.defined() && x2.defined(), "cdist: got an undefined tensor");
  KILN_CHECK(x1.dim() >= 2, "cdist only supports at least 2D tensors, X1 got: ", x1.dim(), "D");
  KILN_CHECK(x2.dim() >= 2, "cdist only supports at least 2D tensors, X2 got: ", x2.dim(), "D");
  KILN_CHECK(is_floating(x1.dtype()) && is_floating(x2.dtype()),
             "cdist only supports floating-point dtypes, X1 got: ", dtype_name(x1.dtype()),
             ", X2 got: ", dtype_name(x2.dtype()));
  KILN_CHECK(p >= 0, "cdist only supports non-negative p values, got ", p);
  auto same = sym_eq(x1.shape().back(), x2.shape().back());
  KILN_CHECK(!same || *same, "X1 and X2 must have the same number of columns. X1: ", x1.shape().back().str(),
             " X2: ", x2.shape().back().str());
  Tensor diff = sub(unsqueeze(x1, -2), unsqueeze(x2, -3));  // [..., P, R, M]
  std::vector<int64_t> last{-1};
  if (std::isinf(p)) return amax(abs(diff), last);
  if (p == 0) return sum(to(ne(diff, 0), diff.dtype()), last);
  if (p == 1) return sum(abs(diff), last);
  // sum(|d|^p)^(1/p), with a zero gradient at zero distance (as PyTorch's cdist_backward).
  Tensor s = p == 2 ? sum(mul(diff, diff), last) : sum(pow(abs(diff), p), last);
  Tensor zero = eq(s, 0);
  Tensor safe = where(zero, Scalar(1.0), s);
  Tensor r = p == 2 ? sqrt(safe) : pow(safe, 1.0 / p);
  return where(zero, Scalar(0.0), r);
}

}  // namespace kiln
