#include "jit/backend/host_code.h"

#include <algorithm>

#include "kernels/cpu/parallel.h"
#include "runtime/core/error.h"

namespace kiln::jit {
namespace {
constexpr int64_t kInlineBelow = 32768;  // elements: a smaller launch runs on the calling thread
constexpr int64_t kChunkWork = 16384;  // elements per TBB chunk at least
}  // namespace

void launch_host(KernelFn fn, const Launch& l) {
  if (l.extent <= 0) return;
  const int64_t work = std::max<int64_t>(1, l.work);
  if (work < kInlineBelow || l.extent == 1) {
    fn(0, l.extent, l.buffers, l.iparams, l.fparams);
    return;
  }
  const int64_t per_index = std::max<int64_t>(1, work / l.extent);
  const int64_t grain = std::max<int64_t>(1, kChunkWork / per_index);
  kernels::parallel_for(tbb::blocked_range<int64_t>(0, l.extent, grain), [&](const tbb::blocked_range<int64_t>& r) {
    fn(r.begin(), r.end(), l.buffers, l.iparams, l.fparams);
  });
}

const Target& host_target() {
  static const Target t = [] {
    Target x;
    x.name = "cpu";
    x.parallel = Target::Parallel::HostChunks;
    x.tile = 2048;
    x.column_tile = 64;
    // Column reductions over 1024 rows or more (a layer's bias and weight gradients): row chunks
    // x column tiles with per-chunk partials, so every core takes part whatever the width.
    x.column_split_rows = 1024;
    x.small_inner = 8;
    x.vector_bytes = 32;
    // Row kernels keep up to 8192 elements a row on the stack (jit/loop/row_cache.h): a
    // layer_norm -> gelu -> softmax row is read once and its erf and exp computed once.
    x.row_cache = 8192;
    x.store_expensive = false;
    x.recompute_in_row_cache_only = true;
    x.merge_row_stages = true;
    return x;
  }();
  return t;
}

void HostBackend::launch(const Code& code, const Launch& l) const {
  launch_host(static_cast<const HostCode&>(code).fn, l);
}

void HostBackend::run_range(const Code& code, int64_t begin, int64_t end, const Launch& l) const {
  static_cast<const HostCode&>(code).fn(begin, end, l.buffers, l.iparams, l.fparams);
}

std::shared_ptr<Code> HostBackend::wrap(KernelFn fn) const {
  if (!fn) throw Error(std::string(name()) + " returned no kernel function");
  auto c = std::make_shared<HostCode>();
  c->backend = this;
  c->fn = fn;
  return c;
}

}  // namespace kiln::jit
