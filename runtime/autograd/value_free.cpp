// Which values each vjp rule reads, found from the rules themselves: a backward node keeps only the
// inputs and output its rule reads for the gradients wanted (autograd.cpp), and that must never be
// wrong. Instead of a list kept beside the rules (which drifted from them), each rule is run once
// per key on stand-ins and its gradient graph is searched for each of them; and, in debug builds
// and under KILN_POISON, every backward of a node that kept stand-ins checks they went unread.
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <limits>
#include <numeric>
#include <string>
#include <unordered_map>
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

// What a rule reads depends on the op and may depend on its attributes (a dim, a mode), its
// dtypes and which inputs it has: the probe's answer is remembered per such key, per thread (no
// lock on the recording path; a thread probes a key once).
std::string key_of(OpKind op, const Attrs& a, const std::vector<Tensor>& inputs, const Tensor& out,
                   const std::vector<bool>& needs) {
  std::string k;
  auto put = [&](const void* p, size_t n) { k.append(static_cast<const char*>(p), n); };
  put(&op, sizeof op);
  put(a.ints.data(), a.ints.size() * sizeof(int64_t));
  put(&a.f0, sizeof a.f0);
  put(&a.f1, sizeof a.f1);
  const DType od = out.dtype();
  put(&od, sizeof od);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    const DType d = t.defined() ? t.dtype() : DType::Bool;
    const char def = static_cast<char>((t.defined() ? 1 : 0) | (needs[i] ? 2 : 0));
    put(&d, sizeof d);
    put(&def, 1);
  }
  return k;
}

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

Tensor stand_in(const Shape& shape, DType dtype, Device device, const Shape* strides) {
  const Scalar v = is_floating(dtype) ? Scalar(std::numeric_limits<double>::quiet_NaN()) : Scalar(0);
  // A permuted dense layout: a constant of the dims in stride order, permuted back.
  const size_t r = shape.size();
  bool permuted = strides && strides->size() == r && r > 1;
  for (size_t i = 0; permuted && i < r; ++i) permuted = (*strides)[i].is_constant() && shape[i].is_constant();
  if (permuted) {
    std::vector<int64_t> order(r);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return (*strides)[x].as_int() > (*strides)[y].as_int(); });
    std::vector<int64_t> dense(r), back(r);
    for (size_t i = 0; i < r; ++i) dense[i] = shape[static_cast<size_t>(order[i])].as_int(), back[order[i]] = static_cast<int64_t>(i);
    if (std::is_sorted(order.begin(), order.end())) return expand_to(full({}, v, dtype, device), shape);
    Tensor t = permute(full(dense, v, dtype, device), back);
    bool same = true;
    for (size_t i = 0; i < r; ++i)
      same = same && (shape[i].as_int() <= 1 || t.node()->strides[i].as_int() == (*strides)[i].as_int());
    if (same) return t;
  }
  return expand_to(full({}, v, dtype, device), shape);
}

std::vector<bool> reads_which(const std::vector<Tensor>& grads, const std::vector<Tensor>& stand_ins, const Tensor& g) {
  // Every node the gradients are computed from, up to g (past g lies only its own history).
  std::unordered_set<const Node*> seen{g.node().get()};
  std::vector<const Node*> todo;
  for (const Tensor& t : grads)
    if (t.defined()) todo.push_back(t.node().get());
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    for (const NodePtr& in : n->inputs) todo.push_back(in.get());
  }
  seen.erase(g.node().get());
  std::vector<bool> read(stand_ins.size(), false);
  for (size_t i = 0; i < stand_ins.size(); ++i) {
    if (!stand_ins[i].defined()) continue;
    std::unordered_set<const Node*> mine;
    add_nodes(stand_ins[i], mine);
    for (const Node* n : mine) read[i] = read[i] || seen.count(n) > 0;
  }
  return read;
}

bool reads_any(const std::vector<Tensor>& grads, const std::vector<Tensor>& stand_ins, const Tensor& g) {
  for (bool r : reads_which(grads, stand_ins, g))
    if (r) return true;
  return false;
}

std::vector<bool> vjp_reads(OpKind op, const Attrs& attrs, const std::vector<Tensor>& inputs, const Tensor& out,
                            const Shape& view_shape, const std::vector<bool>& needs) {
  thread_local std::unordered_map<std::string, std::vector<bool>> known;
  const std::string key = key_of(op, attrs, inputs, out, needs);
  if (auto it = known.find(key); it != known.end()) return it->second;
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
      if (inputs[i].defined()) {
        const Shape st = concrete_shape(inputs[i].node()->strides);
        in[i] = stand_in(in_shapes[i], inputs[i].dtype(), inputs[i].device(), &st);
      }
    const Tensor o = stand_in(out_shape, out.dtype(), out.device());
    const Tensor g = stand_in(out_shape, out.dtype(), out.device());  // (read by every rule: not a mark)
    std::vector<Tensor> marks = in;
    marks.push_back(o);
    std::vector<Tensor> grads = vjp(op, a, in, o, g, vshape);
    for (size_t i = 0; i < grads.size(); ++i)
      if (i >= needs.size() || !needs[i]) grads[i] = Tensor();  // (discarded: no input wants it)
    std::vector<bool> reads = reads_which(grads, marks, g);
    known.emplace(key, reads);
    return reads;
  } catch (const std::exception&) {
    return std::vector<bool>(inputs.size() + 1, true);  // (this call keeps the values; the next asks again)
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
