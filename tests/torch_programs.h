// Replaying one program of the torch-programs corpus (../shared/torch-programs/README.md) with
// kiln's public API, in every mode the README lists.
#pragma once
#include <filesystem>
#include <functional>
#include <optional>
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

// How a distributed replay lays tensors out (DTensors, runtime/dtensor): `place` puts input
// `i` on the mesh, `gather` reads a result or gradient back whole.
struct Placer {
  std::function<Tensor(const Tensor& x, size_t input)> place;
  std::function<Tensor(const Tensor& t)> gather;
};
// Replays the program with its inputs placed: eager on every set, gradients eager on every set,
// and compiled on set 0 (kiln::compile runs DTensor programs eagerly), all compared whole.
Outcome replay_placed(const Program& p, const Placer& placer);

// The corpus file ($KILN_PROGRAMS_FILE, else shared/torch-programs next to the source or up to
// three levels up); `tried` collects the places looked at.
std::optional<std::filesystem::path> find_corpus(std::string& tried);
// Every line of the gzip'd corpus.
std::vector<std::string> read_corpus(const std::filesystem::path& path);

}  // namespace torch_programs
