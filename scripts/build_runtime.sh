#!/usr/bin/env bash
# Configures and builds runtime/ (libet_trt_runtime.so, et_trt_runner, tests)
# against the ExecuTorch wheel in .venv. Extra arguments go to CMake's
# configure step, e.g. -DET_TRT_TENSORRT_INCLUDE_DIR=/path/to/TensorRT/include.
set -euo pipefail
cd "$(dirname "$0")/.."
ET_DIR=$(.venv/bin/python -c 'import executorch; print(list(executorch.__path__)[0])')
.venv/bin/cmake -S runtime -B runtime/build -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$ET_DIR" -DPython3_EXECUTABLE="$PWD/.venv/bin/python" "$@"
.venv/bin/cmake --build runtime/build -j"$(nproc)"
