"""Accuracy of FP8 experts: the relative error of each GroupedMM and of the example policy against bf16.

    python benchmarks/fp8_accuracy.py [--tokens 2 16 64 512] [--seeds 0 1 2]

On the CPU, with the reference math of the FP8 GroupedMM (the lowering op
et_trt_lowering.grouped_mm_fp8, whose CPU implementation is
et_trt_backend/quantization.py): the example policy (examples/moe_policy.py)
runs in bf16 as PyTorch runs it, and again with the decoder's grouped GEMMs in
FP8, as expert_precision = "fp8" on the decoder part lowers them (weights
quantized per expert output channel, activations per row). The velocity part
stays bf16. Relative error = ||x - x_bf16|| / ||x_bf16|| (Frobenius, float32):
per GroupedMM call on the rows it received (the worst over the runs), and for
the policy's output. The bf16 GroupedMM itself against float64 math on the same
inputs is printed beside it for scale.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

REPO = Path(__file__).resolve().parents[1]


def relative_error(x: torch.Tensor, reference: torch.Tensor) -> float:
    reference = reference.double()
    return float((x.double() - reference).norm() / reference.norm().clamp_min(1e-30))


class QuantizedGroupedMMs(TorchFunctionMode):
    """Runs torch._grouped_mm(a, w.transpose(-2, -1), offs) as `quantized` computes it (the lowering's quantized
    GroupedMM), recording per weight the relative error against the bf16 call (and that call's own, against
    float64). benchmarks/int4_accuracy.py runs the INT4 form through it too."""

    def __init__(self):
        super().__init__()
        self.names: dict[int, str] = {}  # data_ptr of each expert weight -> its parameter name
        self.errors: dict[str, list[float]] = collections.defaultdict(list)
        self.bf16_errors: dict[str, list[float]] = collections.defaultdict(list)

    def quantized(self, a: torch.Tensor, weights: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        """The quantized GroupedMM of a with the weights as [G, N, K] (the form the lowering quantizes)."""
        raise NotImplementedError

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch._grouped_mm:
            return func(*args, **kwargs)
        a, b = args[:2]
        offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
        name = self.names.get(b.data_ptr(), f"unnamed weight {list(b.shape)}")
        bf16 = func(*args, **kwargs)
        quantized = self.quantized(a, b.transpose(-2, -1), offs)
        float64 = _grouped_mm_float64(a, b, offs)
        covered = slice(0, int(offs[-1].clamp(0, a.shape[0])))  # rows past the last group are not defined in bf16
        self.errors[name].append(relative_error(quantized[covered], bf16[covered]))
        self.bf16_errors[name].append(relative_error(bf16[covered], float64[covered]))
        return quantized


class Fp8GroupedMMs(QuantizedGroupedMMs):
    """The FP8 GroupedMM: weights per expert output channel, activations per row."""

    def quantized(self, a, weights, offs):
        from et_trt_backend import quantization
        from et_trt_backend.lowering import ops

        b_q, b_scale = quantization.quantize_weights_fp8(weights)
        return ops.grouped_mm_fp8(a, b_q, offs, b_scale)


def _grouped_mm_float64(a, b, offs) -> torch.Tensor:
    out = torch.zeros(a.shape[0], b.shape[-1], dtype=torch.float64)
    start = 0
    for g, end in enumerate(offs.tolist()):
        end = min(max(end, start), a.shape[0])
        out[start:end] = a[start:end].double() @ b[g].double()
        start = end
    return out


def measure(tokens=(2, 16, 64, 512), seeds=(0, 1, 2), mode: QuantizedGroupedMMs | None = None) -> dict:
    """{"grouped_mm": {weight: worst relative error}, "grouped_mm_bf16": {weight: bf16's own worst},
    "policy": [relative error of each (seed, tokens) run]} for the example policy, its decoder's GroupedMMs run by
    `mode` (FP8 where None)."""
    sys.path.insert(0, str(REPO))
    from examples import moe_policy

    policy_errors = []
    mode = mode or Fp8GroupedMMs()
    for seed in seeds:
        policy = moe_policy.build_policy(seed)
        mode.names = {p.data_ptr(): f"decoder.{n}" for n, p in policy.decoder.named_parameters() if p.dim() == 3}
        for count in tokens:
            observations, noisy_actions, timestep = moe_policy.example_inputs(count, seed)
            with torch.no_grad():
                bf16 = policy(observations, noisy_actions, timestep)
                with mode:
                    context = policy.decoder(observations)
                quantized = policy.velocity(noisy_actions, timestep, context)
            policy_errors.append(relative_error(quantized, bf16))
    return {"grouped_mm": {k: max(v) for k, v in mode.errors.items()},
            "grouped_mm_bf16": {k: max(v) for k, v in mode.bf16_errors.items()},
            "policy": policy_errors}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2, 16, 64, 512])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    result = measure(tuple(args.tokens), tuple(args.seeds))
    print(f"example policy, decoder experts in FP8 (CPU reference), tokens {args.tokens}, seeds {args.seeds}")
    print("| GroupedMM weights | FP8 vs bf16, worst | bf16 vs float64, worst |")
    print("|---|---|---|")
    for name, error in result["grouped_mm"].items():
        print(f"| {name} | {error:.4f} | {result['grouped_mm_bf16'][name]:.4f} |")
    errors = result["policy"]
    print(f"policy output vs bf16: worst {max(errors):.4f}, mean {sum(errors) / len(errors):.4f} "
          f"over {len(errors)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
