// Ops as free functions, with PyTorch's names and semantics. Each checks its arguments,
// infers dtype and shape, and records a node; nothing runs until materialization.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/export.h"
#include "runtime/tensor/tensor.h"

namespace kiln {

// ---------- creation ----------
KILN_API Tensor zeros(const std::vector<int64_t>& shape, DType dtype = kFloat32, Device device = cpu());
KILN_API Tensor ones(const std::vector<int64_t>& shape, DType dtype = kFloat32, Device device = cpu());
KILN_API Tensor full(const std::vector<int64_t>& shape, Scalar value, std::optional<DType> dtype = std::nullopt,
                     Device device = cpu());
// Uninitialized in PyTorch; kiln fills with zeros so results are deterministic.
KILN_API Tensor empty(const std::vector<int64_t>& shape, DType dtype = kFloat32, Device device = cpu());
// Symbolic-shape fill (used by tracing and internal decompositions).
KILN_API Tensor full_shape(const Shape& shape, Scalar value, DType dtype, Device device = cpu());
// zeros / ones / full / arange with SymInt sizes (from Tensor::sym_size): symbolic in
// compile() traces, so a shape computed from an input's size does not specialize it.
KILN_API Tensor zeros_symint(const Shape& shape, DType dtype = kFloat32, Device device = cpu());
KILN_API Tensor ones_symint(const Shape& shape, DType dtype = kFloat32, Device device = cpu());
KILN_API Tensor full_symint(const Shape& shape, Scalar value, std::optional<DType> dtype = std::nullopt,
                            Device device = cpu());
// 0, 1, ..., end-1 (int64).
KILN_API Tensor arange_symint(const SymInt& end, Device device = cpu());
KILN_API Tensor arange(Scalar end, std::optional<DType> dtype = std::nullopt, Device device = cpu());
KILN_API Tensor arange(Scalar start, Scalar end, Scalar step = 1, std::optional<DType> dtype = std::nullopt,
                       Device device = cpu());
KILN_API Tensor linspace(double start, double end, int64_t steps, DType dtype = kFloat32, Device device = cpu());
KILN_API Tensor eye(int64_t n, std::optional<int64_t> m = std::nullopt, DType dtype = kFloat32, Device device = cpu());
KILN_API Tensor zeros_like(const Tensor& t, std::optional<DType> dtype = std::nullopt);
KILN_API Tensor ones_like(const Tensor& t, std::optional<DType> dtype = std::nullopt);
KILN_API Tensor full_like(const Tensor& t, Scalar value, std::optional<DType> dtype = std::nullopt);
KILN_API Tensor empty_like(const Tensor& t, std::optional<DType> dtype = std::nullopt);
KILN_API Tensor rand_like(const Tensor& t);
KILN_API Tensor randn_like(const Tensor& t);
// 1-D tensor from a list; dtype defaults from T (double -> float32 like torch.tensor([1.0])).
KILN_API Tensor tensor(std::initializer_list<double> v, DType dtype = kFloat32, Device device = cpu());
KILN_API Tensor tensor(std::initializer_list<std::initializer_list<double>> v, DType dtype = kFloat32,
                       Device device = cpu());
KILN_API Tensor tensor(std::initializer_list<std::initializer_list<std::initializer_list<double>>> v,
                       DType dtype = kFloat32, Device device = cpu());
// Copies `values` (T's dtype) into a new tensor of `shape` (default: 1-D) on `device`.
template <class T>
KILN_API Tensor from_vector(const std::vector<T>& values, std::optional<std::vector<int64_t>> shape = std::nullopt,
                            Device device = cpu());
// Zero-copy tensor over user memory (contiguous, row-major) on `device` (a device address for
// a CUDA device). `deleter`, if given, is called with `data` when the last reference goes;
// otherwise the memory must outlive the tensor.
KILN_API Tensor from_blob(void* data, const std::vector<int64_t>& shape, DType dtype,
                          std::function<void(void*)> deleter = nullptr, Device device = cpu());
// A 0-d tensor holding `value` (dtype defaults to the scalar's own).
KILN_API Tensor scalar_tensor(Scalar value, std::optional<DType> dtype = std::nullopt, Device device = cpu());

// ---------- random (counter-based Philox: same numbers whatever the thread count) ----------
// Resets the global generator (seed, counter 0).
KILN_API void manual_seed(uint64_t seed);
// The same numbers on every device for the same seed.
KILN_API Tensor rand(const std::vector<int64_t>& shape, DType dtype = kFloat32, Device device = cpu());
KILN_API Tensor randn(const std::vector<int64_t>& shape, DType dtype = kFloat32, Device device = cpu());
// Integers uniform in [low, high).
KILN_API Tensor randint(int64_t low, int64_t high, const std::vector<int64_t>& shape, DType dtype = kInt64,
                        Device device = cpu());
// 1 with probability p (elementwise), else 0; same dtype as p.
KILN_API Tensor bernoulli(const Tensor& p);
KILN_API Tensor bernoulli(const std::vector<int64_t>& shape, double p, DType dtype = kFloat32, Device device = cpu());

// ---------- unary pointwise ----------
KILN_API Tensor neg(const Tensor& x);
KILN_API Tensor abs(const Tensor& x);
KILN_API Tensor exp(const Tensor& x);
KILN_API Tensor exp2(const Tensor& x);
KILN_API Tensor expm1(const Tensor& x);
KILN_API Tensor log(const Tensor& x);
KILN_API Tensor log2(const Tensor& x);
KILN_API Tensor log1p(const Tensor& x);
KILN_API Tensor sqrt(const Tensor& x);
KILN_API Tensor rsqrt(const Tensor& x);
KILN_API Tensor reciprocal(const Tensor& x);
KILN_API Tensor square(const Tensor& x);
KILN_API Tensor sin(const Tensor& x);
KILN_API Tensor cos(const Tensor& x);
KILN_API Tensor tan(const Tensor& x);
KILN_API Tensor atan(const Tensor& x);
KILN_API Tensor tanh(const Tensor& x);
KILN_API Tensor sigmoid(const Tensor& x);
KILN_API Tensor relu(const Tensor& x);
KILN_API Tensor silu(const Tensor& x);
KILN_API Tensor softplus(const Tensor& x, double beta = 1, double threshold = 20);
KILN_API Tensor erf(const Tensor& x);
KILN_API Tensor floor(const Tensor& x);
KILN_API Tensor ceil(const Tensor& x);
KILN_API Tensor round(const Tensor& x);
KILN_API Tensor sign(const Tensor& x);
KILN_API Tensor isnan(const Tensor& x);
KILN_API Tensor isfinite(const Tensor& x);
KILN_API Tensor logical_not(const Tensor& x);
KILN_API Tensor bitwise_not(const Tensor& x);
// approximate: "none" (erf) or "tanh".
KILN_API Tensor gelu(const Tensor& x, const std::string& approximate = "none");
KILN_API Tensor to(const Tensor& x, DType dtype);
// x on `device` (x itself when it is there already): a recorded copy, differentiable.
KILN_API Tensor to(const Tensor& x, Device device);

// ---------- binary pointwise (broadcasting, PyTorch type promotion) ----------
#define KILN_BINARY_DECL(name)                            \
  KILN_API Tensor name(const Tensor& a, const Tensor& b); \
  KILN_API Tensor name(const Tensor& a, Scalar b);        \
  KILN_API Tensor name(Scalar a, const Tensor& b);
KILN_BINARY_DECL(add)
KILN_BINARY_DECL(sub)
KILN_BINARY_DECL(mul)
KILN_BINARY_DECL(div)
KILN_BINARY_DECL(pow)
KILN_BINARY_DECL(maximum)
KILN_BINARY_DECL(minimum)
KILN_BINARY_DECL(atan2)
KILN_BINARY_DECL(remainder)
KILN_BINARY_DECL(fmod)
KILN_BINARY_DECL(eq)
KILN_BINARY_DECL(ne)
KILN_BINARY_DECL(lt)
KILN_BINARY_DECL(le)
KILN_BINARY_DECL(gt)
KILN_BINARY_DECL(ge)
KILN_BINARY_DECL(logical_and)
KILN_BINARY_DECL(logical_or)
KILN_BINARY_DECL(logical_xor)
KILN_BINARY_DECL(bitwise_and)
KILN_BINARY_DECL(bitwise_or)
KILN_BINARY_DECL(bitwise_xor)
#undef KILN_BINARY_DECL
// a + alpha * b.
KILN_API Tensor add(const Tensor& a, const Tensor& b, Scalar alpha);
KILN_API Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha);

// ---------- ternary ----------
KILN_API Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
KILN_API Tensor where(const Tensor& cond, const Tensor& a, Scalar b);
KILN_API Tensor where(const Tensor& cond, Scalar a, const Tensor& b);
KILN_API Tensor where(const Tensor& cond, Scalar a, Scalar b);
KILN_API Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max);
KILN_API Tensor clamp(const Tensor& x, const std::optional<Tensor>& min, const std::optional<Tensor>& max);
KILN_API Tensor lerp(const Tensor& a, const Tensor& b, Scalar weight);
KILN_API Tensor lerp(const Tensor& a, const Tensor& b, const Tensor& weight);
KILN_API Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value);
KILN_API Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value);

// ---------- reductions (dims empty = all dims; negative dims allowed) ----------
KILN_API Tensor sum(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false,
                    std::optional<DType> dtype = std::nullopt);
KILN_API Tensor mean(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
KILN_API Tensor prod(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
KILN_API Tensor amax(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
KILN_API Tensor amin(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
// Values and indices of the max/min along `dim`.
KILN_API std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
KILN_API std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
// Max/min over all elements.
KILN_API Tensor max(const Tensor& x);
KILN_API Tensor min(const Tensor& x);
KILN_API Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
KILN_API Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
KILN_API Tensor all(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
KILN_API Tensor any(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
KILN_API Tensor var(const Tensor& x, std::vector<int64_t> dims = {}, double correction = 1, bool keepdim = false);
KILN_API Tensor std(const Tensor& x, std::vector<int64_t> dims = {}, double correction = 1, bool keepdim = false);
KILN_API Tensor logsumexp(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
// Vector p-norm over dims (p = 2 default; p = inf supported).
KILN_API Tensor norm(const Tensor& x, double p = 2, std::vector<int64_t> dims = {}, bool keepdim = false);
KILN_API Tensor cumsum(const Tensor& x, int64_t dim);

// ---------- views and movement ----------
KILN_API Tensor reshape(const Tensor& x, const std::vector<int64_t>& shape);
KILN_API Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
KILN_API Tensor squeeze(const Tensor& x, std::optional<int64_t> dim = std::nullopt);
KILN_API Tensor unsqueeze(const Tensor& x, int64_t dim);
KILN_API Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
KILN_API Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
KILN_API Tensor expand(const Tensor& x, const std::vector<int64_t>& shape);
KILN_API Tensor broadcast_to(const Tensor& x, const std::vector<int64_t>& shape);
// x expanded / viewed / reshaped to other's shape (symbolic sizes stay symbolic).
KILN_API Tensor expand_as(const Tensor& x, const Tensor& other);
KILN_API Tensor view_as(const Tensor& x, const Tensor& other);
KILN_API Tensor reshape_as(const Tensor& x, const Tensor& other);
KILN_API std::vector<Tensor> broadcast_tensors(const std::vector<Tensor>& ts);
KILN_API Tensor contiguous(const Tensor& x);
KILN_API Tensor cat(const std::vector<Tensor>& ts, int64_t dim = 0);
KILN_API Tensor stack(const std::vector<Tensor>& ts, int64_t dim = 0);
KILN_API std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim = 0);
KILN_API std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
KILN_API std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
KILN_API Tensor flip(const Tensor& x, const std::vector<int64_t>& dims);
KILN_API Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats);
// Constant padding; `pad` lists (left, right) pairs starting from the last dim, like F.pad.
KILN_API Tensor pad(const Tensor& x, const std::vector<int64_t>& pad, double value = 0);
KILN_API Tensor tril(const Tensor& x, int64_t diagonal = 0);
KILN_API Tensor triu(const Tensor& x, int64_t diagonal = 0);

// ---------- indexing ----------
KILN_API Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
KILN_API Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
KILN_API Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, Scalar value);
KILN_API Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
KILN_API Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
KILN_API Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha = 1);
KILN_API Tensor embedding(const Tensor& indices, const Tensor& weight);
KILN_API Tensor one_hot(const Tensor& indices, int64_t num_classes = -1);
// Data-dependent (materialize their input): indices of non-zero elements [n, dim]; masked values.
KILN_API Tensor nonzero(const Tensor& x);
KILN_API Tensor masked_select(const Tensor& x, const Tensor& mask);

// ---------- linear algebra (OpenBLAS) ----------
KILN_API Tensor matmul(const Tensor& a, const Tensor& b);
// How float32 GEMMs on CUDA may round, as torch.set_float32_matmul_precision: "highest" (the
// default: full float32), "high" or "medium" (TF32 tensor cores allowed). CPU GEMMs ignore it.
KILN_API void set_float32_matmul_precision(const std::string& precision);
KILN_API std::string get_float32_matmul_precision();
KILN_API Tensor bmm(const Tensor& a, const Tensor& b);
KILN_API Tensor mm(const Tensor& a, const Tensor& b);
// x @ w^T + b.
KILN_API Tensor linear(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b = std::nullopt);
KILN_API Tensor outer(const Tensor& a, const Tensor& b);

// ---------- nn functional ----------
KILN_API Tensor softmax(const Tensor& x, int64_t dim);
KILN_API Tensor log_softmax(const Tensor& x, int64_t dim);
KILN_API Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape,
                           const std::optional<Tensor>& weight = std::nullopt,
                           const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5);
// reduction: "mean", "sum" or "none". target: class indices (int64).
KILN_API Tensor cross_entropy(const Tensor& logits, const Tensor& target, const std::string& reduction = "mean");
KILN_API Tensor mse_loss(const Tensor& x, const Tensor& y, const std::string& reduction = "mean");
KILN_API Tensor smooth_l1_loss(const Tensor& x, const Tensor& y, const std::string& reduction = "mean",
                               double beta = 1.0);
KILN_API Tensor dropout(const Tensor& x, double p = 0.5, bool training = true);
// softmax(q·kᵀ·scale + mask)·v (scale defaults to 1/sqrt(head size); a bool mask keeps the
// true entries; is_causal keeps key j <= query i), with dropout of probability dropout_p on the
// softmax (kept entries scaled by 1 / (1 - dropout_p); pass 0 outside training). float32/float64
// with equal key and value head sizes up to 256 run as one fused node (forward and backward never
// hold the Tq x Tk matrix; the dropout mask comes from kiln's generator, drawn inside the kernels).
KILN_API Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const std::optional<Tensor>& attn_mask = std::nullopt,
                                             bool is_causal = false, std::optional<double> scale = std::nullopt,
                                             double dropout_p = 0.0);
// x [N, C, H, W], w [Cout, C/groups, kh, kw].
KILN_API Tensor conv2d(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b = std::nullopt,
                       std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0},
                       std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1);

// ---------- C++ operators ----------
#define KILN_OPERATOR_DECL(sym)                                   \
  KILN_API Tensor operator sym(const Tensor& a, const Tensor& b); \
  KILN_API Tensor operator sym(const Tensor& a, Scalar b);        \
  KILN_API Tensor operator sym(Scalar a, const Tensor& b);
KILN_OPERATOR_DECL(+)
KILN_OPERATOR_DECL(-)
KILN_OPERATOR_DECL(*)
KILN_OPERATOR_DECL(/)
KILN_OPERATOR_DECL(==)
KILN_OPERATOR_DECL(!=)
KILN_OPERATOR_DECL(<)
KILN_OPERATOR_DECL(<=)
KILN_OPERATOR_DECL(>)
KILN_OPERATOR_DECL(>=)
KILN_OPERATOR_DECL(&)
KILN_OPERATOR_DECL(|)
KILN_OPERATOR_DECL(^)
#undef KILN_OPERATOR_DECL
KILN_API Tensor operator-(const Tensor& a);
KILN_API Tensor operator!(const Tensor& a);
KILN_API Tensor operator~(const Tensor& a);

// Result dtype of an op over these operands (torch.result_type rules).
KILN_API DType result_type(const std::vector<Tensor>& tensors, const std::vector<Scalar>& scalars = {});

// ---------- PyTorch conveniences (runtime/ops/ops_api.cpp, ops_sort.cpp, ops_einsum.cpp,
// ops_advindex.cpp) ----------
// Reductions over a single dim: sum(x, 1), mean(x, -1) (braced lists pick the dims forms).
template <DimIndex I>
Tensor sum(const Tensor& x, I dim, bool keepdim = false, std::optional<DType> dtype = std::nullopt) {
  return sum(x, std::vector<int64_t>{static_cast<int64_t>(dim)}, keepdim, dtype);
}
#define KILN_ONE_DIM_DECL(name)                                               \
  template <DimIndex I>                                                       \
  Tensor name(const Tensor& x, I dim, bool keepdim = false) {                 \
    return name(x, std::vector<int64_t>{static_cast<int64_t>(dim)}, keepdim); \
  }
KILN_ONE_DIM_DECL(mean)
KILN_ONE_DIM_DECL(prod)
KILN_ONE_DIM_DECL(amax)
KILN_ONE_DIM_DECL(amin)
KILN_ONE_DIM_DECL(all)
KILN_ONE_DIM_DECL(any)
KILN_ONE_DIM_DECL(logsumexp)
#undef KILN_ONE_DIM_DECL
template <DimIndex I>
Tensor var(const Tensor& x, I dim, double correction = 1, bool keepdim = false) {
  return var(x, std::vector<int64_t>{static_cast<int64_t>(dim)}, correction, keepdim);
}
template <DimIndex I>
Tensor std(const Tensor& x, I dim, double correction = 1, bool keepdim = false) {
  return kiln::std(x, std::vector<int64_t>{static_cast<int64_t>(dim)}, correction, keepdim);
}
// Inclusive sum scan computed and returned in `dtype` (default: int types widen to int64).
KILN_API Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype);
// Inclusive product scan along `dim` (in `dtype` when given).
KILN_API Tensor cumprod(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);
// clamp with one bound (a number or a broadcasting tensor).
KILN_API Tensor clamp_min(const Tensor& x, Scalar min);
KILN_API Tensor clamp_min(const Tensor& x, const Tensor& min);
KILN_API Tensor clamp_max(const Tensor& x, Scalar max);
KILN_API Tensor clamp_max(const Tensor& x, const Tensor& max);
// Removes the listed dims that have size 1 (others are kept).
KILN_API Tensor squeeze(const Tensor& x, std::initializer_list<int64_t> dims);
KILN_API Tensor squeeze(const Tensor& x, const std::vector<int64_t>& dims);
// Slices along `dim`, in order (views).
KILN_API std::vector<Tensor> unbind(const Tensor& x, int64_t dim = 0);
// Moves dims `source` to positions `destination`; the others keep their order.
KILN_API Tensor movedim(const Tensor& x, int64_t source, int64_t destination);
KILN_API Tensor movedim(const Tensor& x, const std::vector<int64_t>& source, const std::vector<int64_t>& destination);
// The diagonal (offset above/below the main one) of dims dim1, dim2, as a view appended last.
KILN_API Tensor diagonal(const Tensor& x, int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1);
// Circular shift along `dims` (no dims: over the flattened tensor).
KILN_API Tensor roll(const Tensor& x, int64_t shift, std::optional<int64_t> dim = std::nullopt);
KILN_API Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims);
// Sorted values and int64 indices along `dim`; always stable; NaN sorts as the greatest value.
KILN_API std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false,
                                        bool stable = false);
KILN_API Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false, bool stable = false);
// The k largest (largest=false: smallest) elements and their indices along `dim`, in sorted order.
KILN_API std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                                        bool sorted = true);
// int64 samples of category indices from the rows of `probs` ([n] or [rows, n], unnormalized
// non-negative weights), with or without replacement (Philox, like rand).
KILN_API Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false);
// A random permutation of 0..n-1.
KILN_API Tensor randperm(int64_t n, DType dtype = kInt64);
// Einstein summation: "ij,jk->ik", implicit output, repeated labels (diagonals), "...".
KILN_API Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands);
// Pairwise p-norm distances between the rows of x1 [..., P, M] and x2 [..., R, M]: [..., P, R].
KILN_API Tensor cdist(const Tensor& x1, const Tensor& x2, double p = 2.0);
// Out-of-place x[indices] = values (accumulate: +=), indices as for Tensor::index.
KILN_API Tensor index_put(const Tensor& x, const std::vector<TensorIndex>& indices, const Tensor& values,
                          bool accumulate = false);
// from_vector of bools (std::vector<bool> is bit-packed, so it has its own definition).
template <>
KILN_API Tensor from_vector<bool>(const std::vector<bool>& values, std::optional<std::vector<int64_t>> shape,
                                  Device device);

}  // namespace kiln
