"""Elementwise arithmetic, comparison and selection (TensorRT ElementWise, Unary and Select layers)."""

from __future__ import annotations

import torch
from torch.fx import Node

from ._common import (
    BOOL_DTYPES,
    FLOAT_DTYPES,
    NUMERIC_DTYPES,
    TENSOR_DTYPES,
    Rule,
    check_arg_dtype,
    first_reason,
    rule_dtypes,
)

aten = torch.ops.aten


def _binary(allowed: frozenset[torch.dtype]) -> Rule:
    return rule_dtypes(allowed, 0, 1)


def _div_mode(node: Node) -> str | None:
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    if mode not in (None, "floor", "trunc"):
        return f"rounding_mode {mode!r} is not supported"
    return first_reason(check_arg_dtype(node, 0, NUMERIC_DTYPES), check_arg_dtype(node, 1, NUMERIC_DTYPES))


def _where(node: Node) -> str | None:
    return first_reason(
        check_arg_dtype(node, 0, BOOL_DTYPES, "condition"),
        check_arg_dtype(node, 1, TENSOR_DTYPES),
        check_arg_dtype(node, 2, TENSOR_DTYPES),
    )


_numeric = rule_dtypes(NUMERIC_DTYPES)
_float = rule_dtypes(FLOAT_DTYPES)
_bool = _binary(BOOL_DTYPES)

RULES: dict[torch._ops.OpOverload, Rule] = {
    # arithmetic (ints for index math such as `order // top_k`)
    aten.add.Tensor: _binary(NUMERIC_DTYPES),
    aten.add.Scalar: _numeric,
    aten.sub.Tensor: _binary(NUMERIC_DTYPES),
    aten.sub.Scalar: _numeric,
    aten.mul.Tensor: _binary(NUMERIC_DTYPES | BOOL_DTYPES),  # bool * bool: attention masks combined
    aten.mul.Scalar: _numeric,
    aten.div.Tensor: _binary(NUMERIC_DTYPES),
    aten.div.Scalar: _numeric,
    aten.div.Tensor_mode: _div_mode,
    aten.div.Scalar_mode: _div_mode,
    aten.fmod.Tensor: _binary(NUMERIC_DTYPES),
    aten.fmod.Scalar: _numeric,
    aten.remainder.Tensor: _binary(NUMERIC_DTYPES),
    aten.remainder.Scalar: _numeric,
    aten.neg.default: _numeric,
    aten.abs.default: _numeric,
    aten.sign.default: _numeric,
    aten.maximum.default: _binary(NUMERIC_DTYPES),
    aten.minimum.default: _binary(NUMERIC_DTYPES),
    aten.clamp.default: _numeric,
    aten.clamp.Tensor: _numeric,
    aten.pow.Tensor_Scalar: _float,
    aten.pow.Tensor_Tensor: _binary(FLOAT_DTYPES),
    aten.pow.Scalar: rule_dtypes(FLOAT_DTYPES, 1),  # base ** exponents (rotary inverse frequencies)
    aten.sqrt.default: _float,
    aten.rsqrt.default: _float,
    aten.reciprocal.default: _float,
    aten.exp.default: _float,
    aten.expm1.default: _float,
    aten.log.default: _float,
    aten.log1p.default: _float,
    aten.log2.default: _float,
    aten.log10.default: _float,
    aten.sin.default: _float,
    aten.cos.default: _float,
    aten.tan.default: _float,
    aten.asin.default: _float,
    aten.acos.default: _float,
    aten.atan.default: _float,
    aten.atan2.default: _binary(FLOAT_DTYPES),
    aten.sinh.default: _float,
    aten.cosh.default: _float,
    aten.asinh.default: _float,
    aten.acosh.default: _float,
    aten.atanh.default: _float,
    aten.erf.default: _float,
    aten.floor.default: _float,
    aten.ceil.default: _float,
    aten.round.default: _float,
    aten.trunc.default: _float,
    # float -> bool
    aten.isnan.default: _float,
    aten.isinf.default: _float,
    # comparisons -> bool
    aten.eq.Tensor: _binary(NUMERIC_DTYPES | BOOL_DTYPES),
    aten.eq.Scalar: rule_dtypes(NUMERIC_DTYPES | BOOL_DTYPES),
    aten.ne.Tensor: _binary(NUMERIC_DTYPES | BOOL_DTYPES),
    aten.ne.Scalar: rule_dtypes(NUMERIC_DTYPES | BOOL_DTYPES),
    aten.lt.Tensor: _binary(NUMERIC_DTYPES),
    aten.lt.Scalar: _numeric,
    aten.le.Tensor: _binary(NUMERIC_DTYPES),
    aten.le.Scalar: _numeric,
    aten.gt.Tensor: _binary(NUMERIC_DTYPES),
    aten.gt.Scalar: _numeric,
    aten.ge.Tensor: _binary(NUMERIC_DTYPES),
    aten.ge.Scalar: _numeric,
    # logic on masks (group-limited routing negates a group mask)
    aten.logical_not.default: rule_dtypes(BOOL_DTYPES),
    aten.logical_and.default: _bool,
    aten.logical_or.default: _bool,
    aten.logical_xor.default: _bool,
    aten.bitwise_not.default: rule_dtypes(BOOL_DTYPES),
    aten.bitwise_and.Tensor: _bool,
    aten.bitwise_or.Tensor: _bool,
    aten.bitwise_xor.Tensor: _bool,
    aten.bitwise_and.Scalar: rule_dtypes(BOOL_DTYPES),
    aten.bitwise_or.Scalar: rule_dtypes(BOOL_DTYPES),
    aten.bitwise_xor.Scalar: rule_dtypes(BOOL_DTYPES),
    aten.where.self: _where,
}
