// Graph rewrites written as kiln functions: a search function and its replacement, registered
// once. kiln::compile traces the search function into a pattern graph (once, on first use),
// finds its instances in each traced graph — forward and backward: the joint graph, before it
// is partitioned — and replaces each by the replacement traced on the matched inputs.
//
// Matching is structural: ops, their dim/index attributes, ranks and constants must agree; sizes
// are ignored, then checked on the replacement (same shapes and dtypes as what it replaces).
// Operands of commutative ops match in either order; a pattern input used twice must match one
// node twice; the scalars given as example_scalars are wildcards bound to any constant found in
// their place (pick example values that no other constant of the search function has). A match
// is refused when a node it would remove is also used outside it.
//
// In training, a pattern also matches its own backward: for every subset of the floating tensor
// inputs the search function is traced with gradients (a tangent standing for the incoming
// gradient), and the replacement's gradients replace the matched ones. KILN_LOG=patterns lists
// each match; KILN_PATTERNS=off (or set_enabled(false)) turns the rewrites off.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/export.h"
#include "runtime/tensor/tensor.h"

namespace kiln::patterns {

// A pattern or replacement function: tensors and scalars in, one tensor out.
using PatternFn = std::function<Tensor(const std::vector<Tensor>& tensors, const std::vector<double>& scalars)>;
// A final say on a structural match, given what it bound (sizes are known by then).
using ExtraCheck = std::function<bool(const std::vector<Tensor>& tensors, const std::vector<double>& scalars)>;

// Registers (or replaces) the rewrite `name`: instances of search(example_tensors-like inputs,
// scalars) become replace(same inputs, same scalars). The examples fix the inputs' ranks and
// dtypes; use sizes of at least 2. Throws kiln::Error when search does not build a graph over
// its inputs.
KILN_API void register_replacement(const std::string& name, PatternFn search, PatternFn replace,
                                   std::vector<Tensor> example_tensors, std::vector<double> example_scalars = {},
                                   ExtraCheck extra_check = nullptr);
// Removes the rewrite `name`; false when there was none.
KILN_API bool unregister_replacement(const std::string& name);
// Names of the registered rewrites, kiln's own included.
KILN_API std::vector<std::string> registered();
// Turns every rewrite on or off for this process (KILN_PATTERNS=off starts it off).
KILN_API void set_enabled(bool on);
KILN_API bool enabled();
// Instances replaced so far, per rewrite name (this process).
KILN_API std::map<std::string, int64_t> match_counts();

}  // namespace kiln::patterns
