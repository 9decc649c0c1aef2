#include <atomic>
#include <cstdlib>
#include <cstring>

#include "runtime/exec/buffer_pool.h"
#include "runtime/core/error.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/node.h"

#include "runtime/core/pool_allocator.h"
#include "runtime/exec/device_runtime.h"
#include "runtime/exec/memory_ledger.h"

namespace kiln {

const char* op_name(OpKind op) {
  static const char* names[] = {"leaf",        "full",
                                "arange",      "rand_uniform",
                                "rand_normal", "randint",
                                "neg",         "abs",
                                "exp",         "exp2",
                                "expm1",       "log",
                                "log2",        "log1p",
                                "sqrt",        "rsqrt",
                                "reciprocal",  "sin",
                                "cos",         "tan",
                                "atan",        "tanh",
                                "sigmoid",     "relu",
                                "erf",         "floor",
                                "ceil",        "round",
                                "sign",        "isnan",
                                "isfinite",    "logical_not",
                                "bitwise_not", "cast",
                                "add",         "sub",
                                "mul",         "div",
                                "pow",         "maximum",
                                "minimum",     "atan2",
                                "remainder",   "fmod",
                                "eq",          "ne",
                                "lt",          "le",
                                "gt",          "ge",
                                "logical_and", "logical_or",
                                "logical_xor", "bitwise_and",
                                "bitwise_or",  "bitwise_xor",
                                "where",       "sum",
                                "prod",        "amax",
                                "amin",        "argmax",
                                "argmin",      "cumsum",
                                "view",        "permute",
                                "expand",      "slice",
                                "select",      "squeeze",
                                "unsqueeze",   "flip",
                                "as_strided",  "contiguous",
                                "cat",         "view_scatter",
                                "gather",      "scatter",
                                "scatter_add", "index_select",
                                "index_add",   "matmul",
                                "im2col",      "col2im",
                                "attention",   "attention_backward",
                                "to",          "collective"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<size_t>(OpKind::NumOps));
  return names[static_cast<size_t>(op)];
}

bool is_view_op(OpKind op) { return op >= OpKind::View && op <= OpKind::AsStrided; }

void bind_size_attrs(Node& n) {
  Attrs& a = n.attrs;
  if (a.sizes.empty()) return;
  if (n.op == OpKind::Full) {
    int64_t v = a.sizes[0].as_int();
    a.f0 = static_cast<double>(v);
    if (!a.ints.empty()) a.ints = {v};
  } else if (n.op == OpKind::Slice && a.sizes.size() == 2 && a.ints.size() == 4) {
    a.ints[1] = a.sizes[0].as_int();
    a.ints[2] = a.sizes[1].as_int();
  } else if (n.op == OpKind::Select && a.sizes.size() == 1 && a.ints.size() == 2) {
    a.ints[1] = a.sizes[0].as_int();
  }
}

Storage::~Storage() {
  if (in_ledger) memory_ledger_remove(*this);
  if (deleter) deleter(data);
}

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device, const char* made_by) {
  std::shared_ptr<Storage> s;
  if (device.type != DeviceType::CPU) {
    s = device_runtime(device).allocate(nbytes, device.index);
  } else {
    s = std::allocate_shared<Storage>(detail::PoolAllocator<Storage>());
    s->data = pool_allocate(nbytes);
    s->nbytes = nbytes;
    s->device = device;
    s->deleter = [nbytes](void* p) { pool_free(p, nbytes); };
  }
  s->made_by = made_by;
  if (memory_ledger_on()) memory_ledger_add(*s);
  return s;
}

NodePtr new_node() { return std::allocate_shared<Node>(detail::PoolAllocator<Node>()); }

NodePtr new_leaf(DType dtype, Device device, Shape shape, Shape strides, SymInt offset) {
  NodePtr n = new_node();
  n->op = OpKind::Leaf;
  n->dtype = dtype;
  n->device = device;
  n->strides = strides.empty() && !shape.empty() ? contiguous_strides(shape) : std::move(strides);
  n->shape = std::move(shape);
  n->offset = std::move(offset);
  return n;
}

Node::Node() : id(detail::node_made()) {}

Node::~Node() {
  if (pending) detail::pending_add(-1);
  // Release long input chains iteratively so deep graphs cannot overflow the stack.
  NodeList stack = std::move(inputs);
  while (!stack.empty()) {
    NodePtr n = std::move(stack.back());
    stack.pop_back();
    if (n && n.use_count() == 1) {
      for (auto& in : n->inputs) stack.push_back(std::move(in));
      n->inputs.clear();
    }
  }
}

void Node::set_storage(std::shared_ptr<Storage> s, bool drop_inputs) {
  if (pending) detail::pending_add(-1);
  pending = false;
  storage = std::move(s);
  if (role != MemoryRole::Other && storage && storage->in_ledger) memory_ledger_mark(*this, role);
  if (drop_inputs) {
    inputs.clear();
    set_ready();
  }
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  SymInt acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc = acc * shape[i];
  }
  return st;
}

bool is_contiguous_layout(const Shape& shape, const Shape& strides) {
  // Fast path: every size and stride known.
  bool constant = true;
  for (size_t i = 0; i < shape.size() && constant; ++i) constant = shape[i].is_constant() && strides[i].is_constant();
  if (constant) {
    int64_t expected = 1;
    bool dense = true;
    for (size_t i = shape.size(); i-- > 0;) {
      int64_t n = shape[i].as_int();
      if (n == 0) return true;
      if (n == 1) continue;
      dense = dense && strides[i].as_int() == expected;
      expected *= n;
    }
    return dense;
  }
  // Strides that are the row-major ones by construction: contiguous, asking nothing about the
  // sizes (which could pin a symbol the trace saw as 0 or 1).
  {
    SymInt expected = 1;
    bool dense = true;
    for (size_t i = shape.size(); i-- > 0 && dense;) {
      dense = strides[i].same_as(expected);
      expected = expected * shape[i];
    }
    if (dense) return true;
  }
  // No elements: contiguous whatever the strides (like PyTorch), wherever the 0 is.
  for (const auto& s : shape) {
    auto zero = sym_eq(s, 0);
    if (zero && *zero) return true;
  }
  SymInt expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    // The stride first: asking whether a symbolic size is 1 could specialize it.
    auto same = sym_eq(strides[i], expected);
    if (!same || !*same) {
      auto one = sym_eq(shape[i], 1);
      if (one && *one) continue;
      return false;
    }
    expected = expected * shape[i];
  }
  return true;
}

}  // namespace kiln
