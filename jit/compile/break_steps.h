// Graph breaks kept compiled: a data-dependent step inside fn (item(), to_vector(), a size read
// from values) splits a compiled entry into segments. A break's segment computes the values fn
// read and the values later segments need; the values read pick the continuation traced for
// them (a value guard), so an entry is a small tree of segments.
#pragma once
#include <atomic>
#include <map>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "guards/guard_set.h"
#include "jit/compile/program.h"

namespace kiln::detail {
struct Outcome;  // how compile() lands a final segment's outputs (jit/compile/compile.cpp)
}

namespace kiln::jit {

// The most elements a data-dependent step may read and still become a value guard; a larger
// read (printing or data() of a big tensor) makes fn run eagerly.
inline constexpr int64_t kMaxBreakElements = 64;

struct BreakStep;

// One continuation after a break: the values it was traced for, what it adds to the guards,
// and the next break or the final segment.
struct Branch {
  std::vector<uint8_t> bytes;  // the values read, element by element
  guards::BranchGuards guards;
  std::unique_ptr<BreakStep> next;  // the next break, or
  std::shared_ptr<detail::Outcome> end;  // the final segment
  Branch* older = nullptr;  // the branch tried after this one
};

// One graph break of a traced entry: the segment computing its values, and its continuations.
struct BreakStep {
  std::shared_ptr<Program> prog;  // inputs: the slots before the break; outputs: values read, then carried
  size_t num_values = 0;  // leading outputs fn read (compared by bytes)
  std::vector<DType> dtypes;  // ... their dtypes
  std::vector<int64_t> numels;  // ... and element counts (for messages)
  std::string what;  // "item() of sum"
  std::string signature;  // the segment's structure: a re-trace on the same path matches it
  std::atomic<Branch*> head{nullptr};  // the continuations, most recent first (read without a lock)
  std::vector<std::unique_ptr<Branch>> owned;

  // Makes `b` the first continuation tried (callers serialize adds).
  void add(std::unique_ptr<Branch> b);
  // The first continuation traced for `bytes` whose guards hold (`first_captured`: the number of
  // captured tensors before the break), or null; on a miss `why` says why in words.
  Branch* find(const std::vector<uint8_t>& bytes, std::vector<int64_t>& syms, const std::vector<std::string>& names,
               size_t first_captured, std::string* why) const;
  // Values in words: "3", "true", "[1, 0, 1]".
  std::string values_str(const std::vector<uint8_t>& bytes) const;
};

// The elements of `outs[0..n)` (materialized) as bytes, in logical order.
std::vector<uint8_t> value_bytes(const std::vector<Tensor>& outs, size_t n);
// Storage holding materialized `src`'s elements where `like` (strides and offset under `env`)
// expects them: `src`'s own when the layouts agree, else a copy.
std::shared_ptr<Storage> storage_like(const Node& like, const Node& src, const std::map<std::string, int64_t>& env);

}  // namespace kiln::jit
