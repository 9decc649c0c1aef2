// The reference interpreter: runs a segment node by node with the kernels in kernels/.
// Slow, simple and always right; the oracle for every JIT path.
#include <unordered_map>

#include "kernels/cpu/node_operand.h"
#include "kernels/cpu/reference.h"
#include "runtime/core/error.h"
#include "runtime/exec/collective_hook.h"
#include "runtime/exec/device_runtime.h"
#include "runtime/exec/executor.h"

namespace kiln {

namespace detail {
namespace {
CollectiveRunner g_collective_runner = nullptr;
}
void set_collective_runner(CollectiveRunner r) { g_collective_runner = r; }
void run_collective_node(Node& n) {
  KILN_CHECK(g_collective_runner, "collective: this build of kiln has no process groups (runtime/dist)");
  g_collective_runner(n);
}
}  // namespace detail

namespace {

kernels::Operand operand(const Node& n) { return kernels::operand_of(n); }

// A window of `out` (same dtype) for cat / view_scatter.
kernels::Operand window(const kernels::Operand& out, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                        int64_t offset) {
  kernels::Operand w = out;
  w.sizes = std::move(sizes);
  w.strides = std::move(strides);
  w.data = out.data + offset * static_cast<int64_t>(itemsize(out.dtype));
  return w;
}

// A cross-device copy: the input is dense (recorded after contiguous()).
void copy_to_device(Node& n) {
  const Node& in = *n.inputs[0];
  const size_t nbytes = static_cast<size_t>(kiln::numel(n.shape).as_int()) * itemsize(n.dtype);
  auto storage = Storage::allocate(nbytes, n.device, "copy between devices");
  const char* src =
      static_cast<const char*>(in.storage->data) + in.offset.as_int() * static_cast<int64_t>(itemsize(in.dtype));
  if (nbytes)
    device_runtime(n.device.type != DeviceType::CPU ? n.device : in.device)
        .copy(storage->data, n.device, src, in.device, nbytes);
  n.set_storage(std::move(storage), false);
}

void compute(Node& n) {
  using namespace kernels;
  if (is_view_op(n.op)) {
    n.set_storage(n.inputs[0]->storage, false);
    return;
  }
  if (n.op == OpKind::Collective) {  // on every device: the process group's backend runs it
    detail::run_collective_node(n);
    return;
  }
  KILN_CHECK(n.op != OpKind::Leaf, "interpreter: leaf node without storage");
  if (n.op == OpKind::ToDevice) {
    copy_to_device(n);
    return;
  }
  if (n.device.type != DeviceType::CPU) {  // the device's own kernels
    device_runtime(n.device).run_node(n);
    return;
  }
  const int64_t numel = kiln::numel(n.shape).as_int();
  auto storage = Storage::allocate(static_cast<size_t>(numel) * itemsize(n.dtype), n.device, op_name(n.op));
  Operand out;
  out.dtype = n.dtype;
  out.sizes = concrete(n.shape);
  out.strides = concrete(n.strides);
  out.data = static_cast<char*>(storage->data);
  auto in = [&](size_t i) { return operand(*n.inputs[i]); };
  const auto& a = n.attrs;
  switch (n.op) {
    case OpKind::Full: fill(out, a.f0, a.ints); break;
    case OpKind::Arange: arange(out, a); break;
    case OpKind::RandUniform:
    case OpKind::RandNormal:
    case OpKind::RandInt: random(n.op, out, a); break;
    case OpKind::Where: where(out, in(0), in(1), in(2)); break;
    case OpKind::Sum:
    case OpKind::Prod:
    case OpKind::Amax:
    case OpKind::Amin:
    case OpKind::ArgMax:
    case OpKind::ArgMin: reduce(n.op, out, in(0), a.ints); break;
    case OpKind::Cumsum: cumsum(out, in(0), a.ints[0]); break;
    case OpKind::Contiguous: unary(OpKind::Contiguous, out, in(0)); break;
    case OpKind::Cat: {
      int64_t d = a.ints[0], at = 0;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        Operand src = in(i);
        std::vector<int64_t> sz = out.sizes;
        sz[d] = src.sizes[d];
        unary(OpKind::Contiguous, window(out, sz, out.strides, at * out.strides[d]), src);
        at += sz[d];
      }
      break;
    }
    case OpKind::ViewScatter:
      unary(OpKind::Contiguous, out, in(0));
      unary(OpKind::Contiguous, window(out, concrete(a.sizes), concrete(a.strides), a.offset.as_int()), in(1));
      break;
    case OpKind::Gather: gather(out, in(0), in(1), a.ints[0]); break;
    case OpKind::Scatter:
    case OpKind::ScatterAdd:
      unary(OpKind::Contiguous, out, in(0));
      scatter(n.op, out, in(1), in(2), a.ints[0]);
      break;
    case OpKind::IndexSelect: index_select(out, in(0), in(1), a.ints[0]); break;
    case OpKind::IndexAdd:
      unary(OpKind::Contiguous, out, in(0));
      index_add(out, in(1), in(2), a.ints[0]);
      break;
    case OpKind::Matmul: matmul(out, in(0), in(1)); break;
    case OpKind::Im2Col: im2col(out, in(0), a.ints); break;
    case OpKind::Attention:
    case OpKind::AttentionBackward: {
      // q, k, v (backward: then the packed forward output and its gradient), then the mask and
      // the dropout generator words where present.
      const size_t mi = attention_mask_input(n), ri = attention_dropout_input(n);
      const bool has_mask = mi != 0;
      const Operand mask = has_mask ? in(mi) : Operand(), rng = ri ? in(ri) : Operand();
      const AttentionDropout drop{ri ? &rng : nullptr, attention_dropout(a)};
      if (n.op == OpKind::Attention)
        attention(out, in(0), in(1), in(2), has_mask ? &mask : nullptr, attention_causal(a), attention_scale(a), drop);
      else
        attention_backward(out, in(0), in(1), in(2), in(3), in(4), has_mask ? &mask : nullptr, attention_causal(a),
                           attention_scale(a), drop);
      break;
    }
    case OpKind::Col2Im: col2im(out, in(0), a.ints); break;
    default:
      if (n.inputs.size() == 1)
        unary(n.op, out, in(0));
      else if (n.inputs.size() == 2)
        binary(n.op, out, in(0), in(1));
      else
        throw Error(detail::cat("interpreter: no kernel for ", op_name(n.op)));
  }
  n.set_storage(std::move(storage), false);
}

class Interpreter final : public Executor {
 public:
  void run(Segment& seg) override {
    // Release an intermediate's storage once its last consumer in the segment has run.
    std::unordered_map<Node*, int> uses;
    std::unordered_map<Node*, bool> needed;
    for (size_t i = 0; i < seg.nodes.size(); ++i) {
      needed[seg.nodes[i]] = seg.needed[i];
      for (auto& in : seg.nodes[i]->inputs) uses[in.get()]++;
    }
    for (Node* n : seg.nodes) {
      compute(*n);
      for (auto& in : n->inputs) {
        Node* i = in.get();
        auto it = needed.find(i);
        if (--uses[i] == 0 && it != needed.end() && !it->second) i->storage.reset();
      }
    }
  }
  const char* name() const override { return "interp"; }
};

}  // namespace

void interpret_node(Node& n) {
  if (!n.materialized()) compute(n);
}

std::shared_ptr<Executor> interpreter() {
  static auto ex = std::make_shared<Interpreter>();
  return ex;
}

}  // namespace kiln
