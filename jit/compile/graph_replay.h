// GraphReplay: one program instance on a GPU replayed as device graphs (CUDA graphs). The second
// run of an instance is recorded; later runs whose inputs sit where a recorded graph reads them
// launch that graph: one launch for the whole program, none of the host work of a run.
//
// What a replay must never do, and how it is kept from it:
// - Overwrite an output the caller still holds: each graph owns its output memory (its private
//   pool); a graph replays only when nobody else holds one of its outputs. Small outputs (up to
//   kCopyOutBytes: a loss) are handed out as copies, and gradients a call sets without reading
//   are let go before it runs (compile.cpp), so a training loop replays one graph. Up to
//   kPerInstance graphs per instance take turns (a loop holding last call's large outputs
//   alternates between two); when every graph's outputs are held the run goes without a graph,
//   and a graph held for kStale runs is replaced (its memory stays with the outputs held).
// - Read the wrong memory: a graph bakes in the addresses of its inputs. An input whose address
//   changes from call to call (a fresh batch tensor) is copied into a buffer of the graph before
//   each replay; the others are guarded by address (storage, offset and strides).
// - Break captured state updated in place: a tensor the program rewrites (parameters and
//   optimizer state written in place by fn) is written back into its own storage at the end of
//   the graph, so its address never changes — only when nothing else holds that storage or the
//   tensor's node (else the run goes without a graph and the usual fresh storage is used).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/exec/device_runtime.h"
#include "runtime/tensor/tensor.h"

namespace kiln::jit {

// Counters shared by the programs of one compiled function (CompileStats reads them).
struct GraphCounters {
  std::atomic<int64_t> recorded{0};  // graphs recorded
  std::atomic<int64_t> updated{0};  // ... of which by updating a dropped graph's executable in place
  std::atomic<int64_t> replays{0};  // runs served by a graph
  std::atomic<int64_t> ungraphed{0};  // runs of graphable instances that went without a graph
  std::atomic<int64_t> pool_bytes{0};  // device memory held by the graphs' private pools now
  std::atomic<int64_t> kept{0};  // graphs kept now
  std::atomic<int64_t> clock{0};  // stamps graph uses (least recently used across instances)
  int64_t limit = 128;  // graphs kept at most (CompileOptions::cuda_graph_limit)
};

// How a program's instances use graphs.
struct GraphPolicy {
  std::shared_ptr<GraphCounters> counters;
  // (output, input) pairs: the output is the new value of the input, written in place.
  std::vector<std::pair<size_t, size_t>> write_back;
  std::string name;  // for KILN_LOG=graphs
};

// A fresh leaf with `layout`'s type and layout over `storage` (how a program run hands out its
// outputs).
Tensor leaf_over(const Node& layout, std::shared_ptr<Storage> storage);

class GraphReplay {
 public:
  // Graphs per instance that take turns (outputs still held block a graph).
  static constexpr size_t kPerInstance = 3;
  // Outputs of at most this many bytes (a loss, a norm) are handed out as copies, so holding them
  // never keeps a graph from replaying.
  static constexpr size_t kCopyOutBytes = size_t{1} << 20;
  // Runs after which a graph whose outputs are still held may be replaced by a new one.
  static constexpr int64_t kStale = 16;

  // For an instance whose computed nodes are `nodes`, inputs `inputs`, outputs `outputs`
  // (the instance's node objects). `device` is where everything lives.
  GraphReplay(GraphPolicy policy, Device device, std::vector<Node*> inputs, std::vector<Node*> outputs);
  ~GraphReplay();
  // The one CUDA device all of `nodes` and `inputs` live on, or nothing (then no graphs).
  static std::optional<Device> device_of(const std::vector<Node*>& nodes, const std::vector<Node*>& inputs);

  // Serves the call with a recorded graph when one fits `ins` (the call's inputs, at offset 0):
  // true with `out` set; false: run normally (and maybe record, see record()).
  bool replay(const std::vector<Node*>& ins, std::vector<Tensor>& out);
  // Whether the run about to be made normally should be recorded instead.
  bool wants_record(const std::vector<Node*>& ins);
  // Records `run` (the instance's run, inputs bound to `ins`' storage) into a graph, launches
  // it and sets `out`: true. False when the work cannot be recorded (logged; the instance is
  // then never graphed and the caller runs normally). `bind_input(i, storage)` rebinds the
  // instance's input i to a graph-owned buffer. `reuse`: a graph dropped to make room (this
  // instance's, or another size's at the function's limit), whose executable is updated in
  // place when the operations line up.
  bool record(const std::vector<Node*>& ins, const std::function<void()>& run,
              const std::function<void(size_t, const std::shared_ptr<Storage>&)>& bind_input, std::vector<Tensor>& out,
              std::unique_ptr<DeviceGraph> reuse = nullptr);
  // Counts a run that went without a graph.
  void note_ungraphed();
  // The use stamp of this instance's least recently used graph whose outputs nobody holds
  // (INT64_MAX: none), and taking that graph out (the function keeps too many).
  int64_t oldest_free() const;
  std::unique_ptr<DeviceGraph> take_oldest_free();

 private:
  struct Graph;
  bool write_back_safe(const std::vector<Node*>& ins) const;
  std::unique_ptr<DeviceGraph> drop(const Graph* g);
  // Copies moving inputs into `g`'s buffers, launches it and stamps the use.
  void launch(Graph& g, const std::vector<Node*>& ins);
  // Whether nobody but the graph holds an output it hands out (a replay would overwrite it).
  static bool outputs_free(const Graph& g);
  void make_outputs(const Graph& g, const std::vector<Node*>& ins, std::vector<Tensor>& out) const;

  GraphPolicy policy_;
  Device device_;
  std::vector<Node*> inputs_, outputs_;
  std::vector<std::unique_ptr<Graph>> graphs_;
  std::vector<const void*> last_address_;  // per input, its data address at the last call
  std::vector<bool> writes_;  // per output: the new value of an input (write_back)
  std::vector<size_t> write_to_;  // ... of which input
  std::vector<bool> written_;  // per input: rewritten in place
  std::vector<bool> moving_;  // per input: its address changed between calls
  std::unique_ptr<DeviceGraph> spare_;  // the graph wants_record dropped, for record() to reuse
  int64_t calls_ = 0;
  bool broken_ = false;  // recording failed once: never again
};

}  // namespace kiln::jit
