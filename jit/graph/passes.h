// Graph passes run on a segment before scheduling: constant folding, no-op removal, common
// subexpression elimination and dead-code elimination. (Decomposition happens earlier: composite
// ops are recorded as primitive subgraphs.) The passes analyze a segment once, when its plan is
// made, and return a Rewrite in segment positions; the executor re-applies that rewrite, cheaply,
// to every later segment of the same signature (and the same guarded constant values).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/exec/executor.h"

namespace kiln::jit {

// How many nodes each pass removed.
struct PassCounts {
  int64_t cse = 0;  // duplicates of an earlier node
  int64_t noop =
      0;  // identities (x*1, x+0, x-0, x/1, same-shape view/expand, contiguous of contiguous, same-dtype cast)
  int64_t folded = 0;  // pointwise ops over constants, replaced by one constant
  int64_t dead = 0;  // nodes nothing used any more
};

// A recorded rewrite. Positions below the segment size name segment nodes; position
// size + j names the j-th folded constant.
struct Rewrite {
  // A constant value the rewrite relies on: Full node `pos` holds `value` (f0 and, for integer
  // dtypes, ints[0]).
  struct Guard {
    int pos;
    double f0;
    int64_t i0;
    bool has_i0;
  };
  // A new Full constant shaped like node `like`: `op` over the values of the Full nodes `args`.
  struct Fold {
    OpKind op;
    DType dtype;
    int like;
    int nargs;
    int args[2];
  };
  // A new node (a registered rewrite's replacement, jit/compile/patterns.h): its fields, and
  // its inputs by position (negative: external input -(k + 1)).
  struct Made {
    OpKind op;
    DType dtype;
    Device device;
    Shape shape, strides;
    SymInt offset;
    Attrs attrs;
    std::vector<int> inputs;
    bool random = false;  // a random op: the executor draws its numbers afresh on every application
  };
  // Input `slot` of node `node` reads node `to` instead.
  struct Edge {
    int node, slot, to;
  };
  // After the run, needed node `node` takes the storage of `from` (equal layout).
  struct Share {
    int node, from;
  };
  std::vector<Guard> guards;
  std::vector<Fold> folds;
  std::vector<Made> made;  // positions after the folded constants
  std::vector<Edge> edges;
  std::vector<Share> shares;
  std::vector<std::pair<int, int>> ext_src;  // external input -(k + 1): (node, slot) reading it
  std::vector<int> order;  // positions to schedule, topologically sorted
  std::vector<bool> needed;  // per entry of `order`: keeps its storage after the run
  PassCounts counts;
  // True when the segment runs as it is (nothing to apply).
  bool identity = true;
};

// Analyzes `seg` (left unchanged) and returns its rewrite.
Rewrite run_passes(const Segment& seg);
// Whether the constant values `guards` rely on hold in `seg` (of the same signature).
bool guards_hold(const std::vector<Rewrite::Guard>& guards, const Segment& seg);
// A guard on constant node `c` at position `pos`: its value as it is now.
Rewrite::Guard guard_on(const Node& c, int pos);
// Applies `rw` to `seg`: creates the folded constants and the made nodes, and redirects edges;
// `owned` receives the new nodes and every node unlinked (keep it until the segment is done: pass
// Segment::keep_alive). `ext` receives the node of every position.
void apply_rewrite(const Rewrite& rw, const Segment& seg, std::vector<Node*>& ext, std::vector<NodePtr>& owned);
// After the run: gives shared nodes their storage.
void finish_rewrite(const Rewrite& rw, const std::vector<Node*>& ext);
// Totals over every run_passes() call of the process (tests, KILN_LOG=passes).
PassCounts pass_totals();

}  // namespace kiln::jit
