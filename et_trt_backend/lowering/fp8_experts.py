"""expert_precision = "fp8": every MoE block's expert weights become FP8 e4m3.

Runs on the ATen program after the MoE fusion (moe_fusion.py) and the precision pass, so the weights it reads are
in the part's precision, as the bf16/fp16 kernels would have used them, and it finds each block in one of its two
forms:
- a fused block, et_trt_lowering.moe_experts: both weights are quantized and the node becomes
  et_trt_lowering.moe_experts_fp8 (the MoEExperts node with two float32 scale inputs after both biases, group_size 0;
  moe_experts_fp8.py has its semantics: hidden quantized per token, the down GEMM's input in 1 x 128 blocks, both
  by the kernels, kernels/moe_fp8.py);
- a block left to GroupedMMs: each GroupedMM with constant weights becomes et_trt_lowering.grouped_mm_fp8, whose ONNX
  form is the 4-input GroupedMM (translations.py); its activations are quantized per row at run time by the plugin.
Both through the pass the INT4 form shares (expert_weights.py). The weights qualify when they are a parameter,
buffer or lifted constant of the partition; they are quantized here, once (quantization.quantize_weights_fp8: e4m3
with a float32 scale per expert output channel), into new lifted constants: q [E, N, K] and scale [E, N].
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputSpec

from et_trt_backend import quantization

from . import ops as _ops  # noqa: F401  (registers torch.ops.et_trt_lowering)
from .errors import LoweringError
from .expert_weights import quantize_fused_blocks, quantize_grouped_mms
from .translations import FP8_WEIGHTS_TORCH_DTYPE

lowering_ops = torch.ops.et_trt_lowering


def _quantized(spec: InputSpec, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        b_q, b_scale = quantization.quantize_weights_fp8(weights)
    except ValueError as e:
        raise LoweringError(f"expert_precision = \"fp8\": weights '{spec.target}': {e}") from None
    return b_q.contiguous().view(FP8_WEIGHTS_TORCH_DTYPE), b_scale.contiguous()


def quantize_experts(program: torch.export.ExportedProgram) -> tuple[int, int]:
    """Turns (in place) every fused MoE block and every GroupedMM with constant weights of `program` into its FP8
    form; returns (fused blocks, GroupedMMs) turned."""
    fused = quantize_fused_blocks(program, "FP8", _quantized, lowering_ops.moe_experts_fp8.default)
    grouped = quantize_grouped_mms(program, "FP8", _quantized, lowering_ops.grouped_mm_fp8.default)
    return fused, grouped
