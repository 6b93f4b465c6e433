"""expert_precision = "fp8": each GroupedMM with constant weights becomes an FP8 GroupedMM.

Runs on the ATen program after the precision pass, so the weights it reads are
in the part's precision, as the bf16/fp16 GroupedMM would have used them. A
GroupedMM's weights qualify when they are a parameter, buffer or lifted
constant of the partition (expert_weights.py, the pass the INT4 form shares);
they are quantized here, once (quantization.quantize_weights_fp8: e4m3 with a
float32 scale per expert output channel), into two new lifted constants:
b_q [G, N, K] and b_scale [G, N]. The node becomes
et_trt_lowering.grouped_mm_fp8, whose ONNX form is the 4-input GroupedMM
(translations.py). Activations are quantized per row at run time by the plugin.
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputSpec

from et_trt_backend import quantization

from . import ops as _ops  # noqa: F401  (registers torch.ops.et_trt_lowering)
from .errors import LoweringError
from .expert_weights import quantize_grouped_mms
from .translations import FP8_WEIGHTS_TORCH_DTYPE


def _quantized(spec: InputSpec, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        b_q, b_scale = quantization.quantize_weights_fp8(weights)
    except ValueError as e:
        raise LoweringError(f"expert_precision = \"fp8\": weights '{spec.target}': {e}") from None
    return b_q.contiguous().view(FP8_WEIGHTS_TORCH_DTYPE), b_scale.contiguous()


def quantize_experts(program: torch.export.ExportedProgram) -> int:
    """Turns every GroupedMM of `program` (in place) whose weights are constant into an FP8 GroupedMM;
    returns how many."""
    return quantize_grouped_mms(program, "FP8", _quantized, torch.ops.et_trt_lowering.grouped_mm_fp8.default)
