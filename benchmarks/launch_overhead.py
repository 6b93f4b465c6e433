"""Host time per grouped-GEMM launch through the C++ launcher (what a TensorRT plugin's enqueue adds).

Robot policies run small layers whose kernels take 5-50 us, so the host time of each
launch can decide the latency. This times `launch()` calls from Python (ctypes included)
without waiting for the GPU: batches of 100, median over 21 batches, per shape, once on
the same buffers every call (as a model reruns a layer) and once cycling through ten
slices of one buffer (a new a every call).

    python benchmarks/launch_overhead.py --images .device/bench_images.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from et_trt_backend.kernels.images import load_images  # noqa: E402
from et_trt_backend.kernels.launcher import GroupedMMLauncher  # noqa: E402

import grouped_mm_bench  # noqa: E402  (benchmarks/, next to this file)

SHAPES = [  # name, tokens, experts, hidden (K), N, top_k
    ("robot 32tok 8e h1024 gate_up", 32, 8, 1024, 2048, 2),
    ("robot 256tok 8e h1024 gate_up", 256, 8, 1024, 2048, 2),
    ("3500tok gate_up", 3500, 128, 3072, 6144, 8),
]
BATCH, BATCHES, SLICES = 100, 21, 10


def host_us_per_call(launcher: GroupedMMLauncher, inputs: list, out: torch.Tensor, offs, k: int, n: int,
                     groups: int) -> float:
    stream = torch.cuda.current_stream().cuda_stream
    samples = []
    for _ in range(BATCHES):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(BATCH):
            a, w = inputs[i % len(inputs)]
            launcher.launch(a.data_ptr(), w.data_ptr(), offs.data_ptr(), out.data_ptr(), a.shape[0], k, n, groups,
                            True, stream)
        samples.append((time.perf_counter() - start) / BATCH * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", required=True, help="JSON from benchmarks/device/prepare.py")
    args = parser.parse_args()
    images = load_images(args.images)
    ours = json.loads(pathlib.Path(args.images).with_suffix(".groups.json").read_text())["ours"]
    torch.empty(1, device="cuda")  # the launcher loads into the current CUDA context
    launcher = GroupedMMLauncher([images[i] for i in ours])
    print("| shape | kernel | same buffers: host us per launch | new a each launch: host us per launch |")
    print("|---|---|---|---|")
    for name, tokens, experts, k, n, top_k in SHAPES:
        rows = tokens * top_k
        offs = grouped_mm_bench.routed_offsets(tokens, experts, top_k, seed=tokens).cuda()
        base = torch.randn(rows + SLICES * 8, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
        same = host_us_per_call(launcher, [(base[:rows], w)], out, offs, k, n, experts)
        kernel = launcher.last_kernel
        fresh = host_us_per_call(launcher, [(base[i * 8:i * 8 + rows], w) for i in range(SLICES)], out, offs, k, n,
                                 experts)
        print(f"| {name} | {kernel} | {same:.2f} | {fresh:.2f} |", flush=True)


if __name__ == "__main__":
    main()
