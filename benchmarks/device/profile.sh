#!/usr/bin/env bash
# Nsight Compute over the large MoE shapes: what limits each kernel (tensor pipe, shared
# memory, L2, DRAM). Run after run_all.sh in the same call (it builds the launcher):
#   bash benchmarks/device/profile.sh [labels...]      -> $OUT/ncu.csv and a short table
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
METRICS=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_bytes.sum
PYTHONPATH=/tmp/no_triton:$PWD ET_TRT_KERNEL_IMAGES=$PWD/.device/images.json \
  "$NCU" --clock-control none --target-processes all --csv --metrics "$METRICS" \
  python3 benchmarks/device/profile_kernels.py --images .device/bench_images.json --labels "$@" \
  > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
echo "ncu rc=$?"
python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.DictReader(lines))
table = collections.OrderedDict()
for r in rows:
    key = (r["ID"], r["Kernel Name"][:40])
    table.setdefault(key, {})[r["Metric Name"]] = r["Metric Value"]
for (i, name), m in table.items():
    print(i, name, " ".join(f"{k.split('__')[1].split('.')[0][:24]}={v}" for k, v in m.items()))
PY
tail -5 "$OUT/ncu.err"
