"""Reductions over static axes (TensorRT Reduce and TopK-based ArgMax layers)."""

from __future__ import annotations

import torch
from torch.fx import Node

from ._common import FLOAT_DTYPES, NUMERIC_DTYPES, TENSOR_DTYPES, Rule, arg_tensor, check_arg_dtype, is_static, rule_dtypes

aten = torch.ops.aten


def _reduce(allowed: frozenset[torch.dtype]) -> Rule:
    # Reduction axes are static ints in ATen; only the dtype can be wrong.
    return rule_dtypes(allowed)


def _layer_norm(node: Node) -> str | None:
    normalized = node.args[1]
    x = arg_tensor(node, 0)
    if x is not None and not all(is_static(s) for s in x.shape[x.dim() - len(normalized):]):
        return "layer norm over a dynamic dimension is not supported"
    return check_arg_dtype(node, 0, FLOAT_DTYPES)


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.sum.dim_IntList: _reduce(NUMERIC_DTYPES),
    aten.mean.dim: _reduce(FLOAT_DTYPES),
    aten.amax.default: _reduce(NUMERIC_DTYPES),
    aten.amin.default: _reduce(NUMERIC_DTYPES),
    # any of a mask (SDPA's decomposition asks which rows have a visible key): ReduceMax on int64
    aten.any.dim: _reduce(TENSOR_DTYPES),
    aten.any.dims: _reduce(TENSOR_DTYPES),
    aten.argmax.default: _reduce(NUMERIC_DTYPES),
    aten.argmin.default: _reduce(NUMERIC_DTYPES),
    aten.max.dim: _reduce(NUMERIC_DTYPES),
    aten.min.dim: _reduce(NUMERIC_DTYPES),
    aten.var.correction: _reduce(FLOAT_DTYPES),
    aten.native_layer_norm.default: _layer_norm,
}
