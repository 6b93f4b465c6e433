#!/usr/bin/env bash
# Sets up a fresh machine and runs the main job: export the bundled example
# policy to a .pte. Idempotent: a second run reuses the venv and the build.
#   ./scripts/setup.sh            set up, build the runtime, export
#   ET_TRT_SKIP_EXPORT=1 ./scripts/setup.sh   set up and build only
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

./scripts/system_packages.sh
source scripts/compiler_cache.sh

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi
log "installing et-trt and its pinned dependencies into .venv"
.venv/bin/python -m pip install -q --upgrade pip
# torch 2.13.0 (CPU) first so nothing pulls a CUDA build; then the package.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[test,tensorrt-rtx]" "cmake>=3.28,<4"
# LeRobot's policies (tests/test_lerobot_policies.py): lerobot pins torch<2.11, so it goes in without its
# dependencies; what its policy code imports is in the [test] extra.
.venv/bin/python -m pip install -q --no-deps "lerobot==0.4.4"
./scripts/link_tensorrt_rtx.sh

log "building the C++ runtime (runtime/build)"
./scripts/build_runtime.sh
# libet_trt_plugin.so for the real-builder tests (runtime/build-tensorrt-11.1), against
# ../shared's TensorRT 11.1 headers where there are some (CI), as test.sh builds it.
log "building the TensorRT layer against TensorRT 11.1's headers, where ../shared has them"
./scripts/build_tensorrt_layers.sh --build-only 11.1

if [ "${ET_TRT_SKIP_EXPORT:-0}" != 1 ]; then
  log "exporting the example policy"
  .venv/bin/et-trt export --output out/moe_policy.pte
fi
