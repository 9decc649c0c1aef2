// Ops as free functions, with PyTorch's names and semantics. Each checks its arguments,
// infers dtype and shape, and records a node; nothing runs until materialization.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/tensor/tensor.h"

namespace kiln {

// ---------- creation ----------
Tensor zeros(const std::vector<int64_t>& shape, DType dtype = kFloat32, Device device = cpu());
Tensor ones(const std::vector<int64_t>& shape, DType dtype = kFloat32, Device device = cpu());
Tensor full(const std::vector<int64_t>& shape, Scalar value, std::optional<DType> dtype = std::nullopt,
            Device device = cpu());
// Uninitialized in PyTorch; kiln fills with zeros so results are deterministic.
Tensor empty(const std::vector<int64_t>& shape, DType dtype = kFloat32, Device device = cpu());
// Symbolic-shape fill (used by tracing and internal decompositions).
Tensor full_shape(const Shape& shape, Scalar value, DType dtype, Device device = cpu());
// zeros / ones / full / arange with SymInt sizes (from Tensor::sym_size): symbolic in
// compile() traces, so a shape computed from an input's size does not specialize it.
Tensor zeros_symint(const Shape& shape, DType dtype = kFloat32, Device device = cpu());
Tensor ones_symint(const Shape& shape, DType dtype = kFloat32, Device device = cpu());
Tensor full_symint(const Shape& shape, Scalar value, std::optional<DType> dtype = std::nullopt,
                   Device device = cpu());
// 0, 1, ..., end-1 (int64).
Tensor arange_symint(const SymInt& end, Device device = cpu());
Tensor arange(Scalar end, std::optional<DType> dtype = std::nullopt);
Tensor arange(Scalar start, Scalar end, Scalar step = 1, std::optional<DType> dtype = std::nullopt);
Tensor linspace(double start, double end, int64_t steps, DType dtype = kFloat32);
Tensor eye(int64_t n, std::optional<int64_t> m = std::nullopt, DType dtype = kFloat32);
Tensor zeros_like(const Tensor& t, std::optional<DType> dtype = std::nullopt);
Tensor ones_like(const Tensor& t, std::optional<DType> dtype = std::nullopt);
Tensor full_like(const Tensor& t, Scalar value, std::optional<DType> dtype = std::nullopt);
Tensor empty_like(const Tensor& t, std::optional<DType> dtype = std::nullopt);
Tensor rand_like(const Tensor& t);
Tensor randn_like(const Tensor& t);
// 1-D tensor from a list; dtype defaults from T (double -> float32 like torch.tensor([1.0])).
Tensor tensor(std::initializer_list<double> v, DType dtype = kFloat32);
Tensor tensor(std::initializer_list<std::initializer_list<double>> v, DType dtype = kFloat32);
Tensor tensor(std::initializer_list<std::initializer_list<std::initializer_list<double>>> v,
              DType dtype = kFloat32);
// Copies `values` (T's dtype) into a new tensor of `shape` (default: 1-D).
template <class T>
Tensor from_vector(const std::vector<T>& values, std::optional<std::vector<int64_t>> shape = std::nullopt);
// Zero-copy tensor over user memory (contiguous, row-major). `deleter`, if given, is called
// with `data` when the last reference goes; otherwise the memory must outlive the tensor.
Tensor from_blob(void* data, const std::vector<int64_t>& shape, DType dtype,
                 std::function<void(void*)> deleter = nullptr);
// A 0-d tensor holding `value` (dtype defaults to the scalar's own).
Tensor scalar_tensor(Scalar value, std::optional<DType> dtype = std::nullopt);

// ---------- random (counter-based Philox: same numbers whatever the thread count) ----------
// Resets the global generator (seed, counter 0).
void manual_seed(uint64_t seed);
Tensor rand(const std::vector<int64_t>& shape, DType dtype = kFloat32);
Tensor randn(const std::vector<int64_t>& shape, DType dtype = kFloat32);
// Integers uniform in [low, high).
Tensor randint(int64_t low, int64_t high, const std::vector<int64_t>& shape, DType dtype = kInt64);
// 1 with probability p (elementwise), else 0; same dtype as p.
Tensor bernoulli(const Tensor& p);
Tensor bernoulli(const std::vector<int64_t>& shape, double p, DType dtype = kFloat32);

// ---------- unary pointwise ----------
Tensor neg(const Tensor& x);        Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);        Tensor exp2(const Tensor& x);
Tensor expm1(const Tensor& x);      Tensor log(const Tensor& x);
Tensor log2(const Tensor& x);       Tensor log1p(const Tensor& x);
Tensor sqrt(const Tensor& x);       Tensor rsqrt(const Tensor& x);
Tensor reciprocal(const Tensor& x); Tensor square(const Tensor& x);
Tensor sin(const Tensor& x);        Tensor cos(const Tensor& x);
Tensor tan(const Tensor& x);        Tensor atan(const Tensor& x);
Tensor tanh(const Tensor& x);       Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);       Tensor silu(const Tensor& x);
Tensor softplus(const Tensor& x, double beta = 1, double threshold = 20);
Tensor erf(const Tensor& x);        Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);       Tensor round(const Tensor& x);
Tensor sign(const Tensor& x);       Tensor isnan(const Tensor& x);
Tensor isfinite(const Tensor& x);   Tensor logical_not(const Tensor& x);
Tensor bitwise_not(const Tensor& x);
// approximate: "none" (erf) or "tanh".
Tensor gelu(const Tensor& x, const std::string& approximate = "none");
Tensor to(const Tensor& x, DType dtype);

// ---------- binary pointwise (broadcasting, PyTorch type promotion) ----------
#define KILN_BINARY_DECL(name)                  \
  Tensor name(const Tensor& a, const Tensor& b); \
  Tensor name(const Tensor& a, Scalar b);        \
  Tensor name(Scalar a, const Tensor& b);
KILN_BINARY_DECL(add) KILN_BINARY_DECL(sub) KILN_BINARY_DECL(mul) KILN_BINARY_DECL(div)
KILN_BINARY_DECL(pow) KILN_BINARY_DECL(maximum) KILN_BINARY_DECL(minimum)
KILN_BINARY_DECL(atan2) KILN_BINARY_DECL(remainder) KILN_BINARY_DECL(fmod)
KILN_BINARY_DECL(eq) KILN_BINARY_DECL(ne) KILN_BINARY_DECL(lt) KILN_BINARY_DECL(le)
KILN_BINARY_DECL(gt) KILN_BINARY_DECL(ge)
KILN_BINARY_DECL(logical_and) KILN_BINARY_DECL(logical_or) KILN_BINARY_DECL(logical_xor)
KILN_BINARY_DECL(bitwise_and) KILN_BINARY_DECL(bitwise_or) KILN_BINARY_DECL(bitwise_xor)
#undef KILN_BINARY_DECL
// a + alpha * b.
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha);
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha);

// ---------- ternary ----------
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, Scalar b);
Tensor where(const Tensor& cond, Scalar a, const Tensor& b);
Tensor where(const Tensor& cond, Scalar a, Scalar b);
Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max);
Tensor clamp(const Tensor& x, const std::optional<Tensor>& min, const std::optional<Tensor>& max);
Tensor lerp(const Tensor& a, const Tensor& b, Scalar weight);
Tensor lerp(const Tensor& a, const Tensor& b, const Tensor& weight);
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value);
Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value);

// ---------- reductions (dims empty = all dims; negative dims allowed) ----------
Tensor sum(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false,
           std::optional<DType> dtype = std::nullopt);
Tensor mean(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor prod(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
// Values and indices of the max/min along `dim`.
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
// Max/min over all elements.
Tensor max(const Tensor& x);
Tensor min(const Tensor& x);
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor all(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor any(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor var(const Tensor& x, std::vector<int64_t> dims = {}, double correction = 1, bool keepdim = false);
Tensor std(const Tensor& x, std::vector<int64_t> dims = {}, double correction = 1, bool keepdim = false);
Tensor logsumexp(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
// Vector p-norm over dims (p = 2 default; p = inf supported).
Tensor norm(const Tensor& x, double p = 2, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor cumsum(const Tensor& x, int64_t dim);

// ---------- views and movement ----------
Tensor reshape(const Tensor& x, const std::vector<int64_t>& shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor squeeze(const Tensor& x, std::optional<int64_t> dim = std::nullopt);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor expand(const Tensor& x, const std::vector<int64_t>& shape);
Tensor broadcast_to(const Tensor& x, const std::vector<int64_t>& shape);
// x expanded / viewed / reshaped to other's shape (symbolic sizes stay symbolic).
Tensor expand_as(const Tensor& x, const Tensor& other);
Tensor view_as(const Tensor& x, const Tensor& other);
Tensor reshape_as(const Tensor& x, const Tensor& other);
std::vector<Tensor> broadcast_tensors(const std::vector<Tensor>& ts);
Tensor contiguous(const Tensor& x);
Tensor cat(const std::vector<Tensor>& ts, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& ts, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
Tensor flip(const Tensor& x, const std::vector<int64_t>& dims);
Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats);
// Constant padding; `pad` lists (left, right) pairs starting from the last dim, like F.pad.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pad, double value = 0);
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);

// ---------- indexing ----------
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, Scalar value);
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha = 1);
Tensor embedding(const Tensor& indices, const Tensor& weight);
Tensor one_hot(const Tensor& indices, int64_t num_classes = -1);
// Data-dependent (materialize their input): indices of non-zero elements [n, dim]; masked values.
Tensor nonzero(const Tensor& x);
Tensor masked_select(const Tensor& x, const Tensor& mask);

// ---------- linear algebra (OpenBLAS) ----------
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);
// x @ w^T + b.
Tensor linear(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b = std::nullopt);
Tensor outer(const Tensor& a, const Tensor& b);

// ---------- nn functional ----------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape,
                  const std::optional<Tensor>& weight = std::nullopt,
                  const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5);
// reduction: "mean", "sum" or "none". target: class indices (int64).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const std::string& reduction = "mean");
Tensor mse_loss(const Tensor& x, const Tensor& y, const std::string& reduction = "mean");
Tensor smooth_l1_loss(const Tensor& x, const Tensor& y, const std::string& reduction = "mean",
                      double beta = 1.0);
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true);
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const std::optional<Tensor>& attn_mask = std::nullopt,
                                    bool is_causal = false, std::optional<double> scale = std::nullopt);
// x [N, C, H, W], w [Cout, C/groups, kh, kw].
Tensor conv2d(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b = std::nullopt,
              std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0},
              std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1);

// ---------- C++ operators ----------
#define KILN_OPERATOR_DECL(sym)                         \
  Tensor operator sym(const Tensor& a, const Tensor& b); \
  Tensor operator sym(const Tensor& a, Scalar b);        \
  Tensor operator sym(Scalar a, const Tensor& b);
KILN_OPERATOR_DECL(+) KILN_OPERATOR_DECL(-) KILN_OPERATOR_DECL(*) KILN_OPERATOR_DECL(/)
KILN_OPERATOR_DECL(==) KILN_OPERATOR_DECL(!=) KILN_OPERATOR_DECL(<) KILN_OPERATOR_DECL(<=)
KILN_OPERATOR_DECL(>) KILN_OPERATOR_DECL(>=) KILN_OPERATOR_DECL(&) KILN_OPERATOR_DECL(|)
KILN_OPERATOR_DECL(^)
#undef KILN_OPERATOR_DECL
Tensor operator-(const Tensor& a);
Tensor operator!(const Tensor& a);
Tensor operator~(const Tensor& a);

// Result dtype of an op over these operands (torch.result_type rules).
DType result_type(const std::vector<Tensor>& tensors, const std::vector<Scalar>& scalars = {});

// ---------- PyTorch conveniences (runtime/ops/ops_api.cpp, ops_sort.cpp, ops_einsum.cpp,
// ops_advindex.cpp) ----------
// Reductions over a single dim: sum(x, 1), mean(x, -1) (braced lists pick the dims forms).
template <DimIndex I>
Tensor sum(const Tensor& x, I dim, bool keepdim = false, std::optional<DType> dtype = std::nullopt) {
  return sum(x, std::vector<int64_t>{static_cast<int64_t>(dim)}, keepdim, dtype);
}
#define KILN_ONE_DIM_DECL(name)                                        \
  template <DimIndex I>                                                \
  Tensor name(const Tensor& x, I dim, bool keepdim = false) {          \
    return name(x, std::vector<int64_t>{static_cast<int64_t>(dim)}, keepdim); \
  }
KILN_ONE_DIM_DECL(mean) KILN_ONE_DIM_DECL(prod) KILN_ONE_DIM_DECL(amax) KILN_ONE_DIM_DECL(amin)
KILN_ONE_DIM_DECL(all) KILN_ONE_DIM_DECL(any) KILN_ONE_DIM_DECL(logsumexp)
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
Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype);
// Inclusive product scan along `dim` (in `dtype` when given).
Tensor cumprod(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);
// clamp with one bound (a number or a broadcasting tensor).
Tensor clamp_min(const Tensor& x, Scalar min);
Tensor clamp_min(const Tensor& x, const Tensor& min);
Tensor clamp_max(const Tensor& x, Scalar max);
Tensor clamp_max(const Tensor& x, const Tensor& max);
// Removes the listed dims that have size 1 (others are kept).
Tensor squeeze(const Tensor& x, std::initializer_list<int64_t> dims);
Tensor squeeze(const Tensor& x, const std::vector<int64_t>& dims);
// Slices along `dim`, in order (views).
std::vector<Tensor> unbind(const Tensor& x, int64_t dim = 0);
// Moves dims `source` to positions `destination`; the others keep their order.
Tensor movedim(const Tensor& x, int64_t source, int64_t destination);
Tensor movedim(const Tensor& x, const std::vector<int64_t>& source, const std::vector<int64_t>& destination);
// The diagonal (offset above/below the main one) of dims dim1, dim2, as a view appended last.
Tensor diagonal(const Tensor& x, int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1);
// Circular shift along `dims` (no dims: over the flattened tensor).
Tensor roll(const Tensor& x, int64_t shift, std::optional<int64_t> dim = std::nullopt);
Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims);
// Sorted values and int64 indices along `dim`; always stable; NaN sorts as the greatest value.
std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false, bool stable = false);
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false, bool stable = false);
// The k largest (largest=false: smallest) elements and their indices along `dim`, in sorted order.
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                               bool sorted = true);
// int64 samples of category indices from the rows of `probs` ([n] or [rows, n], unnormalized
// non-negative weights), with or without replacement (Philox, like rand).
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false);
// A random permutation of 0..n-1.
Tensor randperm(int64_t n, DType dtype = kInt64);
// Einstein summation: "ij,jk->ik", implicit output, repeated labels (diagonals), "...".
Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands);
// Pairwise p-norm distances between the rows of x1 [..., P, M] and x2 [..., R, M]: [..., P, R].
Tensor cdist(const Tensor& x1, const Tensor& x2, double p = 2.0);
// Out-of-place x[indices] = values (accumulate: +=), indices as for Tensor::index.
Tensor index_put(const Tensor& x, const std::vector<TensorIndex>& indices, const Tensor& values,
                 bool accumulate = false);
// from_vector of bools (std::vector<bool> is bit-packed, so it has its own definition).
template <>
Tensor from_vector<bool>(const std::vector<bool>& values, std::optional<std::vector<int64_t>> shape);

}  // namespace kiln
