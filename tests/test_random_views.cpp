// Randomized differential tests: broadcasting binary ops, chains of views, in-place writes
// through views and reductions of views, each checked against a tiny reference written here
// from scratch: a strided ndarray of doubles (shared buffer + shape/strides/offset) walked with
// explicit index loops, and PyTorch's type-promotion rules restated independently.
//
// Tests: RandomBroadcast.BinaryOpsMatchReference (values + result dtype + errors),
// RandomViews.ChainsMatchReference (values, contiguity, aliasing of every step),
// RandomViews.InPlaceWritesThroughViews (base and every other view after writes),
// RandomViews.ReductionsOfViews, RandomViews.LargeTensorsMatchReference (parallel kernel path),
// RandomViews.NothingRunsUntilValuesAreRead (laziness via kiln::stats()).
//
// Reproducible: the seed is KILN_TEST_SEED (default below); a failure prints the seed and the
// case number, and KILN_TEST_CASE=<n> reruns only case n of each test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kiln.h"
#include "test_seed.h"

namespace {

using kiln::DType;
using kiln::Scalar;
using kiln::Tensor;
using Dims = std::vector<int64_t>;

constexpr DType kBool = kiln::kBool, kI32 = kiln::kInt32, kI64 = kiln::kInt64, kF32 = kiln::kFloat32,
                kF64 = kiln::kFloat64;
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// ============================================================== seeds and randomness

using kiln::testing::splitmix;
uint64_t test_seed() { return kiln::testing::test_seed(20250101ull); }

std::optional<int> only_case() {
  const char* s = std::getenv("KILN_TEST_CASE");
  if (!s || !*s) return std::nullopt;
  return std::atoi(s);
}

// Deterministic everywhere (no std::*_distribution, whose output varies by library).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return splitmix(state_);
  }
  // Uniform in [lo, hi].
  int64_t range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool coin(double p = 0.5) { return static_cast<double>(next() >> 11) * 0x1p-53 < p; }
  template <class T>
  T pick(std::initializer_list<T> xs) {
    return xs.begin()[range(0, static_cast<int64_t>(xs.size()) - 1)];
  }

 private:
  uint64_t state_;
};

// Runs `count` cases of body(rng, log), each with its own generator derived from the seed, the
// test name and the case number. `log` describes what the case did; check helpers print it.
// Stops after a few failing cases so that one bug does not flood the output.
template <class F>
void run_cases(const std::string& name, int count, F&& body) {
  const auto only = only_case();
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  const ::testing::TestResult* result = ::testing::UnitTest::GetInstance()->current_test_info()->result();
  int failed = 0;
  for (int i = 0; i < count && failed < 3; ++i) {
    if (only && *only != i) continue;
    std::ostringstream trace;
    trace << "reproduce with KILN_TEST_SEED=" << test_seed() << " KILN_TEST_CASE=" << i;
    SCOPED_TRACE(trace.str());
    Rng rng(splitmix(test_seed() ^ splitmix(h + static_cast<uint64_t>(i))));
    std::string log;
    const int before = result->total_part_count();
    try {
      body(rng, log);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "unexpected exception: " << e.what() << "\n  ops:\n" << log;
    }
    if (result->total_part_count() > before) ++failed;
  }
}

// ============================================================== small helpers

std::string str(const Dims& d) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < d.size(); ++i) os << (i ? ", " : "") << d[i];
  os << "]";
  return os.str();
}

std::string opt_str(std::optional<int64_t> v) { return v ? std::to_string(*v) : "None"; }

int64_t numel_of(const Dims& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

// Calls f(idx) for every index of `shape` in row-major order.
template <class F>
void for_each_index(const Dims& shape, F&& f) {
  const int64_t n = numel_of(shape);
  Dims idx(shape.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    f(idx);
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// Row-major position of `idx` in `shape`.
int64_t linear(const Dims& idx, const Dims& shape) {
  int64_t k = 0;
  for (size_t d = 0; d < shape.size(); ++d) k = k * shape[d] + idx[d];
  return k;
}

// Values `v` (row-major over `from`) broadcast to `to` (numpy rules; `from` must fit).
std::vector<double> broadcast_values(const std::vector<double>& v, const Dims& from, const Dims& to) {
  std::vector<double> out;
  const size_t lead = to.size() - from.size();
  for_each_index(to, [&](const Dims& idx) {
    int64_t k = 0;
    for (size_t d = 0; d < from.size(); ++d) k = k * from[d] + (from[d] == 1 ? 0 : idx[lead + d]);
    out.push_back(v.at(k));
  });
  return out;
}

// Broadcast shape of `shapes`, or nullopt if they are incompatible.
std::optional<Dims> ref_broadcast(const std::vector<Dims>& shapes) {
  size_t n = 0;
  for (const auto& s : shapes) n = std::max(n, s.size());
  Dims out(n, 1);
  for (const auto& s : shapes)
    for (size_t d = 0; d < s.size(); ++d) {
      int64_t& o = out[n - s.size() + d];
      if (s[d] == 1) continue;
      if (o == 1)
        o = s[d];
      else if (o != s[d])
        return std::nullopt;
    }
  return out;
}

// ============================================================== reference dtypes

const char* dname(DType t) { return kiln::dtype_name(t); }
int category(DType t) { return t == kBool ? 0 : (t == kI32 || t == kI64) ? 1 : 2; }
bool is_float(DType t) { return category(t) == 2; }
int width(DType t) { return (t == kI64 || t == kF64) ? 2 : 1; }

DType ref_promote(DType a, DType b) {
  if (category(a) != category(b)) return category(a) > category(b) ? a : b;
  return width(a) >= width(b) ? a : b;
}

// An operand for type promotion: its dtype and priority (2: tensor with dims, 1: 0-d tensor,
// 0: C++ number, whose dtype is bool / int64 / float32 by kind).
struct TypeArg {
  DType dtype;
  int priority;
};

// torch.result_type restated: the result category is the highest category of any operand; the
// dtype is the promotion within the highest-priority group of operands that reaches it.
DType ref_result_type(const std::vector<TypeArg>& args) {
  int top = -1;
  for (const auto& a : args) top = std::max(top, category(a.dtype));
  for (int pr = 2; pr >= 0; --pr) {
    std::optional<DType> g;
    for (const auto& a : args)
      if (a.priority == pr) g = g ? ref_promote(*g, a.dtype) : a.dtype;
    if (g && category(*g) == top) return *g;
  }
  ADD_FAILURE() << "ref_result_type: no operands";
  return kF32;
}

// torch.can_cast: never to a lower category.
bool ref_can_cast(DType from, DType to) { return category(from) <= category(to); }

// `x` stored as dtype `t` and read back.
double to_dtype(DType t, double x) {
  switch (t) {
    case kBool: return x != 0 ? 1.0 : 0.0;  // NaN is truthy
    case kI32: return static_cast<double>(static_cast<int32_t>(x));
    case kI64: return static_cast<double>(static_cast<int64_t>(x));
    case kF32: return static_cast<double>(static_cast<float>(x));
    default: return x;
  }
}

enum class Op { Add, Sub, Mul, Div, Maximum, Minimum, Eq, Ne, Lt, Le, Gt, Ge };

// One element of op(a, b) computed in dtype `c` (a and b hold values of their own dtypes).
// Doing a single float32 op in double and rounding once gives float32's exact answer.
double ref_binary(Op op, double a, double b, DType c) {
  const double x = to_dtype(c, a), y = to_dtype(c, b);
  const bool boolean = c == kBool;
  switch (op) {
    case Op::Add: return boolean ? double(x != 0 || y != 0) : to_dtype(c, x + y);
    case Op::Sub: return to_dtype(c, x - y);
    case Op::Mul: return boolean ? double(x != 0 && y != 0) : to_dtype(c, x * y);
    case Op::Div: return to_dtype(c, x / y);
    case Op::Maximum: return (std::isnan(x) || std::isnan(y)) ? kNaN : std::max(x, y);
    case Op::Minimum: return (std::isnan(x) || std::isnan(y)) ? kNaN : std::min(x, y);
    case Op::Eq: return x == y;
    case Op::Ne: return x != y;
    case Op::Lt: return x < y;
    case Op::Le: return x <= y;
    case Op::Gt: return x > y;
    case Op::Ge: return x >= y;
  }
  return kNaN;
}

// ============================================================== reference strided ndarray

struct Ref {
  std::shared_ptr<std::vector<double>> buf;
  Dims shape, strides;
  int64_t offset = 0;
  DType dtype = kF32;

  int64_t dim() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const { return numel_of(shape); }
  // Buffer positions of the elements, row-major.
  std::vector<int64_t> offsets() const {
    std::vector<int64_t> out;
    for_each_index(shape, [&](const Dims& idx) {
      int64_t o = offset;
      for (size_t d = 0; d < idx.size(); ++d) o += idx[d] * strides[d];
      out.push_back(o);
    });
    return out;
  }
  std::vector<double> values() const {
    std::vector<double> out;
    for (int64_t o : offsets()) out.push_back(buf->at(static_cast<size_t>(o)));
    return out;
  }
};

Dims dense_strides(const Dims& shape) {
  Dims st(shape.size());
  int64_t acc = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    st[d] = acc;
    acc *= std::max<int64_t>(shape[d], 1);
  }
  return st;
}

Ref make_ref(std::vector<double> vals, const Dims& shape, DType dt) {
  Ref r;
  r.buf = std::make_shared<std::vector<double>>(std::move(vals));
  r.shape = shape;
  r.strides = dense_strides(shape);
  r.dtype = dt;
  return r;
}

Ref ref_copy(const Ref& x) { return make_ref(x.values(), x.shape, x.dtype); }

int64_t wrap(int64_t d, int64_t n) { return d < 0 ? d + std::max<int64_t>(n, 1) : d; }

// Python's slice.indices for a positive step: clamped [begin, end).
std::pair<int64_t, int64_t> py_bounds(std::optional<int64_t> start, std::optional<int64_t> stop, int64_t n) {
  auto fix = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
  const int64_t b = start ? fix(*start) : 0, e = stop ? fix(*stop) : n;
  return {b, std::max(b, e)};
}

Ref r_slice(Ref x, int64_t d, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step) {
  d = wrap(d, x.dim());
  auto [b, e] = py_bounds(start, stop, x.shape[d]);
  x.offset += b * x.strides[d];
  x.shape[d] = (e - b + step - 1) / step;
  x.strides[d] *= step;
  return x;
}

Ref r_select(Ref x, int64_t d, int64_t i) {
  d = wrap(d, x.dim());
  if (i < 0) i += x.shape[d];
  x.offset += i * x.strides[d];
  x.shape.erase(x.shape.begin() + d);
  x.strides.erase(x.strides.begin() + d);
  return x;
}

Ref r_permute(const Ref& x, const Dims& perm) {
  Ref r = x;
  for (size_t i = 0; i < perm.size(); ++i) {
    const int64_t p = wrap(perm[i], x.dim());
    r.shape[i] = x.shape[p];
    r.strides[i] = x.strides[p];
  }
  return r;
}

Ref r_unsqueeze(Ref x, int64_t d) {
  d = d < 0 ? d + x.dim() + 1 : d;
  x.shape.insert(x.shape.begin() + d, 1);
  x.strides.insert(x.strides.begin() + d, 0);  // any stride addresses a size-1 dim
  return x;
}

Ref r_squeeze(Ref x, std::optional<int64_t> dim) {
  Ref r = x;
  r.shape.clear();
  r.strides.clear();
  const int64_t only = dim && x.dim() > 0 ? wrap(*dim, x.dim()) : -1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool drop = x.shape[d] == 1 && (!dim || d == only);
    if (drop) continue;
    r.shape.push_back(x.shape[d]);
    r.strides.push_back(x.strides[d]);
  }
  return r;
}

// expand(sizes) with -1 = keep; nullopt if invalid.
std::optional<Ref> r_expand(const Ref& x, const Dims& sizes) {
  if (sizes.size() < x.shape.size()) return std::nullopt;
  const size_t lead = sizes.size() - x.shape.size();
  Ref r = x;
  r.shape.assign(sizes.size(), 0);
  r.strides.assign(sizes.size(), 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i < lead) {
      if (sizes[i] < 0) return std::nullopt;
      r.shape[i] = sizes[i];
      continue;
    }
    const int64_t have = x.shape[i - lead];
    const int64_t want = sizes[i] == -1 ? have : sizes[i];
    if (want == have) {
      r.shape[i] = have;
      r.strides[i] = x.strides[i - lead];
    } else if (have == 1 && want >= 0) {
      r.shape[i] = want;
    } else {
      return std::nullopt;
    }
  }
  return r;
}

bool r_is_contiguous(const Ref& x) {
  if (x.numel() == 0) return true;
  int64_t expected = 1;
  for (int64_t d = x.dim() - 1; d >= 0; --d) {
    if (x.shape[d] == 1) continue;
    if (x.strides[d] != expected) return false;
    expected *= x.shape[d];
  }
  return true;
}

// Strides that let `x`'s memory be read as `ns` (the same elements in row-major order), if any.
// x's non-1 dims form chunks that are each one evenly strided run; the new non-1 dims must split
// exactly along the chunk boundaries.
std::optional<Dims> r_view_strides(const Ref& x, const Dims& ns) {
  if (x.numel() == 0) return dense_strides(ns);
  struct Chunk {
    int64_t numel, inner;
  };
  std::vector<Chunk> chunks;
  int64_t prev = 0;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (x.shape[d] == 1) continue;
    if (!chunks.empty() && prev == x.strides[d] * x.shape[d]) {
      chunks.back().numel *= x.shape[d];
      chunks.back().inner = x.strides[d];
    } else {
      chunks.push_back({x.shape[d], x.strides[d]});
    }
    prev = x.strides[d];
  }
  Dims st(ns.size(), 1);
  size_t j = 0;
  for (const auto& c : chunks) {
    std::vector<size_t> group;
    int64_t prod = 1;
    while (prod < c.numel) {
      if (j >= ns.size()) return std::nullopt;
      if (ns[j] != 1) {
        group.push_back(j);
        prod *= ns[j];
      }
      ++j;
    }
    if (prod != c.numel) return std::nullopt;
    int64_t s = c.inner;
    for (auto it = group.rbegin(); it != group.rend(); ++it) {
      st[*it] = s;
      s *= ns[*it];
    }
  }
  for (; j < ns.size(); ++j)
    if (ns[j] != 1) return std::nullopt;
  return st;
}

// reshape: a view when the memory allows it (PyTorch's rule), otherwise a dense copy.
Ref r_reshape(const Ref& x, const Dims& ns) {
  if (auto st = r_view_strides(x, ns)) {
    Ref r = x;
    r.shape = ns;
    r.strides = *st;
    return r;
  }
  Ref c = ref_copy(x);
  c.shape = ns;
  c.strides = dense_strides(ns);
  return c;
}

// flip: always a new buffer.
Ref r_flip(const Ref& x, const Dims& dims) {
  std::vector<bool> f(x.shape.size(), false);
  for (int64_t d : dims)
    if (x.dim() > 0) f[wrap(d, x.dim())] = true;
  const std::vector<double> v = x.values();
  std::vector<double> out;
  for_each_index(x.shape, [&](const Dims& idx) {
    Dims src = idx;
    for (size_t d = 0; d < src.size(); ++d)
      if (f[d]) src[d] = x.shape[d] - 1 - idx[d];
    out.push_back(v.at(linear(src, x.shape)));
  });
  return make_ref(out, x.shape, x.dtype);
}

Ref r_contiguous(const Ref& x) { return r_is_contiguous(x) ? x : ref_copy(x); }

// An item of x.index({...}).
struct Idx {
  enum Kind { Int, Sl, None, Ell } kind = Sl;
  int64_t i = 0;
  std::optional<int64_t> start, stop;
  int64_t step = 1;
};

Idx idx_of(Idx::Kind k) {
  Idx it;
  it.kind = k;
  return it;
}

std::string idx_str(const std::vector<Idx>& items) {
  std::ostringstream os;
  os << "{";
  for (size_t k = 0; k < items.size(); ++k) {
    const Idx& it = items[k];
    os << (k ? ", " : "");
    switch (it.kind) {
      case Idx::Int: os << it.i; break;
      case Idx::Sl: os << "Slice(" << opt_str(it.start) << ", " << opt_str(it.stop) << ", " << it.step << ")"; break;
      case Idx::None: os << "None"; break;
      case Idx::Ell: os << "..."; break;
    }
  }
  os << "}";
  return os.str();
}

std::vector<kiln::TensorIndex> to_kiln(const std::vector<Idx>& items) {
  std::vector<kiln::TensorIndex> out;
  for (const Idx& it : items) {
    switch (it.kind) {
      case Idx::Int: out.emplace_back(it.i); break;
      case Idx::Sl: out.emplace_back(kiln::Slice(it.start, it.stop, it.step)); break;
      case Idx::None: out.emplace_back(kiln::None); break;
      case Idx::Ell: out.emplace_back(kiln::Ellipsis); break;
    }
  }
  return out;
}

// x[items] the numpy way: expand the ellipsis into full slices, then walk input dims once,
// building the output layout directly (trailing dims unindexed).
Ref r_index(const Ref& x, const std::vector<Idx>& items) {
  int64_t consumed = 0;
  for (const Idx& it : items) consumed += (it.kind == Idx::Int || it.kind == Idx::Sl);
  std::vector<Idx> full;
  for (const Idx& it : items) {
    if (it.kind != Idx::Ell) {
      full.push_back(it);
      continue;
    }
    for (int64_t k = 0; k < x.dim() - consumed; ++k) full.push_back(Idx{});
  }
  Ref r = x;
  r.shape.clear();
  r.strides.clear();
  int64_t d = 0;
  for (const Idx& it : full) {
    if (it.kind == Idx::None) {
      r.shape.push_back(1);
      r.strides.push_back(0);
    } else if (it.kind == Idx::Int) {
      r.offset += (it.i < 0 ? it.i + x.shape[d] : it.i) * x.strides[d];
      ++d;
    } else {
      auto [b, e] = py_bounds(it.start, it.stop, x.shape[d]);
      r.offset += b * x.strides[d];
      r.shape.push_back((e - b + it.step - 1) / it.step);
      r.strides.push_back(x.strides[d] * it.step);
      ++d;
    }
  }
  for (; d < x.dim(); ++d) {
    r.shape.push_back(x.shape[d]);
    r.strides.push_back(x.strides[d]);
  }
  return r;
}

// Reduction reference: op in {"sum", "amax", "amin", "mean"}.
Ref r_reduce(const Ref& x, const std::string& op, const Dims& dims, bool keepdim) {
  std::vector<bool> red(x.shape.size(), dims.empty());
  for (int64_t d : dims)
    if (x.dim() > 0) red[wrap(d, x.dim())] = true;
  Dims out_shape;
  int64_t count = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (red[d]) count *= x.shape[d];
    if (!red[d])
      out_shape.push_back(x.shape[d]);
    else if (keepdim)
      out_shape.push_back(1);
  }
  const int64_t n_out = numel_of(out_shape);
  std::vector<double> acc(n_out, op == "sum" || op == "mean" ? 0.0 : kNaN);
  std::vector<bool> seen(n_out, false), nan(n_out, false);
  const std::vector<double> v = x.values();
  int64_t k = 0;
  for_each_index(x.shape, [&](const Dims& idx) {
    int64_t o = 0;
    for (int64_t d = 0; d < x.dim(); ++d)
      if (!red[d]) o = o * x.shape[d] + idx[d];
    const double e = v[k++];
    if (op == "sum" || op == "mean") {
      acc[o] += e;
    } else {
      if (std::isnan(e)) nan[o] = true;
      if (!seen[o] || (op == "amax" ? e > acc[o] : e < acc[o])) acc[o] = e;
      seen[o] = true;
    }
  });
  DType out_t = x.dtype;
  if (op == "sum" && !is_float(x.dtype)) out_t = kI64;
  for (int64_t o = 0; o < n_out; ++o) {
    if (nan[o]) acc[o] = kNaN;
    if (op == "mean") acc[o] = to_dtype(out_t, to_dtype(out_t, acc[o]) / static_cast<double>(count));
    acc[o] = to_dtype(out_t, acc[o]);
  }
  return make_ref(acc, out_shape, out_t);
}

// ============================================================== checks

bool same_value(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

std::string values_str(const std::vector<double>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size() && i < 48; ++i) os << (i ? ", " : "") << v[i];
  if (v.size() > 48) os << ", ...";
  os << "]";
  return os.str();
}

// Checks dtype, shape and values of `t` against `r`; returns false on a mismatch.
bool check_tensor(const Tensor& t, const Ref& r, const std::string& what, const std::string& log) {
  if (t.dtype() != r.dtype) {
    ADD_FAILURE() << what << ": dtype " << dname(t.dtype()) << ", expected " << dname(r.dtype) << "\n  ops:\n" << log;
    return false;
  }
  if (t.sizes() != r.shape) {
    ADD_FAILURE() << what << ": shape " << str(t.sizes()) << ", expected " << str(r.shape) << "\n  ops:\n" << log;
    return false;
  }
  const std::vector<double> got = t.to_vector<double>(), want = r.values();
  for (size_t i = 0; i < want.size(); ++i) {
    if (i >= got.size() || !same_value(got[i], want[i])) {
      ADD_FAILURE() << what << " (" << dname(r.dtype) << str(r.shape) << "): element " << i << " is "
                    << (i < got.size() ? got[i] : kNaN) << ", expected " << want[i]
                    << "\n  got:      " << values_str(got) << "\n  expected: " << values_str(want) << "\n  ops:\n"
                    << log;
      return false;
    }
  }
  return true;
}

// Runs f, which must throw kiln::Error.
template <class F>
void expect_error(F&& f, const std::string& what, const std::string& log) {
  try {
    f();
  } catch (const kiln::Error&) {
    return;
  }
  ADD_FAILURE() << what << ": expected kiln::Error, nothing was thrown\n  ops:\n" << log;
}

const char* raw_data(const Tensor& t) {
  switch (t.dtype()) {
    case kBool: return reinterpret_cast<const char*>(t.data<bool>());
    case kI32: return reinterpret_cast<const char*>(t.data<int32_t>());
    case kI64: return reinterpret_cast<const char*>(t.data<int64_t>());
    case kF32: return reinterpret_cast<const char*>(t.data<float>());
    case kF64: return reinterpret_cast<const char*>(t.data<double>());
    default: return nullptr;
  }
}

// A kiln tensor and its reference.
struct Held {
  Tensor t;
  Ref r;
  std::string name;
};

// Views alias: tensors whose references share a buffer must share kiln memory at the same
// relative element positions, and tensors over different reference buffers share none.
void check_aliasing(const std::vector<Held>& hs, const std::string& log) {
  struct Addr {
    const std::vector<double>* buf;
    std::vector<intptr_t> kiln;
    std::vector<int64_t> ref;
    intptr_t item;
    const std::string* name;
  };
  std::vector<Addr> as;
  for (const Held& h : hs) {
    if (h.r.numel() == 0 || h.t.sizes() != h.r.shape) continue;
    Addr a{h.r.buf.get(), {}, h.r.offsets(), static_cast<intptr_t>(kiln::itemsize(h.t.dtype())), &h.name};
    const intptr_t p = reinterpret_cast<intptr_t>(raw_data(h.t));
    const Dims ks = h.t.strides();
    for_each_index(h.r.shape, [&](const Dims& idx) {
      int64_t o = 0;
      for (size_t d = 0; d < idx.size(); ++d) o += idx[d] * ks[d];
      a.kiln.push_back(p + static_cast<intptr_t>(o) * a.item);
    });
    as.push_back(std::move(a));
  }
  for (size_t i = 0; i < as.size(); ++i) {
    size_t j = 0;
    while (as[j].buf != as[i].buf) ++j;  // the first tensor over this buffer anchors it
    for (size_t k = 0; k < as[i].kiln.size(); ++k) {
      if (as[i].kiln[k] - as[j].kiln[0] != (as[i].ref[k] - as[j].ref[0]) * as[i].item) {
        ADD_FAILURE() << *as[i].name << ": element " << k << " is not where a view of " << *as[j].name
                      << " puts it (kiln memory offset " << (as[i].kiln[k] - as[j].kiln[0]) / as[i].item
                      << ", expected " << (as[i].ref[k] - as[j].ref[0]) << ")\n  ops:\n"
                      << log;
        break;
      }
    }
  }
  for (size_t i = 0; i < as.size(); ++i) {
    std::set<intptr_t> mine(as[i].kiln.begin(), as[i].kiln.end());
    for (size_t j = i + 1; j < as.size(); ++j) {
      if (as[j].buf == as[i].buf) continue;
      for (intptr_t a : as[j].kiln)
        if (mine.count(a)) {
          ADD_FAILURE() << *as[j].name << " shares memory with " << *as[i].name
                        << " although one of them is a copy\n  ops:\n"
                        << log;
          return;
        }
    }
  }
}

// ============================================================== random inputs

DType random_dtype(Rng& rng) { return rng.pick({kBool, kI32, kI64, kF32, kF64}); }

double random_value(Rng& rng, DType dt, bool specials) {
  switch (dt) {
    case kBool: return rng.coin() ? 1 : 0;
    case kI32:
    case kI64: return rng.coin(0.15) ? 0 : static_cast<double>(rng.range(-9, 9));
    default:
      if (specials && rng.coin(0.04)) return rng.pick({kNaN, kInf, -kInf});
      return rng.coin(0.1) ? 0 : static_cast<double>(rng.range(-40, 40)) / 4;
  }
}

// A size for a random dim: mostly 2-4, sometimes 1, rarely 0.
int64_t random_size(Rng& rng) {
  const int64_t r = rng.range(0, 99);
  return r < 6 ? 0 : r < 26 ? 1 : rng.range(2, 4);
}

Dims random_shape(Rng& rng, int64_t min_rank = 0, int64_t max_rank = 4) {
  Dims s(static_cast<size_t>(rng.range(min_rank, max_rank)));
  for (auto& x : s) x = random_size(rng);
  return s;
}

// A shape that broadcasts to `out`: a suffix of it with some dims set to 1.
Dims operand_shape(Rng& rng, const Dims& out) {
  const int64_t k = rng.range(0, static_cast<int64_t>(out.size()));
  Dims s(out.end() - k, out.end());
  for (auto& x : s)
    if (rng.coin(0.3)) x = 1;
  return s;
}

// A shape holding exactly n elements, rank 0-4 (n = 0: some dim is 0).
Dims shape_with_numel(Rng& rng, int64_t n) {
  int64_t rank = rng.range(0, 4);
  if (n == 0) {
    rank = std::max<int64_t>(rank, 1);
    Dims s(rank);
    for (auto& x : s) x = rng.range(0, 3);
    s[rng.range(0, rank - 1)] = 0;
    return s;
  }
  if (n > 1 && rank == 0) rank = 1;
  Dims s(rank, 1);
  int64_t m = n;
  for (int64_t f = 2; m > 1;) {
    if (m % f == 0) {
      s[rng.range(0, rank - 1)] *= f;
      m /= f;
    } else {
      ++f;
    }
  }
  return s;
}

Dims random_perm(Rng& rng, int64_t n) {
  Dims p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[rng.range(0, i)]);
  return p;
}

// A slice bound for a dim of size sz: None, in range (maybe written negative), or wild.
std::optional<int64_t> random_bound(Rng& rng, int64_t sz, bool is_start) {
  const int64_t r = rng.range(0, 9);
  if (r < 3) return std::nullopt;
  if (r < 8) {
    const int64_t v = is_start ? rng.range(0, std::max<int64_t>(sz - 1, 0)) : rng.range(std::min<int64_t>(1, sz), sz);
    return rng.coin(0.4) ? v - sz : v;
  }
  return rng.range(-sz - 3, sz + 3);
}

// A kiln tensor holding `vals` (row-major over `shape`) in a random layout: dense, a permuted
// dense storage, every other element of a larger storage, or expanded; lazy or evaluated.
struct Input {
  Tensor t;
  std::vector<double> vals;  // logical values, row-major
  std::string how;
  Ref ref;  // the same layout over a model of the hidden storage
};

// `given`: use these logical values (then never expanded).
Input make_input(Rng& rng, const Dims& shape, DType dt, bool specials, bool allow_eval = true,
                 const std::vector<double>* given = nullptr) {
  Input in;
  const int64_t n = static_cast<int64_t>(shape.size());
  int layout = static_cast<int>(rng.range(0, given ? 2 : 3));
  if (layout == 1 && n < 2) layout = 0;
  if (layout == 2 && n < 1) layout = 0;
  if (layout == 3) {
    Dims small = shape;
    for (auto& s : small)
      if (rng.coin(0.5)) s = 1;
    std::vector<double> sv(static_cast<size_t>(numel_of(small)));
    for (auto& v : sv) v = random_value(rng, dt, specials);
    in.vals = broadcast_values(sv, small, shape);
    in.t = kiln::from_vector<double>(sv, small).to(dt).expand(shape);
    in.ref = *r_expand(make_ref(sv, small, dt), shape);
    in.how = "expanded from " + str(small);
  } else {
    if (given) {
      in.vals = *given;
    } else {
      in.vals.resize(static_cast<size_t>(numel_of(shape)));
      for (auto& v : in.vals) v = random_value(rng, dt, specials);
    }
    if (layout == 0) {
      in.t = kiln::from_vector<double>(in.vals, shape).to(dt);
      in.ref = make_ref(in.vals, shape, dt);
      in.how = "dense";
    } else if (layout == 1) {
      // Storage holds x.permute(p); permuting back by p's inverse gives x.
      const Dims p = random_perm(rng, n);
      Dims q(n), inv(n);
      for (int64_t i = 0; i < n; ++i) {
        q[i] = shape[p[i]];
        inv[p[i]] = i;
      }
      std::vector<double> sv;
      for_each_index(q, [&](const Dims& j) {
        Dims idx(n);
        for (int64_t i = 0; i < n; ++i) idx[p[i]] = j[i];
        sv.push_back(in.vals.at(linear(idx, shape)));
      });
      in.t = kiln::from_vector<double>(sv, q).to(dt).permute(inv);
      in.ref = r_permute(make_ref(sv, q, dt), inv);
      in.how = "permuted " + str(inv) + " of dense " + str(q);
    } else {
      // Element idx lives at 2 * idx + 1 of a storage twice as large (plus one) per dim.
      Dims q(n);
      for (int64_t i = 0; i < n; ++i) q[i] = 2 * shape[i] + 1;
      std::vector<double> sv(static_cast<size_t>(numel_of(q)), 7);
      int64_t k = 0;
      for_each_index(shape, [&](const Dims& idx) {
        Dims j(n);
        for (int64_t i = 0; i < n; ++i) j[i] = 2 * idx[i] + 1;
        sv.at(linear(j, q)) = in.vals[k++];
      });
      in.t = kiln::from_vector<double>(sv, q).to(dt);
      in.ref = make_ref(sv, q, dt);
      for (int64_t i = 0; i < n; ++i) {
        in.t = in.t.slice(i, 1, std::nullopt, 2);
        in.ref = r_slice(in.ref, i, 1, std::nullopt, 2);
      }
      in.how = "every other element of " + str(q);
    }
  }
  if (allow_eval && rng.coin(0.3)) {
    in.t.eval();
    in.how += ", evaluated";
  }
  return in;
}

// A C++ number operand, or a tensor operand.
struct Arg {
  bool is_scalar = false;
  Scalar s;
  double sval = 0;
  DType sdtype = kI64;  // dtype PyTorch gives the wrapped number
  Dims shape;
  DType dtype = kF32;
  Input in;

  TypeArg type() const { return is_scalar ? TypeArg{sdtype, 0} : TypeArg{dtype, shape.empty() ? 1 : 2}; }
  std::string str() const {
    std::ostringstream os;
    if (is_scalar) {
      os << (sdtype == kBool ? (sval != 0 ? "true" : "false") : std::to_string(sval))
         << (sdtype == kBool  ? " (bool)"
             : sdtype == kI64 ? " (int)"
                              : " (double)");
    } else {
      os << dname(dtype) << ::str(shape) << " " << in.how << " " << values_str(in.vals);
    }
    return os.str();
  }
  // Values broadcast to `out`.
  std::vector<double> at(const Dims& out) const {
    if (is_scalar) return std::vector<double>(static_cast<size_t>(numel_of(out)), sval);
    return broadcast_values(in.vals, shape, out);
  }
};

Arg scalar_arg(Rng& rng) {
  Arg a;
  a.is_scalar = true;
  switch (rng.range(0, 2)) {
    case 0: {
      const bool b = rng.coin();
      a.s = b;
      a.sval = b;
      a.sdtype = kBool;
      break;
    }
    case 1: {
      const int64_t v = rng.range(-5, 5);
      a.s = v;
      a.sval = static_cast<double>(v);
      a.sdtype = kI64;
      break;
    }
    default: {
      const double v = static_cast<double>(rng.range(-20, 20)) / 4;
      a.s = v;
      a.sval = v;
      a.sdtype = kF32;
    }
  }
  return a;
}

Arg tensor_arg(Rng& rng, const Dims& shape, DType dt, bool specials, bool allow_eval = true) {
  Arg a;
  a.shape = shape;
  a.dtype = dt;
  a.in = make_input(rng, shape, dt, specials, allow_eval);
  return a;
}

// ============================================================== random view steps

// Applies one random view / movement op to `p` and to its reference, appending it to `log`.
// Invalid variants are generated now and then and must throw (p is then unchanged).
void view_step(Rng& rng, Held& p, bool allow_expand, std::string& log) {
  const Ref& r = p.r;
  const int64_t n = r.dim();
  auto rand_dim = [&]() { return rng.range(-n, n - 1); };  // n >= 1
  std::ostringstream os;
  const int which = static_cast<int>(rng.range(0, 15));
  switch (which) {
    case 0: {  // slice
      if (n == 0) break;
      const int64_t d = rand_dim(), sz = r.shape[wrap(d, n)];
      const auto b = random_bound(rng, sz, true), e = random_bound(rng, sz, false);
      const int64_t st = rng.range(1, 3);
      os << ".slice(" << d << ", " << opt_str(b) << ", " << opt_str(e) << ", " << st << ")";
      p.t = p.t.slice(d, b, e, st);
      p.r = r_slice(p.r, d, b, e, st);
      break;
    }
    case 1: {  // select
      if (n == 0) break;
      const int64_t d = rand_dim(), sz = r.shape[wrap(d, n)];
      if (sz == 0 || rng.coin(0.05)) {
        const int64_t i = rng.coin() ? sz : -sz - 1;
        os << ".select(" << d << ", " << i << ") -> error";
        expect_error([&] { (void)p.t.select(d, i); }, os.str(), log);
        break;
      }
      const int64_t i = rng.range(-sz, sz - 1);
      os << ".select(" << d << ", " << i << ")";
      p.t = p.t.select(d, i);
      p.r = r_select(p.r, d, i);
      break;
    }
    case 2: {  // narrow
      if (n == 0) break;
      const int64_t d = rand_dim(), sz = r.shape[wrap(d, n)];
      const int64_t start = rng.range(-sz, sz), s0 = start < 0 ? start + sz : start;
      const int64_t len = rng.range(0, sz - s0);
      os << ".narrow(" << d << ", " << start << ", " << len << ")";
      p.t = p.t.narrow(d, start, len);
      p.r = r_slice(p.r, d, s0, s0 + len, 1);
      break;
    }
    case 3: {  // transpose
      if (n == 0) break;
      const int64_t a = rand_dim(), b = rand_dim();
      os << ".transpose(" << a << ", " << b << ")";
      p.t = p.t.transpose(a, b);
      Dims perm(n);
      for (int64_t i = 0; i < n; ++i) perm[i] = i;
      std::swap(perm[wrap(a, n)], perm[wrap(b, n)]);
      p.r = r_permute(p.r, perm);
      break;
    }
    case 4: {  // permute (some dims negative)
      Dims perm = random_perm(rng, n);
      for (auto& d : perm)
        if (rng.coin(0.3)) d -= n;
      os << ".permute(" << str(perm) << ")";
      p.t = p.t.permute(perm);
      p.r = r_permute(p.r, perm);
      break;
    }
    case 5: {  // unsqueeze
      if (n >= 5) break;
      const int64_t d = rng.range(-n - 1, n);
      os << ".unsqueeze(" << d << ")";
      p.t = p.t.unsqueeze(d);
      p.r = r_unsqueeze(p.r, d);
      break;
    }
    case 6: {  // squeeze
      std::optional<int64_t> d;
      if (rng.coin(0.6)) d = n == 0 ? rng.pick<int64_t>({0, -1}) : rand_dim();
      os << ".squeeze(" << opt_str(d) << ")";
      p.t = p.t.squeeze(d);
      p.r = r_squeeze(p.r, d);
      break;
    }
    case 7: {  // expand
      if (!allow_expand) break;
      Dims sizes;
      if (n < 4 && rng.coin(0.3)) sizes.push_back(rng.coin(0.1) ? 0 : rng.range(1, 3));
      for (int64_t s : r.shape) {
        if (s == 1)
          sizes.push_back(rng.pick<int64_t>({1, 2, 3, -1, 3, 2, 0}));
        else
          sizes.push_back(rng.coin(0.3) ? -1 : s);
      }
      const bool bad = rng.coin(0.05) && n > 0;
      if (bad) {
        const int64_t d = static_cast<int64_t>(sizes.size()) - 1 - rng.range(0, n - 1);
        const int64_t have = r.shape[d - (static_cast<int64_t>(sizes.size()) - n)];
        if (have != 1) sizes[d] = have + 1;
      }
      auto e = r_expand(r, sizes);
      if (!e) {
        os << ".expand(" << str(sizes) << ") -> error";
        expect_error([&] { (void)p.t.expand(sizes); }, os.str(), log);
        break;
      }
      if (e->numel() > 600) break;
      os << ".expand(" << str(sizes) << ")";
      p.t = p.t.expand(sizes);
      p.r = *e;
      break;
    }
    case 8:
    case 9: {  // reshape / view (maybe with -1)
      const int64_t total = r.numel();
      Dims ns = shape_with_numel(rng, total);
      Dims arg = ns;
      if (total > 0 && !arg.empty() && rng.coin(0.3)) arg[rng.range(0, static_cast<int64_t>(arg.size()) - 1)] = -1;
      const bool as_view = which == 9 && rng.coin(0.5);
      auto st = r_view_strides(r, ns);
      if (as_view && !st) {
        os << ".view(" << str(arg) << ") -> error";
        expect_error([&] { (void)p.t.view(arg); }, os.str(), log);
        break;
      }
      os << (as_view ? ".view(" : ".reshape(") << str(arg) << ")" << (st ? "" : " [copy]");
      p.t = as_view ? p.t.view(arg) : p.t.reshape(arg);
      p.r = r_reshape(p.r, ns);
      break;
    }
    case 10: {  // t()
      if (n > 2) {
        os << ".t() -> error";
        expect_error([&] { (void)p.t.t(); }, os.str(), log);
        break;
      }
      os << ".t()";
      p.t = p.t.t();
      if (n == 2) p.r = r_permute(p.r, {1, 0});
      break;
    }
    case 11: {  // flip (a copy)
      Dims dims;
      if (n == 0) {
        dims.push_back(rng.pick<int64_t>({0, -1}));
      } else {
        Dims perm = random_perm(rng, n);
        const int64_t k = rng.range(1, n);
        for (int64_t i = 0; i < k; ++i) dims.push_back(rng.coin(0.3) ? perm[i] - n : perm[i]);
      }
      os << ".flip(" << str(dims) << ") [copy]";
      p.t = p.t.flip(dims);
      p.r = r_flip(p.r, dims);
      break;
    }
    case 12:
    case 13: {  // index({...})
      const bool ell = rng.coin(0.4);
      const int64_t k = rng.range(0, n);
      const int64_t before = ell ? rng.range(0, k) : k;
      std::vector<Idx> items;
      auto consume = [&](int64_t d) {
        Idx it;
        const int64_t sz = r.shape[d];
        if (sz > 0 && rng.coin(0.35)) {
          it.kind = Idx::Int;
          it.i = rng.range(-sz, sz - 1);
        } else {
          it.start = random_bound(rng, sz, true);
          it.stop = random_bound(rng, sz, false);
          it.step = rng.range(1, 3);
        }
        items.push_back(it);
      };
      for (int64_t d = 0; d < before; ++d) consume(d);
      if (ell) {
        items.push_back(idx_of(Idx::Ell));
        for (int64_t d = n - (k - before); d < n; ++d) consume(d);
      }
      const int64_t nones = rng.coin(0.5) ? rng.range(1, 2) : 0;
      for (int64_t j = 0; j < nones; ++j)
        items.insert(items.begin() + rng.range(0, static_cast<int64_t>(items.size())), idx_of(Idx::None));
      Ref res = r_index(r, items);
      if (res.dim() > 5) break;
      os << ".index(" << idx_str(items) << ")";
      p.t = p.t.index(to_kiln(items));
      p.r = res;
      break;
    }
    case 14: {  // contiguous
      os << ".contiguous()" << (r_is_contiguous(r) ? "" : " [copy]");
      p.t = p.t.contiguous();
      p.r = r_contiguous(p.r);
      break;
    }
    default: {  // flatten
      int64_t s = 0, e = -1;
      Dims ns{1};
      if (n > 0) {
        int64_t a = rng.range(0, n - 1), b = rng.range(0, n - 1);
        if (a > b) std::swap(a, b);
        s = rng.coin(0.3) ? a - n : a;
        e = rng.coin(0.3) ? b - n : b;
        ns.clear();
        for (int64_t d = 0; d < a; ++d) ns.push_back(r.shape[d]);
        int64_t prod = 1;
        for (int64_t d = a; d <= b; ++d) prod *= r.shape[d];
        ns.push_back(prod);
        for (int64_t d = b + 1; d < n; ++d) ns.push_back(r.shape[d]);
      }
      os << ".flatten(" << s << ", " << e << ")" << (r_view_strides(r, ns) ? "" : " [copy]");
      p.t = p.t.flatten(s, e);
      p.r = r_reshape(p.r, ns);
      break;
    }
  }
  log += os.str();
}

// Distinct values (so a misplaced element shows), random for bool.
std::vector<double> distinct_values(Rng& rng, int64_t n, DType dt) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (dt == kBool)
      v[i] = rng.coin() ? 1 : 0;
    else if (is_float(dt))
      v[i] = static_cast<double>(i - n / 2) * 0.25 + 0.5;
    else
      v[i] = static_cast<double>(i + 1);
  }
  return v;
}

// A fresh tensor holding `vals`: dense, lazy (a cast node) or evaluated; with `any_layout`,
// sometimes a non-contiguous view of a hidden storage (permuted or strided).
Held make_base(Rng& rng, const Dims& shape, DType dt, std::vector<double> vals, const std::string& name,
               bool any_layout = false) {
  Held h;
  h.name = name;
  if (any_layout && rng.coin(0.4)) {
    Input in = make_input(rng, shape, dt, false, true, &vals);
    h.t = in.t;
    h.r = in.ref;
    h.name += " (" + in.how + ")";
    return h;
  }
  h.t = kiln::from_vector<double>(vals, shape).to(dt);
  if (rng.coin(0.4)) h.t.eval();
  h.r = make_ref(std::move(vals), shape, dt);
  return h;
}

// ============================================================== 1. broadcasting binary ops

enum class Bin { Add, Sub, Mul, Div, Maximum, Minimum, Eq, Ne, Lt, Le, Gt, Ge, Where, AddAlpha, SubAlpha, Count };
const char* bin_name(Bin b) {
  static const char* names[] = {"add", "sub", "mul", "div", "maximum", "minimum",    "eq",        "ne",
                                "lt",  "le",  "gt",  "ge",  "where",   "add(alpha)", "sub(alpha)"};
  return names[static_cast<int>(b)];
}

// Calls f with the two operands as Tensor or Scalar, whichever they are.
template <class F>
Tensor apply2(const Arg& x, const Arg& y, F&& f) {
  if (x.is_scalar) return f(x.s, y.in.t);
  if (y.is_scalar) return f(x.in.t, y.s);
  return f(x.in.t, y.in.t);
}

Tensor run_binary(Bin op, const std::vector<Arg>& a, Scalar alpha, bool use_operator) {
  switch (op) {
    case Bin::Add:
      return use_operator ? apply2(a[0], a[1], [](const auto& x, const auto& y) { return x + y; })
                          : apply2(a[0], a[1], [](const auto& x, const auto& y) { return kiln::add(x, y); });
    case Bin::Sub:
      return use_operator ? apply2(a[0], a[1], [](const auto& x, const auto& y) { return x - y; })
                          : apply2(a[0], a[1], [](const auto& x, const auto& y) { return kiln::sub(x, y); });
    case Bin::Mul:
      return use_operator ? apply2(a[0], a[1], [](const auto& x, const auto& y) { return x * y; })
                          : apply2(a[0], a[1], [](const auto& x, const auto& y) { return kiln::mul(x, y); });
    case Bin::Div:
      return use_operator ? apply2(a[0], a[1], [](const auto& x, const auto& y) { return x / y; })
                          : apply2(a[0], a[1], [](const auto& x, const auto& y) { return kiln::div(x, y); });
    case Bin::Maximum: return apply2(a[0], a[1], [](const auto& x, const auto& y) { return kiln::maximum(x, y); });
    case Bin::Minimum: return apply2(a[0], a[1], [](const auto& x, const auto& y) { return kiln::minimum(x, y); });
    case Bin::Eq:
      return use_operator ? apply2(a[0], a[1], [](const auto& x, const auto& y) { return x == y; })
                          : apply2(a[0], a[1], [](const auto& x, const auto& y) { return kiln::eq(x, y); });
    case Bin::Ne:
      return use_operator ? apply2(a[0], a[1], [](const auto& x, const auto& y) { return x != y; })
                          : apply2(a[0], a[1], [](const auto& x, const auto& y) { return kiln::ne(x, y); });
    case Bin::Lt:
      return use_operator ? apply2(a[0], a[1], [](const auto& x, const auto& y) { return x < y; })
                          : apply2(a[0], a[1], [](const auto& x, const auto& y) { return kiln::lt(x, y); });
    case Bin::Le:
      return use_operator ? apply2(a[0], a[1], [](const auto& x, const auto& y) { return x <= y; })
                          : apply2(a[0], a[1], [](const auto& x, const auto& y) { return kiln::le(x, y); });
    case Bin::Gt:
      return use_operator ? apply2(a[0], a[1], [](const auto& x, const auto& y) { return x > y; })
                          : apply2(a[0], a[1], [](const auto& x, const auto& y) { return kiln::gt(x, y); });
    case Bin::Ge:
      return use_operator ? apply2(a[0], a[1], [](const auto& x, const auto& y) { return x >= y; })
                          : apply2(a[0], a[1], [](const auto& x, const auto& y) { return kiln::ge(x, y); });
    case Bin::Where: {
      const Tensor& c = a[0].in.t;
      if (a[1].is_scalar && a[2].is_scalar) return kiln::where(c, a[1].s, a[2].s);
      return apply2(a[1], a[2], [&](const auto& x, const auto& y) { return kiln::where(c, x, y); });
    }
    case Bin::AddAlpha: return kiln::add(a[0].in.t, a[1].in.t, alpha);
    case Bin::SubAlpha: return kiln::sub(a[0].in.t, a[1].in.t, alpha);
    default: break;
  }
  return Tensor();
}

Op to_op(Bin b) {
  switch (b) {
    case Bin::Sub:
    case Bin::SubAlpha: return Op::Sub;
    case Bin::Mul: return Op::Mul;
    case Bin::Div: return Op::Div;
    case Bin::Maximum: return Op::Maximum;
    case Bin::Minimum: return Op::Minimum;
    case Bin::Eq: return Op::Eq;
    case Bin::Ne: return Op::Ne;
    case Bin::Lt: return Op::Lt;
    case Bin::Le: return Op::Le;
    case Bin::Gt: return Op::Gt;
    case Bin::Ge: return Op::Ge;
    default: return Op::Add;
  }
}

bool is_compare(Bin b) { return b >= Bin::Eq && b <= Bin::Ge; }

TEST(RandomBroadcast, BinaryOpsMatchReference) {
  run_cases("binary", 2000, [](Rng& rng, std::string& log) {
    const Bin op = static_cast<Bin>(rng.range(0, static_cast<int64_t>(Bin::Count) - 1));
    const bool alpha_op = op == Bin::AddAlpha || op == Bin::SubAlpha;
    const int nargs = op == Bin::Where ? 3 : 2;
    Dims out(static_cast<size_t>(rng.range(0, 4)));
    for (auto& s : out) s = random_size(rng);
    std::vector<Arg> args(nargs);
    int scalars = 0;
    for (int i = 0; i < nargs; ++i) {
      const bool may_scalar = !alpha_op && !(op == Bin::Where && i == 0) && (op == Bin::Where || scalars == 0);
      if (may_scalar && rng.coin(0.2)) {
        args[i] = scalar_arg(rng);
        ++scalars;
        continue;
      }
      Dims s = operand_shape(rng, out);
      if (!s.empty() && rng.coin(0.05)) s[rng.range(0, static_cast<int64_t>(s.size()) - 1)] = rng.range(0, 4);
      const DType dt = (op == Bin::Where && i == 0) ? kBool : random_dtype(rng);
      args[i] = tensor_arg(rng, s, dt, /*specials=*/true);
    }
    std::vector<TypeArg> types;
    for (int i = op == Bin::Where ? 1 : 0; i < nargs; ++i) types.push_back(args[i].type());
    const DType rt = ref_result_type(types);

    // alpha: valid for the result type, now and then not.
    Scalar alpha = 1;
    double alpha_v = 1;
    bool bad_alpha = false;
    if (alpha_op) {
      const int kind = static_cast<int>(rng.range(0, 9));
      if (kind == 0) {  // a float alpha: only for floating results
        alpha = 0.5;
        alpha_v = 0.5;
        bad_alpha = !is_float(rt);
      } else if (kind == 1) {  // a bool alpha: only for bool results
        alpha = true;
        alpha_v = 1;
        bad_alpha = rt != kBool;
      } else if (kind == 2 && is_float(rt)) {
        alpha = -2.0;
        alpha_v = -2;
      } else {
        const int64_t v = rng.pick<int64_t>({2, -1, 3, 0});
        alpha = v;
        alpha_v = static_cast<double>(v);
      }
    }
    const bool use_operator = rng.coin(0.4);

    std::ostringstream os;
    os << "  " << bin_name(op) << (use_operator ? " (operator)" : "");
    if (alpha_op) os << " alpha=" << alpha_v << (alpha.is_floating() ? " (double)" : "");
    os << "\n";
    for (int i = 0; i < nargs; ++i) os << "    arg" << i << ": " << args[i].str() << "\n";
    log = os.str();

    std::vector<Dims> shapes;
    for (const auto& a : args)
      if (!a.is_scalar) shapes.push_back(a.shape);
    const auto bshape = ref_broadcast(shapes);
    bool any_bool = false;
    for (const auto& a : args) any_bool |= a.type().dtype == kBool;
    const bool sub_bool = (op == Bin::Sub || op == Bin::SubAlpha) && any_bool;
    if (!bshape || sub_bool || bad_alpha) {
      expect_error([&] { (void)run_binary(op, args, alpha, use_operator); }, "binary op", log);
      return;
    }
    Tensor result = run_binary(op, args, alpha, use_operator);

    // Reference.
    DType compute = rt, out_t = rt;
    if (op == Bin::Div && !is_float(rt)) compute = out_t = kF32;
    if (is_compare(op)) out_t = kBool;
    std::vector<std::vector<double>> vals;
    for (const auto& a : args) vals.push_back(a.at(*bshape));
    std::vector<double> want(static_cast<size_t>(numel_of(*bshape)));
    for (size_t k = 0; k < want.size(); ++k) {
      if (op == Bin::Where) {
        want[k] = to_dtype(out_t, vals[0][k] != 0 ? vals[1][k] : vals[2][k]);
      } else if (alpha_op) {
        const double scaled = to_dtype(compute, alpha_v * to_dtype(compute, vals[1][k]));
        want[k] = ref_binary(to_op(op), vals[0][k], scaled, compute);
      } else {
        want[k] = ref_binary(to_op(op), vals[0][k], vals[1][k], compute);
      }
    }
    check_tensor(result, make_ref(want, *bshape, out_t), "result", log);
  });
}

// ============================================================== 2. chains of views

TEST(RandomViews, ChainsMatchReference) {
  run_cases("chains", 1500, [](Rng& rng, std::string& log) {
    const DType dt = rng.pick({kBool, kI32, kI64, kF32, kF64, kF32, kI64});
    const Dims shape = random_shape(rng);
    Held cur = make_base(rng, shape, dt, distinct_values(rng, numel_of(shape), dt), "base", /*any_layout=*/true);
    log = "  " + cur.name + " = " + std::string(dname(dt)) + str(shape) +
          (cur.t.is_materialized() ? " (evaluated)" : " (lazy)") + "\n";
    cur.name = "base";
    std::vector<Held> hist{cur};
    const int steps = static_cast<int>(rng.range(1, 6));
    for (int s = 0; s < steps; ++s) {
      const std::string prev = hist.back().name;
      log += "  v" + std::to_string(s + 1) + " = " + prev;
      view_step(rng, cur, /*allow_expand=*/true, log);
      log += "  -> " + str(cur.r.shape) + "\n";
      cur.name = "v" + std::to_string(s + 1);
      hist.push_back(cur);
    }
    // Read intermediate tensors in a random order (materialization order must not matter).
    std::vector<size_t> order(hist.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (rng.coin(0.5)) std::reverse(order.begin(), order.end());
    for (size_t i : order) {
      const Held& h = hist[i];
      if (!check_tensor(h.t, h.r, h.name, log)) return;
      EXPECT_EQ(h.t.is_contiguous(), r_is_contiguous(h.r)) << h.name << " strides " << str(h.t.strides()) << "\n"
                                                           << log;
      Tensor c = h.t.contiguous();
      EXPECT_TRUE(c.is_contiguous()) << h.name << ".contiguous()\n" << log;
      if (!check_tensor(c, h.r, h.name + ".contiguous()", log)) return;
    }
    check_aliasing(hist, log);
  });
}

// ============================================================== 3. in-place through views

// True when no two elements of `r` share a buffer position (the view may be written).
bool writable(const Ref& r) {
  std::vector<int64_t> o = r.offsets();
  std::sort(o.begin(), o.end());
  return std::adjacent_find(o.begin(), o.end()) == o.end();
}

// Operand dtypes an in-place op on `self` accepts, or (bad) ones it must reject.
DType operand_dtype(Rng& rng, DType self, bool bad) {
  if (bad) {
    if (self == kBool) return rng.pick({kI32, kF32});
    if (!is_float(self)) return rng.pick({kF32, kF64});
  }
  if (self == kBool) return kBool;
  if (!is_float(self)) return rng.pick({kBool, kI32, kI64});
  return random_dtype(rng);
}

// Applies a random in-place op to `h` (a base, view or copy) and to the reference, whose
// shared buffer every other view of it reads.
void inplace_step(Rng& rng, Held& h, std::string& log) {
  const DType dt = h.r.dtype;
  const std::vector<double> old = h.r.values();
  std::vector<int64_t> woffs = h.r.offsets();  // buffer positions written ...
  std::vector<double> wvals = old;  // ... and their new values
  bool throws = false;
  std::function<void()> call;
  std::ostringstream os;
  os << "  " << h.name;
  if (!writable(h.r)) {
    // Several elements share memory (expanded): PyTorch refuses to write.
    os << ".fill_(1) [overlapping memory]";
    throws = true;
    call = [&h] { h.t.fill_(1); };
  } else {
    const int kind = static_cast<int>(rng.range(0, 7));
    switch (kind) {
      case 0:
      case 1: {  // add_ / sub_ / mul_ / div_ / add_(alpha) with a tensor
        const Op op = rng.pick({Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Add, Op::Mul});
        const bool use_alpha = op == Op::Add && rng.coin(0.3);
        Dims os_shape = operand_shape(rng, h.r.shape);
        const bool bad_shape = rng.coin(0.04);  // one more dim than the target: can't broadcast into it
        if (bad_shape) {
          os_shape = h.r.shape;
          os_shape.insert(os_shape.begin(), 2);
        }
        const Arg o = tensor_arg(rng, os_shape, operand_dtype(rng, dt, rng.coin(0.08)), false);
        const DType p = ref_result_type({{dt, h.r.dim() > 0 ? 2 : 1}, o.type()});
        const DType res = (op == Op::Div && !is_float(p)) ? kF32 : p;
        int64_t alpha = 1;
        if (use_alpha) alpha = rng.pick<int64_t>({2, -1, 3});
        throws = bad_shape || !ref_can_cast(res, dt) || (op == Op::Sub && (dt == kBool || o.dtype == kBool));
        static const char* names[] = {"add_", "sub_", "mul_", "div_"};
        os << "." << names[static_cast<int>(op)] << "(" << o.str()
           << (use_alpha ? ", alpha=" + std::to_string(alpha) : "") << ")";
        if (!throws) {
          const std::vector<double> b = o.at(h.r.shape);
          for (size_t k = 0; k < old.size(); ++k) {
            double y = b[k];
            if (use_alpha) y = to_dtype(res, static_cast<double>(alpha) * to_dtype(res, y));
            wvals[k] = to_dtype(dt, ref_binary(op, old[k], y, res));
          }
        }
        call = [&h, op, o, use_alpha, alpha] {
          switch (op) {
            case Op::Add:
              if (use_alpha)
                h.t.add_(o.in.t, alpha);
              else
                h.t.add_(o.in.t);
              break;
            case Op::Sub: h.t.sub_(o.in.t); break;
            case Op::Mul: h.t.mul_(o.in.t); break;
            default: h.t.div_(o.in.t); break;
          }
        };
        break;
      }
      case 2: {  // add_ / sub_ / mul_ / div_ with a number
        const Op op = rng.pick({Op::Add, Op::Sub, Op::Mul, Op::Div});
        const Arg s = scalar_arg(rng);
        const DType p = ref_result_type({{dt, h.r.dim() > 0 ? 2 : 1}, s.type()});
        const DType res = (op == Op::Div && !is_float(p)) ? kF32 : p;
        throws = !ref_can_cast(res, dt) || (op == Op::Sub && (dt == kBool || s.sdtype == kBool));
        static const char* names[] = {"add_", "sub_", "mul_", "div_"};
        os << "." << names[static_cast<int>(op)] << "(" << s.str() << ")";
        if (!throws)
          for (size_t k = 0; k < old.size(); ++k) wvals[k] = to_dtype(dt, ref_binary(op, old[k], s.sval, res));
        call = [&h, op, s] {
          switch (op) {
            case Op::Add: h.t.add_(s.s); break;
            case Op::Sub: h.t.sub_(s.s); break;
            case Op::Mul: h.t.mul_(s.s); break;
            default: h.t.div_(s.s); break;
          }
        };
        break;
      }
      case 3: {  // fill_ (any number; cast like PyTorch)
        const Arg s = scalar_arg(rng);
        os << ".fill_(" << s.str() << ")";
        for (auto& v : wvals) v = to_dtype(dt, s.sval);
        call = [&h, s] { h.t.fill_(s.s); };
        break;
      }
      case 4: {  // zero_
        os << ".zero_()";
        for (auto& v : wvals) v = 0;
        call = [&h] { h.t.zero_(); };
        break;
      }
      case 5: {  // copy_ from a broadcastable tensor of any dtype
        const Arg o = tensor_arg(rng, operand_shape(rng, h.r.shape), random_dtype(rng), false);
        os << ".copy_(" << o.str() << ")";
        const std::vector<double> b = o.at(h.r.shape);
        for (size_t k = 0; k < old.size(); ++k) wvals[k] = to_dtype(dt, b[k]);
        call = [&h, o] { h.t.copy_(o.in.t); };
        break;
      }
      default: {  // index_put_ with a tensor or a number
        const int64_t n = h.r.dim();
        const bool ell = rng.coin(0.4);
        const int64_t k = rng.range(0, n);
        const int64_t before = ell ? rng.range(0, k) : k;
        std::vector<Idx> items;
        auto consume = [&](int64_t d) {
          Idx it;
          const int64_t sz = h.r.shape[d];
          if (sz > 0 && rng.coin(0.4)) {
            it.kind = Idx::Int;
            it.i = rng.range(-sz, sz - 1);
          } else {
            it.start = random_bound(rng, sz, true);
            it.stop = random_bound(rng, sz, false);
            it.step = rng.range(1, 3);
          }
          items.push_back(it);
        };
        for (int64_t d = 0; d < before; ++d) consume(d);
        if (ell) {
          items.push_back(idx_of(Idx::Ell));
          for (int64_t d = n - (k - before); d < n; ++d) consume(d);
        }
        if (rng.coin(0.2))
          items.insert(items.begin() + rng.range(0, static_cast<int64_t>(items.size())), idx_of(Idx::None));
        const Ref sub = r_index(h.r, items);
        woffs = sub.offsets();
        wvals.clear();
        if (rng.coin(0.6)) {
          const Arg v = tensor_arg(rng, operand_shape(rng, sub.shape), random_dtype(rng), false);
          os << ".index_put_(" << idx_str(items) << ", " << v.str() << ")";
          for (double x : v.at(sub.shape)) wvals.push_back(to_dtype(dt, x));
          call = [&h, items, v] { h.t.index_put_(to_kiln(items), v.in.t); };
        } else {
          const Arg s = scalar_arg(rng);
          os << ".index_put_(" << idx_str(items) << ", " << s.str() << ")";
          wvals.assign(woffs.size(), to_dtype(dt, s.sval));
          call = [&h, items, s] { h.t.index_put_(to_kiln(items), s.s); };
        }
        break;
      }
    }
  }
  if (throws) os << " -> error";
  log += os.str() + "\n";
  if (throws) {
    expect_error(call, os.str(), log);
    EXPECT_EQ(h.t.dtype(), dt) << log;
    return;
  }
  call();
  for (size_t k = 0; k < woffs.size(); ++k) h.r.buf->at(static_cast<size_t>(woffs[k])) = wvals[k];
}

// Restores kiln's pending-node limit (a low limit materializes while ops are being recorded).
struct PendingLimitGuard {
  uint64_t old = kiln::pending_limit();
  ~PendingLimitGuard() { kiln::set_pending_limit(old); }
};

TEST(RandomViews, InPlaceWritesThroughViews) {
  run_cases("inplace", 1500, [](Rng& rng, std::string& log) {
    const DType dt = rng.pick({kBool, kI32, kI64, kF32, kF64, kF32, kI64});
    const Dims shape = random_shape(rng, rng.coin(0.1) ? 0 : 1, 4);
    PendingLimitGuard guard;
    if (rng.coin(0.2)) {
      kiln::set_pending_limit(static_cast<uint64_t>(rng.range(0, 6)));
      log = "  (pending limit " + std::to_string(kiln::pending_limit()) + ")\n";
    }
    std::vector<Held> live{make_base(rng, shape, dt, distinct_values(rng, numel_of(shape), dt), "base", true)};
    log += "  " + live[0].name + " = " + std::string(dname(dt)) + str(shape) + "\n";
    live[0].name = "base";
    auto add_view = [&] {
      const size_t from = static_cast<size_t>(rng.range(0, static_cast<int64_t>(live.size()) - 1));
      Held v = live[from];
      v.name = "v" + std::to_string(live.size());
      log += "  " + v.name + " = " + live[from].name;
      const int steps = static_cast<int>(rng.range(1, 3));
      for (int s = 0; s < steps; ++s) view_step(rng, v, /*allow_expand=*/rng.coin(0.3), log);
      log += "  -> " + str(v.r.shape) + "\n";
      live.push_back(v);
    };
    const int nviews = static_cast<int>(rng.range(1, 3));
    for (int i = 0; i < nviews; ++i) add_view();
    const int nops = static_cast<int>(rng.range(1, 4));
    for (int i = 0; i < nops; ++i) {
      if (i > 0 && rng.coin(0.3)) add_view();
      // Mostly write through a view; overlapping (expanded) targets must be refused.
      std::vector<size_t> targets;
      for (size_t j = 0; j < live.size(); ++j)
        if (writable(live[j].r) || rng.coin(0.1)) targets.push_back(j);
      if (targets.empty()) targets.push_back(0);
      Held& tgt = live[targets[static_cast<size_t>(rng.range(0, static_cast<int64_t>(targets.size()) - 1))]];
      inplace_step(rng, tgt, log);
      if (rng.coin(0.3)) {  // read something now: later writes must still reach it
        const Held& h = live[static_cast<size_t>(rng.range(0, static_cast<int64_t>(live.size()) - 1))];
        if (!check_tensor(h.t, h.r, h.name + " (mid-way)", log)) return;
      }
    }
    for (const Held& h : live) {
      if (!check_tensor(h.t, h.r, h.name, log)) return;
      EXPECT_EQ(h.t.is_contiguous(), r_is_contiguous(h.r)) << h.name << "\n" << log;
    }
    check_aliasing(live, log);
  });
}

// ============================================================== reductions of views

TEST(RandomViews, ReductionsOfViews) {
  run_cases("reduce", 1000, [](Rng& rng, std::string& log) {
    const DType dt = rng.pick({kBool, kI32, kI64, kF32, kF64, kF32});
    const Dims shape = random_shape(rng);
    std::vector<double> vals(static_cast<size_t>(numel_of(shape)));
    for (auto& v : vals) v = random_value(rng, dt, /*specials=*/rng.coin(0.3));
    Held p = make_base(rng, shape, dt, vals, "x", /*any_layout=*/true);
    log = "  x = " + std::string(dname(dt)) + str(shape) + " " + values_str(vals) + "\n  v = x";
    const int steps = static_cast<int>(rng.range(0, 3));
    for (int s = 0; s < steps; ++s) view_step(rng, p, /*allow_expand=*/true, log);
    log += "  -> " + str(p.r.shape) + "\n";

    const int64_t n = p.r.dim();
    const std::string op = rng.pick<const char*>({"sum", "amax", "mean", "sum", "amin"});
    Dims dims;
    const int64_t k = rng.range(0, std::max<int64_t>(n, 1));
    if (n == 0) {
      if (k > 0) dims.push_back(rng.pick<int64_t>({0, -1}));
    } else {
      Dims perm = random_perm(rng, n);
      for (int64_t i = 0; i < k; ++i) dims.push_back(rng.coin(0.3) ? perm[i] - n : perm[i]);
    }
    const bool dup = !dims.empty() && n > 0 && rng.coin(0.04);
    if (dup) dims.push_back(dims[0]);
    const bool keepdim = rng.coin();
    log += "  " + op + "(v, " + str(dims) + ", keepdim=" + (keepdim ? "true" : "false") + ")\n";

    bool empty_reduced = false;
    for (int64_t d = 0; d < n; ++d) {
      bool reduced = dims.empty();
      for (int64_t x : dims) reduced |= wrap(x, n) == d;
      empty_reduced |= reduced && p.r.shape[d] == 0;
    }
    auto run = [&]() -> Tensor {
      if (op == "sum") return rng.coin() ? kiln::sum(p.t, dims, keepdim) : p.t.sum(dims, keepdim);
      if (op == "mean") return kiln::mean(p.t, dims, keepdim);
      if (op == "amin") return p.t.amin(dims, keepdim);
      return rng.coin() ? kiln::amax(p.t, dims, keepdim) : p.t.amax(dims, keepdim);
    };
    const bool throws = dup || (op == "mean" && !is_float(dt)) || ((op == "amax" || op == "amin") && empty_reduced);
    if (throws) {
      expect_error([&] { (void)run(); }, op, log);
      return;
    }
    check_tensor(run(), r_reduce(p.r, op, dims, keepdim), op, log);
  });
}

// ============================================================== large tensors

// Big enough for the kernels' parallel (TBB) path: views, a broadcasting op, a reduction and an
// in-place write through a view, on tensors of more than 32768 elements.
TEST(RandomViews, LargeTensorsMatchReference) {
  run_cases("large", 6, [](Rng& rng, std::string& log) {
    const DType dt = rng.pick({kF32, kI64, kF64});
    const Dims shape{rng.range(36, 48), rng.range(36, 48), rng.range(26, 32)};
    Held base = make_base(rng, shape, dt, distinct_values(rng, numel_of(shape), dt), "base");
    log = "  base = " + std::string(dname(dt)) + str(shape) + "\n  v = base";
    Held v = base;
    v.name = "v";
    const int steps = static_cast<int>(rng.range(1, 3));
    for (int s = 0; s < steps; ++s) view_step(rng, v, /*allow_expand=*/false, log);
    log += "  -> " + str(v.r.shape) + "\n";

    Arg x;
    x.shape = v.r.shape;
    x.dtype = dt;
    x.in.t = v.t;
    x.in.vals = v.r.values();
    x.in.how = "v";
    const Arg y = tensor_arg(rng, operand_shape(rng, v.r.shape), random_dtype(rng), false);
    const Bin op = rng.pick({Bin::Add, Bin::Mul, Bin::Maximum, Bin::Gt, Bin::Div});
    log += "  " + std::string(bin_name(op)) + "(v, " + y.str() + ")\n";
    const DType rt = ref_result_type({x.type(), y.type()});
    DType compute = rt, out_t = rt;
    if (op == Bin::Div && !is_float(rt)) compute = out_t = kF32;
    if (is_compare(op)) out_t = kBool;
    const std::vector<double> yb = y.at(x.shape);
    std::vector<double> want(x.in.vals.size());
    for (size_t k = 0; k < want.size(); ++k) want[k] = ref_binary(to_op(op), x.in.vals[k], yb[k], compute);
    if (!check_tensor(run_binary(op, {x, y}, 1, false), make_ref(want, x.shape, out_t), "binary", log)) return;

    if (v.r.dim() > 0) {
      const Dims dims{rng.range(0, v.r.dim() - 1)};
      log += "  sum(v, " + str(dims) + ")\n";
      if (!check_tensor(v.t.sum(dims), r_reduce(v.r, "sum", dims, false), "sum", log)) return;
    }
    std::vector<Held> live{base, v};
    if (writable(v.r)) inplace_step(rng, live[1], log);
    for (const Held& h : live) check_tensor(h.t, h.r, h.name, log);
    check_aliasing(live, log);
  });
}

// ============================================================== laziness

TEST(RandomViews, NothingRunsUntilValuesAreRead) {
  run_cases("lazy", 4, [](Rng& rng, std::string& log) {
    const Dims shape{3, 4, 2};
    std::vector<double> vals = distinct_values(rng, numel_of(shape), kF32);
    Held base;
    base.t = kiln::from_vector<double>(vals, shape).to(kF32);  // a lazy cast
    base.r = make_ref(vals, shape, kF32);
    base.name = "base";
    log = "  base = float32" + str(shape) + "\n";
    kiln::reset_stats();
    std::vector<Held> live{base};
    for (int i = 0; i < 3; ++i) {
      Held v = live.back();
      v.name = "v" + std::to_string(i + 1);
      log += "  " + v.name + " = " + live.back().name;
      for (int s = 0; s < 2; ++s) view_step(rng, v, /*allow_expand=*/false, log);
      log += "\n";
      live.push_back(v);
    }
    for (int i = 0; i < 3; ++i) {
      Held& tgt = live[static_cast<size_t>(rng.range(0, static_cast<int64_t>(live.size()) - 1))];
      if (!writable(tgt.r)) continue;
      const Arg o = tensor_arg(rng, operand_shape(rng, tgt.r.shape), kF32, false, /*allow_eval=*/false);
      log += "  " + tgt.name + ".add_(" + o.str() + ")\n";
      tgt.t.add_(o.in.t);
      const std::vector<double> b = o.at(tgt.r.shape), old = tgt.r.values();
      const std::vector<int64_t> offs = tgt.r.offsets();
      for (size_t k = 0; k < offs.size(); ++k) tgt.r.buf->at(offs[k]) = to_dtype(kF32, old[k] + b[k]);
    }
    Tensor total = kiln::sum(kiln::mul(live.back().t, 2.0));
    Ref want = r_reduce(live.back().r, "sum", {}, false);
    want.buf->at(0) *= 2;
    auto s = kiln::stats();
    EXPECT_EQ(s.materializations, 0u) << log;
    EXPECT_EQ(s.nodes_executed, 0u) << log;
    EXPECT_GT(s.nodes_recorded, 0u) << log;
    EXPECT_FALSE(total.is_materialized()) << log;
    EXPECT_FALSE(live[0].t.is_materialized()) << log;
    check_tensor(total, want, "sum(2 * last view)", log);
    EXPECT_GE(kiln::stats().materializations, 1u) << log;
    for (const Held& h : live) check_tensor(h.t, h.r, h.name, log);
  });
}

}  // namespace
