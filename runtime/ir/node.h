// The graph IR: a Node is one recorded op (or a leaf buffer). Tensors are handles to nodes.
#pragma once
#include <atomic>
#include <bit>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/export.h"
#include "runtime/ir/symint.h"

namespace kiln {

// Every primitive the IR knows. Composite ops (softmax, layer_norm, losses, sdpa, var ...)
// are recorded as subgraphs of these. Attribute use is stated per group.
enum class OpKind : uint16_t {
  // Sources. Full: f0 = value. Arange: f0 = start, f1 = step. Rand*: seed/counter = Philox
  // key/counter, f0/f1 = low/high (uniform, randint) or mean/std (normal).
  Leaf,
  Full,
  Arange,
  RandUniform,
  RandNormal,
  RandInt,
  // Unary pointwise (same dtype out, except IsNan/IsFinite -> bool). Cast: to node dtype.
  Neg,
  Abs,
  Exp,
  Exp2,
  Expm1,
  Log,
  Log2,
  Log1p,
  Sqrt,
  Rsqrt,
  Reciprocal,
  Sin,
  Cos,
  Tan,
  Atan,
  Tanh,
  Sigmoid,
  Relu,
  Erf,
  Floor,
  Ceil,
  Round,
  Sign,
  IsNan,
  IsFinite,
  LogicalNot,
  BitwiseNot,
  Cast,
  // Binary pointwise over inputs of one dtype (broadcast), comparisons/logical -> bool.
  Add,
  Sub,
  Mul,
  Div,
  Pow,
  Maximum,
  Minimum,
  Atan2,
  Remainder,
  Fmod,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  LogicalAnd,
  LogicalOr,
  LogicalXor,
  BitwiseAnd,
  BitwiseOr,
  BitwiseXor,
  // Ternary pointwise: Where(cond, a, b).
  Where,
  // Reductions over ints = dims (sorted, non-negative); shape holds the result (keepdim or not).
  Sum,
  Prod,
  Amax,
  Amin,
  ArgMax,
  ArgMin,
  // Scan along ints[0].
  Cumsum,
  // Views: share the input's storage; the node's strides/offset place it in that storage.
  // ints: Permute = permutation; Slice = {dim, start, stop, step}; Select = {dim, index};
  // Squeeze/Unsqueeze = {dim}; Flip = dims; View/Expand: the node's shape. AsStrided: the
  // window sizes/strides/offset of a dense input (used by gradients of in-place writes).
  View,
  Permute,
  Expand,
  Slice,
  Select,
  Squeeze,
  Unsqueeze,
  Flip,
  AsStrided,
  // Copies. Contiguous: dense copy. Cat: ints[0] = dim. ViewScatter(base, src): a dense copy
  // of base with src written into the strided window attrs.sizes/strides/offset.
  Contiguous,
  Cat,
  ViewScatter,
  // Indexing, ints[0] = dim. Gather(x, idx); Scatter(x, idx, src); ScatterAdd(x, idx, src);
  // IndexSelect(x, idx); IndexAdd(x, idx, src).
  Gather,
  Scatter,
  ScatterAdd,
  IndexSelect,
  IndexAdd,
  // Batched GEMM over equal batch dims: [..., M, K] x [..., K, N].
  Matmul,
  // conv2d helpers; ints = {kh, kw, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w}.
  // Im2Col: [N, C, H, W] -> [N, C*kh*kw, L]. Col2Im: inverse (summing overlaps) to attrs.sizes.
  Im2Col,
  Col2Im,
  // Fused scaled dot-product attention over equal batch dims, Dk == Dv = D, float32/float64 or
  // bfloat16/float16 (computed in float32, rounded once).
  // ints = {causal (0/1: key j <= query i), bit pattern of the double scale}.
  // Attention(q [..., Tq, D], k [..., Tk, D], v [..., Tk, D] [, additive mask broadcast to
  // [..., Tq, Tk]]) -> [..., Tq, W] in q's dtype: the output rows, then each row's log-sum-exp
  // (attention_packed_width: W = D + 1 for float32/float64; 16-bit: the float32 log-sum-exp in
  // four exact 16-bit pieces, attention_lse.h, then zeros to a multiple of 8 columns).
  // AttentionBackward(q, k, v, out, grad_out [, mask]) -> [..., Tq + 2 Tk, D] in q's dtype: dq,
  // dk, dv stacked. out is Attention's packed output; grad_out is dO alone [..., Tq, D] (the
  // log-sum-exp gets no gradient) or, float32/float64, the packed output's gradient [..., Tq, D + 1].
  Attention,
  AttentionBackward,
  // Cross-device copy: a dense copy of a contiguous input onto the node's device.
  ToDevice,
  // A collective of a process group (runtime/dist): every rank of the group runs the same ones
  // in the same order. ints = collective_attrs (runtime/dist/collective_node.h): kind, group id,
  // reduce op, root, then split sizes. Never fused, recomputed, merged or matched.
  Collective,
  NumOps
};

// PyTorch-style name of an op kind ("add", "sum", ...).
KILN_API const char* op_name(OpKind op);
// True for ops whose output shares the input's storage.
KILN_API bool is_view_op(OpKind op);

// Attributes of a node; meaning depends on the op (see OpKind).
struct Attrs {
  std::vector<int64_t> ints;
  Shape sizes, strides;
  SymInt offset;
  double f0 = 0, f1 = 0;
  uint64_t seed = 0, counter = 0;
};

// What a block of memory holds for training, as the memory profile reports it (KILN_PROFILE=
// memory): set by the optimizer (parameters, their state), backward (gradients) and autograd's
// recording (values kept for a backward); a block marked twice keeps the later role in this
// order (a parameter a backward reads stays a parameter).
enum class MemoryRole : uint8_t { Other = 0, Saved, Gradient, OptimizerState, Parameter };

// A block of memory holding elements, on one device.
struct KILN_API Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  std::function<void(void*)> deleter;  // frees data (empty: not owned)
  // The op that made it (an op name: the memory ledger's "made by"); null: not said.
  const char* made_by = nullptr;
  bool in_ledger = false;  // recorded by the memory ledger (KILN_PROFILE=memory)
  MemoryRole role = MemoryRole::Other;  // (set through memory_ledger_mark, under the ledger's lock)
  ~Storage();
  // Fresh, owned memory of `nbytes` on `device` (64-byte aligned on the CPU; from the device's
  // caching allocator elsewhere), made by `made_by` (an op name, for KILN_PROFILE=memory).
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device, const char* made_by = nullptr);
};

struct Node;
using NodePtr = std::shared_ptr<Node>;
// What a node placed over a device mesh (a DTensor) stands on: this rank's shard. The mesh and
// the placements are added by runtime/dtensor (PlacedLayout), which alone makes these.
struct Placed {
  NodePtr local;
  virtual ~Placed() = default;
};
// A node's inputs.
using NodeList = std::vector<NodePtr, detail::PoolAllocator<NodePtr>>;

// One recorded op: what it computes, its inputs, its type, shape and layout, and once
// materialized the storage it lives in. Immutable once recorded, except for materialization.
struct KILN_API Node : std::enable_shared_from_this<Node> {
  OpKind op = OpKind::Leaf;
  NodeList inputs;
  Attrs attrs;
  DType dtype = DType::Float32;
  Device device;
  Shape shape;
  Shape strides;  // element strides into storage
  SymInt offset;  // element offset into storage
  std::shared_ptr<Storage> storage;  // set once materialized
  uint64_t id = 0;  // unique, increasing in recording order
  bool pending = true;  // counted in stats().pending until first computed
  // What its storage will hold (memory_ledger_mark), given to the storage it gets.
  MemoryRole role = MemoryRole::Other;
  // A scalar operand's constant that a thread's ops share (detail::scalar_operand): only ops
  // read it, so materialize() never stores it unless asked for it.
  bool shared_constant = false;
  // A compiled program's output that is the new value of its input `write_over` (optimizer state
  // updated in place), for one run whose caller holds that input alone: the kernel computing it
  // may write over the input's storage when it reads each element only where it writes it and is
  // that input's last reader (jit/exec/launch.cpp). Null: a fresh buffer.
  Node* write_over = nullptr;
  // Scratch for the thread materializing this (pending) node: a visit mark and the node's
  // position in its segment. Meaningless outside materialize() and Executor::run().
  uint32_t mark = 0;
  int32_t pos = -1;
  // The thread whose materialize() owns this pending node now (0: none). Only the owner reads
  // or changes a pending node's inputs, storage and scratch (see materialize.cpp).
  std::atomic<uint32_t> claim{0};
  // Set on the node of a DTensor: its shard (the local node), mesh and placements. Such a node
  // has the global shape and is never computed itself: ops on it record ops on the shard
  // (runtime/tensor/placed_hooks.h), materializing it materializes the shard.
  std::shared_ptr<const Placed> placed;

  Node();
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  bool materialized() const { return storage != nullptr; }
  // Computed for good (storage final, inputs dropped): safe to test from any thread, and once
  // true the node's storage may be read from any thread.
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  // Marks a materialized node ready (after its inputs were dropped).
  void set_ready() { ready_.store(true, std::memory_order_release); }
  // Marks the node computed into `s` and (by default) cuts it loose from its inputs, which
  // also makes it ready().
  void set_storage(std::shared_ptr<Storage> s, bool drop_inputs = true);
  // Typed pointer to the element at the node's offset (requires materialized, constant offset).
  template <class T>
  T* data() const {
    return static_cast<T*>(storage->data) + offset.as_int();
  }

 private:
  std::atomic<bool> ready_{false};
};

// Calls f on every size expression of `n` (a Node or const Node): shape, strides, offset and
// the size attributes.
template <class N, class F>
void for_each_size(N& n, F&& f) {
  for (auto* s : {&n.shape, &n.strides, &n.attrs.sizes, &n.attrs.strides})
    for (auto& d : *s) f(d);
  f(n.offset);
  f(n.attrs.offset);
}

// Size attributes that stand for integer attributes in compile() traces, where they can be
// symbolic: a Full with attrs.sizes = {v} fills with the size value v (a mean's count); a Slice
// with attrs.sizes = {start, stop} and a Select with attrs.sizes = {index} take those bounds.
// Their ints / f0 hold the traced values; once every size is concrete, this copies the sizes
// into them (compiled programs call it when they instantiate a trace for concrete sizes).
// Internal to kiln::compile: not exported.
void bind_size_attrs(Node& n);

// Attention / AttentionBackward attributes: ints = {causal, bit pattern of the double scale,
// bit pattern of the double dropout probability}. With dropout the last input is the int64 [4]
// generator words of its mask (kernels/cpu/attention_dropout.h).
inline Attrs attention_attrs(bool causal, double scale, double dropout = 0) {
  Attrs a;
  a.ints = {causal ? 1 : 0, std::bit_cast<int64_t>(scale), std::bit_cast<int64_t>(dropout)};
  return a;
}
// The columns of an Attention node's packed output for head size d and dtype dt: the output
// rows, then the row log-sum-exp: one column in float32/float64; in 16-bit dtypes its four exact
// pieces (attention_lse.h) and zeros up to a multiple of 8 columns (rows stay 16-byte aligned).
inline constexpr int64_t kAttentionLsePieces = 4;
inline int64_t attention_packed_width(int64_t d, DType dt) {
  return is_half(dt) ? (d + kAttentionLsePieces + 7) / 8 * 8 : d + 1;
}
inline SymInt attention_packed_width(const SymInt& d, DType dt) {
  return is_half(dt) ? SymInt(attention_packed_width(d.as_int(), dt)) : d + 1;
}
inline bool attention_causal(const Attrs& a) { return a.ints[0] != 0; }
inline double attention_scale(const Attrs& a) { return std::bit_cast<double>(a.ints[1]); }
inline double attention_dropout(const Attrs& a) { return a.ints.size() > 2 ? std::bit_cast<double>(a.ints[2]) : 0.0; }
// The input index of an Attention / AttentionBackward node's mask (after q, k, v and, backward,
// the packed forward output and its gradient), or 0 when it has none.
inline size_t attention_mask_input(const Node& n) {
  const size_t first = n.op == OpKind::Attention ? 3 : 5;
  return n.inputs.size() > first + (attention_dropout(n.attrs) > 0 ? 1 : 0) ? first : 0;
}
// The input index of its dropout generator words (the last input), or 0 without dropout.
inline size_t attention_dropout_input(const Node& n) {
  return attention_dropout(n.attrs) > 0 ? n.inputs.size() - 1 : 0;
}

// A fresh node (from the per-thread node pool).
KILN_API NodePtr new_node();
// A fresh Leaf node (a value without an op: an input, a placeholder) of `dtype` on `device`
// with this layout; empty `strides` means dense row-major. Storage is set by the caller.
KILN_API NodePtr new_leaf(DType dtype, Device device, Shape shape, Shape strides = {}, SymInt offset = SymInt(0));

// Dense row-major strides for a shape.
KILN_API Shape contiguous_strides(const Shape& shape);
// Whether shape/strides describe a dense row-major block (size-1 dims ignored).
KILN_API bool is_contiguous_layout(const Shape& shape, const Shape& strides);

}  // namespace kiln
