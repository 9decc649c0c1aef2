// The pattern matcher behind kiln::patterns (jit/compile/patterns.h): pattern graphs traced from
// the registered functions, structural matching, and the rewrite of a traced graph.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/ir/node.h"

namespace kiln::jit {

// Replaces the instances of the registered rewrites in the graph behind `roots` (each vector's
// entries naming a replaced node are redirected to its replacement). Nodes recorded before
// `first_id` (program inputs, captured values) are never rewritten, only bound as inputs.
// Runs inside compile()'s trace (sizes the replacements rely on are guarded). `where` names the
// graph in KILN_LOG=patterns. Returns the number of instances replaced (0 when disabled).
size_t apply_patterns(const std::vector<std::vector<NodePtr>*>& roots, uint64_t first_id, const std::string& where);

// Makes the registered rewrite `name` match only its forms with gradients (for kiln's own
// rewrites whose point is the backward: the forward alone would be replaced by itself).
void set_gradient_forms_only(const std::string& name);

}  // namespace kiln::jit
