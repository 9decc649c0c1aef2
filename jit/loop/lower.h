// Lowering: a scheduled group -> loop IR kernel, a structural key, and a recipe that binds
// the runtime arguments (sizes, strides, scalars, buffers) of any group with the same key.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "jit/backend/target.h"
#include "jit/loop/loop_ir.h"
#include "jit/graph/scheduler.h"

namespace kiln::jit {

// Where one runtime argument of a kernel comes from, for a group of the recorded structure.
struct ArgSource {
  enum class Kind : uint8_t {
    DomainSize,  // domain size of dim a
    NodeSize,  // size of dim b of group node a
    InputStride,  // stride of dim b of input a
    FullValue,  // node a's fill value (double / exact int)
    AttrF0,
    AttrF1,  // node a's f0 / f1
    Chunks,  // number of parallel chunks (split reductions)
    ChunkSize,  // rows (or elements) per chunk
  } kind;
  int a = 0, b = 0;
};

// Whether `g` is a row reduction whose loops run at most t.row_cache iterations (every dim,
// reduced or the last, at most that long, its size known): its kernel keeps a row's values
// that several stages use in the row cache.
bool row_cache_fits(const Group& g, const Target& t);

// Structural key of a group: equal keys lower to identical kernels for target `t`.
std::string group_key(const Group& g, const Target& t);

// A lowered group: the kernel and how to bind it.
struct Lowered {
  Kernel kernel;
  std::vector<ArgSource> iparams, fparams;
  int num_inputs = 0, num_outputs = 0;  // buffers: inputs, then outputs, then partials
  bool split = false;
  bool split_flat = false;  // split over the flat index of every dim (a short last dim)
  bool split_columns = false;  // split over rows of a column reduction: partials per (chunk, column)
  bool column = false;  // column reduction: one scratch buffer per reduction, kept-numel accumulators
  bool column_chunks = false;  // split_columns on a host: row chunks x column tiles, partials per (chunk, column)
  std::vector<OpKind> partial_ops;  // split: reduction op per output (partials combined after)
  int64_t split_chunks = 256, split_chunk_work = 16384;  // split: the target's chunking
};

// Runtime arguments of a lowered kernel bound to one group (by the recipe in Lowered).
struct BoundArgs {
  std::vector<int64_t> ip;  // int64 parameters
  std::vector<double> fp;  // double parameters
  int64_t chunks = 1;  // split reductions: chunks of the parallel range (partials)
  int64_t columns = 1;  // split column reductions: kept elements (partials per chunk)
  int64_t scratch = 1;  // elements (8 bytes each) of every scratch buffer
};
// Binds `L`'s arguments for group `g`, whose canonical inputs are `ins`, into `out` (cleared
// first, capacity kept).
void bind_args(const Lowered& L, const Group& g, const std::vector<Node*>& ins, BoundArgs& out);

// The second stage of a split reduction on a device: one parallel index reduces the partials
// of reduction `op` (param 0 = their count; buffer 0 the values in `acc` dtype, buffer 1 the
// arg indices for arg reductions) into element 0 of the last buffer (`out` dtype), as the host
// combine would.
Kernel combine_kernel(OpKind op, DType acc, DType out, bool columns = false);

// Thrown when a group cannot be expressed (the executor then runs it on the interpreter).
struct LowerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Lowers a group for target `t`: its tiles, its parallel scheme, its ops (throws LowerError
// for structure or ops the target does not take).
std::shared_ptr<Lowered> lower(const Group& g, const Target& t);

// Canonical order of a group's inputs (first use while walking its nodes).
std::vector<Node*> canonical_inputs(const Group& g);

}  // namespace kiln::jit
