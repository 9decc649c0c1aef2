// topo_order: the unmaterialized nodes behind a set of outputs, inputs first.
#include "jit/graph/topo_order.h"

#include <unordered_map>
#include <utility>

namespace kiln::jit {

std::vector<Node*> topo_order(const std::vector<NodePtr>& outputs, const std::set<const Node*>& stop) {
  std::vector<Node*> order;
  std::unordered_map<const Node*, int> state;
  std::vector<std::pair<Node*, size_t>> stack;
  for (const auto& r : outputs) {
    if (!r || stop.count(r.get()) || r->materialized() || state.count(r.get())) continue;
    stack.push_back({r.get(), 0});
    state[r.get()] = 1;
    while (!stack.empty()) {
      auto& [n, i] = stack.back();
      if (i < n->inputs.size()) {
        Node* in = n->inputs[i++].get();
        if (!stop.count(in) && !in->materialized() && !state.count(in)) {
          state[in] = 1;
          stack.push_back({in, 0});
        }
      } else {
        order.push_back(n);
        stack.pop_back();
      }
    }
  }
  return order;
}

}  // namespace kiln::jit
