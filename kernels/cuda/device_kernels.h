// The CUDA device runtime's kernels for the ops that are not generated (copies, casts, cat,
// view_scatter, indexing, cumsum, integer remainder / fmod / pow): one CUDA C++ template source without includes,
// compiled by NVRTC per instance (a template and its element types) on first use (runtime/cuda/device_ops). No kernel
// adds floats with atomics: a float sum whose order the scheduler picks would change its bits from run to run. Float
// scatter_add / index_add sort the sources by destination (a stable radix sort whose counts are integers) and sum each
// destination in the CPU's order.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"

namespace kiln::kernels {

// The templates. Every one walks up to 8 coalesced dims (sizes and per-operand element strides
// passed by value) with a grid-stride loop; indexing and integer kernels report a bad index or
// value into the device's error record (first error wins) and skip the element.
enum class DeviceKernel {
  Copy,  // out[i] = convert(in[i]) (a: out dtype, b: in dtype)
  // cat of up to kCatPieces pieces contiguous in memory, one launch (head: the bytes a thread
  // moves at once, 1, 2, 4, 8 or 16; a piece's rows are whole units)
  Cat,
  Gather,  // out[i] = x[... idx[i] ...] (gather, index_select; a: data, b: index)
  ScatterAdd,  // out[... idx[i] ...] += src[i] atomically (integer / bool scatter_add, index_add)
  ScatterClaim,  // winner[dest] = max i writing dest (scatter's last-write-wins order; b: index)
  ScatterWrite,  // out[dest] = src[i] where i is dest's winner
  Cumsum,  // one thread per row, sequential in float64 / int64 like the CPU (a: data)
  Remainder,  // integer out[i] = a[i] mod b[i], y's sign; reports division by zero (a: dtype)
  Fmod,  // integer out[i] = a[i] % b[i], x's sign; reports division by zero (a: dtype)
  Pow,  // integer / bool out[i] = a[i] ** b[i]; reports negative exponents (a: dtype)
  // Float scatter_add / index_add, deterministic: (key, position) pairs, sorted stably by key,
  // then one thread per destination summing its sources in position order (the CPU's order).
  IndexKeys,  // key[i] = idx[i] (a 1-d index; size when out of range, reported), pos[i] = i (b: index)
  ScatterKeys,  // key[i] = out offset of element i's destination (numel(out) when bad), pos[i] = i (b: index)
  RadixCount,  // a block's digit counts of its keys (one 8-bit digit of a stable LSD radix sort)
  RadixScan,  // exclusive scan of the [digit][block] counts (one block)
  RadixMove,  // each block's pairs to their place by digit, keeping their order
  SegmentAddRows,  // out[.., key, ..] += src[.., pos, ..] per sorted run of a key, a thread per column (a: data)
  SegmentAddElements,  // out[key] += src[element pos] per sorted run of a key (a: data)
  // A batched GEMM's matrix addresses, one per batch element for c, a and b in turn (u64 byte
  // addresses; batch dims with per-operand byte strides): cuBLAS's pointer-array batch, for
  // operands whose batch dims do not collapse to one stride (heads split out of a projection).
  BatchPointers,
  // Fused attention (kernels/cuda/attention_kernels.h; a: float32/float64, head: bucket).
  AttentionForward,  // packed output rows + log-sum-exp
  AttentionBackwardQ,  // dq rows of the stacked gradient
  AttentionBackwardKV,  // dk and dv rows of the stacked gradient
  // The same three as 64 x 64 tiles (float32, head sizes up to 64; opt into > 48 KiB of shared memory).
  AttentionForwardTiled,
  AttentionBackwardQTiled,
  AttentionBackwardKVTiled,
  // Tensor-core attention (kernels/cuda/flash_kernels.h; a: bfloat16, float16 or float32 with
  // tf32_passes; head: bucket, a multiple of 32; outputs in the input type; sm_80 and later).
  FlashForward,  // output rows + log-sum-exp (16-bit: in pieces, runtime/ir/attention_lse.h)
  FlashBackwardKV,  // dk and dv rows of the stacked gradient
  FlashBackwardQ,  // dq rows
  FlashBackwardPrep,  // the backward's work area: dO, lse, delta per query row
  FlashScan,  // whether q, k, v (and dO) hold an infinity or NaN (a: float32; 3xTF32 picks its form by it)
  // The same on Hopper's warpgroup MMA (a: bfloat16 or float16; head: bucket 64 or 128;
  // compiled for sm_90a, see needs_sm90a; the backward's work area from FlashBackwardPrep).
  FlashForwardWarpgroup,
  FlashBackwardKVWarpgroup,
  FlashBackwardQWarpgroup,
};

// The most pieces one Cat launch takes (its arguments: 24 bytes a piece).
constexpr int kCatPieces = 128;

// One instance: a template and its element types (the ones it does not use are ignored).
struct DeviceKernelInstance {
  DeviceKernel kernel;
  DType a = DType::Float32, b = DType::Int64;
  int head = 0;  // attention kernels: the head-size bucket (32, 64, 128 or 256; flash: 32, 64, ..., 256); Cat: unit bytes
  // float32 flash kernels: tensor-core passes a product takes, 1 (TF32) or 3 (3xTF32,
  // float32-accurate); 0 elsewhere.
  int tf32_passes = 0;
  // 3xTF32: the careful form (each tile checked for infinities and NaN; runs when FlashScan
  // found one, the plain form otherwise).
  bool careful = false;
};

// Whether `k` is one of the CUDA-core attention kernels.
bool is_attention_kernel(DeviceKernel k);
// Whether `k` uses sm_90a's architecture-specific instructions (wgmma): compiled for sm_90a, it
// runs on devices of compute capability 9.0 alone.
bool needs_sm90a(DeviceKernel k);
// The attention kernels' head-size bucket for head size d (1..256): 32, 64, 128 or 256.
int attention_head_bucket(int64_t d);

// The instance's kernel symbol, e.g. "kiln_gather_float32_int64".
std::string device_kernel_name(const DeviceKernelInstance& k);
// The template source followed by an extern "C" kernel per instance (ready for NVRTC).
std::string device_kernel_program(const std::vector<DeviceKernelInstance>& ks);
// Every instance the device runtime may launch (all dtype combinations it handles).
std::vector<DeviceKernelInstance> all_device_kernels();

}  // namespace kiln::kernels
