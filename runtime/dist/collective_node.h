// Collectives as nodes of the lazy graph (OpKind::Collective): the attribute layout, recording,
// and the runner the interpreter calls to compute one on its group's backend.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/dist/backend.h"
#include "runtime/dist/group.h"
#include "runtime/ir/node.h"
#include "runtime/tensor/tensor.h"

namespace kiln::dist {

enum class CollKind : int64_t { AllReduce, Broadcast, AllGather, ReduceScatter, AllToAll };
const char* coll_name(CollKind k);

// ints = {kind, group id, reduce op, root, async, n, in_splits[n] (elements), out_splits[n]}.
struct CollAttrs {
  CollKind kind = CollKind::AllReduce;
  int64_t group = 0;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  bool async = false;
  std::vector<int64_t> in_counts, out_counts;  // all_to_all: elements per rank
};
Attrs to_attrs(const CollAttrs& c);
CollAttrs from_attrs(const Attrs& a);

// Records the collective on `input` (made dense) with an output of `dtype`/`shape`; in lazy
// eager it runs now (every rank in call order), inside a compile() trace it is only recorded.
Tensor record_collective(const CollAttrs& c, const Tensor& input, Shape out_shape);

// What the last collective this thread ran left in flight: its completion and the storages it
// reads and writes, kept until it is done (null completion: finished).
struct InFlight {
  CompletionPtr done;
  std::vector<std::shared_ptr<Storage>> keep;
};
InFlight take_in_flight();

}  // namespace kiln::dist
