#include "runtime/cuda/device_ops.h"

#include <algorithm>
#include <bit>
#include <map>
#include <memory>
#include <mutex>

#include "kernels/cpu/node_operand.h"
#include "kernels/cuda/device_kernels.h"
#include "kernels/cuda/flash_kernels.h"
#include "runtime/core/error.h"
#include "runtime/cuda/cuda_runtime.h"
#include "runtime/cuda/driver.h"
#include "runtime/exec/device_runtime.h"
#include "runtime/cuda/nvrtc.h"

namespace kiln::cu {
namespace {

using kernels::DeviceKernel;
using kernels::DeviceKernelInstance;
using kernels::Operand;

// The kernels' Geom (kernels/cuda/device_kernels.cpp): up to 8 dims, three operands' strides.
struct Geom {
  int64_t nd = 0;
  int64_t size[8] = {};
  int64_t st[3][8] = {};
  int64_t narrow = 0;  // 1: every index fits in 32 bits (the kernels divide in 32 bits)
};

// `sizes` with the operands' strides (up to 3), coalesced as kernels/cpu's nd_for does (size-1
// dims dropped, dims contiguous for every operand merged; row-major order is kept). At most
// 8 dims remain: run_device_op takes only shapes with at most 8 dims of size > 1.
Geom make_geom(const std::vector<int64_t>& sizes, const std::vector<std::vector<int64_t>>& st) {
  Geom g;
  int64_t nd = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    bool merge = nd > 0;
    for (size_t k = 0; k < st.size() && merge; ++k) merge = g.st[k][nd - 1] == st[k][d] * sizes[d];
    if (merge) {
      g.size[nd - 1] *= sizes[d];
      for (size_t k = 0; k < st.size(); ++k) g.st[k][nd - 1] = st[k][d];
      continue;
    }
    KILN_CHECK(nd < 8, "cuda: device kernels take at most 8 dims");
    g.size[nd] = sizes[d];
    for (size_t k = 0; k < st.size(); ++k) g.st[k][nd] = st[k][d];
    ++nd;
  }
  g.nd = nd;
  int64_t n = 1;
  for (int64_t d = 0; d < nd; ++d) n *= g.size[d];
  g.narrow = n <= int64_t{0xffffffff} ? 1 : 0;
  return g;
}

int64_t numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

// Strides with dim `dim` zeroed (the indexed dim is addressed through the index value).
std::vector<int64_t> without(std::vector<int64_t> st, int64_t dim) {
  st[dim] = 0;
  return st;
}

// A loaded kernel, per (device, instance); compiled and loaded once, outside the map's lock.
struct Loaded {
  std::once_flag once;
  CUfunction fn = nullptr;
};

// NVRTC's output per (compute capability, instance), shared by devices of one architecture.
struct Compiled {
  std::once_flag once;
  std::string image;
};

template <class V, class K>
V& slot(std::map<K, std::unique_ptr<V>>& m, const K& key) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto& p = m[key];
  if (!p) p = std::make_unique<V>();
  return *p;
}

// `shared`: dynamic shared memory the instance's launches use (above 48 KiB it is opted into
// once, when the function is loaded).
CUfunction function(int device, const DeviceKernelInstance& k, const std::string& name, int64_t shared = 0) {
  static std::map<std::pair<int, std::string>, std::unique_ptr<Loaded>> loaded;
  static std::map<std::pair<int, std::string>, std::unique_ptr<Compiled>> compiled;
  Loaded& l = slot(loaded, std::make_pair(device, name));
  std::call_once(l.once, [&] {
    const int cc = compute_capability(device);
    Compiled& c = slot(compiled, std::make_pair(cc, name));
    std::call_once(c.once, [&] {
      // Kept across processes in the JIT's disk cache when there is one (keyed by the source,
      // the architecture, NVRTC's version and options): a warm process compiles nothing.
      const std::string src = kernels::device_kernel_program({k});
      const bool sm90a = kernels::needs_sm90a(k.kernel);
      KILN_CHECK(!sm90a || cc == 90, "cuda: ", name, " runs on compute capability 9.0 alone (device ", device,
                 " has ", cc / 10, ".", cc % 10, ")");
      const std::string key = "cuda-lib;sm_" + std::to_string(cc) + (sm90a ? "a" : "") + ";nvrtc" +
                              std::to_string(nvrtc_version()) + ";" + nvrtc_options_key() + ";" + name + "\n" + src;
      KernelImageStore* store = kernel_image_store();
      if (store && store->read(key, c.image) && !c.image.empty()) return;
      c.image = nvrtc_compile(src, name, cc, nullptr, sm90a);
      if (store) store->write(key, c.image);
    });
    CUmodule mod = nullptr;  // kept for the life of the process
    check(api().module_load_data(&mod, c.image.data()), "cuModuleLoadData");
    check(api().module_get_function(&l.fn, mod, name.c_str()), "cuModuleGetFunction");
    if (shared > 48 * 1024)
      check(api().func_set_attribute(l.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(shared)),
            "cuFuncSetAttribute");
  });
  return l.fn;
}

// Queues instance `k` as a grid of blocks_x x blocks_y blocks of `threads` threads on `device`'s
// stream with arguments `args` (a kernel that checks indices reports into the error record).
template <class... A>
void launch_grid(int device, const DeviceKernelInstance& k, int64_t blocks_x, int64_t blocks_y, int64_t threads,
                 bool checks_indices, A... args) {
  const std::string name = kernels::device_kernel_name(k);
  CUfunction f = function(device, k, name);
  void* params[] = {&args...};
  check(api().launch_kernel(f, static_cast<unsigned>(blocks_x), static_cast<unsigned>(blocks_y), 1,
                            static_cast<unsigned>(threads), 1, 1, 0, enter(device), params, nullptr),
        "cuLaunchKernel");
  note_launch(device, name, checks_indices);
}

// Queues instance `k` over `n` elements (threads, grid-stride beyond 2^20 blocks).
template <class... A>
void launch(int device, const DeviceKernelInstance& k, int64_t n, bool checks_indices, A... args) {
  if (n <= 0) return;
  const int64_t threads = 256, blocks = std::min<int64_t>((n + threads - 1) / threads, int64_t{1} << 20);
  launch_grid(device, k, blocks, 1, threads, checks_indices, args...);
}

// Queues instance `k` as `blocks` blocks of `threads` threads (kernels that split their work by
// block themselves: the radix sort's).
template <class... A>
void launch_blocks(int device, const DeviceKernelInstance& k, int64_t blocks, int64_t threads, A... args) {
  launch_grid(device, k, blocks, 1, threads, false, args...);
}

void* ptr(const Operand& o) { return o.data; }

// ---- fused attention ----

// The kernels' AttnArgs (kernels/cuda/attention_kernels.cpp), field for field.
struct AttnArgs {
  const void* ptr[7] = {};  // q, k, v, mask, fwd, gout, out
  int64_t nb = 0;
  int64_t bsize[6] = {};
  int64_t bst[7][6] = {};
  int64_t rs[7] = {}, cs[7] = {};
  int64_t tq = 0, tk = 0, d = 0, bt = 0;
  int32_t causal = 0, has_mask = 0;
  double scale = 0;
  const void* rng = nullptr;  // dropout: the generator words (kernels/cpu/attention_dropout.h)
  int64_t rng_st = 0;
  double dropout = 0;
  int32_t vec[7] = {};  // per operand: 16-byte loads apply (flash kernels)
  void* work = nullptr;  // flash backward: dO, lse and delta per query row
  int32_t glse = 0;      // backward: gout carries the log-sum-exp's gradient in column d
  int32_t* nonfinite = nullptr;  // 3xTF32 flash kernels: set by flash_scan when an input is not finite
};
constexpr int kAttnQ = 0, kAttnK = 1, kAttnV = 2, kAttnMask = 3, kAttnFwd = 4, kAttnGout = 5, kAttnOut = 6;
// Rows per block and threads per row of a head-size bucket (the kernels' Shape<DM>).
int64_t attn_rows(int head) { return 4096 / std::max(head, 64); }
int64_t attn_split(int head) { return head / 16; }

// Sets operand `k` of `a` from `o`, whose dims are the batch dims then two more (the mask:
// broadcast to [batch..., tq, tk] first).
void attn_operand(AttnArgs& a, int k, const Operand& o, const std::vector<int64_t>& full) {
  const std::vector<int64_t> st = k == kAttnMask ? o.broadcast_strides(full) : o.strides;
  const size_t r = st.size();
  a.ptr[k] = o.data;
  for (size_t d = 0; d + 2 < r; ++d) a.bst[k][d] = st[d];
  a.rs[k] = st[r - 2];
  a.cs[k] = st[r - 1];
}

bool tiled(DeviceKernel k) {
  return k == DeviceKernel::AttentionForwardTiled || k == DeviceKernel::AttentionBackwardQTiled ||
         k == DeviceKernel::AttentionBackwardKVTiled;
}

// Shared memory of a launch (the kernels' layouts).
int64_t attn_shared(DeviceKernel k, int head, int64_t item, int64_t bt) {
  const int64_t tile = 64 * (head + 4), scores = 64 * 68;
  switch (k) {
    case DeviceKernel::AttentionForwardTiled: return (3 * tile + scores + 3 * 64) * 4;
    case DeviceKernel::AttentionBackwardQTiled: return (4 * tile + scores + 2 * 64) * 4;
    case DeviceKernel::AttentionBackwardKVTiled: return (4 * tile + 2 * scores + 2 * 64) * 4;
    case DeviceKernel::AttentionBackwardKV: return 2 * bt * head * item + 2 * bt * item;
    default: return 2 * bt * head * item;
  }
}

// Queues attention kernel `k` with `a`: a grid of (batch, ceil(rows / per), parts) blocks of
// `threads` threads and `shared` bytes of dynamic shared memory (an instance's shared memory
// depends only on the instance: opted into once, at load).
void launch_attention(int device, const DeviceKernelInstance& k, const AttnArgs& a, int64_t batch, int64_t rows,
                      int64_t per, int parts, int64_t threads, int64_t shared) {
  if (batch == 0 || rows == 0) return;
  const std::string name = kernels::device_kernel_name(k);
  CUfunction f = function(device, k, name, shared);
  AttnArgs args = a;
  void* params[] = {&args};
  check(api().launch_kernel(f, static_cast<unsigned>(batch), static_cast<unsigned>((rows + per - 1) / per),
                            static_cast<unsigned>(parts), static_cast<unsigned>(threads), 1, 1,
                            static_cast<unsigned>(shared), enter(device), params, nullptr),
        "cuLaunchKernel");
  note_launch(device, name, false);
}

// Queues a CUDA-core attention kernel over `rows` rows (per block: 64 tiled, else attn_rows) of
// each batch element.
void attn_launch(int device, DeviceKernel kernel, DType dt, int head, const AttnArgs& a, int64_t batch, int64_t rows) {
  const int64_t per = tiled(kernel) ? 64 : attn_rows(head);
  launch_attention(device, {kernel, dt, DType::Int64, head}, a, batch, rows, per, 1,
                   tiled(kernel) ? 256 : per * attn_split(head),
                   attn_shared(kernel, head, static_cast<int64_t>(itemsize(dt)), a.bt));
}

// Whether operand `o` (head size d) takes 16-byte loads: unit column stride, every other stride
// and the address a multiple of 16 bytes.
bool loads_vectors(const Operand& o, int64_t d) {
  const int64_t per = 16 / static_cast<int64_t>(itemsize(o.dtype));  // elements of 16 bytes
  if (d % per != 0 || reinterpret_cast<uintptr_t>(o.data) % 16 != 0) return false;
  const size_t r = o.strides.size();
  if (o.strides[r - 1] != 1 && o.sizes[r - 1] > 1) return false;
  for (size_t i = 0; i + 1 < r; ++i)
    if (o.strides[i] % per != 0 && o.sizes[i] > 1) return false;
  return true;
}

// Whether attention over `dt` inputs with head size d runs on the tensor-core (flash) kernels of
// the device: 16-bit and float32 inputs on sm_80 and later, where their shared memory fits.
bool flash_applies(int device, DType dt, int64_t d) {
  if (!is_half(dt) && dt != DType::Float32) return false;
  if (compute_capability(device) < 80) return false;
  return kernels::flash_most_shared_bytes(kernels::flash_head_bucket(d), static_cast<int64_t>(itemsize(dt))) <=
         max_shared_per_block(device);
}

// Whether attention over `dt` inputs runs on the warpgroup-MMA (wgmma) kernels: compute
// capability 9.0 (H100, H200), 16-bit inputs, head buckets 64 and 128, where they were measured
// faster than the mma.sync ones (the forward at bucket 64 from 2048 keys; docs/BENCHMARKS.md).
bool flash_warpgroup(int device, DType dt, int bucket, DeviceKernel k, int64_t tk) {
  if (compute_capability(device) != 90 || !is_half(dt) || (bucket != 64 && bucket != 128)) return false;
  if (k == DeviceKernel::FlashForwardWarpgroup && bucket == 64 && tk < 2048) return false;
  return kernels::flash_shared_bytes(k, bucket, 2) <= max_shared_per_block(device);
}

// Queues flash kernel `k` (a block per 64 or 128 rows of `rows`, `parts` blocks of gradient
// columns) over each batch element.
void flash_launch(int device, DeviceKernelInstance k, DeviceKernel kernel, const AttnArgs& a, int64_t batch,
                  int64_t rows, int parts) {
  k.kernel = kernel;
  launch_attention(device, k, a, batch, rows, kernels::flash_rows_per_block(kernel, k.head), parts,
                   kernels::flash_threads(kernel),
                   kernels::flash_shared_bytes(kernel, k.head, static_cast<int64_t>(itemsize(k.a))));
}

// Zeroes a flag on the device and queues flash_scan, which sets it when q, k, v or (backward) dO
// hold an infinity or NaN (a.nonfinite: the 3xTF32 kernels take their careful form by it). The
// flag goes back to the caching allocator once its readers are queued (its next user comes after).
std::shared_ptr<Storage> queue_flash_scan(int device, AttnArgs& a, int64_t batch) {
  auto flag = Storage::allocate(sizeof(int32_t), Device{DeviceType::CUDA, device}, "attention workspace");
  check(api().memset_d8_async(reinterpret_cast<CUdeviceptr>(flag->data), 0, sizeof(int32_t), enter(device)),
        "cuMemsetD8Async");
  a.nonfinite = static_cast<int32_t*>(flag->data);
  const int64_t most = std::max(a.tq, a.tk) * a.d, chunks = std::clamp<int64_t>((most + 2047) / 2048, 1, 1024);
  launch_attention(device, {DeviceKernel::FlashScan, DType::Float32, DType::Int64, 32, 3}, a, batch, chunks, 1, 1,
                   kernels::flash_threads(DeviceKernel::FlashScan), 0);
  return flag;
}

// The tensor-core (flash) kernels: the forward, or the backward's work area, dq and dk/dv (in
// their warpgroup forms where flash_warpgroup says). float32 takes TF32 products where
// set_float32_matmul_precision allows them, else 3xTF32, which scans its inputs first and queues
// both forms of each kernel (the scan's answer runs one, the other returns at once).
void flash_attention(int device, AttnArgs& a, bool fwd, DType in_dt, int64_t batch) {
  const int bucket = kernels::flash_head_bucket(a.d);
  const int parts = bucket / kernels::flash_columns(bucket);
  const DeviceKernelInstance k{DeviceKernel::FlashForward, in_dt, DType::Int64, bucket,
                               in_dt != DType::Float32 ? 0 : float32_matmul_allows_tf32() ? 1 : 3};
  std::shared_ptr<Storage> flag;
  if (k.tf32_passes == 3) flag = queue_flash_scan(device, a, batch);
  auto run = [&](DeviceKernel wg, DeviceKernel sync, int64_t rows, int p) {
    const DeviceKernel kernel = flash_warpgroup(device, in_dt, bucket, wg, a.tk) ? wg : sync;
    flash_launch(device, k, kernel, a, batch, rows, p);
    if (k.tf32_passes != 3) return;
    DeviceKernelInstance careful = k;
    careful.careful = true;
    flash_launch(device, careful, kernel, a, batch, rows, p);
  };
  if (fwd) {
    run(DeviceKernel::FlashForwardWarpgroup, DeviceKernel::FlashForward, a.tq, 1);
    return;
  }
  // (the work area goes back to the caching allocator once queued: its next user is queued after these)
  const int64_t work_bytes = kernels::flash_work_bytes(batch, a.tq, bucket, static_cast<int64_t>(itemsize(in_dt)));
  const auto work =
      Storage::allocate(static_cast<size_t>(std::max<int64_t>(1, work_bytes)), Device{DeviceType::CUDA, device},
                        "attention workspace");
  a.work = work->data;
  flash_launch(device, k, DeviceKernel::FlashBackwardPrep, a, batch, a.tq, 1);
  run(DeviceKernel::FlashBackwardQWarpgroup, DeviceKernel::FlashBackwardQ, a.tq, parts);
  run(DeviceKernel::FlashBackwardKVWarpgroup, DeviceKernel::FlashBackwardKV, a.tk, parts);
}

// Attention (forward) or AttentionBackward (dq, then dk and dv) of node n into `out`.
void attention(int device, const Node& n, const Operand& out) {
  const bool fwd = n.op == OpKind::Attention;
  auto in = [&](size_t i) { return kernels::operand_of(*n.inputs[i]); };
  const Operand q = in(0), k = in(1);
  const size_t r = q.sizes.size();
  AttnArgs a;
  a.tq = q.sizes[r - 2];
  a.tk = k.sizes[r - 2];
  a.d = q.sizes[r - 1];
  a.nb = static_cast<int64_t>(r - 2);
  int64_t batch = 1;
  for (size_t d = 0; d + 2 < r; ++d) batch *= (a.bsize[d] = q.sizes[d]);
  std::vector<int64_t> full(q.sizes.begin(), q.sizes.end() - 2);
  full.push_back(a.tq);
  full.push_back(a.tk);
  attn_operand(a, kAttnQ, q, full);
  attn_operand(a, kAttnK, k, full);
  attn_operand(a, kAttnV, in(2), full);
  attn_operand(a, kAttnOut, out, full);
  if (const size_t mask_at = attention_mask_input(n)) {
    attn_operand(a, kAttnMask, in(mask_at), full);
    a.has_mask = 1;
  }
  a.dropout = attention_dropout(n.attrs);
  if (const size_t ri = attention_dropout_input(n)) {
    const Operand rng = in(ri);
    a.rng = rng.data;
    a.rng_st = rng.strides[0];
  }
  if (!fwd) {
    attn_operand(a, kAttnFwd, in(3), full);
    attn_operand(a, kAttnGout, in(4), full);
    a.glse = n.inputs[4]->shape.back().as_int() > a.d;
  }
  a.causal = attention_causal(n.attrs);
  a.scale = attention_scale(n.attrs);
  const DType in_dt = n.inputs[0]->dtype;
  if (flash_applies(device, in_dt, a.d)) {  // the tensor-core kernels
    for (int i : {kAttnQ, kAttnK, kAttnV}) a.vec[i] = loads_vectors(in(static_cast<size_t>(i)), a.d);
    flash_attention(device, a, fwd, in_dt, batch);
    return;
  }
  const int head = kernels::attention_head_bucket(a.d);
  const int64_t item = static_cast<int64_t>(itemsize(n.dtype));
  a.bt =
      std::min<int64_t>(64, 40960 / (2 * head * item)) / 4 * 4;  // (a multiple of 4: the kernels take 4 rows at a time)
  // float32 with heads up to 128: the tiled kernels where their shared memory fits (heads of
  // 128: 120-170 KiB, sm_90's 227 KiB); else (and with dropout) the row kernels.
  const bool tile = n.dtype == DType::Float32 && head <= 128 && a.dropout == 0 &&
                    attn_shared(DeviceKernel::AttentionBackwardKVTiled, head, 4, 0) <= max_shared_per_block(device);
  if (fwd) {
    attn_launch(device, tile ? DeviceKernel::AttentionForwardTiled : DeviceKernel::AttentionForward, n.dtype, head, a,
                batch, a.tq);
  } else {
    attn_launch(device, tile ? DeviceKernel::AttentionBackwardQTiled : DeviceKernel::AttentionBackwardQ, n.dtype, head,
                a, batch, a.tq);
    attn_launch(device, tile ? DeviceKernel::AttentionBackwardKVTiled : DeviceKernel::AttentionBackwardKV, n.dtype,
                head, a, batch, a.tk);
  }
}

// Whether the attention kernels take node n: float32/64 (the CUDA-core kernels) or 16-bit (the
// tensor-core kernels: sm_80 and later, their shared memory within the device's), head size
// 1..256, at most 6 batch dims, rows that fit the grid.
bool attention_handled(const Node& n) {
  if (is_half(n.inputs[0]->dtype)) {
    if (n.dtype != n.inputs[0]->dtype ||
        !flash_applies(n.device.index, n.dtype, n.inputs[0]->shape.back().as_int()))
      return false;
  } else if (n.dtype != DType::Float32 && n.dtype != DType::Float64) {
    return false;
  }
  const Shape& qs = n.inputs[0]->shape;
  const Shape& ks = n.inputs[1]->shape;
  if (qs.size() < 2 || qs.size() > 8) return false;
  const int64_t d = qs.back().as_int(), tq = qs[qs.size() - 2].as_int(), tk = ks[ks.size() - 2].as_int();
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < qs.size(); ++i) batch *= qs[i].as_int();
  const int64_t max_rows = int64_t{65535} * attn_rows(256);
  return d >= 1 && d <= 256 && tq < max_rows && tk < max_rows && batch < (int64_t{1} << 31);
}

// out = in converted to out's dtype, `in` broadcast to out's sizes (the CPU's unary Contiguous).
void copy(int device, const Operand& out, const Operand& in) {
  const Geom g = make_geom(out.sizes, {out.strides, in.broadcast_strides(out.sizes)});
  launch(device, {DeviceKernel::Copy, out.dtype, in.dtype}, numel(out.sizes), false, ptr(out), ptr(in), g,
         numel(out.sizes));
}

// A window of `out` (same dtype) for cat / view_scatter.
Operand window(const Operand& out, std::vector<int64_t> sizes, std::vector<int64_t> strides, int64_t offset) {
  Operand w = out;
  w.sizes = std::move(sizes);
  w.strides = std::move(strides);
  w.data = out.data + offset * static_cast<int64_t>(itemsize(out.dtype));
  return w;
}

// The kernel's CatArgs (kernels/cuda/device_kernels.cpp), field for field.
struct CatPiece {
  const void* src;
  int64_t row, at;
};
struct CatArgs {
  void* out;
  int64_t outer, out_row;
  CatPiece piece[kernels::kCatPieces];
};
static_assert(sizeof(CatArgs) == 24 + 24 * kernels::kCatPieces, "CatArgs as the kernel's");

// cat of node `n`'s inputs along `dim` into the contiguous `out`: pieces of out's dtype laid out
// contiguously go in launches
// of up to kCatPieces (one per row of blocks), in the widest unit that divides every piece's
// row, offset and address; any other piece is a strided copy of its own. 149 gradient norms
// stacked for clip_grad_norm_ were 149 one-element launches; a GPT layer's dq, dk, dv
// (bfloat16 rows of 768 into rows of 2304) three copies of two-byte elements.
void cat(int device, const Operand& out, const Node& n, int64_t dim) {
  const size_t isz = itemsize(out.dtype), dm = static_cast<size_t>(dim);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < dm; ++d) outer *= out.sizes[d];
  for (size_t d = dm + 1; d < out.sizes.size(); ++d) inner *= out.sizes[d];
  const int64_t out_row = out.sizes[dm] * inner;
  std::vector<Operand> pieces;
  for (const NodePtr& in : n.inputs) pieces.push_back(kernels::operand_of(*in));
  struct Dense {
    const Operand* piece;
    int64_t at;  // elements into out's row
  };
  std::vector<Dense> batch;
  auto flush = [&] {
    if (batch.empty()) return;
    uint64_t bits = reinterpret_cast<uintptr_t>(out.data) | static_cast<uint64_t>(out_row * isz);
    for (const Dense& b : batch)
      bits |= reinterpret_cast<uintptr_t>(b.piece->data) | static_cast<uint64_t>(b.piece->numel() / outer * isz) |
              static_cast<uint64_t>(b.at * isz);
    int unit = 16;
    while (bits % static_cast<uint64_t>(unit) != 0) unit /= 2;
    CatArgs a{};
    a.out = out.data;
    a.outer = outer;
    a.out_row = out_row * static_cast<int64_t>(isz) / unit;
    int64_t most = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const int64_t row = batch[i].piece->numel() / outer;
      a.piece[i] = {batch[i].piece->data, row * static_cast<int64_t>(isz) / unit, batch[i].at * static_cast<int64_t>(isz) / unit};
      most = std::max(most, outer * a.piece[i].row);
    }
    const int64_t threads = 256, blocks = std::min<int64_t>((most + threads - 1) / threads, int64_t{1} << 16);
    const DeviceKernelInstance k{DeviceKernel::Cat, DType::Float32, DType::Int64, unit};
    launch_grid(device, k, blocks, static_cast<int64_t>(batch.size()), threads, false, a);
    batch.clear();
  };
  int64_t at = 0;  // along dim
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Operand& src = pieces[i];
    std::vector<int64_t> sz = out.sizes;
    sz[dm] = src.sizes[dm];
    if (src.numel() > 0) {
      const Node& in = *n.inputs[i];
      if (src.dtype == out.dtype && src.sizes == sz && is_contiguous_layout(in.shape, in.strides)) {
        batch.push_back({&src, at * inner});
        if (batch.size() == static_cast<size_t>(kernels::kCatPieces)) flush();
      } else {
        copy(device, window(out, sz, out.strides, at * out.strides[dm]), src);
      }
    }
    at += sz[dm];
  }
  flush();
}

// The gather template: gather (index strides as given) and index_select (index along `dim`).
void gather(int device, OpKind op, const Operand& out, const Operand& x, const Operand& index, int64_t dim) {
  const int64_t size = x.sizes.empty() ? 1 : x.sizes[dim];
  const int64_t xs = x.strides.empty() ? 0 : x.strides[dim];
  std::vector<int64_t> xst = x.strides.empty() ? std::vector<int64_t>(out.sizes.size(), 0) : without(x.strides, dim);
  std::vector<int64_t> ist = index.strides;
  if (op == OpKind::IndexSelect) {
    ist.assign(out.sizes.size(), 0);
    ist[x.sizes.empty() ? 0 : dim] = index.strides[0];
  }
  const Geom g = make_geom(out.sizes, {out.strides, ist, xst});
  const int64_t n = numel(out.sizes);
  launch(device, {DeviceKernel::Gather, out.dtype, index.dtype}, n, true, ptr(out), ptr(x), ptr(index), g, n, xs, size,
         dim, int64_t(op), index_error_record(device));
}

// ---- float scatter_add / index_add in a fixed order ----

// (key, position) pairs on the device, twice (a sort's passes go back and forth), and the radix
// sort's digit counts. Freed after queuing, like scatter's winners: the next user of the memory
// is queued after these kernels.
struct SortBuffers {
  std::shared_ptr<Storage> storage;
  uint64_t* key[2] = {};
  int64_t* pos[2] = {};
  int64_t* hist = nullptr;
  int64_t n = 0, tiles = 0, blocks = 0;
};

// Room for n pairs: blocks of 256 threads take `tiles` tiles of 256 pairs each, at most 1024
// blocks (so the counts, 256 a block, are scanned by one block).
SortBuffers sort_buffers(int device, int64_t n) {
  SortBuffers b;
  b.n = n;
  b.tiles = std::max<int64_t>(1, (n + 256 * 1024 - 1) / (256 * 1024));
  b.blocks = (n + 256 * b.tiles - 1) / (256 * b.tiles);
  const size_t pairs = static_cast<size_t>(n) * 8;
  b.storage = Storage::allocate(4 * pairs + static_cast<size_t>(256 * b.blocks) * 8, Device{DeviceType::CUDA, device},
                                "sort workspace");
  char* p = static_cast<char*>(b.storage->data);
  b.key[0] = reinterpret_cast<uint64_t*>(p);
  b.key[1] = reinterpret_cast<uint64_t*>(p + pairs);
  b.pos[0] = reinterpret_cast<int64_t*>(p + 2 * pairs);
  b.pos[1] = reinterpret_cast<int64_t*>(p + 3 * pairs);
  b.hist = reinterpret_cast<int64_t*>(p + 4 * pairs);
  return b;
}

// Sorts the pairs in buffer 0 by key, stably (equal keys keep their order), keys at most
// max_key: an LSD radix sort, 8 bits a pass, whose counts and places are integers, so the
// result is the same on every run. Returns the buffer holding the result.
int radix_sort(int device, const SortBuffers& b, uint64_t max_key) {
  const int passes = std::max(1, (static_cast<int>(std::bit_width(max_key)) + 7) / 8);
  const DeviceKernelInstance count{DeviceKernel::RadixCount}, scan{DeviceKernel::RadixScan},
      move{DeviceKernel::RadixMove};
  int cur = 0;
  for (int p = 0; p < passes; ++p) {
    const int32_t shift = 8 * p;
    launch_blocks(device, count, b.blocks, 256, b.key[cur], b.n, b.tiles, shift, b.hist);
    launch_blocks(device, scan, 1, 1024, b.hist, 256 * b.blocks);
    launch_blocks(device, move, b.blocks, 256, b.key[cur], b.pos[cur], b.key[1 - cur], b.pos[1 - cur], b.n, b.tiles,
                  shift, b.hist);
    cur = 1 - cur;
  }
  return cur;
}

// Whether scatter_add's index holds the same values across every dim but `dim` (stride 0 or
// size 1 there: an expanded 1-d index, e.g. an embedding gradient written as scatter_add).
bool shared_index(const Operand& index, int64_t dim) {
  for (size_t k = 0; k < index.sizes.size(); ++k)
    if (static_cast<int64_t>(k) != dim && index.sizes[k] != 1 && index.strides[k] != 0) return false;
  return true;
}

// Float scatter_add / index_add without atomics (`out` already holds self; arguments as
// scatter's below): the sources are sorted stably by destination, then each destination adds
// its sources in the CPU's serial order, one thread each (per column for a 1-d index). The
// CPU's sums exactly, with the same bits on every run. A 1-d index (index_add, or an expanded
// scatter_add index) sorts its entries once for all columns; any other index sorts elements.
void ordered_add(int device, OpKind op, const Operand& out, const Operand& index, const Operand& src, int64_t dim,
                 const std::vector<int64_t>& sizes, const std::vector<int64_t>& ost, const Geom& g, int64_t n,
                 int64_t os, int64_t size, CUdeviceptr err) {
  const DType idt = index.dtype;
  if (!sizes.empty() && (op == OpKind::IndexAdd || shared_index(index, dim))) {
    const int64_t len = sizes[dim], cols = n / len;
    const int64_t is = op == OpKind::IndexAdd ? index.strides[0] : index.strides[dim];
    SortBuffers b = sort_buffers(device, len);
    launch(device, {DeviceKernel::IndexKeys, DType::Float32, idt}, len, true, ptr(index), is, len, size, dim,
           int64_t(op), err, b.key[0], b.pos[0]);
    const int r = radix_sort(device, b, static_cast<uint64_t>(size));
    std::vector<int64_t> csz = sizes;
    csz[dim] = 1;  // (dropped: the columns are every other dim)
    const Geom cg = make_geom(csz, {ost, std::vector<int64_t>(sizes.size(), 0), src.strides});
    launch(device, {DeviceKernel::SegmentAddRows, out.dtype}, n, false, ptr(out), ptr(src), b.key[r], b.pos[r], cg, len,
           cols, os, src.strides[dim], size);
    return;
  }
  const uint64_t none = static_cast<uint64_t>(numel(out.sizes));
  SortBuffers b = sort_buffers(device, n);
  launch(device, {DeviceKernel::ScatterKeys, DType::Float32, idt}, n, true, ptr(index), g, n, os, size, dim,
         int64_t(op), err, none, b.key[0], b.pos[0]);
  const int r = radix_sort(device, b, none);
  launch(device, {DeviceKernel::SegmentAddElements, out.dtype}, n, false, ptr(out), ptr(src), b.key[r], b.pos[r], g, n,
         none);
}

// scatter / scatter_add over index's sizes, index_add over src's; `out` already holds self.
void scatter(int device, OpKind op, const Operand& out, const Operand& index, const Operand& src, int64_t dim) {
  const bool index_add = op == OpKind::IndexAdd;
  const std::vector<int64_t>& sizes = index_add ? src.sizes : index.sizes;
  const int64_t size = out.sizes.empty() ? 1 : out.sizes[dim];
  const int64_t os = out.strides.empty() ? 0 : out.strides[dim];
  std::vector<int64_t> ost = out.strides.empty() ? std::vector<int64_t>(sizes.size(), 0) : without(out.strides, dim);
  std::vector<int64_t> ist = index.strides;
  if (index_add) {
    ist.assign(sizes.size(), 0);
    ist[dim] = index.strides[0];
  }
  const Geom g = make_geom(sizes, {ost, ist, src.strides});
  const int64_t n = numel(sizes);
  if (n == 0) return;
  const CUdeviceptr err = index_error_record(device);
  if (op != OpKind::Scatter) {
    if (is_floating(out.dtype))  // (float atomics would add in a different order each run)
      ordered_add(device, op, out, index, src, dim, sizes, ost, g, n, os, size, err);
    else  // integer and bool adds are exact in any order
      launch(device, {DeviceKernel::ScatterAdd, out.dtype, index.dtype}, n, true, ptr(out), ptr(src), ptr(index), g, n,
             os, size, dim, int64_t(op), err);
    return;
  }
  // Duplicate destinations: the last write in the CPU's serial order wins, as there. `win`
  // goes back to the caching allocator after queuing; its next user is queued after these.
  auto win =
      Storage::allocate(static_cast<size_t>(numel(out.sizes)) * sizeof(int64_t), Device{DeviceType::CUDA, device},
                        "scatter workspace");
  check(api().memset_d8_async(reinterpret_cast<CUdeviceptr>(win->data), 0xff, win->nbytes, enter(device)),
        "cuMemsetD8Async");
  launch(device, {DeviceKernel::ScatterClaim, out.dtype, index.dtype}, n, true, ptr(index), g, n, os, size, dim,
         int64_t(op), err, win->data);
  launch(device, {DeviceKernel::ScatterWrite, out.dtype, index.dtype}, n, false, ptr(out), ptr(src), ptr(index), g, n,
         os, size, win->data);
}

// One thread per row (all dims but `dim`), summing sequentially as the CPU does.
void cumsum(int device, const Operand& out, const Operand& in, int64_t dim) {
  std::vector<int64_t> rows = in.sizes;
  const int64_t len = rows[dim];
  rows[dim] = 1;
  const Geom g = make_geom(rows, {out.strides, in.strides});
  if (len > 0)
    launch(device, {DeviceKernel::Cumsum, out.dtype, DType::Int64}, numel(rows), false, ptr(out), ptr(in), g,
           numel(rows), len, in.strides[dim], out.strides[dim]);
}

// Integer remainder / fmod / pow of a and b broadcast to out's sizes; bad values are reported.
void int_binary(int device, OpKind op, const Operand& out, const Operand& a, const Operand& b) {
  const DeviceKernel k = op == OpKind::Remainder ? DeviceKernel::Remainder
                         : op == OpKind::Fmod    ? DeviceKernel::Fmod
                                                 : DeviceKernel::Pow;
  const Geom g = make_geom(out.sizes, {out.strides, a.broadcast_strides(out.sizes), b.broadcast_strides(out.sizes)});
  const int64_t n = numel(out.sizes);
  launch(device, {k, out.dtype}, n, true, ptr(out), ptr(a), ptr(b), g, n, int64_t(op), index_error_record(device));
}

// At most 8 dims of size > 1: then every iteration space below coalesces to at most 8 dims.
bool fits(const Shape& shape) {
  int dims = 0;
  for (const SymInt& s : shape) dims += s.as_int() != 1;
  return dims <= 8;
}

bool handled(const Node& n) {
  switch (n.op) {
    case OpKind::Attention:
    case OpKind::AttentionBackward:
      return attention_handled(n) && is_contiguous_layout(n.shape, n.strides) && have_nvrtc();
    case OpKind::Contiguous:
    case OpKind::Cast:
    case OpKind::Cat:
    case OpKind::ViewScatter:
    case OpKind::Gather:
    case OpKind::Scatter:
    case OpKind::ScatterAdd:
    case OpKind::IndexSelect:
    case OpKind::Cumsum: break;
    case OpKind::IndexAdd:
      if (n.shape.empty()) return false;  // (a 0-d index_add is left to the host)
      break;
    case OpKind::Remainder:
    case OpKind::Fmod:
    case OpKind::Pow:  // integers (and bool pow); float forms are generated kernels
      if (n.dtype != DType::Int32 && n.dtype != DType::Int64 && !(n.op == OpKind::Pow && n.dtype == DType::Bool))
        return false;
      if (n.inputs.size() != 2 || n.inputs[0]->dtype != n.dtype || n.inputs[1]->dtype != n.dtype) return false;
      break;
    default: return false;
  }
  if (!fits(n.shape) || !fits(n.attrs.sizes)) return false;
  for (const NodePtr& in : n.inputs)
    if (!fits(in->shape)) return false;
  return is_contiguous_layout(n.shape, n.strides) && have_nvrtc();
}

}  // namespace

NodePtr dense_copy(const Node& n) {
  if (!fits(n.shape) || !have_nvrtc()) return nullptr;
  NodePtr d = new_node();
  d->dtype = n.dtype;
  d->device = n.device;
  d->shape = n.shape;
  d->strides = contiguous_strides(n.shape);
  d->offset = 0;
  auto storage =
      Storage::allocate(static_cast<size_t>(kiln::numel(n.shape).as_int()) * itemsize(n.dtype), n.device, op_name(n.op));
  Operand out;
  out.dtype = n.dtype;
  out.sizes = concrete(n.shape);
  out.strides = concrete(d->strides);
  out.data = static_cast<char*>(storage->data);
  copy(n.device.index, out, kernels::operand_of(n));
  d->set_storage(std::move(storage));
  return d;
}

std::shared_ptr<Storage> gemm_batch_pointers(Device device, const std::vector<int64_t>& sizes,
                                             const std::vector<std::vector<int64_t>>& strides,
                                             const std::vector<const void*>& bases, size_t itemsize) {
  if (!have_nvrtc()) return nullptr;
  int64_t dims = 0;
  for (int64_t s : sizes) dims += s != 1;
  if (dims > 8) return nullptr;
  std::vector<std::vector<int64_t>> bytes = strides;
  for (auto& st : bytes)
    for (int64_t& x : st) x *= static_cast<int64_t>(itemsize);
  const Geom g = make_geom(sizes, bytes);
  const int64_t n = numel(sizes);
  auto storage = Storage::allocate(static_cast<size_t>(3 * n) * sizeof(uint64_t), device, "matmul workspace");
  auto addr = [](const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); };
  launch(device.index, {DeviceKernel::BatchPointers}, n, false, storage->data, addr(bases[0]), addr(bases[1]),
         addr(bases[2]), g, n);
  return storage;
}

bool run_device_op(Node& n) {
  if (!handled(n)) return false;
  const int device = n.device.index;
  auto storage =
      Storage::allocate(static_cast<size_t>(kiln::numel(n.shape).as_int()) * itemsize(n.dtype), n.device, op_name(n.op));
  Operand out;
  out.dtype = n.dtype;
  out.sizes = concrete(n.shape);
  out.strides = concrete(contiguous_strides(n.shape));
  out.data = static_cast<char*>(storage->data);
  auto in = [&](size_t i) { return kernels::operand_of(*n.inputs[i]); };
  const int64_t dim = n.attrs.ints.empty() ? 0 : n.attrs.ints[0];
  switch (n.op) {
    case OpKind::Contiguous:
    case OpKind::Cast: copy(device, out, in(0)); break;
    case OpKind::Cat: cat(device, out, n, dim); break;
    case OpKind::ViewScatter:
      copy(device, out, in(0));
      copy(device, window(out, concrete(n.attrs.sizes), concrete(n.attrs.strides), n.attrs.offset.as_int()), in(1));
      break;
    case OpKind::Gather:
    case OpKind::IndexSelect: gather(device, n.op, out, in(0), in(1), dim); break;
    case OpKind::Scatter:
    case OpKind::ScatterAdd:
    case OpKind::IndexAdd:
      copy(device, out, in(0));
      scatter(device, n.op, out, in(1), in(2), dim);
      break;
    case OpKind::Cumsum: cumsum(device, out, in(0), dim); break;
    case OpKind::Attention:
    case OpKind::AttentionBackward: attention(device, n, out); break;
    case OpKind::Remainder:
    case OpKind::Fmod:
    case OpKind::Pow: int_binary(device, n.op, out, in(0), in(1)); break;
    default: return false;
  }
  n.set_storage(std::move(storage), false);
  return true;
}

}  // namespace kiln::cu
