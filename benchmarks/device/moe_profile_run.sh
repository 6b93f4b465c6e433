#!/usr/bin/env bash
# One device step for Nsight Compute (issues 32 and 33): the kernels of benchmarks/device/moe_profile.py's blocks
# (bf16 at the MoE layer's 3500 tokens, INT4 at three robot shapes), with the sections that tell compute, memory,
# occupancy and stall limits apart. Clocks left free (--clock-control none: METHOD.md). The whole report goes to
# $OUT/ncu_moe.txt, its key lines to the log. NCU_ARGS replaces the sections (e.g. "-k regex:wgmma|mma_gate_up
# --section ComputeWorkloadAnalysis --section SourceCounters": where the named kernels' warps stall, by instruction).
# PROFILE_ARGS replaces moe_profile.py's arguments (e.g. "--blocks fp8 --fp8-images .device/moe_fp8_bench_images.json
# --fp8-contenders fused_fp8,fused_fp8_down_<rev>": the FP8 block's contenders, from prepare.py --moe-fp8).
# Prepare here first:  python benchmarks/device/prepare.py --int4
# Then on the device:  bash benchmarks/device/moe_profile_run.sh   (carry .device; results go to $OUT)
source "$(dirname "$0")/common.sh"

main() {
  local ncu
  ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$ncu" ] || { echo "ncu not found"; return; }
  local sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats
                  --section WarpStateStats --section SchedulerStats)
  [ -n "${NCU_ARGS:-}" ] && read -r -a sections <<< "$NCU_ARGS"
  step moe_profile 150 int4_images.json "$ncu" --clock-control none --profile-from-start off "${sections[@]}" \
    python3 benchmarks/device/moe_profile.py ${PROFILE_ARGS:---images .device/int4_images.json}
  cp "$OUT/moe_profile.log" "$OUT/ncu_moe.txt"
  grep -E "^(int4|bf16|fp8) |kernels:|^  [a-z_]+.*\([0-9]+, [0-9]+, [0-9]+\)x|SM Frequency|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Stall|stalled|Warp Cycles Per Issued|One or More Eligible|L2 Cache Throughput|pipe_.*cycles_active|Executed Ipc|Issue Slots" \
    "$OUT/ncu_moe.txt" | head -220
}

device_run moe_profile_run
