# Sourced first by the device scripts (source "$(dirname "$0")/common.sh"): the shell moves to the repository root,
# $OUT is made, Triton is blocked in every Python process (the shipped images must run without it); then
# device_run, print_device, build_launcher and step.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export OUT=${OUT:-out}
mkdir -p "$OUT"
mkdir -p /tmp/no_triton/triton
echo 'raise ImportError("triton is blocked: the kernel checks run without Triton")' > /tmp/no_triton/triton/__init__.py
export PYTHONPATH=/tmp/no_triton:$PWD PYTHONUNBUFFERED=1

print_device() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"
}

# device_run NAME: the device printed, the launcher built, then the script's function main; everything printed also
# goes to $OUT/NAME.log.
device_run() {
  {
    print_device
    build_launcher
    main
  } 2>&1 | tee "$OUT/$1.log"
}

# The C++ launchers' library (runtime/kernels) into build/kernels; exits the script if the build fails.
build_launcher() {
  cmake -S runtime/kernels -B build/kernels -DCMAKE_BUILD_TYPE=Release \
    -DET_TRT_FLATBUFFERS_INCLUDE_DIR=$PWD/.device/flatbuffers/include > "$OUT/build.log" 2>&1 \
    && cmake --build build/kernels -j 8 >> "$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
  echo "launcher built"
}

# step NAME LIMIT_S IMAGES COMMAND...: COMMAND with ET_TRT_KERNEL_IMAGES=.device/IMAGES, its output in $OUT/NAME.log
# (the last lines printed), its exit status in rc_NAME (124: its time limit).
step() {
  local name=$1 limit=$2 images=$3 rc
  shift 3
  ET_TRT_KERNEL_IMAGES=$PWD/.device/$images timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  printf -v "rc_$name" %s "$rc"
  echo "== $name: rc $rc"
  grep -E "ERROR SUMMARY|passed|failed|skipped|rror" "$OUT/$name.log" | tail -6
}

PYTEST=(python3 -m pytest -q -p no:cacheprovider --noconftest)
MEMCHECK=(compute-sanitizer --tool memcheck --error-exitcode 9)
