#include "runtime/tensor/record.h"

#include "runtime/autograd/autograd.h"
#include "runtime/autograd/forward_ad.h"
#include "runtime/exec/device_runtime.h"
#include "runtime/ops/ops.h"
#include "runtime/ir/sym_facts.h"
#include "runtime/tensor/placed_hooks.h"
#include "runtime/tensor/trace.h"

#include <algorithm>
#include <array>
#include <bit>
#include <sstream>

namespace kiln::detail {

namespace {
void maybe_flush(const NodePtr& n) {
  // A leaf gets its storage right after recording; it has nothing to compute.
  // (Never while a compile() trace records: its graph must stay whole.)
  if (n->op != OpKind::Leaf && !trace_observer() && detail::pending_now() > static_cast<int64_t>(pending_limit()))
    materialize(n);
}
// A dense tensor of constant sizes must have a byte count that int64 holds (PyTorch: "Storage
// size calculation overflowed"); otherwise numel * itemsize would wrap around.
void check_storage_size(OpKind op, const Shape& shape, DType dtype) {
  int64_t bytes = static_cast<int64_t>(itemsize(dtype));
  bool overflow = false;
  for (const auto& d : shape) {
    if (!d.is_constant()) return;  // symbolic: checked when an instance binds concrete sizes
    overflow = overflow || __builtin_mul_overflow(bytes, d.as_int(), &bytes);
  }
  KILN_CHECK(!overflow, op_name(op), ": storage size calculation overflowed with sizes=", str(shape), " (",
             dtype_name(dtype), ": more than 2^63 - 1 bytes)");
}
// The facts a compile() trace has established, when one records and `s` is symbolic.
const SymFacts* facts_for(const Shape& s) {
  bool symbolic = false;
  for (const auto& d : s) symbolic = symbolic || !d.is_constant();
  if (!symbolic) return nullptr;
  const ShapeOracle* o = shape_oracle();
  return o ? o->facts() : nullptr;
}
}  // namespace

PlacedHooks& placed_hooks() {
  static PlacedHooks hooks;
  return hooks;
}

const PlacedHooks& placed_hooks_checked() {
  const PlacedHooks& h = placed_hooks();
  KILN_CHECK(h.record && h.view && h.full && h.as_placed_like,
             "a DTensor reached an op, but kiln's DTensor layer (runtime/dtensor) is not linked in");
  return h;
}

Tensor record(OpKind op, NodeList inputs, Attrs attrs, DType dtype, Shape shape, Device device) {
  if (any_placed(inputs)) [[unlikely]]  // a DTensor op: recorded on the shards
    return Tensor::from_node(placed_hooks_checked().record(op, inputs, attrs, dtype, shape, device));
  if (device.type != DeviceType::CPU) [[unlikely]]
    device_runtime(device);  // usable, or a clear error now
  auto n = new_node();
  n->op = op;
  n->inputs = std::move(inputs);
  n->attrs = std::move(attrs);
  n->dtype = dtype;
  n->device = device;
  if (const SymFacts* f = facts_for(shape)) shape = f->simplify(shape);  // sizes as the facts state them
  check_storage_size(op, shape, dtype);
  n->strides = contiguous_strides(shape);
  n->shape = std::move(shape);
  n->offset = 0;
  maybe_flush(n);
  return Tensor::from_node(std::move(n));
}

namespace {
// Records op over the tensors *inputs[0..count) (pointers: the callers' tensors are not copied).
Tensor record_tensors(OpKind op, const Tensor* const* inputs, size_t count, Attrs&& attrs, DType dtype, Shape&& shape) {
  NodeList ins;
  ins.reserve(count);
  // The op's device: the first input's, except that 0-d CPU tensors join any device (as in
  // PyTorch) and a cross-device copy names its target in attrs.ints.
  for (size_t i = 0; i < count; ++i) KILN_CHECK(inputs[i]->defined(), op_name(op), ": got an undefined tensor");
  Device dev = count == 0 ? cpu() : inputs[0]->device();
  if (count > 1 && dev.type == DeviceType::CPU && inputs[0]->dim() == 0)
    for (size_t i = 1; i < count && dev.type == DeviceType::CPU; ++i)
      if (inputs[i]->dim() > 0 || inputs[i]->device().type != DeviceType::CPU) dev = inputs[i]->device();
  if (op == OpKind::ToDevice)
    dev = Device{static_cast<DeviceType>(attrs.ints.at(0)), static_cast<int>(attrs.ints.at(1))};
  bool wants_grad = false;
  std::vector<Tensor> moved;  // inputs with 0-d CPU ones copied to the op's device (when any is)
  for (size_t i = 0; i < count; ++i) {
    const Tensor& t = *inputs[i];
    const NodePtr& n = t.node();
    if (n->device != dev && op != OpKind::ToDevice) [[unlikely]] {
      KILN_CHECK(n->device.type == DeviceType::CPU && n->shape.empty(), op_name(op),
                 ": expected all tensors to be on the same device, but found at least two devices, ", dev.str(),
                 " and ", n->device.str());
      if (moved.empty())
        for (size_t j = 0; j < count; ++j) moved.push_back(*inputs[j]);
      moved[i] = t.to(dev);
      ins.push_back(moved[i].node());
    } else {
      ins.push_back(n);
    }
    wants_grad = wants_grad || t.requires_grad();
  }
  const bool track = wants_grad && grad_enabled();
  const bool dual = forward_ad_visible();
  if (!track && !dual) [[likely]]
    return record(op, std::move(ins), std::move(attrs), dtype, std::move(shape), dev);
  Tensor out = record(op, std::move(ins), attrs, dtype, std::move(shape), dev);
  // Tangents first: the backward node keeps the output's (forward-over-reverse reads them).
  if (dual) attach_tangents(out, op, attrs, inputs, count);
  if (!track) return out;
  std::vector<Tensor> grad_inputs = moved;
  if (grad_inputs.empty())
    for (size_t j = 0; j < count; ++j) grad_inputs.push_back(*inputs[j]);
  attach_grad(out, op, attrs, grad_inputs);
  return out;
}

// Pointers to a list of tensors (on the stack for up to 8).
struct TensorRefs {
  const Tensor* small[8];
  std::vector<const Tensor*> big;
  const Tensor* const* data = small;
  template <class It>
  TensorRefs(It first, size_t n) {
    if (n > 8) {
      big.reserve(n);
      for (size_t i = 0; i < n; ++i, ++first) big.push_back(&*first);
      data = big.data();
    } else {
      for (size_t i = 0; i < n; ++i, ++first) small[i] = &*first;
    }
  }
};
}  // namespace

Tensor record(OpKind op, const std::vector<Tensor>& inputs, Attrs attrs, DType dtype, Shape shape) {
  TensorRefs refs(inputs.begin(), inputs.size());
  return record_tensors(op, refs.data, inputs.size(), std::move(attrs), dtype, std::move(shape));
}

Tensor record(OpKind op, std::initializer_list<Tensor> inputs, Attrs attrs, DType dtype, Shape shape) {
  TensorRefs refs(inputs.begin(), inputs.size());
  return record_tensors(op, refs.data, inputs.size(), std::move(attrs), dtype, std::move(shape));
}

Tensor record_refs(OpKind op, std::initializer_list<const Tensor*> inputs, Attrs attrs, DType dtype, Shape shape) {
  return record_tensors(op, inputs.begin(), inputs.size(), std::move(attrs), dtype, std::move(shape));
}

NodePtr record_view_node(OpKind op, const NodePtr& in, Attrs attrs, Shape shape, Shape strides, SymInt offset) {
  if (in->placed) [[unlikely]]  // a view of a DTensor: taken of its shard
    return placed_hooks_checked().view(op, in, attrs, shape, strides, offset);
  auto n = new_node();
  n->op = op;
  n->inputs = {in};
  n->attrs = std::move(attrs);
  n->dtype = in->dtype;
  n->device = in->device;
  n->shape = std::move(shape);
  n->strides = std::move(strides);
  n->offset = std::move(offset);
  if (const SymFacts* f = facts_for(n->shape)) {  // sizes as the facts state them
    n->shape = f->simplify(n->shape);
    n->strides = f->simplify(n->strides);
    n->offset = f->simplify(n->offset);
  }
  // A view of materialized storage is itself materialized: it only names other memory. (Not
  // while compile() traces: the program must re-derive it from the input's storage each call.)
  if (in->ready() && !trace_observer()) n->set_storage(in->storage);
  return n;
}

std::string str(const Shape& s) {
  // In a compile() trace a symbolic size reads as the size the caller passed (no guard: hint()
  // only looks), so messages speak of the user's sizes, not of s0.
  ShapeOracle* o = shape_oracle();
  bool symbolic = false;
  for (const auto& d : s) symbolic = symbolic || !d.is_constant();
  if (!symbolic || !o) return shape_str(s);
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << (s[i].is_constant() ? s[i].as_int() : o->hint(s[i]));
  os << "]";
  return os.str();
}
std::string str(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = std::max<int64_t>(ndim, 1);
  KILN_CHECK(dim >= -n && dim < n, op, ": dimension out of range (expected to be in range of [", -n, ", ", n - 1,
             "], but got ", dim, ")");
  return dim < 0 ? dim + n : dim;
}

std::vector<int64_t> wrap_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, ndim, op);
    KILN_CHECK(std::find(out.begin(), out.end(), w) == out.end(), op, ": dim ", d,
               " appears multiple times in the list of dims");
    out.push_back(w);
  }
  if (ndim == 0) out.clear();
  std::sort(out.begin(), out.end());
  return out;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const SymInt* x = i < n - a.size() ? nullptr : &a[i - (n - a.size())];
    const SymInt* y = i < n - b.size() ? nullptr : &b[i - (n - b.size())];
    if (!x) {
      out[i] = *y;
      continue;
    }
    if (!y) {
      out[i] = *x;
      continue;
    }
    // A literal 1 broadcasts to the other size, whatever that size is (a symbol the trace saw
    // as 1 included): nothing to ask.
    if (is_one(*x)) {
      out[i] = *y;
      continue;
    }
    if (is_one(*y)) {
      out[i] = *x;
      continue;
    }
    // Equal sizes next: asking whether a size is 1 would specialize a symbolic size that
    // happens to be 1 in the traced call.
    auto same = sym_eq(*x, *y);
    if (same && *same) {
      out[i] = *x;
      continue;
    }
    auto x1 = sym_eq(*x, 1);
    if (x1 && *x1) {
      out[i] = *y;
      continue;
    }
    auto y1 = sym_eq(*y, 1);
    if (y1 && *y1)
      out[i] = *x;
    else
      throw Error(cat(op, ": shapes ", str(a), " and ", str(b),
                      " cannot be broadcast (expected equal sizes or 1 at dim ", i, ", got ", x->str(), " and ",
                      y->str(), ")"));
  }
  return out;
}

Tensor cast(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Attrs a;
  return record_refs(OpKind::Cast, {&t}, a, dtype, t.shape());
}

Tensor expand_to(const Tensor& t, const Shape& shape) {
  return identical_shape(t.shape(), shape) ? t : t.expand_sym(shape);
}

void check_fill_value(Scalar v, DType dtype, const char* op) {
  if (v.kind() != Scalar::Kind::Float || !is_integral(dtype)) return;
  const double lim = dtype == DType::Int32 ? 0x1p31 : 0x1p63, d = v.to_double();
  KILN_CHECK(d >= -lim && d < lim, op, ": value ", d, " cannot be converted to type ", dtype_name(dtype),
             " without overflow (expected a finite number in [", -lim, ", ", lim, "))");
}

Tensor constant(Scalar v, DType dtype, Device device) {
  check_fill_value(v, dtype, "fill");
  Attrs a;
  a.f0 = v.to_double();
  if (v.kind() != Scalar::Kind::Float) a.ints = {v.to_int()};  // exact for large int64
  return record(OpKind::Full, NodeList{}, std::move(a), dtype, Shape{}, device);
}

Tensor scalar_operand(Scalar v, DType dtype, Device device) {
  if (trace_observer()) return constant(v, dtype, device);  // a trace's constants are its own
  // The last few values this thread used, round robin. A cached node is only read by ops
  // (materialize() does not store it for the cache's reference) and is not pending work.
  struct Entry {
    Scalar::Kind kind;
    uint64_t bits;  // of the double value
    int64_t i;
    DType dtype;
    Device device;
    NodePtr node;
  };
  constexpr size_t kEntries = 8;
  thread_local std::array<Entry, kEntries> cache{};
  thread_local size_t next = 0;
  const uint64_t bits = std::bit_cast<uint64_t>(v.to_double());
  for (Entry& e : cache)
    if (e.node && e.bits == bits && e.i == v.to_int() && e.kind == v.kind() && e.dtype == dtype && e.device == device &&
        !e.node->materialized())
      return Tensor::from_node(e.node);
  Tensor t = constant(v, dtype, device);
  const NodePtr& n = t.node();
  if (n->materialized() || n->op != OpKind::Full) return t;  // (flushed at the pending limit)
  if (n->pending) {
    n->pending = false;
    pending_add(-1);
  }
  n->shared_constant = true;
  cache[next] = Entry{v.kind(), bits, v.to_int(), dtype, device, n};
  next = (next + 1) % kEntries;
  return t;
}

Tensor size_value(const SymInt& v, DType dtype, Device device) {
  if (v.is_constant()) return constant(Scalar(v.as_int()), dtype, device);
  Attrs a;
  int64_t hint = size_hint(v);
  a.f0 = static_cast<double>(hint);
  a.ints = {hint};
  a.sizes = {v};
  return record(OpKind::Full, NodeList{}, std::move(a), dtype, Shape{}, device);
}

int64_t size_hint(const SymInt& v) {
  if (v.is_constant()) return v.as_int();
  ShapeOracle* o = shape_oracle();
  KILN_CHECK(o, "a symbolic size outside a compile() trace: ", v.str());
  return o->hint(v);
}

Tensor reshape_to(const Tensor& t, const Shape& shape) {
  if (identical_shape(t.shape(), shape)) return t;
  bool symbolic = std::any_of(shape.begin(), shape.end(), [](const SymInt& d) { return !d.is_constant(); });
  return symbolic ? t.reshape_sym(shape) : reshape(t, concrete(shape));
}

Tensor slice_window(const Tensor& x, int64_t d, const SymInt& start, const SymInt& stop, int64_t step) {
  ViewStep s{OpKind::Slice, Attrs{}, {}};
  s.attrs.ints = {d, size_hint(start), size_hint(stop), step};
  if (!start.is_constant() || !stop.is_constant()) s.attrs.sizes = {start, stop};
  return make_view(x, std::move(s));
}

Tensor arange_of(const SymInt& n, Device device) {
  Attrs a;
  a.f0 = 0;
  a.f1 = 1;
  a.ints = {0, 1};
  return record(OpKind::Arange, NodeList{}, a, kInt64, Shape{n}, device);
}

bool same_size(const SymInt& a, const SymInt& b) { return sym_eq(a, b).value_or(false); }

Shape reduced_shape(const Shape& s, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) {
    bool r = std::find(dims.begin(), dims.end(), i) != dims.end();
    if (!r)
      out.push_back(s[i]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

NodePtr apply_view(const NodePtr& in, const ViewStep& step) {
  const Shape& sh = in->shape;
  const Shape& st = in->strides;
  const auto& ints = step.attrs.ints;
  Shape shape, strides;
  SymInt offset = in->offset;
  switch (step.op) {
    case OpKind::Permute:
      for (int64_t d : ints) {
        shape.push_back(sh[d]);
        strides.push_back(st[d]);
      }
      break;
    case OpKind::Expand: {
      shape = step.shape;
      size_t lead = shape.size() - sh.size();
      strides.assign(shape.size(), SymInt(0));
      for (size_t i = 0; i < sh.size(); ++i) {
        // A literal 1 gets stride 0 whatever it expands to (nothing to ask: with one element
        // along the dim, the stride is never used to step).
        if (is_one(sh[i])) {
          if (is_one(shape[lead + i])) strides[lead + i] = st[i];
          continue;
        }
        auto same = sym_eq(sh[i], shape[lead + i]);
        strides[lead + i] = (same && *same) ? st[i] : SymInt(0);
      }
      break;
    }
    case OpKind::Slice: {  // {dim, start, stop, step}, already clamped (sizes: symbolic bounds)
      shape = sh;
      strides = st;
      int64_t d = ints[0], stp = ints[3];
      if (step.attrs.sizes.size() == 2) {
        const SymInt &start = step.attrs.sizes[0], &stop = step.attrs.sizes[1];
        shape[d] = floordiv(stop - start + SymInt(stp - 1), stp);  // callers keep start <= stop
        offset = offset + st[d] * start;
      } else {
        int64_t start = ints[1], stop = ints[2];
        shape[d] = SymInt((std::max<int64_t>(stop - start, 0) + stp - 1) / stp);
        offset = offset + st[d] * start;
      }
      strides[d] = st[d] * stp;
      break;
    }
    case OpKind::Select: {
      int64_t d = ints[0];
      offset = offset + st[d] * (step.attrs.sizes.size() == 1 ? step.attrs.sizes[0] : SymInt(ints[1]));
      for (size_t i = 0; i < sh.size(); ++i)
        if (static_cast<int64_t>(i) != d) {
          shape.push_back(sh[i]);
          strides.push_back(st[i]);
        }
      break;
    }
    case OpKind::Squeeze: {
      int64_t d = ints[0];
      for (size_t i = 0; i < sh.size(); ++i)
        if (static_cast<int64_t>(i) != d) {
          shape.push_back(sh[i]);
          strides.push_back(st[i]);
        }
      break;
    }
    case OpKind::Unsqueeze: {
      int64_t d = ints[0];
      shape = sh;
      strides = st;
      SymInt s = d < static_cast<int64_t>(sh.size()) ? sh[d] * st[d] : SymInt(1);
      shape.insert(shape.begin() + d, SymInt(1));
      strides.insert(strides.begin() + d, s);
      break;
    }
    case OpKind::Flip:
      shape = sh;
      strides = st;
      for (int64_t d : ints) {
        offset = offset + (sh[d] - 1) * st[d];
        strides[d] = -st[d];
      }
      break;
    case OpKind::AsStrided:  // input is dense: window relative to its first element
      shape = step.shape;
      strides = step.attrs.strides;
      offset = offset + step.attrs.offset;
      break;
    case OpKind::View:
      shape = step.shape;
      strides = step.attrs.strides;  // computed by reshape's viewability check
      // Strides were computed relative to the input's strides; offset unchanged.
      break;
    default: throw Error(cat("apply_view: ", op_name(step.op), " is not a view op"));
  }
  return record_view_node(step.op, in, step.attrs, std::move(shape), std::move(strides), offset);
}

Tensor view_step(const Tensor& x, const ViewStep& step) {
  Tensor out = Tensor::from_node(apply_view(x.node(), step));
  if (forward_ad_visible()) [[unlikely]] {
    const Tensor* in = &x;
    attach_tangents(out, step.op, step.attrs, &in, 1, step.shape);
  }
  attach_grad(out, step.op, step.attrs, {x}, step.shape);
  return out;
}

Tensor make_view(const Tensor& x, ViewStep step) {
  Tensor v = view_step(x, step);
  std::shared_ptr<TensorImpl> impl = v.impl();
  const auto& src = x.impl();
  if (src->base) {
    impl->base = src->base;
    impl->chain = src->chain;
  } else {
    impl->base = src;
  }
  impl->chain.push_back(std::move(step));
  impl->base_version = impl->base->version;
  return Tensor(std::move(impl));
}

}  // namespace kiln::detail
