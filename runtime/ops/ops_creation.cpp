// Creation ops: constants, ranges, user memory and random numbers.
#include <cmath>
#include <mutex>

#include "runtime/exec/device_runtime.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"
#include "runtime/tensor/trace.h"
#include <tuple>

namespace kiln {
using detail::record;

namespace detail {
Tensor leaf(std::shared_ptr<Storage> storage, Shape shape, DType dtype, Device device) {
  Tensor t = record(OpKind::Leaf, NodeList{}, Attrs{}, dtype, std::move(shape), device);
  t.node()->set_storage(std::move(storage));
  return t;
}
void check_sizes(const std::vector<int64_t>& shape, const char* op) {
  for (int64_t s : shape) KILN_CHECK(s >= 0, op, ": expected non-negative sizes, got ", str(shape));
}
}  // namespace detail

Tensor full_shape(const Shape& shape, Scalar value, DType dtype, Device device) {
  detail::check_fill_value(value, dtype, "full");
  Attrs a;
  a.f0 = value.to_double();
  if (value.kind() != Scalar::Kind::Float) a.ints = {value.to_int()};
  return record(OpKind::Full, NodeList{}, a, dtype, shape, device);
}

Tensor full(const std::vector<int64_t>& shape, Scalar value, std::optional<DType> dtype, Device device) {
  detail::check_sizes(shape, "full");
  return full_shape(make_shape(shape), value, dtype ? *dtype : value.default_dtype(), device);
}
Tensor zeros(const std::vector<int64_t>& s, DType t, Device d) { return full(s, 0, t, d); }
Tensor ones(const std::vector<int64_t>& s, DType t, Device d) { return full(s, 1, t, d); }
Tensor empty(const std::vector<int64_t>& s, DType t, Device d) { return full(s, 0, t, d); }
Tensor zeros_like(const Tensor& t, std::optional<DType> d) {
  return full_shape(t.shape(), 0, d.value_or(t.dtype()), t.device());
}
Tensor ones_like(const Tensor& t, std::optional<DType> d) {
  return full_shape(t.shape(), 1, d.value_or(t.dtype()), t.device());
}
Tensor empty_like(const Tensor& t, std::optional<DType> d) { return zeros_like(t, d); }
Tensor full_like(const Tensor& t, Scalar v, std::optional<DType> d) {
  return full_shape(t.shape(), v, d.value_or(t.dtype()), t.device());
}
Tensor scalar_tensor(Scalar v, std::optional<DType> dtype, Device device) {
  return full_shape(Shape{}, v, dtype.value_or(v.default_dtype()), device);
}

Tensor arange(Scalar end, std::optional<DType> dtype, Device device) { return arange(0, end, 1, dtype, device); }
Tensor arange(Scalar start, Scalar end, Scalar step, std::optional<DType> dtype, Device device) {
  bool fl = start.is_floating() || end.is_floating() || step.is_floating();
  DType t = dtype ? *dtype : fl ? kFloat32 : kInt64;
  double st = step.to_double();
  KILN_CHECK(std::isfinite(start.to_double()) && std::isfinite(end.to_double()),
             "arange: unsupported range: ", start.to_double(), " -> ", end.to_double(),
             " (expected finite start and end)");
  KILN_CHECK(st != 0 && !std::isnan(st), "arange: step must be nonzero and not nan, got ", st);
  double n = std::ceil((end.to_double() - start.to_double()) / st);
  KILN_CHECK(n >= 0, "arange: upper bound and larger bound inconsistent with step sign (start=", start.to_double(),
             ", end=", end.to_double(), ", step=", st, ")");
  KILN_CHECK(n < 0x1p63, "arange: the range [", start.to_double(), ", ", end.to_double(), ") with step ", st, " holds ",
             n, " elements, more than int64 can count (invalid size, possible overflow)");
  Attrs a;
  a.f0 = start.to_double();
  a.f1 = st;
  if (!fl) a.ints = {start.to_int(), step.to_int()};
  return record(OpKind::Arange, NodeList{}, a, t, Shape{static_cast<int64_t>(n)}, device);
}

namespace {
template <class T>
Tensor host_tensor(const std::vector<T>& v, const std::vector<int64_t>& shape) {
  auto s = Storage::allocate(v.size() * sizeof(T), cpu());
  if (!v.empty()) std::memcpy(s->data, v.data(), v.size() * sizeof(T));
  return detail::leaf(std::move(s), make_shape(shape), dtype_of<T>(), cpu());
}
}  // namespace

template <class T>
Tensor from_vector(const std::vector<T>& values, std::optional<std::vector<int64_t>> shape, Device device) {
  std::vector<int64_t> sh = shape ? *shape : std::vector<int64_t>{static_cast<int64_t>(values.size())};
  detail::check_sizes(sh, "from_vector");
  int64_t n = 1;
  for (int64_t s : sh) n *= s;
  KILN_CHECK(n == static_cast<int64_t>(values.size()), "from_vector: shape ", detail::str(sh), " holds ", n,
             " elements, got ", values.size(), " values");
  Tensor t = host_tensor(values, sh);
  return device == cpu() ? t : t.to(device).detach();
}
template Tensor from_vector(const std::vector<float>&, std::optional<std::vector<int64_t>>, Device);
template Tensor from_vector(const std::vector<double>&, std::optional<std::vector<int64_t>>, Device);
template Tensor from_vector(const std::vector<int32_t>&, std::optional<std::vector<int64_t>>, Device);
template Tensor from_vector(const std::vector<int64_t>&, std::optional<std::vector<int64_t>>, Device);
template Tensor from_vector(const std::vector<Half>&, std::optional<std::vector<int64_t>>, Device);
template Tensor from_vector(const std::vector<BFloat16>&, std::optional<std::vector<int64_t>>, Device);

namespace {
// t on `device` (a leaf there when it was one here).
Tensor on(const Tensor& t, Device device) { return device == cpu() ? t : t.to(device).detach(); }

Tensor from_doubles(const std::vector<double>& v, const std::vector<int64_t>& shape, DType dtype) {
  return dispatch_dtype(dtype, [&](auto tag) -> Tensor {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      return from_doubles(v, shape, kFloat64) != 0.0;
    } else {
      std::vector<T> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<T>(static_cast<compute_t<T>>(v[i]));
      return host_tensor(out, shape);
    }
  });
}
}  // namespace

Tensor tensor(std::initializer_list<double> v, DType dtype, Device device) {
  return on(from_doubles(std::vector<double>(v), {static_cast<int64_t>(v.size())}, dtype), device);
}
Tensor tensor(std::initializer_list<std::initializer_list<double>> v, DType dtype, Device device) {
  std::vector<double> flat;
  size_t cols = v.size() ? v.begin()->size() : 0;
  for (auto& row : v) {
    KILN_CHECK(row.size() == cols, "tensor: expected rows of equal length ", cols, ", got ", row.size());
    flat.insert(flat.end(), row.begin(), row.end());
  }
  return on(from_doubles(flat, {static_cast<int64_t>(v.size()), static_cast<int64_t>(cols)}, dtype), device);
}
Tensor tensor(std::initializer_list<std::initializer_list<std::initializer_list<double>>> v, DType dtype,
              Device device) {
  std::vector<double> flat;
  size_t rows = v.size() ? v.begin()->size() : 0, cols = rows ? v.begin()->begin()->size() : 0;
  for (auto& m : v) {
    KILN_CHECK(m.size() == rows, "tensor: expected ", rows, " rows per matrix, got ", m.size());
    for (auto& row : m) {
      KILN_CHECK(row.size() == cols, "tensor: expected rows of equal length ", cols, ", got ", row.size());
      flat.insert(flat.end(), row.begin(), row.end());
    }
  }
  return on(from_doubles(flat, {static_cast<int64_t>(v.size()), static_cast<int64_t>(rows), static_cast<int64_t>(cols)},
                         dtype),
            device);
}

Tensor linspace(double start, double end, int64_t steps, DType dtype, Device device) {
  KILN_CHECK(steps >= 0, "linspace: number of steps must be non-negative, got ", steps);
  KILN_CHECK(is_floating(dtype), "linspace: expected a floating dtype, got ", dtype_name(dtype));
  std::vector<double> v(static_cast<size_t>(steps));
  double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0;
  int64_t half = steps / 2;
  for (int64_t i = 0; i < steps; ++i)
    v[i] = i < half ? start + step * static_cast<double>(i) : end - step * static_cast<double>(steps - 1 - i);
  if (steps == 1) v[0] = start;  // PyTorch: a single step is `start`, not `end`
  return on(from_doubles(v, {steps}, dtype), device);
}

Tensor eye(int64_t n, std::optional<int64_t> m, DType dtype, Device device) {
  int64_t cols = m.value_or(n);
  KILN_CHECK(n >= 0 && cols >= 0, "eye: expected non-negative sizes, got ", n, " x ", cols);
  Tensor r = arange(n, std::nullopt, device).unsqueeze(1), c = arange(cols, std::nullopt, device).unsqueeze(0);
  return to(eq(r, c), dtype);
}

Tensor from_blob(void* data, const std::vector<int64_t>& shape, DType dtype, std::function<void(void*)> deleter,
                 Device device) {
  if (device != cpu()) device_runtime(device);  // before the storage exists: a failure must not call `deleter`
  detail::check_sizes(shape, "from_blob");
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  KILN_CHECK(data != nullptr || n == 0, "from_blob: got a null pointer for ", n, " elements");
  auto s = std::make_shared<Storage>();
  s->data = data;
  s->nbytes = static_cast<size_t>(n) * itemsize(dtype);
  s->device = device;
  s->deleter = std::move(deleter);
  return detail::leaf(std::move(s), make_shape(shape), dtype, device);
}

// ---------- random ----------
namespace {
std::mutex g_rng_mu;
uint64_t g_seed = 0x853c49e6748fea9bull, g_counter = 0;

Tensor random_op(OpKind op, const Shape& shape, DType dtype, Device device, double a, double b,
                 std::vector<int64_t> ints = {}) {
  Attrs at;
  at.ints = std::move(ints);
  at.f0 = a;
  at.f1 = b;
  int64_t n = 1;
  for (const auto& s : shape) n *= s.maybe_int().value_or(1);
  auto* observer = detail::trace_observer();
  if (!observer || observer->draws()) std::tie(at.seed, at.counter) = detail::rng_reserve(static_cast<uint64_t>(n));
  Tensor t = record(op, NodeList{}, at, dtype, shape, device);
  if (observer) observer->on_random(*t.node());
  return t;
}
}  // namespace

namespace detail {
// This thread's RngRecord (innermost; each holds the next outer one) and RngReplay, or null.
thread_local RngRecord* t_rng_record = nullptr;
thread_local RngReplay* t_rng_replay = nullptr;

std::pair<uint64_t, uint64_t> rng_state() {
  std::lock_guard<std::mutex> lock(g_rng_mu);
  return {g_seed, g_counter};
}
void set_rng_state(std::pair<uint64_t, uint64_t> s) {
  std::lock_guard<std::mutex> lock(g_rng_mu);
  std::tie(g_seed, g_counter) = s;
}
std::pair<uint64_t, uint64_t> rng_reserve(uint64_t n) {
  std::pair<uint64_t, uint64_t> r;
  if (t_rng_replay) {
    r = t_rng_replay->next(n);
  } else {
    std::lock_guard<std::mutex> lock(g_rng_mu);
    r = {g_seed, g_counter};
    g_counter += n;
  }
  for (RngRecord* rec = t_rng_record; rec; rec = rec->outer_) rec->draws_.push_back({r.first, r.second, n});
  return r;
}

RngRecord::RngRecord() : outer_(t_rng_record) { t_rng_record = this; }
RngRecord::~RngRecord() { t_rng_record = outer_; }

RngReplay::RngReplay(const RngRecord::Draws& draws) : draws_(draws), outer_(t_rng_replay) { t_rng_replay = this; }
RngReplay::~RngReplay() { t_rng_replay = outer_; }
std::pair<uint64_t, uint64_t> RngReplay::next(uint64_t n) {
  KILN_CHECK(at_ < draws_.size() && draws_[at_].n == n, "checkpoint: the recomputation draws random numbers (",
             n, " of them, draw ", at_ + 1, ") the forward did not (it drew ", draws_.size(),
             " times); fn must compute the same function both times");
  const RngRecord::Draw& d = draws_[at_++];
  return {d.seed, d.counter};
}
}  // namespace detail

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(g_rng_mu);
  g_seed = seed;
  g_counter = 0;
}

Tensor rand(const std::vector<int64_t>& shape, DType dtype, Device device) {
  detail::check_sizes(shape, "rand");
  KILN_CHECK(is_floating(dtype), "rand: expected a floating dtype, got ", dtype_name(dtype));
  return random_op(OpKind::RandUniform, make_shape(shape), dtype, device, 0, 1);
}
Tensor randn(const std::vector<int64_t>& shape, DType dtype, Device device) {
  detail::check_sizes(shape, "randn");
  KILN_CHECK(is_floating(dtype), "randn: expected a floating dtype, got ", dtype_name(dtype));
  return random_op(OpKind::RandNormal, make_shape(shape), dtype, device, 0, 1);
}
Tensor rand_like(const Tensor& t) { return random_op(OpKind::RandUniform, t.shape(), t.dtype(), t.device(), 0, 1); }
Tensor randn_like(const Tensor& t) { return random_op(OpKind::RandNormal, t.shape(), t.dtype(), t.device(), 0, 1); }
Tensor randint(int64_t low, int64_t high, const std::vector<int64_t>& shape, DType dtype, Device device) {
  detail::check_sizes(shape, "randint");
  KILN_CHECK(high > low, "randint: expected low < high, got low=", low, ", high=", high);
  return random_op(OpKind::RandInt, make_shape(shape), dtype, device, static_cast<double>(low),
                   static_cast<double>(high), {low, high});
}
Tensor bernoulli(const Tensor& p) {
  KILN_CHECK(is_floating(p.dtype()), "bernoulli: expected a floating probability tensor, got ", dtype_name(p.dtype()));
  Tensor u = random_op(OpKind::RandUniform, p.shape(), p.dtype(), p.device(), 0, 1);
  return to(lt(u, p), p.dtype());
}
Tensor bernoulli(const std::vector<int64_t>& shape, double p, DType dtype, Device device) {
  KILN_CHECK(p >= 0 && p <= 1, "bernoulli: expected 0 <= p <= 1, got ", p);
  Tensor u = rand(shape, is_floating(dtype) ? dtype : kFloat32, device);
  return to(lt(u, p), dtype);
}

}  // namespace kiln
