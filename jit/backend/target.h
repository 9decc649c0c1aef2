// Target: what a backend tells lowering about the machine it generates code for. lower()
// reads it instead of constants: how the parallel index is spread, tile sizes, vector width
// and which loop shapes and ops the backend takes.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/ir/node.h"

namespace kiln::jit {

struct Target {
  // How a kernel's parallel index [0, extent) is run.
  enum class Parallel : uint8_t {
    HostChunks,  // chunks of consecutive indices on the host's TBB pool
    DeviceGrid,  // one device thread (or block) per index
  };
  std::string name;  // part of every kernel key ("cpu", "cuda-sm90")
  Parallel parallel = Parallel::HostChunks;
  int64_t tile = 2048;  // elements of a long last dim per parallel index
  // Pointwise kernels run tiles of the last dim only where it is a constant at least this long
  // (0: wherever it is not small_inner), in a domain of rows (two dims or more) that gives at
  // least tile_min_parallel tiles when its leading dims are constants; others one element per
  // parallel index.
  int64_t tile_min_inner = 0;
  int64_t tile_min_parallel = 0;
  int64_t column_tile = 64;  // columns per parallel index of a column reduction
  int64_t small_inner = 8;  // a last dim up to this size is a compile-time constant
  int vector_bytes = 32;  // width of the vector registers code is generated for
  bool split_reductions = true;  // full reductions as per-chunk partials, combined after
  int64_t split_chunks = 256;  // most chunks of a split reduction (its parallel extent)
  int64_t split_chunk_work = 16384;  // fewest elements per chunk
  // Row reductions whose rows hold at most this many elements (known when the plan is made):
  // the kernel may keep values that several stages of a row use in fast memory (0: never).
  int64_t row_cache = 0;
  // Reductions over leading dims (the last kept) of at least this many rows, known when the
  // plan is made: per-(row chunk, column) partials, one index per column of a chunk, combined
  // per column after (0: never; columns then reduce in one index each).
  int64_t column_split_rows = 0;
  bool merge_row_stages = false;  // ScheduleOptions::merge_row_stages
  int max_merged_reductions = 0;  // ScheduleOptions::max_merged_reductions
  bool half_kernels = false;  // float16/bfloat16 ops fused into kernels (float32 math)
  bool split_flat = false;  // split over a short last dim: chunks of the flat index
                            // (lanes read consecutive elements), not of rows
  bool column_reductions = true;  // reductions over leading dims with per-column scratch
  // Store transcendental values a reduction and another op read (ScheduleOptions); false: also
  // schedule with recomputation and keep whichever schedule's kernels move fewer bytes.
  bool store_expensive = true;
  // With store_expensive off: keep the recomputing schedule only when each of its reduction
  // kernels keeps its rows in the row cache (a host core pays for every recomputed
  // transcendental; a GPU hides it behind memory traffic).
  bool recompute_in_row_cache_only = false;
  // The most bytes of arguments (buffers and parameters, 8 bytes each, + 16) a kernel launch
  // passes; wider pointwise kernels are split by their outputs (0: no limit).
  int64_t max_arg_bytes = 0;
  // Ops the backend cannot generate (lower() rejects groups using them); null: all.
  bool (*unsupported_op)(OpKind op, DType dtype) = nullptr;
  // Whether lowering may emit `op` on `dtype` values.
  bool supports(OpKind op, DType dtype) const { return !unsupported_op || !unsupported_op(op, dtype); }
};

}  // namespace kiln::jit
