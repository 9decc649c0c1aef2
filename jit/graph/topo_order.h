// The order every traced-graph walk uses (programs, partitioning, graph breaks, patterns).
#pragma once
#include <set>
#include <vector>

#include "runtime/ir/node.h"

namespace kiln::jit {

// Nodes behind `outputs`, inputs first (stops at `stop` and materialized nodes), topologically sorted.
std::vector<Node*> topo_order(const std::vector<NodePtr>& outputs, const std::set<const Node*>& stop);

}  // namespace kiln::jit
