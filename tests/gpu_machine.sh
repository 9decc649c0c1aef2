#!/usr/bin/env bash
# Runs kiln's suites and benchmarks on a GPU machine from binaries built here.
#
#   tests/gpu_machine.sh pack [BUILD]   (here) packs BUILD's (default build/) test and benchmark
#                                       programs, kiln-run, libkiln, the libraries a bare Ubuntu GPU
#                                       host lacks (TBB, oneDNN, SLEEF, Gloo) and ../shared's corpora into
#                                       .carry/kiln-gpu.tar.xz (git-ignored; name .carry in carry)
#   tests/gpu_machine.sh unpack         (there) unpacks it to .carry/gpu and ../shared
#   tests/gpu_machine.sh suite OUTDIR   (there) every test program once with KILN_TEST_DEVICE=cuda,
#                                       its log in OUTDIR, one summary line a program
#   tests/gpu_machine.sh cpu-suite OUTDIR  (there) the same as CPU tests (no KILN_TEST_DEVICE): the
#                                       suite on the GPU host's processor (another vendor than here)
#   tests/gpu_machine.sh env            (there) prints the exports the programs need (eval it)
#
# The programs find their child programs next to themselves, so they run from any directory.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARRY="$ROOT/.carry"
cmd=${1:-}

case "$cmd" in
  pack)
    build=$(cd "${2:-$ROOT/build}" && pwd)
    stage=$(mktemp -d)
    mkdir -p "$stage/gpu/tests" "$stage/gpu/bench" "$stage/gpu/examples" "$stage/gpu/lib" "$stage/shared"
    for f in "$build"/tests/*; do [ -f "$f" ] && [ -x "$f" ] && cp "$f" "$stage/gpu/tests/"; done
    for f in "$build"/bench/*; do [ -f "$f" ] && [ -x "$f" ] && cp "$f" "$stage/gpu/bench/"; done
    cp "$build"/examples/kiln-run "$stage/gpu/examples/"
    cp -L "$build"/libkiln.so.0 "$stage/gpu/lib/"
    # (Gloo and what it links: hiredis, ibverbs and netlink, absent on the GPU host)
    for l in libtbb.so.12 libsleefgnuabi.so.3 libdnnl.so.2 libgloo.so.0 libhiredis.so.0.14 libibverbs.so.1 \
             libnl-route-3.so.200 libnl-3.so.200; do
      p=$(ldconfig -p | awk -v l="$l" '$1 == l && !f {print $NF; f = 1}')  # (no early exit: ldconfig would get SIGPIPE)
      [ -n "$p" ] && cp -L "$p" "$stage/gpu/lib/$l"
    done
    # A Redis server for the two-node runs (tests/two_nodes.sh), with the libraries Ubuntu lacks.
    mkdir -p "$stage/gpu/bin"
    if command -v redis-server >/dev/null; then
      cp -L "$(command -v redis-server)" "$stage/gpu/bin/"
      for l in liblzf.so.1 libjemalloc.so.2; do
        p=$(ldconfig -p | awk -v l="$l" '$1 == l && !f {print $NF; f = 1}')
        [ -n "$p" ] && cp -L "$p" "$stage/gpu/lib/$l"
      done
    fi
    cp -r "$ROOT/../shared/torch-parity" "$ROOT/../shared/torch-programs" "$stage/shared/"
    strip --strip-unneeded "$stage"/gpu/tests/* "$stage"/gpu/bench/* "$stage"/gpu/examples/* "$stage"/gpu/lib/* 2>/dev/null || true
    mkdir -p "$CARRY"
    tar -C "$stage" -cf - gpu shared | xz -T2 -6 > "$CARRY/kiln-gpu.tar.xz"
    rm -rf "$stage"
    ls -la "$CARRY/kiln-gpu.tar.xz"
    ;;
  unpack)
    rm -rf "$CARRY/gpu"
    xz -dc "$CARRY/kiln-gpu.tar.xz" | tar -C "$CARRY" -xf - gpu
    mkdir -p "$ROOT/../shared"
    xz -dc "$CARRY/kiln-gpu.tar.xz" | tar -C "$ROOT/.." -xf - shared
    ;;
  env)
    echo "export LD_LIBRARY_PATH=$CARRY/gpu/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    echo "export KILN_SOURCE_DIR=$ROOT KILN_REQUIRE_PARITY=1"
    ;;
  suite|cpu-suite)
    out=${2:?usage: gpu_machine.sh suite|cpu-suite OUTDIR}
    mkdir -p "$out"
    eval "$("$0" env)"
    if [ "$cmd" = suite ]; then export KILN_TEST_DEVICE=cuda; else unset KILN_TEST_DEVICE; fi
    # Test programs on the GPU; the child programs start from their parents.
    progs=()
    for f in "$CARRY"/gpu/tests/test_*; do progs+=("$f"); done
    run_one() {
      local f=$1 out=$2 name t0 rc
      name=$(basename "$f")
      t0=$(date +%s)
      set +e
      KILN_CACHE_DIR=$(mktemp -d) timeout "${TEST_TIMEOUT:-900}" "$f" --gtest_brief=1 > "$out/$name.log" 2>&1
      rc=$?
      set -e
      local tests
      tests=$(grep -Eo '\[==========\] [0-9]+ tests? from' "$out/$name.log" | tail -1 | grep -Eo '[0-9]+' | head -1)
      echo "$name rc=$rc tests=${tests:-?} skipped=$(grep -c '^\[  SKIPPED \]' "$out/$name.log") failed=$(grep -c '^\[  FAILED  \]' "$out/$name.log") $(( $(date +%s) - t0 ))s"
    }
    export -f run_one
    printf '%s\n' "${progs[@]}" | xargs -P "${JOBS:-4}" -I{} bash -c 'run_one "$@"' _ {} "$out" | sort | tee "$out/summary.txt"
    ! grep -v ' rc=0 ' "$out/summary.txt"
    ;;
  *)
    sed -n '2,15p' "$0"; exit 2 ;;
esac
