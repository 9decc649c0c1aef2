// torch.func's transforms on kiln's two AD modes: jvp through dual levels (forward_ad.h), vjp
// through kiln::grad (with create_graph where a primal requires grad), Jacobians as stacks of
// either, the Hessian and hvp forward-over-reverse.
#include "runtime/autograd/transforms.h"

#include "runtime/autograd/autograd.h"
#include "runtime/autograd/forward_ad.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln {
namespace {

// The i-th unit tensor of t's shape, dtype and device (from the rows of one identity matrix).
struct Basis {
  Tensor eye;
  Shape shape;
  explicit Basis(const Tensor& like)
      : eye(kiln::eye(like.numel(), std::nullopt, like.dtype(), like.device())), shape(like.shape()) {}
  Tensor operator[](int64_t i) const { return detail::reshape_to(eye.select(0, i), shape); }
};

// out_shape ++ in_shape.
std::vector<int64_t> joined(const Tensor& out, const Tensor& in) {
  std::vector<int64_t> s = out.sizes(), b = in.sizes();
  s.insert(s.end(), b.begin(), b.end());
  return s;
}

// A Jacobian block from its columns (jacfwd: stacked last) or rows (jacrev: stacked first).
Tensor block(const std::vector<Tensor>& parts, bool columns, const Tensor& out, const Tensor& in) {
  if (parts.empty()) return zeros(joined(out, in), out.dtype(), out.device());
  return reshape(stack(parts, columns ? -1 : 0), joined(out, in));
}

// jvp with undefined tangents allowed (those primals stay plain).
JvpResult jvp_some(const TensorsFn& fn, const std::vector<Tensor>& primals, const std::vector<Tensor>& tangents) {
  fwad::DualLevel level;
  std::vector<Tensor> duals;
  duals.reserve(primals.size());
  for (size_t i = 0; i < primals.size(); ++i)
    duals.push_back(tangents[i].defined() ? fwad::make_dual(primals[i], tangents[i]) : primals[i]);
  std::vector<Tensor> outs = fn(duals);
  JvpResult r;
  for (const Tensor& o : outs) {
    KILN_CHECK(o.defined(), "jvp: fn returned an undefined tensor");
    auto [p, t] = fwad::unpack_dual(o);
    r.outputs.push_back(p);
    r.tangents.push_back(t.defined() ? t : zeros_like(p));
  }
  return r;
}

// A handle on primal p that kiln::grad can differentiate by: an identity view when p is already
// part of a graph (gradients flow on to it), else a fresh leaf; either keeps p's tangents.
Tensor differentiable_alias(const Tensor& p) {
  if (!is_floating(p.dtype())) return p;
  if (p.requires_grad()) return detail::view_step(p, ViewStep{OpKind::Expand, {}, p.shape()});
  Tensor a = detail::snapshot(p);
  a.requires_grad_(true);
  return a;
}

// Cotangent-weighted gradients of `outs` (those that depend on `inputs`) with respect to inputs;
// zeros where none flows, undefined for non-floating inputs. With `create_graph` the gradients
// are differentiable (a caller's primal requires grad: reverse-over-reverse); tangents ride along
// either way (forward-over-reverse needs no graph).
std::vector<Tensor> pull_back(const std::vector<Tensor>& outs, const std::vector<Tensor>& cots,
                              const std::vector<Tensor>& inputs, bool create_graph) {
  std::vector<Tensor> o, c, in;
  for (size_t i = 0; i < outs.size(); ++i)
    if (outs[i].requires_grad() && cots[i].defined()) {
      o.push_back(outs[i]);
      c.push_back(cots[i]);
    }
  for (const Tensor& x : inputs)
    if (x.requires_grad()) in.push_back(x);
  std::vector<Tensor> g;
  if (!o.empty() && !in.empty()) g = grad(o, in, c, /*retain_graph=*/true, create_graph, /*allow_unused=*/true);
  std::vector<Tensor> r;
  size_t k = 0;
  for (const Tensor& x : inputs) {
    if (!x.requires_grad()) {
      r.push_back(is_floating(x.dtype()) ? zeros_like(x) : Tensor());
      continue;
    }
    Tensor gi = k < g.size() ? g[k] : Tensor();
    ++k;
    r.push_back(gi.defined() ? gi : zeros_like(x));
  }
  return r;
}

}  // namespace

JvpResult jvp(const TensorsFn& fn, const std::vector<Tensor>& primals, const std::vector<Tensor>& tangents) {
  KILN_CHECK(primals.size() == tangents.size(), "jvp: expected one tangent per primal (", primals.size(),
             " primals), got ", tangents.size());
  for (size_t i = 0; i < primals.size(); ++i)
    KILN_CHECK(primals[i].defined() && tangents[i].defined(), "jvp: primal or tangent ", i, " is undefined");
  return jvp_some(fn, primals, tangents);
}

namespace {
// fn run on differentiable aliases of the primals (what vjp and jacrev pull back through).
struct Traced {
  std::vector<Tensor> inputs, outputs;
  bool create_graph = false;  // a primal requires grad: the pulled-back gradients keep a graph
};
Traced run_differentiably(const TensorsFn& fn, const std::vector<Tensor>& primals, const char* op) {
  Traced t;
  for (size_t i = 0; i < primals.size(); ++i) {
    KILN_CHECK(primals[i].defined(), op, ": primal ", i, " is undefined");
    t.inputs.push_back(differentiable_alias(primals[i]));
    t.create_graph = t.create_graph || primals[i].requires_grad();
  }
  {
    EnableGradGuard grad_on;  // (as torch.func: the transform records whatever the caller's mode)
    t.outputs = fn(t.inputs);
  }
  for (const Tensor& o : t.outputs) KILN_CHECK(o.defined(), op, ": fn returned an undefined tensor");
  return t;
}
}  // namespace

VjpResult vjp(const TensorsFn& fn, const std::vector<Tensor>& primals) {
  Traced t = run_differentiably(fn, primals, "vjp");
  VjpResult r;
  r.outputs = t.outputs;
  r.vjp_fn = [t](const std::vector<Tensor>& cots) {
    KILN_CHECK(cots.size() == t.outputs.size(), "vjp: expected one cotangent per output (", t.outputs.size(),
               " outputs), got ", cots.size());
    for (size_t i = 0; i < cots.size(); ++i) {
      KILN_CHECK(cots[i].defined(), "vjp: cotangent ", i, " is undefined");
      KILN_CHECK(same_shape(cots[i].shape(), t.outputs[i].shape()), "vjp: cotangent ", i, " has shape ",
                 detail::str(cots[i].shape()), ", expected its output's shape ", detail::str(t.outputs[i].shape()));
    }
    return pull_back(t.outputs, cots, t.inputs, t.create_graph);
  };
  return r;
}

TensorsFn jacfwd(TensorsFn fn) {
  return [fn](const std::vector<Tensor>& primals) {
    const size_t n = primals.size();
    std::vector<std::vector<std::vector<Tensor>>> cols;  // [out][in] -> columns
    std::vector<Tensor> outs;
    for (size_t j = 0; j < n; ++j) {
      KILN_CHECK(is_floating(primals[j].dtype()), "jacfwd: primal ", j, " is ", dtype_name(primals[j].dtype()),
                 ", expected floating point");
      const int64_t m = primals[j].numel();
      if (m == 0) continue;
      Basis e(primals[j]);
      for (int64_t k = 0; k < m; ++k) {
        std::vector<Tensor> t(n);
        t[j] = e[k];
        JvpResult r = jvp_some(fn, primals, t);
        if (outs.empty()) {
          outs = r.outputs;
          cols.assign(outs.size(), std::vector<std::vector<Tensor>>(n));
        }
        for (size_t i = 0; i < r.tangents.size(); ++i) cols[i][j].push_back(r.tangents[i]);
      }
    }
    if (outs.empty()) outs = fn(primals);  // every primal empty: only the shapes are needed
    cols.resize(outs.size(), std::vector<std::vector<Tensor>>(n));
    std::vector<Tensor> blocks;
    for (size_t i = 0; i < outs.size(); ++i)
      for (size_t j = 0; j < n; ++j) blocks.push_back(block(cols[i][j], true, outs[i], primals[j]));
    return blocks;
  };
}

TensorsFn jacrev(TensorsFn fn) {
  return [fn](const std::vector<Tensor>& primals) {
    Traced r = run_differentiably(fn, primals, "jacrev");
    const size_t n = primals.size();
    std::vector<Tensor> blocks;
    for (size_t i = 0; i < r.outputs.size(); ++i) {
      const Tensor& out = r.outputs[i];
      KILN_CHECK(is_floating(out.dtype()), "jacrev: output ", i, " is ", dtype_name(out.dtype()),
                 ", expected floating point");
      std::vector<std::vector<Tensor>> rows(n);
      const int64_t m = out.numel();
      if (m > 0) {
        Basis e(out);
        for (int64_t k = 0; k < m; ++k) {
          std::vector<Tensor> g = pull_back({out}, {e[k]}, r.inputs, r.create_graph);
          for (size_t j = 0; j < n; ++j) rows[j].push_back(g[j]);
        }
      }
      for (size_t j = 0; j < n; ++j) blocks.push_back(block(rows[j], false, out, primals[j]));
    }
    return blocks;
  };
}

TensorsFn hessian(TensorsFn fn) { return jacfwd(jacrev(std::move(fn))); }

HvpResult hvp(const TensorsFn& fn, const std::vector<Tensor>& primals, const std::vector<Tensor>& tangents) {
  std::vector<Tensor> outputs;
  auto gradient = [&](const std::vector<Tensor>& xs) {
    VjpResult r = vjp(fn, xs);
    KILN_CHECK(r.outputs.size() == 1 && r.outputs[0].numel() == 1,
               "hvp: expected fn to return one tensor with one element, got ", r.outputs.size(), " outputs",
               r.outputs.empty() ? std::string() : detail::cat(" (the first of shape ", detail::str(r.outputs[0].shape()), ")"));
    outputs = r.outputs;
    return r.vjp_fn({ones_like(r.outputs[0])});
  };
  JvpResult j = jvp(gradient, primals, tangents);
  HvpResult h;
  h.outputs = std::move(outputs);  // (the level has exited: no tangent left on them)
  h.hvp = std::move(j.tangents);
  return h;
}

}  // namespace kiln
