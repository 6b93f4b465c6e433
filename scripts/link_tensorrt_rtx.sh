#!/usr/bin/env bash
# Works around a bug of the TensorRT for RTX wheels (1.7): its ONNX parser
# dlopens the unversioned libtensorrt_rtx.so when it adds a plugin layer, the
# wheel ships only libtensorrt_rtx.so.1, and the process aborts. Links the one
# to the other in the wheel's folder, where the parser looks first ($ORIGIN).
#   ./scripts/link_tensorrt_rtx.sh [LIB_DIR]
# LIB_DIR defaults to the installed tensorrt_rtx_libs package in .venv;
# nothing to do when TensorRT for RTX is not installed or the link exists.
set -euo pipefail
cd "$(dirname "$0")/.."

lib_dir=${1:-$(.venv/bin/python -c 'import importlib.util, os
spec = importlib.util.find_spec("tensorrt_rtx_libs")
print(os.path.dirname(spec.origin) if spec and spec.origin else "")')}
if [ -z "$lib_dir" ] || [ ! -e "$lib_dir/libtensorrt_rtx.so.1" ]; then
  echo "link_tensorrt_rtx.sh: TensorRT for RTX is not installed; nothing to link"
  exit 0
fi
if [ ! -e "$lib_dir/libtensorrt_rtx.so" ]; then
  ln -s libtensorrt_rtx.so.1 "$lib_dir/libtensorrt_rtx.so"
  echo "link_tensorrt_rtx.sh: linked $lib_dir/libtensorrt_rtx.so -> libtensorrt_rtx.so.1"
fi
