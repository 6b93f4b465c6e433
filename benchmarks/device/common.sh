# Sourced by the device scripts (run_all.sh, moe_run.sh), from the repository root: $OUT made, Triton blocked in
# every Python process (the shipped images must run without it), the device printed, and build_launcher.
OUT=${OUT:-out}
mkdir -p "$OUT"
mkdir -p /tmp/no_triton/triton
echo 'raise ImportError("triton is blocked: the kernel checks run without Triton")' > /tmp/no_triton/triton/__init__.py
export PYTHONPATH=/tmp/no_triton:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"

# The C++ launchers' library (runtime/kernels) into build/kernels; exits the script if the build fails.
build_launcher() {
  cmake -S runtime/kernels -B build/kernels -DCMAKE_BUILD_TYPE=Release \
    -DET_TRT_FLATBUFFERS_INCLUDE_DIR=$PWD/.device/flatbuffers/include > "$OUT/build.log" 2>&1 \
    && cmake --build build/kernels -j 8 >> "$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
  echo "launcher built"
}
