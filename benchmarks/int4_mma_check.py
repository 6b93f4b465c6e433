"""The INT4 mma.sync kernels (int4_mma.py) on a GPU before they are timed: every build of the sweep
(prepare.py's MMA_SWEEP, .device/int4_sweep_images.json) through the C++ launcher, forced onto the mma.sync path
(MoEExpertsLauncher.set_int4_path), against int4_weights' float32 reference, outputs NaN-poisoned: one token, odd
sizes (K not a multiple of 32, features not a multiple of a block), every group size (and more scale groups than the
kernel holds at once), every activation and layout, biases, invalid ids and empty experts, more of an expert's pairs
than one pass takes, fewer experts than pairs and more (the BY_EXPERT builds' two ways of finding an expert's
pairs). Exits 1 on any failure; run it under compute-sanitizer too (--quick: the small cases only). --ok-file lists
the builds that passed (a build that crashes the process leaves the later ones unlisted), for the sweep's --mma-ok.

    python benchmarks/int4_mma_check.py --images .device/int4_images.json --sweep .device/int4_sweep_images.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import int4_gemv_sweep  # noqa: E402  (benchmarks/, next to this file)
from support.int4_cases import moe_case, relative_error, run_moe  # noqa: E402

from et_trt_backend.kernels.images import load_images  # noqa: E402
from et_trt_backend.kernels.launcher import MoEExpertsLauncher  # noqa: E402

BOUND = 1e-2  # bf16 output (and gate+up, activation) rounding against the float32 reference


def cases(quick: bool) -> list[tuple[str, object]]:
    """(name, MoECase) of every shape class; --quick: those small enough for compute-sanitizer."""
    invalid = moe_case(8, 2, 16, 128, 64, activation="relu2", invalid=0.3, seed=5)
    invalid.ids[0] = torch.tensor([-(2**31), 16], dtype=torch.int32)  # token 0: no valid pair, its row is zero
    skewed = moe_case(120, 2, 8, 128, 64, activation="geglu_erf", seed=6)
    skewed.ids = torch.stack([torch.zeros(120), torch.ones(120)], 1).int()  # 120 pairs each: many passes
    skewed.ids[5, 1] = -1  # negative: invalid whatever count of experts the launcher is told
    few = moe_case(6, 2, 16, 96, 48, seed=13)  # more experts than pairs: the first-pair rule, 5 pairs on experts 0, 3
    few.ids = torch.tensor([[0, 3], [3, 0], [0, 3], [3, 9], [9, 0], [0, 3]], dtype=torch.int32)
    small = [
        ("1 token", moe_case(1, 2, 8, 256, 128, seed=1)),
        ("odd K and F, group 32", moe_case(5, 2, 4, 208, 80, group_size=32, weights_dtype=torch.bfloat16, seed=2)),
        ("odd K and F, group 64", moe_case(5, 2, 4, 208, 80, group_size=64, seed=3)),
        ("gptoss interleaved bias, 37 tokens on 3 experts",
         moe_case(37, 2, 3, 256, 128, activation="gptoss_glu", layout="interleaved", bias=True, seed=4)),
        ("relu2, invalid ids, empty experts", invalid),
        ("geglu_erf, skewed", skewed),
        ("16 experts, 12 pairs on 3", few),
        ("silu, bias", moe_case(9, 2, 4, 96, 48, activation="silu", bias=True, seed=7)),
        ("gelu_tanh", moe_case(9, 2, 4, 96, 48, activation="gelu_tanh", seed=8)),
        ("geglu_tanh blocked8", moe_case(9, 2, 4, 96, 48, activation="geglu_tanh", layout="blocked8", seed=9)),
    ]
    if quick:
        return small
    return small + [
        ("robot 64x2048x1024, 16 tokens, group 32 (scale windows)",
         moe_case(16, 2, 64, 2048, 1024, group_size=32, seed=10)),
        ("robot 8x1024x1024, 64 tokens, blocked8", moe_case(64, 2, 8, 1024, 1024, layout="blocked8", seed=11)),
        ("16x2048x4096, 8 tokens, group 32", moe_case(8, 2, 16, 2048, 4096, group_size=32, seed=12)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", required=True, help="int4_images.json (the route and combine images)")
    parser.add_argument("--sweep", required=True, help="int4_sweep_images.json (its mma_ groups are checked)")
    parser.add_argument("--quick", action="store_true", help="the small cases only (for compute-sanitizer)")
    parser.add_argument("--labels", nargs="*", help="only these mma_ builds")
    parser.add_argument("--ok-file", type=pathlib.Path,
                        help="append each build that passed every case (the sweep times only those)")
    args = parser.parse_args()
    torch.empty(1, device="cuda")  # the launchers load their images into the current CUDA context: make it current
    base = int4_gemv_sweep.sweep_base(args.images)
    sweep = load_images(args.sweep)
    groups = json.loads(pathlib.Path(args.sweep).with_suffix(".groups.json").read_text())
    labels = [label for label in groups if label.startswith("mma_") and (not args.labels or label in args.labels)]
    checked = cases(args.quick)
    wants = [case.reference() for _, case in checked]
    failures = 0
    for label in labels:
        launcher = MoEExpertsLauncher(base + [sweep[i] for i in groups[label]])
        launcher.set_int4_path("mma")
        failed_before = failures
        for (name, case), want in zip(checked, wants):
            out, kernels = run_moe(launcher, case.to("cuda"), case.dense_down.shape[0])
            err = relative_error(out, want)
            zero_rows = (out[(want == 0).all(1)] == 0).all().item()
            ok = not out.isnan().any() and err < BOUND and zero_rows and "(mma_p" in kernels
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {label} | {name}: relative error {err:.2e}"
                  f"{'' if zero_rows else ', rows of no valid pair not zero'} | {kernels}", flush=True)
        if args.ok_file and failures == failed_before:
            with args.ok_file.open("a") as f:
                f.write(label + "\n")
    print(f"mma check: {len(labels)} builds x {len(checked)} cases, {failures} failed")
    sys.exit(1 if failures or not labels else 0)


if __name__ == "__main__":
    main()
