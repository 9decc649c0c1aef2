#!/usr/bin/env bash
# kiln's one entry point on a fresh Debian 12 machine:
#   ./setup.sh demo   install what is missing, build (Release), run the particles demo
#   ./setup.sh test   install what is missing, build (Release), run the whole test suite
set -euo pipefail
cd "$(dirname "$0")"
mode=${1:-demo}
build=${KILN_BUILD_DIR:-build}

packages=(build-essential cmake ninja-build pkg-config libtbb-dev libopenblas-dev libgtest-dev
          libbenchmark-dev xtensor-dev xtl-dev nlohmann-json3-dev llvm-16-dev libsleef-dev
          libasmjit-dev libdnnl2 libgloo-dev redis-server)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

jobs=$(nproc)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$jobs"

case "$mode" in
  demo)
    "$build/examples/particles"
    ;;
  test)
    # In CI the torch-parity corpus (../shared) must be present; locally a missing corpus skips.
    if [ "${CI:-}" = true ] || [ -f ../shared/torch-parity/torch_parity.jsonl ]; then export KILN_REQUIRE_PARITY=1; fi
    ctest --test-dir "$build" --output-on-failure -j "$jobs"
    ;;
  *)
    echo "usage: $0 demo|test" >&2
    exit 2
    ;;
esac
