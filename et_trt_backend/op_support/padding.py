"""Padding (TensorRT Slice layers in fill mode, from ONNX Pad).

F.pad(mode="constant") becomes constant_pad_nd (negative pads crop); reflect and replicate padding arrive
decomposed by ExecuTorch into index ops (arange, abs / clamp, index) that the indexing rules take.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ._common import NUMERIC_DTYPES, Rule, check_arg_dtype, static_ints

aten = torch.ops.aten


def _constant_pad(node: Node) -> str | None:
    pad = node.args[1]
    if not static_ints(pad):
        return f"padding sizes {list(pad)} depend on a dynamic dimension; pad by static sizes"
    return check_arg_dtype(node, 0, NUMERIC_DTYPES)


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.constant_pad_nd.default: _constant_pad,
}
