// Program: a traced graph from input leaves to outputs, replayed without re-recording. Sizes may
// be symbolic; each set of symbol values gets an instance (concrete nodes, one schedule) whose
// kernels come from the code cache, so every size shares one kernel set.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "jit/compile/graph_replay.h"
#include "jit/graph/topo_order.h"
#include "runtime/tensor/tensor.h"

namespace kiln::jit {

class Program {
 public:
  // `inputs`: leaf nodes the graph reads (storage bound per call); `outputs`: what run()
  // returns. Materialized nodes reached that are not inputs are constants. `rng_offsets`: per
  // random node id, its first number's offset from the call's generator state (used when run()
  // is given that state).
  Program(std::vector<NodePtr> inputs, std::vector<NodePtr> outputs, std::vector<std::string> symbols,
          std::map<uint64_t, SymInt> rng_offsets = {});
  ~Program();
  // Runs on `inputs` (materialized nodes matching the input leaves' dtypes and layouts) with
  // symbol values `syms`; returns the outputs as fresh tensors. Random ops reserve their numbers
  // from the generator, or with `rng_base` draw at rng_base + their offset (the generator is
  // left alone).
  std::vector<Tensor> run(const std::vector<Node*>& inputs, const std::vector<int64_t>& syms,
                          const std::pair<uint64_t, uint64_t>* rng_base = nullptr);
  const std::vector<NodePtr>& inputs() const { return inputs_; }
  const std::vector<NodePtr>& outputs() const { return outputs_; }
  // Replays instances on a GPU as device graphs under `policy` (set before the first run).
  void use_graphs(GraphPolicy policy);
  // (output, input) pairs: the output is the new value of the input (state the program updates
  // in place). A run without a device graph whose caller holds such an input alone writes the
  // output over the input's storage (when the kernel computing it reads the input last and only
  // where it writes): the old and the new state do not both take memory.
  void donate(std::vector<std::pair<size_t, size_t>> write_back);
  // Number of size instances built so far (one per set of values of the symbols it uses).
  size_t instances() const;
  // The symbols the program's sizes use (inputs' layouts, nodes, random offsets), in the
  // order of `symbols`; instances are keyed by their values only.
  std::vector<std::string> symbols_used() const;
  // Nodes computed by the program (not inputs or constants), topologically sorted.
  std::vector<const Node*> body() const;

 private:
  struct Instance;
  // An input's layout as the program was built (later rewrites of the traced node do not apply).
  struct Layout {
    Shape shape, strides;
    SymInt offset;
  };
  Instance& instance(const std::vector<int64_t>& syms);
  void graph_instance(Instance& inst);  // gives `inst` device graphs when the policy and its nodes allow
  std::unique_ptr<DeviceGraph> graph_to_reuse();  // at the limit: the least recently used free graph, taken out
  Instance* oldest_free_graph();  // the instance holding the least recently used free graph
  std::vector<NodePtr> inputs_, outputs_;
  std::vector<Layout> input_layouts_;
  std::vector<std::string> symbols_;
  std::vector<size_t> used_;  // indices into symbols_ of the symbols the program uses
  std::map<uint64_t, SymInt> rng_offsets_;
  std::unique_ptr<GraphPolicy> graphs_;  // null: no device graphs
  std::vector<std::pair<size_t, size_t>> donations_;  // (output, input)
  mutable std::mutex mu_;
  std::map<std::vector<int64_t>, std::unique_ptr<Instance>> instances_;
  Instance* last_ = nullptr;  // the instance used last (most calls repeat sizes)
  std::vector<int64_t> last_key_;  // its key: the values of the used symbols
};

// Graphviz text of the graph behind `outputs` (stopping at `inputs`); nodes in `highlight` are
// filled (saved values), `label` titles it.
std::string graph_dot(const std::vector<NodePtr>& inputs, const std::vector<NodePtr>& outputs,
                      const std::set<const Node*>& highlight, const std::string& label);

// Whether `op` draws random numbers (its Philox counter is set per run).
bool is_random_op(OpKind op);

}  // namespace kiln::jit
