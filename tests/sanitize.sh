#!/usr/bin/env bash
# Builds the suite with sanitizers and runs it.
#
#   tests/sanitize.sh [asan|tsan|all] ["test_core test_ops ..."]
#
#   asan: build-asan/ with AddressSanitizer + UndefinedBehaviorSanitizer (float-cast-overflow
#         included, every UB report fatal), then the whole ctest suite there; or, given test
#         programs, only those are built and each runs twice, as ctest runs them (the default
#         executor, then KILN_JIT=interp).
#   tsan: build-tsan/ with ThreadSanitizer, then the threaded tests (test_threads, the JIT's
#         JitConcurrency tests) on every executor.
#   all (default): both.
#
# Environment: JOBS (build and ctest parallelism, default 2), BUILD_TYPE (default
# RelWithDebInfo: optimized, with line numbers in reports).
#
# TSan and TBB: TBB (kernel threads, the JIT's background compiler) is not instrumented, so
# TSan does not see the synchronization inside it. Two measures:
# - kiln's TBB loops all go through kernels/cpu/parallel.h, which under TSan annotates TBB's fork
#   and join (__tsan_release/__tsan_acquire): what the caller did before a parallel loop
#   happens-before each body, each body happens-before what the caller does after the loop.
#   So a race between a kernel body and ordinary code is reported, and fails the run.
# - Reports fully inside TBB's own code are let pass: both racing accesses' innermost frames
#   (past libstdc++ and memcpy/new/delete-like runtime frames) are TBB code, i.e. TBB's
#   task objects, allocator and the body copies its header templates make, whose reuse across
#   threads goes through uninstrumented TBB. A TSan suppressions file cannot state that rule
#   (TSan suppresses a report when a pattern matches either access's stack), so there is
#   none: the run prints every report and check_tsan_log below applies the rule, failing on
#   any other (a kernel body's own accesses are kiln frames, so they are never let pass).
#   TSan sometimes cannot restore the older access's stack ("[failed to restore the stack]":
#   its history is bounded); such a report is let pass only when the access it kept is TBB
#   code, and each one is listed (seen: TBB's execute reading a task object's affinity slot or
#   context that TBB's allocator had cleared for another thread, the same pair the full reports
#   show with both stacks).
set -euo pipefail

mode=${1:-all}
programs=${2:-}
src=$(cd "$(dirname "$0")/.." && pwd)
jobs=${JOBS:-2}
build_type=${BUILD_TYPE:-RelWithDebInfo}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

configure() {  # configure DIR FLAGS
  cmake -S "$src" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" "${launcher[@]}" \
    -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_EXAMPLES=OFF \
    -DCMAKE_CXX_FLAGS="$2 -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="$2" -DCMAKE_SHARED_LINKER_FLAGS="$2" >/dev/null
}

run_asan() {
  local dir="$src/build-asan"
  echo "== ASan+UBSan: $dir"
  configure "$dir" "-fsanitize=address,undefined -fsanitize=float-cast-overflow -fno-sanitize-recover=undefined"
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
  if [[ -z "$programs" ]]; then
    nice -n 10 cmake --build "$dir" -j "$jobs"
    # consumer_find_package links the installed (sanitized) libkiln into a plain program, which
    # ASan refuses ("runtime does not come first"); it runs in the ordinary suite.
    (cd "$dir" && ctest -j "$jobs" --output-on-failure --timeout 3600 -E '^consumer_find_package$')
    return
  fi
  local extra=()
  [[ " $programs " == *" test_jit "* ]] && extra=(jit_cache_child)
  nice -n 10 cmake --build "$dir" -j "$jobs" --target $programs "${extra[@]}"
  local p status=0
  for p in $programs; do
    echo "   $p"
    (cd "$dir/tests" && KILN_SOURCE_DIR="$src" KILN_CACHE_DIR="$dir/kiln-cache" "./$p" >"$dir/$p.log" 2>&1) ||
      { status=1; tail -40 "$dir/$p.log"; }
    echo "   $p (KILN_JIT=interp)"
    (cd "$dir/tests" && KILN_SOURCE_DIR="$src" KILN_JIT=interp "./$p" >"$dir/$p.interp.log" 2>&1) ||
      { status=1; tail -40 "$dir/$p.interp.log"; }
    grep -hE '^\[  (PASSED|FAILED) ' "$dir/$p.log" "$dir/$p.interp.log" | sed 's/^/     /'
  done
  return $status
}

# Fails on any TSan report in log $1 unless it is a data race whose two access stacks both have
# TBB code as innermost frame (a TBB header or libtbb; frames in libstdc++ headers and runtime
# frames such as memcpy or operator delete skipped).
# Prints how many it let pass.
check_tsan_log() {
  awk '
    function fn(line) { sub(/^ *#[0-9]+ /, "", line); return line }
    /^WARNING: ThreadSanitizer:/ { inrep = 1; nstack = 0; cur = 0; tbb[1] = tbb[2] = lost[1] = lost[2] = 0; race = ($0 ~ /data race/); next }
    inrep && /^  (Write|Read|Atomic|Previous)/ { if (nstack < 2) { cur = ++nstack; top[cur] = "" } else cur = 0; next }
    inrep && /^  [A-Z]/ { cur = 0; next }
    inrep && cur && top[cur] == "" && /\[failed to restore the stack\]/ { lost[cur] = 1; next }
    inrep && cur && top[cur] == "" && /^ *#[0-9]+ / {
      f = fn($0)
      if (f ~ /^(__tsan|__interceptor|__sanitizer|memcpy|memmove|memset|free|malloc|operator new|operator delete)/ ||
          f ~ /\/usr\/include\/c\+\+\//) next
      top[cur] = f; tbb[cur] = (f ~ /\/(oneapi\/)?tbb\/[^ ]*:[0-9]+ / || f ~ /\(libtbb[^ ]*\+0x[0-9a-f]+\)$/); next }
    inrep && /^SUMMARY: ThreadSanitizer/ {
      if (race && tbb[1] && tbb[2]) ++ok
      else if (race && tbb[1] && lost[2]) { ++gone; print "   let pass (TBB side, other stack lost): " $0 }
      else { ++bad; print "   unsuppressed: " $0; print "     access 1: " substr(top[1], 1, 160); print "     access 2: " substr(top[2], 1, 160) }
      inrep = 0; next }
    END { printf "   TSan reports: %d inside TBB on both sides (let pass), %d inside TBB on the side TSan kept (let pass, listed), %d others\n", ok, gone, bad; exit bad > 0 }
  ' "$1"
}

run_tsan() {
  local dir="$src/build-tsan"
  echo "== TSan: $dir"
  configure "$dir" "-fsanitize=thread"
  nice -n 10 cmake --build "$dir" -j "$jobs" --target test_threads test_jit jit_cache_child
  local log="$dir/tsan.log" reports="$dir/tsan-reports.log" status=0 jit
  : >"$log"
  rm -f "$dir"/tsan-report.*
  for jit in tiered llvm asmjit interp; do
    echo "   KILN_JIT=$jit"
    # report_signal_unsafe=0: LLVM's crash handlers; history_size: deeper stacks for old accesses.
    # log_path: reports of every process (the JIT tests' child processes too, whose output the
    # tests parse) go to files, checked below; exitcode=0: the rule below decides, not TSan.
    KILN_JIT=$jit KILN_SOURCE_DIR="$src" KILN_CACHE_DIR="$dir/kiln-cache" \
      TSAN_OPTIONS="halt_on_error=0:history_size=7:report_signal_unsafe=0:second_deadlock_stack=1:exitcode=0:log_path=$dir/tsan-report" \
      "$dir/tests/test_threads" >>"$log" 2>&1 || status=1
    KILN_JIT=$jit KILN_SOURCE_DIR="$src" KILN_CACHE_DIR="$dir/kiln-cache" \
      TSAN_OPTIONS="halt_on_error=0:history_size=7:report_signal_unsafe=0:second_deadlock_stack=1:exitcode=0:log_path=$dir/tsan-report" \
      "$dir/tests/test_jit" --gtest_filter='JitConcurrency.*' >>"$log" 2>&1 || status=1
  done
  grep -E '^\[  (PASSED|FAILED) ' "$log" | sort | uniq -c
  cat "$dir"/tsan-report.* >"$reports" 2>/dev/null || : >"$reports"
  check_tsan_log "$reports" || status=1
  echo "   test output: $log; TSan reports: $reports"
  return $status
}

case "$mode" in
  asan) run_asan ;;
  tsan) run_tsan ;;
  all) run_asan && run_tsan ;;
  *) echo "usage: $0 [asan|tsan|all] [\"test_core test_ops ...\"]" >&2; exit 2 ;;
esac
