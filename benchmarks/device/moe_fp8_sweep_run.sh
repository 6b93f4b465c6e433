#!/usr/bin/env bash
# One device call for the FP8 down GEMM's candidates (issue 32; kernels/moe_fp8_down.py, Triton and Gluon; prepare.py's
# FP8_DOWN_CANDIDATES and FP8_DOWN_WGMMA_CANDIDATES): build the launcher; the shipped FP8 images' GPU tests
# (tests/test_moe_experts_fp8_gpu.py); every candidate checked against the FP8 reference and the shipped down at small
# and odd sizes with the "large" tiling forced (benchmarks/moe_fp8_down_check.py), the small cases also under
# compute-sanitizer memcheck; then the
# candidates that passed timed at the MoE shapes beside the shipped images, a repeat of them, bf16 eager, torch's FP8
# chain and our bf16 kernels (benchmarks/moe_fp8_block_bench.py --skip-robot: block us, paired ratios, per-kernel
# us). Its tables print last; everything printed also goes to $OUT/moe_fp8_sweep_run.log, each step's log to
# $OUT/<step>.log. About 4 minutes; the step limits (345 s) and the launcher build bound it near 7.
# Prepare here first:  python benchmarks/device/prepare.py --moe-fp8
# Then on the device:  bash benchmarks/device/moe_fp8_sweep_run.sh   (carry .device; results go to $OUT)
# FP8_MEMCHECK=0 skips the memcheck.
source "$(dirname "$0")/common.sh"

main() {
  step fp8_tests 60 moe_fp8_images.json "${PYTEST[@]}" -rs tests/test_moe_experts_fp8_gpu.py
  local check=(python3 benchmarks/moe_fp8_down_check.py --images .device/moe_fp8_sweep_images.json)
  step down_check 60 moe_fp8_images.json "${check[@]}" --ok-file "$OUT/down_ok.txt"
  grep -E "FAIL|differs|fp8 down check" "$OUT/down_check.log" | tail -12
  rc_down_memcheck=skipped
  if [ "${FP8_MEMCHECK:-1}" != 0 ]; then
    step down_memcheck 75 moe_fp8_images.json "${MEMCHECK[@]}" "${check[@]}" --quick
  fi
  touch "$OUT/down_ok.txt"  # none timed if the check did not finish
  step sweep_bench 150 moe_fp8_images.json python3 benchmarks/moe_fp8_block_bench.py \
    --images .device/moe_fp8_sweep_images.json --only "$OUT/down_ok.txt" --skip-robot --out "$OUT"

  echo
  if [ -f "$OUT/moe_fp8_block_bench.md" ]; then
    cat "$OUT/moe_fp8_block_bench.md"
  else
    tail -30 "$OUT/sweep_bench.log"
  fi
  echo "rc: fp8 tests $rc_fp8_tests, down check $rc_down_check, down memcheck $rc_down_memcheck," \
    "bench $rc_sweep_bench (124: the step's time limit)"
}

device_run moe_fp8_sweep_run
