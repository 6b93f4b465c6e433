"""expert_precision = "fp8": each GroupedMM with constant weights becomes an FP8 GroupedMM.

Runs on the ATen program after the precision pass, so the weights it reads are
in the part's precision, as the bf16/fp16 GroupedMM would have used them. A
GroupedMM's weights qualify when they are a parameter, buffer or lifted
constant of the partition; they are quantized here, once
(quantization.quantize_weights_fp8: e4m3 with a float32 scale per expert
output channel), into two new lifted constants: b_q [G, N, K] (weights stored
[G, K, N] are transposed first: the FP8 kernels take [G, N, K] only) and
b_scale [G, N]. The node becomes et_trt_lowering.grouped_mm_fp8, whose ONNX
form is the 4-input GroupedMM (translations.py); the bf16/fp16 weights leave
the partition where nothing else reads them. Activations are quantized per row
at run time by the plugin.

Weights computed at run time (a slice, a cast or a product of other tensors)
cannot be quantized at export: that GroupedMM stays in the part's precision,
with a warning naming it.
"""

from __future__ import annotations

import logging

import torch
from torch.export.graph_signature import InputSpec

from et_trt_backend import quantization
from et_trt_backend.source_lines import source_line

from . import ops as _ops  # noqa: F401  (registers torch.ops.et_trt_lowering)
from .errors import LoweringError
from .program_weights import ProgramWeights
from .translations import FP8_WEIGHTS_TORCH_DTYPE, KERNEL_DTYPES

logger = logging.getLogger(__name__)
lowering_ops = torch.ops.et_trt_lowering


def _quantized(spec: InputSpec, value: torch.Tensor, trans_b: bool) -> tuple[torch.Tensor, torch.Tensor]:
    weights = value.detach() if trans_b else value.detach().transpose(-2, -1)  # [G, N, K]
    try:
        b_q, b_scale = quantization.quantize_weights_fp8(weights)
    except ValueError as e:
        raise LoweringError(f"expert_precision = \"fp8\": weights '{spec.target}': {e}") from None
    return b_q.contiguous().view(FP8_WEIGHTS_TORCH_DTYPE), b_scale.contiguous()


def quantize_experts(program: torch.export.ExportedProgram) -> int:
    """Turns every GroupedMM of `program` (in place) whose weights are constant into an FP8 GroupedMM;
    returns how many."""
    state = ProgramWeights(program)
    quantized: dict[tuple[str, bool], tuple[torch.fx.Node, torch.fx.Node]] = {}  # a weight feeding several once
    count = 0
    for node in list(state.graph.nodes):
        if node.target is not lowering_ops.grouped_mm.default:
            continue
        a, b, offs, trans_b = node.args
        dtype = a.meta["val"].dtype
        found = state.weight(b)
        if dtype not in KERNEL_DTYPES or found is None:
            why = (f"its activations are {dtype} (FP8 GroupedMMs compute in bf16 or fp16)" if found is not None
                   else f"its weights ({b.name}) are computed at run time, not a constant the export can quantize")
            logger.warning("expert_precision = \"fp8\": GroupedMM %s at %s stays %s: %s", node.name,
                           source_line(node), str(dtype).removeprefix("torch."), why)
            continue
        spec, value = found
        key = (spec.target, bool(trans_b))
        if key not in quantized:
            b_q, b_scale = _quantized(spec, value, bool(trans_b))
            q_node = state.add_constant(b, f"{b.name}_fp8", b_q)
            scale_node = state.add_constant(q_node, f"{b.name}_fp8_scale", b_scale)
            quantized[key] = q_node, scale_node
            logger.info("GroupedMM %s: weights '%s' %s -> FP8 [G, N, K] %s, %.1f KiB + %.1f KiB of scales "
                        "(were %.1f KiB)", node.name, spec.target, list(value.shape), list(b_q.shape),
                        b_q.nbytes / 1024, b_scale.nbytes / 1024, value.nbytes / 1024)
        q_node, scale_node = quantized[key]
        with state.graph.inserting_before(node):
            fp8 = state.graph.call_function(lowering_ops.grouped_mm_fp8.default, (a, q_node, offs, scale_node))
        fp8.meta = {**node.meta}
        with state.fake_mode:
            fp8.meta["val"] = lowering_ops.grouped_mm_fp8.default(a.meta["val"], q_node.meta["val"], offs.meta["val"],
                                                                  scale_node.meta["val"])
        node.replace_all_uses_with(fp8)
        state.graph.erase_node(node)
        state.drop_if_unused(b)
        count += 1
    program.graph_module.recompile()
    return count
