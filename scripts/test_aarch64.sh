#!/usr/bin/env bash
# The runtime for aarch64 (Jetson Orin and Thor), cross-built here and its
# ctest suite run under qemu-aarch64: gtest, the corruption run, the runner on
# the example .pte and on a program with no delegate. Run by scripts/test.sh.
#   runtime/build-aarch64-tensorrt-10.3: with the TensorRT 10.3 headers (JetPack 6,
#     Orin) of ../shared/third_party/tensorrt (ET_TRT_TENSORRT_HEADERS moves it),
#     warnings as errors: the whole runtime and its whole suite. Where those headers
#     are missing, runtime/build-aarch64 without TensorRT instead (what differs without
#     TensorRT, the delegate's refusal, is runtime/build's natively).
#   runtime/build-aarch64-tensorrt-11.1 (the newest major): the TensorRT layer only
#     (et_trt_tensorrt_layer): its suite is the same tests as 10.3's here and as
#     runtime/build-tensorrt-11.1's natively (build_tensorrt_layers.sh).
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

# Builds one configuration (build_runtime.sh's arguments after the first two).
build() {
  local dir=$1 what=$2
  shift 2
  echo "== aarch64 $what: $dir" | tee -a "$log"
  ./scripts/build_runtime.sh --target aarch64 --build-dir "$dir" "$@" >>"$log" 2>&1 ||
    fail "the aarch64 build $dir failed"
}

# Builds one configuration and runs its tests under qemu-aarch64.
suite() {
  build "$@"
  local build=$1 started=$SECONDS
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

headers=${ET_TRT_TENSORRT_HEADERS:-../shared/third_party/tensorrt}
include=$headers/10.3/include
if [ -d "$include" ]; then
  # ON named: an earlier checkout's build folder has them OFF in its CMake cache.
  suite runtime/build-aarch64-tensorrt-10.3 "with TensorRT 10.3 headers" -DET_TRT_WERROR=ON \
    -DET_TRT_TENSORRT_INCLUDE_DIR="$(cd "$include" && pwd)" -DET_TRT_CORRUPTION_TEST=ON -DET_TRT_UNIT_TESTS=ON
else
  echo "test_aarch64.sh: no TensorRT 10.3 headers at $include; built without TensorRT"
  suite runtime/build-aarch64 "without TensorRT"
fi
include=$headers/11.1/include
if [ -d "$include" ]; then
  build runtime/build-aarch64-tensorrt-11.1 "with TensorRT 11.1 headers" --only et_trt_tensorrt_layer \
    -DET_TRT_WERROR=ON -DET_TRT_TENSORRT_INCLUDE_DIR="$(cd "$include" && pwd)" -DET_TRT_BUILD_TESTS=OFF
else
  echo "test_aarch64.sh: no TensorRT 11.1 headers at $include; that build is skipped"
fi
