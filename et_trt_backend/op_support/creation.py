"""Tensor creation (TensorRT Fill, Constant and Range-style layers).

empty_like is lowered as zeros: its values are undefined in PyTorch. (Through
TensorRTPartitioner it never reaches the edge program: partitioner/pre_edge_rewrites.py
turns it into zeros_like first.)
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ._common import NUMERIC_DTYPES, TENSOR_DTYPES, Rule, check_dtype, output_tensors

aten = torch.ops.aten


def _creates(allowed: frozenset[torch.dtype]) -> Rule:
    def rule(node: Node) -> str | None:
        out = output_tensors(node)
        return check_dtype(out[0] if out else None, allowed, "result")

    return rule


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.arange.start_step: _creates(NUMERIC_DTYPES),
    aten.arange.default: _creates(NUMERIC_DTYPES),
    aten.full.default: _creates(TENSOR_DTYPES),
    aten.full_like.default: _creates(TENSOR_DTYPES),
    aten.empty_like.default: _creates(TENSOR_DTYPES),
    aten.scalar_tensor.default: _creates(TENSOR_DTYPES),
}
