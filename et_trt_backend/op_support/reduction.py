"""Reductions over static axes (TensorRT Reduce and TopK-based ArgMax layers)."""

from __future__ import annotations

import torch

from ._common import BOOL_DTYPES, FLOAT_DTYPES, NUMERIC_DTYPES, TENSOR_DTYPES, Rule, rule_dtypes

aten = torch.ops.aten


def _reduce(allowed: frozenset[torch.dtype]) -> Rule:
    # Reduction axes are static ints in ATen; only the dtype can be wrong.
    return rule_dtypes(allowed)


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.sum.dim_IntList: _reduce(NUMERIC_DTYPES | BOOL_DTYPES),  # a bool mask's count (int64, as PyTorch)
    aten.mean.dim: _reduce(FLOAT_DTYPES),
    aten.mean.default: _reduce(FLOAT_DTYPES),
    aten.prod.dim_int: _reduce(NUMERIC_DTYPES),
    aten.prod.default: _reduce(NUMERIC_DTYPES),
    aten.amax.default: _reduce(NUMERIC_DTYPES),
    aten.amin.default: _reduce(NUMERIC_DTYPES),
    # any of a mask (SDPA's decomposition asks which rows have a visible key): ReduceMax on int64
    aten.any.dim: _reduce(TENSOR_DTYPES),
    aten.any.dims: _reduce(TENSOR_DTYPES),
    aten.any.default: _reduce(TENSOR_DTYPES),
    aten.argmax.default: _reduce(NUMERIC_DTYPES),
    aten.argmin.default: _reduce(NUMERIC_DTYPES),
    aten.max.dim: _reduce(NUMERIC_DTYPES),
    aten.min.dim: _reduce(NUMERIC_DTYPES),
    aten.var.correction: _reduce(FLOAT_DTYPES),
}
