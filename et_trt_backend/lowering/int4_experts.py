"""expert_precision = "int4": every MoE block's expert weights become INT4 (et_trt_backend/int4_weights.py).

Runs on the ATen program after the MoE fusion (moe_fusion.py), so it finds each block in one of its two forms:
- a fused block, et_trt_lowering.moe_experts with its weights laid out as constants [E, out, in] (gate+up rows
  in the layout written): both weights are quantized and packed, and the node becomes
  et_trt_lowering.moe_experts_int4 (the MoEExperts node with two scale inputs and its group size). The scales
  follow the two optional biases in the node's inputs, so a block without biases gets zero ones: every input of
  the node is then a tensor (an empty optional input is not something a plugin node can rely on TensorRT's parser
  for), at [E, N1] + [E, H] values of the part's precision, a few KiB;
- a block left to GroupedMMs: each GroupedMM with constant weights becomes et_trt_lowering.grouped_mm_int4 (the
  4-input GroupedMM with its group size), through the pass the FP8 form shares (expert_weights.py).
Quantization: symmetric, round-to-nearest, one bfloat16 scale per `group_size` elements along K (the GEMM's inner
dimension), no calibration data; packed as the INT4 kernels read it (int4_weights.py says why that layout).
Activations, biases and outputs stay in the part's precision. The weights in that precision leave the partition
where nothing else reads them.
"""

from __future__ import annotations

import logging

import torch
from torch.export.graph_signature import InputSpec

from et_trt_backend import int4_weights

from . import ops as _ops  # noqa: F401  (registers torch.ops.et_trt_lowering)
from .errors import LoweringError
from .expert_weights import quantize_grouped_mms, replace_node
from .program_weights import ProgramWeights
from .translations import INT4_WEIGHTS_TORCH_DTYPE

logger = logging.getLogger(__name__)
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
    fused = _quantize_fused_blocks(program, quantize, group_size)
    grouped = quantize_grouped_mms(program, "INT4", quantize, lowering_ops.grouped_mm_int4.default, (group_size,))
    return fused, grouped


def _quantize_fused_blocks(program: torch.export.ExportedProgram, quantize, group_size: int) -> int:
    state = ProgramWeights(program)
    count = 0
    for node in list(state.graph.nodes):
        if node.target is not lowering_ops.moe_experts.default:
            continue
        hidden, ids, routing, w_gate_up, w_down, b_gate_up, b_down, *attributes = node.args
        experts, rows, size = w_gate_up.meta["val"].shape
        dtype = hidden.meta["val"].dtype
        if b_gate_up is None:
            b_gate_up = state.add_constant(w_down, f"{w_gate_up.name}_zero_bias", torch.zeros(experts, rows, dtype=dtype))
        if b_down is None:
            b_down = state.add_constant(b_gate_up, f"{w_down.name}_zero_bias", torch.zeros(experts, size, dtype=dtype))
        operands = []
        for weights in (w_gate_up, w_down):
            found = state.weight(weights)
            if found is None:  # moe_fusion.py writes the fused op's weights as constants, always
                raise LoweringError(f"MoEExperts {node.name}: its weights {weights.name} are not a constant")
            spec, value = found
            packed, scales = quantize(spec, value)
            packed_node = state.add_constant(weights, f"{weights.name}_int4", packed)
            operands.append((packed_node, state.add_constant(packed_node, f"{weights.name}_int4_scale", scales)))
            logger.info("MoEExperts %s: weights '%s' %s -> INT4 %s, %.1f KiB + %.1f KiB of scales (were %.1f KiB)",
                        node.name, spec.target, list(value.shape), list(packed.shape), packed.nbytes / 1024,
                        scales.nbytes / 1024, value.nbytes / 1024)
        (gate_up_packed, gate_up_scale), (down_packed, down_scale) = operands
        args = (hidden, ids, routing, gate_up_packed, down_packed, b_gate_up, b_down, gate_up_scale, down_scale,
                *attributes, group_size)
        replace_node(state, node, lowering_ops.moe_experts_int4.default, args)
        for weights in (w_gate_up, w_down):
            state.drop_if_unused(weights)
        count += 1
    program.graph_module.recompile()
    return count
