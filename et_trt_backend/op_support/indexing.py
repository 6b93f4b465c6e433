"""Gathers: advanced indexing, gather, index_select (TensorRT Gather layer, default/element/ND modes).

Boolean masks as indices are refused: their result size depends on the data.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ._common import INDEX_DTYPES, TENSOR_DTYPES, Rule, check_arg_dtype, check_dtype, first_reason

aten = torch.ops.aten


def index_tensors_reason(indices: list, mask_advice: str) -> str | None:
    """Why the index tensors of aten.index / index_put (None where a dimension is not indexed) cannot be
    lowered, else None: none given, a boolean mask (`mask_advice`), non-integers, non-adjacent dimensions."""
    present = [i for i in indices if i is not None]
    if not present:
        return "no index tensor"
    for index in present:
        val = index.meta.get("val") if isinstance(index, Node) else None
        if isinstance(val, torch.Tensor) and val.dtype == torch.bool:
            return mask_advice
        reason = check_dtype(val, INDEX_DTYPES, "index")
        if reason:
            return reason
    first = next(k for k, i in enumerate(indices) if i is not None)
    if any(i is None for i in indices[first:first + len(present)]):
        return "index tensors on non-adjacent dimensions are not supported; index one dimension at a time"
    return None


def _index(node: Node) -> str | None:
    mask = "boolean-mask indexing has a data-dependent size; use torch.where or masked_fill instead"
    return index_tensors_reason(list(node.args[1]), mask) or check_arg_dtype(node, 0, TENSOR_DTYPES)


def _gather(node: Node) -> str | None:
    return first_reason(check_arg_dtype(node, 0, TENSOR_DTYPES), check_arg_dtype(node, 2, INDEX_DTYPES, "index"))


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.index.Tensor: _index,
    aten.gather.default: _gather,
    aten.index_select.default: _gather,
    aten.embedding.default: lambda node: first_reason(
        check_arg_dtype(node, 0, TENSOR_DTYPES), check_arg_dtype(node, 1, INDEX_DTYPES, "index")
    ),
}
