#!/usr/bin/env bash
# One device call for every GPU test module, no benchmark: build the launcher, then run, with no Triton in the
# process, tests/test_kernel_gpu.py (GroupedMM), test_moe_experts_gpu.py (fused MoE experts, bf16/fp16),
# test_moe_experts_fp8_gpu.py (FP8) and test_int4_gpu.py (INT4), each against its float32 reference, each step
# limited to 90 s (they took 13-24 s apiece on an H100). The check that the tree as it stands passes on a GPU.
# Prepare here first:  python benchmarks/device/prepare.py --gpu-tests
# Then on the device:  bash benchmarks/device/gpu_tests_run.sh   (carry .device; results go to $OUT)
# GPU_TESTS_MEMCHECK=1 also runs each module's invalid-input cases under compute-sanitizer memcheck.
source "$(dirname "$0")/common.sh"

main() {
  step kernel_tests 90 images.json "${PYTEST[@]}" -rs tests/test_kernel_gpu.py
  step moe_tests 90 moe_images.json "${PYTEST[@]}" -rs tests/test_moe_experts_gpu.py
  step fp8_tests 90 moe_fp8_images.json "${PYTEST[@]}" -rs tests/test_moe_experts_fp8_gpu.py
  step int4_tests 90 int4_images.json "${PYTEST[@]}" -rs tests/test_int4_gpu.py
  local memcheck="skipped"
  if [ "${GPU_TESTS_MEMCHECK:-0}" = 1 ]; then
    step memcheck 90 moe_images.json "${MEMCHECK[@]}" "${PYTEST[@]}" tests/test_moe_experts_gpu.py -k invalid
    memcheck=$rc_memcheck
  fi
  echo "rc: kernel $rc_kernel_tests, moe $rc_moe_tests, fp8 $rc_fp8_tests, int4 $rc_int4_tests," \
    "memcheck $memcheck (124: the step's time limit)"
}

device_run gpu_tests_run
