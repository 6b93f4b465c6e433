#!/usr/bin/env bash
# Configures and builds runtime/ (libet_trt_runtime.so, et_trt_runner, tests)
# against the ExecuTorch wheel in .venv.
#   ./scripts/build_runtime.sh [--build-dir DIR] [CMAKE_ARGS...]
# DIR defaults to runtime/build. CMAKE_ARGS go to CMake's configure step,
# e.g. -DET_TRT_TENSORRT_INCLUDE_DIR=/path/to/TensorRT/include.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=runtime/build
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=${2:?--build-dir needs a folder}; shift 2 ;;
    *) break ;;
  esac
done

et_dir=$(.venv/bin/python -c 'import executorch; print(list(executorch.__path__)[0])')
.venv/bin/cmake -S runtime -B "$build_dir" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$et_dir" -DPython3_EXECUTABLE="$PWD/.venv/bin/python" "$@"
.venv/bin/cmake --build "$build_dir" -j"$(nproc)"
