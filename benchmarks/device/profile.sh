#!/usr/bin/env bash
# Nsight Compute on the first large MoE shape (3500 tokens, gate+up): what limits each
# contender's kernel (tensor pipe, shared memory, L2, DRAM, stall reasons). Run after
# run_all.sh in the same device call (it builds the launcher):
#   bash benchmarks/device/profile.sh ours all_wgmma_only   -> $OUT/ncu.txt and its key lines
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
[ $# -gt 0 ] || { echo "usage: profile.sh <contender label>... (see .device/bench_images.groups.json)"; exit 2; }
# Clocks are left free (--clock-control none): the H200 throttles to ~1.5 GHz under
# these kernels, and that is part of what is being measured.
PYTHONPATH=/tmp/no_triton:$PWD ET_TRT_KERNEL_IMAGES=$PWD/.device/images.json \
  "$NCU" --clock-control none -k regex:grouped_mm --launch-count $# \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section SchedulerStats --section WarpStateStats \
  python3 benchmarks/device/profile_kernels.py --images .device/bench_images.json --labels "$@" > "$OUT/ncu.txt" 2>&1
echo "ncu rc=$?"
grep -E "^  grouped_mm|SM Frequency|Duration|Throughput|highest-utilized|Spilling Requests|Eligible Warps|represents" "$OUT/ncu.txt"
