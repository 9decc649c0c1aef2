#!/usr/bin/env bash
# Builds and runs the consumer project. Usage: check.sh find_package|add_subdirectory SRC BUILD
set -euo pipefail
mode=$1 src=$2 build=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [ "$mode" = find_package ]; then
  cmake --install "$build" --prefix "$work/prefix" >/dev/null
  cmake -S "$src/tests/consumer" -B "$work/b" "${gen[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
else
  cmake -S "$src/tests/consumer" -B "$work/b" "${gen[@]}" -DKILN_SOURCE="$src" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$work/b" -j 2 >/dev/null
"$work/b/consumer"
