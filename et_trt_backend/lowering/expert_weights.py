"""What the quantized expert forms (fp8_experts.py, int4_experts.py) share: each fused MoE block
(et_trt_lowering.moe_experts, moe_fusion.py) becomes its quantized form, and each GroupedMM whose weights are a
constant of the partition a quantized GroupedMM, their weights quantized once, at export, into new lifted constants
(the quantized values and their scales); the weights in the part's precision leave the partition where nothing else
reads them.

A quantized MoEExperts node has both biases and both scales: its inputs are hidden, ids, routing weights, the two
quantized weights, b_gate_up, b_down (zeros where the model has none: every input of the node is then a tensor, as an
empty optional input is not something a plugin node can rely on TensorRT's parser for; [E, N1] + [E, H] values of the
part's precision, a few KiB), then the two weights' scales.

Weights computed at run time (a slice, a cast or a product of other tensors) cannot be quantized at export: that
GroupedMM stays in the part's precision, with a warning naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch.export.graph_signature import InputSpec

from et_trt_backend.source_lines import source_line

from .errors import LoweringError
from .program_weights import ProgramWeights
from .translations import KERNEL_DTYPES

logger = logging.getLogger(__name__)
lowering_ops = torch.ops.et_trt_lowering

# (the weights' spec, their value as [G, N, K]) -> (quantized values, scales)
Quantizer = Callable[[InputSpec, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def quantize_grouped_mms(program: torch.export.ExportedProgram, form: str, quantize: Quantizer, target,
                         extra_args: tuple = ()) -> int:
    """Turns every GroupedMM of `program` (in place) whose weights are constant into `target`(a, quantized, offs,
    scales, *extra_args), `form` ("FP8", "INT4") naming it in logs; returns how many. `quantize` takes the weights
    as [G, N, K] (those stored [G, K, N] are transposed first: the quantized kernels take [G, N, K] only)."""
    state = ProgramWeights(program)
    quantized: dict[tuple[str, bool], tuple[torch.fx.Node, torch.fx.Node]] = {}  # a weight feeding several once
    suffix = form.lower()
    count = 0
    for node in list(state.graph.nodes):
        if node.target is not lowering_ops.grouped_mm.default:
            continue
        a, b, offs, trans_b = node.args
        dtype = a.meta["val"].dtype
        found = state.weight(b)
        if dtype not in KERNEL_DTYPES or found is None:
            why = (f"its activations are {dtype} ({form} GroupedMMs compute in bf16 or fp16)" if found is not None
                   else f"its weights ({b.name}) are computed at run time, not a constant the export can quantize")
            logger.warning("expert_precision = \"%s\": GroupedMM %s at %s stays %s: %s", suffix, node.name,
                           source_line(node), str(dtype).removeprefix("torch."), why)
            continue
        spec, value = found
        key = (spec.target, bool(trans_b))
        if key not in quantized:
            weights = value.detach() if trans_b else value.detach().transpose(-2, -1)
            values, scales = quantize(spec, weights)
            q_node = state.add_constant(b, f"{b.name}_{suffix}", values)
            scale_node = state.add_constant(q_node, f"{b.name}_{suffix}_scale", scales)
            quantized[key] = q_node, scale_node
            logger.info("GroupedMM %s: weights '%s' %s -> %s [G, N, K] %s, %.1f KiB + %.1f KiB of scales "
                        "(were %.1f KiB)", node.name, spec.target, list(value.shape), form, list(values.shape),
                        values.nbytes / 1024, scales.nbytes / 1024, value.nbytes / 1024)
        q_node, scale_node = quantized[key]
        replace_node(state, node, target, (a, q_node, offs, scale_node, *extra_args))
        state.drop_if_unused(b)
        count += 1
    program.graph_module.recompile()
    return count


def quantize_fused_blocks(program: torch.export.ExportedProgram, form: str, quantize: Quantizer, target,
                          extra_args: tuple = ()) -> int:
    """Turns every et_trt_lowering.moe_experts node of `program` (in place) into `target`(hidden, ids, routing,
    quantized w_gate_up, quantized w_down, b_gate_up, b_down, w_gate_up scales, w_down scales, *attributes,
    *extra_args), `form` ("FP8", "INT4") naming it in logs; returns how many. moe_fusion.py writes the fused op's
    weights as constants [E, out, in], which `quantize` takes as they are."""
    state = ProgramWeights(program)
    suffix = form.lower()
    count = 0
    for node in list(state.graph.nodes):
        if node.target is not lowering_ops.moe_experts.default:
            continue
        hidden, ids, routing, w_gate_up, w_down, b_gate_up, b_down, *attributes = node.args
        experts, rows, size = w_gate_up.meta["val"].shape
        dtype = hidden.meta["val"].dtype
        if b_gate_up is None:
            b_gate_up = state.add_constant(w_down, f"{w_gate_up.name}_zero_bias",
                                           torch.zeros(experts, rows, dtype=dtype))
        if b_down is None:
            b_down = state.add_constant(b_gate_up, f"{w_down.name}_zero_bias", torch.zeros(experts, size, dtype=dtype))
        operands = []
        for weights in (w_gate_up, w_down):
            found = state.weight(weights)
            if found is None:  # moe_fusion.py writes the fused op's weights as constants, always
                raise LoweringError(f"MoEExperts {node.name}: its weights {weights.name} are not a constant")
            spec, value = found
            values, scales = quantize(spec, value)
            q_node = state.add_constant(weights, f"{weights.name}_{suffix}", values)
            operands.append((q_node, state.add_constant(q_node, f"{weights.name}_{suffix}_scale", scales)))
            logger.info("MoEExperts %s: weights '%s' %s -> %s %s, %.1f KiB + %.1f KiB of scales (were %.1f KiB)",
                        node.name, spec.target, list(value.shape), form, list(values.shape), values.nbytes / 1024,
                        scales.nbytes / 1024, value.nbytes / 1024)
        (gate_up_q, gate_up_scale), (down_q, down_scale) = operands
        args = (hidden, ids, routing, gate_up_q, down_q, b_gate_up, b_down, gate_up_scale, down_scale, *attributes,
                *extra_args)
        replace_node(state, node, target, args)
        for weights in (w_gate_up, w_down):
            state.drop_if_unused(weights)
        count += 1
    program.graph_module.recompile()
    return count


def replace_node(state: ProgramWeights, node: torch.fx.Node, target, args: tuple) -> None:
    """`node` replaced by a call of `target` on `args` (its metadata kept, its value traced anew), and erased."""
    with state.graph.inserting_before(node):
        replacement = state.graph.call_function(target, args)
    replacement.meta = {**node.meta}
    with state.fake_mode:
        replacement.meta["val"] = target(*(arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg
                                           for arg in args))
    node.replace_all_uses_with(replacement)
    state.graph.erase_node(node)
