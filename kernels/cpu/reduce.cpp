// Reference reductions and scans. Each output element is reduced on one thread, with
// double (floats) or int64 (integers) accumulators.
#include <cmath>
#include <limits>

#include "kernels/cpu/reference.h"
#include "runtime/core/error.h"

namespace kiln::kernels {
namespace {

// Splits in's dims into kept (matching out's elements in order) and reduced.
struct ReducePlan {
  std::vector<int64_t> kept_sizes, kept_strides, red_sizes, red_strides;
};

ReducePlan plan(const Operand& in, const std::vector<int64_t>& dims) {
  ReducePlan p;
  for (int64_t d = 0; d < static_cast<int64_t>(in.sizes.size()); ++d) {
    bool r = std::find(dims.begin(), dims.end(), d) != dims.end();
    (r ? p.red_sizes : p.kept_sizes).push_back(in.sizes[d]);
    (r ? p.red_strides : p.kept_strides).push_back(in.strides[d]);
  }
  return p;
}

// Offsets of every element of the reduced sub-space, in row-major order.
std::vector<int64_t> reduced_offsets(const ReducePlan& p) {
  int64_t n = 1;
  for (int64_t s : p.red_sizes) n *= s;
  std::vector<int64_t> offs;
  offs.reserve(n);
  if (n == 0) return offs;
  std::vector<int64_t> idx(p.red_sizes.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t o = 0;
    for (size_t d = 0; d < idx.size(); ++d) o += idx[d] * p.red_strides[d];
    offs.push_back(o);
    for (int64_t d = static_cast<int64_t>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[d] < p.red_sizes[d]) break;
      idx[d] = 0;
    }
  }
  return offs;
}

template <class T>
void reduce_typed(OpKind op, const Operand& out, const Operand& in, const std::vector<int64_t>& dims) {
  using C = compute_t<T>;
  using Acc = std::conditional_t<std::is_floating_point_v<C>, double, int64_t>;
  ReducePlan p = plan(in, dims);
  std::vector<int64_t> roffs = reduced_offsets(p);
  // Out elements are dense and in kept-dim order; out strides for the kept dims:
  std::vector<int64_t> out_st(p.kept_sizes.size());
  int64_t acc_st = 1;
  for (size_t d = p.kept_sizes.size(); d-- > 0;) {
    out_st[d] = acc_st;
    acc_st *= p.kept_sizes[d];
  }
  const bool arg = op == OpKind::ArgMax || op == OpKind::ArgMin;
  nd_for<2>(p.kept_sizes, {out_st, p.kept_strides},
            [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
              for (int64_t i = 0; i < n; ++i) {
                const T* x = in.ptr<T>() + off[1] + i * st[1];
                if (arg) {
                  int64_t best = 0;
                  C bv = static_cast<C>(x[roffs.empty() ? 0 : roffs[0]]);
                  for (size_t k = 1; k < roffs.size(); ++k) {
                    C v = static_cast<C>(x[roffs[k]]);
                    bool better;
                    if constexpr (std::is_floating_point_v<C>) {
                      if (std::isnan(bv))
                        better = false;
                      else if (std::isnan(v))
                        better = true;
                      else
                        better = op == OpKind::ArgMax ? v > bv : v < bv;
                    } else {
                      better = op == OpKind::ArgMax ? v > bv : v < bv;
                    }
                    if (better) {
                      bv = v;
                      best = static_cast<int64_t>(k);
                    }
                  }
                  out.ptr<int64_t>()[off[0] + i * st[0]] = best;
                  continue;
                }
                Acc acc;
                if (op == OpKind::Sum)
                  acc = 0;
                else if (op == OpKind::Prod)
                  acc = 1;
                else if (roffs.empty())  // an empty dim (softmax's shift): the identity, as the JIT's
                  acc = std::numeric_limits<Acc>::has_infinity
                            ? (op == OpKind::Amax ? -1 : 1) * std::numeric_limits<Acc>::infinity()
                        : op == OpKind::Amax ? std::numeric_limits<Acc>::lowest()
                                             : std::numeric_limits<Acc>::max();
                else
                  acc = static_cast<Acc>(static_cast<C>(x[roffs[0]]));
                for (size_t k = 0; k < roffs.size(); ++k) {
                  Acc v = static_cast<Acc>(static_cast<C>(x[roffs[k]]));
                  switch (op) {
                    case OpKind::Sum: acc += v; break;
                    case OpKind::Prod: acc *= v; break;
                    case OpKind::Amax:
                      if constexpr (std::is_floating_point_v<Acc>) {
                        if (std::isnan(v) || v > acc) acc = v;
                      } else if (v > acc)
                        acc = v;
                      break;
                    case OpKind::Amin:
                      if constexpr (std::is_floating_point_v<Acc>) {
                        if (std::isnan(v) || v < acc) acc = v;
                      } else if (v < acc)
                        acc = v;
                      break;
                    default: break;
                  }
                  if constexpr (std::is_floating_point_v<Acc>)
                    if ((op == OpKind::Amax || op == OpKind::Amin) && std::isnan(acc)) break;
                }
                out.ptr<T>()[off[0] + i * st[0]] = static_cast<T>(static_cast<C>(acc));
              }
            });
}

}  // namespace

void reduce(OpKind op, const Operand& out, const Operand& in, const std::vector<int64_t>& dims) {
  dispatch_dtype(in.dtype, [&](auto tag) { reduce_typed<decltype(tag)>(op, out, in, dims); });
}

void cumsum(const Operand& out, const Operand& in, int64_t dim) {
  dispatch_dtype(in.dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    using Acc = std::conditional_t<std::is_floating_point_v<C>, double, int64_t>;
    std::vector<int64_t> sizes = in.sizes, ist = in.strides, ost = out.strides;
    int64_t n = sizes[dim], is = ist[dim], os = ost[dim];
    sizes[dim] = 1;
    nd_for<2>(sizes, {ost, ist}, [&](const std::array<int64_t, 2>& off, int64_t cnt, const std::array<int64_t, 2>& st) {
      for (int64_t i = 0; i < cnt; ++i) {
        const T* x = in.ptr<T>() + off[1] + i * st[1];
        T* o = out.ptr<T>() + off[0] + i * st[0];
        Acc acc = 0;
        for (int64_t k = 0; k < n; ++k) {
          acc += static_cast<Acc>(static_cast<C>(x[k * is]));
          o[k * os] = static_cast<T>(static_cast<C>(acc));
        }
      }
    });
  });
}

}  // namespace kiln::kernels
