#!/usr/bin/env bash
# Several device scripts in one call, their images from prepare.py --pack (carry .devpack):
#   python benchmarks/device/prepare.py --gpu-tests --int4 --pack                  # here
#   bash benchmarks/device/run_packed.sh gpu_tests_run int4_sweep_run:380          # there
# Unpacks .device, then runs each script (NAME or NAME:LIMIT_S, a time limit of its own) in turn, printing its
# output. A call brings back at most 8 files and two scripts leave more, so their files go to one folder, packed into
# $OUT/logs.tgz after each script: a call cut short still brings back what the scripts before it wrote.
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=${OUT:-out}
mkdir -p "$logs"
rm -rf .device
tar -xzf .devpack/device.tgz || { echo "no .devpack/device.tgz: run prepare.py with --pack here, carry .devpack"; exit 1; }
export OUT=/tmp/device_logs
rm -rf "$OUT"
mkdir -p "$OUT"
for entry in "$@"; do
  name=${entry%%:*}
  limit=600
  [ "$name" != "$entry" ] && limit=${entry#*:}
  echo "=== $name (limit $limit s)"
  timeout "$limit" bash "benchmarks/device/$name.sh"
  echo "=== $name: rc $? (124: its limit)"
  tar -czf "$logs/logs.tgz" -C "$OUT" .
done
