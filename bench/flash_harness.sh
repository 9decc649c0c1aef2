#!/usr/bin/env bash
# Builds bench/flash_harness.cu: the tensor-core attention kernels (kernels/cuda/flash_kernels.cpp,
# the CUDA source kiln hands NVRTC) compiled by nvcc for sm_90a with a small host program around
# them, to check and time a kernel change on one GPU in seconds, without the rest of kiln.
#
#   bench/flash_harness.sh [BIN]     build (here: nvcc needs no GPU); default build/bench/flash_harness
#   BIN check | time | prof D CAUSAL T     (there; see bench/flash_harness.cu)
#
# The binary needs only the CUDA runtime: carry it to the GPU host in the working tree.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${1:-$ROOT/build/bench/flash_harness}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
HOST_SRC=("$ROOT"/kernels/cuda/{device,flash,attention}_kernels.cpp "$ROOT"/runtime/core/{dtype,error}.cpp)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The kernels' CUDA source, exactly as the device runtime builds its programs from it.
g++ -std=c++20 -I"$ROOT" -o "$tmp/print_source" -x c++ - "${HOST_SRC[@]}" <<'CPP'
#include <cstdio>
#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/flash_kernels.h"
int main() {
  std::fputs(kiln::kernels::attention_common_source(), stdout);
  std::fputs(kiln::kernels::flash_kernel_source(), stdout);
}
CPP
"$tmp/print_source" > "$tmp/flash_source.cuh"
mkdir -p "$(dirname "$BIN")"
# (--fmad=false: NVRTC's option in runtime/cuda/nvrtc.cpp, so the harness times the same code)
"$NVCC" -std=c++20 -O3 --fmad=false -gencode arch=compute_90a,code=sm_90a -I"$ROOT" -I"$tmp" -o "$BIN" \
  "$ROOT/bench/flash_harness.cu" "${HOST_SRC[@]}"
echo "$BIN"
