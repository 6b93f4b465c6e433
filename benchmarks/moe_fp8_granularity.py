"""What the FP8 fused block's scale granularity buys in accuracy, on the CPU (issue 32 item 3's error goal).

    python benchmarks/moe_fp8_granularity.py [--tokens 256] [--experts 16] [--size 3072] [--ffn 3072] [--seeds 0 1]

The block of benchmarks/moe_fp8_block_bench.py (random normal hidden states, weights randn / sqrt(fan-in) in bf16,
SwiGLU, top-8 routing with softmax weights) at the MoE shapes' H and F with fewer tokens and experts (the error is
per element: their count does not move it), emulated with moe_experts.compute: float32 math on e4m3 values, each
GEMM's input quantized as a variant says. Variants: hidden per token (1 x H) or per 1 x 128 block; the down GEMM's
input h per 1 x 128 block or per row; either not quantized at all (what each quantization costs alone); h as two
e4m3 terms (hi + the residual's e4m3, a second down MMA: what removing h's rounding would cost); weights per output
channel or per 128 x 128 block. Printed per variant: the norm-wise relative error against float32 of the same
quantized weights (issue 32's measure: 4.4e-2 measured on an H100 for the shipped variant) and against float32 of
the bf16 weights (the weights' own rounding included). The shipped variant is the first row.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from et_trt_backend import moe_experts, moe_experts_fp8  # noqa: E402
from et_trt_backend.quantization import FP8_DTYPE, FP8_MAX, quantize_weights_fp8  # noqa: E402


def fake_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [..., K] after e4m3 with one scale per `block` columns (the last partial) and back, float32."""
    size = x.shape[-1]
    blocks = -(-size // block)
    padded = torch.nn.functional.pad(x.float(), (0, blocks * block - size)).unflatten(-1, (blocks, block))
    amax = padded.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    q = (padded / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return (q.float() * scale).flatten(-2)[..., :size]


def fake_two_terms(x: torch.Tensor, block: int) -> torch.Tensor:
    """x as the sum of its quantization in blocks and that of the residual (two e4m3 operands)."""
    hi = fake_blocks(x, block)
    return hi + fake_blocks(x - hi, block)


def fake_weight_tiles(w: torch.Tensor, tile: int = 128) -> torch.Tensor:
    """w [E, N, K] after e4m3 with one scale per tile x tile block and back, float32."""
    experts, n, k = w.shape
    pad_n, pad_k = -n % tile, -k % tile
    padded = torch.nn.functional.pad(w.float(), (0, pad_k, 0, pad_n))
    tiles = padded.unflatten(1, (-1, tile)).unflatten(3, (-1, tile)).transpose(2, 3)  # [E, N/t, K/t, t, t]
    return fake_blocks(tiles.flatten(-2), tile * tile).unflatten(-1, (tile, tile)).transpose(2, 3) \
        .flatten(3, 4).flatten(1, 2)[:, :n, :k]


def per_channel(w: torch.Tensor) -> torch.Tensor:
    return moe_experts_fp8.dequantize(*quantize_weights_fp8(w))


HIDDEN = {"token": lambda x: fake_blocks(x, x.shape[-1]), "1x128": lambda x: fake_blocks(x, 128),
          "none": lambda x: x, "token two terms": lambda x: fake_two_terms(x, x.shape[-1])}
DOWN = {"1x128": lambda x: fake_blocks(x, 128), "row": lambda x: fake_blocks(x, x.shape[-1]),
        "none": lambda x: x, "1x128 two terms": lambda x: fake_two_terms(x, 128)}
WEIGHTS = {"channel": per_channel, "128x128": fake_weight_tiles}
VARIANTS = [("token", "1x128", "channel"), ("1x128", "1x128", "channel"), ("token", "row", "channel"),
            ("1x128", "row", "channel"), ("token", "1x128", "128x128"), ("1x128", "1x128", "128x128"),
            ("token", "none", "channel"), ("none", "1x128", "channel"), ("token", "1x128 two terms", "channel"),
            ("token two terms", "1x128", "channel")]


def relative_error(x: torch.Tensor, reference: torch.Tensor) -> float:
    return float((x.float() - reference).norm() / reference.norm())


def measure(tokens: int, experts: int, size: int, ffn: int, top_k: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, size, generator=gen).to(torch.bfloat16)
    w_gate_up = (torch.randn(experts, 2 * ffn, size, generator=gen) / size**0.5).to(torch.bfloat16)
    w_down = (torch.randn(experts, size, ffn, generator=gen) / ffn**0.5).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).int()
    weights = torch.rand(tokens, top_k, generator=gen).softmax(-1)
    options = dict(activation="swiglu", gate_up_layout="concat", alpha=moe_experts.GPTOSS_ALPHA,
                   limit=moe_experts.GPTOSS_LIMIT)
    bf16_weights = moe_experts.compute(hidden.float(), ids, weights, w_gate_up.float(), w_down.float(), None, None,
                                       **options)
    results, dense = {}, {}
    for variant in VARIANTS:
        hidden_q, down_q, weight_q = variant
        gate_up_w, down_w = WEIGHTS[weight_q](w_gate_up), WEIGHTS[weight_q](w_down)
        if weight_q not in dense:  # float32 of the same quantized weights
            dense[weight_q] = moe_experts.compute(hidden.float(), ids, weights, gate_up_w, down_w, None, None,
                                                  **options)
        out = moe_experts.compute(hidden, ids, weights, gate_up_w, down_w, None, None, **options,
                                  quantize_gate_up=HIDDEN[hidden_q], quantize_down=DOWN[down_q])
        results[variant] = (relative_error(out, dense[weight_q]), relative_error(out, bf16_weights))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--size", type=int, default=3072)
    parser.add_argument("--ffn", type=int, default=3072)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    torch.set_num_threads(2)
    runs = [measure(args.tokens, args.experts, args.size, args.ffn, args.top_k, seed) for seed in args.seeds]
    print(f"{args.tokens} tokens, {args.experts} experts, H {args.size}, F {args.ffn}, top-{args.top_k}, SwiGLU, "
          f"seeds {args.seeds}: relative error (norm-wise; worst of the seeds), the block's output in bf16")
    print("| hidden scales | down input scales | weight scales | vs float32, same quantized weights | "
          "vs float32, bf16 weights |")
    print("|---|---|---|---|---|")
    for variant in VARIANTS:
        same, bf16 = (max(run[variant][i] for run in runs) for i in (0, 1))
        print(f"| {' | '.join(variant)} | {same:.2e} | {bf16:.2e} |")


if __name__ == "__main__":
    main()
