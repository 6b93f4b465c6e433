#!/usr/bin/env bash
# One device call for the INT4 kernels' tuning (issue 33): build the launcher; check the shipped INT4 kernels
# again (tests/test_int4_gpu.py, no Triton); then time every blocking of prepare.py's GEMV_SWEEP and ROWS_SWEEP forced
# onto its path at 1-256 tokens against the shipped launcher (gemv or tiles), our bf16 kernels and ExecuTorch's
# decode kernel (benchmarks/int4_gemv_sweep.py), each output checked first. The sweep's tables print last; everything
# printed also goes to $OUT/int4_sweep_run.log, each step's log to $OUT/<step>.log. Step limits: the call ends within
# ~8 minutes.
# Prepare here first:  python benchmarks/device/prepare.py --int4
# Then on the device:  bash benchmarks/device/int4_sweep_run.sh   (carry .device; results go to $OUT)
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-out}
mkdir -p "$OUT"

main() {
  source benchmarks/device/common.sh
  build_launcher

  step int4_tests 60 int4_images.json "${PYTEST[@]}" -rs tests/test_int4_gpu.py
  # ExecuTorch's kernels are Triton's: this step's Python has it (ours are still the AOT images). The sweep starts
  # no new shape after 280 s, so it ends (tables written) before its 340 s limit.
  step int4_sweep 340 int4_images.json env PYTHONPATH="$PWD" python3 benchmarks/int4_gemv_sweep.py \
    --images .device/int4_images.json --sweep .device/int4_sweep_images.json --executorch .device/executorch \
    --out "$OUT" --deadline-s 280

  echo
  if [ -f "$OUT/int4_gemv_sweep.md" ]; then cat "$OUT/int4_gemv_sweep.md"; else tail -30 "$OUT/int4_sweep.log"; fi
  echo "rc: int4 tests $rc_int4_tests, sweep $rc_int4_sweep (124: the step's time limit)"
}

main 2>&1 | tee "$OUT/int4_sweep_run.log"
