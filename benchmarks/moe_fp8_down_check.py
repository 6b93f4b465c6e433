"""The FP8 down GEMM's sweep candidates (kernels/moe_fp8_down.py) checked on a GPU before they are timed: each FP8
group of .device/moe_fp8_sweep_images.json (prepare.py --moe-fp8) narrowed to its "large" tiling (plus "any", which
the launcher requires, and the route and combine), so that the launcher runs the "large" down at every size here,
from one token up. Each block's output (NaN-poisoned first) against moe_experts_fp8.reference (float32 math on the
GPU, no TF32) within 2e-2, tests/test_moe_experts_fp8_gpu.py's bound, and against the shipped images narrowed the
same way: the candidates compute the shipped down's products and promotions in its order, so "bit-identical" is
expected (a difference is reported, not failed: the reference decides). Cases: one token, odd H and F (a partial
column tile and a partial scale block), skewed routing (several m-tiles of one expert, empty experts, invalid ids),
biases with bfloat16 routing weights, and a wide FFN (24 scale blocks). No Triton in the process: AOT images through
the C++ launcher. The Gluon candidates run nowhere else before the device (Triton's interpreter does not run Gluon).

    python benchmarks/moe_fp8_down_check.py --images .device/moe_fp8_sweep_images.json --ok-file out/down_ok.txt
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from support.moe_inputs import make_inputs  # noqa: E402

from et_trt_backend import moe_experts_fp8  # noqa: E402
from et_trt_backend.kernels.images import load_images  # noqa: E402
from et_trt_backend.kernels.launcher import MoEExpertsLauncher, moe_workspace_bytes  # noqa: E402
from et_trt_backend.kernels.moe_op import launch_args  # noqa: E402

MAX_ERROR = 2e-2  # against the FP8 reference, as tests/test_moe_experts_fp8_gpu.py


def cases(quick: bool) -> dict:
    """name -> make_inputs' (hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down), SwiGLU; H and F multiples of
    16 ("large" takes those)."""
    skewed = list(make_inputs(300, 2, 6, 256, 256, "swiglu", seed=5))
    ids = torch.stack([torch.zeros(300), torch.ones(300)], 1).int()  # 3 m-tiles each; experts 2-5 empty
    ids[3, 0], ids[9, 1], ids[17, 0] = 6, -1, -(2**31)
    skewed[1] = ids
    chosen = {"one token": make_inputs(1, 2, 4, 256, 256, "swiglu", seed=1),
              "odd H 176, F 208": make_inputs(37, 2, 5, 176, 208, "swiglu", invalid=0.1, seed=2),
              "skewed, empty experts, invalid ids": tuple(skewed)}
    if not quick:
        chosen["biases, bf16 routing weights, 64 x top-4"] = make_inputs(64, 4, 8, 512, 384, "swiglu", bias=True,
                                                                      weights_dtype=torch.bfloat16, seed=3)
        chosen["F 3072, 256 x top-8"] = make_inputs(256, 8, 16, 1024, 3072, "swiglu", seed=4)
    return chosen


def large_only(images: list) -> list:
    return [i for i in images if i.kernel in ("moe_route_quantize", "moe_combine") or i.variant in ("large", "any")]


def run(launcher: MoEExpertsLauncher, inputs, weights_fp8) -> tuple[torch.Tensor, str]:
    """One block on device tensors (inputs as make_inputs', weights_fp8 quantize_weights' pairs) into a
    NaN-poisoned output; (output, the kernels the launcher ran)."""
    hidden, ids, weights, _, _, b_gate_up, b_down = inputs
    (gq, gs), (dq, ds) = weights_fp8
    (tokens, size), top_k, experts, ffn = hidden.shape, ids.shape[1], dq.shape[0], dq.shape[2]
    out = torch.full_like(hidden, float("nan"))
    workspace = torch.empty(moe_workspace_bytes(tokens, top_k, experts, size, ffn), dtype=torch.uint8,
                            device="cuda")
    launcher.launch(launch_args(hidden, ids, weights, gq, dq, out, workspace, experts=experts, ffn=ffn,
                                b_gate_up=b_gate_up, b_down=b_down, w_gate_up_scale=gs, w_down_scale=ds),
                    torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return out, launcher.last_kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", required=True, help="moe_fp8_sweep_images.json from prepare.py --moe-fp8")
    parser.add_argument("--ok-file", type=pathlib.Path, help="where to write the labels that passed, one a line")
    parser.add_argument("--quick", action="store_true", help="the three small cases only (for compute-sanitizer)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    images = load_images(args.images)
    torch.empty(1, device="cuda")  # the launchers load into the current CUDA context
    groups = json.loads(pathlib.Path(args.images).with_suffix(".groups.json").read_text())
    labels = [label for label in groups if label.startswith("fused_fp8")]  # "fused_fp8" (shipped) first
    prepared = {}  # case -> (device inputs, FP8 weights, FP8 reference)
    for name, inputs in cases(args.quick).items():
        hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down = (None if t is None else t.cuda()
                                                                      for t in inputs)
        weights_fp8 = moe_experts_fp8.quantize_weights(w_gate_up, w_down)
        reference = moe_experts_fp8.reference(hidden, ids, weights, *weights_fp8, b_gate_up, b_down).float()
        prepared[name] = (hidden, ids, weights, None, None, b_gate_up, b_down), weights_fp8, reference
    # One label at a time, each written to the ok-file once it passed every case: a candidate that faults (which
    # ends the process's CUDA context) costs only itself and those after it (the Gluon ones come last).
    passed, shipped = [], {}
    for label in labels:
        try:
            launcher = MoEExpertsLauncher(large_only([images[i] for i in groups[label]]))
        except Exception as e:  # reported; the others are still checked
            print(f"{label}: FAIL launcher: {e}", flush=True)
            continue
        ok = True
        for name, (inputs, weights_fp8, reference) in prepared.items():
            try:
                out, kernels = run(launcher, inputs, weights_fp8)
            except Exception as e:
                print(f"{name}: {label}: FAIL launch: {e}", flush=True)
                ok = False
                continue
            err = float((out.float() - reference).norm() / reference.norm().clamp_min(1e-6))
            problems = [] if "moe_down (large)" in kernels else [f"ran {kernels}, not the large down"]
            if out.isnan().any():
                problems.append("unwritten (NaN) outputs")
            if not err <= MAX_ERROR:
                problems.append(f"error {err:.2e} > {MAX_ERROR}")
            if name not in shipped:  # the first label, "fused_fp8"
                shipped[name] = out
                same = "shipped"
            elif torch.equal(out.view(torch.int16), shipped[name].view(torch.int16)):
                same = "bit-identical to shipped"
            else:
                diff = float((out.float() - shipped[name].float()).abs().max())
                same = f"differs from shipped: max |diff| {diff:.2e}"
            ok = ok and not problems
            print(f"{name}: {label}: {'FAIL ' + '; '.join(problems) if problems else 'ok'}, {err:.2e} from the FP8 "
                  f"reference, {same}", flush=True)
        if ok:
            passed.append(label)
            if args.ok_file:
                args.ok_file.write_text("".join(f"{passed_label}\n" for passed_label in passed))
    failed = [label for label in labels if label not in passed]
    print(f"fp8 down check: {len(passed)} of {len(labels)} passed" + (f"; FAILED: {failed}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
