#!/usr/bin/env bash
# One device call: build the launcher, check the kernel (no Triton in the process),
# run the invalid-offset cases under compute-sanitizer, then benchmark (bf16, then fp8).
# Prepare here first:  python benchmarks/device/prepare.py
# Then on the device:  bash benchmarks/device/run_all.sh   (carry .device; results go to $OUT)
source "$(dirname "$0")/common.sh"
print_device
export ET_TRT_KERNEL_IMAGES=$PWD/.device/images.json
build_launcher

tests_rc=skipped memcheck_rc=skipped
if [ -z "${BENCH_ONLY:-}" ]; then  # BENCH_ONLY=1: tuning runs, kernel source unchanged since the last checked run
python3 -m pytest -q -p no:cacheprovider --noconftest -rs tests/test_kernel_gpu.py 2>&1 | tee "$OUT/tests.log" | tail -15
tests_rc=${PIPESTATUS[0]}

compute-sanitizer --tool memcheck --error-exitcode 9 \
  python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_kernel_gpu.py -k "invalid or odd or empty or swiglu" \
  > "$OUT/memcheck.log" 2>&1
memcheck_rc=$?
grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck.log" | tail -3
fi

# BENCHES: which benchmarks run, "bf16 fp8" unless told; "swiglu" adds the FP8 down stage's (fp8_swiglu_bench.py),
# "experts" the whole experts' (fp8_experts_bench.py: gate+up, SwiGLU, down).
if [[ " ${BENCHES:-bf16 fp8} " == *" bf16 "* ]]; then
python3 benchmarks/grouped_mm_bench.py --images .device/bench_images.json --out "$OUT" --sustained "${SUSTAINED_S:-3}" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -60
fi
if [[ " ${BENCHES:-bf16 fp8} " == *" fp8 "* ]]; then
python3 benchmarks/fp8_grouped_mm_bench.py --images .device/fp8_bench_images.json --out "$OUT" --sustained "${SUSTAINED_S:-3}" ${FP8_ARGS:-} 2>&1 | tee "$OUT/fp8_bench.log" | tail -60
fi
if [[ " ${BENCHES:-bf16 fp8} " == *" swiglu "* ]]; then  # its SwiGLU comparators are Triton kernels: unblocked
PYTHONPATH=$PWD python3 benchmarks/fp8_swiglu_bench.py --images .device/fp8_bench_images.json --out "$OUT" ${SWIGLU_ARGS:-} 2>&1 | tee "$OUT/fp8_swiglu_bench.log" | tail -40
fi
if [[ " ${BENCHES:-bf16 fp8} " == *" experts "* ]]; then  # Triton SwiGLU comparators here too: unblocked
PYTHONPATH=$PWD python3 benchmarks/fp8_experts_bench.py --images .device/fp8_bench_images.json --out "$OUT" ${EXPERTS_ARGS:-} 2>&1 | tee "$OUT/fp8_experts_bench.log" | tail -25
fi
echo "tests rc=$tests_rc memcheck rc=$memcheck_rc"
