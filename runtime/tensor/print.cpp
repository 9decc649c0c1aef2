// Printing in PyTorch's style: tensor([[1.0000, 2.0000], ...], shape=[2, 2], dtype=float32).
#include <cmath>
#include <cstdio>
#include <ostream>
#include <sstream>

#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln {
namespace {

constexpr int64_t kSummarizeAbove = 1000;  // elements
constexpr int64_t kEdgeItems = 3;

struct Formatter {
  enum class Mode { Int, Whole, Fixed, Sci, Bool } mode = Mode::Fixed;
  size_t width = 1;

  std::string format(double v) const {
    char buf[64];
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    switch (mode) {
      case Mode::Bool: return v != 0 ? "True" : "False";
      case Mode::Int: std::snprintf(buf, sizeof buf, "%.0f", v); break;
      case Mode::Whole: std::snprintf(buf, sizeof buf, "%.0f.", v); break;
      case Mode::Fixed: std::snprintf(buf, sizeof buf, "%.4f", v); break;
      case Mode::Sci: std::snprintf(buf, sizeof buf, "%.4e", v); break;
    }
    return buf;
  }
  std::string padded(double v) const {
    std::string s = format(v);
    return std::string(width > s.size() ? width - s.size() : 0, ' ') + s;
  }
};

Formatter make_formatter(const std::vector<double>& vals, DType dtype) {
  Formatter f;
  if (dtype == DType::Bool)
    f.mode = Formatter::Mode::Bool;
  else if (!is_floating(dtype))
    f.mode = Formatter::Mode::Int;
  else {
    bool whole = true;
    double mx = 0, mn = INFINITY;
    for (double v : vals) {
      if (!std::isfinite(v)) continue;
      if (v != std::floor(v)) whole = false;
      double a = std::fabs(v);
      mx = std::max(mx, a);
      if (a > 0) mn = std::min(mn, a);
    }
    if (mx > 1e8 || (mn < 1e-4 && mn > 0) || (mn > 0 && mx / mn > 1000 && !whole))
      f.mode = Formatter::Mode::Sci;
    else if (whole)
      f.mode = Formatter::Mode::Whole;
    else
      f.mode = Formatter::Mode::Fixed;
  }
  for (double v : vals) f.width = std::max(f.width, f.format(v).size());
  return f;
}

// Indices kept along a dim of size n (all, or the edges when summarizing); -1 marks "...".
std::vector<int64_t> kept(int64_t n, bool summarize) {
  std::vector<int64_t> r;
  if (!summarize || n <= 2 * kEdgeItems) {
    for (int64_t i = 0; i < n; ++i) r.push_back(i);
  } else {
    for (int64_t i = 0; i < kEdgeItems; ++i) r.push_back(i);
    r.push_back(-1);
    for (int64_t i = n - kEdgeItems; i < n; ++i) r.push_back(i);
  }
  return r;
}

void emit(std::ostream& os, const std::vector<double>& v, const std::vector<int64_t>& sizes,
          const std::vector<int64_t>& strides, int64_t dim, int64_t off, const Formatter& f, bool summarize,
          int indent) {
  if (dim == static_cast<int64_t>(sizes.size())) {
    os << f.padded(v[off]);
    return;
  }
  os << "[";
  auto idx = kept(sizes[dim], summarize);
  bool last = dim + 1 == static_cast<int64_t>(sizes.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    if (k) {
      os << ",";
      if (last)
        os << " ";
      else
        os << std::string(sizes.size() - dim - 1, '\n') << std::string(indent + dim + 1, ' ');
    }
    if (idx[k] < 0)
      os << "...";
    else
      emit(os, v, sizes, strides, dim + 1, off + idx[k] * strides[dim], f, summarize, indent);
  }
  os << "]";
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  std::vector<double> vals = t.to_vector<double>();
  std::vector<int64_t> sizes = t.sizes();
  std::vector<int64_t> strides(sizes.size());
  int64_t acc = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = acc;
    acc *= sizes[d];
  }
  bool summarize = t.numel() > kSummarizeAbove;
  // Format width from the values that will be shown.
  std::vector<double> shown;
  if (!summarize)
    shown = vals;
  else
    for (size_t i = 0; i < vals.size(); i += std::max<size_t>(1, vals.size() / 64)) shown.push_back(vals[i]);
  Formatter f = make_formatter(shown, t.dtype());
  std::ostringstream body;
  if (sizes.empty())
    body << f.format(vals[0]);
  else if (t.numel() == 0)
    body << "[]";
  else
    emit(body, vals, sizes, strides, 0, 0, f, summarize, 7);
  os << "tensor(" << body.str() << ", shape=" << detail::str(sizes) << ", dtype=" << dtype_name(t.dtype());
  if (t.device() != cpu()) os << ", device='" << t.device().str() << "'";
  os << ")";
  return os;
}

std::string to_string(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

}  // namespace kiln
