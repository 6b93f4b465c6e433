#!/usr/bin/env bash
# Configures and builds runtime/ (libet_trt_runtime.so, et_trt_runner, the
# kernel launcher libraries, the C++ tests).
#   ./scripts/build_runtime.sh [--target host|aarch64] [--build-dir DIR] [--only "TARGET..."] [CMAKE_ARGS...]
# --target host (default): for this machine, against the ExecuTorch wheel in
#   .venv; DIR defaults to runtime/build.
# --target aarch64: for Jetson Orin and Thor, against ExecuTorch's manylinux
#   aarch64 wheel, fetched by pip and unpacked into ~/.cache/et_trt/wheels
#   (ET_TRT_WHEELS moves it); cross-compiled on an x86-64 machine
#   (runtime/cmake/aarch64-linux-gnu.cmake; ctest then runs the tests under
#   qemu-aarch64), natively on an aarch64 one. DIR defaults to runtime/build-aarch64.
# --only: build these CMake targets (and what they link) instead of all.
# CMAKE_ARGS go to CMake's configure step, e.g. -DET_TRT_TENSORRT_INCLUDE_DIR=/path/to/TensorRT/include.
set -euo pipefail
cd "$(dirname "$0")/.."

target=host
build_dir=
only=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target=${2:?--target needs host or aarch64}; shift 2 ;;
    --build-dir) build_dir=${2:?--build-dir needs a folder}; shift 2 ;;
    --only) read -ra only <<<"${2:?--only needs CMake target names}"; only=(--target "${only[@]}"); shift 2 ;;
    *) break ;;
  esac
done

# ExecuTorch's aarch64 wheel, unpacked once into the cache. Its headers,
# libexecutorch.so and CMake config are the same in the wheel of every Python
# version, so the one pip picks for this Python serves.
aarch64_executorch() {
  local version cache py tmp
  version=$(sed -n 's/^ *"executorch==\([^"]*\)",$/\1/p' pyproject.toml)
  [ -n "$version" ] || { echo "build_runtime.sh: no executorch==VERSION pin in pyproject.toml" >&2; return 1; }
  cache=${ET_TRT_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/et_trt/wheels}/executorch-$version-manylinux_2_28_aarch64
  if [ ! -d "$cache" ]; then
    echo "build_runtime.sh: fetching ExecuTorch $version for aarch64 (manylinux_2_28 wheel) into $cache" >&2
    py=.venv/bin/python
    [ -x "$py" ] || py=python3
    mkdir -p "$(dirname "$cache")"
    tmp=$(mktemp -d "$cache.partial.XXXXXX")
    "$py" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 \
      "executorch==$version" -d "$tmp" >&2
    "$py" -m zipfile -e "$tmp"/executorch-"$version"-*.whl "$tmp/unpacked"
    mv "$tmp/unpacked" "$cache"  # whole or not at all: an interrupted fetch starts over
    rm -rf "$tmp"
  fi
  echo "$cache/executorch"
}

toolchain=()
case "$target" in
  host)
    build_dir=${build_dir:-runtime/build}
    et_dir=$(.venv/bin/python -c 'import executorch; print(list(executorch.__path__)[0])')
    ;;
  aarch64)
    build_dir=${build_dir:-runtime/build-aarch64}
    if [ "$(uname -m)" != aarch64 ]; then
      if ! command -v aarch64-linux-gnu-g++ >/dev/null; then
        echo "build_runtime.sh: --target aarch64 needs the cross compiler aarch64-linux-gnu-g++ and the arm64" \
          "libraries; ./scripts/system_packages.sh installs them (Debian/Ubuntu)" >&2
        exit 1
      fi
      toolchain=(-DCMAKE_TOOLCHAIN_FILE="$PWD/runtime/cmake/aarch64-linux-gnu.cmake")
    fi
    et_dir=$(aarch64_executorch)
    ;;
  *)
    echo "build_runtime.sh: --target $target is not supported; use one of: host, aarch64" >&2
    exit 2
    ;;
esac

.venv/bin/cmake -S runtime -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "${toolchain[@]}" \
  -DCMAKE_PREFIX_PATH="$et_dir" -DPython3_EXECUTABLE="$PWD/.venv/bin/python" "$@"
.venv/bin/cmake --build "$build_dir" -j"$(nproc)" "${only[@]}"
