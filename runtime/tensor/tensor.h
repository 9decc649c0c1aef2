// Tensor: a cheap handle to a node of the lazy graph. Ops record; data access materializes.
#pragma once
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/export.h"
#include "runtime/ir/node.h"
#include "runtime/core/scalar.h"

namespace kiln {

inline constexpr DType kBool = DType::Bool;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;

// One step of a view chain (replayed on the base after an in-place write).
struct ViewStep {
  OpKind op;
  Attrs attrs;
  Shape shape;  // the view's shape (View/Expand)
};

struct GradNode;  // a node of the backward graph (runtime/autograd/autograd.h)

// Shared state behind Tensor handles: the node it currently names, and, for views, the base
// tensor and the chain of view steps from it. In-place ops rebind `node` (functionalization).
struct KILN_API TensorImpl {
  // A fresh impl (from the per-thread pool).
  static std::shared_ptr<TensorImpl> make();
  NodePtr node_;
  std::shared_ptr<TensorImpl> base;  // set for views: the tensor owning the storage
  std::vector<ViewStep> chain;  // view steps from base to this
  uint64_t version = 0;  // bumped by every in-place write to this tensor
  uint64_t base_version = 0;  // base->version this view's node was built from
  // Autograd: leaves that require grad accumulate into `grad`; results of differentiable ops
  // name the backward node that produced them.
  bool requires_grad = false;
  std::shared_ptr<GradNode> grad_fn;  // null for leaves
  std::shared_ptr<GradNode> accumulator;  // leaves: where gradients accumulate (lazy)
  std::shared_ptr<TensorImpl> grad;  // accumulated gradient (leaves)
  // Forward-mode AD (runtime/autograd/forward_ad.h): this tensor's tangent at each dual level
  // that gave it one (entries of exited levels are dropped when the level exits).
  struct Tangent {
    uint64_t level;
    std::shared_ptr<TensorImpl> value;
  };
  std::vector<Tangent> tangents;
  // The current node, rebuilt from the base if the base was written since (a compile() trace
  // hears of the read through Tensor::node(), which knows the owning handle).
  const NodePtr& node() { return base ? view_node() : node_; }

 private:
  const NodePtr& view_node();
};

class Tensor;
// Index into a tensor: an integer (select), a Slice, None (new dim) or Ellipsis.
struct NoneIndex {};
struct EllipsisIndex {};
inline constexpr NoneIndex None{};
inline constexpr EllipsisIndex Ellipsis{};
// A slice bound: an index (negative counts from the end) or None (open end).
struct SliceBound {
  std::optional<int64_t> value;
  SliceBound(NoneIndex) {}  // NOLINT
  SliceBound(std::nullopt_t) {}  // NOLINT
  SliceBound(int64_t v) : value(v) {}  // NOLINT
  SliceBound(int v) : value(v) {}  // NOLINT
  SliceBound(std::optional<int64_t> v) : value(v) {}  // NOLINT
};
// start:stop:step, like Python's slice (step > 0).
struct Slice {
  std::optional<int64_t> start, stop;
  int64_t step = 1;
  Slice(SliceBound start = None, SliceBound stop = None, int64_t step = 1)
      : start(start.value), stop(stop.value), step(step) {}
};
// An index tensor (advanced indexing): int64/int32 positions or a bool mask (runtime/ops/ops_advindex.cpp).
struct KILN_API IndexTensor {
  std::shared_ptr<TensorImpl> impl;
  IndexTensor(const Tensor& t);  // NOLINT: implicit, so x.index({idx, Slice()}) reads like x[idx, :]
};
using TensorIndex = std::variant<int64_t, Slice, NoneIndex, EllipsisIndex, IndexTensor>;
// A dim, not a bool (single-dim overloads of reductions; braced lists pick the dims overloads).
template <class I>
concept DimIndex = std::integral<I> && !std::same_as<I, bool>;

// Handle to a lazy tensor. Copying a Tensor copies the handle, not the data.
class KILN_API Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  // A tensor naming `node` (not a view).
  static Tensor from_node(NodePtr node);

  bool defined() const { return impl_ != nullptr; }
  const NodePtr& node() const;
  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }

  // --- metadata (never materializes) ---
  DType dtype() const { return node()->dtype; }
  Device device() const { return node()->device; }
  int64_t dim() const { return static_cast<int64_t>(node()->shape.size()); }
  // Symbolic shape.
  const Shape& shape() const { return node()->shape; }
  // Sizes as integers. Inside a compile() trace a symbolic size is specialized to its traced
  // value, with a guard (KILN_LOG=recompiles names the call); use sym_sizes() to keep it symbolic.
  std::vector<int64_t> sizes() const;
  // Size of dim `d` (negative counts from the end); specializes like sizes().
  int64_t size(int64_t d) const;
  // Size of dim `d` as a SymInt: symbolic inside compile() traces, no specialization.
  SymInt sym_size(int64_t d) const;
  // Every size as a SymInt (the symbolic shape).
  const Shape& sym_sizes() const { return shape(); }
  int64_t numel() const;
  // Element strides into storage (views may be non-contiguous).
  std::vector<int64_t> strides() const;
  bool is_contiguous() const;
  bool is_view() const { return impl_ && impl_->base != nullptr; }
  bool is_materialized() const { return node()->materialized(); }

  // --- materialization ---
  // Computes this tensor now (with its pending ancestors); returns *this.
  const Tensor& eval() const;
  // The single value of a one-element tensor, converted to T.
  template <class T>
  T item() const;
  // Pointer to the first element (materializes; dtype must match T; follow strides()). For a
  // CUDA tensor: its device address, once the device has finished writing it.
  template <class T>
  const T* data() const;
  // A contiguous row-major copy of the values, converted to T.
  template <class T>
  std::vector<T> to_vector() const;

  // --- pointwise (method forms of the free functions) ---
  Tensor neg() const;
  Tensor abs() const;
  Tensor exp() const;
  Tensor exp2() const;
  Tensor expm1() const;
  Tensor log() const;
  Tensor log2() const;
  Tensor log1p() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor reciprocal() const;
  Tensor square() const;
  Tensor sin() const;
  Tensor cos() const;
  Tensor tan() const;
  Tensor atan() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor silu() const;
  Tensor softplus() const;
  Tensor erf() const;
  Tensor floor() const;
  Tensor ceil() const;
  Tensor round() const;
  Tensor sign() const;
  Tensor isnan() const;
  Tensor isfinite() const;
  Tensor logical_not() const;
  Tensor gelu(const std::string& approximate = "none") const;
  Tensor pow(const Tensor& e) const;
  Tensor pow(Scalar e) const;
  Tensor clamp(std::optional<Scalar> min, std::optional<Scalar> max) const;
  Tensor to(DType t) const;
  // This tensor on `device` (itself when already there); .cuda() / .cpu() are shorthands.
  Tensor to(Device device) const;
  Tensor cuda(int index = 0) const;
  Tensor cpu() const;
  Tensor masked_fill(const Tensor& mask, Scalar value) const;

  // --- reductions (empty dims = all dims) ---
  Tensor sum(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor mean(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor prod(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor amax(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor amin(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor argmax(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  Tensor argmin(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  Tensor all(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor any(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor var(std::vector<int64_t> dims = {}, double correction = 1, bool keepdim = false) const;
  Tensor std(std::vector<int64_t> dims = {}, double correction = 1, bool keepdim = false) const;
  Tensor logsumexp(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor norm(double p = 2, std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor cumsum(int64_t dim) const;

  // --- views and movement ---
  Tensor reshape(const std::vector<int64_t>& shape) const;
  Tensor reshape_sym(const Shape& shape) const;  // symbolic-shape reshape
  // reshape / view / expand / narrow with SymInt sizes (from sym_size(), arithmetic on them):
  // shapes computed from symbolic sizes stay symbolic in compile() traces.
  Tensor reshape_symint(const Shape& shape) const;
  Tensor view_symint(const Shape& shape) const;
  Tensor expand_symint(const Shape& shape) const;
  Tensor narrow_symint(int64_t dim, const SymInt& start, const SymInt& length) const;
  Tensor view(const std::vector<int64_t>& shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor squeeze(std::optional<int64_t> dim = std::nullopt) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;
  Tensor expand(const std::vector<int64_t>& shape) const;
  Tensor expand_sym(const Shape& shape) const;  // symbolic-shape expand
  Tensor broadcast_to(const std::vector<int64_t>& shape) const;
  Tensor slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // x[i, 1:3, None, ...] as x.index({i, Slice(1, 3), None, Ellipsis}).
  Tensor index(const std::vector<TensorIndex>& idx) const;
  Tensor operator[](int64_t i) const { return select(0, i); }
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor flip(const std::vector<int64_t>& dims) const;
  Tensor repeat(const std::vector<int64_t>& repeats) const;
  std::vector<Tensor> split(int64_t size, int64_t dim = 0) const;
  std::vector<Tensor> split(const std::vector<int64_t>& sizes, int64_t dim = 0) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  Tensor tril(int64_t diagonal = 0) const;
  Tensor triu(int64_t diagonal = 0) const;

  // --- indexing and linear algebra ---
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor matmul(const Tensor& o) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;

  // --- in-place (functionalized: the handle is rebound; views write through to their base) ---
  Tensor& add_(const Tensor& o, Scalar alpha = 1);
  Tensor& add_(Scalar o);
  Tensor& sub_(const Tensor& o, Scalar alpha = 1);
  Tensor& sub_(Scalar o);
  Tensor& mul_(const Tensor& o);
  Tensor& mul_(Scalar o);
  Tensor& div_(const Tensor& o);
  Tensor& div_(Scalar o);
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(Scalar v);
  Tensor& zero_();
  Tensor& clamp_(std::optional<Scalar> min, std::optional<Scalar> max);
  // x[idx] = v.
  Tensor& index_put_(const std::vector<TensorIndex>& idx, const Tensor& v);
  Tensor& index_put_(const std::vector<TensorIndex>& idx, Scalar v);

  // --- autograd ---
  // Marks a floating-point leaf as requiring gradients; returns *this.
  Tensor& requires_grad_(bool on = true);
  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  // True for tensors not produced by a differentiable op (user-created).
  bool is_leaf() const { return !impl_ || impl_->grad_fn == nullptr; }
  // The gradient accumulated by backward() (undefined until then).
  Tensor grad() const;
  // Replaces the accumulated gradient (undefined tensor clears it).
  void set_grad(const Tensor& g);
  // Backpropagates from this tensor: d(sum(this * gradient))/d(leaf) is added to each leaf's
  // grad(). `gradient` defaults to 1 for one-element tensors. Builds lazy nodes only.
  void backward(const std::optional<Tensor>& gradient = std::nullopt, bool retain_graph = false,
                bool create_graph = false) const;
  // The same value, cut from the autograd graph (shares the node).
  Tensor detach() const;
  // Makes this tensor (not a view) hold `value`'s data, keeping its identity and grad settings,
  // as PyTorch's `t.data = value`; a gradient on another device than `value` is cleared.
  Tensor& set_data(const Tensor& value);

  // Rebinds this handle to `value` (cast to dtype, broadcast to shape), writing through to the
  // base if this is a view. The primitive behind every in-place op.
  Tensor& assign_(const Tensor& value);

  // --- PyTorch conveniences (runtime/ops/ops_api.cpp, ops_sort.cpp, ops_advindex.cpp) ---
  // Reductions over one dim: x.sum(1), x.mean(-1) (braced lists still pick the dims forms).
  template <DimIndex I>
  Tensor sum(I d, bool keepdim = false) const {
    return sum(one_dim(d), keepdim);
  }
  template <DimIndex I>
  Tensor mean(I d, bool keepdim = false) const {
    return mean(one_dim(d), keepdim);
  }
  template <DimIndex I>
  Tensor prod(I d, bool keepdim = false) const {
    return prod(one_dim(d), keepdim);
  }
  template <DimIndex I>
  Tensor amax(I d, bool keepdim = false) const {
    return amax(one_dim(d), keepdim);
  }
  template <DimIndex I>
  Tensor amin(I d, bool keepdim = false) const {
    return amin(one_dim(d), keepdim);
  }
  template <DimIndex I>
  Tensor all(I d, bool keepdim = false) const {
    return all(one_dim(d), keepdim);
  }
  template <DimIndex I>
  Tensor any(I d, bool keepdim = false) const {
    return any(one_dim(d), keepdim);
  }
  template <DimIndex I>
  Tensor logsumexp(I d, bool keepdim = false) const {
    return logsumexp(one_dim(d), keepdim);
  }
  template <DimIndex I>
  Tensor var(I d, double correction = 1, bool keepdim = false) const {
    return var(one_dim(d), correction, keepdim);
  }
  template <DimIndex I>
  Tensor std(I d, double correction = 1, bool keepdim = false) const {
    return std(one_dim(d), correction, keepdim);
  }
  // Sum accumulated and returned in `dtype`.
  Tensor sum(std::vector<int64_t> dims, bool keepdim, DType dtype) const;
  // Max/min over all elements; (values, int64 indices) along `dim`.
  Tensor max() const;
  Tensor min() const;
  std::pair<Tensor, Tensor> max(int64_t dim, bool keepdim = false) const;
  std::pair<Tensor, Tensor> min(int64_t dim, bool keepdim = false) const;
  // Inclusive scans along `dim`, computed and returned in `dtype` when given.
  Tensor cumsum(int64_t dim, std::optional<DType> dtype) const;
  Tensor cumprod(int64_t dim, std::optional<DType> dtype = std::nullopt) const;
  // clamp with one bound.
  Tensor clamp_min(Scalar min) const;
  Tensor clamp_max(Scalar max) const;
  // Expanded / viewed / reshaped to other's shape.
  Tensor expand_as(const Tensor& other) const;
  Tensor view_as(const Tensor& other) const;
  Tensor reshape_as(const Tensor& other) const;
  // Removes the listed size-1 dims (others are kept, as PyTorch).
  Tensor squeeze(std::initializer_list<int64_t> dims) const;
  Tensor squeeze(const std::vector<int64_t>& dims) const;
  // Slices along `dim` (views), in order.
  std::vector<Tensor> unbind(int64_t dim = 0) const;
  // Moves dim `source` to position `destination` (others keep their order).
  Tensor movedim(int64_t source, int64_t destination) const;
  Tensor movedim(const std::vector<int64_t>& source, const std::vector<int64_t>& destination) const;
  // The diagonal of dims (dim1, dim2) as a view, appended as the last dim.
  Tensor diagonal(int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1) const;
  // Elements shifted circularly along `dims` (no dims: the flattened tensor, reshaped back).
  Tensor roll(int64_t shift, std::optional<int64_t> dim = std::nullopt) const;
  Tensor roll(const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) const;
  // Sorted values and their int64 indices along `dim` (stable; NaN sorts as the greatest).
  std::pair<Tensor, Tensor> sort(int64_t dim = -1, bool descending = false, bool stable = false) const;
  Tensor argsort(int64_t dim = -1, bool descending = false, bool stable = false) const;
  // The k largest (or smallest) values and indices along `dim`, sorted.
  std::pair<Tensor, Tensor> topk(int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true) const;
  // Elementwise comparisons (bool results).
  Tensor eq(const Tensor& o) const;
  Tensor eq(Scalar o) const;
  Tensor ne(const Tensor& o) const;
  Tensor ne(Scalar o) const;
  Tensor lt(const Tensor& o) const;
  Tensor lt(Scalar o) const;
  Tensor le(const Tensor& o) const;
  Tensor le(Scalar o) const;
  Tensor gt(const Tensor& o) const;
  Tensor gt(Scalar o) const;
  Tensor ge(const Tensor& o) const;
  Tensor ge(Scalar o) const;
  // Casts (PyTorch's .float() .double() .long() .int() .bool(); those names are C++ keywords).
  Tensor to_float() const;
  Tensor to_double() const;
  Tensor to_long() const;
  Tensor to_int() const;
  Tensor to_bool() const;
  // The last two dims transposed (PyTorch's .mT).
  Tensor mT() const;
  // In-place forms (functionalized through assign_).
  Tensor& masked_fill_(const Tensor& mask, Scalar value);
  Tensor& masked_fill_(const Tensor& mask, const Tensor& value);
  Tensor& exp_();
  Tensor& log_();
  Tensor& sqrt_();
  Tensor& rsqrt_();
  Tensor& relu_();
  Tensor& sigmoid_();
  Tensor& tanh_();
  Tensor& neg_();
  Tensor& abs_();
  Tensor& sin_();
  Tensor& cos_();
  Tensor& floor_();
  Tensor& ceil_();
  Tensor& round_();
  Tensor& reciprocal_();
  Tensor& square_();
  Tensor& clamp_min_(Scalar min);
  Tensor& clamp_max_(Scalar max);
  Tensor& pow_(Scalar e);
  // x[indices] = v (accumulate=false) or x[indices] += v (accumulate=true, duplicates add up).
  Tensor& index_put_(const std::vector<TensorIndex>& idx, const Tensor& v, bool accumulate);

 private:
  template <DimIndex I>
  static std::vector<int64_t> one_dim(I d) {
    return {static_cast<int64_t>(d)};
  }
  std::shared_ptr<TensorImpl> impl_;
};

// Prints like PyTorch: values, then shape and dtype.
KILN_API std::ostream& operator<<(std::ostream& os, const Tensor& t);
// The same text as operator<<.
KILN_API std::string to_string(const Tensor& t);

// to_vector of a bool tensor (std::vector<bool> has no element pointers).
template <>
std::vector<bool> Tensor::to_vector<bool>() const;

// Computes all given tensors in one segment.
KILN_API void eval(const std::vector<Tensor>& ts);

}  // namespace kiln
