#!/usr/bin/env bash
# One device call for the MoEExperts TensorRT plugin's runtime path (issue 32), in two parts.
# 1. Without TensorRT (runs on the device as it is): runtime/tools/moe_plugin_check.py drives the C++ plugin through
# its IPluginV3 interfaces as TensorRT does (created from each MoEExperts node of the fused example export, its
# fields serialized and read back, attached, shapes, workspace, enqueue) with the model's expert weights, against
# the float32 reference, and times the enqueue (table 1); the same for the nodes of the fused export with INT4
# experts (expert_precision = "int4": packed weights, group scales, the launcher's INT4 kernels; rows "INT4 g128")
# and with FP8 experts (expert_precision = "fp8": e4m3 weights, float32 scales per output channel, the launcher's FP8
# kernels; rows "FP8", against moe_experts_fp8.reference and, norm-wise, float32 of the same dequantized weights).
# 2. With TensorRT, where it is found: builds et-trt's runtime (the delegate,
# the GroupedMM and MoEExperts plugins, et_trt_runner) against the TensorRT it finds, runs the example policy exported
# with fused MoE blocks (one MoEExperts node each) and with GroupedMM blocks and their routing glue
# (fused_experts = false), and fused with FP8 experts, through et_trt_runner at 16 and 512 observation tokens (the
# engines are built at init, as on a robot: the first call), compares each output with the float32 policy's and with
# the GroupedMM form's, and times them (median and p99 of 200 calls after 20 warm-ups; table 2). Tables print last;
# every log is in $OUT.
# Expected within ~6 minutes on an H100 (part 1 under a minute, the build ~3, each run's engine build under one).
#
# Prepare here first:  python benchmarks/device/prepare_plugin_run.py [--tensorrt DIR]
# Then on the device:  bash benchmarks/device/moe_plugin_run.sh   (carry .device; results go to $OUT)
#
# TensorRT: the device image has none (/work/.library/device/KINDS.md lists what it holds), and no machine here can
# fetch it (/work/shared/FACTS.md: PyPI's tensorrt-cu13-libs is a 15.5 kB sdist that downloads the libraries from
# pypi.nvidia.com; TensorRT for RTX, which this machine has, runs no engine on sm_90). What a run needs: TensorRT 10 or
# 11 for CUDA 13, x86-64: libnvinfer.so.N, its builder resource library and libnvonnxparser.so.N (conda's libnvinfer
# 10.0.1.6 package for linux-64 is 638 MB compressed), in .device/tensorrt/lib or on the loader's path. A call
# carries at most 64 MiB, so that means an image with TensorRT, or carrying it in pieces over several calls of one
# warm machine (files written there stay until it goes back). Without it, part 2 says what is missing and the call
# ends with exit status 3 (1 where part 1 failed).
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-out}
mkdir -p "$OUT"
RUN=.device/plugin_run
TOKENS=(16 512)

# The folder of libnvinfer.so.<major> (.device/tensorrt/lib first, then the loader's path); sets TRT_LIB, TRT_MAJOR.
find_tensorrt() {
  local lib
  for lib in .device/tensorrt/lib/libnvinfer.so.1[01] \
      $(ldconfig -p 2>/dev/null | awk '/libnvinfer\.so\.1[01] /{print $NF}'); do
    if [ -e "$lib" ] && ls "$(dirname "$lib")"/libnvonnxparser.so.* > /dev/null 2>&1; then
      TRT_LIB=$(cd "$(dirname "$lib")" && pwd)
      TRT_MAJOR=${lib##*.so.}
      return 0
    fi
  done
  return 1
}

# Builds et_trt_runner into build/runtime against the headers of TensorRT major $TRT_MAJOR; exits on failure.
build_runner() {
  local headers crypto zlib
  headers=$(ls -d .device/tensorrt/"$TRT_MAJOR".*/include | sort -V | tail -1)
  crypto=$(ldconfig -p | awk '/libcrypto\.so\.3 /{print $NF; exit}')
  zlib=$(ldconfig -p | awk '/libz\.so\.1 /{print $NF; exit}')
  echo "building et_trt_runner against $headers (libcrypto $crypto, libz $zlib)"
  cmake -S runtime -B build/runtime -G Ninja -DCMAKE_BUILD_TYPE=Release -DET_TRT_BUILD_TESTS=OFF \
    -DCMAKE_PREFIX_PATH="$PWD/.device/executorch" -DET_TRT_TENSORRT_INCLUDE_DIR="$PWD/$headers" \
    -DET_TRT_FLATBUFFERS_INCLUDE_DIR="$PWD/.device/flatbuffers/include" \
    -DOPENSSL_INCLUDE_DIR="$PWD/.device/sysdeps/include" -DOPENSSL_CRYPTO_LIBRARY="$crypto" \
    -DZLIB_INCLUDE_DIR="$PWD/.device/sysdeps/include" -DZLIB_LIBRARY="$zlib" > "$OUT/build.log" 2>&1 \
    && cmake --build build/runtime -j 16 --target et_trt_runner >> "$OUT/build.log" 2>&1 \
    || { tail -40 "$OUT/build.log"; exit 1; }
  echo "et_trt_runner built"
}

main() {
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  for need in "$RUN/fused.pte" "$RUN/grouped.pte" "$RUN/fp8.pte" "$RUN/check/nodes.json" \
      .device/executorch/lib/libexecutorch.so .device/flatbuffers/bin/flatc .device/sysdeps/include/zlib.h; do
    [ -e "$need" ] || { echo "missing $need: run python benchmarks/device/prepare_plugin_run.py here first"; exit 2; }
  done
  command -v nvcc cmake ninja || { echo "the device lacks nvcc, cmake or ninja"; exit 2; }
  timeout 180 python3 runtime/tools/moe_plugin_check.py "$RUN/check/nodes.json" > "$OUT/plugin_check.md" 2>&1
  local check_rc=$?
  echo "== plugin check (no TensorRT): rc $check_rc"
  if ! find_tensorrt; then
    echo "NO TENSORRT: neither .device/tensorrt/lib nor the loader's path has libnvinfer.so.10/11 with"
    echo "libnvonnxparser (see this script's header for what a run needs): part 2 (the plugin inside TensorRT"
    echo "engines, fused against GroupedMM blocks through et_trt_runner) did not run."
    echo
    cat "$OUT/plugin_check.md"
    [ "$check_rc" = 0 ] && exit 3 || exit 1
  fi
  echo "TensorRT $TRT_MAJOR at $TRT_LIB"
  export LD_LIBRARY_PATH="$TRT_LIB:$PWD/.device/executorch/lib:${LD_LIBRARY_PATH:-}"
  build_runner

  local form tokens name inputs i
  for form in fused grouped fp8; do
    for tokens in "${TOKENS[@]}"; do
      name=${form}_t$tokens
      inputs=()
      for i in 0 1 2; do inputs+=(--input "$i=$RUN/t${tokens}_input_$i.npy"); done
      mkdir -p "$OUT/$name"
      timeout 150 build/runtime/et_trt_runner "$RUN/$form.pte" "${inputs[@]}" --warmup 20 --iterations 200 \
        --engine-cache /tmp/et_trt_engines --save-outputs "$OUT/$name" > "$OUT/$name.log" 2>&1
      echo "== $name: rc $?"
      grep -E "first call|timed|rror" "$OUT/$name.log" | tail -4
    done
  done
  echo
  cat "$OUT/plugin_check.md"
  echo
  python3 benchmarks/device/plugin_run_table.py "$OUT" "$RUN" "${TOKENS[@]}" && [ "$check_rc" = 0 ]
}

main 2>&1 | tee "$OUT/moe_plugin_run.log"
