#include "runtime/core/pool_allocator.h"
#include "runtime/tensor/tensor.h"

#include "runtime/ops/advindex.h"
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/forward_ad.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"
#include "runtime/tensor/placed_hooks.h"
#include "runtime/tensor/trace.h"
#include "runtime/exec/device_runtime.h"
#include "runtime/exec/memory_ledger.h"

namespace kiln {

const NodePtr& TensorImpl::view_node() {
  if (base_version != base->version) {
    // The base was written: replay the view chain on its new value (with autograd when the
    // base takes part in it, whatever the current grad mode: the view is a function of it).
    std::optional<EnableGradGuard> g;
    if (base->requires_grad) g.emplace();
    Tensor cur(base);
    for (const auto& step : chain) cur = detail::view_step(cur, step);
    node_ = cur.node();
    detail::copy_autograd(*this, cur);
    detail::copy_tangents(*this, *cur.impl());
    base_version = base->version;
  }
  return node_;
}

std::shared_ptr<TensorImpl> TensorImpl::make() {
  return std::allocate_shared<TensorImpl>(detail::PoolAllocator<TensorImpl>());
}

Tensor Tensor::from_node(NodePtr node) {
  auto impl = TensorImpl::make();
  impl->node_ = std::move(node);
  return Tensor(std::move(impl));
}

const NodePtr& Tensor::node() const {
  KILN_CHECK(impl_ != nullptr, "use of an undefined Tensor");
  const NodePtr& n = impl_->node();
  if (auto* o = detail::trace_observer()) [[unlikely]]
    o->on_read(impl_);  // (may rebind: n names the member)
  return n;
}

std::vector<int64_t> Tensor::sizes() const { return concrete(shape()); }

// size() and numel() stay on the stack while they specialize a symbolic size (no sibling
// call), so compile()'s diagnostics can name them.
__attribute__((optimize("no-optimize-sibling-calls"))) int64_t Tensor::size(int64_t d) const {
  return shape()[detail::wrap_dim(d, dim(), "size")].as_int();
}

SymInt Tensor::sym_size(int64_t d) const { return shape()[detail::wrap_dim(d, dim(), "sym_size")]; }

__attribute__((optimize("no-optimize-sibling-calls"))) int64_t Tensor::numel() const {
  return kiln::numel(shape()).as_int();
}

std::vector<int64_t> Tensor::strides() const { return concrete(node()->strides); }

bool Tensor::is_contiguous() const {
  const auto& n = node();
  return is_contiguous_layout(n->shape, n->strides);
}

const Tensor& Tensor::eval() const {
  materialize(node());
  return *this;
}

void eval(const std::vector<Tensor>& ts) {
  std::vector<NodePtr> ns;
  for (const auto& t : ts) ns.push_back(t.node());
  materialize(ns);
}

template <class T>
T Tensor::item() const {
  KILN_CHECK(numel() == 1, "item(): expected a tensor with one element, got shape ", detail::str(shape()));
  if (node()->placed) return detail::placed_hooks_checked().full(*this).template item<T>();  // a DTensor's value
  if (device().type != DeviceType::CPU) return cpu().item<T>();
  eval();
  const auto& n = node();
  T out{};
  dispatch_dtype(n->dtype, [&](auto tag) {
    using S = decltype(tag);
    out = static_cast<T>(static_cast<compute_t<S>>(*n->data<S>()));
  });
  return out;
}

template <class T>
const T* Tensor::data() const {
  KILN_CHECK(dtype() == dtype_of<T>(), "data<T>(): tensor has dtype ", dtype_name(dtype()), ", requested ",
             dtype_name(dtype_of<T>()));
  KILN_CHECK(!node()->placed, "data<T>(): a DTensor has no single buffer; read its shard with to_local() or the "
             "whole tensor with full_tensor()");
  eval();
  if (device().type != DeviceType::CPU) device_runtime(device()).synchronize(device().index);  // finished writing
  return node()->data<T>();
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  if (node()->placed) return detail::placed_hooks_checked().full(*this).template to_vector<T>();  // a DTensor's values
  Tensor c = device().type == DeviceType::CPU ? contiguous() : contiguous().cpu();
  c.eval();
  const auto& n = c.node();
  int64_t count = c.numel();
  std::vector<T> out(static_cast<size_t>(count));
  dispatch_dtype(n->dtype, [&](auto tag) {
    using S = decltype(tag);
    const S* p = n->data<S>();
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<T>(static_cast<compute_t<S>>(p[i]));
  });
  return out;
}

#define KILN_INST(T)                         \
  template T Tensor::item<T>() const;        \
  template const T* Tensor::data<T>() const; \
  template std::vector<T> Tensor::to_vector<T>() const;
KILN_INST(float)
KILN_INST(double)
KILN_INST(int32_t)
KILN_INST(int64_t)
#undef KILN_INST
template bool Tensor::item<bool>() const;
template const bool* Tensor::data<bool>() const;
template const Half* Tensor::data<Half>() const;
template const BFloat16* Tensor::data<BFloat16>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

Tensor& Tensor::assign_(const Tensor& value) {
  KILN_CHECK(defined() && value.defined(), "in-place op on an undefined tensor");
  KILN_CHECK(can_cast(value.dtype(), dtype()), "in-place op: result type ", dtype_name(value.dtype()),
             " can't be cast to the desired output type ", dtype_name(dtype()));
  Shape target = shape();
  Shape b = detail::broadcast_shapes(value.shape(), target, "in-place op");
  KILN_CHECK(b.size() == target.size(), "in-place op: output with shape ", detail::str(target),
             " doesn't match the broadcast shape ", detail::str(b));
  for (size_t i = 0; i < b.size(); ++i) {
    auto same = sym_eq(b[i], target[i]);
    KILN_CHECK(same && *same, "in-place op: output with shape ", detail::str(target),
               " doesn't match the broadcast shape ", detail::str(b));
  }
  const bool tracking = grad_enabled();
  auto& owner = impl_->base ? impl_->base : impl_;
  if (auto* o = detail::trace_observer()) [[unlikely]]
    o->on_write(owner);
  KILN_CHECK(!(tracking && owner->requires_grad && !owner->grad_fn), "in-place op: a leaf tensor that requires ",
             "grad (or a view of one) is used in an in-place operation; wrap it in NoGradGuard");
  if (impl_->base) {
    const NodePtr& self = node();
    // A 0 stride overlaps elements only along a dim of size > 1, and only if there are elements.
    // Only an expand makes a literal 0 stride; a stride computed from sizes is 0 only when one
    // of those sizes is, and then the tensor is empty. (Asking about sizes only here keeps a
    // symbol the trace saw as 0 or 1 symbolic.)
    std::optional<bool> empty;
    for (size_t i = 0; i < self->shape.size(); ++i) {
      if (!self->strides[i].is_constant() || self->strides[i].as_int() != 0) continue;
      if (!empty) empty = sym_eq(kiln::numel(self->shape), 0).value_or(false);
      if (*empty) break;
      auto one = sym_eq(self->shape[i], 1);
      KILN_CHECK(one && *one, "in-place op: more than one element of the written-to ",
                 "tensor refers to a single memory location (an expanded view); clone it first");
    }
  }
  Tensor v = detail::cast(value, dtype());
  v = detail::expand_to(v, target);
  if (impl_->base) {
    const NodePtr& self = node();
    Attrs a;
    a.sizes = self->shape;
    a.strides = self->strides;
    a.offset = self->offset;
    auto& base = impl_->base;
    Tensor old_base(base);
    Tensor nb = detail::record(OpKind::ViewScatter, {old_base, v}, a, old_base.dtype(), old_base.shape());
    memory_ledger_inherit(*base->node_, *nb.node());
    base->node_ = nb.node();
    detail::copy_tangents(base, *nb.impl());  // the window's tangent written into the base's
    if (tracking)
      detail::copy_autograd(*base, nb);
    else
      base->grad_fn = nullptr;  // overwritten without tracking: a new leaf
    base->version++;
    node();  // replay the chain on the new base
  } else {
    // Nodes are immutable, so aliasing a non-view node is safe; a view is copied so that a
    // non-view tensor always names dense storage.
    Tensor nv = is_view_op(v.node()->op) ? detail::record(OpKind::Contiguous, {v}, Attrs{}, dtype(), target) : v;
    memory_ledger_inherit(*impl_->node_, *nv.node());
    impl_->node_ = nv.node();
    detail::copy_tangents(impl_, *nv.impl());  // the new value's tangent (none: none)
    if (tracking) {
      detail::copy_autograd(*impl_, nv);
    } else if (impl_->grad_fn) {
      impl_->grad_fn = nullptr;  // overwritten without tracking: it is a new leaf
    }
    impl_->version++;
  }
  return *this;
}

Tensor& Tensor::add_(const Tensor& o, Scalar alpha) { return assign_(add(*this, o, alpha)); }
Tensor& Tensor::add_(Scalar o) { return assign_(add(*this, o)); }
Tensor& Tensor::sub_(const Tensor& o, Scalar alpha) { return assign_(sub(*this, o, alpha)); }
Tensor& Tensor::sub_(Scalar o) { return assign_(sub(*this, o)); }
Tensor& Tensor::mul_(const Tensor& o) { return assign_(mul(*this, o)); }
Tensor& Tensor::mul_(Scalar o) { return assign_(mul(*this, o)); }
Tensor& Tensor::div_(const Tensor& o) { return assign_(div(*this, o)); }
Tensor& Tensor::div_(Scalar o) { return assign_(div(*this, o)); }
// copy_ converts from any dtype (like PyTorch), unlike the arithmetic in-place ops.
Tensor& Tensor::copy_(const Tensor& src) {
  KILN_CHECK(defined() && src.defined(), "copy_: got an undefined tensor");
  return assign_(detail::cast(src, dtype()));
}
Tensor& Tensor::fill_(Scalar v) { return assign_(full_shape(Shape{}, v, dtype(), device())); }
Tensor& Tensor::zero_() { return fill_(0); }
Tensor& Tensor::clamp_(std::optional<Scalar> mn, std::optional<Scalar> mx) {
  return assign_(kiln::clamp(*this, mn, mx));
}
Tensor& Tensor::index_put_(const std::vector<TensorIndex>& idx, const Tensor& v) {
  if (detail::has_index_tensor(idx)) return index_put_(idx, v, false);
  Tensor view = index(idx);
  view.copy_(v);  // x[idx] = v copies, converting v's dtype
  return *this;
}
Tensor& Tensor::index_put_(const std::vector<TensorIndex>& idx, Scalar v) {
  if (detail::has_index_tensor(idx)) return index_put_(idx, full_shape(Shape{}, v, dtype(), device()), false);
  Tensor view = index(idx);
  view.fill_(v);
  return *this;
}

// ---- method forms ----
#define KILN_UNARY_METHOD(name) \
  Tensor Tensor::name() const { return kiln::name(*this); }
KILN_UNARY_METHOD(neg)
KILN_UNARY_METHOD(abs)
KILN_UNARY_METHOD(exp)
KILN_UNARY_METHOD(exp2)
KILN_UNARY_METHOD(expm1)
KILN_UNARY_METHOD(log)
KILN_UNARY_METHOD(log2)
KILN_UNARY_METHOD(log1p)
KILN_UNARY_METHOD(sqrt)
KILN_UNARY_METHOD(rsqrt)
KILN_UNARY_METHOD(reciprocal)
KILN_UNARY_METHOD(square)
KILN_UNARY_METHOD(sin)
KILN_UNARY_METHOD(cos)
KILN_UNARY_METHOD(tan)
KILN_UNARY_METHOD(atan)
KILN_UNARY_METHOD(tanh)
KILN_UNARY_METHOD(sigmoid)
KILN_UNARY_METHOD(relu)
KILN_UNARY_METHOD(silu)
KILN_UNARY_METHOD(erf)
KILN_UNARY_METHOD(floor)
KILN_UNARY_METHOD(ceil)
KILN_UNARY_METHOD(round)
KILN_UNARY_METHOD(sign)
KILN_UNARY_METHOD(isnan)
KILN_UNARY_METHOD(isfinite)
KILN_UNARY_METHOD(logical_not)
KILN_UNARY_METHOD(contiguous)
#undef KILN_UNARY_METHOD
Tensor Tensor::softplus() const { return kiln::softplus(*this); }
Tensor Tensor::gelu(const std::string& a) const { return kiln::gelu(*this, a); }
Tensor Tensor::pow(const Tensor& e) const { return kiln::pow(*this, e); }
Tensor Tensor::pow(Scalar e) const { return kiln::pow(*this, e); }
Tensor Tensor::clamp(std::optional<Scalar> mn, std::optional<Scalar> mx) const { return kiln::clamp(*this, mn, mx); }
Tensor Tensor::to(DType t) const { return kiln::to(*this, t); }
Tensor Tensor::to(Device d) const { return kiln::to(*this, d); }
Tensor Tensor::cuda(int index) const { return kiln::to(*this, kiln::cuda(index)); }
Tensor Tensor::cpu() const { return kiln::to(*this, kiln::cpu()); }
Tensor Tensor::masked_fill(const Tensor& m, Scalar v) const { return kiln::masked_fill(*this, m, v); }
Tensor Tensor::sum(std::vector<int64_t> d, bool k) const { return kiln::sum(*this, d, k); }
Tensor Tensor::mean(std::vector<int64_t> d, bool k) const { return kiln::mean(*this, d, k); }
Tensor Tensor::prod(std::vector<int64_t> d, bool k) const { return kiln::prod(*this, d, k); }
Tensor Tensor::amax(std::vector<int64_t> d, bool k) const { return kiln::amax(*this, d, k); }
Tensor Tensor::amin(std::vector<int64_t> d, bool k) const { return kiln::amin(*this, d, k); }
Tensor Tensor::argmax(std::optional<int64_t> d, bool k) const { return kiln::argmax(*this, d, k); }
Tensor Tensor::argmin(std::optional<int64_t> d, bool k) const { return kiln::argmin(*this, d, k); }
Tensor Tensor::all(std::vector<int64_t> d, bool k) const { return kiln::all(*this, d, k); }
Tensor Tensor::any(std::vector<int64_t> d, bool k) const { return kiln::any(*this, d, k); }
Tensor Tensor::var(std::vector<int64_t> d, double c, bool k) const { return kiln::var(*this, d, c, k); }
Tensor Tensor::std(std::vector<int64_t> d, double c, bool k) const { return kiln::std(*this, d, c, k); }
Tensor Tensor::logsumexp(std::vector<int64_t> d, bool k) const { return kiln::logsumexp(*this, d, k); }
Tensor Tensor::norm(double p, std::vector<int64_t> d, bool k) const { return kiln::norm(*this, p, d, k); }
Tensor Tensor::cumsum(int64_t d) const { return kiln::cumsum(*this, d); }
Tensor Tensor::reshape(const std::vector<int64_t>& s) const { return kiln::reshape(*this, s); }
Tensor Tensor::flatten(int64_t a, int64_t b) const { return kiln::flatten(*this, a, b); }
Tensor Tensor::squeeze(std::optional<int64_t> d) const { return kiln::squeeze(*this, d); }
Tensor Tensor::unsqueeze(int64_t d) const { return kiln::unsqueeze(*this, d); }
Tensor Tensor::permute(const std::vector<int64_t>& d) const { return kiln::permute(*this, d); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return kiln::transpose(*this, a, b); }
Tensor Tensor::expand(const std::vector<int64_t>& s) const { return kiln::expand(*this, s); }
Tensor Tensor::broadcast_to(const std::vector<int64_t>& s) const { return kiln::broadcast_to(*this, s); }
Tensor Tensor::flip(const std::vector<int64_t>& d) const { return kiln::flip(*this, d); }
Tensor Tensor::repeat(const std::vector<int64_t>& r) const { return kiln::repeat(*this, r); }
std::vector<Tensor> Tensor::split(int64_t s, int64_t d) const { return kiln::split(*this, s, d); }
std::vector<Tensor> Tensor::split(const std::vector<int64_t>& s, int64_t d) const { return kiln::split(*this, s, d); }
std::vector<Tensor> Tensor::chunk(int64_t c, int64_t d) const { return kiln::chunk(*this, c, d); }
Tensor Tensor::tril(int64_t k) const { return kiln::tril(*this, k); }
Tensor Tensor::triu(int64_t k) const { return kiln::triu(*this, k); }
Tensor Tensor::gather(int64_t d, const Tensor& i) const { return kiln::gather(*this, d, i); }
Tensor Tensor::index_select(int64_t d, const Tensor& i) const { return kiln::index_select(*this, d, i); }
Tensor Tensor::matmul(const Tensor& o) const { return kiln::matmul(*this, o); }
Tensor Tensor::softmax(int64_t d) const { return kiln::softmax(*this, d); }
Tensor Tensor::log_softmax(int64_t d) const { return kiln::log_softmax(*this, d); }
Tensor Tensor::clone() const { return detail::record(OpKind::Contiguous, {*this}, Attrs{}, dtype(), shape()); }

}  // namespace kiln
