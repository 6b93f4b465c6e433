"""Runs the MoE blocks whose limits a profiler should name, once each after a warm-up, between
cudaProfilerStart and Stop: our bf16 block at the MoE layer's 3500 tokens (128 experts, hidden = FFN = 3072, top-8:
issue 32's gate+up at ~400 TFLOP/s) and our INT4 block at robot shapes where it reads its weights at 20-58% of the
copy rate (issue 33): 8x1024x1024 at 16 tokens (mma.sync, BY_EXPERT), 16x2048x4096 at 16 (mma.sync, first-pair
grid), 64x2048x1024 at 4 (the vector-matrix kernels).

    ncu --profile-from-start off ... python3 benchmarks/device/moe_profile.py --images .device/int4_images.json

With --fp8-images (prepare.py --moe-fp8's moe_fp8_bench_images.json) the FP8 block at 3500 tokens too, once per
contender named in --fp8-contenders (the shipped "fused_fp8" by default); --blocks picks the blocks.

benchmarks/device/moe_profile_run.sh runs it under Nsight Compute. No timing here: the profiler measures each launch.
"""

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import int4_experts_bench as int4_bench  # noqa: E402  (benchmarks/)
import moe_block_bench  # noqa: E402
import moe_fp8_block_bench  # noqa: E402

from et_trt_backend import moe_experts_fp8  # noqa: E402

BF16_SHAPE = (3500, 128, 3072, 3072, 8)  # tokens, experts, hidden, FFN, top-k
INT4_SHAPES = [(16, 8, 1024, 1024), (16, 16, 2048, 4096), (4, 64, 2048, 1024)]  # tokens, experts, hidden, FFN; top-2


def profiled(label: str, call) -> None:
    call()  # warm-up: the launchers' first launch loads nothing more, but the caches are cold
    torch.cuda.synchronize()
    print(label, flush=True)
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", help="int4_images.json (the INT4 and the dense MoE images)")
    parser.add_argument("--fp8-images", help="moe_fp8_bench_images.json (the FP8 block's contenders)")
    parser.add_argument("--fp8-contenders", default="fused_fp8", help="comma-separated FP8 contenders to profile")
    parser.add_argument("--blocks", default="int4,bf16,fp8", help="comma-separated: int4, bf16, fp8 (those given)")
    args = parser.parse_args()
    blocks = set(args.blocks.split(","))
    if blocks & {"int4", "bf16"} and args.images:
        profile_int4_and_bf16(args.images, blocks)
    if "fp8" in blocks and args.fp8_images:
        profile_fp8(args.fp8_images, args.fp8_contenders.split(","))


def profile_fp8(images: str, names: list[str]) -> None:
    contenders = moe_fp8_block_bench.load_contenders(images)
    tokens, experts, size, ffn, top_k = BF16_SHAPE
    hidden, blocked, down, ids, weights = bf16_operands()
    fp8 = moe_experts_fp8.quantize_weights(blocked, down)
    del blocked, down
    for name in names:
        block = contenders[name]
        profiled(f"fp8 {name} {experts}x{size}x{ffn}, {tokens} tokens, top-{top_k}",
                 lambda: block(hidden, ids, weights, *fp8))
        print("  kernels:", block.launcher.last_kernels, flush=True)


def bf16_operands():
    """The MoE layer's hidden states, gate+up weights (blocked8), down weights, ids and routing weights."""
    tokens, experts, size, ffn, top_k = BF16_SHAPE
    hidden = torch.randn(tokens, size, device="cuda").bfloat16()
    blocked = (torch.randn(experts, 2 * ffn, size, device="cuda") / size**0.5).bfloat16()
    down = (torch.randn(experts, size, ffn, device="cuda") / ffn**0.5).bfloat16()
    ids, weights = moe_block_bench.routing(tokens, experts, top_k, tokens)
    return hidden, blocked, down, ids, weights


def profile_int4_and_bf16(images: str, blocks: set[str]) -> None:
    contenders = int4_bench.load_contenders(images)
    for tokens, experts, size, ffn in INT4_SHAPES if "int4" in blocks else []:
        w = int4_bench.Weights(experts, size, ffn)
        hidden = torch.randn(tokens, size, device="cuda").bfloat16()
        ids, weights = moe_block_bench.routing(tokens, experts, int4_bench.TOP_K, tokens + experts)
        block = contenders["int4"]
        profiled(f"int4 {experts}x{size}x{ffn}, {tokens} tokens",
                 lambda: block(hidden, ids, weights, w.q_gate_up, w.q_down))
        print("  kernels:", block.launcher.last_kernels, flush=True)
        del w
    if "bf16" not in blocks:
        return
    tokens, experts, size, ffn, top_k = BF16_SHAPE
    hidden, blocked, down, ids, weights = bf16_operands()
    block = contenders["bf16"]
    profiled(f"bf16 {experts}x{size}x{ffn}, {tokens} tokens, top-{top_k}",
             lambda: block(hidden, ids, weights, blocked, down))
    print("  kernels:", block.launcher.last_kernels, flush=True)


if __name__ == "__main__":
    main()
