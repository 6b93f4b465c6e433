#!/usr/bin/env bash
# One device call for the INT4 kernels' tuning (issue 33), within 6 minutes: build the launcher; check every
# mma.sync build of prepare.py's MMA_SWEEP against the float32 reference (benchmarks/int4_mma_check.py), the two
# largest BY_EXPERT builds' small cases also under compute-sanitizer; then time every blocking of prepare.py's GEMV_SWEEP
# and MMA_SWEEP forced onto its path at 4-256 tokens against the shipped launcher (gemv, mma.sync or
# tiles by its rule) and our bf16 kernels (benchmarks/int4_gemv_sweep.py; without ExecuTorch's kernels, whose
# autotuning takes minutes), each output checked first. The sweep's tables print last; everything printed also goes
# to $OUT/int4_sweep_run.log, each step's log to $OUT/<step>.log. (The shipped images' GPU tests: int4_run.sh.)
# Prepare here first:  python benchmarks/device/prepare.py --int4
# Then on the device:  bash benchmarks/device/int4_sweep_run.sh   (carry .device; results go to $OUT)
# SWEEP_MEMCHECK=0 skips the compute-sanitizer step (about 40 s); SWEEP_CHECK=0 both checks (every build is timed,
# each output still checked against the reference first: for a short call on builds checked before).
source "$(dirname "$0")/common.sh"

main() {
  local check=(python3 benchmarks/int4_mma_check.py --images .device/int4_images.json
               --sweep .device/int4_sweep_images.json)
  rc_int4_mma_check=skipped rc_int4_mma_memcheck=skipped
  [ "${SWEEP_CHECK:-1}" != 0 ] && step int4_mma_check 75 int4_images.json "${check[@]}" --ok-file "$OUT/mma_ok.txt"
  if [ "${SWEEP_CHECK:-1}" != 0 ] && [ "${SWEEP_MEMCHECK:-1}" != 0 ]; then
    step int4_mma_memcheck 60 int4_images.json "${MEMCHECK[@]}" "${check[@]}" --quick \
      --labels mma_w4t1p32c4s3e_w4t1p32c4s3e mma_w8t1p64c4s3e_w8t1p64c4s3e
  fi
  [ -f "$OUT/int4_mma_check.log" ] && grep -E "FAIL|mma check" "$OUT/int4_mma_check.log" | tail -12
  # The sweep starts no new shape after SWEEP_DEADLINE_S (120 s), so it ends (tables written) before its limit,
  # 45 s later. SWEEP_SHAPES (experts x hidden x ffn, comma-separated) times other shapes than the robot ones,
  # SWEEP_TOKENS (comma-separated) other token counts than 4-256.
  local deadline=${SWEEP_DEADLINE_S:-120} mma_ok=()
  [ "${SWEEP_CHECK:-1}" != 0 ] && mma_ok=(--mma-ok "$OUT/mma_ok.txt")
  step int4_sweep $((deadline + 45)) int4_images.json python3 benchmarks/int4_gemv_sweep.py \
    --images .device/int4_images.json --sweep .device/int4_sweep_images.json --out "$OUT" --deadline-s "$deadline" \
    "${mma_ok[@]}" ${SWEEP_SHAPES:+--shapes "$SWEEP_SHAPES"} ${SWEEP_TOKENS:+--tokens "$SWEEP_TOKENS"}

  echo
  if [ -f "$OUT/int4_gemv_sweep.md" ]; then cat "$OUT/int4_gemv_sweep.md"; else tail -30 "$OUT/int4_sweep.log"; fi
  echo "rc: mma check $rc_int4_mma_check, mma memcheck $rc_int4_mma_memcheck, sweep $rc_int4_sweep" \
    "(124: the step's time limit)"
}

device_run int4_sweep_run
