#!/usr/bin/env bash
# Runs every test: the C++ runtime's (through ctest, driven by pytest) and
# the Python ones, the TensorRT layer built against TensorRT's headers where
# ../shared has them, and the runtime cross-built for aarch64 with its C++
# tests under qemu-aarch64 where the cross toolchain is installed.
# Needs ./scripts/setup.sh once. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/compiler_cache.sh
./scripts/build_runtime.sh >/dev/null
# The TensorRT layer against each TensorRT header set in ../shared (CI), if present.
log=runtime/build-tensorrt.log
./scripts/build_tensorrt_layers.sh >"$log" 2>&1 || {
  tail -n 60 "$log"
  echo "test.sh: the TensorRT layer failed to build or test against TensorRT's headers (log: $log)" >&2
  exit 1
}
./scripts/test_aarch64.sh
# -ra: the summary lists every skip with its reason (what is missing here and why).
# -n 2: two workers (the suite is mostly single-threaded export work; 38 -> 22 min on
# 2 cores); --dist loadfile keeps each module on one worker, so its fixtures run once, and
# --no-loadscope-reorder hands the modules out in tests/conftest.py's order (whole-model exports first).
exec .venv/bin/python -m pytest -ra -n "${ET_TRT_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
