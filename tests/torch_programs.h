// Replaying one program of the torch-programs corpus (../shared/torch-programs/README.md) with
// kiln's public API, in every mode the README lists.
#pragma once
#include <string>
#include <vector>

#include "torch_ops.h"

namespace torch_programs {

using kiln::Tensor;
using torch_ops::json;

// One program: its ops with their index constants made once, its input sets and results.
struct Program {
  std::string id;
  bool grad = false;
  json ops;  // the ops, as in the corpus
  std::vector<std::vector<Tensor>> attr_tensors;  // per op: tensors in attrs (index, target…)
  std::vector<int64_t> outputs;  // value ids of the results
  std::vector<std::string> tol;  // per result: "f32", "f64" or "exact"
  json sets;  // input sets with expected outputs and gradients
  int64_t nvalues = 0;  // inputs plus every op output
};

// Parses one corpus line.
Program parse_program(const json& j);
// Runs the ops on `inputs` (tensors of set s, or traced values) and returns the results.
std::vector<Tensor> run_program(const Program& p, const std::vector<Tensor>& inputs);

// What replaying one program found.
struct Outcome {
  std::vector<std::string> failures;  // "mode: what differed"; empty when every mode passed
  bool polymorphic = false;  // three input sets of different sizes
  bool coverable = false;  // ... whose third set changes only dims the second set
                           // made symbolic, to sizes >= 2 (others must recompile)
  bool third_size_reused = false;  // ... and the third set ran on the symbolic entry
  std::string third_size_miss;  // ... else why its guards missed
};

// Runs every mode on one program (exceptions become failures).
Outcome replay(const Program& p);

}  // namespace torch_programs
