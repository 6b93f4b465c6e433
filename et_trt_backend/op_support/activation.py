"""Activations and softmax (TensorRT Activation and SoftMax layers).

SiLU, Mish, softplus, hardswish and hardsigmoid reach an edge program decomposed (sigmoid, exp, log1p,
tanh, clamp, where: elementwise.py); gelu (both approximations), elu and the rest as themselves.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ._common import FLOAT_DTYPES, Rule, check_arg_dtype, first_reason, rule_dtypes

aten = torch.ops.aten

_float = rule_dtypes(FLOAT_DTYPES)


def _gelu(node: Node) -> str | None:
    approximate = node.kwargs.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        return f"gelu approximate={approximate!r} is not supported"
    return check_arg_dtype(node, 0, FLOAT_DTYPES)


def _softmax(node: Node) -> str | None:
    half_to_float = node.args[2] if len(node.args) > 2 else False
    return first_reason(
        check_arg_dtype(node, 0, FLOAT_DTYPES),
        "half_to_float softmax is not supported; compute softmax in float32 explicitly" if half_to_float else None,
    )


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.relu.default: _float,
    aten.sigmoid.default: _float,
    aten.tanh.default: _float,
    aten.gelu.default: _gelu,
    aten.hardtanh.default: _float,
    aten.leaky_relu.default: _float,
    aten.elu.default: _float,
    aten._softmax.default: _softmax,
    aten._log_softmax.default: _softmax,
}
