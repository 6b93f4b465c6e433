#!/usr/bin/env bash
# Compiles the TensorRT layer against every TensorRT header set in
# ../shared/third_party/tensorrt/<version>/include, warnings as errors, and
# fails on any compile error. Run by scripts/test.sh; a checkout without that
# folder (a user's) skips it.
#   11.1: the whole runtime with TensorRT on (runtime/build-tensorrt-11.1,
#         libet_trt_plugin.so included) and its ctest suite, but the blob
#         reader's corruption run and the unit tests, which runtime/build's
#         suite runs (they include no TensorRT header).
#   others (10.16, 10.3): the delegate and the plugin library (CMake target et_trt_tensorrt_layer:
#         every source that includes a TensorRT header, checked against 11.1's build where there
#         is one); the runner, the launcher check and the kernels' C ABI library include none.
#   ./scripts/build_tensorrt_layers.sh [--build-only] [VERSION...]
# VERSIONs limit it to those header sets; --build-only runs no ctest (scripts/setup.sh
# builds 11.1 so, with the flags test.sh builds it with, so test.sh does not build it again).
# ET_TRT_TENSORRT_HEADERS moves the folder.
set -euo pipefail
cd "$(dirname "$0")/.."

# Fails naming a source 11.1's whole build compiled with a TensorRT header that $1 (et_trt_tensorrt_layer) did not.
check_trt_targets() {
  local full=runtime/build-tensorrt-$full_version dep
  [ -d "$full" ] || return 0
  for dep in $(grep -rl --include='*.o.d' NvInfer.h "$full" | grep -v "^$full/tests/"); do
    [ -f "$1/${dep#"$full"/}" ] || {
      echo "build_tensorrt_layers.sh: $(basename "${dep%.o.d}") includes a TensorRT header but is not built by" \
        "et_trt_tensorrt_layer (runtime/CMakeLists.txt): add its target there" >&2
      return 1
    }
  done
}
run_ctest=1
if [ "${1:-}" = --build-only ]; then
  run_ctest=0
  shift
fi
headers=${ET_TRT_TENSORRT_HEADERS:-../shared/third_party/tensorrt}
full_version=11.1
if [ ! -d "$headers" ]; then
  echo "build_tensorrt_layers.sh: no TensorRT headers at $headers; the TensorRT layer is not compiled"
  exit 0
fi
for include in "$headers"/*/include; do
  version=$(basename "$(dirname "$include")")
  if [ $# -gt 0 ] && [[ " $* " != *" $version "* ]]; then
    continue
  fi
  build=runtime/build-tensorrt-$version
  echo "== TensorRT $version headers: $build"
  args=(--build-dir "$build" -DET_TRT_WERROR=ON -DET_TRT_TENSORRT_INCLUDE_DIR="$(cd "$include" && pwd)")
  if [ "$version" = "$full_version" ]; then
    ./scripts/build_runtime.sh "${args[@]}" -DET_TRT_CORRUPTION_TEST=OFF -DET_TRT_UNIT_TESTS=OFF
    if [ "$run_ctest" = 1 ]; then
      .venv/bin/ctest --test-dir "$build" -j"$(nproc)" --output-on-failure
    fi
  else
    ./scripts/build_runtime.sh --only et_trt_tensorrt_layer "${args[@]}" -DET_TRT_BUILD_TESTS=OFF
    check_trt_targets "$build"
  fi
done
