"""expert_precision = "int4": every MoE block's expert weights become INT4 (et_trt_backend/int4_weights.py).

Runs on the ATen program after the MoE fusion (moe_fusion.py), so it finds each block in one of its two forms:
- a fused block, et_trt_lowering.moe_experts with its weights laid out as constants [E, out, in] (gate+up rows
  in the layout written): both weights are quantized and packed, and the node becomes
  et_trt_lowering.moe_experts_int4 (the MoEExperts node with two scale inputs after both biases, and its group
  size), through the pass the FP8 form shares (expert_weights.py);
- a block left to GroupedMMs: each GroupedMM with constant weights becomes et_trt_lowering.grouped_mm_int4 (the
  4-input GroupedMM with its group size), through the pass the FP8 form shares (expert_weights.py).
Quantization: symmetric, round-to-nearest, one bfloat16 scale per `group_size` elements along K (the GEMM's inner
dimension), no calibration data; packed as the INT4 kernels read it (int4_weights.py says why that layout).
Activations, biases and outputs stay in the part's precision. The weights in that precision leave the partition
where nothing else reads them.
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputSpec

from et_trt_backend import int4_weights

from . import ops as _ops  # noqa: F401  (registers torch.ops.et_trt_lowering)
from .errors import LoweringError
from .expert_weights import quantize_fused_blocks, quantize_grouped_mms
from .translations import INT4_WEIGHTS_TORCH_DTYPE

lowering_ops = torch.ops.et_trt_lowering


def _quantizer(group_size: int):
    def quantize(spec: InputSpec, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            q = int4_weights.quantize(weights, group_size)
        except ValueError as e:
            raise LoweringError(f"expert_precision = \"int4\": weights '{spec.target}': {e}") from None
        return q.packed.view(INT4_WEIGHTS_TORCH_DTYPE), q.scales

    return quantize


def quantize_experts(program: torch.export.ExportedProgram, group_size: int) -> tuple[int, int]:
    """Turns (in place) every fused MoE block and every GroupedMM with constant weights of `program` into its INT4
    form; returns (fused blocks, GroupedMMs) turned."""
    quantize = _quantizer(group_size)
    fused = quantize_fused_blocks(program, "INT4", quantize, lowering_ops.moe_experts_int4.default, (group_size,))
    grouped = quantize_grouped_mms(program, "INT4", quantize, lowering_ops.grouped_mm_int4.default, (group_size,))
    return fused, grouped
