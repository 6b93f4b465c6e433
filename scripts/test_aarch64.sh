#!/usr/bin/env bash
# The runtime for aarch64 (Jetson Orin and Thor), cross-built here and its
# ctest suite run under qemu-aarch64: gtest, the corruption run, the runner on
# the example .pte and on a program with no delegate. Run by scripts/test.sh.
#   runtime/build-aarch64: ./scripts/build_runtime.sh --target aarch64, no TensorRT
#   runtime/build-aarch64-tensorrt-<v>: with the TensorRT <v> headers of
#     ../shared/third_party/tensorrt (ET_TRT_TENSORRT_HEADERS moves it), warnings
#     as errors: 10.3 (JetPack 6, Orin) and 11.1 (the newest major); the blob
#     reader's corruption run and the unit tests (no TensorRT header in them) are
#     runtime/build-aarch64's
# Prints each suite's summary; the whole output goes to runtime/build-aarch64.log.
# Skipped, saying why, where the cross toolchain is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(uname -m)" = aarch64 ]; then
  echo "test_aarch64.sh: skipped: this machine is aarch64, so runtime/build is the aarch64 build (tested natively)"
  exit 0
fi
missing=()
for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "test_aarch64.sh: skipped: no ${missing[*]} here (./scripts/system_packages.sh installs the aarch64 cross" \
    "toolchain and qemu-user on x86-64 Debian/Ubuntu)"
  exit 0
fi

log=runtime/build-aarch64.log
: >"$log"
fail() {
  tail -n 60 "$log"
  echo "test_aarch64.sh: $1 (log: $log)" >&2
  exit 1
}

# Builds one configuration and runs its tests under qemu-aarch64.
suite() {
  local build=$1 what=$2
  shift 2
  echo "== aarch64 $what: $build" | tee -a "$log"
  ./scripts/build_runtime.sh --target aarch64 --build-dir "$build" "$@" >>"$log" 2>&1 ||
    fail "the aarch64 build $build failed"
  local started=$SECONDS
  .venv/bin/ctest --test-dir "$build" -j"$(nproc)" --output-on-failure >"$build/ctest.log" 2>&1 || {
    cat "$build/ctest.log" >>"$log"
    fail "the aarch64 tests of $build failed under qemu-aarch64"
  }
  cat "$build/ctest.log" >>"$log"
  echo "   ctest under qemu-aarch64 ($((SECONDS - started)) s): $(grep 'tests passed' "$build/ctest.log")"
  # What the corruption run mutated (or left to the native run, for its size), where it was built.
  if ! grep -q "^ET_TRT_CORRUPTION_TEST:BOOL=OFF" "$build/CMakeCache.txt"; then
    grep -hE 'raw mutants|skipped, over' "$build/Testing/Temporary/LastTest.log" | sed "s|^$PWD/||; s|^|   |"
  fi
}

suite runtime/build-aarch64 "without TensorRT"
headers=${ET_TRT_TENSORRT_HEADERS:-../shared/third_party/tensorrt}
for version in 10.3 11.1; do
  include=$headers/$version/include
  if [ ! -d "$include" ]; then
    echo "test_aarch64.sh: no TensorRT $version headers at $include; that build is skipped"
    continue
  fi
  suite "runtime/build-aarch64-tensorrt-$version" "with TensorRT $version headers" -DET_TRT_WERROR=ON \
    -DET_TRT_TENSORRT_INCLUDE_DIR="$(cd "$include" && pwd)" -DET_TRT_CORRUPTION_TEST=OFF -DET_TRT_UNIT_TESTS=OFF
done
