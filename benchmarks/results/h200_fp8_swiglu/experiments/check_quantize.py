"""Each fp8 bench contender's quantized rows and scales (left in the workspace) against quantize_rows_fp8's, bit
for bit, and torch's bf16 -> e4m3 conversion's bandwidth (the same bytes). On the H200 from the repository root:
PYTHONPATH=$PWD python3 .device/check_quantize.py (after run_all.sh built the launcher)."""
import json
import sys

import torch

sys.path.insert(0, ".")
from et_trt_backend.kernels.launcher import Fp8Operands, fp8_workspace_bytes  # noqa: E402
from et_trt_backend.kernels.images import load_images  # noqa: E402
from et_trt_backend.kernels.launcher import GroupedMMLauncher  # noqa: E402
from et_trt_backend.quantization import quantize_rows_fp8, quantize_weights_fp8  # noqa: E402

images = load_images(".device/fp8_bench_images.json")
groups = json.load(open(".device/fp8_bench_images.groups.json"))
torch.empty(1, device="cuda")
launchers = {k: GroupedMMLauncher([images[i] for i in v]) for k, v in groups.items() if k.startswith("ours_fp8")}
failures = 0
for rows, k in ((28000, 3072), (3000, 4096), (700, 8192), (5000, 16), (4099, 2048), (70000, 1024)):
    g = torch.Generator(device="cuda").manual_seed(rows + k)
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=g)
    a[::7] *= torch.logspace(-40, 36, a[::7].shape[0], device="cuda").to(torch.bfloat16)[:, None]  # wide scales
    a[3] = 0
    a[5, :] = -0.0
    a[9] *= 1e-30
    w = (torch.randn(2, 64, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16)
    b_q, b_scale = quantize_weights_fp8(w)
    offs = torch.tensor([rows // 2, rows], dtype=torch.int32, device="cuda")
    a_q, a_scale = quantize_rows_fp8(a)
    scale_at = (rows * k + 255) // 256 * 256
    for label, launcher in launchers.items():
        ws = torch.full((fp8_workspace_bytes(rows, k),), 0x5A, device="cuda", dtype=torch.uint8)
        out = torch.full((rows, 64), float("nan"), device="cuda", dtype=torch.bfloat16)
        launcher.launch(a.data_ptr(), b_q.data_ptr(), offs.data_ptr(), out.data_ptr(), rows, k, 64, 2, True,
                        torch.cuda.current_stream().cuda_stream, Fp8Operands(b_scale.data_ptr(), ws.data_ptr(),
                                                                             ws.numel()))
        torch.cuda.synchronize()
        bad_q = int((ws[:rows * k].view(rows, k) != a_q.view(torch.uint8)).sum())
        got_s = ws[scale_at:scale_at + 4 * rows].view(torch.float32)
        bad_s = int((got_s.view(torch.int32) != a_scale.view(torch.int32)).sum())
        ok = bad_q == 0 and bad_s == 0 and not out.isnan().any()
        failures += not ok
        print(f"{rows}x{k} {label:28s} {launcher.last_quantize:40s} values differ {bad_q} scales differ {bad_s} "
              f"{'ok' if ok else 'FAIL'}", flush=True)
print("check_quantize:", "PASS" if failures == 0 else f"{failures} FAILED")

# What the memory system gives a pass of the same bytes (read 2 B, write 1 B per element): torch's conversion.
for rows in (28000, 69920):
    a = torch.randn(rows, 3072, device="cuda", dtype=torch.bfloat16)
    q = torch.empty(rows, 3072, device="cuda", dtype=torch.float8_e4m3fn)
    times = []
    for _ in range(60):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        q.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    us = sorted(times[10:])[len(times[10:]) // 2]
    print(f"torch bf16->e4m3 copy {rows}x3072: {us:.1f} us, {3 * rows * 3072 / us / 1e6:.2f} TB/s")
