// Guards: what a compiled entry assumed about its inputs, checked on every call before
// anything runs. Sizes are constants or symbols (bound from the first dim that carries them)
// with the relations the trace relied on.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "guards/value.h"

namespace kiln::guards {

// Assumptions about one tensor: dtype, device, rank, sizes, layout, requires_grad.
struct TensorGuard {
  DType dtype = DType::Float32;
  Device device;
  bool requires_grad = false;
  std::vector<int64_t> sizes;  // per dim: the size when constant
  std::vector<int> symbols;  // per dim: symbol index, or -1 when constant
  bool contiguous = true;  // else `strides` must match exactly (all sizes constant)
  std::vector<int64_t> strides;
};

// A relation the trace relied on: `expr rel 0` over the symbols.
struct SizeRelation {
  SymInt expr;
  SymRel rel;
  std::string by;  // the kiln call that relied on it ("mean()"), or ""
};

// Where a captured tensor (one fn reads without taking it as an argument) is found at call time.
struct CapturedTensor {
  std::weak_ptr<TensorImpl> impl;  // the tensor read, or the parameter whose grad was read
  bool grad_of = false;  // true: use impl->grad
  TensorGuard guard;  // its assumptions (sizes always constant)
  bool has_grad = false;  // (requires_grad leaves) whether .grad() was defined
  bool watch_grad = false;  // check has_grad
};

// The guards of one compiled entry.
class GuardSet {
 public:
  std::vector<int64_t> spec;  // argument structure (container lengths)
  std::vector<uint8_t> kinds;  // per flat argument: Value index (0 tensor, 1 int, 2 double, 3 bool)
  std::vector<int> tensor_slot;  // per flat argument: index into `tensors` (-1 for scalars)
  std::vector<TensorGuard> tensors;
  std::vector<Value> scalars;  // per flat argument: the specialized value (scalars only)
  std::vector<CapturedTensor> captured;
  std::vector<SizeRelation> relations;
  std::vector<std::string> symbol_names;  // "s0", "s1", ...
  bool grad_mode = true;
  uint32_t autocast = 0;  // detail::autocast_key() when traced
  uint8_t sdpa_backend = 0;  // detail::sdpa_backend_key() when traced (kiln::sdpa_kernel)

  // True when the call satisfies every guard; fills `syms` with the symbol values. On failure
  // and when `why` is given, says which guard failed ("arg 0 dim 0: expected 4096, got 1000").
  bool check(const std::vector<Value>& args, const std::vector<int64_t>& arg_spec, std::vector<int64_t>& syms,
             std::string* why) const;
  // The guards in words, one per line (KILN_LOG=guards).
  std::string str() const;
};

// What a continuation after a graph break adds to its entry's guards: the tensors fn first
// read after the break and the size relations it relied on after it.
struct BranchGuards {
  std::vector<CapturedTensor> captured;  // numbered after the captured tensors before the break
  std::vector<SizeRelation> relations;

  // True when every guard holds with the entry's symbol values `syms` (named `names`); `first`
  // is the number of the first captured tensor in messages.
  bool check(std::vector<int64_t>& syms, const std::vector<std::string>& names, size_t first, std::string* why) const;
  // The guards in words, one per line.
  std::string str(const std::vector<std::string>& names, size_t first) const;
  bool empty() const { return captured.empty() && relations.empty(); }
};

// Whether `t` satisfies `g` (symbol values checked/bound in `syms`); `what` names it in `why`.
bool check_tensor(const TensorGuard& g, const Node& n, bool requires_grad, std::vector<int64_t>& syms, const char* what,
                  int index, std::string* why);

}  // namespace kiln::guards
