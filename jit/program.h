// Program: a traced graph from input leaves to outputs, replayed without re-recording. Sizes may
// be symbolic; each set of symbol values gets an instance (concrete nodes, one schedule) whose
// kernels come from the code cache, so every size shares one kernel set.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace kiln::jit {

class Program {
 public:
  // `inputs`: leaf nodes the graph reads (storage bound per call); `outputs`: what run()
  // returns. Materialized nodes reached that are not inputs are constants.
  Program(std::vector<NodePtr> inputs, std::vector<NodePtr> outputs, std::vector<std::string> symbols);
  ~Program();
  // Runs on `inputs` (materialized nodes matching the input leaves' dtypes and layouts) with
  // symbol values `syms`; returns the outputs as fresh tensors.
  std::vector<Tensor> run(const std::vector<Node*>& inputs, const std::vector<int64_t>& syms);
  const std::vector<NodePtr>& inputs() const { return inputs_; }
  const std::vector<NodePtr>& outputs() const { return outputs_; }
  // Number of size instances built so far.
  size_t instances() const;
  // Nodes computed by the program (not inputs or constants), topologically sorted.
  std::vector<const Node*> body() const;

 private:
  struct Instance;
  Instance& instance(const std::vector<int64_t>& syms);
  std::vector<NodePtr> inputs_, outputs_;
  std::vector<std::string> symbols_;
  mutable std::mutex mu_;
  std::map<std::vector<int64_t>, std::unique_ptr<Instance>> instances_;
  Instance* last_ = nullptr;  // the instance used last (most calls repeat sizes)
  std::vector<int64_t> last_key_;
};

// Graphviz text of the graph behind `outputs` (stopping at `inputs`); nodes in `highlight` are
// filled (saved values), `label` titles it.
std::string graph_dot(const std::vector<NodePtr>& inputs, const std::vector<NodePtr>& outputs,
                      const std::set<const Node*>& highlight, const std::string& label);

// Nodes behind `outputs`, inputs first (stops at `inputs` and materialized nodes), topologically sorted.
std::vector<Node*> topo_order(const std::vector<NodePtr>& outputs, const std::set<const Node*>& stop);

}  // namespace kiln::jit
