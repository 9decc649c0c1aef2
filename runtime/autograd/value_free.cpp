// Which vjp rules read no values, found from the rules themselves: a backward node whose rule uses
// only shapes, dtypes and devices keeps no tensors (autograd.cpp), and it must never be wrong.
// Instead of a list of such ops kept beside the rules (which drifted from them), each op's rule
// is run once on stand-ins and its gradient graph is searched for them; and, in debug builds and
// under KILN_POISON, every backward of a shape-only node checks that its stand-ins went unread.
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "runtime/autograd/autograd.h"
#include "runtime/autograd/autograd_rules.h"
#include "runtime/core/error.h"
#include "runtime/ops/autocast_policy.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"
#include "runtime/tensor/trace.h"

namespace kiln::detail {
namespace {

// Per op: unknown (0), reads values (2), reads none (1).
std::array<std::atomic<int8_t>, static_cast<size_t>(OpKind::NumOps)> g_reads{};

// `s` with every size a constant: a symbolic one (inside a kiln::compile trace) takes its traced
// value, asked of the shape oracle without recording a guard.
Shape concrete_shape(const Shape& s) {
  Shape out;
  for (const SymInt& d : s) {
    if (auto v = d.maybe_int()) {
      out.push_back(*v);
    } else {
      ShapeOracle* o = shape_oracle();
      KILN_CHECK(o, "a symbolic size outside a trace");
      out.push_back(o->hint(d));
    }
  }
  return out;
}

// The nodes of a stand-in (the expanded view and the constant under it).
void add_nodes(const Tensor& t, std::unordered_set<const Node*>& out) {
  for (const Node* n = t.node().get(); n; n = n->inputs.empty() ? nullptr : n->inputs[0].get()) out.insert(n);
}

// Everything the probe records happens apart from the user's program: no gradients, no autocast,
// no trace, no shape guards, no pending-limit flush (detail::Untraced).
struct Apart {
  NoGradGuard no_grad;
  AutocastOff no_autocast;
  Untraced untraced;
};

}  // namespace

Tensor stand_in(const Shape& shape, DType dtype, Device device) {
  const Scalar v = is_floating(dtype) ? Scalar(std::numeric_limits<double>::quiet_NaN()) : Scalar(0);
  return expand_to(full({}, v, dtype, device), shape);
}

bool reads_any(const std::vector<Tensor>& grads, const std::vector<Tensor>& stand_ins, const Tensor& g) {
  std::unordered_set<const Node*> marks, seen{g.node().get()};
  for (const Tensor& s : stand_ins)
    if (s.defined()) add_nodes(s, marks);
  std::vector<const Node*> todo;
  for (const Tensor& g : grads)
    if (g.defined()) todo.push_back(g.node().get());
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (marks.count(n)) return true;
    // (the rule's inputs are the stand-ins and g: past g lies only the gradient's own history)
    if (!seen.insert(n).second) continue;
    for (const NodePtr& in : n->inputs) todo.push_back(in.get());
  }
  return false;
}

bool vjp_reads_values(OpKind op, const Attrs& attrs, const std::vector<Tensor>& inputs, const Tensor& out,
                      const Shape& view_shape) {
  std::atomic<int8_t>& known = g_reads[static_cast<size_t>(op)];
  if (const int8_t k = known.load(std::memory_order_relaxed)) return k == 2;
  try {
    // (sizes made constant first, while the shape oracle of a trace can still say them)
    const Shape out_shape = concrete_shape(out.shape()), vshape = concrete_shape(view_shape);
    Attrs a = attrs;
    a.sizes = concrete_shape(attrs.sizes);
    a.strides = concrete_shape(attrs.strides);
    if (auto off = attrs.offset.maybe_int()) a.offset = *off; else a.offset = shape_oracle()->hint(attrs.offset);
    std::vector<Shape> in_shapes;
    for (const Tensor& t : inputs) in_shapes.push_back(t.defined() ? concrete_shape(t.shape()) : Shape{});
    Apart apart;
    std::vector<Tensor> in(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined()) in[i] = stand_in(in_shapes[i], inputs[i].dtype(), inputs[i].device());
    const Tensor o = stand_in(out_shape, out.dtype(), out.device());
    const Tensor g = stand_in(out_shape, out.dtype(), out.device());  // (read by every rule: not a mark)
    std::vector<Tensor> marks = in;
    marks.push_back(o);
    const bool reads = reads_any(vjp(op, a, in, o, g, vshape), marks, g);
    known.store(reads ? 2 : 1, std::memory_order_relaxed);
    return reads;
  } catch (const std::exception&) {
    return true;  // (this call keeps the values; the next asks again)
  }
}

bool check_stand_ins() {
#ifndef NDEBUG
  return true;
#else
  static const bool on = [] {
    const char* v = std::getenv("KILN_POISON");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
#endif
}

}  // namespace kiln::detail
