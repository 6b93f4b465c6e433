"""The MoEExperts op with FP8 weights (expert_precision "fp8" in the fused form): its quantization and reference.

Weights: each expert's w_gate_up [E, N1, H] and w_down [E, H, F] as float8 e4m3 with one float32 scale per output
channel, quantization.quantize_weights_fp8's form (w ~= q * scale[..., None]): the form the FP8 GroupedMM already
takes, exact to dequantize in float32, and applied once at the end of each GEMM (one multiply per output element).
Activations: hidden per token (row), the down GEMM's input in blocks of 1 x ACTIVATION_BLOCK along K; scale = the
row's or block's amax / 448 (1 where amax is 0), q = e4m3 of x / scale (saturated, nearest even). The kernels
(kernels/moe_fp8.py) quantize hidden in the routing launch and write the down GEMM's input already quantized from
the gate+up GEMM's epilogue. Why per token for hidden: the gate+up GEMM then keeps its accumulators in the MMA
(block scales would scale every K step's product in registers); e4m3's relative rounding does not depend on the
scale's granularity, except for values 2^-6 / 448 of the amax or smaller (subnormals).

`reference` is moe_experts.reference's arithmetic with the weights dequantized and the two GEMMs' inputs
quantized as above (then dequantized: float32 math). Against moe_experts.reference in float32 of the same
dequantized weights (what the FP8 form's accuracy is measured against), the activations' e4m3 roundings cost about
4% relative error on random normal inputs; the kernels match this reference far closer (tests).
"""

from __future__ import annotations

import torch

from et_trt_backend import moe_experts
from et_trt_backend.quantization import FP8_DTYPE, FP8_MAX, quantize_rows_fp8, quantize_weights_fp8

ACTIVATION_BLOCK = 128  # columns per scale of the down GEMM's input (kernels/moe_fp8.py's SCALE_BLOCK)


def quantize_blocks(x: torch.Tensor, block: int = ACTIVATION_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 [rows, K], float32 scales [rows, ceil(K / block)]) of activation rows x [rows, K]."""
    rows, size = x.shape
    blocks = -(-size // block)
    padded = torch.nn.functional.pad(x.float(), (0, blocks * block - size)).view(rows, blocks, block)
    amax = padded.abs().amax(-1)
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    q = (padded / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(rows, blocks * block)[:, :size], scale


def fake_quantize_blocks(x: torch.Tensor) -> torch.Tensor:
    """x's float32 values after quantize_blocks and back."""
    q, scale = quantize_blocks(x)
    size = x.shape[1]
    return (q.float() * scale.repeat_interleave(ACTIVATION_BLOCK, 1)[:, :size])


def fake_quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """x's float32 values after e4m3 with one scale per row (quantization.quantize_rows_fp8) and back."""
    q, scale = quantize_rows_fp8(x)
    return q.float() * scale.unsqueeze(1)


def quantize_weights(w_gate_up: torch.Tensor, w_down: torch.Tensor):
    """((w_gate_up e4m3, its scales [E, N1]), (w_down e4m3, its scales [E, H])) of the experts' weights."""
    return quantize_weights_fp8(w_gate_up), quantize_weights_fp8(w_down)


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 weights q * scale of one quantize_weights pair (exact)."""
    return q.float() * scale.unsqueeze(-1)


def check_inputs(hidden, topk_ids, topk_weights, w_gate_up, w_gate_up_scale, w_down, w_down_scale, b_gate_up, b_down,
                 activation: str, gate_up_layout: str) -> tuple[int, int, int, int, int]:
    """(T, k, E, H, F) of valid FP8 inputs (moe_experts.check_inputs' rules with e4m3 weights and their float32
    scales [E, out]); a ValueError naming the input otherwise."""
    for name, q, scale in (("w_gate_up", w_gate_up, w_gate_up_scale), ("w_down", w_down, w_down_scale)):
        if q.dim() != 3 or q.dtype != FP8_DTYPE or scale.dtype != torch.float32 or \
                tuple(scale.shape) != tuple(q.shape[:2]):
            raise ValueError(f"moe_experts: FP8 {name} must be float8_e4m3fn [E, out, in] with float32 scales "
                             f"[E, out] (moe_experts_fp8.quantize_weights); got {q.dtype} {tuple(q.shape)} and "
                             f"{scale.dtype} {tuple(scale.shape)}")
    shapes = [torch.empty(w.shape, dtype=hidden.dtype, device="meta") for w in (w_gate_up, w_down)]
    return moe_experts.check_inputs(hidden, topk_ids, topk_weights, *shapes, b_gate_up, b_down, activation,
                                    gate_up_layout)


def reference(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w_gate_up, w_down,
              b_gate_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None, *, activation: str = "swiglu",
              gate_up_layout: str = "concat", alpha: float = moe_experts.GPTOSS_ALPHA,
              limit: float = moe_experts.GPTOSS_LIMIT) -> torch.Tensor:
    """out [T, H] in hidden's dtype: moe_experts.reference's semantics with w_gate_up and w_down (e4m3, scale)
    pairs, hidden quantized per token and the down GEMM's input in 1 x 128 blocks."""
    check_inputs(hidden, topk_ids, topk_weights, *w_gate_up, *w_down, b_gate_up, b_down, activation, gate_up_layout)
    return moe_experts.compute(hidden, topk_ids, topk_weights, dequantize(*w_gate_up), dequantize(*w_down), b_gate_up,
                               b_down, activation=activation, gate_up_layout=gate_up_layout, alpha=alpha, limit=limit,
                               quantize_gate_up=fake_quantize_rows, quantize_down=fake_quantize_blocks)
