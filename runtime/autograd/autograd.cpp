// The autograd engine: backward nodes, the grad-mode switch, and the backward pass.
#include "runtime/autograd/autograd.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <optional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "runtime/autograd/autograd_rules.h"
#include "runtime/autograd/gradient_sum.h"
#include "runtime/exec/memory_ledger.h"
#include "runtime/ops/autocast_policy.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor/record.h"
#include "runtime/tensor/placed_hooks.h"
#include "runtime/tensor/trace.h"

namespace kiln {
namespace {
thread_local const char* t_backward_op = nullptr;
thread_local bool g_grad_enabled __attribute__((tls_model("initial-exec"))) = true;

// Accumulates into a leaf's .grad().
struct AccumulateGrad final : GradNode {
  std::weak_ptr<TensorImpl> leaf;
  std::vector<std::pair<int64_t, std::function<void(const Tensor&)>>> hooks;  // post-accumulate
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& l) : leaf(l) {}
  std::vector<Tensor> apply(const Tensor& g, bool create_graph) override {
    auto impl = leaf.lock();
    if (!impl) return {};
    if (auto* o = detail::trace_observer()) o->on_grad(*impl, true);
    Tensor gd = create_graph ? g : g.detach();
    const Tensor param(impl);
    gd = detail::cast(gd, param.node()->dtype);
    if (param.node()->placed) gd = detail::placed_hooks_checked().as_placed_like(gd, param);
    if (impl->grad) {
      Tensor old(impl->grad);
      gd = add(old, gd);
    }
    impl->grad = Tensor(gd).impl();
    detail::mark_memory_role(gd, MemoryRole::Gradient);
    // A fresh handle so later in-place on the returned grad does not alias the leaf's.
    if (!create_graph) impl->grad->requires_grad = false;
    for (auto hook : hooks) hook.second(param);  // (a copy: a hook may remove itself)
    return {};
  }
  const char* name() const override { return "AccumulateGrad"; }
};

// What a vjp rule that reads no values needs of a tensor: its shape, dtype and device.
struct TensorMeta {
  Shape shape;
  DType dtype = kFloat32;
  Device device;
  Shape strides;  // (a rule may read the layout: matmul's transposed right operand)
};
TensorMeta meta_of(const Tensor& t) { return TensorMeta{t.shape(), t.dtype(), t.device(), t.node()->strides}; }

// A stand-in of that shape, dtype, device and layout for such a rule (detail::stand_in).
Tensor stand_in(const TensorMeta& m) { return detail::stand_in(m.shape, m.dtype, m.device, &m.strides); }

// The backward node of one recorded primitive.
struct OpGradNode final : GradNode, std::enable_shared_from_this<OpGradNode> {
  OpKind op;
  Attrs attrs;
  Shape view_shape;
  std::vector<Tensor> inputs;  // snapshots (undefined where `metas` stands in)
  std::vector<std::optional<TensorMeta>> metas;  // per input, where the rule does not read it (empty: none)
  NodePtr out;  // (null where the rule does not read it: out_meta stands in)
  std::optional<TensorMeta> out_meta;
  std::vector<TensorImpl::Tangent> out_tangents;  // the output's, for forward-over-reverse
  bool released_ = false;

  std::vector<Tensor> apply(const Tensor& g, bool create_graph) override {
    KILN_CHECK(!released_, "backward: trying to backward through the graph a second time (", op_name(op),
               "); pass retain_graph=true to the first backward");
    auto impl = TensorImpl::make();
    impl->node_ = out ? out : stand_in(*out_meta).node();
    impl->requires_grad = true;
    impl->grad_fn = shared_from_this();
    impl->tangents = out_tangents;
    Tensor o(impl);
    if (metas.empty()) return detail::vjp(op, attrs, inputs, o, g, view_shape);
    std::vector<Tensor> in = inputs;
    for (size_t i = 0; i < in.size(); ++i)
      if (metas[i]) in[i] = stand_in(*metas[i]);
    std::vector<Tensor> grads = detail::vjp(op, attrs, in, o, g, view_shape);
    for (size_t i = 0; i < grads.size(); ++i)  // (gradients no input wants were built from stand-ins)
      if (i >= next.size() || !next[i].fn) grads[i] = Tensor();
    if (detail::check_stand_ins()) {
      std::vector<Tensor> marks;
      for (size_t i = 0; i < in.size(); ++i)
        if (metas[i]) marks.push_back(in[i]);
      if (!out) marks.push_back(o);
      KILN_CHECK(!detail::reads_any(grads, marks, g), "backward of ", op_name(op),
                 ": its rule read a value the node did not keep (a shape-only backward node); a kiln bug, please report it");
    }
    return grads;
  }
  void release() override {
    // The output node too: a handle to it would make the lazy executor store every forward
    // intermediate that the pending backward could otherwise recompute or fuse.
    inputs.clear();
    metas.clear();
    out.reset();
    out_tangents.clear();
    released_ = true;
  }
  bool released() const override { return released_; }
  const char* name() const override { return op_name(op); }
};
// The backward node of a composite with its own gradient (detail::attach_custom_grad).
struct CustomGradNode final : GradNode, std::enable_shared_from_this<CustomGradNode> {
  const char* label = "custom";
  detail::CustomVjp vjp;
  detail::CustomVjpOfOutput vjp_of_output;  // (instead of vjp: a rule reading the output)
  NodePtr out;  // the output's value, for vjp_of_output
  std::vector<TensorImpl::Tangent> out_tangents;  // the output's, for forward-over-reverse
  bool released_ = false;

  std::vector<Tensor> apply(const Tensor& g, bool create_graph) override {
    KILN_CHECK(!released_, "backward: trying to backward through the graph a second time (", label,
               "); pass retain_graph=true to the first backward");
    if (!vjp_of_output) return vjp(g, create_graph);
    auto impl = TensorImpl::make();  // the output as this node's result (no cycle: made per call)
    impl->node_ = out;
    impl->requires_grad = true;
    impl->grad_fn = shared_from_this();
    impl->tangents = out_tangents;
    return vjp_of_output(g, Tensor(impl), create_graph);
  }
  void release() override {
    vjp = nullptr;
    vjp_of_output = nullptr;
    out.reset();
    out_tangents.clear();
    released_ = true;
  }
  bool released() const override { return released_; }
  const char* name() const override { return label; }
};
}  // namespace

bool grad_enabled() { return g_grad_enabled; }
void set_grad_enabled(bool enabled) { g_grad_enabled = enabled; }

namespace detail {
const char* backward_op() { return t_backward_op; }

Edge grad_edge(const Tensor& t) {
  if (!t.defined()) return {};
  auto& impl = t.impl();
  if (impl->grad_fn) return {impl->grad_fn};
  if (!impl->requires_grad) return {};
  // Threads may share a leaf (a module's parameters): its accumulator is made once, locked.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!impl->accumulator) impl->accumulator = std::make_shared<AccumulateGrad>(impl);
  return {impl->accumulator};
}

Tensor snapshot(const Tensor& t) {
  auto impl = TensorImpl::make();
  impl->node_ = t.node();
  impl->requires_grad = t.requires_grad();
  impl->grad_fn = t.impl()->grad_fn;
  impl->tangents = t.impl()->tangents;  // (forward-over-reverse: saved inputs keep their tangents)
  if (impl->requires_grad && !impl->grad_fn) {
    grad_edge(t);  // make sure the leaf has its accumulator
    impl->accumulator = t.impl()->accumulator;
  }
  return Tensor(impl);
}

void copy_autograd(TensorImpl& dst, const Tensor& src) {
  dst.requires_grad = src.requires_grad();
  dst.grad_fn = src.impl()->grad_fn;
  dst.accumulator = src.impl()->grad_fn ? nullptr : src.impl()->accumulator;
}

void attach_grad(Tensor& out, OpKind op, const Attrs& attrs, const std::vector<Tensor>& inputs,
                 const Shape& view_shape) {
  if (!g_grad_enabled || !is_differentiable(op) || !is_floating(out.dtype())) return;
  bool any = false;
  for (const auto& t : inputs) any = any || t.requires_grad();
  if (!any) return;
  auto node = std::make_shared<OpGradNode>();
  node->op = op;
  node->attrs = attrs;
  node->view_shape = view_shape;
  node->out_tangents = out.impl()->tangents;
  // Only the values the rule reads are kept, shapes for the rest (DTensors excepted: a stand-in
  // would lose their placements).
  bool placed = out.node()->placed != nullptr;
  for (const auto& t : inputs) placed = placed || t.node()->placed;
  std::vector<bool> needs;
  for (const auto& t : inputs) needs.push_back(t.requires_grad() && is_floating(t.dtype()));
  std::vector<bool> reads = placed ? std::vector<bool>(inputs.size() + 1, true)
                                   : detail::vjp_reads(op, attrs, inputs, out, view_shape, needs);
  const bool all = std::all_of(reads.begin(), reads.end(), [](bool r) { return r; });
  if (reads.back()) {
    node->out = out.node();
    mark_memory_role(out, MemoryRole::Saved);
  } else {
    node->out_meta = meta_of(out);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (reads[i]) {
      node->inputs.push_back(snapshot(t));
      mark_memory_role(t, MemoryRole::Saved);
    } else {
      node->inputs.emplace_back();
    }
    if (!all) node->metas.push_back(reads[i] ? std::nullopt : std::optional<TensorMeta>(meta_of(t)));
    node->next.push_back(needs[i] ? grad_edge(t) : Edge{});
  }
  out.impl()->requires_grad = true;
  out.impl()->grad_fn = std::move(node);
}

namespace {
// A custom node for `out` over `inputs`, or null where no gradient is wanted.
std::shared_ptr<CustomGradNode> custom_node(const Tensor& out, const char* name, const std::vector<Tensor>& inputs) {
  if (!g_grad_enabled || !is_floating(out.dtype())) return nullptr;
  bool any = false;
  for (const auto& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return nullptr;
  auto node = std::make_shared<CustomGradNode>();
  node->label = name;
  for (const auto& t : inputs)
    node->next.push_back(t.defined() && t.requires_grad() && is_floating(t.dtype()) ? grad_edge(t) : Edge{});
  return node;
}
}  // namespace

void attach_custom_grad(Tensor& out, const char* name, const std::vector<Tensor>& inputs, CustomVjp vjp) {
  std::shared_ptr<CustomGradNode> node = custom_node(out, name, inputs);
  if (!node) return;
  node->vjp = std::move(vjp);
  out.impl()->requires_grad = true;
  out.impl()->grad_fn = std::move(node);
}

void attach_custom_grad(Tensor& out, const char* name, const std::vector<Tensor>& inputs, CustomVjpOfOutput vjp) {
  std::shared_ptr<CustomGradNode> node = custom_node(out, name, inputs);
  if (!node) return;
  node->vjp_of_output = std::move(vjp);
  node->out = out.node();
  mark_memory_role(out, MemoryRole::Saved);
  node->out_tangents = out.impl()->tangents;
  out.impl()->requires_grad = true;
  out.impl()->grad_fn = std::move(node);
}

void mark_memory_role(const Tensor& t, MemoryRole role) {
  if (t.defined() && memory_ledger_on()) memory_ledger_mark(*t.node(), role);
}

Tensor with_custom_grad(const char* name, const std::vector<Tensor>& inputs, const std::function<Tensor()>& value,
                        CustomVjp vjp) {
  bool any = false;
  for (const auto& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!g_grad_enabled || !any) return value();
  Tensor out;
  {
    NoGradGuard no_grad;
    out = value();
  }
  attach_custom_grad(out, name, inputs, std::move(vjp));
  return out;
}

}  // namespace detail

namespace {

thread_local int t_backward_depth = 0;
thread_local std::vector<std::function<void()>> t_backward_callbacks;

}  // namespace

int64_t register_post_accumulate_grad_hook(const Tensor& param, std::function<void(const Tensor&)> hook) {
  KILN_CHECK(param.defined() && param.is_leaf() && param.requires_grad(),
             "register_post_accumulate_grad_hook: expected a leaf tensor that requires grad");
  static std::atomic<int64_t> next{1};
  detail::grad_edge(param);  // make sure the leaf has its accumulator
  auto* acc = dynamic_cast<AccumulateGrad*>(param.impl()->accumulator.get());
  KILN_CHECK(acc, "register_post_accumulate_grad_hook: the tensor has no gradient accumulator");
  const int64_t id = next++;
  acc->hooks.emplace_back(id, std::move(hook));
  return id;
}

void remove_post_accumulate_grad_hook(const Tensor& param, int64_t id) {
  auto* acc = param.defined() ? dynamic_cast<AccumulateGrad*>(param.impl()->accumulator.get()) : nullptr;
  if (!acc) return;
  std::erase_if(acc->hooks, [id](const auto& h) { return h.first == id; });
}

void queue_backward_callback(std::function<void()> fn) {
  KILN_CHECK(t_backward_depth > 0, "queue_backward_callback: no backward is running on this thread");
  t_backward_callbacks.push_back(std::move(fn));
}

namespace {

// Runs the backward pass from (edge, gradient) roots. With `capture`, gradients reaching the
// captured nodes are stored there and leaves are not accumulated into.
void run_backward(const std::vector<std::pair<Edge, Tensor>>& roots, bool retain_graph, bool create_graph,
                  std::unordered_map<GradNode*, Tensor>* capture) {
  // The callbacks queued during the outermost backward run when it has finished.
  struct Depth {
    Depth() { ++t_backward_depth; }
    ~Depth() {
      if (--t_backward_depth == 0 && std::uncaught_exceptions()) t_backward_callbacks.clear();
    }
  } depth;
  struct RunCallbacks {
    ~RunCallbacks() noexcept(false) {
      if (t_backward_depth != 1 || std::uncaught_exceptions()) return;
      while (!t_backward_callbacks.empty()) {
        auto cbs = std::exchange(t_backward_callbacks, {});
        for (auto& cb : cbs) cb();
      }
    }
  } run_callbacks;
  std::optional<NoGradGuard> no_grad;
  std::optional<EnableGradGuard> with_grad;
  if (create_graph)
    with_grad.emplace();
  else
    no_grad.emplace();

  // Dependencies: how many edges point at each node.
  std::unordered_map<GradNode*, int> deps;
  std::unordered_map<GradNode*, std::shared_ptr<GradNode>> owner;
  std::vector<GradNode*> stack;
  for (const auto& [e, g] : roots)
    if (e.fn && !owner.count(e.fn.get())) {
      owner[e.fn.get()] = e.fn;
      stack.push_back(e.fn.get());
    }
  while (!stack.empty()) {
    GradNode* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next) {
      if (!e.fn) continue;
      deps[e.fn.get()]++;
      if (!owner.count(e.fn.get())) {
        owner[e.fn.get()] = e.fn;
        stack.push_back(e.fn.get());
      }
    }
  }
  std::unordered_map<GradNode*, Tensor> buffer;
  auto accumulate = [&](GradNode* n, const Tensor& g) {
    auto it = buffer.find(n);
    if (it == buffer.end() || !it->second.defined())
      buffer[n] = g;
    else  // (a split's pieces: one cat; gradients with their own history: added)
      it->second = create_graph ? add(it->second, g) : detail::sum_gradients(it->second, g);
  };
  for (const auto& [e, g] : roots)
    if (e.fn) accumulate(e.fn.get(), g);
  std::vector<GradNode*> ready;
  for (auto& [n, _] : owner)
    if (!deps.count(n)) ready.push_back(n);
  while (!ready.empty()) {
    GradNode* n = ready.back();
    ready.pop_back();
    Tensor g = buffer[n];
    buffer.erase(n);
    std::vector<Tensor> grads;
    bool is_leaf_acc = dynamic_cast<AccumulateGrad*>(n) != nullptr;
    if (capture && capture->count(n)) (*capture)[n] = g;
    if (g.defined() && !(capture && is_leaf_acc)) {
      struct Naming {
        explicit Naming(const char* op) { t_backward_op = op; }
        ~Naming() { t_backward_op = nullptr; }
      } naming(n->name());
      grads = n->apply(g, create_graph);
    }
    for (size_t i = 0; i < n->next.size(); ++i) {
      GradNode* nx = n->next[i].fn.get();
      if (!nx) continue;
      if (i < grads.size() && grads[i].defined())
        accumulate(nx, grads[i]);
      else
        buffer.try_emplace(nx);  // keep an (undefined) slot so the node still runs
      if (--deps[nx] == 0) ready.push_back(nx);
    }
  }
  if (!retain_graph)
    for (auto& [n, _] : owner) n->release();
}

Tensor default_grad(const Tensor& out, const Tensor* given) {
  if (given && given->defined()) {
    KILN_CHECK(same_shape(given->shape(), out.shape()), "backward: gradient has shape ", detail::str(given->shape()),
               ", expected the output's shape ", detail::str(out.shape()));
    return *given;
  }
  KILN_CHECK(out.numel() == 1, "backward: grad can be implicitly created only for outputs with one element, got ",
             "shape ", detail::str(out.shape()));
  return ones_like(out);
}

std::vector<std::pair<Edge, Tensor>> make_roots(const std::vector<Tensor>& outputs, const std::vector<Tensor>& gouts) {
  KILN_CHECK(gouts.empty() || gouts.size() == outputs.size(), "backward: got ", gouts.size(), " gradients for ",
             outputs.size(), " outputs");
  std::vector<std::pair<Edge, Tensor>> roots;
  for (size_t i = 0; i < outputs.size(); ++i) {
    KILN_CHECK(outputs[i].requires_grad(), "backward: output ", i,
               " does not require grad and has no grad_fn (did every input have requires_grad=false?)");
    Edge e = detail::grad_edge(outputs[i]);
    roots.push_back({e, default_grad(outputs[i], gouts.empty() ? nullptr : &gouts[i])});
  }
  return roots;
}
}  // namespace

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs, bool retain_graph,
              bool create_graph) {
  detail::AutocastOff autocast_off;  // backward ops take their forward ops' dtypes
  run_backward(make_roots(outputs, grad_outputs), retain_graph || create_graph, create_graph, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph, bool create_graph,
                         bool allow_unused) {
  detail::AutocastOff autocast_off;  // backward ops take their forward ops' dtypes
  auto roots = make_roots(outputs, grad_outputs);
  std::unordered_map<GradNode*, Tensor> capture;
  std::vector<GradNode*> keys;
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_CHECK(inputs[i].requires_grad(), "grad: input ", i, " does not require grad");
    Edge e = detail::grad_edge(inputs[i]);
    keys.push_back(e.fn.get());
    capture[e.fn.get()] = Tensor();
  }
  run_backward(roots, retain_graph || create_graph, create_graph, &capture);
  std::vector<Tensor> out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor g = capture[keys[i]];
    KILN_CHECK(g.defined() || allow_unused, "grad: input ", i,
               " was not used in the graph of the outputs (pass allow_unused=true)");
    out.push_back(g);
  }
  return out;
}

// ---- Tensor methods ----
Tensor& Tensor::requires_grad_(bool r) {
  KILN_CHECK(defined(), "requires_grad_: undefined tensor");
  KILN_CHECK(!r || is_floating(dtype()), "requires_grad_: only floating point tensors can require gradients, got ",
             dtype_name(dtype()));
  KILN_CHECK(is_leaf() || r, "requires_grad_: you can only change requires_grad flags of leaf tensors");
  impl_->requires_grad = r;
  return *this;
}

Tensor Tensor::grad() const {
  KILN_CHECK(defined(), "grad: undefined tensor");
  return impl_->grad ? Tensor(impl_->grad) : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  KILN_CHECK(defined(), "set_grad: undefined tensor");
  if (g.defined())
    KILN_CHECK(g.sizes() == sizes(), "set_grad: gradient shape ", detail::str(g.shape()), " does not match ",
               detail::str(shape()));
  if (auto* o = detail::trace_observer()) o->on_grad(*impl_, false);
  impl_->grad = g.defined() ? g.impl() : nullptr;
}

void Tensor::backward(const std::optional<Tensor>& gradient, bool retain_graph, bool create_graph) const {
  kiln::backward({*this}, gradient ? std::vector<Tensor>{*gradient} : std::vector<Tensor>{}, retain_graph,
                 create_graph);
}

Tensor Tensor::detach() const { return Tensor::from_node(node()); }

Tensor& Tensor::set_data(const Tensor& value) {
  KILN_CHECK(defined() && value.defined(), "set_data: got an undefined tensor");
  KILN_CHECK(!impl_->base, "set_data: cannot rebind a view");
  memory_ledger_inherit(*impl_->node_, *value.node());
  impl_->node_ = value.node();
  impl_->version++;
  if (impl_->grad && impl_->grad->node()->device != impl_->node_->device) impl_->grad.reset();
  return *this;
}

}  // namespace kiln
