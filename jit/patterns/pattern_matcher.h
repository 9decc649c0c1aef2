// The pattern matcher behind kiln::patterns (jit/compile/patterns.h): pattern graphs traced from
// the registered functions, structural matching, and the rewrite of a traced graph.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "jit/graph/passes.h"
#include "runtime/ir/node.h"

namespace kiln::jit {

// Replaces the instances of the registered rewrites in the graph behind `roots` (each vector's
// entries naming a replaced node are redirected to its replacement). Nodes recorded before
// `first_id` (program inputs, captured values) are never rewritten, only bound as inputs.
// Runs inside compile()'s trace (sizes the replacements rely on are guarded). `where` names the
// graph in KILN_LOG=patterns. Returns the number of instances replaced (0 when disabled).
size_t apply_patterns(const std::vector<std::vector<NodePtr>*>& roots, uint64_t first_id, const std::string& where);

// Lazy eager: the registered rewrites' instances in `seg` as a rewrite that makes their
// replacements (Rewrite::made) and relinks their readers, for the executor to apply to this and
// every later segment of the same signature and guarded constants (a needed node replaced takes
// its replacement's storage). `seg` is left as it was; identity when nothing matched.
Rewrite segment_patterns(const Segment& seg);

// Changes with every registration, removal and switch of the rewrites (plans made under another
// generation are stale).
uint64_t patterns_generation();

// Makes the registered rewrite `name` match only its forms with gradients (for kiln's own
// rewrites whose point is the backward: the forward alone would be replaced by itself).
void set_gradient_forms_only(const std::string& name);

}  // namespace kiln::jit
