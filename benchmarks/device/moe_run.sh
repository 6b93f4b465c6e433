#!/usr/bin/env bash
# One device call for the fused MoE block (issue 32): build the launcher, check the fused kernels against the float32
# reference (no Triton in the process), time the block (benchmarks/moe_block_bench.py: fused against PyTorch eager
# and against our unfused kernels + glue, launches counted), then run the invalid-id, odd-size, empty, single-token,
# family and wgmma cases under compute-sanitizer; the benchmark's table and the goals' lines print last. Each step
# has a time limit, so the call ends within ~9.5 minutes at worst (~4 expected on an H100).
# Prepare here first:  python benchmarks/device/prepare.py --moe
# Then on the device:  bash benchmarks/device/moe_run.sh   (carry .device; results go to $OUT)
# MOE_BENCH_ARGS: extra arguments for the benchmark (--skip-robot, --skip-moe); MOE_MEMCHECK=0 skips the memcheck.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/device/common.sh
export ET_TRT_KERNEL_IMAGES=$PWD/.device/moe_images.json
build_launcher

timeout 180 python3 -m pytest -q -p no:cacheprovider --noconftest -rs tests/test_moe_experts_gpu.py 2>&1 \
  | tee "$OUT/moe_tests.log" | tail -25
tests_rc=${PIPESTATUS[0]}

timeout 220 python3 benchmarks/moe_block_bench.py --images .device/moe_bench_images.json --out "$OUT" \
  ${MOE_BENCH_ARGS:-} > "$OUT/moe_bench.log" 2>&1
bench_rc=$?
grep -E "device:|rror" "$OUT/moe_bench.log" | head -20

memcheck_rc=skipped
if [ "${MOE_MEMCHECK:-1}" != 0 ]; then
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_moe_experts_gpu.py \
    -k "invalid or odd or empty or single or (family and t7) or every_wgmma or (many_rows and bf16 and swiglu)" > "$OUT/moe_memcheck.log" 2>&1
  memcheck_rc=$?
  grep -E "ERROR SUMMARY|passed|failed" "$OUT/moe_memcheck.log" | tail -3
fi
if [ -f "$OUT/moe_block_bench.md" ]; then cat "$OUT/moe_block_bench.md"; else tail -30 "$OUT/moe_bench.log"; fi
echo "tests rc=$tests_rc bench rc=$bench_rc memcheck rc=$memcheck_rc (124: the step's time limit)"
