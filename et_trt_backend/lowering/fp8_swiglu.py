"""An FP8 GroupedMM fed by the SwiGLU of a gate+up output takes that output instead (activation "swiglu").

    x = grouped_mm(rows, w_gate_up)                 # [rows, 2K]
    gate, up = x[:, :K], x[:, K:]                   # slices, or a split / chunk in two
    h = silu(gate) * up                             # silu as exported: g * sigmoid(g) in float32, or aten.silu
    out = grouped_mm_fp8(h, w_down_fp8, ...)        # -> grouped_mm_fp8(x, w_down_fp8, ..., activation=1)

The FP8 GroupedMM quantizes its rows at run time anyway; with activation 1 its quantization kernel
computes h from x in the same pass (kernels/quantize_rows.py, SWIGLU), so h is never written in bf16/fp16
and read back, and the SwiGLU's own kernel launch goes. On the H200 the down stage (SwiGLU + down GEMM)
ran 1.28x faster at robot sizes (median of 12) and 1.06x at the MoE shapes than unfused
(benchmarks/results/h200_fp8_swiglu/). The rounding is the exported ops' (quantization.swiglu_rows, up to
the kernel's sigmoid), so the result is the unfused graph's. Only h's single use is replaced; a SwiGLU
read elsewhere too stays as it is.
"""

from __future__ import annotations

import logging
import operator

import torch

from et_trt_backend.op_support import node_value
from et_trt_backend.plugin_names import ACTIVATIONS
from et_trt_backend.source_lines import source_line

from . import ops as _ops  # noqa: F401  (registers torch.ops.et_trt_lowering)

logger = logging.getLogger(__name__)
aten = torch.ops.aten
lowering_ops = torch.ops.et_trt_lowering


def _static_width(node) -> int | None:
    """The last dimension of a 2-D node's value, where it is a plain int."""
    val = node_value(node)
    if val is None or val.dim() != 2 or not isinstance(val.shape[1], int):
        return None
    return val.shape[1]


_SLICE_DEFAULTS = (None, 0, None, None, 1)  # aten.slice.Tensor(self, dim, start, end, step)


def _slice_bound(bound, default: int, width: int) -> int | None:
    """A slice bound as the column it stands for, as Python and aten.slice read it: None is `default`,
    negatives count from the end, and the result is clamped to [0, width]; None where it is not an int."""
    if bound is None:
        return default
    if not isinstance(bound, int):
        return None
    return min(max(bound + width if bound < 0 else bound, 0), width)


def _half_of(node, half: int, k: int) -> torch.fx.Node | None:
    """x where `node` is half `half` (0: columns [0, K), 1: [K, 2K)) of a 2-D x of 2K columns."""
    if not isinstance(node, torch.fx.Node):
        return None
    if node.target is aten.slice.Tensor:
        x, dim, start, end, step = tuple(node.args) + _SLICE_DEFAULTS[len(node.args):]
        if _static_width(x) != 2 * k or dim not in (1, -1) or step != 1:
            return None
        span = (_slice_bound(start, 0, 2 * k), _slice_bound(end, 2 * k, 2 * k))
        return x if span == (half * k, (half + 1) * k) else None
    if node.target is operator.getitem and node.args[1] == half:
        split = node.args[0]
        if not isinstance(split, torch.fx.Node) or _static_width(split.args[0]) != 2 * k:
            return None
        dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
        sizes = split.args[1]
        if dim not in (1, -1):
            return None
        if split.target is aten.split.Tensor and sizes == k:
            return split.args[0]
        if split.target is aten.split_with_sizes.default and list(sizes) == [k, k]:
            return split.args[0]
    return None


def _is_cast(node, dtype: torch.dtype) -> bool:
    """A plain dtype conversion to `dtype` (memory format contiguous or unchanged)."""
    return (isinstance(node, torch.fx.Node) and node.target is aten._to_copy.default and len(node.args) == 1
            and node.kwargs.get("dtype") == dtype
            and node.kwargs.get("memory_format") in (None, torch.contiguous_format, torch.preserve_format)
            and set(node.kwargs) <= {"dtype", "memory_format"})


def _silu_input(node) -> torch.fx.Node | None:
    """g where `node` is silu(g) in g's dtype: aten.silu, or the exported g * sigmoid(g) in float32 cast back."""
    if not isinstance(node, torch.fx.Node):
        return None
    if node.target is aten.silu.default:
        return node.args[0]
    val = node_value(node)
    if val is None or not _is_cast(node, val.dtype) or node.args[0].target is not aten.mul.Tensor:
        return None
    product = node.args[0]
    for c, sigmoid in (product.args, product.args[::-1]):
        if not (isinstance(sigmoid, torch.fx.Node) and sigmoid.target is aten.sigmoid.default):
            continue
        d = sigmoid.args[0]  # c again, or a second cast of the same g
        if (_is_cast(c, torch.float32) and _is_cast(d, torch.float32) and c.args[0] is d.args[0]
                and node_value(c.args[0]).dtype == val.dtype):
            return c.args[0]
    return None


def _gate_up(h: torch.fx.Node, k: int) -> torch.fx.Node | None:
    """x where h = silu(x[:, :K]) * x[:, K:] (either order), all in x's dtype."""
    if h.target is not aten.mul.Tensor or len(h.args) != 2:
        return None
    for silu, up in (h.args, h.args[::-1]):
        gate = _silu_input(silu)
        x = _half_of(gate, 0, k)
        if x is not None and _half_of(up, 1, k) is x and node_value(x).dtype == node_value(h).dtype:
            return x
    return None


def fuse_swiglu(program: torch.export.ExportedProgram) -> int:
    """Gives every FP8 GroupedMM of `program` (in place) whose rows are a SwiGLU used by it alone the gate+up
    output instead, with activation "swiglu"; returns how many."""
    graph = program.graph
    count = 0
    for node in list(graph.nodes):
        if node.target is not lowering_ops.grouped_mm_fp8.default or len(node.args) != 4:
            continue
        h, b_q, offs, b_scale = node.args
        x = _gate_up(h, node_value(b_q).shape[-1]) if len(h.users) == 1 else None
        if x is None:
            continue
        node.args = (x, b_q, offs, b_scale, ACTIVATIONS["swiglu"])
        logger.info("FP8 GroupedMM %s at %s takes the gate+up output %s and computes its SwiGLU itself",
                    node.name, source_line(node), x.name)
        count += 1
    if count:
        graph.eliminate_dead_code()
        program.graph_module.recompile()
    return count
