#!/usr/bin/env bash
# One device call for the fused MoE block's sweep (issue 32): build the launcher, then time every contender of
# benchmarks/moe_sweep.py (wgmma builds, Triton tilings, PyTorch eager) at the MoE shapes and over the dispatch grid,
# with no Triton in the process. Its tables print last; everything printed also goes to $OUT/moe_sweep_run.log,
# the sweep's log to $OUT/moe_sweep.log, its figures to $OUT/moe_sweep.json and .md. Ends within ~8 minutes: the
# sweep starts no shape after 330 s (its --deadline-s), the step stops at 400 s.
# Prepare here first:  python benchmarks/device/prepare.py --sweep
# Then on the device:  bash benchmarks/device/moe_sweep_run.sh   (carry .device; results go to $OUT)
# MOE_SWEEP_ARGS: extra arguments for the sweep (--skip-dispatch, --deadline-s S).
source "$(dirname "$0")/common.sh"

main() {
  step moe_sweep 400 moe_sweep_images.json python3 benchmarks/moe_sweep.py --images .device/moe_sweep_images.json \
    --out "$OUT" ${MOE_SWEEP_ARGS:-}
  echo
  if [ -f "$OUT/moe_sweep.md" ]; then cat "$OUT/moe_sweep.md"; else tail -40 "$OUT/moe_sweep.log"; fi
  echo "rc: sweep $rc_moe_sweep (124: the step's time limit)"
}

device_run moe_sweep_run
