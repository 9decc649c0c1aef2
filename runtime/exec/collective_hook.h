// The seam through which the interpreter (and every executor's opaque steps) runs a Collective
// node without knowing process groups: runtime/dist registers the runner at load.
#pragma once
#include "runtime/ir/node.h"

namespace kiln::detail {
using CollectiveRunner = void (*)(Node&);
void set_collective_runner(CollectiveRunner r);
// Computes Collective node `n` (inputs materialized on its device); Error without a runner.
void run_collective_node(Node& n);
}  // namespace kiln::detail
