#!/usr/bin/env bash
# One device call for the INT4 experts (issue 33): build the launcher; check, with no Triton in the process, the INT4
# kernels (GroupedMM and MoEExperts, every path) against the float32 references (tests/test_int4_gpu.py); run its
# invalid, odd-size, empty, skewed and single-token cases under compute-sanitizer memcheck; then time the block
# (benchmarks/int4_experts_bench.py: INT4 against our bf16 kernels and ExecuTorch's Triton fused_moe, and the sm_80
# images' bandwidth against a measured copy). The benchmark's table and the goals print last. Everything printed also
# goes to $OUT/int4_run.log, each step's full log to $OUT/<step>.log. Each step has a time limit: the call ends
# within ~8 minutes at worst.
# Prepare here first:  python benchmarks/device/prepare.py --int4
# Then on the device:  bash benchmarks/device/int4_run.sh   (carry .device; results go to $OUT)
# INT4_MEMCHECK=0 skips the memcheck; INT4_BENCH_LIMIT_S (240) is the benchmark's limit (ExecuTorch's autotuning
# takes most of it: 240 s reached 10-13 of its 15 cells).
source "$(dirname "$0")/common.sh"

main() {
  step int4_tests 110 int4_images.json "${PYTEST[@]}" -rs tests/test_int4_gpu.py
  rc_int4_memcheck=skipped
  if [ "${INT4_MEMCHECK:-1}" != 0 ]; then
    step int4_memcheck 100 int4_images.json "${MEMCHECK[@]}" "${PYTEST[@]}" tests/test_int4_gpu.py \
      -k "(grouped_mm and bf16 and 32) or invalid or odd or single or skewed or (paths and bf16 and swiglu and concat) \
or (mma_builds and p64)"
  fi
  # ExecuTorch's kernels are Triton's: this step's Python has it (our kernels are still the AOT images).
  step int4_bench "${INT4_BENCH_LIMIT_S:-240}" int4_images.json env PYTHONPATH="$PWD" python3 benchmarks/int4_experts_bench.py \
    --images .device/int4_images.json --executorch .device/executorch --out "$OUT"

  echo
  if [ -f "$OUT/int4_experts_bench.md" ]; then cat "$OUT/int4_experts_bench.md"; else tail -30 "$OUT/int4_bench.log"; fi
  echo "rc: int4 tests $rc_int4_tests, int4 memcheck $rc_int4_memcheck, bench $rc_int4_bench" \
    "(124: the step's time limit)"
}

device_run int4_run
