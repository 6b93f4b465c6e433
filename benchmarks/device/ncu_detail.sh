NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
export PYTHONPATH=/tmp/no_triton:$PWD ET_TRT_KERNEL_IMAGES=$PWD/.device/images.json
"$NCU" --clock-control none -k regex:grouped_mm --launch-count 2 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters \
  python3 benchmarks/device/profile_kernels.py --images .device/bench_images.json --labels ours all_wgmma_s4 > $OUT/ncu_detail.txt 2>&1
grep -E "grouped_mm|Duration|Throughput|Stall|Pipe|Issue|Eligible|Active Warps|Busy|Bandwidth|Hit|cycles|Warp Cycles" $OUT/ncu_detail.txt | head -120
