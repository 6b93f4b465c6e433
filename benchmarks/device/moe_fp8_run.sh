#!/usr/bin/env bash
# One device call for the fused MoE block with FP8 weights (issue 32 item 3): build the launcher; check, with no
# Triton in the process, the FP8 kernels against their FP8 reference and float32 (tests/test_moe_experts_fp8_gpu.py);
# run its invalid-id, odd-size, single-token cases under compute-sanitizer memcheck; then time the block
# (benchmarks/moe_fp8_block_bench.py: fused FP8 against PyTorch bf16 eager, torch's FP8 chain and our fused bf16,
# launches counted). The benchmark's table and the goals print last. Everything printed also goes to
# $OUT/moe_fp8_run.log, each step's full log to $OUT/<step>.log. Each step has a time limit (~7 minutes at worst).
# Prepare here first:  python benchmarks/device/prepare.py --moe-fp8
# Then on the device:  bash benchmarks/device/moe_fp8_run.sh   (carry .device; results go to $OUT)
# MOE_BENCH_ARGS: extra arguments for the benchmark (--skip-robot); MOE_MEMCHECK=0 skips the memcheck.
source "$(dirname "$0")/common.sh"

main() {
  step fp8_tests 120 moe_fp8_images.json "${PYTEST[@]}" -rs -s tests/test_moe_experts_fp8_gpu.py
  grep -E "FP8 reference" "$OUT/fp8_tests.log" | tail -8
  rc_fp8_memcheck=skipped
  if [ "${MOE_MEMCHECK:-1}" != 0 ]; then
    step fp8_memcheck 90 moe_fp8_images.json "${MEMCHECK[@]}" "${PYTEST[@]}" tests/test_moe_experts_fp8_gpu.py \
      -k "invalid or odd or single"
  fi
  step fp8_bench 300 moe_fp8_bench_images.json python3 benchmarks/moe_fp8_block_bench.py \
    --images .device/moe_fp8_bench_images.json --out "$OUT" ${MOE_BENCH_ARGS:-}

  echo
  if [ -f "$OUT/moe_fp8_block_bench.md" ]; then cat "$OUT/moe_fp8_block_bench.md"; else tail -30 "$OUT/fp8_bench.log"; fi
  echo "rc: fp8 tests $rc_fp8_tests, fp8 memcheck $rc_fp8_memcheck, bench $rc_fp8_bench (124: the step's time limit)"
}

device_run moe_fp8_run
