#!/usr/bin/env bash
# Prepares the device check of the GroupedMM plugin's launch path (launch_check.py):
# builds the runtime, takes the delegate blobs out of a .pte and puts them with
# libet_trt_launch_check.so under .device/launch_check (carried to the device).
#   runtime/tools/prepare_launch_check.sh [PTE]     (default out/moe_policy.pte)
# Then on the device (carry .device):
#   python3 runtime/tools/launch_check.py .device/launch_check/blobs/*.blob --lib .device/launch_check/libet_trt_launch_check.so
set -euo pipefail
cd "$(dirname "$0")/../.."
PTE=${1:-out/moe_policy.pte}
./scripts/build_runtime.sh > /dev/null
rm -rf .device/launch_check
mkdir -p .device/launch_check
cp runtime/build/libet_trt_launch_check.so .device/launch_check/
.venv/bin/python runtime/tools/extract_blobs.py "$PTE" .device/launch_check/blobs
du -sh .device/launch_check
