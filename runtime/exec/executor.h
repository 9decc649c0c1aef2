// The executor interface: how pending graphs are run. The interpreter is the default;
// JIT backends plug in here without runtime/ knowing them.
#pragma once
#include <memory>
#include <vector>

#include "runtime/core/export.h"
#include "runtime/ir/node.h"

namespace kiln {

// A pending subgraph handed to an executor in one piece.
struct Segment {
  std::vector<Node*> nodes;  // unmaterialized nodes, topologically sorted
  std::vector<bool> needed;  // per node: must hold storage after the run (used outside)
  // Nodes to keep alive until materialize() has finished with the segment: an executor that
  // unlinks a segment node from its consumers (graph passes) adds it here.
  std::vector<NodePtr> keep_alive;
};

// Runs segments. run() must leave every `needed` node materialized (Node::set_storage; pass
// drop_inputs=false while other nodes of the segment may still read a node's inputs —
// materialize() cuts every materialized node loose afterwards).
class KILN_API Executor {
 public:
  virtual ~Executor() = default;
  virtual void run(Segment& segment) = 0;
  virtual const char* name() const = 0;
};

// Installs the executor used by materialization; nullptr restores the interpreter.
KILN_API void set_executor(std::shared_ptr<Executor> ex);
// The executor in use (for CPU segments).
KILN_API Executor& current_executor();
// Installs the executor for segments on devices of `type` other than the CPU (the JIT's CUDA
// executor); nullptr restores the interpreter, which runs such nodes through the device runtime.
KILN_API void set_device_executor(DeviceType type, std::shared_ptr<Executor> ex);
// Runs a segment whose nodes may live on several devices: split into one segment per device
// and phase (a node after a cross-device copy runs in a later phase), each on its device's
// executor.
KILN_API void run_segment(Segment& segment);
// The part of a segment that runs on one device in one phase.
struct DevicePart {
  Device device;
  int phase = 0;
  Segment seg;  // its nodes, in the segment's order; `needed` also for nodes a later part reads
};
// `segment` cut into single-device parts, in an order that runs every node after its inputs
// (sets the nodes' `pos` to their index in `segment`).
KILN_API std::vector<DevicePart> split_by_device(Segment& segment);
// The reference interpreter (always available; the oracle for every JIT path).
KILN_API std::shared_ptr<Executor> interpreter();

// Runs one node on the reference interpreter (its inputs must be materialized). JIT
// executors use it for ops they do not compile and as their fallback.
KILN_API void interpret_node(Node& n);

// Computes every given node that is not yet materialized, with all pending ancestors.
KILN_API void materialize(const std::vector<NodePtr>& nodes);
// Same, for one node.
KILN_API void materialize(const NodePtr& node);

// Counters proving laziness.
struct Stats {
  uint64_t nodes_recorded = 0;  // nodes created by ops (leaves included)
  uint64_t nodes_executed = 0;  // nodes computed by an executor
  uint64_t materializations = 0;  // segments run
  uint64_t pending = 0;  // nodes recorded but not yet computed, alive now
};
// A snapshot of the counters.
KILN_API Stats stats();
// Zeroes the recorded/executed/materialization counters.
KILN_API void reset_stats();
// Pending nodes above which a newly recorded node is materialized at once (default 10000).
KILN_API void set_pending_limit(uint64_t n);
KILN_API uint64_t pending_limit();

// Internal counters (not exported).
namespace detail {
// A new node's id (unique, increasing in recording order); counts it recorded and pending.
uint64_t node_made();
void count_executed(uint64_t n);
// Changes the number of pending nodes (a per-thread tally, added to the total in batches).
void pending_add(int64_t d);
// The number of pending nodes as this thread sees it (cheaper than stats()).
int64_t pending_now();
}  // namespace detail

}  // namespace kiln
