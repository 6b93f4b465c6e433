"""Accuracy of INT4 experts: the relative error of each expert GEMM and of the example policy against bf16.

    python benchmarks/int4_accuracy.py [--tokens 2 16 64 512] [--seeds 0 1 2] [--group-sizes 32 64 128]

On the CPU, with the reference math of the INT4 GroupedMM (the lowering op et_trt_lowering.grouped_mm_int4, whose
CPU implementation is et_trt_backend/int4_weights.py: weights quantized symmetrically per group along K, round to
nearest, bf16 scales; activations in bf16, float32 sums): the example policy (examples/moe_policy.py) runs in bf16
as PyTorch runs it, and again with the decoder's expert GEMMs in INT4, as expert_precision = "int4" on the decoder
lowers them (the fused MoEExperts node computes the same GEMMs from the same weights). Relative error =
||x - x_bf16|| / ||x_bf16|| (Frobenius): per expert GEMM on the rows it received (the worst over the runs), and for
the policy's output; the bf16 GEMM against float64 beside it for scale. A second table gives the weight
quantization's own error ||w_q - w|| / ||w|| per weight and the kurtosis of the weights (3 for Gaussian ones), and
the same error for uniform weights, the distribution absmax round-to-nearest codes suit best (about sqrt(3) / 24 =
0.07 at any group size: a step of amax / 7 errs step / sqrt(12) in RMS): no weights of a real model fare better.
"""

from __future__ import annotations

import argparse
import sys

import torch

import fp8_accuracy


class Int4GroupedMMs(fp8_accuracy.QuantizedGroupedMMs):
    """The INT4 GroupedMM at `group_size`."""

    def __init__(self, group_size: int):
        super().__init__()
        self.group_size = group_size

    def quantized(self, a, weights, offs):
        from et_trt_backend import int4_weights
        from et_trt_backend.lowering import ops

        q = int4_weights.quantize(weights, self.group_size)
        return ops.grouped_mm_int4(a, q.packed, offs, q.scales, self.group_size)


def weight_errors(group_size: int, seed: int = 0) -> dict[str, tuple[float, float]]:
    """{decoder expert weight: (||w_q - w|| / ||w|| at `group_size`, kurtosis of w)} of the example policy."""
    from et_trt_backend import int4_weights
    from examples import moe_policy

    policy = moe_policy.build_policy(seed)
    found = {}
    for name, weights in policy.decoder.named_parameters():
        if weights.dim() != 3:
            continue
        w = weights.detach()  # stored [G, N, K] (the policy's experts are [experts, out, in]), as the lowering takes it
        q = int4_weights.quantize(w, group_size)
        dequantized = int4_weights.dequantize(q.packed, q.scales, w.shape[-1], group_size)
        x = w.double()
        kurtosis = float(((x - x.mean()) ** 4).mean() / ((x - x.mean()) ** 2).mean() ** 2)
        found[f"decoder.{name}"] = (fp8_accuracy.relative_error(dequantized, w), kurtosis)
    return found


def uniform_weight_error(group_size: int, shape=(8, 256, 1024)) -> float:
    """||w_q - w|| / ||w|| of uniform random weights [G, N, K] at `group_size`."""
    from et_trt_backend import int4_weights

    w = torch.rand(shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
    q = int4_weights.quantize(w, group_size)
    return fp8_accuracy.relative_error(int4_weights.dequantize(q.packed, q.scales, shape[-1], group_size), w)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2, 16, 64, 512])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--group-sizes", type=int, nargs="+", default=[32, 64, 128])
    args = parser.parse_args(argv)
    sys.path.insert(0, str(fp8_accuracy.REPO))
    results = {g: fp8_accuracy.measure(tuple(args.tokens), tuple(args.seeds), Int4GroupedMMs(g))
               for g in args.group_sizes}
    weights = {g: weight_errors(g) for g in args.group_sizes}
    groups = args.group_sizes
    print(f"example policy, decoder experts in INT4 (CPU reference), tokens {args.tokens}, seeds {args.seeds}")
    print("| expert GEMM weights | " + " | ".join(f"INT4 g{g} vs bf16, worst" for g in groups)
          + " | bf16 vs float64, worst |")
    print("|---" * (len(groups) + 2) + "|")
    first = results[groups[0]]
    for name in first["grouped_mm"]:
        print(f"| {name} | " + " | ".join(f"{results[g]['grouped_mm'][name]:.4f}" for g in groups)
              + f" | {first['grouped_mm_bf16'][name]:.4f} |")
    for g in groups:
        errors = results[g]["policy"]
        print(f"group {g}: policy output vs bf16: worst {max(errors):.4f}, mean {sum(errors) / len(errors):.4f} "
              f"over {len(errors)} runs")
    print("| weights (seed 0) | kurtosis | " + " | ".join(f"||w_q - w|| / ||w||, g{g}" for g in groups) + " |")
    print("|---" * (len(groups) + 2) + "|")
    for name, (_, kurtosis) in weights[groups[0]].items():
        print(f"| {name} | {kurtosis:.2f} | " + " | ".join(f"{weights[g][name][0]:.4f}" for g in groups) + " |")
    print("| uniform random [8, 256, 1024] | 1.80 | " + " | ".join(f"{uniform_weight_error(g):.4f}" for g in groups)
          + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
