#!/usr/bin/env bash
# One device call for the fused MoE block (issue 32): build the launcher; check, with no Triton in the process, the
# fused kernels against the float32 reference (tests/test_moe_experts_gpu.py) and the grouped GEMM's kernels
# (tests/test_kernel_gpu.py); run their invalid-id / invalid-offset, odd-size, empty, single-token, family and wgmma
# cases under compute-sanitizer memcheck; then time the block (benchmarks/moe_block_bench.py: fused against PyTorch
# eager and against our unfused kernels + glue, launches counted). The benchmark's table and the goals print last.
# Everything printed also goes to $OUT/moe_run.log, each step's full log to $OUT/<step>.log. Each step has a time
# limit (7.5 minutes together, the build apart), so the call ends within ~9 minutes at worst (~4 expected on an
# H100: the tests took 17 s each, the memcheck subsets 12 and 5 s there).
# Prepare here first:  python benchmarks/device/prepare.py --moe   (--moe --sweep for MOE_SWEEP=1)
# Then on the device:  bash benchmarks/device/moe_run.sh   (carry .device; results go to $OUT)
# MOE_BENCH_ARGS: extra arguments for the benchmark (--skip-robot, --skip-moe); MOE_MEMCHECK=0 skips the memcheck.
# MOE_SWEEP=1 also runs benchmarks/moe_sweep.py (its contenders at the MoE and dispatch shapes, the dispatch rule's
# evidence) before the benchmark, starting no shape after MOE_SWEEP_S seconds (default 180; the step stops 60 s
# later), its tables in $OUT/moe_sweep.md; MOE_KERNEL_TESTS narrows tests/test_kernel_gpu.py (a -k expression).
source "$(dirname "$0")/common.sh"

main() {
  # The grouped GEMM's tests where .device holds their images (prepare.py --moe makes them).
  local kernel_images=.device/images.json
  rc_kernel_tests=skipped rc_kernel_memcheck=skipped rc_moe_memcheck=skipped
  [ -f "$kernel_images" ] || echo "== kernel tests: skipped (no $kernel_images)"
  [ -f "$kernel_images" ] && step kernel_tests 60 images.json "${PYTEST[@]}" -rs tests/test_kernel_gpu.py \
    ${MOE_KERNEL_TESTS:+-k "$MOE_KERNEL_TESTS"}
  step moe_tests 75 moe_images.json "${PYTEST[@]}" -rs tests/test_moe_experts_gpu.py
  if [ "${MOE_MEMCHECK:-1}" != 0 ]; then
    [ -f "$kernel_images" ] && step kernel_memcheck 60 images.json "${MEMCHECK[@]}" "${PYTEST[@]}" \
      tests/test_kernel_gpu.py -k "invalid or odd or empty or swiglu"
    step moe_memcheck 60 moe_images.json "${MEMCHECK[@]}" "${PYTEST[@]}" tests/test_moe_experts_gpu.py \
      -k "invalid or odd or empty or single or (family and t7) or every_wgmma or (many_rows and bf16 and swiglu)"
  fi
  rc_moe_sweep=skipped
  if [ "${MOE_SWEEP:-0}" = 1 ]; then
    local deadline=${MOE_SWEEP_S:-180}
    step moe_sweep $((deadline + 60)) moe_sweep_images.json python3 benchmarks/moe_sweep.py \
      --images .device/moe_sweep_images.json --out "$OUT" --deadline-s "$deadline"
  fi
  step moe_bench 210 moe_bench_images.json python3 benchmarks/moe_block_bench.py \
    --images .device/moe_bench_images.json --out "$OUT" ${MOE_BENCH_ARGS:-}

  echo "rc: kernel tests $rc_kernel_tests, moe tests $rc_moe_tests, kernel memcheck $rc_kernel_memcheck," \
    "moe memcheck $rc_moe_memcheck, sweep $rc_moe_sweep, bench $rc_moe_bench (124: the step's time limit)"
  echo
  if [ -f "$OUT/moe_sweep.md" ]; then sed -n '/^By total routed rows/,$p' "$OUT/moe_sweep.md" | head -60; echo; fi
  if [ -f "$OUT/moe_block_bench.md" ]; then cat "$OUT/moe_block_bench.md"; else tail -30 "$OUT/moe_bench.log"; fi
}

device_run moe_run
