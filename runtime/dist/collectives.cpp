// The collectives users call: argument checks, the functional (lazy, differentiable) forms, the
// in-place forms of torch.distributed on top of them, and Work handles.
#include <numeric>

#include "runtime/autograd/autograd.h"
#include "runtime/dist/collective_node.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"

namespace kiln::dist {

struct Work::State {
  CompletionPtr done;
  std::vector<std::shared_ptr<Storage>> keep;
  std::function<void()> finish;  // writes the result into the caller's tensors
  Tensor result;
  bool finished = false;
};

Tensor Work::result() const {
  KILN_CHECK(s_ && s_->finished, "Work::result: call wait() first");
  return s_->result;
}

void Work::wait() {
  if (!s_ || s_->finished) return;
  if (s_->done) s_->done->wait();  // throws the collective's error: nothing written
  s_->done.reset();
  s_->keep.clear();
  s_->finished = true;
  if (s_->finish) std::exchange(s_->finish, nullptr)();
}

bool Work::is_completed() const { return !s_ || s_->finished || !s_->done || s_->done->done(); }

namespace {

Group& member_group(const ProcessGroup& pg, const char* what) {
  Group& g = pg.impl();
  KILN_CHECK(g.rank() >= 0, what, ": this process is not a member of the group of ", g.size(), " ranks");
  return g;
}

void check_op(ReduceOp op, DType dtype, const char* what) {
  KILN_CHECK(op != ReduceOp::Avg || is_floating(dtype), what, ": ReduceOp::Avg needs a floating dtype, got ",
             dtype_name(dtype));
  KILN_CHECK(dtype != DType::Bool || op != ReduceOp::Avg, what, ": bool tensors reduce with sum/max (or), ",
             "product/min (and)");
}

void check_root(int root, const Group& g, const char* what) {
  KILN_CHECK(root >= 0 && root < g.size(), what, ": rank ", root, " is out of range for a group of ", g.size());
}

// Runs the functional form and returns the Work that writes its result with `finish` (now, or at
// wait() for async_op).
Work complete(const Tensor& result, std::function<void()> finish, bool async_op) {
  auto s = std::make_shared<Work::State>();
  InFlight f = take_in_flight();
  s->done = std::move(f.done);
  s->keep = std::move(f.keep);
  s->finish = std::move(finish);
  s->result = result;
  Work w(s);
  if (!async_op) w.wait();
  return w;
}

CollAttrs attrs_of(CollKind kind, const Group& g, ReduceOp op = ReduceOp::Sum, int root = 0, bool async = false) {
  CollAttrs c;
  c.kind = kind;
  c.group = g.id();
  c.op = op;
  c.root = root;
  c.async = async;
  return c;
}

// Equal blocks of `n` rows over `size` ranks, or the given splits (checked).
std::vector<int64_t> splits_or_equal(std::vector<int64_t> s, int64_t n, int size, const char* which) {
  if (s.empty()) {
    KILN_CHECK(n % size == 0, "all_to_all: dim 0 of the ", which, " (", n, ") is not divisible by the group size ",
               size, "; pass ", which, "_splits");
    return std::vector<int64_t>(static_cast<size_t>(size), n / size);
  }
  KILN_CHECK(static_cast<int>(s.size()) == size, "all_to_all: ", which, "_splits has ", s.size(),
             " entries for a group of ", size);
  for (int64_t x : s) KILN_CHECK(x >= 0, "all_to_all: ", which, "_splits has a negative entry ", x);
  KILN_CHECK(std::accumulate(s.begin(), s.end(), int64_t{0}) == n, "all_to_all: ", which, "_splits sum to ",
             std::accumulate(s.begin(), s.end(), int64_t{0}), ", but dim 0 of the ", which, " is ", n);
  return s;
}

// Elements in one row (dim 0 index) of `t`: the product of its other sizes (also when dim 0 is
// empty: a rank sending no rows still receives rows of that size).
int64_t row_elems(const Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

Tensor all_to_all_impl(const Tensor& input, std::vector<int64_t> output_splits, std::vector<int64_t> input_splits,
                       Group& g, bool async) {
  KILN_CHECK(input.dim() >= 1, "all_to_all: the input needs a dim 0 to split, got a 0-d tensor");
  input_splits = splits_or_equal(std::move(input_splits), input.size(0), g.size(), "input");
  const bool equal_out = output_splits.empty();
  if (equal_out) output_splits = input_splits;  // equal blocks both ways
  output_splits = splits_or_equal(std::move(output_splits),
                                  std::accumulate(output_splits.begin(), output_splits.end(), int64_t{0}), g.size(),
                                  "output");
  const int64_t rows = std::accumulate(output_splits.begin(), output_splits.end(), int64_t{0});
  const int64_t per_row = row_elems(input);
  CollAttrs c = attrs_of(CollKind::AllToAll, g, ReduceOp::Sum, 0, async);
  for (int64_t s : input_splits) c.in_counts.push_back(s * per_row);
  for (int64_t s : output_splits) c.out_counts.push_back(s * per_row);
  Shape shape = input.shape();
  shape[0] = SymInt(rows);
  Tensor out = record_collective(c, input, shape);
  detail::attach_custom_grad(out, "all_to_all", {input},
                             [input_splits, output_splits, gp = g.shared_from_this()](const Tensor& gr, bool) {
                               return std::vector<Tensor>{
                                   functional::all_to_all(gr, input_splits, output_splits, ProcessGroup(gp))};
                             });
  return out;
}

Tensor all_reduce_impl(const Tensor& input, ReduceOp op, Group& g, bool async) {
  check_op(op, input.dtype(), "all_reduce");
  Tensor out = record_collective(attrs_of(CollKind::AllReduce, g, op, 0, async), input, input.shape());
  // The gradient of every rank's output reaches every rank's input: the backward sums them.
  if (op == ReduceOp::Sum || op == ReduceOp::Avg)
    detail::attach_custom_grad(out, "all_reduce", {input}, [op, gp = g.shared_from_this()](const Tensor& gr, bool) {
      return std::vector<Tensor>{functional::all_reduce(gr, op, ProcessGroup(gp))};
    });
  return out;
}

Tensor gather_impl(const Tensor& input, Group& g, bool async) {
  Shape shape = input.shape();
  if (shape.empty()) shape = {SymInt(1)};
  shape[0] = shape[0] * SymInt(g.size());
  Tensor out = record_collective(attrs_of(CollKind::AllGather, g, ReduceOp::Sum, 0, async), input, shape);
  detail::attach_custom_grad(out, "all_gather", {input}, [gp = g.shared_from_this(), s = input.shape()](const Tensor& gr, bool) {
    return std::vector<Tensor>{functional::reduce_scatter(gr, ReduceOp::Sum, 0, ProcessGroup(gp)).reshape_symint(s)};
  });
  return out;
}

Tensor scatter_impl(const Tensor& input, ReduceOp op, Group& g, bool async) {
  check_op(op, input.dtype(), "reduce_scatter");
  KILN_CHECK(input.dim() >= 1 && input.size(0) % g.size() == 0, "reduce_scatter: dim 0 of the input (",
             input.dim() ? input.size(0) : 0, ") must be divisible by the group size ", g.size());
  Shape shape = input.shape();
  shape[0] = SymInt(input.size(0) / g.size());
  Tensor out = record_collective(attrs_of(CollKind::ReduceScatter, g, op, 0, async), input, shape);
  if (op == ReduceOp::Sum || op == ReduceOp::Avg)
    detail::attach_custom_grad(out, "reduce_scatter", {input}, [op, gp = g.shared_from_this()](const Tensor& gr, bool) {
      Tensor full = functional::all_gather(gr, 0, ProcessGroup(gp));
      return std::vector<Tensor>{op == ReduceOp::Avg ? full / static_cast<double>(gp->size()) : full};
    });
  return out;
}

Tensor broadcast_impl(const Tensor& input, int src, Group& g, bool async) {
  check_root(src, g, "broadcast");
  Tensor out = record_collective(attrs_of(CollKind::Broadcast, g, ReduceOp::Sum, src, async), input, input.shape());
  detail::attach_custom_grad(out, "broadcast", {input}, [src, gp = g.shared_from_this()](const Tensor& gr, bool) {
    Tensor sum = functional::all_reduce(gr, ReduceOp::Sum, ProcessGroup(gp));
    return std::vector<Tensor>{gp->rank() == src ? sum : zeros_like(sum)};
  });
  return out;
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* what) {
  KILN_CHECK(a.dtype() == b.dtype(), what, ": output dtype ", dtype_name(a.dtype()), " differs from the input's ",
             dtype_name(b.dtype()));
  KILN_CHECK(a.device() == b.device(), what, ": output is on ", a.device().str(), ", the input on ", b.device().str());
}

}  // namespace

namespace functional {
Tensor all_reduce(const Tensor& input, ReduceOp op, const ProcessGroup& group) {
  return all_reduce_impl(input, op, member_group(group, "all_reduce"), false);
}
Tensor all_gather(const Tensor& input, int64_t dim, const ProcessGroup& group) {
  Group& g = member_group(group, "all_gather");
  const int64_t d = detail::wrap_dim(dim, std::max<int64_t>(input.dim(), 1), "all_gather");
  if (d == 0) return gather_impl(input.dim() == 0 ? input.reshape({1}) : input, g, false);
  // Gather along dim 0 of the input moved to the front, then move it back.
  Tensor moved = input.movedim(d, 0);
  return gather_impl(moved, g, false).movedim(0, d);
}
Tensor reduce_scatter(const Tensor& input, ReduceOp op, int64_t dim, const ProcessGroup& group) {
  Group& g = member_group(group, "reduce_scatter");
  const int64_t d = detail::wrap_dim(dim, input.dim(), "reduce_scatter");
  if (d == 0) return scatter_impl(input, op, g, false);
  return scatter_impl(input.movedim(d, 0), op, g, false).movedim(0, d);
}
Tensor broadcast(const Tensor& input, int src, const ProcessGroup& group) {
  return broadcast_impl(input, src, member_group(group, "broadcast"), false);
}
Tensor all_to_all(const Tensor& input, std::vector<int64_t> output_splits, std::vector<int64_t> input_splits,
                  const ProcessGroup& group) {
  return all_to_all_impl(input, std::move(output_splits), std::move(input_splits), member_group(group, "all_to_all"),
                         false);
}
}  // namespace functional

Work all_reduce(Tensor& tensor, ReduceOp op, const ProcessGroup& group, bool async_op) {
  Tensor r = all_reduce_impl(tensor, op, member_group(group, "all_reduce"), async_op);
  return complete(r, [&tensor, r] { tensor.assign_(r); }, async_op);
}

Work broadcast(Tensor& tensor, int src, const ProcessGroup& group, bool async_op) {
  Tensor r = broadcast_impl(tensor, src, member_group(group, "broadcast"), async_op);
  return complete(r, [&tensor, r] { tensor.assign_(r); }, async_op);
}

Work all_gather_into_tensor(Tensor& output, const Tensor& input, const ProcessGroup& group, bool async_op) {
  Group& g = member_group(group, "all_gather_into_tensor");
  check_same_dtype(output, input, "all_gather_into_tensor");
  KILN_CHECK(output.numel() == input.numel() * g.size(), "all_gather_into_tensor: output has ", output.numel(),
             " elements, expected ", g.size(), " x ", input.numel());
  Tensor r = gather_impl(input.reshape({-1}), g, async_op);
  return complete(r, [&output, r] { output.assign_(r.reshape(output.sizes())); }, async_op);
}

Work all_gather(std::vector<Tensor>& outputs, const Tensor& input, const ProcessGroup& group, bool async_op) {
  Group& g = member_group(group, "all_gather");
  Tensor r = gather_impl(input.reshape({-1}), g, async_op);
  return complete(
      r,
      [&outputs, r, n = g.size(), shape = input.sizes()] {
        auto parts = r.chunk(n, 0);
        outputs.resize(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) outputs[static_cast<size_t>(i)] = parts[static_cast<size_t>(i)].reshape(shape);
      },
      async_op);
}

Work reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op, const ProcessGroup& group, bool async_op) {
  Group& g = member_group(group, "reduce_scatter_tensor");
  check_same_dtype(output, input, "reduce_scatter_tensor");
  KILN_CHECK(output.numel() * g.size() == input.numel(), "reduce_scatter_tensor: input has ", input.numel(),
             " elements, expected ", g.size(), " x the output's ", output.numel());
  Tensor r = scatter_impl(input.reshape({g.size(), -1}), op, g, async_op);
  return complete(r, [&output, r] { output.assign_(r.reshape(output.sizes())); }, async_op);
}

Work all_to_all_single(Tensor& output, const Tensor& input, std::vector<int64_t> output_splits,
                       std::vector<int64_t> input_splits, const ProcessGroup& group, bool async_op) {
  Group& g = member_group(group, "all_to_all_single");
  check_same_dtype(output, input, "all_to_all_single");
  Tensor r = all_to_all_impl(input, std::move(output_splits), std::move(input_splits), g, async_op);
  KILN_CHECK(r.sizes() == output.sizes(), "all_to_all_single: output has shape ", detail::str(output.shape()),
             ", the exchange gives ", detail::str(r.shape()));
  return complete(r, [&output, r] { output.assign_(r); }, async_op);
}

Work send(const Tensor& tensor, int dst, const ProcessGroup& group) {
  Group& g = member_group(group, "send");
  check_root(dst, g, "send");
  KILN_CHECK(dst != g.rank(), "send: a rank cannot send to itself (rank ", dst, ")");
  Tensor x = tensor.contiguous();
  x.eval();
  const Node& n = *x.node();
  const void* p = static_cast<const char*>(n.storage->data) + n.offset.as_int() * static_cast<int64_t>(itemsize(n.dtype));
  CompletionPtr c = g.run("send", x.device(), [&](Backend& b) {
    return b.send(p, static_cast<size_t>(x.numel()), x.dtype(), dst);
  });
  auto s = std::make_shared<Work::State>();
  s->done = c;
  s->keep = {n.storage};
  return Work(s);
}

Work recv(Tensor& tensor, int src, const ProcessGroup& group) {
  Group& g = member_group(group, "recv");
  check_root(src, g, "recv");
  KILN_CHECK(src != g.rank(), "recv: a rank cannot receive from itself (rank ", src, ")");
  auto storage =
      Storage::allocate(static_cast<size_t>(tensor.numel()) * itemsize(tensor.dtype()), tensor.device(), "recv");
  CompletionPtr c = g.run("recv", tensor.device(), [&](Backend& b) {
    return b.recv(storage->data, static_cast<size_t>(tensor.numel()), tensor.dtype(), src);
  });
  Tensor r = detail::leaf(storage, tensor.shape(), tensor.dtype(), tensor.device());
  auto s = std::make_shared<Work::State>();
  s->done = c;
  s->keep = {storage};
  s->finish = [&tensor, r] { tensor.assign_(r); };
  Work w(s);
  w.wait();
  return w;
}

void barrier(const ProcessGroup& group) {
  Group& g = member_group(group, "barrier");
  g.settle_checks();  // (a disagreement found on another thread surfaces here at the latest)
  g.run("barrier", g.libraries().find("gloo") != std::string::npos ? cpu() : cuda(local_rank()),
        [](Backend& b) -> CompletionPtr {
          b.barrier();
          return nullptr;
        });
}

}  // namespace kiln::dist
