#!/usr/bin/env bash
# One device call for the fused MoE block (issue 32): build the launcher, check the fused kernels against the float32
# reference (no Triton in the process), run the invalid-id, odd-size, empty and single-token cases under
# compute-sanitizer, then time the block (benchmarks/moe_block_bench.py: fused against PyTorch eager and against our
# unfused kernels + glue, launches counted). Its table and the goals' lines print last. Each step has a time limit,
# so the call ends within ~9 minutes at worst (~4 expected on an H100).
# Prepare here first:  python benchmarks/device/prepare.py --moe
# Then on the device:  bash benchmarks/device/moe_run.sh   (carry .device; results go to $OUT)
# MOE_BENCH_ARGS: extra arguments for the benchmark (--skip-robot, --skip-moe).
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/device/common.sh
export ET_TRT_KERNEL_IMAGES=$PWD/.device/moe_images.json
build_launcher

timeout 200 python3 -m pytest -q -p no:cacheprovider --noconftest -rs tests/test_moe_experts_gpu.py 2>&1 \
  | tee "$OUT/moe_tests.log" | tail -25
tests_rc=${PIPESTATUS[0]}

timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
  python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_moe_experts_gpu.py \
  -k "invalid or odd or empty or single or family or e64" > "$OUT/moe_memcheck.log" 2>&1
memcheck_rc=$?
grep -E "ERROR SUMMARY|passed|failed" "$OUT/moe_memcheck.log" | tail -3

timeout 240 python3 benchmarks/moe_block_bench.py --images .device/moe_bench_images.json --out "$OUT" \
  ${MOE_BENCH_ARGS:-} 2>&1 | tee "$OUT/moe_bench.log" | tail -45
bench_rc=${PIPESTATUS[0]}
echo "tests rc=$tests_rc memcheck rc=$memcheck_rc bench rc=$bench_rc (124: the step's time limit)"
