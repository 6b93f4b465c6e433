"""Runs torch._grouped_mm and the given benchmark contenders once per large MoE shape, for a profiler.

    python3 benchmarks/device/profile_kernels.py --images .device/bench_images.json --labels ours

benchmarks/device/profile.sh runs it under Nsight Compute with the sections that tell
compute, shared memory, L2 and DRAM limits apart. No timing here: the profiler
measures each launch.
"""

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from benchmarks.grouped_mm_bench import LARGE, launch_fn, routed_offsets  # noqa: E402
from et_trt_backend.kernels.images import load_images  # noqa: E402
from et_trt_backend.kernels.launcher import GroupedMMLauncher  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", required=True)
    parser.add_argument("--labels", nargs="+", required=True, help="contenders to run, in this order")
    args = parser.parse_args()
    images = load_images(args.images)
    torch.empty(1, device="cuda")
    groups = json.loads(pathlib.Path(args.images).with_suffix(".groups.json").read_text())
    labels = args.labels
    launchers = {label: GroupedMMLauncher([images[i] for i in groups[label]]) for label in labels}
    for tokens, experts, hidden, ffn, top_k in LARGE:
        for gemm, k, n in (("gate_up", hidden, 2 * ffn), ("down", ffn, hidden)):
            offs = routed_offsets(tokens, experts, top_k, tokens).cuda()
            a = torch.randn(tokens * top_k, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
            out = torch.empty(tokens * top_k, n, device="cuda", dtype=torch.bfloat16)
            print(f"{tokens}tok {gemm}: torch, then {', '.join(labels)}", flush=True)
            torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
            for launcher in launchers.values():
                launch_fn(launcher, a, w, offs, out)()
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
